//! Host benchmarks of the engine with the real arm64 descriptor format
//! ([`Arm64`]): 1 GiB of address space, tables in the [`Arena`], no TLB work
//! ([`NoopMmu`]), so the figures compare with pgtable-core's `core` bench
//! (which uses the test format). Criterion reports one whole operation;
//! divide by 262,144 pages (or 512 blocks) for the per-entry figure.
//!
//! `linear-map/*` is Linux "arm64: mm: Batch dsb and isb when populating pgtables" on the host: the walker barrier is played by
//! a sequentially consistent fence (`mfence` on x86_64), a stand-in for
//! `dsb ishst; isb` whose cost on real arm64 hardware is larger.
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pgtable_arm64::Arm64;
use pgtable_core::contract::{Arena, Mmu, NoopMmu, TlbRange};
use pgtable_core::{test_format::TestFormat, MoveOptions};
use pgtable_core::{variants, AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

const G1: u64 = 1 << 30;
const VA: VirtAddr = VirtAddr(8 * G1);
const PA: PhysAddr = PhysAddr(2 * G1);

type Space<M> = AddressSpace<Arm64, M, Arena>;

/// An MMU whose walker barrier is a full fence (host stand-in for
/// `dsb ishst; isb`).
struct FenceMmu;

// SAFETY: a host benchmark MMU: no hardware walker uses these tables.
unsafe impl Mmu for FenceMmu {
    fn walker_barrier(&self) {
        // The stand-in barrier: a full fence, as `dsb` is on arm64.
        fence(Ordering::SeqCst);
    }
    fn flush_tlb_range(&self, _range: TlbRange) {}
    fn flush_tlb_all(&self) {}
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

fn space<M: Mmu>(mmu: M) -> Space<M> {
    let mut s = AddressSpace::new(mmu, Arena::new()).unwrap();
    // Warm the arena's free list so every run reuses the same frames.
    s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.unmap(VA, G1).unwrap();
    s
}

/// Times `op` only; `setup` and `teardown` run around it untimed.
fn timed<M: Mmu>(
    s: &mut Space<M>,
    iters: u64,
    mut setup: impl FnMut(&mut Space<M>),
    mut op: impl FnMut(&mut Space<M>),
    mut teardown: impl FnMut(&mut Space<M>),
) -> Duration {
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        setup(s);
        let t0 = Instant::now();
        op(s);
        t += t0.elapsed();
        teardown(s);
    }
    black_box(&*s);
    t
}

fn none<M: Mmu>(_: &mut Space<M>) {}

/// Maps `[VA, VA + 1 GiB)` with 4 KiB pages, read-write.
fn map_4k<M: Mmu>(s: &mut Space<M>) {
    s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap()
}

/// Maps `[VA, VA + 1 GiB)` with 2 MiB blocks, read-write.
fn map_2m<M: Mmu>(s: &mut Space<M>) {
    s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PMD_BLOCKS)
        .unwrap()
}

/// Unmaps `[VA, VA + 1 GiB)`.
fn unmap_1g<M: Mmu>(s: &mut Space<M>) {
    s.unmap(VA, G1).unwrap()
}

fn engine(c: &mut Criterion) {
    let mut g = c.benchmark_group("arm64-1GiB");
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    let mut s = space(NoopMmu);

    g.throughput(Throughput::Elements(G1 / 4096));
    g.bench_function("map-4K", |b| {
        b.iter_custom(|n| timed(&mut s, n, none, map_4k, unmap_1g))
    });
    g.bench_function("unmap-4K", |b| {
        b.iter_custom(|n| timed(&mut s, n, map_4k, unmap_1g, none))
    });
    s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let mut ro = true;
    g.bench_function("protect-4K", |b| {
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
                    s.change_protection(VA, G1, p).unwrap();
                    ro = !ro;
                },
                none,
            )
        })
    });
    s.unmap(VA, G1).unwrap();
    // The same operation with pgtable-core's test format, for reference
    // (settled entries: accessed and dirty set).
    let mut t = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    t.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let ad = pgtable_core::test_format::ACCESSED | pgtable_core::test_format::DIRTY;
    for off in (0..G1).step_by(4096) {
        // SAFETY: sets accessed/dirty state in a leaf, as the hardware
        // does; the space is never installed.
        let slot = unsafe { t.inspect().slot(VirtAddr(VA.0 + off), 0) }.unwrap();
        slot.fetch_or(ad, Ordering::Relaxed);
    }
    let mut ro = true;
    g.bench_function("protect-4K-test-format", |b| {
        b.iter(|| {
            let p = if ro {
                Prot::READ_ONLY
            } else {
                Prot::READ_WRITE
            };
            t.change_protection(VA, G1, p).unwrap();
            ro = !ro;
        })
    });
    drop(t);
    g.bench_function("move-4K-pte-path", |b| {
        // Not PMD/PUD aligned relative to each other: every PTE moves.
        let dst = VirtAddr(VA.0 + 4 * G1 + 4096);
        b.iter_custom(|n| {
            timed(
                &mut s,
                n,
                map_4k,
                |s| {
                    s.move_page_tables(VA, dst, G1, MoveOptions::DEFAULT)
                        .unwrap()
                },
                |s| s.unmap(dst, G1).unwrap(),
            )
        })
    });

    g.throughput(Throughput::Elements(G1 >> 21));
    g.bench_function("map-2M", |b| {
        b.iter_custom(|n| timed(&mut s, n, none, map_2m, unmap_1g))
    });
    g.finish();
}

fn linear_map(c: &mut Criterion) {
    let mut g = c.benchmark_group("linear-map");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(G1 / 4096));
    let mut s = space(FenceMmu);
    for (name, opts) in [
        ("barrier-per-table", MapOptions::PAGES),
        (
            "barrier-per-entry",
            variants::barrier_per_entry(MapOptions::PAGES),
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                timed(
                    &mut s,
                    n,
                    none,
                    |s| s.map(VA, PA, G1, Prot::READ_WRITE, opts).unwrap(),
                    unmap_1g,
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, engine, linear_map);
criterion_main!(benches);
