//! `unmap`: remove translations for a range.
//!
//! Phases as in `map`: count the tables that splitting partly covered
//! blocks needs (only blocks at the two ends of the range can be partly
//! covered), reserve them, then clear. Holes in the range are skipped, as
//! Linux's `zap_page_range` skips them. Tables that become empty are
//! unlinked and freed after the one gathered TLB flush.
//!
//! A table whose whole span is unmapped is unlinked without clearing its
//! entries one by one: after the flush no walker can reach it, and the
//! allocator takes frames back with any contents. The accessed/dirty state
//! of unmapped entries is discarded by [`unmap`](AddressSpace::unmap).
//!
//! [`unmap_with`](AddressSpace::unmap_with) reports every entry it removes
//! instead (Linux `zap_pte_range` handing each page to `tlb_remove_page`),
//! so it visits every entry, also in tables it then unlinks whole. A PTE
//! table the range covers whole is unlinked first and its entries read
//! after the TLB flush, with plain loads: from then on no walker can write
//! them, so each read is the entry's final value, accessed and dirty state
//! included, without an atomic swap per page.

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{entry_end, index, shift};
use crate::ops::contpte;
use crate::space::aspace::{covers, Block, FreeQueue, Reservation};
use crate::space::walker::{Next, Span, TableRef, MAX_LEVELS};
use crate::{
    AddressSpace, Arch, Decoded, Error, Format, Mmu, PhysAddr, Removed, Slot, TableAlloc,
    TlbGather, VirtAddr,
};

/// What unmap does with each entry it removes: nothing ([`NoReport`]) or
/// hand it to the caller ([`Report`]).
pub(crate) trait Zap<A: Format> {
    /// Whether entries are reported (then every entry is visited and
    /// taken out with an exact read of its final value).
    const REPORT: bool;
    /// Whether a settled entry ([`Format::is_settled`]) may be read with a
    /// plain load: only when no unflushed change of the range is pending,
    /// so no TLB holds a writable entry the tables no longer grant.
    fn trust_settled(&self) -> bool;
    /// The entry `raw` at `height` covering `va` was removed.
    fn removed(&mut self, va: u64, height: u32, raw: u64);
    /// Where PTE tables unlinked whole wait to be read after the flush
    /// (`None`: report every entry before the flush).
    #[inline]
    fn deferred(&mut self) -> Option<&mut Deferred> {
        None
    }
    /// Whether every table stays linked, emptied or not (Linux
    /// `zap_page_range`; freeing them is `free_pgtables`' job).
    #[inline]
    fn keeps_tables(&self) -> bool {
        false
    }
}

/// PTE tables a report unlinked whole, linked through their first entry
/// (the second holds the table's virtual address): their remaining
/// entries are read and reported after the TLB flush, when no walker can
/// write them any more, with plain loads.
pub(crate) struct Deferred {
    head: u64,
    count: usize,
}

/// Reports of a zap chunk whose first entry is entry `first` of its table:
/// every whole folded run in it gets the run's accessed/dirty state (Linux
/// `contpte_ptep_get`; the hardware may have marked any of its entries).
fn contpte_gather_chunk<A: Format>(old: &mut [u64], first: usize, runs: usize) {
    let mut p = (runs - first % runs) % runs;
    while p + runs <= old.len() {
        let run = &mut old[p..p + runs];
        if contpte::is_folded::<A>(run[0], 0) {
            let young = run.iter().any(|&r| A::is_young(r));
            let dirty = run.iter().any(|&r| A::is_dirty(r));
            for r in run.iter_mut().filter(|r| **r != 0) {
                *r = contpte::with_ad::<A>(*r, 0, young, dirty);
            }
        }
        p += runs;
    }
}

/// What an unmap carries down the tables: the tables reserved for
/// splits, the TLB gather, the tables to free after the flush and the
/// report.
struct Zapping<'r, Z> {
    stash: &'r mut Reservation,
    gather: &'r mut TlbGather,
    q: &'r mut FreeQueue,
    z: &'r mut Z,
}

/// What the cursor keeps for each table on its path until it leaves it.
#[derive(Clone, Copy, Default)]
struct Cleared {
    /// Entries written.
    written: u64,
    /// Whether a software entry was cleared (the table wants its walker
    /// barrier).
    invalid: bool,
}

/// What `unmap_entry` did with one entry.
enum Step<'a> {
    /// Cleared it: the entries written and whether one was a software
    /// entry.
    Cleared(u64, bool),
    /// The cursor goes on in this table, which may be unlinked when the
    /// cursor leaves it if the flag says so.
    Descend(TableRef<'a>, bool),
}

/// Discards the removed entries (plain [`AddressSpace::unmap`]).
pub(crate) struct NoReport;

impl<A: Format> Zap<A> for NoReport {
    const REPORT: bool = false;
    #[inline]
    fn trust_settled(&self) -> bool {
        true
    }
    #[inline]
    fn removed(&mut self, _va: u64, _height: u32, _raw: u64) {}
}

/// Hands every removed entry to a callback.
pub(crate) struct Report<F> {
    f: F,
    trust_settled: bool,
    deferred: Option<Deferred>,
    keep: bool,
}

impl<F> Report<F> {
    pub(crate) fn new(f: F, trust_settled: bool) -> Self {
        Report {
            f,
            trust_settled,
            deferred: None,
            keep: false,
        }
    }

    /// A report that unlinks no table ([`Zap::keeps_tables`]).
    pub(crate) fn keeping(f: F, trust_settled: bool) -> Self {
        Report {
            keep: true,
            ..Report::new(f, trust_settled)
        }
    }

    /// A report that reads the PTE tables it unlinks whole after the
    /// flush ([`AddressSpace::report_deferred`]).
    pub(crate) fn deferring(f: F) -> Self {
        Report {
            f,
            trust_settled: true,
            deferred: Some(Deferred { head: 0, count: 0 }),
            keep: false,
        }
    }
}

impl<A: Format, F: FnMut(Removed<A>)> Zap<A> for Report<F> {
    const REPORT: bool = true;
    #[inline]
    fn trust_settled(&self) -> bool {
        self.trust_settled
    }
    #[inline(always)]
    fn removed(&mut self, va: u64, height: u32, raw: u64) {
        (self.f)(Removed::new(va, height, raw))
    }
    #[inline]
    fn deferred(&mut self) -> Option<&mut Deferred> {
        self.deferred.as_mut()
    }
    #[inline]
    fn keeps_tables(&self) -> bool {
        self.keep
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Unmaps `[va, va + len)`: clears its entries, splits blocks the range
    /// covers only in part, frees tables that become empty, and flushes the
    /// TLB once.
    ///
    /// # Errors
    ///
    /// Misaligned or zero length, a range outside the address space, or
    /// [`Error::OutOfMemory`] when a partly covered block cannot be split.
    /// On error nothing was changed.
    pub fn unmap(&mut self, va: VirtAddr, len: u64) -> Result<(), Error> {
        let mut gather = TlbGather::new();
        let mut q = FreeQueue::new();
        let r = self.unmap_into(va, len, &mut NoReport, &mut gather, &mut q);
        self.finish(gather, q);
        r
    }

    /// [`unmap`](Self::unmap), reporting every entry it removes to `f`
    /// (Linux `zap_pte_range` and `tlb_remove_page`): each present leaf,
    /// with its final accessed and dirty state, and each non-present
    /// non-zero entry (a software entry such as a swap entry, whose slot
    /// the caller must release). A block removed whole is one report of
    /// its size; a block the range covers in part is split first and the
    /// removed part reported page by page (or block by block). Entries of
    /// tables that are unlinked whole are reported too. Every entry of a
    /// folded contiguous run (pages or blocks) is reported with the
    /// accessed/dirty state ORed over the run (Linux `contpte_ptep_get`,
    /// `huge_ptep_get`): the hardware may record a store in any entry of it.
    ///
    /// The report is the value the entry held when it was taken out: an
    /// atomic get-and-clear (Linux `ptep_get_and_clear`) where the
    /// hardware could still set accessed or dirty state, a plain read
    /// where it cannot ([`Format::is_settled`]: accessed, and dirty or
    /// read-only). So a store the hardware made before the removal always
    /// shows as [`dirty`](crate::LeafEntry::dirty).
    ///
    /// Reports are not in address order: the pages of a page table the
    /// range covers whole are reported after the TLB flush (their table is
    /// unlinked first and read once no walker can reach it), the others
    /// before it. A CPU may still reach the pages reported before the
    /// flush through a stale translation until this call returns, so do
    /// not reuse or free a reported page before then (Linux frees the
    /// gathered pages only after the flush, in `tlb_finish_mmu`). With
    /// [`MmuGather::unmap_with`](crate::MmuGather::unmap_with) that point
    /// is [`MmuGather::finish`](crate::MmuGather::finish).
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// space.map(va, PhysAddr(0x8000_0000), 3 << 12, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// let mut freed = Vec::new();
    /// space.unmap_with(va, 3 << 12, |r| freed.push((r.pa().unwrap(), r.dirty()))).unwrap();
    /// assert_eq!(freed.len(), 3);
    /// assert_eq!(freed[2].0, PhysAddr(0x8000_2000));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`unmap`](Self::unmap); on error nothing was changed and nothing
    /// reported.
    pub fn unmap_with(
        &mut self,
        va: VirtAddr,
        len: u64,
        f: impl FnMut(Removed<A>),
    ) -> Result<(), Error> {
        let mut gather = TlbGather::new();
        let mut q = FreeQueue::new();
        let mut z = Report::deferring(f);
        let r = self.unmap_into(va, len, &mut z, &mut gather, &mut q);
        self.finish(gather, q);
        self.report_deferred(&mut z);
        r
    }

    /// Reports the entries of the PTE tables `z` deferred, now that the
    /// flush is done, and frees those tables.
    pub(crate) fn report_deferred<F: FnMut(Removed<A>)>(&mut self, z: &mut Report<F>) {
        let Some(d) = z.deferred.take() else {
            return;
        };
        let mut head = d.head;
        for _ in 0..d.count {
            let pa = PhysAddr(head);
            // SAFETY: a PTE table this call unlinked; the flush is done, so
            // no walker reaches it and nothing but this loop reads it.
            let t = unsafe { self.owned_frame(pa) };
            // Relaxed: private to this thread (see above).
            head = t[0].load(Relaxed);
            let va = t[1].load(Relaxed);
            let runs = A::cont_entries(0) as usize;
            let mut k = 2;
            while k < t.len() {
                let raw = t[k].load(Relaxed);
                if runs != 0 && k % runs == 0 && contpte::is_folded::<A>(raw, 0) {
                    // A folded run: every page reported with the run's
                    // accessed/dirty state (Linux `contpte_ptep_get`).
                    let run = &t[k..k + runs];
                    let (young, dirty) = contpte::gather_ad::<A>(run);
                    for (j, e) in run.iter().enumerate() {
                        let raw = e.load(Relaxed);
                        if raw == 0 {
                            continue;
                        }
                        let raw = contpte::with_ad::<A>(raw, 0, young, dirty);
                        (z.f)(Removed::new(
                            va + (((k + j) as u64) << shift::<A>(0)),
                            0,
                            raw,
                        ));
                    }
                    k += runs;
                    continue;
                }
                if raw != 0 {
                    (z.f)(Removed::new(va + ((k as u64) << shift::<A>(0)), 0, raw));
                }
                k += 1;
            }
            // SAFETY: unlinked, and the TLB flush has completed.
            unsafe { self.alloc.free_table(pa) };
        }
        self.mmu.stats.add_tables_freed(d.count as u64);
    }

    /// Takes the subtree at `pa` (height `height`, covering from `va`)
    /// that a report unlinked whole: reports its blocks and software
    /// entries now, queues its upper tables for freeing, and defers its
    /// PTE tables to [`report_deferred`](Self::report_deferred) after
    /// taking their first two entries (which become the link).
    fn defer_subtree<Z: Zap<A>>(
        &self,
        q: &mut FreeQueue,
        pa: PhysAddr,
        height: u32,
        va: u64,
        z: &mut Z,
    ) {
        // SAFETY: the subtree is ours; it was reachable until unlinked.
        let t = unsafe { self.owned_frame(pa) };
        let runs = A::cont_entries(0) as usize;
        // Relaxed: exclusive access; the swaps below re-read exactly.
        if height == 0 && runs != 0 && contpte::is_folded::<A>(t[0].load(Relaxed), 0) {
            // The first run is folded: it is taken and reported whole now,
            // with its accessed/dirty state ORed over the run (entries 0
            // and 1 become the link below).
            let mut old = [0u64; contpte::MAX_RUN];
            let (mut young, mut dirty) = (false, false);
            for (o, slot) in old.iter_mut().zip(&t[..runs]) {
                // Until the flush the hardware may still write it.
                *o = A::ptep_get_and_clear(&self.mmu, slot);
                young |= A::is_young(*o);
                dirty |= A::is_dirty(*o);
            }
            for (k, &o) in old[..runs].iter().enumerate() {
                if o != 0 {
                    let raw = contpte::with_ad::<A>(o, 0, young, dirty);
                    z.removed(va + ((k as u64) << shift::<A>(0)), 0, raw);
                }
            }
        }
        if height == 0 {
            for (k, slot) in t[..2].iter().enumerate() {
                // Relaxed: exclusive access; the swap re-reads exactly.
                if slot.load(Relaxed) != 0 {
                    // Until the flush the hardware may still write it.
                    let old = A::ptep_get_and_clear(&self.mmu, slot);
                    z.removed(va + ((k as u64) << shift::<A>(0)), 0, old);
                }
            }
            if let Some(d) = z.deferred() {
                // Relaxed: only this thread follows the link. Both values
                // have their low 12 bits clear, so a walker that still
                // uses a cached pointer to the table reads them as
                // invalid entries.
                t[0].store(d.head, Relaxed);
                t[1].store(va, Relaxed);
                d.head = pa.0;
                d.count += 1;
            }
            return;
        }
        for (i, slot) in t.iter().enumerate() {
            // Relaxed: exclusive access; leaves are taken atomically.
            let raw = slot.load(Relaxed);
            let eva = va + ((i as u64) << shift::<A>(height));
            match A::decode(raw, height) {
                Decoded::None => {}
                Decoded::Table(c) => self.defer_subtree(q, c, height - 1, eva, z),
                Decoded::Leaf(_) if A::is_cont(raw, height) => {
                    // The first entry of a folded run of blocks: the whole
                    // run is taken now (its other entries then read as
                    // none).
                    let slots = contpte::run_slots::<A>(t, i, height);
                    self.zap_block_run(slots, eva, height, z);
                }
                Decoded::Leaf(_) => {
                    let old = if A::is_settled(raw, height) {
                        raw
                    } else {
                        A::pmdp_huge_get_and_clear(&self.mmu, slot)
                    };
                    z.removed(eva, height, old);
                }
                Decoded::Invalid => z.removed(eva, height, raw),
            }
        }
        self.queue_free(q, pa);
    }

    /// Takes the folded run of blocks `slots` at `height` (first address
    /// `base`) out whole and reports every entry of it with the run's
    /// accessed/dirty state (Linux `huge_ptep_get`: the hardware may have
    /// marked any entry of the run, whichever it walked).
    fn zap_block_run<Z: Zap<A>>(&self, slots: &[Slot], base: u64, height: u32, z: &mut Z) {
        let mut old = [0u64; contpte::MAX_RUN];
        let (mut young, mut dirty) = (false, false);
        for (o, slot) in old.iter_mut().zip(slots) {
            // Until the flush the hardware may still write it.
            *o = A::pmdp_huge_get_and_clear(&self.mmu, slot);
            young |= A::is_young(*o);
            dirty |= A::is_dirty(*o);
        }
        for (k, &o) in old[..slots.len()].iter().enumerate() {
            if o != 0 {
                let raw = contpte::with_ad::<A>(o, height, young, dirty);
                z.removed(base + ((k as u64) << shift::<A>(height)), height, raw);
            }
        }
    }

    /// The three phases of unmap, leaving the flush and the frees to the
    /// caller (`gather`, `q`).
    pub(crate) fn unmap_into<Z: Zap<A>>(
        &mut self,
        va: VirtAddr,
        len: u64,
        z: &mut Z,
        gather: &mut TlbGather,
        q: &mut FreeQueue,
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        let need = self.split_check(va.0, end, &|_, _| true);
        let mut stash = self.reserve(need)?;
        // Runs the range covers in part are unfolded first (whole runs go
        // whole, so the hint never outlives part of its run).
        self.contpte_unfold_edges(va.0, end);
        let mut cx = Zapping {
            stash: &mut stash,
            gather,
            q,
            z,
        };
        self.unmap_clear(va.0, end, &mut cx);
        // Short only if `split_check` under-counted (see `take`).
        self.settle(stash)
    }

    /// Clears `[va, end)` on the cursor. A table entry is cleared after
    /// the table it links (when the cursor leaves that table), and only if
    /// that table is now empty or covered whole; each table's entry count
    /// and barrier also come when the cursor leaves it.
    fn unmap_clear<Z: Zap<A>>(&self, va: u64, end: u64, cx: &mut Zapping<'_, Z>) {
        let mut tables = [Cleared::default(); MAX_LEVELS];
        // Whether the table at each height on the path may be unlinked
        // once the cursor leaves it.
        let mut unlink = [false; MAX_LEVELS];
        let mut cur = self.cursor(va, end);
        while let Some(span) = cur.span() {
            let h = span.height as usize;
            if let Some((child, va, may)) = self.unmap_span(span, cx, &mut tables[h]) {
                unlink[h - 1] = may;
                cur.descend(child, va);
                continue;
            }
            for d in cur.advance(span.next) {
                let d = d as usize;
                let done = core::mem::take(&mut tables[d]);
                self.mmu.stats.add_entries_written(done.written);
                if done.invalid {
                    self.table_done();
                }
                let Some(l) = cur.left(d as u32).filter(|_| unlink[d]) else {
                    continue;
                };
                // The caller only frees a table it does not cover whole
                // when it is empty, so scan unless the range covered every
                // entry. A table found empty is queued alone: scanning it
                // again for children to count and to free would read
                // every entry twice more (8192 each with 64 KiB pages).
                let empty = !l.whole() && l.is_empty();
                if l.whole() || empty {
                    A::set_pte_nosync(&self.mmu, l.link(), 0);
                    tables[d + 1].written += 1;
                    cx.gather
                        .add_tables::<A>(VirtAddr(l.va), l.next.wrapping_sub(l.va));
                    if empty {
                        self.queue_free(cx.q, l.table.pa());
                    } else {
                        self.queue_free_subtree(cx.q, l.table.pa(), d as u32);
                    }
                }
            }
        }
    }

    /// Clears the entries of `span` up to its first entry whose table the
    /// cursor must visit, counting into `acc`; returns that table, its
    /// first address and whether it may be unlinked afterwards (`None`:
    /// the span is done).
    fn unmap_span<'a, Z: Zap<A>>(
        &'a self,
        span: Span<'a, A>,
        cx: &mut Zapping<'_, Z>,
        acc: &mut Cleared,
    ) -> Option<(TableRef<'a>, u64, bool)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        if Z::REPORT && height == 0 {
            self.zap_ptes(t.all(), va, end, cx.gather, cx.z);
            return None;
        }
        loop {
            let next = entry_end::<A>(va, height, end);
            match self.unmap_entry(t, height, va, next, cx) {
                Step::Cleared(n, invalid) => {
                    acc.written += n;
                    acc.invalid |= invalid;
                }
                Step::Descend(c, may) => return Some((c, va, may)),
            }
            va = next;
            if va == end {
                return None;
            }
        }
    }

    /// Clears the part `[va, next)` of the entry of `va` in `t` at
    /// `height`, or says which table to clear it in.
    fn unmap_entry<'a, Z: Zap<A>>(
        &'a self,
        t: TableRef<'a>,
        height: u32,
        va: u64,
        next: u64,
        cx: &mut Zapping<'_, Z>,
    ) -> Step<'a> {
        let i = index::<A>(va, height);
        let slot = t.slot(i);
        // Without a report, a hardware A/D update racing the clear below
        // is discarded on purpose (a report takes the entry atomically).
        let (raw, kind) = self.read(t, i, height);
        match kind {
            Next::None => Step::Cleared(0, false),
            Next::Invalid => {
                // A software entry: the hardware never writes it and
                // nothing is flushed for it, but the clear still wants
                // this table's walker barrier.
                A::set_pte_nosync(&self.mmu, slot, 0);
                cx.z.removed(va, height, raw);
                Step::Cleared(1, true)
            }
            Next::Leaf(_) if Z::REPORT && height > 0 && A::is_cont(raw, height) => {
                // The first entry of a folded run of blocks, which the
                // range covers whole (runs covered in part were unfolded
                // first): the whole run is taken now (its other entries
                // then read as none).
                let run = contpte::run_size::<A>(height);
                debug_assert_eq!(va & (run - 1), 0, "a folded run covered in part");
                let slots = contpte::run_slots::<A>(t.all(), i, height);
                self.zap_block_run(slots, va, height, cx.z);
                cx.gather.add_range::<A>(VirtAddr(va), run, height);
                Step::Cleared(slots.len() as u64, false)
            }
            Next::Leaf(_) if height == 0 || covers::<A>(va, next, height) => {
                let z = &mut *cx.z;
                let old = if Z::REPORT && !(z.trust_settled() && A::is_settled(raw, height)) {
                    // The exact final value, A/D included.
                    A::pmdp_huge_get_and_clear(&self.mmu, slot)
                } else {
                    A::set_pte_nosync(&self.mmu, slot, 0);
                    raw
                };
                cx.gather.add_leaf::<A>(VirtAddr(va), height);
                z.removed(va, height, old);
                Step::Cleared(1, false)
            }
            Next::Leaf(_) => {
                // Partly covered: split, then clear the covered part one
                // level down, through the table the split linked, which
                // stays. (No table: the count was short, see `take`; the
                // block stays.)
                let block = Block {
                    slot,
                    raw,
                    va: VirtAddr(va),
                    height,
                };
                if self.split_block(block, cx.stash, cx.gather).is_some() {
                    if let (_, Next::Table(c)) = self.read(t, i, height) {
                        return Step::Descend(c, false);
                    }
                }
                Step::Cleared(0, false)
            }
            Next::Table(c) => self.unmap_table(slot, c, height, va..next, cx),
        }
    }

    /// The table entry `slot` at `height` (linking `c`), of which the
    /// range covers `range`: unlinks it now when it is covered whole and
    /// its entries need no visit, or has the cursor visit `c` first.
    fn unmap_table<'a, Z: Zap<A>>(
        &self,
        slot: &'a Slot,
        c: TableRef<'a>,
        height: u32,
        range: core::ops::Range<u64>,
        cx: &mut Zapping<'_, Z>,
    ) -> Step<'a> {
        let (va, next) = (range.start, range.end);
        // A pinned kernel-half table is emptied, never unlinked. A report
        // visits the entries of a table it unlinks whole (and so always
        // finds it empty afterwards).
        let keep = self.pinned(height, va) || cx.z.keeps_tables();
        let whole = covers::<A>(va, next, height) && !keep;
        if whole && (!Z::REPORT || cx.z.deferred().is_some()) {
            A::set_pte_nosync(&self.mmu, slot, 0);
            cx.gather
                .add_tables::<A>(VirtAddr(va), next.wrapping_sub(va));
            if Z::REPORT {
                self.defer_subtree(cx.q, c.pa(), height - 1, va, cx.z);
            } else {
                self.queue_free_subtree(cx.q, c.pa(), height - 1);
            }
            return Step::Cleared(1, false);
        }
        Step::Descend(c, !keep)
    }

    /// The reporting form of the PTE level: every non-zero entry of
    /// `[va, end)` in the PTE table `t` is taken out and reported. A table
    /// covered whole is about to be unlinked and freed after the flush, so
    /// entries the hardware can no longer change are only read there, not
    /// cleared (the allocator takes frames back with any contents); the
    /// others are taken with the atomic get-and-clear.
    ///
    /// Entries are taken a chunk at a time into a small local buffer and
    /// reported from it: the report loop then holds no atomic access and
    /// no condition, so the compiler can keep the caller's accumulators in
    /// registers instead of reloading them around every entry.
    fn zap_ptes<Z: Zap<A>>(
        &self,
        t: &[Slot],
        va: u64,
        end: u64,
        gather: &mut TlbGather,
        z: &mut Z,
    ) {
        // As long as the largest folded run (arm64 16 KiB granule: 128
        // PTEs), so that aligned chunks hold whole runs.
        const CHUNK: usize = contpte::MAX_RUN;
        // A table that stays linked is cleared entry by entry.
        let whole = covers::<A>(va, end, 1) && !z.keeps_tables();
        let trust = z.trust_settled();
        let i = index::<A>(va, 0);
        let n = (end.wrapping_sub(va) >> shift::<A>(0)) as usize;
        let mut written = 0u64;
        // The removed entries of a chunk (0 where there was none).
        let mut old = [0u64; CHUNK];
        let runs = A::cont_entries(0) as usize;
        // Chunks are aligned in the table (the first may be shorter), so a
        // folded run never straddles two.
        let mut off = 0;
        while off < n {
            let len = (n - off).min(CHUNK - (i + off) % CHUNK);
            let chunk = &t[i + off..i + off + len];
            let base = va + ((off as u64) << shift::<A>(0));
            off += len;
            let mut full = true;
            // The OR of the entries: whether any has the contiguous hint.
            let mut seen = 0u64;
            for (slot, out) in chunk.iter().zip(old.iter_mut()) {
                // Relaxed: we hold the address space exclusively; an entry
                // the hardware may still update is re-read by the swap.
                let raw = slot.load(Relaxed);
                *out = if raw == 0 {
                    0
                } else if trust && A::is_settled(raw, 0) {
                    // Nothing can change it any more: the load is exact.
                    if !whole {
                        A::set_pte_nosync(&self.mmu, slot, 0);
                        written += 1;
                    }
                    raw
                } else {
                    written += 1;
                    A::ptep_get_and_clear(&self.mmu, slot)
                };
                full &= raw != 0;
                seen |= raw;
            }
            if runs != 0 && A::is_cont(seen, 0) {
                contpte_gather_chunk::<A>(&mut old[..len], i + off - len, runs);
            }
            // A full chunk (the common case) is reported by a loop whose
            // every iteration reports, so the compiler may keep what the
            // callback accumulates in registers throughout.
            let chunk_old = &old[..chunk.len()];
            if full {
                for (k, &raw) in chunk_old.iter().enumerate() {
                    z.removed(base + ((k as u64) << shift::<A>(0)), 0, raw);
                }
            } else {
                for (k, &raw) in chunk_old.iter().enumerate() {
                    if raw != 0 {
                        z.removed(base + ((k as u64) << shift::<A>(0)), 0, raw);
                    }
                }
            }
        }
        if written > 0 || whole {
            gather.add_range::<A>(VirtAddr(va), end.wrapping_sub(va), 0);
        }
        self.mmu.stats.add_entries_written(written);
    }
}
