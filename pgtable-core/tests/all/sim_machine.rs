//! The simulated machine itself: translation, faults, accessed/dirty
//! updates, the TLB and walk cache with their flush semantics, the arm64
//! walker-visibility model, the hardware agent, and the stale-TLB check on
//! random operation sequences.
#![cfg(feature = "sim")]

use crate::common::test_format_variant;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pgtable_core::contract::{Access, AccessFault, Arch, Format, Mmu, TlbRange};
use pgtable_core::test_format::{TestFormat, ACCESSED, DIRTY};
use pgtable_core::{
    sim::{Installed, SimAlloc, SimFaultKind, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VirtAddr};

const K4: u64 = 4 << 10;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

type T4 = TestFormat<4>;
type Space<A = T4> = AddressSpace<A, SimMmu<A>, SimAlloc>;

/// Maps `[va, va + len)` read-write with 4 KiB pages to physical
/// `0x8000_0000` onwards.
fn map_rw<A: Arch>(s: &mut Space<A>, va: VirtAddr, len: u64) {
    s.map(
        va,
        PhysAddr(0x8000_0000),
        len,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
}

fn setup<A: Arch>() -> (SimMachine<A>, Installed<A, SimMmu<A>, SimAlloc>) {
    let m = SimMachine::<A>::new();
    let s = Space::<A>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

test_format_variant!(
    /// The test format, except that the walker sees table writes in program
    /// order (x86): no barrier needed.
    InOrderWalker,
    "test-in-order"
);

// SAFETY: every entry operation is the generic fallback.
unsafe impl Arch for InOrderWalker {
    const NEEDS_WALKER_BARRIER: bool = false;
}

#[test]
fn loads_and_stores_reach_the_physical_page_the_tables_name() {
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1 + 3 * K4);
    map_rw(&mut s, va, 2 * K4);
    m.write_u64(VirtAddr(va.0 + K4 + 16), 0xfeed).unwrap();
    m.write_u8(VirtAddr(va.0 + 3), 0xab).unwrap();
    assert_eq!(m.phys_read_u64(PhysAddr(0x8000_1010)), 0xfeed);
    assert_eq!(m.read_u8(VirtAddr(va.0 + 3)).unwrap(), 0xab);
    m.phys_write_u64(PhysAddr(0x8000_0008), 77);
    assert_eq!(m.read_u64(VirtAddr(va.0 + 8)).unwrap(), 77);
    assert_eq!(
        m.translate(VirtAddr(va.0 + K4 + 5)).unwrap(),
        PhysAddr(0x8000_1005)
    );
    m.check().unwrap();
}

#[test]
fn bad_accesses_fault_as_values_with_their_reason() {
    let m = SimMachine::<T4>::new();
    let f = m.read_u64(VirtAddr(0)).unwrap_err();
    assert_eq!(f.kind, SimFaultKind::NoRoot);
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1);
    s.map(
        va,
        PhysAddr(0x8000_0000),
        K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    let f = m.read_u64(VirtAddr(G1 + K4)).unwrap_err();
    assert_eq!(f.kind, SimFaultKind::Translation { height: 0 });
    assert!(!f.write);
    let f = m.read_u64(VirtAddr(G1 + M2)).unwrap_err();
    assert_eq!(f.kind, SimFaultKind::Translation { height: 1 });
    let f = m.read_u64(VirtAddr(2 * G1)).unwrap_err();
    assert_eq!(f.kind, SimFaultKind::Translation { height: 2 });
    let f = m.write_u64(va, 1).unwrap_err();
    assert_eq!(f.kind, SimFaultKind::Permission(AccessFault::Write));
    assert!(f.write);
    assert_eq!(
        m.exec(va).unwrap_err().kind,
        SimFaultKind::Permission(AccessFault::Exec)
    );
    assert_eq!(
        m.read_u64(VirtAddr(G1 + 4)).unwrap_err().kind,
        SimFaultKind::Unaligned
    );
    // Non-canonical.
    assert!(matches!(
        m.read_u64(VirtAddr(1 << 50)).unwrap_err().kind,
        SimFaultKind::Translation { .. }
    ));
    // A table entry pointing at memory that is not a table frame.
    // SAFETY: NOT what `slot` allows (a forged table entry), on purpose:
    // the simulated walker checks table frames, and the address space
    // never sees the forged entry: the original is back before the slot's
    // borrow ends and before anything here can panic.
    let pmd = unsafe { s.inspect().slot(va, 1) }.unwrap();
    let good = pmd.swap(T4::table_entry(PhysAddr(0x9000_0000), 1), Relaxed);
    m.mmu().flush_tlb_all();
    let forged = m.read_u64(va);
    pmd.store(good, Relaxed);
    m.mmu().flush_tlb_all();
    assert_eq!(
        forged.unwrap_err().kind,
        SimFaultKind::NotATable(PhysAddr(0x9000_0000))
    );
    m.read_u64(va).unwrap();
}

#[test]
fn the_walker_sets_accessed_then_dirty_in_the_leaf() {
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1);
    map_rw(&mut s, va, K4);
    let entry = |s: &Space| s.translate(va).unwrap().entry;
    assert_eq!(entry(&s) & (ACCESSED | DIRTY), 0);
    m.read_u64(va).unwrap();
    assert_eq!(entry(&s) & (ACCESSED | DIRTY), ACCESSED);
    // The store hits a clean cached entry: the walker updates memory.
    let u = m.hw_touch(va, true).unwrap();
    assert!(u.dirty && !u.accessed);
    assert_eq!(entry(&s) & (ACCESSED | DIRTY), ACCESSED | DIRTY);
    assert_eq!(m.stats().dirty_set, 1);
    assert_eq!(m.stats().accessed_set, 1);
    m.check().unwrap();
}

#[test]
fn a_block_is_one_tlb_entry_and_later_accesses_hit() {
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1 + M2);
    s.map(
        va,
        PhysAddr(0x8020_0000),
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    for i in 0..64 {
        m.read_u64(VirtAddr(va.0 + i * 8 * K4)).unwrap();
    }
    let st = m.stats();
    assert_eq!(st.tlb_misses, 1);
    assert_eq!(st.tlb_hits, 63);
    // One leaf plus the two table entries above the PMD.
    assert_eq!(m.tlb_len(), 3);
}

#[test]
fn a_range_flush_drops_overlapping_leaves_and_walk_caches_only_when_not_last_level() {
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1);
    map_rw(&mut s, va, 2 * K4);
    m.read_u64(va).unwrap();
    m.read_u64(VirtAddr(va.0 + K4)).unwrap();
    // Two leaves, three walk-cache entries (PGD, PUD, PMD).
    assert_eq!(m.tlb_len(), 5);
    let mmu = m.mmu();
    mmu.flush_tlb_range(TlbRange {
        start: va,
        end: VirtAddr(va.0 + K4),
        stride_shift: 12,
        last_level: true,
    });
    assert!(!m.tlb_holds(va));
    assert!(m.tlb_holds(VirtAddr(va.0 + K4)));
    assert_eq!(m.tlb_len(), 4);
    // The next walk starts from the walk cache.
    let before = m.stats().walk_cache_hits;
    m.read_u64(va).unwrap();
    assert_eq!(m.stats().walk_cache_hits, before + 1);
    mmu.flush_tlb_range(TlbRange {
        start: va,
        end: VirtAddr(va.0 + K4),
        stride_shift: 12,
        last_level: false,
    });
    assert_eq!(m.tlb_len(), 1, "only the other page's leaf is left");
    mmu.flush_tlb_all();
    assert_eq!(m.tlb_len(), 0);
}

#[test]
fn the_tlb_evicts_its_oldest_entry_when_full() {
    let (m, mut s) = setup::<T4>();
    m.set_tlb_capacity(4);
    let va = VirtAddr(G1);
    map_rw(&mut s, va, 4 * K4);
    for i in 0..4 {
        m.read_u64(VirtAddr(va.0 + i * K4)).unwrap();
    }
    assert_eq!(m.tlb_len(), 4);
    assert!(m.stats().tlb_evictions >= 3);
    assert!(m.tlb_holds(VirtAddr(va.0 + 3 * K4)));
    m.check().unwrap();
}

#[test]
fn a_nosync_write_is_invisible_to_an_arm64_walker_until_a_barrier_or_flush() {
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1);
    map_rw(&mut s, va, K4);
    let next = VirtAddr(G1 + K4);
    let leaf = T4::leaf(PhysAddr(0x8000_5000), Prot::READ_WRITE, 0);
    // SAFETY: a leaf into an empty entry; the missing barrier is the point.
    T4::set_pte_nosync(s.mmu(), unsafe { s.inspect().slot(next, 0) }.unwrap(), leaf);
    assert_eq!(
        m.read_u64(next).unwrap_err().kind,
        SimFaultKind::Translation { height: 0 }
    );
    let p = m.check_visible().unwrap_err();
    assert_eq!((p.old, p.new), (0, leaf));
    s.mmu().walker_barrier();
    m.read_u64(next).unwrap();
    m.check().unwrap();
    // A flush orders earlier writes too.
    let third = VirtAddr(G1 + 2 * K4);
    // SAFETY: a leaf into an empty entry; the missing barrier is the point.
    T4::set_pte_nosync(
        s.mmu(),
        unsafe { s.inspect().slot(third, 0) }.unwrap(),
        leaf,
    );
    assert!(m.read_u64(third).is_err());
    s.mmu().flush_tlb_all();
    m.read_u64(third).unwrap();
    m.check().unwrap();
    s.unmap(va, 3 * K4).unwrap();
}

#[test]
fn an_in_order_walker_sees_nosync_writes_at_once() {
    let (m, mut s) = setup::<InOrderWalker>();
    let va = VirtAddr(G1);
    map_rw(&mut s, va, K4);
    let next = VirtAddr(G1 + K4);
    let leaf = InOrderWalker::leaf(PhysAddr(0x8000_5000), Prot::READ_WRITE, 0);
    // SAFETY: a leaf into an empty entry, as the arch's setter stores it.
    InOrderWalker::set_pte_nosync(s.mmu(), unsafe { s.inspect().slot(next, 0) }.unwrap(), leaf);
    m.read_u64(next).unwrap();
    m.check().unwrap();
    assert_eq!(s.stats().barriers(), 0, "no barrier is ever issued");
}

#[test]
fn handles_are_send_and_sync_and_an_agent_thread_sets_accessed_and_dirty() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<SimMachine<T4>>();
    send_sync::<SimMmu<T4>>();
    send_sync::<SimAlloc>();
    let (m, mut s) = setup::<T4>();
    let va = VirtAddr(G1);
    map_rw(&mut s, va, 8 * K4);
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(va, 8 * K4, stop.clone());
    while m.stats().dirty_set < 8 {
        std::thread::yield_now();
    }
    stop.store(true, Relaxed);
    let r = agent.join().unwrap();
    assert_eq!(r.faults, 0);
    assert_eq!((r.accessed_set, r.dirty_set), (8, 8));
    let mut dirty = 0;
    s.walk(va, 8 * K4, |mp| dirty += u32::from(T4::is_dirty(mp.entry)))
        .unwrap();
    assert_eq!(dirty, 8);
}

#[test]
fn table_allocation_failures_can_be_injected() {
    let (m, mut s) = setup::<T4>();
    let live = m.live_tables();
    m.fail_after(Some(1));
    let r = s.map(
        VirtAddr(G1),
        PhysAddr(0x8000_0000),
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    assert_eq!(r, Err(Error::OutOfMemory));
    assert_eq!(m.live_tables(), live);
    m.fail_after(None);
    map_rw(&mut s, VirtAddr(G1), K4);
    assert_eq!(m.live_tables(), live + 3);
    assert_eq!(s.alloc().live(), live + 3);
}

/// splitmix64, for the random sequences.
fn next(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn random_operation_sequences_never_leave_a_stale_tlb_entry() {
    // Map, unmap, protect and move random ranges in a 64 MiB area, touching
    // random pages between operations so the TLB holds translations the
    // operations must invalidate; after every operation the simulator's
    // check must pass and every access must agree with `translate`.
    let (m, mut s) = setup::<T4>();
    let base = G1;
    let pages = 64 * M2 / K4;
    let mut x = 0xc0ffee;
    for step in 0..pgtable_testkit::miri_scaled(400) {
        let p = next(&mut x) % pages;
        let n = 1 + next(&mut x) % 1024.min(pages - p);
        let va = VirtAddr(base + p * K4);
        let len = n * K4;
        let op = next(&mut x) % 4;
        let r = match op {
            0 => {
                let opts = if next(&mut x) % 2 == 0 {
                    MapOptions::BLOCKS
                } else {
                    MapOptions::PAGES
                };
                s.map(
                    va,
                    PhysAddr(0x1_0000_0000 + p * K4),
                    len,
                    Prot::READ_WRITE,
                    opts,
                )
            }
            1 => s.unmap(va, len),
            2 => {
                let prot = if next(&mut x) % 2 == 0 {
                    Prot::READ_ONLY
                } else {
                    Prot::READ_WRITE
                };
                s.change_protection(va, len, prot)
            }
            _ => {
                let q = next(&mut x) % pages;
                let n = n.min(pages - q);
                s.move_page_tables(va, VirtAddr(base + q * K4), n * K4, MoveOptions::DEFAULT)
            }
        };
        // Errors (overlap, already mapped) are fine here; what matters is
        // the machine's view after every operation.
        let _ = r;
        if let Err(e) = m.check() {
            panic!("step {step} (op {op} at {va:?} len {len:#x}): {e}");
        }
        for _ in 0..16 {
            let t = VirtAddr(base + (next(&mut x) % pages) * K4 + 8 * (next(&mut x) % 512));
            let write = next(&mut x) % 2 == 0;
            let want = s.translate(t);
            let got = m.access(t, if write { Access::WRITE } else { Access::READ });
            match (want, got) {
                (None, Err(f)) => assert!(matches!(f.kind, SimFaultKind::Translation { .. })),
                (Some(w), Ok((pa, _))) => {
                    assert_eq!(pa, w.pa, "step {step}: {t:?}");
                    assert!(!write || w.prot.writable());
                }
                (Some(w), Err(f)) => assert!(
                    write
                        && !w.prot.writable()
                        && f.kind == SimFaultKind::Permission(AccessFault::Write),
                    "step {step}: {t:?} faulted with {f:?} but maps {w:?}"
                ),
                (None, Ok(pa)) => panic!("step {step}: {t:?} unmapped but reached {pa:?}"),
            }
        }
    }
    drop(s);
    assert_eq!(m.live_tables(), 0);
}

#[test]
fn an_installed_space_that_is_dropped_leaves_its_tables_to_the_walker() {
    let m = SimMachine::<T4>::new();
    let mut s = Space::<T4>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    unsafe { s.install() };
    map_rw(&mut s, VirtAddr(G1), K4);
    m.write_u64(VirtAddr(G1), 7).unwrap();
    let live = m.live_tables();
    assert_eq!(live, 4);
    // Debug builds report the misuse (a panic in `drop`); every build
    // leaves the tables allocated.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(s)));
    assert_eq!(dropped.is_err(), cfg!(debug_assertions));
    assert_eq!(m.live_tables(), live, "tables of an installed space freed");
    // The machine still runs on that root: a fresh walk reaches the page.
    m.mmu().flush_tlb_all();
    assert_eq!(m.read_u64(VirtAddr(G1)).unwrap(), 7);
    m.check().unwrap();
}

#[test]
fn a_deactivated_space_frees_its_tables_when_dropped() {
    let (m, mut s) = setup::<T4>();
    map_rw(&mut s, VirtAddr(G1), K4);
    m.write_u64(VirtAddr(G1), 7).unwrap();
    let root = s.root();
    assert!(s.inspect().is_active());
    // `Installed` deactivates it first.
    drop(s);
    assert_eq!(m.live_tables(), 0);
    m.mmu().flush_tlb_all();
    assert_eq!(
        m.read_u64(VirtAddr(G1)).unwrap_err().kind,
        SimFaultKind::FreedTable(root)
    );
}

/// The simulator's allocator keeps one lock per live table frame: the same
/// lock on every call and from every clone of the allocator, distinct for
/// distinct frames, and a new, unlocked one when a freed frame comes back.
#[test]
fn sim_alloc_keeps_one_table_lock_per_live_frame() {
    use pgtable_core::contract::{TableAlloc, TableLocks};

    let m = SimMachine::<T4>::new();
    let mut a = m.alloc();
    let other = m.alloc();
    let (p, q) = (a.alloc_table().unwrap(), a.alloc_table().unwrap());
    // SAFETY: both frames are live until freed below, and no reference is
    // used after its frame's free.
    unsafe {
        let lp = a.table_lock(p);
        assert!(core::ptr::eq(lp, other.table_lock(p)));
        assert!(!core::ptr::eq(lp, a.table_lock(q)));
        let held = lp.lock();
        assert!(other.table_lock(p).try_lock().is_none());
        assert!(a.table_lock(q).try_lock().is_some());
        drop(held);
        // Freed while locked: the frame comes back with an unlocked lock.
        core::mem::forget(a.table_lock(q).lock());
        a.free_table(q);
    }
    let q2 = a.alloc_table().unwrap();
    // SAFETY: live frames, references used only while they live.
    unsafe {
        assert_eq!(q2, q, "the arena hands the freed frame out again");
        assert!(!a.table_lock(q2).is_locked());
        a.free_table(q2);
        a.free_table(p);
    }
    assert_eq!(a.live(), 0);
}
