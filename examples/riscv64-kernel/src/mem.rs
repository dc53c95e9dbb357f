//! Memory: the physical layout, the kernel's address space and the
//! table-frame allocator.
//!
//! The kernel runs at its physical addresses: every address space it
//! builds ([`kernel_space`]) maps all RAM at virtual = physical, by the
//! GiB where it can, global (the same in every address space, as the
//! privileged spec requires of global mappings) and supervisor-only. So
//! table frames are reached at their physical address, with translation
//! on or off, and secondary harts run the same code with `satp` Bare
//! until a case switches them to a space.
//!
//! Physical layout (QEMU virt, RAM from 0x8000_0000):
//!
//! | range | use |
//! |---|---|
//! | 0x8000_0000 – 0x8020_0000 | OpenSBI (PMP-protected from S-mode) |
//! | 0x8020_0000 – `__image_end` | kernel image, a 64 KiB stack per hart |
//! | [`TABLES_START`] – [`TABLES_END`] | page-table frames ([`Frames`]) |
//! | [`CASE_FRAMES`] – +2 MiB | frames the `space_` and `smp_` cases map |
//! | [`POOL_START`] – end of RAM | the pool the suite maps and overwrites |
//!
//! The device tree QEMU places near the top of the first 3 GiB is read at
//! boot, before the suite may overwrite it.
//!
//! Virtual layout: RAM at its physical address (lower half), the suite's
//! window at [`crate::machine::WINDOW_BASE`], the cases' pages at
//! [`CASE_VA`]; everything else is free (the suite's
//! `last_entries_of_the_*` cases use the top of each half).

use core::cell::Cell;
use core::ptr::NonNull;

use pgtable_core::contract::{Arch, Mmu, Table, TableAlloc};
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};

/// First byte of the table-frame region.
pub const TABLES_START: u64 = 0x8100_0000;
/// One past the table-frame region (64 MiB: 16384 tables).
pub const TABLES_END: u64 = 0x8500_0000;
/// First byte of the frames the kernel's own cases map (512 frames).
pub const CASE_FRAMES: u64 = 0x8600_0000;
/// First byte of the suite's pool.
pub const POOL_START: u64 = 0x8800_0000;
/// The virtual page the kernel's own cases map (128 GiB, in the lower
/// half of every format, above the suite's window).
pub const CASE_VA: u64 = 0x20_0000_0000;

/// The `i`-th case frame.
pub const fn case_frame(i: u64) -> u64 {
    CASE_FRAMES + i * 4096
}

/// A new address space mapping all of `ram` at its physical address,
/// read-write-execute, global, supervisor-only (not installed).
pub fn kernel_space<A: Arch, M: Mmu>(
    ram: (u64, u64),
    mmu: M,
) -> Result<AddressSpace<A, M, Frames>, Error> {
    let mut space = AddressSpace::<A, M, Frames>::new_in(VaRange::Both, mmu, Frames)?;
    let prot = Prot::WRITE | Prot::EXEC | Prot::GLOBAL;
    space.map(
        VirtAddr(ram.0),
        PhysAddr(ram.0),
        ram.1,
        prot,
        MapOptions::BLOCKS,
    )?;
    Ok(space)
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

// SAFETY: only the boot hart builds and changes address spaces (the
// secondaries only switch `satp` and access memory), and no trap handler
// allocates, so the cells are never accessed concurrently.
unsafe impl Sync for PoolCell {}

static POOL: PoolCell = PoolCell(FramePool {
    next: Cell::new(TABLES_START),
    free: Cell::new(0),
    live: Cell::new(0),
    peak: Cell::new(0),
    refuse: Cell::new(false),
});

/// A handle to the kernel's table-frame allocator (bump + free list over
/// [`TABLES_START`]..[`TABLES_END`]). All handles share one pool.
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

// SAFETY: frames come from `TABLES_START..TABLES_END`, RAM that nothing
// but this allocator uses; each is 4 KiB aligned, zeroed before it is
// handed out, handed out once until freed, and the pool is a static;
// `phys_to_virt` is the identity, which holds with translation off and in
// every address space the kernel runs on (`kernel_space`).
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
                // SAFETY: a free frame of ours; its first word links the list.
                p.free.set(unsafe { (pa as *const u64).read() });
                pa
            }
        };
        // SAFETY: the frame is ours and unused; zero all 4 KiB.
        unsafe { (pa as *mut Table).write_bytes(0, 1) };
        p.live.set(p.live.get() + 1);
        p.peak.set(p.peak.get().max(p.live.get()));
        Some(PhysAddr(pa))
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        let p = &POOL.0;
        // SAFETY: the caller returns a frame of ours that nothing uses any
        // more; its first word becomes the free-list link.
        unsafe { (pa.0 as *mut u64).write(p.free.get()) };
        p.free.set(pa.0);
        p.live.set(p.live.get() - 1);
    }

    #[inline]
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: the caller passes one of our frames, at or above
        // TABLES_START, so not null.
        unsafe { NonNull::new_unchecked(pa.0 as *mut Table) }
    }
}
