//! The `space_` cases: the kernel's own address space on the real MMU.
//!
//! - where the kernel runs: nothing of the boot identity map is left, the
//!   lower half of the kernel's root is empty;
//! - W^X for the kernel itself: a store to its text, to its rodata and to
//!   the linear map's alias of its text page-faults (P = 1, W = 1), an
//!   instruction fetch from its data and from the linear map faults
//!   (I/D = 1);
//! - ring 3: a user address space made by `AddressSpace::new_user`, which
//!   shares the kernel half (its root's upper-half entries are the kernel
//!   root's, linking the kernel's pinned, supervisor-only tables), code
//!   and stack at [`USER_BASE`] with [`Prot::USER`]; the CPU enters CPL 3
//!   with `iretq` and comes back through `int 0x80` (a DPL-3 gate) or a
//!   page fault. A CPL-3 load from a kernel address faults with U = 1;
//!   with CR4.SMEP the kernel cannot fetch from user memory, and user code
//!   cannot fetch from the kernel's text;
//! - several address spaces ([`multi`]): isolation between the kernel's
//!   space and user spaces, switched by PCID when the CPU has PCIDs and by
//!   CR3 otherwise ([`switch`]), and no stale translation after a switch,
//!   an unmap in a space that is not installed, or PCID roll-overs;
//! - operations on live spaces ([`ops`]): fork with copy-on-write, swap
//!   entries moved with their table, live protection changes of kernel
//!   pages.
//!
//! Each case prints `ok <name>` or `FAIL <name>: <why>` like the suite.

// A failure carries its message (200 bytes, no allocator here); only the
// failing path moves it.
#![allow(clippy::result_large_err)]

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_core::contract::{Arch, PAGE_SIZE};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86Mmu;
use x86_64::registers::control::{Cr4, Cr4Flags};

use crate::mem::{image_phys, phys_to_virt, Frames, USER_FRAMES};
use crate::println;
use crate::trap::{self, PageFault, UserTrap};

/// Where the ring-3 pages live (lower half, 128 GiB: clear of the suite's
/// window at 64 GiB and of its pages at the end and middle of each half).
pub const USER_BASE: u64 = 0x20_0000_0000;
/// The user code page (user, read-execute).
const USER_CODE: u64 = USER_BASE;
/// The user data page (user, read-write, not executable).
const USER_DATA: u64 = USER_BASE + PAGE_SIZE;
/// The user stack page (user, read-write, not executable).
const USER_STACK: u64 = USER_BASE + 2 * PAGE_SIZE;
/// A user address nothing maps: a load from it is the user program's
/// other way back (a page fault the case recognises by its address).
const USER_EXIT: u64 = USER_BASE + 16 * PAGE_SIZE;
/// Offset in the user code page of a `ret` the kernel tries to fetch.
const USER_RET_OFFSET: u64 = 0x800;

/// Page-fault error code bits (Intel SDM vol. 3A §4.7, figure 4-12).
const PF_P: u64 = 1 << 0;
const PF_W: u64 = 1 << 1;
const PF_U: u64 = 1 << 2;
const PF_RSVD: u64 = 1 << 3;
const PF_I: u64 = 1 << 4;

/// The `int 0x80` vector.
const SYSCALL: u64 = 0x80;

/// What the user program does after its load/add/store of the data page
/// (its `rdx`).
#[derive(Clone, Copy)]
#[repr(u64)]
enum Mode {
    /// `int 0x80` at once.
    Return = 0,
    /// Load from the address in `rsi`, then `int 0x80`.
    Load = 1,
    /// Jump to the address in `rsi`.
    Jump = 2,
}

global_asm!(
    r#"
    /* The ring-3 program, copied into the user code page. rdi: the user
       data page, rsi: a target address, rdx: the mode. It adds one to the
       first word of the data page (a load and a store at CPL 3), uses the
       user stack, then per mode: 0 int 0x80, 1 loads [rsi] and int 0x80,
       2 jumps to rsi. */
    .section .rodata.user_program, "a"
    .global user_program_start, user_program_end
user_program_start:
    mov rax, qword ptr [rdi]
    add rax, 1
    mov qword ptr [rdi], rax
    push rax
    pop rax
    cmp rdx, 1
    je 1f
    cmp rdx, 2
    je 2f
    .global user_program_int80
user_program_int80:
    int 0x80
    ud2
1:
    mov rax, qword ptr [rsi]
    int 0x80
    ud2
2:
    jmp rsi
user_program_end:
"#
);

extern "C" {
    static user_program_start: u8;
    static user_program_end: u8;
    static user_program_int80: u8;
    static __text_start: u8;
    static __rodata_start: u8;
    static __rodata_end: u8;
    static __data_start: u8;
}

/// A read-only word: the target of the rodata store.
static RODATA_WORD: u64 = 0x0123_4567_89ab_cdef;

/// `ret` instructions in `.data`: the target of the data fetch (if the
/// fetch did not fault, the probe would run one and return). Exported, so
/// the compiler cannot prove it constant and move it to `.rodata`.
#[no_mangle]
static mut DATA_RETS: [u8; 16] = [0xc3; 16];

/// A data word in the image: the target of the ring-3 load.
static KERNEL_WORD: AtomicU64 = AtomicU64::new(0x5eed);

/// Counts the cases.
#[derive(Default)]
pub struct Tally {
    /// Cases that printed `ok`.
    pub passed: u32,
    /// Cases that printed `FAIL`.
    pub failed: u32,
}

impl Tally {
    fn case(&mut self, name: &str, r: Result<(), Why>) {
        match r {
            Ok(()) => {
                println!("ok {name}");
                self.passed += 1;
            }
            Err(why) => {
                println!("FAIL {name}: {why}");
                self.failed += 1;
            }
        }
    }
}

/// Why a case failed.
type Why = heapless_str::Msg;

/// A small fixed-capacity message (no allocator in this kernel).
mod heapless_str {
    use core::fmt;

    /// Up to 200 bytes of text.
    pub struct Msg {
        buf: [u8; 200],
        len: usize,
    }

    impl Msg {
        /// The text.
        pub fn as_str(&self) -> &str {
            core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?")
        }

        pub fn new(args: fmt::Arguments) -> Msg {
            let mut m = Msg {
                buf: [0; 200],
                len: 0,
            };
            let _ = fmt::write(&mut m, args);
            m
        }
    }

    impl fmt::Write for Msg {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let n = s.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }

    impl fmt::Display for Msg {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?"))
        }
    }
}

macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(Why::new(format_args!($($arg)*)))
    };
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            bail!($($arg)*);
        }
    };
}

/// Address of a linker symbol.
macro_rules! sym {
    ($s:ident) => {
        (&raw const $s) as u64
    };
}

// After the macros, which they use.
mod mm;
mod multi;
mod ops;
pub mod switch;

use switch::{Switcher, User};

/// Whether the CPU has SMEP (CPUID.(EAX=7,ECX=0):EBX[7]).
pub fn has_smep() -> bool {
    core::arch::x86_64::__cpuid_count(7, 0).ebx & (1 << 7) != 0
}

/// Turns on CR4.SMEP when the CPU has it: supervisor-mode instruction
/// fetches from user pages then fault (Intel SDM vol. 3A §4.6.1). True if
/// it is on.
pub fn enable_smep() -> bool {
    if !has_smep() {
        return false;
    }
    // SAFETY: the kernel never executes from user pages; setting SMEP
    // changes no translation.
    unsafe { Cr4::update(|f| f.insert(Cr4Flags::SUPERVISOR_MODE_EXECUTION_PROTECTION)) };
    true
}

/// A store of the value already there (harmless if the MMU lets it
/// through) must fault with P = 1, W = 1 at `va`.
fn store_faults(va: u64) -> Result<(), Why> {
    let old = match trap::read_u64(va) {
        Ok(v) => v,
        Err(f) => bail!("load from {va:#x} faulted: error {:#x}", f.error),
    };
    // SAFETY: `va` is a kernel word that `old` was just read from; storing
    // it back changes nothing if the store is (wrongly) allowed.
    match unsafe { trap::write_u64(va, old) } {
        Ok(()) => bail!("store to {va:#x} succeeded"),
        Err(f) => expect_fault(f, va, PF_P | PF_W, PF_U | PF_RSVD | PF_I),
    }
}

/// An instruction fetch from `va`, where a `ret` lies, must fault with
/// P = 1, I/D = 1.
fn fetch_faults(va: u64) -> Result<(), Why> {
    // SAFETY: a `ret` is behind `va` (our callers' statics and pages).
    match unsafe { trap::exec(va) } {
        Ok(()) => bail!("fetch from {va:#x} ran"),
        Err(f) => expect_fault(f, va, PF_P | PF_I, PF_U | PF_RSVD | PF_W),
    }
}

/// `f` is a fault at `va` with every bit of `set` and none of `clear`.
fn expect_fault(f: PageFault, va: u64, set: u64, clear: u64) -> Result<(), Why> {
    ensure!(
        f.cr2 == va && f.error & set == set && f.error & clear == 0,
        "fault at CR2 {:#x} error {:#x}, expected CR2 {va:#x} with bits {set:#x} set and {clear:#x} clear",
        f.cr2,
        f.error
    );
    Ok(())
}

/// Runs the `space_` cases on the kernel's installed address space
/// (`pcids`: CR4.PCIDE is on).
pub fn run<A: Arch>(
    kernel: &mut AddressSpace<A, X86Mmu, Frames>,
    smep: bool,
    pcids: bool,
) -> Tally {
    let mut t = Tally::default();
    println!();
    println!("== the kernel's address space ==");
    t.case("space_lower_half_is_empty", lower_half_is_empty(kernel));
    let text = sym!(__text_start);
    t.case("space_kernel_text_write_faults", store_faults(text));
    t.case(
        "space_kernel_rodata_write_faults",
        rodata_word().and_then(store_faults),
    );
    let data = sym!(DATA_RETS);
    t.case(
        "space_kernel_data_exec_faults",
        data_word(data).and_then(fetch_faults),
    );
    t.case(
        "space_linear_map_exec_faults",
        fetch_faults(phys_to_virt(image_phys(data))),
    );
    t.case(
        "space_linear_alias_of_text_write_faults",
        store_faults(phys_to_virt(image_phys(text))),
    );
    let r = with_user_space(kernel, |user, kroot| {
        t.case("space_user_roundtrip", user_roundtrip());
        t.case(
            "space_user_access_to_kernel_faults",
            user_access_to_kernel_faults(),
        );
        t.case(
            "space_user_cannot_execute_kernel_text",
            user_cannot_execute_kernel_text(),
        );
        t.case(
            "space_kernel_cannot_execute_user_memory",
            kernel_cannot_execute_user_memory(smep),
        );
        t.case(
            "space_user_space_shares_the_kernel_half",
            shares_kernel_half(user, kroot),
        );
    });
    if let Err(why) = r {
        t.case("space_user_space", Err(why));
    }
    multi::run(kernel, pcids, &mut t);
    ops::run(kernel, &mut t);
    mm::run(kernel, &mut t);
    switch::print_counts();
    t
}

/// Every root entry of the lower half is empty, and a load from where the
/// boot code was (its identity map) faults as not present.
fn lower_half_is_empty<A: Arch>(space: &AddressSpace<A, X86Mmu, Frames>) -> Result<(), Why> {
    let shift = 12 + 9 * (A::LEVELS - 1);
    for i in 0..256u64 {
        let va = i << shift;
        if let Some(raw) = space.inspect().entry(VirtAddr(va), A::LEVELS - 1) {
            ensure!(raw == 0, "root entry {i} ({va:#x}) is {raw:#x}");
        }
    }
    let boot = 0x10_0000;
    match trap::read_u64(boot) {
        Ok(_) => bail!("the boot code at {boot:#x} is still mapped"),
        Err(f) => expect_fault(f, boot, 0, PF_P | PF_W | PF_U | PF_RSVD | PF_I),
    }
}

/// The address of [`RODATA_WORD`], checked to lie in `.rodata`.
fn rodata_word() -> Result<u64, Why> {
    let va = &raw const RODATA_WORD as u64;
    ensure!(
        (sym!(__rodata_start)..sym!(__rodata_end)).contains(&va),
        "RODATA_WORD at {va:#x} is not in .rodata"
    );
    Ok(va)
}

/// `va`, checked to lie in `.data`.
fn data_word(va: u64) -> Result<u64, Why> {
    ensure!(
        va >= sym!(__data_start),
        "DATA_RETS at {va:#x} is not in .data"
    );
    Ok(va)
}

/// Writes the user program into the user code frame: the program at its
/// start, a `ret` at [`USER_RET_OFFSET`] for the kernel's fetch, `int3`
/// everywhere else.
fn load_user_program() {
    let start = sym!(user_program_start);
    let len = sym!(user_program_end) - start;
    // SAFETY: the user code frame is RAM nothing else uses (mem.rs),
    // reached through the linear map; the program bytes are in .rodata.
    unsafe {
        let code = phys_to_virt(USER_FRAMES) as *mut u8;
        code.write_bytes(0xcc, PAGE_SIZE as usize);
        core::ptr::copy_nonoverlapping(start as *const u8, code, len as usize);
        code.add(USER_RET_OFFSET as usize).write(0xc3);
    }
}

/// Maps the user code page and the user stack page (the shared frames of
/// [`USER_FRAMES`]) into `user`, so the user program can run there.
fn map_user_program<A: Arch>(
    user: &mut AddressSpace<A, X86Mmu, Frames>,
    with_data: bool,
) -> Result<(), Why> {
    let (code_pa, data_pa, stack_pa) = (
        USER_FRAMES,
        USER_FRAMES + PAGE_SIZE,
        USER_FRAMES + 2 * PAGE_SIZE,
    );
    let maps = [
        (USER_CODE, code_pa, Prot::USER | Prot::EXEC),
        (USER_STACK, stack_pa, Prot::USER | Prot::WRITE),
        (USER_DATA, data_pa, Prot::USER | Prot::WRITE),
    ];
    let n = if with_data { 3 } else { 2 };
    for (va, pa, prot) in maps.into_iter().take(n) {
        if let Err(e) = user.map(
            VirtAddr(va),
            PhysAddr(pa),
            PAGE_SIZE,
            prot,
            MapOptions::PAGES,
        ) {
            bail!("map user page {va:#x}: {e}");
        }
    }
    Ok(())
}

/// The user space: the kernel half of `kernel` shared
/// ([`AddressSpace::new_user`]), the user pages mapped; installed while
/// `body` runs, then the kernel's space again.
fn with_user_space<A: Arch>(
    kernel: &mut AddressSpace<A, X86Mmu, Frames>,
    body: impl FnOnce(PhysAddr, PhysAddr),
) -> Result<(), Why> {
    let mut user = User::new(kernel)?;
    load_user_program();
    // SAFETY: the user data and stack frames are RAM nothing else uses
    // (mem.rs), reached through the linear map.
    unsafe {
        (phys_to_virt(USER_FRAMES + PAGE_SIZE) as *mut u8).write_bytes(0, 2 * PAGE_SIZE as usize)
    };
    let r = map_user_program(&mut user.space, true);
    if r.is_ok() {
        let mut sw = Switcher::new(12)?;
        sw.switch_user(&mut user)?;
        body(user.space.root(), kernel.root());
        sw.switch_kernel(kernel);
    }
    user.retire();
    r
}

/// The 512 entries of the root table at `root`, through the linear map.
fn root_entries(root: PhysAddr) -> &'static [AtomicU64; 512] {
    // SAFETY: a root table frame from `Frames` (linearly mapped, 4 KiB
    // aligned); entries are accessed atomically because the walker may
    // read them (it writes nothing: table entries are created accessed).
    unsafe { &*(phys_to_virt(root.0) as *const [AtomicU64; 512]) }
}

/// Runs the user program in `mode` with `target` in `rsi`.
fn user_run(mode: Mode, target: u64) -> UserTrap {
    user_run_on(USER_DATA, mode, target)
}

/// Runs the user program on the data word at `data` (its `rdi`), in
/// `mode` with `target` in `rsi`.
fn user_run_on(data: u64, mode: Mode, target: u64) -> UserTrap {
    // SAFETY: a user space with the user code and stack pages
    // (`map_user_program`) is installed: the program at USER_CODE touches
    // only `data` and the stack page, and `target` (a load or a jump) only
    // faults or is user memory.
    unsafe {
        trap::run_user(
            USER_CODE,
            USER_STACK + PAGE_SIZE,
            [data, target, mode as u64],
        )
    }
}

/// The user data page's first word (through the linear map).
fn user_counter() -> u64 {
    // SAFETY: the user data frame is RAM only the user program and this
    // module use, reached through the linear map.
    unsafe { (phys_to_virt(USER_FRAMES + PAGE_SIZE) as *const u64).read_volatile() }
}

fn user_roundtrip() -> Result<(), Why> {
    let before = user_counter();
    let mut runs = 1;
    let mut t = user_run(Mode::Return, 0);
    let int80 = USER_CODE + sym!(user_program_int80) - sym!(user_program_start);
    if t.vector == 6 && t.rip == int80 && t.cs & 3 == 3 {
        // Seen under kvm_pvm, which emulates a guest that is not a PVM
        // guest and does not deliver `int n` from its ring 3.
        println!(
            "  int 0x80 at CPL 3 raised #UD at {int80:#x} (the hypervisor does not deliver it); returning through a deliberate page fault at {USER_EXIT:#x} instead"
        );
        t = user_run(Mode::Load, USER_EXIT);
        runs += 1;
        ensure!(
            t.vector == 14 && t.cr2 == USER_EXIT && t.error & (PF_P | PF_U) == PF_U,
            "ring 3 ended with vector {:#x} (error {:#x}, RIP {:#x}, CR2 {:#x}), not the page fault at {USER_EXIT:#x}",
            t.vector,
            t.error,
            t.rip,
            t.cr2
        );
    } else {
        ensure!(
            t.vector == SYSCALL,
            "ring 3 ended with vector {:#x} (error {:#x}, RIP {:#x}, CR2 {:#x}), not int 0x80",
            t.vector,
            t.error,
            t.rip,
            t.cr2
        );
    }
    ensure!(
        t.cs & 3 == 3,
        "the trap came from CPL {} (CS {:#x})",
        t.cs & 3,
        t.cs
    );
    let after = user_counter();
    ensure!(
        after == before + runs && t.rax == after,
        "data page {before} -> {after} in {runs} runs, user rax {}",
        t.rax
    );
    println!(
        "  ring 3 (CS {:#x}) loaded and stored its data page ({before} -> {after}) and came back with {} from RIP {:#x}",
        t.cs,
        if t.vector == SYSCALL { "int 0x80" } else { "a page fault" },
        t.rip
    );
    Ok(())
}

fn user_access_to_kernel_faults() -> Result<(), Why> {
    let image = &raw const KERNEL_WORD as u64;
    let linear = phys_to_virt(image_phys(image));
    for va in [image, linear] {
        let t = user_run(Mode::Load, va);
        ensure!(
            t.vector == 14 && t.cs & 3 == 3,
            "ring-3 load from {va:#x}: vector {:#x} from CS {:#x}, not a page fault",
            t.vector,
            t.cs
        );
        expect_fault(
            PageFault {
                cr2: t.cr2,
                error: t.error,
            },
            va,
            PF_P | PF_U,
            PF_W | PF_RSVD | PF_I,
        )?;
    }
    Ok(())
}

fn user_cannot_execute_kernel_text() -> Result<(), Why> {
    let va = sym!(__text_start);
    let t = user_run(Mode::Jump, va);
    ensure!(
        t.vector == 14 && t.cs & 3 == 3,
        "ring-3 jump to {va:#x}: vector {:#x} from CS {:#x}, not a page fault",
        t.vector,
        t.cs
    );
    expect_fault(
        PageFault {
            cr2: t.cr2,
            error: t.error,
        },
        va,
        PF_P | PF_U | PF_I,
        PF_W | PF_RSVD,
    )
}

fn kernel_cannot_execute_user_memory(smep: bool) -> Result<(), Why> {
    let va = USER_CODE + USER_RET_OFFSET;
    if !smep {
        // No SMEP: the kernel could fetch from user pages. What still
        // separates them: user data is NX, and user code cannot fetch from
        // the kernel (`space_user_cannot_execute_kernel_text`).
        println!(
            "  CR4.SMEP: absent (CPUID.(EAX=7,ECX=0):EBX[7] = 0): the kernel can fetch from user code; checking that user data is not executable instead"
        );
        // SAFETY: a `ret` at the start of the user data page, which only
        // the user program writes (its first word, not during this call).
        unsafe { (phys_to_virt(USER_FRAMES + PAGE_SIZE + 8) as *mut u8).write_volatile(0xc3) };
        return fetch_faults(USER_DATA + 8);
    }
    println!("  CR4.SMEP: on");
    fetch_faults(va)
}

/// The user root's upper half is the kernel root's, entry for entry (the
/// copy `new_user` made), every one of those 256 entries links a table
/// with U/S clear (supervisor-only: Intel SDM vol. 3A §4.6.1, a clear U/S
/// bit anywhere on the walk makes the page supervisor-only), and its
/// lower half holds one entry (the table of the user pages) with U/S set.
/// Below the root, every table entry on the paths to the image and the
/// linear map has U/S clear too.
fn shares_kernel_half(user: PhysAddr, kernel: PhysAddr) -> Result<(), Why> {
    const P: u64 = 1 << 0;
    const US: u64 = 1 << 2;
    const PS: u64 = 1 << 7;
    const ADDR: u64 = 0x000f_ffff_ffff_f000;
    let levels = if X86Mmu::la57_enabled() { 5 } else { 4 };
    let image = &raw const KERNEL_WORD as u64;
    let mut tables = 0;
    for va in [image, phys_to_virt(image_phys(image))] {
        let mut table = kernel.0;
        for h in (1..levels).rev() {
            let e =
                root_entries(PhysAddr(table))[((va >> (12 + 9 * h)) & 511) as usize].load(Relaxed);
            if e & P == 0 || (h <= 2 && e & PS != 0) {
                break;
            }
            ensure!(
                e & US == 0,
                "the table entry at height {h} on the path to {va:#x} is {e:#x}: U/S set"
            );
            tables += 1;
            table = e & ADDR;
        }
    }
    let (u, k) = (root_entries(user), root_entries(kernel));
    for i in 256..512 {
        let (ue, ke) = (u[i].load(Relaxed), k[i].load(Relaxed));
        ensure!(ue == ke, "root entry {i}: user {ue:#x}, kernel {ke:#x}");
        ensure!(
            ke & P != 0 && ke & US == 0,
            "kernel root entry {i} is {ke:#x}: not a present supervisor-only table entry"
        );
    }
    let lower: [u64; 256] = core::array::from_fn(|i| u[i].load(Relaxed));
    let used = lower.iter().filter(|&&e| e != 0).count();
    let user_ok = lower.iter().all(|&e| e == 0 || e & (P | US) == P | US);
    ensure!(
        used == 1 && user_ok,
        "{used} lower-half entries (expected 1), all with U/S set: {user_ok}"
    );
    println!(
        "  user root: the 256 upper-half entries are the kernel root's (present, U/S clear), {used} of its own (U/S set); {tables} table entries on the paths to the image and the linear map: U/S clear"
    );
    Ok(())
}
