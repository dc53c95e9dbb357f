//! `copy_page_range`: the page-table half of `fork` (Linux `mm/memory.c`:
//! `copy_page_range` → `copy_p4d_range` … `copy_pte_range`, and
//! `copy_huge_pmd` / `copy_huge_pud` for blocks).
//!
//! Three phases, as everywhere in this crate, so that an error leaves both
//! address spaces untouched:
//!
//! 1. **check** (read-only): the range is valid, the destination range is
//!    empty, and two counts: the source tables needed to split blocks the
//!    range covers in part (at its two ends), and the destination tables
//!    the copy needs (only where the source maps something: empty tables
//!    are never created);
//! 2. **reserve** both counts, each from its own space's allocator;
//! 3. **copy**, which can no longer fail, then the source's one TLB flush.
//!    Each entry written into the destination is reported to the caller
//!    as it is written (in address order; the cursor walks the source in
//!    order), so an error in phases 1 and 2 reports nothing.
//!
//! A copy-on-write copy ([`CopyMode::Cow`], Linux `is_cow_mapping`)
//! write-protects every writable leaf of the source in place, with a
//! compare-exchange loop on the live entry (Linux `ptep_set_wrprotect`):
//! a hardware accessed/dirty update that races it is kept, never
//! overwritten, and the dirty state survives the protection change
//! ([`Format::modify_prot`] keeps it; on arm64 it moves the hardware dirty
//! state, AP\[2\] clear with DBM, into the software dirty bit and clears
//! DBM, so the hardware cannot make the page writable again: Arm ARM D8.5
//! "Hardware updates of the translation tables"). The child receives the
//! write-protected leaf. The source's TLB is flushed once at the end
//! (Linux flushes after `copy_page_range` in `dup_mmap`), and only if a
//! leaf was write-protected or a block split (a split that needs
//! break-before-make on the arch also flushes its block at once, as in every
//! operation); the destination held nothing in the range, so it needs no
//! flush.
//!
//! Settled writable leaves ([`Format::is_settled`]: the hardware will never
//! write them again, e.g. x86 kernel pages created accessed and dirty) are
//! write-protected with a plain store instead, which cannot lose an update;
//! the decision is made once per attribute word, as in
//! `change_protection`.
//!
//! Blocks are copied as blocks (one entry per 2 MiB or 1 GiB, as
//! `copy_huge_pmd` does). Software entries ([`Format::swp_entry`]) are
//! copied as they are (Linux `copy_nonpresent_pte` copies swap entries; it
//! also downgrades writable migration entries, which this crate does not
//! have).
//!
//! As Linux's `copy_present_pte` does, the child's leaves are old
//! ([`Format::mkold`]: the child has not used them yet) and, for shared
//! mappings, clean ([`Format::mkclean`]: the dirty state stays with the
//! source, which writes the page back); a private copy keeps the dirty
//! state, since the page's contents differ from what backs it.
//!
//! [`Format`]: crate::Format
//! [`Format::modify_prot`]: crate::Format::modify_prot
//! [`Format::is_settled`]: crate::Format::is_settled
//! [`Format::swp_entry`]: crate::Format::swp_entry

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{entry_end, page_size};
use crate::space::aspace::{break_entry, covers, needs_bbm, FreeQueue, Reservation};
use crate::space::walker::{split_parts, Next, Span, TableRef, MAX_LEVELS};
use crate::{
    generic, AddressSpace, Arch, Decoded, Error, LeafEntry, Mmu, Prot, Slot, TableAlloc, TlbGather,
    VirtAddr,
};

/// How [`AddressSpace::copy_page_range`] treats writable leaves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CopyMode {
    /// A private writable mapping (Linux `is_cow_mapping`: `VM_MAYWRITE`
    /// without `VM_SHARED`): writable leaves are write-protected in the
    /// source and copied write-protected, so the first write on either side
    /// faults and can copy the page.
    Cow,
    /// A shared mapping: leaves are copied as they are.
    Shared,
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Copies the mappings of `[va, va + len)` into the same range of
    /// `dst` (Linux `copy_page_range` at `fork`), which must be empty
    /// there.
    ///
    /// With [`CopyMode::Cow`] every writable leaf of the range is
    /// write-protected in place in `self` (Linux `ptep_set_wrprotect`: a
    /// compare-exchange loop on the live entry, so a racing hardware
    /// accessed/dirty update is kept; the dirty state survives, on arm64
    /// as the software dirty bit with DBM cleared so the hardware cannot
    /// make the page writable again) and `dst` gets the write-protected
    /// leaf. With [`CopyMode::Shared`] leaves are copied as they are.
    /// Blocks are copied as blocks, software entries
    /// ([`Format::swp_entry`](crate::Format::swp_entry)) as they are, and
    /// `dst` gets tables only where the range maps something. `self` is
    /// flushed once at the end, if anything was write-protected or split
    /// (and a block split in place once more at once, before its pages are
    /// write-protected: Intel SDM Vol. 3A 4.10.2.3); `dst` needs no flush.
    /// The child's leaves are old, and with [`CopyMode::Shared`] clean
    /// (Linux `copy_present_pte`).
    ///
    /// A block the range covers only in part is split in the source first
    /// (as Linux splits a huge page at a VMA boundary), so that only the
    /// range is write-protected. Global leaves may be copied: `dst` then
    /// flushes with `flush_tlb_all` too.
    ///
    /// # Report
    ///
    /// `report` is called once for each entry copied into `dst`, in
    /// address order, with the entry as `dst` now holds it: each present
    /// leaf (a page, or a block of its [`size`](LeafEntry::size); old,
    /// write-protected by a COW copy, clean when shared) and each software
    /// entry ([`LeafEntry::swap_value`]). That is what fork needs to take
    /// its references without walking the child afterwards: a reference
    /// on each page (Linux `copy_present_pte` takes one with
    /// `folio_try_dup_anon_rmap_pte` / `folio_get`) and on each swap slot
    /// (Linux `copy_nonpresent_pte`: `swap_duplicate`). A block the range
    /// covers in part is reported as the smaller leaves it was split into.
    /// The reports are made during the copy phase, which cannot fail: on
    /// error nothing was reported. `|_| {}` ignores them. They come before
    /// the source's TLB flush: a store the parent makes through a stale
    /// writable translation until this call returns marks the parent's
    /// entry dirty (never lost, see above), not the reported copy.
    ///
    /// # Errors
    ///
    /// Zero or misaligned length, a range outside the address space,
    /// [`Error::AlreadyMapped`] (with the first such address) when
    /// anything, a software entry included, is in the range in `dst`, or
    /// [`Error::OutOfMemory`] from either space's allocator. On error
    /// neither space was changed, no table frame is kept and nothing was
    /// reported.
    ///
    /// # Example
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, CopyMode, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut parent = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let mut child = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// parent.map(va, PhysAddr(0x8000_0000), 4 << 20, Prot::READ_WRITE, MapOptions::BLOCKS).unwrap();
    /// let mut frames = Vec::new();
    /// parent
    ///     .copy_page_range(&mut child, va, 4 << 20, CopyMode::Cow, |e| frames.push(e.pa()))
    ///     .unwrap();
    /// // Two 2 MiB blocks copied: one reference to take on each.
    /// assert_eq!(frames, [Some(PhysAddr(0x8000_0000)), Some(PhysAddr(0x8020_0000))]);
    /// let (p, c) = (parent.translate(va).unwrap(), child.translate(va).unwrap());
    /// assert_eq!(p.pa, c.pa);
    /// assert!(!p.prot.writable() && !c.prot.writable());
    /// # }
    /// ```
    pub fn copy_page_range<M2: Mmu, T2: TableAlloc>(
        &mut self,
        dst: &mut AddressSpace<A, M2, T2>,
        va: VirtAddr,
        len: u64,
        mode: CopyMode,
        report: impl FnMut(LeafEntry<A>),
    ) -> Result<(), Error> {
        // Phase 1: check, read-only.
        let end = self.check_range(va, len)?;
        dst.check_range(va, len)?;
        let top = A::LEVELS - 1;
        if let Some(at) = dst.first_mapped_in(dst.root_table(), top, va.0, end) {
            return Err(Error::AlreadyMapped(at));
        }
        let src_need = self.split_check(va.0, end, &|_, _| true);
        let dst_need = self.copy_need(dst, va.0, end);

        // Phase 2: reserve both, or neither.
        let src_stash = self.reserve(src_need)?;
        let dst_stash = match dst.reserve(dst_need) {
            Ok(s) => s,
            Err(e) => {
                self.release(src_stash);
                return Err(e);
            }
        };

        // A run the range covers in part is unfolded in the source first,
        // so the child never gets part of a folded run.
        self.contpte_unfold_edges(va.0, end);

        // Phase 3: copy, then the source's one flush.
        dst.may_hold_global |= self.may_hold_global;
        let mut c = Copier {
            dst: &*dst,
            src_stash,
            dst_stash,
            gather: TlbGather::new(),
            cow: mode == CopyMode::Cow,
            report,
        };
        self.copy_walk(&mut c, va.0, end);
        let Copier {
            src_stash,
            dst_stash,
            gather,
            ..
        } = c;
        self.finish(gather, FreeQueue::new());
        // Short only if a count was (see `take`); both are settled.
        let src = self.settle(src_stash);
        let dst = dst.settle(dst_stash);
        src.and(dst)
    }

    /// Phase 1: the tables `dst` needs to copy `[va, end)` (blocks covered
    /// in part will have been split in the source), on the source's
    /// cursor, with `dst`'s table at each height on the path beside it
    /// (`None`: to be created).
    fn copy_need<M2: Mmu, T2: TableAlloc>(
        &self,
        dst: &AddressSpace<A, M2, T2>,
        va: u64,
        end: u64,
    ) -> usize {
        let mut dpath = [None; MAX_LEVELS];
        dpath[A::LEVELS as usize - 1] = Some(dst.root_table());
        let mut need = 0;
        let mut cur = self.cursor(va, end);
        while let Some(sp) = cur.span() {
            let h = sp.height as usize;
            match self.need_span(dst, sp, dpath[h], &mut need) {
                Some((child, va, dc)) => {
                    cur.descend(child, va);
                    dpath[h - 1] = dc;
                }
                None => {
                    cur.advance(sp.next);
                }
            }
        }
        need
    }

    /// [`copy_need`](Self::copy_need) over `span` (above the PTE level) up
    /// to its first table entry worth descending into, where `dt` is
    /// `dst`'s table beside it; returns that entry's table, first address
    /// and `dst`'s table below it (`None`: the span is done).
    fn need_span<'a, M2: Mmu, T2: TableAlloc>(
        &'a self,
        dst: &'a AddressSpace<A, M2, T2>,
        span: Span<'a, A>,
        dt: Option<TableRef<'a>>,
        need: &mut usize,
    ) -> Option<(TableRef<'a>, u64, Option<TableRef<'a>>)> {
        let Span {
            table: t,
            height: h,
            mut va,
            next: end,
            ..
        } = span;
        if h == 0 {
            return None;
        }
        for i in span.from..span.to {
            let next = entry_end::<A>(va, h, end);
            match self.read(t, i, h).1 {
                Next::Leaf(_) if !covers::<A>(va, next, h) => {
                    // Split in the source: its part in the range is copied
                    // as leaves of the next size down.
                    let dc = dst_child(dst, dt, i, h);
                    *need += usize::from(dc.is_none()) + split_copy_need(dst, h - 1, va, next, dc);
                }
                Next::Table(c) if self.first_mapped_in(c, h - 1, va, next).is_some() => {
                    let dc = dst_child(dst, dt, i, h);
                    *need += usize::from(dc.is_none());
                    // A PTE table needs nothing below it.
                    if h > 1 {
                        return Some((c, va, dc));
                    }
                }
                // Copied into `dt` itself (blocks, software entries), or
                // nothing to copy.
                _ => {}
            }
            va = next;
        }
        None
    }

    /// Phase 3: copies `[va, end)` into `c.dst` on the source's cursor,
    /// with `dst`'s tables on the path beside it: each PTE span through
    /// the PTE loop, the spans above it through
    /// [`copy_span`](Self::copy_span). A new table of `dst` is filled
    /// before it is linked: the link is made when the cursor leaves it
    /// (populate publishes its contents first), after its own barrier.
    fn copy_walk<'a, M2: Mmu, T2: TableAlloc>(
        &'a self,
        c: &mut Copier<'a, A, M2, T2, impl FnMut(LeafEntry<A>)>,
        va: u64,
        end: u64,
    ) {
        let mut path = DstPath {
            tables: [c.dst.root_table(); MAX_LEVELS],
            link: [None; MAX_LEVELS],
            wrote: [false; MAX_LEVELS],
        };
        let mut cur = self.cursor(va, end);
        while let Some(sp) = cur.span() {
            let h = sp.height as usize;
            let dt = path.tables[h];
            if h == 0 {
                path.wrote[0] |= self.copy_ptes(sp, dt, c);
            } else if let Some(d) = self.copy_span(sp, dt, c, &mut path.wrote[h]) {
                cur.descend(d.src, d.va);
                path.tables[h - 1] = d.dst;
                path.link[h - 1] = d.link;
                continue;
            }
            for h in cur.advance(sp.next) {
                path.leave(c.dst, h as usize);
            }
        }
    }

    /// Copies the entries of `span` (above the PTE level) into `dt`, up to
    /// its first table entry with something to copy below it (`wrote`: an
    /// entry of `dt` was written); returns where to descend: the source's
    /// table, its first address and `dst`'s table beside it (`None`: the
    /// span is done).
    fn copy_span<'a, M2: Mmu, T2: TableAlloc>(
        &'a self,
        span: Span<'a, A>,
        dt: TableRef<'a>,
        c: &mut Copier<'a, A, M2, T2, impl FnMut(LeafEntry<A>)>,
        wrote: &mut bool,
    ) -> Option<Descend<'a>> {
        let Span {
            table: st,
            height: h,
            mut va,
            next: end,
            ..
        } = span;
        for i in span.from..span.to {
            let next = entry_end::<A>(va, h, end);
            let slot = st.slot(i);
            // A leaf is re-read atomically by the write-protect.
            let sub = match self.read(st, i, h) {
                (_, Next::None) => None,
                (_, Next::Table(sc)) => Some(sc),
                (raw, Next::Leaf(_)) if covers::<A>(va, next, h) => {
                    let leaf = self.copy_leaf(slot, raw, VirtAddr(va), h, c);
                    *wrote |= c.write(dt.slot(i), leaf);
                    (c.report)(LeafEntry::new(va, h, leaf));
                    None
                }
                // Split in the source, then copied through the table the
                // split linked. (No table: a short count, see `take`; not
                // copied.)
                (raw, Next::Leaf(_)) => self
                    .split_block_to_change(slot, raw, VirtAddr(va), h, &mut c.src_stash)
                    .and_then(|_| match self.read(st, i, h).1 {
                        Next::Table(sc) => Some(sc),
                        _ => None,
                    }),
                // A software entry above the PTE level (only `slot` puts
                // one there): copied whole.
                (raw, Next::Invalid) if covers::<A>(va, next, h) => {
                    *wrote |= c.write(dt.slot(i), raw);
                    (c.report)(LeafEntry::new(va, h, raw));
                    None
                }
                // Covered in part: it cannot be split; not copied.
                (_, Next::Invalid) => None,
            };
            let sub = sub.filter(|sc| self.first_mapped_in(*sc, h - 1, va, next).is_some());
            if let Some(src) = sub {
                // (No table for `dst`: a short count; not copied.)
                if let Some((dst, link)) = c.dst_child(dt, i, h) {
                    return Some(Descend { src, va, dst, link });
                }
            }
            va = next;
        }
        None
    }

    /// Linux `copy_pte_range`: copies the PTEs of `span` into `dt` (the
    /// per-entry loop: one load, and for a writable leaf of a COW copy one
    /// compare-exchange, per present entry). Returns whether it wrote to
    /// `dt`.
    fn copy_ptes<M2: Mmu, T2: TableAlloc>(
        &self,
        span: Span<'_, A>,
        dt: TableRef<'_>,
        c: &mut Copier<'_, A, M2, T2, impl FnMut(LeafEntry<A>)>,
    ) -> bool {
        let Span { to, va, .. } = span;
        // Read once, not per entry through `c` (the entry stores may alias
        // it as far as the compiler knows).
        let (dst, cow) = (c.dst, c.cow);
        let report = &mut c.report;
        // Empty entries up to the first one to copy are skipped here, so
        // the copy loop needs no "wrote anything" state of its own (it
        // would take a register the loop needs for its decisions).
        // Relaxed: as in the loop below.
        let Some(skip) = span
            .table
            .slots(span.from, to)
            .iter()
            .position(|s| s.load(Relaxed) != 0)
        else {
            return false;
        };
        let from = span.from + skip;
        let va = va + skip as u64 * page_size::<A>();
        let mut copied = 0u64;
        // What to do with a leaf depends only on its attribute word
        // (`Format` rules), so it is decided once per distinct word
        // (usually once per table), not per entry. No leaf has the
        // attribute word 0, so 0 means "nothing decided yet".
        let mut memo = (0u64, Wp::Keep);
        // The first and last write-protected entries: one gathered range
        // per table instead of one per entry.
        let mut wp = (usize::MAX, 0);
        for (k, (s, d)) in span
            .table
            .slots(from, to)
            .iter()
            .zip(dt.slots(from, to))
            .enumerate()
        {
            // Relaxed: we hold the source exclusively; a write-protect
            // re-reads the entry atomically.
            let raw = s.load(Relaxed);
            if raw == 0 {
                continue;
            }
            let v = va + k as u64 * page_size::<A>();
            let pte = match A::decode(raw, 0) {
                Decoded::Leaf(pa) if cow => {
                    let attrs = raw ^ A::oa_field(pa);
                    if attrs != memo.0 {
                        memo = (attrs, Wp::decide::<A>(raw, 0));
                    }
                    let (pte, protected) = self.cow_pte(s, raw, memo.1, v);
                    if protected {
                        wp = (wp.0.min(k), k);
                    }
                    pte
                }
                // Shared: old and clean in the child.
                Decoded::Leaf(_) => A::mkclean(A::mkold(raw, 0), 0),
                // Software entries are copied as they are (a PTE never
                // decodes as a table).
                _ => raw,
            };
            A::set_pte_nosync(&dst.mmu, d, pte);
            report(LeafEntry::new(v, 0, pte));
            copied += 1;
        }
        if wp.0 != usize::MAX {
            let first = va + wp.0 as u64 * page_size::<A>();
            let len = (wp.1 - wp.0 + 1) as u64 * page_size::<A>();
            c.gather.add_range::<A>(VirtAddr(first), len, 0);
        }
        dst.mmu.stats.add_entries_written(copied);
        true
    }

    /// A COW copy of the source PTE `raw` in `s` (mapping `va`), as `wp`
    /// decided for its attribute word: the child's entry, and whether the
    /// source entry was write-protected.
    #[inline(always)]
    fn cow_pte(&self, s: &Slot, raw: u64, wp: Wp, va: u64) -> (u64, bool) {
        let new = match wp {
            Wp::Keep => return (A::mkold(raw, 0), false),
            Wp::Plain(delta) => {
                // Settled: the hardware never writes this entry again, so
                // a plain store cannot lose an accessed/dirty update.
                generic::set_entry_nosync(&self.mmu, s, raw ^ delta);
                self.mmu.stats.add_entries_written(1);
                raw ^ delta
            }
            Wp::Atomic(delta) => self.wrprotect_as(s, raw, delta, VirtAddr(va)),
            Wp::Bbm => self.wrprotect(s, raw, VirtAddr(va), 0),
        };
        (A::mkold(new, 0), true)
    }

    /// The child's copy of the leaf `raw` at `h` in `slot`, old (and clean
    /// when shared): for a COW copy of a writable leaf, the source leaf
    /// write-protected.
    fn copy_leaf<M2: Mmu, T2: TableAlloc>(
        &self,
        slot: &Slot,
        raw: u64,
        va: VirtAddr,
        h: u32,
        c: &mut Copier<'_, A, M2, T2, impl FnMut(LeafEntry<A>)>,
    ) -> u64 {
        if !c.cow {
            A::mkclean(A::mkold(raw, h), h)
        } else if A::leaf_prot(raw, h).writable() {
            let new = self.wrprotect(slot, raw, va, h);
            c.gather.add_leaf::<A>(va, h);
            A::mkold(new, h)
        } else {
            A::mkold(raw, h)
        }
    }

    /// [`wrprotect`](Self::wrprotect) of the PTE `raw` whose read-only
    /// form is `raw ^ delta` (decided once per attribute word): one
    /// compare-exchange, and the general loop only if the hardware set
    /// accessed/dirty state since `raw` was read.
    #[inline]
    fn wrprotect_as(&self, slot: &Slot, raw: u64, delta: u64, va: VirtAddr) -> u64 {
        // Relaxed: as in `wrprotect`.
        match slot.compare_exchange(raw, raw ^ delta, Relaxed, Relaxed) {
            Ok(_) => {
                if M::OBSERVES_WRITES {
                    self.mmu.entry_written(slot, raw);
                }
                self.mmu.stats.add_entries_written(1);
                raw ^ delta
            }
            Err(now) => self.wrprotect(slot, now, va, 0),
        }
    }

    /// Linux `ptep_set_wrprotect` / `pmdp_set_wrprotect`: makes the live
    /// writable leaf `raw` at `h` in `slot` read-only, keeping its
    /// accessed/dirty state, and returns the new leaf. The caller gathers
    /// its translation for the operation's flush.
    fn wrprotect(&self, slot: &Slot, raw: u64, va: VirtAddr, h: u32) -> u64 {
        let ro = ro(A::leaf_prot(raw, h));
        if needs_bbm::<A>(raw, A::modify_prot(raw, ro, h), h) {
            // Not for any format of this workspace (a permission change is
            // safe in place), but the rule is the rule: break, then make.
            let old = break_entry::<A, _>(&self.mmu, slot, va, h);
            let new = A::modify_prot(old, ro, h);
            A::set_pte_nosync(&self.mmu, slot, new);
            self.table_done();
            return new;
        }
        // Compare-exchange: a hardware accessed/dirty update between the
        // load and the exchange fails it, and the retry carries the update
        // over (a load and a store would lose it).
        let mut cur = raw;
        let new = loop {
            let new = A::modify_prot(cur, ro, h);
            // Relaxed: atomicity is what matters against the hardware; the
            // walker is ordered by the flush at the end of the operation
            // (until then it may still use the writable translation, as in
            // Linux, where the flush follows `copy_page_range`).
            match slot.compare_exchange(cur, new, Relaxed, Relaxed) {
                Ok(_) => break new,
                Err(now) => cur = now,
            }
        };
        if M::OBSERVES_WRITES {
            self.mmu.entry_written(slot, cur);
        }
        self.mmu.stats.add_entries_written(1);
        new
    }
}

/// What a COW copy does to a source leaf, decided once per attribute word.
#[derive(Clone, Copy)]
enum Wp {
    /// Not writable: copied as it is.
    Keep,
    /// Writable and settled ([`Format::is_settled`](crate::Format::is_settled)):
    /// write-protected with a plain store of the leaf XOR this.
    Plain(u64),
    /// Writable, and the hardware may still set accessed/dirty state:
    /// write-protected with a compare-exchange of the leaf XOR this, and
    /// the general loop if the hardware changed the leaf meanwhile.
    Atomic(u64),
    /// Writable, and write-protecting it needs break-before-make (no
    /// format of this workspace): the general path.
    Bbm,
}

impl Wp {
    #[inline]
    fn decide<A: Arch>(raw: u64, h: u32) -> Wp {
        let p = A::leaf_prot(raw, h);
        if !p.writable() {
            Wp::Keep
        } else if needs_bbm::<A>(raw, A::modify_prot(raw, ro(p), h), h) {
            Wp::Bbm
        } else if A::is_settled(raw, h) {
            Wp::Plain(A::modify_prot(raw, ro(p), h) ^ raw)
        } else {
            Wp::Atomic(A::modify_prot(raw, ro(p), h) ^ raw)
        }
    }
}

/// `p` without write permission.
#[inline]
fn ro(p: Prot) -> Prot {
    p.difference(Prot::WRITE)
}

/// The state of one copy that its steps share: the destination, both
/// reservations, the source's gather.
struct Copier<'d, A: Arch, M: Mmu, T: TableAlloc, F> {
    dst: &'d AddressSpace<A, M, T>,
    src_stash: Reservation,
    dst_stash: Reservation,
    gather: TlbGather,
    cow: bool,
    /// The caller's report of each entry copied.
    report: F,
}

impl<'d, A: Arch, M: Mmu, T: TableAlloc, F: FnMut(LeafEntry<A>)> Copier<'d, A, M, T, F> {
    /// Writes `raw` into `dst`'s empty `slot`; returns `true` (the table
    /// was written).
    #[inline]
    fn write(&self, slot: &Slot, raw: u64) -> bool {
        A::set_pte_nosync(&self.dst.mmu, slot, raw);
        self.dst.mmu.stats.add_entries_written(1);
        true
    }

    /// `dst`'s table below entry `i` of its table `dt` at `h`: the one
    /// there, or a new one with the slot to link it into (`None`: there
    /// was none and the reservation was short).
    fn dst_child(
        &mut self,
        dt: TableRef<'d>,
        i: usize,
        h: u32,
    ) -> Option<(TableRef<'d>, Option<&'d Slot>)> {
        match self.dst.read(dt, i, h).1 {
            Next::Table(dc) => Some((dc, None)),
            // None (checked empty).
            _ => Some((self.dst.take_table(&mut self.dst_stash)?, Some(dt.slot(i)))),
        }
    }
}

/// Where the copy descends: the source's table, its first address, and
/// `dst`'s table beside it with the slot to link it into if it is new.
struct Descend<'a> {
    src: TableRef<'a>,
    va: u64,
    dst: TableRef<'a>,
    link: Option<&'a Slot>,
}

/// `dst`'s tables beside the source cursor's path: at each height the
/// table (above the cursor: stale), the slot of its parent to link it
/// into when the cursor leaves it (a new table), and whether an entry of
/// it was written.
struct DstPath<'a> {
    tables: [TableRef<'a>; MAX_LEVELS],
    link: [Option<&'a Slot>; MAX_LEVELS],
    wrote: [bool; MAX_LEVELS],
}

impl DstPath<'_> {
    /// The cursor is done with `dst`'s table at `h`: its barrier if it was
    /// written, then its link if it is new (populate publishes its
    /// contents first; the parent's barrier covers the link).
    fn leave<A: Arch, M: Mmu, T: TableAlloc>(&mut self, dst: &AddressSpace<A, M, T>, h: usize) {
        if core::mem::take(&mut self.wrote[h]) {
            dst.table_done();
        }
        if let Some(slot) = self.link[h].take() {
            let (pa, parent) = (self.tables[h].pa(), h as u32 + 1);
            A::populate_attrs(&dst.mmu, slot, pa, parent, dst.table_attrs);
            dst.mmu.stats.add_entries_written(1);
            self.wrote[h + 1] = true;
        }
    }
}

/// `dst`'s table below entry `i` of its table `dt` at `h`, if there is
/// one.
fn dst_child<'a, A: Arch, M: Mmu, T: TableAlloc>(
    dst: &'a AddressSpace<A, M, T>,
    dt: Option<TableRef<'a>>,
    i: usize,
    h: u32,
) -> Option<TableRef<'a>> {
    match dst.read(dt?, i, h).1 {
        Next::Table(c) => Some(c),
        _ => None,
    }
}

/// The tables `dst` needs below height `h` to hold the leaves of a split
/// block copied into `[va, end)` (leaves at `h`; those covered in part are
/// split again), where `dt` is `dst`'s table at `h` (`None`: new): on
/// `dst`'s cursor, through the entries covered in part only.
fn split_copy_need<A: Arch, M: Mmu, T: TableAlloc>(
    dst: &AddressSpace<A, M, T>,
    h: u32,
    va: u64,
    end: u64,
    dt: Option<TableRef<'_>>,
) -> usize {
    let Some(dt) = dt else {
        // A new table, and one below each entry covered in part.
        return split_parts::<A>(va, end, h);
    };
    let mut need = 0;
    let mut cur = dst.cursor_under(dt, h, va, end);
    while let Some(sp) = cur.span() {
        match split_copy_span(dst, sp, &mut need) {
            Some((c, va)) => cur.descend(c, va),
            None => {
                cur.advance(sp.next);
            }
        }
    }
    need
}

/// [`split_copy_need`] over the entries of `sp` covered in part, counting
/// into `need`, up to the first that has a table in `dst`: that table and
/// its first address (`None`: the span is done).
fn split_copy_span<'a, A: Arch, M: Mmu, T: TableAlloc>(
    dst: &'a AddressSpace<A, M, T>,
    sp: Span<'a, A>,
    need: &mut usize,
) -> Option<(TableRef<'a>, u64)> {
    let h = sp.height;
    if h == 0 {
        return None;
    }
    for (i, va, next) in sp.partial() {
        match dst.read(sp.table, i, h).1 {
            Next::Table(c) => return Some((c, va)),
            _ => *need += 1 + split_parts::<A>(va, next, h - 1),
        }
    }
    None
}
