//! `copy_page_range` (fork): copy-on-write and shared copies, blocks
//! covered in part, failures that change neither space, and the dirty
//! state the hardware sets during the copy.

use pgtable_core::contract::NewPte;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pgtable_core::contract::{AccessFault, Arch};
use pgtable_core::sim::SimFaultKind;
use pgtable_core::{CopyMode, Error, LeafEntry, MapOptions, Mapping, PhysAddr, Prot, VirtAddr};

use super::{
    expect_swp, flushes, listing, machine, no_leak, populate, snapshot, Space, G1, K4, M2, PA, RO,
    RW,
};

/// The source of the fork tests: pages (writable, read-only) with software
/// entries among them, 2 MiB blocks and a 1 GiB block where the format has
/// them. Returns the software entries (offsets from `G1`).
fn fork_source<A: Arch>(s: &mut Space<A>) -> Vec<(u64, u64)> {
    let swp = populate(s, G1, 600 * K4);
    s.map(
        VirtAddr(G1 + 700 * K4),
        PhysAddr(PA + 0x20_0000),
        8 * K4,
        RO,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(G1 + 4 * M2),
        PhysAddr(PA + 4 * M2),
        2 * M2,
        RW,
        MapOptions::BLOCKS,
    )
    .unwrap();
    if A::leaf_allowed(2) {
        s.map(
            VirtAddr(2 * G1),
            PhysAddr(PA + G1),
            G1,
            RW,
            MapOptions::BLOCKS,
        )
        .unwrap();
    }
    swp
}

/// Checks the reports of a fork into `child` of `[va, va + len)`: in
/// address order, exactly one per entry the child now holds there (its
/// present leaves as a walk finds them, and its software entries, `swp`
/// at offsets from `base`), each the entry as the child holds it.
fn check_reports<A: Arch>(
    got: &[LeafEntry<A>],
    child: &Space<A>,
    (va, len): (u64, u64),
    base: u64,
    swp: &[(u64, u64)],
) {
    assert!(
        got.windows(2).all(|w| w[0].va() < w[1].va()),
        "reports out of address order"
    );
    for e in got {
        let held = child.inspect().entry(e.va(), e.height());
        assert_eq!(held, Some(e.raw()), "report at {:?}", e.va());
    }
    let present: Vec<_> = got
        .iter()
        .filter(|e| e.is_present())
        .map(|e| (e.va(), e.pa().unwrap(), e.size()))
        .collect();
    let walked: Vec<_> = listing(child, va, len)
        .iter()
        .map(|m| (m.va, m.pa, m.size))
        .collect();
    assert_eq!(present, walked, "present leaves reported");
    let sw: Vec<_> = got
        .iter()
        .filter_map(|e| e.swap_value().map(|v| (e.va().0 - base, v)))
        .collect();
    assert_eq!(sw, swp, "software entries reported");
    let others = got.len() - present.len() - sw.len();
    assert_eq!(others, 0, "reports of neither kind");
}

/// A COW fork write-protects both sides, keeps translations equal, copies
/// blocks as blocks and software entries, flushes the source once and
/// creates no empty table.
pub fn fork_cow<A: Arch>() {
    let (m, mut src) = machine::<A>();
    let (cm, mut child) = machine::<A>();
    let swp = fork_source(&mut src);
    // The source has been used: dirty and accessed state to keep.
    m.write_u64(VirtAddr(G1 + 5 * K4), 0x55).unwrap();
    m.write_u64(VirtAddr(G1 + 4 * M2 + 8), 0x66).unwrap();
    m.read_u64(VirtAddr(G1 + 15 * K4)).unwrap();
    let (va, len) = (G1, 2 * G1);
    let before = listing(&src, va, len);
    let f0 = (flushes(&m), flushes(&cm));
    let mut got = Vec::new();
    src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |e| {
        got.push(e)
    })
    .unwrap();
    check_reports(&got, &child, (va, len), G1, &swp);
    // As copied: write-protected and old, the dirty state kept.
    for e in got.iter().filter(|e| e.is_present()) {
        assert!(!e.prot().unwrap().writable() && !e.young(), "{:?}", e.va());
    }
    assert!(got.iter().any(|e| e.dirty()), "a dirty page reported dirty");
    assert!(
        got.iter().any(|e| e.height() == 1),
        "a block reported whole"
    );
    assert_eq!(flushes(&m) - f0.0, 1, "the source flushes exactly once");
    assert_eq!(flushes(&cm) - f0.1, 0, "the child needs no flush");
    m.check().expect("source machine check");
    cm.check().expect("child machine check");
    // The same translations, blocks as blocks, all read-only now.
    let (ps, cs) = (listing(&src, va, len), listing(&child, va, len));
    assert_eq!(ps.len(), before.len());
    for ((p, c), b) in ps.iter().zip(&cs).zip(&before) {
        assert_eq!((p.va, p.pa, p.size), (b.va, b.pa, b.size));
        assert_eq!((c.va, c.pa, c.size), (b.va, b.pa, b.size));
        // The child gets the write-protected leaf, made old (Linux
        // `copy_present_pte`); the dirty state of a private copy stays.
        assert_eq!(c.entry, A::mkold(p.entry, p.height), "{:?}", c.va);
        assert!(!A::is_young(c.entry), "{:?}", c.va);
        assert_eq!(A::is_dirty(c.entry), A::is_dirty(p.entry), "{:?}", c.va);
        let (bp, pp) = (b.prot, p.prot);
        assert!(!pp.writable());
        assert_eq!(bp.difference(Prot::WRITE), pp);
        // Accessed and dirty state kept.
        assert_eq!(A::is_dirty(p.entry), A::is_dirty(b.entry), "{:?}", p.va);
        assert_eq!(A::is_young(p.entry), A::is_young(b.entry), "{:?}", p.va);
    }
    assert!(
        ps.iter().any(|p| p.height == 1),
        "2 MiB blocks copied whole"
    );
    assert!(A::is_dirty(
        src.translate(VirtAddr(G1 + 5 * K4)).unwrap().entry
    ));
    expect_swp(&child, G1, &swp);
    expect_swp(&src, G1, &swp);
    // No empty table: the same tables on both sides.
    assert_eq!(child.inspect().count_tables(), src.inspect().count_tables());
    // Writes fault on both sides, reads work and see the same memory.
    for (mm, name) in [(&m, "source"), (&cm, "child")] {
        for a in [G1 + 5 * K4, G1 + 15 * K4, G1 + 4 * M2 + 8, 2 * G1 + 0x1238] {
            if !A::leaf_allowed(2) && a >= 2 * G1 {
                continue;
            }
            let f = mm.write_u64(VirtAddr(a), 1).unwrap_err();
            assert_eq!(
                f.kind,
                SimFaultKind::Permission(AccessFault::Write),
                "{name} {a:#x}"
            );
            mm.read_u64(VirtAddr(a)).unwrap();
        }
    }
    assert_eq!(m.read_u64(VirtAddr(G1 + 5 * K4)), Ok(0x55));
    assert_eq!(m.read_u64(VirtAddr(G1 + 4 * M2 + 8)), Ok(0x66));
    no_leak(&m, &src);
    no_leak(&cm, &child);
    // Independent tables: unmapping in the child leaves the source intact.
    // (The reads above set accessed state: compare what is mapped.)
    let shape = |l: Vec<Mapping>| -> Vec<_> {
        l.into_iter()
            .map(|m| (m.va, m.pa, m.size, m.prot))
            .collect()
    };
    let mapped = shape(listing(&src, va, len));
    child.unmap(VirtAddr(va), len).unwrap();
    assert!(
        mapped == shape(listing(&src, va, len)),
        "the child's unmap changed the source"
    );
    expect_swp(&src, G1, &swp);
    assert_eq!(child.inspect().count_tables(), 1);
    no_leak(&cm, &child);
    no_leak(&m, &src);
}

/// A shared fork copies leaves as they are and flushes nothing.
pub fn fork_shared<A: Arch>() {
    let (m, mut src) = machine::<A>();
    let (cm, mut child) = machine::<A>();
    let swp = fork_source(&mut src);
    // Used: accessed and dirty state the child must not inherit.
    m.write_u64(VirtAddr(G1 + 5 * K4), 7).unwrap();
    let before = listing(&src, G1, 2 * G1);
    let f0 = flushes(&m);
    let mut got = Vec::new();
    src.copy_page_range(&mut child, VirtAddr(G1), 2 * G1, CopyMode::Shared, |e| {
        got.push(e)
    })
    .unwrap();
    check_reports(&got, &child, (G1, 2 * G1), G1, &swp);
    // As copied: old and clean, still writable.
    for e in got.iter().filter(|e| e.is_present()) {
        assert!(!e.young() && !e.dirty(), "{:?}", e.va());
    }
    assert!(got.iter().any(|e| e.prot().is_some_and(|p| p.writable())));
    assert_eq!(flushes(&m), f0);
    assert_eq!(listing(&src, G1, 2 * G1), before);
    // The child's leaves are old and clean (the source keeps the dirty
    // state and writes the page back).
    let old_clean = |e: &Mapping| {
        (
            e.va,
            e.pa,
            e.size,
            A::mkclean(A::mkold(e.entry, e.height), e.height),
        )
    };
    let want: Vec<_> = before.iter().map(old_clean).collect();
    let got: Vec<_> = listing(&child, G1, 2 * G1)
        .iter()
        .map(|e| (e.va, e.pa, e.size, e.entry))
        .collect();
    assert_eq!(got, want);
    assert!(before
        .iter()
        .any(|e| A::is_dirty(e.entry) || A::is_young(e.entry)));
    expect_swp(&child, G1, &swp);
    // Still writable on both sides.
    cm.write_u64(VirtAddr(G1 + 5 * K4), 9).unwrap();
    m.write_u64(VirtAddr(G1 + 4 * M2), 9).unwrap();
    no_leak(&m, &src);
    no_leak(&cm, &child);
}

/// A range that covers blocks in part: the source blocks are split, only
/// the range is write-protected, and the child gets the part in the range.
pub fn fork_partial_blocks<A: Arch>() {
    let (m, mut src) = machine::<A>();
    let (cm, mut child) = machine::<A>();
    src.map(VirtAddr(G1), PhysAddr(PA), 2 * M2, RW, MapOptions::BLOCKS)
        .unwrap();
    // Something of the child's own next to the range, in the same tables.
    child
        .map(VirtAddr(G1), PhysAddr(PA), K4, RW, MapOptions::PAGES)
        .unwrap();
    let (va, len) = (G1 + 3 * K4, M2);
    let mut got = Vec::new();
    src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |e| {
        got.push(e)
    })
    .unwrap();
    // The part of each block in the range, as the pages it was split into.
    check_reports(&got, &child, (va, len), G1, &[]);
    assert_eq!(got.len() as u64, len / K4);
    for off in [0, 2 * K4, M2 + 3 * K4, M2 + 20 * K4] {
        let t = src.translate(VirtAddr(G1 + off)).unwrap();
        assert!(t.prot.writable(), "outside, {off:#x}");
    }
    for off in [3 * K4, M2 - K4, M2, M2 + 2 * K4] {
        let t = src.translate(VirtAddr(G1 + off)).unwrap();
        assert!(!t.prot.writable(), "inside, {off:#x}");
        let c = child.translate(VirtAddr(G1 + off)).unwrap();
        assert_eq!(c.pa, t.pa);
        assert_eq!(c.entry, A::mkold(t.entry, t.height));
    }
    assert_eq!(child.translate(VirtAddr(G1 + M2 + 3 * K4)), None);
    assert_eq!(child.translate(VirtAddr(G1 + K4)), None);
    m.check().unwrap();
    no_leak(&m, &src);
    no_leak(&cm, &child);
    if !A::leaf_allowed(2) {
        return;
    }
    // A 1 GiB block covered in part at both ends of the range: split down
    // two levels on each side, in the source and the child alike; the
    // tables counted are the tables taken.
    let (m, mut src) = machine::<A>();
    let (cm, mut child) = machine::<A>();
    src.map(VirtAddr(4 * G1), PhysAddr(PA), G1, RW, MapOptions::BLOCKS)
        .unwrap();
    let (va, len) = (4 * G1 + 3 * M2 + 5 * K4, G1 - 7 * M2);
    let (a0, b0) = (
        src.stats().tables_allocated(),
        child.stats().tables_allocated(),
    );
    src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |_| {})
        .unwrap();
    // Source: the 1 GiB block into a PMD table, the two partly covered
    // 2 MiB blocks into PTE tables; the child the same, plus its path.
    assert_eq!(src.stats().tables_allocated() - a0, 3);
    assert_eq!(
        child.stats().tables_allocated() - b0,
        3 + u64::from(A::LEVELS - 3)
    );
    for off in [0, K4, len / 2, len - K4] {
        let t = src.translate(VirtAddr(va + off)).unwrap();
        let c = child.translate(VirtAddr(va + off)).unwrap();
        let old = A::mkold(t.entry, t.height);
        assert_eq!((c.pa, c.entry, c.height), (t.pa, old, t.height));
        assert!(!t.prot.writable());
    }
    for a in [va - K4, va + len, 4 * G1] {
        let t = src.translate(VirtAddr(a)).unwrap();
        assert!(t.prot.writable(), "{a:#x}");
        assert_eq!(child.translate(VirtAddr(a)), None);
    }
    m.check().unwrap();
    no_leak(&m, &src);
    no_leak(&cm, &child);
}

/// On every allocation failure, in either space, and on an occupied
/// destination, both spaces are unchanged and no table leaked.
pub fn fork_fails_unchanged<A: Arch>() {
    let probes: Vec<u64> = (0..8).map(|i| G1 + (i * 7 + 3) * K4).collect();
    let build = || {
        let (m, mut src) = machine::<A>();
        let (cm, mut child) = machine::<A>();
        fork_source(&mut src);
        // A block the range covers in part: the source needs a split.
        src.map(
            VirtAddr(G1 + 8 * M2),
            PhysAddr(PA),
            M2,
            RW,
            MapOptions::BLOCKS,
        )
        .unwrap();
        child
            .map(
                VirtAddr(G1 + 9 * M2),
                PhysAddr(PA),
                K4,
                RO,
                MapOptions::PAGES,
            )
            .unwrap();
        (m, src, cm, child)
    };
    let (va, len) = (G1, 8 * M2 + 5 * K4);
    // The counts, from a run with memory.
    let (_m, mut src, _cm, mut child) = build();
    let (a0, b0) = (
        src.stats().tables_allocated(),
        child.stats().tables_allocated(),
    );
    src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |_| {})
        .unwrap();
    let src_need = src.stats().tables_allocated() - a0;
    let dst_need = child.stats().tables_allocated() - b0;
    assert!(src_need >= 1 && dst_need >= 3, "{src_need} {dst_need}");
    drop((src, child));
    for (side, need) in [(0, src_need), (1, dst_need)] {
        for k in 0..need {
            let (m, mut src, cm, mut child) = build();
            let (sb, cb) = (
                snapshot(&src, G1, 2 * G1, &probes),
                snapshot(&child, G1, 2 * G1, &probes),
            );
            let f0 = flushes(&m);
            if side == 0 {
                m.fail_after(Some(k));
            } else {
                cm.fail_after(Some(k));
            }
            let mut reported = 0;
            let r = src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |_| {
                reported += 1
            });
            assert_eq!(reported, 0, "reported on error");
            m.fail_after(None);
            cm.fail_after(None);
            assert_eq!(r, Err(Error::OutOfMemory), "side {side}, k = {k}");
            assert_eq!(
                snapshot(&src, G1, 2 * G1, &probes),
                sb,
                "side {side}, k = {k}"
            );
            assert_eq!(
                snapshot(&child, G1, 2 * G1, &probes),
                cb,
                "side {side}, k = {k}"
            );
            assert_eq!(flushes(&m), f0);
            no_leak(&m, &src);
            no_leak(&cm, &child);
        }
    }
    // Exactly the counted tables suffice.
    let (m, mut src, cm, mut child) = build();
    m.fail_after(Some(src_need));
    cm.fail_after(Some(dst_need));
    src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |_| {})
        .unwrap();
    m.fail_after(None);
    cm.fail_after(None);
    // An occupied destination: a software entry, or a page.
    for (what, at) in [("software entry", G1 + 300 * K4), ("page", G1 + 5 * M2)] {
        let (m, mut src, cm, mut child) = build();
        if what == "page" {
            child
                .map(VirtAddr(at), PhysAddr(PA), K4, RO, MapOptions::PAGES)
                .unwrap();
        } else {
            child.install_pte(VirtAddr(at), NewPte::Swap(5)).unwrap();
        }
        let (sb, cb) = (
            snapshot(&src, G1, 2 * G1, &probes),
            snapshot(&child, G1, 2 * G1, &probes),
        );
        let mut reported = 0;
        let r = src.copy_page_range(&mut child, VirtAddr(va), len, CopyMode::Cow, |_| {
            reported += 1
        });
        assert_eq!(reported, 0, "reported on error");
        assert_eq!(r, Err(Error::AlreadyMapped(VirtAddr(at))), "{what}");
        assert_eq!(snapshot(&src, G1, 2 * G1, &probes), sb);
        assert_eq!(snapshot(&child, G1, 2 * G1, &probes), cb);
        no_leak(&m, &src);
        no_leak(&cm, &child);
    }
}

/// A hardware agent storing through the source while it is write-protected:
/// no dirty state it set is lost, on either side.
pub fn fork_race_keeps_dirty<A: Arch + Send>(rounds: usize) {
    let rounds = (crate::miri_scaled(rounds as u64) as usize).max(1);
    const PAGES: u64 = 512;
    let mut lost_total = 0;
    let mut dirtied_total = 0;
    for _ in 0..rounds {
        let (m, mut src) = machine::<A>();
        let (_cm, mut child) = machine::<A>();
        let va = VirtAddr(G1);
        // Counted per entry: no contiguous runs (a folded run reads as
        // dirty on every page once one is).
        let opts = MapOptions::PAGES.no_contiguous();
        src.map(va, PhysAddr(PA), PAGES * K4, RW, opts).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let agent = m.spawn_agent(va, PAGES * K4, stop.clone());
        // Let it start.
        while m.stats().tlb_misses < 64 {
            std::thread::yield_now();
        }
        src.copy_page_range(&mut child, va, PAGES * K4, CopyMode::Cow, |_| {})
            .unwrap();
        // Relaxed: join orders the rest.
        stop.store(true, Relaxed);
        let report = agent.join().unwrap();
        let dirty_src = listing(&src, va.0, PAGES * K4)
            .iter()
            .filter(|m| A::is_dirty(m.entry))
            .count() as u64;
        let dirty_child = listing(&child, va.0, PAGES * K4)
            .iter()
            .filter(|m| A::is_dirty(m.entry))
            .count() as u64;
        // Every page was clean: each dirty state the agent set is one page.
        lost_total += report.dirty_set - dirty_src;
        assert_eq!(dirty_child, dirty_src, "the child has the final state");
        dirtied_total += report.dirty_set;
        m.check().unwrap();
    }
    assert_eq!(lost_total, 0, "dirty states lost ({dirtied_total} set)");
    assert!(dirtied_total > 0, "the agent never stored");
}

/// A hardware agent that stores through the leaves directly (as the page
/// walker does: a compare-exchange on the entry, only while the leaf
/// allows the store), sweeping the pages backwards while the copy
/// write-protects them forwards, so the two cross in every round. Returns
/// the dirty states lost (set by the agent, missing afterwards in the
/// source or the child) and how many the agent set.
pub fn fork_direct_race<A: Arch>(rounds: usize) -> (u64, u64) {
    let rounds = (crate::miri_scaled(rounds as u64) as usize).max(1);
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Release};
    const PAGES: u64 = 4096;
    let (mut lost, mut set) = (0, 0);
    for _ in 0..rounds {
        let (_m, mut src) = machine::<A>();
        let (_cm, mut child) = machine::<A>();
        let va = VirtAddr(G1);
        src.map(va, PhysAddr(PA), PAGES * K4, RW, MapOptions::PAGES)
            .unwrap();
        let slots: Vec<usize> = (0..PAGES)
            .map(|i| {
                // SAFETY: only read for its address; the agent below uses
                // it as hardware does (atomic compare-exchange of A/D).
                let s = unsafe { src.inspect().slot(va.add(i * K4), 0) }.expect("mapped");
                s as *const _ as usize
            })
            .collect();
        let go = AtomicUsize::new(0);
        let dirtied = std::thread::scope(|scope| {
            let agent = scope.spawn(|| {
                // Acquire: pairs with the Release below.
                while go.load(Acquire) == 0 {
                    std::hint::spin_loop();
                }
                let mut dirtied = Vec::new();
                for (i, &a) in slots.iter().enumerate().rev() {
                    // SAFETY: a live entry of `src`'s tables, which stay
                    // allocated until after this scope; all accesses to it
                    // are atomic.
                    let e = unsafe { &*(a as *const AtomicU64) };
                    loop {
                        // Relaxed: only atomicity matters, as for the
                        // hardware's read-modify-write.
                        let raw = e.load(Relaxed);
                        let Ok(new) = A::hw_access(raw, 0, pgtable_core::contract::Access::WRITE)
                        else {
                            break;
                        };
                        // Relaxed: as above.
                        if e.compare_exchange(raw, new, Relaxed, Relaxed).is_ok() {
                            if !A::is_dirty(raw) && A::is_dirty(new) {
                                dirtied.push(i as u64);
                            }
                            break;
                        }
                    }
                }
                dirtied
            });
            // Release: the agent starts now.
            go.store(1, Release);
            src.copy_page_range(&mut *child, va, PAGES * K4, CopyMode::Cow, |_| {})
                .unwrap();
            agent.join().unwrap()
        });
        set += dirtied.len() as u64;
        for i in dirtied {
            let p = src.translate(va.add(i * K4)).unwrap().entry;
            let c = child.translate(va.add(i * K4)).unwrap().entry;
            lost += u64::from(!A::is_dirty(p) || !A::is_dirty(c));
        }
    }
    (lost, set)
}
