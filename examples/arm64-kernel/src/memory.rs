//! RAM layout and the table-frame allocator.
//!
//! QEMU `virt` RAM starts at 0x4000_0000. The kernel identity-maps all of
//! it, so a physical address is also the virtual address the kernel uses
//! (before and after the MMU is on). Layout:
//!
//! ```text
//! 0x4000_0000  device tree (QEMU puts it here)
//! 0x4020_0000  kernel image, .bss, boot stack       (__kernel_start..__kernel_end)
//! next 2 MiB   table frames: TABLE_POOL bytes, bump + free list
//! next 2 MiB   the test pool: RAM the suite and the benchmarks map
//!              and write through their virtual windows
//! RAM end
//! ```

use core::cell::UnsafeCell;
use core::ptr::NonNull;

use pgtable_core::{PhysAddr, Table, TableAlloc};

/// Bytes reserved for page-table frames.
pub const TABLE_POOL: u64 = 64 << 20;
/// QEMU virt RAM base.
pub const RAM_BASE: u64 = 0x4000_0000;

const MIB2: u64 = 2 << 20;

/// Where everything is.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// RAM, `[start, end)`.
    pub ram: (u64, u64),
    /// The kernel image with its stack, 2 MiB-rounded.
    pub kernel: (u64, u64),
    /// Table frames.
    pub tables: (u64, u64),
    /// The test pool.
    pub pool: (u64, u64),
}

extern "C" {
    static __kernel_start: u8;
    static __kernel_end: u8;
}

impl Layout {
    /// The layout for RAM `[ram_base, ram_base + ram_size)`.
    pub fn new(ram_base: u64, ram_size: u64) -> Layout {
        // Linker-defined symbols: only their addresses are taken.
        let (ks, ke) = (
            &raw const __kernel_start as u64,
            &raw const __kernel_end as u64,
        );
        let kernel = (ks & !(MIB2 - 1), (ke + MIB2 - 1) & !(MIB2 - 1));
        let tables = (kernel.1, kernel.1 + TABLE_POOL);
        let end = ram_base + ram_size;
        assert!(tables.1 < end, "RAM too small for the table pool");
        Layout {
            ram: (ram_base, end),
            kernel,
            tables,
            pool: (tables.1, end),
        }
    }
}

/// The state of the table allocator: a bump pointer over the table pool
/// and a free list linked through the first word of each free frame.
struct Frames {
    next: u64,
    end: u64,
    free: u64,
    live: u64,
    peak: u64,
}

/// Single-core kernel with interrupts masked: no concurrent access.
struct Global(UnsafeCell<Frames>);

// SAFETY: the kernel runs on one core with interrupts masked, and every
// access goes through `with_frames`, which never re-enters itself.
unsafe impl Sync for Global {}

static FRAMES: Global = Global(UnsafeCell::new(Frames {
    next: 0,
    end: 0,
    free: 0,
    live: 0,
    peak: 0,
}));

fn with_frames<R>(f: impl FnOnce(&mut Frames) -> R) -> R {
    // SAFETY: see `Global`: one core, no interrupts, and `f` (code of this
    // module) does not call `with_frames` again, so the borrow is unique.
    f(unsafe { &mut *FRAMES.0.get() })
}

/// Hands the table pool `[start, end)` to the allocator.
///
/// # Safety
///
/// Call once, before the first allocation. `[start, end)` is 4 KiB aligned
/// RAM, identity-mapped, above address 0, that nothing else uses.
pub unsafe fn init_tables(start: u64, end: u64) {
    with_frames(|fr| {
        fr.next = start;
        fr.end = end;
    });
}

/// Frames allocated and not freed, and the most ever live at once.
pub fn tables_live() -> (u64, u64) {
    with_frames(|fr| (fr.live, fr.peak))
}

/// A handle to the kernel's table allocator. Copies share the frames, so
/// several address spaces may draw from one pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelTables;

// SAFETY: frames come from the table pool, which nothing else in the
// kernel uses (see `Layout`); the bump pointer hands each frame out once
// and the free list holds only frames given back; every frame is zeroed
// before it is handed out; the pool is a static (dropping a handle frees
// nothing). RAM is identity-mapped (before and after the MMU is on), so
// `phys_to_virt` is the identity and valid for the frame's life.
unsafe impl TableAlloc for KernelTables {
    fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = with_frames(|fr| {
            let pa = if fr.free != 0 {
                let pa = fr.free;
                // SAFETY: a frame on the free list is ours and unused; its
                // first word links the next free frame.
                fr.free = unsafe { (pa as *const u64).read() };
                pa
            } else if fr.next < fr.end {
                let pa = fr.next;
                fr.next += 4096;
                pa
            } else {
                return None;
            };
            fr.live += 1;
            fr.peak = fr.peak.max(fr.live);
            Some(pa)
        })?;
        // SAFETY: the frame was just taken from the pool, is 4 KiB aligned
        // and mapped (identity), and nothing else uses it.
        unsafe { (pa as *mut Table).write_bytes(0, 1) };
        Some(PhysAddr(pa))
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        with_frames(|fr| {
            // SAFETY: the caller returns a frame of ours nobody uses any more.
            unsafe { (pa.0 as *mut u64).write(fr.free) };
            fr.free = pa.0;
            fr.live -= 1;
        });
    }

    #[inline]
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: the caller passes one of our frames, which lie in RAM,
        // and RAM starts at 1 GiB, so the address is not null.
        unsafe { NonNull::new_unchecked(pa.0 as *mut Table) }
    }
}
