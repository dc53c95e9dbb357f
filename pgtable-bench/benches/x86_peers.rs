//! pgtable against its Rust peers on x86_64, one criterion run over 1 GiB
//! of address space: the groups `x86-map-4K`, `x86-protect-4K`,
//! `x86-unmap-4K`, `x86-map-2M` and `x86-move-1G`. What each group times,
//! the checks before timing, the common fairness rules and the clock are
//! those of the shared harness, `pgtable-bench/src/harness.rs` (its module
//! docs); the peer subjects are in `pgtable-bench/src/x86.rs`. This file
//! adds three x86-only groups (see [`report_and_fault`] and [`fork`]).
//!
//! Subjects, each with its fastest honest API:
//!
//! - `pgtable`: `AddressSpace<X86_64, NoopMmu, ZeroOnAlloc>`, one ranged call per
//!   operation. Kernel leaves are created accessed and dirty (Linux's
//!   `__PAGE_KERNEL`), so protection changes take the plain-store path for
//!   settled entries, which is A/D-safe because the processor never writes a
//!   settled entry. `pgtable-user` maps user pages, created with A and D
//!   clear: its protection change takes the atomic get-and-clear path per
//!   entry (what an A/D-tracking OS pays).
//! - `x86_64`: the `x86_64` crate's `OffsetPageTable` (physical offset 0: a
//!   table frame's "physical" address is its host address). It has per-page
//!   calls only: `map_to` / `update_flags` / `unmap`, each walking from the
//!   root; the `MapperFlush` is `ignore()`d. `unmap` keeps emptied tables;
//!   `x86_64+clean_up` (unmap group only) adds
//!   `CleanUp::clean_up_addr_range`, which frees them (what pgtable's unmap
//!   does).
//! - `page_table_multiarch`: `x86_64::X64PageTable` (x86_64 hosts only) in
//!   the harness's `ptm` subject: ranged calls through a cursor, emptied
//!   tables kept until the table is dropped, flag updates not A/D-safe
//!   (details there).
//!
//! Fairness, x86 specifics: the leaves are kernel, read-write or
//! read-only, not executable, write-back; the `x86_64` crate's leaves are
//! bit-identical to pgtable's, A and D included; page_table_multiarch
//! cannot set A/D. Both peers take table frames from the harness's free
//! list of 4 KiB host frames and zero a table when they create it (their
//! design); pgtable's `ZeroOnAlloc` zeroes a frame when it hands it out, so
//! every subject pays for zeroing inside the timed map and nobody in unmap.
//!
//! Run: `cargo bench -p pgtable-bench --bench x86_peers -- --warm-up-time 1
//! --measurement-time 3` (`PEERS_CLOCK=thread` for CPU time: see the
//! harness docs).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use pgtable_core::contract::NewPte;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pgtable_bench::harness::{self, clock, Pgtable, Space, Subject, Subjects, ZeroOnAlloc};
use pgtable_bench::harness::{G1, M2, PA, PAGE, PAGES, VA};
use pgtable_bench::x86::X86_64Crate;
use pgtable_core::contract::NoopMmu;
use pgtable_core::{AddressSpace, CopyMode, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86_64;

/// Every subject of all groups but move (the harness adds `pgtable-user`
/// to the protect group and `x86_64+clean_up` comes in for unmap).
fn subjects() -> Subjects {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Subjects = vec![
        ("pgtable", Box::new(Pgtable::<X86_64>::new(false))),
        ("x86_64", Box::new(X86_64Crate::new(false))),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push((
        "page_table_multiarch",
        Box::new(pgtable_bench::x86::ptm_subject()),
    ));
    v
}

fn peers(c: &mut Criterion) {
    harness::run::<X86_64>(c, "x86", subjects(), || {
        vec![("x86_64+clean_up", Box::new(X86_64Crate::new(true)))]
    });
}

/// An empty space whose allocator is warm (1 GiB of `prot` pages mapped
/// and unmapped once).
fn space(prot: Prot) -> Space<X86_64> {
    let mut s = AddressSpace::new(NoopMmu, ZeroOnAlloc::default()).unwrap();
    s.map(VirtAddr(VA), PhysAddr(PA), G1, prot, MapOptions::PAGES)
        .unwrap();
    s.unmap(VirtAddr(VA), G1).unwrap();
    s
}

/// `x86-unmap-report-4K`: unmap 1 GiB of 4 KiB pages and hand every
/// removed page to the caller, who sums its physical address and dirty
/// state (so nothing is optimised away); median / 262,144 per page. Every
/// subject frees the emptied tables.
///
/// - `pgtable`: `unmap_with` of kernel pages (created accessed and dirty:
///   settled, so each entry is read with a plain load).
/// - `pgtable-user`: `unmap_with` of user pages (A/D clean: the hardware
///   could still write them, so each is taken with the atomic
///   get-and-clear, `xchg`).
/// - `pgtable-noreport`: plain `unmap` for reference (unlinks whole tables
///   without visiting their entries).
/// - `x86_64+clean_up`: the x86_64 crate's `unmap` per page, which returns
///   the frame (no dirty state), summing the frames, then
///   `clean_up_addr_range` to free the emptied tables as pgtable does.
///
/// `x86-fault-4K`: install one 4 KiB page where its tables exist (a page
/// fault's `set_pte_at`), 511 in a row into each of 64 PTE tables per
/// timed batch (32,704 installs between one pair of clock reads); median /
/// 32,704. `pgtable`: `install_pte`; `x86_64`: `map_to`.
fn report_and_fault(c: &mut Criterion) {
    let mut g = c.benchmark_group("x86-unmap-report-4K");
    g.sample_size(harness::sample_size());
    g.throughput(Throughput::Elements(PAGES));
    let user = Prot::WRITE | Prot::USER;
    for (name, prot, report) in [
        ("pgtable", Prot::READ_WRITE, true),
        ("pgtable-user", user, true),
        ("pgtable-noreport", Prot::READ_WRITE, false),
    ] {
        let mut s = space(prot);
        // Check once: every page is reported with its frame.
        s.map(VirtAddr(VA), PhysAddr(PA), G1, prot, MapOptions::PAGES)
            .unwrap();
        let (mut n, mut sum) = (0u64, 0u64);
        s.unmap_with(VirtAddr(VA), G1, |r| {
            n += 1;
            sum = sum.wrapping_add(r.pa().unwrap().0 - PA);
        })
        .unwrap();
        assert_eq!((n, sum), (PAGES, (0..PAGES).map(|i| i * PAGE).sum()));
        assert!(s.translate(VirtAddr(VA)).is_none());
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    s.map(VirtAddr(VA), PhysAddr(PA), G1, prot, MapOptions::PAGES)
                        .unwrap();
                    let t0 = clock::now();
                    if report {
                        let mut acc = 0u64;
                        s.unmap_with(VirtAddr(VA), G1, |r| {
                            acc = acc
                                .wrapping_add(r.pa().map_or(0, |p| p.0))
                                .wrapping_add(u64::from(r.dirty()));
                        })
                        .unwrap();
                        black_box(acc);
                    } else {
                        s.unmap(VirtAddr(VA), G1).unwrap();
                    }
                    t += clock::now() - t0;
                }
                t
            })
        });
    }
    let mut x = X86_64Crate::new(false);
    x.map_pages(VA, G1);
    let sum = x.unmap_pages_summing(VA, G1);
    assert_eq!(sum, (0..PAGES).map(|i| PA + i * PAGE).sum::<u64>());
    g.bench_function("x86_64+clean_up", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                x.map_pages(VA, G1);
                let t0 = clock::now();
                black_box(x.unmap_pages_summing(VA, G1));
                t += clock::now() - t0;
            }
            t
        })
    });
    g.finish();

    // Install one page at a time into existing PTE tables: page 0 of each
    // 2 MiB region stays mapped (so its table stays), pages 1..512 come and
    // go.
    const N: u64 = 511;
    const TABLES: u64 = 64;
    let regions: Vec<u64> = (0..TABLES).map(|k| VA + k * M2).collect();
    let mut g = c.benchmark_group("x86-fault-4K");
    g.sample_size(harness::sample_size());
    g.throughput(Throughput::Elements(N * TABLES));
    let mut s = space(Prot::READ_WRITE);
    for &r in &regions {
        s.map(
            VirtAddr(r),
            PhysAddr(PA),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
    }
    let install = |s: &mut Space<X86_64>| {
        for &r in &regions {
            // `1..N + 1`, not `1..=N`: the loop the peer's `map_range`
            // runs (an inclusive range costs a few instructions more per
            // step, which would be charged to pgtable).
            for i in 1..N + 1 {
                s.install_pte(
                    VirtAddr(r + i * PAGE),
                    NewPte::Page {
                        pa: PhysAddr(PA + i * PAGE),
                        prot: Prot::READ_WRITE,
                    },
                )
                .unwrap();
            }
        }
    };
    let uninstall = |s: &mut Space<X86_64>| {
        for &r in &regions {
            s.unmap(VirtAddr(r + PAGE), N * PAGE).unwrap();
        }
    };
    install(&mut s);
    let last = regions[regions.len() - 1] + N * PAGE;
    assert_eq!(
        s.translate(VirtAddr(last)).unwrap().pa,
        PhysAddr(PA + N * PAGE)
    );
    uninstall(&mut s);
    // Root, PUD, PMD and the 64 PTE tables stay.
    assert_eq!(s.inspect().count_tables(), 3 + TABLES as usize);
    g.bench_function("pgtable", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = clock::now();
                install(&mut s);
                t += clock::now() - t0;
                uninstall(&mut s);
            }
            t
        })
    });
    let mut x = X86_64Crate::new(false);
    for &r in &regions {
        x.map_range(r, 0, 1);
        x.map_range(r, 1, N + 1);
    }
    assert_eq!(x.translate(last).map(|t| t.0), Some(PA + N * PAGE));
    for &r in &regions {
        x.unmap_range(r, 1, N + 1);
    }
    g.bench_function("x86_64", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = clock::now();
                for &r in &regions {
                    x.map_range(r, 1, N + 1);
                }
                t += clock::now() - t0;
                for &r in &regions {
                    x.unmap_range(r, 1, N + 1);
                }
            }
            t
        })
    });
    for &r in &regions {
        x.unmap_range(r, 0, 1);
    }
    g.finish();
}

/// `x86-fork-4K`: fork's page-table copy of 1 GiB of 4 KiB user pages
/// into a new address space (`copy_page_range`), median / 262,144 per
/// page. `pgtable-cow` write-protects every page in the parent with a
/// compare-exchange and copies it read-only (a private writable mapping);
/// `pgtable-shared` copies as is (a shared mapping). No peer has a fork
/// or a range copy; the closest operation is building the same child
/// tables by mapping the range, shown as `pgtable-map` and `x86_64` (the
/// x86_64 crate's `map_to` per page). The child's tables are unmapped
/// untimed after each copy, so every subject reuses warm table frames
/// (zeroed when handed out, inside the timed copy or map).
fn fork(c: &mut Criterion) {
    let user = Prot::WRITE | Prot::USER;
    let mut g = c.benchmark_group("x86-fork-4K");
    g.sample_size(harness::sample_size());
    g.throughput(Throughput::Elements(PAGES));
    for (name, mode) in [
        ("pgtable-cow", CopyMode::Cow),
        ("pgtable-shared", CopyMode::Shared),
    ] {
        let mut parent = space(user);
        parent
            .map(VirtAddr(VA), PhysAddr(PA), G1, user, MapOptions::PAGES)
            .unwrap();
        // Check once: the child translates like the parent.
        let mut child = space(user);
        parent
            .copy_page_range(&mut child, VirtAddr(VA), G1, mode, |_| {})
            .unwrap();
        let t = child.translate(VirtAddr(VA + G1 - 4096)).unwrap();
        assert_eq!(t.pa, PhysAddr(PA + G1 - 4096));
        child.unmap(VirtAddr(VA), G1).unwrap();
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    // COW made the parent read-only: writable again, untimed.
                    parent.change_protection(VirtAddr(VA), G1, user).unwrap();
                    let t0 = clock::now();
                    parent
                        .copy_page_range(&mut child, VirtAddr(VA), G1, mode, |_| {})
                        .unwrap();
                    t += clock::now() - t0;
                    child.unmap(VirtAddr(VA), G1).unwrap();
                }
                t
            })
        });
    }
    let mut child = space(user);
    g.bench_function("pgtable-map", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = clock::now();
                child
                    .map(VirtAddr(VA), PhysAddr(PA), G1, user, MapOptions::PAGES)
                    .unwrap();
                t += clock::now() - t0;
                child.unmap(VirtAddr(VA), G1).unwrap();
            }
            t
        })
    });
    let mut x = X86_64Crate::new(true);
    g.bench_function("x86_64", |b| {
        b.iter_custom(|iters| {
            harness::timed_batch(
                &mut x,
                iters,
                &[VA],
                |_, _| {},
                |s, va| s.map_pages(va, G1),
                |s, va| s.unmap_pages(va, G1),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, peers, report_and_fault, fork);
criterion_main!(benches);
