//! `change_protection_live`: permission changes of mappings that other
//! CPUs are using right now (the kernel image, the linear map, vmalloc).

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{entry_end, index};
use crate::space::aspace::{bbm_reason, break_entry, covers, needs_bbm, Reservation, TableSpan};
use crate::space::walker::{Next, Span, TableRef};
use crate::{
    AddressSpace, Arch, BbmReason, Error, Mmu, PhysAddr, Prot, Slot, TableAlloc, TlbGather,
    VirtAddr,
};

/// Options of [`AddressSpace::change_protection_live`].
///
/// [`change_protection`](AddressSpace::change_protection) follows mprotect:
/// each entry is taken out of service (`ptep_modify_prot_start`, an atomic
/// clear) and put back (`ptep_modify_prot_commit`). A CPU that touches the
/// page in between takes a translation fault, which a user page's fault
/// handler retries but which is fatal for kernel text or data another CPU
/// is running on. Linux therefore changes kernel mappings in place: arm64
/// `set_memory_ro` → `__change_memory_common` → `change_page_range` stores
/// the modified entry with `__set_pte` (no invalid step), and x86
/// `__change_page_attr` writes the new entry with `set_pte_atomic`, then
/// each flushes the TLB once.
///
/// [`AddressSpace::change_protection_live`] does the same with a compare-exchange per entry (so an
/// accessed or dirty bit the hardware sets meanwhile is kept: the exchange
/// fails and is retried with the new value), one walker barrier per table
/// and one TLB flush at the end. No entry is ever invalid on the way.
///
/// # Folded contiguous runs
///
/// A folded run ([`Format::cont_entries`](crate::Format::cont_entries):
/// arm64 16 pages or 16 blocks with the Contiguous bit) that the range
/// covers whole is changed in place, entry by entry, keeping the hint on
/// every entry, when the change needs no break-before-make for a single
/// entry (permissions, or global to non-global). Between the first and the
/// last write the run's entries differ in those bits only, which the Arm ARM
/// (D8.6.1 "The Contiguous bit", rule RJQQTC) constrains: a TLB lookup in
/// the run returns the output address, permissions and attributes of one
/// of its entries, never a mix of them and never a TLB conflict abort. So
/// an access that the old and the new protection both allow never faults,
/// and any other behaves as with the old translation still cached, until
/// the final flush. Linux does the same: arm64 `__change_memory_common`
/// rewrites the entries of a contiguous kernel run one `__set_pte` at a
/// time (`pageattr_pte_entry`), and `contpte_wrprotect_ptes` write-protects
/// whole user runs without unfolding them.
///
/// Everything else a folded run can need is break-before-make for the
/// whole run, refused with [`Error::BreakBeforeMake`] unless allowed (the
/// error's [`BbmReason`] says which):
/// - changing *part* of a run unfolds it ([`BbmReason::ContiguousRun`];
///   [`map`](AddressSpace::map) folds every run a call covers whole by
///   default, so on arm64 one 2 MiB block of a linear map mapped with
///   blocks is part of a 32 MiB run; a change of the translation
///   size: a valid entry without the hint in a cached run may raise a TLB
///   conflict abort even with FEAT_BBM level 1 or 2, rule RNGLXZ). Linux
///   does not fold or unfold kernel mappings through its contpte code
///   ("kernel mappings can't tolerate faults", `mm_is_user` in
///   `arch/arm64/mm/contpte.c`) and splits live kernel runs only on CPUs
///   that never raise the conflict abort (`system_supports_bbml2_noabort`);
/// - a memory-type ([`BbmReason::MemoryType`]) or non-global to global
///   ([`BbmReason::NonGlobalToGlobal`]) change of whole runs, which
///   clears all entries of the run, flushes it once and makes them again.
///
/// Map a range that must stay changeable in part without
/// break-before-make with [`MapOptions::no_contiguous`](crate::MapOptions::no_contiguous)
/// (as Linux maps the linear map with pages when `can_set_direct_map`).
///
/// # When break-before-make is needed
///
/// In place is allowed only where the architecture allows both the old and
/// the new translation to be cached at once ([`Arch::change_is_safe`]).
/// On arm64 (Arm ARM D8.16 "break-before-make") that excludes changes of
/// memory type or shareability, non-global to global, and any change of
/// the translation size: splitting a block a range covers only in part
/// ([`BbmReason::BlockSplit`]) needs break-before-make there. The
/// operation then returns
/// [`Error::BreakBeforeMake`] *before it changes anything*, unless the
/// caller allows break-before-make ([`LiveOptions::ALLOW_BBM`]) because no
/// other CPU can be using the range (the entry is briefly invalid: Linux
/// arm64 avoids it by mapping the linear map with pages when it must stay
/// changeable, `can_set_direct_map`).
///
/// On x86 ([`Arch::BREAK_BEFORE_MAKE`] is `false`) every change is made
/// in place, splits included, but a split is not free. The Intel SDM (Vol.
/// 3A 4.10.2.3 "Details of TLB Use") lets the TLB hold a large-page and a
/// small-page translation for the same address once the page size changes,
/// and leaves processor behaviour undefined if the two differ in page frame
/// or attributes (permissions included). So a block is split with its own
/// frame and attributes (the new entries translate exactly as the block
/// did), its translation is flushed at once, and only then are the covered
/// entries changed, as Linux `__split_large_page` does (its comment quotes
/// that note). A change that splits a block therefore costs one immediate
/// flush per split block (at most two: only the range's ends split) besides
/// the flush at the end.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct LiveOptions {
    /// See [`LiveOptions::allows_bbm`].
    allow_bbm: bool,
}

impl LiveOptions {
    /// In place only: a change that needs break-before-make is refused.
    pub const IN_PLACE: LiveOptions = LiveOptions { allow_bbm: false };
    /// Break-before-make allowed where needed.
    pub const ALLOW_BBM: LiveOptions = LiveOptions { allow_bbm: true };

    /// Whether break-before-make is allowed where the architecture needs
    /// it (the entry is invalid for a moment, and a CPU touching it then
    /// faults): [`ALLOW_BBM`](Self::ALLOW_BBM), only for ranges no other
    /// CPU can be using.
    #[inline]
    pub const fn allows_bbm(self) -> bool {
        self.allow_bbm
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Changes the protection of every mapping in `[va, va + len)` to
    /// `prot` without ever making an entry invalid (Linux `set_memory_ro`
    /// and kin: arm64 `__change_memory_common`, x86 `__change_page_attr`),
    /// for mappings that other CPUs may be using meanwhile.
    ///
    /// Each changed entry is replaced by one compare-exchange (retried if
    /// the hardware set an accessed or dirty bit meanwhile, which is kept);
    /// the TLB is flushed once at the end (a full flush past
    /// [`Arch::TLB_FLUSH_CEILING`]). Holes are skipped; entries that already
    /// grant `prot` are not written. A block the range covers only in part
    /// is split first: in place on x86, with break-before-make on arm64
    /// (see below). Folded contiguous runs the range covers whole stay
    /// folded and are changed entry by entry. [`LiveOptions`] states the
    /// rules.
    ///
    /// Mind how the range was mapped: [`map`](Self::map) folds every
    /// aligned run it covers whole unless told
    /// [`no_contiguous`](crate::MapOptions::no_contiguous), and a live
    /// change of part of a folded run is refused
    /// ([`BbmReason::ContiguousRun`]). On arm64 a linear map of 2 MiB
    /// blocks is folded into 32 MiB runs, so `change_protection_live` of
    /// exactly one 2 MiB block of it fails, and so does one 4 KiB page of
    /// 16 folded pages. Closing whole pages, blocks or runs to
    /// [`Prot::NONE`](crate::Prot::NONE) (or opening them from it) needs
    /// no break-before-make: the entry is, or becomes, invalid for the
    /// hardware, and the TLB is flushed at the end.
    ///
    /// # Errors
    ///
    /// As [`change_protection`](Self::change_protection), and
    /// [`Error::BreakBeforeMake`] with the first address (in walk order)
    /// whose entry cannot be changed in place, and why ([`BbmReason`]:
    /// [`Arch::change_is_safe`] refuses arm64 memory type or non-global to
    /// global changes and splitting a block), or changing part of a
    /// folded contiguous run (on every
    /// format with runs: the unfold clears the whole run, also on RISC-V
    /// Svnapot), unless `opts` allows break-before-make. On error nothing
    /// was changed.
    pub fn change_protection_live(
        &mut self,
        va: VirtAddr,
        len: u64,
        prot: Prot,
        opts: LiveOptions,
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        // Compared with what the leaves report (`Prot::NONE` drops the
        // rest), so a change to an equal protection is no change.
        let prot = prot.normalized();
        // The unfold of a run is break-before-make for the whole run,
        // whether or not the arch requires it elsewhere (RISC-V).
        let has_runs = (0..A::LEVELS).any(|h| A::cont_entries(h) != 0);
        if (A::BREAK_BEFORE_MAKE || has_runs) && !opts.allows_bbm() {
            // Changing part of a folded contiguous run unfolds it, which
            // is break-before-make for the whole run. The error names the
            // lower of the two first addresses (the walk goes up from `va`).
            let differs = |raw, h| A::leaf_prot(raw, h) != prot;
            let partial = self.contpte_partial_change(va.0, end, &differs);
            let partial = partial.map(|at| (at, BbmReason::ContiguousRun));
            let entry = self.live_bbm_check(va.0, end, prot);
            if let Some((at, why)) = partial.into_iter().chain(entry).min_by_key(|e| e.0) {
                return Err(Error::BreakBeforeMake(at, why));
            }
        }
        self.change_prot_with(end, va, prot, Self::live_change)
    }

    /// The first address in `[va, end)` whose change to `prot` needs
    /// break-before-make, and why.
    fn live_bbm_check(&self, va: u64, end: u64, prot: Prot) -> Option<(VirtAddr, BbmReason)> {
        let mut cur = self.cursor(va, end);
        while let Some(span) = cur.span() {
            match self.live_bbm_span(span, prot) {
                Err(at) => return Some(at),
                Ok(Some((child, va))) => cur.descend(child, va),
                Ok(None) => {
                    cur.advance(span.next);
                }
            }
        }
        None
    }

    /// [`live_bbm_check`](Self::live_bbm_check) over `span` up to its
    /// first table entry: `Err` with the first address found, or that
    /// entry's table and first address (`Ok(None)`: the span is done).
    /// The hardware changes accessed/dirty state only, which does not
    /// decide this.
    fn live_bbm_span<'a>(
        &'a self,
        span: Span<'a, A>,
        prot: Prot,
    ) -> Result<Option<(TableRef<'a>, u64)>, (VirtAddr, BbmReason)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        for i in span.from..span.to {
            let next = entry_end::<A>(va, height, end);
            match self.read(t, i, height) {
                (_, Next::Table(c)) => return Ok(Some((c, va))),
                (raw, Next::Leaf(_)) if A::leaf_prot(raw, height) == prot => {}
                (raw, Next::Leaf(_)) => {
                    let whole = height == 0 || covers::<A>(va, next, height);
                    // A split replaces the block by a table (a size
                    // change), then changes the children.
                    let split = !whole
                        && needs_bbm::<A>(
                            raw,
                            A::table_entry_attrs(PhysAddr(0), height, self.table_attrs),
                            height,
                        );
                    let (leaf, h) = if whole {
                        (raw, height)
                    } else {
                        (A::split_leaf(raw, height), height - 1)
                    };
                    if split {
                        return Err((VirtAddr(va), BbmReason::BlockSplit));
                    }
                    let new = A::modify_prot(leaf, prot, h);
                    if needs_bbm::<A>(leaf, new, h) {
                        return Err((VirtAddr(va), bbm_reason::<A>(leaf, new, h)));
                    }
                }
                _ => {}
            }
            va = next;
        }
        Ok(None)
    }

    /// Changes `[va, end)` of `span` (the root's) on the cursor, one
    /// barrier per table written when the cursor leaves it.
    fn live_change(
        &mut self,
        span: TableSpan,
        prot: Prot,
        stash: &mut Reservation,
        gather: &mut TlbGather,
    ) {
        debug_assert!(span.height == A::LEVELS - 1 && span.table == self.root);
        let s = &*self;
        let mut wrote = [false; crate::space::walker::MAX_LEVELS];
        let mut cur = s.cursor(span.va, span.end);
        while let Some(sp) = cur.span() {
            let h = sp.height as usize;
            if let Some((child, va)) = s.live_span(sp, prot, stash, gather, &mut wrote[h]) {
                cur.descend(child, va);
                continue;
            }
            for h in cur.advance(sp.next) {
                if core::mem::take(&mut wrote[h as usize]) {
                    s.table_done();
                }
            }
        }
    }

    /// Changes the leaves of `span` up to its first table entry, splitting
    /// a block it covers in part (`wrote`: an entry of the table was
    /// written); returns that entry's table and first address (`None`:
    /// the span is done). The compare-exchanges catch a concurrent
    /// hardware update.
    fn live_span<'a>(
        &'a self,
        span: Span<'a, A>,
        prot: Prot,
        stash: &mut Reservation,
        gather: &mut TlbGather,
        wrote: &mut bool,
    ) -> Option<(TableRef<'a>, u64)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        loop {
            let next = entry_end::<A>(va, height, end);
            let i = index::<A>(va, height);
            let slot = t.slot(i);
            match self.read(t, i, height) {
                (_, Next::Table(c)) => return Some((c, va)),
                (raw, Next::Leaf(_)) if A::leaf_prot(raw, height) == prot => {}
                (raw, Next::Leaf(_))
                    if A::is_cont(raw, height)
                        && needs_bbm::<A>(raw, A::modify_prot(raw, prot, height), height) =>
                {
                    // A whole folded run (the caller allowed
                    // break-before-make): all its entries at once, so no
                    // two disagree in memory type while valid.
                    let c = A::cont_entries(height) as usize;
                    let at = i & !(c - 1);
                    let span = c as u64 * crate::contract::level::size::<A>(height);
                    let base = va & !(span - 1);
                    crate::ops::contpte::break_run::<A, _>(
                        &self.mmu,
                        t.slots(at, at + c),
                        base,
                        height,
                        |o, _, _, _| A::modify_prot(o, prot, height),
                    );
                    self.mmu.stats.add_entries_written(c as u64);
                    gather.add_range::<A>(VirtAddr(base), span, height);
                    *wrote = true;
                    va = base.wrapping_add(span);
                    if va == end {
                        return None;
                    }
                    continue;
                }
                (raw, Next::Leaf(_)) if height > 0 && !covers::<A>(va, next, height) => {
                    // Descended through the table the split linked. (No
                    // table: the count was short, see `take`; the block
                    // keeps its protection.)
                    let split = self.split_block_to_change(slot, raw, VirtAddr(va), height, stash);
                    if let Some((_, Next::Table(c))) = split.map(|_| self.read(t, i, height)) {
                        return Some((c, va));
                    }
                }
                (raw, Next::Leaf(_)) => {
                    self.live_set(slot, raw, VirtAddr(va), height, prot);
                    gather.add_leaf::<A>(VirtAddr(va), height);
                    *wrote = true;
                }
                _ => {}
            }
            va = next;
            if va == end {
                return None;
            }
        }
    }

    /// Replaces the live leaf `raw` in `slot` by its `prot` version: one
    /// compare-exchange, or break-before-make where the arch needs it (the
    /// caller allowed it).
    fn live_set(&self, slot: &Slot, raw: u64, va: VirtAddr, height: u32, prot: Prot) {
        let mut cur = raw;
        loop {
            let new = A::modify_prot(cur, prot, height);
            if needs_bbm::<A>(cur, new, height) {
                // Break (atomically, so the final accessed/dirty state is
                // kept), flush, make.
                let old = break_entry::<A, _>(&self.mmu, slot, va, height);
                let new = A::modify_prot(old, prot, height);
                match height {
                    0 => A::set_pte_at(&self.mmu, va, slot, new),
                    1 => A::set_pmd_at(&self.mmu, va, slot, new),
                    _ => A::set_pud_at(&self.mmu, va, slot, new),
                }
                break;
            }
            // Relaxed: atomicity against the hardware's accessed/dirty
            // updates is what matters; the walker is ordered by the
            // table's barrier and the final flush.
            match slot.compare_exchange(cur, new, Relaxed, Relaxed) {
                Ok(_) => {
                    if M::OBSERVES_WRITES {
                        self.mmu.entry_written(slot, cur);
                    }
                    break;
                }
                Err(now) => cur = now,
            }
        }
        self.mmu.stats.add_entries_written(1);
    }
}
