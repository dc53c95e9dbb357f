//! A kernel's own table allocator on the simulator: the README's
//! `KernelTables` (a free list of frames in a "RAM" buffer, reached
//! through a direct-map offset) run through `SimMachine::alloc_from`, the
//! same allocator given to the machine without it (its tables are
//! unknown to the walker, which the check reports), and user-mode loads
//! and stores. The same checks for every format.

use core::ptr::NonNull;
use core::sync::atomic::Ordering::Relaxed;
use std::vec::Vec;

use pgtable_core::contract::{Arch, Mmu, Table, TableAlloc};
use pgtable_core::sim::{
    CheckError, Installed, SimFaultKind, SimMachine, UnknownTable, UnknownTableKind,
};
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VirtAddr};

const PAGE: u64 = 4096;

/// Physical memory starts at `RAM_BASE`; the kernel's direct map puts
/// physical address `pa` at `direct_map + (pa - RAM_BASE)`.
pub const RAM_BASE: u64 = 0x4000_0000;

/// The README's kernel allocator: frames of a "RAM" buffer handed out
/// from a free list, `phys_to_virt` a direct-map offset.
pub struct KernelTables {
    /// Where `RAM_BASE` is mapped.
    direct_map: *mut Table,
    /// Frames of the buffer (the RAM's size).
    frames: usize,
    /// Stands for the kernel's page allocator.
    free: Vec<PhysAddr>,
}

impl KernelTables {
    /// `frames` frames of RAM from `RAM_BASE` on, all free.
    pub fn new(frames: usize) -> KernelTables {
        let ram: Vec<Table> = (0..frames).map(|_| Table::zeroed()).collect();
        let direct_map = Box::into_raw(ram.into_boxed_slice()).cast::<Table>();
        KernelTables {
            direct_map,
            frames,
            free: (0..frames as u64)
                .map(|i| PhysAddr(RAM_BASE + i * PAGE))
                .collect(),
        }
    }

    /// Frames not handed out.
    pub fn free_frames(&self) -> usize {
        self.free.len()
    }
}

impl Drop for KernelTables {
    fn drop(&mut self) {
        // Frames still handed out stay allocated (the `TableAlloc`
        // contract): then the RAM is leaked.
        if self.free.len() == self.frames {
            let ram = core::ptr::slice_from_raw_parts_mut(self.direct_map, self.frames);
            // SAFETY: `ram` is the boxed slice `new` leaked, given back
            // once; no frame of it is handed out any more.
            drop(unsafe { Box::from_raw(ram) });
        }
    }
}

// SAFETY: frames are 4 KiB-aligned (`Table`'s alignment), zeroed when
// handed out, each handed out once until freed, and reachable through the
// direct map for as long as the buffer lives, which is until the last one
// is back.
unsafe impl TableAlloc for KernelTables {
    fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = self.free.pop()?;
        // SAFETY: `pa` is a free frame of this allocator.
        unsafe { self.phys_to_virt(pa).write_bytes(0, 1) };
        Some(pa)
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        self.free.push(pa);
    }

    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        let index = ((pa.0 - RAM_BASE) / PAGE) as usize;
        // SAFETY: `pa` is one of this allocator's frames, all inside the
        // direct-mapped buffer.
        unsafe { NonNull::new_unchecked(self.direct_map.add(index)) }
    }
}

/// The kernel's allocator, made known to the machine, serves an address
/// space whose memory the simulated CPU loads and stores through; tables
/// go back to it when they are emptied and when the space goes.
pub fn a_kernel_allocator_runs_on_the_simulator<A: Arch>() {
    let m = SimMachine::<A>::new();
    let tables = m.alloc_from(KernelTables::new(16));
    let space = AddressSpace::<A, _, _>::new(m.mmu(), tables).unwrap();
    // The free list hands out its last frame first.
    assert_eq!(space.root(), PhysAddr(RAM_BASE + 15 * PAGE));
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    m.check().unwrap();
    let (va, far) = (VirtAddr(0x40_0000), VirtAddr(0xc000_0000));
    let (pa, far_pa) = (PhysAddr(0x8000_0000), PhysAddr(0x8100_0000));
    for (va, pa) in [(va, pa), (far, far_pa)] {
        space
            .map(va, pa, PAGE, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
    }
    m.write_u64(va, 0x1234).unwrap();
    m.write_u64(VirtAddr(far.0 + 8), 0x5678).unwrap();
    assert_eq!(m.read_u64(va), Ok(0x1234));
    assert_eq!(m.phys_read_u64(pa), 0x1234);
    assert_eq!(m.phys_read_u64(PhysAddr(far_pa.0 + 8)), 0x5678);
    m.check().unwrap();
    let used = space.inspect().count_tables();
    assert_eq!(space.alloc().inner().free_frames(), 16 - used);
    assert_eq!(m.live_tables(), used);

    // Emptied tables go back to the kernel's allocator after the flush;
    // the walker then faults where they were.
    space.unmap(far, PAGE).unwrap();
    assert!(space.inspect().count_tables() < used);
    assert_eq!(
        space.alloc().inner().free_frames(),
        16 - space.inspect().count_tables()
    );
    assert!(m.read_u64(far).is_err());
    assert_eq!(m.read_u64(va), Ok(0x1234));
    m.check().unwrap();
    drop(space);
    assert_eq!(m.live_tables(), 0);
}

/// The same allocator given to the machine's MMU directly: the machine
/// does not know its frames, and says so in the check as soon as the root
/// is installed, and in the fault of the first access.
pub fn tables_the_machine_does_not_know_fail_the_check<A: Arch>() {
    let m = SimMachine::<A>::new();
    let mut space = AddressSpace::<A, _, _>::new(m.mmu(), KernelTables::new(16)).unwrap();
    let root = space.root();
    m.check().unwrap();
    // SAFETY: a simulated MMU; deactivated below.
    unsafe { space.install() };
    let unknown_root = UnknownTable {
        pa: root,
        kind: UnknownTableKind::Root,
    };
    assert_eq!(m.check(), Err(CheckError::UnknownTable(unknown_root)));
    let va = VirtAddr(0x40_0000);
    space
        .map(
            va,
            PhysAddr(0x8000_0000),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
    assert_eq!(
        m.read_u64(va).unwrap_err().kind,
        SimFaultKind::NotATable(root)
    );
    assert_eq!(m.check(), Err(CheckError::UnknownTable(unknown_root)));
    // SAFETY: the simulated walker never reads these frames.
    unsafe { space.deactivate() };
}

/// A table entry forged to point at a frame no allocator handed out: the
/// access faults and the check reports the frame, after the entry is back.
pub fn a_forged_table_entry_fails_the_check<A: Arch>() {
    let m = SimMachine::<A>::new();
    let space = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    let va = VirtAddr(0x40_0000);
    space
        .map(
            va,
            PhysAddr(0x8000_0000),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
    m.read_u64(va).unwrap();
    m.check().unwrap();
    let bogus = PhysAddr(0x9000_0000);
    // SAFETY: NOT what `slot` allows (a forged table entry), on purpose:
    // the simulated walker checks table frames, and the address space
    // never sees the forged entry: the original is back before the
    // slot's borrow ends and before anything here can panic.
    let pmd = unsafe { space.inspect().slot(va, 1) }.unwrap();
    let good = pmd.swap(A::table_entry(bogus, 1), Relaxed);
    // Make the walker read the forged entry, then put the original back.
    let flush_and_read = || {
        space.mmu().flush_tlb_all();
        m.read_u64(va)
    };
    let forged = flush_and_read();
    pmd.store(good, Relaxed);
    space.mmu().flush_tlb_all();
    assert_eq!(forged.unwrap_err().kind, SimFaultKind::NotATable(bogus));
    assert_eq!(m.read_u64(va), Ok(0));
    assert_eq!(
        m.check(),
        Err(CheckError::UnknownTable(UnknownTable {
            pa: bogus,
            kind: UnknownTableKind::Entry
        }))
    );
}

/// Two kernel allocators handing out frames at the same physical
/// addresses on one machine: the second one's frame is refused (the
/// address space cannot be made, nothing leaks) and the check reports it.
pub fn two_allocators_with_one_frame_clash<A: Arch>() {
    let m = SimMachine::<A>::new();
    let first = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc_from(KernelTables::new(4))).unwrap();
    m.check().unwrap();
    let mut other = m.alloc_from(KernelTables::new(4));
    assert_eq!(other.alloc_table(), None);
    assert_eq!(other.inner().free_frames(), 4);
    let r = AddressSpace::<A, _, _>::new(m.mmu(), other);
    assert_eq!(r.err(), Some(Error::OutOfMemory));
    assert_eq!(
        m.check(),
        Err(CheckError::UnknownTable(UnknownTable {
            pa: first.root(),
            kind: UnknownTableKind::Clash
        }))
    );
    drop(first);
    assert_eq!(m.live_tables(), 0);
}

/// User-mode loads and stores: a user page serves them, a kernel-only
/// page and a user page without write permission refuse them (the kernel
/// still reaches its page).
pub fn user_accesses_need_a_user_page<A: Arch>() {
    let m = SimMachine::<A>::new();
    let space = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    let (user, kernel, ro) = (
        VirtAddr(0x40_0000),
        VirtAddr(0x60_0000),
        VirtAddr(0x80_0000),
    );
    let maps = [
        (user, Prot::READ_WRITE | Prot::USER),
        (kernel, Prot::READ_WRITE),
        (ro, Prot::READ_ONLY | Prot::USER),
    ];
    for (i, (va, prot)) in maps.into_iter().enumerate() {
        let pa = PhysAddr(0x8000_0000 + i as u64 * PAGE);
        space.map(va, pa, PAGE, prot, MapOptions::PAGES).unwrap();
    }
    m.user_write_u64(user, 0xabcd).unwrap();
    assert_eq!(m.user_read_u64(user), Ok(0xabcd));
    assert_eq!(m.phys_read_u64(PhysAddr(0x8000_0000)), 0xabcd);
    m.write_u64(kernel, 0x77).unwrap();
    for f in [
        m.user_read_u64(kernel).unwrap_err(),
        m.user_write_u64(kernel, 1).unwrap_err(),
        m.user_write_u64(ro, 1).unwrap_err(),
    ] {
        assert!(
            matches!(f.kind, SimFaultKind::Permission(_)),
            "{f} should be a permission fault"
        );
    }
    assert_eq!(m.read_u64(kernel), Ok(0x77));
    assert_eq!(m.user_read_u64(ro), Ok(0));
    assert_eq!(
        m.user_read_u64(VirtAddr(user.0 + 4)).unwrap_err().kind,
        SimFaultKind::Unaligned
    );
    m.check().unwrap();
}

/// The tests of this module for the format `$a`, in a module `$m`.
#[macro_export]
macro_rules! kernel_alloc_tests {
    ($m:ident, $a:ident) => {
        mod $m {
            type A = super::$a;

            #[test]
            fn a_kernel_allocator_runs_on_the_simulator() {
                $crate::kernel_alloc::a_kernel_allocator_runs_on_the_simulator::<A>();
            }
            #[test]
            fn tables_the_machine_does_not_know_fail_the_check() {
                $crate::kernel_alloc::tables_the_machine_does_not_know_fail_the_check::<A>();
            }
            #[test]
            fn a_forged_table_entry_fails_the_check() {
                $crate::kernel_alloc::a_forged_table_entry_fails_the_check::<A>();
            }
            #[test]
            fn two_allocators_with_one_frame_clash() {
                $crate::kernel_alloc::two_allocators_with_one_frame_clash::<A>();
            }
            #[test]
            fn user_accesses_need_a_user_page() {
                $crate::kernel_alloc::user_accesses_need_a_user_page::<A>();
            }
        }
    };
}
