//! The code before the Linux changes, kept for benchmarks and tests.
//!
//! Each item here reproduces how Linux worked before one of the changes
//! this crate follows, so that one binary can measure both ways, and tests
//! can check that both give the same tables. None of them is needed to use
//! the crate; the main API always takes the faster path the arch allows.
//!
//! | Item | Before Linux … |
//! |------|----------------|
//! | [`barrier_per_entry`] | "arm64: mm: Batch dsb and isb when populating pgtables" |
//! | [`PTES_ONLY`] | "mm: Speed up mremap on large regions" (`HAVE_MOVE_PMD`) |
//! | [`PMD_ONLY`] | "arm64: mremap speedup - Enable HAVE_MOVE_PUD" |
//! | [`GenericBlockProt`] | "arm64: mm: rework the pmd protect changing flow" |
//!
//! [`DeferredBlockProt`] is the other way round: that change's block path
//! for a format that keeps the generic one, so both paths can be compared
//! on any format.

use core::marker::PhantomData;

use crate::{
    generic, Access, AccessFault, Arch, Decoded, Format, MapOptions, Mmu, MoveOptions, PhysAddr,
    Prot, Slot, VirtAddr,
};

/// `opts` with every entry written by the synchronising setter
/// (`set_pte_at`: one walker barrier per entry), as before Linux "arm64:
/// mm: Batch dsb and isb when populating pgtables"; the main API issues
/// one barrier per table.
///
/// ```
/// # #[cfg(feature = "alloc")] {
/// use pgtable_core::{variants, AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
/// use pgtable_core::contract::{Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let opts = variants::barrier_per_entry(MapOptions::PAGES);
/// space.map(VirtAddr(1 << 30), PhysAddr(0x8000_0000), 1 << 20, Prot::READ_WRITE, opts).unwrap();
/// # }
/// ```
pub const fn barrier_per_entry(opts: MapOptions) -> MapOptions {
    opts.with_sync_each()
}

/// Only the PTE-by-PTE path of
/// [`move_page_tables`](crate::AddressSpace::move_page_tables):
/// no whole-table moves, as before Linux "mm: Speed up mremap on large
/// regions".
pub const PTES_ONLY: MoveOptions = MoveOptions::DEFAULT.no_pmd().no_pud();

/// Whole-PMD moves but no whole-PUD moves, as arm64 before Linux "arm64:
/// mremap speedup - Enable HAVE_MOVE_PUD".
pub const PMD_ONLY: MoveOptions = MoveOptions::DEFAULT.no_pud();

/// Defines a zero-sized wrapper arch that delegates everything to `A` except
/// `pmdp_modify_prot_start`, which uses `$start`.
macro_rules! block_prot_wrapper {
    ($(#[$m:meta])* $name:ident, $start:ident) => {
        $(#[$m])*
        pub struct $name<A>(PhantomData<A>);

        // SAFETY: every method is `A`'s, which upholds the contract.
        unsafe impl<A: Arch> Format for $name<A> {
            const NAME: &'static str = A::NAME;
            const LEVELS: u32 = A::LEVELS;
            const PA_BITS: u32 = A::PA_BITS;
            const VA_BITS: u32 = A::VA_BITS;
            const PAGE_SHIFT: u32 = A::PAGE_SHIFT;
            const OA_SHIFT: u32 = A::OA_SHIFT;

            #[inline]
            fn leaf_allowed(height: u32) -> bool {
                A::leaf_allowed(height)
            }
            #[inline]
            fn decode(raw: u64, height: u32) -> Decoded {
                A::decode(raw, height)
            }
            #[inline]
            fn table_entry(pa: PhysAddr, height: u32) -> u64 {
                A::table_entry(pa, height)
            }
            #[inline]
            fn leaf_template(prot: Prot, height: u32) -> u64 {
                A::leaf_template(prot, height)
            }
            #[inline]
            fn leaf(pa: PhysAddr, prot: Prot, height: u32) -> u64 {
                A::leaf(pa, prot, height)
            }
            #[inline]
            fn oa_field(pa: PhysAddr) -> u64 {
                A::oa_field(pa)
            }
            #[inline]
            fn leaf_prot(raw: u64, height: u32) -> Prot {
                A::leaf_prot(raw, height)
            }
            #[inline]
            fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64 {
                A::modify_prot(raw, prot, height)
            }
            #[inline]
            fn split_leaf(raw: u64, height: u32) -> u64 {
                A::split_leaf(raw, height)
            }
            #[inline]
            fn is_young(raw: u64) -> bool {
                A::is_young(raw)
            }
            #[inline]
            fn is_dirty(raw: u64) -> bool {
                A::is_dirty(raw)
            }
            #[inline]
            fn is_settled(raw: u64, height: u32) -> bool {
                A::is_settled(raw, height)
            }
            #[inline]
            fn hw_access(raw: u64, height: u32, access: Access) -> Result<u64, AccessFault> {
                A::hw_access(raw, height, access)
            }
            #[inline]
            fn cont_entries(height: u32) -> u32 {
                A::cont_entries(height)
            }
            #[inline]
            fn mk_cont(raw: u64, height: u32) -> u64 {
                A::mk_cont(raw, height)
            }
            #[inline]
            fn clear_cont(raw: u64, height: u32) -> u64 {
                A::clear_cont(raw, height)
            }
            #[inline]
            fn clear_cont_at(raw: u64, height: u32, index: usize) -> u64 {
                A::clear_cont_at(raw, height, index)
            }
            #[inline]
            fn cont_pa(raw: u64, pa: PhysAddr, height: u32, index: usize) -> PhysAddr {
                A::cont_pa(raw, pa, height, index)
            }
            #[inline]
            fn is_cont(raw: u64, height: u32) -> bool {
                A::is_cont(raw, height)
            }
            #[inline]
            fn is_protnone(raw: u64, height: u32) -> bool {
                A::is_protnone(raw, height)
            }
            #[inline]
            fn mkold(raw: u64, height: u32) -> u64 {
                A::mkold(raw, height)
            }
            #[inline]
            fn mkyoung(raw: u64, height: u32) -> u64 {
                A::mkyoung(raw, height)
            }
            #[inline]
            fn mkclean(raw: u64, height: u32) -> u64 {
                A::mkclean(raw, height)
            }
            #[inline]
            fn mkdirty(raw: u64, height: u32) -> u64 {
                A::mkdirty(raw, height)
            }
            const SEPARATE_HALVES: bool = A::SEPARATE_HALVES;
            #[inline]
            fn table_entry_attrs(pa: PhysAddr, height: u32, attrs: crate::TableAttrs) -> u64 {
                A::table_entry_attrs(pa, height, attrs)
            }
            #[inline]
            fn table_limits(raw: u64, height: u32) -> crate::TableAttrs {
                A::table_limits(raw, height)
            }
        }

        // SAFETY: every entry operation is `A`'s, except
        // `pmdp_modify_prot_start`, which is a generic one built on `A`'s
        // own operations.
        unsafe impl<A: Arch> Arch for $name<A> {
            const HAVE_MOVE_PMD: bool = A::HAVE_MOVE_PMD;
            const HAVE_MOVE_PUD: bool = A::HAVE_MOVE_PUD;
            const TLB_FLUSH_CEILING: u64 = A::TLB_FLUSH_CEILING;
            const NEEDS_WALKER_BARRIER: bool = A::NEEDS_WALKER_BARRIER;
            const BREAK_BEFORE_MAKE: bool = A::BREAK_BEFORE_MAKE;

            #[inline]
            fn set_pte_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pte: u64) {
                A::set_pte_at(mmu, va, slot, pte)
            }
            #[inline]
            fn set_pmd_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pmd: u64) {
                A::set_pmd_at(mmu, va, slot, pmd)
            }
            #[inline]
            fn set_pud_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pud: u64) {
                A::set_pud_at(mmu, va, slot, pud)
            }
            #[inline]
            fn set_pte_nosync<M: Mmu>(mmu: &M, slot: &Slot, pte: u64) {
                A::set_pte_nosync(mmu, slot, pte)
            }
            #[inline]
            fn ptep_get_and_clear<M: Mmu>(mmu: &M, slot: &Slot) -> u64 {
                A::ptep_get_and_clear(mmu, slot)
            }
            #[inline]
            fn pmdp_huge_get_and_clear<M: Mmu>(mmu: &M, slot: &Slot) -> u64 {
                A::pmdp_huge_get_and_clear(mmu, slot)
            }
            #[inline]
            fn ptep_modify_prot_start<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot) -> u64 {
                A::ptep_modify_prot_start(mmu, va, slot)
            }
            #[inline]
            fn ptep_modify_prot_commit<M: Mmu>(
                mmu: &M,
                va: VirtAddr,
                slot: &Slot,
                old: u64,
                new: u64,
            ) {
                A::ptep_modify_prot_commit(mmu, va, slot, old, new)
            }
            #[inline]
            fn pmdp_modify_prot_start<M: Mmu>(
                mmu: &M,
                va: VirtAddr,
                slot: &Slot,
                height: u32,
            ) -> u64 {
                generic::$start::<Self, M>(mmu, va, slot, height)
            }
            #[inline]
            fn pmdp_modify_prot_commit<M: Mmu>(
                mmu: &M,
                va: VirtAddr,
                slot: &Slot,
                height: u32,
                new: u64,
            ) {
                A::pmdp_modify_prot_commit(mmu, va, slot, height, new)
            }
            #[inline]
            fn change_is_safe(old: u64, new: u64, height: u32) -> bool {
                A::change_is_safe(old, new, height)
            }
        }

        impl<A> Clone for $name<A> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<A> Copy for $name<A> {}

        impl<A> Default for $name<A> {
            fn default() -> Self {
                $name(PhantomData)
            }
        }

        impl<A> core::fmt::Debug for $name<A> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(stringify!($name))
            }
        }
    };
}

block_prot_wrapper!(
    /// The arch `A` with Linux's generic `pmdp_modify_prot_start`
    /// ([`generic::pmdp_modify_prot_start`]: clear the block and flush its
    /// TLB range at once), whatever `A` overrides: the control variant
    /// from before Linux "arm64: mm: rework the pmd protect changing flow", for benchmarks and
    /// tests that compare both block
    /// paths in one binary. Every other constant and method is `A`'s.
    ///
    /// Tables built through an address space of `A` belong to that space;
    /// build a separate `AddressSpace<GenericBlockProt<A>, _, _>` (same
    /// descriptor bits) to measure this variant.
    GenericBlockProt,
    pmdp_modify_prot_start
);

block_prot_wrapper!(
    /// The arch `A` with the deferred `pmdp_modify_prot_start`
    /// ([`generic::pmdp_modify_prot_start_deferred`]: an atomic
    /// get-and-clear, no flush until the end of the operation), whatever
    /// `A` does: the transaction path of
    /// Linux "arm64: mm: rework the pmd protect changing flow", for benchmarks and tests
    /// of formats (such as the test format) that keep the generic
    /// fallback. The counterpart of [`GenericBlockProt`].
    DeferredBlockProt,
    pmdp_modify_prot_start_deferred
);
