//! The planning walk: what the move does at one position, found by one
//! walk from the root of the source (and, for whole entries, of the
//! destination).

use core::sync::atomic::Ordering::Relaxed;

use super::dry_run::DryRun;
use super::{Cursor, Mover};
use crate::aspace::table_at;
use crate::level::{entry_end, index, size};
use crate::{Arch, Decoded, Mmu, PhysAddr, Slot, Table, TableAlloc, ENTRIES_PER_TABLE};

/// Linux `enum pgt_entry`: the kinds of entries moved whole.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum PgtEntry {
    /// A PMD entry pointing at a PTE table.
    NormalPmd,
    /// A PUD entry pointing at a PMD table.
    NormalPud,
    /// A block (huge leaf) at this height, or a software entry the extent
    /// covers whole.
    Huge(u32),
}

/// What the move does at the current position.
pub(super) enum Step<'t> {
    /// Nothing is mapped in the next `len` bytes of the source.
    Skip(u64),
    /// Move `count` consecutive source entries of one kind at `height`
    /// (`slots`, in the source table `table`; both `None` for a block
    /// split in the dry run), each covering `size(height)` bytes whole at
    /// both ends, to `dst`.
    Entry {
        kind: PgtEntry,
        height: u32,
        slots: Option<&'t [Slot]>,
        table: Option<&'t Table>,
        count: usize,
        dst: Dest,
    },
    /// Split the partly covered source block `raw` at `height` (in `slot`).
    Split {
        height: u32,
        slot: Option<&'t Slot>,
        raw: u64,
    },
    /// Move the PTEs of the next `len` bytes out of the source PTE table
    /// `src` (`None`: a block split in the dry run, every entry present),
    /// linked from the PMD entry `pmd`.
    Ptes {
        len: u64,
        src: Option<PhysAddr>,
        pmd: Option<&'t Slot>,
    },
}

/// Where the destination entries of a [`Step::Entry`] go, as found by the
/// walk that checked them none: the existing destination table at the
/// step's height, or how many tables on the path to it are missing.
#[derive(Clone, Copy)]
pub(super) enum Dest {
    /// The destination table holding the entries.
    Table(PhysAddr),
    /// This many tables (the deepest at the step's height) are missing.
    Missing(u32),
}

impl<A: Arch, M: Mmu, T: TableAlloc> Mover<'_, A, M, T> {
    /// What to do at `at`. `dry` is the dry run's simulated state (`None`
    /// in the write phase, where the tables themselves are the state).
    pub(super) fn plan<'t>(&self, at: Cursor, dry: Option<&DryRun>) -> Step<'t> {
        let (old, new, rem) = (at.old, at.new, at.rem);
        let mut h = A::LEVELS - 1;
        // SAFETY: the root is a live table of ours; the frames reached from
        // it stay live until `finish` (nothing is freed before).
        let mut t: &'t Table = unsafe { table_at(&self.space.alloc, self.space.root) };
        let mut slot = Some(&t.entries[index(old, h)]);
        // Relaxed: we hold the address space exclusively; the walker's A/D
        // updates are picked up by the atomic moves below, not here.
        let mut raw = slot.map_or(0, |s| s.load(Relaxed));
        loop {
            let ext = at.extent(h);
            let whole = ext == size(h);
            let decoded = A::decode(raw, h);
            // Whole entries move as one when the destination entry is none
            // (it can hold an empty table, see `dest_lookup`); the walk
            // that checks it also finds where the entries go.
            let dst = match decoded {
                Decoded::Invalid | Decoded::Leaf(_) if whole && h > 0 => self.dest_none(new, h),
                Decoded::Table(_) if whole && self.fast.table_move(h) => self.dest_none(new, h),
                _ => None,
            };
            match decoded {
                Decoded::None => {
                    return Step::Skip(entry_end(old, h, old.wrapping_add(rem)).wrapping_sub(old));
                }
                Decoded::Invalid if h == 0 => unreachable!("PTE tables are moved as a whole"),
                Decoded::Invalid => {
                    let Some(dst) = dst else {
                        // A software entry cannot be split; leave it in
                        // place.
                        return Step::Skip(ext);
                    };
                    return Step::Entry {
                        kind: PgtEntry::Huge(h),
                        height: h,
                        slots: slot.map(core::slice::from_ref),
                        table: slot.map(|_| t),
                        count: 1,
                        dst,
                    };
                }
                Decoded::Leaf(_) if dst.is_some() => {
                    let dst = dst.expect("checked above");
                    let slots = slot.map(|_| self.run(t, at, h, false, dst));
                    return Step::Entry {
                        kind: PgtEntry::Huge(h),
                        height: h,
                        slots,
                        table: slot.map(|_| t),
                        count: slots.map_or(1, <[Slot]>::len),
                        dst,
                    };
                }
                // Partly covered, or an (empty) table in the way at the
                // destination: split, as Linux does when `move_huge_pmd`
                // fails.
                Decoded::Leaf(_) => {
                    let block = old & !(size(h) - 1);
                    if dry.is_some_and(|d| d.split[h as usize] == Some(block)) {
                        // Split in the dry run: its children are blocks (or
                        // pages) of the next size down, all present.
                        if h == 1 {
                            return Step::Ptes {
                                len: ext,
                                src: None,
                                pmd: None,
                            };
                        }
                        raw = A::split_leaf(raw, h)
                            + ((index(old, h - 1) as u64 * size(h - 1)) >> A::OA_SHIFT);
                        slot = None;
                        h -= 1;
                        continue;
                    }
                    return Step::Split {
                        height: h,
                        slot,
                        raw,
                    };
                }
                Decoded::Table(c) => {
                    if let Some(dst) = dst {
                        let kind = if h == 2 {
                            PgtEntry::NormalPud
                        } else {
                            PgtEntry::NormalPmd
                        };
                        let slots = self.run(t, at, h, true, dst);
                        return Step::Entry {
                            kind,
                            height: h,
                            slots: Some(slots),
                            table: Some(t),
                            count: slots.len(),
                            dst,
                        };
                    }
                    if h == 1 {
                        return Step::Ptes {
                            len: ext,
                            src: Some(c),
                            pmd: slot,
                        };
                    }
                    // SAFETY: a table reached from the root.
                    t = unsafe { table_at(&self.space.alloc, c) };
                    h -= 1;
                    let s = &t.entries[index(old, h)];
                    slot = Some(s);
                    // Relaxed: as above.
                    raw = s.load(Relaxed);
                }
            }
        }
    }

    /// Where the destination entry at `height` for `new` is, when it is
    /// none (or will be, in a table still to be allocated); `None` when it
    /// is not.
    fn dest_none(&self, new: u64, height: u32) -> Option<Dest> {
        match self.dest_lookup(new, height) {
            Ok(Dest::Table(pa)) => {
                // SAFETY: `dest_lookup` returns a live table of ours.
                let t = unsafe { table_at(&self.space.alloc, pa) };
                // Relaxed: we hold the address space exclusively.
                (t.entries[index(new, height)].load(Relaxed) == 0).then_some(Dest::Table(pa))
            }
            Ok(missing) => Some(missing),
            Err(()) => None,
        }
    }

    /// The existing destination table at `height` for `new`, or how many
    /// tables are missing on the path to it (every entry below is none);
    /// `Err` when a leaf or software entry is on the path (only possible
    /// before the empty-destination check).
    fn dest_lookup(&self, new: u64, height: u32) -> Result<Dest, ()> {
        let mut tpa = self.space.root;
        let mut h = A::LEVELS - 1;
        loop {
            if h == height {
                return Ok(Dest::Table(tpa));
            }
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.space.alloc, tpa) };
            // Relaxed: we hold the address space exclusively.
            match A::decode(t.entries[index(new, h)].load(Relaxed), h) {
                Decoded::None => return Ok(Dest::Missing(h - height)),
                Decoded::Table(c) => tpa = c,
                Decoded::Leaf(_) | Decoded::Invalid => return Err(()),
            }
            h -= 1;
        }
    }

    /// The run of source entries in `t` at `height` from `at` that move
    /// like the first one (tables when `tables`, blocks otherwise), each
    /// whole at both ends with a none destination entry, within one source
    /// and one destination table (`dst`, where the first one goes). Moving
    /// them in one step saves a walk from the root per entry (512 per GiB
    /// on the PMD path).
    fn run<'t>(
        &self,
        t: &'t Table,
        at: Cursor,
        height: u32,
        tables: bool,
        dst: Dest,
    ) -> &'t [Slot] {
        let (i, j) = (index(at.old, height), index(at.new, height));
        let max = (ENTRIES_PER_TABLE - i)
            .min(ENTRIES_PER_TABLE - j)
            .min((at.rem / size(height)) as usize);
        let mut k = 1;
        if max > 1 {
            let dst = match dst {
                // SAFETY: `dest_lookup` returned a live table of ours.
                Dest::Table(pa) => Some(unsafe { table_at(&self.space.alloc, pa) }),
                Dest::Missing(_) => None,
            };
            while k < max {
                // Relaxed: we hold the address space exclusively.
                let same = match A::decode(t.entries[i + k].load(Relaxed), height) {
                    Decoded::Table(_) => tables,
                    Decoded::Leaf(_) => !tables,
                    _ => false,
                };
                // Relaxed: as above.
                if !same || dst.is_some_and(|d| d.entries[j + k].load(Relaxed) != 0) {
                    break;
                }
                k += 1;
            }
        }
        &t.entries[i..i + k]
    }
}
