//! Memory: the kernel's virtual layout, the RAM map and the table-frame
//! allocator (the kernel's address space itself is built by
//! `kernel_space` in `main.rs`).
//!
//! Virtual layout once the kernel runs on its own tables: everything the
//! kernel maps lies in the upper half (PML4 entries 256–511; with 5-level
//! paging PML5 entry 511), so every address space can share it by copying
//! those top-level entries: `share_kernel_half` links a pinned table under
//! each of them (supervisor-only) and `AddressSpace::new_user` copies them
//! into each user root. The lower half holds only what the suite, the
//! benchmarks and the `space_` cases map there themselves.
//!
//! | virtual range | maps | rights |
//! |---|---|---|
//! | [`LINEAR_BASE`] + RAM (PML4 entry 273) | all RAM, by the GiB (linear map, [`phys_to_virt`]) | RW, NX, global |
//! | [`KERNEL_VMA`] + 1 MiB… (PML4 511, PDPT 510) | the image: `.text` / `.rodata` / `.data` + `.bss` (stack) | RX / R NX / RW NX, global |
//! | 0x10_0000_0000 + 16 GiB (lower half) | the suite's window ([`crate::machine`]) | the suite's |
//! | [`crate::space::USER_BASE`] (lower half) | the ring-3 test pages | user |
//!
//! Physical layout:
//!
//! | range | use |
//! |---|---|
//! | 0 – 1 MiB | firmware, PVH start info, command line |
//! | 1 MiB – `__boot_end` | 32-bit entry, boot GDT, boot tables (identity-mapped while booting only) |
//! | … – `__kernel_end` − [`KERNEL_VMA`] | kernel image, stack |
//! | [`TABLES_START`] – [`TABLES_END`] | page-table frames ([`Frames`]) |
//! | [`USER_FRAMES`] – +64 KiB | frames of the ring-3 test pages |
//! | [`SPACE_FRAMES`] – +1 MiB | frames the multi-space `space_` cases map |
//! | [`POOL_START`] – end of RAM | the test pool the suite and benchmarks map |

use core::cell::Cell;
use core::ptr::NonNull;

use pgtable_core::contract::{Table, TableAlloc};
use pgtable_core::PhysAddr;

use crate::boot::{MemmapEntry, StartInfo};

/// First byte of the table-frame region.
pub const TABLES_START: u64 = 16 << 20;
/// One past the table-frame region (64 MiB of frames: 16384 tables).
pub const TABLES_END: u64 = 80 << 20;
/// First byte of the frames the ring-3 test pages use (16 frames).
pub const USER_FRAMES: u64 = 96 << 20;
/// First byte of the frames the multi-space `space_` cases map
/// ([`SPACE_FRAME_COUNT`] frames).
pub const SPACE_FRAMES: u64 = 112 << 20;
/// Number of frames at [`SPACE_FRAMES`].
pub const SPACE_FRAME_COUNT: u64 = 256;
/// First byte of the test pool.
pub const POOL_START: u64 = 256 << 20;

/// Virtual minus physical address of the kernel image: the image is linked
/// in the top 2 GiB (the kernel code model's region, `linker.ld`).
pub const KERNEL_VMA: u64 = 0xffff_ffff_8000_0000;
/// Where the linear map of all RAM starts: virtual = physical +
/// `LINEAR_BASE` (PML4 entry 273, the slot Linux uses for its direct map
/// with 4-level paging; with 5-level paging it lies in PML5 entry 511).
pub const LINEAR_BASE: u64 = 0xffff_8880_0000_0000;
/// How much physical memory the linear map may cover (64 TiB, the rest
/// of the PML4 entries up to the next kernel region).
pub const LINEAR_MAX: u64 = 1 << 46;

/// The linear-map address of physical address `pa` (Linux `__va`). Valid
/// for RAM (the boot tables cover the first 4 GiB, the kernel's tables all
/// RAM).
#[inline]
pub const fn phys_to_virt(pa: u64) -> u64 {
    pa + LINEAR_BASE
}

/// The physical address of `va` in the kernel image (Linux
/// `__pa_symbol`).
#[inline]
pub const fn image_phys(va: u64) -> u64 {
    va - KERNEL_VMA
}

/// A RAM region.
#[derive(Clone, Copy, Debug, Default)]
pub struct Region {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// The RAM regions the firmware reports (E820 type 1), at most 8.
#[derive(Clone, Copy, Debug, Default)]
pub struct RamMap {
    /// The regions, `len` of them valid.
    pub regions: [Region; 8],
    /// How many are valid.
    pub len: usize,
}

impl RamMap {
    /// The valid regions.
    pub fn iter(&self) -> impl Iterator<Item = Region> + '_ {
        self.regions[..self.len].iter().copied()
    }

    /// Reads the PVH memory map (start info version 1); without one,
    /// assumes RAM from 0 to `fallback_end`.
    ///
    /// # Safety
    ///
    /// `info` is the start info the loader passed: with version 1 and a
    /// non-zero `memmap_paddr`, that address holds `memmap_entries`
    /// entries in linearly mapped memory.
    pub unsafe fn from_start_info(info: &StartInfo, fallback_end: u64) -> RamMap {
        let mut map = RamMap::default();
        if info.version >= 1 && info.memmap_paddr != 0 {
            let base = phys_to_virt(info.memmap_paddr) as *const MemmapEntry;
            for i in 0..info.memmap_entries as usize {
                // SAFETY: `memmap_entries` entries at `memmap_paddr`, in
                // linearly mapped memory (our caller's promise).
                let e = unsafe { base.add(i).read_unaligned() };
                if e.kind == 1 && map.len < map.regions.len() {
                    map.regions[map.len] = Region {
                        start: e.addr,
                        end: e.addr + e.size,
                    };
                    map.len += 1;
                }
            }
        }
        if map.len == 0 {
            map.regions[0] = Region {
                start: 0,
                end: fallback_end,
            };
            map.len = 1;
        }
        map
    }

    /// The parts of RAM at or above [`POOL_START`], 2 MiB aligned.
    pub fn pool(&self) -> impl Iterator<Item = Region> + '_ {
        self.iter().filter_map(|r| {
            let start = r.start.max(POOL_START).next_multiple_of(2 << 20);
            let end = r.end & !((2 << 20) - 1);
            (start < end).then_some(Region { start, end })
        })
    }
}

/// The state of the table-frame region: a bump pointer plus a free list
/// linked through the first word of each free frame.
struct FramePool {
    next: Cell<u64>,
    free: Cell<u64>,
    live: Cell<u64>,
    peak: Cell<u64>,
    /// Every allocation is refused ([`Frames::refuse`]).
    refuse: Cell<bool>,
}

/// The one frame pool.
struct PoolCell(FramePool);

// SAFETY: the kernel runs on one CPU and never touches the pool from an
// exception handler, so the cells are never accessed concurrently.
unsafe impl Sync for PoolCell {}

static POOL: PoolCell = PoolCell(FramePool {
    next: Cell::new(TABLES_START),
    free: Cell::new(0),
    live: Cell::new(0),
    peak: Cell::new(0),
    refuse: Cell::new(false),
});

/// A handle to the kernel's table-frame allocator (bump + free list over
/// [`TABLES_START`]..[`TABLES_END`]). Handles are free to copy; all share
/// one pool, so several address spaces can draw from it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Frames;

impl Frames {
    /// Frames currently allocated.
    pub fn live(&self) -> u64 {
        POOL.0.live.get()
    }

    /// The most frames ever allocated at once.
    pub fn peak(&self) -> u64 {
        POOL.0.peak.get()
    }

    /// While `on`, every allocation is refused (memory pressure, for the
    /// cases that must not allocate).
    pub fn refuse(&self, on: bool) {
        POOL.0.refuse.set(on);
    }
}

// SAFETY: frames come from `TABLES_START..TABLES_END`, a RAM range that
// nothing but this allocator uses; each is 4 KiB aligned, zeroed before it
// is handed out, handed out once until freed, and the pool is a static
// (dropping a handle frees nothing); `phys_to_virt` is the frame's address
// in the linear map, which the boot tables and the kernel's tables both
// hold (read-write).
unsafe impl TableAlloc for Frames {
    fn alloc_table(&mut self) -> Option<PhysAddr> {
        let p = &POOL.0;
        if p.refuse.get() {
            return None;
        }
        let pa = match p.free.get() {
            0 => {
                let pa = p.next.get();
                if pa >= TABLES_END {
                    return None;
                }
                p.next.set(pa + 4096);
                pa
            }
            pa => {
                // SAFETY: a free frame of ours (linearly mapped); its first
                // word links the list.
                p.free
                    .set(unsafe { (phys_to_virt(pa) as *const u64).read() });
                pa
            }
        };
        // SAFETY: the frame is ours and unused (linearly mapped); zero all
        // 4 KiB.
        unsafe { (phys_to_virt(pa) as *mut Table).write_bytes(0, 1) };
        p.live.set(p.live.get() + 1);
        p.peak.set(p.peak.get().max(p.live.get()));
        Some(PhysAddr(pa))
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        let p = &POOL.0;
        // SAFETY: the caller returns a frame of ours that nothing uses any
        // more; we store the free-list link in its first word (through the
        // linear map).
        unsafe { (phys_to_virt(pa.0) as *mut u64).write(p.free.get()) };
        p.free.set(pa.0);
        p.live.set(p.live.get() - 1);
    }

    #[inline]
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: the caller passes one of our frames; its linear-map
        // address lies in the upper half, so is not null.
        unsafe { NonNull::new_unchecked(phys_to_virt(pa.0) as *mut Table) }
    }
}
