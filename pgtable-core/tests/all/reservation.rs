//! The check → reserve → write promise, checked exhaustively on a grid of
//! small cases: starts at page offsets around PMD and PUD boundaries,
//! lengths from one page to past 1 GiB, destinations next to the source
//! (above and below, sharing its tables) and far from it, and layouts of
//! existing mappings (pages at the ends of the range and on both sides of
//! it, a full PTE table, a 2 MiB block, a 1 GiB block).
//!
//! For every case of `move_page_tables`, `map`, `unmap` and
//! `change_protection`:
//! - the result is what a reference model of the mappings predicts: the
//!   error for invalid input, otherwise the exact mappings afterwards
//!   (compared as runs of contiguous memory with one set of attributes,
//!   so a block split into pages compares equal to the block);
//! - with the allocator failing after `k` allocations, for every `k` below
//!   what the operation needs, it returns [`Error::OutOfMemory`] and every
//!   reachable table is unchanged, entry for entry, with no frame leaked;
//! - once it succeeds, it reserved exactly the tables it took into the
//!   tables (the arena's allocations against the `tables_allocated`
//!   counter, with the `stats` feature), no frame leaked, and no table but
//!   the root is empty.
//!
//! A debug build takes a few seconds for the grid; under Miri
//! (`cargo xtask miri`) each grid runs a sample of its cases
//! (`miri_sample_sparse`: every 1009th), each checked as natively.
#![cfg(feature = "alloc")]

use std::cell::Cell;
use std::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::{Arena, Decoded, Format, NoopMmu, Stats, TableAlloc, PAGE_SIZE};
use pgtable_core::test_format::{TestFormat, ACCESSED, ADDR_MASK, DIRTY, TABLE_OR_PAGE};
use pgtable_core::{
    variants, AddressSpace, Error, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr,
};
use pgtable_testkit::miri_sample_sparse;

const K4: u64 = PAGE_SIZE;
const M1: u64 = 1 << 20;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

/// Existing mappings map `va & PA_MASK` (blocks stay aligned).
const PA_MASK: u64 = (1 << 44) - 1;

/// Where the source side of every case lives (PUD aligned).
const BASE: u64 = 4 * G1;

/// Start offsets from `BASE`: around a PMD boundary, then around a PUD
/// boundary.
const OFFSETS: [u64; 12] = [
    0,
    K4,
    M1 - K4,
    M2 - K4,
    M2,
    M2 + K4,
    2 * M2,
    G1 - M2,
    G1 - K4,
    G1,
    G1 + K4,
    G1 + M2,
];

/// Lengths.
const LENGTHS: [u64; 8] = [K4, 2 * K4, M2 - K4, M2, M2 + K4, 2 * M2, G1, G1 + M2];

type Space<const L: u32> = AddressSpace<TestFormat<L>, NoopMmu, Arena>;

/// Virtually and physically contiguous memory with one set of attributes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct Run {
    va: u64,
    end: u64,
    pa: u64,
    attrs: u64,
}

/// The attributes of a leaf: everything but its address and the bit that
/// tells pages from blocks.
fn attrs(entry: u64) -> u64 {
    entry & !(ADDR_MASK | TABLE_OR_PAGE)
}

/// Sorts `v` and merges the runs that continue each other.
fn normalize(mut v: Vec<Run>) -> Vec<Run> {
    v.retain(|r| r.va < r.end);
    v.sort();
    let mut out: Vec<Run> = Vec::new();
    for r in v {
        if let Some(l) = out.last_mut() {
            if l.end == r.va && l.pa + (l.end - l.va) == r.pa && l.attrs == r.attrs {
                l.end = r.end;
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// Every leaf of `tables` (from [`tables`]), as runs.
fn runs_of<const L: u32>(tables: &[Copy]) -> Vec<Run> {
    let mut v = Vec::new();
    for t in tables {
        let size = 1u64 << (12 + 9 * t.height);
        for_each_used(&t.entries, |i, raw| {
            if let Decoded::Leaf(pa) = TestFormat::<L>::decode(raw, t.height) {
                let va = t.va + i as u64 * size;
                v.push(Run {
                    va,
                    end: va + size,
                    pa: pa.0,
                    attrs: attrs(raw),
                });
            }
        });
    }
    normalize(v)
}

/// The parts of `runs` inside `[lo, hi)` and the parts outside.
fn split_runs(runs: &[Run], lo: u64, hi: u64) -> (Vec<Run>, Vec<Run>) {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    for r in runs {
        let (a, b) = (r.va.max(lo), r.end.min(hi));
        if a >= b {
            outside.push(*r);
            continue;
        }
        let part = |va: u64, end: u64| Run {
            va,
            end,
            pa: r.pa + (va - r.va),
            attrs: r.attrs,
        };
        inside.push(part(a, b));
        outside.push(part(r.va, a));
        outside.push(part(b, r.end));
    }
    (normalize(inside), normalize(outside))
}

/// The first mapped address in `[lo, hi)`.
fn first_mapped(runs: &[Run], lo: u64, hi: u64) -> Option<u64> {
    runs.iter()
        .filter(|r| r.va < hi && lo < r.end)
        .map(|r| r.va.max(lo))
        .min()
}

/// Calls `f` with the index and value of every nonzero entry (most are
/// zero: chunks of zeros are skipped with one slice comparison, a
/// `memcmp`, which keeps the debug build fast).
fn for_each_used(entries: &[u64; 512], mut f: impl FnMut(usize, u64)) {
    const CHUNK: usize = 32;
    for (c, chunk) in entries.chunks_exact(CHUNK).enumerate() {
        if chunk == [0u64; CHUNK] {
            continue;
        }
        for (i, &raw) in chunk.iter().enumerate() {
            if raw != 0 {
                f(c * CHUNK + i, raw);
            }
        }
    }
}

/// A copy of one table reachable from the root.
#[derive(PartialEq, Eq, Debug)]
struct Copy {
    /// Its frame.
    pa: u64,
    height: u32,
    /// The first address it maps (lower half only).
    va: u64,
    entries: Box<[u64; 512]>,
}

/// Whether every table of `before` (from [`tables`]) still holds the same
/// entries: then the same tables are reachable, with the same entries
/// (by induction from the root, which never changes).
fn unchanged<const L: u32>(s: &Space<L>, before: &[Copy]) -> bool {
    before.iter().all(|t| {
        // SAFETY: the frame was a table of `s` before the operation, a frame
        // of this arena; a failed operation frees none (and if it did, the
        // arena keeps freed frames allocated for reuse, so the read stays
        // in bounds and the comparison fails). `AtomicU64` has the
        // in-memory representation of `u64`, and nothing writes the table
        // meanwhile.
        let now = unsafe {
            s.alloc()
                .phys_to_virt(PhysAddr(t.pa))
                .as_ref()
                .entries()
                .as_ptr()
                .cast::<[u64; 512]>()
                .read()
        };
        now == *t.entries
    })
}

/// Every table reachable from the root, entry for entry.
fn tables<const L: u32>(s: &Space<L>) -> Vec<Copy> {
    let mut out = Vec::new();
    let mut todo = vec![(s.root(), L - 1, 0u64)];
    while let Some((pa, height, va)) = todo.pop() {
        // SAFETY: `pa` is the root or a table reached from it, a live frame
        // of this arena, and `s` is borrowed for the whole walk, so no
        // operation frees it meanwhile.
        let t = unsafe { s.alloc().phys_to_virt(pa).as_ref() };
        // SAFETY: `AtomicU64` has the in-memory representation of `u64`,
        // and nothing writes the table meanwhile (`s` is borrowed). A plain
        // copy keeps the debug build fast.
        let entries = Box::new(unsafe { t.entries().as_ptr().cast::<[u64; 512]>().read() });
        if height > 0 {
            let size = 1u64 << (12 + 9 * height);
            for_each_used(&entries, |i, raw| {
                if let Decoded::Table(c) = TestFormat::<L>::decode(raw, height) {
                    todo.push((c, height - 1, va.wrapping_add(i as u64 * size)));
                }
            });
        }
        out.push(Copy {
            pa: pa.0,
            height,
            va,
            entries,
        });
    }
    out
}

/// What an operation did: its result, and the mappings before and after.
struct Outcome {
    result: Result<(), Error>,
    before: Vec<Run>,
    after: Vec<Run>,
}

/// Runs `op` with the allocator failing after `k` = 0, 1, 2, ... table
/// allocations until it returns anything but [`Error::OutOfMemory`], and
/// returns what it did then. Checks that every failure ran the allocator dry and left
/// every table exactly as it was, with no frame leaked, and that the
/// success reserved exactly the tables it took, leaked nothing and left no
/// empty table behind.
fn with_failures<const L: u32>(
    s: &mut Space<L>,
    case: &dyn Fn() -> String,
    op: &mut dyn FnMut(&mut Space<L>) -> Result<(), Error>,
) -> Outcome {
    let before = tables(s);
    let runs_before = runs_of::<L>(&before);
    let live = s.alloc().live();
    assert_eq!(live, before.len(), "{}: leak before the case", case());
    let mut k = 0;
    loop {
        s.alloc().fail_after(Some(k));
        let (allocs, stat) = (s.alloc().allocs(), s.stats().tables_allocated());
        let r = op(s);
        s.alloc().fail_after(None);
        let reserved = s.alloc().allocs() - allocs;
        let taken = s.stats().tables_allocated() - stat;
        if r != Err(Error::OutOfMemory) {
            if r.is_err() {
                assert_eq!(k, 0, "{}: {r:?} after an allocation failure", case());
                assert!(
                    unchanged(s, &before),
                    "{}: {r:?} changed the tables",
                    case()
                );
                return Outcome {
                    result: r,
                    after: runs_before.clone(),
                    before: runs_before,
                };
            } else {
                assert_eq!(reserved, k, "{}: allocated past the reservation", case());
                if Stats::ENABLED {
                    assert_eq!(taken, reserved, "{}: tables taken vs reserved", case());
                }
                assert_eq!(
                    s.alloc().live(),
                    s.inspect().count_tables(),
                    "{}: leak",
                    case()
                );
                let after = tables(s);
                for t in &after {
                    assert!(
                        t.pa == s.root().0 || t.entries.iter().any(|&e| e != 0),
                        "{}: empty table at height {} left behind",
                        case(),
                        t.height
                    );
                }
                return Outcome {
                    result: r,
                    before: runs_before,
                    after: runs_of::<L>(&after),
                };
            }
        }
        // A real allocation failure: the budget ran out.
        assert_eq!(reserved, k, "{}: OutOfMemory with memory left", case());
        assert_eq!(taken, 0, "{}: a failed case took tables", case());
        assert_eq!(s.alloc().live(), live, "{}: leak after failure {k}", case());
        assert!(
            unchanged(s, &before),
            "{}: failure after {k} allocations changed the tables",
            case()
        );
        k += 1;
    }
}

/// An existing mapping: `len` bytes at `va`, mapped to the same physical
/// address (so blocks are aligned), as pages or as one block.
#[derive(Clone, Copy, Debug)]
struct Piece {
    va: u64,
    len: u64,
    block: bool,
}

const fn pages(va: u64, len: u64) -> Piece {
    Piece {
        va,
        len,
        block: false,
    }
}

const fn block(va: u64, len: u64) -> Piece {
    Piece {
        va,
        len,
        block: true,
    }
}

/// Layouts that do not depend on the case: a page in a PTE table, pages at
/// both edges of a PMD and of a PUD boundary, a full PTE table, a 2 MiB
/// block, a 1 GiB block.
fn fixed_layouts() -> Vec<(&'static str, Vec<Piece>)> {
    vec![
        ("page", vec![pages(BASE + M2 + 2 * K4, K4)]),
        (
            "table edges",
            vec![pages(BASE + M2 - K4, 2 * K4), pages(BASE + G1 - K4, 2 * K4)],
        ),
        ("full table", vec![pages(BASE + M2, M2)]),
        ("2M block", vec![block(BASE + M2, M2)]),
        ("1G block", vec![block(BASE + G1, G1)]),
    ]
}

/// A space with `layout` mapped; some leaves accessed and dirty, as the
/// hardware would leave them, so that operations must carry that state.
fn build<const L: u32>(layout: &[Piece]) -> Space<L> {
    let mut s = Space::<L>::new(NoopMmu, Arena::new()).unwrap();
    let mut mapped: Vec<(u64, u64)> = Vec::new();
    for p in layout {
        // Layouts built from a case may repeat a page: map it once.
        if mapped
            .iter()
            .any(|&(a, l)| a < p.va + p.len && p.va < a + l)
        {
            continue;
        }
        let opts = if p.block {
            MapOptions::BLOCKS
        } else {
            MapOptions::PAGES
        };
        s.map(
            VirtAddr(p.va),
            PhysAddr(p.va & PA_MASK),
            p.len,
            Prot::READ_WRITE,
            opts,
        )
        .unwrap();
        mapped.push((p.va, p.len));
    }
    for (n, t) in tables(&s).iter().enumerate() {
        // SAFETY: a table of `s`, reached from its root just now: a live
        // frame of this arena. `s` does nothing meanwhile, so setting
        // accessed and dirty bits here is what hardware could do.
        let tt = unsafe { s.alloc().phys_to_virt(PhysAddr(t.pa)).as_ref() };
        for (i, &raw) in t.entries.iter().enumerate() {
            if let Decoded::Leaf(_) = TestFormat::<L>::decode(raw, t.height) {
                let bits = match (n + i) % 3 {
                    0 => 0,
                    1 => ACCESSED,
                    _ => ACCESSED | DIRTY,
                };
                tt.entries()[i].fetch_or(bits, Relaxed);
            }
        }
    }
    s.stats().reset();
    s
}

/// Checks that the first and last page of every run of `expected` moved
/// from `[old, old + len)` translate at the destination, and that the
/// source no longer does.
fn assert_translated<const L: u32>(
    s: &Space<L>,
    moved: &[Run],
    delta: u64,
    case: &dyn Fn() -> String,
) {
    for r in moved {
        for va in [r.va, r.end - K4] {
            let t = s.translate(VirtAddr(va.wrapping_add(delta)));
            assert_eq!(
                t.map(|t| t.pa.0),
                Some(r.pa + (va - r.va)),
                "{}: page of {va:#x}",
                case()
            );
            assert!(
                s.translate(VirtAddr(va)).is_none(),
                "{}: {va:#x} still mapped",
                case()
            );
        }
    }
}

/// Destinations for a move of `len` bytes from `old`: next to the source
/// above and below, 0, 4 KiB or 2 MiB away (sharing its tables); and far
/// from it, at offsets around a PMD and a PUD boundary, where the PMD table
/// is missing, or every table below the root.
fn destinations<const L: u32>(old: u64, len: u64) -> Vec<u64> {
    let mut v = Vec::new();
    for gap in [0, K4, M2] {
        v.push(old + len + gap);
        if let Some(below) = old.checked_sub(len + gap) {
            v.push(below);
        }
    }
    for off in [0, K4, M2 - K4, G1 - K4] {
        v.push(BASE + 16 * G1 + off);
    }
    for off in [K4, G1] {
        v.push((1u64 << (TestFormat::<L>::VA_BITS - 2)) + off);
    }
    v
}

/// The moves of the grid with source offsets `offsets` and lengths
/// `lengths`, in a `TestFormat<L>` space, each with every one of
/// `all_opts`. Returns the number of cases run.
fn move_grid<const L: u32>(all_opts: &[MoveOptions], offsets: &[u64], lengths: &[u64]) -> usize {
    let mut cases = 0;
    for &off in offsets {
        let old = BASE + off;
        for &len in lengths {
            for new in destinations::<L>(old, len) {
                let mut layouts = fixed_layouts();
                // Pages at both ends of the source, and next to the ends of
                // both ranges (so their tables stay).
                layouts.push((
                    "range edges",
                    vec![pages(old, K4), pages(old + len - K4, K4)],
                ));
                layouts.push((
                    "both sides",
                    vec![pages(old - K4, K4), pages(old, K4), pages(old + len, K4)],
                ));
                layouts.push((
                    "dest sides",
                    vec![pages(old, K4), pages(new - K4, K4), pages(new + len, K4)],
                ));
                for (name, layout) in &layouts {
                    if heavy(layout, old, new, len) {
                        continue;
                    }
                    for &opts in all_opts {
                        move_case::<L>(layout, name, old, new, len, opts);
                        cases += 1;
                    }
                }
            }
        }
    }
    cases
}

/// Whether the move splits most of a 1 GiB block into pages (when source
/// and destination are not equally placed in a PMD): 262,144 entries, too
/// slow for a debug build, and counted like a split at either end of it.
fn heavy(layout: &[Piece], old: u64, new: u64, len: u64) -> bool {
    layout.iter().any(|p| {
        let covered = (old + len).min(p.va + p.len).saturating_sub(old.max(p.va));
        p.block && p.len == G1 && covered > 2 * M2 && new % M2 != old % M2
    })
}

/// With [`MoveOptions::free_below`]: the first mapped address in the space
/// the caller claimed free, when the mutual-alignment rule applies (same
/// offset in a PMD at both starts, the range reaching the next PMD
/// boundary, the widened ranges disjoint).
fn wrong_claim(before: &[Run], old: u64, new: u64, len: u64, opts: MoveOptions) -> Option<u64> {
    let off = old % M2;
    // The realignment is a PMD fast path: the caller, the arch and the
    // crate feature must all allow it.
    let pmd = opts.allows_pmd() && cfg!(feature = "move-pmd");
    if !opts.claims_free_below() || !pmd || off == 0 || off != new % M2 || len < M2 - off {
        return None;
    }
    let (ao, an, alen) = (old - off, new - off, len + off);
    if ao < an + alen && an < ao + alen {
        return None;
    }
    first_mapped(before, ao, old).or_else(|| first_mapped(before, an, new))
}

/// Whether the next case of this thread's grid runs: every case
/// natively, a sample under Miri ([`miri_sample_sparse`]).
fn next_case_runs() -> bool {
    thread_local!(static CASES: Cell<usize> = const { Cell::new(0) });
    CASES.with(|n| {
        let i = n.get();
        n.set(i + 1);
        miri_sample_sparse(i)
    })
}

fn move_case<const L: u32>(
    layout: &[Piece],
    name: &str,
    old: u64,
    new: u64,
    len: u64,
    opts: MoveOptions,
) {
    if !next_case_runs() {
        return;
    }
    let mut s = build::<L>(layout);
    let case = || format!("L{L} move {old:#x} -> {new:#x} len {len:#x} {opts:?}, layout {name}");
    let out = with_failures(&mut s, &case, &mut |s| {
        s.move_page_tables(VirtAddr(old), VirtAddr(new), len, opts)
    });
    let expected = if old < new + len && new < old + len {
        Err(Error::Overlap)
    } else if let Some(a) = first_mapped(&out.before, new, new + len) {
        Err(Error::AlreadyMapped(VirtAddr(a)))
    } else if let Some(a) = wrong_claim(&out.before, old, new, len, opts) {
        Err(Error::AlreadyMapped(VirtAddr(a)))
    } else {
        Ok(())
    };
    assert_eq!(out.result, expected, "{}", case());
    if out.result.is_ok() {
        let (moved, stay) = split_runs(&out.before, old, old + len);
        let delta = new.wrapping_sub(old);
        let mut want = stay;
        want.extend(moved.iter().map(|r| Run {
            va: r.va.wrapping_add(delta),
            end: r.end.wrapping_add(delta),
            ..*r
        }));
        assert_eq!(out.after, normalize(want), "{}", case());
        assert_translated(&s, &moved, delta, &case);
    }
}

// The move grid runs as several tests so that the harness runs them in
// parallel.

#[test]
fn every_small_move_keeps_the_reservation_promise() {
    let cases = move_grid::<4>(&[MoveOptions::DEFAULT], &OFFSETS, &LENGTHS);
    assert!(cases > 9_000, "{cases} cases");
}

#[test]
fn every_small_move_keeps_the_reservation_promise_on_the_pte_path() {
    let cases = move_grid::<4>(&[variants::PTES_ONLY], &OFFSETS, &LENGTHS);
    assert!(cases > 9_000, "{cases} cases");
}

#[test]
fn every_small_move_keeps_the_reservation_promise_without_pud_moves() {
    // Only 1 GiB and longer moves can move a whole PUD entry.
    move_grid::<4>(&[variants::PMD_ONLY], &OFFSETS, &[G1, G1 + M2]);
}

#[test]
fn every_small_move_with_a_free_below_claim_keeps_the_reservation_promise() {
    // The claim matters where the mutual-alignment rule can apply: starts
    // inside a PMD.
    let claim = MoveOptions::DEFAULT.free_below();
    let offsets = [K4, M1 - K4, M2 + K4, G1 - K4, G1 + K4];
    let lengths = [K4, M2 - K4, M2, 2 * M2, G1 + M2];
    move_grid::<4>(&[claim], &offsets, &lengths);
}

#[test]
fn every_small_move_keeps_the_reservation_promise_at_3_and_5_levels() {
    // The root is the PUD table (3 levels) or two levels above it (5).
    let offsets = [0, K4, M2, G1 - K4, G1];
    let lengths = [K4, M2, M2 + K4, G1 + M2];
    move_grid::<3>(&[MoveOptions::DEFAULT], &offsets, &lengths);
    move_grid::<5>(&[MoveOptions::DEFAULT], &offsets, &lengths);
}

/// Ranges for the single-range operations: every offset of [`OFFSETS`]
/// from `BASE`, and from a far base with nothing mapped, with every length.
fn ranges<const L: u32>() -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    for base in [BASE, 1u64 << (TestFormat::<L>::VA_BITS - 2)] {
        for off in OFFSETS {
            for len in LENGTHS {
                v.push((base + off, len));
            }
        }
    }
    v
}

/// Layouts for a single-range case: the fixed ones, nothing, and pages at
/// both ends of the range and right outside it.
fn range_layouts(va: u64, len: u64) -> Vec<(&'static str, Vec<Piece>)> {
    let mut layouts = fixed_layouts();
    layouts.push(("empty", Vec::new()));
    layouts.push(("range edges", vec![pages(va, K4), pages(va + len - K4, K4)]));
    layouts.push(("both sides", vec![pages(va - K4, K4), pages(va + len, K4)]));
    layouts
}

fn map_grid<const L: u32>() {
    let template = attrs(TestFormat::<L>::leaf(PhysAddr(0), Prot::READ_WRITE, 0));
    for (va, len) in ranges::<L>() {
        for (name, layout) in range_layouts(va, len) {
            for opts in [
                MapOptions::PAGES,
                MapOptions::PMD_BLOCKS,
                MapOptions::BLOCKS,
            ] {
                // Aligned like the address (blocks possible), and not.
                for pa in [va + 64 * G1, va + 64 * G1 + K4] {
                    if len >= G1 && (opts == MapOptions::PAGES || pa % M2 != va % M2) {
                        // 262,144 pages: too slow for a debug build, and
                        // counted like the shorter page ranges.
                        continue;
                    }
                    if !next_case_runs() {
                        continue;
                    }
                    let mut s = build::<L>(&layout);
                    let case = || {
                        format!("L{L} map {va:#x} len {len:#x} to {pa:#x} {opts:?}, layout {name}")
                    };
                    let out = with_failures(&mut s, &case, &mut |s| {
                        s.map(VirtAddr(va), PhysAddr(pa), len, Prot::READ_WRITE, opts)
                    });
                    let r = out.result;
                    match first_mapped(&out.before, va, va + len) {
                        // The address reported is the entry that is in the
                        // way: at or before the first mapped address.
                        Some(first) => match r {
                            Err(Error::AlreadyMapped(a)) => {
                                assert!((va..=first).contains(&a.0), "{}: {a:?}", case());
                            }
                            _ => panic!("{}: {r:?}, expected AlreadyMapped", case()),
                        },
                        None => {
                            assert_eq!(r, Ok(()), "{}", case());
                            let mut want = out.before;
                            want.push(Run {
                                va,
                                end: va + len,
                                pa,
                                attrs: template,
                            });
                            assert_eq!(out.after, normalize(want), "{}", case());
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_small_map_keeps_the_reservation_promise() {
    map_grid::<4>();
}

fn unmap_grid<const L: u32>() {
    for (va, len) in ranges::<L>() {
        for (name, layout) in range_layouts(va, len) {
            if !next_case_runs() {
                continue;
            }
            let mut s = build::<L>(&layout);
            let case = || format!("L{L} unmap {va:#x} len {len:#x}, layout {name}");
            let out = with_failures(&mut s, &case, &mut |s| s.unmap(VirtAddr(va), len));
            assert_eq!(out.result, Ok(()), "{}", case());
            let want = split_runs(&out.before, va, va + len).1;
            assert_eq!(out.after, want, "{}", case());
        }
    }
}

#[test]
fn every_small_unmap_keeps_the_reservation_promise() {
    unmap_grid::<4>();
}

fn protect_grid<const L: u32>() {
    for (va, len) in ranges::<L>() {
        for (name, layout) in range_layouts(va, len) {
            // A change (blocks partly covered are split) and none (they
            // are not).
            for prot in [Prot::READ_ONLY, Prot::READ_WRITE] {
                if !next_case_runs() {
                    continue;
                }
                let mut s = build::<L>(&layout);
                let case = || {
                    format!("L{L} change_protection {va:#x} len {len:#x} {prot:?}, layout {name}")
                };
                let out = with_failures(&mut s, &case, &mut |s| {
                    s.change_protection(VirtAddr(va), len, prot)
                });
                assert_eq!(out.result, Ok(()), "{}", case());
                let (inside, mut want) = split_runs(&out.before, va, va + len);
                want.extend(inside.iter().map(|r| Run {
                    attrs: TestFormat::<L>::modify_prot(r.attrs, prot, 0),
                    ..*r
                }));
                assert_eq!(out.after, normalize(want), "{}", case());
            }
        }
    }
}

#[test]
fn every_small_protection_change_keeps_the_reservation_promise() {
    protect_grid::<4>();
}
