//! The arm64 MMU operations: barriers, TLB maintenance, installing roots.
//!
//! Compiled only for `target_arch = "aarch64"`; host tests use the
//! simulator or a recording [`Mmu`] with the same format. The decisions
//! (which TLBIs for a range) are the pure functions of [`crate::tlbi`], so
//! the host tests cover them; this module only executes them.
//!
//! Barrier sequences (Arm ARM D8.2 "Translation table walks" ordering and
//! D8.14 "TLB maintenance"; Linux arm64 `tlbflush.h` does the same):
//! - after table writes: `dsb ishst` (the stores reach the inner-shareable
//!   domain, where every walker reads) then `isb` (this CPU's later
//!   instructions are fetched and translated after it);
//! - around TLBIs: `dsb ishst` before (the table writes are visible before
//!   the invalidation, so no walker refills the old entry), `dsb ish` after
//!   (the broadcast invalidation completed on every CPU), `isb` (this CPU
//!   does not use a translation fetched before the completion).

use core::arch::asm;
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};

use aarch64_cpu::asm::barrier::{dmb, dsb, isb, ISH, ISHST, NSH, SY};
use aarch64_cpu::registers::{
    ID_AA64ISAR0_EL1, ID_AA64MMFR0_EL1, ID_AA64MMFR1_EL1, MAIR_EL1, SCTLR_EL1, TCR_EL1, TTBR0_EL1,
    TTBR1_EL1,
};
use pgtable_core::{Format, Mmu, PhysAddr, TlbRange};
use tock_registers::interfaces::{Readable, Writeable};

use crate::regs::{
    tcr_value, tcr_value_separate_halves, ttbr1_base, TcrConfig, SCTLR_MMU_BITS, SCTLR_MMU_CLEAR,
};
use crate::tlbi::{
    plan_flush, tlbi_asid_operand, tlbi_range_operand, tlbi_range_ops, tlbi_va_operand, FlushPlan,
    TlbiOp,
};
use crate::{Arm64, MAIR_VALUE};

/// 0: not read yet, 1: no FEAT_TLBIRANGE, 2: present.
static TLB_RANGE: AtomicU8 = AtomicU8::new(0);

/// Whether the CPU implements FEAT_TLBIRANGE (ID_AA64ISAR0_EL1.TLB,
/// bits \[59:56\], is 0b0010). Read once and cached.
pub fn has_tlb_range() -> bool {
    // Relaxed: the cached value is the same whoever computes it.
    match TLB_RANGE.load(Relaxed) {
        0 => {
            let tlb = (ID_AA64ISAR0_EL1.get() >> 56) & 0xf;
            let yes = tlb >= 0b0010;
            // Relaxed: see above.
            TLB_RANGE.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
        v => v == 2,
    }
}

/// Which translation table base registers [`Mmu::install_root`] writes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Ttbr {
    /// TTBR0_EL1 only (the low half).
    Ttbr0,
    /// TTBR1_EL1 only, at the root's high half (see [`ttbr1_base`]).
    Ttbr1,
    /// Both: one root serves both canonical halves.
    Both,
    /// TTBR1_EL1 only, at the root itself: the root of a
    /// [`VaRange::Upper`](pgtable_core::VaRange::Upper) address space, which
    /// translates the whole `[2^64 - 2^VA_BITS, 2^64)` through its 512
    /// entries (TCR_EL1 from
    /// [`tcr_value_separate_halves`], as
    /// [`enable_mmu_separate_halves`] sets). A
    /// [`VaRange::Lower`](pgtable_core::VaRange::Lower) space uses
    /// [`Ttbr::Ttbr0`].
    Ttbr1Root,
}

/// The arm64 [`Mmu`]: real barriers and inner-shareable TLB maintenance.
#[derive(Clone, Copy, Debug)]
pub struct Arm64Mmu {
    asid: u8,
    tagged: bool,
    ttbr: Ttbr,
}

impl Arm64Mmu {
    /// An MMU for an address space of global mappings (or ASID 0): full
    /// flushes are `TLBI VMALLE1IS`; roots go to both TTBRs.
    pub const fn new() -> Arm64Mmu {
        Arm64Mmu {
            asid: 0,
            tagged: false,
            ttbr: Ttbr::Both,
        }
    }

    /// An MMU for the address space tagged with `asid` (its leaves are nG):
    /// full flushes are `TLBI ASIDE1IS`; the root goes to TTBR0_EL1 with
    /// the ASID in bits \[55:48\] (TCR_EL1.A1 = 0, 8-bit ASIDs).
    pub const fn with_asid(asid: u8) -> Arm64Mmu {
        Arm64Mmu {
            asid,
            tagged: true,
            ttbr: Ttbr::Ttbr0,
        }
    }

    /// The same MMU installing roots into `ttbr`.
    pub const fn installing_into(self, ttbr: Ttbr) -> Arm64Mmu {
        Arm64Mmu { ttbr, ..self }
    }

    fn tlbi_page(&self, va: u64, last_level: bool) {
        let x = tlbi_va_operand(va, self.asid as u16);
        if last_level {
            // SAFETY: TLB invalidation has no memory effects Rust can see.
            unsafe { asm!("tlbi vale1is, {}", in(reg) x, options(nostack, preserves_flags)) };
        } else {
            // SAFETY: as above.
            unsafe { asm!("tlbi vae1is, {}", in(reg) x, options(nostack, preserves_flags)) };
        }
    }

    fn tlbi_range(&self, op: TlbiOp, last_level: bool) {
        match op {
            TlbiOp::Page { page } => self.tlbi_page(page << 12, last_level),
            TlbiOp::Range { scale, num, base } => {
                let x = tlbi_range_operand(base, scale, num, self.asid as u16);
                // `sys` encodings (op1 = 0, CRn = c8, CRm = c2) so no
                // assembler support for FEAT_TLBIRANGE is needed:
                // op2 = 5 is TLBI RVALE1IS, op2 = 1 is TLBI RVAE1IS.
                if last_level {
                    // SAFETY: as above; only issued when the CPU has it.
                    unsafe {
                        asm!("sys #0, c8, c2, #5, {}", in(reg) x, options(nostack, preserves_flags))
                    };
                } else {
                    // SAFETY: as above.
                    unsafe {
                        asm!("sys #0, c8, c2, #1, {}", in(reg) x, options(nostack, preserves_flags))
                    };
                }
            }
        }
    }

    /// Invalidates this address space's entries: its ASID's (global ones
    /// stay), or everything for an untagged space.
    fn tlbi_mm(&self) {
        if self.tagged {
            let x = tlbi_asid_operand(self.asid as u16);
            // SAFETY: as above.
            unsafe { asm!("tlbi aside1is, {}", in(reg) x, options(nostack, preserves_flags)) };
        } else {
            // SAFETY: as above.
            unsafe { asm!("tlbi vmalle1is", options(nostack, preserves_flags)) };
        }
    }
}

impl Default for Arm64Mmu {
    fn default() -> Self {
        Arm64Mmu::new()
    }
}

// SAFETY: barriers are `dsb ishst; isb`; every invalidation is the
// inner-shareable broadcast form (`…is`) completed by `dsb ish`, so it has
// reached every CPU of the inner-shareable domain when the flush returns;
// `flush_tlb_all` is `vmalle1is` (global entries included).
unsafe impl Mmu for Arm64Mmu {
    #[inline]
    fn walker_barrier(&self) {
        // Table stores complete in the inner-shareable domain (all walkers)…
        dsb(ISHST);
        // …before this CPU executes anything that could walk them.
        isb(SY);
    }

    #[inline]
    fn publish_barrier(&self) {
        // Linux `smp_wmb()` before `pmd_populate`: the new table's zeroing
        // and entries are observed by every walker in the inner-shareable
        // domain before the store that links it.
        dmb(ISHST);
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        let plan = plan_flush(range, has_tlb_range());
        // Entry writes reach every walker before the invalidation.
        dsb(ISHST);
        match plan {
            // A range flush must drop global entries in the range too, so
            // its full-flush fallback is the one that includes them.
            FlushPlan::All => {
                // SAFETY: TLB invalidation has no memory effects Rust can see.
                unsafe { asm!("tlbi vmalle1is", options(nostack, preserves_flags)) }
            }
            FlushPlan::PerStride {
                start,
                count,
                stride_shift,
                last_level,
            } => {
                for i in 0..count {
                    self.tlbi_page(start.wrapping_add(i << stride_shift), last_level);
                }
            }
            FlushPlan::Range {
                start_page,
                pages,
                last_level,
            } => {
                for op in tlbi_range_ops(start_page, pages) {
                    self.tlbi_range(op, last_level);
                }
            }
        }
        // The broadcast invalidation completed on every CPU…
        dsb(ISH);
        // …and this CPU uses no translation fetched before that.
        isb(SY);
    }

    fn flush_tlb_all(&self) {
        // As in `flush_tlb_range`.
        dsb(ISHST);
        // SAFETY: TLB invalidation has no memory effects Rust can see.
        unsafe { asm!("tlbi vmalle1is", options(nostack, preserves_flags)) };
        // As in `flush_tlb_range`.
        dsb(ISH);
        // As in `flush_tlb_range`.
        isb(SY);
    }

    fn flush_tlb_mm(&self) {
        // As in `flush_tlb_range`.
        dsb(ISHST);
        self.tlbi_mm();
        // As in `flush_tlb_range`.
        dsb(ISH);
        // As in `flush_tlb_range`.
        isb(SY);
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // The tables are complete in memory before a walk can start there.
        dsb(ISHST);
        let ttbr0 = root.0 | ((self.asid as u64) << 48);
        match self.ttbr {
            Ttbr::Ttbr0 => TTBR0_EL1.set(ttbr0),
            Ttbr::Ttbr1 => TTBR1_EL1.set(ttbr1_base(root.0)),
            Ttbr::Ttbr1Root => TTBR1_EL1.set(root.0),
            Ttbr::Both => {
                TTBR0_EL1.set(ttbr0);
                TTBR1_EL1.set(ttbr1_base(root.0));
            }
        }
        // The new base takes effect for the following instructions.
        isb(SY);
        // Translations cached for an earlier root with the same ASID go.
        self.flush_tlb_mm();
    }
}

/// Installs the register values the format assumes and turns the MMU on,
/// for the format `F` ([`Arm64`] or [`Arm64Va39`](crate::Arm64Va39)), with
/// `root` in TTBR0_EL1 and (its high half) in TTBR1_EL1.
///
/// MAIR_EL1 = [`MAIR_VALUE`]; TCR_EL1 = [`tcr_value`] with the CPU's
/// PARange (at most 48 bits) and HA/HD set when ID_AA64MMFR1_EL1.HAFDBS
/// reports access-flag (0b0001) / dirty-state (0b0010) management; the
/// local TLB is invalidated; SCTLR_EL1 gets M, C and I and loses A and WXN.
/// Returns the TCR value written.
///
/// # Safety
///
/// Must run at EL1 with the MMU off. `root` must be a complete table
/// hierarchy in format `F` that maps (identity, or as the caller arranges)
/// the code executing this function and everything the CPU touches next,
/// and must stay alive while installed.
pub unsafe fn enable_mmu_for<F: Format>(root: PhysAddr) -> u64 {
    let pa_range = ID_AA64MMFR0_EL1.get() & 0xf;
    let hafdbs = ID_AA64MMFR1_EL1.get() & 0xf;
    let tcr = tcr_value(TcrConfig {
        va_bits: F::VA_BITS,
        ttbr1: true,
        pa_range,
        hw_access_flag: hafdbs >= 1,
        hw_dirty: hafdbs >= 2,
    });
    MAIR_EL1.set(MAIR_VALUE);
    TCR_EL1.set(tcr);
    TTBR0_EL1.set(root.0);
    TTBR1_EL1.set(ttbr1_base(root.0));
    // Table writes and the register writes are complete…
    dsb(ISH);
    isb(SY);
    // SAFETY: local TLB invalidation; stale entries from before are gone.
    unsafe { asm!("tlbi vmalle1", options(nostack, preserves_flags)) };
    // The local invalidation completed…
    dsb(NSH);
    isb(SY);
    let sctlr = (SCTLR_EL1.get() | SCTLR_MMU_BITS) & !SCTLR_MMU_CLEAR;
    SCTLR_EL1.set(sctlr);
    // Instructions after this one are translated.
    isb(SY);
    tcr
}

/// [`enable_mmu_for`] with the 48-bit [`Arm64`] format.
///
/// # Safety
///
/// As [`enable_mmu_for`].
pub unsafe fn enable_mmu(root: PhysAddr) -> u64 {
    // SAFETY: the caller upholds the contract of `enable_mmu_for`.
    unsafe { enable_mmu_for::<Arm64>(root) }
}

/// Turns the MMU on with separate roots for the two halves, as Linux runs
/// arm64: `lower` (a [`VaRange::Lower`](pgtable_core::VaRange::Lower)
/// space) in TTBR0_EL1 for `[0, 2^VA_BITS)` and `upper` (a
/// [`VaRange::Upper`](pgtable_core::VaRange::Upper) space, e.g. from
/// `AddressSpace::new_kernel`) in TTBR1_EL1 for `[2^64 - 2^VA_BITS, 2^64)`,
/// each through all 512 entries of its root.
///
/// Everything else is as in [`enable_mmu_for`], except TCR_EL1 =
/// [`tcr_value_separate_halves`] (T0SZ = T1SZ = 64 - VA_BITS). Returns the
/// TCR value written. Switch user spaces afterwards with an MMU installing
/// into [`Ttbr::Ttbr0`], and the kernel's with [`Ttbr::Ttbr1Root`].
///
/// # Safety
///
/// As [`enable_mmu_for`], for both roots: together they must map the code
/// executing this function and everything the CPU touches next, and both
/// must stay alive while installed.
pub unsafe fn enable_mmu_separate_halves<F: Format>(lower: PhysAddr, upper: PhysAddr) -> u64 {
    let pa_range = ID_AA64MMFR0_EL1.get() & 0xf;
    let hafdbs = ID_AA64MMFR1_EL1.get() & 0xf;
    let tcr = tcr_value_separate_halves(TcrConfig {
        va_bits: F::VA_BITS,
        ttbr1: true,
        pa_range,
        hw_access_flag: hafdbs >= 1,
        hw_dirty: hafdbs >= 2,
    });
    MAIR_EL1.set(MAIR_VALUE);
    TCR_EL1.set(tcr);
    TTBR0_EL1.set(lower.0);
    TTBR1_EL1.set(upper.0);
    // Table writes and the register writes are complete before the TLB
    // invalidation and the enable.
    dsb(ISH);
    isb(SY);
    // SAFETY: local TLB invalidation; stale entries from before are gone.
    unsafe { asm!("tlbi vmalle1", options(nostack, preserves_flags)) };
    // The local invalidation completed before the enable.
    dsb(NSH);
    isb(SY);
    let sctlr = (SCTLR_EL1.get() | SCTLR_MMU_BITS) & !SCTLR_MMU_CLEAR;
    SCTLR_EL1.set(sctlr);
    // Instructions after this one are translated.
    isb(SY);
    tcr
}
