//! Host benchmarks of `change_protection` (Linux "arm64: mm: rework the pmd protect changing flow").
//!
//! - `protect-4K-1GiB`: change the protection of 1 GiB of 4 KiB pages,
//!   toggling between read-write and read-only so every iteration rewrites
//!   every entry. `settled` pages are accessed and dirty (a mapping that was
//!   written: the plain store path); `fresh` pages have neither bit (the
//!   atomic get-and-clear path). Divide the median by 262,144 for ns/page.
//!   `floor-xchg-store` is not pgtable: it is the least an A/D-safe change
//!   of a live, unsettled entry costs on this CPU (one atomic exchange and
//!   one store per entry, over the same 2 MiB of entries), so `fresh` can
//!   be read as a ratio to the hardware's floor.
//! - `protect-2M`: 64–512 MiB of 2 MiB blocks on both block paths:
//!   `generic` (Linux's `pmdp_invalidate`: clear and flush each block at
//!   once, [`GenericBlockProt`]) and `deferred` (that change's atomic
//!   get-and-clear with one flush at the end, [`DeferredBlockProt`]).
//!
//! The MMU does no TLB work (like [`NoopMmu`]) but counts flushes, which
//! are printed once per configuration. With free flushes the host ratio
//! shows only the extra work of the generic path; the cost of real TLB
//! invalidations shows in the in-kernel benchmark.
//!
//! [`NoopMmu`]: pgtable_core::contract::NoopMmu
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pgtable_core::contract::{Arch, Arena, Mmu, TlbRange};
use pgtable_core::test_format::{TestFormat, ACCESSED, DIRTY};
use pgtable_core::{
    variants::{DeferredBlockProt, GenericBlockProt},
    AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr,
};

const G1: u64 = 1 << 30;
const M2: u64 = 2 << 20;
const VA: VirtAddr = VirtAddr(8 * G1);
const PA: PhysAddr = PhysAddr(2 * G1);

/// No TLB work, but flushes are counted.
#[derive(Default)]
struct FlushCount(Cell<u64>);

// SAFETY: a host benchmark MMU: no hardware walker uses these tables.
unsafe impl Mmu for FlushCount {
    fn walker_barrier(&self) {}
    fn flush_tlb_range(&self, _range: TlbRange) {
        self.0.set(self.0.get() + 1);
    }
    fn flush_tlb_all(&self) {
        self.0.set(self.0.get() + 1);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

type Space<A> = AddressSpace<A, FlushCount, Arena>;

fn mapped<A: Arch>(len: u64, opts: MapOptions, ad: u64) -> Space<A> {
    let mut s = Space::<A>::new(FlushCount::default(), Arena::new()).unwrap();
    s.map(VA, PA, len, Prot::READ_WRITE, opts).unwrap();
    if ad != 0 {
        let (h, step) = if opts == MapOptions::PAGES {
            (0, 4096)
        } else {
            (1, M2)
        };
        for off in (0..len).step_by(step as usize) {
            // SAFETY: sets accessed/dirty state in a leaf, as the hardware
            // does; the space is never installed.
            let slot = unsafe { s.inspect().slot(VA.add(off), h) }.unwrap();
            slot.fetch_or(ad, Relaxed);
        }
    }
    s
}

/// Times toggling the protection of `[VA, VA + len)` in `s`.
fn toggle<A: Arch>(b: &mut criterion::Bencher<'_>, s: &mut Space<A>, len: u64) {
    let mut ro = false;
    b.iter(|| {
        ro = !ro;
        let prot = if ro {
            Prot::READ_ONLY
        } else {
            Prot::READ_WRITE
        };
        s.change_protection(black_box(VA), len, prot).unwrap();
    });
}

/// Flushes one protection change of `[VA, VA + len)` issues.
fn flushes_per_op<A: Arch>(s: &mut Space<A>, len: u64) -> u64 {
    let before = s.mmu().0.get();
    let now = s.translate(VA).unwrap().prot;
    let prot = if now == Prot::READ_ONLY {
        Prot::READ_WRITE
    } else {
        Prot::READ_ONLY
    };
    s.change_protection(VA, len, prot).unwrap();
    s.mmu().0.get() - before
}

fn bench_pages(c: &mut Criterion) {
    let mut g = c.benchmark_group("protect-4K-1GiB");
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(G1 / 4096));
    for (name, ad) in [("settled", ACCESSED | DIRTY), ("fresh", 0)] {
        let mut s = mapped::<TestFormat>(G1, MapOptions::PAGES, ad);
        g.bench_function(name, |b| toggle(b, &mut s, G1));
        eprintln!(
            "protect-4K-1GiB/{name}: {} flush(es) per operation",
            flushes_per_op(&mut s, G1)
        );
    }
    let entries: Vec<AtomicU64> = (0..G1 / 4096)
        .map(|i| AtomicU64::new((PA.0 + (i << 12)) | 0x3))
        .collect();
    g.bench_function("floor-xchg-store", |b| {
        b.iter(|| {
            for e in black_box(&entries) {
                // Relaxed: what the transaction path does (see
                // `pgtable_core::contract::generic`); only atomicity matters.
                let old = e.swap(0, Relaxed);
                e.store(old ^ 0x2, Relaxed);
            }
        })
    });
    g.finish();
}

fn bench_blocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("protect-2M");
    g.sample_size(30);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for mib in [64u64, 128, 256, 512] {
        let len = mib << 20;
        g.throughput(Throughput::Elements(len / M2));
        let mut s = mapped::<GenericBlockProt<TestFormat>>(len, MapOptions::PMD_BLOCKS, ACCESSED);
        g.bench_with_input(BenchmarkId::new("generic", mib), &len, |b, &len| {
            toggle(b, &mut s, len)
        });
        let gf = flushes_per_op(&mut s, len);
        let mut s = mapped::<DeferredBlockProt<TestFormat>>(len, MapOptions::PMD_BLOCKS, ACCESSED);
        g.bench_with_input(BenchmarkId::new("deferred", mib), &len, |b, &len| {
            toggle(b, &mut s, len)
        });
        let df = flushes_per_op(&mut s, len);
        eprintln!("protect-2M/{mib} MiB: flushes per operation: generic {gf}, deferred {df}");
    }
    g.finish();
}

criterion_group!(benches, bench_pages, bench_blocks);
criterion_main!(benches);
