//! The planning: what the move does at one position of the source, in the
//! source table on the path to it (`plan_at`: the write phase's cursor
//! hands it that table; `plan` walks to it from the root for the first
//! step), with the destination found by its own short walk
//! (`AddressSpace::path_to`) for whole entries.

use super::{Fast, Pos};
use crate::contract::level::{entries, entry_end, index, size};
use crate::space::walker::{Next, Stop, TableRef};
use crate::Format;
use crate::{AddressSpace, Arch, Decoded, Mmu, PhysAddr, Slot, TableAlloc};

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

/// What the write phase does at the current position.
pub(super) enum Step<'a> {
    /// Nothing is mapped in the next `len` bytes of the source.
    Skip(u64),
    /// Move a run of whole entries.
    Entry(EntryMove<'a>),
    /// Split the partly covered source block `raw` at `height` (in `slot`).
    Split {
        height: u32,
        slot: &'a Slot,
        raw: u64,
    },
    /// Move the PTEs of the next `len` bytes out of the source PTE table
    /// `src`, linked from the PMD entry `pmd`.
    Ptes {
        len: u64,
        src: TableRef<'a>,
        pmd: &'a Slot,
    },
}

/// What [`Planner::plan_at`] finds at a position.
pub(super) enum At<'a> {
    /// The step there.
    Step(Step<'a>),
    /// The source table to go down into (the entry's table, at the next
    /// height down).
    Down(TableRef<'a>),
}

/// `count` consecutive source entries of one kind at `height`, from entry
/// `from` of the source table `table`, each covering `size(height)` bytes
/// whole at both ends, moving to `dst`.
#[derive(Clone, Copy)]
pub(super) struct EntryMove<'a> {
    pub(super) kind: PgtEntry,
    pub(super) height: u32,
    pub(super) table: TableRef<'a>,
    pub(super) from: usize,
    pub(super) count: usize,
    pub(super) dst: Dest<'a>,
}

/// Where the destination entries of an [`EntryMove`] go, as found by the
/// walk that checked them none: the existing destination table at the
/// step's height, or how many tables on the path to it are missing.
#[derive(Clone, Copy)]
pub(super) enum Dest<'a> {
    /// The destination table holding the entries.
    Table(TableRef<'a>),
    /// This many tables (the deepest at the step's height) are missing.
    Missing(u32),
}

/// An [`EntryMove`] kept by address across the `&mut` steps between the
/// check and the write phase (reserving tables, unfolding contiguous runs
/// in place), which free no table and unlink none.
pub(super) struct KeptMove {
    kind: PgtEntry,
    height: u32,
    table: PhysAddr,
    from: usize,
    count: usize,
    /// The destination table, when it exists (else the write phase links
    /// the missing ones).
    dst: Option<PhysAddr>,
    missing: u32,
}

impl<'a> EntryMove<'a> {
    /// The source entries.
    #[inline]
    pub(super) fn slots(&self) -> &'a [Slot] {
        self.table.slots(self.from, self.from + self.count)
    }

    /// Bytes the run covers.
    #[inline]
    pub(super) fn len<A: Format>(&self) -> u64 {
        self.count as u64 * size::<A>(self.height)
    }

    /// The step by address (see [`KeptMove`]).
    pub(super) fn keep(self) -> KeptMove {
        let (dst, missing) = match self.dst {
            Dest::Table(t) => (Some(t.pa()), 0),
            Dest::Missing(m) => (None, m),
        };
        KeptMove {
            kind: self.kind,
            height: self.height,
            table: self.table.pa(),
            from: self.from,
            count: self.count,
            dst,
            missing,
        }
    }
}

impl KeptMove {
    /// The step again, with its tables.
    ///
    /// # Safety
    ///
    /// `self` was planned in `space`, and no table of it has been freed
    /// since (see [`AddressSpace::table_again`]).
    pub(super) unsafe fn again<A: Arch, M: Mmu, T: TableAlloc>(
        self,
        space: &AddressSpace<A, M, T>,
    ) -> EntryMove<'_> {
        // SAFETY: tables of a `TableRef` the planning walk made, none freed
        // since (the caller's guarantee).
        let again = |pa| unsafe { space.table_again(pa) };
        EntryMove {
            kind: self.kind,
            height: self.height,
            table: again(self.table),
            from: self.from,
            count: self.count,
            dst: match self.dst {
                Some(pa) => Dest::Table(again(pa)),
                None => Dest::Missing(self.missing),
            },
        }
    }
}

/// The planning side of a move: the space, read only, and the fast paths
/// allowed.
pub(super) struct Planner<'a, A: Arch, M: Mmu, T: TableAlloc> {
    pub(super) space: &'a AddressSpace<A, M, T>,
    pub(super) fast: Fast,
}

impl<A: Arch, M: Mmu, T: TableAlloc> Clone for Planner<'_, A, M, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> Copy for Planner<'_, A, M, T> {}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Planner<'a, A, M, T> {
    /// What to do at `at`: walks the source from the root down to the
    /// first entry that is not a table the move descends into (the first
    /// step, planned before the checks; the write phase plans the rest on
    /// its cursor with [`plan_at`](Self::plan_at)).
    pub(super) fn plan(self, at: Pos) -> Step<'a> {
        let mut t = self.space.root_table();
        let mut h = A::LEVELS - 1;
        loop {
            match self.plan_at(t, h, at) {
                At::Step(step) => return step,
                At::Down(c) => {
                    t = c;
                    h -= 1;
                }
            }
        }
    }

    /// What to do at `at`, in `t`, the source table at height `h` on the
    /// path to `at.old`: a step, or the table of its entry to go down
    /// into (only above the PMD level: the PTEs under a PMD entry are one
    /// step per extent, Linux `move_ptes`).
    #[inline(always)]
    pub(super) fn plan_at(self, t: TableRef<'a>, h: u32, at: Pos) -> At<'a> {
        let i = index::<A>(at.old, h);
        let (raw, next) = self.space.read(t, i, h);
        let ext = at.extent::<A>(h);
        let whole = ext == size::<A>(h);
        // Whole entries move as one when the destination entry is none
        // (it can hold an empty table, see `dest_lookup`); the walk that
        // checks it also finds where the entries go.
        At::Step(match next {
            Next::None => {
                let end = entry_end::<A>(at.old, h, at.old.wrapping_add(at.rem));
                Step::Skip(end.wrapping_sub(at.old))
            }
            Next::Invalid => match self.whole_dest(whole, at.new, h) {
                Some(dst) => Step::Entry(EntryMove {
                    kind: PgtEntry::Huge(h),
                    height: h,
                    table: t,
                    from: i,
                    count: 1,
                    dst,
                }),
                // A software entry cannot be split; leave it in place.
                None => Step::Skip(ext),
            },
            Next::Leaf(_) => match self.whole_dest(whole, at.new, h) {
                Some(dst) => Step::Entry(self.run(t, at, h, false, dst)),
                // Partly covered, or an (empty) table in the way at the
                // destination: split, as Linux does when `move_huge_pmd`
                // fails.
                None => Step::Split {
                    height: h,
                    slot: t.slot(i),
                    raw,
                },
            },
            Next::Table(c) => {
                if let Some(dst) = self.whole_dest(whole && self.fast.table_move(h), at.new, h) {
                    Step::Entry(self.run(t, at, h, true, dst))
                } else if h == 1 {
                    Step::Ptes {
                        len: ext,
                        src: c,
                        pmd: t.slot(i),
                    }
                } else {
                    return At::Down(c);
                }
            }
        })
    }

    /// Where the destination entry at `height` for `new` is, when `whole`
    /// holds (the entry moves whole) and it is none.
    #[inline]
    pub(super) fn whole_dest(self, whole: bool, new: u64, height: u32) -> Option<Dest<'a>> {
        if whole {
            self.dest_none(new, height)
        } else {
            None
        }
    }

    /// Where the destination entry at `height` for `new` is, when it is
    /// none (or will be, in a table still to be allocated); `None` when it
    /// is not.
    fn dest_none(self, new: u64, height: u32) -> Option<Dest<'a>> {
        match self.dest_lookup(new, height) {
            Ok(Dest::Table(t)) => (t.load(index::<A>(new, height)) == 0).then_some(Dest::Table(t)),
            Ok(missing) => Some(missing),
            Err(()) => None,
        }
    }

    /// The existing destination table at `height` for `new`, or how many
    /// tables are missing on the path to it (every entry below is none);
    /// `Err` when a leaf or software entry is on the path (only possible
    /// before the empty-destination check).
    fn dest_lookup(self, new: u64, height: u32) -> Result<Dest<'a>, ()> {
        match self.space.path_to(new, height) {
            Ok(t) => Ok(Dest::Table(t)),
            Err(Stop {
                height: h,
                next: Next::None,
                ..
            }) => Ok(Dest::Missing(h - height)),
            Err(_) => Err(()),
        }
    }

    /// The run of source entries in `t` at `height` from `at` that move
    /// like the first one (tables when `tables`, blocks otherwise), each
    /// whole at both ends with a none destination entry, within one source
    /// and one destination table (`dst`, where the first one goes). Moving
    /// them in one step saves a walk from the root per entry (512 per GiB
    /// on the PMD path).
    #[inline]
    fn run(
        self,
        t: TableRef<'a>,
        at: Pos,
        height: u32,
        tables: bool,
        dst: Dest<'a>,
    ) -> EntryMove<'a> {
        let (i, j) = (index::<A>(at.old, height), index::<A>(at.new, height));
        let max = (entries::<A>() - i)
            .min(entries::<A>() - j)
            .min((at.rem / size::<A>(height)) as usize);
        let mut k = 1;
        let dt = match dst {
            Dest::Table(d) => Some(d),
            Dest::Missing(_) => None,
        };
        while k < max {
            let same = match A::decode(t.load(i + k), height) {
                Decoded::Table(_) => tables,
                Decoded::Leaf(_) => !tables,
                _ => false,
            };
            if !same || dt.is_some_and(|d| d.load(j + k) != 0) {
                break;
            }
            k += 1;
        }
        let kind = match (tables, height) {
            (true, 2) => PgtEntry::NormalPud,
            (true, _) => PgtEntry::NormalPmd,
            (false, h) => PgtEntry::Huge(h),
        };
        EntryMove {
            kind,
            height,
            table: t,
            from: i,
            count: k,
            dst,
        }
    }
}
