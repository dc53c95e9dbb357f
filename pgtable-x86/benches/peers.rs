//! pgtable against its Rust peers on x86_64, one criterion run over 1 GiB
//! of address space: the groups `x86-map-4K`, `x86-protect-4K`,
//! `x86-unmap-4K`, `x86-map-2M` and `x86-move-1G`. What each group times,
//! the checks before timing, the common fairness rules and the clock are
//! those of the shared harness, `pgtable-core/benches/support/peers_harness.rs`
//! (its module docs); this file adds the x86 peers.
//!
//! Subjects, each with its fastest honest API:
//!
//! - `pgtable`: `AddressSpace<X86_64, NoopMmu, Arena>`, one ranged call per
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
//! list of 4 KiB host frames and zero a table when they allocate it (their
//! design); pgtable's arena zeroes it when it is freed, so pgtable pays
//! that in unmap.
//!
//! Run: `cargo bench -p pgtable-x86 --bench peers -- --warm-up-time 1
//! --measurement-time 3` (`PEERS_CLOCK=thread` for CPU time, 4 KiB groups
//! only: see the harness docs).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use pgtable_x86::X86_64;

// page_table_multiarch's x86_64 table, the only user of `harness::ptm`
// here, exists only on x86_64 hosts.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[path = "../../pgtable-core/benches/support/peers_harness.rs"]
mod harness;

use harness::{Pgtable, Subjects};

// ----- the x86_64 crate -----

mod x86_64_crate {
    use std::ptr::NonNull;

    use x86_64::structures::paging::mapper::{MappedFrame, TranslateResult};
    use x86_64::structures::paging::{
        mapper::CleanUp, FrameAllocator, FrameDeallocator, Mapper, OffsetPageTable, Page,
        PageTable, PageTableFlags as F, PhysFrame, Size2MiB, Size4KiB, Translate,
    };
    use x86_64::{PhysAddr, VirtAddr};

    use crate::harness::{frames, Subject, BLOCKS, G1, PA, PAGE, VA};

    /// pgtable's kernel read-write leaf, bit for bit.
    const RW: F = F::PRESENT
        .union(F::WRITABLE)
        .union(F::NO_EXECUTE)
        .union(F::ACCESSED)
        .union(F::DIRTY);
    /// pgtable's kernel read-only leaf (A and D kept), bit for bit.
    const RO: F = F::PRESENT
        .union(F::NO_EXECUTE)
        .union(F::ACCESSED)
        .union(F::DIRTY);

    /// The frame allocator the crate's `map_to` and `clean_up` use.
    struct Frames;

    // SAFETY: `frames::alloc` hands out each 4 KiB-aligned frame once until
    // it is freed, and with physical offset 0 the frame is addressable.
    unsafe impl FrameAllocator<Size4KiB> for Frames {
        fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
            Some(PhysFrame::containing_address(PhysAddr::new(
                frames::alloc() as u64,
            )))
        }
    }

    impl FrameDeallocator<Size4KiB> for Frames {
        unsafe fn deallocate_frame(&mut self, frame: PhysFrame<Size4KiB>) {
            frames::free(frame.start_address().as_u64() as usize);
        }
    }

    pub struct X86_64Crate {
        root: NonNull<PageTable>,
        /// Free the emptied tables in the timed unmap (`clean_up_addr_range`).
        pub clean_up_in_unmap: bool,
    }

    impl X86_64Crate {
        pub fn new(clean_up_in_unmap: bool) -> X86_64Crate {
            let p = frames::alloc() as *mut PageTable;
            // SAFETY: a fresh 4 KiB-aligned frame of ours.
            unsafe { p.write(PageTable::new()) };
            X86_64Crate {
                root: NonNull::new(p).unwrap(),
                clean_up_in_unmap,
            }
        }

        pub fn mapper(&mut self) -> OffsetPageTable<'_> {
            // SAFETY: the root is ours and every table below it is a host
            // frame whose address is its "physical" address (offset 0);
            // `&mut self` makes the borrow exclusive.
            unsafe { OffsetPageTable::new(self.root.as_mut(), VirtAddr::zero()) }
        }

        pub fn pages() -> impl Iterator<Item = (Page<Size4KiB>, PhysFrame<Size4KiB>)> {
            let p0 = Page::containing_address(VirtAddr::new(VA));
            let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
            Page::range(p0, p0 + G1 / PAGE).zip(PhysFrame::range(f0, f0 + G1 / PAGE))
        }

        fn blocks() -> impl Iterator<Item = (Page<Size2MiB>, PhysFrame<Size2MiB>)> {
            let p0 = Page::containing_address(VirtAddr::new(VA));
            let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
            Page::range(p0, p0 + BLOCKS).zip(PhysFrame::range(f0, f0 + BLOCKS))
        }

        pub fn clean_up(&mut self) {
            let first = Page::<Size4KiB>::containing_address(VirtAddr::new(VA));
            let last = Page::containing_address(VirtAddr::new(VA + G1 - 1));
            // SAFETY: nothing is mapped in the range any more and no CPU
            // uses these tables.
            unsafe {
                self.mapper()
                    .clean_up_addr_range(Page::range_inclusive(first, last), &mut Frames)
            };
        }
    }

    impl X86_64Crate {
        /// Unmaps the 1 GiB of pages one `unmap` each, summing the frames
        /// it returns (what a kernel needs to free them), then frees the
        /// emptied tables as pgtable's unmap does.
        pub fn unmap_pages_summing(&mut self) -> u64 {
            let mut sum = 0u64;
            let mut m = self.mapper();
            for (page, _) in Self::pages() {
                let (frame, flush) = Mapper::<Size4KiB>::unmap(&mut m, page).unwrap();
                flush.ignore();
                sum = sum.wrapping_add(frame.start_address().as_u64());
            }
            self.clean_up();
            sum
        }

        /// `map_to` of the pages `[VA + first * 4K, VA + end * 4K)`, one
        /// call each; their tables exist.
        pub fn map_range(&mut self, first: u64, end: u64) {
            let mut m = self.mapper();
            for i in first..end {
                let page = Page::<Size4KiB>::containing_address(VirtAddr::new(VA + i * PAGE));
                let frame = PhysFrame::containing_address(PhysAddr::new(PA + i * PAGE));
                // SAFETY: the frames are never accessed; the tables are not live.
                unsafe { m.map_to(page, frame, RW, &mut Frames) }
                    .unwrap()
                    .ignore();
            }
        }

        /// `unmap` of the pages `[VA + first * 4K, VA + end * 4K)`.
        pub fn unmap_range(&mut self, first: u64, end: u64) {
            let mut m = self.mapper();
            for i in first..end {
                let page = Page::<Size4KiB>::containing_address(VirtAddr::new(VA + i * PAGE));
                Mapper::<Size4KiB>::unmap(&mut m, page).unwrap().1.ignore();
            }
        }
    }

    impl Drop for X86_64Crate {
        fn drop(&mut self) {
            // SAFETY: no CPU uses these tables; everything is unmapped first.
            unsafe { self.mapper().clean_up(&mut Frames) };
            frames::free(self.root.as_ptr() as usize);
        }
    }

    impl Subject for X86_64Crate {
        fn map_pages(&mut self) {
            let mut m = self.mapper();
            for (page, frame) in Self::pages() {
                // SAFETY: the frames are never accessed; the tables are not live.
                unsafe { m.map_to(page, frame, RW, &mut Frames) }
                    .unwrap()
                    .ignore();
            }
        }
        fn map_blocks(&mut self) {
            let mut m = self.mapper();
            for (page, frame) in Self::blocks() {
                // SAFETY: as in `map_pages`.
                unsafe { m.map_to(page, frame, RW, &mut Frames) }
                    .unwrap()
                    .ignore();
            }
        }
        fn protect(&mut self, writable: bool) {
            let flags = if writable { RW } else { RO };
            let mut m = self.mapper();
            for (page, _) in Self::pages() {
                // SAFETY: the tables are not live.
                unsafe { m.update_flags(page, flags) }.unwrap().ignore();
            }
        }
        fn unmap_pages(&mut self) {
            let mut m = self.mapper();
            for (page, _) in Self::pages() {
                Mapper::<Size4KiB>::unmap(&mut m, page).unwrap().1.ignore();
            }
            if self.clean_up_in_unmap {
                self.clean_up();
            }
        }
        fn unmap_blocks(&mut self) {
            let mut m = self.mapper();
            for (page, _) in Self::blocks() {
                Mapper::<Size2MiB>::unmap(&mut m, page).unwrap().1.ignore();
            }
        }
        fn reset(&mut self) {
            self.clean_up();
        }
        fn translate(&self, va: u64) -> Option<(u64, bool, u64)> {
            // SAFETY: as in `mapper`; the mapper is only read through.
            let m = unsafe { OffsetPageTable::new(&mut *self.root.as_ptr(), VirtAddr::zero()) };
            match m.translate(VirtAddr::new(va)) {
                TranslateResult::Mapped {
                    frame,
                    offset,
                    flags,
                } => {
                    let size = match frame {
                        MappedFrame::Size4KiB(_) => PAGE,
                        MappedFrame::Size2MiB(_) => 2 << 20,
                        MappedFrame::Size1GiB(_) => 1 << 30,
                    };
                    Some((
                        frame.start_address().as_u64() + offset,
                        flags.contains(F::WRITABLE),
                        size,
                    ))
                }
                _ => None,
            }
        }
    }
}

// ----- the benchmarks -----

/// Every subject of all groups but move (the harness adds `pgtable-user`
/// to the protect group and `x86_64+clean_up` comes in for unmap).
fn subjects() -> Subjects {
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Subjects = vec![
        ("pgtable", Box::new(Pgtable::<X86_64>::new(false))),
        ("x86_64", Box::new(x86_64_crate::X86_64Crate::new(false))),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push((
        "page_table_multiarch",
        Box::new(harness::ptm::Ptm::new(
            page_table_multiarch::x86_64::X64PageTable::try_new().unwrap(),
        )),
    ));
    v
}

fn peers(c: &mut Criterion) {
    harness::run::<X86_64>(c, "x86", subjects(), || {
        vec![(
            "x86_64+clean_up",
            Box::new(x86_64_crate::X86_64Crate::new(true)),
        )]
    });
}

// ----- unmap with a report per page, and the fault-time install -----

/// `x86-unmap-report-4K`: unmap 1 GiB of 4 KiB pages and hand every
/// removed page to the caller, who sums its physical address and dirty
/// state (so nothing is optimised away); median / 262,144 per page.
///
/// - `pgtable`: `unmap_with` of kernel pages (created accessed and dirty:
///   settled, so each entry is read with a plain load).
/// - `pgtable-user`: `unmap_with` of user pages (A/D clean: the hardware
///   could still write them, so each is taken with the atomic
///   get-and-clear, `xchg`).
/// - `pgtable-noreport`: plain `unmap` for reference (unlinks whole tables
///   without visiting their entries).
/// - `x86_64`: the x86_64 crate's `unmap` per page, which returns the
///   frame (no dirty state), summing the frames, then
///   `clean_up_addr_range` to free the emptied tables as pgtable does.
///
/// `x86-fault-4K`: install one 4 KiB page where its tables exist (a page
/// fault's `set_pte_at`), 511 in a row per timed batch; median / 511.
/// `pgtable`: `install_pte`; `x86_64`: `map_to`.
fn report_and_fault(c: &mut Criterion) {
    use std::hint::black_box;
    use std::time::Duration;

    use harness::{clock, G1, PA, PAGE, PAGES, VA};
    use pgtable_core::{AddressSpace, Arena, MapOptions, NoopMmu, PhysAddr, Prot, VirtAddr};

    fn space(prot: Prot) -> AddressSpace<X86_64, NoopMmu, Arena> {
        let mut s = AddressSpace::new(NoopMmu, Arena::new()).unwrap();
        s.map(VirtAddr(VA), PhysAddr(PA), G1, prot, MapOptions::PAGES)
            .unwrap();
        s.unmap(VirtAddr(VA), G1).unwrap();
        s
    }

    let mut g = c.benchmark_group("x86-unmap-report-4K");
    g.sample_size(20);
    g.throughput(criterion::Throughput::Elements(PAGES));
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
    let mut x = x86_64_crate::X86_64Crate::new(false);
    harness::Subject::map_pages(&mut x);
    let sum = x.unmap_pages_summing();
    assert_eq!(sum, (0..PAGES).map(|i| PA + i * PAGE).sum::<u64>());
    g.bench_function("x86_64", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                harness::Subject::map_pages(&mut x);
                let t0 = clock::now();
                black_box(x.unmap_pages_summing());
                t += clock::now() - t0;
            }
            t
        })
    });
    g.finish();

    // Install one page at a time into an existing PTE table: page 0 stays
    // mapped (so the table stays), pages 1..512 come and go.
    const N: u64 = 511;
    let mut g = c.benchmark_group("x86-fault-4K");
    g.sample_size(20);
    g.throughput(criterion::Throughput::Elements(N));
    let mut s = space(Prot::READ_WRITE);
    s.map(
        VirtAddr(VA),
        PhysAddr(PA),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    let install = |s: &mut AddressSpace<X86_64, NoopMmu, Arena>| {
        for i in 1..=N {
            s.install_pte(
                VirtAddr(VA + i * PAGE),
                PhysAddr(PA + i * PAGE),
                Prot::READ_WRITE,
            )
            .unwrap();
        }
    };
    install(&mut s);
    assert_eq!(
        s.translate(VirtAddr(VA + N * PAGE)).unwrap().pa,
        PhysAddr(PA + N * PAGE)
    );
    s.unmap(VirtAddr(VA + PAGE), N * PAGE).unwrap();
    assert_eq!(s.count_tables(), 4);
    g.bench_function("pgtable", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = clock::now();
                install(&mut s);
                t += clock::now() - t0;
                s.unmap(VirtAddr(VA + PAGE), N * PAGE).unwrap();
            }
            t
        })
    });
    let mut x = x86_64_crate::X86_64Crate::new(false);
    x.map_range(0, 1);
    x.map_range(1, N + 1);
    assert_eq!(
        harness::Subject::translate(&x, VA + N * PAGE).map(|t| t.0),
        Some(PA + N * PAGE)
    );
    x.unmap_range(1, N + 1);
    g.bench_function("x86_64", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = clock::now();
                x.map_range(1, N + 1);
                t += clock::now() - t0;
                x.unmap_range(1, N + 1);
            }
            t
        })
    });
    x.unmap_range(0, 1);
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
/// untimed after each copy, so every subject reuses warm table frames.
fn fork(c: &mut Criterion) {
    use std::time::Duration;

    use harness::{clock, G1, PA, PAGES, VA};
    use pgtable_core::{
        AddressSpace, Arena, CopyMode, MapOptions, NoopMmu, PhysAddr, Prot, VirtAddr,
    };

    let user = Prot::WRITE | Prot::USER;
    let mut g = c.benchmark_group("x86-fork-4K");
    g.sample_size(20);
    g.throughput(criterion::Throughput::Elements(PAGES));
    for (name, mode) in [
        ("pgtable-cow", CopyMode::Cow),
        ("pgtable-shared", CopyMode::Shared),
    ] {
        let mut parent = AddressSpace::<X86_64, _, _>::new(NoopMmu, Arena::new()).unwrap();
        parent
            .map(VirtAddr(VA), PhysAddr(PA), G1, user, MapOptions::PAGES)
            .unwrap();
        // Check once: the child translates like the parent.
        let mut child = AddressSpace::<X86_64, _, _>::new(NoopMmu, Arena::new()).unwrap();
        parent
            .copy_page_range(&mut child, VirtAddr(VA), G1, mode)
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
                        .copy_page_range(&mut child, VirtAddr(VA), G1, mode)
                        .unwrap();
                    t += clock::now() - t0;
                    child.unmap(VirtAddr(VA), G1).unwrap();
                }
                t
            })
        });
    }
    let mut child = AddressSpace::<X86_64, _, _>::new(NoopMmu, Arena::new()).unwrap();
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
    let mut x = x86_64_crate::X86_64Crate::new(true);
    g.bench_function("x86_64", |b| {
        b.iter_custom(|iters| {
            let mut t = Duration::ZERO;
            for _ in 0..iters {
                let t0 = clock::now();
                harness::Subject::map_pages(&mut x);
                t += clock::now() - t0;
                harness::Subject::unmap_pages(&mut x);
                harness::Subject::reset(&mut x);
            }
            t
        })
    });
    g.finish();
}

criterion_group!(benches, peers, report_and_fault, fork);
criterion_main!(benches);
