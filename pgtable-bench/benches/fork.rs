//! Host benchmark of `copy_page_range` (the page-table half of `fork`).
//!
//! 1 GiB of address space is copied from a source space into an empty
//! child, one timed copy per iteration; the setup of each iteration (not
//! timed) makes the source writable again and unmaps the child, so every
//! copy does the same work with warm arenas:
//!
//! - `cow-4K`: 262,144 writable 4 KiB pages, copy-on-write: one
//!   compare-exchange write-protect in the source and one store in the
//!   child per page, 513 child tables, one source flush;
//! - `cow-4K-settled`: the same pages accessed and dirty (settled: the
//!   hardware never writes them again, as x86 kernel pages created like
//!   Linux's `__PAGE_KERNEL`), write-protected with a plain store each;
//! - `shared-4K`: the same pages copied as they are (a load and a store per
//!   page);
//! - `cow-2M`: 512 writable 2 MiB blocks, copy-on-write (copied as blocks:
//!   512 entries, one child table);
//! - `map-4K`: not a fork: `map` of the same 1 GiB of 4 KiB pages into an
//!   empty space, the closest operation the peer crates have (the `x86_64`
//!   crate and page_table_multiarch have no fork or range copy; their
//!   numbers for mapping this range are the `x86-map-4K` group of
//!   `pgtable-bench/benches/x86_peers.rs`). A copy reads the source on top of
//!   writing what a map writes.
//!
//! Tables live in the [`Arena`]; the MMU is [`NoopMmu`] (no TLB work), the
//! format the test format. Divide the 4 KiB medians by 262,144 for the
//! per-page figure.
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pgtable_core::contract::{Arena, NoopMmu, PAGE_SIZE};
use pgtable_core::test_format::{TestFormat, ACCESSED, DIRTY};
use pgtable_core::{AddressSpace, CopyMode, MapOptions, PhysAddr, Prot, VirtAddr};

const G1: u64 = 1 << 30;
const VA: VirtAddr = VirtAddr(8 * G1);
const PA: PhysAddr = PhysAddr(2 * G1);

type Space = AddressSpace<TestFormat, NoopMmu, Arena>;

fn space() -> Space {
    Space::new(NoopMmu, Arena::new()).unwrap()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("fork-1GiB");
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    g.throughput(Throughput::Elements(G1 / PAGE_SIZE));

    for (name, opts, mode, settled) in [
        ("cow-4K", MapOptions::PAGES, CopyMode::Cow, false),
        ("cow-4K-settled", MapOptions::PAGES, CopyMode::Cow, true),
        ("shared-4K", MapOptions::PAGES, CopyMode::Shared, false),
        ("cow-2M", MapOptions::PMD_BLOCKS, CopyMode::Cow, false),
    ] {
        let mut src = space();
        src.map(VA, PA, G1, Prot::READ_WRITE, opts).unwrap();
        if settled {
            for i in 0..G1 / PAGE_SIZE {
                // SAFETY: sets accessed/dirty state in a leaf, as the
                // hardware does; the space is never installed.
                let slot = unsafe { src.inspect().slot(VA.add(i * PAGE_SIZE), 0) }.unwrap();
                slot.fetch_or(ACCESSED | DIRTY, Relaxed);
            }
        }
        // Checked once, before timing (so that a filter or `--list`, which
        // skip the timed closure, skip nothing of the check): the copy
        // does what it says, same frame and protection, and the child's
        // leaf is old (Linux `copy_present_pte`: `pte_mkold`).
        let mut child = space();
        src.copy_page_range(&mut child, VA, G1, mode, |_| {})
            .unwrap();
        let p = src.translate(VA.add(5 * PAGE_SIZE)).unwrap();
        let k = child.translate(VA.add(5 * PAGE_SIZE)).unwrap();
        assert_eq!((p.pa, p.prot), (k.pa, k.prot));
        assert_eq!(k.entry & ACCESSED, 0, "{name}: the child's leaf is old");
        assert_eq!(p.prot.writable(), mode == CopyMode::Shared);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    // Not timed: a writable source, an empty child.
                    src.change_protection(VA, G1, Prot::READ_WRITE).unwrap();
                    child.unmap(VA, G1).unwrap();
                    let t0 = Instant::now();
                    src.copy_page_range(&mut child, VA, G1, mode, |_| {})
                        .unwrap();
                    t += t0.elapsed();
                }
                t
            })
        });
    }

    let mut s = space();
    g.bench_function("map-4K", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                s.unmap(VA, G1).unwrap();
                let t0 = Instant::now();
                s.map(VA, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
                    .unwrap();
                t += t0.elapsed();
            }
            t
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
