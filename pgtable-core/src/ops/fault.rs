//! Fault-time operations on one entry: install one page with the least
//! work (Linux `set_pte_at` in `do_anonymous_page` / `finish_fault`), and
//! update one present leaf's accessed/dirty state and write permission
//! (Linux `ptep_set_access_flags`).

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{index, page_size, shift, size};
use crate::contract::NewPte;
use crate::space::aspace::{bbm_reason, needs_bbm, FreeQueue};
use crate::space::walker::Next;
use crate::{AddressSpace, Arch, Decoded, Error, Mmu, Prot, Slot, TableAlloc, TlbGather, VirtAddr};

bitflags::bitflags! {
    /// What [`AddressSpace::ptep_set_access_flags`] sets in a leaf besides
    /// the accessed state, which it always sets: a set of flags, built like
    /// [`Prot`] (the empty set is [`FaultFlags::ACCESS`]).
    ///
    /// ```
    /// use pgtable_core::FaultFlags;
    ///
    /// assert!(FaultFlags::ACCESS.is_empty());
    /// // A write fault also marks the page dirty.
    /// assert!(FaultFlags::WRITE.contains(FaultFlags::DIRTY));
    /// assert!(!FaultFlags::DIRTY.contains(FaultFlags::WRITE));
    /// ```
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct FaultFlags: u8 {
        /// Accessed and dirty (Linux `pte_mkdirty`): a write fault on a
        /// writable but clean leaf where the hardware does not manage the
        /// dirty state.
        const DIRTY = 1 << 0;
        /// Accessed, dirty and writable (Linux `maybe_mkwrite(pte_mkdirty())`
        /// in `wp_page_reuse`): a write fault on a write-protected page the
        /// faulting task may write in place, e.g. a copy-on-write page it
        /// turned out to be the only user of. Includes [`FaultFlags::DIRTY`].
        const WRITE = Self::DIRTY.bits() | 1 << 1;
    }
}

impl FaultFlags {
    /// The accessed state only (Linux `pte_mkyoung`): an Access flag fault
    /// (arm64 without FEAT_HAFDBS) or a read fault on an old page.
    pub const ACCESS: FaultFlags = FaultFlags::empty();
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Installs one 4 KiB page at `va` (a faulting address, page aligned)
    /// with the least work (Linux `do_anonymous_page` / `finish_fault`
    /// ending in `set_pte_at`): walks down once, allocates only the
    /// missing tables (reserved first, so a failure changes nothing), links
    /// them, writes the PTE, and issues one walker barrier for all of it
    /// (deferred to the end of a [`lazy_mmu`](Self::lazy_mmu) scope). No
    /// TLB flush: the entry goes from not present to present, and a
    /// not-present entry is never cached (Arm ARM D8.16: a change from an
    /// invalid entry needs no break-before-make nor invalidation; Intel SDM
    /// Vol. 3A §4.10.4.3: a change of P from 0 to 1 needs no
    /// invalidation).
    ///
    /// # Errors
    ///
    /// [`Error::MisalignedVirt`] / [`Error::MisalignedPhys`],
    /// [`Error::OutOfRange`] / [`Error::PhysOutOfRange`],
    /// [`Error::AlreadyMapped`] when a page, a block or a non-present
    /// entry is already there, [`Error::OutOfMemory`] when a missing table
    /// cannot be allocated, and for [`NewPte::Swap`]
    /// [`Error::SwapValueTooWide`] when the value does not fit (always, for
    /// a format without software entries). On error nothing was changed
    /// and no table frame stays allocated.
    ///
    /// # Software entries
    ///
    /// With [`NewPte::Swap`] it puts a software entry into the empty PTE
    /// of `va` instead (Linux `set_pte_at(mm, addr, pte,
    /// swp_entry_to_pte(entry))`, e.g. a swap entry restored or a
    /// migration entry set up), allocating the missing tables the same
    /// way; no barrier is needed for the entry itself, which the hardware
    /// never reads. As for a page, the PTE must be none: a page, a block
    /// or a software entry already there is [`Error::AlreadyMapped`]
    /// (replace either in place with
    /// [`replace_pte`](Self::replace_pte), which returns what it
    /// replaced).
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, Error, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NewPte, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let (va, pa) = (VirtAddr(1 << 30), PhysAddr(0x8000_0000));
    /// space.install_pte(va, NewPte::Page { pa, prot: Prot::READ_WRITE }).unwrap();
    /// let next = VirtAddr(va.0 + 4096);
    /// space.install_pte(next, NewPte::Swap(42)).unwrap();
    /// assert_eq!(space.ptep_get(next).unwrap().swap_value(), Some(42));
    /// assert_eq!(space.install_pte(next, NewPte::Swap(7)), Err(Error::AlreadyMapped(next)));
    /// # }
    /// ```
    pub fn install_pte(&mut self, va: VirtAddr, new: NewPte) -> Result<(), Error> {
        let (pa, prot) = match new {
            NewPte::Page { pa, prot } => (pa, prot),
            NewPte::Swap(value) => return self.install_swap(va, value),
        };
        if !va.is_aligned(page_size::<A>()) {
            return Err(Error::MisalignedVirt(va));
        }
        // One page: its range check is its address's.
        self.check_va(va)?;
        Self::check_phys(pa, page_size::<A>())?;
        let entry = A::leaf(pa, prot, 0);
        let i = index::<A>(va.0, 0);
        // The short path when every table exists: the dependent loads of
        // the walk, then the one store.
        match self.table_for(va.0, 0) {
            Some(pte) if pte.load(i) == 0 => A::set_pte_nosync(&self.mmu, pte.slot(i), entry),
            Some(_) => return Err(Error::AlreadyMapped(va)),
            None => self.install_tables(va, entry)?,
        }
        if prot.global() {
            self.may_hold_global = true;
        }
        self.mmu.stats.add_entries_written(1);
        // The one walker barrier for the links and the PTE.
        self.table_done();
        Ok(())
    }

    /// The rest of [`install_pte`](Self::install_pte) when a table on the
    /// path to `va` is missing: finds the first (a leaf or a non-present
    /// entry above the PTE level is [`Error::AlreadyMapped`]), reserves
    /// one for each missing level, links them top-down (each `populate`
    /// orders the zeroed table before its link), then writes `entry`.
    #[cold]
    #[inline(never)]
    fn install_tables(&mut self, va: VirtAddr, entry: u64) -> Result<(), Error> {
        let mut t = self.root_table();
        let mut height = A::LEVELS - 1;
        // Check: how far the tables reach.
        loop {
            match self.read(t, index::<A>(va.0, height), height).1 {
                Next::Table(c) if height > 0 => t = c,
                Next::None => break,
                _ => return Err(Error::AlreadyMapped(va)),
            }
            height -= 1;
        }
        let mut res = self.reserve(height as usize)?;
        let mut h = height;
        let mut t = self.table_for(va.0, h);
        while let Some(parent) = t.filter(|_| h > 0) {
            // Never short: the reservation counted `height` tables.
            t = self.take_table(&mut res);
            if let Some(c) = t {
                let slot = parent.slot(index::<A>(va.0, h));
                A::populate_attrs(&self.mmu, slot, c.pa(), h, self.table_attrs);
            }
            h -= 1;
        }
        if let Some(pte) = t {
            A::set_pte_nosync(&self.mmu, pte.slot(index::<A>(va.0, 0)), entry);
        }
        self.settle(res)
    }

    /// Linux `ptep_set_access_flags` (and `pmdp_set_access_flags` for a
    /// block): sets the state `flags` names in the present leaf covering
    /// `va`, as a fault handler does where the hardware does not (arm64
    /// without FEAT_HAFDBS, or any software-managed dirty tracking), and
    /// with [`FaultFlags::WRITE`] makes it writable. Returns whether the
    /// entry changed (`false`: nothing to do, e.g. the hardware or another
    /// fault already set it; a spurious fault).
    ///
    /// Only relaxing changes are made, with a compare-exchange loop, so an
    /// accessed/dirty update the hardware makes meanwhile is kept. The
    /// flush rule: a change of the accessed state alone is not flushed, as
    /// an entry whose access faults is never cached (Arm ARM D8.5: entries
    /// that generate an Access flag fault are not held in a TLB; x86 caches
    /// only entries whose A is set, SDM Vol. 3A §4.10.2.3). When the dirty
    /// state or the write permission changes, the one page is flushed, as
    /// Linux arm64 `__ptep_set_access_flags` does for a write fault: a TLB
    /// may still hold the read-only entry that faulted, and the store would
    /// fault again. (x86 Linux skips that flush because a page fault itself
    /// invalidates the faulting address, SDM Vol. 3A §4.10.4.1; this crate
    /// flushes on both, one page.)
    ///
    /// In a folded contiguous run (arm64, [`Format::cont_entries`]) the
    /// accessed/dirty change is made on every entry of the run, which stays
    /// folded; a change of the write permission is made on the one entry
    /// after its run is unfolded (break-before-make for the whole run), so
    /// the other pages of the run stay read-only (Linux
    /// `contpte_ptep_set_access_flags`).
    ///
    /// [`Format::cont_entries`]: crate::Format::cont_entries
    ///
    /// # Errors
    ///
    /// [`Error::OutOfRange`] outside the address space,
    /// [`Error::NotMapped`] when no present leaf covers `va`,
    /// [`Error::ProtNone`] when it is a [`Prot::NONE`] leaf (its rights
    /// come back through `change_protection` only),
    /// [`Error::BreakBeforeMake`] when the arch cannot make the change in
    /// place. On error nothing was changed.
    pub fn ptep_set_access_flags(
        &mut self,
        va: VirtAddr,
        flags: FaultFlags,
    ) -> Result<bool, Error> {
        self.check_va(va)?;
        let (t, i, h) = self.leaf_for(va.0).ok_or(Error::NotMapped(va))?;
        let mut slot = t.slot(i);
        let change = |cur: u64| flags.apply::<A>(cur, h);
        // Relaxed: the kind of entry and its permissions do not change
        // under us (the hardware sets accessed/dirty state only).
        let raw = slot.load(Relaxed);
        if matches!(A::decode(raw, h), Decoded::Leaf(_)) && A::is_protnone(raw, h) {
            return Err(Error::ProtNone(va));
        }
        if matches!(A::decode(raw, h), Decoded::Leaf(_))
            && A::is_cont(raw, h)
            && flags.contains(FaultFlags::WRITE)
            && !A::leaf_prot(raw, h).writable()
        {
            // The write permission of one entry of a folded run changes:
            // the run is unfolded first (break-before-make for the whole
            // run) and only this entry is made writable, as Linux
            // `contpte_ptep_set_access_flags` does. Making the whole run
            // writable would also grant stores to pages the fault did not
            // ask for (after a copy-on-write fork: pages still shared).
            let one = A::clear_cont_at(raw, h, i);
            if needs_bbm::<A>(one, change(one), h) {
                return Err(Error::BreakBeforeMake(
                    va,
                    bbm_reason::<A>(one, change(one), h),
                ));
            }
            self.contpte_unfold(va.0, h);
            let (t, i, _) = self.leaf_for(va.0).ok_or(Error::NotMapped(va))?;
            slot = t.slot(i);
        }
        // A folded contiguous run is one translation: an accessed/dirty
        // change applies to every entry of it (Linux
        // `contpte_ptep_set_access_flags`).
        // Relaxed: the compare-exchange below re-checks it.
        let (slots, base) = match A::is_cont(slot.load(Relaxed), h) {
            true => match self.folded_run(va.0, h) {
                Some((run, base)) => (run, base),
                None => (core::slice::from_ref(slot), va.0 & !(size::<A>(h) - 1)),
            },
            false => (core::slice::from_ref(slot), va.0 & !(size::<A>(h) - 1)),
        };
        // Checked before anything is written: the entries of a run share
        // their attributes, so the first decides.
        // Relaxed: as above.
        let cur = slots[0].load(Relaxed);
        if !matches!(A::decode(cur, h), Decoded::Leaf(_)) {
            return Err(Error::NotMapped(va));
        }
        if needs_bbm::<A>(cur, change(cur), h) {
            return Err(Error::BreakBeforeMake(
                va,
                bbm_reason::<A>(cur, change(cur), h),
            ));
        }
        let (written, flush) = relax_entries::<A, _>(&self.mmu, slots, h, change);
        if written == 0 {
            return Ok(false);
        }
        let span = (slots.len() as u64) << shift::<A>(h);
        self.mmu.stats.add_entries_written(written);
        self.table_done();
        if flush {
            let mut gather = TlbGather::new();
            gather.add_range::<A>(VirtAddr(base), span, h);
            self.finish(gather, FreeQueue::new());
        }
        Ok(true)
    }
}

impl FaultFlags {
    /// `cur`, a leaf at `height`, with the state these flags name set:
    /// accessed, then with [`WRITE`](Self::WRITE) the write permission
    /// where it lacks it, then with [`DIRTY`](Self::DIRTY) the dirty state.
    #[inline]
    fn apply<A: Arch>(self, cur: u64, height: u32) -> u64 {
        let mut new = A::mkyoung(cur, height);
        if self.contains(FaultFlags::WRITE) {
            let p = A::leaf_prot(new, height);
            if !p.writable() {
                new = A::modify_prot(new, p.union(Prot::WRITE), height);
            }
        }
        if self.intersects(FaultFlags::DIRTY) {
            new = A::mkdirty(new, height);
        }
        new
    }
}

/// Applies `change` to every present leaf of `slots` (at `height`) with a
/// compare-exchange loop, so an accessed/dirty update the hardware makes
/// meanwhile is kept. Returns how many entries changed and whether a change
/// went beyond the accessed state (which must be flushed; see
/// [`AddressSpace::ptep_set_access_flags`]).
fn relax_entries<A: Arch, M: Mmu>(
    mmu: &M,
    slots: &[Slot],
    height: u32,
    change: impl Fn(u64) -> u64,
) -> (u64, bool) {
    let mut flush = false;
    let mut written = 0u64;
    for slot in slots {
        // Relaxed: the compare-exchange below re-checks it.
        let mut cur = slot.load(Relaxed);
        let done = loop {
            if !matches!(A::decode(cur, height), Decoded::Leaf(_)) {
                break None;
            }
            let new = change(cur);
            if new == cur {
                break None;
            }
            // Relaxed: atomic against the hardware's A/D update; the
            // walker is ordered by the walker barrier that follows.
            match slot.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
                Ok(_) => break Some((cur, new)),
                Err(now) => cur = now,
            }
        };
        if let Some((old, new)) = done {
            if M::OBSERVES_WRITES {
                mmu.entry_written(slot, old);
            }
            written += 1;
            flush |= A::mkyoung(old, height) != A::mkyoung(new, height);
        }
    }
    (written, flush)
}
