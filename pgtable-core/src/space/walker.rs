//! The walker: table references that are reachable by construction, and
//! the range cursor the operations walk `[start, end)` with.
//!
//! A [`TableRef`] is made only from the space's root
//! ([`AddressSpace::root_table`]), from a table entry of another
//! `TableRef` ([`AddressSpace::read`]), or from a frame just taken from the
//! operation's [`Reservation`](crate::space::aspace::Reservation)
//! ([`AddressSpace::take_table`]); it borrows the space shared, and a table
//! is freed only through `&mut` paths (after it is unlinked and the TLB
//! flush), so no `TableRef` outlives its table. The one `unsafe` access to
//! a table frame lives in those constructors. An operation that must keep
//! a table by its address (in a list threaded through table frames, or
//! across one of its own `&mut` steps that frees nothing) comes back to it
//! through [`AddressSpace::table_again`], whose contract is exactly that
//! no table was freed since.
//!
//! A [`Cursor`] is a position in `[start, end)` plus the tables on the
//! path from the root down to it (Asterinas ostd's `Cursor`, so that a
//! later change can make it hold a lock on each). It hands the operation
//! one [`Span`] at a time: the entries of the table at the cursor's height
//! from its position up to the end of that table or of the range (what a
//! Linux `p?d_addr_end` loop runs over); the operation runs its own tight
//! loop over the span and either [`descend`](Cursor::descend)s into one
//! entry's table or, done with the span, [`advance`](Cursor::advance)s,
//! which ascends as far as the new position has left tables behind.
//!
//! An operation that decides about a table only after its children (free
//! it if it is now empty, count it, clear the entry linking it) does so
//! when the cursor leaves it: [`advance`](Cursor::advance) names the
//! heights it left, and [`left`](Cursor::left) hands each such table
//! with the entry that links it and the part of its range the walk
//! covered ([`Left::whole`]: all of it). Tables that do not exist yet (a
//! block to be split, a hole to be filled) are not walked: what they
//! would take is counted from the range's ends ([`split_parts`]).

use crate::contract::level::{entries, entry_end, index, size};
use crate::space::aspace::{covers, first_used};
use core::marker::PhantomData;

use crate::{AddressSpace, Arch, Decoded, Format, Mmu, PhysAddr, Slot, TableAlloc, VirtAddr};

/// A table of the space that the current operation may read and write:
/// the root, a table linked by a table entry of another `TableRef`, or a
/// reserved frame not linked yet (see the module docs).
#[derive(Clone, Copy)]
pub(crate) struct TableRef<'a> {
    table: &'a [Slot],
    pa: PhysAddr,
}

impl<'a> TableRef<'a> {
    /// The table's physical address (what a table entry links).
    #[inline]
    pub(crate) fn pa(self) -> PhysAddr {
        self.pa
    }

    /// All its entries.
    #[inline]
    pub(crate) fn all(self) -> &'a [Slot] {
        self.table
    }

    /// The entry `i`.
    #[inline]
    pub(crate) fn slot(self, i: usize) -> &'a Slot {
        &self.table[i]
    }

    /// The entries `from..to`.
    #[inline]
    pub(crate) fn slots(self, from: usize, to: usize) -> &'a [Slot] {
        &self.table[from..to]
    }

    /// The raw value of entry `i`.
    ///
    /// Relaxed, here for every walk: the operation holds the space (`&`
    /// for readers, `&mut` for writers), so no other software changes the
    /// entry; the hardware walker may set accessed/dirty state in a leaf,
    /// which never changes the kind of an entry, its address or its
    /// protection. The walker is ordered against the operation's stores by
    /// `Mmu::walker_barrier`, `Mmu::publish_barrier` and the TLB flushes,
    /// not by this load.
    #[inline]
    pub(crate) fn load(self, i: usize) -> u64 {
        self.table[i].load(core::sync::atomic::Ordering::Relaxed)
    }
}

/// What an entry read through [`AddressSpace::read`] is.
#[derive(Clone, Copy)]
pub(crate) enum Next<'a> {
    /// No entry (the raw value is 0).
    None,
    /// A leaf mapping this physical address (its first byte).
    Leaf(PhysAddr),
    /// A table entry above the PTE level: the table it links.
    Table(TableRef<'a>),
    /// Anything else: a software entry, a reserved-bit pattern, or a value
    /// that decodes as a table at the PTE level.
    Invalid,
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// The root table.
    #[inline]
    pub(crate) fn root_table(&self) -> TableRef<'_> {
        // SAFETY: the root is a live table frame of `self.alloc` while the
        // space lives, and the reference borrows the space.
        let table =
            unsafe { crate::space::aspace::table_at(&self.alloc, self.root, entries::<A>()) };
        TableRef {
            table,
            pa: self.root,
        }
    }

    /// Entry `i` of `t`, a table at `height`: its raw value and what it
    /// is, with the table it links for a table entry.
    #[inline]
    pub(crate) fn read<'a>(&'a self, t: TableRef<'a>, i: usize, height: u32) -> (u64, Next<'a>) {
        let raw = t.load(i);
        let next = match A::decode(raw, height) {
            Decoded::None => Next::None,
            Decoded::Leaf(pa) => Next::Leaf(A::cont_pa(raw, pa, height, i)),
            Decoded::Table(pa) if height > 0 => {
                // SAFETY: `t` is reachable (by construction), and a table
                // entry of a reachable table links a live table frame of
                // ours (the `Format` and `from_root` rules: every table
                // entry links a table linked nowhere else); it stays live
                // while the space is borrowed, as tables are unlinked and
                // freed only through `&mut self`.
                let table =
                    unsafe { crate::space::aspace::table_at(&self.alloc, pa, entries::<A>()) };
                Next::Table(TableRef { table, pa })
            }
            Decoded::Table(_) | Decoded::Invalid => Next::Invalid,
        };
        (raw, next)
    }

    /// Takes one table from `res` (see [`take`](Self::take)), zeroed and
    /// not linked yet: the caller fills it and links it with a populate
    /// operation.
    #[inline]
    pub(crate) fn take_table(
        &self,
        res: &mut crate::space::aspace::Reservation,
    ) -> Option<TableRef<'_>> {
        let pa = self.take(res)?;
        // SAFETY: a reserved frame of ours, handed out once: it is freed
        // only by `&mut self` paths (a `settle` of another reservation
        // never holds it, and after it is linked, the free queue after
        // the flush), so it outlives the borrow of the space.
        let table = unsafe { self.owned_frame(pa) };
        Some(TableRef { table, pa })
    }

    /// The table whose [`pa`](TableRef::pa) is `pa`, again: for a table
    /// the operation reached or took earlier and kept by address, because a
    /// reference cannot be stored in a table frame (a list threaded through
    /// unlinked tables) or held across the operation's own `&mut` steps
    /// (reserving tables, unfolding runs in place).
    ///
    /// # Safety
    ///
    /// `pa` is the address of a `TableRef` of this space, and no table of
    /// the space has been freed since that `TableRef` was made. (Tables are
    /// freed only by `&mut` operations after their TLB flush, so within one
    /// shared borrow of the space this always holds.)
    #[inline]
    pub(crate) unsafe fn table_again(&self, pa: PhysAddr) -> TableRef<'_> {
        // SAFETY: a table frame of ours that is still live (the caller's
        // guarantee); it stays live while the space is borrowed shared.
        let table = unsafe { self.owned_frame(pa) };
        TableRef { table, pa }
    }

    /// The table at `height` on the path to `va` (`Ok`), or where the path
    /// ends above it (`Err`): the deepest table on the path, its height and
    /// what its entry for `va` is (anything but a table entry).
    #[inline]
    pub(crate) fn path_to(&self, va: u64, height: u32) -> Result<TableRef<'_>, Stop<'_>> {
        let mut t = self.root_table();
        let mut h = A::LEVELS - 1;
        while h > height {
            match self.read(t, index::<A>(va, h), h).1 {
                Next::Table(c) => t = c,
                next => {
                    return Err(Stop {
                        table: t,
                        height: h,
                        next,
                    })
                }
            }
            h -= 1;
        }
        Ok(t)
    }

    /// The tables on the path to `va` down to `height` and the slot of the
    /// entry there, if those tables exist (a leaf or nothing above
    /// `height` ends the walk: `None`). The fault-time short path: no
    /// range, no cursor, a fixed number of dependent loads.
    #[inline]
    pub(crate) fn table_for(&self, va: u64, height: u32) -> Option<TableRef<'_>> {
        let mut t = self.root_table();
        let mut h = A::LEVELS - 1;
        while h > height {
            match self.read(t, index::<A>(va, h), h).1 {
                Next::Table(c) => t = c,
                _ => return None,
            }
            h -= 1;
        }
        Some(t)
    }

    /// The leaf-level entry on the path to `va` (checked by the caller): a
    /// page, a block, or a non-present non-zero entry, as the table that
    /// holds it, its index there and its height; `None` when a zero entry
    /// ends the walk first. The short path of the single-entry operations
    /// (Linux `ptep_get`, `ptep_set_access_flags`,
    /// `ptep_test_and_clear_young`): no range, no cursor.
    #[inline]
    pub(crate) fn leaf_for(&self, va: u64) -> Option<(TableRef<'_>, usize, u32)> {
        let mut t = self.root_table();
        let mut h = A::LEVELS - 1;
        loop {
            let i = index::<A>(va, h);
            match self.read(t, i, h) {
                (_, Next::Table(c)) => t = c,
                (_, Next::None) => return None,
                (raw, Next::Invalid)
                    if h == 0 && matches!(A::decode(raw, 0), Decoded::Table(_)) =>
                {
                    return None
                }
                (_, Next::Leaf(_) | Next::Invalid) => return Some((t, i, h)),
            }
            // A table entry is never found at height 0 (`Format` rules).
            h = h.checked_sub(1)?;
        }
    }

    /// A cursor over `[va, end)` inside `t`, a table at `height` whose
    /// range holds `[va, end)`: a walk of that subtree only.
    #[inline]
    pub(crate) fn cursor_under<'a>(
        &'a self,
        t: TableRef<'a>,
        height: u32,
        va: u64,
        end: u64,
    ) -> Cursor<'a, A> {
        let mut path = [None; MAX_LEVELS];
        path[height as usize] = Some(t);
        Cursor {
            path,
            entered: [0; MAX_LEVELS],
            va,
            end,
            height,
            top: height,
            format: PhantomData,
        }
    }

    /// A cursor over `[va, end)` (checked by the caller), at the root.
    #[inline]
    pub(crate) fn cursor(&self, va: u64, end: u64) -> Cursor<'_, A> {
        let top = A::LEVELS - 1;
        let mut path = [None; MAX_LEVELS];
        path[top as usize] = Some(self.root_table());
        Cursor {
            path,
            entered: [0; MAX_LEVELS],
            va,
            end,
            height: top,
            top,
            format: PhantomData,
        }
    }
}

/// Where [`AddressSpace::path_to`] ended above the height it walked to.
#[derive(Clone, Copy)]
pub(crate) struct Stop<'a> {
    /// The deepest table on the path.
    pub(crate) table: TableRef<'a>,
    /// Its height.
    pub(crate) height: u32,
    /// Its entry for the address: not a [`Next::Table`].
    pub(crate) next: Next<'a>,
}

/// The most translation levels a format may have (x86 LA57).
pub(crate) const MAX_LEVELS: usize = 5;

/// A position in `[start, end)` and the tables on the path to it (see the
/// module docs).
pub(crate) struct Cursor<'a, A> {
    /// `path[h]`: the table at height `h` on the path; `Some` for every
    /// height from the cursor's up to the root.
    path: [Option<TableRef<'a>>; MAX_LEVELS],
    /// `entered[h]`: the address the cursor descended into the table at
    /// height `h` with (below the top).
    entered: [u64; MAX_LEVELS],
    va: u64,
    end: u64,
    height: u32,
    top: u32,
    /// The format, whose geometry the cursor steps by.
    format: PhantomData<fn() -> A>,
}

/// The entries `from..to` of `table`, a table at `height`, covering
/// `[va, next)`: the first and the last may be covered in part.
pub(crate) struct Span<'a, A> {
    pub(crate) table: TableRef<'a>,
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) va: u64,
    pub(crate) next: u64,
    pub(crate) height: u32,
    pub(crate) format: PhantomData<fn() -> A>,
}

// Not derived: a derive would ask `A: Copy`.
impl<A> Clone for Span<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Span<'_, A> {}

impl<A: Format> Span<'_, A> {
    /// The entries of the span that it covers in part, each as its index
    /// and its part `[va, next)`: only the first and the last can be.
    #[inline]
    pub(crate) fn partial(&self) -> impl Iterator<Item = (usize, u64, u64)> {
        let h = self.height;
        let first_end = entry_end::<A>(self.va, h, self.next);
        let last = self.next.wrapping_sub(1) & !(size::<A>(h) - 1);
        let first = (self.from, self.va, first_end);
        let last = (first_end != self.next).then_some((self.to - 1, last, self.next));
        core::iter::once(first)
            .chain(last)
            .filter(move |&(_, va, next)| !covers::<A>(va, next, h))
    }
}

/// A table the cursor has left ([`Cursor::left`]): the table at `height`,
/// linked by entry `index` of `parent`, whose part `[va, next)` the walk
/// covered.
pub(crate) struct Left<'a, A> {
    pub(crate) table: TableRef<'a>,
    pub(crate) height: u32,
    pub(crate) parent: TableRef<'a>,
    pub(crate) index: usize,
    pub(crate) va: u64,
    pub(crate) next: u64,
    pub(crate) format: PhantomData<fn() -> A>,
}

// Not derived: a derive would ask `A: Copy`.
impl<A> Clone for Left<'_, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A> Copy for Left<'_, A> {}

impl<'a, A: Format> Left<'a, A> {
    /// Whether the walk covered the table's whole range.
    #[inline]
    pub(crate) fn whole(&self) -> bool {
        covers::<A>(self.va, self.next, self.height + 1)
    }

    /// The parent's entry that links the table.
    #[inline]
    pub(crate) fn link(&self) -> &'a Slot {
        self.parent.slot(self.index)
    }

    /// Whether every entry of the table is none.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.table.slots(0, entries::<A>()).iter().all(|e| {
            // Relaxed: as in `TableRef::load`.
            e.load(core::sync::atomic::Ordering::Relaxed) == 0
        })
    }
}

/// The entries at heights `1..=height` that `[va, end)` (inside one entry
/// at `height + 1`) covers in part: at each height the entry holding `va`
/// unless `va` starts it, and the one holding `end - 1` unless `end` ends
/// it. Splitting a block around `[va, end)` down to pages takes one table
/// for each of them below the block's own (only the two ends of a range
/// can be covered in part, so nothing is walked).
pub(crate) fn split_parts<A: Format>(va: u64, end: u64, height: u32) -> usize {
    let mut n = 0;
    for h in 1..=height {
        let first_end = entry_end::<A>(va, h, end);
        n += usize::from(!covers::<A>(va, first_end, h));
        if first_end != end {
            n += usize::from(end & (size::<A>(h) - 1) != 0);
        }
    }
    n
}

impl<'a, A: Format> Cursor<'a, A> {
    /// The span at the cursor: the entries of the current table from the
    /// position up to the end of the table or of the range; `None` when
    /// the cursor has passed the end.
    #[inline]
    pub(crate) fn span(&self) -> Option<Span<'a, A>> {
        if self.height > self.top {
            return None;
        }
        let h = self.height;
        let table = self.path[h as usize]?;
        let next = if h == self.top {
            self.end
        } else {
            entry_end::<A>(self.va, h + 1, self.end)
        };
        Some(Span {
            table,
            from: index::<A>(self.va, h),
            // The last entry is that of `next - 1` (wrapping: `next` is 0
            // at the top of the 64-bit space).
            to: index::<A>(next.wrapping_sub(1), h) + 1,
            va: self.va,
            next,
            height: h,
            format: PhantomData,
        })
    }

    /// Moves into `child`, the table of the entry of the current span that
    /// covers `va` (the first address of that entry in the range).
    #[inline]
    pub(crate) fn descend(&mut self, child: TableRef<'a>, va: u64) {
        debug_assert!(self.height > 0);
        self.height -= 1;
        self.path[self.height as usize] = Some(child);
        self.entered[self.height as usize] = va;
        self.va = va;
    }

    /// The table at `height` that the last [`advance`](Self::advance)
    /// left (`height` in the range it returned), with the entry linking
    /// it; `None` for the cursor's top table, which it entered through no
    /// entry of its own.
    #[inline]
    pub(crate) fn left(&self, height: u32) -> Option<Left<'a, A>> {
        if height >= self.top {
            return None;
        }
        let h = height as usize;
        let va = self.entered[h];
        Some(Left {
            table: self.path[h]?,
            height,
            parent: self.path[h + 1]?,
            index: index::<A>(va, height + 1),
            va,
            next: self.va,
            format: PhantomData,
        })
    }

    /// Moves to `next`, the end of the current span, and up to the table
    /// whose entries go on from there (or past the end of the range).
    /// Returns the heights of the tables the cursor is done with (each
    /// visited for the last time), lowest first: where an operation issues
    /// its per-table barrier.
    #[inline]
    pub(crate) fn advance(&mut self, next: u64) -> core::ops::Range<u32> {
        let from = self.height;
        self.va = next;
        if next == self.end {
            self.height = self.top + 1;
            return from..self.height;
        }
        // A table at height `h` covers `size(h + 1)`: while `next` starts
        // a new table there, that table is done too.
        self.height += 1;
        while self.height < self.top && next & (size::<A>(self.height + 1) - 1) == 0 {
            self.height += 1;
        }
        from..self.height
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// The first address in `[va, va + len)` that something is mapped at
    /// (a leaf, or a software entry the walker does not decode).
    pub(crate) fn first_mapped(&self, va: u64, len: u64) -> Option<VirtAddr> {
        let top = A::LEVELS - 1;
        self.first_mapped_in(self.root_table(), top, va, va.wrapping_add(len))
    }

    /// The first address in `[va, end)` that something is mapped at, under
    /// `t`, a table at `height` whose range holds `[va, end)`.
    pub(crate) fn first_mapped_in(
        &self,
        t: TableRef<'_>,
        height: u32,
        va: u64,
        end: u64,
    ) -> Option<VirtAddr> {
        let mut cur = self.cursor_under(t, height, va, end);
        while let Some(span) = cur.span() {
            match self.first_mapped_in_span(span) {
                Ok(Some((child, va))) => cur.descend(child, va),
                Ok(None) => {
                    cur.advance(span.next);
                }
                Err(hit) => return Some(hit),
            }
        }
        None
    }

    /// The first mapped address of `span` up to its first table entry
    /// (`Err`), or that entry's table and first address (`Ok(Some)`), or
    /// `Ok(None)`: nothing mapped in the span.
    fn first_mapped_in_span<'a>(
        &'a self,
        span: Span<'a, A>,
    ) -> Result<Option<(TableRef<'a>, u64)>, VirtAddr> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        if height == 0 {
            // At the PTE level anything but none is mapped.
            return match first_used::<A>(t.all(), 0, va, end) {
                Some(hit) => Err(hit),
                None => Ok(None),
            };
        }
        for i in span.from..span.to {
            match self.read(t, i, height).1 {
                Next::None => {}
                Next::Table(c) => return Ok(Some((c, va))),
                Next::Leaf(_) | Next::Invalid => return Err(VirtAddr(va)),
            }
            va = entry_end::<A>(va, height, end);
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    /// The 4 KiB, 4-level geometry the cases below are written for.
    type A = crate::testing::test_format::TestFormat<4>;

    use super::*;

    /// What [`split_parts`] counts, entry by entry: each entry below
    /// `height` that `[va, end)` covers in part, and the same inside it.
    fn parts_by_entry(va: u64, end: u64, height: u32) -> usize {
        if height == 0 {
            return 0;
        }
        let (mut n, mut v) = (0, va);
        loop {
            let next = entry_end::<A>(v, height, end);
            if !covers::<A>(v, next, height) {
                n += 1 + parts_by_entry(v, next, height - 1);
            }
            v = next;
            if v == end {
                return n;
            }
        }
    }

    #[test]
    fn split_parts_counts_the_entries_covered_in_part_at_each_height() {
        // One page inside a 2 MiB entry inside a 1 GiB entry.
        assert_eq!(split_parts::<A>(0x1000, 0x2000, 2), 2);
        // 2 MiB aligned: only the 1 GiB entry is covered in part.
        assert_eq!(split_parts::<A>(0x20_0000, 0x60_0000, 2), 1);
        // Both ends inside two different 2 MiB entries.
        assert_eq!(split_parts::<A>(0x1f_f000, 0x20_1000, 1), 2);
        // The last pages of the 64-bit space (`end` wraps to 0).
        assert_eq!(split_parts::<A>(u64::MAX - 0x1fff, 0, 2), 2);
        let starts = [0, 0x1000, 0x1f_f000, 0x20_0000, 0x3f_e000, 0x1234_5000];
        let lens = [0x1000, 0x3000, 0x20_0000, 0x20_1000, 0x40_0000, 0x3fe0_0000];
        for va in starts {
            for len in lens {
                let end = va + len;
                if end > 1 << 30 {
                    continue;
                }
                for h in 0..=2 {
                    if h < 2 && (va >> (12 + 9 * (h + 1))) != ((end - 1) >> (12 + 9 * (h + 1))) {
                        // Not inside one entry at `h + 1`.
                        continue;
                    }
                    assert_eq!(
                        split_parts::<A>(va, end, h),
                        parts_by_entry(va, end, h),
                        "[{va:#x}, {end:#x}) at height {h}"
                    );
                }
            }
        }
    }
}
