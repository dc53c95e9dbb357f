//! The arm64 translation granules side by side on the host: the same
//! per-page work with 4 KiB ([`Arm64`]), 16 KiB ([`Arm64K16`]) and 64 KiB
//! ([`Arm64K64`]) pages, 48-bit addresses each. Every benchmark works on
//! [`PAGES`] pages (256 MiB, 1 GiB and 4 GiB of address space), so
//! criterion's throughput is pages and the report's figure is the median
//! divided by [`PAGES`]: ns per page.
//!
//! | group | what one timed sample does |
//! |---|---|
//! | `arm64-granules-map` | map the range with pages into an empty space |
//! | `arm64-granules-unmap` | unmap the mapped range (frees its tables) |
//! | `arm64-granules-protect` | toggle the range RW <-> RO (every entry changes) |
//! | `arm64-granules-move` | `move_page_tables` of the range by one page more than a multiple of the PMD size: every PTE moves (Linux `move_ptes`) |
//!
//! One more page stays mapped right after the range throughout (the
//! guard), so the tables above the PTE level on its path never become
//! empty: unmap and move free the PTE tables only, as in an address space
//! with other mappings, and no figure includes freeing the upper tables
//! once per call (a PMD table of the 64 KiB granule has 8,192 entries).
//!
//! Each group has the functions `4K`, `16K` and `64K`. Pages are mapped
//! without the contiguous hint (`MapOptions::no_contiguous`): its run is 16,
//! 128 or 32 entries depending on the granule (Arm ARM D8.6.1), so with it
//! the figures would compare the hint's runs rather than the granules (the
//! `contpte` bench measures the hint). Tables come from an [`Arena`] of the
//! format's page size, warmed so no timed part pays the host allocator
//! (the arena zeroes a table when it frees it, inside the timed unmap and
//! move); no TLB work ([`NoopMmu`]). Setup and teardown run outside the
//! timed part; the clock is the harness's (`PEERS_CLOCK=thread`: the
//! thread's CPU time), the sample count the harness's (10 with
//! `PGTABLE_BENCH_QUICK`).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use pgtable_arm64::{Arm64, Arm64K16, Arm64K64};
use pgtable_bench::harness::{clock, sample_size};
use pgtable_core::contract::level::{page_size, shift, size};
use pgtable_core::contract::{Arch, Arena, NoopMmu};
use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};

/// Pages per timed sample, the same for every granule: enough that a
/// sample lasts tens of microseconds even for `unmap` (which frees whole
/// tables without visiting their entries), so one pair of clock reads is
/// a small part of it.
const PAGES: u64 = 1 << 16;
/// Start of the range: 8 GiB, aligned to every granule's PMD size (2 MiB,
/// 32 MiB, 512 MiB).
const VA: u64 = 8 << 30;
/// Start of the physical range (aligned to every page size).
const PA: u64 = 2 << 30;
/// The move's destination is this far above [`VA`], plus one page: a
/// multiple of every granule's PMD size, so the offset modulo the PMD
/// size is one page and no PMD entry can move whole.
const MOVE_BY: u64 = 64 << 30;

/// Pages only, one entry each.
const OPTS: MapOptions = MapOptions::PAGES.no_contiguous();

type Space<F> = AddressSpace<F, NoopMmu, Arena>;

/// Bytes of the range with `F`'s pages.
fn len<F: Arch>() -> u64 {
    PAGES * page_size::<F>()
}

/// Where the move puts the range.
fn moved<F: Arch>() -> u64 {
    VA + MOVE_BY + page_size::<F>()
}

fn map<F: Arch>(s: &mut Space<F>, va: u64) {
    s.map(
        VirtAddr(va),
        PhysAddr(PA),
        len::<F>(),
        Prot::READ_WRITE,
        OPTS,
    )
    .unwrap()
}

fn unmap<F: Arch>(s: &mut Space<F>, va: u64) {
    s.unmap(VirtAddr(va), len::<F>()).unwrap()
}

fn protect<F: Arch>(s: &mut Space<F>, prot: Prot) {
    s.change_protection(VirtAddr(VA), len::<F>(), prot).unwrap()
}

fn move_range<F: Arch>(s: &mut Space<F>) {
    s.move_page_tables(
        VirtAddr(VA),
        VirtAddr(moved::<F>()),
        len::<F>(),
        MoveOptions::DEFAULT,
    )
    .unwrap()
}

/// Panics unless the first, a middle and the last page of the range at
/// `va` are pages of the physical range with `writable`, or (`None`)
/// unless they are unmapped.
fn expect<F: Arch>(s: &Space<F>, va: u64, writable: Option<bool>) {
    let page = page_size::<F>();
    for off in [0, (PAGES / 2 + 3) * page, len::<F>() - page] {
        let t = s.translate(VirtAddr(va + off + 8));
        match writable {
            None => assert!(t.is_none(), "{va:#x} + {off:#x} still mapped"),
            Some(w) => {
                let t = t.unwrap_or_else(|| panic!("{va:#x} + {off:#x} not mapped"));
                assert_eq!(t.pa, PhysAddr(PA + off + 8), "{va:#x} + {off:#x}");
                assert_eq!(t.height, 0, "{va:#x} + {off:#x}: not a page");
                assert_eq!(t.prot.writable(), w, "{va:#x} + {off:#x}: writable");
            }
        }
    }
}

/// A space of `F` with the guard page mapped, whose arena already holds
/// every table the benchmarks need (the source and the moved range mapped
/// at once), each operation checked once through the space's own
/// translation.
fn space<F: Arch>() -> Space<F> {
    let mut s = AddressSpace::new(NoopMmu, Arena::for_format::<F>()).unwrap();
    // The move's offset really is off every PMD boundary.
    assert_eq!((moved::<F>() - VA) % size::<F>(1), page_size::<F>());
    // The guard: the page after the range, under the same PMD table as
    // the range's last page (the range ends inside that table's span).
    let guard = VA + len::<F>();
    assert_eq!(
        (guard - 1) >> shift::<F>(2),
        guard >> shift::<F>(2),
        "the guard shares the range's last PMD table"
    );
    s.map(
        VirtAddr(guard),
        PhysAddr(PA + len::<F>()),
        page_size::<F>(),
        Prot::READ_WRITE,
        OPTS,
    )
    .unwrap();
    map(&mut s, VA);
    expect(&s, VA, Some(true));
    protect(&mut s, Prot::READ_ONLY);
    expect(&s, VA, Some(false));
    protect(&mut s, Prot::READ_WRITE);
    move_range(&mut s);
    expect(&s, VA, None);
    expect(&s, moved::<F>(), Some(true));
    map(&mut s, VA);
    unmap(&mut s, VA);
    unmap(&mut s, moved::<F>());
    expect(&s, VA, None);
    expect(&s, moved::<F>(), None);
    let t = s.translate(VirtAddr(guard)).expect("the guard is mapped");
    assert_eq!(t.pa, PhysAddr(PA + len::<F>()));
    s
}

/// Times `op` only; `setup` and `teardown` run around it untimed.
fn timed<F: Arch>(
    s: &mut Space<F>,
    iters: u64,
    mut setup: impl FnMut(&mut Space<F>),
    mut op: impl FnMut(&mut Space<F>),
    mut teardown: impl FnMut(&mut Space<F>),
) -> Duration {
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        setup(s);
        let t0 = clock::now();
        op(s);
        t += clock::now() - t0;
        teardown(s);
    }
    black_box(&*s);
    t
}

fn none<F: Arch>(_: &mut Space<F>) {}

/// The operations, one criterion group each.
#[derive(Clone, Copy)]
enum Op {
    Map,
    Unmap,
    Protect,
    Move,
}

/// `op`'s benchmark of granule `F`, named `name`, in `g`.
fn bench<F: Arch>(g: &mut BenchmarkGroup<'_, WallTime>, name: &str, op: Op) {
    let mut s = space::<F>();
    match op {
        Op::Map => {
            g.bench_function(name, |b| {
                b.iter_custom(|n| timed(&mut s, n, none, |s| map(s, VA), |s| unmap(s, VA)))
            });
        }
        Op::Unmap => {
            g.bench_function(name, |b| {
                b.iter_custom(|n| timed(&mut s, n, |s| map(s, VA), |s| unmap(s, VA), none))
            });
        }
        Op::Protect => {
            map(&mut s, VA);
            let mut ro = true;
            g.bench_function(name, |b| {
                b.iter_custom(|n| {
                    timed(
                        &mut s,
                        n,
                        none,
                        |s| {
                            let p = if ro {
                                Prot::READ_ONLY
                            } else {
                                Prot::READ_WRITE
                            };
                            protect(s, p);
                            ro = !ro;
                        },
                        none,
                    )
                })
            });
            unmap(&mut s, VA);
        }
        Op::Move => {
            g.bench_function(name, |b| {
                b.iter_custom(|n| {
                    timed(
                        &mut s,
                        n,
                        |s| map(s, VA),
                        move_range,
                        |s| unmap(s, moved::<F>()),
                    )
                })
            });
        }
    }
}

fn granules(c: &mut Criterion) {
    for (group, op) in [
        ("arm64-granules-map", Op::Map),
        ("arm64-granules-unmap", Op::Unmap),
        ("arm64-granules-protect", Op::Protect),
        ("arm64-granules-move", Op::Move),
    ] {
        let mut g = c.benchmark_group(group);
        g.sample_size(sample_size());
        g.throughput(Throughput::Elements(PAGES));
        bench::<Arm64>(&mut g, "4K", op);
        bench::<Arm64K16>(&mut g, "16K", op);
        bench::<Arm64K64>(&mut g, "64K", op);
        g.finish();
    }
}

criterion_group!(benches, granules);
criterion_main!(benches);
