//! Exceptions: the IDT, the entry stubs, and the memory probes.
//!
//! Every exception vector 0–31 and the system-call vector 0x80 enter a
//! `global_asm!` stub that pushes a dummy error code where the CPU pushes
//! none (Intel SDM vol. 3 §6.13, table 6-1), the vector number and the
//! general registers, then calls
//! [`trap_dispatch`] with a pointer to that [`TrapFrame`]. The handler may
//! edit the frame; the stub restores it and returns with `iretq`.
//!
//! A page fault at one of the *probe* instructions (the single load or
//! store inside [`read_u64`] / [`write_u64`], or the instruction fetch at
//! the target of [`exec`]'s call) is an expected outcome: the handler
//! records CR2 and the error code, sets the probe's fault flag and resumes
//! after the instruction (after the call, for a fetch). Any trap from
//! ring 3 (the `int 0x80` gate of DPL 3, a page fault, anything) ends the
//! [`run_user`] call that entered ring 3 and becomes its result. Any other
//! exception prints the vector, error code, RIP (and CR2 for a page fault)
//! and ends the run as failed.

use core::arch::global_asm;
use core::cell::UnsafeCell;

use x86_64::instructions::tables::lidt;
use x86_64::registers::control::Cr2;
use x86_64::structures::idt::InterruptDescriptorTable;
use x86_64::structures::DescriptorTablePointer;
use x86_64::{PrivilegeLevel, VirtAddr};

/// The registers the stubs save, lowest address first.
#[repr(C)]
#[derive(Debug)]
pub struct TrapFrame {
    r15: u64,
    r14: u64,
    r13: u64,
    r12: u64,
    r11: u64,
    r10: u64,
    r9: u64,
    r8: u64,
    rdi: u64,
    rsi: u64,
    rbp: u64,
    rbx: u64,
    rdx: u64,
    rcx: u64,
    rax: u64,
    vector: u64,
    error: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

global_asm!(
    r#"
    .section .text.trap, "ax"
    .irp n, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31
isr_\n:
    push 0
    push \n
    jmp isr_common
    .endr
    .irp n, 8,10,11,12,13,14,17,21,29,30
isr_\n:
    push \n
    jmp isr_common
    .endr

    /* The system-call gate (DPL 3): ring 3 returns to the kernel with
       `int 0x80`. */
isr_128:
    push 0
    push 128
    jmp isr_common

isr_common:
    push rax
    push rcx
    push rdx
    push rbx
    push rbp
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    push r12
    push r13
    push r14
    push r15
    /* The CPU aligned RSP to 16 before its 40-byte frame; with the vector,
       the error code and 15 registers (176 bytes in all) RSP is aligned
       again here, as the call below requires. */
    mov rdi, rsp
    cld
    call trap_dispatch
    pop r15
    pop r14
    pop r13
    pop r12
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rbp
    pop rbx
    pop rdx
    pop rcx
    pop rax
    add rsp, 16
    iretq

    /* Device interrupts (vectors 32..255): none is expected, all sources
       are masked; one that was already pending is acknowledged at both
       PICs and dropped. */
irq_ignore:
    push rax
    mov al, 0x20
    out 0xa0, al
    out 0x20, al
    pop rax
    iretq

    .section .rodata.isr_table, "a"
    .p2align 3
    .global isr_table
isr_table:
    .irp n, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad isr_\n
    .endr

    .global irq_ignore_addr
    .p2align 3
irq_ignore_addr:
    .quad irq_ignore
    .global syscall_addr
syscall_addr:
    .quad isr_128

    /* enter_user(rip, rsp, rdi, rsi, rdx), sysv64: saves the callee-saved
       registers and the stack pointer, then `iretq`s to CPL 3 at `rip`
       with `rsp` and the user's rdi, rsi, rdx from the last three
       arguments (interrupts stay off: RFLAGS = 2). It returns when the
       handler of a trap from CPL 3 jumps to leave_user. */
    .section .text.user_entry, "ax"
    .global enter_user
enter_user:
    push rbx
    push rbp
    push r12
    push r13
    push r14
    push r15
    mov qword ptr [rip + user_kernel_rsp], rsp
    push {user_ds}
    push rsi
    push 2
    push {user_cs}
    push rdi
    mov rdi, rdx
    mov rsi, rcx
    mov rdx, r8
    xor eax, eax
    xor ebx, ebx
    xor ecx, ecx
    xor ebp, ebp
    xor r8d, r8d
    xor r9d, r9d
    xor r10d, r10d
    xor r11d, r11d
    xor r12d, r12d
    xor r13d, r13d
    xor r14d, r14d
    xor r15d, r15d
    iretq

    /* Back to enter_user's caller, from the trap handler (on the RSP0
       stack, which is abandoned): the kernel data segments again (a trap
       from CPL 3 loads SS with a null selector, an iretq to CPL 3 nulls
       DS and ES), the saved stack and registers. */
    .global leave_user
leave_user:
    mov ax, {kernel_ds}
    mov ds, ax
    mov es, ax
    mov ss, ax
    mov rsp, qword ptr [rip + user_kernel_rsp]
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbp
    pop rbx
    ret

    .section .data.user_kernel_rsp, "aw"
    .p2align 3
user_kernel_rsp:
    .quad 0

    /* Probes: sysv64, address in rdi (value in rsi); return the loaded
       value in rax and 0 (no fault) / 1 (fault) in rdx. */
    .section .text.probe, "ax"
    .global probe_read64
probe_read64:
    xor edx, edx
    xor eax, eax
probe_read64_insn:
    mov rax, qword ptr [rdi]
probe_read64_resume:
    ret

    .global probe_write64
probe_write64:
    xor edx, edx
    xor eax, eax
probe_write64_insn:
    mov qword ptr [rdi], rsi
probe_write64_resume:
    ret

    /* Fetch probe: calls the address in rdi, where the caller placed a
       `ret`; returns 0 (it ran) / 1 (the fetch faulted) in rdx. */
    .global probe_exec
probe_exec:
    xor edx, edx
    call rdi
probe_exec_resume:
    ret

    .global probe_addrs
    .section .rodata.probe_addrs, "a"
    .p2align 3
probe_addrs:
    .quad probe_read64_insn, probe_read64_resume
    .quad probe_write64_insn, probe_write64_resume
    .quad probe_exec_resume
"#,
    user_ds = const crate::gdt::USER_DS,
    user_cs = const crate::gdt::USER_CS,
    kernel_ds = const crate::gdt::KERNEL_DS,
);

/// What a probe returns (in rax:rdx, as sysv64 returns a two-word struct).
#[repr(C)]
struct ProbeResult {
    value: u64,
    faulted: u64,
}

extern "sysv64" {
    fn probe_read64(va: u64) -> ProbeResult;
    fn probe_write64(va: u64, value: u64) -> ProbeResult;
    fn probe_exec(va: u64) -> ProbeResult;
    fn enter_user(rip: u64, rsp: u64, rdi: u64, rsi: u64, rdx: u64);
}

extern "C" {
    fn leave_user() -> !;
    static syscall_addr: u64;
    static irq_ignore_addr: u64;
    static isr_table: [u64; 32];
    static probe_addrs: [u64; 5];
}

/// A page fault caught by a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageFault {
    /// The faulting linear address (CR2).
    pub cr2: u64,
    /// The page-fault error code (bit 0 present, bit 1 write, bit 4 fetch).
    pub error: u64,
}

/// The last fault a probe caught, per CPU ([`crate::smp::this_cpu`]):
/// written only by that CPU's handler while its probe waits for it.
static mut LAST_FAULT: [PageFault; crate::smp::MAX_CPUS] =
    [PageFault { cr2: 0, error: 0 }; crate::smp::MAX_CPUS];

/// This CPU's last probe fault.
fn last_fault() -> PageFault {
    // SAFETY: this CPU's entry, written by its own handler before the
    // probe returned here.
    unsafe { core::ptr::read_volatile(&raw const LAST_FAULT[crate::smp::this_cpu()]) }
}

/// Reads the 8 bytes at `va` (8-byte aligned), or returns the page fault.
pub fn read_u64(va: u64) -> Result<u64, PageFault> {
    // SAFETY: the probe is a single load whose page fault the handler turns
    // into a result; any other fault ends the run. `va` is not Rust memory
    // the compiler reasons about.
    let r = unsafe { probe_read64(va) };
    if r.faulted == 0 {
        Ok(r.value)
    } else {
        Err(last_fault())
    }
}

/// Writes the 8 bytes at `va` (8-byte aligned), or returns the page fault.
///
/// # Safety
///
/// A page fault is caught, but a store that succeeds is a real store: `va`
/// must map nothing, or only memory no Rust object lives in (the RAM pool
/// the kernel hands to the suite and the benchmarks).
pub unsafe fn write_u64(va: u64, value: u64) -> Result<(), PageFault> {
    // SAFETY: as in `read_u64`; the store targets pool memory or faults
    // (our caller's promise), never kernel data.
    let r = unsafe { probe_write64(va, value) };
    if r.faulted == 0 {
        Ok(())
    } else {
        Err(last_fault())
    }
}

/// Calls `va`, which must hold a `ret` (0xC3) if it is executable, or
/// returns the page fault the instruction fetch raised.
///
/// # Safety
///
/// If the fetch from `va` does not fault, the byte there is executed: the
/// caller must have placed a `ret` at the physical address `va` maps to.
pub unsafe fn exec(va: u64) -> Result<(), PageFault> {
    // SAFETY: the caller placed a `ret` behind `va`, so the call returns at
    // once, clobbering nothing; a page fault on the fetch is turned into a
    // result by `trap_dispatch`, which pops the return address the call
    // pushed and resumes after it.
    let r = unsafe { probe_exec(va) };
    if r.faulted == 0 {
        Ok(())
    } else {
        Err(last_fault())
    }
}

/// How a run in ring 3 ended: the trap that brought the CPU back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserTrap {
    /// The vector (0x80: the system-call gate; 14: a page fault).
    pub vector: u64,
    /// The error code (0 for a vector that pushes none).
    pub error: u64,
    /// CR2 for a page fault, else 0.
    pub cr2: u64,
    /// The user's RIP at the trap (after `int 0x80`; the faulting
    /// instruction for a fault).
    pub rip: u64,
    /// The user's CS (its low two bits are the CPL it ran at).
    pub cs: u64,
    /// The user's RAX.
    pub rax: u64,
}

/// The trap that ended the last ring-3 run (single CPU, written by the
/// handler before it jumps back into [`run_user`]).
static mut USER_TRAP: UserTrap = UserTrap {
    vector: 0,
    error: 0,
    cr2: 0,
    rip: 0,
    cs: 0,
    rax: 0,
};

/// Runs user code at CPL 3: `iretq` to `rip` with stack `rsp` and the
/// user's `rdi`, `rsi`, `rdx` = `args`, until its first interrupt or
/// exception (an `int 0x80`, a page fault, anything), which comes back
/// here as the result.
///
/// # Safety
///
/// The installed tables map the user code at `rip` (user, executable) and
/// the kernel half (the image, whose TSS gives the RSP0 stack, and the
/// IDT and GDT); whatever the code may touch is user memory it may
/// change.
pub unsafe fn run_user(rip: u64, rsp: u64, args: [u64; 3]) -> UserTrap {
    // SAFETY: `enter_user` saves what sysv64 makes callee-saved and
    // returns through `leave_user`, which restores it (our caller's
    // promise covers what the user code can reach).
    unsafe { enter_user(rip, rsp, args[0], args[1], args[2]) };
    // SAFETY: single CPU; the handler wrote it before jumping back.
    unsafe { core::ptr::read_volatile(&raw const USER_TRAP) }
}

/// The IDT, written once by [`init`].
struct IdtCell(UnsafeCell<InterruptDescriptorTable>);

// SAFETY: written by `init` before it is loaded and by `set_gate` (CPU 0,
// before any CPU can take that vector); read only by the processors.
unsafe impl Sync for IdtCell {}

static IDT: IdtCell = IdtCell(UnsafeCell::new(InterruptDescriptorTable::new()));

/// Installs the IDT with the stubs for vectors 0–31.
///
/// # Safety
///
/// Call once, at boot, with interrupts off: the IDT is built in place and
/// must not change once the processor uses it.
pub unsafe fn init() {
    // SAFETY: `isr_table` is a static array of 32 addresses defined above.
    let table = unsafe { &isr_table };
    let addr = |v: usize| VirtAddr::new(table[v]);
    // SAFETY: single CPU during boot, interrupts off: nothing else touches
    // the IDT while it is built.
    let idt = unsafe { &mut *IDT.0.get() };
    // SAFETY: each address is the stub for its vector, which saves all
    // state, handles the exception and returns with `iretq` after popping
    // the error code the CPU pushed (or the dummy the stub pushed); device
    // vectors get `irq_ignore`, which acknowledges and returns.
    unsafe {
        idt.divide_error.set_handler_addr(addr(0));
        idt.debug.set_handler_addr(addr(1));
        idt.non_maskable_interrupt.set_handler_addr(addr(2));
        idt.breakpoint.set_handler_addr(addr(3));
        idt.overflow.set_handler_addr(addr(4));
        idt.bound_range_exceeded.set_handler_addr(addr(5));
        idt.invalid_opcode.set_handler_addr(addr(6));
        idt.device_not_available.set_handler_addr(addr(7));
        idt.double_fault
            .set_handler_addr(addr(8))
            .set_stack_index(crate::gdt::DOUBLE_FAULT_IST);
        idt.invalid_tss.set_handler_addr(addr(10));
        idt.segment_not_present.set_handler_addr(addr(11));
        idt.stack_segment_fault.set_handler_addr(addr(12));
        idt.general_protection_fault.set_handler_addr(addr(13));
        idt.page_fault.set_handler_addr(addr(14));
        idt.x87_floating_point.set_handler_addr(addr(16));
        idt.alignment_check.set_handler_addr(addr(17));
        idt.machine_check.set_handler_addr(addr(18));
        idt.simd_floating_point.set_handler_addr(addr(19));
        idt.virtualization.set_handler_addr(addr(20));
        idt.cp_protection_exception.set_handler_addr(addr(21));
        let irq = VirtAddr::new(irq_ignore_addr);
        for v in 32..=255u8 {
            idt[v].set_handler_addr(irq);
        }
        // The one gate ring 3 may use (`int 0x80`): DPL 3.
        idt[0x80]
            .set_handler_addr(VirtAddr::new(syscall_addr))
            .set_privilege_level(PrivilegeLevel::Ring3);
    }
    let ptr = DescriptorTablePointer {
        limit: (core::mem::size_of::<InterruptDescriptorTable>() - 1) as u16,
        base: VirtAddr::from_ptr(IDT.0.get()),
    };
    // SAFETY: the IDT is a static that lives forever and holds valid gates.
    unsafe { lidt(&ptr) };
}

/// Loads the IDT on this CPU (an AP; the BSP's [`init`] loads it).
pub fn load_idt() {
    let ptr = DescriptorTablePointer {
        limit: (core::mem::size_of::<InterruptDescriptorTable>() - 1) as u16,
        base: VirtAddr::from_ptr(IDT.0.get()),
    };
    // SAFETY: the IDT is a static that lives forever and holds valid gates.
    unsafe { lidt(&ptr) };
}

/// Points the interrupt gate of `vector` (32..=255) at `handler`.
///
/// # Safety
///
/// `handler` is an interrupt entry that saves what it clobbers and
/// returns with `iretq`; no CPU can take `vector` while the gate changes.
pub unsafe fn set_gate(vector: u8, handler: u64) {
    // SAFETY: no CPU takes this vector now (our caller's promise); the
    // 16-byte gate is rewritten in place.
    let idt = unsafe { &mut *IDT.0.get() };
    // SAFETY: our caller's promise about `handler`.
    unsafe { idt[vector].set_handler_addr(VirtAddr::new(handler)) };
}

/// Called by the stubs with the saved state.
#[no_mangle]
extern "C" fn trap_dispatch(frame: &mut TrapFrame) {
    if frame.cs & 3 == 3 {
        // From ring 3: whatever it is ends the run; back to `run_user`.
        let trap = UserTrap {
            vector: frame.vector,
            error: frame.error,
            cr2: if frame.vector == 14 {
                Cr2::read_raw()
            } else {
                0
            },
            rip: frame.rip,
            cs: frame.cs,
            rax: frame.rax,
        };
        // SAFETY: single CPU; `run_user` reads it after `leave_user`.
        unsafe { core::ptr::write_volatile(&raw mut USER_TRAP, trap) };
        // SAFETY: a trap from CPL 3 only happens inside `enter_user`,
        // which saved the stack `leave_user` returns on; this handler's
        // frame on the RSP0 stack is abandoned (it owns nothing).
        unsafe { leave_user() }
    }
    if frame.vector == 14 {
        let cr2 = Cr2::read_raw();
        // SAFETY: `probe_addrs` is a static array defined above.
        let p = unsafe { &probe_addrs };
        let resume = if frame.rip == p[0] {
            Some(p[1])
        } else if frame.rip == p[2] {
            Some(p[3])
        } else if frame.rip == frame.rdi && return_address(frame) == Some(p[4]) {
            // The fetch at the target of `probe_exec`'s call faulted (the
            // fault's RIP is the target, SDM Vol. 3A §6.15 "Interrupt 14"):
            // drop the return address the call pushed and resume after
            // the call.
            frame.rsp += 8;
            Some(p[4])
        } else {
            None
        };
        if let Some(resume) = resume {
            // SAFETY: this CPU's entry; its probe reads it after we
            // return.
            unsafe {
                core::ptr::write_volatile(
                    &raw mut LAST_FAULT[crate::smp::this_cpu()],
                    PageFault {
                        cr2,
                        error: frame.error,
                    },
                )
            };
            frame.rax = 0;
            frame.rdx = 1;
            frame.rip = resume;
            return;
        }
        crate::println!(
            "UNEXPECTED page fault: CR2={:#x} error={:#x} RIP={:#x} RSP={:#x}",
            cr2,
            frame.error,
            frame.rip,
            frame.rsp
        );
    } else {
        crate::println!(
            "UNEXPECTED exception {} ({}): error={:#x} RIP={:#x} RSP={:#x}",
            frame.vector,
            name(frame.vector),
            frame.error,
            frame.rip,
            frame.rsp
        );
    }
    crate::println!("{:x?}", frame);
    crate::exit(false);
}

/// The word on top of the interrupted stack: the return address when the
/// fault hit the first instruction of a called function. `None` when the
/// stack pointer is not the kernel's stack.
fn return_address(frame: &TrapFrame) -> Option<u64> {
    // Only the address is taken.
    let lo = (&raw const crate::boot::BOOT_STACK) as u64;
    let hi = lo + crate::boot::STACK_SIZE as u64;
    (frame.rsp >= lo && frame.rsp + 8 <= hi && frame.rsp.is_multiple_of(8)).then(|| {
        // SAFETY: an aligned word inside the kernel's stack, which is
        // mapped and not being written while the handler runs.
        unsafe { (frame.rsp as *const u64).read() }
    })
}

fn name(vector: u64) -> &'static str {
    match vector {
        0 => "#DE divide error",
        1 => "#DB debug",
        2 => "NMI",
        3 => "#BP breakpoint",
        4 => "#OF overflow",
        5 => "#BR bound range",
        6 => "#UD invalid opcode",
        7 => "#NM device not available",
        8 => "#DF double fault",
        10 => "#TS invalid TSS",
        11 => "#NP segment not present",
        12 => "#SS stack fault",
        13 => "#GP general protection",
        14 => "#PF page fault",
        16 => "#MF x87",
        17 => "#AC alignment check",
        18 => "#MC machine check",
        19 => "#XM SIMD",
        20 => "#VE virtualization",
        21 => "#CP control protection",
        _ => "reserved",
    }
}
