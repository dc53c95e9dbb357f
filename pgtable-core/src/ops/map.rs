//! `map`: install translations for a range.
//!
//! Three phases, so that an error leaves the tables untouched:
//! 1. check: walk the range read-only, fail on anything already mapped and
//!    count the tables the mapping needs;
//! 2. reserve: allocate exactly that many tables (or fail, freeing them);
//! 3. fill: write the entries, which can no longer fail. Entries of one
//!    table are written with the nosync setter and the table gets one
//!    walker barrier (Linux "arm64: mm: Batch dsb and isb when populating pgtables"), or none
//!    until the end of a lazy-MMU scope.

use crate::contract::level::{entries, entry_end, index, page_size, shift, size};
use crate::ops::contpte;
use crate::space::aspace::{covers, first_used, Reservation};
use crate::space::walker::{Next, Span, TableRef, MAX_LEVELS};
use crate::{AddressSpace, Arch, Error, MapOptions, Mmu, PhysAddr, Prot, TableAlloc, VirtAddr};

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Maps `[va, va + len)` to `[pa, pa + len)` with `prot`.
    ///
    /// Uses a block at PUD or PMD level wherever `opts` allows it, the
    /// format supports it and VA, PA and the remaining length are aligned to
    /// the block size; 4 KiB pages elsewhere. No TLB maintenance is needed
    /// (nothing valid is replaced).
    ///
    /// Where the format has a contiguous hint ([`Format::cont_entries`]:
    /// arm64 runs of 16 pages or 16 2 MiB blocks, Arm ARM D8.6.1), every
    /// aligned run that this call maps whole, with the physical address
    /// congruent to the virtual one modulo the run size, is written with
    /// the hint (Linux `contpte_set_ptes`), unless `opts` say
    /// [`no_contiguous`](MapOptions::no_contiguous). The choice is made
    /// once per table span, so the per-entry loop is unchanged. Runs that
    /// two calls map half each are not folded.
    ///
    /// # Folding and later live changes
    ///
    /// A folded run is one translation to the hardware, so a later change
    /// of *part* of it unfolds it first, which clears all of its entries
    /// for a moment: [`change_protection`](Self::change_protection) does
    /// that, but
    /// [`change_protection_live`](Self::change_protection_live) refuses
    /// (in place, [`LiveOptions::IN_PLACE`](crate::LiveOptions::IN_PLACE))
    /// with [`Error::BreakBeforeMake`] and
    /// [`BbmReason::ContiguousRun`](crate::contract::BbmReason::ContiguousRun).
    /// On arm64 a linear map mapped with 2 MiB blocks is folded into
    /// 32 MiB runs, so changing one 2 MiB block of it live fails. Map with
    /// [`MapOptions::no_contiguous`] (and with pages, as Linux's
    /// `can_set_direct_map` does, if 4 KiB pieces will change) whatever
    /// must later change live in pieces smaller than a run.
    ///
    /// [`Format::cont_entries`]: crate::Format::cont_entries
    ///
    /// # Errors
    ///
    /// Misaligned or zero length, a range outside the address space, a
    /// physical range the format cannot encode, anything already mapped in
    /// the range ([`Error::AlreadyMapped`] with the first such address), or
    /// [`Error::OutOfMemory`]. On error nothing was changed.
    pub fn map(
        &mut self,
        va: VirtAddr,
        pa: PhysAddr,
        len: u64,
        prot: Prot,
        opts: MapOptions,
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        Self::check_phys(pa, len)?;
        let plan = MapPlan {
            off: pa.0.wrapping_sub(va.0),
            prot,
            opts,
        };
        let need = self.map_check(va.0, end, &plan)?;
        let mut stash = self.reserve(need)?;
        self.may_hold_global |= prot.global();
        self.map_fill(va.0, end, &plan, &mut stash);
        // Short only if `map_check` under-counted (see `take`).
        self.settle(stash)
    }

    /// Phase 1: conflicts and the number of tables needed, on the cursor.
    /// Existing tables are walked; what a new table needs below it is
    /// counted from its range ([`hole_need`]).
    fn map_check(&self, va: u64, end: u64, plan: &MapPlan) -> Result<usize, Error> {
        let mut need = 0;
        let mut cur = self.cursor(va, end);
        while let Some(span) = cur.span() {
            match self.check_span(span, plan, &mut need)? {
                Some((child, va)) => cur.descend(child, va),
                None => {
                    cur.advance(span.next);
                }
            }
        }
        Ok(need)
    }

    /// [`map_check`](Self::map_check) over `span`, counting into `need`,
    /// up to its first existing table that the map writes into: that table
    /// and its first address (`Ok(None)`: the span is done).
    fn check_span<'a>(
        &'a self,
        span: Span<'a, A>,
        plan: &MapPlan,
        need: &mut usize,
    ) -> Result<Option<(TableRef<'a>, u64)>, Error> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        let opts = plan.opts;
        if height == 0 || all_leaves::<A>(height, va, end, plan.pa(va), opts) {
            // Every entry becomes a leaf (a page, or a block of the fast
            // path): they must all be free.
            if let Some(at) = first_used::<A>(t.all(), height, va, end) {
                let next = entry_end::<A>(at.0, height, end);
                let kind = self.read(t, index::<A>(at.0, height), height).1;
                return Err(Error::AlreadyMapped(
                    self.first_mapped_at(kind, height, at.0, next),
                ));
            }
            return Ok(None);
        }
        for i in span.from..span.to {
            let next = entry_end::<A>(va, height, end);
            let (raw, kind) = self.read(t, i, height);
            if use_leaf::<A>(height, va, next, plan.pa(va), opts) {
                if raw != 0 {
                    return Err(Error::AlreadyMapped(
                        self.first_mapped_at(kind, height, va, next),
                    ));
                }
            } else {
                match kind {
                    Next::None => *need += 1 + hole_need::<A>(height - 1, va, next, plan),
                    Next::Table(c) => return Ok(Some((c, va))),
                    Next::Leaf(_) | Next::Invalid => {
                        return Err(Error::AlreadyMapped(VirtAddr(va)));
                    }
                }
            }
            va = next;
        }
        Ok(None)
    }

    /// Where a map that wants a leaf for the entry `raw` at `height`
    /// (covering `[va, next)`, not none) first meets a mapping: `va` for a
    /// leaf or a software entry, the first mapped address below for a
    /// table (what the caller can act on, not the start of the slot), or
    /// `va` again for a table that maps nothing (it is in the way all the
    /// same; the operations never leave one linked).
    fn first_mapped_at(&self, kind: Next<'_>, height: u32, va: u64, next: u64) -> VirtAddr {
        match kind {
            Next::Table(c) => self
                .first_mapped_in(c, height - 1, va, next)
                .unwrap_or(VirtAddr(va)),
            _ => VirtAddr(va),
        }
    }

    /// Phase 3: writes `[va, end)` on the cursor, which can no longer fail.
    /// A table taken from `stash` is filled first and linked when the
    /// cursor leaves it (populate publishes its contents before the link);
    /// each table that was written gets one barrier when the cursor leaves
    /// it, a new table before its link, so the parent's barrier covers the
    /// link.
    fn map_fill(&self, va: u64, end: u64, plan: &MapPlan, stash: &mut Reservation) {
        // Whether the table at each height on the path was written.
        let mut wrote = [false; MAX_LEVELS];
        // Whether the table at each height on the path is new: linked
        // into its parent's entry when the cursor is done with it.
        let mut new = [false; MAX_LEVELS];
        let mut cur = self.cursor(va, end);
        while let Some(span) = cur.span() {
            let h = span.height as usize;
            if let Some((child, va, is_new)) = self.map_span(span, plan, stash, &mut wrote[h]) {
                new[h - 1] = is_new;
                cur.descend(child, va);
                continue;
            }
            for d in cur.advance(span.next) {
                let d = d as usize;
                if core::mem::take(&mut wrote[d]) {
                    self.table_done();
                }
                if let Some(l) = cur.left(d as u32).filter(|_| core::mem::take(&mut new[d])) {
                    let (slot, c) = (l.link(), l.table.pa());
                    A::populate_attrs(&self.mmu, slot, c, d as u32 + 1, self.table_attrs);
                    self.mmu.stats.add_entries_written(1);
                    wrote[d + 1] = true;
                }
            }
        }
    }

    /// Writes the entries of `span` up to its first entry that needs a
    /// table, setting `wrote` if it wrote any; returns that table (an
    /// existing one, or a new one to link when the cursor leaves it), its
    /// first address and whether it is new (`None`: the span is done).
    fn map_span<'a>(
        &'a self,
        span: Span<'a, A>,
        plan: &MapPlan,
        stash: &mut Reservation,
        wrote: &mut bool,
    ) -> Option<(TableRef<'a>, u64, bool)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        if height == 0 {
            self.fill_ptes(t, va, end, plan);
            *wrote = true;
            return None;
        }
        let opts = plan.opts;
        if all_leaves::<A>(height, va, end, plan.pa(va), opts) {
            self.fill_blocks(t, height, va, end, plan);
            *wrote = true;
            return None;
        }
        // The blocks of `[lo, lo + folded)` are written with the hint.
        let (lo, folded) = contpte::fold_span::<A>(height, va, end, plan.pa(va), opts);
        loop {
            let next = entry_end::<A>(va, height, end);
            let i = index::<A>(va, height);
            let slot = t.slot(i);
            if use_leaf::<A>(height, va, next, plan.pa(va), opts) {
                let mut leaf = A::leaf(PhysAddr(plan.pa(va)), plan.prot, height);
                if va.wrapping_sub(lo) < folded {
                    leaf = A::mk_cont(leaf, height);
                }
                if opts.is_barrier_per_entry() {
                    if height >= 2 {
                        A::set_pud_at(&self.mmu, VirtAddr(va), slot, leaf);
                    } else {
                        A::set_pmd_at(&self.mmu, VirtAddr(va), slot, leaf);
                    }
                } else {
                    A::set_pte_nosync(&self.mmu, slot, leaf);
                }
                self.mmu.stats.add_entries_written(1);
                *wrote = true;
            } else {
                match self.read(t, i, height).1 {
                    Next::Table(c) => return Some((c, va, false)),
                    // Phase 1 saw `None` here: a new table, linked when
                    // it is filled. (No table: the count was short, see
                    // `take`; this part stays unmapped.)
                    _ => {
                        if let Some(c) = self.take_table(stash) {
                            return Some((c, va, true));
                        }
                    }
                }
            }
            va = next;
            if va == end {
                return None;
            }
        }
    }

    /// The PTE store loops over `[va, end)` of `t`: unfolded head, folded
    /// whole runs, unfolded tail, each with one template (see
    /// `contpte::fold_span`).
    fn fill_ptes(&self, t: TableRef<'_>, mut va: u64, end: u64, plan: &MapPlan) {
        let opts = plan.opts;
        let mut pa = plan.pa(va);
        let template = A::leaf_template(plan.prot, 0);
        let i = index::<A>(va, 0);
        let n = (end.wrapping_sub(va) / page_size::<A>()) as usize;
        let (lo, folded) = contpte::fold_span::<A>(0, va, end, pa, opts);
        let head = (lo.wrapping_sub(va) / page_size::<A>()) as usize;
        let mid = (folded / page_size::<A>()) as usize;
        let spans = [
            (i, i + head, false),
            (i + head, i + head + mid, true),
            (i + head + mid, i + n, false),
        ];
        let entries = t.all();
        if opts.is_barrier_per_entry() {
            for (a, b, folded) in spans {
                for e in &entries[a..b] {
                    let mut leaf = template | A::oa_field(PhysAddr(pa));
                    if folded {
                        leaf = A::mk_cont(leaf, 0);
                    }
                    A::set_pte_at(&self.mmu, VirtAddr(va), e, leaf);
                    pa += page_size::<A>();
                    // Wrapping: past the last page of the 64-bit space
                    // the address is 2^64, and it is not used again.
                    va = va.wrapping_add(page_size::<A>());
                }
            }
        } else {
            // Three plain loops (one per span), each the tight
            // template-OR-address store loop.
            let (h, m) = (spans[0].1, spans[1].1);
            pa = fill::<A, _>(&self.mmu, &entries[i..h], template, pa, page_size::<A>());
            pa = fill_cont::<A, _>(&self.mmu, &entries[h..m], template, pa, 0);
            fill::<A, _>(
                &self.mmu,
                &entries[m..i + n],
                template,
                pa,
                page_size::<A>(),
            );
        }
        self.mmu.stats.add_entries_written(n as u64);
    }

    /// The block fast path over `[va, end)` of `t` at `height`: a run of
    /// blocks, one template per part (head, folded runs, tail).
    fn fill_blocks(&self, t: TableRef<'_>, height: u32, va: u64, end: u64, plan: &MapPlan) {
        let mut pa = plan.pa(va);
        let (lo, folded) = contpte::fold_span::<A>(height, va, end, pa, plan.opts);
        let template = A::leaf_template(plan.prot, height);
        let i = index::<A>(va, height);
        let n = (end.wrapping_sub(va) >> shift::<A>(height)) as usize;
        let head = (lo.wrapping_sub(va) >> shift::<A>(height)) as usize;
        let mid = (folded >> shift::<A>(height)) as usize;
        let (h, m) = (i + head, i + head + mid);
        let step = size::<A>(height);
        let entries = t.all();
        pa = fill::<A, _>(&self.mmu, &entries[i..h], template, pa, step);
        pa = fill_cont::<A, _>(&self.mmu, &entries[h..m], template, pa, height);
        fill::<A, _>(&self.mmu, &entries[m..i + n], template, pa, step);
        self.mmu.stats.add_entries_written(n as u64);
    }
}

/// What one `map` call writes: the offset from each virtual address to
/// its physical one, the protection and the options.
#[derive(Clone, Copy)]
struct MapPlan {
    /// `pa - va`, wrapping.
    off: u64,
    prot: Prot,
    opts: MapOptions,
}

impl MapPlan {
    /// The physical address `va` maps to.
    #[inline(always)]
    fn pa(&self, va: u64) -> u64 {
        va.wrapping_add(self.off)
    }
}

/// Writes `template | pa` into each of `entries`, `pa` advancing by `step`
/// (the nosync setter: the caller issues the table's barrier); returns
/// the next `pa`.
#[inline(always)]
fn fill<A: Arch, M: Mmu>(
    mmu: &M,
    entries: &[crate::Slot],
    template: u64,
    mut pa: u64,
    step: u64,
) -> u64 {
    for e in entries {
        A::set_pte_nosync(mmu, e, template | A::oa_field(PhysAddr(pa)));
        pa = pa.wrapping_add(step);
    }
    pa
}

/// The tables a map of `[va, end)` needs below a new (empty) table at
/// `height` whose range holds it: a table for each entry that is not a
/// leaf, and what that table needs in turn. Counted, not walked: only the
/// first and the last entry can be covered in part; the whole entries
/// between them all need the same ([`whole_need`]).
fn hole_need<A: Arch>(height: u32, va: u64, end: u64, plan: &MapPlan) -> usize {
    if height == 0 || all_leaves::<A>(height, va, end, plan.pa(va), plan.opts) {
        return 0;
    }
    let entry = |v: u64, next: u64| {
        if use_leaf::<A>(height, v, next, plan.pa(v), plan.opts) {
            0
        } else {
            1 + hole_need::<A>(height - 1, v, next, plan)
        }
    };
    let first_end = entry_end::<A>(va, height, end);
    let mut need = entry(va, first_end);
    if first_end != end {
        let last = end.wrapping_sub(1) & !(size::<A>(height) - 1);
        let whole = (last.wrapping_sub(first_end) >> shift::<A>(height)) as usize;
        need += entry(last, end) + whole * whole_need::<A>(height, plan);
    }
    need
}

/// The tables a map needs for one whole entry at `height` of a new
/// table: none for a leaf, else a table at `height - 1` and what each of
/// its entries (all whole, all alike) needs.
fn whole_need<A: Arch>(height: u32, plan: &MapPlan) -> usize {
    let mut need = 0;
    for h in 1..=height {
        need = if whole_leaf::<A>(h, plan) {
            0
        } else {
            1 + entries::<A>() * need
        };
    }
    need
}

/// Whether a whole entry at `height` (above the PTE level) of `plan` is
/// mapped by a leaf: what [`use_leaf`] says for every aligned entry.
#[inline]
fn whole_leaf<A: Arch>(height: u32, plan: &MapPlan) -> bool {
    plan.opts.allows(height) && A::leaf_allowed(height) && plan.off & (size::<A>(height) - 1) == 0
}

/// [`fill`] for whole folded runs at `height`: each entry is the run's
/// entry for its own leaf, `mk_cont(template | pa)` (for arm64 the hint OR
/// the address, which the compiler hoists out of the loop; for a RISC-V
/// NAPOT run the run's base encoding, the same in every entry).
#[inline(always)]
fn fill_cont<A: Arch, M: Mmu>(
    mmu: &M,
    entries: &[crate::Slot],
    template: u64,
    mut pa: u64,
    height: u32,
) -> u64 {
    for e in entries {
        A::set_pte_nosync(
            mmu,
            e,
            A::mk_cont(template | A::oa_field(PhysAddr(pa)), height),
        );
        pa = pa.wrapping_add(size::<A>(height));
    }
    pa
}

/// Whether every entry of `[va, end)` (within one table at `height`) is a
/// leaf: blocks allowed, and VA, PA and length aligned to the block size.
#[inline]
fn all_leaves<A: Arch>(height: u32, va: u64, end: u64, pa: u64, opts: MapOptions) -> bool {
    let mask = size::<A>(height) - 1;
    opts.allows(height)
        && A::leaf_allowed(height)
        && (va | pa | end.wrapping_sub(va)) & mask == 0
        && !opts.is_barrier_per_entry()
}

/// Whether `[va, next)` at `height` is mapped by one leaf entry.
#[inline]
fn use_leaf<A: Arch>(height: u32, va: u64, next: u64, pa: u64, opts: MapOptions) -> bool {
    height == 0
        || (opts.allows(height)
            && A::leaf_allowed(height)
            && covers::<A>(va, next, height)
            && pa & (size::<A>(height) - 1) == 0)
}

#[cfg(test)]
mod tests {
    /// The 4 KiB, 4-level geometry the cases below are written for.
    type A = crate::testing::test_format::TestFormat<4>;

    use super::*;
    use crate::testing::test_format::TestFormat;

    type F = TestFormat<4>;

    /// What [`hole_need`] counts, entry by entry (phase 1 of a map into a
    /// table that does not exist yet, visiting every entry).
    fn need_by_entry(height: u32, va: u64, end: u64, plan: &MapPlan) -> usize {
        if height == 0 || all_leaves::<F>(height, va, end, plan.pa(va), plan.opts) {
            return 0;
        }
        let (mut need, mut v) = (0, va);
        loop {
            let next = entry_end::<A>(v, height, end);
            if !use_leaf::<F>(height, v, next, plan.pa(v), plan.opts) {
                need += 1 + need_by_entry(height - 1, v, next, plan);
            }
            v = next;
            if v == end {
                return need;
            }
        }
    }

    #[test]
    fn hole_need_counts_what_a_map_into_a_new_table_takes() {
        let plan = |off, opts| MapPlan {
            off,
            prot: Prot::READ_WRITE,
            opts,
        };
        // 4 MiB of pages from 2 MiB + 4 KiB under a new PUD table: three
        // PTE tables (the 2 MiB entries it touches) and one PMD table.
        let pages = plan(0, MapOptions::PAGES);
        assert_eq!(hole_need::<F>(2, 0x20_1000, 0x60_1000, &pages), 4);
        // The same with PMD blocks: the middle 2 MiB is a block.
        let blocks = plan(0, MapOptions::PMD_BLOCKS);
        assert_eq!(hole_need::<F>(2, 0x20_1000, 0x60_1000, &blocks), 3);
        let opts = [
            MapOptions::PAGES,
            MapOptions::PMD_BLOCKS,
            MapOptions::BLOCKS,
            MapOptions::BLOCKS.with_sync_each(),
        ];
        let offs = [0, 0x1000, 0x20_0000, 0x4000_0000];
        let ranges = [
            (0x1000, 0x2000),
            (0x20_0000, 0x60_0000),
            (0x1f_f000, 0x60_1000),
            (0, 0x4000_0000),
            (0x1000, 0x8000_0000),
            (0x3fe0_0000, 0x8020_0000),
        ];
        for o in opts {
            for off in offs {
                let p = plan(off, o);
                for (va, end) in ranges {
                    for h in 1..=3 {
                        if h < 3 && va >> (12 + 9 * (h + 1)) != (end - 1) >> (12 + 9 * (h + 1)) {
                            // Not inside one entry at `h + 1`.
                            continue;
                        }
                        assert_eq!(
                            hole_need::<F>(h, va, end, &p),
                            need_by_entry(h, va, end, &p),
                            "[{va:#x}, {end:#x}) at {h}, off {off:#x}, {o:?}"
                        );
                    }
                }
            }
        }
    }
}
