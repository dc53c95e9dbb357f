//! The dry run: the move without writes, on the walker's cursor over the
//! source range, counting exactly the tables the write phase will take
//! (destination tables and block splits).
//!
//! Each source entry is judged as the write phase judges it: it moves
//! whole when it covers its whole entry and its destination starts an
//! entry of the same height that is none (a table only where the fast
//! path allows it); a table that does not move whole is descended into;
//! a block that does not move whole is split, and its children (not
//! tables yet, so not walked) are judged from their addresses.

use core::sync::atomic::Ordering::Relaxed;

use super::plan::Planner;
use super::Range;
use crate::contract::level::{entry_end, index, page_size, size};
use crate::space::aspace::covers;
use crate::space::walker::{Next, Span, TableRef};
use crate::{Arch, Mmu, TableAlloc};

/// The destination table last counted at each height (the destination
/// side is walked in address order, so one per height suffices), the
/// offset from source to destination and the count so far.
struct DryRun {
    alloc: [Option<u64>; 5],
    delta: u64,
    need: usize,
}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Planner<'a, A, M, T> {
    /// Phase 1: a dry run of the whole move `range`, counting the tables
    /// it takes.
    pub(super) fn count_tables_needed(self, range: Range) -> usize {
        let mut dry = DryRun {
            alloc: [None; 5],
            delta: range.new.wrapping_sub(range.old),
            need: 0,
        };
        let mut cur = self
            .space
            .cursor(range.old, range.old.wrapping_add(range.len));
        while let Some(sp) = cur.span() {
            match self.dry_span(sp, &mut dry) {
                Some((c, va)) => cur.descend(c, va),
                None => {
                    cur.advance(sp.next);
                }
            }
        }
        dry.need
    }

    /// The dry run over `sp` up to the first table it descends into (that
    /// table and its first address; `None`: the span is done).
    fn dry_span(self, sp: Span<'a, A>, dry: &mut DryRun) -> Option<(TableRef<'a>, u64)> {
        let Span {
            table: t,
            height: h,
            mut va,
            next: end,
            ..
        } = sp;
        if h == 0 {
            // Relaxed: we hold the address space exclusively.
            let present = |v: u64, n: usize| {
                let i = index::<A>(v, 0);
                t.slots(i, i + n).iter().any(|e| e.load(Relaxed) != 0)
            };
            self.ptes_need(va, end, present, dry);
            return None;
        }
        for i in sp.from..sp.to {
            let next = entry_end::<A>(va, h, end);
            let whole = || self.whole_at(va, next, h, dry);
            match self.space.read(t, i, h).1 {
                Next::None => {}
                // A software entry moves whole or stays in place.
                Next::Invalid => {
                    if whole() {
                        self.dest_need(va, h, dry);
                    }
                }
                Next::Leaf(_) if whole() => self.dest_need(va, h, dry),
                Next::Leaf(_) => self.split_need(va, next, h, dry),
                Next::Table(_) if self.fast.table_move(h) && whole() => self.dest_need(va, h, dry),
                Next::Table(c) => return Some((c, va)),
            }
            va = next;
        }
        None
    }

    /// Whether the source entry at `height` holding `[va, next)` moves as
    /// one entry when it is a block: it covers its whole entry, and its
    /// destination starts an entry of the same height that is none.
    #[inline]
    fn whole_at(self, va: u64, next: u64, height: u32, dry: &DryRun) -> bool {
        let new = va.wrapping_add(dry.delta);
        covers::<A>(va, next, height)
            && new & (size::<A>(height) - 1) == 0
            && self.whole_dest(true, new, height).is_some()
    }

    /// The split of the source block at `height` holding `[va, end)`: one
    /// table, then its children at the next height down, which are
    /// blocks (or pages) and all present (the `Format::split_leaf`
    /// rules), each moved whole or split in turn.
    fn split_need(self, va: u64, end: u64, height: u32, dry: &mut DryRun) {
        dry.need += 1;
        let h = height - 1;
        if h == 0 {
            self.ptes_need(va, end, |_, _| true, dry);
            return;
        }
        let mut v = va;
        while v != end {
            let next = entry_end::<A>(v, h, end);
            if self.whole_at(v, next, h, dry) {
                self.dest_need(v, h, dry);
            } else {
                self.split_need(v, next, h, dry);
            }
            v = next;
        }
    }

    /// The PTEs of the source `[va, end)` (inside one source PTE table)
    /// moved entry by entry: one destination PTE table for each part of
    /// the range inside one destination PMD entry, when `present(v, n)`
    /// says one of the `n` source entries from `v` is not none.
    fn ptes_need(self, va: u64, end: u64, present: impl Fn(u64, usize) -> bool, dry: &mut DryRun) {
        let mut v = va;
        while v != end {
            let new = v.wrapping_add(dry.delta);
            let room = size::<A>(1) - (new & (size::<A>(1) - 1));
            let part = room.min(end.wrapping_sub(v));
            if present(v, (part / page_size::<A>()) as usize) {
                self.dest_need(v, 0, dry);
            }
            v = v.wrapping_add(part);
        }
    }

    /// Counts the tables the destination path to the entry at `height`
    /// for the source address `va` still lacks, and records them.
    fn dest_need(self, va: u64, height: u32, dry: &mut DryRun) {
        let new = va.wrapping_add(dry.delta);
        let Err(stop) = self.space.path_to(new, height) else {
            return;
        };
        // The tables at heights `stop.height - 1 ..= height` are missing,
        // unless an earlier step of the dry run counted them.
        for k in (height..stop.height).rev() {
            let span = new & !(size::<A>(k + 1) - 1);
            if dry.alloc[k as usize] != Some(span) {
                dry.alloc[k as usize] = Some(span);
                dry.need += 1;
            }
        }
    }
}
