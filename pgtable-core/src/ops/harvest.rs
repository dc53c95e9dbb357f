//! Accessed/dirty harvesting: Linux `ptep_test_and_clear_young`,
//! `pmdp_test_and_clear_young`, `ptep_clear_flush_young` and the page
//! walk of `/proc/PID/clear_refs` (`clear_refs_pte_range`).
//!
//! Every clear is a compare-exchange loop on the live entry, so an
//! accessed or dirty update the hardware makes at the same time is either
//! seen (and reported) or made after the clear (and kept): none is lost.
//! Changed leaves are flushed through one gathered flush at the end (or by
//! the caller's [`MmuGather`](crate::MmuGather)): a TLB entry that still
//! holds the old state would let the hardware skip setting it again.

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::entry_end;
use crate::ops::contpte;
use crate::space::aspace::FreeQueue;
use crate::space::walker::{Next, Span, TableRef};
use crate::{
    AddressSpace, Arch, Decoded, Error, LeafEntry, Mmu, Slot, TableAlloc, TlbGather, VirtAddr,
};

bitflags::bitflags! {
    /// What [`AddressSpace::clear_refs`] clears in each leaf: a set of
    /// flags, built like [`Prot`](crate::Prot) (`ClearRefs::YOUNG |
    /// ClearRefs::DIRTY` is [`ClearRefs::ALL`]).
    ///
    /// ```
    /// use pgtable_core::ClearRefs;
    ///
    /// let what = ClearRefs::YOUNG | ClearRefs::DIRTY;
    /// assert_eq!(what, ClearRefs::ALL);
    /// assert!(what.young() && what.dirty());
    /// assert!(!ClearRefs::DIRTY.young());
    /// ```
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
    pub struct ClearRefs: u8 {
        /// The accessed (young) state ([`Format::mkold`]; Linux
        /// `CLEAR_REFS_ALL` / `ptep_test_and_clear_young`), for reclaim and
        /// working-set estimation.
        ///
        /// [`Format::mkold`]: crate::Format::mkold
        const YOUNG = 1 << 0;
        /// The dirty state ([`Format::mkclean`]; Linux `pte_mkclean` as page
        /// writeback's `page_mkclean_one` applies it). The leaf stays writable
        /// where the hardware manages the dirty state: the next store marks it
        /// dirty again. Treat the page as clean only after the flush.
        ///
        /// [`Format::mkclean`]: crate::Format::mkclean
        const DIRTY = 1 << 1;
        /// Both.
        const ALL = Self::YOUNG.bits() | Self::DIRTY.bits();
    }
}

impl ClearRefs {
    /// Whether the accessed state is cleared.
    pub const fn young(self) -> bool {
        self.contains(ClearRefs::YOUNG)
    }

    /// Whether the dirty state is cleared.
    pub const fn dirty(self) -> bool {
        self.contains(ClearRefs::DIRTY)
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// The leaf covering `va` (a page, a block, or a non-present non-zero
    /// entry) and its height, if there is one.
    pub(crate) fn find_leaf(&self, va: VirtAddr) -> Option<(&Slot, u32)> {
        self.check_va(va).ok()?;
        let (t, i, h) = self.leaf_for(va.0)?;
        Some((t.slot(i), h))
    }

    /// Linux `ptep_get` (and `pmdp_get` / `pudp_get` for a block): the
    /// leaf-level entry covering `va` — a page, a block or a non-present
    /// software entry — as a [`LeafEntry`], or `None` when nothing is
    /// there (or `va` is outside the address space). A snapshot: the
    /// hardware may set accessed/dirty state in the entry right after.
    pub fn ptep_get(&self, va: VirtAddr) -> Option<LeafEntry<A>> {
        let (slot, h) = self.find_leaf(va)?;
        // Relaxed: a snapshot of one entry.
        let raw = slot.load(Relaxed);
        if A::is_cont(raw, h) {
            // A folded run: the hardware may have set accessed or dirty
            // state on any of its entries (Linux `contpte_ptep_get`).
            if let Some((run, _)) = self.folded_run(va.0, h) {
                let (young, dirty) = contpte::gather_ad::<A>(run);
                return Some(LeafEntry::new(
                    va.0,
                    h,
                    contpte::with_ad::<A>(raw, h, young, dirty),
                ));
            }
        }
        Some(LeafEntry::new(va.0, h, raw))
    }

    /// Linux `ptep_clear_flush_young` (`pmdp_clear_flush_young` for a
    /// block): clears the accessed state of the leaf covering `va` and
    /// returns whether it was set. When it was, the leaf's translation is
    /// flushed, so the next access sets it again in the tables.
    ///
    /// Unmapped addresses are not young (`Ok(false)`), as in Linux.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfRange`] for an address outside the address space.
    pub fn test_and_clear_young(&mut self, va: VirtAddr) -> Result<bool, Error> {
        self.check_va(va)?;
        let Some((t, i, h)) = self.leaf_for(va.0) else {
            return Ok(false);
        };
        let slot = t.slot(i);
        // Relaxed: the clear re-reads it.
        if A::is_cont(slot.load(Relaxed), h) {
            if let Some((run, base)) = self.folded_run(va.0, h) {
                // Linux `contpte_ptep_test_and_clear_young`: the run is one
                // translation, so its accessed state is cleared on every
                // entry and the whole run flushed.
                let (young, _, changed) = clear_run::<A, _>(&self.mmu, run, h, ClearRefs::YOUNG);
                if changed > 0 {
                    self.mmu.stats.add_entries_written(changed);
                    self.table_done();
                    let mut gather = TlbGather::new();
                    gather.add_range::<A>(VirtAddr(base), contpte::run_size::<A>(h), h);
                    self.finish(gather, FreeQueue::new());
                }
                return Ok(young);
            }
        }
        let Some((old, changed)) = clear_leaf::<A, _>(&self.mmu, slot, h, ClearRefs::YOUNG) else {
            return Ok(false);
        };
        if changed {
            self.table_done();
            let mut gather = TlbGather::new();
            gather.add_leaf::<A>(va, h);
            self.finish(gather, FreeQueue::new());
        }
        Ok(A::is_young(old))
    }

    /// Clears the state `what` names in every present leaf of
    /// `[va, va + len)` and calls `f` with each leaf as it was just before
    /// the clear (its [`young`](LeafEntry::young) and
    /// [`dirty`](LeafEntry::dirty) tell what the hardware had set), then
    /// flushes the changed leaves once. A block the range covers in part
    /// is cleared whole (and reported once, with its own address), as
    /// Linux's `clear_refs` does for a huge page. Holes and non-present
    /// entries are skipped.
    ///
    /// Each clear is a compare-exchange loop, never a load and a store, so
    /// a concurrent hardware update is never lost. A page whose dirty
    /// state was cleared may be treated as clean (written back) once this
    /// returns: the flush has removed the TLB entries that could let a
    /// store through without marking it dirty again.
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLength`], [`Error::MisalignedVirt`] /
    /// [`Error::MisalignedLength`], [`Error::OutOfRange`]; on error nothing
    /// was changed and nothing reported.
    pub fn clear_refs(
        &mut self,
        va: VirtAddr,
        len: u64,
        what: ClearRefs,
        f: impl FnMut(LeafEntry<A>),
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        let mut gather = TlbGather::new();
        let mut f = f;
        self.harvest(va.0, end, what, &mut gather, &mut f);
        self.finish(gather, FreeQueue::new());
        Ok(())
    }

    /// [`clear_refs`](Self::clear_refs) into `gather`, flushed by the
    /// caller ([`MmuGather::clear_refs`](crate::MmuGather::clear_refs)).
    pub(crate) fn clear_refs_into(
        &mut self,
        gather: &mut TlbGather,
        va: VirtAddr,
        len: u64,
        what: ClearRefs,
        f: impl FnMut(LeafEntry<A>),
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        let mut f = f;
        self.harvest(va.0, end, what, gather, &mut f);
        Ok(())
    }

    fn harvest(
        &self,
        va: u64,
        end: u64,
        what: ClearRefs,
        gather: &mut TlbGather,
        f: &mut impl FnMut(LeafEntry<A>),
    ) {
        // Entries changed in the table at each height on the cursor's
        // path: one barrier per table, when the cursor leaves it.
        let mut changed = [0u64; crate::space::walker::MAX_LEVELS];
        let mut cur = self.cursor(va, end);
        while let Some(span) = cur.span() {
            let h = span.height as usize;
            match self.harvest_span(span, what, gather, f, &mut changed[h]) {
                Some((child, va)) => cur.descend(child, va),
                None => {
                    for h in cur.advance(span.next) {
                        let n = core::mem::take(&mut changed[h as usize]);
                        if n > 0 {
                            self.mmu.stats.add_entries_written(n);
                            self.table_done();
                        }
                    }
                }
            }
        }
    }

    /// Clears the leaves of `span` up to its first table entry, counting
    /// the changed ones in `changed`, and returns that entry's table and
    /// first address (`None`: the span is done).
    fn harvest_span<'a>(
        &'a self,
        span: Span<'a, A>,
        what: ClearRefs,
        gather: &mut TlbGather,
        f: &mut impl FnMut(LeafEntry<A>),
        changed: &mut u64,
    ) -> Option<(TableRef<'a>, u64)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        let mut i = span.from;
        while i < span.to {
            let next = entry_end::<A>(va, height, end);
            // The clear re-reads the value in its compare-exchange.
            match self.read(t, i, height) {
                (_, Next::Table(c)) => return Some((c, va)),
                (raw, Next::Leaf(_)) if A::is_cont(raw, height) => {
                    // A folded run: cleared whole, reported up to `stop`.
                    let (stop, ch) = self.harvest_run(span, i, va, what, f);
                    if ch > 0 {
                        *changed += ch;
                        let run = contpte::run_size::<A>(height);
                        gather.add_range::<A>(VirtAddr(va & !(run - 1)), run, height);
                    }
                    va = stop;
                    i = (i | (A::cont_entries(height) as usize - 1)) + 1;
                    continue;
                }
                (_, Next::Leaf(_)) => {
                    let slot = t.slot(i);
                    if let Some((old, ch)) = clear_leaf::<A, _>(&self.mmu, slot, height, what) {
                        let leaf = LeafEntry::new(va, height, old);
                        if ch {
                            *changed += 1;
                            gather.add_leaf::<A>(leaf.va(), height);
                        }
                        f(leaf);
                    }
                }
                _ => {}
            }
            va = next;
            i += 1;
        }
        None
    }

    /// The folded run holding entry `i` of `span` (mapping `va`): cleared
    /// over the whole run (beyond the range too, as Linux's contpte
    /// harvesting does), every entry of it in the range reported with the
    /// run's state. Returns where the report stopped (the end of the run
    /// or of the span) and how many entries changed.
    fn harvest_run(
        &self,
        span: Span<'_, A>,
        i: usize,
        va: u64,
        what: ClearRefs,
        f: &mut impl FnMut(LeafEntry<A>),
    ) -> (u64, u64) {
        let (height, end) = (span.height, span.next);
        let n = A::cont_entries(height) as usize;
        let at = i & !(n - 1);
        let slots = span.table.slots(at, at + n);
        let (young, dirty, ch) = clear_run::<A, _>(&self.mmu, slots, height, what);
        // Each entry of the run in the span, once: `va` may lie inside a
        // block (a block covered in part is reported whole).
        let mut v = va;
        for k in i..(at + n).min(span.to) {
            // Relaxed: the value the clear left (its address is what the
            // report needs, the state comes from the run).
            let now = slots[k - at].load(Relaxed);
            f(LeafEntry::new(
                v,
                height,
                contpte::with_ad::<A>(now, height, young, dirty),
            ));
            v = entry_end::<A>(v, height, end);
        }
        (v, ch)
    }
}

/// Clears `what` in every leaf of the folded run `slots` at `height` (see
/// [`clear_leaf`]). Returns whether any was young, whether any was dirty,
/// and how many changed.
#[inline]
fn clear_run<A: Arch, M: Mmu>(
    mmu: &M,
    slots: &[Slot],
    height: u32,
    what: ClearRefs,
) -> (bool, bool, u64) {
    let (mut young, mut dirty, mut changed) = (false, false, 0u64);
    for s in slots {
        if let Some((old, ch)) = clear_leaf::<A, _>(mmu, s, height, what) {
            young |= A::is_young(old);
            dirty |= A::is_dirty(old);
            changed += u64::from(ch);
        }
    }
    (young, dirty, changed)
}

/// Clears `what` in the leaf at `height` in `slot` with a compare-exchange
/// loop. Returns the value it held just before (the one the exchange
/// replaced) and whether it changed; `None` if it is no longer a present
/// leaf.
#[inline]
fn clear_leaf<A: Arch, M: Mmu>(
    mmu: &M,
    slot: &Slot,
    height: u32,
    what: ClearRefs,
) -> Option<(u64, bool)> {
    // Relaxed: the compare-exchange below re-checks it.
    let mut cur = slot.load(Relaxed);
    loop {
        if !matches!(A::decode(cur, height), Decoded::Leaf(_)) {
            return None;
        }
        let mut new = cur;
        if what.young() {
            new = A::mkold(new, height);
        }
        if what.dirty() {
            new = A::mkclean(new, height);
        }
        if new == cur {
            return Some((cur, false));
        }
        // Relaxed: atomicity against the hardware's own locked A/D update
        // is what matters; the walker is ordered by the walker barrier and
        // the flush that follow.
        match slot.compare_exchange_weak(cur, new, Relaxed, Relaxed) {
            Ok(_) => {
                if M::OBSERVES_WRITES {
                    mmu.entry_written(slot, cur);
                }
                return Some((cur, true));
            }
            Err(now) => cur = now,
        }
    }
}
