//! Contiguous mappings (Arm ARM D8.6.1; Linux `arch/arm64/mm/contpte.c`)
//! on the host: the cost of `map` and `change_protection` of 1 GiB of
//! 4 KiB pages folded into 64 KiB runs (the default) against the same
//! without the hint (`MapOptions::no_contiguous`), tables in the [`Arena`],
//! no TLB work ([`NoopMmu`]); and, printed before the timings, how many
//! TLB fills the simulated MMU needs to touch every page of that GiB
//! either way (one per run folded, one per page unfolded).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion, Throughput};
use pgtable_arm64::Arm64;
use pgtable_core::contract::{Access, Arena, NoopMmu};
use pgtable_core::sim::{Installed, SimMachine};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

const G1: u64 = 1 << 30;
const PAGE: u64 = 4096;
const VA: VirtAddr = VirtAddr(8 * G1);
const PA: PhysAddr = PhysAddr(2 * G1);

type Space = AddressSpace<Arm64, NoopMmu, Arena>;

const VARIANTS: [(&str, MapOptions); 2] = [
    ("unfolded", MapOptions::PAGES.no_contiguous()),
    ("folded", MapOptions::PAGES),
];

fn space() -> Space {
    let mut s = AddressSpace::new(NoopMmu, Arena::new()).unwrap();
    // Warm the arena's free list so every run reuses the same frames.
    s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.unmap(VA, G1).unwrap();
    s
}

/// Times `op` only; `setup` and `teardown` run around it untimed.
fn timed(
    s: &mut Space,
    iters: u64,
    mut setup: impl FnMut(&mut Space),
    mut op: impl FnMut(&mut Space),
    mut teardown: impl FnMut(&mut Space),
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

fn map(c: &mut Criterion) {
    let mut g = c.benchmark_group("contpte/map-1g-4k");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(G1 / PAGE));
    let mut s = space();
    for (name, opts) in VARIANTS {
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                timed(
                    &mut s,
                    n,
                    |_| {},
                    |s| s.map(VA, PA, G1, Prot::READ_WRITE, opts).unwrap(),
                    |s| s.unmap(VA, G1).unwrap(),
                )
            })
        });
    }
    g.finish();
}

fn protect(c: &mut Criterion) {
    let mut g = c.benchmark_group("contpte/protect-1g-4k");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(G1 / PAGE));
    let mut s = space();
    for (name, opts) in VARIANTS {
        g.bench_function(name, |b| {
            b.iter_custom(|n| {
                timed(
                    &mut s,
                    n,
                    |s| s.map(VA, PA, G1, Prot::READ_WRITE, opts).unwrap(),
                    |s| s.change_protection(VA, G1, Prot::READ_ONLY).unwrap(),
                    |s| s.unmap(VA, G1).unwrap(),
                )
            })
        });
    }
    g.finish();
}

/// TLB fills of the simulated MMU for loading every page of 1 GiB once.
fn tlb_fills(opts: MapOptions) -> u64 {
    let m = SimMachine::<Arm64>::new();
    let s = AddressSpace::<Arm64, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU; only the simulated walker uses the tables.
    let mut s = unsafe { Installed::new(s) };
    s.map(VA, PA, G1, Prot::READ_WRITE, opts).unwrap();
    let before = m.stats().tlb_fills;
    for k in 0..G1 / PAGE {
        m.access(VA.add(k * PAGE), Access::READ).unwrap();
    }
    let fills = m.stats().tlb_fills - before;
    m.check().unwrap();
    fills
}

criterion_group!(benches, map, protect);

fn main() {
    for (name, opts) in VARIANTS {
        println!(
            "contpte/tlb-fills-1g-4k/{name}: {} fills to touch {} pages",
            tlb_fills(opts),
            G1 / PAGE
        );
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
