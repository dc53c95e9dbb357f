//! Host benchmark of `move_page_tables` (Linux's mremap speed-ups: `HAVE_MOVE_PMD`, and "mm: Speedup mremap on 1GB or larger regions" for `HAVE_MOVE_PUD`).
//!
//! 1 GiB of 4 KiB pages moves back and forth between two PUD-aligned
//! ranges, one timed move per iteration (no setup is timed), on every path
//! in one run, chosen with the runtime [`MoveOptions`] switches:
//!
//! - `pud`: one PUD entry (`HAVE_MOVE_PUD`, Linux "arm64: mremap speedup - Enable HAVE_MOVE_PUD");
//! - `pmd`: 512 PMD entries (`HAVE_MOVE_PMD`, the arm64 state before `HAVE_MOVE_PUD`);
//! - `pte-fresh` / `pte-settled`: the control variant, 262,144 PTEs stored
//!   one by one at the destination; `fresh` pages have neither accessed nor
//!   dirty state, `settled` ones are accessed and dirty. Both take the
//!   whole-table path of `move_page_tables` (each source PTE table is
//!   unlinked and copied with plain loads after the one flush), so they
//!   should match; only partly covered tables at the ends of a range pay an
//!   atomic get-and-clear per unsettled entry.
//!
//! Tables live in the [`Arena`]; the MMU is [`NoopMmu`] (no TLB work). The
//! fast paths need the default features `move-pmd` and `move-pud`; without
//! them every variant measures the PTE path. Divide the PTE medians by
//! 262,144 for the per-page figure.
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pgtable_core::contract::{Arena, NoopMmu, PAGE_SIZE};
use pgtable_core::test_format::{TestFormat, ACCESSED, DIRTY};
use pgtable_core::{variants, AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};

const G1: u64 = 1 << 30;
const A: VirtAddr = VirtAddr(8 * G1);
const B: VirtAddr = VirtAddr(16 * G1);
const PA: PhysAddr = PhysAddr(2 * G1);

type Space = AddressSpace<TestFormat, NoopMmu, Arena>;

/// 1 GiB of pages at `A`; `settled`: every entry accessed and dirty.
fn space(settled: bool) -> Space {
    let mut s = Space::new(NoopMmu, Arena::new()).unwrap();
    s.map(A, PA, G1, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    if settled {
        for i in 0..G1 / PAGE_SIZE {
            // SAFETY: sets accessed/dirty state in a leaf, as the hardware
            // does; the space is never installed.
            let slot = unsafe { s.inspect().slot(A.add(i * PAGE_SIZE), 0) }.unwrap();
            slot.fetch_or(ACCESSED | DIRTY, Relaxed);
        }
    }
    // Warm the arena's free list: one round trip.
    s.move_page_tables(A, B, G1, variants::PTES_ONLY).unwrap();
    s.move_page_tables(B, A, G1, variants::PTES_ONLY).unwrap();
    s
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("move-1GiB");
    g.sample_size(30);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(G1 / PAGE_SIZE));

    for (name, opts, settled) in [
        ("pud", MoveOptions::DEFAULT, false),
        ("pmd", variants::PMD_ONLY, false),
        ("pte-fresh", variants::PTES_ONLY, false),
        ("pte-settled", variants::PTES_ONLY, true),
    ] {
        let mut s = space(settled);
        let mut at_a = true;
        // One move per iteration, alternating direction, so nothing but
        // moves is timed.
        g.bench_function(name, |b| {
            b.iter(|| {
                let (from, to) = if at_a { (A, B) } else { (B, A) };
                s.move_page_tables(from, to, G1, opts).unwrap();
                at_a = !at_a;
            })
        });
        // Every page is still mapped, wherever the last move left it.
        let at = if at_a { A } else { B };
        assert_eq!(
            s.translate(at.add(G1 - 1)).unwrap().pa,
            PhysAddr(PA.0 + G1 - 1)
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
