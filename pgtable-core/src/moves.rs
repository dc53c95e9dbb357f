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
//! still receives the table's entries one by one (the control variant keeps
//! its 262,144 stores per GiB). Its destination tables are linked when the
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
//! **Mutual alignment** (beyond the seeds; Linux's later mremap rule): when
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

use core::sync::atomic::Ordering::Relaxed;

use crate::aspace::{covers, first_used, table_at, FreeQueue, Stash};
use crate::level::{entry_end, index, size};
use crate::{
    generic, AddressSpace, Arch, Decoded, Error, Mmu, PhysAddr, Slot, TableAlloc, TlbGather,
    VirtAddr, ENTRIES_PER_TABLE, PAGE_SIZE,
};

/// Runtime switches of [`AddressSpace::move_page_tables_with`]; each fast
/// path also needs the arch constant and the core's Cargo feature.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MoveOptions {
    /// Allow moving whole PMD tables (one entry per 2 MiB).
    pub pmd: bool,
    /// Allow moving whole PUD tables (one entry per 1 GiB).
    pub pud: bool,
    /// The caller states that the space below both aligned-down starts
    /// (down to the PMD boundary) is free, enabling the mutual-alignment
    /// rule.
    ///
    /// The rule is also taken without this claim whenever the tables show
    /// that space unmapped. With the claim, the tables are checked all the
    /// same, and a mapping found there is reported as
    /// [`Error::AlreadyMapped`] (the claim was wrong), so a wrong claim can
    /// never move or hide a mapping outside the requested ranges.
    pub free_below: bool,
}

impl MoveOptions {
    /// Every fast path the build allows; no claim about free space.
    pub const DEFAULT: MoveOptions = MoveOptions {
        pmd: true,
        pud: true,
        free_below: false,
    };

    /// Only the PTE-by-PTE path (the control variant of the seeds).
    pub const PTES_ONLY: MoveOptions = MoveOptions {
        pmd: false,
        pud: false,
        free_below: false,
    };

    /// Whole-PMD moves but no whole-PUD moves (arm64 before Linux "arm64: mremap speedup -
    /// Enable HAVE_MOVE_PUD").
    pub const PMD_ONLY: MoveOptions = MoveOptions {
        pmd: true,
        pud: false,
        free_below: false,
    };
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions::DEFAULT
    }
}

/// Which fast paths are on: arch constant AND Cargo feature AND option.
#[derive(Clone, Copy)]
struct Fast {
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
    fn table_move(self, height: u32) -> bool {
        match height {
            1 => self.pmd,
            2 => self.pud,
            _ => false,
        }
    }
}

/// Linux `enum pgt_entry`: the kinds of entries moved whole.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PgtEntry {
    /// A PMD entry pointing at a PTE table.
    NormalPmd,
    /// A PUD entry pointing at a PMD table.
    NormalPud,
    /// A block (huge leaf) at this height, or a software entry the extent
    /// covers whole.
    Huge(u32),
}

/// What the move does at the current position.
enum Step<'t> {
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
        table: Option<&'t crate::Table>,
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
enum Dest {
    /// The destination table holding the entries.
    Table(PhysAddr),
    /// This many tables (the deepest at the step's height) are missing.
    Missing(u32),
}

/// State the dry run simulates instead of writing it: the source block
/// being split at each height, and the destination table last allocated at
/// each height (both walks are monotone, so one of each per height
/// suffices).
#[derive(Default)]
struct DryRun {
    split: [Option<u64>; 5],
    alloc: [Option<u64>; 5],
}

/// Destination tables written since the last walker barrier, by height.
/// Leaving a table for another one at the same height issues the barrier
/// (it covers every earlier write), so each destination table gets one.
#[derive(Default)]
struct Owed {
    table: [Option<PhysAddr>; 5],
    /// Some destination write still needs a barrier (also writes that
    /// are not tracked by table, see `defer_ptes`).
    pending: bool,
}

/// Source PTE tables unlinked whole during the move, to be copied after
/// the flush: a list in address order. The first [`DEFER_HEAD`] entries of
/// each table moved before it was unlinked; their slots hold its record:
/// the next table of the list, the table's source address, and the
/// destination PTE tables of its two halves (see [`first_half`]; 0 when
/// that half is empty). All of these have their low 12 bits clear, so a
/// walker that still reaches the table sees them as invalid entries and
/// never writes them.
#[derive(Default)]
struct Deferred {
    head: u64,
    tail: u64,
    count: usize,
}

/// Entries of a deferred PTE table that move before it is unlinked, to
/// make room for its [`Deferred`] record.
const DEFER_HEAD: usize = 4;

/// How many entries of a whole PTE table moving to `new` land in the first
/// destination PTE table (all 512 when `new` is PMD aligned).
#[inline]
fn first_half(new: u64) -> usize {
    ((size(1) - (new & (size(1) - 1))) / PAGE_SIZE) as usize
}

/// Whether the destination PTE tables of a whole source PTE table moving
/// to `new` (the one or two tables holding `[new, new + 2 MiB)`) also hold
/// part of the source range `[old, old + len)`. Such a table can be a
/// partly covered source table that the move empties before the deferred
/// copy would fill it, so that table moves entry by entry instead (only
/// tables next to the ends of the source range can be affected).
#[inline]
fn dest_meets_source(new: u64, old: u64, len: u64) -> bool {
    let first = new & !(size(1) - 1);
    // `[new, new + 2 MiB)` lies in the destination range, so this does
    // not wrap.
    let last = (new + (size(1) - 1)) | (size(1) - 1);
    first <= old.wrapping_add(len - 1) && old <= last
}

/// Bytes from `old` (and `new`) to the nearer of the next boundaries of
/// entries at `height` on both sides, at most `rem`.
#[inline]
fn extent(old: u64, new: u64, rem: u64, height: u32) -> u64 {
    let mask = size(height) - 1;
    let a = size(height) - (old & mask);
    let b = size(height) - (new & mask);
    a.min(b).min(rem)
}

/// Whether `[a, a + len)` and `[b, b + len)` intersect (`len > 0`, neither
/// range wraps past the top of the 64-bit space).
#[inline]
fn overlap(a: u64, b: u64, len: u64) -> bool {
    a <= b.wrapping_add(len - 1) && b <= a.wrapping_add(len - 1)
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Moves the mappings of `[old, old + len)` to `[new, new + len)`, with
    /// every fast path the arch and the build allow
    /// ([`MoveOptions::DEFAULT`]).
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
    /// On error nothing was changed and no table frame is kept.
    ///
    /// # Example
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, Arena, MapOptions, NoopMmu, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let (old, new) = (VirtAddr(1 << 30), VirtAddr(3 << 30));
    /// space.map(old, PhysAddr(0x8000_0000), 4 << 20, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// space.move_page_tables(old, new, 4 << 20).unwrap();
    /// assert_eq!(space.translate(new.add(0x1234)).unwrap().pa, PhysAddr(0x8000_1234));
    /// assert!(space.translate(old).is_none());
    /// # }
    /// ```
    pub fn move_page_tables(
        &mut self,
        old: VirtAddr,
        new: VirtAddr,
        len: u64,
    ) -> Result<(), Error> {
        self.move_page_tables_with(old, new, len, MoveOptions::DEFAULT)
    }

    /// [`move_page_tables`](Self::move_page_tables) with runtime switches:
    /// each fast path runs only when `opts`, the arch constant and the Cargo
    /// feature all allow it, so one binary can measure every variant.
    ///
    /// # Errors
    ///
    /// As [`move_page_tables`](Self::move_page_tables); with
    /// [`MoveOptions::free_below`] also [`Error::AlreadyMapped`] when the
    /// space the caller claimed free below a start is mapped.
    pub fn move_page_tables_with(
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
        // One whole-entry step covering the whole range (a 1 GiB PUD
        // entry, a run of PMD entries, a block): its planning walk already
        // found every destination entry of the range none, so the
        // destination is empty, the mutual-alignment rule does not apply
        // (the start is entry aligned) and the tables it needs are the
        // missing ones on its destination path. Checked in one walk of
        // each side instead of the separate check and dry run below.
        let mut first = match self.plan(old.0, new.0, len, fast, None) {
            step @ Step::Entry { height, count, .. } if count as u64 * size(height) == len => {
                Some(step)
            }
            _ => None,
        };
        // The source table of that step, if the move may leave it empty.
        let mut single = None;
        let (old, new, len, need) = match first {
            Some(Step::Entry {
                dst,
                table,
                height,
                count,
                ..
            }) => {
                single = table.map(|t| (t, height, count));
                let need = match dst {
                    Dest::Table(_) => 0,
                    Dest::Missing(m) => m as usize,
                };
                (old.0, new.0, len, need)
            }
            _ => {
                if let Some(va) = self.first_mapped(new.0, len) {
                    return Err(Error::AlreadyMapped(va));
                }
                let (old, new, len) = self.realign(old.0, new.0, len, fast, opts.free_below)?;
                (old, new, len, self.count_tables_needed(old, new, len, fast))
            }
        };

        // Phase 2: reserve; the only failure left.
        let mut stash = self.reserve(need)?;
        self.contpte_before_move(old, new, len);

        // Phase 3: move, free the emptied source tables, flush, release.
        let mut gather = TlbGather::new();
        let mut q = FreeQueue::new();
        let mut owed = Owed::default();
        let mut later = Deferred::default();
        let (mut o, mut n, mut rem) = (old, new, len);
        while rem > 0 {
            // The shortcut's step is still current: reserving tables does
            // not change the tables. `plan(.., None)` fills every `Option`
            // of a step (only the dry run's simulated splits leave them
            // `None`), so the `expect`s below cannot fire.
            let step = match first
                .take()
                .unwrap_or_else(|| self.plan(o, n, rem, fast, None))
            {
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
                    self.move_pgt_entry(kind, slots, o, n, dst, &mut stash, &mut gather, &mut owed);
                    count as u64 * size(height)
                }
                Step::Split { height, slot, raw } => {
                    let slot = slot.expect("a real source block");
                    self.split_block(slot, raw, VirtAddr(o), height, &mut stash, &mut gather);
                    0
                }
                Step::Ptes {
                    len: part,
                    src,
                    pmd,
                } => {
                    let src = src.expect("a real source table");
                    if o & (size(1) - 1) == 0 && rem >= size(1) && !dest_meets_source(n, old, len) {
                        // The whole PTE table moves: unlink it now and
                        // copy it after the flush (see `defer_ptes`).
                        let pmd = pmd.expect("a real PMD entry");
                        self.defer_ptes(
                            src,
                            pmd,
                            o,
                            n,
                            &mut stash,
                            &mut gather,
                            &mut owed,
                            &mut later,
                        );
                        size(1)
                    } else {
                        self.move_ptes(src, o, n, part, &mut stash, &mut gather, &mut owed);
                        part
                    }
                }
            };
            if stash.short {
                // The count was short (see `take`): the step changed
                // nothing; stop here and keep what is left at the source.
                break;
            }
            o = o.wrapping_add(step);
            n = n.wrapping_add(step);
            rem -= step;
        }
        // After a single step, the moved entries were the only ones of the
        // range, and they are none now: only their source table (then its
        // ancestors) can have become empty, and only if it is not the root
        // and holds no other entry. Otherwise there is nothing to free and
        // no need to walk the range again. (A whole table moved out is
        // empty: `free_empty` frees it without a scan.) After a short
        // count nothing is freed: entries that did not move may sit in
        // tables `free_empty` takes to be empty.
        let nothing_to_free = stash.short
            || single.is_some_and(|(t, height, count): (&crate::Table, u32, usize)| {
                height == A::LEVELS - 1
                    || (count < ENTRIES_PER_TABLE
                        // Relaxed: we hold the address space exclusively.
                        && t.entries.iter().any(|e| e.load(Relaxed) != 0))
            });
        if !nothing_to_free {
            self.free_empty(
                A::LEVELS - 1,
                self.root,
                old,
                old.wrapping_add(len),
                &mut gather,
                &mut q,
            );
        }
        // The one TLB flush. Unlinked tables are freed only after it, and
        // the deferred PTE tables are copied only after it: from then on no
        // walker can reach them to set an accessed or dirty bit. Without
        // deferred tables, one `finish` flushes and frees. The copy takes
        // no table and walks nothing: `defer_ptes` linked its destination
        // tables and recorded them, and `free_empty` above cannot have
        // freed them (see `defer_ptes`).
        let q = if later.count == 0 {
            self.finish(gather, q);
            None
        } else {
            self.finish(gather, FreeQueue::new());
            self.copy_deferred(later, new.wrapping_sub(old), &mut owed, &mut q);
            Some(q)
        };
        if owed.pending {
            self.table_done();
        }
        debug_assert_eq!(stash.count, 0, "table reservation over-counted");
        let short = stash.short;
        self.release(stash);
        if let Some(q) = q {
            self.finish(TlbGather::new(), q);
        }
        if short {
            return Err(Error::OutOfMemory);
        }
        Ok(())
    }

    /// The first address in `[va, va + len)` that something is mapped at
    /// (a leaf, or a software entry the walker does not decode).
    fn first_mapped(&self, va: u64, len: u64) -> Option<VirtAddr> {
        self.first_mapped_in(A::LEVELS - 1, self.root, va, va.wrapping_add(len))
    }

    pub(crate) fn first_mapped_in(
        &self,
        height: u32,
        tpa: PhysAddr,
        mut va: u64,
        end: u64,
    ) -> Option<VirtAddr> {
        // SAFETY: the root or a table reached from it; nothing is freed
        // while this shared borrow of the address space lasts.
        let t = unsafe { table_at(&self.alloc, tpa) };
        if height == 0 {
            return first_used(t, 0, va, end);
        }
        loop {
            let next = entry_end(va, height, end);
            // Relaxed: we hold the address space exclusively.
            let raw = t.entries[index(va, height)].load(Relaxed);
            match A::decode(raw, height) {
                Decoded::None => {}
                Decoded::Table(c) => {
                    if let Some(hit) = self.first_mapped_in(height - 1, c, va, next) {
                        return Some(hit);
                    }
                }
                Decoded::Leaf(_) | Decoded::Invalid => return Some(VirtAddr(va)),
            }
            va = next;
            if va == end {
                return None;
            }
        }
    }

    /// The mutual-alignment rule: returns the (possibly aligned-down)
    /// `(old, new, len)` to move.
    fn realign(
        &self,
        old: u64,
        new: u64,
        len: u64,
        fast: Fast,
        claimed_free: bool,
    ) -> Result<(u64, u64, u64), Error> {
        let pmd = size(1);
        let off = old & (pmd - 1);
        let unchanged = Ok((old, new, len));
        if !fast.pmd || off == 0 || off != new & (pmd - 1) || len < pmd - off {
            return unchanged;
        }
        let (ao, an, alen) = (old - off, new - off, len + off);
        // Aligning down stays on the same side of the non-canonical hole
        // (each half starts PMD aligned), but the widened ranges must still
        // be disjoint.
        if overlap(ao, an, alen) {
            return unchanged;
        }
        match self
            .first_mapped(ao, off)
            .or_else(|| self.first_mapped(an, off))
        {
            None => Ok((ao, an, alen)),
            Some(va) if claimed_free => Err(Error::AlreadyMapped(va)),
            Some(_) => unchanged,
        }
    }

    /// Phase 1: a dry run of the move loop, counting the tables it takes.
    fn count_tables_needed(&self, old: u64, new: u64, len: u64, fast: Fast) -> usize {
        let mut dry = DryRun::default();
        let mut need = 0;
        let (mut o, mut n, mut rem) = (old, new, len);
        while rem > 0 {
            let step = match self.plan(o, n, rem, fast, Some(&dry)) {
                Step::Skip(l) => l,
                Step::Entry { height, count, .. } => {
                    // One destination table holds the whole run.
                    need += self.dest_need(n, height, &mut dry);
                    count as u64 * size(height)
                }
                Step::Split { height, .. } => {
                    need += 1;
                    dry.split[height as usize] = Some(o & !(size(height) - 1));
                    0
                }
                Step::Ptes { len, src, .. } => {
                    let present = src.is_none_or(|c| {
                        // SAFETY: a table reached from the root.
                        let t = unsafe { table_at(&self.alloc, c) };
                        let i = index(o, 0);
                        let k = (len / PAGE_SIZE) as usize;
                        // Relaxed: we hold the address space exclusively.
                        t.entries[i..i + k].iter().any(|e| e.load(Relaxed) != 0)
                    });
                    if present {
                        need += self.dest_need(n, 0, &mut dry);
                    }
                    len
                }
            };
            o = o.wrapping_add(step);
            n = n.wrapping_add(step);
            rem -= step;
        }
        need
    }

    /// What to do at source `old` / destination `new` with `rem` bytes left.
    /// `dry` is the dry run's simulated state (`None` in the write phase,
    /// where the tables themselves are the state).
    fn plan<'t>(&self, old: u64, new: u64, rem: u64, fast: Fast, dry: Option<&DryRun>) -> Step<'t> {
        let mut h = A::LEVELS - 1;
        // SAFETY: the root is a live table of ours; the frames reached from
        // it stay live until `finish` (nothing is freed before).
        let mut t: &'t crate::Table = unsafe { table_at(&self.alloc, self.root) };
        let mut slot = Some(&t.entries[index(old, h)]);
        // Relaxed: we hold the address space exclusively; the walker's A/D
        // updates are picked up by the atomic moves below, not here.
        let mut raw = slot.map_or(0, |s| s.load(Relaxed));
        loop {
            let ext = extent(old, new, rem, h);
            let whole = ext == size(h);
            let decoded = A::decode(raw, h);
            // Whole entries move as one when the destination entry is none
            // (it can hold an empty table, see `dest_lookup`); the walk
            // that checks it also finds where the entries go.
            let dst = match decoded {
                Decoded::Invalid | Decoded::Leaf(_) if whole && h > 0 => self.dest_none(new, h),
                Decoded::Table(_) if whole && fast.table_move(h) => self.dest_none(new, h),
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
                    let slots = slot.map(|_| self.run(t, old, new, rem, h, false, dst));
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
                        raw = A::split_leaf(raw, h) + index(old, h - 1) as u64 * size(h - 1);
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
                        let slots = self.run(t, old, new, rem, h, true, dst);
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
                    t = unsafe { table_at(&self.alloc, c) };
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
                let t = unsafe { table_at(&self.alloc, pa) };
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
        let mut tpa = self.root;
        let mut h = A::LEVELS - 1;
        loop {
            if h == height {
                return Ok(Dest::Table(tpa));
            }
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.alloc, tpa) };
            // Relaxed: we hold the address space exclusively.
            match A::decode(t.entries[index(new, h)].load(Relaxed), h) {
                Decoded::None => return Ok(Dest::Missing(h - height)),
                Decoded::Table(c) => tpa = c,
                Decoded::Leaf(_) | Decoded::Invalid => return Err(()),
            }
            h -= 1;
        }
    }

    /// The run of source entries in `t` at `height` from `old` that move
    /// like the first one (tables when `tables`, blocks otherwise), each
    /// whole at both ends with a none destination entry, within one source
    /// and one destination table (`dst`, where the first one goes). Moving
    /// them in one step saves a walk from the root per entry (512 per GiB
    /// on the PMD path).
    #[allow(clippy::too_many_arguments)]
    fn run<'t>(
        &self,
        t: &'t crate::Table,
        old: u64,
        new: u64,
        rem: u64,
        height: u32,
        tables: bool,
        dst: Dest,
    ) -> &'t [Slot] {
        let (i, j) = (index(old, height), index(new, height));
        let max = (ENTRIES_PER_TABLE - i)
            .min(ENTRIES_PER_TABLE - j)
            .min((rem / size(height)) as usize);
        let mut k = 1;
        if max > 1 {
            let dst = match dst {
                // SAFETY: `dest_lookup` returned a live table of ours.
                Dest::Table(pa) => Some(unsafe { table_at(&self.alloc, pa) }),
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

    /// Dry run: tables the destination path to the entry at `height` for
    /// `new` still lacks; records them as allocated.
    fn dest_need(&self, new: u64, height: u32, dry: &mut DryRun) -> usize {
        let mut tpa = self.root;
        let mut h = A::LEVELS - 1;
        while h > height {
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.alloc, tpa) };
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

    /// The destination table at `height` (the one holding entries of that
    /// height) for `new`, allocating and linking the missing tables on the
    /// way from the reservation (Linux `alloc_new_pmd` / `alloc_new_pud`).
    /// `None` only when the reservation is short (see `take`); the tables
    /// linked until then stay, empty.
    fn dest_table(
        &mut self,
        new: u64,
        height: u32,
        stash: &mut Stash,
        owed: &mut Owed,
    ) -> Option<PhysAddr> {
        let mut tpa = self.root;
        let mut h = A::LEVELS - 1;
        while h > height {
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.alloc, tpa) };
            let slot = &t.entries[index(new, h)];
            // Relaxed: we hold the address space exclusively.
            match A::decode(slot.load(Relaxed), h) {
                Decoded::Table(c) => tpa = c,
                _ => {
                    // Checked empty: this is `None`. Link a zeroed table
                    // (populate publishes its zeroing first); the barrier
                    // of this table covers the link.
                    let c = self.take(stash)?;
                    A::populate_attrs(&self.mmu, slot, c, h, self.table_attrs);
                    self.wrote(owed, h, tpa);
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
    fn wrote(&mut self, owed: &mut Owed, height: u32, tpa: PhysAddr) {
        let cur = &mut owed.table[height as usize];
        if *cur == Some(tpa) {
            return;
        }
        if cur.is_some() {
            // One barrier makes every earlier write visible.
            self.table_done();
            owed.table = [None; 5];
        }
        owed.table[height as usize] = Some(tpa);
        owed.pending = true;
    }

    /// Linux `move_pgt_entry`: moves the source entries `src` (a run of
    /// one kind, see [`run`](Self::run)) to the destination.
    #[allow(clippy::too_many_arguments)]
    fn move_pgt_entry(
        &mut self,
        kind: PgtEntry,
        src: &[Slot],
        old: u64,
        new: u64,
        dst: Dest,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
    ) {
        match kind {
            PgtEntry::NormalPud => self.move_normal_pud(src, old, new, dst, stash, gather, owed),
            PgtEntry::NormalPmd => self.move_normal_pmd(src, old, new, dst, stash, gather, owed),
            PgtEntry::Huge(h) => self.move_huge(h, src, old, new, dst, stash, gather, owed),
        }
    }

    /// Moves PUD entries that point at whole PMD tables: one entry per
    /// 1 GiB (Linux "mm: Speed up mremap on large regions").
    #[allow(clippy::too_many_arguments)]
    fn move_normal_pud(
        &mut self,
        src: &[Slot],
        old: u64,
        new: u64,
        dst: Dest,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
    ) {
        self.move_entries(2, true, src, old, new, dst, stash, gather, owed);
    }

    /// Moves PMD entries that point at whole PTE tables: one entry per
    /// 2 MiB.
    #[allow(clippy::too_many_arguments)]
    fn move_normal_pmd(
        &mut self,
        src: &[Slot],
        old: u64,
        new: u64,
        dst: Dest,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
    ) {
        self.move_entries(1, true, src, old, new, dst, stash, gather, owed);
    }

    /// Moves blocks (huge leaves) at `height`, one entry each (Linux
    /// `move_huge_pmd` / `move_huge_pud`).
    #[allow(clippy::too_many_arguments)]
    fn move_huge(
        &mut self,
        height: u32,
        src: &[Slot],
        old: u64,
        new: u64,
        dst: Dest,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
    ) {
        self.move_entries(height, false, src, old, new, dst, stash, gather, owed);
    }

    /// Moves the entries `src` at `height` (tables when `tables`) to the
    /// consecutive destination entries from `new`, in one destination
    /// table (`dst`, as the planning walk found it: no second walk when it
    /// exists).
    #[allow(clippy::too_many_arguments)]
    fn move_entries(
        &mut self,
        height: u32,
        tables: bool,
        src: &[Slot],
        old: u64,
        new: u64,
        dst: Dest,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
    ) {
        let dt = match dst {
            Dest::Table(pa) => pa,
            Dest::Missing(_) => match self.dest_table(new, height, stash, owed) {
                Some(pa) => pa,
                // Short reservation (see `take`): the entries stay.
                None => return,
            },
        };
        // SAFETY: `dst` / `dest_table` is a live table of ours; the run
        // stays inside it.
        let dst = unsafe { &table_at(&self.alloc, dt).entries[index(new, height)..][..src.len()] };
        if tables {
            // Linux relinks a moved table with `pmd_populate` /
            // `pud_populate`: its contents, written by earlier operations,
            // are published before the link at the new place.
            self.mmu.publish_barrier();
        }
        for (s, d) in src.iter().zip(dst) {
            // An atomic exchange: a block's accessed/dirty state, and the
            // accessed bit x86 sets in table entries too, must not be lost
            // between the read and the clear.
            let raw = if tables {
                generic::get_and_clear(&self.mmu, s)
            } else {
                A::pmdp_huge_get_and_clear(&self.mmu, s)
            };
            // The nosync half of `set_pud_at` / `set_pmd_at`; the barrier
            // is this destination table's, issued by `wrote` or at the end.
            A::set_pte_nosync(&self.mmu, d, raw);
        }
        self.wrote(owed, height, dt);
        self.mmu.stats.add_entries_written(src.len() as u64);
        let len = src.len() as u64 * size(height);
        if tables {
            // Walk caches of the old path must go, not only leaves.
            gather.add_tables(VirtAddr(old), len);
        } else {
            gather.add_range(VirtAddr(old), len, height);
        }
    }

    /// Linux `move_ptes`: moves the PTEs of `[old, old + len)` (inside the
    /// source PTE table `src`) to `[new, new + len)`.
    #[allow(clippy::too_many_arguments)]
    fn move_ptes(
        &mut self,
        src: PhysAddr,
        old: u64,
        new: u64,
        len: u64,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
    ) {
        let n = (len / PAGE_SIZE) as usize;
        // SAFETY: a table reached from the root; live until `finish`.
        let st = unsafe { table_at(&self.alloc, src) };
        let src = &st.entries[index(old, 0)..][..n];
        // Relaxed: we hold the address space exclusively.
        let Some(first) = src.iter().position(|e| e.load(Relaxed) != 0) else {
            return;
        };
        // Only now, with something to move, take a destination table
        // (none: the reservation is short, see `take`; the entries stay).
        let Some(dt) = self.dest_table(new, 0, stash, owed) else {
            return;
        };
        // SAFETY: `dest_table` returns a live table of ours, distinct
        // entries from `src` (the ranges do not overlap).
        let dst = unsafe { &table_at(&self.alloc, dt).entries[index(new, 0)..][..n] };
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
                generic::set_entry_nosync(&self.mmu, s, 0);
                raw
            } else {
                A::ptep_get_and_clear(&self.mmu, s)
            };
            A::set_pte_nosync(&self.mmu, d, pte);
            moved += 1;
        }
        self.wrote(owed, 0, dt);
        self.mmu.stats.add_entries_written(moved);
        let start = old + first as u64 * PAGE_SIZE;
        gather.add_range(VirtAddr(start), (n - first) as u64 * PAGE_SIZE, 0);
    }

    /// Moves a whole source PTE table (`[old, old + 2 MiB)`, linked from
    /// `pmd`) without an atomic exchange per entry: the destination tables
    /// are taken now, the first [`DEFER_HEAD`] entries move now (their
    /// slots then carry the [`Deferred`] record), the table is unlinked,
    /// and [`copy_deferred`](Self::copy_deferred) copies the rest with
    /// plain loads after the flush. Until the flush a walker that cached the
    /// path may still set accessed/dirty bits in the table; the copy reads
    /// them, so none is lost.
    ///
    /// The copy runs after `free_empty`, so every table it writes must
    /// survive that pass; it does, by construction:
    /// - each destination PTE table is linked here, and only for a half of
    ///   the source table that holds an entry, so it ends up holding that
    ///   entry; its ancestors hold the link, and none of them is covered
    ///   whole by the source range (each spans a destination address), so
    ///   `free_empty` never takes them for empty;
    /// - the destination PTE tables themselves do not meet the source range
    ///   (the caller defers only then, see [`dest_meets_source`]), so
    ///   `free_empty` never looks at them, empty as they are until the copy.
    ///
    /// Takes the same tables, in the same order, as the dry run counts for
    /// the two halves. Changes nothing and leaves the table in place when
    /// the reservation is short (see `take`).
    #[allow(clippy::too_many_arguments)]
    fn defer_ptes(
        &mut self,
        src: PhysAddr,
        pmd: &Slot,
        old: u64,
        new: u64,
        stash: &mut Stash,
        gather: &mut TlbGather,
        owed: &mut Owed,
        later: &mut Deferred,
    ) {
        // SAFETY: a table reached from the root; unlinked below, freed only
        // after the copy.
        let t = unsafe { table_at(&self.alloc, src) };
        let split = first_half(new);
        let mut dts = [0u64; 2];
        for (dt, (lo, hi)) in dts.iter_mut().zip([(0, split), (split, ENTRIES_PER_TABLE)]) {
            // Relaxed: we hold the address space exclusively; the hardware
            // never makes a none entry valid.
            if t.entries[lo..hi].iter().any(|e| e.load(Relaxed) != 0) {
                let va = new + lo as u64 * PAGE_SIZE;
                match self.dest_table(va, 0, stash, owed) {
                    Some(pa) => *dt = pa.0,
                    None => return,
                }
            }
        }
        for (k, e) in t.entries[..DEFER_HEAD].iter().enumerate() {
            // Relaxed: as above.
            if e.load(Relaxed) == 0 {
                continue;
            }
            let va = new + k as u64 * PAGE_SIZE;
            // Nonzero: its half holds an entry, so its table was taken.
            let dt = PhysAddr(dts[usize::from(k >= split)]);
            // SAFETY: `dest_table` returned a live table of ours.
            let d = unsafe { &table_at(&self.alloc, dt).entries[index(va, 0)] };
            // Atomic: the table is still live.
            let pte = A::ptep_get_and_clear(&self.mmu, e);
            A::set_pte_nosync(&self.mmu, d, pte);
            // The rest of this destination table is written after the
            // flush; its barrier then covers this write too.
            owed.pending = true;
            self.mmu.stats.add_entries_written(1);
        }
        // Atomic, as `move_table_entry`; walk caches of the path must go.
        generic::get_and_clear(&self.mmu, pmd);
        gather.add_tables(VirtAddr(old), size(1));
        // Relaxed: only this thread follows the record; a walker reading
        // these slots sees invalid entries (low 12 bits clear).
        t.entries[0].store(0, Relaxed);
        t.entries[1].store(old, Relaxed);
        t.entries[2].store(dts[0], Relaxed);
        t.entries[3].store(dts[1], Relaxed);
        if later.count == 0 {
            later.head = src.0;
        } else {
            // SAFETY: the tail is a deferred table of ours, not yet freed.
            let tail = unsafe { table_at(&self.alloc, PhysAddr(later.tail)) };
            // Relaxed: as above.
            tail.entries[0].store(src.0, Relaxed);
        }
        later.tail = src.0;
        later.count += 1;
    }

    /// After the flush: copies the deferred source PTE tables to their
    /// destinations (`delta` = destination − source) with plain loads, and
    /// queues them for freeing. Takes no table and walks nothing: the
    /// destination tables are in each table's record.
    fn copy_deferred(&mut self, later: Deferred, delta: u64, owed: &mut Owed, q: &mut FreeQueue) {
        let mut pa = later.head;
        for _ in 0..later.count {
            // SAFETY: a deferred table of ours: unlinked, flushed, not freed.
            let t = unsafe { table_at(&self.alloc, PhysAddr(pa)) };
            // Relaxed: private to this thread since the flush.
            let next = t.entries[0].load(Relaxed);
            let new = t.entries[1].load(Relaxed).wrapping_add(delta);
            let dts = [t.entries[2].load(Relaxed), t.entries[3].load(Relaxed)];
            // Entries that land in the first destination table, then the
            // rest (a misaligned destination spans two tables).
            let split = first_half(new);
            for (dt, (lo, hi)) in dts
                .into_iter()
                .zip([(0, split), (split, ENTRIES_PER_TABLE)])
            {
                // The first entries moved already.
                let lo = lo.max(DEFER_HEAD);
                if dt == 0 || lo >= hi {
                    continue;
                }
                let src = &t.entries[lo..hi];
                // Relaxed: as above.
                let Some(first) = src.iter().position(|e| e.load(Relaxed) != 0) else {
                    continue;
                };
                let va = new.wrapping_add(lo as u64 * PAGE_SIZE);
                // SAFETY: `defer_ptes` took this table and linked it; the
                // move freed nothing on its path (see there).
                let dst = unsafe {
                    &table_at(&self.alloc, PhysAddr(dt)).entries[index(va, 0)..][..hi - lo]
                };
                let mut moved = 0u64;
                for (s, d) in src[first..].iter().zip(&dst[first..]) {
                    // Relaxed: no walker can reach the source any more; the
                    // destination is ordered by its barrier.
                    let pte = s.load(Relaxed);
                    if pte != 0 {
                        A::set_pte_nosync(&self.mmu, d, pte);
                        moved += 1;
                    }
                }
                self.wrote(owed, 0, PhysAddr(dt));
                self.mmu.stats.add_entries_written(moved);
            }
            self.queue_free(q, PhysAddr(pa));
            pa = next;
        }
    }

    /// After the move: unlinks and queues the source tables in
    /// `[va, end)` that are now empty. Returns whether the table `tpa` at
    /// `height` is empty.
    ///
    /// Everything whose span lies inside the source range was moved, so a
    /// table covered whole is empty (its subtree holds only empty tables)
    /// and is not scanned; only the partly covered tables at the two ends of
    /// the range are.
    fn free_empty(
        &mut self,
        height: u32,
        tpa: PhysAddr,
        mut va: u64,
        end: u64,
        gather: &mut TlbGather,
        q: &mut FreeQueue,
    ) -> bool {
        let start = va;
        // SAFETY: the root or a table reached from it.
        let t = unsafe { table_at(&self.alloc, tpa) };
        if height > 0 {
            loop {
                let next = entry_end(va, height, end);
                let slot = &t.entries[index(va, height)];
                // Relaxed: we hold the address space exclusively.
                if let Decoded::Table(c) = A::decode(slot.load(Relaxed), height) {
                    // A pinned kernel-half table is emptied, never unlinked.
                    let keep = self.pinned(height, va);
                    let whole = covers(va, next, height) && !keep;
                    if (whole || self.free_empty(height - 1, c, va, next, gather, q)) && !keep {
                        // A source-side clear; the flush orders it.
                        generic::set_entry_nosync(&self.mmu, slot, 0);
                        gather.add_tables(VirtAddr(va), next.wrapping_sub(va));
                        self.queue_free_subtree(q, c, height - 1);
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
