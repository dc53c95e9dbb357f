//! The flush plan and the walker barrier against the simulated machine:
//! an MMU that executes [`flush_plan`] with the privileged spec's meaning
//! of each fence (`SFENCE.VMA va` orders the *leaf* entries of `va` only;
//! `SFENCE.VMA x0, x0` everything) passes the conformance suite, and the
//! simulator catches the broken variants: a plan that flushes freed tables
//! by address, and a map without the walker barrier.

use pgtable_core::contract::{Arch, Mmu, Slot, TlbRange};
use pgtable_core::sim::{CheckError, Installed, SimMachine, SimMmu, SimSuiteMachine};
use pgtable_core::suite::{self, Config};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::{flush_plan, FlushCaps, FlushPlan, Sv39, Sv48, TLB_FLUSH_CEILING};

/// What the MMU gets wrong.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// Nothing: the plan as `RiscvMmu` executes it.
    None,
    /// The plan is made as if only leaves changed, so freed tables are
    /// flushed with `SFENCE.VMA va` (which orders leaf entries only).
    TablesByAddress,
    /// No walker barrier (no `SFENCE.VMA` after the PTE stores).
    NoWalkerBarrier,
}

/// An untagged hart whose flushes execute the pure plan on the simulator.
struct PlanMmu<A: Arch> {
    inner: SimMmu<A>,
    fault: Fault,
}

// SAFETY: every flush reaches the simulated machine at least as far as the
// spec's fence would, except for the deliberately broken variants, which
// run on the simulator only.
unsafe impl<A: Arch> Mmu for PlanMmu<A> {
    const OBSERVES_WRITES: bool = <SimMmu<A> as Mmu>::OBSERVES_WRITES;

    fn walker_barrier(&self) {
        if self.fault != Fault::NoWalkerBarrier {
            self.inner.walker_barrier();
        }
    }

    fn publish_barrier(&self) {
        self.inner.publish_barrier();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        let planned = match self.fault {
            Fault::TablesByAddress => TlbRange {
                last_level: true,
                ..range
            },
            _ => range,
        };
        match flush_plan(planned, TLB_FLUSH_CEILING, FlushCaps::default(), true) {
            FlushPlan::PerStride {
                start,
                stride_shift,
                count,
                ..
            }
            | FlushPlan::Svinval {
                start,
                stride_shift,
                count,
                ..
            } => {
                for k in 0..count {
                    let va = start.0.wrapping_add(k << stride_shift);
                    // `SFENCE.VMA va, x0`: the leaf entries of `va` only.
                    self.inner.flush_tlb_range(TlbRange {
                        start: VirtAddr(va),
                        end: VirtAddr(va.wrapping_add(1 << stride_shift)),
                        stride_shift,
                        last_level: true,
                    });
                }
            }
            FlushPlan::Asid(_) => self.inner.flush_tlb_mm(),
            FlushPlan::All => self.inner.flush_tlb_all(),
        }
    }

    fn flush_tlb_all(&self) {
        self.inner.flush_tlb_all();
    }

    /// Untagged: `SFENCE.VMA x0, x0`.
    fn flush_tlb_mm(&self) {
        self.inner.flush_tlb_all();
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.install_root(root) }
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.inner.entry_written(slot, old)
    }
}

type Space<A> = Installed<A, PlanMmu<A>, pgtable_core::sim::SimAlloc>;

fn space<A: Arch>(fault: Fault) -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let mmu = PlanMmu {
        inner: m.mmu(),
        fault,
    };
    let s = AddressSpace::new(mmu, m.alloc()).unwrap();
    // SAFETY: `PlanMmu` forwards `install_root` to a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

fn run_cases<A: Arch>(fault: Fault, only: &'static [&'static str]) -> (u32, Vec<String>) {
    let (m, mut s) = space::<A>(fault);
    let mut mach = SimSuiteMachine::new(m.clone()).with_echo(false);
    let cfg = Config {
        only,
        threshold_bytes: 64 << 10,
        big_moves: false,
        ..Config::DEFAULT
    };
    let sum = suite::run(&mut s, &mut mach, &cfg);
    (sum.failed, mach.failures().map(String::from).collect())
}

#[test]
fn the_flush_plan_executed_with_the_fence_semantics_passes_the_suite() {
    let (m, mut s) = space::<Sv48>(Fault::None);
    let mut mach = SimSuiteMachine::new(m.clone()).with_echo(false);
    let cfg = Config {
        threshold_bytes: 1 << 20,
        big_moves: false,
        ..Config::DEFAULT
    };
    let sum = suite::run(&mut s, &mut mach, &cfg);
    let fails: Vec<String> = mach.failures().map(String::from).collect();
    assert!(fails.is_empty(), "failed cases:\n{}", fails.join("\n"));
    assert_eq!((sum.failed, sum.skipped), (0, 0));
    // `unsampled`: the move cases a Miri run leaves out (0 otherwise).
    assert!(
        sum.passed + sum.unsampled >= 40,
        "only {} cases passed",
        sum.passed
    );
}

#[test]
fn freed_tables_flushed_by_address_leave_a_stale_walk_cache_entry() {
    let cases: &[&str] = &["unmap_hole_in_pages", "move_4m_align_pmd_pages"];
    let (failed, fails) = run_cases::<Sv39>(Fault::TablesByAddress, cases);
    assert!(failed > 0, "the broken plan went unnoticed");
    assert!(
        fails.iter().any(|l| l.contains("stale walk-cache entry")),
        "{fails:?}"
    );
    let (failed, fails) = run_cases::<Sv39>(Fault::None, cases);
    assert_eq!(failed, 0, "{fails:?}");
}

#[test]
fn a_pte_store_without_the_walker_barrier_is_not_seen_by_the_walker() {
    let va = VirtAddr(0x4000_5000);
    let (m, mut s) = space::<Sv39>(Fault::NoWalkerBarrier);
    s.map(
        va,
        PhysAddr(0x8000_0000),
        0x1000,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    assert!(m.read_u64(va).is_err(), "the walker saw an unfenced store");
    assert!(matches!(m.check(), Err(CheckError::Pending(_))));

    let (m, mut s) = space::<Sv39>(Fault::None);
    s.map(
        va,
        PhysAddr(0x8000_0000),
        0x1000,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    m.read_u64(va).unwrap();
    m.check().unwrap();
}
