//! The write phase: the move loop over the planned steps, the entry moves
//! (Linux `move_pgt_entry`, `move_ptes`), the destination tables they
//! link, and the freeing of the source tables the move emptied.

use core::sync::atomic::Ordering::Relaxed;

use super::deferred::dest_meets_source;
use super::plan::{Dest, PgtEntry, Step};
use super::{Cursor, Mover};
use crate::aspace::{covers, table_at, Block, FreeQueue};
use crate::level::{entry_end, index, size};
use crate::{
    generic, Arch, Decoded, Error, Mmu, PhysAddr, Slot, Table, TableAlloc, TlbGather, VirtAddr,
    ENTRIES_PER_TABLE, PAGE_SIZE,
};

/// Destination tables written since the last walker barrier, by height.
/// Leaving a table for another one at the same height issues the barrier
/// (it covers every earlier write), so each destination table gets one.
#[derive(Default)]
pub(super) struct Owed {
    table: [Option<PhysAddr>; 5],
    /// Some destination write still needs a barrier (also writes that
    /// are not tracked by table, see `defer_ptes`).
    pub(super) pending: bool,
}

impl<A: Arch, M: Mmu, T: TableAlloc> Mover<'_, A, M, T> {
    /// Phase 3: moves, frees the emptied source tables, flushes, copies
    /// the deferred PTE tables and releases what is left of the
    /// reservation. `first` is the step the check phase already planned at
    /// the start, if any (reserving tables does not change the tables, so
    /// it is still current).
    pub(super) fn apply(mut self, mut first: Option<Step<'_>>) -> Result<(), Error> {
        // After a single step, the moved entries were the only ones of the
        // range, and they are none now: only their source table (then its
        // ancestors) can have become empty, and only if it is not the root
        // and holds no other entry. Otherwise there is nothing to free and
        // no need to walk the range again. (A whole table moved out is
        // empty: `free_empty` frees it without a scan.)
        let single = match first {
            Some(Step::Entry {
                table,
                height,
                count,
                ..
            }) => table.map(|t| (t, height, count)),
            _ => None,
        };
        let mut at = self.start();
        while at.rem > 0 {
            // `plan(.., None)` fills every `Option` of a step (only the dry
            // run's simulated splits leave them `None`), so the `expect`s
            // below cannot fire.
            let step = match first.take().unwrap_or_else(|| self.plan(at, None)) {
                Step::Skip(l) => l,
                Step::Entry {
                    kind,
                    height,
                    slots,
                    count,
                    dst,
                    ..
                } => {
                    let slots = slots.expect("real source entries");
                    self.move_pgt_entry(kind, slots, at, dst);
                    count as u64 * size(height)
                }
                Step::Split { height, slot, raw } => {
                    let slot = slot.expect("a real source block");
                    let block = Block {
                        slot,
                        raw,
                        va: VirtAddr(at.old),
                        height,
                    };
                    self.space
                        .split_block(block, &mut self.stash, &mut self.gather);
                    0
                }
                Step::Ptes {
                    len: part,
                    src,
                    pmd,
                } => {
                    let src = src.expect("a real source table");
                    if at.old & (size(1) - 1) == 0
                        && at.rem >= size(1)
                        && !dest_meets_source(at.new, self.old, self.len)
                    {
                        // The whole PTE table moves: unlink it now and
                        // copy it after the flush (see `defer_ptes`).
                        let pmd = pmd.expect("a real PMD entry");
                        self.defer_ptes(src, pmd, at);
                        size(1)
                    } else {
                        self.move_ptes(src, at, part);
                        part
                    }
                }
            };
            if self.stash.is_short() {
                // The count was short (see `take`): the step changed
                // nothing; stop here and keep what is left at the source.
                break;
            }
            at.advance(step);
        }
        // After a short count nothing is freed: entries that did not move
        // may sit in tables `free_empty` takes to be empty.
        let nothing_to_free = self.stash.is_short()
            || single.is_some_and(|(t, height, count): (&Table, u32, usize)| {
                height == A::LEVELS - 1
                    || (count < ENTRIES_PER_TABLE
                        // Relaxed: we hold the address space exclusively.
                        && t.entries.iter().any(|e| e.load(Relaxed) != 0))
            });
        if !nothing_to_free {
            let (root, old) = (self.space.root, self.old);
            self.free_empty(A::LEVELS - 1, root, old, old.wrapping_add(self.len));
        }
        // The one TLB flush. Unlinked tables are freed only after it, and
        // the deferred PTE tables are copied only after it: from then on no
        // walker can reach them to set an accessed or dirty bit. Without
        // deferred tables, one `finish` flushes and frees. The copy takes
        // no table and walks nothing: `defer_ptes` linked its destination
        // tables and recorded them, and `free_empty` above cannot have
        // freed them (see `defer_ptes`).
        let gather = core::mem::take(&mut self.gather);
        let deferred = self.later.count != 0;
        if deferred {
            self.space.finish(gather, FreeQueue::new());
            self.copy_deferred();
        } else {
            let q = core::mem::replace(&mut self.q, FreeQueue::new());
            self.space.finish(gather, q);
        }
        let Mover {
            space,
            stash,
            owed,
            q,
            ..
        } = self;
        if owed.pending {
            space.table_done();
        }
        let settled = space.settle(stash);
        if deferred {
            space.finish(TlbGather::new(), q);
        }
        settled
    }

    /// The destination table at `height` (the one holding entries of that
    /// height) for `new`, allocating and linking the missing tables on the
    /// way from the reservation (Linux `alloc_new_pmd` / `alloc_new_pud`).
    /// `None` only when the reservation is short (see `take`); the tables
    /// linked until then stay, empty.
    pub(super) fn dest_table(&mut self, new: u64, height: u32) -> Option<PhysAddr> {
        let mut tpa = self.space.root;
        let mut h = A::LEVELS - 1;
        while h > height {
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.space.alloc, tpa) };
            let slot = &t.entries[index(new, h)];
            // Relaxed: we hold the address space exclusively.
            match A::decode(slot.load(Relaxed), h) {
                Decoded::Table(c) => tpa = c,
                _ => {
                    // Checked empty: this is `None`. Link a zeroed table
                    // (populate publishes its zeroing first); the barrier
                    // of this table covers the link.
                    let c = self.space.take(&mut self.stash)?;
                    A::populate_attrs(&self.space.mmu, slot, c, h, self.space.table_attrs);
                    self.wrote(h, tpa);
                    tpa = c;
                }
            }
            h -= 1;
        }
        Some(tpa)
    }

    /// Notes a write to destination table `tpa` at `height`; issues the
    /// walker barrier when the move leaves another table at that height.
    #[inline]
    pub(super) fn wrote(&mut self, height: u32, tpa: PhysAddr) {
        let cur = &mut self.owed.table[height as usize];
        if *cur == Some(tpa) {
            return;
        }
        if cur.is_some() {
            // One barrier makes every earlier write visible.
            self.space.table_done();
            self.owed.table = [None; 5];
        }
        self.owed.table[height as usize] = Some(tpa);
        self.owed.pending = true;
    }

    /// Linux `move_pgt_entry`: moves the source entries `src` (a run of
    /// one kind, see [`run`](Self::run)) from `at` to the destination.
    fn move_pgt_entry(&mut self, kind: PgtEntry, src: &[Slot], at: Cursor, dst: Dest) {
        match kind {
            PgtEntry::NormalPud => self.move_normal_pud(src, at, dst),
            PgtEntry::NormalPmd => self.move_normal_pmd(src, at, dst),
            PgtEntry::Huge(h) => self.move_huge(h, src, at, dst),
        }
    }

    /// Moves PUD entries that point at whole PMD tables: one entry per
    /// 1 GiB (Linux "mm: Speed up mremap on large regions").
    fn move_normal_pud(&mut self, src: &[Slot], at: Cursor, dst: Dest) {
        self.move_entries(2, true, src, at, dst);
    }

    /// Moves PMD entries that point at whole PTE tables: one entry per
    /// 2 MiB.
    fn move_normal_pmd(&mut self, src: &[Slot], at: Cursor, dst: Dest) {
        self.move_entries(1, true, src, at, dst);
    }

    /// Moves blocks (huge leaves) at `height`, one entry each (Linux
    /// `move_huge_pmd` / `move_huge_pud`).
    fn move_huge(&mut self, height: u32, src: &[Slot], at: Cursor, dst: Dest) {
        self.move_entries(height, false, src, at, dst);
    }

    /// Moves the entries `src` at `height` (tables when `tables`) from
    /// `at` to the consecutive destination entries there, in one
    /// destination table (`dst`, as the planning walk found it: no second
    /// walk when it exists).
    fn move_entries(&mut self, height: u32, tables: bool, src: &[Slot], at: Cursor, dst: Dest) {
        let dt = match dst {
            Dest::Table(pa) => pa,
            Dest::Missing(_) => match self.dest_table(at.new, height) {
                Some(pa) => pa,
                // Short reservation (see `take`): the entries stay.
                None => return,
            },
        };
        // SAFETY: `dst` / `dest_table` is a live table of ours; the run
        // stays inside it.
        let dst = unsafe {
            &table_at(&self.space.alloc, dt).entries[index(at.new, height)..][..src.len()]
        };
        let mmu = &self.space.mmu;
        if tables {
            // Linux relinks a moved table with `pmd_populate` /
            // `pud_populate`: its contents, written by earlier operations,
            // are published before the link at the new place.
            mmu.publish_barrier();
        }
        for (s, d) in src.iter().zip(dst) {
            // An atomic exchange: a block's accessed/dirty state, and the
            // accessed bit x86 sets in table entries too, must not be lost
            // between the read and the clear.
            let raw = if tables {
                generic::get_and_clear(mmu, s)
            } else {
                A::pmdp_huge_get_and_clear(mmu, s)
            };
            // The nosync half of `set_pud_at` / `set_pmd_at`; the barrier
            // is this destination table's, issued by `wrote` or at the end.
            A::set_pte_nosync(mmu, d, raw);
        }
        self.wrote(height, dt);
        self.space.mmu.stats.add_entries_written(src.len() as u64);
        let len = src.len() as u64 * size(height);
        if tables {
            // Walk caches of the old path must go, not only leaves.
            self.gather.add_tables(VirtAddr(at.old), len);
        } else {
            self.gather.add_range(VirtAddr(at.old), len, height);
        }
    }

    /// Linux `move_ptes`: moves the PTEs of the `len` bytes from `at`
    /// (inside the source PTE table `src`) to the destination.
    fn move_ptes(&mut self, src: PhysAddr, at: Cursor, len: u64) {
        let n = (len / PAGE_SIZE) as usize;
        // SAFETY: a table reached from the root; live until `finish`.
        let st = unsafe { table_at(&self.space.alloc, src) };
        let src = &st.entries[index(at.old, 0)..][..n];
        // Relaxed: we hold the address space exclusively.
        let Some(first) = src.iter().position(|e| e.load(Relaxed) != 0) else {
            return;
        };
        // Only now, with something to move, take a destination table
        // (none: the reservation is short, see `take`; the entries stay).
        let Some(dt) = self.dest_table(at.new, 0) else {
            return;
        };
        // SAFETY: `dest_table` returns a live table of ours, distinct
        // entries from `src` (the ranges do not overlap).
        let dst = unsafe { &table_at(&self.space.alloc, dt).entries[index(at.new, 0)..][..n] };
        let mmu = &self.space.mmu;
        let mut moved = 0u64;
        for (s, d) in src[first..].iter().zip(&dst[first..]) {
            // Relaxed: exclusive access; ordering toward the walker comes
            // from the barrier and the flush.
            let raw = s.load(Relaxed);
            if raw == 0 {
                continue;
            }
            let pte = if A::is_settled(raw, 0) {
                // The hardware will never write this entry again, so a
                // plain clear cannot lose an accessed/dirty update.
                generic::set_entry_nosync(mmu, s, 0);
                raw
            } else {
                A::ptep_get_and_clear(mmu, s)
            };
            A::set_pte_nosync(mmu, d, pte);
            moved += 1;
        }
        self.wrote(0, dt);
        self.space.mmu.stats.add_entries_written(moved);
        let start = at.old + first as u64 * PAGE_SIZE;
        self.gather
            .add_range(VirtAddr(start), (n - first) as u64 * PAGE_SIZE, 0);
    }

    /// After the move: unlinks and queues the source tables in
    /// `[va, end)` that are now empty. Returns whether the table `tpa` at
    /// `height` is empty.
    ///
    /// Everything whose span lies inside the source range was moved, so a
    /// table covered whole is empty (its subtree holds only empty tables)
    /// and is not scanned; only the partly covered tables at the two ends of
    /// the range are.
    fn free_empty(&mut self, height: u32, tpa: PhysAddr, mut va: u64, end: u64) -> bool {
        let start = va;
        // SAFETY: the root or a table reached from it.
        let t = unsafe { table_at(&self.space.alloc, tpa) };
        if height > 0 {
            loop {
                let next = entry_end(va, height, end);
                let slot = &t.entries[index(va, height)];
                // Relaxed: we hold the address space exclusively.
                if let Decoded::Table(c) = A::decode(slot.load(Relaxed), height) {
                    // A pinned kernel-half table is emptied, never unlinked.
                    let keep = self.space.pinned(height, va);
                    let whole = covers(va, next, height) && !keep;
                    if (whole || self.free_empty(height - 1, c, va, next)) && !keep {
                        // A source-side clear; the flush orders it.
                        generic::set_entry_nosync(&self.space.mmu, slot, 0);
                        self.gather.add_tables(VirtAddr(va), next.wrapping_sub(va));
                        self.space.queue_free_subtree(&mut self.q, c, height - 1);
                    }
                }
                va = next;
                if va == end {
                    break;
                }
            }
        }
        if height == A::LEVELS - 1 {
            // The root stays, empty or not: no need to scan it.
            return false;
        }
        covers(start, end, height + 1)
            // Relaxed: we hold the address space exclusively.
            || t.entries.iter().all(|e| e.load(Relaxed) == 0)
    }
}
