//! Break-before-make (Arm ARM D8.16 "Translation table maintenance",
//! "Using break-before-make when updating translation table entries").
//!
//! Replacing one valid entry by another while a CPU may be using it is
//! allowed in place only for some changes; others need the sequence
//! *break* (write an invalid entry), barrier, TLB invalidation, *make*
//! (write the new entry). Otherwise the TLB may hold both translations at
//! once, with TLB conflict aborts, lost coherency or mixed attributes.
//!
//! The rules follow Linux's `pgattr_change_is_safe` (arch/arm64/mm/mmu.c)
//! and google/aarch64-paging's checks, written from these facts:
//!
//! - creating (from invalid) or removing (to invalid) an entry is safe;
//! - the output address must not change, nor the kind (block versus table:
//!   a change of block size), nor the contiguous hint (it changes the
//!   effective translation size), nor the memory type (AttrIndx),
//!   shareability or NS;
//! - permission changes are safe: AP\[2:1\], PXN, UXN and DBM (Linux allows
//!   PXN / RDONLY / WRITE (= DBM) on kernel entries; the Arm ARM needs no
//!   break-before-make for any permission change, so AP\[1\] and UXN are
//!   allowed too);
//! - AF and the software bits (software dirty) may change;
//! - nG may be set (global to non-global) but not cleared: a non-global to
//!   global transition could leave a global and an ASID-tagged TLB entry
//!   for the same address;
//! - a table entry may change only its hierarchical permission bits
//!   (PXNTable, UXNTable, APTable), never its address.
//!
//! A safe in-place change still leaves the old translation in TLBs until
//! they are invalidated; [`set_live_entry`] does that too.

use core::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::{level, BbmReason, Mmu, Slot, TlbRange};
use pgtable_core::{Error, LiveOptions, VirtAddr};

use crate::bits::{
    AF, AP_EL0, AP_RDONLY, AP_TABLE_MASK, CONT, DBM, NG, PXN, PXN_TABLE, SW_MASK, TABLE_OR_PAGE,
    UXN, UXN_TABLE, VALID,
};
use crate::format::{Arm64, Arm64Geometry};

/// Leaf bits that may change in a live entry (besides nG set).
pub const LEAF_SAFE_MASK: u64 = AP_EL0 | AP_RDONLY | PXN | UXN | DBM | AF | SW_MASK | NG;
/// Table-descriptor bits that may change in a live entry.
pub const TABLE_SAFE_MASK: u64 = PXN_TABLE | UXN_TABLE | AP_TABLE_MASK;

/// Whether the live entry `old` at `height` may be replaced by `new` in
/// place, without break-before-make (the rules in the
/// [module documentation](self)).
pub fn pgattr_change_is_safe(old: u64, new: u64, height: u32) -> bool {
    // Creating or taking down a mapping is always safe.
    if old & VALID == 0 || new & VALID == 0 {
        return true;
    }
    // Block <-> table (or page <-> reserved) changes the translation size.
    if (old ^ new) & TABLE_OR_PAGE != 0 {
        return false;
    }
    let table = height > 0 && old & TABLE_OR_PAGE != 0;
    if table {
        return (old ^ new) & !TABLE_SAFE_MASK == 0;
    }
    // Non-global to global is unsafe.
    if old & NG != 0 && new & NG == 0 {
        return false;
    }
    // Everything else (address, AttrIndx, SH, NS, contiguous, GP) must stay.
    (old ^ new) & !LEAF_SAFE_MASK == 0
}

/// Why replacing the live entry `old` at `height` by `new` in place is
/// unsafe, for an entry pair [`pgattr_change_is_safe`] refuses: the first
/// rule of the [module documentation](self) it breaks. For [`Arm64`];
/// [`bbm_reason_for`] for any arm64 format.
pub fn bbm_reason(old: u64, new: u64, height: u32) -> BbmReason {
    bbm_reason_for::<Arm64>(old, new, height)
}

/// [`bbm_reason`] for the arm64 format `F`, whose output address may also
/// sit in bits \[9:8\] (FEAT_LPA2) or \[15:12\] (64 KiB, FEAT_LPA): a
/// change there is [`BbmReason::OutputAddress`].
pub fn bbm_reason_for<F: Arm64Geometry>(old: u64, new: u64, height: u32) -> BbmReason {
    let diff = old ^ new;
    if diff & TABLE_OR_PAGE != 0 || (height > 0 && old & TABLE_OR_PAGE != 0) {
        // A block <-> table change, or a table entry's address.
        BbmReason::BlockSplit
    } else if diff & CONT != 0 {
        BbmReason::ContiguousRun
    } else if diff & F::OA_FIELD_MASK != 0 {
        BbmReason::OutputAddress
    } else if diff & !LEAF_SAFE_MASK == 0 {
        // Only the safe bits differ, so nG was cleared.
        BbmReason::NonGlobalToGlobal
    } else {
        // AttrIndx, SH, NS or GP.
        BbmReason::MemoryType
    }
}

/// The TLB range that the live entry `old` at `height` covering `va` may
/// have cached translations for.
fn entry_range<F: Arm64Geometry>(va: VirtAddr, height: u32, old: u64) -> TlbRange {
    let shift = level::shift::<F>(height);
    let start = va.align_down(1u64 << shift);
    let leaf = height == 0 || old & TABLE_OR_PAGE == 0;
    TlbRange {
        start,
        end: start.add(1u64 << shift),
        // Below a table entry the leaves may be as small as a page, and
        // the walk caches of the table must go too.
        stride_shift: if leaf {
            shift
        } else {
            level::page_shift::<F>()
        },
        last_level: leaf,
    }
}

/// A live entry: the slot at `height` on the path to `va` (the address
/// its translation covers, for the TLB invalidation).
#[derive(Clone, Copy, Debug)]
pub struct LiveEntry<'a> {
    /// An address the entry translates.
    pub va: VirtAddr,
    /// The entry.
    pub slot: &'a Slot,
    /// Its height above the PTE level (0 PTE, 1 PMD, 2 PUD).
    pub height: u32,
}

/// Stores with the setter Linux uses for this level (each issues the walker
/// barrier for a valid entry).
fn set_at<F: Arm64Geometry, M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, height: u32, val: u64) {
    match height {
        0 => F::set_pte_at(mmu, va, slot, val),
        1 => F::set_pmd_at(mmu, va, slot, val),
        _ => F::set_pud_at(mmu, va, slot, val),
    }
}

/// Changes the live `entry` to `new`, safely for CPUs that may be using
/// it.
///
/// - If [`pgattr_change_is_safe`] allows it, the entry is written in place
///   (store, walker barrier) and, when the old entry was valid, its TLB
///   range is invalidated so no CPU keeps the old attributes.
/// - Otherwise, with [`LiveOptions::ALLOW_BBM`]: break-before-make — the entry is
///   atomically cleared, a walker barrier (`dsb ishst; isb`) makes the
///   invalid entry visible, the TLB range is invalidated (the flush ends
///   with `dsb ish; isb`, the barrier before the make), then `new` is
///   written with its walker barrier. Accesses by other CPUs in between
///   fault; the caller must be able to tolerate that (no code or stack of
///   the running CPU may be in the range).
/// - Otherwise it returns [`Error::BreakBeforeMake`] and changes nothing.
///
/// The value written is exactly `new`: accessed/dirty state the hardware
/// set in the old entry is not merged into it (use the
/// `ptep_modify_prot_*` transaction for protection changes that must keep
/// it). A table that the old entry pointed at is not freed.
///
/// # Errors
///
/// [`Error::BreakBeforeMake`] with `va` and the rule the change breaks
/// ([`bbm_reason`]) when it is unsafe in place and `opts` does not allow
/// break-before-make.
pub fn set_live_entry<M: Mmu>(
    mmu: &M,
    entry: LiveEntry<'_>,
    new: u64,
    opts: LiveOptions,
) -> Result<(), Error> {
    set_live_entry_for::<Arm64, M>(mmu, entry, new, opts)
}

/// [`set_live_entry`] for an entry of the arm64 format `F`: the TLB range
/// flushed is the entry's size in `F`'s geometry (Linux `flush_tlb_range`
/// with the stride of the level), and [`bbm_reason_for`] says why.
///
/// # Errors
///
/// As [`set_live_entry`].
pub fn set_live_entry_for<F: Arm64Geometry, M: Mmu>(
    mmu: &M,
    entry: LiveEntry<'_>,
    new: u64,
    opts: LiveOptions,
) -> Result<(), Error> {
    let LiveEntry { va, slot, height } = entry;
    // Relaxed: the caller holds the address space; ordering toward the
    // walker comes from barriers and TLB maintenance, not Rust orderings.
    let old = slot.load(Relaxed);
    if old == new {
        return Ok(());
    }
    if pgattr_change_is_safe(old, new, height) {
        set_at::<F, M>(mmu, va, slot, height, new);
        if old & VALID != 0 {
            mmu.flush_tlb_range(entry_range::<F>(va, height, old));
        }
        return Ok(());
    }
    if !opts.allows_bbm() {
        return Err(Error::BreakBeforeMake(
            va,
            bbm_reason_for::<F>(old, new, height),
        ));
    }
    // Break: atomically, so the range flushed is the one of the entry that
    // was really there (the walker may have set AF or dirty meanwhile).
    let prev = F::ptep_get_and_clear(mmu, slot);
    // The invalid entry must be visible to every walker before the TLBI.
    mmu.walker_barrier();
    mmu.flush_tlb_range(entry_range::<F>(va, height, prev));
    // Make.
    set_at::<F, M>(mmu, va, slot, height, new);
    Ok(())
}
