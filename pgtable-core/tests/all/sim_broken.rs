//! Deliberately broken variants, each caught by the simulator: a dropped
//! TLB flush (stale entry), a flush that keeps walk caches when a table was
//! freed, a missing walker barrier (the walker still sees the old entry),
//! and a non-atomic read-modify-write of an entry racing the hardware (a
//! lost dirty bit), table entries without their hierarchical attributes
//! (user tables without PXNTable, kernel tables open to user mode), a
//! flush that reaches only the executing CPU on a machine with two (with
//! the CVE-2018-18281 race: a writer CPU storing into a moved and reused
//! frame), a user space writing the kernel half's shared entry and
//! flushing only its own CPU, a kernel-half table freed with a flush of
//! the current ASID only (left in another ASID's walk cache), a
//! `Prot::NONE` encoding the hardware still uses, a dropped flush after a
//! change to `Prot::NONE`, and an encoding the hardware decoder reads
//! differently from the format — with the correct variant beside each one
//! passing.
#![cfg(all(feature = "sim", feature = "suite"))]

use crate::common::{test_format_variant, ProbesOnly};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use pgtable_core::contract::{AccessFault, Arch, Format, Mmu, Slot, TableAlloc, TlbRange};
use pgtable_core::suite::{self, Config};
use pgtable_core::test_format::{TestFormat, DIRTY};
use pgtable_core::{
    sim::{CheckError, Installed, SimAlloc, SimFaultKind, SimMachine, SimMmu, SimSuiteMachine},
    MoveOptions,
};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

const K4: u64 = 4 << 10;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

type T4 = TestFormat<4>;

/// What a broken MMU wrapper leaves out.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Break {
    /// Every TLB flush is dropped.
    Flushes,
    /// Every walker barrier is dropped.
    Barriers,
    /// Every flush keeps the walk caches (as if always `last_level`).
    WalkCacheFlushes,
    /// Every publish barrier is dropped (a table may be linked before its
    /// contents are visible).
    Publish,
    /// Full flushes keep global entries (`flush_tlb_all` does only what
    /// `flush_tlb_mm` does: x86 MOV to CR3, arm64 `tlbi aside1is`).
    GlobalFlushes,
    /// Range flushes invalidate each page at its address sign-extended
    /// from bit 47, as an x86 `invlpg` of a 48-bit truncated address does
    /// under 5-level paging.
    Truncated48,
    /// Range and address-space flushes name another ASID than the address
    /// space's (the one `Broken::retag` gives).
    WrongAsid,
}

/// `va` sign-extended from bit 47 (what a 48-bit canonicalisation makes of
/// a 57-bit address).
fn truncate48(va: u64) -> u64 {
    ((va << 16) as i64 >> 16) as u64
}

/// An MMU that forwards to `M` except for what it breaks.
struct Broken<M> {
    inner: M,
    brk: Break,
    /// For [`Break::WrongAsid`]: the handle whose ASID the flushes name.
    retag: Option<fn(&M) -> M>,
}

impl<M> Broken<M> {
    fn new(inner: M, brk: Break) -> Broken<M> {
        Broken {
            inner,
            brk,
            retag: None,
        }
    }

    /// The handle flushes go through.
    fn flusher(&self) -> Option<M> {
        match (self.brk, self.retag) {
            (Break::WrongAsid, Some(f)) => Some(f(&self.inner)),
            _ => None,
        }
    }
}

// SAFETY: deliberately broken for these tests, on the simulator only: no
// hardware walker uses these tables.
unsafe impl<M: Mmu> Mmu for Broken<M> {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;

    fn walker_barrier(&self) {
        if self.brk != Break::Barriers {
            self.inner.walker_barrier();
        }
    }

    fn publish_barrier(&self) {
        if self.brk != Break::Publish {
            self.inner.publish_barrier();
        }
    }

    fn flush_tlb_mm(&self) {
        if let Some(wrong) = self.flusher() {
            return wrong.flush_tlb_mm();
        }
        match self.brk {
            Break::Flushes | Break::WalkCacheFlushes => self.flush_tlb_all(),
            _ => self.inner.flush_tlb_mm(),
        }
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        if let Some(wrong) = self.flusher() {
            return wrong.flush_tlb_range(range);
        }
        match self.brk {
            Break::Flushes => {}
            Break::WalkCacheFlushes => self.inner.flush_tlb_range(TlbRange {
                last_level: true,
                ..range
            }),
            Break::Barriers | Break::Publish | Break::GlobalFlushes | Break::WrongAsid => {
                self.inner.flush_tlb_range(range)
            }
            Break::Truncated48 if range.strides() > 64 => self.inner.flush_tlb_all(),
            Break::Truncated48 => {
                let stride = 1u64 << range.stride_shift;
                for k in 0..range.strides() {
                    let page = truncate48(range.start.0 + k * stride);
                    self.inner.flush_tlb_range(TlbRange {
                        start: VirtAddr(page),
                        end: VirtAddr(page.wrapping_add(stride)),
                        ..range
                    });
                }
            }
        }
    }

    fn flush_tlb_all(&self) {
        match self.brk {
            Break::Flushes => {}
            // Leaves only, everywhere.
            Break::WalkCacheFlushes => self.inner.flush_tlb_range(TlbRange {
                start: VirtAddr(0),
                end: VirtAddr(0),
                stride_shift: 12,
                last_level: true,
            }),
            Break::Barriers | Break::Publish | Break::Truncated48 | Break::WrongAsid => {
                self.inner.flush_tlb_all()
            }
            Break::GlobalFlushes => self.inner.flush_tlb_mm(),
        }
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.install_root(root) }
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.inner.entry_written(slot, old)
    }
}

type BrokenSpace<A = T4> = Installed<A, Broken<SimMmu<A>>, SimAlloc>;
type Space<A = T4> = Installed<A, SimMmu<A>, SimAlloc>;

fn broken(brk: Break) -> (SimMachine<T4>, BrokenSpace) {
    let m = SimMachine::<T4>::new();
    let inner = m.mmu();
    let s = AddressSpace::new(Broken::new(inner, brk), m.alloc()).unwrap();
    // SAFETY: `Broken` forwards `install_root` to a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

fn correct() -> (SimMachine<T4>, Space) {
    let m = SimMachine::<T4>::new();
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

/// The live leaf entry that maps `va`, for the tests that write entries
/// themselves, on purpose the wrong way.
///
/// # Safety
///
/// The caller stores only leaves (or 0) through it; the simulated machine
/// tolerates any missing barrier or flush (it reports it).
unsafe fn leaf_slot<A: Arch, M: Mmu>(s: &AddressSpace<A, M, SimAlloc>, va: VirtAddr) -> &Slot {
    // SAFETY: our caller's promise, and a simulated machine (every space
    // of this file is one).
    unsafe { s.inspect().slot(va, 0) }.unwrap()
}

const VA: VirtAddr = VirtAddr(G1 + 5 * K4);
const PA: PhysAddr = PhysAddr(0x8000_0000);
const PA2: PhysAddr = PhysAddr(0x9000_0000);

#[test]
fn a_dropped_flush_after_unmap_leaves_a_stale_entry_that_check_tlb_names() {
    let (m, mut s) = broken(Break::Flushes);
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA, 0x1111).unwrap();
    m.check().unwrap();
    s.unmap(VA, K4).unwrap();
    // The bug as a program sees it: the unmapped page is still accessible.
    assert_eq!(m.read_u64(VA).unwrap(), 0x1111);
    let stale = m.check_tlb().unwrap_err();
    assert_eq!((stale.va, stale.height, stale.leaf), (VA, 0, true));
    assert_eq!(stale.fresh, None);
    // Remapped elsewhere, the stale entry still reaches the old frame.
    m.phys_write_u64(PA2, 0x2222);
    s.map(VA, PA2, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    assert_eq!(m.read_u64(VA).unwrap(), 0x1111, "stale translation used");
    // The remap wrote new entries over cached ones without a flush: a
    // break-before-make conflict on top of the stale entry.
    assert!(matches!(
        m.check(),
        Err(CheckError::Conflict(_) | CheckError::Stale(_))
    ));
    assert!(m.check_tlb().is_err());

    // The correct MMU: the same steps leave nothing stale.
    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA, 0x1111).unwrap();
    s.unmap(VA, K4).unwrap();
    m.check().unwrap();
    assert!(m.read_u64(VA).is_err());
    m.phys_write_u64(PA2, 0x2222);
    s.map(VA, PA2, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    assert_eq!(m.read_u64(VA).unwrap(), 0x2222);
    m.check().unwrap();
}

#[test]
fn a_dropped_flush_after_write_protect_lets_stores_through_and_is_caught() {
    let (m, mut s) = broken(Break::Flushes);
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA, 1).unwrap();
    s.change_protection(VA, K4, Prot::READ_ONLY).unwrap();
    // The store goes through the stale writable entry.
    m.write_u64(VA, 2).unwrap();
    let stale = m.check_tlb().unwrap_err();
    assert_eq!(stale.va, VA);
    assert!(stale.fresh.is_some(), "still mapped, but read-only");

    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA, 1).unwrap();
    s.change_protection(VA, K4, Prot::READ_ONLY).unwrap();
    m.check().unwrap();
    assert_eq!(
        m.write_u64(VA, 2).unwrap_err().kind,
        SimFaultKind::Permission(AccessFault::Write)
    );
}

#[test]
fn a_flush_that_keeps_walk_caches_after_freeing_a_table_is_caught() {
    let (m, mut s) = broken(Break::WalkCacheFlushes);
    // A whole PTE table's worth of pages: unmapping them frees the table.
    let va = VirtAddr(G1 + M2);
    s.map(va, PA, M2, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(va).unwrap();
    let tables = m.live_tables();
    s.unmap(va, M2).unwrap();
    // The PTE, PMD and PUD tables all became empty and were freed.
    assert_eq!(m.live_tables(), tables - 3);
    let stale = m.check_tlb().unwrap_err();
    assert!(!stale.leaf, "a walk-cache entry: {stale:?}");
    assert_eq!(stale.fresh, None);
    // The walker follows the cached pointer into the freed table.
    assert!(matches!(
        m.read_u64(va).unwrap_err().kind,
        SimFaultKind::FreedTable(_)
    ));

    let (m, mut s) = correct();
    s.map(va, PA, M2, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(va).unwrap();
    s.unmap(va, M2).unwrap();
    m.check().unwrap();
    assert_eq!(
        m.read_u64(va).unwrap_err().kind,
        SimFaultKind::Translation { height: 3 }
    );
}

#[test]
fn a_missing_barrier_hides_the_new_mapping_from_the_walker() {
    let (m, mut s) = broken(Break::Barriers);
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // The walker still sees the old (empty) entries.
    assert!(matches!(
        m.read_u64(VA).unwrap_err().kind,
        SimFaultKind::Translation { .. }
    ));
    assert!(matches!(m.check(), Err(CheckError::Pending(_))));
    assert!(m.stats().stale_walker_reads > 0);

    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    m.check().unwrap();
}

test_format_variant!(
    /// The test format with a broken `set_pte_at`: it stores without the
    /// walker barrier its arch needs.
    NoBarrierSetPte,
    "test-no-barrier"
);

// SAFETY: the broken `set_pte_at` still stores the value it is given (it
// only skips the barrier); the rest is the generic fallback.
unsafe impl Arch for NoBarrierSetPte {
    fn set_pte_at<M: Mmu>(mmu: &M, _va: VirtAddr, slot: &Slot, pte: u64) {
        // BUG (on purpose): no `walker_barrier` after the store.
        pgtable_core::contract::generic::set_entry_nosync(mmu, slot, pte)
    }
}

#[test]
fn an_arch_whose_set_pte_at_skips_the_barrier_is_caught() {
    let m = SimMachine::<NoBarrierSetPte>::new();
    let s = AddressSpace::<NoBarrierSetPte, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    // The page next to VA shares its PTE table.
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let next = VirtAddr(VA.0 + K4);
    let leaf = NoBarrierSetPte::leaf(PA2, Prot::READ_WRITE, 0);
    // SAFETY: a leaf, stored by the arch's (broken) setter.
    NoBarrierSetPte::set_pte_at(s.mmu(), next, unsafe { leaf_slot(&s, next) }, leaf);
    assert_eq!(
        m.read_u64(next).unwrap_err().kind,
        SimFaultKind::Translation { height: 0 }
    );
    let p = m.check_visible().unwrap_err();
    assert_eq!((p.old, p.new), (0, leaf));

    // The generic `set_pte_at` of the test format issues the barrier.
    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let leaf = T4::leaf(PA2, Prot::READ_WRITE, 0);
    // SAFETY: a leaf, stored by the arch's setter.
    T4::set_pte_at(s.mmu(), next, unsafe { leaf_slot(&s, next) }, leaf);
    m.read_u64(next).unwrap();
    m.check().unwrap();
}

/// One "clean the page" step as software does it: take the entry's dirty
/// state and write it back clean (read-only then writable again would do
/// the same), returning whether the entry was dirty. `atomic` picks the
/// transaction (`ptep_modify_prot_start` = atomic swap) or the broken
/// load-then-store; `window` runs between the read and the write (where
/// the hardware may strike).
fn clean_entry(
    mmu: &SimMmu<T4>,
    va: VirtAddr,
    slot: &Slot,
    atomic: bool,
    window: impl FnOnce(),
) -> bool {
    let old = if atomic {
        T4::ptep_modify_prot_start(mmu, va, slot)
    } else {
        // BUG (on purpose): a plain load; the store below overwrites
        // whatever the hardware set in between.
        slot.load(Relaxed)
    };
    window();
    let new = T4::modify_prot(old, Prot::READ_WRITE, 0) & !DIRTY;
    if atomic {
        T4::ptep_modify_prot_commit(mmu, va, slot, old, new);
    } else {
        slot.store(new, Relaxed);
        mmu.walker_barrier();
    }
    // The clean entry must not stay cached as dirty.
    mmu.flush_tlb_range(TlbRange {
        start: va,
        end: VirtAddr(va.0 + K4),
        stride_shift: 12,
        last_level: true,
    });
    T4::is_dirty(old)
}

#[test]
fn a_non_atomic_entry_update_loses_the_dirty_bit_the_hardware_set() {
    for atomic in [false, true] {
        let (m, mut s) = correct();
        s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
        // SAFETY: `clean_entry` stores leaves only.
        let slot = unsafe { leaf_slot(&s, VA) };
        let mut hw_dirtied = 0;
        // The hardware stores to the page exactly inside the window.
        let seen = clean_entry(s.mmu(), VA, slot, atomic, || {
            if let Ok(u) = m.hw_touch(VA, true) {
                hw_dirtied += u64::from(u.dirty);
            }
        });
        let seen_now = T4::is_dirty(slot.load(Relaxed));
        // Every dirty state the hardware set is seen by software: in the
        // value it took out, or still in the entry.
        let accounted = u64::from(seen) + u64::from(seen_now);
        if atomic {
            // The entry was out of service: the store faulted (or used the
            // old translation) and set nothing that could be lost.
            assert_eq!(accounted, hw_dirtied, "atomic path lost nothing");
        } else {
            assert_eq!(hw_dirtied, 1, "the hardware dirtied the page");
            assert_eq!(accounted, 0, "and the plain store erased it");
        }
    }
}

#[test]
fn the_atomic_transaction_loses_no_dirty_bit_against_a_hardware_thread() {
    let (m, mut s) = correct();
    let len = 4 * K4;
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let agent = m.spawn_agent(VA, len, stop.clone());
    let mut seen = 0u64;
    let mut rounds = 0u64;
    // Run until the hardware has dirtied pages many times (bounded in time
    // for a starved agent thread on a loaded machine).
    let t0 = std::time::Instant::now();
    // A tenth of the rounds and stores under Miri.
    while t0.elapsed().as_secs() < 30
        && (m.stats().dirty_set < pgtable_testkit::miri_scaled(300)
            || rounds < pgtable_testkit::miri_scaled(1_000))
    {
        for p in 0..4 {
            let va = VirtAddr(VA.0 + p * K4);
            // SAFETY: `clean_entry` stores leaves only.
            let slot = unsafe { leaf_slot(&s, va) };
            seen += u64::from(clean_entry(s.mmu(), va, slot, true, || {}));
        }
        rounds += 1;
    }
    stop.store(true, Relaxed);
    let report = agent.join().unwrap();
    // What is still dirty in the entries counts as seen.
    s.walk(VA, len, |mp| seen += u64::from(T4::is_dirty(mp.entry)))
        .unwrap();
    assert!(
        report.dirty_set > pgtable_testkit::miri_scaled(100),
        "the race was exercised: {report:?}"
    );
    assert_eq!(seen, report.dirty_set, "no dirty bit lost: {report:?}");
    m.check().unwrap();
}

#[test]
fn the_suite_fails_on_an_mmu_that_drops_flushes_or_barriers() {
    for (brk, what) in [
        (Break::Flushes, "stale TLB entry"),
        (Break::Barriers, "missing barrier"),
        (Break::WalkCacheFlushes, "stale walk-cache entry"),
    ] {
        let (m, mut s) = broken(brk);
        let mut mach = SimSuiteMachine::new(m.clone()).with_echo(false);
        let cfg = Config {
            only: &[
                "map_4k_pages",
                "unmap_hole_in_pages",
                "move_4m_align_pmd_pages",
            ],
            threshold_bytes: 64 << 10,
            ..Config::DEFAULT
        };
        let sum = suite::run(&mut s, &mut mach, &cfg);
        assert!(sum.failed > 0, "{brk:?} went unnoticed: {:?}", mach.lines());
        assert!(
            mach.failures().any(|l| l.contains(what)),
            "{brk:?}: expected a failure mentioning {what:?}: {:?}",
            mach.lines()
        );
    }
}

/// Runs the suite's cases named `only*` with format `A` on a fresh machine
/// whose range flushes are truncated to 48 bits; returns the printed lines.
fn with_truncated_flushes<A: Arch>(only: &'static [&'static str]) -> Vec<String> {
    let m = SimMachine::<A>::new();
    let inner = m.mmu();
    let s = AddressSpace::new(Broken::new(inner, Break::Truncated48), m.alloc()).unwrap();
    // SAFETY: `Broken` forwards `install_root` to a simulated MMU.
    let mut s: BrokenSpace<A> = unsafe { Installed::new(s) };
    let mut mach = ProbesOnly::new(SimSuiteMachine::new(m.clone()).with_echo(false));
    let cfg = Config {
        only,
        ..Config::DEFAULT
    };
    suite::run(&mut s, &mut mach, &cfg);
    mach.sim.lines().to_vec()
}

#[test]
fn the_last_entries_cases_catch_a_flush_truncated_to_48_bits_with_57_bit_addresses() {
    // Each case on a fresh machine, so it meets only its own stale
    // translations; the accesses themselves see them (the simulator's
    // stale-TLB check is off): the old state still works.
    const CASES: [(&[&str], &str); 3] = [
        (
            &["last_entries_of_the_lower_half_change_protection"],
            "should fault but succeeded",
        ),
        (
            &["last_entries_of_the_lower_half_move"],
            "should fault but read",
        ),
        (
            &["last_entries_of_the_lower_half_unmap"],
            "should fault but read",
        ),
    ];
    for (only, probe) in CASES {
        let lines = with_truncated_flushes::<TestFormat<5>>(only);
        let fail = format!("FAIL {}: ", only[0]);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&fail) && l.contains(probe)),
            "no `{fail}.. {probe}` line: {lines:#?}"
        );
        assert_eq!(lines.last().unwrap(), "0 passed, 1 failed");
    }
    // With 48-bit addresses the truncation changes nothing: all pass.
    let lines = with_truncated_flushes::<T4>(&["last_entries_of_the_"]);
    assert_eq!(lines.last().unwrap(), "6 passed, 0 failed", "{lines:#?}");
}

#[test]
fn a_load_modify_store_loop_racing_a_hardware_thread_is_caught_losing_dirty_bits() {
    // The broken loop of the test above, against the real agent thread.
    // The race is timing dependent, so run epochs (agent started, loop,
    // agent stopped, books balanced) until one loses a bit; a loaded
    // machine gets many epochs.
    let (m, mut s) = correct();
    let len = 4 * K4;
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let t0 = std::time::Instant::now();
    let mut epochs = 0;
    let lost = loop {
        let stop = Arc::new(AtomicBool::new(false));
        let agent = m.spawn_agent(VA, len, stop.clone());
        let mut seen = 0u64;
        let e0 = std::time::Instant::now();
        while e0.elapsed().as_millis() < 300 {
            for p in 0..4 {
                let va = VirtAddr(VA.0 + p * K4);
                // SAFETY: `clean_entry` stores leaves only.
                let slot = unsafe { leaf_slot(&s, va) };
                seen += u64::from(clean_entry(s.mmu(), va, slot, false, || {}));
            }
        }
        stop.store(true, Relaxed);
        let report = agent.join().unwrap();
        // Whatever is still dirty counts as seen; then clean for the next
        // epoch (nothing races now).
        for p in 0..4 {
            let va = VirtAddr(VA.0 + p * K4);
            // SAFETY: `clean_entry` stores leaves only.
            let slot = unsafe { leaf_slot(&s, va) };
            seen += u64::from(clean_entry(s.mmu(), va, slot, true, || {}));
        }
        assert!(seen <= report.dirty_set, "more dirty states seen than set");
        epochs += 1;
        let lost = report.dirty_set - seen;
        if lost > 0 || t0.elapsed().as_secs() >= 60 {
            break lost;
        }
    };
    assert!(lost > 0, "no dirty bit lost in {epochs} epochs");
}

#[test]
fn a_table_linked_before_its_contents_are_published_is_caught() {
    // In a lazy-MMU scope no walker barrier separates a new table's
    // entries from the store that links it: only the publish barrier of
    // the populate operation orders them.
    let (m, mut s) = broken(Break::Publish);
    s.lazy_mmu(|s| s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES))
        .unwrap();
    let Err(CheckError::Unordered(u)) = m.check() else {
        panic!("unordered link not reported: {:?}", m.check());
    };
    assert!(m.live_tables() > 1 && u.table != s.root());

    let (m, mut s) = correct();
    s.lazy_mmu(|s| s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES))
        .unwrap();
    m.check().unwrap();
    m.read_u64(VA).unwrap();
}

#[test]
fn a_full_flush_that_keeps_global_entries_leaves_an_unmapped_global_leaf_stale() {
    // 64 global pages: unmapping them all is past the flush ceiling (33),
    // so the gathered flush is a full one, which must drop global entries.
    let len = 64 * K4;
    let global = Prot::WRITE | Prot::GLOBAL;
    let (m, mut s) = broken(Break::GlobalFlushes);
    s.map(VA, PA, len, global, MapOptions::PAGES).unwrap();
    m.read_u64(VA).unwrap();
    s.unmap(VA, len).unwrap();
    // The bug as a program sees it: the freed page is still reachable.
    assert!(m.read_u64(VA).is_ok());
    let stale = m.check_tlb().unwrap_err();
    assert_eq!((stale.va, stale.leaf, stale.fresh), (VA, true, None));

    let (m, mut s) = correct();
    s.map(VA, PA, len, global, MapOptions::PAGES).unwrap();
    m.read_u64(VA).unwrap();
    s.unmap(VA, len).unwrap();
    m.check().unwrap();
    assert!(m.read_u64(VA).is_err());
    assert_eq!(s.stats().flush_all(), 1, "one full flush");
}

#[test]
fn a_flush_by_asid_keeps_global_entries_and_other_asids() {
    let m = SimMachine::<T4>::new();
    let mut a = AddressSpace::<T4, _, _>::new(m.mmu_with_asid(1), m.alloc()).unwrap();
    let mut b = AddressSpace::<T4, _, _>::new(m.mmu_with_asid(2), m.alloc()).unwrap();
    let global = Prot::WRITE | Prot::GLOBAL;
    a.map(VA, PA, K4, global, MapOptions::PAGES).unwrap();
    a.map(
        VirtAddr(VA.0 + K4),
        PA2,
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    b.map(
        VirtAddr(VA.0 + K4),
        PA,
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    // SAFETY: simulated.
    unsafe { a.install() };
    m.read_u64(VA).unwrap();
    m.read_u64(VirtAddr(VA.0 + K4)).unwrap();
    // SAFETY: simulated.
    unsafe { b.install() };
    m.read_u64(VirtAddr(VA.0 + K4)).unwrap();
    // A's global page is visible from B's ASID (B does not map it).
    assert!(m.tlb_holds(VA));
    assert_eq!(
        m.tlb_len(),
        3 + 3 + 3,
        "two leaves and three walk-cache entries per space"
    );
    a.mmu().flush_tlb_mm();
    // A's global leaf and all of B stay; A's non-global entries go.
    assert!(m.tlb_holds(VA) && m.tlb_holds(VirtAddr(VA.0 + K4)));
    assert_eq!(m.tlb_len(), 1 + 4);
    m.check().unwrap();
    a.mmu().flush_tlb_all();
    assert_eq!(m.tlb_len(), 0);
    // SAFETY: simulated, and nothing is cached any more.
    unsafe {
        a.deactivate();
        b.deactivate();
    }
}

#[test]
fn replacing_a_cached_entry_without_break_before_make_is_a_conflict() {
    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    let global = T4::leaf(PA, Prot::WRITE | Prot::GLOBAL, 0);
    // SAFETY: a leaf; a deliberate break-before-make violation on the
    // simulator.
    let slot = unsafe { leaf_slot(&s, VA) };
    // Non-global to global in place, with the old entry cached.
    T4::set_pte_at(s.mmu(), VA, slot, global);
    let Err(CheckError::Conflict(c)) = m.check() else {
        panic!("conflict not reported: {:?}", m.check());
    };
    assert_eq!((c.va, c.height), (VA, 0));

    // Break (clear), flush, make: no conflict.
    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    // SAFETY: only leaves and 0 are stored, with break-before-make.
    let slot = unsafe { leaf_slot(&s, VA) };
    T4::ptep_get_and_clear(s.mmu(), slot);
    s.mmu().flush_tlb_range(TlbRange {
        start: VA,
        end: VirtAddr(VA.0 + K4),
        stride_shift: 12,
        last_level: true,
    });
    T4::set_pte_at(s.mmu(), VA, slot, global);
    m.check().unwrap();
}

#[test]
fn change_protection_to_global_uses_break_before_make_for_pages_and_blocks() {
    let (m, mut s) = correct();
    let global = Prot::WRITE | Prot::GLOBAL;
    // A 4 KiB page, a 2 MiB block and a 1 GiB block, all cached.
    let pages = VirtAddr(G1);
    let pmd = VirtAddr(G1 + M2);
    let pud = VirtAddr(2 * G1);
    s.map(pages, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.map(
        pmd,
        PhysAddr(PA.0 + M2),
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    s.map(
        pud,
        PhysAddr(4 * G1),
        G1,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    for va in [pages, pmd, pud] {
        m.write_u64(va, va.0).unwrap();
    }
    for (va, len) in [(pages, K4), (pmd, M2), (pud, G1)] {
        s.change_protection(va, len, global).unwrap();
        m.check().unwrap();
        assert_eq!(s.translate(va).unwrap().prot, global);
        assert_eq!(m.read_u64(va).unwrap(), va.0);
    }
}

/// The handle of `mmu`'s machine tagged with the next ASID: a flush by
/// another address space's ASID.
fn next_asid(mmu: &SimMmu<T4>) -> SimMmu<T4> {
    mmu.machine().mmu_with_asid(mmu.asid().unwrap_or(0) + 1)
}

/// The handle tagged with the ASID installed now: what x86 `invlpg` or a
/// MOV to CR3 does for an address space that is not the current one (they
/// act on the current PCID).
fn current_asid(mmu: &SimMmu<T4>) -> SimMmu<T4> {
    let m = mmu.machine();
    m.mmu_with_asid(m.asid())
}

/// Address space `a` with ASID 1 (flushing through `retag`, if any) and
/// `b` with ASID 2; `a` maps `VA` to `PA`, `b` maps it to `PA2`.
#[allow(clippy::type_complexity)]
fn two_tagged(
    retag: Option<fn(&SimMmu<T4>) -> SimMmu<T4>>,
) -> (
    SimMachine<T4>,
    AddressSpace<T4, Broken<SimMmu<T4>>, SimAlloc>,
    AddressSpace<T4, SimMmu<T4>, SimAlloc>,
) {
    let m = SimMachine::<T4>::new();
    let brk = Broken {
        inner: m.mmu_with_asid(1),
        brk: Break::WrongAsid,
        retag,
    };
    let mut a = AddressSpace::<T4, _, _>::new(brk, m.alloc()).unwrap();
    let mut b = AddressSpace::<T4, _, _>::new(m.mmu_with_asid(2), m.alloc()).unwrap();
    a.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    b.map(VA, PA2, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.phys_write_u64(PA, 1);
    m.phys_write_u64(PA2, 2);
    (m, a, b)
}

/// Drops both spaces' tables.
fn release<M1: Mmu, M2: Mmu>(
    m: &SimMachine<T4>,
    mut a: AddressSpace<T4, M1, SimAlloc>,
    mut b: AddressSpace<T4, M2, SimAlloc>,
) {
    m.mmu().flush_tlb_all();
    // SAFETY: simulated, and nothing is cached any more.
    unsafe {
        a.deactivate();
        b.deactivate();
    }
}

#[test]
fn a_flush_naming_another_asid_leaves_the_address_spaces_entry_stale() {
    for (retag, correct) in [(Some(next_asid as fn(&_) -> _), false), (None, true)] {
        let (m, mut a, b) = two_tagged(retag);
        // SAFETY: simulated.
        unsafe { a.install() };
        assert_eq!(m.read_u64(VA).unwrap(), 1);
        a.unmap(VA, K4).unwrap();
        if correct {
            m.check().unwrap();
            assert!(m.read_u64(VA).is_err());
        } else {
            // The bug as a program sees it: the unmapped page is reachable.
            assert_eq!(m.read_u64(VA).unwrap(), 1);
            let stale = m.check_tlb().unwrap_err();
            assert_eq!((stale.va, stale.leaf, stale.fresh), (VA, true, None));
        }
        release(&m, a, b);
    }
}

/// A kernel MMU whose every flush reaches every ASID (x86 INVPCID type 2
/// or 3: what a kernel half shared by every PCID needs).
struct EveryAsid(SimMmu<T4>);

// SAFETY: on the simulator only; its flushes do more than asked.
unsafe impl Mmu for EveryAsid {
    const OBSERVES_WRITES: bool = true;
    fn walker_barrier(&self) {
        self.0.walker_barrier()
    }
    fn publish_barrier(&self) {
        self.0.publish_barrier()
    }
    fn flush_tlb_range(&self, _: TlbRange) {
        self.0.flush_tlb_all()
    }
    fn flush_tlb_mm(&self) {
        self.0.flush_tlb_all()
    }
    fn flush_tlb_all(&self) {
        self.0.flush_tlb_all()
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded.
        unsafe { self.0.install_root(root) }
    }
    fn entry_written(&self, slot: &Slot, old: u64) {
        self.0.entry_written(slot, old)
    }
}

/// The kernel's space (ASID 1, flushing through `kmmu`) and two user
/// spaces (ASIDs 2, 3) sharing its half read a global kernel page; the
/// kernel unmaps it while user space 3 is current, freeing the tables
/// above it, which user space 2's walk cached under its ASID.
fn kernel_table_freed_under_asids<M: Mmu>(m: &SimMachine<T4>, kmmu: M) -> Result<(), CheckError> {
    let kva = VirtAddr(0xffff_8000_4000_0000);
    let mut k = AddressSpace::<T4, _, _>::new_kernel(kmmu, m.alloc()).unwrap();
    k.map(kva, PA, K4, Prot::GLOBAL, MapOptions::PAGES).unwrap();
    let mut users: Vec<_> = [2, 3]
        .map(|asid| {
            // SAFETY: the kernel's space outlives the user spaces.
            unsafe { AddressSpace::<T4, _, _>::new_user(&k, m.mmu_with_asid(asid), m.alloc()) }
                .unwrap()
        })
        .into_iter()
        .collect();
    for u in &mut users {
        // SAFETY: simulated.
        unsafe { u.install() };
        m.read_u64(kva).unwrap();
    }
    k.unmap(kva, K4).unwrap();
    let checked = m.check();
    m.mmu().flush_tlb_all();
    for mut u in users {
        // SAFETY: simulated, and nothing is cached any more.
        unsafe { u.deactivate() };
    }
    checked
}

#[test]
fn a_kernel_table_freed_with_a_flush_of_the_current_asid_stays_cached_under_another() {
    // Walk caches are tagged by ASID (x86 PCID): a flush by the current
    // ASID (x86 `INVLPG`) reaches the global leaf everywhere, but the
    // table entries only under that ASID.
    let m = SimMachine::<T4>::new();
    let invlpg = Broken {
        inner: m.mmu_with_asid(1),
        brk: Break::WrongAsid,
        retag: Some(current_asid),
    };
    let Err(CheckError::Stale(stale)) = kernel_table_freed_under_asids(&m, invlpg) else {
        panic!("not caught");
    };
    assert!(!stale.leaf, "{stale}");
    let m = SimMachine::<T4>::new();
    let every = EveryAsid(m.mmu_with_asid(1));
    assert_eq!(kernel_table_freed_under_asids(&m, every), Ok(()));
}

#[test]
fn a_flush_of_a_space_that_is_not_current_by_the_current_asid_is_caught() {
    // x86 `invlpg` (and MOV to CR3) act on the current PCID: a space that
    // is not current must be flushed by its own PCID (INVPCID) or on its
    // next switch.
    for (retag, correct) in [(Some(current_asid as fn(&_) -> _), false), (None, true)] {
        let (m, mut a, mut b) = two_tagged(retag);
        // SAFETY: simulated.
        unsafe { a.install() };
        assert_eq!(m.read_u64(VA).unwrap(), 1);
        // SAFETY: simulated.
        unsafe { b.install() };
        assert_eq!(m.read_u64(VA).unwrap(), 2);
        // `a` is not current; its unmap flushes.
        a.unmap(VA, K4).unwrap();
        if correct {
            m.check().unwrap();
        } else {
            let stale = m.check_tlb().unwrap_err();
            assert_eq!((stale.va, stale.leaf, stale.fresh), (VA, true, None));
        }
        // SAFETY: simulated.
        unsafe { a.install() };
        assert_eq!(m.read_u64(VA).is_ok(), !correct);
        release(&m, a, b);
    }
}

#[test]
fn reusing_an_asid_after_a_rollover_without_the_local_flush_is_caught() {
    use pgtable_core::asid::{AsidAllocator, AsidContext};
    for honour_flush in [false, true] {
        let m = SimMachine::<T4>::new();
        // 2-bit ASIDs: 1, 2, 3; the fourth space rolls over.
        let mut asids = AsidAllocator::<1, 1>::new(2).unwrap();
        let mut spaces: Vec<_> = (0..4u64)
            .map(|i| {
                let mut s = AddressSpace::<T4, _, _>::new(m.mmu_with_asid(0), m.alloc()).unwrap();
                let pa = PhysAddr(PA.0 + i * K4);
                s.map(VA, pa, K4, Prot::READ_WRITE, MapOptions::PAGES)
                    .unwrap();
                m.phys_write_u64(pa, i);
                (s, AsidContext::NEW)
            })
            .collect();
        let mut first_error = None;
        for (i, (s, ctx)) in spaces.iter_mut().enumerate() {
            let sw = asids.switch_to(0, ctx).unwrap();
            if sw.flush_local && honour_flush {
                s.mmu().flush_tlb_all();
            }
            s.mmu().set_asid(sw.asid);
            // SAFETY: simulated.
            unsafe { s.install() };
            let seen = m.read_u64(VA).unwrap();
            if first_error.is_none() {
                first_error = m.check().err().map(|e| (i, seen, e));
            }
            if honour_flush {
                assert_eq!(seen, i as u64);
            }
        }
        assert_eq!(asids.rollovers(), 1);
        if honour_flush {
            assert_eq!(first_error, None);
        } else {
            // Space 3 got space 0's ASID and sees space 0's page.
            let Some((3, 0, CheckError::Stale(stale))) = first_error else {
                panic!("reuse not caught: {first_error:?}");
            };
            assert_eq!((stale.va, stale.leaf), (VA, true));
        }
        m.mmu().flush_tlb_all();
        for (mut s, _) in spaces {
            // SAFETY: simulated, and nothing is cached any more.
            unsafe { s.deactivate() };
        }
    }
}

test_format_variant!(
    /// The test format with table entries that drop their attributes
    /// (the trait's default `table_entry_attrs`): user tables without
    /// `PXNTable`, kernel tables open to user mode.
    NoTableAttrs,
    "test-no-table-attrs"
);

// SAFETY: every entry operation is the generic fallback.
unsafe impl Arch for NoTableAttrs {}

/// A kernel fetch from a kernel-executable leaf in a user space's half
/// must fault on the user tables' `PXNTable` (Arm ARM D8.4.3; Linux
/// `PMD_TABLE_PXN`). `Err` when the kernel could execute it.
fn kernel_cannot_execute_user_memory<A: Arch>() -> Result<(), String> {
    let m = SimMachine::<A>::new();
    let k = AddressSpace::<A, _, _>::new_kernel(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let k = unsafe { Installed::new(k) };
    // SAFETY: the user space is dropped before the kernel space.
    let u = unsafe { AddressSpace::<A, _, _>::new_user(&k, m.mmu(), m.alloc()) }.unwrap();
    // SAFETY: a simulated MMU.
    let mut u = unsafe { Installed::new(u) };
    u.map(VA, PA, K4, Prot::READ_EXEC, MapOptions::PAGES)
        .unwrap();
    let r = match m.exec(VA) {
        Err(f) if f.kind == SimFaultKind::Permission(AccessFault::Exec) => Ok(()),
        other => Err(format!("kernel fetch from the user half: {other:?}")),
    };
    m.check().unwrap();
    r
}

/// A user access to a user-accessible leaf of the kernel half must fault
/// on the kernel tables (arm64 `APTable[0]`, x86 U/S clear: Intel SDM
/// 4.6.1). `Err` when user mode could reach it.
fn user_cannot_reach_the_kernel_half<A: Arch>() -> Result<(), String> {
    let m = SimMachine::<A>::new();
    let k = AddressSpace::<A, _, _>::new_kernel(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut k = unsafe { Installed::new(k) };
    let kva = VirtAddr(0xffff_8000_4000_0000);
    let leaf = Prot::USER | Prot::WRITE;
    k.map(kva, PA, K4, leaf, MapOptions::PAGES).unwrap();
    let user = pgtable_core::contract::Access {
        user: true,
        ..pgtable_core::contract::Access::READ
    };
    let r = match m.access(kva, user) {
        Err(f) if f.kind == SimFaultKind::Permission(AccessFault::Privilege) => Ok(()),
        other => Err(format!("user access to the kernel half: {other:?}")),
    };
    m.check().unwrap();
    r
}

#[test]
fn user_tables_without_pxn_table_let_the_kernel_execute_user_memory_and_are_caught() {
    kernel_cannot_execute_user_memory::<T4>().unwrap();
    assert!(kernel_cannot_execute_user_memory::<NoTableAttrs>().is_err());
}

#[test]
fn kernel_tables_open_to_user_mode_are_caught() {
    user_cannot_reach_the_kernel_half::<T4>().unwrap();
    assert!(user_cannot_reach_the_kernel_half::<NoTableAttrs>().is_err());
}

use pgtable_testkit::live;

#[test]
fn a_live_kernel_change_through_clear_then_commit_is_caught() {
    // The correct variant: in place, no invalid moment, no fault.
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<T4>();
    // mprotect's path (`pmdp_modify_prot_start` / `ptep_modify_prot_start`
    // clear the entry before the commit): the block, and every page the
    // hardware may still write, is invalid for a moment in each change,
    // which a CPU running on the range would fault on. (Settled pages are
    // changed with a plain store there, as the agents made them.)
    let o = live::change_under_agents::<T4>(live::Way::ClearThenCommit, 2);
    assert!(o.gaps >= 2, "the block in each change: {}", o.gaps);
}

// ----- several CPUs: a flush must reach every CPU -----

/// A machine with two CPUs and an address space installed on both, whose
/// MMU executes on CPU 0 and flushes every CPU (`broadcast`) or CPU 0
/// only (the x86 `invlpg` / arm64 non-IS `tlbi` reach, without a
/// shootdown).
fn two_cpus(broadcast: bool) -> (SimMachine<T4>, Space) {
    let m = SimMachine::<T4>::with_cpus(2);
    let mmu = if broadcast {
        m.mmu()
    } else {
        m.mmu().local_only()
    };
    let s = AddressSpace::new(mmu, m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let s = unsafe { Installed::new(s) };
    // SAFETY: the same complete hierarchy, on the simulated CPU 1.
    unsafe { m.cpu(1).mmu().install_root(s.root()) };
    (m, s)
}

/// What the other CPU sees after `op` changed `VA` on CPU 0: the check's
/// error, and whether CPU 1 could still store through its cached entry.
fn other_cpu_after(broadcast: bool, op: &str) -> (Result<(), CheckError>, bool) {
    let (m, mut s) = two_cpus(broadcast);
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // CPU 1 caches a dirty translation; CPU 0 never touches the page.
    m.cpu(1).write_u64(VA, 7).unwrap();
    assert!(m.cpu(1).tlb_holds(VA) && !m.tlb_holds(VA));
    m.check().unwrap();
    match op {
        "unmap" => s.unmap(VA, K4).unwrap(),
        "protect" => s.change_protection(VA, K4, Prot::READ_ONLY).unwrap(),
        "move" => s
            .move_page_tables(VA, VirtAddr(3 * G1), K4, MoveOptions::DEFAULT)
            .unwrap(),
        _ => unreachable!(),
    }
    let checked = m.check();
    let stored = m.cpu(1).write_u64(VA, 8).is_ok();
    (checked, stored)
}

#[test]
fn a_flush_that_reaches_only_the_local_cpu_is_caught_on_the_other_cpu() {
    for op in ["unmap", "protect", "move"] {
        let (checked, stored) = other_cpu_after(false, op);
        let Err(CheckError::Stale(stale)) = checked else {
            panic!("{op}: a local-only flush passed the check: {checked:?}");
        };
        assert_eq!((stale.cpu, stale.va, stale.leaf), (1, VA, true), "{op}");
        assert!(stored, "{op}: CPU 1 stores through its stale entry");
        assert!(stale.to_string().starts_with("CPU 1: "), "{stale}");

        // A broadcast flush (arm64 `tlbi …is` + `dsb ish`) reaches CPU 1.
        let (checked, stored) = other_cpu_after(true, op);
        assert_eq!(checked, Ok(()), "{op}");
        assert!(!stored, "{op}: CPU 1 faults after the change");
    }
}

#[test]
fn each_cpu_fills_its_own_tlb_and_a_local_flush_leaves_the_others() {
    let (m, mut s) = two_cpus(true);
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    assert!(m.tlb_holds(VA) && !m.cpu(1).tlb_holds(VA));
    m.cpu(1).read_u64(VA).unwrap();
    assert!(m.cpu(1).tlb_holds(VA));
    // A local flush on CPU 1 empties CPU 1's entry only.
    m.cpu(1).mmu().local_only().flush_tlb_range(TlbRange {
        start: VA,
        end: VA.add(K4),
        stride_shift: 12,
        last_level: false,
    });
    assert!(m.tlb_holds(VA) && !m.cpu(1).tlb_holds(VA));
    m.check().unwrap();
    assert_eq!((m.cpus(), m.cpu(1).cpu_id()), (2, 1));
    assert_eq!(m.cpu(1).root(), Some(s.root()));
}

/// CVE-2018-18281 as a race: a writer CPU keeps storing through its cached
/// translation of `old` while CPU 0 moves the range away (mremap), then
/// frees the frame and reuses it. Returns the value the reused frame holds
/// once the writer has made several stores after the move returned, and
/// how many of those stores went through.
fn writer_races_a_move(broadcast: bool) -> (u64, u64) {
    use std::sync::atomic::AtomicU64;
    let (m, mut s) = two_cpus(broadcast);
    let old = VA;
    let new = VirtAddr(3 * G1);
    s.map(old, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let moved = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let (before, after, landed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let writer = {
        let cpu1 = m.cpu(1);
        let (moved, stop) = (moved.clone(), stop.clone());
        let (before, after, landed) = (before.clone(), after.clone(), landed.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            // Acquire: pairs with the Release stores below, so a store
            // counted as "after" was issued after the move returned.
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let was_moved = moved.load(std::sync::atomic::Ordering::Acquire);
                let ok = cpu1.write_u64(old, 0xbad0_0000 + i).is_ok();
                if was_moved {
                    landed.fetch_add(u64::from(ok), Relaxed);
                    after.fetch_add(1, Relaxed);
                } else {
                    before.fetch_add(u64::from(ok), Relaxed);
                }
                i += 1;
                std::thread::yield_now();
            }
        })
    };
    // The writer has a cached translation before the move starts.
    while before.load(Relaxed) == 0 {
        std::thread::yield_now();
    }
    s.move_page_tables(old, new, K4, MoveOptions::DEFAULT)
        .unwrap();
    // Release: the move's table writes happen before the writer sees it.
    moved.store(true, std::sync::atomic::Ordering::Release);
    // The frame leaves the address space and is reused for other data.
    s.unmap(new, K4).unwrap();
    m.phys_write_u64(PA, 0xfeed);
    let seen = after.load(Relaxed);
    while after.load(Relaxed) < seen + 8 {
        std::thread::yield_now();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    writer.join().unwrap();
    (m.phys_read_u64(PA), landed.load(Relaxed))
}

#[test]
fn a_local_only_flush_lets_a_writer_cpu_store_into_a_moved_and_reused_frame() {
    // CVE-2018-18281: the move's flush did not reach the writer's CPU.
    let (frame, landed) = writer_races_a_move(false);
    assert_ne!(frame, 0xfeed, "the reused frame was overwritten");
    assert!(landed > 0);

    // A broadcast flush: once the move returns no store lands anywhere.
    let (frame, landed) = writer_races_a_move(true);
    assert_eq!((frame, landed), (0xfeed, 0));
}

#[test]
fn hardware_agents_on_two_cpus_race_protection_changes_and_unmaps() {
    let (m, mut s) = two_cpus(true);
    let len = 8 * K4;
    s.map(VA, PA, len, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // CPU 0 and CPU 1 each run a hardware agent on the range.
    let agents = [
        m.spawn_agent(VA, len, stop.clone()),
        m.cpu(1).spawn_agent(VA, len, stop.clone()),
    ];
    // Only the agents fill the TLBs: go on until each CPU's has been seen
    // holding something (its walk cache).
    let (mut round, mut seen) = (0, [false; 2]);
    while round < 50 || (!(seen[0] && seen[1]) && round < 1_000_000) {
        round += 1;
        for (c, seen) in seen.iter_mut().enumerate() {
            *seen |= m.cpu(c).tlb_len() > 0;
        }
        let prot = if round % 2 == 0 {
            Prot::READ_ONLY
        } else {
            Prot::READ_WRITE
        };
        s.change_protection(VA, len, prot).unwrap();
        m.check().unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    s.unmap(VA, len).unwrap();
    m.check().unwrap();
    stop.store(true, Relaxed);
    for a in agents {
        let r = a.join().unwrap();
        assert!(r.touches > 0);
    }
    m.check().unwrap();
    for c in 0..2 {
        assert!(m.cpu(c).read_u64(VA).is_err(), "CPU {c}");
    }
}

/// An address space on the simulator, not installed.
type Plain = AddressSpace<T4, SimMmu<T4>, SimAlloc>;

/// Two CPUs: a kernel space with a read-only global page at the start of
/// the upper half (kernel text), installed and cached on CPU 1; a user
/// space of it installed on CPU 0, whose flushes reach CPU 0 only (a
/// space live on one CPU needs no more, for its own half).
fn kernel_text_seen_from_a_user_space() -> (SimMachine<T4>, VirtAddr, Plain, Plain) {
    let m = SimMachine::<T4>::with_cpus(2);
    let mut kernel = AddressSpace::<T4, _, _>::new_kernel(m.mmu(), m.alloc()).unwrap();
    let kva = VirtAddr(0xffff_8000_0000_0000);
    let text = Prot::READ_EXEC | Prot::GLOBAL;
    kernel.map(kva, PA, K4, text, MapOptions::PAGES).unwrap();
    // SAFETY: the complete kernel hierarchy, on the simulated CPU 1.
    unsafe { m.cpu(1).mmu().install_root(kernel.root()) };
    m.cpu(1).read_u64(kva).unwrap();
    let local = m.mmu().local_only();
    // SAFETY: the user space is dropped first (`release`).
    let mut user =
        unsafe { AddressSpace::<T4, _, _>::new_user(&kernel, local, m.alloc()) }.unwrap();
    // SAFETY: simulated.
    unsafe { user.install() };
    m.read_u64(kva).unwrap();
    (m, kva, kernel, user)
}

#[test]
fn a_user_space_changing_a_kernel_entry_flushes_only_its_own_cpus_and_is_caught() {
    // Broken: what a fault-time operation that skipped the space's range
    // check did from a user space (it walked the kernel half's shared
    // tables): the kernel's text made writable through the user's
    // handle, flushed on the user's CPU only; CPU 1 keeps the old text.
    let (m, kva, kernel, user) = kernel_text_seen_from_a_user_space();
    // SAFETY: a leaf's permission changes in place (what the operation
    // did); the entry stays a valid leaf.
    let slot = unsafe { kernel.inspect().slot(kva, 0) }.unwrap();
    let rw = T4::modify_prot(slot.load(Relaxed), Prot::READ_WRITE | Prot::GLOBAL, 0);
    T4::set_pte_at(user.mmu(), kva, slot, rw);
    user.mmu().flush_tlb_range(TlbRange {
        start: kva,
        end: kva.add(K4),
        stride_shift: 12,
        last_level: true,
    });
    let stale = m.check_tlb().unwrap_err();
    assert_eq!((stale.cpu, stale.va, stale.leaf), (1, kva, true));
    release(&m, user, kernel);

    // Correct: the user space refuses the kernel's address and changes
    // nothing; the kernel's own change reaches every CPU.
    let (m, kva, mut kernel, mut user) = kernel_text_seen_from_a_user_space();
    let before = kernel.inspect().entry(kva, 0);
    assert_eq!(
        user.ptep_set_access_flags(kva, pgtable_core::FaultFlags::WRITE),
        Err(pgtable_core::Error::OutOfRange(kva))
    );
    assert_eq!(kernel.inspect().entry(kva, 0), before);
    m.check().unwrap();
    kernel
        .ptep_set_access_flags(kva, pgtable_core::FaultFlags::WRITE)
        .unwrap();
    m.check().unwrap();
    release(&m, user, kernel);
}

/// The test format with a `Prot::NONE` that stays valid for the hardware:
/// software reads `NONE` back (the marker bit), but the walker, which
/// looks at the valid bit only, uses the entry.
#[derive(Clone, Copy, Debug, Default)]
struct NoneStaysValid;

impl NoneStaysValid {
    fn marked(raw: u64, none: bool) -> u64 {
        if none {
            raw | pgtable_core::test_format::PROT_NONE
        } else {
            raw & !pgtable_core::test_format::PROT_NONE
        }
    }
}

// SAFETY: every method is `TestFormat<4>`'s, with the PROT_NONE marker
// (bit 10, which no decision of `decode` depends on while the valid bit is
// set) added to a valid kernel read-only leaf instead of a cleared valid
// bit; tables and software entries are untouched.
unsafe impl Format for NoneStaysValid {
    const NAME: &'static str = "test-none-stays-valid";
    const LEVELS: u32 = 4;
    const PA_BITS: u32 = 48;
    fn leaf_allowed(h: u32) -> bool {
        T4::leaf_allowed(h)
    }
    fn decode(raw: u64, h: u32) -> pgtable_core::contract::Decoded {
        T4::decode(raw, h)
    }
    fn table_entry(pa: PhysAddr, h: u32) -> u64 {
        T4::table_entry(pa, h)
    }
    fn leaf_template(p: Prot, h: u32) -> u64 {
        Self::marked(T4::leaf_template(p.without_none(), h), p.protnone())
    }
    fn leaf_prot(raw: u64, h: u32) -> Prot {
        if raw & pgtable_core::test_format::PROT_NONE != 0 {
            Prot::NONE.with_mem(T4::leaf_prot(raw, h).mem())
        } else {
            T4::leaf_prot(raw, h)
        }
    }
    fn modify_prot(raw: u64, p: Prot, h: u32) -> u64 {
        Self::marked(T4::modify_prot(raw, p.without_none(), h), p.protnone())
    }
    fn split_leaf(raw: u64, h: u32) -> u64 {
        T4::split_leaf(raw, h)
    }
    fn is_young(raw: u64) -> bool {
        T4::is_young(raw)
    }
    fn is_dirty(raw: u64) -> bool {
        T4::is_dirty(raw)
    }
    fn is_protnone(raw: u64, h: u32) -> bool {
        T4::is_protnone(raw, h)
    }
    fn hw_access(raw: u64, h: u32, a: pgtable_core::contract::Access) -> Result<u64, AccessFault> {
        T4::hw_access(raw, h, a)
    }
}

// SAFETY: every entry operation is the generic fallback.
unsafe impl Arch for NoneStaysValid {}

/// `Err` with the access that went through a `Prot::NONE` page.
fn prot_none_page_faults<A: Arch>() -> Result<(), String> {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    s.map(VA, PA, K4, Prot::NONE, MapOptions::PAGES).unwrap();
    assert_eq!(s.ptep_get(VA).unwrap().prot(), Some(Prot::NONE));
    match m.read_u64(VA) {
        Ok(v) => Err(format!("read {v:#x} through a PROT_NONE page")),
        Err(f) if matches!(f.kind, SimFaultKind::Translation { .. }) => Ok(()),
        Err(f) => Err(format!("not a translation fault: {f:?}")),
    }
}

#[test]
fn a_prot_none_encoding_the_hardware_still_uses_is_caught() {
    let err = prot_none_page_faults::<NoneStaysValid>().unwrap_err();
    assert!(err.starts_with("read"), "{err}");
    prot_none_page_faults::<T4>().unwrap();
}

#[test]
fn a_dropped_flush_after_prot_none_leaves_the_page_accessible_and_is_caught() {
    let (m, mut s) = broken(Break::Flushes);
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA, 3).unwrap();
    s.change_protection(VA, K4, Prot::NONE).unwrap();
    // The old writable translation still serves the store.
    m.write_u64(VA, 4).unwrap();
    let stale = m.check_tlb().unwrap_err();
    assert_eq!(stale.va, VA);
    assert!(stale.fresh.is_some(), "still present, as PROT_NONE");

    let (m, mut s) = correct();
    s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(VA, 3).unwrap();
    s.change_protection(VA, K4, Prot::NONE).unwrap();
    m.check().unwrap();
    assert!(matches!(
        m.write_u64(VA, 4).unwrap_err().kind,
        SimFaultKind::Translation { .. }
    ));
    s.change_protection(VA, K4, Prot::READ_WRITE).unwrap();
    assert_eq!(m.read_u64(VA).unwrap(), 3);
    m.check().unwrap();
}

/// With 16 KiB pages and 48 bits the root has 2 entries: the walker
/// indexes it with VA bit 47 alone. A walk that indexes it with the 11
/// bits a full table would use (the root index not cut to `VA_BITS`)
/// links an upper-half table in an entry the hardware never reads: the
/// simulator, which forms its own index, faults where the broken walk
/// thinks the page is mapped.
#[test]
fn a_root_index_not_cut_to_the_va_bits_is_caught() {
    type K16 = TestFormat<4, 14, 48>;
    let m = SimMachine::<K16>::new();
    let s = AddressSpace::<K16, _, _>::new_in(pgtable_core::VaRange::Upper, m.mmu(), m.alloc())
        .unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    let va = VirtAddr(0xffff_8000_0000_0000);
    s.map(va, PA, 16 << 10, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.write_u64(va, 5).unwrap();
    // The correct walk linked root entry 1 (VA bit 47); the broken one
    // would have used entry 0x7ff (VA bits 57..47 of a sign-extended
    // address): move the link there, as it would have written it.
    let root = s.root();
    let entry = |i: usize| {
        // SAFETY: the root frame of the live space (2048 entries of a
        // 16 KiB frame); only this test writes it.
        unsafe { &*m.alloc().phys_to_virt(root).cast::<Slot>().as_ptr().add(i) }
    };
    let link = entry(1).swap(0, Relaxed);
    entry(0x7ff).store(link, Relaxed);
    s.mmu().flush_tlb_all();
    assert!(matches!(
        m.read_u64(va).unwrap_err().kind,
        SimFaultKind::Translation { .. }
    ));
    // Put back where the hardware reads it, the page is there again.
    entry(1).store(entry(0x7ff).swap(0, Relaxed), Relaxed);
    s.mmu().flush_tlb_all();
    assert_eq!(m.read_u64(va).unwrap(), 5);
    m.check().unwrap();
}

/// A "hardware" that reads every leaf one page further than the format
/// means: the format's encoding of the output address is wrong for it.
fn one_page_off(raw: u64, height: u32) -> pgtable_core::contract::Decoded {
    use pgtable_core::contract::Decoded;
    match T4::decode(raw, height) {
        Decoded::Leaf(pa) => Decoded::Leaf(PhysAddr(pa.0 + K4)),
        d => d,
    }
}

#[test]
fn an_encoding_the_hardware_decoder_reads_differently_is_caught() {
    let run = |decoder: Option<pgtable_core::sim::HwDecoder>| {
        let m = SimMachine::<T4>::new();
        m.set_hw_decoder(decoder);
        let s = AddressSpace::<T4, _, _>::new(m.mmu(), m.alloc()).unwrap();
        // SAFETY: a simulated MMU.
        let mut s = unsafe { Installed::new(s) };
        s.map(VA, PA, K4, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
        // The walk goes on as the format decodes.
        m.write_u64(VA, 3).unwrap();
        assert_eq!(m.phys_read_u64(PA), 3);
        m.check()
    };
    // The format's own decoding as the hardware's, and none: nothing to
    // report (tables, the leaf and the empty entries agree).
    run(Some(T4::decode)).unwrap();
    run(None).unwrap();
    match run(Some(one_page_off)) {
        Err(CheckError::HwDecode(d)) => {
            assert_eq!((d.va, d.height), (VA, 0));
            assert_eq!(d.format, pgtable_core::contract::Decoded::Leaf(PA));
            assert_eq!(
                d.hardware,
                pgtable_core::contract::Decoded::Leaf(PhysAddr(PA.0 + K4))
            );
        }
        other => panic!("expected a decoder mismatch, got {other:?}"),
    }
}
