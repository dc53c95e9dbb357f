//! The simulator's checks of contiguous runs (Arm ARM D8.6.1 "Contiguous
//! bit"): broken variants of the contpte rules it must catch, a CPU that
//! probes every intermediate state an operation's flushes expose, stores
//! through the simulator after a write fault on one page of a run, and
//! reports checked against the stores a run took when the hardware records
//! their dirty state in another entry of the run.

use pgtable_arm64::bits;
use pgtable_arm64::format::is_contiguous;
use pgtable_arm64::Arm64;
use pgtable_core::contract::{Access, Arch, Format, Mmu, Slot, TlbRange};
use pgtable_core::sim::{CheckError, Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VirtAddr};

const PAGE: u64 = 4096;
const RUN: u64 = 16 * PAGE;
const VA: VirtAddr = VirtAddr(1 << 30);
const PA: PhysAddr = PhysAddr(0x4000_0000);

type Space = Installed<Arm64, SimMmu<Arm64>, SimAlloc>;

fn machine() -> (SimMachine<Arm64>, Space) {
    let m = SimMachine::<Arm64>::new();
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m.clone(), unsafe { Installed::new(s) })
}

/// Loads every page of `[va, va + len)` through the simulated TLB.
fn touch(m: &SimMachine<Arm64>, va: VirtAddr, len: u64) {
    for k in 0..len / PAGE {
        m.access(va.add(k * PAGE), Access::READ).unwrap();
    }
}

/// A run whose hint outlives a change to part of it: the simulator reports
/// the disagreeing permissions after the operation.
#[test]
fn contpte_sim_catches_a_hint_left_on_a_partly_changed_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.check().unwrap();
    // What `change_protection` of one page did before it unfolded runs:
    // that entry alone made read-only, the hint kept.
    // SAFETY: a leaf changed in place into another leaf of the format;
    // the test flushes nothing because nothing is cached.
    let slot = unsafe { s.inspect().slot(VA.add(PAGE), 0) }.unwrap();
    let raw = slot.load(std::sync::atomic::Ordering::Relaxed);
    let ro = Arm64::modify_prot(raw, Prot::READ_ONLY, 0);
    assert!(is_contiguous(ro));
    Arm64::set_pte_at(s.mmu(), VA.add(PAGE), slot, ro);
    match m.check() {
        Err(CheckError::Contiguous(c)) => {
            assert_eq!((c.va, c.height, c.index), (VA, 0, 1));
            assert!(!c.at_fill);
        }
        other => panic!("not caught: {other:?}"),
    }
}

/// An output address that breaks the run: a TLB fill through the run
/// reports it.
#[test]
fn contpte_sim_catches_a_fill_through_a_misprogrammed_run() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // SAFETY: a leaf replaced by another leaf while nothing is cached.
    let slot = unsafe { s.inspect().slot(VA.add(9 * PAGE), 0) }.unwrap();
    let raw = slot.load(std::sync::atomic::Ordering::Relaxed);
    Arm64::set_pte_at(s.mmu(), VA.add(9 * PAGE), slot, raw + 0x10_0000);
    m.access(VA, Access::READ).unwrap();
    match m.check() {
        Err(CheckError::Contiguous(c)) => {
            assert_eq!((c.va, c.index), (VA, 9));
            assert!(c.at_fill);
        }
        other => panic!("not caught: {other:?}"),
    }
}

/// An unfold without the flush between clearing the entries and writing
/// them again: the cached run translation meets entries without the hint
/// (a break-before-make violation, Arm ARM D8.16).
#[test]
fn contpte_sim_catches_an_unfold_without_the_flush() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, RUN);
    assert!(m.tlb_holds_run(VA));
    let mmu = s.mmu().clone();
    let mut old = Vec::new();
    for k in 0..16 {
        // SAFETY: the run's leaves are cleared and made again as the same
        // leaves without the hint (the broken part is the missing flush).
        let slot = unsafe { s.inspect().slot(VA.add(k * PAGE), 0) }.unwrap();
        old.push(Arm64::ptep_get_and_clear(&mmu, slot));
    }
    // (The flush of the run belongs here.)
    for (k, o) in old.into_iter().enumerate() {
        // SAFETY: as above.
        let slot = unsafe { s.inspect().slot(VA.add(k as u64 * PAGE), 0) }.unwrap();
        Arm64::set_pte_at(&mmu, VA.add(k as u64 * PAGE), slot, o & !bits::CONT);
    }
    match m.check() {
        Err(CheckError::Conflict(c)) => assert_eq!(c.va, VA),
        other => panic!("not caught: {other:?}"),
    }
}

/// Has `cpu` cache the run at `VA`, then rewrites every entry of it in
/// place, one at a time (no break, no flush in between), as `f(raw)`, and
/// flushes the run: what an operation that changed a folded run entry by
/// entry without unfolding it would do.
fn rewrite_run_in_place(cpu: &SimMachine<Arm64>, s: &mut Space, f: impl Fn(u64) -> u64) {
    touch(cpu, VA, RUN);
    assert!(cpu.tlb_holds_run(VA));
    let mmu = s.mmu().clone();
    for k in 0..16 {
        // SAFETY: a leaf replaced by another leaf of the format at the same
        // output address (the broken part is doing it in place).
        let slot = unsafe { s.inspect().slot(VA.add(k * PAGE), 0) }.unwrap();
        let raw = slot.load(std::sync::atomic::Ordering::Relaxed);
        Arm64::set_pte_at(&mmu, VA.add(k * PAGE), slot, f(raw));
    }
    mmu.flush_tlb_range(TlbRange {
        start: VA,
        end: VA.add(RUN),
        stride_shift: 12,
        last_level: true,
    });
}

/// A memory-type change made entry by entry on a cached run: after the
/// flush the run agrees again, but the first write already gave the cached
/// run an entry of another memory type (Arm ARM rule RJQQTC: a lookup may
/// use either's attributes), which the simulator reports at that write.
#[test]
fn contpte_sim_catches_an_in_place_memory_type_change_of_a_cached_run_at_the_write() {
    let m = SimMachine::<Arm64>::with_cpus(2);
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    // SAFETY: the same complete hierarchy, on the simulated CPU 1.
    unsafe { m.cpu(1).mmu().install_root(s.root()) };
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // CPU 1 holds the run; CPU 0, which writes, does not.
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    rewrite_run_in_place(&m.cpu(1), &mut s, |raw| Arm64::modify_prot(raw, nc, 0));
    assert!(!m.tlb_holds_run(VA));
    match m.check_contiguous() {
        Err(c) => assert_eq!((c.va, c.index, c.cached_on), (VA, 0, Some(1))),
        other => panic!("not caught: {other:?}"),
    }
    assert!(m.check().is_err());
}

/// Clearing the hint entry by entry on a cached run (an unfold without
/// break-before-make): a valid entry without the hint inside a cached run
/// (Arm ARM rule RNGLXZ: a TLB conflict abort even with FEAT_BBM) is
/// reported at the first write.
#[test]
fn contpte_sim_catches_an_in_place_unfold_of_a_cached_run_at_the_write() {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    rewrite_run_in_place(&m, &mut s, |raw| raw & !bits::CONT);
    match m.check_contiguous() {
        Err(c) => {
            assert_eq!((c.va, c.index, c.cached_on), (VA, 0, Some(0)));
            assert!(!is_contiguous(c.raw));
        }
        other => panic!("not caught: {other:?}"),
    }
}

/// The correct sequences beside them: a permission change of whole cached
/// runs entry by entry in place (`change_protection_live`, and the
/// get-and-clear transaction of `change_protection`) lets the entries
/// differ only in permissions, and `0`, until the flush (rule RJQQTC), and
/// a memory-type change breaks the whole run at once: nothing is reported,
/// although a CPU fills through the runs after every single entry write.
#[test]
fn contpte_whole_run_permission_changes_in_place_are_accepted_while_cached() {
    let m = SimMachine::<Arm64>::new();
    let len = 2 * RUN;
    let mmu = Prober {
        inner: m.mmu(),
        machine: m.clone(),
        va: VA,
        len,
        on_write: true,
    };
    let s = AddressSpace::<Arm64, _, _>::new(mmu, m.alloc()).unwrap();
    // SAFETY: the prober forwards `install_root` to a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, len);
    // Writable and clean: the get-and-clear transaction, entry by entry.
    s.change_protection(VA, len, Prot::READ_WRITE | Prot::EXEC)
        .unwrap();
    m.check().unwrap();
    let live = pgtable_core::LiveOptions::IN_PLACE;
    s.change_protection_live(VA, len, Prot::READ_ONLY, live)
        .unwrap();
    m.check().unwrap();
    let nc = Prot::READ_ONLY.with_mem(MemType::NormalNonCacheable);
    s.change_protection(VA, len, nc).unwrap();
    m.check().unwrap();
    for k in 0..len / PAGE {
        let e = s.inspect().entry(VA.add(k * PAGE), 0).unwrap();
        assert!(is_contiguous(e));
        assert_eq!(Arm64::leaf_prot(e, 0), nc);
    }
}

/// A simulated MMU whose other CPU loads every page of `[va, va + len)`
/// right after each TLB flush (and, `on_write`, after each observed entry
/// write): it sees every intermediate state an operation exposes, so a
/// moment in which a folded run has valid entries that disagree (in output
/// address or memory type) is a TLB fill through a misprogrammed run.
struct Prober {
    inner: SimMmu<Arm64>,
    machine: SimMachine<Arm64>,
    va: VirtAddr,
    len: u64,
    on_write: bool,
}

impl Prober {
    fn probe(&self) {
        for k in 0..self.len / PAGE {
            // Faults are expected (cleared entries); conflicts are recorded
            // by the simulator.
            let _ = self.machine.access(self.va.add(k * PAGE), Access::READ);
        }
    }
}

// SAFETY: forwards every operation to the simulated MMU; the probes only
// read through the simulated walker.
unsafe impl Mmu for Prober {
    const OBSERVES_WRITES: bool = true;
    fn walker_barrier(&self) {
        self.inner.walker_barrier()
    }
    fn publish_barrier(&self) {
        self.inner.publish_barrier()
    }
    fn flush_tlb_range(&self, range: TlbRange) {
        self.inner.flush_tlb_range(range);
        self.probe();
    }
    fn flush_tlb_all(&self) {
        self.inner.flush_tlb_all();
        self.probe();
    }
    fn flush_tlb_mm(&self) {
        self.inner.flush_tlb_mm();
        self.probe();
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded.
        unsafe { self.inner.install_root(root) }
    }
    fn entry_written(&self, slot: &Slot, old: u64) {
        self.inner.entry_written(slot, old);
        if self.on_write {
            self.probe();
        }
    }
}

/// The break-before-make rule for the 16 entries: no flush of any
/// operation on folded runs (unfolding a run, a memory-type change of
/// whole runs, partial and whole protects, unmaps) exposes a run whose
/// valid entries disagree; a CPU probing the range at every flush finds
/// either the old run, the new one, or invalid entries.
#[test]
fn contpte_no_flush_exposes_a_run_with_disagreeing_entries() {
    let m = SimMachine::<Arm64>::new();
    let len = 4 * RUN;
    let mmu = Prober {
        inner: m.mmu(),
        machine: m.clone(),
        va: VA,
        len,
        on_write: false,
    };
    let s = AddressSpace::<Arm64, _, _>::new(mmu, m.alloc()).unwrap();
    // SAFETY: the prober forwards `install_root` to a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    touch(&m, VA, len);
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    s.change_protection(VA, 2 * RUN, nc).unwrap();
    m.check().unwrap();
    s.change_protection(VA.add(3 * PAGE), RUN, Prot::READ_WRITE)
        .unwrap();
    m.check().unwrap();
    s.change_protection(VA.add(2 * RUN + PAGE), PAGE, nc)
        .unwrap();
    m.check().unwrap();
    s.unmap(VA.add(3 * RUN + 5 * PAGE), PAGE).unwrap();
    m.check().unwrap();
    assert_eq!(
        s.translate(VA.add(RUN + 2 * PAGE)).unwrap().prot,
        Prot::READ_WRITE
    );
    assert_eq!(s.translate(VA.add(RUN + 3 * PAGE)).unwrap().prot, nc);
}

/// A user store, through the simulated TLB.
const USER_STORE: Access = Access {
    write: true,
    exec: false,
    user: true,
};

/// The check of a write fault on page `granted` of the run at `va`: the
/// pages other than `granted` that a user store reaches through the
/// simulated MMU (TLB included). A write fault grants its own page only.
fn stray_stores(m: &SimMachine<Arm64>, va: VirtAddr, granted: u64) -> Vec<u64> {
    (0..16)
        .filter(|&k| k != granted && m.access(va.add(k * PAGE), USER_STORE).is_ok())
        .collect()
}

/// A read-only folded run, cached whole.
fn read_only_run() -> (SimMachine<Arm64>, Space) {
    let (m, mut s) = machine();
    s.map(VA, PA, RUN, Prot::USER, MapOptions::PAGES).unwrap();
    touch(&m, VA, RUN);
    assert!(m.tlb_holds_run(VA));
    (m, s)
}

/// The correct write fault (the run unfolded, one entry made writable):
/// page 3 takes a store, no other page does, and the run check passes.
#[test]
fn contpte_sim_a_write_fault_grants_a_store_to_its_page_only() {
    let (m, mut s) = read_only_run();
    assert!(s
        .ptep_set_access_flags(VA.add(3 * PAGE), pgtable_core::FaultFlags::WRITE)
        .unwrap());
    m.check().unwrap();
    assert!(m.access(VA.add(3 * PAGE), USER_STORE).is_ok());
    assert_eq!(stray_stores(&m, VA, 3), Vec::<u64>::new());
    m.check().unwrap();
}

/// What `ptep_set_access_flags` did when the write permission went over
/// the whole run like its accessed/dirty state: every entry made writable
/// (the run stays consistent, so the run check cannot see it), and a store
/// to page 4 succeeds.
#[test]
fn contpte_sim_catches_a_write_fault_applied_to_the_whole_run() {
    let (m, s) = read_only_run();
    for k in 0..16 {
        let va = VA.add(k * PAGE);
        // SAFETY: a leaf of the run changed in place into a more permissive
        // leaf of the same output address; flushed below.
        let slot = unsafe { s.inspect().slot(va, 0) }.unwrap();
        let raw = slot.load(std::sync::atomic::Ordering::Relaxed);
        let rw = Arm64::mkdirty(Arm64::modify_prot(raw, Prot::USER | Prot::WRITE, 0), 0);
        Arm64::set_pte_at(s.mmu(), va, slot, rw);
    }
    s.mmu().flush_tlb_range(TlbRange {
        start: VA,
        end: VA.add(RUN),
        stride_shift: 12,
        last_level: true,
    });
    m.check().unwrap();
    assert_eq!(
        stray_stores(&m, VA, 3),
        (0..16).filter(|&k| k != 3).collect::<Vec<_>>()
    );
}

/// The other wrong fix: page 3 alone made writable with the hint kept.
/// The run's entries now disagree in their permissions, which the run
/// check reports.
#[test]
fn contpte_sim_catches_a_write_fault_that_keeps_the_hint() {
    let (m, s) = read_only_run();
    let va = VA.add(3 * PAGE);
    // SAFETY: one leaf of the run made writable in place; flushed below.
    let slot = unsafe { s.inspect().slot(va, 0) }.unwrap();
    let raw = slot.load(std::sync::atomic::Ordering::Relaxed);
    let rw = Arm64::modify_prot(raw, Prot::USER | Prot::WRITE, 0);
    assert!(is_contiguous(rw));
    Arm64::set_pte_at(s.mmu(), va, slot, rw);
    s.mmu().flush_tlb_range(TlbRange {
        start: va,
        end: va.add(PAGE),
        stride_shift: 12,
        last_level: true,
    });
    match m.check() {
        Err(CheckError::Contiguous(c)) => assert_eq!((c.va, c.height), (VA, 0)),
        other => panic!("not caught: {other:?}"),
    }
}

const BLOCK: u64 = 2 << 20;
const BLOCK_RUN: VirtAddr = VirtAddr(0x4000_0000);

/// The check of a report: the addresses a store reached through the
/// simulator that no report of `(va, size, dirty)` calls dirty. A caller
/// that trusts such a report drops the data of a page it takes for clean.
fn lost_stores(stored: &[VirtAddr], reports: &[(VirtAddr, u64, bool)]) -> Vec<VirtAddr> {
    stored
        .iter()
        .copied()
        .filter(|a| {
            !reports
                .iter()
                .any(|&(va, len, d)| d && (va.0..va.0 + len).contains(&a.0))
        })
        .collect()
}

/// A folded run of 2 MiB blocks on a machine whose hardware records the
/// dirty state of the run in its first entry, and stores into blocks 2
/// and 15: only block 0's own entry turns dirty.
fn stored_block_run() -> (SimMachine<Arm64>, Space, Vec<VirtAddr>) {
    let (m, mut s) = machine();
    s.map(
        BLOCK_RUN,
        PhysAddr(BLOCK_RUN.0),
        16 * BLOCK,
        Prot::USER | Prot::WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    m.set_run_ad_on_first_entry(true);
    let stored = vec![BLOCK_RUN.add(2 * BLOCK + 8), BLOCK_RUN.add(15 * BLOCK + 8)];
    store(&m, &stored);
    assert!(Arm64::is_dirty(s.inspect().entry(BLOCK_RUN, 1).unwrap()));
    assert!(!Arm64::is_dirty(
        s.inspect().entry(BLOCK_RUN.add(15 * BLOCK), 1).unwrap()
    ));
    (m, s, stored)
}

fn store(m: &SimMachine<Arm64>, at: &[VirtAddr]) {
    for &a in at {
        m.write_u64(a, 1).unwrap();
    }
}

/// The correct reports (`clear_refs` of part of the run from inside a
/// block, then `unmap_with` of the run) give every block the run's state:
/// no store is lost.
#[test]
fn contpte_sim_reports_see_a_store_recorded_in_another_entry_of_the_run() {
    let (m, mut s, stored) = stored_block_run();
    let mut reports = Vec::new();
    s.clear_refs(
        BLOCK_RUN.add(PAGE),
        2 * BLOCK,
        pgtable_core::ClearRefs::ALL,
        |e| reports.push((e.va(), BLOCK, e.dirty())),
    )
    .unwrap();
    m.check().unwrap();
    assert_eq!(lost_stores(&stored[..1], &reports), Vec::<VirtAddr>::new());
    store(&m, &stored);
    let mut reports = Vec::new();
    s.unmap_with(BLOCK_RUN, 16 * BLOCK, |r| {
        reports.push((r.va(), BLOCK, r.dirty()))
    })
    .unwrap();
    m.check().unwrap();
    assert_eq!(reports.len(), 16);
    assert_eq!(lost_stores(&stored, &reports), Vec::<VirtAddr>::new());
}

/// What `unmap_with` reported for a folded run of blocks before it ORed
/// the run's state: each block's own entry. The check finds both stores
/// lost (the hardware recorded them in block 0).
#[test]
fn contpte_sim_catches_a_report_of_each_blocks_own_state() {
    let (m, mut s, stored) = stored_block_run();
    let reports: Vec<_> = (0..16)
        .map(|k| {
            let va = BLOCK_RUN.add(k * BLOCK);
            (
                va,
                BLOCK,
                Arm64::is_dirty(s.inspect().entry(va, 1).unwrap()),
            )
        })
        .collect();
    s.unmap(BLOCK_RUN, 16 * BLOCK).unwrap();
    m.check().unwrap();
    assert_eq!(lost_stores(&stored, &reports), stored);
}

/// What `clear_refs` reported for part of a folded run of blocks from an
/// address inside a block: one report every 2 MiB from that address, so
/// the block holding the range's last byte is missed and its store lost.
#[test]
fn contpte_sim_catches_a_report_loop_that_skips_a_block() {
    let (m, s, stored) = stored_block_run();
    let (start, end) = (BLOCK_RUN.0 + PAGE, BLOCK_RUN.0 + PAGE + 2 * BLOCK);
    let (young, dirty) = (0..16).fold((false, false), |(y, d), k| {
        let raw = s.inspect().entry(BLOCK_RUN.add(k * BLOCK), 1).unwrap();
        (y | Arm64::is_young(raw), d | Arm64::is_dirty(raw))
    });
    assert!(young && dirty);
    let reports: Vec<_> = (start..end)
        .step_by(BLOCK as usize)
        .map(|v| (VirtAddr(v & !(BLOCK - 1)), BLOCK, dirty))
        .collect();
    m.check().unwrap();
    assert_eq!(lost_stores(&stored[..1], &reports), stored[..1].to_vec());
}
