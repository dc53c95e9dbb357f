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

        fn mapper(&mut self) -> OffsetPageTable<'_> {
            // SAFETY: the root is ours and every table below it is a host
            // frame whose address is its "physical" address (offset 0);
            // `&mut self` makes the borrow exclusive.
            unsafe { OffsetPageTable::new(self.root.as_mut(), VirtAddr::zero()) }
        }

        fn pages() -> impl Iterator<Item = (Page<Size4KiB>, PhysFrame<Size4KiB>)> {
            let p0 = Page::containing_address(VirtAddr::new(VA));
            let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
            Page::range(p0, p0 + G1 / PAGE).zip(PhysFrame::range(f0, f0 + G1 / PAGE))
        }

        fn blocks() -> impl Iterator<Item = (Page<Size2MiB>, PhysFrame<Size2MiB>)> {
            let p0 = Page::containing_address(VirtAddr::new(VA));
            let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
            Page::range(p0, p0 + BLOCKS).zip(PhysFrame::range(f0, f0 + BLOCKS))
        }

        fn clean_up(&mut self) {
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

criterion_group!(benches, peers);
criterion_main!(benches);
