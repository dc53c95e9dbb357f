//! The fault-time operations: `install_pte` and `ptep_set_access_flags`.

use pgtable_core::contract::NewPte;
use std::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::Arch;
use pgtable_core::{Error, FaultFlags, MapOptions, PhysAddr, Prot, VirtAddr};

use super::{map, setup, snapshot, K4, M2, PA, SWAP, URW, VA};

/// One page into an empty space: only the missing tables, one walker
/// barrier (where the arch needs any), no flush; then one more page in the
/// same table: no table at all.
pub fn install_pte_allocates_only_missing_tables<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let live = m.alloc().live();
    s.stats().reset();
    s.install_pte(
        VirtAddr(VA + 3 * K4),
        NewPte::Page {
            pa: PhysAddr(PA),
            prot: URW,
        },
    )
    .unwrap();
    m.check().unwrap();
    assert_eq!(m.alloc().live(), live + (A::LEVELS as usize - 1));
    assert_eq!(s.stats().flushes(), 0);
    assert_eq!(s.stats().barriers(), u64::from(A::NEEDS_WALKER_BARRIER));
    assert_eq!(
        m.translate(VirtAddr(VA + 3 * K4 + 9)).unwrap(),
        PhysAddr(PA + 9)
    );
    s.stats().reset();
    s.install_pte(
        VirtAddr(VA + 4 * K4),
        NewPte::Page {
            pa: PhysAddr(PA + K4),
            prot: URW,
        },
    )
    .unwrap();
    m.check().unwrap();
    assert_eq!(m.alloc().live(), live + (A::LEVELS as usize - 1));
    assert_eq!(s.stats().flushes(), 0);
    assert_eq!(s.stats().tables_allocated(), 0);
    assert_eq!(s.stats().barriers(), u64::from(A::NEEDS_WALKER_BARRIER));
}

/// Errors: an occupied slot (page, swap entry, block), bad input, and a
/// failed table allocation leave the tables and the allocator unchanged.
pub fn install_pte_errors_change_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, K4, URW, MapOptions::PAGES);
    // SAFETY: an empty PTE slot of an existing table gets a not-present
    // value, as `slot` allows.
    unsafe {
        s.inspect()
            .slot(VirtAddr(VA + K4), 0)
            .unwrap()
            .store(SWAP, Relaxed)
    };
    let before = snapshot(&s, VA, 4 * K4);
    let live = m.alloc().live();
    // `ptep_get` shows the software entry as a non-present leaf entry.
    let e = s.ptep_get(VirtAddr(VA + K4)).unwrap();
    assert_eq!(
        (e.raw(), e.is_present(), e.pa(), e.dirty()),
        (SWAP, false, None, false)
    );
    assert!(s.ptep_get(VirtAddr(VA)).unwrap().is_present());
    assert!(s.ptep_get(VirtAddr(VA + 2 * K4)).is_none());
    for v in [VA, VA + K4] {
        assert_eq!(
            s.install_pte(
                VirtAddr(v),
                NewPte::Page {
                    pa: PhysAddr(PA),
                    prot: URW
                }
            ),
            Err(Error::AlreadyMapped(VirtAddr(v)))
        );
    }
    assert_eq!(
        s.install_pte(
            VirtAddr(VA + 5),
            NewPte::Page {
                pa: PhysAddr(PA),
                prot: URW
            }
        ),
        Err(Error::MisalignedVirt(VirtAddr(VA + 5)))
    );
    assert_eq!(
        s.install_pte(
            VirtAddr(VA + 2 * K4),
            NewPte::Page {
                pa: PhysAddr(PA + 5),
                prot: URW
            }
        ),
        Err(Error::MisalignedPhys(PhysAddr(PA + 5)))
    );
    assert_eq!(snapshot(&s, VA, 4 * K4), before);
    if A::leaf_allowed(1) {
        map(&mut s, M2, M2, URW, MapOptions::PMD_BLOCKS);
        assert_eq!(
            s.install_pte(
                VirtAddr(VA + M2 + K4),
                NewPte::Page {
                    pa: PhysAddr(PA),
                    prot: URW
                }
            ),
            Err(Error::AlreadyMapped(VirtAddr(VA + M2 + K4)))
        );
    }
    // Needs LEVELS - 1 tables far away; only one can be had.
    let live = m.alloc().live().max(live);
    let far = VirtAddr(VA + (1 << (A::VA_BITS - 2)));
    let tables = s.inspect().count_tables();
    m.alloc().fail_after(Some(1));
    let e = s.install_pte(
        far,
        NewPte::Page {
            pa: PhysAddr(PA),
            prot: URW,
        },
    );
    m.alloc().fail_after(None);
    assert_eq!(e, Err(Error::OutOfMemory));
    assert_eq!(m.alloc().live(), live);
    assert_eq!(s.inspect().count_tables(), tables);
    assert!(s.ptep_get(far).is_none());
    m.check().unwrap();
}

/// `ptep_set_access_flags`: accessed alone (no flush), dirty, and the
/// write upgrade of a read-only page cached in the TLB (one page flushed,
/// and the store then goes through).
pub fn set_access_flags_relaxes_in_place<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let ro = Prot::USER;
    map(&mut s, 0, 2 * K4, ro, MapOptions::PAGES);
    let v = VirtAddr(VA + K4);
    let _ = s.test_and_clear_young(v).unwrap();
    s.stats().reset();
    assert!(s.ptep_set_access_flags(v, FaultFlags::ACCESS).unwrap());
    assert_eq!(s.stats().flushes(), 0);
    assert!(s.ptep_get(v).unwrap().young());
    assert!(!s.ptep_set_access_flags(v, FaultFlags::ACCESS).unwrap());
    m.check().unwrap();
    // Cache the read-only translation, fault on a store, upgrade.
    m.read_u64(v).unwrap();
    assert!(m.write_u64(v, 7).is_err());
    s.stats().reset();
    assert!(s.ptep_set_access_flags(v, FaultFlags::WRITE).unwrap());
    assert_eq!(s.stats().flushes(), 1);
    m.check().unwrap();
    let e = s.ptep_get(v).unwrap();
    assert!(e.prot().unwrap().writable() && e.dirty() && e.young());
    m.write_u64(v, 7).unwrap();
    assert_eq!(m.phys_read_u64(PhysAddr(PA + K4)), 7);
    // The other page kept its protection.
    assert!(!s.ptep_get(VirtAddr(VA)).unwrap().prot().unwrap().writable());
    assert_eq!(
        s.ptep_set_access_flags(VirtAddr(VA + 9 * K4), FaultFlags::DIRTY),
        Err(Error::NotMapped(VirtAddr(VA + 9 * K4)))
    );
    m.check().unwrap();
}
