//! Live permission changes on the simulator, for every format (run
//! by the tests of pgtable-core and of each arch crate).
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgtable_core::contract::{Arch, BbmReason, Decoded, Mmu, Slot, TlbRange};
use pgtable_core::sim::{AgentReport, Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{
    AddressSpace, Error, LiveOptions, MapOptions, MemType, PhysAddr, Prot, VirtAddr,
};

/// A base page.
pub const PAGE: u64 = 4096;
/// A 2 MiB block.
pub const MIB2: u64 = 2 << 20;
/// 64 pages at 1 GiB, then a 2 MiB block at 1 GiB + 2 MiB.
pub const VA: VirtAddr = VirtAddr(1 << 30);
/// Pages mapped at [`VA`].
pub const PAGES: u64 = 64;
/// The 2 MiB block after the pages.
pub const BLOCK: VirtAddr = VirtAddr((1 << 30) + MIB2);

/// An MMU that counts the entry writes that turn a valid leaf into
/// something the walker cannot use: each is a moment in which another CPU
/// touching the page takes a translation fault.
pub struct GapWatch<A: Arch> {
    /// The simulated MMU every operation goes to.
    pub inner: SimMmu<A>,
    /// Writes that made a valid leaf unusable.
    pub gaps: Arc<AtomicU64>,
}

// SAFETY: forwards every operation to the simulated MMU; only observes.
unsafe impl<A: Arch> Mmu for GapWatch<A> {
    const OBSERVES_WRITES: bool = true;
    fn walker_barrier(&self) {
        self.inner.walker_barrier()
    }
    fn publish_barrier(&self) {
        self.inner.publish_barrier()
    }
    fn flush_tlb_range(&self, range: TlbRange) {
        self.inner.flush_tlb_range(range)
    }
    fn flush_tlb_all(&self) {
        self.inner.flush_tlb_all()
    }
    fn flush_tlb_mm(&self) {
        self.inner.flush_tlb_mm()
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.install_root(root) }
    }
    fn entry_written(&self, slot: &Slot, old: u64) {
        // Relaxed: the value just written (the simulator reads it too).
        let new = slot.load(Relaxed);
        let leaf = |raw| (0..A::LEVELS).any(|h| matches!(A::decode(raw, h), Decoded::Leaf(_)));
        // A block replaced by a table in place (a split) is no gap: the
        // walker reaches the same pages through the new table (on RISC-V a
        // table entry decodes as a table only, never as a leaf).
        let table = |raw| (1..A::LEVELS).any(|h| matches!(A::decode(raw, h), Decoded::Table(_)));
        if leaf(old) && !leaf(new) && !table(new) {
            self.gaps.fetch_add(1, Relaxed);
        }
        self.inner.entry_written(slot, old)
    }
}

/// An installed address space whose MMU watches for gaps.
pub type Space<A> = Installed<A, GapWatch<A>, SimAlloc>;

/// A machine with `PAGES` user-writable pages at [`VA`] and a 2 MiB block
/// at [`BLOCK`], clean (the hardware sets dirty on the first store).
pub fn setup<A: Arch>() -> (SimMachine<A>, Space<A>, Arc<AtomicU64>) {
    let m = SimMachine::<A>::new();
    let gaps = Arc::new(AtomicU64::new(0));
    let mmu = GapWatch {
        inner: m.mmu(),
        gaps: gaps.clone(),
    };
    let s = AddressSpace::new(mmu, m.alloc()).unwrap();
    // SAFETY: `GapWatch` forwards `install_root` to a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    let rw = user_rw();
    s.map(
        VA,
        PhysAddr(0x4000_0000),
        PAGES * PAGE,
        rw,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(BLOCK, PhysAddr(0x8000_0000), MIB2, rw, MapOptions::BLOCKS)
        .unwrap();
    assert_eq!(s.translate(BLOCK).unwrap().height, 1);
    (m, s, gaps)
}

/// User read-write.
pub fn user_rw() -> Prot {
    Prot::USER | Prot::WRITE
}

/// `user_rw` made executable: a permission-only change.
pub fn user_rwx() -> Prot {
    Prot::USER | Prot::WRITE | Prot::EXEC
}

/// Which way the test changes the protection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Way {
    /// `change_protection_live`.
    Live,
    /// `change_protection` (clear, then commit): what must not be used on
    /// live kernel mappings.
    ClearThenCommit,
}

/// What happened while the protection of the pages and the block changed
/// under a hardware agent touching them.
pub struct Outcome {
    /// Entry writes that left a leaf invalid for a moment.
    pub gaps: u64,
    /// The agents' reports (pages, block).
    pub agents: [AgentReport; 2],
}

/// Changes `[VA, +PAGES)` and the block to [`user_rwx`], `rounds` times
/// back and forth, while two agent threads load and store on them.
pub fn change_under_agents<A: Arch + Send>(way: Way, rounds: u32) -> Outcome {
    let (m, mut s, gaps) = setup::<A>();
    let stop = Arc::new(AtomicBool::new(false));
    let a = m.spawn_agent(VA, PAGES * PAGE, stop.clone());
    let b = m.spawn_agent(BLOCK, 16 * PAGE, stop.clone());
    // Let the agents make every page dirty once before the first change.
    let t0 = Instant::now();
    while m.stats().dirty_set < PAGES + 1 && t0.elapsed() < Duration::from_secs(30) {
        std::thread::yield_now();
    }
    // One dirty update per page and one for the block (a dirty entry stays
    // dirty through the changes, so none is counted twice).
    assert!(
        m.stats().dirty_set > PAGES,
        "the agents made every entry dirty"
    );
    let touched = m.stats().tlb_misses;
    for i in 0..rounds {
        let prot = if i % 2 == 0 { user_rwx() } else { user_rw() };
        for (va, len) in [(VA, PAGES * PAGE), (BLOCK, MIB2)] {
            match way {
                Way::Live => s
                    .change_protection_live(va, len, prot, LiveOptions::IN_PLACE)
                    .unwrap(),
                Way::ClearThenCommit => s.change_protection(va, len, prot).unwrap(),
            }
            m.check().unwrap();
        }
        // Let the agents run between the changes too (the mutex of the
        // simulated machine is not fair).
        let seen = m.stats().tlb_misses;
        let t0 = Instant::now();
        while m.stats().tlb_misses < seen + 8 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
    }
    stop.store(true, Relaxed);
    let agents = [a.join().unwrap(), b.join().unwrap()];
    m.check().unwrap();
    // No dirty bit lost: every page was stored to before the changes.
    let mut clean = Vec::new();
    s.walk(VA, PAGES * PAGE, |mp| {
        if !A::is_dirty(mp.entry) {
            clean.push(mp.va);
        }
    })
    .unwrap();
    assert!(clean.is_empty(), "dirty state lost at {clean:x?}");
    assert!(A::is_dirty(s.translate(BLOCK).unwrap().entry));
    assert!(
        m.stats().tlb_misses > touched,
        "the agents ran during the changes"
    );
    Outcome {
        gaps: gaps.load(Relaxed),
        agents,
    }
}

/// A live permission change never leaves an entry invalid, so the agents
/// on the range never fault, and loses no dirty bit.
pub fn a_live_permission_change_never_faults_a_cpu_using_the_range<A: Arch + Send>() {
    // Four rounds under Miri.
    let o = change_under_agents::<A>(Way::Live, crate::miri_scaled(40) as u32);
    assert_eq!(o.gaps, 0, "an entry was invalid for a moment");
    for r in o.agents {
        assert!(r.touches > 0);
        assert_eq!(r.faults, 0, "{r:?}");
    }
}

/// The live change refuses, before changing anything, what needs
/// break-before-make on this arch (memory type, non-global to global,
/// splitting a block on arm64), and makes it with `ALLOW_BBM`; without
/// break-before-make rules (x86) everything is done in place, block
/// splits included.
pub fn break_before_make_is_refused_unless_allowed<A: Arch + Send>() {
    let (m, mut s, gaps) = setup::<A>();
    let nc = user_rw().with_mem(MemType::NormalNonCacheable);
    // After `nc` is made: the same memory type, only global.
    let global = nc | Prot::GLOBAL;
    // Part of the block: a split.
    let part = VirtAddr(BLOCK.0 + 4 * PAGE);
    let cases = [
        (VA, PAGE, nc, BbmReason::MemoryType),
        (VA, PAGE, global, BbmReason::NonGlobalToGlobal),
        (part, PAGE, user_rwx(), BbmReason::BlockSplit),
    ];
    for (va, len, prot, why) in cases {
        let tables = s.inspect().count_tables();
        let before = s.translate(va).unwrap();
        let r = s.change_protection_live(va, len, prot, LiveOptions::IN_PLACE);
        if A::BREAK_BEFORE_MAKE {
            // A page of a folded run (arm64 maps VA folded): changing it
            // alone is refused for the run first.
            let e = s.ptep_get(va).unwrap();
            let why = match A::is_cont(e.raw(), e.height()) {
                true => BbmReason::ContiguousRun,
                false => why,
            };
            assert_eq!(r, Err(Error::BreakBeforeMake(va, why)), "{prot:?}");
            assert_eq!(s.translate(va), Some(before), "unchanged");
            assert_eq!(s.inspect().count_tables(), tables);
            assert_eq!(m.live_tables(), tables);
            s.change_protection_live(va, len, prot, LiveOptions::ALLOW_BBM)
                .unwrap();
        } else {
            r.unwrap();
            assert_eq!(gaps.load(Relaxed), 0, "in place on this arch");
        }
        assert_eq!(s.translate(va).unwrap().prot, prot);
        m.check().unwrap();
    }
    // The split kept the rest of the block as it was.
    assert_eq!(s.translate(BLOCK).unwrap().prot, user_rw());
    assert_eq!(
        s.translate(VirtAddr(part.0 + 8)).unwrap().pa,
        PhysAddr(0x8000_0000 + 4 * PAGE + 8)
    );
    m.check().unwrap();
}

/// A live change that needs a table (a block split) and cannot get one
/// fails with nothing changed and nothing leaked.
pub fn a_live_change_out_of_memory_changes_nothing<A: Arch + Send>() {
    let (m, mut s, _) = setup::<A>();
    let part = VirtAddr(BLOCK.0 + 4 * PAGE);
    let (tables, before) = (m.live_tables(), s.translate(part));
    m.fail_after(Some(0));
    assert_eq!(
        s.change_protection_live(part, PAGE, user_rwx(), LiveOptions::ALLOW_BBM),
        Err(Error::OutOfMemory)
    );
    m.fail_after(None);
    assert_eq!((m.live_tables(), s.translate(part)), (tables, before));
    m.check().unwrap();
}
