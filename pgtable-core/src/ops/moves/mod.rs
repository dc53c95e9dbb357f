//! `move_page_tables`: mremap for page tables (Linux `move_page_tables` with `HAVE_MOVE_PMD` / `HAVE_MOVE_PUD`).
//!
//! Moves the mappings of one virtual range to another of the same length,
//! the way Linux's `mm/mremap.c` does, in three phases so that an error
//! leaves the tables untouched:
//!
//! 1. **check** (read-only): both ranges valid, not overlapping, the
//!    destination empty; then a dry run of the move loop below that counts
//!    exactly how many tables the move will take (destination tables and
//!    splits of partly covered source blocks);
//! 2. **reserve**: allocate exactly that many tables (or fail, freeing them);
//! 3. **move**, which can no longer fail, then free the source tables that
//!    became empty, flush the TLB once for the source range and only then
//!    release the freed frames.
//!
//! The move takes every table before it frees any, so the dry run counts
//! against tables that all stay: the free pass runs after the last table
//! is taken, and it cannot free a table that the copy after the flush
//! (below) still writes.
//!
//! **One-step moves** (a PUD-aligned 1 GiB move of one PUD entry, a run of
//! PMD entries, one block): the first step is planned before the checks.
//! When it moves the whole range at once, the walk that planned it has
//! already seen every destination entry of the range none (so the
//! destination is empty, and the entry-aligned start leaves nothing to the
//! mutual-alignment rule) and knows the destination table, or how many
//! tables its path lacks. The separate empty-destination walk, the dry run
//! and the destination walk of the write are skipped; the free pass is
//! skipped too when the step's source table still holds other entries (it
//! then cannot have become empty). A 1 GiB PUD move walks each side once.
//!
//! The move loop walks by *extent*: the distance to the next entry boundary
//! at the source, at the destination, or to the end, whichever is nearest.
//! At each position it takes the coarsest step possible:
//!
//! - a hole in the source is skipped (nothing to move);
//! - a whole PUD (resp. PMD) extent whose source entry points at a table
//!   moves that one entry (`move_normal_pud` / `move_normal_pmd`), when the
//!   arch constant ([`Arch::HAVE_MOVE_PUD`] / [`Arch::HAVE_MOVE_PMD`]), the
//!   Cargo feature (`move-pud` / `move-pmd`) and the runtime
//!   [`MoveOptions`] switch all allow it and the destination entry is none:
//!   one store instead of 262,144 (resp. 512) for 1 GiB;
//! - a block (huge leaf) the extent covers whole moves as one entry; a block
//!   it covers in part is split first;
//! - otherwise the PTEs of the extent move one by one (`move_ptes`): an
//!   atomic get-and-clear at the source (so a concurrent hardware
//!   accessed/dirty update is carried over, never lost), or a plain load and
//!   clear for *settled* entries the hardware will not write again
//!   ([`Format::is_settled`](crate::Format::is_settled)); the destination is
//!   written with the nosync setter.
//!
//! **Whole PTE tables without an atomic per entry** (beyond Linux): on the
//! PTE path, a source PTE table the range covers whole (every table but the
//! two at the ends) is unlinked from its PMD entry instead of being emptied
//! entry by entry, and copied to the destination with plain loads *after*
//! the TLB flush. Until the flush a walker that cached the path may still
//! set accessed/dirty bits in it; after the flush none can reach it, so the
//! copy carries every such update, and the per-entry locked exchange (about
//! as costly as the rest of the move on x86) is not needed. The destination
//! still receives the table's entries one by one
//! ([`variants::PTES_ONLY`](crate::variants::PTES_ONLY) keeps its 262,144
//! stores per GiB). Its destination tables are linked when the
//! table is unlinked, and the copy writes into them without a walk. A table
//! whose destination tables also hold part of the source range (possible
//! only next to the ends of the range) moves entry by entry instead: such
//! a destination table may be a source table that the move empties and
//! frees.
//!
//! Destination tables get one walker barrier each (a barrier is issued when
//! the move leaves a destination table, and one at the end), not one per
//! entry (Linux "arm64: mm: Batch dsb and isb when populating pgtables").
//!
//! **Mutual alignment** (Linux "mm/mremap: optimize the start addresses in
//! move_page_tables()"): when
//! source and destination start at the same offset inside a PMD, the range
//! reaches the next PMD boundary and nothing is mapped between the
//! aligned-down starts and the starts on either side, both starts are aligned
//! down so that the first, partial PMD moves as one entry too.
//!
//! **Counters** (feature `stats`): `entries_written` counts the entries
//! stored at the destination that carry a moved mapping or table (1 for a
//! PUD-aligned 1 GiB move, 512 on the PMD path, 262,144 on the PTE path),
//! plus the entries of any block split; source clears and the links of new
//! destination tables are not counted. `tables_allocated` / `tables_freed`
//! count destination tables and freed (emptied) source tables.
//!
//! **Code map.** Both walks run on the walker's cursor over the source
//! range; the destination side of each extent is found by its own short
//! walk from the root (`path_to`, as Linux's `move_page_tables` takes
//! `get_old_pmd` / `alloc_new_pmd` per extent). The check phase is a
//! [`Planner`](plan::Planner): the space, borrowed shared, and the fast
//! paths allowed. `plan.rs` decides what to do at one position (as a
//! [`Step`](plan::Step)), `dry_run.rs` is its read-only count of the
//! tables the move takes (its own walk, no step values). The write phase
//! is a [`Mover`]: the planner, the range and the write phase's state,
//! under one shared borrow of the space from the first write to the copy
//! after the flush; `apply.rs` is the move loop, the entry moves and the
//! freeing of emptied source tables, `deferred.rs` the whole PTE tables
//! copied after the flush. Only the closing steps (freeing the queued
//! tables, returning the reservation)
//! take the space `&mut` again.

mod apply;
mod deferred;
mod dry_run;
mod plan;

use crate::contract::level::size;
use crate::space::aspace::{FreeQueue, Reservation};
use crate::Format;
use crate::{AddressSpace, Arch, Error, Mmu, TableAlloc, TlbGather, VirtAddr};

use apply::Owed;
use deferred::Deferred;
use plan::{Dest, KeptMove, Planner, Step};

/// Runtime switches of [`AddressSpace::move_page_tables`]; each fast
/// path also needs the arch constant and the core's Cargo feature.
///
/// [`MoveOptions::DEFAULT`] (also `Default::default()`) allows every fast
/// path and claims nothing; it is what
/// [`move_page_tables`](AddressSpace::move_page_tables) uses.
///
/// # `free_below`: moving the first, partial PMD as one entry
///
/// When the source and destination starts sit at the same offset inside
/// a 2 MiB (PMD) region and the move reaches the next PMD boundary, the
/// move can align both starts down to that boundary and move the first
/// partial PTE table as one PMD entry instead of entry by entry (Linux
/// "mm/mremap: optimize the start addresses in move_page_tables()"; it
/// needs whole-PMD moves: [`allows_pmd`](Self::allows_pmd) (on unless [`no_pmd`](Self::no_pmd)), the arch's
/// [`HAVE_MOVE_PMD`](crate::Arch::HAVE_MOVE_PMD) and the `move-pmd`
/// feature). This is only correct when nothing is mapped between each
/// aligned-down start and the real start. The move checks that in the
/// tables itself, so the rule applies without any claim whenever the
/// tables show the space unmapped.
///
/// Set `free_below` when the caller knows that space is free (as Linux
/// knows from the VMAs that no other mapping lies below). The move still
/// checks the tables, and a mapping found there is an error
/// ([`Error::AlreadyMapped`] with its address, nothing changed) instead of
/// a silent fallback to the slower path, so a wrong claim never moves or
/// hides a mapping outside the requested ranges.
///
/// ```
/// # #[cfg(all(feature = "alloc", feature = "move-pmd"))] {
/// use pgtable_core::{AddressSpace, Error, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};
/// use pgtable_core::contract::{Arena, NoopMmu};
/// use pgtable_core::test_format::TestFormat;
///
/// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// // 2 MiB starting 4 KiB into a PMD region, moved to the same offset.
/// let (old, new) = (VirtAddr((1 << 30) + 0x1000), VirtAddr((3 << 30) + 0x1000));
/// space.map(old, PhysAddr(0x8000_0000), 2 << 20, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
/// // A page below the source start: the claim is wrong, nothing moves.
/// let below = VirtAddr(1 << 30);
/// space.map(below, PhysAddr(0x9000_0000), 0x1000, Prot::READ_ONLY, MapOptions::PAGES).unwrap();
/// let opts = MoveOptions::DEFAULT.free_below();
/// assert_eq!(
///     space.move_page_tables(old, new, 2 << 20, opts),
///     Err(Error::AlreadyMapped(below))
/// );
/// // Without the claim the move checks the same space and takes the slower path.
/// space.move_page_tables(old, new, 2 << 20, MoveOptions::DEFAULT).unwrap();
/// assert_eq!(space.translate(new).unwrap().pa, PhysAddr(0x8000_0000));
/// assert_eq!(space.translate(below).unwrap().pa, PhysAddr(0x9000_0000));
/// # }
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MoveOptions {
    /// Allow moving whole PMD tables (one entry per 2 MiB).
    pmd: bool,
    /// Allow moving whole PUD tables (one entry per 1 GiB).
    pud: bool,
    /// The caller's claim of free space ([`MoveOptions::free_below`]).
    free_below: bool,
}

impl MoveOptions {
    /// Every fast path the build allows; no claim about free space.
    pub const DEFAULT: MoveOptions = MoveOptions {
        pmd: true,
        pud: true,
        free_below: false,
    };

    /// Whether this build of pgtable-core has the `move-pmd` feature
    /// (whole-PMD moves compiled in). Cargo unifies a crate's features over
    /// the whole build, so a dependent crate's own feature flag does not
    /// tell.
    pub const PMD_BUILT: bool = cfg!(feature = "move-pmd");

    /// The same options without whole-PMD moves (one entry per 2 MiB).
    pub const fn no_pmd(self) -> MoveOptions {
        MoveOptions { pmd: false, ..self }
    }

    /// The same options without whole-PUD moves (one entry per 1 GiB).
    pub const fn no_pud(self) -> MoveOptions {
        MoveOptions { pud: false, ..self }
    }

    /// The same options with the caller's claim that the space between
    /// each start and the PMD boundary below it (on both sides) is free,
    /// so the first partial PMD may move as one entry; a mapping found
    /// there is [`Error::AlreadyMapped`]. See [the type docs](MoveOptions)
    /// for the rule.
    pub const fn free_below(self) -> MoveOptions {
        MoveOptions {
            free_below: true,
            ..self
        }
    }

    /// Whether whole PMD tables may move (if the arch and the build allow).
    #[inline]
    pub const fn allows_pmd(self) -> bool {
        self.pmd
    }

    /// Whether whole PUD tables may move (if the arch and the build allow).
    #[inline]
    pub const fn allows_pud(self) -> bool {
        self.pud
    }

    /// Whether the caller claims the space below the starts free
    /// ([`free_below`](Self::free_below)).
    #[inline]
    pub const fn claims_free_below(self) -> bool {
        self.free_below
    }
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions::DEFAULT
    }
}

/// Which fast paths are on: arch constant AND Cargo feature AND option.
#[derive(Clone, Copy)]
pub(super) struct Fast {
    pmd: bool,
    pud: bool,
}

impl Fast {
    fn new<A: Arch>(opts: MoveOptions) -> Fast {
        Fast {
            pmd: A::HAVE_MOVE_PMD && cfg!(feature = "move-pmd") && opts.pmd,
            pud: A::HAVE_MOVE_PUD && cfg!(feature = "move-pud") && opts.pud,
        }
    }

    /// Whether a whole table at `height` may move as one entry.
    #[inline]
    pub(super) fn table_move(self, height: u32) -> bool {
        match height {
            1 => self.pmd,
            2 => self.pud,
            _ => false,
        }
    }
}

/// A position of the move loop: the source address `old`, the destination
/// address `new` and the `rem` bytes left from there.
#[derive(Clone, Copy)]
struct Pos {
    old: u64,
    new: u64,
    rem: u64,
}

impl Pos {
    /// Bytes to the nearer of the next boundaries of entries at `height`
    /// on both sides, at most `rem`.
    #[inline]
    fn extent<A: Format>(self, height: u32) -> u64 {
        let mask = size::<A>(height) - 1;
        let a = size::<A>(height) - (self.old & mask);
        let b = size::<A>(height) - (self.new & mask);
        a.min(b).min(self.rem)
    }
}

/// The whole (possibly realigned) move: source start, destination start,
/// length.
#[derive(Clone, Copy)]
struct Range {
    old: u64,
    new: u64,
    len: u64,
}

impl Range {
    /// The position at the start of the whole move.
    #[inline]
    fn start(self) -> Pos {
        Pos {
            old: self.old,
            new: self.new,
            rem: self.len,
        }
    }
}

/// The write phase of one move: the planner, the whole range, and the
/// state the writes build up. Every step of the write phase is a method
/// of it.
struct Mover<'a, A: Arch, M: Mmu, T: TableAlloc> {
    plan: Planner<'a, A, M, T>,
    space: &'a AddressSpace<A, M, T>,
    range: Range,
    /// The reserved tables.
    stash: Reservation,
    /// The source range to flush.
    gather: TlbGather,
    /// Destination tables still owed a walker barrier.
    owed: Owed,
    /// Whole PTE tables to copy after the flush.
    later: Deferred<'a>,
    /// Unlinked source tables, freed after the flush.
    q: FreeQueue,
}

/// What the write phase leaves to the closing steps, which take the space
/// `&mut`.
struct Done {
    /// The gather still to flush (empty when `flushed`).
    gather: TlbGather,
    /// The source tables to free after the flush.
    q: FreeQueue,
    /// What is left of the reservation.
    stash: Reservation,
    /// A destination write still needs its walker barrier.
    pending: bool,
    /// The write phase flushed already (to copy deferred PTE tables
    /// after the flush).
    flushed: bool,
}

/// Whether `[a, a + len)` and `[b, b + len)` intersect (`len > 0`, neither
/// range wraps past the top of the 64-bit space).
#[inline]
fn overlap(a: u64, b: u64, len: u64) -> bool {
    a <= b.wrapping_add(len - 1) && b <= a.wrapping_add(len - 1)
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Moves the mappings of `[old, old + len)` to `[new, new + len)`
    /// (Linux `move_page_tables`, the heart of mremap). Each fast path
    /// runs only when `opts`, the arch constant and the Cargo feature all
    /// allow it ([`MoveOptions::DEFAULT`]: every one the arch and the
    /// build allow), so one binary can measure every variant.
    ///
    /// With [`MoveOptions::free_below`] the caller claims the space between
    /// each start and the PMD boundary below it free, so a first partial
    /// PMD whose starts are mutually aligned moves as one entry; the claim
    /// is checked, not trusted (see [`MoveOptions`]).
    ///
    /// Every leaf keeps its output address and attributes, accessed and
    /// dirty state included; the source range translates to nothing
    /// afterwards. Holes in the source are skipped. Source tables that
    /// become empty are freed, after the one TLB flush of the source range.
    ///
    /// # Errors
    ///
    /// Zero or misaligned length, a misaligned address, either range outside
    /// the address space, overlapping ranges ([`Error::Overlap`]), anything
    /// mapped in the destination ([`Error::AlreadyMapped`] with the first
    /// such address), or [`Error::OutOfMemory`] for the destination tables.
    /// With [`MoveOptions::free_below`] also [`Error::AlreadyMapped`] when
    /// the space the caller claimed free below a start is mapped. On error
    /// nothing was changed and no table frame is kept.
    ///
    /// # Example
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let (old, new) = (VirtAddr(1 << 30), VirtAddr(3 << 30));
    /// space.map(old, PhysAddr(0x8000_0000), 4 << 20, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// space.move_page_tables(old, new, 4 << 20, MoveOptions::DEFAULT).unwrap();
    /// assert_eq!(space.translate(new.add(0x1234)).unwrap().pa, PhysAddr(0x8000_1234));
    /// assert!(space.translate(old).is_none());
    /// # }
    /// ```
    pub fn move_page_tables(
        &mut self,
        old: VirtAddr,
        new: VirtAddr,
        len: u64,
        opts: MoveOptions,
    ) -> Result<(), Error> {
        // Phase 1: check, read-only.
        self.check_range(old, len)?;
        self.check_range(new, len)?;
        if overlap(old.0, new.0, len) {
            return Err(Error::Overlap);
        }
        let fast = Fast::new::<A>(opts);
        let mut range = Range {
            old: old.0,
            new: new.0,
            len,
        };
        let planner = Planner {
            space: &*self,
            fast,
        };
        let (first, need) = planner.check(&mut range, opts.free_below)?;

        // Phase 2: reserve; the only failure left.
        let stash = self.reserve(need)?;
        self.contpte_before_move(old.0, new.0, len);

        // Phase 3: move, free the emptied source tables, flush, release.
        let planner = Planner {
            space: &*self,
            fast,
        };
        // SAFETY: `first` was planned in this space; reserving and
        // unfolding runs in place free no table.
        let first = first.map(|k| unsafe { k.again(planner.space) });
        let done = Mover::new(planner, range, stash).apply(first);
        self.end_move(done)
    }

    /// The closing steps of the write phase: the flush and the freeing of
    /// the unlinked source tables (unless the write phase flushed
    /// already), the last walker barrier, and the reservation's return.
    fn end_move(&mut self, mut done: Done) -> Result<(), Error> {
        if !done.flushed {
            let q = core::mem::replace(&mut done.q, FreeQueue::new());
            self.finish(done.gather, q);
        }
        if done.pending {
            self.table_done();
        }
        let settled = self.settle(done.stash);
        if done.flushed {
            self.finish(TlbGather::new(), done.q);
        }
        settled
    }
}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Planner<'a, A, M, T> {
    /// Phase 1 after the range checks: plans the first step and, unless it
    /// moves the whole range at once, checks the destination empty,
    /// applies the mutual-alignment rule to `range` and counts the tables
    /// the move takes. Returns that first step (kept by address) and the
    /// count.
    ///
    /// One whole-entry step covering the whole range (a 1 GiB PUD entry, a
    /// run of PMD entries, a block): its planning walk already found every
    /// destination entry of the range none, so the destination is empty,
    /// the mutual-alignment rule does not apply (the start is entry
    /// aligned) and the tables it needs are the missing ones on its
    /// destination path. Checked in one walk of each side instead of the
    /// separate check and dry run.
    fn check(
        self,
        range: &mut Range,
        free_below: bool,
    ) -> Result<(Option<KeptMove>, usize), Error> {
        if let Step::Entry(e) = self.plan(range.start()) {
            if e.len::<A>() == range.len {
                let need = match e.dst {
                    Dest::Table(_) => 0,
                    Dest::Missing(m) => m as usize,
                };
                return Ok((Some(e.keep()), need));
            }
        }
        if let Some(va) = self.space.first_mapped(range.new, range.len) {
            return Err(Error::AlreadyMapped(va));
        }
        self.realign(range, free_below)?;
        Ok((None, self.count_tables_needed(*range)))
    }

    /// The mutual-alignment rule: aligns the move's starts down to the
    /// PMD boundary when it applies. `claimed_free` is
    /// [`MoveOptions::free_below`].
    fn realign(self, range: &mut Range, claimed_free: bool) -> Result<(), Error> {
        let Range { old, new, len } = *range;
        let pmd = size::<A>(1);
        let off = old & (pmd - 1);
        if !self.fast.pmd || off == 0 || off != new & (pmd - 1) || len < pmd - off {
            return Ok(());
        }
        let (ao, an, alen) = (old - off, new - off, len + off);
        // Aligning down stays on the same side of the non-canonical hole
        // (each half starts PMD aligned), but the widened ranges must still
        // be disjoint.
        if overlap(ao, an, alen) {
            return Ok(());
        }
        match self
            .space
            .first_mapped(ao, off)
            .or_else(|| self.space.first_mapped(an, off))
        {
            None => {
                *range = Range {
                    old: ao,
                    new: an,
                    len: alen,
                };
                Ok(())
            }
            Some(va) if claimed_free => Err(Error::AlreadyMapped(va)),
            Some(_) => Ok(()),
        }
    }
}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Mover<'a, A, M, T> {
    fn new(plan: Planner<'a, A, M, T>, range: Range, stash: Reservation) -> Self {
        Mover {
            plan,
            space: plan.space,
            range,
            stash,
            gather: TlbGather::new(),
            owed: Owed::default(),
            later: Deferred::default(),
            q: FreeQueue::new(),
        }
    }
}
