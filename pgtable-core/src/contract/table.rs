//! Table frames and the memory they come from.

use core::ptr::NonNull;
use core::sync::atomic::AtomicU64;

use crate::{PhysAddr, ENTRIES_PER_TABLE};

/// One table entry: a single 64-bit atomic (the walker reads it
/// concurrently and may write accessed/dirty bits into it).
pub type Slot = AtomicU64;

/// One translation table: 512 entries, 4 KiB, 4 KiB aligned.
#[repr(C, align(4096))]
pub struct Table {
    /// The entries, indexed by the address bits of the table's level.
    pub entries: [Slot; ENTRIES_PER_TABLE],
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
///   of a 4 KiB-aligned, zero-filled frame that nothing else uses until it
///   is passed back to [`free_table`](TableAlloc::free_table);
/// - a frame stays allocated until it is passed to `free_table`, even if
///   the allocator value is dropped first (an allocator that owns its
///   memory leaks the frames still handed out when it goes): an address
///   space whose tables are live on a CPU when it is dropped leaks them
///   rather than free them, and relies on this;
/// - [`phys_to_virt`](TableAlloc::phys_to_virt) of an allocated frame
///   returns a pointer to that frame, valid for reads and atomic writes for
///   as long as the frame stays allocated.
pub unsafe trait TableAlloc {
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
    use crate::PhysAddr;

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
    #[derive(Debug)]
    #[cfg_attr(docsrs, doc(cfg(feature = "alloc")))]
    pub struct Arena {
        free: Vec<PhysAddr>,
        live: usize,
        allocs: u64,
        frees: u64,
        /// Allocations left before they fail; `NO_BUDGET`: never fail.
        budget: AtomicU64,
    }

    /// The `budget` of an arena that never fails.
    const NO_BUDGET: u64 = u64::MAX;

    const LAYOUT: Layout = Layout::new::<Table>();

    impl Default for Arena {
        fn default() -> Arena {
            Arena::new()
        }
    }

    impl Arena {
        /// An empty arena.
        pub const fn new() -> Arena {
            Arena {
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

    // SAFETY: frames come from the global allocator with the layout of a
    // `Table` (4 KiB, 4 KiB aligned), are zeroed (fresh `alloc_zeroed`, or
    // zeroed in `free_table` before going on the free list) and are handed
    // out once until freed. A frame handed out is never returned to the
    // global allocator, not even by `Drop` (which returns the free list
    // only), so it stays valid while allocated. A frame's address is its
    // host address, exposed when it is first handed out.
    unsafe impl TableAlloc for Arena {
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
                    // SAFETY: `LAYOUT` has a non-zero size.
                    let p = unsafe { alloc_zeroed(LAYOUT) };
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
            // SAFETY: the frame is ours (a `LAYOUT` allocation) and no longer
            // in use, so we may overwrite it.
            unsafe { t.as_ptr().write_bytes(0, 1) };
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
            for pa in self.free.drain(..) {
                let p = core::ptr::with_exposed_provenance_mut::<u8>(pa.0 as usize);
                // SAFETY: every frame on the free list came from
                // `alloc_zeroed(LAYOUT)` and is no longer handed out.
                unsafe { dealloc(p, LAYOUT) };
            }
        }
    }
}
