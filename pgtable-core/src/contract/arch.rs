//! The arch contract: capabilities and the Linux-named entry operations.

use crate::{generic, Format, Mmu, PhysAddr, Slot, TableAttrs, VirtAddr};

/// An architecture: a [`Format`] plus its capabilities and entry operations.
///
/// Every entry operation is a provided method whose body is Linux's generic
/// fallback from `include/linux/pgtable.h`, also callable as a free function
/// in [`generic`](crate::contract::generic) so an override can reuse it. An arch overrides a method
/// where Linux's arch code defines `__HAVE_ARCH_…`.
///
/// Entries are single 64-bit atomics: the hardware walker reads them
/// concurrently and may write accessed/dirty bits into them.
///
/// # Safety
///
/// The entry operations are handed the live entries of the tables, which
/// the algorithms trust (see [`Format`]'s safety rules). An implementation
/// that overrides one must guarantee that it:
///
/// - writes no memory through `slot` but that entry;
/// - stores into it only the value it was asked to store, `0`, or a value
///   that does not [`decode`](Format::decode) as [`Decoded::Table`] at any
///   height (e.g. an invalid marker);
/// - returns, from the get-and-clear and `*_modify_prot_start` operations,
///   the value the entry held, read in the same atomic operation that
///   cleared it.
///
/// The provided bodies (the [`generic`](crate::contract::generic) fallbacks) do exactly that.
///
/// [`Decoded::Table`]: crate::Decoded::Table
pub unsafe trait Arch: Format {
    /// The arch can move a whole PMD table by moving one entry (Linux
    /// `CONFIG_HAVE_MOVE_PMD`). The fast path also needs the core's
    /// `move-pmd` feature.
    const HAVE_MOVE_PMD: bool = false;
    /// The arch can move a whole PUD table by moving one entry (Linux
    /// `CONFIG_HAVE_MOVE_PUD`). The fast path also needs the core's
    /// `move-pud` feature.
    const HAVE_MOVE_PUD: bool = false;
    /// Past this many strides a range flush becomes a full flush (Linux:
    /// 33 on x86 `tlb_single_page_flush_ceiling`, 512 on arm64
    /// `MAX_TLBI_OPS`).
    const TLB_FLUSH_CEILING: u64 = 33;
    /// Table writes need [`Mmu::walker_barrier`] before the walker is
    /// guaranteed to see them (arm64); `false` where the walker observes
    /// stores in order (x86).
    const NEEDS_WALKER_BARRIER: bool = true;
    /// Changing a live entry in a way the hardware cannot tolerate (output
    /// address, block size) needs break-before-make: invalid entry, barrier,
    /// TLB invalidation, then the new entry (arm64 ARM D8.16).
    const BREAK_BEFORE_MAKE: bool = true;

    /// Linux `set_pte_at`: store a PTE and make it visible to the walker.
    #[inline]
    fn set_pte_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pte: u64) {
        generic::set_entry_at::<Self, M>(mmu, va, slot, pte)
    }

    /// Linux `set_pmd_at`: store a PMD (block or table) and make it visible.
    #[inline]
    fn set_pmd_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pmd: u64) {
        generic::set_entry_at::<Self, M>(mmu, va, slot, pmd)
    }

    /// Linux `set_pud_at` (Linux "arm64: mremap speedup - Enable HAVE_MOVE_PUD"): store a PUD
    /// and make it visible.
    #[inline]
    fn set_pud_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pud: u64) {
        generic::set_entry_at::<Self, M>(mmu, va, slot, pud)
    }

    /// Linux `set_pte_nosync` (Linux "arm64: mm: Batch dsb and isb when populating pgtables"):
    /// store an entry of any level
    /// without the walker barrier; the caller issues one barrier after the
    /// last entry of the table (or of a lazy-MMU scope).
    #[inline]
    fn set_pte_nosync<M: Mmu>(mmu: &M, slot: &Slot, pte: u64) {
        generic::set_entry_nosync(mmu, slot, pte)
    }

    /// Linux `pmd_populate`: links the PTE table at `table` into the PMD
    /// entry `slot`, publishing it: everything written to the table before
    /// (its zeroing, its entries) is ordered before the link
    /// ([`Mmu::publish_barrier`], Linux's `smp_wmb()`), so a walker that
    /// follows the link never reads stale contents. No walker barrier: the
    /// caller issues it (per table, or per lazy-MMU scope).
    #[inline]
    fn pmd_populate<M: Mmu>(mmu: &M, slot: &Slot, table: PhysAddr) {
        generic::populate::<Self, M>(mmu, slot, table, 1)
    }

    /// Linux `pud_populate`: links the PMD table at `table` into a PUD
    /// entry, publishing it as [`pmd_populate`](Arch::pmd_populate) does.
    #[inline]
    fn pud_populate<M: Mmu>(mmu: &M, slot: &Slot, table: PhysAddr) {
        generic::populate::<Self, M>(mmu, slot, table, 2)
    }

    /// Linux `p4d_populate`: links the PUD table at `table` into a P4D
    /// entry (5-level formats), as [`pmd_populate`](Arch::pmd_populate).
    #[inline]
    fn p4d_populate<M: Mmu>(mmu: &M, slot: &Slot, table: PhysAddr) {
        generic::populate::<Self, M>(mmu, slot, table, 3)
    }

    /// Linux `pgd_populate`: links the table at `table` into a top-level
    /// entry at `height` (the PGD of a 4- or 5-level format), as
    /// [`pmd_populate`](Arch::pmd_populate).
    #[inline]
    fn pgd_populate<M: Mmu>(mmu: &M, slot: &Slot, table: PhysAddr, height: u32) {
        generic::populate::<Self, M>(mmu, slot, table, height)
    }

    /// Links `table` into the entry `slot` at `height` through the Linux
    /// populate operation of that level.
    #[inline]
    fn populate<M: Mmu>(mmu: &M, slot: &Slot, table: PhysAddr, height: u32) {
        match height {
            1 => Self::pmd_populate(mmu, slot, table),
            2 => Self::pud_populate(mmu, slot, table),
            3 if Self::LEVELS == 5 => Self::p4d_populate(mmu, slot, table),
            _ => Self::pgd_populate(mmu, slot, table, height),
        }
    }

    /// Linux `ptep_get_and_clear`: atomically read and clear an entry, so a
    /// concurrent hardware accessed/dirty update is returned, never lost.
    #[inline]
    fn ptep_get_and_clear<M: Mmu>(mmu: &M, slot: &Slot) -> u64 {
        generic::get_and_clear(mmu, slot)
    }

    /// Linux `pmdp_huge_get_and_clear`: the same for a block entry.
    #[inline]
    fn pmdp_huge_get_and_clear<M: Mmu>(mmu: &M, slot: &Slot) -> u64 {
        generic::get_and_clear(mmu, slot)
    }

    /// Linux `ptep_modify_prot_start`: take the PTE out of service for a
    /// protection change and return it with its final accessed/dirty state.
    #[inline]
    fn ptep_modify_prot_start<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot) -> u64 {
        generic::ptep_modify_prot_start::<Self, M>(mmu, va, slot)
    }

    /// Linux `ptep_modify_prot_commit`: install the modified PTE.
    #[inline]
    fn ptep_modify_prot_commit<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, old: u64, new: u64) {
        generic::ptep_modify_prot_commit::<Self, M>(mmu, va, slot, old, new)
    }

    /// Linux `pmdp_modify_prot_start` for a block at `height` (PMD or PUD).
    ///
    /// The generic fallback is Linux's `pmdp_invalidate`: clear the entry
    /// and flush its TLB range at once — the first of the two flushes Linux
    /// "arm64: mm: rework the pmd protect changing flow" removes. An arch whose hardware updates are made safe by
    /// the atomic clear alone overrides this with
    /// [`generic::pmdp_modify_prot_start_deferred`](crate::contract::generic::pmdp_modify_prot_start_deferred), leaving one flush at the
    /// end of the operation.
    #[inline]
    fn pmdp_modify_prot_start<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, height: u32) -> u64 {
        generic::pmdp_modify_prot_start::<Self, M>(mmu, va, slot, height)
    }

    /// Installs the modified block `new` at `height` after
    /// [`pmdp_modify_prot_start`](Arch::pmdp_modify_prot_start): Linux's
    /// `change_huge_pmd` / `change_huge_pud` end with `set_pmd_at` /
    /// `set_pud_at` of the new entry (the old value, unlike the PTE
    /// transaction's, is no argument: no arch needs it).
    #[inline]
    fn pmdp_modify_prot_commit<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, height: u32, new: u64) {
        generic::pmdp_modify_prot_commit::<Self, M>(mmu, va, slot, height, new)
    }

    /// Whether the live entry `old` may be replaced by `new` in place,
    /// without break-before-make. The default allows it only from or to
    /// none, or when the two differ in accessed/dirty state alone
    /// (`modify_prot` with the same protection). Arch crates refine it
    /// (arm64 `pgattr_change_is_safe`).
    #[inline]
    fn change_is_safe(old: u64, new: u64, height: u32) -> bool {
        generic::change_is_safe::<Self>(old, new, height)
    }

    /// Links `table` into `slot` at `height` with the table attributes
    /// `attrs` ([`Format::table_entry_attrs`]), publishing it as
    /// [`populate`](Arch::populate) does. With [`TableAttrs::NONE`] it is
    /// [`populate`](Arch::populate) (so an arch's populate overrides still
    /// run); otherwise [`generic::populate_attrs`].
    #[inline]
    fn populate_attrs<M: Mmu>(
        mmu: &M,
        slot: &Slot,
        table: PhysAddr,
        height: u32,
        attrs: TableAttrs,
    ) {
        if attrs == TableAttrs::NONE {
            Self::populate(mmu, slot, table, height)
        } else {
            generic::populate_attrs::<Self, M>(mmu, slot, table, height, attrs)
        }
    }
}
