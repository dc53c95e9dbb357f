//! The PCID flush policy ([`pcid_flush_plan`], [`PcidCpu`]) executed on the
//! simulator, with the hardware's rule that `INVLPG` and MOV to CR3 reach
//! only the current PCID: address spaces that are not current are flushed
//! by INVPCID, or their flush is deferred to their next switch. A policy
//! that uses `INVLPG` / CR3 only (what an x86 MMU without PCIDs does) is
//! caught leaving another space's stale translation. The kernel's space,
//! whose half every user space links, is flushed for every PCID
//! ([`kernel_flush_plan`]); flushing it with `INVLPG` alone is caught
//! leaving a freed kernel table or a changed non-global kernel page cached
//! under another PCID.

use std::sync::Arc;

use pgtable_core::asid::{AsidAllocator, AsidContext};
use pgtable_core::contract::{Mmu, Slot, TlbRange};
use pgtable_core::sim::{SimAlloc, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_testkit::{miri_first, miri_scaled};
use pgtable_x86::{
    flush_plan, full_flush_plan, kernel_flush_plan, pcid_flush_plan, FlushKind, FlushPlan,
    OtherPcid, Pcid, PcidCpu, PcidFlush, X86_64,
};

type Sim = SimMmu<X86_64>;

/// An x86 MMU handle with a PCID, on the simulator.
struct PcidSim {
    sim: Sim,
    cpu: Arc<PcidCpu>,
    has_invpcid: bool,
    /// The bug: flush with INVLPG / CR3 as if the space were current.
    invlpg_only: bool,
    /// The bug: a switch keeps the no-flush bit although the PCID owes a
    /// flush.
    ignore_stale: bool,
    /// The kernel's space (untagged, its half shared by every PCID).
    kernel: bool,
}

impl PcidSim {
    fn pcid(&self) -> Pcid {
        self.sim
            .asid()
            .map_or(Pcid::ZERO, |a| Pcid::new(a).unwrap())
    }

    /// The simulated handle of PCID `p`.
    fn tagged(&self, p: Pcid) -> Sim {
        self.sim.machine().mmu_with_asid(p.get())
    }

    fn run(&self, kind: FlushKind) {
        let inv = self.has_invpcid;
        let current = Pcid::new(self.sim.machine().asid()).unwrap();
        let plan = if self.invlpg_only {
            PcidFlush {
                local: Some(match kind {
                    FlushKind::Range(r) => flush_plan(r, 33, inv, true),
                    FlushKind::Mm => full_flush_plan(inv, false),
                    FlushKind::All => full_flush_plan(inv, true),
                }),
                other: None,
            }
        } else if self.kernel {
            kernel_flush_plan(kind, 33, inv, true)
        } else {
            pcid_flush_plan(kind, Some(self.pcid()), current, 33, inv)
        };
        // INVLPG and MOV to CR3 act on the current PCID.
        let here = self.tagged(current);
        let pages = |start: VirtAddr, stride_shift: u32, count: u64| TlbRange {
            start,
            end: VirtAddr(start.0.wrapping_add(count << stride_shift)),
            stride_shift,
            last_level: false,
        };
        match plan.local {
            None => {}
            Some(FlushPlan::PerStride {
                start,
                stride_shift,
                count,
            }) => here.flush_tlb_range(pages(start, stride_shift, count)),
            Some(FlushPlan::ReloadCr3 | FlushPlan::InvpcidSingleContext) => here.flush_tlb_mm(),
            Some(FlushPlan::InvpcidAllContexts | FlushPlan::ToggleCr4Pge) => {
                self.sim.flush_tlb_all();
                self.cpu.clear();
            }
        }
        match plan.other {
            None => {}
            Some(OtherPcid::InvpcidAddress {
                pcid,
                start,
                stride_shift,
                count,
            }) => self
                .tagged(pcid)
                .flush_tlb_range(pages(start, stride_shift, count)),
            Some(OtherPcid::InvpcidSingleContext(pcid)) => self.tagged(pcid).flush_tlb_mm(),
            Some(OtherPcid::Defer(pcid)) => {
                self.cpu.mark_stale(pcid);
                self.tagged(pcid).defer_flush();
            }
            // INVPCID type 3; the simulator drops the global entries too
            // (more than the hardware does, never less).
            Some(OtherPcid::AllNonGlobal) => {
                self.sim.flush_tlb_all();
                self.cpu.clear();
            }
        }
    }
}

// SAFETY: on the simulator only; the flushes are the policy under test.
unsafe impl Mmu for PcidSim {
    const OBSERVES_WRITES: bool = true;
    fn walker_barrier(&self) {
        self.sim.walker_barrier()
    }
    fn publish_barrier(&self) {
        self.sim.publish_barrier()
    }
    fn flush_tlb_range(&self, range: TlbRange) {
        self.run(FlushKind::Range(range))
    }
    fn flush_tlb_mm(&self) {
        self.run(FlushKind::Mm)
    }
    fn flush_tlb_all(&self) {
        self.run(FlushKind::All)
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // MOV to CR3 without the no-flush bit when the PCID owes a flush.
        if self.cpu.take_stale(self.pcid()) && !self.ignore_stale {
            self.sim.flush_tlb_mm();
        }
        // SAFETY: forwarded to the simulator.
        unsafe { self.sim.install_root(root) }
    }
    fn entry_written(&self, slot: &Slot, old: u64) {
        self.sim.entry_written(slot, old)
    }
}

type Space = AddressSpace<X86_64, PcidSim, SimAlloc>;

const K4: u64 = 4 << 10;
const VA: VirtAddr = VirtAddr(0x40_0000);
const KVA: VirtAddr = VirtAddr(0xffff_8000_4000_0000);
const KPA: PhysAddr = PhysAddr(0x1_0000_0000);
const SPACES: usize = 20;

fn frame(i: usize, version: u64) -> PhysAddr {
    PhysAddr(0x8000_0000 + (i as u64 * 2 + version % 2) * K4)
}

/// xorshift64*: seeded, so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

/// A deliberate bug in the policy.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Bug {
    None,
    /// Flushes use INVLPG / CR3 as if the space were current.
    InvlpgOnly,
    /// A switch to a PCID that owes a flush keeps the no-flush bit.
    IgnoreStale,
}

/// 20 address spaces on 15 PCIDs (a 4-bit allocator), switched in random
/// order, with spaces that are not current remapping their page. Returns
/// the number of deferred flushes, or the first wrong translation or
/// failed check.
fn run(seed: u64, has_invpcid: bool, bug: Bug) -> Result<u64, String> {
    let m = SimMachine::<X86_64>::new();
    let cpu = Arc::new(PcidCpu::new());
    let mut pcids = AsidAllocator::<1, 1>::new(4).unwrap();
    let global = Prot::WRITE | Prot::GLOBAL;
    let mut spaces: Vec<(Space, AsidContext, u64)> = (0..SPACES)
        .map(|i| {
            let mmu = PcidSim {
                sim: m.mmu_with_asid(0),
                cpu: cpu.clone(),
                has_invpcid,
                invlpg_only: bug == Bug::InvlpgOnly,
                ignore_stale: bug == Bug::IgnoreStale,
                kernel: false,
            };
            let mut s = Space::new(mmu, m.alloc()).unwrap();
            s.map(VA, frame(i, 0), K4, Prot::READ_WRITE, MapOptions::PAGES)
                .unwrap();
            s.map(KVA, KPA, K4, global, MapOptions::PAGES).unwrap();
            m.phys_write_u64(frame(i, 0), (i as u64) << 8);
            (s, AsidContext::NEW, 0)
        })
        .collect();
    m.phys_write_u64(KPA, 0xcafe);
    let mut rng = Rng(seed);
    let mut current = None;
    let mut deferred = 0;
    let result = (|| {
        for step in 0..miri_scaled(1500) {
            let i = rng.below(SPACES);
            let (s, ctx, version) = &mut spaces[i];
            let sw = pcids.switch_to(0, ctx).unwrap();
            if sw.flush_local {
                // INVPCID type 3 or a CR4.PGE toggle: every PCID.
                s.mmu().sim.flush_tlb_all();
                cpu.clear();
            }
            s.mmu().sim.set_asid(sw.asid);
            // SAFETY: simulated.
            unsafe { s.install() };
            current = Some(i);
            let want = ((i as u64) << 8) | *version;
            let got = m.read_u64(VA).map_err(|e| format!("step {step}: {e}"))?;
            if got != want {
                return Err(format!(
                    "step {step}: space {i} reads {got:#x}, expected {want:#x}"
                ));
            }
            assert_eq!(m.read_u64(KVA), Ok(0xcafe));
            m.check().map_err(|e| format!("step {step}: {e}"))?;
            if rng.below(3) == 0 {
                let t = rng.below(SPACES);
                if Some(t) != current {
                    let (s, _, version) = &mut spaces[t];
                    *version += 1;
                    s.unmap(VA, K4).unwrap();
                    deferred += u64::from(cpu.is_stale(s.mmu().pcid()));
                    let pa = frame(t, *version);
                    s.map(VA, pa, K4, Prot::READ_WRITE, MapOptions::PAGES)
                        .unwrap();
                    m.phys_write_u64(pa, ((t as u64) << 8) | *version);
                    m.check()
                        .map_err(|e| format!("step {step}, remap of {t}: {e}"))?;
                }
            }
        }
        Ok(())
    })();
    m.mmu().flush_tlb_all();
    for (mut s, _, _) in spaces {
        // SAFETY: simulated, and nothing is cached any more.
        unsafe { s.deactivate() };
    }
    result.map(|()| deferred)
}

#[test]
fn spaces_that_are_not_current_are_flushed_by_invpcid() {
    for &seed in miri_first(&[1, 2, 3]) {
        assert_eq!(run(seed, true, Bug::None), Ok(0), "seed {seed}");
    }
}

#[test]
fn without_invpcid_their_flush_is_deferred_to_their_next_switch() {
    for &seed in miri_first(&[1, 2, 3]) {
        let deferred = run(seed, false, Bug::None).unwrap();
        assert!(
            deferred > miri_scaled(50),
            "seed {seed}: {deferred} deferred flushes"
        );
    }
}

#[test]
fn flushing_a_space_that_is_not_current_with_invlpg_only_is_caught() {
    for has_invpcid in [false, true] {
        let err = run(1, has_invpcid, Bug::InvlpgOnly).unwrap_err();
        assert!(err.contains("stale") || err.contains("reads"), "{err}");
    }
}

#[test]
fn a_switch_that_keeps_a_stale_pcids_entries_is_caught() {
    let err = run(1, false, Bug::IgnoreStale).unwrap_err();
    assert!(err.contains("stale") || err.contains("reads"), "{err}");
}

/// What the kernel changes in its half while a user space is current.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum KernelChange {
    /// A non-global kernel page becomes read-only.
    NonGlobalPage,
    /// A global kernel page is unmapped with the tables above it, which
    /// the walks of every user space cached under its PCID.
    FreedTables,
}

/// The kernel's space and three user spaces under PCIDs 1 to 3 that share
/// its half; each user space reads a kernel page, the kernel makes `change`
/// while user space 3 is current, flushing with `kernel_flush_plan` or,
/// when `invlpg_only`, with `INVLPG` / CR3 as an untagged MMU does; then
/// each user space is switched to (no-flush) and checked.
fn kernel_change_under_pcids(
    change: KernelChange,
    has_invpcid: bool,
    invlpg_only: bool,
) -> Result<(), String> {
    let m = SimMachine::<X86_64>::new();
    let cpu = Arc::new(PcidCpu::new());
    let mmu = |sim: Sim, kernel: bool| PcidSim {
        sim,
        cpu: cpu.clone(),
        has_invpcid,
        invlpg_only: kernel && invlpg_only,
        ignore_stale: false,
        kernel,
    };
    let mut k = Space::new_kernel(mmu(m.mmu(), true), m.alloc()).unwrap();
    let (page, prot) = match change {
        KernelChange::NonGlobalPage => (KVA, Prot::WRITE),
        KernelChange::FreedTables => (VirtAddr(0xffff_8000_8000_0000), Prot::GLOBAL),
    };
    k.map(page, KPA, K4, prot, MapOptions::PAGES).unwrap();
    m.phys_write_u64(KPA, 0xcafe);
    let mut users: Vec<Space> = (1..=3)
        .map(|p| {
            // SAFETY: the kernel's space outlives the user spaces (they
            // are deactivated and dropped first, below).
            unsafe { Space::new_user(&k, mmu(m.mmu_with_asid(p), false), m.alloc()) }.unwrap()
        })
        .collect();
    for u in &mut users {
        // SAFETY: simulated.
        unsafe { u.install() };
        assert_eq!(m.read_u64(page), Ok(0xcafe));
    }
    match change {
        KernelChange::NonGlobalPage => k.change_protection(page, K4, Prot::READ_ONLY).unwrap(),
        // Its page table and PMD table empty: both freed, one INVLPG.
        KernelChange::FreedTables => k.unmap(page, K4).unwrap(),
    }
    let result = (|| {
        for (i, u) in users.iter_mut().enumerate() {
            // SAFETY: simulated.
            unsafe { u.install() };
            m.check()
                .map_err(|e| format!("user space {}: {e}", i + 1))?;
            let wrote = m.write_u64(page, 1);
            if wrote.is_ok() {
                return Err(format!("user space {}: stored at {page}", i + 1));
            }
        }
        Ok(())
    })();
    m.mmu().flush_tlb_all();
    for mut u in users {
        // SAFETY: simulated, and nothing is cached any more.
        unsafe { u.deactivate() };
    }
    drop(k);
    result
}

#[test]
fn kernel_half_changes_reach_every_pcid() {
    for change in [KernelChange::NonGlobalPage, KernelChange::FreedTables] {
        for has_invpcid in [false, true] {
            assert_eq!(
                kernel_change_under_pcids(change, has_invpcid, false),
                Ok(()),
                "{change:?}, INVPCID {has_invpcid}"
            );
        }
    }
}

#[test]
fn kernel_half_changes_flushed_with_invlpg_only_are_caught() {
    for change in [KernelChange::NonGlobalPage, KernelChange::FreedTables] {
        for has_invpcid in [false, true] {
            let err = kernel_change_under_pcids(change, has_invpcid, true).unwrap_err();
            assert!(
                err.starts_with("user space 1: CPU 0: stale"),
                "{change:?}, INVPCID {has_invpcid}: {err}"
            );
        }
    }
}
