//! Boot code and exception vectors.
//!
//! `_start` runs first on every core QEMU starts: secondary cores park, the
//! boot core drops from EL2 to EL1 if it started there, enables FP/SIMD,
//! sets up the stack, clears `.bss`, installs the vectors and calls
//! `kernel_main` (QEMU passes no device-tree pointer to an ELF kernel: see
//! `fdt.rs`).
//!
//! The vectors turn a data abort at one of the two probe instructions
//! (`pgk_probe_load_insn`, `pgk_probe_store_insn`), and an instruction
//! abort at the target of the exec probe, into a returned fault (see
//! `probe.rs`); every other exception ends the run through
//! `unexpected_exception`.

use core::arch::global_asm;

global_asm!(
    r#"
.section .text.boot, "ax"
.global _start
_start:
    // Park every core but 0.0.0.0 (MPIDR_EL1 Aff3..Aff0, Arm ARM D19.2.86).
    mrs     x1, mpidr_el1
    ldr     x2, =0xff00ffffff
    and     x1, x1, x2
    cbz     x1, 2f
1:  wfe
    b       1b

2:  // CurrentEL[3:2] is the exception level.
    mrs     x1, CurrentEL
    lsr     x1, x1, #2
    cmp     x1, #2
    b.ne    3f
    // At EL2: EL1 runs AArch64 (HCR_EL2.RW, bit 31), may read the physical
    // and virtual counters (CNTHCTL_EL2.EL1PCTEN/EL1PCEN, bits 0-1), with
    // no virtual counter offset; return to EL1h with DAIF masked.
    mov     x1, #0x80000000
    msr     hcr_el2, x1
    mov     x1, #3
    msr     cnthctl_el2, x1
    msr     cntvoff_el2, xzr
    mov     x1, #0x3c5
    msr     spsr_el2, x1
    adr     x1, 3f
    msr     elr_el2, x1
    eret

3:  // EL1. CPACR_EL1.FPEN (bits 21:20) = 0b11: FP/SIMD does not trap;
    // Rust code uses SIMD registers for copies.
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    // The new CPACR_EL1 applies to the instructions after this isb.
    isb

    ldr     x1, =__stack_top
    mov     sp, x1

    ldr     x1, =__bss_start
    ldr     x2, =__bss_end
4:  cmp     x1, x2
    b.hs    5f
    stp     xzr, xzr, [x1], #16
    b       4b

5:  ldr     x1, =pgk_vectors
    msr     vbar_el1, x1
    // Exceptions taken after this isb use the new VBAR_EL1.
    isb

    bl      kernel_main
6:  wfe
    b       6b

// ---------------------------------------------------------------------
// Exception vectors (Arm ARM D1.10.2): 16 entries of 0x80 bytes, the
// table aligned to 2 KiB. Only "current EL with SP_ELx, synchronous" can
// be an expected probe fault; every other entry reports and stops.
.section .text.vectors, "ax"
.balign 2048
.global pgk_vectors
pgk_vectors:
    .balign 0x80
    mov     x0, #0
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #1
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #2
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #3
    b       pgk_unexpected
    // Current EL with SP_ELx.
    .balign 0x80
    b       pgk_sync_spx
    .balign 0x80
    mov     x0, #5
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #6
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #7
    b       pgk_unexpected
    // Lower EL, AArch64.
    .balign 0x80
    mov     x0, #8
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #9
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #10
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #11
    b       pgk_unexpected
    // Lower EL, AArch32.
    .balign 0x80
    mov     x0, #12
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #13
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #14
    b       pgk_unexpected
    .balign 0x80
    mov     x0, #15
    b       pgk_unexpected

// Synchronous exception at EL1. x9-x11 are scratch: the probes are called
// as functions under the C ABI, where they are caller-saved.
pgk_sync_spx:
    // ESR_EL1.EC (bits 31:26): 0x25 data abort, 0x21 instruction abort,
    // both taken without a change of EL. Anything else is unexpected.
    mrs     x11, esr_el1
    lsr     x11, x11, #26
    cmp     x11, #0x21
    b.eq    12f
    cmp     x11, #0x25
    b.ne    9f
    mrs     x9, elr_el1
    adr     x10, pgk_probe_load_insn
    cmp     x9, x10
    b.eq    7f
    adr     x10, pgk_probe_store_insn
    cmp     x9, x10
    b.eq    8f
9:  mov     x0, #4
    b       pgk_unexpected
7:  adr     x10, pgk_probe_load_fixup
    b       10f
8:  adr     x10, pgk_probe_store_fixup
    b       10f
12: // An instruction abort is expected only at the exec probe's target
    // (ELR_EL1 = x0) while called from the probe (x30 = its return label).
    mrs     x9, elr_el1
    cmp     x9, x0
    b.ne    9b
    adr     x10, pgk_probe_exec_ret
    cmp     x30, x10
    b.ne    9b
10: // Resume at the probe's fixup with x1 = ESR_EL1, x2 = FAR_EL1.
    msr     elr_el1, x10
    mrs     x1, esr_el1
    mrs     x2, far_el1
    eret

pgk_unexpected:
    // x0 = vector index. Never returns: a fresh stack is fine.
    mrs     x1, esr_el1
    mrs     x2, far_el1
    mrs     x3, elr_el1
    ldr     x4, =__stack_top
    mov     sp, x4
    bl      unexpected_exception
11: wfe
    b       11b

// ---------------------------------------------------------------------
// Probes. In: x0 = address (and x1 = value for the store).
// Out: x1 = 0 on success (x0 = the loaded value), or x1 = ESR_EL1 and
// x2 = FAR_EL1 of the data abort the access raised.
.section .text.probe, "ax"
.global pgk_probe_load
pgk_probe_load:
    mov     x1, xzr
.global pgk_probe_load_insn
pgk_probe_load_insn:
    ldr     x0, [x0]
pgk_probe_load_fixup:
    ret

.global pgk_probe_store
pgk_probe_store:
.global pgk_probe_store_insn
pgk_probe_store_insn:
    str     x1, [x0]
    mov     x1, xzr
    ret
pgk_probe_store_fixup:
    ret

// Exec probe. In: x0 = address of a `ret` instruction. Calls it; out:
// x1 = 0 if it ran, or x1 = ESR_EL1, x2 = FAR_EL1 of the instruction
// abort the fetch raised. x3 holds the caller's return address meanwhile.
.global pgk_probe_exec
pgk_probe_exec:
    mov     x3, x30
    mov     x1, xzr
    blr     x0
pgk_probe_exec_ret:
    mov     x30, x3
    ret
"#
);
