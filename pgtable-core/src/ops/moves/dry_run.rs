//! The dry run: the move loop without writes, counting exactly the tables
//! the write phase will take (destination tables and block splits).

use core::sync::atomic::Ordering::Relaxed;

use super::plan::{Planner, Step};
use super::Pos;
use crate::contract::level::{index, size};
use crate::{Arch, Mmu, TableAlloc, PAGE_SIZE};

/// State the dry run simulates instead of writing it: the source block
/// being split at each height, and the destination table last allocated at
/// each height (both walks are monotone, so one of each per height
/// suffices).
#[derive(Default)]
struct DryRun {
    split: [Option<u64>; 5],
    alloc: [Option<u64>; 5],
}

/// What the write phase would do at a position, as far as the count of
/// tables it takes goes.
enum DryStep {
    /// Nothing to move in the next `len` bytes.
    Skip(u64),
    /// A run of `count` whole entries at `height`.
    Entry { height: u32, count: usize },
    /// A split of the source block at `height`.
    Split { height: u32 },
    /// The PTEs of the next `len` bytes; `present` when any is not none
    /// (only then does the write phase take a destination table).
    Ptes { len: u64, present: bool },
}

/// The first address of the entry at `height` that covers `va`.
#[inline]
fn entry_start(va: u64, height: u32) -> u64 {
    va & !(size(height) - 1)
}

impl<A: Arch, M: Mmu, T: TableAlloc> Planner<'_, A, M, T> {
    /// Phase 1: a dry run of the move loop over the whole move from
    /// `start`, counting the tables it takes.
    pub(super) fn count_tables_needed(self, start: Pos) -> usize {
        let mut dry = DryRun::default();
        let mut need = 0;
        let mut at = start;
        while at.rem > 0 {
            let step = match self.plan_dry(at, &dry) {
                DryStep::Skip(l) => l,
                DryStep::Entry { height, count } => {
                    // One destination table holds the whole run.
                    need += self.dest_need(at.new, height, &mut dry);
                    count as u64 * size(height)
                }
                DryStep::Split { height } => {
                    need += 1;
                    dry.split[height as usize] = Some(entry_start(at.old, height));
                    0
                }
                DryStep::Ptes { len, present } => {
                    if present {
                        need += self.dest_need(at.new, 0, &mut dry);
                    }
                    len
                }
            };
            at.advance(step);
        }
        need
    }

    /// The planning walk at `at` over the tables as the dry run has
    /// changed them so far: a block it split is seen as its children.
    fn plan_dry(self, at: Pos, dry: &DryRun) -> DryStep {
        match self.plan(at) {
            Step::Skip(l) => DryStep::Skip(l),
            Step::Entry(e) => DryStep::Entry {
                height: e.height,
                count: e.count,
            },
            Step::Split { height, .. }
                if dry.split[height as usize] == Some(entry_start(at.old, height)) =>
            {
                self.split_children(at, height, dry)
            }
            Step::Split { height, .. } => DryStep::Split { height },
            Step::Ptes { len, src, .. } => {
                let i = index(at.old, 0);
                let k = (len / PAGE_SIZE) as usize;
                DryStep::Ptes {
                    len,
                    // Relaxed: we hold the address space exclusively.
                    present: src.slots(i, i + k).iter().any(|e| e.load(Relaxed) != 0),
                }
            }
        }
    }

    /// The step at `at` inside the block at `height` that the dry run has
    /// split: its children are blocks (or pages) of the next size down,
    /// all present (a split gives leaves of the next size, by the
    /// `Format::split_leaf` rules).
    fn split_children(self, at: Pos, height: u32, dry: &DryRun) -> DryStep {
        let mut h = height;
        loop {
            if h == 1 {
                return DryStep::Ptes {
                    len: at.extent(1),
                    present: true,
                };
            }
            h -= 1;
            if self
                .whole_dest(at.extent(h) == size(h), at.new, h)
                .is_some()
            {
                return DryStep::Entry {
                    height: h,
                    count: 1,
                };
            }
            if dry.split[h as usize] != Some(entry_start(at.old, h)) {
                return DryStep::Split { height: h };
            }
        }
    }

    /// Tables the destination path to the entry at `height` for `new`
    /// still lacks; records them as allocated.
    fn dest_need(self, new: u64, height: u32, dry: &mut DryRun) -> usize {
        let Err(stop) = self.space.path_to(new, height) else {
            return 0;
        };
        // The tables at heights `stop.height - 1 ..= height` are missing,
        // unless an earlier step of the dry run allocated them.
        let mut need = 0;
        for k in (height..stop.height).rev() {
            let span = new & !(size(k + 1) - 1);
            if dry.alloc[k as usize] != Some(span) {
                dry.alloc[k as usize] = Some(span);
                need += 1;
            }
        }
        need
    }
}
