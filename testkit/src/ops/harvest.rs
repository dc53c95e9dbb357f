//! Accessed/dirty harvesting: `test_and_clear_young` and `clear_refs`.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pgtable_core::contract::Arch;
use pgtable_core::{ClearRefs, Error, MapOptions, VirtAddr};

use super::{busy, map, rec, setup, snapshot, K4, M2, URW, VA};

/// `test_and_clear_young` returns the accessed state and clears it, and
/// the flush lets the next access set it again.
pub fn test_and_clear_young_round_trip<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, URW, MapOptions::PAGES);
    let v = VirtAddr(VA + K4);
    // arm64 leaves are created with AF set; start from old everywhere.
    let _ = s.test_and_clear_young(v).unwrap();
    m.check().unwrap();
    assert!(!s.test_and_clear_young(v).unwrap());
    m.read_u64(v).unwrap();
    assert!(s.ptep_get(v).unwrap().young());
    assert!(s.test_and_clear_young(VirtAddr(v.0 + 8)).unwrap());
    m.check().unwrap();
    assert!(!s.ptep_get(v).unwrap().young());
    // Not cached any more: the next access walks and sets it again.
    m.read_u64(v).unwrap();
    assert!(s.test_and_clear_young(v).unwrap());
    assert!(!s.test_and_clear_young(VirtAddr(VA + 100 * K4)).unwrap());
    assert_eq!(
        s.test_and_clear_young(VirtAddr(1 << 63)),
        Err(Error::OutOfRange(VirtAddr(1 << 63)))
    );
    m.check().unwrap();
}

/// Clearing the dirty state keeps the page writable where the hardware
/// tracks dirtiness: the next store succeeds and marks it dirty again.
pub fn clear_refs_cleans_and_the_next_store_redirties<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 8 * K4, URW, MapOptions::PAGES);
    m.write_u64(VirtAddr(VA + 2 * K4), 1).unwrap();
    m.write_u64(VirtAddr(VA + 5 * K4), 1).unwrap();
    let mut dirty = Vec::new();
    s.clear_refs(VirtAddr(VA), 8 * K4, ClearRefs::DIRTY, |r| {
        if r.dirty() {
            dirty.push(r.va().0 - VA)
        }
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(dirty, [2 * K4, 5 * K4]);
    for i in 0..8 {
        let e = s.ptep_get(VirtAddr(VA + i * K4)).unwrap();
        assert!(!e.dirty());
        assert!(e.prot().unwrap().writable());
    }
    let u = m.hw_touch(VirtAddr(VA + 2 * K4), true).unwrap();
    assert!(u.dirty);
    assert!(s.ptep_get(VirtAddr(VA + 2 * K4)).unwrap().dirty());
    // Young: both cleared at once, reported as they were.
    let mut young = 0;
    s.clear_refs(VirtAddr(VA), 8 * K4, ClearRefs::ALL, |r| {
        young += usize::from(r.young())
    })
    .unwrap();
    assert!(young >= 2);
    assert!(!s.ptep_get(VirtAddr(VA + 2 * K4)).unwrap().young());
    m.check().unwrap();
}

/// Bad input: nothing cleared, nothing reported.
pub fn clear_refs_errors_change_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, URW, MapOptions::PAGES);
    m.write_u64(VirtAddr(VA), 1).unwrap();
    let before = snapshot(&s, VA, 4 * K4);
    let mut n = 0;
    for (va, len, e) in [
        (VA, 0, Error::ZeroLength),
        (VA + 8, K4, Error::MisalignedVirt(VirtAddr(VA + 8))),
        (VA, K4 + 1, Error::MisalignedLength(K4 + 1)),
    ] {
        assert_eq!(
            s.clear_refs(VirtAddr(va), len, ClearRefs::ALL, |_| n += 1),
            Err(e)
        );
    }
    assert_eq!(n, 0);
    assert_eq!(snapshot(&s, VA, 4 * K4), before);
    m.check().unwrap();
}

/// A block is harvested whole and reported once.
pub fn clear_refs_harvests_blocks_whole<A: Arch>() {
    if !A::leaf_allowed(1) {
        return;
    }
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, M2, URW, MapOptions::PMD_BLOCKS);
    m.write_u64(VirtAddr(VA + 7 * K4), 1).unwrap();
    let mut got = Vec::new();
    s.clear_refs(VirtAddr(VA + K4), K4, ClearRefs::ALL, |r| got.push(rec(r)))
        .unwrap();
    m.check().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].va, got[0].size, got[0].dirty), (VA, M2, true));
    assert!(!s.ptep_get(VirtAddr(VA)).unwrap().dirty());
}

/// Harvesting while the hardware agent keeps touching the pages: every
/// accessed and dirty state the hardware set is either reported by a
/// clear or still in the entry at the end; none is lost.
pub fn clear_refs_loses_no_update_under_the_agent<A: Arch + Send>(rounds: usize) {
    let rounds = crate::miri_scaled(rounds as u64) as usize;
    let pages = 64u64;
    let (m, mut s) = setup::<A>();
    map(
        &mut s,
        0,
        pages * K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    // Start with everything old and clean.
    s.clear_refs(VirtAddr(VA), pages * K4, ClearRefs::ALL, |_| {})
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(VirtAddr(VA), pages * K4, stop.clone());
    let (mut young, mut dirty) = (0u64, 0u64);
    let t0 = std::time::Instant::now();
    let mut done = 0;
    // At least `rounds`, and until the agent has dirtied pages many times
    // over (bounded in time).
    let want = crate::miri_scaled(4 * pages);
    while done < rounds || (m.stats().dirty_set < want && t0.elapsed().as_secs() < 20) {
        done += 1;
        s.clear_refs(VirtAddr(VA), pages * K4, ClearRefs::ALL, |r| {
            young += u64::from(r.young());
            dirty += u64::from(r.dirty());
            busy(1);
        })
        .unwrap();
    }
    stop.store(true, Relaxed);
    let rep = agent.join().unwrap();
    m.check().unwrap();
    for i in 0..pages {
        let e = s.ptep_get(VirtAddr(VA + i * K4)).unwrap();
        young += u64::from(e.young());
        dirty += u64::from(e.dirty());
    }
    assert_eq!(rep.faults, 0);
    assert!(rep.dirty_set > 0);
    assert_eq!(dirty, rep.dirty_set, "dirty states lost");
    assert_eq!(young, rep.accessed_set, "accessed states lost");
}
