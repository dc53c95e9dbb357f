//! Boot entry, the trap vector and the fault probes.
//!
//! - `_start`: OpenSBI enters the boot hart here in S-mode with
//!   translation off, a0 = hart ID, a1 = device tree. A lottery on a
//!   word in `.data` lets only the first hart through (any other one is
//!   stopped with `sbi_hart_stop` and started later as a secondary): a
//!   second hart in `_start` would zero `.bss` under the first and run
//!   the suite on the same RAM. The winner zeroes `.bss`,
//!   takes the hart's stack (`__stacks_start` + 64 KiB × (ID + 1)) and
//!   calls `kmain`. `_secondary` is where `sbi_hart_start` starts the
//!   others (a0 = hart ID, a1 = its stack top) before `secondary_main`.
//!   Both keep the hart ID in `tp` ([`crate::smp::this_hart`]).
//! - The trap vector (`stvec`, direct mode) serves only the probes: a load
//!   or store page fault at the probe instruction, or an instruction page
//!   fault while the fetch probe runs, resumes after the probe with the
//!   cause in a1 (privileged spec, "Supervisor Cause Register": 12
//!   instruction, 13 load, 15 store/AMO page fault). It uses only
//!   temporaries (t0..t2) and a1/a2, which the probes, being calls,
//!   may clobber. Any other trap prints the cause and fails the run.
//!
//! A trap from U-mode ends [`run_user`]: the vector restores the kernel
//! stack and registers `enter_user` saved and returns to its caller.
//!
//! The probes are assembled with `.option norvc`, so each instruction the
//! vector compares `sepc` with is 4 bytes long.

use core::arch::{asm, global_asm};

global_asm!(
    r#"
    .section .text.entry, "ax"
    .option push
    .option norvc
    .option arch, +a
    .global _start
_start:
    /* The hart lottery: only the first hart here boots; any other one
       (firmware that enters several harts) counts itself and stops
       through HSM, from where `bring_up` starts it as a secondary. */
    la t0, boot_lottery
    li t1, 1
    amoadd.w t1, t1, (t0)
    beqz t1, 0f
    li a7, 0x48534d
    li a6, 1
    ecall
8:  wfi
    j 8b
0:  mv tp, a0
    la t0, __bss_start
    la t1, __bss_end
1:  bgeu t0, t1, 2f
    sd zero, 0(t0)
    addi t0, t0, 8
    j 1b
2:  la sp, __stacks_start
    addi t0, a0, 1
    slli t0, t0, 16
    add sp, sp, t0
    la t0, trap_vector
    csrw stvec, t0
    call kmain
3:  wfi
    j 3b

    .global _secondary
_secondary:
    mv tp, a0
    mv sp, a1
    la t0, trap_vector
    csrw stvec, t0
    call secondary_main
4:  wfi
    j 4b

    .section .data.boot_lottery, "aw"
    .align 2
    .global boot_lottery
boot_lottery:
    .word 0

    .section .text.entry, "ax"
    .align 4
    .global trap_vector
trap_vector:
    /* From U-mode (sstatus.SPP = 0): back to `enter_user`'s caller. */
    csrr t0, sstatus
    andi t0, t0, 0x100
    beqz t0, 7f
    csrr t0, scause
    csrr t1, sepc
    la t2, probe_load_insn
    beq t1, t2, 5f
    la t2, probe_store_insn
    beq t1, t2, 5f
    li t2, 12
    bne t0, t2, 9f
    la t2, probe_exec_ret
    bne ra, t2, 9f
    /* A fetch fault while the fetch probe ran: resume at its return. */
    csrw sepc, ra
    j 6f
5:  addi t1, t1, 4
    csrw sepc, t1
6:  mv a1, t0
    sret
7:  csrr a1, scause
    csrr sp, sscratch
    ld ra, 0(sp)
    ld s0, 8(sp)
    ld s1, 16(sp)
    ld s2, 24(sp)
    ld s3, 32(sp)
    ld s4, 40(sp)
    ld s5, 48(sp)
    ld s6, 56(sp)
    ld s7, 64(sp)
    ld s8, 72(sp)
    ld s9, 80(sp)
    ld s10, 88(sp)
    ld s11, 96(sp)
    ld gp, 104(sp)
    addi sp, sp, 112
    ret
9:  call trap_unexpected
    j 9b

    /* enter_user(pc, arg) -> (a0 = the user's a0, a1 = scause of the trap
       that ended it: 8 for its ECALL). Saves the callee-saved registers,
       keeps the kernel stack in sscratch and enters U-mode at `pc` with
       a0 = `arg` (sstatus.SPP = 0, SPIE = 0: interrupts stay off). */
    .global enter_user
enter_user:
    addi sp, sp, -112
    sd ra, 0(sp)
    sd s0, 8(sp)
    sd s1, 16(sp)
    sd s2, 24(sp)
    sd s3, 32(sp)
    sd s4, 40(sp)
    sd s5, 48(sp)
    sd s6, 56(sp)
    sd s7, 64(sp)
    sd s8, 72(sp)
    sd s9, 80(sp)
    sd s10, 88(sp)
    sd s11, 96(sp)
    sd gp, 104(sp)
    csrw sscratch, sp
    csrw sepc, a0
    li t0, 0x120
    csrc sstatus, t0
    mv a0, a1
    sret

    /* probe_load(va) -> (a0 = value, a1 = 0 or scause) */
    .global probe_load
probe_load:
    li a1, 0
probe_load_insn:
    ld a0, 0(a0)
    ret

    /* probe_store(va, value) -> (a0 = 0, a1 = 0 or scause) */
    .global probe_store
probe_store:
    mv a3, a1
    li a1, 0
probe_store_insn:
    sd a3, 0(a0)
    li a0, 0
    ret

    /* probe_exec(va) -> (a0 = 0, a1 = 0 or scause): calls va, which must
       hold a `ret` (or fault on the fetch). */
    .global probe_exec
probe_exec:
    addi sp, sp, -16
    sd ra, 0(sp)
    li a1, 0
    jalr ra, 0(a0)
probe_exec_ret:
    ld ra, 0(sp)
    addi sp, sp, 16
    li a0, 0
    ret
    .option pop
"#
);

/// What a probe returns in a0 and a1.
#[repr(C)]
#[derive(Clone, Copy)]
struct Probe {
    value: u64,
    cause: u64,
}

extern "C" {
    fn probe_load(va: u64) -> Probe;
    fn probe_store(va: u64, value: u64) -> Probe;
    fn probe_exec(va: u64) -> Probe;
    fn enter_user(pc: u64, arg: u64) -> Probe;
}

/// `scause` of an environment call from U-mode.
pub const CAUSE_USER_ECALL: u64 = 8;

/// Runs U-mode code at `pc` with a0 = `arg` until it traps; returns its
/// a0 and the trap's `scause` ([`CAUSE_USER_ECALL`] when it called the
/// kernel).
///
/// # Safety
///
/// The installed tables map `pc` user-executable; the kernel's code and
/// stack stay mapped for the trap back (they are, in every space the
/// kernel builds). Whatever the code does in U-mode cannot touch
/// supervisor-only pages.
pub unsafe fn run_user(pc: u64, arg: u64) -> (u64, u64) {
    // SAFETY: our caller's promise; the trap vector restores the
    // callee-saved registers and the stack `enter_user` saved.
    let p = unsafe { enter_user(pc, arg) };
    (p.value, p.cause)
}

/// How many harts entered `_start` (1 unless the firmware let several in).
pub fn harts_at_start() -> u32 {
    extern "C" {
        static boot_lottery: core::sync::atomic::AtomicU32;
    }
    // SAFETY: a word in `.data` that `_start` changes only atomically.
    // Relaxed: a count for a message.
    unsafe { boot_lottery.load(core::sync::atomic::Ordering::Relaxed) }
}

/// `scause` of an instruction page fault.
pub const CAUSE_FETCH_PAGE_FAULT: u64 = 12;
/// `scause` of a load page fault.
pub const CAUSE_LOAD_PAGE_FAULT: u64 = 13;
/// `scause` of a store/AMO page fault.
pub const CAUSE_STORE_PAGE_FAULT: u64 = 15;

/// Loads the u64 at `va`; `Err(scause)` if the access faulted with a page
/// fault.
pub fn read_u64(va: u64) -> Result<u64, u64> {
    // SAFETY: a load whose page fault the trap vector turns into a return
    // value; `va` is only read.
    let p = unsafe { probe_load(va) };
    if p.cause == 0 {
        Ok(p.value)
    } else {
        Err(p.cause)
    }
}

/// Stores `value` at `va`; `Err(scause)` if the access faulted.
///
/// # Safety
///
/// A store that does not fault must not break the kernel: `va` is not
/// memory the kernel uses.
pub unsafe fn write_u64(va: u64, value: u64) -> Result<(), u64> {
    // SAFETY: the caller's promise; a faulting store is turned into a
    // return value.
    let p = unsafe { probe_store(va, value) };
    if p.cause == 0 {
        Ok(())
    } else {
        Err(p.cause)
    }
}

/// Calls `va`; `Err(scause)` if the fetch faulted.
///
/// # Safety
///
/// If the fetch at `va` does not fault, the instruction there is a `ret`.
pub unsafe fn exec(va: u64) -> Result<(), u64> {
    // SAFETY: the caller's promise.
    let p = unsafe { probe_exec(va) };
    if p.cause == 0 {
        Ok(())
    } else {
        Err(p.cause)
    }
}

/// Any trap but a probe's: print what happened and fail the run.
#[no_mangle]
extern "C" fn trap_unexpected() -> ! {
    let (cause, epc, tval): (u64, u64, u64);
    // SAFETY: reads of the trap CSRs.
    unsafe {
        asm!("csrr {0}, scause", "csrr {1}, sepc", "csrr {2}, stval",
            out(reg) cause, out(reg) epc, out(reg) tval, options(nomem, nostack))
    };
    crate::println!(
        "UNEXPECTED trap on hart {}: scause {cause:#x} sepc {epc:#x} stval {tval:#x}",
        crate::smp::this_hart()
    );
    crate::println!("0 passed, 1 failed");
    crate::sbi::shutdown(false)
}
