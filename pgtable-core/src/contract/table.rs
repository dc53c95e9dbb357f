//! Table frames and the memory they come from.

use core::ptr::NonNull;
use core::sync::atomic::AtomicU64;

use crate::PhysAddr;

/// One table entry: a single 64-bit atomic (the walker reads it
/// concurrently and may write accessed/dirty bits into it).
pub type Slot = AtomicU64;

/// The start of a table frame, as [`TableAlloc::phys_to_virt`] names it:
/// the first 4 KiB (512 entries) of a frame of
/// [`frame_shift`](TableAlloc::frame_shift) bytes, 4 KiB aligned at least.
/// With 4 KiB pages it is the whole frame; with arm64's 16 KiB and 64 KiB
/// granules a frame holds 2048 or 8192 entries, and the pointer is valid
/// for all of them. The algorithms reach the entries through the pointer,
/// never through a reference to this type.
#[repr(C, align(4096))]
pub struct Table {
    _first: [Slot; 512],
}

impl Table {
    /// A zero-filled 4 KiB frame: for a kernel's static pool of table
    /// frames (`[const { Table::zeroed() }; N]`).
    pub const fn zeroed() -> Table {
        Table {
            _first: [const { Slot::new(0) }; 512],
        }
    }

    /// The frame's first 512 entries: all of them with 4 KiB pages (a
    /// larger frame's others lie beyond, reached through the pointer).
    pub fn entries(&self) -> &[Slot; 512] {
        &self._first
    }
}

const _: () = assert!(core::mem::size_of::<Table>() == 4096);
const _: () = assert!(core::mem::align_of::<Table>() == 4096);

/// Where table frames come from. Implemented by the user (the kernel's page
/// allocator) or, on a host, by `Arena` (feature `alloc`).
///
/// # Safety
///
/// Implementations must guarantee:
/// - [`alloc_table`](TableAlloc::alloc_table) returns the physical address
///   of a zero-filled frame of `1 << frame_shift()` bytes, aligned to its
///   size, that nothing else uses until it is passed back to
///   [`free_table`](TableAlloc::free_table);
/// - a frame stays allocated until it is passed to `free_table`, even if
///   the allocator value is dropped first (an allocator that owns its
///   memory leaks the frames still handed out when it goes): an address
///   space whose tables are live on a CPU when it is dropped leaks them
///   rather than free them, and relies on this;
/// - [`phys_to_virt`](TableAlloc::phys_to_virt) of an allocated frame
///   returns a pointer to that frame, valid for reads and atomic writes of
///   all its bytes for as long as the frame stays allocated.
pub unsafe trait TableAlloc {
    /// log2 of the bytes of every frame (and of their alignment): 12, the
    /// default, for 4 KiB frames; 14 or 16 for an arm64 kernel with 16 KiB
    /// or 64 KiB pages. An address space requires it to equal its format's
    /// [`PAGE_SHIFT`](crate::contract::Format::PAGE_SHIFT)
    /// ([`Error::FrameSize`](crate::Error::FrameSize) otherwise), and it
    /// must not change while the allocator serves one.
    fn frame_shift(&self) -> u32 {
        12
    }

    /// A zeroed table frame, or `None` when memory is exhausted.
    fn alloc_table(&mut self) -> Option<PhysAddr>;

    /// Returns a frame. Its contents are unspecified (the algorithms do not
    /// zero it first); an allocator that hands out zeroed frames zeroes it.
    ///
    /// # Safety
    ///
    /// `pa` came from [`alloc_table`](TableAlloc::alloc_table) of this
    /// allocator, is not freed yet, and no hardware walker can reach it any
    /// more (it is unlinked and the TLB was flushed).
    unsafe fn free_table(&mut self, pa: PhysAddr);

    /// The kernel-virtual address of the table frame at `pa` (Linux
    /// `__va` / `phys_to_virt`).
    ///
    /// Why `unsafe`: a kernel's translation is defined for its table frames
    /// only. It may be a linear-map offset, an index into a frame array or
    /// a slot of a temporary mapping window, and for an address that is
    /// not one of its frames it has no answer (an identity map would even
    /// turn physical address 0 into a null pointer). The algorithms call
    /// it only for frames they got from this allocator and have not freed,
    /// on every step of every walk; asking each implementation to be total
    /// would put a check on that path for an input that never occurs.
    ///
    /// # Safety
    ///
    /// `pa` is a frame that [`alloc_table`](TableAlloc::alloc_table) of this
    /// allocator returned and that is not freed yet.
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table>;
}

#[cfg(feature = "alloc")]
pub use arena::Arena;

#[cfg(feature = "alloc")]
mod arena {
    use alloc::alloc::{alloc_zeroed, dealloc, Layout};
    use alloc::vec::Vec;
    use core::ptr::NonNull;
    use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

    use super::{Table, TableAlloc};
    use crate::{Format, PhysAddr};

    /// A heap-backed table allocator for hosts and tests.
    ///
    /// A frame's "physical" address is its host address, so
    /// `phys_to_virt` is free. Freed frames are zeroed and kept on a free
    /// list for reuse; the arena counts live frames so tests can check for
    /// leaks, and can be told to fail after a number of allocations (through
    /// a shared reference, so a test can do it to the arena of a live
    /// address space: `space.alloc().fail_after(Some(2))`).
    ///
    /// Frames still allocated when the arena is dropped are leaked, never
    /// returned to the global allocator (see [`TableAlloc`]).
    ///
    /// Its frames are 4 KiB ([`Arena::new`]) or the pages of a format
    /// ([`Arena::for_format`]: 16 KiB or 64 KiB for arm64's larger
    /// granules).
    #[derive(Debug)]
    #[cfg_attr(docsrs, doc(cfg(feature = "alloc")))]
    pub struct Arena {
        /// The frames' layout: a format's page, aligned to its size.
        layout: Layout,
        free: Vec<PhysAddr>,
        live: usize,
        allocs: u64,
        frees: u64,
        /// Allocations left before they fail; `NO_BUDGET`: never fail.
        budget: AtomicU64,
    }

    /// The `budget` of an arena that never fails.
    const NO_BUDGET: u64 = u64::MAX;

    impl Default for Arena {
        fn default() -> Arena {
            Arena::new()
        }
    }

    impl Arena {
        /// An empty arena of 4 KiB frames.
        pub const fn new() -> Arena {
            Arena::with_shift(12)
        }

        /// An empty arena of frames of `F`'s page size.
        pub const fn for_format<F: Format>() -> Arena {
            const { assert!(crate::contract::level::check::<F>()) };
            Arena::with_shift(F::PAGE_SHIFT)
        }

        /// `shift` is a format's `PAGE_SHIFT` (12, 14 or 16).
        const fn with_shift(shift: u32) -> Arena {
            let size = 1usize << shift;
            Arena {
                // A power of two is a valid size and alignment; the
                // fallback (a 4 KiB `Table`) is never taken.
                layout: match Layout::from_size_align(size, size) {
                    Ok(l) => l,
                    Err(_) => Layout::new::<Table>(),
                },
                free: Vec::new(),
                live: 0,
                allocs: 0,
                frees: 0,
                budget: AtomicU64::new(NO_BUDGET),
            }
        }

        /// Frames currently allocated and not freed.
        pub fn live(&self) -> usize {
            self.live
        }

        /// Total successful allocations.
        pub fn allocs(&self) -> u64 {
            self.allocs
        }

        /// Total frees.
        pub fn frees(&self) -> u64 {
            self.frees
        }

        /// Lets the next `n` table allocations succeed and every later one
        /// fail (`None`: never fail).
        pub fn fail_after(&self, n: Option<u64>) {
            // Relaxed: a test knob, read by `alloc_table` through `&mut`.
            self.budget
                .store(n.map_or(NO_BUDGET, |n| n.min(NO_BUDGET - 1)), Relaxed);
        }
    }

    // SAFETY: frames come from the global allocator with `self.layout`
    // (`1 << frame_shift()` bytes aligned to their size), are zeroed (fresh
    // `alloc_zeroed`, or zeroed in `free_table` before going on the free
    // list) and are handed out once until freed. A frame handed out is
    // never returned to the global allocator, not even by `Drop` (which
    // returns the free list only), so it stays valid while allocated. A
    // frame's address is its host address, exposed when it is first handed
    // out.
    unsafe impl TableAlloc for Arena {
        fn frame_shift(&self) -> u32 {
            self.layout.size().trailing_zeros()
        }

        fn alloc_table(&mut self) -> Option<PhysAddr> {
            let b = self.budget.get_mut();
            if *b != NO_BUDGET {
                if *b == 0 {
                    return None;
                }
                *b -= 1;
            }
            let pa = match self.free.pop() {
                Some(pa) => pa,
                None => {
                    // SAFETY: the layout has a non-zero size.
                    let p = unsafe { alloc_zeroed(self.layout) };
                    if p.is_null() {
                        return None;
                    }
                    PhysAddr(p.expose_provenance() as u64)
                }
            };
            self.live += 1;
            self.allocs += 1;
            Some(pa)
        }

        unsafe fn free_table(&mut self, pa: PhysAddr) {
            // SAFETY: the caller passes a frame of ours that is not freed yet.
            let t = unsafe { self.phys_to_virt(pa) };
            // SAFETY: the frame is ours (an allocation of `self.layout`)
            // and no longer in use, so we may overwrite it.
            unsafe { t.as_ptr().cast::<u8>().write_bytes(0, self.layout.size()) };
            self.live -= 1;
            self.frees += 1;
            self.free.push(pa);
        }

        #[inline]
        unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
            // The address was exposed by `alloc_table`, so the pointer gets
            // the provenance of the frame's allocation.
            let p = core::ptr::with_exposed_provenance_mut::<Table>(pa.0 as usize);
            // SAFETY: the caller passes a frame we handed out, whose address
            // is that of a non-null `alloc_zeroed` allocation.
            unsafe { NonNull::new_unchecked(p) }
        }
    }

    impl Drop for Arena {
        fn drop(&mut self) {
            let layout = self.layout;
            for pa in self.free.drain(..) {
                let p = core::ptr::with_exposed_provenance_mut::<u8>(pa.0 as usize);
                // SAFETY: every frame on the free list came from
                // `alloc_zeroed(self.layout)` and is no longer handed out.
                unsafe { dealloc(p, layout) };
            }
        }
    }
}
