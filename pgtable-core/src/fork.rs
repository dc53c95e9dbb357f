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

use crate::aspace::{break_entry, covers, needs_bbm, table_at, FreeQueue, Reservation, TableSpan};
use crate::level::{entry_end, index};
use crate::{
    generic, AddressSpace, Arch, Decoded, Error, Mmu, PhysAddr, Prot, Slot, Table, TableAlloc,
    TlbGather, VirtAddr,
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
    /// write-protected: Intel SDM Vol. 3A 4.10.2.3); `dst` needs no flush. The child's leaves are old, and with
    /// [`CopyMode::Shared`] clean (Linux `copy_present_pte`).
    ///
    /// A block the range covers only in part is split in the source first
    /// (as Linux splits a huge page at a VMA boundary), so that only the
    /// range is write-protected. Global leaves may be copied: `dst` then
    /// flushes with `flush_tlb_all` too.
    ///
    /// # Errors
    ///
    /// Zero or misaligned length, a range outside the address space,
    /// [`Error::AlreadyMapped`] (with the first such address) when
    /// anything, a software entry included, is in the range in `dst`, or
    /// [`Error::OutOfMemory`] from either space's allocator. On error
    /// neither space was changed and no table frame is kept.
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
    /// parent.copy_page_range(&mut child, va, 4 << 20, CopyMode::Cow).unwrap();
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
    ) -> Result<(), Error> {
        // Phase 1: check, read-only.
        let end = self.check_range(va, len)?;
        dst.check_range(va, len)?;
        let top = A::LEVELS - 1;
        if let Some(at) = dst.first_mapped_in(top, dst.root, va.0, end) {
            return Err(Error::AlreadyMapped(at));
        }
        let src_need = self.split_check(top, self.root_table(), va.0, end, &|_, _| true);
        // SAFETY: the destination root is a live table of `dst`.
        let droot = unsafe { table_at(&dst.alloc, dst.root) };
        let dst_need = self.copy_need(dst, TableSpan::new(top, self.root, va.0, end), Some(droot));

        // Phase 2: reserve both, or neither.
        let mut src_stash = self.reserve(src_need)?;
        let mut dst_stash = match dst.reserve(dst_need) {
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
        let mut gather = TlbGather::new();
        let cow = mode == CopyMode::Cow;
        let (sroot, droot) = (self.root, dst.root);
        let mut c = CopyState {
            src_stash: &mut src_stash,
            dst_stash: &mut dst_stash,
            gather: &mut gather,
            cow,
        };
        self.copy_table(dst, TableSpan::new(top, sroot, va.0, end), droot, &mut c);
        self.finish(gather, FreeQueue::new());
        // Short only if a count was (see `take`); both are settled.
        let src = self.settle(src_stash);
        let dst = dst.settle(dst_stash);
        src.and(dst)
    }

    /// Phase 1: the tables `dst` needs below height `h` to copy `[va, end)`
    /// of the source table `src` (whose partly covered blocks will have been
    /// split), where `dt` is `dst`'s table at `h` (`None`: to be created).
    fn copy_need<M2: Mmu, T2: TableAlloc>(
        &self,
        dst: &AddressSpace<A, M2, T2>,
        span: TableSpan,
        dt: Option<&Table>,
    ) -> usize {
        let TableSpan {
            height: h,
            table: src,
            mut va,
            end,
        } = span;
        if h == 0 {
            return 0;
        }
        // SAFETY: the root or a table reached from it.
        let t = unsafe { table_at(&self.alloc, src) };
        let mut need = 0;
        loop {
            let next = entry_end(va, h, end);
            // Relaxed: we hold the source exclusively; the hardware changes
            // accessed/dirty state only.
            let raw = t.entries[index(va, h)].load(Relaxed);
            let child = |dst: &AddressSpace<A, M2, T2>| child_table(dst, dt, va, h);
            match A::decode(raw, h) {
                Decoded::Leaf(_) if !covers(va, next, h) => {
                    // Split in the source: its part in the range is copied
                    // as leaves of the next size down.
                    let dc = child(dst);
                    need += usize::from(dc.is_none()) + split_copy_need(dst, h - 1, va, next, dc);
                }
                Decoded::Table(c) if self.first_mapped_in(h - 1, c, va, next).is_some() => {
                    let dc = child(dst);
                    need += usize::from(dc.is_none())
                        + self.copy_need(dst, TableSpan::new(h - 1, c, va, next), dc);
                }
                // Copied into `dt` itself (blocks, software entries), or
                // nothing to copy.
                _ => {}
            }
            va = next;
            if va == end {
                return need;
            }
        }
    }

    /// Phase 3: copies `[va, end)` of the source table `stpa` at `h` into
    /// `dst`'s table `dtpa`. Returns whether it wrote to `dtpa`.
    fn copy_table<M2: Mmu, T2: TableAlloc>(
        &mut self,
        dst: &mut AddressSpace<A, M2, T2>,
        span: TableSpan,
        dtpa: PhysAddr,
        c: &mut CopyState<'_>,
    ) -> bool {
        let TableSpan {
            height: h,
            table: stpa,
            mut va,
            end,
        } = span;
        // SAFETY: the source root, a table reached from it or one a split
        // just linked; live until the flush of this operation at least.
        let st = unsafe { table_at(&self.alloc, stpa) };
        // SAFETY: `dst`'s root, a table reached from it, or a reserved
        // frame of `dst` being filled before its link.
        let dt = unsafe { table_at(&dst.alloc, dtpa) };
        if h == 0 {
            return self.copy_ptes(dst, st, dt, va, end, c);
        }
        let mut wrote = false;
        loop {
            let next = entry_end(va, h, end);
            let i = index(va, h);
            let slot = &st.entries[i];
            // Relaxed: as in `copy_need`; a leaf is re-read atomically by
            // the write-protect.
            let raw = slot.load(Relaxed);
            let sub = match A::decode(raw, h) {
                Decoded::None => None,
                Decoded::Table(sc) => Some(sc),
                Decoded::Leaf(_) if covers(va, next, h) => {
                    let leaf = self.copy_leaf(slot, raw, VirtAddr(va), h, c);
                    A::set_pte_nosync(&dst.mmu, &dt.entries[i], leaf);
                    dst.mmu.stats.add_entries_written(1);
                    wrote = true;
                    None
                }
                Decoded::Leaf(_) => {
                    // (No table: a short count, see `take`; not copied.)
                    self.split_block_to_change(slot, raw, VirtAddr(va), h, c.src_stash)
                }
                Decoded::Invalid if covers(va, next, h) => {
                    // A software entry above the PTE level (only `slot`
                    // puts one there): copied whole.
                    A::set_pte_nosync(&dst.mmu, &dt.entries[i], raw);
                    dst.mmu.stats.add_entries_written(1);
                    wrote = true;
                    None
                }
                // Covered in part: it cannot be split; not copied.
                Decoded::Invalid => None,
            };
            if let Some(sc) = sub {
                if self.first_mapped_in(h - 1, sc, va, next).is_some() {
                    let dslot = &dt.entries[i];
                    // Relaxed: `dst` is held exclusively.
                    match A::decode(dslot.load(Relaxed), h) {
                        Decoded::Table(dc) => {
                            self.copy_table(dst, TableSpan::new(h - 1, sc, va, next), dc, c);
                        }
                        _ => {
                            // None (checked empty). Fill the new table, then
                            // link it: populate publishes its contents
                            // first, and this table's barrier covers the
                            // link. (No table: a short count; not copied.)
                            if let Some(dc) = dst.take(c.dst_stash) {
                                self.copy_table(dst, TableSpan::new(h - 1, sc, va, next), dc, c);
                                A::populate_attrs(&dst.mmu, dslot, dc, h, dst.table_attrs);
                                dst.mmu.stats.add_entries_written(1);
                                wrote = true;
                            }
                        }
                    }
                }
            }
            va = next;
            if va == end {
                break;
            }
        }
        if wrote {
            dst.table_done();
        }
        wrote
    }

    /// Linux `copy_pte_range`: copies the PTEs of `[va, end)` from `st` to
    /// `dt` (the per-entry loop: one load, and for a writable leaf of a
    /// COW copy one compare-exchange, per present entry).
    fn copy_ptes<M2: Mmu, T2: TableAlloc>(
        &mut self,
        dst: &mut AddressSpace<A, M2, T2>,
        st: &Table,
        dt: &Table,
        va: u64,
        end: u64,
        c: &mut CopyState<'_>,
    ) -> bool {
        let i = index(va, 0);
        let n = (end.wrapping_sub(va) / crate::PAGE_SIZE) as usize;
        let mut copied = 0u64;
        // What to do with a leaf depends only on its attribute word
        // (`Format` rules), so it is decided once per distinct word
        // (usually once per table), not per entry. No leaf has the
        // attribute word 0, so 0 means "nothing decided yet".
        let mut memo = (0u64, Wp::Keep);
        // The first and last write-protected entries: one gathered range
        // per table instead of one per entry.
        let mut wp = (usize::MAX, 0);
        for (k, (s, d)) in st.entries[i..i + n]
            .iter()
            .zip(&dt.entries[i..i + n])
            .enumerate()
        {
            // Relaxed: we hold the source exclusively; a write-protect
            // re-reads the entry atomically.
            let raw = s.load(Relaxed);
            if raw == 0 {
                continue;
            }
            let pte = match A::decode(raw, 0) {
                Decoded::Leaf(pa) if c.cow => {
                    let attrs = raw ^ pa.0 >> A::OA_SHIFT;
                    if attrs != memo.0 {
                        memo = (attrs, Wp::decide::<A>(raw, 0));
                    }
                    match memo.1 {
                        Wp::Keep => A::mkold(raw, 0),
                        Wp::Plain(delta) => {
                            // Settled: the hardware never writes this entry
                            // again, so a plain store cannot lose an
                            // accessed/dirty update.
                            generic::set_entry_nosync(&self.mmu, s, raw ^ delta);
                            self.mmu.stats.add_entries_written(1);
                            wp = (wp.0.min(k), k);
                            A::mkold(raw ^ delta, 0)
                        }
                        Wp::Atomic => {
                            wp = (wp.0.min(k), k);
                            let v = VirtAddr(va + k as u64 * crate::PAGE_SIZE);
                            A::mkold(self.wrprotect(s, raw, v, 0), 0)
                        }
                    }
                }
                // Shared: old and clean in the child.
                Decoded::Leaf(_) => A::mkclean(A::mkold(raw, 0), 0),
                // Software entries are copied as they are (a PTE never
                // decodes as a table).
                _ => raw,
            };
            A::set_pte_nosync(&dst.mmu, d, pte);
            copied += 1;
        }
        if wp.0 != usize::MAX {
            let first = va + wp.0 as u64 * crate::PAGE_SIZE;
            c.gather.add_range(
                VirtAddr(first),
                (wp.1 - wp.0 + 1) as u64 * crate::PAGE_SIZE,
                0,
            );
        }
        dst.mmu.stats.add_entries_written(copied);
        if copied > 0 {
            dst.table_done();
        }
        copied > 0
    }

    /// The child's copy of the leaf `raw` at `h` in `slot`, old (and clean
    /// when shared): for a COW copy of a writable leaf, the source leaf
    /// write-protected.
    fn copy_leaf(
        &mut self,
        slot: &Slot,
        raw: u64,
        va: VirtAddr,
        h: u32,
        c: &mut CopyState<'_>,
    ) -> u64 {
        if !c.cow {
            A::mkclean(A::mkold(raw, h), h)
        } else if A::leaf_prot(raw, h).writable() {
            let new = self.wrprotect(slot, raw, va, h);
            c.gather.add_leaf(va, h);
            A::mkold(new, h)
        } else {
            A::mkold(raw, h)
        }
    }

    /// Linux `ptep_set_wrprotect` / `pmdp_set_wrprotect`: makes the live
    /// writable leaf `raw` at `h` in `slot` read-only, keeping its
    /// accessed/dirty state, and returns the new leaf. The caller gathers
    /// its translation for the operation's flush.
    fn wrprotect(&mut self, slot: &Slot, raw: u64, va: VirtAddr, h: u32) -> u64 {
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
    /// write-protected with a compare-exchange loop.
    Atomic,
}

impl Wp {
    #[inline]
    fn decide<A: Arch>(raw: u64, h: u32) -> Wp {
        let p = A::leaf_prot(raw, h);
        if !p.writable() {
            Wp::Keep
        } else if A::is_settled(raw, h) && !needs_bbm::<A>(raw, A::modify_prot(raw, ro(p), h), h) {
            Wp::Plain(A::modify_prot(raw, ro(p), h) ^ raw)
        } else {
            Wp::Atomic
        }
    }
}

/// `p` without write permission.
#[inline]
fn ro(p: Prot) -> Prot {
    p.difference(Prot::WRITE)
}

/// The mutable state of one copy.
struct CopyState<'a> {
    src_stash: &'a mut Reservation,
    dst_stash: &'a mut Reservation,
    gather: &'a mut TlbGather,
    cow: bool,
}

/// `dst`'s table below the entry at `h` for `va` in its table `dt`, if
/// there is one.
fn child_table<'t, A: Arch, M: Mmu, T: TableAlloc>(
    dst: &AddressSpace<A, M, T>,
    dt: Option<&Table>,
    va: u64,
    h: u32,
) -> Option<&'t Table> {
    // Relaxed: `dst` is held exclusively.
    match A::decode(dt?.entries[index(va, h)].load(Relaxed), h) {
        // SAFETY: a table reached from `dst`'s root.
        Decoded::Table(c) => Some(unsafe { table_at(&dst.alloc, c) }),
        _ => None,
    }
}

/// The tables `dst` needs below height `h` to hold the leaves of a split
/// block copied into `[va, end)` (leaves at `h`; those covered in part are
/// split again), where `dt` is `dst`'s table at `h` (`None`: new).
fn split_copy_need<A: Arch, M: Mmu, T: TableAlloc>(
    dst: &AddressSpace<A, M, T>,
    h: u32,
    mut va: u64,
    end: u64,
    dt: Option<&Table>,
) -> usize {
    if h == 0 {
        return 0;
    }
    let mut need = 0;
    loop {
        let next = entry_end(va, h, end);
        if !covers(va, next, h) {
            let dc = child_table(dst, dt, va, h);
            need += usize::from(dc.is_none()) + split_copy_need(dst, h - 1, va, next, dc);
        }
        va = next;
        if va == end {
            return need;
        }
    }
}
