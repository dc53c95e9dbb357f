//! Whole source PTE tables moved without an atomic exchange per entry:
//! unlinked during the move, copied to their destination tables with
//! plain loads after the TLB flush.

use core::sync::atomic::Ordering::Relaxed;

use super::{Mover, Pos};
use crate::contract::level::{entries, index, page_size, size};
use crate::space::walker::TableRef;
use crate::Format;
use crate::{generic, Arch, Mmu, PhysAddr, Slot, TableAlloc, VirtAddr};

/// Source PTE tables unlinked whole during the move, to be copied after
/// the flush: a list in address order. The first [`DEFER_HEAD`] entries of
/// each table moved before it was unlinked; their slots hold its record:
/// the next table of the list, the table's source address, and the
/// destination PTE tables of its two halves (see [`first_half`]; 0 when
/// that half is empty). All of these have their low 12 bits clear, so a
/// walker that still reaches the table sees them as invalid entries and
/// never writes them.
///
/// The tables are unlinked, so they are kept by address from the second
/// one on (a table frame cannot hold a reference) and reached again with
/// [`table_again`](crate::AddressSpace::table_again): each was a
/// `TableRef` of the move, and the move frees no table before the copy.
#[derive(Default)]
pub(super) struct Deferred<'a> {
    head: Option<TableRef<'a>>,
    tail: Option<TableRef<'a>>,
    pub(super) count: usize,
}

/// Entries of a deferred PTE table that move before it is unlinked, to
/// make room for its [`Deferred`] record.
const DEFER_HEAD: usize = 4;

/// How many entries of a whole PTE table moving to `new` land in the first
/// destination PTE table (all 512 when `new` is PMD aligned).
#[inline]
fn first_half<A: Format>(new: u64) -> usize {
    ((size::<A>(1) - (new & (size::<A>(1) - 1))) / page_size::<A>()) as usize
}

/// Whether the destination PTE tables of a whole source PTE table moving
/// to `new` (the one or two tables holding `[new, new + 2 MiB)`) also hold
/// part of the source range `[old, old + len)`. Such a table can be a
/// partly covered source table that the move empties before the deferred
/// copy would fill it, so that table moves entry by entry instead (only
/// tables next to the ends of the source range can be affected).
#[inline]
pub(super) fn dest_meets_source<A: Format>(new: u64, old: u64, len: u64) -> bool {
    let first = new & !(size::<A>(1) - 1);
    // `[new, new + 2 MiB)` lies in the destination range, so this does
    // not wrap.
    let last = (new + (size::<A>(1) - 1)) | (size::<A>(1) - 1);
    first <= old.wrapping_add(len - 1) && old <= last
}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> Mover<'a, A, M, T> {
    /// Moves a whole source PTE table `t` (`[at.old, at.old + 2 MiB)`,
    /// linked from `pmd`) without an atomic exchange per entry: the
    /// destination tables are taken now, the first [`DEFER_HEAD`] entries
    /// move now (their slots then carry the [`Deferred`] record), the table
    /// is unlinked, and [`copy_deferred`](Self::copy_deferred) copies the
    /// rest with plain loads after the flush. Until the flush a walker that
    /// cached the path may still set accessed/dirty bits in the table; the
    /// copy reads them, so none is lost.
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
    pub(super) fn defer_ptes(&mut self, t: TableRef<'a>, pmd: &Slot, at: Pos) {
        let Some(dts) = self.defer_dests(t, at.new) else {
            return;
        };
        let mmu = &self.space.mmu;
        let split = first_half::<A>(at.new);
        for (k, e) in t.slots(0, DEFER_HEAD).iter().enumerate() {
            // Relaxed: we hold the address space exclusively; the hardware
            // never makes a none entry valid.
            if e.load(Relaxed) == 0 {
                continue;
            }
            let va = at.new + k as u64 * page_size::<A>();
            // Its half holds an entry, so its table was taken.
            let Some(dt) = dts[usize::from(k >= split)] else {
                continue;
            };
            let d = dt.slot(index::<A>(va, 0));
            // Atomic: the table is still live.
            let pte = A::ptep_get_and_clear(mmu, e);
            A::set_pte_nosync(mmu, d, pte);
            // The rest of this destination table is written after the
            // flush; its barrier then covers this write too.
            self.owed.pending = true;
            mmu.stats.add_entries_written(1);
        }
        // Atomic, as `move_table_entry`; walk caches of the path must go.
        generic::get_and_clear(mmu, pmd);
        self.gather.add_tables::<A>(VirtAddr(at.old), size::<A>(1));
        let pa = |d: Option<TableRef<'_>>| d.map_or(0, |d| d.pa().0);
        // Relaxed: only this thread follows the record; a walker reading
        // these slots sees invalid entries (low 12 bits clear).
        t.slot(0).store(0, Relaxed);
        t.slot(1).store(at.old, Relaxed);
        t.slot(2).store(pa(dts[0]), Relaxed);
        t.slot(3).store(pa(dts[1]), Relaxed);
        let later = &mut self.later;
        match later.tail {
            // Relaxed: as above.
            Some(tail) => tail.slot(0).store(t.pa().0, Relaxed),
            None => later.head = Some(t),
        }
        later.tail = Some(t);
        later.count += 1;
    }

    /// The destination PTE tables of the two halves of the whole source
    /// PTE table `t` moving to `new` (see [`first_half`]), taken for each
    /// half that holds an entry; `None` when the reservation is short.
    fn defer_dests(&mut self, t: TableRef<'a>, new: u64) -> Option<[Option<TableRef<'a>>; 2]> {
        let split = first_half::<A>(new);
        let mut dts = [None; 2];
        for (dt, (lo, hi)) in dts.iter_mut().zip([(0, split), (split, entries::<A>())]) {
            // Relaxed: we hold the address space exclusively; the hardware
            // never makes a none entry valid.
            if t.slots(lo, hi).iter().any(|e| e.load(Relaxed) != 0) {
                let va = new + lo as u64 * page_size::<A>();
                *dt = Some(self.dest_table(va, 0)?);
            }
        }
        Some(dts)
    }

    /// After the flush: copies the deferred source PTE tables to their
    /// destinations with plain loads, and queues them for freeing. Takes no
    /// table and walks nothing: the destination tables are in each table's
    /// record.
    pub(super) fn copy_deferred(&mut self) {
        // Destination − source.
        let delta = self.range.new.wrapping_sub(self.range.old);
        let mut next = self.later.head;
        while let Some(t) = next {
            // Relaxed: private to this thread since the flush.
            let link = t.slot(0).load(Relaxed);
            let new = t.slot(1).load(Relaxed).wrapping_add(delta);
            let dts = [t.slot(2).load(Relaxed), t.slot(3).load(Relaxed)];
            // Entries that land in the first destination table, then the
            // rest (a misaligned destination spans two tables).
            let split = first_half::<A>(new);
            for (dt, (lo, hi)) in dts.into_iter().zip([(0, split), (split, entries::<A>())]) {
                // The first entries moved already.
                let lo = lo.max(DEFER_HEAD);
                if dt != 0 && lo < hi {
                    // SAFETY: `defer_ptes` took or found this table (a
                    // `TableRef` of the move) and linked it; nothing is
                    // freed before the copy.
                    let dt = unsafe { self.space.table_again(PhysAddr(dt)) };
                    self.copy_half(
                        t.slots(lo, hi),
                        dt,
                        new.wrapping_add(lo as u64 * page_size::<A>()),
                    );
                }
            }
            self.space.queue_free(&mut self.q, t.pa());
            next = if Some(t.pa()) == self.later.tail.map(TableRef::pa) {
                None
            } else {
                // SAFETY: the next deferred table, a `TableRef` of the
                // move when it was deferred; unlinked, not freed.
                Some(unsafe { self.space.table_again(PhysAddr(link)) })
            };
        }
    }

    /// Copies the source PTEs `src` of a deferred table to the destination
    /// table `dt`, from the entry for `va` on.
    fn copy_half(&mut self, src: &[Slot], dt: TableRef<'a>, va: u64) {
        // Relaxed: as in `copy_deferred`.
        let Some(first) = src.iter().position(|e| e.load(Relaxed) != 0) else {
            return;
        };
        let j = index::<A>(va, 0);
        let dst = dt.slots(j, j + src.len());
        let mmu = &self.space.mmu;
        let mut moved = 0u64;
        for (s, d) in src[first..].iter().zip(&dst[first..]) {
            // Relaxed: no walker can reach the source any more; the
            // destination is ordered by its barrier.
            let pte = s.load(Relaxed);
            if pte != 0 {
                A::set_pte_nosync(mmu, d, pte);
                moved += 1;
            }
        }
        self.wrote(0, dt);
        self.space.mmu.stats.add_entries_written(moved);
    }
}
