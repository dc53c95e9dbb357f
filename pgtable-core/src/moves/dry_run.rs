//! The dry run: the move loop without writes, counting exactly the tables
//! the write phase will take (destination tables and block splits).

use core::sync::atomic::Ordering::Relaxed;

use super::plan::Step;
use super::Mover;
use crate::aspace::table_at;
use crate::level::{index, size};
use crate::{Arch, Decoded, Mmu, TableAlloc, PAGE_SIZE};

/// State the dry run simulates instead of writing it: the source block
/// being split at each height, and the destination table last allocated at
/// each height (both walks are monotone, so one of each per height
/// suffices).
#[derive(Default)]
pub(super) struct DryRun {
    pub(super) split: [Option<u64>; 5],
    alloc: [Option<u64>; 5],
}

impl<A: Arch, M: Mmu, T: TableAlloc> Mover<'_, A, M, T> {
    /// Phase 1: a dry run of the move loop over the whole move, counting
    /// the tables it takes.
    pub(super) fn count_tables_needed(&self) -> usize {
        let mut dry = DryRun::default();
        let mut need = 0;
        let mut at = self.start();
        while at.rem > 0 {
            let step = match self.plan(at, Some(&dry)) {
                Step::Skip(l) => l,
                Step::Entry { height, count, .. } => {
                    // One destination table holds the whole run.
                    need += self.dest_need(at.new, height, &mut dry);
                    count as u64 * size(height)
                }
                Step::Split { height, .. } => {
                    need += 1;
                    dry.split[height as usize] = Some(at.old & !(size(height) - 1));
                    0
                }
                Step::Ptes { len, src, .. } => {
                    let present = src.is_none_or(|c| {
                        // SAFETY: a table reached from the root.
                        let t = unsafe { table_at(&self.space.alloc, c) };
                        let i = index(at.old, 0);
                        let k = (len / PAGE_SIZE) as usize;
                        // Relaxed: we hold the address space exclusively.
                        t.entries[i..i + k].iter().any(|e| e.load(Relaxed) != 0)
                    });
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

    /// Tables the destination path to the entry at `height` for `new`
    /// still lacks; records them as allocated.
    fn dest_need(&self, new: u64, height: u32, dry: &mut DryRun) -> usize {
        let mut tpa = self.space.root;
        let mut h = A::LEVELS - 1;
        while h > height {
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.space.alloc, tpa) };
            // Relaxed: we hold the address space exclusively.
            match A::decode(t.entries[index(new, h)].load(Relaxed), h) {
                Decoded::Table(c) => tpa = c,
                _ => {
                    // The tables at heights h-1 ..= height are missing,
                    // unless an earlier step of the dry run allocated them.
                    let mut need = 0;
                    for k in (height..h).rev() {
                        let span = new & !(size(k + 1) - 1);
                        if dry.alloc[k as usize] != Some(span) {
                            dry.alloc[k as usize] = Some(span);
                            need += 1;
                        }
                    }
                    return need;
                }
            }
            h -= 1;
        }
        0
    }
}
