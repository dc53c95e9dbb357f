//! The `space_` cases: what the MMU enforces between address spaces and
//! privilege levels, on the live tables of each format.
//!
//! - U-mode round trip: user code (a page mapped U and X) loads from a
//!   user page and returns the value with `ECALL`; a user load from a
//!   supervisor page faults back to the kernel.
//! - SUM (privileged spec, "Supervisor Status Register", `sstatus.SUM`):
//!   with SUM clear the kernel's loads from a user page fault, with SUM
//!   set they succeed; the kernel never executes a user page (SUM does
//!   not apply to fetches).
//! - Svpbmt: a space of the Svpbmt format maps the UART with PBMT = IO
//!   and reads its line status through that mapping.
//! - ASIDs: two spaces tagged with different ASIDs map the same address
//!   to different frames; switching `satp` between them without a fence
//!   shows each its own mapping, and an unmap in a space that is not
//!   current (`SFENCE.VMA va, asid` of the other ASID) leaves no stale
//!   entry behind.

use core::arch::asm;

use pgtable_core::contract::Mmu;
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::{Asid, RiscvMmu, RiscvPaging, SVPBMT};

use crate::cases::{ensure, fill, Counts, Why, R};
use crate::mem::{case_frame, kernel_space, Frames, CASE_VA};
use crate::trap::{self, CAUSE_FETCH_PAGE_FAULT, CAUSE_LOAD_PAGE_FAULT, CAUSE_USER_ECALL};

type Kernel<const L: u32> = AddressSpace<RiscvPaging<L>, RiscvMmu, Frames>;

/// `ld a0, 0(a0)`.
const LD_A0_A0: u32 = 0x0005_3503;
/// `ecall`.
const ECALL: u32 = 0x0000_0073;
/// `ret`.
const RET: u32 = 0x0000_8067;

/// The user code page, the user data page and the user page holding a
/// `ret`, in the cases' gigabyte.
const USER_CODE: u64 = CASE_VA + 0x10_0000;
const USER_DATA: u64 = CASE_VA + 0x10_1000;
const USER_RET: u64 = CASE_VA + 0x10_2000;

fn map<A: pgtable_core::contract::Arch, M: Mmu>(
    s: &mut AddressSpace<A, M, Frames>,
    va: u64,
    frame: u64,
    prot: Prot,
) -> R {
    s.map(VirtAddr(va), PhysAddr(frame), 4096, prot, MapOptions::PAGES)
        .map_err(|_| Why("map failed", va))
}

/// Writes instructions into frame `pa` and makes them fetchable.
fn code(pa: u64, insns: &[u32]) {
    for (i, &w) in insns.iter().enumerate() {
        // SAFETY: `pa` is a case frame, RAM nothing else uses.
        unsafe { (pa as *mut u32).add(i).write_volatile(w) };
    }
    // SAFETY: an instruction-stream fence only ("Zifencei").
    unsafe { asm!("fence.i", options(nostack)) };
}

fn set_sum(on: bool) {
    const SUM: u64 = 1 << 18;
    if on {
        // SAFETY: sets sstatus.SUM, which only widens S-mode's access to
        // user pages.
        unsafe { asm!("csrs sstatus, {0}", in(reg) SUM, options(nomem, nostack)) };
    } else {
        // SAFETY: clears it again.
        unsafe { asm!("csrc sstatus, {0}", in(reg) SUM, options(nomem, nostack)) };
    }
}

/// Runs `f` with sstatus.SUM set (S-mode loads and stores reach U pages),
/// and clears it again.
pub fn with_sum<T>(f: impl FnOnce() -> T) -> T {
    set_sum(true);
    let r = f();
    set_sum(false);
    r
}

fn user_pages<const L: u32>(k: &mut Kernel<L>) -> R {
    code(case_frame(10), &[LD_A0_A0, ECALL]);
    fill(case_frame(11), 0x05e7_da7a);
    code(case_frame(12), &[RET]);
    map(k, USER_CODE, case_frame(10), Prot::EXEC | Prot::USER)?;
    map(k, USER_DATA, case_frame(11), Prot::USER)?;
    map(k, USER_RET, case_frame(12), Prot::EXEC | Prot::USER)
}

fn roundtrip() -> R {
    // SAFETY: USER_CODE is user code that loads and calls the kernel.
    let (v, cause) = unsafe { trap::run_user(USER_CODE, USER_DATA) };
    ensure(
        cause == CAUSE_USER_ECALL,
        "the user code did not come back through ECALL",
        cause,
    )?;
    ensure(v == 0x05e7_da7a, "the user load read another value", v)
}

fn user_to_kernel_faults() -> R {
    // SAFETY: as above; the load targets a supervisor page (the cases'
    // frame through the identity map), which faults.
    let (_, cause) = unsafe { trap::run_user(USER_CODE, case_frame(11)) };
    ensure(
        cause == CAUSE_LOAD_PAGE_FAULT,
        "a user load from a supervisor page did not fault",
        cause,
    )
}

fn sum_gates() -> R {
    set_sum(false);
    let r = trap::read_u64(USER_DATA);
    ensure(
        r == Err(CAUSE_LOAD_PAGE_FAULT),
        "a kernel load from a user page with SUM clear did not fault",
        r.unwrap_or(0),
    )?;
    set_sum(true);
    let r = trap::read_u64(USER_DATA);
    set_sum(false);
    ensure(
        r == Ok(0x05e7_da7a),
        "a kernel load from a user page with SUM set failed",
        r.unwrap_or(0),
    )
}

fn kernel_cannot_exec_user() -> R {
    set_sum(true);
    // SAFETY: USER_RET holds a `ret`.
    let r = unsafe { trap::exec(USER_RET) };
    set_sum(false);
    ensure(
        r == Err(CAUSE_FETCH_PAGE_FAULT),
        "the kernel fetched from a user page",
        0,
    )
}

type Tagged<const L: u32> = AddressSpace<RiscvPaging<L>, RiscvMmu, Frames>;

fn tagged<const L: u32>(ram: (u64, u64), asid: Asid, frame: u64) -> Result<Tagged<L>, Why> {
    let mut s = kernel_space::<RiscvPaging<L>, _>(ram, RiscvMmu::new::<L, 0>().with_asid(asid))
        .map_err(|_| Why("cannot build a tagged space", u64::from(asid.get())))?;
    map(&mut s, CASE_VA, frame, Prot::WRITE)?;
    Ok(s)
}

fn read_case(want: u64, what: &'static str) -> R {
    let r = trap::read_u64(CASE_VA);
    ensure(r == Ok(want), what, r.unwrap_or(0))
}

fn asid_cases<const L: u32>(k: &mut Kernel<L>, ram: (u64, u64), bits: u32, c: &mut Counts) {
    let (Ok(a1), Ok(a2)) = (Asid::new(1, bits), Asid::new(2, bits)) else {
        crate::println!(
            "skip space_isolation_by_asid: the harts implement no ASID bits (ASIDLEN {bits})"
        );
        return;
    };
    fill(case_frame(20), 0xa51d_0001);
    fill(case_frame(21), 0xa51d_0002);
    let (mut s1, mut s2) = match (
        tagged::<L>(ram, a1, case_frame(20)),
        tagged::<L>(ram, a2, case_frame(21)),
    ) {
        (Ok(x), Ok(y)) => (x, y),
        _ => {
            c.case("space_isolation_by_asid", || {
                Err(Why("cannot build the tagged spaces", 0))
            });
            return;
        }
    };
    c.case("space_isolation_by_asid", || {
        // SAFETY: both map all RAM identically (kernel code, data,
        // stacks) like the kernel's space.
        unsafe { s1.install() };
        read_case(0xa51d_0001, "ASID 1 read another frame")?;
        // SAFETY: as above.
        unsafe { s2.install() };
        read_case(0xa51d_0002, "ASID 2 read ASID 1's translation")?;
        // SAFETY: as above.
        unsafe { s1.install() };
        read_case(0xa51d_0001, "ASID 1 read ASID 2's translation")
    });
    c.case("space_no_stale_after_unmap_in_other_space", || {
        // s1 is current and has the page cached; unmap it while s2 runs.
        read_case(0xa51d_0001, "ASID 1 lost its page")?;
        // SAFETY: as above.
        unsafe { s2.install() };
        s1.unmap(VirtAddr(CASE_VA), 4096)
            .map_err(|_| Why("unmap failed", CASE_VA))?;
        // SAFETY: as above.
        unsafe { s1.install() };
        let r = trap::read_u64(CASE_VA);
        ensure(
            r == Err(CAUSE_LOAD_PAGE_FAULT),
            "ASID 1 still reached the page unmapped while ASID 2 ran",
            r.unwrap_or(0),
        )
    });
    // SAFETY: the kernel's space maps everything the kernel touches.
    unsafe { k.install() };
    // SAFETY: the untagged install of the kernel's space fenced every
    // ASID (`SFENCE.VMA x0, x0`) and no hart runs either space.
    unsafe {
        s1.deactivate();
        s2.deactivate();
    }
}

/// Runs the `space_` cases on the kernel's installed space `k` (format
/// `RiscvPaging<L>`, untagged), with `asid_bits` ASID bits.
pub fn run<const L: u32>(k: &mut Kernel<L>, ram: (u64, u64), asid_bits: u32) -> Counts {
    let mut c = Counts::default();
    let before = Frames.live();
    if let Err(Why(w, v)) = user_pages(k) {
        c.case("space_setup", || Err(Why(w, v)));
        return c;
    }
    c.case("space_user_roundtrip", roundtrip);
    c.case("space_user_access_to_kernel_faults", user_to_kernel_faults);
    c.case("space_sum_gates_kernel_access_to_user_pages", sum_gates);
    c.case(
        "space_kernel_cannot_execute_user_memory",
        kernel_cannot_exec_user,
    );
    let _ = k.unmap(VirtAddr(USER_CODE), 0x3000);
    asid_cases(k, ram, asid_bits, &mut c);
    c.case("space_cases_free_their_tables", || {
        ensure(
            Frames.live() <= before,
            "table frames left after the cases",
            Frames.live(),
        )
    });
    c
}

/// QEMU virt's NS16550 UART (`/soc/serial@10000000`) and its line status
/// register (offset 5): THRE and TEMT (bits 5 and 6) are set while the
/// transmitter is idle.
const UART: u64 = 0x1000_0000;
const UART_LSR: u64 = 5;
/// Where the Svpbmt case maps the UART.
const UART_VA: u64 = CASE_VA + 0x20_0000;

fn svpbmt_io<const L: u32>(k: &mut Kernel<L>, ram: (u64, u64)) -> R {
    let mmu = RiscvMmu::new::<L, SVPBMT>();
    let mut s = kernel_space::<RiscvPaging<L, SVPBMT>, _>(ram, mmu)
        .map_err(|_| Why("cannot build the Svpbmt space", 0))?;
    let io = Prot::WRITE.with_mem(MemType::Device);
    RiscvPaging::<L, SVPBMT>::check_prot(io).map_err(|_| Why("Device memory refused", 0))?;
    map(&mut s, UART_VA, UART, io)?;
    let pte = s.inspect().entry(VirtAddr(UART_VA), 0).unwrap_or(0);
    ensure(
        pte >> 61 == 2,
        "the UART's PTE does not have PBMT = IO",
        pte,
    )?;
    // SAFETY: the space maps all RAM identically, as the kernel's does.
    unsafe { s.install() };
    // SAFETY: a byte read of the UART's line status register, which has
    // no side effect, through the IO mapping just made.
    let lsr = unsafe { ((UART_VA + UART_LSR) as *const u8).read_volatile() };
    // SAFETY: the kernel's space maps everything the kernel touches.
    unsafe { k.install() };
    // SAFETY: the untagged install fenced everything; no other hart runs
    // the space.
    unsafe { s.deactivate() };
    ensure(
        lsr & 0x60 == 0x60,
        "the UART's line status read through the IO mapping is wrong",
        u64::from(lsr),
    )
}

/// The Svpbmt case: a space of the Svpbmt format maps the UART with PBMT
/// = IO and reads it through that mapping (on harts without Svpbmt the
/// PBMT bits are reserved, so the case is skipped there).
pub fn svpbmt<const L: u32>(k: &mut Kernel<L>, ram: (u64, u64), has_svpbmt: bool) -> Counts {
    let mut c = Counts::default();
    if has_svpbmt {
        c.case("space_svpbmt_io_mapping_of_the_uart", || svpbmt_io(k, ram));
    } else {
        crate::println!(
            "skip space_svpbmt_io_mapping_of_the_uart: the harts lack Svpbmt (riscv,isa)"
        );
    }
    c
}
