//! The address-space layout, the RAM layout and the table-frame allocator.
//!
//! The kernel lives in the upper half (TTBR1_EL1), as Linux does; the lower
//! half (TTBR0_EL1) belongs to the suite's test space and to user spaces.
//! As Linux configures arm64 with 48-bit VAs, each half has 48 bits
//! (T0SZ = T1SZ = 16) and its own root: the lower half is
//! `[0, 2^48)`, the upper half `[0xffff_0000_0000_0000, 2^64)`; the 52-bit
//! builds (geom.rs) have `[0, 2^52)` and `[0xfff0_0000_0000_0000, 2^64)`
//! and keep the kernel's regions where the 48-bit layout has them. Each
//! kernel region sits in its own 512 GiB slot (one root entry of the
//! early map's 4 KiB root) and reaches physical memory at a fixed offset:
//!
//! ```text
//! 0xffff_0000_0000_0000  PAGE_OFFSET    linear map of all RAM: va = pa + PAGE_OFFSET
//! 0xffff_0080_0000_0000  KIMAGE_OFFSET  the kernel image:      va = pa + KIMAGE_OFFSET
//! 0xffff_0100_0000_0000  DEVICE_OFFSET  the UART:              va = pa + DEVICE_OFFSET
//! 0xffff_0180_0000_0000  KERNEL_VA_END  (nothing of the kernel's above)
//! ```
//!
//! Everything that reaches a frame by its physical address (the table
//! allocator, the probes' code patching, the device tree) goes through the
//! linear map, never through an identity map: after boot there is none.
//!
//! QEMU `virt` RAM starts at 0x4000_0000. Physical layout:
//!
//! ```text
//! 0x4000_0000  device tree (QEMU puts it here)
//! 0x4020_0000  the boot code and early tables, then the kernel image,
//!              .bss, guard page, boot stack      (__image_start_pa..pa(__kernel_end))
//! next 2 MiB   table frames: TABLE_POOL bytes, bump + free list
//! next 2 MiB   the test pool: RAM the suite and the benchmarks map
//!              and write through their virtual windows
//! RAM end
//! ```

use core::cell::UnsafeCell;
use core::ptr::NonNull;

use pgtable_core::contract::{Table, TableAlloc};
use pgtable_core::PhysAddr;

use crate::geom::{PAGE, PAGE_SHIFT};

/// Bytes reserved for page-table frames.
pub const TABLE_POOL: u64 = 64 << 20;
/// QEMU virt RAM base.
pub const RAM_BASE: u64 = 0x4000_0000;
/// The linear map: RAM at physical `pa` is at `pa + PAGE_OFFSET` (the start
/// of the upper half: TTBR1_EL1 translates 48 bits, T1SZ = 16).
pub const PAGE_OFFSET: u64 = 0xffff_0000_0000_0000;
/// The kernel image: its virtual addresses are its load addresses plus
/// this (`KIMAGE_OFFSET` in link.ld, checked at boot).
pub const KIMAGE_OFFSET: u64 = 0xffff_0080_0000_0000;
/// Devices: the UART registers at physical `pa` are at `pa + DEVICE_OFFSET`.
pub const DEVICE_OFFSET: u64 = 0xffff_0100_0000_0000;
/// The end of the kernel's regions: the kernel maps nothing of its own at
/// or above this, nor below [`PAGE_OFFSET`].
pub const KERNEL_VA_END: u64 = 0xffff_0180_0000_0000;
/// Bytes of one region slot (one root-table entry: 512 GiB).
const SLOT: u64 = 1 << 39;

// Each region is slot-aligned, so the early map (boot.rs) reaches all three
// through one level-1 table, and the linear map has room for 512 GiB.
const _: () = assert!(PAGE_OFFSET % SLOT == 0 && KIMAGE_OFFSET % SLOT == 0);
const _: () = assert!(DEVICE_OFFSET % SLOT == 0 && KERNEL_VA_END == DEVICE_OFFSET + SLOT);
const _: () = assert!(KIMAGE_OFFSET == PAGE_OFFSET + SLOT);

/// The linear-map address of physical `pa`.
#[inline]
pub const fn phys_to_virt(pa: u64) -> u64 {
    pa + PAGE_OFFSET
}

/// The physical address of kernel-image address `va`.
#[inline]
pub const fn kimage_to_phys(va: u64) -> u64 {
    va - KIMAGE_OFFSET
}

/// Whether `va` lies in one of the kernel's regions.
#[inline]
pub const fn is_kernel_va(va: u64) -> bool {
    va >= PAGE_OFFSET && va < KERNEL_VA_END
}

const MIB2: u64 = 2 << 20;

/// Where everything is.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// RAM, `[start, end)`.
    pub ram: (u64, u64),
    /// The kernel image with its stack (physical), 2 MiB-rounded.
    pub kernel: (u64, u64),
    /// Table frames.
    pub tables: (u64, u64),
    /// The test pool.
    pub pool: (u64, u64),
}

impl Layout {
    /// The layout for RAM `[ram_base, ram_base + ram_size)` and the image
    /// at physical `[image.0, image.1)`; `None` if the table pool does not
    /// fit in RAM.
    pub fn new(ram_base: u64, ram_size: u64, image: (u64, u64)) -> Option<Layout> {
        let kernel = (
            image.0 & !(MIB2 - 1),
            image.1.checked_next_multiple_of(MIB2)?,
        );
        let tables = (kernel.1, kernel.1 + TABLE_POOL);
        let end = ram_base.checked_add(ram_size)?;
        (kernel.0 >= ram_base && tables.1 < end).then_some(Layout {
            ram: (ram_base, end),
            kernel,
            tables,
            pool: (tables.1, end),
        })
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
    /// Every allocation is refused (see [`refuse_tables`]).
    refuse: bool,
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
    refuse: false,
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
/// Call once, before the first allocation. `[start, end)` is page aligned
/// RAM that nothing else uses, reachable through the linear map (the early
/// one of boot.rs, and the kernel map's once that is installed).
pub unsafe fn init_tables(start: u64, end: u64) {
    with_frames(|fr| {
        fr.next = start;
        fr.end = end;
    });
}

/// While `on`, the allocator refuses every table frame (memory pressure,
/// for the cases that must not allocate).
pub fn refuse_tables(on: bool) {
    with_frames(|fr| fr.refuse = on);
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
// nothing). All RAM is in the linear map (the early map covers the first
// GiB, where the table pool lies; the kernel map all of RAM), so
// `phys_to_virt` is `pa + PAGE_OFFSET` and valid for the frame's life.
unsafe impl TableAlloc for KernelTables {
    fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = with_frames(|fr| {
            let pa = if fr.refuse {
                return None;
            } else if fr.free != 0 {
                let pa = fr.free;
                // SAFETY: a frame on the free list is ours and unused; its
                // first word links the next free frame.
                fr.free = unsafe { (phys_to_virt(pa) as *const u64).read() };
                pa
            } else if fr.next < fr.end {
                let pa = fr.next;
                fr.next += PAGE;
                pa
            } else {
                return None;
            };
            fr.live += 1;
            fr.peak = fr.peak.max(fr.live);
            Some(pa)
        })?;
        // SAFETY: the frame was just taken from the pool, is one page of
        // the geometry (`PAGE` bytes, aligned to it) and mapped (linear
        // map), and nothing else uses it.
        unsafe { (phys_to_virt(pa) as *mut u8).write_bytes(0, PAGE as usize) };
        Some(PhysAddr(pa))
    }

    /// Frames are pages of the build's geometry (a table of 16 KiB pages
    /// takes 16 KiB).
    fn frame_shift(&self) -> u32 {
        PAGE_SHIFT
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        with_frames(|fr| {
            // SAFETY: the caller returns a frame of ours nobody uses any more.
            unsafe { (phys_to_virt(pa.0) as *mut u64).write(fr.free) };
            fr.free = pa.0;
            fr.live -= 1;
        });
    }

    #[inline]
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: the caller passes one of our frames, which lie in RAM; its
        // linear-map address is in the upper half, so it is not null.
        unsafe { NonNull::new_unchecked(phys_to_virt(pa.0) as *mut Table) }
    }
}
