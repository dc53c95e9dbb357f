//! Host benchmarks of the generic engine: map 4 KiB pages, unmap
//! 4 KiB pages (freeing the emptied tables), and map 2 MiB blocks, each over
//! 1 GiB of address space, tables in the [`Arena`], no TLB work
//! ([`NoopMmu`]). Criterion reports the time of one whole 1 GiB operation;
//! divide the median by 262,144 pages (or 512 blocks) for the per-entry
//! figure (criterion's throughput line is its inverse).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pgtable_core::contract::{Arena, NoopMmu};
use pgtable_core::test_format::TestFormat;
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

const G1: u64 = 1 << 30;
const VA: VirtAddr = VirtAddr(8 * G1);
const PA: PhysAddr = PhysAddr(2 * G1);

type Space = AddressSpace<TestFormat, NoopMmu, Arena>;

fn space() -> Space {
    let mut s = Space::new(NoopMmu, Arena::new()).unwrap();
    // Warm the arena's free list so every run reuses the same frames.
    s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.unmap(VA, G1).unwrap();
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine-1GiB");
    g.sample_size(30);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));

    g.throughput(Throughput::Elements(G1 / 4096));
    let mut s = space();
    g.bench_function("map-4K", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
                    .unwrap();
                t += t0.elapsed();
                s.unmap(VA, G1).unwrap();
            }
            black_box(&s);
            t
        })
    });
    g.bench_function("unmap-4K", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
                    .unwrap();
                let t0 = Instant::now();
                s.unmap(VA, G1).unwrap();
                t += t0.elapsed();
            }
            black_box(&s);
            t
        })
    });
    g.throughput(Throughput::Elements(G1 >> 21));
    g.bench_function("map-2M", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = Instant::now();
                s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PMD_BLOCKS)
                    .unwrap();
                t += t0.elapsed();
                s.unmap(VA, G1).unwrap();
            }
            black_box(&s);
            t
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
