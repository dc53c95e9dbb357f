//! Replacing one PTE in place: a present page by a software entry (Linux
//! `try_to_unmap_one`), by another frame (`wp_page_copy`), and a software
//! entry by a page (`do_swap_page`), without allocating and without a
//! call that leaves the PTE empty.

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{index, page_size};
use crate::ops::contpte;
use crate::space::aspace::{break_entry, FreeQueue};
use crate::space::walker::Next;
use crate::{
    AddressSpace, Arch, Error, LeafEntry, Mmu, PhysAddr, Prot, TableAlloc, TlbGather, VirtAddr,
};

/// The entry [`AddressSpace::replace_pte`] writes into a PTE.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum NewPte {
    /// A present 4 KiB page mapping `pa` with `prot` (Linux `mk_pte`):
    /// the frame a page is swapped in to, or the private copy of a
    /// copy-on-write fault.
    Page {
        /// The frame, page aligned.
        pa: PhysAddr,
        /// What the page grants.
        prot: Prot,
    },
    /// A software entry carrying this value (Linux
    /// `swp_entry_to_pte`): a swap slot or a migration target, at most
    /// [`Format::SWP_VALUE_BITS`](crate::Format::SWP_VALUE_BITS) wide.
    Swap(u64),
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Replaces the PTE of `va`, a present page or a software entry, by
    /// `new`, and returns the entry it held: the operations of reclaim,
    /// copy-on-write and swap-in in one call, which never allocates a
    /// table and never returns with the PTE empty.
    ///
    /// - A present page becomes a software entry (Linux
    ///   `try_to_unmap_one`: `ptep_clear_flush`, then `set_pte_at` of the
    ///   swap PTE).
    /// - A present page becomes another frame (Linux `wp_page_copy`:
    ///   `ptep_clear_flush`, then `set_pte_at` of the copy).
    /// - A software entry becomes a page (Linux `do_swap_page`) or another
    ///   software entry.
    ///
    /// The flush rule. A present entry is taken out with the atomic
    /// get-and-clear (Linux `ptep_get_and_clear`), so the returned entry
    /// holds every accessed/dirty update the hardware made up to then, and
    /// its page is flushed from every TLB before this returns; a new
    /// present frame is written only after that flush, which is the
    /// break-before-make sequence arm64 requires for a change of output
    /// address (Arm ARM D8.16.1), and what x86 and RISC-V need too: a TLB
    /// may hold the old translation until it is invalidated (Intel SDM
    /// Vol. 3A §4.10.4.2; RISC-V privileged spec §12.2.1, SFENCE.VMA). A
    /// software entry is never cached, so replacing one needs no flush
    /// (SDM Vol. 3A §4.10.2.2: no TLB entry unless P is 1 in every entry
    /// of the walk; Arm ARM D8.16: descriptors that generate a
    /// Translation fault are not cached); the new entry is written with
    /// the synchronising setter, so the walker sees it when this returns.
    ///
    /// A page of a folded contiguous run (arm64 contiguous hint, RISC-V
    /// Svnapot) is replaced after its run is unfolded (break-before-make
    /// for the whole run, Linux `contpte_try_unfold`); the returned entry
    /// then carries the run's ORed accessed/dirty state, and the other
    /// pages of the run stay mapped without the hint.
    ///
    /// Free or reuse the old page only after this returns (the flush is
    /// done then). With [`MmuGather::replace_pte`](crate::MmuGather::replace_pte)
    /// the flush of a page that becomes a software entry waits for the
    /// gather's end.
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NewPte, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// space.map(va, PhysAddr(0x8000_0000), 4096, Prot::READ_ONLY, MapOptions::PAGES).unwrap();
    /// // Copy-on-write: the shared page becomes the private copy.
    /// let copy = NewPte::Page { pa: PhysAddr(0x9000_0000), prot: Prot::READ_WRITE };
    /// let old = space.replace_pte(va, copy).unwrap();
    /// assert_eq!(old.pa(), Some(PhysAddr(0x8000_0000)));
    /// // Reclaim: the copy goes out to swap slot 7, then comes back.
    /// let old = space.replace_pte(va, NewPte::Swap(7)).unwrap();
    /// assert_eq!(old.pa(), Some(PhysAddr(0x9000_0000)));
    /// let new = NewPte::Page { pa: PhysAddr(0xa000_0000), prot: Prot::READ_WRITE };
    /// assert_eq!(space.replace_pte(va, new).unwrap().swap_value(), Some(7));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// A misaligned or out-of-range `va` or page frame,
    /// [`Error::SwapValueTooWide`] for a value that does not fit a
    /// software entry, [`Error::NotMapped`] when the PTE of `va` is empty
    /// or its table missing (nothing to replace: use
    /// [`install_pte`](Self::install_pte), for a page or a software
    /// entry), and
    /// [`Error::BlockMapped`] when a block maps `va` (a huge page is split
    /// or unmapped first; this call allocates no table). On error nothing
    /// was changed.
    pub fn replace_pte(&mut self, va: VirtAddr, new: NewPte) -> Result<LeafEntry<A>, Error> {
        let mut gather = TlbGather::new();
        let r = self.replace_into(va, new, &mut gather);
        self.finish(gather, FreeQueue::new());
        r
    }

    /// [`replace_pte`](Self::replace_pte) with the flush of a page that
    /// becomes a software entry added to `pending` (the caller flushes it).
    /// A present page that becomes another frame is flushed at once, as
    /// break-before-make needs; a page written where `pending` still holds
    /// an unflushed translation of `va` flushes `pending` first.
    pub(crate) fn replace_into(
        &mut self,
        va: VirtAddr,
        new: NewPte,
        pending: &mut TlbGather,
    ) -> Result<LeafEntry<A>, Error> {
        self.check_range(va, page_size::<A>())?;
        let raw_new = match new {
            NewPte::Page { pa, prot } => {
                Self::check_phys(pa, page_size::<A>())?;
                A::leaf(pa, prot, 0)
            }
            NewPte::Swap(v) => A::swp_entry(v).ok_or(Error::SwapValueTooWide(v))?,
        };
        let old = self.pte_to_replace(va)?;
        let present = A::swp_value(old).is_none();
        if present && contpte::is_folded::<A>(old, 0) {
            self.contpte_unfold(va.0, 0);
        }
        let Some(pte) = self.table_for(va.0, 0) else {
            // Checked above: the PTE table exists (and unfolding keeps it).
            return Err(Error::NotMapped(va));
        };
        let slot = pte.slot(index::<A>(va.0, 0));
        let new_present = matches!(new, NewPte::Page { .. });
        let old = match (present, new_present) {
            // The break of break-before-make, flushed at once: the new
            // frame must not meet the old translation in any TLB.
            (true, true) => break_entry::<A, _>(&self.mmu, slot, va, 0),
            // Cleared atomically (its final accessed/dirty state); the
            // new entry is not valid, so its flush may wait for `pending`.
            (true, false) => {
                let old = A::ptep_get_and_clear(&self.mmu, slot);
                pending.add_leaf::<A>(va, 0);
                old
            }
            // Relaxed: we hold the space; a software entry is never written
            // by the hardware.
            (false, _) => slot.load(Relaxed),
        };
        if new_present && !present && pending.overlaps(va.0, page_size::<A>()) {
            // A gathered replace of this page is not flushed yet: the old
            // frame may still be cached, so it goes before the new one is
            // written (break-before-make across the two calls).
            self.flush(core::mem::take(pending));
        }
        A::set_pte_at(&self.mmu, va, slot, raw_new);
        self.mmu.stats.add_entries_written(1);
        if let NewPte::Page { prot, .. } = new {
            self.may_hold_global |= prot.global();
        }
        Ok(LeafEntry::new(va.0, 0, old))
    }

    /// The PTE of `va` if it is a present page or a software entry of
    /// this format: its value.
    fn pte_to_replace(&self, va: VirtAddr) -> Result<u64, Error> {
        let mut t = self.root_table();
        let mut h = A::LEVELS - 1;
        loop {
            let (raw, next) = self.read(t, index::<A>(va.0, h), h);
            match next {
                Next::Table(c) if h > 0 => t = c,
                Next::Leaf(_) if h == 0 => return Ok(raw),
                Next::Leaf(_) => return Err(Error::BlockMapped(va)),
                Next::Invalid if h == 0 && A::swp_value(raw).is_some() => return Ok(raw),
                _ => return Err(Error::NotMapped(va)),
            }
            h -= 1;
        }
    }
}
