//! The contract between the algorithms and an architecture: the traits an
//! [`AddressSpace`] is generic over and the types their methods speak.
//!
//! The crate root holds what a kernel's memory manager calls; this module
//! holds what an architecture port, a frame allocator, a host test or a
//! benchmark implements or names. Everything here is also what the
//! algorithms trust, so the traits are `unsafe` and say what they promise.
//!
//! # For kernel authors
//!
//! Pick an arch type (`pgtable_arm64::Arm64`, `pgtable_x86::X86_64`,
//! `pgtable_riscv::Sv48`, …), its [`Mmu`] (the arch crate's, or the
//! simulator's on the host) and a [`TableAlloc`] of your own (your frame
//! allocator; `Arena`, feature `alloc`, on a host), and make an
//! [`AddressSpace`]. The operations are its methods, under Linux's names:
//!
//! - build and tear down: [`map`](AddressSpace::map),
//!   [`unmap`](AddressSpace::unmap) (and
//!   [`unmap_with`](AddressSpace::unmap_with), which reports every removed
//!   entry as a [`LeafEntry`](crate::LeafEntry)),
//!   [`move_page_tables`](AddressSpace::move_page_tables) (mremap),
//!   [`copy_page_range`](AddressSpace::copy_page_range) (fork);
//! - change: [`change_protection`](AddressSpace::change_protection)
//!   (mprotect), [`change_protection_live`](AddressSpace::change_protection_live)
//!   (live kernel mappings, no invalid step);
//! - one entry at fault time: [`install_pte`](AddressSpace::install_pte),
//!   [`ptep_set_access_flags`](AddressSpace::ptep_set_access_flags),
//!   [`ptep_get`](AddressSpace::ptep_get),
//!   [`test_and_clear_young`](AddressSpace::test_and_clear_young),
//!   software entries ([`install_pte`](AddressSpace::install_pte) with
//!   [`NewPte::Swap`], [`replace_pte`](AddressSpace::replace_pte) with a [`NewPte`]: a
//!   present page or a software entry replaced in place, for reclaim,
//!   copy-on-write and swap-in);
//! - read: [`translate`](AddressSpace::translate),
//!   [`walk`](AddressSpace::walk), [`ptdump`](AddressSpace::ptdump),
//!   [`clear_refs`](AddressSpace::clear_refs);
//! - batch: [`tlb_gather_mmu`](AddressSpace::tlb_gather_mmu) hands out an
//!   [`MmuGather`](crate::MmuGather) that runs unmaps and protection
//!   changes under one flush;
//! - run: [`install`](AddressSpace::install),
//!   [`deactivate`](AddressSpace::deactivate), the kernel half
//!   ([`new_kernel`](AddressSpace::new_kernel),
//!   [`share_kernel_half`](AddressSpace::share_kernel_half),
//!   [`new_user`](AddressSpace::new_user)).
//!
//! Every operation checks its whole input and reserves every table it may
//! need before it writes: an error leaves the tables unchanged. A kernel
//! implements only [`TableAlloc`] (and writes `A: Arch, M: Mmu,
//! T: TableAlloc` bounds where its code is generic); [`Inspector`] reads
//! raw entries for tests and diagnostics.
//!
//! # For arch authors
//!
//! The minimum port is a [`Format`] and an empty `unsafe impl Arch`, an
//! [`Mmu`], and nothing else: every entry operation of [`Arch`] has Linux's
//! generic fallback as its provided body ([`generic`]).
//!
//! - [`Format`] (pure, host-tested) requires `NAME`, `LEVELS`, `PA_BITS`,
//!   [`leaf_allowed`](Format::leaf_allowed), [`decode`](Format::decode),
//!   [`table_entry`](Format::table_entry),
//!   [`leaf_template`](Format::leaf_template),
//!   [`leaf_prot`](Format::leaf_prot), [`modify_prot`](Format::modify_prot),
//!   [`split_leaf`](Format::split_leaf), [`is_young`](Format::is_young),
//!   [`is_dirty`](Format::is_dirty) and [`hw_access`](Format::hw_access)
//!   (what the simulated walker does). The rest is optional:
//!   software entries (`SWP_VALUE_BITS`, `swp_entry`, `swp_value`: all
//!   three arches), accessed/dirty setters (`mkold`, `mkyoung`, `mkclean`,
//!   `mkdirty`: all three, as each keeps its dirty state differently),
//!   `is_settled` (all three: a leaf the hardware need not update),
//!   hierarchical table attributes (`table_entry_attrs`, `table_limits`:
//!   arm64 APTable/XNTable, x86 U/S R/W XD), contiguous runs
//!   (`cont_entries`, `mk_cont`, `is_cont`: arm64 and RISC-V with
//!   Svnapot; `clear_cont`: arm64; `clear_cont_at`, `cont_pa`: RISC-V,
//!   whose NAPOT entries all hold the run's base),
//!   `OA_SHIFT` (RISC-V, whose PPN starts at bit 10), `oa_field` and
//!   `leaf` (arm64 with 52-bit addresses, whose top sits in other bits),
//!   `PAGE_SHIFT` and `VA_BITS` (arm64's granules and address sizes) and
//!   `SEPARATE_HALVES` (arm64's TTBR0/TTBR1). A wrapper format that
//!   forwards to another (a benchmark's instrumented format) must forward
//!   these too.
//! - [`Arch`] sets its capabilities (`HAVE_MOVE_PMD`, `HAVE_MOVE_PUD`,
//!   `TLB_FLUSH_CEILING`, `NEEDS_WALKER_BARRIER`, `BREAK_BEFORE_MAKE`;
//!   all three arches set all of them) and overrides what its Linux port
//!   defines as `__HAVE_ARCH_…`: `pmdp_modify_prot_start` (all three use
//!   the deferred form, [`generic::pmdp_modify_prot_start_deferred`]: their
//!   atomic clear makes a hardware update safe without the generic
//!   immediate flush), `set_pte_at`/`set_pmd_at`/`set_pud_at` and
//!   `change_is_safe` (arm64: the walker barrier after a valid entry, and
//!   `pgattr_change_is_safe`). The others (`set_pte_nosync`, the
//!   per-level populate operations, the get-and-clear operations, the
//!   `ptep_modify_prot_*` transaction, `pmdp_modify_prot_commit`) no arch
//!   crate overrides today. They stay because the algorithms write every
//!   live entry through them and through nothing else: they are where a
//!   port whose entry writes are not plain atomic stores hooks in (Linux
//!   x86 routes exactly these through paravirt ops, so that Xen can
//!   replace `set_pte`, `ptep_modify_prot_start` and `_commit`), and the
//!   wrappers in [`variants`](crate::variants) forward each one to the
//!   arch they wrap. [`Arch::populate`] and [`Arch::populate_attrs`] are
//!   dispatchers to the per-level populate operations (with table
//!   attributes, [`Format::table_entry_attrs`]); override those, not them.
//! - [`Mmu`] requires `walker_barrier`, `flush_tlb_range`, `flush_tlb_all`
//!   and `install_root`; all three arches override `flush_tlb_mm` (by
//!   ASID/PCID) and `publish_barrier`; `OBSERVES_WRITES` and
//!   `entry_written` are for the simulator (x86's `SmpMmu` forwards them
//!   to the MMU it wraps).
//! - [`TableAlloc`] requires `alloc_table`, `free_table` and
//!   `phys_to_virt`.
//!
//! # For many CPUs in one address space
//!
//! [`AddressSpace`]'s operations take `&mut self`: one CPU at a time, no
//! locks. Operations by many CPUs at once build on two parts of the
//! contract. Readers that walk tables without their locks rely on a grace
//! period before an unlinked table is freed: a [`GracePeriod`] the kernel
//! supplies (its RCU, or interrupts off and an IPI, as Linux's GUP-fast
//! and `tlb_remove_table` do), or [`ReaderSlots`], which needs nothing but
//! atomics. Writers lock the tables they change: a [`TableLock`] per
//! table frame, which a [`TableLocks`] allocator keeps where the kernel
//! keeps per-frame metadata (Linux's split page-table locks in `ptdesc`;
//! the simulator's `SimAlloc` implements it).
//!
//! [`AddressSpace`]: crate::AddressSpace

use core::fmt;

use crate::{AddressSpace, VirtAddr};

pub(crate) mod arch;
pub(crate) mod format;
pub(crate) mod grace;
pub mod level;
pub(crate) mod lock;
pub(crate) mod mmu;
pub(crate) mod table;

pub use crate::addr::{PAGE_SHIFT, PAGE_SIZE};
pub use crate::contract::arch::Arch;
pub use crate::contract::format::{Access, AccessFault, Decoded, Format};
pub use crate::contract::grace::{GracePeriod, ReadGuard, ReaderSlots};
pub use crate::contract::level::Level;
pub use crate::contract::lock::{TableLock, TableLockGuard, TableLocks};
pub use crate::contract::mmu::{Mmu, NoopMmu, TaggedMmu, TlbRange};
#[cfg(feature = "alloc")]
pub use crate::contract::table::Arena;
pub use crate::contract::table::{Slot, Table, TableAlloc};
pub use crate::error::BbmReason;
/// What [`AddressSpace::replace_pte`] writes. It is here rather than at
/// the root, which holds the types of the common path.
pub use crate::ops::replace::NewPte;
pub use crate::space::table_attrs::TableAttrs;
pub use crate::stats::Stats;

pub mod generic;

/// A read-only view of an address space's raw entries, for tests, arch
/// ports and diagnostics ([`AddressSpace::inspect`]).
pub struct Inspector<'a, A: Arch, M: Mmu, T: TableAlloc> {
    pub(crate) space: &'a AddressSpace<A, M, T>,
}

impl<A: Arch, M: Mmu, T: TableAlloc> Clone for Inspector<'_, A, M, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> Copy for Inspector<'_, A, M, T> {}

impl<A: Arch, M: Mmu, T: TableAlloc> fmt::Debug for Inspector<'_, A, M, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inspector")
            .field("root", &self.space.root())
            .finish_non_exhaustive()
    }
}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Inspector<'a, A, M, T> {
    /// [`walk`](AddressSpace::walk) including software entries: calls `f`
    /// for every non-zero entry that the walk down `[va, va + len)` meets
    /// at the bottom of its path, in address order, as a
    /// [`LeafEntry`](crate::LeafEntry): each present leaf (a page, or a
    /// block of its [`size`](crate::LeafEntry::size); for a folded
    /// contiguous run with the run's accessed/dirty state, as `walk`
    /// reports it) and each software entry
    /// ([`swap_value`](crate::LeafEntry::swap_value); Linux
    /// `is_swap_pte`), so a caller can take a reference on every page and
    /// every swap slot of a range (as fork does in Linux
    /// `copy_nonpresent_pte`: `swap_duplicate`) or check that none is
    /// left. Read-only: nothing is changed, nothing flushed.
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NewPte, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// space.map(va, PhysAddr(0x8000_0000), 4096, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// space.install_pte(VirtAddr(va.0 + 4096), NewPte::Swap(3)).unwrap();
    /// let mut seen = Vec::new();
    /// space.inspect().entries(va, 2 << 12, |e| seen.push((e.pa(), e.swap_value()))).unwrap();
    /// assert_eq!(seen, [(Some(PhysAddr(0x8000_0000)), None), (None, Some(3))]);
    /// // `walk` reports the page only.
    /// let mut n = 0;
    /// space.walk(va, 2 << 12, |_| n += 1).unwrap();
    /// assert_eq!(n, 1);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As `walk`: misaligned or zero length, or a range outside the
    /// address space.
    pub fn entries(
        &self,
        va: VirtAddr,
        len: u64,
        mut f: impl FnMut(crate::LeafEntry<A>),
    ) -> Result<(), crate::Error> {
        self.space.visit(va, len, true, |va, height, raw, _| {
            f(crate::LeafEntry::new(va, height, raw));
        })
    }

    /// The raw value of the entry at `height` on the path to `va` (Linux
    /// `ptep_get` / `pmdp_get` / `pudp_get`), if the tables down to that
    /// height exist; `None` also for an address outside the address space
    /// or a height of `LEVELS` or more. [`Format::decode`] tells what it is.
    pub fn entry(self, va: VirtAddr, height: u32) -> Option<u64> {
        // Relaxed: we read one entry; the hardware may write A/D into it.
        self.space
            .find_slot(va, height)
            .map(|s| s.load(core::sync::atomic::Ordering::Relaxed))
    }

    /// The live entry at `height` on the path to `va` (Linux
    /// `pte_offset_kernel` and its PMD/PUD kin), if the tables down to
    /// that height exist. To read an entry, use the safe
    /// [`entry`](Self::entry).
    ///
    /// The address space cannot change while the slot is borrowed, but the
    /// hardware walker may read it, or set accessed/dirty state in it, at
    /// any time.
    ///
    /// # Safety
    ///
    /// The algorithms, `Drop` included, trust every entry they find: a
    /// table entry is followed, and its frame handed back to the allocator
    /// in the end. Whatever the caller stores through the slot must
    /// therefore keep the tables sound:
    ///
    /// - store only `0`, a leaf the format allows at `height`, a value that
    ///   [decodes](Format::decode) as [`Decoded::Invalid`], or a leaf's
    ///   accessed/dirty state changed as the hardware would;
    /// - never store a table entry, with one exception:
    ///   `A::table_entry(pa, height)` into an entry that is `0`, where `pa`
    ///   is a zero-filled frame that this address space's allocator handed
    ///   out (see [`AddressSpace::alloc_mut`]) and that is linked nowhere
    ///   else; the address space owns and frees it from then on;
    /// - never overwrite a table entry;
    /// - if the address space may be installed, make the change in the way
    ///   the architecture requires for a live entry (break-before-make,
    ///   walker barrier, TLB invalidation: the [`Arch`] entry operations
    ///   and the [`Mmu`] flushes) before relying on it, so no CPU keeps
    ///   using a translation the caller has taken away.
    pub unsafe fn slot(self, va: VirtAddr, height: u32) -> Option<&'a Slot> {
        self.space.find_slot(va, height)
    }

    /// Number of tables reachable from the root through the root entries
    /// of the space's [range](AddressSpace::va_range), the root included
    /// (a user space does not count the kernel tables its root links).
    pub fn count_tables(self) -> usize {
        let s = self.space;
        let (first, last) = s.range.root_indices::<A>();
        1 + s.count_below_root(first, last)
    }

    /// Whether the address space is active: [`install`](AddressSpace::install)ed
    /// and not [`deactivate`](AddressSpace::deactivate)d since.
    pub fn is_active(self) -> bool {
        self.space.active
    }

    /// The table attributes new tables are linked with
    /// ([`AddressSpace::set_table_attrs`]).
    pub fn table_attrs(self) -> TableAttrs {
        self.space.table_attrs
    }

    /// Whether this space shares its kernel half with user spaces
    /// ([`AddressSpace::share_kernel_half`]).
    pub fn is_kernel_half_shared(self) -> bool {
        self.space.kernel_half
    }
}
