//! The x86 formats on the simulated machine: the hardware's view of the
//! exact bits (rights, accessed/dirty updates), the deferred flush of huge
//! protection changes, and accessed/dirty updates racing the algorithms.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtable_core::contract::{Access, AccessFault, Arch, Format, Mmu, TableAlloc, TlbRange};
use pgtable_core::{
    sim::{CheckError, Installed, SimAlloc, SimFaultKind, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{AddressSpace, CopyMode, LiveOptions, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::{X86_64La57, X86_64};

const MIB2: u64 = 0x20_0000;

type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

fn machine<A: Arch>() -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

fn user_rw() -> Prot {
    Prot::USER | Prot::WRITE
}

fn user_ro() -> Prot {
    Prot::USER
}

fn walker_sets_accessed_and_dirty_in_user_leaves<A: Arch>(va: u64) {
    let (m, mut s) = machine::<A>();
    s.map(
        VirtAddr(va),
        PhysAddr(0x4000_0000),
        MIB2,
        user_rw(),
        MapOptions::BLOCKS,
    )
    .unwrap();
    let leaf = |s: &Space<A>| s.translate(VirtAddr(va)).unwrap().entry;
    assert_eq!(leaf(&s) & 0x60, 0, "user leaves start clean");
    m.read_u64(VirtAddr(va + 0x12_3000)).unwrap();
    assert_eq!(leaf(&s) & 0x60, 0x20, "a load sets A only");
    m.write_u64(VirtAddr(va + 8), 1).unwrap();
    assert_eq!(leaf(&s) & 0x60, 0x60, "a store sets D");
    m.check().unwrap();
}

#[test]
fn walker_sets_accessed_and_dirty_4_level() {
    walker_sets_accessed_and_dirty_in_user_leaves::<X86_64>(0xffff_8000_4000_0000);
}

#[test]
fn walker_sets_accessed_and_dirty_5_level() {
    walker_sets_accessed_and_dirty_in_user_leaves::<X86_64La57>(0xff00_0000_4000_0000);
}

#[test]
fn simulated_accesses_obey_the_x86_rights() {
    let (m, mut s) = machine::<X86_64>();
    let va = 0x10_0000_0000u64;
    s.map(
        VirtAddr(va),
        PhysAddr(0x4000_0000),
        0x1000,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(va + 0x1000),
        PhysAddr(0x4000_1000),
        0x1000,
        Prot::USER | Prot::EXEC,
        MapOptions::PAGES,
    )
    .unwrap();
    let kind = |r: Result<_, pgtable_core::sim::SimFault>| r.map(|_| ()).map_err(|f| f.kind);
    // CR0.WP = 1: a kernel store to a read-only page faults.
    assert_eq!(
        kind(m.write_u64(VirtAddr(va), 1)),
        Err(SimFaultKind::Permission(AccessFault::Write))
    );
    // XD: kernel read-only pages are not executable.
    assert_eq!(
        kind(m.exec(VirtAddr(va))),
        Err(SimFaultKind::Permission(AccessFault::Exec))
    );
    let user_read = Access {
        write: false,
        exec: false,
        user: true,
    };
    assert_eq!(
        kind(m.access(VirtAddr(va), user_read).map(|_| ())),
        Err(SimFaultKind::Permission(AccessFault::Privilege))
    );
    // The user page: user and kernel (no SMEP) may execute it.
    assert_eq!(
        kind(m.access(VirtAddr(va + 0x1000), user_read).map(|_| ())),
        Ok(())
    );
    assert_eq!(kind(m.exec(VirtAddr(va + 0x1000))), Ok(()));
    m.check().unwrap();
}

#[test]
fn huge_protection_change_flushes_once_at_the_end() {
    // 32 blocks of 2 MiB: the deferred pmdp_modify_prot_start leaves one
    // gathered range flush (32 strides, under the ceiling of 33); Linux's
    // generic form would flush each block as well.
    let (m, mut s) = machine::<X86_64>();
    let va = VirtAddr(0x40_0000_0000);
    s.map(
        va,
        PhysAddr(0x4000_0000),
        32 * MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    for i in 0..32 {
        m.write_u64(va.add(i * MIB2), i).unwrap();
    }
    s.stats().reset();
    s.change_protection(va, 32 * MIB2, Prot::READ_ONLY).unwrap();
    assert_eq!(s.stats().flush_range(), 1);
    assert_eq!(s.stats().flush_all(), 0);
    assert_eq!(s.stats().barriers(), 0);
    // No stale writable translation survived the one flush.
    m.check().unwrap();
    for i in 0..32 {
        assert_eq!(m.read_u64(va.add(i * MIB2)).unwrap(), i);
        assert!(m.write_u64(va.add(i * MIB2), 0).is_err());
    }
    let t = s.translate(va).unwrap();
    assert_eq!(t.prot, Prot::READ_ONLY);
    // Kernel RO 2 MiB block, A and D kept from before: P | A | D | PS | XD.
    assert_eq!(t.entry, (1 << 63) | 0x4000_0000 | 0xe1);
}

/// Maps user pages and blocks, lets a hardware agent touch them while the
/// main thread flips their protection, then checks that
/// every accessed/dirty state the agent set is still in the tables: an
/// update lost to a racing software write would make the agent set the
/// same state again, so the agent's count would exceed the final one.
fn no_accessed_dirty_update_is_lost<A: Arch + Send>(va: u64) {
    let (m, mut s) = machine::<A>();
    let base = VirtAddr(va);
    let len = 8 * MIB2;
    // 4 MiB of 4 KiB pages, then 4 MiB of 2 MiB blocks.
    s.map(
        base,
        PhysAddr(0x4000_0000),
        len / 2,
        user_rw(),
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        base.add(len / 2),
        PhysAddr(0x4000_0000 + len / 2),
        len / 2,
        user_rw(),
        MapOptions::BLOCKS,
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(base, len, stop.clone());
    // Ten rounds under Miri.
    for round in 0..pgtable_testkit::miri_scaled(100) {
        let p = if round % 2 == 0 { user_ro() } else { user_rw() };
        s.change_protection(base, len, p).unwrap();
        m.check().unwrap();
    }
    // On a loaded machine the agent may not have run yet: give it up to
    // 30 s to set some states (the range is writable after the last round).
    let t0 = Instant::now();
    while (m.stats().accessed_set == 0 || m.stats().dirty_set == 0)
        && t0.elapsed() < Duration::from_secs(30)
    {
        std::thread::yield_now();
    }
    // Relaxed: the join below orders everything the agent did.
    stop.store(true, Relaxed);
    let report = agent.join().unwrap();
    assert!(report.touches > 0);

    let (mut accessed, mut dirty) = (0u64, 0u64);
    s.walk(base, len, |leaf| {
        accessed += u64::from(A::is_young(leaf.entry));
        dirty += u64::from(A::is_dirty(leaf.entry));
    })
    .unwrap();
    assert!(
        report.accessed_set > 0 && report.dirty_set > 0,
        "{report:?}"
    );
    // Nothing here clears A or D, so each leaf gets each state set once;
    // a lost update would be set again and counted twice.
    assert_eq!(
        report.accessed_set, accessed,
        "accessed states lost: {report:?}"
    );
    assert_eq!(report.dirty_set, dirty, "dirty states lost: {report:?}");
    m.check().unwrap();
}

#[test]
fn no_accessed_dirty_update_is_lost_4_level() {
    no_accessed_dirty_update_is_lost::<X86_64>(0xffff_8000_0000_0000);
}

#[test]
fn no_accessed_dirty_update_is_lost_5_level() {
    no_accessed_dirty_update_is_lost::<X86_64La57>(0x0080_0000_0000_0000);
}

#[test]
fn x86_format_is_what_the_simulator_decodes() {
    // The simulator's walk and the format agree on a hand-built 1 GiB page.
    let (m, mut s) = machine::<X86_64La57>();
    let va = VirtAddr(0xff00_0000_4000_0000);
    s.map(
        va,
        PhysAddr(0x4000_0000),
        1 << 30,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let t = s.translate(va).unwrap();
    assert_eq!(t.height, 2);
    assert_eq!(
        t.entry,
        X86_64La57::leaf(PhysAddr(0x4000_0000), Prot::READ_WRITE, 2)
    );
    assert_eq!(
        m.translate(va.add(0x1234_5678)).unwrap(),
        PhysAddr(0x5234_5678)
    );
}

/// A move that relinks whole tables publishes their contents first, as
/// Linux's `pmd_populate` does: the simulator reports a link of a table
/// written since the last publish point (x86 has no walker barrier to do
/// it instead).
fn moved_tables_are_published_before_they_are_relinked<A: Arch>() {
    let (m, mut s) = machine::<A>();
    let (g1, m2) = (1u64 << 30, 2u64 << 20);
    for va in [g1, g1 + 4 * m2] {
        s.map(
            VirtAddr(va),
            PhysAddr(va),
            m2,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
    }
    s.move_page_tables(VirtAddr(g1), VirtAddr(2 * g1), g1, MoveOptions::DEFAULT)
        .unwrap();
    m.check().unwrap();
    assert_eq!(
        s.translate(VirtAddr(2 * g1 + 4 * m2)).unwrap().pa,
        PhysAddr(g1 + 4 * m2)
    );
}

#[test]
fn moved_tables_are_published_before_they_are_relinked_4_level() {
    moved_tables_are_published_before_they_are_relinked::<X86_64>();
}

#[test]
fn moved_tables_are_published_before_they_are_relinked_5_level() {
    moved_tables_are_published_before_they_are_relinked::<X86_64La57>();
}

// ----- splitting a cached block (Intel SDM Vol. 3A 4.10.2.3) -----

/// The 2 MiB block the split cases start from, at `BLOCK_VA`, cached by
/// a load (a read-write global kernel block, or a user one).
const BLOCK_VA: VirtAddr = VirtAddr(0x4000_0000);

fn cached_block(prot: Prot) -> (SimMachine<X86_64>, Space<X86_64>) {
    let (m, mut s) = machine::<X86_64>();
    s.map(
        BLOCK_VA,
        PhysAddr(0x8000_0000),
        MIB2,
        prot,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    m.read_u64(BLOCK_VA.add(0x1000)).unwrap();
    assert!(m.tlb_holds(BLOCK_VA));
    (m, s)
}

/// The flush of the one leaf of `1 << shift` bytes at `va`.
fn leaf(va: VirtAddr, shift: u32) -> TlbRange {
    TlbRange {
        start: va,
        end: va.add(1 << shift),
        stride_shift: shift,
        last_level: true,
    }
}

/// The split of the cached block by hand: a table with `children` (the
/// block's own entries split, or something else), linked in place of the
/// block, then page 1 write-protected, with `flush_first` flushing the
/// block's translation between the link and the change.
fn split_by_hand(children: impl Fn(u64) -> u64, flush_first: bool) -> Result<(), CheckError> {
    let (m, s) = cached_block(Prot::READ_WRITE | Prot::GLOBAL);
    let mmu = m.mmu();
    let mut alloc = m.alloc();
    let child = alloc.alloc_table().unwrap();
    // SAFETY: a fresh frame of the machine's allocator, linked below.
    let t = unsafe { alloc.phys_to_virt(child).as_ref() };
    // SAFETY: the block's entry, written only by this test.
    let slot = unsafe { s.inspect().slot(BLOCK_VA, 1) }.unwrap();
    let block = slot.load(Relaxed);
    let first = X86_64::split_leaf(block, 1);
    for (i, e) in t.entries().iter().enumerate() {
        e.store(children(first + i as u64 * 0x1000), Relaxed);
    }
    mmu.publish_barrier();
    slot.store(X86_64::table_entry(child, 1), Relaxed);
    mmu.entry_written(slot, block);
    if flush_first {
        mmu.flush_tlb_range(leaf(BLOCK_VA, 21));
    }
    // Page 1 read-only (R/W is bit 1).
    let pte = &t.entries()[1];
    let old = pte.load(Relaxed);
    pte.store(old & !2, Relaxed);
    mmu.entry_written(pte, old);
    mmu.flush_tlb_range(leaf(BLOCK_VA.add(0x1000), 12));
    m.check()
}

#[test]
fn changing_a_page_of_a_split_block_before_the_block_is_flushed_is_caught() {
    // Correct (Linux `__split_large_page`): split with the block's own
    // attributes, flush the block, then change the page.
    assert_eq!(split_by_hand(|e| e, true), Ok(()));
    // Broken: the change while the 2 MiB read-write translation may still
    // be cached beside the new 4 KiB read-only one.
    let Err(CheckError::MixedSizes(c)) = split_by_hand(|e| e, false) else {
        panic!("not caught");
    };
    assert_eq!(
        (c.va, c.height, c.block_height),
        (BLOCK_VA.add(0x1000), 0, 1)
    );
    // Broken: a split whose children differ from the block at once.
    let Err(CheckError::MixedSizes(c)) = split_by_hand(|e| e & !2, true) else {
        panic!("not caught");
    };
    assert_eq!((c.va, c.height), (BLOCK_VA, 0));
}

/// One page of the cached block made read-only by `op`: the block's
/// translation must be flushed before the page differs from it.
fn partial_change_of_a_cached_block(op: &str) {
    let prot = if op == "live" {
        Prot::READ_WRITE | Prot::GLOBAL
    } else {
        user_rw()
    };
    let (m, mut s) = cached_block(prot);
    let page = BLOCK_VA.add(0x1000);
    s.stats().reset();
    match op {
        "live" => s
            .change_protection_live(page, 0x1000, Prot::GLOBAL, LiveOptions::default())
            .unwrap(),
        "protect" => s.change_protection(page, 0x1000, user_ro()).unwrap(),
        _ => {
            let mut child = AddressSpace::<X86_64, _, _>::new(m.mmu(), m.alloc()).unwrap();
            s.copy_page_range(&mut child, page, 0x1000, CopyMode::Cow, |_| {})
                .unwrap();
            assert!(!child.translate(page).unwrap().prot.writable());
        }
    }
    assert_eq!(m.check(), Ok(()), "{op}");
    // Two `INVLPG`s: the block's at once, the page's at the end (no full
    // flush for a gathered range of mixed strides).
    assert_eq!(
        (s.stats().flush_range(), s.stats().flush_all()),
        (2, 0),
        "{op}"
    );
    assert!(m.write_u64(page, 1).is_err(), "{op}");
    m.write_u64(BLOCK_VA, 1).unwrap();
    m.check().unwrap();
}

#[test]
fn a_live_change_of_one_page_of_a_cached_block_flushes_the_block_first() {
    partial_change_of_a_cached_block("live");
}

#[test]
fn a_protection_change_of_one_page_of_a_cached_block_flushes_the_block_first() {
    partial_change_of_a_cached_block("protect");
}

#[test]
fn a_cow_copy_of_one_page_of_a_cached_block_flushes_the_block_first() {
    partial_change_of_a_cached_block("fork");
}

/// A gather that changed a cached block's protection and then splits it
/// (an unmap of part of the block in the same gather) flushes the pending
/// change before the split: the new 4 KiB entries carry the new rights,
/// and the old 2 MiB translation must be gone before they are linked.
#[test]
fn a_gather_that_splits_a_block_it_changed_flushes_the_change_first() {
    let (m, mut s) = cached_block(user_rw());
    let mut g = s.tlb_gather_mmu();
    g.change_protection(BLOCK_VA, MIB2, user_ro()).unwrap();
    g.unmap(BLOCK_VA.add(0x1000), 0x1000).unwrap();
    g.finish();
    assert_eq!(m.check(), Ok(()));
    assert!(m.read_u64(BLOCK_VA.add(0x1000)).is_err());
    assert!(m.write_u64(BLOCK_VA, 1).is_err());
    m.read_u64(BLOCK_VA.add(0x2000)).unwrap();
    m.check().unwrap();
}
