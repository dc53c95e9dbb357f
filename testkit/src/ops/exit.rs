//! `exit_mmap`: the teardown of a whole address space reports every page
//! and software entry once, frees every table with one flush, and leaves a
//! shared kernel half alone.

use pgtable_core::contract::{Arch, NewPte};
use pgtable_core::sim::SimMachine;
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};

use super::{rec, Rec, G1, K4, KRW, M2, PA, URW, VA};

fn flushes<A: Arch>(m: &SimMachine<A>) -> u64 {
    let s = m.stats();
    s.flush_range + s.flush_all
}

/// A page record.
fn page(va: u64, pa: u64, size: u64, dirty: bool) -> Rec {
    Rec {
        va,
        size,
        pa: Some(pa),
        present: true,
        dirty,
    }
}

/// A software-entry record.
fn swp(va: u64) -> Rec {
    Rec {
        va,
        size: K4,
        pa: None,
        present: false,
        dirty: false,
    }
}

/// Pages (one of them stored to), a 2 MiB block, a 1 GiB block where the
/// format has them, software entries, and pages at both ends of the upper
/// canonical half (the last one ends at 2^64): `exit_mmap` reports each
/// once, with the stored page dirty, flushes once, frees every table (the
/// root too) and leaves the machine consistent. The space's software
/// entries and the swap values come back too.
pub fn exit_mmap_reports_everything_and_frees_every_table<A: Arch>() {
    let m = SimMachine::<A>::new();
    let base = m.live_tables();
    let mut s = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    unsafe { s.install() };
    let mut want = Vec::new();
    let opts = MapOptions::PAGES.no_contiguous();
    s.map(VirtAddr(VA), PhysAddr(PA), 20 * K4, URW, opts)
        .unwrap();
    for i in 0..20 {
        want.push(page(VA + i * K4, PA + i * K4, K4, i == 3));
    }
    let block = VA + 4 * M2;
    s.map(
        VirtAddr(block),
        PhysAddr(PA + 4 * M2),
        M2,
        URW,
        MapOptions::BLOCKS,
    )
    .unwrap();
    want.push(page(block, PA + 4 * M2, M2, false));
    if A::leaf_allowed(2) {
        s.map(
            VirtAddr(2 * G1),
            PhysAddr(PA + G1),
            G1,
            KRW,
            MapOptions::BLOCKS,
        )
        .unwrap();
        want.push(page(
            2 * G1,
            PA + G1,
            G1,
            A::is_dirty(A::leaf(PhysAddr(0), KRW, 2)),
        ));
    }
    for i in 0..3 {
        let va = VA + (40 + i) * K4;
        s.install_pte(VirtAddr(va), NewPte::Swap(100 + i)).unwrap();
        want.push(swp(va));
    }
    let half = 1u64 << (A::VA_BITS - 1);
    let kernel_dirty = A::is_dirty(A::leaf(PhysAddr(0), KRW, 0));
    for va in [half.wrapping_neg(), u64::MAX - (K4 - 1)] {
        let pa = PA + 2 * G1 + (va & (G1 - 1));
        s.map(VirtAddr(va), PhysAddr(pa), K4, KRW, MapOptions::PAGES)
            .unwrap();
        want.push(page(va, pa, K4, kernel_dirty));
    }
    m.write_u64(VirtAddr(VA + 3 * K4), 7).unwrap();
    m.read_u64(VirtAddr(VA + 5 * K4)).unwrap();
    assert!(m.live_tables() > base + 2);
    // SAFETY: the simulated walker is the only user; `exit_mmap` flushes
    // what its TLB holds.
    unsafe { s.deactivate() };
    let f0 = flushes(&m);
    let (mut got, mut values) = (Vec::new(), Vec::new());
    let (_mmu, _alloc) = s.exit_mmap(|e| {
        got.push(rec(e));
        values.extend(e.swap_value());
    });
    assert_eq!(flushes(&m) - f0, 1, "one flush");
    got.sort();
    want.sort();
    assert_eq!(got, want, "every entry reported once");
    values.sort();
    assert_eq!(values, [100, 101, 102]);
    assert_eq!(m.live_tables(), base, "a table was not freed");
    m.check().unwrap();
}

/// An empty space: nothing reported, no flush, its root freed.
pub fn exit_mmap_of_an_empty_space<A: Arch>() {
    let m = SimMachine::<A>::new();
    let base = m.live_tables();
    let s = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    assert_eq!(m.live_tables(), base + 1);
    let f0 = flushes(&m);
    let mut n = 0;
    let _ = s.exit_mmap(|_| n += 1);
    assert_eq!((n, flushes(&m) - f0), (0, 0));
    assert_eq!(m.live_tables(), base);
}

/// A user space sharing a kernel half: its `exit_mmap` reports and frees
/// its own half only; the kernel space still translates and keeps every
/// table, and frees them all when dropped. An installed space keeps its
/// root (a CPU may use it) and frees everything below it.
pub fn exit_mmap_of_a_user_space_leaves_the_kernel_half<A: Arch>() {
    let m = SimMachine::<A>::new();
    let base = m.live_tables();
    if !A::SEPARATE_HALVES && A::LEVELS < 4 {
        // No kernel half to share with three levels and one root.
        let r = AddressSpace::<A, _, _>::new_kernel(m.mmu(), m.alloc());
        assert!(matches!(r, Err(Error::KernelHalf)));
        return;
    }
    let mut kernel =
        AddressSpace::<A, _, _>::new_kernel(m.mmu_installing_into(VaRange::Upper), m.alloc())
            .unwrap();
    let (kfirst, _) = VaRange::Upper.bounds::<A>();
    let kva = VirtAddr(kfirst + M2);
    kernel
        .map(
            kva,
            PhysAddr(PA),
            K4,
            Prot::WRITE | Prot::GLOBAL,
            MapOptions::PAGES,
        )
        .unwrap();
    let ktables = m.live_tables();
    for installed in [false, true] {
        // SAFETY: the user space is gone before the kernel space.
        let mut u = unsafe {
            AddressSpace::<A, _, _>::new_user(
                &kernel,
                m.mmu_installing_into(VaRange::Lower),
                m.alloc(),
            )
        }
        .unwrap();
        u.map(
            VirtAddr(VA),
            PhysAddr(PA + M2),
            3 * K4,
            URW,
            MapOptions::PAGES,
        )
        .unwrap();
        u.install_pte(VirtAddr(VA + 8 * K4), NewPte::Swap(5))
            .unwrap();
        if installed {
            // SAFETY: a simulated MMU.
            unsafe { u.install() };
        }
        let mut got = Vec::new();
        let _ = u.exit_mmap(|e| got.push((e.va().0, e.is_present())));
        got.sort();
        let want = [
            (VA, true),
            (VA + K4, true),
            (VA + 2 * K4, true),
            (VA + 8 * K4, false),
        ];
        assert_eq!(got, want, "installed: {installed}");
        // The installed space's root.
        let root = usize::from(installed);
        assert_eq!(m.live_tables(), ktables + root, "installed: {installed}");
        assert_eq!(kernel.translate(kva).map(|t| t.pa), Some(PhysAddr(PA)));
        m.check().unwrap();
    }
    drop(kernel);
    // The installed user space's root stays allocated (leaked on purpose).
    assert_eq!(m.live_tables(), base + 1);
}
