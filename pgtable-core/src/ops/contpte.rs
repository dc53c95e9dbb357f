//! Contiguous-hint runs (Arm ARM D8.6.1 "Contiguous bit"; Linux
//! `arch/arm64/mm/contpte.c`), generic over [`Format::cont_entries`].
//!
//! A *run* is an aligned group of `N = cont_entries(height)` adjacent
//! entries of one table. It is *folded* when every entry has the hint: the
//! hardware may then cache one translation for the whole run, so every
//! entry must map the matching part of one aligned, contiguous physical
//! range with the same attributes. The accessed and dirty states may
//! differ per entry (the hardware updates the entry it walked), so reads
//! OR them over the run and harvesting clears them over the run.
//!
//! - [`fold_span`]: which part of a `map` is written folded (decided once
//!   per table; the per-entry loop only ORs the address into a template).
//! - [`AddressSpace::contpte_unfold_edges`]: before an operation changes
//!   part of a range, the runs containing its first and last page (the
//!   only ones it can cover in part) are unfolded with break-before-make:
//!   every entry cleared with an atomic get-and-clear (so accessed/dirty
//!   state the hardware set on any of them is caught), one TLB flush for
//!   the run, every entry rewritten without the hint and with the gathered
//!   accessed/dirty state (Linux `contpte_convert`).
//! - Whole runs inside the range keep their hint: every operation changes
//!   all `N` entries alike before its final flush (Linux
//!   `contpte_wrprotect_ptes`).
//!
//! # What the entries of a cached run may disagree in
//!
//! Until an operation's flush, a CPU may hold the run's old translation
//! while its entries are rewritten one at a time. The Arm ARM (D8.6.1,
//! misprogramming the Contiguous bit) decides what that may look like:
//! - in permissions (and accessed/dirty state) only: allowed. With the
//!   hint on every entry and one output range, rule RJQQTC makes a lookup
//!   return one entry's address, permissions and attributes, never a mix
//!   and never a TLB conflict abort, so the run behaves as a stale TLB
//!   entry does until the flush. Whole-run permission changes therefore
//!   go entry by entry, in place (`change_protection_live`, a
//!   compare-exchange each) or through the get-and-clear transaction
//!   (`change_protection`), where an entry is also `0` for a moment: a CPU
//!   that walks it then takes a translation fault, which a user fault
//!   handler retries (Linux's mprotect leaves whole runs folded and
//!   cleared entry by entry too: arm64 `modify_prot_start_ptes` through
//!   `contpte_get_and_clear_full_ptes`); kernel mappings use the in-place
//!   form;
//! - in the hint, the output address or the memory type: never while the
//!   run may be cached. A valid entry without the hint among entries with
//!   it may raise a TLB conflict abort even with FEAT_BBM level 1 or 2
//!   (rule RNGLXZ), and another output address or memory type may be used
//!   for any page of the run (RJQQTC). Such changes break the whole run at
//!   once ([`break_run`]: clear all `N`, one flush, make all `N`), which a
//!   live change does only when its caller allows break-before-make.
//!
//! The simulator reports a write that makes a cached run's entries
//! disagree in the hint, output address or memory type at that write, a
//! TLB fill through such a run, and any disagreement left after an
//! operation.

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{entry_end, index, shift};
use crate::space::walker::{Next, Span, TableRef};
use crate::{
    AddressSpace, Arch, Decoded, Format, MapOptions, Mmu, PhysAddr, Slot, TableAlloc, TlbRange,
    VirtAddr,
};

/// Size in bytes of one run at `height`, or `0` where the format has none.
#[inline]
pub(crate) fn run_size<A: Format>(height: u32) -> u64 {
    u64::from(A::cont_entries(height)) << shift::<A>(height)
}

/// The folded part of a map of `[va, end)` to `pa` within one table at
/// `height`: `(lo, len)`, the entries of `[lo, lo + len)` are written with
/// the hint. It is made of the aligned runs that the range covers whole,
/// when the physical address is congruent to the virtual one modulo the run
/// size (so each run maps one aligned physical run) and `opts` allow it;
/// otherwise `(end, 0)` (the whole range is the unfolded head). `end` may be `0` for the top of the address
/// space (2^64).
#[inline]
pub(crate) fn fold_span<A: Format>(
    height: u32,
    va: u64,
    end: u64,
    pa: u64,
    opts: MapOptions,
) -> (u64, u64) {
    let run = run_size::<A>(height);
    if run == 0 || !opts.allows_contiguous() || (va ^ pa) & (run - 1) != 0 {
        return (end, 0);
    }
    let len = end.wrapping_sub(va);
    let head = va.wrapping_neg() & (run - 1);
    if head >= len {
        return (end, 0);
    }
    (va + head, (len - head) & !(run - 1))
}

/// The `N` slots of the run at `height` that holds entry `i` of `t`.
#[inline]
pub(crate) fn run_slots<A: Format>(t: &[Slot], i: usize, height: u32) -> &[Slot] {
    let n = A::cont_entries(height) as usize;
    let first = i & !(n - 1);
    &t[first..first + n]
}

/// The OR of the accessed and dirty states over the folded run `slots`:
/// `(young, dirty)` (Linux `contpte_ptep_get`).
#[inline]
pub(crate) fn gather_ad<A: Format>(slots: &[Slot]) -> (bool, bool) {
    let (mut young, mut dirty) = (false, false);
    for s in slots {
        // Relaxed: one entry at a time, as the hardware updates them.
        let raw = s.load(Relaxed);
        young |= A::is_young(raw);
        dirty |= A::is_dirty(raw);
    }
    (young, dirty)
}

/// Whether `raw` at `height` is an entry of a folded run: a present leaf
/// with the contiguous hint. [`Format::is_cont`] reads the hint bit alone,
/// which a software entry's value may set too (it decodes as
/// [`Decoded::Invalid`] and is never part of a run).
#[inline]
pub(crate) fn is_folded<A: Format>(raw: u64, height: u32) -> bool {
    A::is_cont(raw, height) && matches!(A::decode(raw, height), Decoded::Leaf(_))
}

/// The output address of the page the leaf `raw` maps at entry `index`
/// of a table at `height` (what the walker computes: [`Format::cont_pa`]
/// of the decoded address), or `None` if `raw` is not a present leaf.
#[inline]
pub(crate) fn leaf_pa<A: Format>(raw: u64, height: u32, index: usize) -> Option<PhysAddr> {
    match A::decode(raw, height) {
        Decoded::Leaf(pa) => Some(A::cont_pa(raw, pa, height, index)),
        _ => None,
    }
}

/// `raw` with the accessed/dirty state `(young, dirty)` added.
#[inline]
pub(crate) fn with_ad<A: Format>(raw: u64, height: u32, young: bool, dirty: bool) -> u64 {
    let raw = if young { A::mkyoung(raw, height) } else { raw };
    if dirty {
        A::mkdirty(raw, height)
    } else {
        raw
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// The table at `height` on the path to `va`, if it exists.
    pub(crate) fn table_on_path(&self, va: u64, height: u32) -> Option<&[Slot]> {
        if self.check_va(VirtAddr(va)).is_err() || height >= A::LEVELS {
            return None;
        }
        Some(self.table_for(va, height)?.all())
    }

    /// The folded run holding the leaf at `height` on the path to `va`:
    /// its slots and the address of its first entry, if that leaf has the
    /// hint.
    pub(crate) fn folded_run(&self, va: u64, height: u32) -> Option<(&[Slot], u64)> {
        let run = run_size::<A>(height);
        if run == 0 {
            return None;
        }
        let t = self.table_on_path(va, height)?;
        let i = index::<A>(va, height);
        // Relaxed: we hold the address space exclusively.
        let raw = t[i].load(Relaxed);
        if !matches!(A::decode(raw, height), Decoded::Leaf(_)) || !A::is_cont(raw, height) {
            return None;
        }
        Some((run_slots::<A>(t, i, height), va & !(run - 1)))
    }

    /// Unfolds the runs that `[va, end)` covers in part: at every height
    /// with a hint, the run holding `va` unless `va` starts a run, and the
    /// run holding `end - 1` unless `end` ends one. Whole runs are left
    /// folded. A no-op for formats without a hint (a constant test).
    /// Returns whether anything was unfolded.
    pub(crate) fn contpte_unfold_edges(&mut self, va: u64, end: u64) -> bool {
        self.contpte_unfold_edges_if(va, end, &|_, _| true)
    }

    /// [`contpte_unfold_edges`](Self::contpte_unfold_edges), but only the
    /// runs whose leaf `changes(raw, height)` says the operation changes
    /// (a protection change leaves runs that already grant it folded).
    pub(crate) fn contpte_unfold_edges_if(
        &mut self,
        va: u64,
        end: u64,
        changes: &impl Fn(u64, u32) -> bool,
    ) -> bool {
        let mut did = false;
        for height in 0..A::LEVELS {
            for v in self.partial_runs(va, end, height).into_iter().flatten() {
                did |= self.contpte_unfold_if(v, height, changes);
            }
        }
        did
    }

    /// The lowest address in `[va, end)` of a folded run that the range
    /// covers in part and whose leaf `changes` says would change: the
    /// operation would have to unfold it, which needs break-before-make.
    pub(crate) fn contpte_partial_change(
        &self,
        va: u64,
        end: u64,
        changes: &impl Fn(u64, u32) -> bool,
    ) -> Option<VirtAddr> {
        let mut first: Option<u64> = None;
        for height in 0..A::LEVELS {
            for v in self.partial_runs(va, end, height).into_iter().flatten() {
                if let Some((slots, _)) = self.folded_run(v, height) {
                    // Relaxed: we hold the address space; the hardware
                    // changes accessed/dirty state only.
                    let raw = slots[0].load(Relaxed);
                    if changes(raw, height) && first.is_none_or(|f| v < f) {
                        first = Some(v);
                    }
                }
            }
        }
        first.map(VirtAddr)
    }

    /// The addresses in `[va, end)` whose run at `height` the range covers
    /// in part: its first page, and the first page of the range in the run
    /// holding its last page, where they are not on a run boundary.
    fn partial_runs(&self, va: u64, end: u64, height: u32) -> [Option<u64>; 2] {
        let run = run_size::<A>(height);
        if run == 0 {
            return [None, None];
        }
        let first = (va & (run - 1) != 0).then_some(va);
        let last = (end & (run - 1) != 0).then_some((end.wrapping_sub(1) & !(run - 1)).max(va));
        [first, last]
    }

    /// [`contpte_unfold_edges`](Self::contpte_unfold_edges) at one height.
    fn contpte_unfold_edges_at(&mut self, va: u64, end: u64, height: u32) -> bool {
        let mut did = false;
        for v in self.partial_runs(va, end, height).into_iter().flatten() {
            did |= self.contpte_unfold(v, height);
        }
        did
    }

    /// Before moving `[old, old + len)` to `new`: where source and
    /// destination are congruent modulo a height's run size, only the runs
    /// the range covers in part are unfolded, and whole runs move folded;
    /// where they are not, every run of the source at that height is
    /// unfolded (a moved run would not be aligned in the destination).
    pub(crate) fn contpte_before_move(&mut self, old: u64, new: u64, len: u64) {
        let end = old.wrapping_add(len);
        for height in 0..A::LEVELS {
            let run = run_size::<A>(height);
            if run == 0 {
                continue;
            }
            if (old ^ new) & (run - 1) == 0 {
                self.contpte_unfold_edges_at(old, end, height);
            } else {
                self.contpte_unfold_all_at(old, end, height);
            }
        }
    }

    /// Unfolds every folded run at `height` in `[va, end)`, on the cursor
    /// over the runs the range touches: its spans at `height` are read one
    /// run at a time; only formats with a hint get here.
    pub(crate) fn contpte_unfold_all_at(&mut self, va: u64, end: u64, height: u32) -> bool {
        let run = run_size::<A>(height);
        let n = A::cont_entries(height) as usize;
        let s: &Self = self;
        // From the first page of the run holding `va` to the end of the
        // one holding `end - 1` (0: the top of the 64-bit space).
        let start = va & !(run - 1);
        let stop = (end.wrapping_sub(1) | (run - 1)).wrapping_add(1);
        let mut did = false;
        let mut cur = s.cursor(start, stop);
        while let Some(sp) = cur.span() {
            if sp.height > height {
                if let Some((c, va)) = s.first_table(sp) {
                    cur.descend(c, va);
                    continue;
                }
            } else {
                // The span starts and ends on run boundaries.
                for i in (sp.from..sp.to).step_by(n) {
                    let base = sp
                        .va
                        .wrapping_add(((i - sp.from) as u64) << shift::<A>(height));
                    did |= s.unfold_at(sp.table, i, height, base);
                }
            }
            cur.advance(sp.next);
        }
        did
    }

    /// The first table entry of `sp`: its table and first address.
    fn first_table<'a>(&'a self, sp: Span<'a, A>) -> Option<(TableRef<'a>, u64)> {
        let mut va = sp.va;
        for i in sp.from..sp.to {
            if let Next::Table(c) = self.read(sp.table, i, sp.height).1 {
                return Some((c, va));
            }
            va = entry_end::<A>(va, sp.height, sp.next);
        }
        None
    }

    /// Unfolds the run starting at entry `i` of `t` (at `height`, first
    /// address `base`) if it is folded.
    fn unfold_at(&self, t: TableRef<'_>, i: usize, height: u32, base: u64) -> bool {
        if !is_folded::<A>(t.load(i), height) {
            return false;
        }
        self.unfold_run(run_slots::<A>(t.all(), i, height), base, height);
        true
    }

    /// Unfolds the folded run holding the leaf at `height` on the path to
    /// `va`, if there is one (Linux `__contpte_try_unfold` and
    /// `contpte_convert`): break-before-make for the whole run.
    pub(crate) fn contpte_unfold(&mut self, va: u64, height: u32) -> bool {
        self.contpte_unfold_if(va, height, &|_, _| true)
    }

    /// [`contpte_unfold`](Self::contpte_unfold) if `changes` holds for the
    /// run's leaf.
    fn contpte_unfold_if(
        &mut self,
        va: u64,
        height: u32,
        changes: &impl Fn(u64, u32) -> bool,
    ) -> bool {
        let Some((slots, base)) = self.folded_run(va, height) else {
            return false;
        };
        // Relaxed: we hold the address space; the hardware changes
        // accessed/dirty state only, which `changes` does not look at.
        if !changes(slots[0].load(Relaxed), height) {
            return false;
        }
        self.unfold_run(slots, base, height);
        true
    }

    /// Unfolds the folded run `slots` at `height` (first address `base`).
    fn unfold_run(&self, slots: &[Slot], base: u64, height: u32) {
        // The same leaves without the hint, each with the run's
        // accessed/dirty state (which page the hardware marked is unknown).
        break_run::<A, _>(
            &self.mmu,
            slots,
            base,
            height,
            |o, i, young, dirty| match A::decode(o, height) {
                Decoded::Leaf(_) => {
                    with_ad::<A>(A::clear_cont_at(o, height, i), height, young, dirty)
                }
                _ => o,
            },
        );
        self.mmu.stats.add_entries_written(slots.len() as u64);
        // The walker sees the new entries before the caller goes on.
        self.mmu.walker_barrier();
    }
}

/// Break-before-make for the whole run `slots` at `height` (first address
/// `base`): every entry taken out with an atomic get-and-clear (so an
/// accessed/dirty update the hardware made up to then is in the value
/// returned; none after it, an invalid entry is never updated), one TLB
/// flush for the run, then every entry made again as `make(old, index,
/// young, dirty)`, where `index` is the entry's index in its table and
/// `young`/`dirty` are ORed over the run. The caller issues the walker
/// barrier (or its table's).
pub(crate) fn break_run<A: Arch, M: Mmu>(
    mmu: &M,
    slots: &[Slot],
    base: u64,
    height: u32,
    make: impl Fn(u64, usize, bool, bool) -> u64,
) {
    let mut old = [0u64; MAX_RUN];
    let (mut young, mut dirty) = (false, false);
    for (o, s) in old.iter_mut().zip(slots) {
        *o = if height == 0 {
            A::ptep_get_and_clear(mmu, s)
        } else {
            A::pmdp_huge_get_and_clear(mmu, s)
        };
        young |= A::is_young(*o);
        dirty |= A::is_dirty(*o);
    }
    // One flush for the run, before any entry is made again (the flush
    // orders the clears before the invalidation: the `Mmu` rules).
    let run = (slots.len() as u64) << shift::<A>(height);
    mmu.flush_tlb_range(TlbRange {
        start: VirtAddr(base),
        end: VirtAddr(base.wrapping_add(run)),
        stride_shift: shift::<A>(height),
        last_level: true,
    });
    let first = index::<A>(base, height);
    for (k, (o, s)) in old.iter().zip(slots).enumerate() {
        // Only leaves are made again (a folded run holds nothing else; an
        // entry that was not a leaf goes back as it was).
        match A::decode(*o, height) {
            Decoded::Leaf(_) => A::set_pte_nosync(mmu, s, make(*o, first + k, young, dirty)),
            Decoded::None => {}
            _ => A::set_pte_nosync(mmu, s, *o),
        }
    }
}

/// The largest run any format may declare (Arm ARM: 128 entries, 16 KiB
/// granule level 3).
pub(crate) const MAX_RUN: usize = 128;
