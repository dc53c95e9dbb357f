//! The broken variants of the RISC-V rules the simulator models (see
//! pgtable-core's `sim` docs, "RISC-V fences"): each is a `HartMmu` on the
//! simulated hart with one fence wrong, and the simulator catches it,
//! while the same case with the right fences passes.
//!
//! The harts have Svvptc: without it the walker barrier after every
//! table's writes is `SFENCE.VMA x0, x0`, which drops every translation
//! and would hide a wrong range flush; with it the walker barrier is
//! `FENCE W, W`, so a change of a valid entry reaches the walker and
//! leaves the TLB only through the range flush under test.

use pgtable_core::contract::{Mmu, Slot, TlbRange};
use pgtable_core::sim::{CheckError, SimMachine};
use pgtable_core::{MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::{HartMmu, Sv48};

use crate::harts::{asid, install, Bug, SimFences};

/// The hart's MMU with Svvptc (see the module docs).
fn mmu(m: &SimMachine<Sv48>, cpu: usize, bug: Bug) -> HartMmu<SimFences<Sv48>> {
    // SAFETY: the simulated harts have Svvptc (`map_touch_protect`), and
    // nothing walks between a store and its fence in these cases.
    unsafe { crate::harts::mmu(m, cpu, bug).with_svvptc() }
}

const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);
const PAGES: u64 = 4;

/// Maps `PAGES` pages at `VA`, touches them, makes them read-only and
/// touches them again: the outcome of the simulator's check after each
/// step.
fn map_touch_protect<M: Mmu>(m: &SimMachine<Sv48>, mmu: M, prot: Prot) -> Result<(), CheckError> {
    m.set_svvptc(true);
    let mut s = install(m, mmu);
    s.map(VA, PA, PAGES * 0x1000, prot, MapOptions::PAGES)
        .unwrap();
    for i in 0..PAGES {
        let _ = m.read_u64(VirtAddr(VA.0 + i * 0x1000));
    }
    m.check()?;
    s.change_protection(
        VA,
        PAGES * 0x1000,
        Prot::READ_ONLY.union(prot.intersection(Prot::GLOBAL)),
    )
    .unwrap();
    m.check()?;
    for i in 0..PAGES {
        let _ = m.read_u64(VirtAddr(VA.0 + i * 0x1000));
    }
    m.check()
}

#[test]
fn the_right_fences_pass_untagged_tagged_and_with_svinval() {
    let m = SimMachine::<Sv48>::new();
    map_touch_protect(&m, mmu(&m, 0, Bug::None), Prot::READ_WRITE).unwrap();
    let m = SimMachine::<Sv48>::new();
    map_touch_protect(
        &m,
        mmu(&m, 0, Bug::None).with_asid(asid(3)),
        Prot::READ_WRITE,
    )
    .unwrap();
    let m = SimMachine::<Sv48>::new();
    // SAFETY: the simulated hart implements Svinval.
    let svinval = unsafe { mmu(&m, 0, Bug::None).with_svinval() };
    map_touch_protect(&m, svinval, Prot::READ_WRITE).unwrap();
    let m = SimMachine::<Sv48>::new();
    map_touch_protect(&m, mmu(&m, 0, Bug::None), Prot::READ_WRITE | Prot::GLOBAL).unwrap();
}

#[test]
fn a_pte_store_without_any_sfence_stays_invisible_to_the_walker() {
    // Without Svvptc even a new valid entry needs the fence.
    for bug in [Bug::NoSfence, Bug::None] {
        let m = SimMachine::<Sv48>::new();
        let mut s = install(&m, crate::harts::mmu(&m, 0, bug));
        s.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
            .unwrap();
        if bug == Bug::None {
            m.read_u64(VA).unwrap();
            m.check().unwrap();
        } else {
            assert!(m.read_u64(VA).is_err(), "the walker saw an unfenced store");
            assert!(matches!(m.check(), Err(CheckError::Pending(_))));
        }
    }
}

#[test]
fn a_change_without_the_sfence_by_address_leaves_a_stale_entry() {
    let m = SimMachine::<Sv48>::new();
    let r = map_touch_protect(&m, mmu(&m, 0, Bug::NoSfenceByAddress), Prot::READ_WRITE);
    assert!(matches!(r, Err(CheckError::Stale(_))), "{r:?}");
}

#[test]
fn an_sfence_by_the_wrong_asid_leaves_a_stale_entry() {
    let m = SimMachine::<Sv48>::new();
    let mmu = mmu(&m, 0, Bug::WrongAsid).with_asid(asid(3));
    let r = map_touch_protect(&m, mmu, Prot::READ_WRITE);
    assert!(matches!(r, Err(CheckError::Stale(_))), "{r:?}");
}

#[test]
fn a_global_entry_survives_the_fences_of_a_tagged_space() {
    // A tagged handle's range fences name the ASID, which skips global
    // entries: a tagged space must not hold global leaves.
    let m = SimMachine::<Sv48>::new();
    let mmu = mmu(&m, 0, Bug::None).with_asid(asid(3));
    let r = map_touch_protect(&m, mmu, Prot::READ_WRITE | Prot::GLOBAL);
    assert!(matches!(r, Err(CheckError::Stale(_))), "{r:?}");
}

#[test]
fn sinval_without_sfence_w_inval_leaves_the_store_pending() {
    let m = SimMachine::<Sv48>::new();
    // SAFETY: the simulated hart implements Svinval.
    let mmu = unsafe { mmu(&m, 0, Bug::NoWInval).with_svinval() };
    let r = map_touch_protect(&m, mmu, Prot::READ_WRITE);
    assert!(matches!(r, Err(CheckError::Pending(_))), "{r:?}");
}

#[test]
fn sinval_without_sfence_inval_ir_leaves_a_stale_entry() {
    let m = SimMachine::<Sv48>::new();
    // SAFETY: as above.
    let mmu = unsafe { mmu(&m, 0, Bug::NoInvalIr).with_svinval() };
    let r = map_touch_protect(&m, mmu, Prot::READ_WRITE);
    assert!(matches!(r, Err(CheckError::Stale(_))), "{r:?}");
}

/// A `HartMmu` whose range flushes cover too little: the first page of
/// the range only, or only leaves when tables changed.
struct Narrow {
    inner: HartMmu<SimFences<Sv48>>,
    tables_by_address: bool,
}

// SAFETY: a deliberately broken MMU, run on the simulator only.
unsafe impl Mmu for Narrow {
    const OBSERVES_WRITES: bool = true;

    fn walker_barrier(&self) {
        self.inner.walker_barrier();
    }

    fn publish_barrier(&self) {
        self.inner.publish_barrier();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        let r = if self.tables_by_address {
            TlbRange {
                last_level: true,
                ..range
            }
        } else {
            TlbRange {
                end: VirtAddr(range.start.0 + (1 << range.stride_shift)),
                ..range
            }
        };
        self.inner.flush_tlb_range(r);
    }

    fn flush_tlb_all(&self) {
        self.inner.flush_tlb_all();
    }

    fn flush_tlb_mm(&self) {
        self.inner.flush_tlb_mm();
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded.
        unsafe { self.inner.install_root(root) }
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.inner.entry_written(slot, old);
    }
}

#[test]
fn a_range_flush_of_the_first_page_only_leaves_the_others_stale() {
    let m = SimMachine::<Sv48>::new();
    let narrow = Narrow {
        inner: mmu(&m, 0, Bug::None),
        tables_by_address: false,
    };
    let r = map_touch_protect(&m, narrow, Prot::READ_WRITE);
    match r {
        Err(CheckError::Stale(s)) => assert_ne!(s.va, VA, "the flushed page was reported"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn freed_tables_fenced_by_address_leave_the_unlink_pending() {
    let m = SimMachine::<Sv48>::new();
    m.set_svvptc(true);
    let mut s = install(
        &m,
        Narrow {
            inner: mmu(&m, 0, Bug::None),
            tables_by_address: true,
        },
    );
    // Two pages under one PTE table: unmapping both frees the table.
    s.map(VA, PA, 0x2000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    m.check().unwrap();
    s.unmap(VA, 0x2000).unwrap();
    let r = m.check();
    assert!(
        matches!(r, Err(CheckError::Pending(_)) | Err(CheckError::Stale(_))),
        "{r:?}"
    );
    // The plan's own choice (a full fence when tables changed) passes.
    let m = SimMachine::<Sv48>::new();
    m.set_svvptc(true);
    let mut s = install(&m, mmu(&m, 0, Bug::None));
    s.map(VA, PA, 0x2000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    s.unmap(VA, 0x2000).unwrap();
    m.check().unwrap();
}

#[test]
fn past_the_ceiling_a_global_change_needs_the_flush_that_drops_globals() {
    // Past the ceiling pgtable-core flushes a change of global leaves
    // with `flush_tlb_all` (`SFENCE.VMA x0, x0`); as a by-ASID fence
    // (`x0, asid`, which keeps global entries) the global entry stays.
    let pages = pgtable_riscv::TLB_FLUSH_CEILING + 1;
    for bug in [Bug::None, Bug::AllByAsid] {
        let m = SimMachine::<Sv48>::new();
        m.set_svvptc(true);
        let mut s = install(&m, mmu(&m, 0, bug).with_asid(asid(3)));
        let prot = Prot::READ_WRITE | Prot::GLOBAL;
        s.map(VA, PA, pages << 12, prot, MapOptions::PAGES).unwrap();
        m.read_u64(VA).unwrap();
        let ro = Prot::READ_ONLY | Prot::GLOBAL;
        s.change_protection(VA, pages << 12, ro).unwrap();
        let r = m.check();
        if bug == Bug::None {
            r.unwrap();
        } else {
            match r {
                Err(CheckError::Stale(st)) => assert_eq!(st.va, VA),
                r => panic!("{r:?}"),
            }
        }
    }
}

#[test]
fn flush_tlb_all_by_asid_keeps_a_changed_global_entry() {
    for bug in [Bug::AllByAsid, Bug::None] {
        let m = SimMachine::<Sv48>::new();
        m.set_svvptc(true);
        let mut s = install(&m, mmu(&m, 0, bug));
        s.map(
            VA,
            PA,
            0x1000,
            Prot::READ_WRITE | Prot::GLOBAL,
            MapOptions::PAGES,
        )
        .unwrap();
        m.read_u64(VA).unwrap();
        // A kernel rewrites the global leaf read-only itself and flushes
        // everything (Linux `flush_tlb_all`).
        // SAFETY: the entry stays a leaf of the same page; the simulator
        // is told of the write and the flush follows.
        let slot = unsafe { s.inspect().slot(VA, 0) }.unwrap();
        let old = slot.load(core::sync::atomic::Ordering::Relaxed);
        let ro = old & !(1 << 2); // W
        slot.store(ro, core::sync::atomic::Ordering::Relaxed);
        let other = mmu(&m, 0, bug);
        other.entry_written(slot, old);
        other.flush_tlb_all();
        let r = m.check();
        if bug == Bug::None {
            r.unwrap();
        } else {
            assert!(matches!(r, Err(CheckError::Stale(_))), "{r:?}");
        }
    }
}
