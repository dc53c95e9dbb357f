//! EL0: a user space in the lower half (TTBR0_EL1), one tiny user program,
//! and a round trip to it.
//!
//! The program's bytes live in the kernel's text (kernel-only); a run
//! copies them into a pool frame through the linear map and maps that
//! frame at [`USER_CODE`] user-executable and read-only, and a second frame
//! at [`USER_DATA`] user read-write (its data words at the bottom, the
//! user stack growing down from its top). `pgk_enter_user` (boot.rs)
//! returns to EL0 there; an `SVC` or a fault brings the CPU back to EL1
//! through the lower-EL synchronous vector, which returns from
//! `pgk_enter_user` with the syndrome.

use core::arch::{asm, global_asm};

use pgtable_core::{Error, MapOptions, PhysAddr, Prot, VirtAddr};

use crate::geom::{MAX_PAGE, PAGE};
use crate::kmap::KernelSpace;
use crate::memory::{phys_to_virt, KernelTables};
use crate::platform::lower_mmu;

/// Where the user program runs (user-executable, read-only; a page of the
/// geometry, 64 KiB aligned so that every geometry can map it).
pub const USER_CODE: u64 = 0x0040_0000;
/// The user data and stack page (user read-write, never executable; 64 KiB
/// aligned).
pub const USER_DATA: u64 = 0x0080_0000;

const _: () = assert!(USER_CODE % MAX_PAGE == 0 && USER_DATA % MAX_PAGE == 0);
/// The program's `SVC` immediate.
pub const SVC_IMM: u64 = 0x2a;

global_asm!(
    r#"
// The user program. In: x0 = its data page, x1 = an address to load from
// (0: none). Loads the word at [x0], adds 1, passes it through the stack,
// stores it at [x0 + 8], loads from x1 if it is not 0, and returns the
// word in x0 through `svc`.
.section .text.user_program, "ax"
.balign 16
.global pgk_user_program
pgk_user_program:
    ldr     x2, [x0]
    add     x2, x2, #1
    stp     x2, x0, [sp, #-16]!
    ldp     x3, x4, [sp], #16
    str     x3, [x0, #8]
    cbz     x1, 1f
.global pgk_user_program_load
pgk_user_program_load:
    ldr     x5, [x1]
1:  mov     x0, x3
    svc     #{svc}
.global pgk_user_program_after_svc
pgk_user_program_after_svc:
2:  b       2b
.global pgk_user_program_end
pgk_user_program_end:
"#,
    svc = const SVC_IMM,
);

extern "C" {
    static pgk_user_program: u8;
    static pgk_user_program_load: u8;
    static pgk_user_program_after_svc: u8;
    static pgk_user_program_end: u8;
}

/// Offsets into the user program (and so into [`USER_CODE`]).
pub struct ProgramLayout {
    /// Length in bytes.
    pub len: u64,
    /// The load from the caller's address.
    pub load: u64,
    /// The instruction after the `SVC` (where an SVC's ELR_EL1 points).
    pub after_svc: u64,
}

/// The program's address in the kernel text and its layout.
fn program() -> (u64, ProgramLayout) {
    // Symbols of the asm above: only their addresses are taken.
    let start = &raw const pgk_user_program as u64;
    let at = |p: *const u8| p as u64 - start;
    (
        start,
        ProgramLayout {
            len: at(&raw const pgk_user_program_end),
            load: at(&raw const pgk_user_program_load),
            after_svc: at(&raw const pgk_user_program_after_svc),
        },
    )
}

/// How an EL0 run ended: the synchronous exception that brought the CPU
/// back to EL1.
#[derive(Clone, Copy, Debug)]
pub struct UserExit {
    /// ESR_EL1.
    pub esr: u64,
    /// FAR_EL1 (meaningful for aborts).
    pub far: u64,
    /// The user's x0 at the exception.
    pub x0: u64,
    /// ELR_EL1: the faulting instruction, or the one after an `SVC`.
    pub elr: u64,
}

/// A user address space with the program and its data page mapped, and
/// the frames behind them.
pub struct UserSpace {
    /// The address space (lower half, not installed).
    pub space: KernelSpace,
    /// The data/stack frame.
    pub data_pa: u64,
    /// The program's layout.
    pub layout: ProgramLayout,
}

/// Cleans the data cache and invalidates the instruction cache for
/// `[va, va + len)` (Arm ARM B2.4.4), so code just stored there can run
/// from any alias of it.
fn sync_code(va: u64, len: u64) {
    // CTR_EL0.DminLine (bits 19:16): log2 of the smallest data cache line
    // in words.
    let ctr: u64;
    // SAFETY: reading CTR_EL0 has no side effects.
    unsafe { asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack, preserves_flags)) };
    let line = 4u64 << ((ctr >> 16) & 0xf);
    let mut a = va & !(line - 1);
    while a < va + len {
        // SAFETY: cleaning a mapped, readable line does not change memory.
        unsafe { asm!("dc cvau, {}", in(reg) a, options(nostack, preserves_flags)) };
        a += line;
    }
    // SAFETY: cache maintenance only: the cleaned lines reach the point of
    // unification (dsb), every instruction cache line is invalidated, that
    // completes (dsb), and this CPU refetches (isb).
    unsafe {
        asm!(
            "dsb ish",
            "ic iallu",
            "dsb ish",
            "isb",
            options(nostack, preserves_flags)
        )
    };
}

/// Copies the user program to the start of the frame at `code_pa` (the
/// rest of the frame zeroed) and makes it visible to instruction fetches;
/// returns its layout. Map the frame at [`USER_CODE`] user-executable.
///
/// # Safety
///
/// The frame is one page ([`PAGE`] bytes, aligned to it) of pool memory
/// that nothing else uses.
pub unsafe fn load_program(code_pa: u64) -> ProgramLayout {
    let (src, layout) = program();
    // SAFETY: the frame is ours (caller's promise), reached through the
    // linear map; the program's bytes are in the kernel text, readable,
    // and shorter than a page.
    unsafe {
        core::ptr::write_bytes(phys_to_virt(code_pa) as *mut u8, 0, PAGE as usize);
        core::ptr::copy_nonoverlapping(
            src as *const u8,
            phys_to_virt(code_pa) as *mut u8,
            layout.len as usize,
        );
    }
    sync_code(phys_to_virt(code_pa), layout.len);
    layout
}

impl UserSpace {
    /// Builds the user space over the two pool frames at `frames` (two
    /// pages, [`PAGE`] aligned, used by nothing else while it lives): copies the
    /// program, zeroes the data page and maps both, in a new user space of
    /// `kernel` (`new_user`: the lower half, TTBR0_EL1, with the user table
    /// attributes).
    pub fn new(kernel: &KernelSpace, frames: u64) -> Result<UserSpace, Error> {
        let (code_pa, data_pa) = (frames, frames + PAGE);
        // SAFETY: both frames are pool memory given to us (caller's
        // promise), reached through the linear map.
        let layout = unsafe { load_program(code_pa) };
        // SAFETY: as above.
        unsafe { core::ptr::write_bytes(phys_to_virt(data_pa) as *mut u8, 0, PAGE as usize) };
        // SAFETY: the kernel space lives until the run ends (kernel_main
        // never returns).
        let mut space = unsafe { KernelSpace::new_user(kernel, lower_mmu(), KernelTables) }?;
        space.map(
            VirtAddr(USER_CODE),
            PhysAddr(code_pa),
            PAGE,
            Prot::USER | Prot::EXEC,
            MapOptions::PAGES,
        )?;
        space.map(
            VirtAddr(USER_DATA),
            PhysAddr(data_pa),
            PAGE,
            Prot::USER | Prot::WRITE,
            MapOptions::PAGES,
        )?;
        Ok(UserSpace {
            space,
            data_pa,
            layout,
        })
    }

    /// The data word `i` of the data page, read through the linear map.
    pub fn data_word(&self, i: u64) -> u64 {
        // SAFETY: the data frame is ours (see `new`), mapped linearly;
        // EL0 writes it only while `run` is running.
        unsafe { (phys_to_virt(self.data_pa + 8 * i) as *const u64).read_volatile() }
    }

    /// Sets data word `i` through the linear map.
    pub fn set_data_word(&mut self, i: u64, v: u64) {
        // SAFETY: as in `data_word`.
        unsafe { (phys_to_virt(self.data_pa + 8 * i) as *mut u64).write_volatile(v) }
    }
}

/// Runs EL0 code at `entry` with the stack pointer `sp` and x0, x1 = `a0`,
/// `a1`, until its first synchronous exception.
///
/// # Safety
///
/// The installed TTBR0_EL1 space maps `entry`; whatever EL0 can reach
/// there runs with EL0 rights only, and any synchronous exception comes
/// back here (asynchronous ones stay masked).
pub unsafe fn enter_user(entry: u64, sp: u64, a0: u64, a1: u64) -> UserExit {
    let (esr, far, x0, elr): (u64, u64, u64, u64);
    // SAFETY: `pgk_enter_user` saves x19-x30 on the stack, runs EL0 code
    // (which cannot touch EL1 state or kernel memory) and returns here
    // through `pgk_sync_lower`, which restores them and the stack
    // pointer; every register the C ABI lets a callee clobber is declared.
    unsafe {
        asm!(
            "bl pgk_enter_user",
            inout("x0") entry => esr,
            inout("x1") sp => far,
            inout("x2") a0 => x0,
            inout("x3") a1 => elr,
            clobber_abi("C"),
        );
    }
    UserExit { esr, far, x0, elr }
}
