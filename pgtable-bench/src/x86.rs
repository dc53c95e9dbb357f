//! The x86_64 peers (see `benches/x86_peers.rs` for what each calls and
//! why).
//!
//! - [`X86_64Crate`]: the `x86_64` crate's `OffsetPageTable` (physical
//!   offset 0: a table frame's "physical" address is its host address),
//!   per-page calls `map_to` / `update_flags` / `unmap`, each walking from
//!   the root; the `MapperFlush` is `ignore()`d. Its leaves are bit for bit
//!   pgtable's kernel leaves, A and D included.
//! - [`ptm_subject`]: page_table_multiarch's `x86_64::X64PageTable` (x86_64
//!   hosts only) in the harness's [`ptm`](crate::ptm) subject.

use std::ptr::NonNull;

use x86_64::structures::paging::mapper::{MappedFrame, TranslateResult};
use x86_64::structures::paging::{
    mapper::CleanUp, FrameAllocator, FrameDeallocator, Mapper, OffsetPageTable, Page, PageTable,
    PageTableFlags as F, PhysFrame, Size2MiB, Size4KiB, Translate,
};
use x86_64::{PhysAddr, VirtAddr};

use crate::harness::{frames, Subject, M2, PA, PAGE, VA};

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

/// The frame allocator the crate's `map_to` and `clean_up` use: the
/// harness's free list. The crate zeroes a table frame when it links it.
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

/// The `x86_64` crate's subject (`x86_64`, or `x86_64+clean_up`).
pub struct X86_64Crate {
    root: NonNull<PageTable>,
    /// Free the emptied tables in the timed unmap (`clean_up_addr_range`).
    pub clean_up_in_unmap: bool,
}

impl X86_64Crate {
    /// An empty table; `clean_up_in_unmap`: the cleanup variant.
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

    fn pages(va: u64, len: u64) -> impl Iterator<Item = (Page<Size4KiB>, PhysFrame<Size4KiB>)> {
        let p0 = Page::containing_address(VirtAddr::new(va));
        let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
        Page::range(p0, p0 + len / PAGE).zip(PhysFrame::range(f0, f0 + len / PAGE))
    }

    fn blocks(va: u64, len: u64) -> impl Iterator<Item = (Page<Size2MiB>, PhysFrame<Size2MiB>)> {
        let p0 = Page::containing_address(VirtAddr::new(va));
        let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
        Page::range(p0, p0 + len / M2).zip(PhysFrame::range(f0, f0 + len / M2))
    }

    /// Frees the emptied tables of `[va, va + len)`.
    pub fn clean_up(&mut self, va: u64, len: u64) {
        let first = Page::<Size4KiB>::containing_address(VirtAddr::new(va));
        let last = Page::containing_address(VirtAddr::new(va + len - 1));
        // SAFETY: nothing is mapped in the range any more and no CPU
        // uses these tables.
        unsafe {
            self.mapper()
                .clean_up_addr_range(Page::range_inclusive(first, last), &mut Frames)
        };
    }

    /// Unmaps `[va, va + len)` one `unmap` per page, summing the frames it
    /// returns (what a kernel needs to free them), then frees the emptied
    /// tables as pgtable's unmap does.
    pub fn unmap_pages_summing(&mut self, va: u64, len: u64) -> u64 {
        let mut sum = 0u64;
        let mut m = self.mapper();
        for (page, _) in Self::pages(va, len) {
            let (frame, flush) = Mapper::<Size4KiB>::unmap(&mut m, page).unwrap();
            flush.ignore();
            sum = sum.wrapping_add(frame.start_address().as_u64());
        }
        self.clean_up(va, len);
        sum
    }

    /// `map_to` of the pages `[va + first * 4K, va + end * 4K)` (to
    /// `PA + first * 4K ..`), one call each.
    pub fn map_range(&mut self, va: u64, first: u64, end: u64) {
        let mut m = self.mapper();
        for i in first..end {
            let page = Page::<Size4KiB>::containing_address(VirtAddr::new(va + i * PAGE));
            let frame = PhysFrame::containing_address(PhysAddr::new(PA + i * PAGE));
            // SAFETY: the frames are never accessed; the tables are not live.
            unsafe { m.map_to(page, frame, RW, &mut Frames) }
                .unwrap()
                .ignore();
        }
    }

    /// `unmap` of the pages `[va + first * 4K, va + end * 4K)`.
    pub fn unmap_range(&mut self, va: u64, first: u64, end: u64) {
        let mut m = self.mapper();
        for i in first..end {
            let page = Page::<Size4KiB>::containing_address(VirtAddr::new(va + i * PAGE));
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
    fn map_pages(&mut self, va: u64, len: u64) {
        let mut m = self.mapper();
        for (page, frame) in Self::pages(va, len) {
            // SAFETY: the frames are never accessed; the tables are not live.
            unsafe { m.map_to(page, frame, RW, &mut Frames) }
                .unwrap()
                .ignore();
        }
    }
    fn map_blocks(&mut self, va: u64, len: u64) {
        let mut m = self.mapper();
        for (page, frame) in Self::blocks(va, len) {
            // SAFETY: as in `map_pages`.
            unsafe { m.map_to(page, frame, RW, &mut Frames) }
                .unwrap()
                .ignore();
        }
    }
    fn protect(&mut self, va: u64, len: u64, writable: bool) {
        let flags = if writable { RW } else { RO };
        let mut m = self.mapper();
        for (page, _) in Self::pages(va, len) {
            // SAFETY: the tables are not live.
            unsafe { m.update_flags(page, flags) }.unwrap().ignore();
        }
    }
    fn unmap_pages(&mut self, va: u64, len: u64) {
        let mut m = self.mapper();
        for (page, _) in Self::pages(va, len) {
            Mapper::<Size4KiB>::unmap(&mut m, page).unwrap().1.ignore();
        }
        if self.clean_up_in_unmap {
            self.clean_up(va, len);
        }
    }
    fn unmap_blocks(&mut self, va: u64, len: u64) {
        let mut m = self.mapper();
        for (page, _) in Self::blocks(va, len) {
            Mapper::<Size2MiB>::unmap(&mut m, page).unwrap().1.ignore();
        }
        if self.clean_up_in_unmap {
            self.clean_up(va, len);
        }
    }
    fn reset(&mut self) {
        // Everything below the root: the benchmarks' ranges lie in the
        // first 512 GiB, under root entry 0.
        let first = Page::<Size4KiB>::containing_address(VirtAddr::new(0));
        let last = Page::containing_address(VirtAddr::new((512 << 30) - 1));
        // SAFETY: nothing is mapped any more and no CPU uses these tables.
        unsafe {
            self.mapper()
                .clean_up_addr_range(Page::range_inclusive(first, last), &mut Frames)
        };
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
    fn tables_held(&self) -> usize {
        frames::in_use()
    }
}

/// page_table_multiarch's x86_64 table in the harness's `ptm` subject.
#[cfg(target_arch = "x86_64")]
pub fn ptm_subject() -> impl Subject {
    crate::ptm::Ptm::new(page_table_multiarch::x86_64::X64PageTable::try_new().unwrap())
}

/// The VA the benchmarks use is below 512 GiB (see [`X86_64Crate::reset`]).
const _: () = assert!(VA < 512 << 30);
