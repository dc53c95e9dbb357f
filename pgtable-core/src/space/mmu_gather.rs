//! [`MmuGather`]: flush batching owned by the caller (Linux
//! `struct mmu_gather`, `tlb_gather_mmu` / `tlb_finish_mmu`).
//!
//! Every operation of [`AddressSpace`] flushes the TLB once at its end and
//! frees the tables it unlinked after that flush. A kernel that runs a
//! sequence of operations on one address space (`munmap` of several
//! areas, `exit_mmap`, reclaim of a batch of pages) can instead start a
//! gather on it, run the operations through the gather, and finish it
//! once: one TLB flush for the whole sequence, and every table frame the
//! sequence unlinked goes back to the allocator only after that flush.
//!
//! The gather borrows its address space mutably for as long as it lives
//! (as Asterinas ostd's page-table cursor owns its TLB flusher), so the
//! space can neither be used another way, nor dropped, nor replaced until
//! the gather is finished, and a gather can never reach another space.

use core::fmt;

use crate::space::aspace::{FreeQueue, TableSpan};
use crate::{
    AddressSpace, Arch, ClearRefs, Error, LeafEntry, Mmu, Prot, TableAlloc, TlbGather, VirtAddr,
};

/// The TLB invalidations and the unlinked table frames of a sequence of
/// operations on one address space, flushed and freed once by
/// [`finish`](Self::finish) (Linux `struct mmu_gather`).
///
/// Start one with [`AddressSpace::tlb_gather_mmu`]. The gather holds the
/// space's mutable borrow and offers the operations that can be batched
/// ([`unmap`](Self::unmap), [`unmap_with`](Self::unmap_with),
/// [`zap_page_range`](Self::zap_page_range),
/// [`replace_pte`](Self::replace_pte),
/// [`change_protection`](Self::change_protection),
/// [`clear_refs`](Self::clear_refs)); [`space`](Self::space) reads the
/// space meanwhile.
///
/// Until it is finished, translations the operations removed may still be
/// in TLBs: pages whose mappings were removed or made read-only (or
/// clean) must not be reused, written back or treated as clean before
/// [`finish`](Self::finish) returns.
///
/// ```
/// # #[cfg(feature = "alloc")] {
/// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
/// use pgtable_core::contract::{Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let va = VirtAddr(1 << 30);
/// space.map(va, PhysAddr(0x8000_0000), 8 << 20, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
/// let mut tlb = space.tlb_gather_mmu();
/// tlb.unmap(va, 2 << 20).unwrap();
/// let mut pages = Vec::new();
/// tlb.unmap_with(va.add(4 << 20), 2 << 20, |r| pages.push(r.pa())).unwrap();
/// tlb.finish(); // one flush; the emptied tables are freed now
/// // Only now may `pages` be reused.
/// assert_eq!(pages.len(), 512);
/// # }
/// ```
///
/// A gather is bound to its space by the borrow: keeping it past the
/// space's end, or past a replacement of the space, does not compile (so
/// its table frames can never be freed into another space's allocator).
///
/// ```compile_fail
/// use pgtable_core::{AddressSpace, VirtAddr};
/// use pgtable_core::contract::{Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut a = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let mut tlb = a.tlb_gather_mmu();
/// tlb.unmap(VirtAddr(1 << 30), 4096).unwrap();
/// drop(a); // error: cannot move out of `a` because it is borrowed
/// let b = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// tlb.finish();
/// ```
///
/// ```compile_fail
/// use pgtable_core::{AddressSpace, VirtAddr};
/// use pgtable_core::contract::{Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut a = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let mut b = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let mut tlb = a.tlb_gather_mmu();
/// core::mem::swap(&mut a, &mut b); // error: `a` is borrowed by the gather
/// tlb.finish();
/// ```
///
/// A gather should be finished explicitly, where the flush is meant to
/// happen: the type is `#[must_use]`.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// use pgtable_core::AddressSpace;
/// use pgtable_core::contract::{Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// space.tlb_gather_mmu(); // error: unused `MmuGather` that must be used
/// ```
///
/// Dropping a gather finishes it (flush, then free), so no table frame is
/// leaked and no stale translation outlives it. While a panic unwinds
/// (with the `std` feature) the drop still flushes, but leaks the queued
/// frames rather than free them from a half-done operation.
#[must_use = "an MmuGather flushes when finished: call finish() where the flush belongs"]
pub struct MmuGather<'s, A: Arch, M: Mmu, T: TableAlloc> {
    space: &'s mut AddressSpace<A, M, T>,
    tlb: TlbGather,
    q: FreeQueue,
}

impl<A: Arch, M: Mmu, T: TableAlloc> MmuGather<'_, A, M, T> {
    /// Whether nothing waits for the flush: no translation to invalidate,
    /// no table to free.
    pub fn is_empty(&self) -> bool {
        self.tlb.is_empty() && self.q.count == 0
    }

    /// The number of table frames waiting for the flush to be freed.
    pub fn tables_queued(&self) -> usize {
        self.q.count
    }

    /// The address space the gather works on, to read it meanwhile.
    pub fn space(&self) -> &AddressSpace<A, M, T> {
        self.space
    }

    /// Finishes the gather (Linux `tlb_finish_mmu`): one TLB flush for
    /// every translation the operations removed or changed (a range flush,
    /// or a full flush past the arch's ceiling), then frees the table
    /// frames they unlinked.
    pub fn finish(mut self) {
        self.flush_and_free();
    }

    /// Flushes what was gathered, then frees the queued frames; leaves the
    /// gather empty.
    fn flush_and_free(&mut self) {
        let gather = core::mem::take(&mut self.tlb);
        let q = core::mem::replace(&mut self.q, FreeQueue::new());
        self.space.finish(gather, q);
    }

    /// [`AddressSpace::unmap`] into the gather: the TLB flush and the
    /// freeing of emptied tables wait for [`finish`](Self::finish).
    ///
    /// # Errors
    ///
    /// As [`AddressSpace::unmap`]; on error nothing was changed.
    pub fn unmap(&mut self, va: VirtAddr, len: u64) -> Result<(), Error> {
        let z = &mut crate::ops::unmap::NoReport;
        self.space
            .unmap_into(va, len, z, &mut self.tlb, &mut self.q)
    }

    /// [`AddressSpace::unmap_with`] into the gather. The reported pages
    /// must not be reused before [`finish`](Self::finish) returns.
    ///
    /// # Errors
    ///
    /// As [`AddressSpace::unmap`]; on error nothing was changed and
    /// nothing reported.
    pub fn unmap_with(
        &mut self,
        va: VirtAddr,
        len: u64,
        f: impl FnMut(crate::Removed<A>),
    ) -> Result<(), Error> {
        let trust_settled = self.tlb.is_empty();
        self.unmap_reporting(va, len, crate::ops::unmap::Report::new(f, trust_settled))
    }

    /// Linux `zap_page_range`: [`unmap_with`](Self::unmap_with) that keeps
    /// every table linked, emptied or not, for a caller that will fill the
    /// range again (freeing the emptied tables is Linux `free_pgtables`'
    /// job: a later [`unmap`](Self::unmap) or
    /// [`AddressSpace::unmap`] over the range unlinks and frees them). Every
    /// removed entry is reported to `f` as `unmap_with` reports it, with
    /// its final accessed/dirty state; the reported pages must not be
    /// reused before [`finish`](Self::finish) returns. A block the range
    /// covers in part is split first, which takes a table; otherwise no
    /// table is allocated or freed.
    ///
    /// # Errors
    ///
    /// As [`AddressSpace::unmap`]; on error nothing was changed and
    /// nothing reported.
    pub fn zap_page_range(
        &mut self,
        va: VirtAddr,
        len: u64,
        f: impl FnMut(crate::Removed<A>),
    ) -> Result<(), Error> {
        let trust_settled = self.tlb.is_empty();
        self.unmap_reporting(
            va,
            len,
            crate::ops::unmap::Report::keeping(f, trust_settled),
        )
    }

    /// The unmap of [`unmap_with`](Self::unmap_with) and
    /// [`zap_page_range`](Self::zap_page_range) into this gather, reporting
    /// through `z`.
    fn unmap_reporting<F: FnMut(crate::Removed<A>)>(
        &mut self,
        va: VirtAddr,
        len: u64,
        mut z: crate::ops::unmap::Report<F>,
    ) -> Result<(), Error> {
        self.space
            .unmap_into(va, len, &mut z, &mut self.tlb, &mut self.q)
    }

    /// [`AddressSpace::replace_pte`] into the gather. Where a present page
    /// becomes a software entry, its TLB flush waits for
    /// [`finish`](Self::finish) (Linux reclaim's batched flush,
    /// `set_tlb_ubc_flush_pending`): the new entry is not valid, so no TLB
    /// can cache it, and the old page may still be reached through a stale
    /// translation until then, so it must not be written out, freed or
    /// reused before `finish` returns. A store through that translation
    /// after the clear can only happen where the entry was cached dirty,
    /// so the returned dirty state is final. Where a present page becomes
    /// another frame the page is flushed at once, before the new frame is
    /// written (break-before-make, Arm ARM D8.16.1: the new output address
    /// must not meet the old one in a TLB), as
    /// [`AddressSpace::replace_pte`] does; and a page written where this
    /// gather holds an unflushed translation of the same address flushes
    /// the gather first. The entry is replaced before this returns.
    ///
    /// # Errors
    ///
    /// As [`AddressSpace::replace_pte`]; on error nothing was changed.
    pub fn replace_pte(&mut self, va: VirtAddr, new: crate::NewPte) -> Result<LeafEntry<A>, Error> {
        self.space.replace_into(va, new, &mut self.tlb)
    }

    /// [`AddressSpace::clear_refs`] into the gather: the flush waits for
    /// [`finish`](Self::finish), and pages whose dirty state was cleared
    /// must not be treated as clean before it returns.
    ///
    /// # Errors
    ///
    /// As [`AddressSpace::clear_refs`]; on error nothing was changed.
    pub fn clear_refs(
        &mut self,
        va: VirtAddr,
        len: u64,
        what: ClearRefs,
        f: impl FnMut(LeafEntry<A>),
    ) -> Result<(), Error> {
        self.space.clear_refs_into(&mut self.tlb, va, len, what, f)
    }

    /// [`AddressSpace::change_protection`] into the gather.
    ///
    /// If the gather already holds unflushed changes, they are flushed
    /// first (the gather stays open): the protection change copies
    /// entries that the hardware can no longer write with a plain load
    /// and store, and that judgement needs every earlier change of the
    /// range to be out of the TLBs. A gather that starts with the
    /// protection changes batches them all.
    ///
    /// # Errors
    ///
    /// As [`AddressSpace::change_protection`]; on error nothing was
    /// changed.
    pub fn change_protection(&mut self, va: VirtAddr, len: u64, prot: Prot) -> Result<(), Error> {
        // As the leaves report it (see `AddressSpace::change_protection`).
        let prot = prot.normalized();
        let s = &mut *self.space;
        let end = s.check_range(va, len)?;
        let top = A::LEVELS - 1;
        let differs = |raw, h| A::leaf_prot(raw, h) != prot;
        let need = s.split_check(va.0, end, &differs);
        let mut stash = s.reserve(need)?;
        if !self.tlb.is_empty() {
            let mut pending = core::mem::take(&mut self.tlb);
            if s.may_hold_global {
                pending.global_changed();
            }
            pending.flush::<A, _>(&s.mmu);
        }
        s.may_hold_global |= prot.global();
        // Runs covered in part are unfolded (flushed at once, as
        // break-before-make needs), as `change_protection` does.
        s.contpte_unfold_edges_if(va.0, end, &differs);
        s.protect_change(
            TableSpan::new(top, s.root, va.0, end),
            prot,
            &mut stash,
            &mut self.tlb,
        );
        s.settle(stash)
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> fmt::Debug for MmuGather<'_, A, M, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmuGather")
            .field("root", &self.space.root())
            .field("range", &self.tlb.range())
            .field("tables_queued", &self.q.count)
            .finish()
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> Drop for MmuGather<'_, A, M, T> {
    fn drop(&mut self) {
        #[cfg(feature = "std")]
        if std::thread::panicking() {
            // Flush (no stale translation outlives the gather) but leak
            // the queued frames: the panic may have interrupted an
            // operation, and a frame that is never freed can never be
            // reused under a walker.
            let mut gather = core::mem::take(&mut self.tlb);
            if self.space.may_hold_global {
                gather.global_changed();
            }
            gather.flush::<A, _>(&self.space.mmu);
            self.q = FreeQueue::new();
            return;
        }
        self.flush_and_free();
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Starts a gather for a sequence of operations on this address space
    /// (Linux `tlb_gather_mmu`): the operations run through the returned
    /// [`MmuGather`], which flushes and frees once, when it is
    /// [finished](MmuGather::finish) (or dropped).
    pub fn tlb_gather_mmu(&mut self) -> MmuGather<'_, A, M, T> {
        MmuGather {
            space: self,
            tlb: TlbGather::new(),
            q: FreeQueue::new(),
        }
    }
}
