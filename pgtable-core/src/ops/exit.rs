//! `exit_mmap`: the teardown of a whole address space (Linux `exit_mmap`:
//! `unmap_vmas`, then `free_pgtables`, under one `mmu_gather`).

use crate::ops::unmap::Report;
use crate::space::aspace::FreeQueue;
use crate::{AddressSpace, Arch, LeafEntry, Mmu, TableAlloc, TlbGather, VaRange, VirtAddr};

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Tears the address space down (Linux `exit_mmap`): unmaps everything
    /// in its range, reporting every entry it removes to `report` as
    /// [`unmap_with`](Self::unmap_with) does (each present leaf with its
    /// final accessed/dirty state, a block as one report of its size, each
    /// software entry, so the caller can drop its page and swap-slot
    /// references), with one TLB flush for all of it (Linux
    /// `tlb_finish_mmu`: [`Mmu::flush_tlb_mm`] for a whole address space,
    /// [`Mmu::flush_tlb_all`] if it may hold global leaves; none if nothing
    /// was mapped), then frees every table, the root included, and hands
    /// back the MMU handle and the allocator.
    ///
    /// Dropping an address space frees its tables too, but reports
    /// nothing; this is the form for a process exit, where every page and
    /// swap slot the tables name must be released. The reports follow the
    /// rules of `unmap_with`: not in address order, and a reported page
    /// must not be reused before this call returns.
    ///
    /// Only the space's own range is torn down: a user space made by
    /// [`new_user`](Self::new_user) reports and frees its own half, never
    /// the kernel half its root links (those tables belong to the kernel
    /// space). Do not call it on a kernel space whose half user spaces
    /// still link, as for dropping it.
    ///
    /// An [`install`](Self::install)ed space (not
    /// [`deactivate`](Self::deactivate)d) is unmapped and flushed the same
    /// way, and every table below its root freed, but its root table may
    /// still be in use by a CPU: it stays allocated (leaked, as a drop
    /// leaks an installed space's tables). Deactivate the space first to
    /// free it.
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NewPte, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// space.map(va, PhysAddr(0x8000_0000), 2 << 12, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// space.install_pte(VirtAddr(va.0 + (2 << 12)), NewPte::Swap(9)).unwrap();
    /// let (mut pages, mut slots) = (Vec::new(), Vec::new());
    /// let (_mmu, arena) = space.exit_mmap(|e| match e.swap_value() {
    ///     Some(slot) => slots.push(slot),
    ///     None => pages.push(e.pa().unwrap()),
    /// });
    /// pages.sort();
    /// assert_eq!(pages, [PhysAddr(0x8000_0000), PhysAddr(0x8000_1000)]);
    /// assert_eq!(slots, [9]);
    /// # let _ = arena;
    /// # }
    /// ```
    pub fn exit_mmap(mut self, report: impl FnMut(LeafEntry<A>)) -> (M, T) {
        let mut gather = TlbGather::new();
        let mut q = FreeQueue::new();
        let mut z = Report::deferring(report);
        let half = 1u64 << (A::VA_BITS - 1);
        let halves = match self.range {
            // The canonical halves, as the space's range checks see them.
            VaRange::Both => [Some((0, half)), Some((half.wrapping_neg(), half))],
            r => {
                let (first, last) = r.bounds::<A>();
                [Some((first, last - first + 1)), None]
            }
        };
        for (va, len) in halves.into_iter().flatten() {
            // Cannot fail: the range is the whole half, so no block is
            // covered in part (nothing to split, nothing to allocate) and
            // the range check passes. Were it to fail, the tables it left
            // are freed below all the same.
            let _ = self.unmap_into(VirtAddr(va), len, &mut z, &mut gather, &mut q);
        }
        // The one flush, then the frees (Linux `tlb_finish_mmu`).
        self.finish(gather, q);
        self.report_deferred(&mut z);
        if !self.active {
            // What is left: the root, and anything the unmap kept.
            self.free_tables();
        }
        let (_, mmu, alloc) = self.into_parts();
        (mmu, alloc)
    }
}
