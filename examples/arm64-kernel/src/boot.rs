//! Boot code, the early page tables, exception vectors and the EL0 entry.
//!
//! # Boot sequence
//!
//! 1. `_start` (section `.text.boot`, linked and run at its physical
//!    address with the MMU off) parks every core but the boot core (the
//!    others are started later through PSCI at `pgk_secondary_entry`,
//!    see `smp.rs`), drops
//!    from EL2 to EL1 if it started there and enables FP/SIMD.
//! 2. It builds the early tables in `.boot.tables`: one root and one
//!    level-1 table whose entry `i` maps physical GiB `i` (GiB 0, the
//!    devices, as Device-nGnRE execute-never; GiB 1, the first GiB of RAM
//!    holding the device tree, the image and the table pool, as Normal
//!    memory, EL1 read-write-execute). Root entry 0 (the identity map,
//!    TTBR0_EL1) and the root entries of the linear map, the image and the
//!    devices (TTBR1_EL1, see `memory.rs`) all point at that level-1 table
//!    (the identity map and the linear map share root entry 0: both map
//!    physical GiB `i` at GiB `i` of their half).
//! 3. It sets MAIR_EL1 to the format's [`MAIR_VALUE`], TCR_EL1 to
//!    [`EARLY_TCR`] (48-bit halves for both TTBRs, each through a whole
//!    512-entry root, as Linux configures arm64) plus the CPU's PARange,
//!    TTBR0_EL1 and TTBR1_EL1 to the same root, and turns the MMU on. It
//!    keeps running through the identity map and jumps to
//!    `pgk_kernel_entry` in the upper half.
//! 4. `pgk_kernel_entry` (upper half, through TTBR1_EL1) sets the stack,
//!    clears `.bss`, installs the vectors and calls `kernel_main`, which
//!    builds the real kernel map with pgtable and switches TTBR1_EL1 to it
//!    through [`switch_ttbr1`] (which runs `pgk_replace_ttbr1` from the
//!    identity map, so translations of the old map and of the new one are
//!    never live together), then installs the suite's test space in
//!    TTBR0_EL1: from then on nothing uses the identity map.
//!
//! QEMU passes no device-tree pointer to an ELF kernel: see `fdt.rs`.
//!
//! # Exceptions
//!
//! The vectors turn a data abort at one of the two probe instructions
//! (`pgk_probe_load_insn`, `pgk_probe_store_insn`), and an instruction
//! abort at the target of the exec probe, into a returned fault (see
//! `probe.rs`); a synchronous exception from EL0 ends the current EL0 run
//! (`pgk_enter_user`, see `user.rs`); every other exception ends the run
//! through `unexpected_exception`.

use core::arch::{asm, global_asm};

use pgtable_arm64::bits::{
    AF, ATTR_INDX_SHIFT, MAIR_IDX_DEVICE_NGNRE, MAIR_IDX_NORMAL, PXN, SH_INNER, TABLE_OR_PAGE, UXN,
    VALID,
};
use pgtable_arm64::regs::{SCTLR_MMU_BITS, SCTLR_MMU_CLEAR, TCR_DS};
use pgtable_arm64::MAIR_VALUE;

use crate::geom;
use crate::memory::{DEVICE_OFFSET, KIMAGE_OFFSET, PAGE_OFFSET, RAM_BASE};

/// The early blocks' shareability: Inner Shareable in descriptor bits
/// 9:8, except with TCR_EL1.DS = 1 (52-bit builds with 4 or 16 KiB pages),
/// where those bits hold OA\[51:50\] (0 for the first 4 GiB) and
/// shareability comes from TCR_EL1.SH0/SH1 (Arm ARM D8.3.2, FEAT_LPA2).
const EARLY_SH: u64 = if geom::DS { 0 } else { SH_INNER };
/// An early 1 GiB block of Normal memory: EL1 read-write-execute, global,
/// never executable at EL0 (the early map is for the boot only).
const EARLY_RAM_BLOCK: u64 =
    VALID | AF | EARLY_SH | UXN | (MAIR_IDX_NORMAL << ATTR_INDX_SHIFT) | RAM_BASE;
/// The early 1 GiB block of devices at physical 0 (the UART is in it):
/// Device-nGnRE, EL1 read-write, never executable.
const EARLY_DEVICE_BLOCK: u64 = VALID | AF | UXN | PXN | (MAIR_IDX_DEVICE_NGNRE << ATTR_INDX_SHIFT);
/// A table descriptor's type bits.
const TABLE: u64 = VALID | TABLE_OR_PAGE;

/// TCR_EL1 of the early map, without IPS (set from PARange at boot) and
/// without hardware access-flag and dirty-state updates (`kernel_main`
/// switches to pgtable's value for the build's geometry in two steps, see
/// [`switch_ttbr1`] and [`switch_ttbr0_tcr`], and checks that the early
/// value is the 4 KiB one pgtable computes):
///
/// | field | value |
/// |---|---|
/// | T0SZ, T1SZ | 16: 48-bit halves, each with its own 512-entry root (Linux `TCR_T0SZ(48)`, `TCR_T1SZ(48)`) |
/// | IRGN0/1, ORGN0/1 | 0b01: walks Write-Back Read/Write-Allocate |
/// | SH0/1 | 0b11: Inner Shareable |
/// | TG0 / TG1 | 0b00 / 0b10: 4 KiB granule, in every build |
/// | EPD0, EPD1 | 0: both halves are walked |
/// | DS | 1 in the builds whose geometry needs it (`geom::DS`): DS applies to both halves, and the early identity map is still in TTBR0_EL1 when TTBR1_EL1 takes the kernel map |
pub const EARLY_TCR: u64 = 16
    | 0b01 << 8
    | 0b01 << 10
    | 0b11 << 12
    | 16 << 16
    | 0b01 << 24
    | 0b01 << 26
    | 0b11 << 28
    | 0b10 << 30
    | if geom::DS { TCR_DS } else { 0 };

/// The TCR_EL1 fields of the TTBR0_EL1 walks (T0SZ, EPD0, IRGN0, ORGN0,
/// SH0, TG0: bits 15:0), which keep their early values until
/// [`switch_ttbr0_tcr`].
pub const TCR_TTBR0_FIELDS: u64 = 0xffff;

/// The byte offset of the root entry that maps `va` (VA bits 47:39).
const fn root_slot(va: u64) -> u64 {
    ((va >> 39) & 0x1ff) * 8
}

/// The level-1 slot of RAM_BASE (its GiB number): the early level-1 table
/// maps physical GiB `i` at entry `i` in every region, which holds because
/// the regions are 512 GiB aligned (memory.rs).
const _: () = assert!(RAM_BASE >> 30 == 1);

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

    // The early tables (x0 = root, x1 = level 1, x0 + 64 KiB = an empty
    // table of 64 KiB, a root of any geometry, for pgk_replace_ttbr1 and
    // switch_ttbr0_tcr). The loader does not clear them.
    adrp    x0, pgk_boot_tables
    add     x1, x0, #1, lsl #12
    mov     x2, x0
    add     x3, x0, #32, lsl #12
4:  stp     xzr, xzr, [x2], #16
    cmp     x2, x3
    b.lo    4b
    ldr     x2, ={device_block}
    str     x2, [x1]
    ldr     x2, ={ram_block}
    str     x2, [x1, #8]
    orr     x2, x1, #{table}
    str     x2, [x0]
    str     x2, [x0, #{slot_linear}]
    str     x2, [x0, #{slot_image}]
    str     x2, [x0, #{slot_device}]
    // The tables were written with the MMU off (non-cacheable): drop any
    // line of them a cache may still hold, so the walks (cacheable) read
    // what was written (Arm ARM D7.5.9; Linux invalidates its early tables
    // the same way). Line size = 4 << CTR_EL0.DminLine (bits 19:16).
    dsb     sy
    mrs     x3, ctr_el0
    ubfx    x3, x3, #16, #4
    mov     x4, #4
    lsl     x4, x4, x3
    mov     x2, x0
    add     x3, x0, #32, lsl #12
5:  dc      ivac, x2
    add     x2, x2, x4
    cmp     x2, x3
    b.lo    5b
    dsb     sy

    ldr     x2, ={mair}
    msr     mair_el1, x2
    // TCR_EL1.IPS (bits 34:32) = ID_AA64MMFR0_EL1.PARange, at most 48
    // bits (52 with TCR_EL1.DS = 1, where IPS = 0b110 means 52 bits).
    mrs     x3, id_aa64mmfr0_el1
    and     x3, x3, #0xf
    mov     x4, #{ips_max}
    cmp     x3, x4
    csel    x3, x3, x4, lo
    ldr     x2, ={tcr}
    orr     x2, x2, x3, lsl #32
    msr     tcr_el1, x2
    msr     ttbr0_el1, x0
    msr     ttbr1_el1, x0
    // The register writes take effect, then no stale translation is left.
    isb
    tlbi    vmalle1
    dsb     nsh
    isb
    mrs     x2, sctlr_el1
    ldr     x3, ={sctlr_set}
    orr     x2, x2, x3
    ldr     x3, ={sctlr_clear}
    bic     x2, x2, x3
    msr     sctlr_el1, x2
    // Instructions after this isb are translated: this code goes on
    // through the identity map, then jumps to the upper half.
    isb
    ldr     x2, =pgk_kernel_entry
    br      x2

// pgk_replace_ttbr1(x0 = the new TTBR1_EL1, x1 = the new TCR_EL1).
// Called from the upper half, runs from the identity map: TTBR1_EL1 first
// gets an empty table and the local TLB is flushed, so no translation of
// the old tables is live when the new ones come in (a TLB holding both,
// of different sizes for one address, could raise a TLB conflict abort;
// Linux swaps its kernel tables through the identity map,
// `idmap_cpu_replace_ttbr1`, for the same reason). The new TCR_EL1 (the
// TTBR1 walks in the build's granule and VA size, the TTBR0 fields still
// the early map's) is written while TTBR1_EL1 holds the empty table, so
// no walk of the kernel map ever used the early granule. Uses x0-x2
// only, no stack (the stack is in the upper half).
.global pgk_replace_ttbr1
pgk_replace_ttbr1:
    adrp    x2, pgk_boot_tables
    add     x2, x2, #16, lsl #12
    msr     ttbr1_el1, x2
    isb
    tlbi    vmalle1
    dsb     nsh
    isb
    msr     tcr_el1, x1
    // The new TCR_EL1 applies to the walks after this isb.
    isb
    msr     ttbr1_el1, x0
    isb
    ret

.section .boot.tables, "aw", %nobits
.balign 65536
.global pgk_boot_tables
pgk_boot_tables:
    .skip   2 * 65536

// ---------------------------------------------------------------------
// The kernel proper, in the upper half.
.section .text.entry, "ax"
pgk_kernel_entry:
    ldr     x1, =__stack_top
    mov     sp, x1
    // TPIDR_EL1 = 0 marks the boot CPU for pgk_unexpected (smp.rs).
    msr     tpidr_el1, xzr

    ldr     x1, =__bss_start
    ldr     x2, =__bss_end
6:  cmp     x1, x2
    b.hs    7f
    stp     xzr, xzr, [x1], #16
    b       6b

7:  ldr     x1, =pgk_vectors
    msr     vbar_el1, x1
    // Exceptions taken after this isb use the new VBAR_EL1.
    isb

    bl      kernel_main
8:  wfe
    b       8b

// pgk_switch_ttbr1(x0 = the new TTBR1_EL1, x1 = the new TCR_EL1): calls pgk_replace_ttbr1 at its
// identity-mapped (physical) address, out of reach of a PC-relative branch.
.global pgk_switch_ttbr1
pgk_switch_ttbr1:
    ldr     x9, =pgk_replace_ttbr1
    mov     x10, x30
    blr     x9
    mov     x30, x10
    ret

// Addresses of the boot part, as data: the upper half cannot reach them
// with PC-relative instructions.
.section .rodata.boot_symbols, "a"
.balign 8
.global pgk_image_start_pa
pgk_image_start_pa:
    .quad   __image_start_pa
.global pgk_kimage_offset
pgk_kimage_offset:
    .quad   __kimage_offset
.global pgk_empty_table_pa
pgk_empty_table_pa:
    .quad   pgk_boot_tables + 65536

// ---------------------------------------------------------------------
// Exception vectors (Arm ARM D1.10.2): 16 entries of 0x80 bytes, the
// table aligned to 2 KiB. "Current EL with SP_ELx, synchronous" can be an
// expected probe fault and "lower EL, AArch64, synchronous" ends an EL0
// run; every other entry reports and stops.
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
    b       pgk_sync_lower
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
    // x0 = vector index. Never returns: a fresh stack is fine. A
    // secondary CPU keeps its own stack top in TPIDR_EL1 (smp.rs); the
    // boot CPU's is 0 and takes the boot stack.
    mrs     x1, esr_el1
    mrs     x2, far_el1
    mrs     x3, elr_el1
    mrs     x4, tpidr_el1
    cbnz    x4, 13f
    ldr     x4, =__stack_top
13: mov     sp, x4
    bl      unexpected_exception
11: wfe
    b       11b

// ---------------------------------------------------------------------
// EL0 runs. pgk_enter_user(x0 = entry, x1 = user stack pointer, x2, x3 =
// the user's x0, x1): saves the callee-saved registers on the kernel
// stack, clears every other register and returns to EL0t at `entry`
// with DAIF masked. Any synchronous exception from EL0 (an SVC, or a
// fault) comes back through pgk_sync_lower, which returns from
// pgk_enter_user with x0 = ESR_EL1, x1 = FAR_EL1, x2 = the user's x0,
// x3 = ELR_EL1. SP_EL1 is not used at EL0, so it still points at the
// saved registers when the exception is taken.
.section .text.user_entry, "ax"
.global pgk_enter_user
pgk_enter_user:
    stp     x29, x30, [sp, #-96]!
    stp     x19, x20, [sp, #16]
    stp     x21, x22, [sp, #32]
    stp     x23, x24, [sp, #48]
    stp     x25, x26, [sp, #64]
    stp     x27, x28, [sp, #80]
    msr     elr_el1, x0
    msr     sp_el0, x1
    // SPSR_EL1: M[3:0] = 0b0000 (EL0t), D, A, I, F masked (bits 9:6).
    mov     x4, #0x3c0
    msr     spsr_el1, x4
    mov     x0, x2
    mov     x1, x3
    mov     x2, xzr
    mov     x3, xzr
    mov     x4, xzr
    mov     x5, xzr
    mov     x6, xzr
    mov     x7, xzr
    mov     x8, xzr
    mov     x9, xzr
    mov     x10, xzr
    mov     x11, xzr
    mov     x12, xzr
    mov     x13, xzr
    mov     x14, xzr
    mov     x15, xzr
    mov     x16, xzr
    mov     x17, xzr
    mov     x18, xzr
    mov     x19, xzr
    mov     x20, xzr
    mov     x21, xzr
    mov     x22, xzr
    mov     x23, xzr
    mov     x24, xzr
    mov     x25, xzr
    mov     x26, xzr
    mov     x27, xzr
    mov     x28, xzr
    mov     x29, xzr
    mov     x30, xzr
    eret

pgk_sync_lower:
    mov     x2, x0
    mrs     x0, esr_el1
    mrs     x1, far_el1
    mrs     x3, elr_el1
    ldp     x19, x20, [sp, #16]
    ldp     x21, x22, [sp, #32]
    ldp     x23, x24, [sp, #48]
    ldp     x25, x26, [sp, #64]
    ldp     x27, x28, [sp, #80]
    ldp     x29, x30, [sp], #96
    ret

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
.global pgk_probe_load_fixup
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
"#,
    device_block = const EARLY_DEVICE_BLOCK,
    ram_block = const EARLY_RAM_BLOCK,
    table = const TABLE,
    slot_linear = const root_slot(PAGE_OFFSET),
    slot_image = const root_slot(KIMAGE_OFFSET),
    slot_device = const root_slot(DEVICE_OFFSET),
    mair = const MAIR_VALUE,
    tcr = const EARLY_TCR,
    ips_max = const if geom::DS { 6 } else { 5 },
    sctlr_set = const SCTLR_MMU_BITS,
    sctlr_clear = const SCTLR_MMU_CLEAR,
);

extern "C" {
    static pgk_image_start_pa: u64;
    static pgk_kimage_offset: u64;
    static pgk_empty_table_pa: u64;
}

/// The physical address the image starts at (`__image_start_pa`).
pub fn image_start_pa() -> u64 {
    // SAFETY: a word of `.rodata` the linker filled in; never written.
    unsafe { pgk_image_start_pa }
}

/// The linker script's `KIMAGE_OFFSET`.
pub fn linked_kimage_offset() -> u64 {
    // SAFETY: as in `image_start_pa`.
    unsafe { pgk_kimage_offset }
}

/// Makes `ttbr1` (the root of a `VaRange::Upper` space) the upper half's
/// translation and `tcr` TCR_EL1, through `pgk_replace_ttbr1`.
///
/// # Safety
///
/// TTBR0_EL1 still holds the early identity map (the switch runs from
/// it), and `tcr` keeps the early map's TTBR0 fields
/// ([`TCR_TTBR0_FIELDS`]) and its DS. The new tables are of the geometry
/// `tcr` gives TTBR1_EL1, map the code, stack, data and device this
/// kernel uses at the same addresses as the old ones, and stay alive
/// while installed.
pub unsafe fn switch_ttbr1(ttbr1: u64, tcr: u64) {
    // SAFETY: `pgk_switch_ttbr1` uses x0-x2, x9, x10 and x30 (all
    // declared clobbered through the C ABI) and no memory; our caller
    // guarantees that the new tables and TCR_EL1 map everything used
    // after it.
    unsafe {
        asm!(
            "bl pgk_switch_ttbr1",
            in("x0") ttbr1,
            in("x1") tcr,
            clobber_abi("C"),
            options(nostack),
        );
    }
}

/// Gives the TTBR0_EL1 walks the fields of `tcr` (the build's granule
/// and VA size, after [`switch_ttbr1`] gave them to TTBR1_EL1): TTBR0_EL1
/// gets the empty table, then TCR_EL1 is written and the local TLB is
/// flushed, so nothing the early identity map put in the TLB (4 KiB
/// granule) outlives the change; the caller installs the lower-half
/// space afterwards. Runs in the upper half, which it does not change.
///
/// # Safety
///
/// Nothing uses the lower half until a space is installed there, and
/// `tcr` differs from TCR_EL1 in [`TCR_TTBR0_FIELDS`] only.
pub unsafe fn switch_ttbr0_tcr(tcr: u64) {
    // SAFETY: a word of `.rodata` the linker filled in.
    let empty = unsafe { pgk_empty_table_pa };
    // SAFETY: TTBR0_EL1 gets a zeroed 64 KiB table (a root of every
    // geometry, so walks of it find no valid entry in any granule);
    // TCR_EL1 changes only the TTBR0 walks (the caller's promise), which
    // nothing uses; the isbs make each write apply to what follows it,
    // and `tlbi vmalle1; dsb nsh` drops every translation of the early
    // identity map from this CPU's TLB before anything uses TTBR0_EL1.
    unsafe {
        asm!(
            "msr ttbr0_el1, {empty}",
            "isb",
            "msr tcr_el1, {tcr}",
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            empty = in(reg) empty,
            tcr = in(reg) tcr,
            options(nostack, preserves_flags),
        );
    }
}
