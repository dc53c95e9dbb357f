//! The write phase: the move loop over the planned steps, the entry moves
//! (Linux `move_pgt_entry`, `move_ptes`), the destination tables they
//! link, and the freeing of the source tables the move emptied.

use core::sync::atomic::Ordering::Relaxed;

use super::deferred::dest_meets_source;
use super::plan::{At, Dest, EntryMove, PgtEntry, Step};
use super::{Done, Mover, Pos, Range};
use crate::contract::level::{entries, entry_end, index, page_size, size};
use crate::space::aspace::{covers, Block};
use crate::space::walker::{Next, Span, TableRef};
use crate::{generic, Arch, Mmu, PhysAddr, Slot, TableAlloc, TlbGather, VirtAddr};

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

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Mover<'a, A, M, T> {
    /// Phase 3: moves, frees the emptied source tables, and, when whole
    /// PTE tables were deferred, flushes and copies them. `first` is the
    /// step the check phase already planned at the start, if any
    /// (reserving tables does not change the tables, so it is still
    /// current). The rest of the closing steps is the caller's
    /// ([`Done`]).
    pub(super) fn apply(mut self, first: Option<EntryMove<'a>>) -> Done {
        self.move_all(first);
        // After a short count nothing is freed: entries that did not move
        // may sit in tables `free_empty` takes to be empty.
        if !self.stash.is_short() && !first.is_some_and(|e| self.single_freed_nothing(e)) {
            let old = self.range.old;
            self.free_empty(old, old.wrapping_add(self.range.len));
        }
        // The one TLB flush. Unlinked tables are freed only after it (by
        // the caller), and the deferred PTE tables are copied only after
        // it: from then on no walker can reach them to set an accessed or
        // dirty bit. The copy takes no table and walks nothing:
        // `defer_ptes` linked its destination tables and recorded them,
        // and `free_empty` above cannot have freed them (see `defer_ptes`).
        let mut gather = core::mem::take(&mut self.gather);
        let flushed = self.later.count != 0;
        if flushed {
            self.space.flush(gather);
            gather = TlbGather::new();
            self.copy_deferred();
        }
        Done {
            gather,
            q: self.q,
            stash: self.stash,
            pending: self.owed.pending,
            flushed,
        }
    }

    /// Whether the move of `first`, the whole range in one step, left
    /// nothing to free. The moved entries were the only ones of the range,
    /// and they are none now: only their source table (then its
    /// ancestors) can have become empty, and only if it is not the root
    /// and holds no other entry. (A whole table moved out is empty:
    /// `free_empty` frees it without a scan.)
    fn single_freed_nothing(&self, first: EntryMove<'a>) -> bool {
        first.height == A::LEVELS - 1
            || (first.count < entries::<A>()
                && (0..entries::<A>()).any(|i| first.table.load(i) != 0))
    }

    /// The move loop: the cursor over the source range, from its start
    /// until its end or a short reservation; the destination side of each
    /// step is found by its own short walk (Linux `get_old_pmd` /
    /// `alloc_new_pmd` per extent). `first`, when given, is the whole move.
    fn move_all(&mut self, first: Option<EntryMove<'a>>) {
        let range = self.range;
        if let Some(e) = first {
            self.move_pgt_entry(e, range.start());
            return;
        }
        let mut cur = self
            .space
            .cursor(range.old, range.old.wrapping_add(range.len));
        while let Some(sp) = cur.span() {
            match self.move_span(sp) {
                Ok(Some((c, va))) => cur.descend(c, va),
                Ok(None) => {
                    cur.advance(sp.next);
                }
                // The count was short (see `take`): the step changed
                // nothing; stop here and keep what is left at the source.
                Err(()) => return,
            }
        }
    }

    /// The steps of `sp`, one per extent, up to the first table the move
    /// goes down into (that table and its first address; `None`: the span
    /// is done; `Err`: the reservation is short).
    fn move_span(&mut self, sp: Span<'a, A>) -> Result<Option<(TableRef<'a>, u64)>, ()> {
        let Range { old, new, len } = self.range;
        let end = old.wrapping_add(len);
        let mut va = sp.va;
        while va != sp.next {
            let at = Pos {
                old: va,
                new: va.wrapping_sub(old).wrapping_add(new),
                rem: end.wrapping_sub(va),
            };
            let step = match self.plan.plan_at(sp.table, sp.height, at) {
                At::Step(step) => step,
                At::Down(c) => return Ok(Some((c, va))),
            };
            // A split steps 0 bytes: the position is planned again, now
            // over the block's table.
            va = va.wrapping_add(self.step(step, at));
            if self.stash.is_short() {
                return Err(());
            }
        }
        Ok(None)
    }

    /// Carries out `step` at `at`; returns how far it got.
    fn step(&mut self, step: Step<'a>, at: Pos) -> u64 {
        match step {
            Step::Skip(l) => l,
            Step::Entry(e) => {
                self.move_pgt_entry(e, at);
                e.len::<A>()
            }
            Step::Split { height, slot, raw } => {
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
            Step::Ptes { len, src, pmd } => {
                if at.old & (size::<A>(1) - 1) == 0
                    && at.rem >= size::<A>(1)
                    && !dest_meets_source::<A>(at.new, self.range.old, self.range.len)
                {
                    // The whole PTE table moves: unlink it now and copy it
                    // after the flush (see `defer_ptes`).
                    self.defer_ptes(src, pmd, at);
                    size::<A>(1)
                } else {
                    self.move_ptes(src, at, len);
                    len
                }
            }
        }
    }

    /// The destination table at `height` (the one holding entries of that
    /// height) for `new`, allocating and linking the missing tables on the
    /// way from the reservation (Linux `alloc_new_pmd` / `alloc_new_pud`).
    /// `None` only when the reservation is short (see `take`); the tables
    /// linked until then stay, empty.
    pub(super) fn dest_table(&mut self, new: u64, height: u32) -> Option<TableRef<'a>> {
        let stop = match self.space.path_to(new, height) {
            Ok(t) => return Some(t),
            Err(stop) => stop,
        };
        let mut t = stop.table;
        for h in (height + 1..=stop.height).rev() {
            // Checked empty: this entry is none (and every entry of the
            // tables linked below it). Link a zeroed table (populate
            // publishes its zeroing first); the barrier of this table
            // covers the link.
            let c = self.space.take_table(&mut self.stash)?;
            let slot = t.slot(index::<A>(new, h));
            A::populate_attrs(&self.space.mmu, slot, c.pa(), h, self.space.table_attrs);
            self.wrote(h, t);
            t = c;
        }
        Some(t)
    }

    /// Notes a write to destination table `t` at `height`; issues the
    /// walker barrier when the move leaves another table at that height.
    #[inline]
    pub(super) fn wrote(&mut self, height: u32, t: TableRef<'a>) {
        let cur = &mut self.owed.table[height as usize];
        if *cur == Some(t.pa()) {
            return;
        }
        if cur.is_some() {
            // One barrier makes every earlier write visible.
            self.space.table_done();
            self.owed.table = [None; 5];
        }
        self.owed.table[height as usize] = Some(t.pa());
        self.owed.pending = true;
    }

    /// Linux `move_pgt_entry`: moves the source entries of `e` (a run of
    /// one kind, see `Planner::run`) from `at` to the destination.
    fn move_pgt_entry(&mut self, e: EntryMove<'a>, at: Pos) {
        match e.kind {
            PgtEntry::NormalPud => self.move_normal_pud(e, at),
            PgtEntry::NormalPmd => self.move_normal_pmd(e, at),
            PgtEntry::Huge(_) => self.move_huge(e, at),
        }
    }

    /// Moves PUD entries that point at whole PMD tables: one entry per
    /// 1 GiB (Linux "mm: Speed up mremap on large regions").
    fn move_normal_pud(&mut self, e: EntryMove<'a>, at: Pos) {
        self.move_entries(e, true, at);
    }

    /// Moves PMD entries that point at whole PTE tables: one entry per
    /// 2 MiB.
    fn move_normal_pmd(&mut self, e: EntryMove<'a>, at: Pos) {
        self.move_entries(e, true, at);
    }

    /// Moves blocks (huge leaves) at the step's height, one entry each
    /// (Linux `move_huge_pmd` / `move_huge_pud`).
    fn move_huge(&mut self, e: EntryMove<'a>, at: Pos) {
        self.move_entries(e, false, at);
    }

    /// Moves the entries of `e` (tables when `tables`) from `at` to the
    /// consecutive destination entries there, in one destination table
    /// (as the planning walk found it: no second walk when it exists).
    fn move_entries(&mut self, e: EntryMove<'a>, tables: bool, at: Pos) {
        let height = e.height;
        let dt = match e.dst {
            Dest::Table(t) => t,
            Dest::Missing(_) => match self.dest_table(at.new, height) {
                Some(t) => t,
                // Short reservation (see `take`): the entries stay.
                None => return,
            },
        };
        let src = e.slots();
        let j = index::<A>(at.new, height);
        // The run stays inside the destination table (see `run`).
        let dst = dt.slots(j, j + src.len());
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
        if tables {
            // Walk caches of the old path must go, not only leaves.
            self.gather.add_tables::<A>(VirtAddr(at.old), e.len::<A>());
        } else {
            self.gather
                .add_range::<A>(VirtAddr(at.old), e.len::<A>(), height);
        }
    }

    /// Linux `move_ptes`: moves the PTEs of the `len` bytes from `at`
    /// (inside the source PTE table `st`) to the destination.
    fn move_ptes(&mut self, st: TableRef<'a>, at: Pos, len: u64) {
        let n = (len / page_size::<A>()) as usize;
        let i = index::<A>(at.old, 0);
        let src = st.slots(i, i + n);
        // Relaxed: we hold the address space exclusively.
        let Some(first) = src.iter().position(|e| e.load(Relaxed) != 0) else {
            return;
        };
        // Only now, with something to move, take a destination table
        // (none: the reservation is short, see `take`; the entries stay).
        let Some(dt) = self.dest_table(at.new, 0) else {
            return;
        };
        // Distinct entries from `src`: the ranges do not overlap.
        let j = index::<A>(at.new, 0);
        let dst = dt.slots(j, j + n);
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
        let start = at.old + first as u64 * page_size::<A>();
        self.gather
            .add_range::<A>(VirtAddr(start), (n - first) as u64 * page_size::<A>(), 0);
    }

    /// After the move: unlinks and queues the source tables in
    /// `[va, end)` that are now empty, on the cursor; a table covered in
    /// part is judged when the cursor leaves it.
    ///
    /// Everything whose span lies inside the source range was moved, so a
    /// table covered whole is empty (its subtree holds only empty tables)
    /// and is not scanned; only the partly covered tables at the two ends of
    /// the range are. The root stays, empty or not.
    fn free_empty(&mut self, va: u64, end: u64) {
        let space = self.space;
        let mut cur = space.cursor(va, end);
        while let Some(sp) = cur.span() {
            if let Some((c, va)) = self.free_span(sp) {
                cur.descend(c, va);
                continue;
            }
            for h in cur.advance(sp.next) {
                let Some(l) = cur.left(h) else {
                    continue;
                };
                // A pinned kernel-half table is emptied, never unlinked.
                if !space.pinned(h + 1, l.va) && (l.whole() || l.is_empty()) {
                    self.unlink(l.link(), l.va, l.next, l.table.pa(), h);
                }
            }
        }
    }

    /// [`free_empty`](Self::free_empty) over `sp`: unlinks the tables it
    /// covers whole, up to the first table covered in part (or pinned):
    /// that table and its first address (`None`: the span is done).
    fn free_span(&mut self, sp: Span<'a, A>) -> Option<(TableRef<'a>, u64)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = sp;
        if height == 0 {
            return None;
        }
        for i in sp.from..sp.to {
            let next = entry_end::<A>(va, height, end);
            if let Next::Table(c) = self.space.read(t, i, height).1 {
                if !covers::<A>(va, next, height) || self.space.pinned(height, va) {
                    return Some((c, va));
                }
                self.unlink(t.slot(i), va, next, c.pa(), height - 1);
            }
            va = next;
        }
        None
    }

    /// Unlinks the source table `pa` at `height`, linked by `slot` and
    /// covering `[va, next)` of the range, and queues its subtree.
    fn unlink(&mut self, slot: &Slot, va: u64, next: u64, pa: PhysAddr, height: u32) {
        // A source-side clear; the flush orders it.
        generic::set_entry_nosync(&self.space.mmu, slot, 0);
        self.gather
            .add_tables::<A>(VirtAddr(va), next.wrapping_sub(va));
        self.space.queue_free_subtree(&mut self.q, pa, height);
    }
}
