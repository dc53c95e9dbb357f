//! `unmap_with`: every removed entry reported once, errors change
//! nothing, no dirty state lost under the hardware agent.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pgtable_core::contract::{Arch, Decoded};
use pgtable_core::{Error, MapOptions, PhysAddr, VirtAddr};

use super::{busy, map, rec, setup, snapshot, G1, K4, KRW, M2, PA, SWAP, URW, VA};

/// Pages, a partly covered block, a whole block and a swap entry: each
/// removed entry is reported once, with its address, size and dirty state;
/// the tables end as plain unmap leaves them.
///
/// The counts here are per entry, so the user pages are mapped without the
/// contiguous hint (a folded run reports the run's accessed/dirty state for
/// each of its pages: see `pgtable-arm64/tests/contpte.rs`).
pub fn unmap_with_reports_each_removed_entry<A: Arch>() {
    let (m, mut s) = setup::<A>();
    // [0, 4M): two 2 MiB blocks (pages where the format has none).
    map(&mut s, 0, 2 * M2, KRW, MapOptions::PMD_BLOCKS);
    // [4M, 4M + 64K): 16 pages, then a swap entry in the 17th.
    map(
        &mut s,
        2 * M2,
        16 * K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    let swap_va = VA + 2 * M2 + 16 * K4;
    // SAFETY: an empty PTE slot of an existing table gets a value that
    // decodes as not present, as `slot` allows.
    unsafe {
        let slot = s.inspect().slot(VirtAddr(swap_va), 0).unwrap();
        assert!(matches!(A::decode(SWAP, 0), Decoded::Invalid));
        slot.store(SWAP, Relaxed);
    }
    // Dirty two pages through the hardware.
    m.hw_touch(VirtAddr(VA + 2 * M2 + 3 * K4), true).unwrap();
    m.hw_touch(VirtAddr(VA + M2 + 5 * K4), true).unwrap();
    let blocks = A::leaf_allowed(1);

    let start = VA + M2 / 2; // inside the first block
    let end = swap_va + K4;
    let mut got = Vec::new();
    s.unmap_with(VirtAddr(start), end - start, |r| got.push(rec(r)))
        .unwrap();
    m.check().unwrap();

    let mut want = Vec::new();
    // The first block, split: its pages from `start` on.
    for a in (start..VA + M2).step_by(K4 as usize) {
        want.push((a, K4, Some(PA + a - VA), true));
    }
    if blocks {
        want.push((VA + M2, M2, Some(PA + M2), true));
    } else {
        for a in (VA + M2..VA + 2 * M2).step_by(K4 as usize) {
            want.push((a, K4, Some(PA + a - VA), true));
        }
    }
    for a in (VA + 2 * M2..swap_va).step_by(K4 as usize) {
        want.push((a, K4, Some(PA + a - VA), true));
    }
    want.push((swap_va, K4, None, false));
    let got_keys: Vec<_> = got
        .iter()
        .map(|r| (r.va, r.size, r.pa, r.present))
        .collect();
    let want: Vec<_> = want
        .into_iter()
        .map(|(va, size, pa, _)| (va, size, pa, pa.is_some()))
        .collect();
    assert_eq!(got_keys, want);
    // Dirty: kernel read-write leaves may be created dirty (x86, arm64);
    // the user pages start clean and exactly the touched one is dirty.
    for r in &got {
        if r.va >= VA + 2 * M2 && r.present {
            assert_eq!(r.dirty, r.va == VA + 2 * M2 + 3 * K4, "{r:?}");
        }
        if r.va == VA + M2 || r.va == VA + M2 + 5 * K4 {
            assert!(r.dirty, "{r:?}");
        }
    }
    for a in (start..end).step_by(K4 as usize) {
        assert!(s.translate(VirtAddr(a)).is_none());
        assert!(s.ptep_get(VirtAddr(a)).is_none());
    }
    // What stayed mapped stayed.
    assert_eq!(s.translate(VirtAddr(VA)).unwrap().pa, PhysAddr(PA));
}

/// A range covering whole tables: they are unlinked, yet every leaf in
/// them is reported, and the frames go back to the allocator.
pub fn unmap_with_reports_leaves_of_whole_tables<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let live0 = m.alloc().live();
    map(
        &mut s,
        0,
        2 * M2 + 8 * K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    m.hw_touch(VirtAddr(VA + M2 + 7 * K4), true).unwrap();
    let mut got = BTreeSet::new();
    let mut dirty = 0;
    s.unmap_with(VirtAddr(VA), G1, |r| {
        assert!(r.is_present() && r.size() == K4);
        assert_eq!(r.pa().unwrap().0 - PA, r.va().0 - VA);
        dirty += usize::from(r.dirty());
        assert!(got.insert(r.va().0), "reported twice: {r:?}");
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(got.len(), 2 * 512 + 8);
    assert_eq!(dirty, 1);
    assert_eq!(m.alloc().live(), live0);
    assert_eq!(s.inspect().count_tables(), 1);
}

/// Errors report nothing and change nothing (no frame leaked).
pub fn unmap_with_error_changes_nothing<A: Arch>() {
    let (m, mut s) = setup::<A>();
    if !A::leaf_allowed(1) {
        return;
    }
    map(&mut s, 0, M2, KRW, MapOptions::PMD_BLOCKS);
    let before = snapshot(&s, VA, M2);
    let live = m.alloc().live();
    m.alloc().fail_after(Some(0));
    let mut n = 0;
    let e = s.unmap_with(VirtAddr(VA + K4), K4, |_| n += 1);
    m.alloc().fail_after(None);
    assert_eq!(e, Err(Error::OutOfMemory));
    assert_eq!(n, 0);
    assert_eq!(snapshot(&s, VA, M2), before);
    assert_eq!(m.alloc().live(), live);
    assert_eq!(
        s.unmap_with(VirtAddr(VA + 1), K4, |_| n += 1),
        Err(Error::MisalignedVirt(VirtAddr(VA + 1)))
    );
    assert_eq!(n, 0);
    m.check().unwrap();
}

/// The hardware keeps storing to the pages while they are mapped and
/// unmapped again and again: every dirty state it set is reported (the
/// report is the value the atomic get-and-clear returned, not an earlier
/// load, which would lose a store made between the load and the clear).
pub fn unmap_with_loses_no_dirty_state_under_the_agent<A: Arch + Send>(rounds: usize) {
    let rounds = crate::miri_scaled(rounds as u64) as usize;
    let pages = 16u64;
    let (m, mut s) = setup::<A>();
    // Keep the PTE table across rounds (only the pages come and go).
    map(
        &mut s,
        pages * K4,
        K4,
        URW,
        MapOptions::PAGES.no_contiguous(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(VirtAddr(VA), pages * K4, stop.clone());
    let mut reported = 0u64;
    let t0 = std::time::Instant::now();
    let mut done = 0;
    // At least `rounds`, and until the agent has dirtied pages often
    // (bounded in time: the machine may be busy).
    let want = crate::miri_scaled(200);
    while done < rounds || (m.stats().dirty_set < want && t0.elapsed().as_secs() < 20) {
        done += 1;
        map(
            &mut s,
            0,
            pages * K4,
            URW,
            MapOptions::PAGES.no_contiguous(),
        );
        s.unmap_with(VirtAddr(VA), pages * K4, |r| {
            reported += u64::from(r.dirty());
            // A consumer that takes its time (freeing the page): the
            // hardware's stores go on meanwhile.
            busy(2);
        })
        .unwrap();
    }
    stop.store(true, Relaxed);
    let rep = agent.join().unwrap();
    m.check().unwrap();
    assert!(rep.dirty_set > 0);
    assert_eq!(
        reported, rep.dirty_set,
        "dirty states set by the hardware but not reported"
    );
}
