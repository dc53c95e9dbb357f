//! [`MmuGather`]: flush batching owned by the caller (Linux
//! `struct mmu_gather`, `tlb_gather_mmu` / `tlb_finish_mmu`).
//!
//! Every operation of [`AddressSpace`] flushes the TLB once at its end and
//! frees the tables it unlinked after that flush. A kernel that runs a
//! sequence of operations on one address space (`munmap` of several
//! areas, `exit_mmap`, reclaim of a batch of pages) can instead start a
//! gather, pass it to the `*_gathered` forms of the operations, and finish
//! it once: one TLB flush for the whole sequence, and every table frame
//! the sequence unlinked goes back to the allocator only after that flush.

use core::fmt;

use crate::aspace::FreeQueue;
use crate::{AddressSpace, Arch, Error, Mmu, PhysAddr, Prot, TableAlloc, TlbGather, VirtAddr};

/// The TLB invalidations and the unlinked table frames of a sequence of
/// operations on one address space, flushed and freed once by
/// [`AddressSpace::tlb_finish_mmu`] (Linux `struct mmu_gather`).
///
/// Start one with [`AddressSpace::tlb_gather_mmu`]; it is bound to that
/// address space (its root), and an operation given it on another address
/// space fails with [`Error::ForeignGather`] and changes nothing.
///
/// Until it is finished, translations the operations removed may still be
/// in TLBs: pages whose mappings were removed or made read-only (or
/// clean) must not be reused, written back or treated as clean before
/// [`tlb_finish_mmu`](AddressSpace::tlb_finish_mmu) returns.
///
/// ```
/// # #[cfg(feature = "alloc")] {
/// use pgtable_core::{AddressSpace, Arena, MapOptions, NoopMmu, PhysAddr, Prot, VirtAddr};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let va = VirtAddr(1 << 30);
/// space.map(va, PhysAddr(0x8000_0000), 8 << 20, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
/// let mut tlb = space.tlb_gather_mmu();
/// space.unmap_gathered(&mut tlb, va, 2 << 20).unwrap();
/// let mut pages = Vec::new();
/// space.unmap_with_gathered(&mut tlb, va.add(4 << 20), 2 << 20, |r| pages.push(r.pa())).unwrap();
/// space.tlb_finish_mmu(tlb).unwrap(); // one flush; the emptied tables are freed now
/// // Only now may `pages` be reused.
/// assert_eq!(pages.len(), 512);
/// # }
/// ```
///
/// A gather must be finished. Forgetting to is caught twice: the type is
/// `#[must_use]`, and dropping one that holds work panics in debug builds.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// use pgtable_core::{AddressSpace, Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// space.tlb_gather_mmu(); // error: unused `MmuGather` that must be used
/// ```
/// In release builds such a drop flushes nothing and leaks the queued
/// table frames (they are never freed, so no walker can reach a reused
/// frame); the stale translations stay until some later flush, which is
/// why it is a bug.
#[must_use = "an MmuGather must be finished with AddressSpace::tlb_finish_mmu"]
pub struct MmuGather {
    root: PhysAddr,
    pub(crate) tlb: TlbGather,
    pub(crate) q: FreeQueue,
}

impl MmuGather {
    /// Whether nothing waits for the flush: no translation to invalidate,
    /// no table to free.
    pub fn is_empty(&self) -> bool {
        self.tlb.is_empty() && self.q.count == 0
    }

    /// The number of table frames waiting for the flush to be freed.
    pub fn tables_queued(&self) -> usize {
        self.q.count
    }

    /// The root of the address space this gather belongs to.
    pub fn root(&self) -> PhysAddr {
        self.root
    }
}

impl fmt::Debug for MmuGather {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MmuGather")
            .field("root", &self.root)
            .field("range", &self.tlb.range())
            .field("tables_queued", &self.q.count)
            .finish()
    }
}

impl Drop for MmuGather {
    fn drop(&mut self) {
        let pending = !self.is_empty();
        // Our own check below replaces the inner gather's (two failing
        // assertions during one unwind would abort).
        self.tlb.discard();
        #[cfg(feature = "std")]
        if std::thread::panicking() {
            return;
        }
        debug_assert!(
            !pending,
            "an MmuGather holding work was dropped without tlb_finish_mmu: \
             stale TLB entries remain and its table frames are leaked"
        );
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Starts a gather for a sequence of operations on this address space
    /// (Linux `tlb_gather_mmu`). Finish it with
    /// [`tlb_finish_mmu`](Self::tlb_finish_mmu).
    pub fn tlb_gather_mmu(&self) -> MmuGather {
        MmuGather {
            root: self.root,
            tlb: TlbGather::new(),
            q: FreeQueue::new(),
        }
    }

    /// Finishes a gather (Linux `tlb_finish_mmu`): one TLB flush for every
    /// translation the operations given it removed or changed (a range
    /// flush, or a full flush past the arch's ceiling), then frees the
    /// table frames they unlinked.
    ///
    /// # Errors
    ///
    /// A gather started on another address space is handed back unchanged
    /// (finish it on its own address space); nothing is flushed or freed.
    pub fn tlb_finish_mmu(&mut self, mut tlb: MmuGather) -> Result<(), MmuGather> {
        if tlb.root != self.root {
            return Err(tlb);
        }
        let gather = core::mem::take(&mut tlb.tlb);
        let q = core::mem::replace(&mut tlb.q, FreeQueue::new());
        self.finish(gather, q);
        Ok(())
    }

    /// Refuses a gather of another address space.
    #[inline]
    pub(crate) fn check_gather(&self, tlb: &MmuGather) -> Result<(), Error> {
        if tlb.root == self.root {
            Ok(())
        } else {
            Err(Error::ForeignGather)
        }
    }

    /// [`unmap`](Self::unmap) into the caller's gather: the TLB flush and
    /// the freeing of emptied tables wait for
    /// [`tlb_finish_mmu`](Self::tlb_finish_mmu).
    ///
    /// # Errors
    ///
    /// As [`unmap`](Self::unmap), and [`Error::ForeignGather`]; on error
    /// nothing was changed.
    pub fn unmap_gathered(
        &mut self,
        tlb: &mut MmuGather,
        va: VirtAddr,
        len: u64,
    ) -> Result<(), Error> {
        self.check_gather(tlb)?;
        self.unmap_into(
            va,
            len,
            &mut crate::unmap::NoReport,
            &mut tlb.tlb,
            &mut tlb.q,
        )
    }

    /// [`unmap_with`](Self::unmap_with) into the caller's gather. The
    /// reported pages must not be reused before
    /// [`tlb_finish_mmu`](Self::tlb_finish_mmu) returns.
    ///
    /// # Errors
    ///
    /// As [`unmap`](Self::unmap), and [`Error::ForeignGather`]; on error
    /// nothing was changed and nothing reported.
    pub fn unmap_with_gathered(
        &mut self,
        tlb: &mut MmuGather,
        va: VirtAddr,
        len: u64,
        f: impl FnMut(crate::Removed<A>),
    ) -> Result<(), Error> {
        self.check_gather(tlb)?;
        let trust_settled = tlb.tlb.is_empty();
        let mut z = crate::unmap::Report::new(f, trust_settled);
        self.unmap_into(va, len, &mut z, &mut tlb.tlb, &mut tlb.q)
    }

    /// [`change_protection`](Self::change_protection) into the caller's
    /// gather.
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
    /// As [`change_protection`](Self::change_protection), and
    /// [`Error::ForeignGather`]; on error nothing was changed.
    pub fn change_protection_gathered(
        &mut self,
        tlb: &mut MmuGather,
        va: VirtAddr,
        len: u64,
        prot: Prot,
    ) -> Result<(), Error> {
        self.check_gather(tlb)?;
        let end = self.check_range(va, len)?;
        let top = A::LEVELS - 1;
        let differs = |raw, h| A::leaf_prot(raw, h) != prot;
        let need = self.split_check(top, self.root, va.0, end, &differs);
        let mut stash = self.reserve(need)?;
        if !tlb.tlb.is_empty() {
            let mut pending = core::mem::take(&mut tlb.tlb);
            if self.may_hold_global {
                pending.global_changed();
            }
            pending.flush::<A, _>(&self.mmu);
        }
        self.may_hold_global |= prot.global();
        // Runs covered in part are unfolded (flushed at once, as
        // break-before-make needs), as `change_protection` does.
        self.contpte_unfold_edges_if(va.0, end, &differs);
        self.protect_change(top, self.root, va.0, end, prot, &mut stash, &mut tlb.tlb);
        debug_assert_eq!(stash.count, 0, "split reservation over-counted");
        let short = stash.short;
        self.release(stash);
        if short {
            return Err(Error::OutOfMemory);
        }
        Ok(())
    }
}
