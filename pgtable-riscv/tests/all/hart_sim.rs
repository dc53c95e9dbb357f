//! `HartMmu` on the simulated hart (pgtable-core `SimMachine::hart`,
//! whose fences have the privileged spec's reach): the conformance suite
//! passes untagged, tagged and with Svinval; the reach of each
//! `SFENCE.VMA` form; software accessed/dirty management (Svade); Svvptc.

use pgtable_core::contract::Mmu;
use pgtable_core::contract::{Access, AccessFault};
use pgtable_core::sim::SimFaultKind;
use pgtable_core::sim::{SimMachine, SimSuiteMachine};
use pgtable_core::suite::{self, Config};
use pgtable_core::{FaultFlags, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::{Sv39, Sv48, Sv57};

use crate::harts::{asid, install, mmu, Bug, Space};

fn suite_on<const L: u32, M: Mmu>(
    m: &SimMachine<pgtable_riscv::RiscvPaging<L>>,
    s: &mut Space<L, M>,
) {
    let mut mach = SimSuiteMachine::new(m.clone()).with_echo(false);
    let cfg = Config {
        threshold_bytes: 1 << 20,
        big_moves: false,
        ..Config::DEFAULT
    };
    let sum = suite::run(s, &mut mach, &cfg);
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
fn the_hart_mmu_passes_the_suite_untagged_on_sv39() {
    let m = SimMachine::<Sv39>::new();
    let mut s = install(&m, mmu(&m, 0, Bug::None));
    suite_on(&m, &mut s);
}

#[test]
fn the_hart_mmu_passes_the_suite_with_svinval_on_sv48() {
    let m = SimMachine::<Sv48>::new();
    // SAFETY: the simulated hart implements Svinval.
    let mut s = install(&m, unsafe { mmu(&m, 0, Bug::None).with_svinval() });
    suite_on(&m, &mut s);
    assert!(m.stats().flush_range > 0);
}

#[test]
fn the_hart_mmu_passes_the_suite_tagged_on_sv57() {
    let m = SimMachine::<Sv57>::new();
    let mut s = install(&m, mmu(&m, 0, Bug::None).with_asid(asid(7)));
    suite_on(&m, &mut s);
    assert_eq!(m.asid(), 7);
}

const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);

#[test]
fn sfence_by_asid_keeps_global_entries_and_x0_x0_drops_them() {
    let m = SimMachine::<Sv39>::new();
    let mut s = install(&m, mmu(&m, 0, Bug::None).with_asid(asid(5)));
    let g = VirtAddr(VA.0 + 0x1000);
    s.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    s.map(
        g,
        PhysAddr(PA.0 + 0x1000),
        0x1000,
        Prot::READ_WRITE | Prot::GLOBAL,
        MapOptions::PAGES,
    )
    .unwrap();
    m.read_u64(VA).unwrap();
    m.read_u64(g).unwrap();
    assert!(m.tlb_holds(VA) && m.tlb_holds(g));
    m.hart().sfence_vma(None, Some(5));
    assert!(
        !m.tlb_holds(VA),
        "SFENCE.VMA x0, asid kept the ASID's entry"
    );
    assert!(m.tlb_holds(g), "SFENCE.VMA x0, asid dropped a global entry");
    m.hart().sfence_vma(None, Some(6));
    assert!(m.tlb_holds(g));
    m.hart().sfence_vma(None, None);
    assert!(!m.tlb_holds(g), "SFENCE.VMA x0, x0 kept a global entry");
    m.check().unwrap();
}

#[test]
fn sfence_by_address_reaches_every_asid_only_with_x0() {
    let m = SimMachine::<Sv39>::new();
    let mut a = install(&m, mmu(&m, 0, Bug::None).with_asid(asid(1)));
    a.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let root_a = m.root().unwrap();
    let mut b = install(&m, mmu(&m, 0, Bug::None).with_asid(asid(2)));
    b.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let root_b = m.root().unwrap();
    // Fill both ASIDs' entries (no fence between: `satp` writes only).
    let h = m.hart();
    // SAFETY: the spaces' roots, tables of this machine.
    unsafe { h.write_satp(Some(root_a), 1) };
    m.read_u64(VA).unwrap();
    // SAFETY: as above.
    unsafe { h.write_satp(Some(root_b), 2) };
    m.read_u64(VA).unwrap();
    let full = m.tlb_len();
    assert_eq!(full, 6, "a leaf and two walk-cache entries per ASID");
    // `va, asid` of the other ASID: only that ASID's leaf goes.
    h.sfence_vma(Some(VA), Some(1));
    assert_eq!(m.tlb_len(), full - 1);
    assert!(m.tlb_holds(VA), "the current ASID's leaf went too");
    // `va, x0`: every ASID's leaf; the walk-cache entries stay.
    h.sfence_vma(Some(VA), None);
    assert!(!m.tlb_holds(VA));
    assert_eq!(
        m.tlb_len(),
        full - 2,
        "SFENCE.VMA va dropped walk-cache entries"
    );
    m.check().unwrap();
    drop(b);
    drop(a);
}

#[test]
fn a_leaf_store_is_ordered_by_sfence_va_and_a_table_link_only_by_x0() {
    let m = SimMachine::<Sv39>::new();
    let mut s = install(&m, mmu(&m, 0, Bug::None));
    s.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.check().unwrap();
    let h = m.hart();
    // SAFETY: 0 may be stored in any entry; the simulator is told below.
    let leaf = unsafe { s.inspect().slot(VA, 0) }.unwrap();
    let old = leaf.swap(0, core::sync::atomic::Ordering::Relaxed);
    h.entry_written(leaf, old);
    assert!(m.check_visible().is_err());
    h.sfence_vma(Some(VA), Some(3));
    m.check_visible().unwrap();
    leaf.store(old, core::sync::atomic::Ordering::Relaxed);
    h.entry_written(leaf, 0);
    h.sfence_vma(Some(VA), None);
    m.check().unwrap();
    // The PTE table's link: a non-leaf entry.
    // SAFETY: as above; the table stays allocated (the space owns it).
    let link = unsafe { s.inspect().slot(VA, 1) }.unwrap();
    let old = link.swap(0, core::sync::atomic::Ordering::Relaxed);
    h.entry_written(link, old);
    h.sfence_vma(Some(VA), None);
    assert!(
        m.check_visible().is_err(),
        "SFENCE.VMA va ordered a non-leaf store"
    );
    link.store(old, core::sync::atomic::Ordering::Relaxed);
    h.entry_written(link, 0);
    h.sfence_vma(None, None);
    m.check().unwrap();
}

const USER_W: Access = Access {
    write: true,
    exec: false,
    user: true,
};
const USER_R: Access = Access {
    write: false,
    exec: false,
    user: true,
};

#[test]
fn with_software_ad_a_store_to_a_clean_page_faults_until_the_kernel_sets_d() {
    let m = SimMachine::<Sv48>::new();
    m.set_software_ad(true);
    let mut s = install(&m, mmu(&m, 0, Bug::None).with_asid(asid(1)));
    s.map(
        VA,
        PA,
        0x1000,
        Prot::READ_WRITE | Prot::USER,
        MapOptions::PAGES,
    )
    .unwrap();
    // New user leaves have A set: a load works, a store needs D.
    m.access(VA, USER_R).unwrap();
    // SAFETY: read only.
    let before = unsafe { s.inspect().slot(VA, 0) }
        .unwrap()
        .load(core::sync::atomic::Ordering::Relaxed);
    let e = m.access(VA, USER_W).unwrap_err();
    assert_eq!(e.kind, SimFaultKind::Permission(AccessFault::AccessFlag));
    // SAFETY: read only.
    let after = unsafe { s.inspect().slot(VA, 0) }
        .unwrap()
        .load(core::sync::atomic::Ordering::Relaxed);
    assert_eq!(before, after, "a faulting access changed the entry");
    // The kernel's fault path.
    assert!(s.ptep_set_access_flags(VA, FaultFlags::DIRTY).unwrap());
    let (_, upd) = m.access(VA, USER_W).unwrap();
    assert!(!upd.dirty, "the walker set D itself");
    m.check().unwrap();
    // An old page: every access faults until A is set again.
    assert!(s.test_and_clear_young(VA).unwrap());
    let e = m.access(VA, USER_R).unwrap_err();
    assert_eq!(e.kind, SimFaultKind::Permission(AccessFault::AccessFlag));
    assert!(s.ptep_set_access_flags(VA, FaultFlags::ACCESS).unwrap());
    m.access(VA, USER_R).unwrap();
    m.check().unwrap();
}

#[test]
fn with_hardware_ad_the_walker_sets_d() {
    let m = SimMachine::<Sv48>::new();
    let mut s = install(&m, mmu(&m, 0, Bug::None).with_asid(asid(1)));
    s.map(
        VA,
        PA,
        0x1000,
        Prot::READ_WRITE | Prot::USER,
        MapOptions::PAGES,
    )
    .unwrap();
    let (_, upd) = m.access(VA, USER_W).unwrap();
    assert!(upd.dirty);
    m.check().unwrap();
}

#[test]
fn with_svvptc_a_new_valid_entry_needs_no_fence_but_a_change_does() {
    let m = SimMachine::<Sv39>::new();
    m.set_svvptc(true);
    // SAFETY: the simulated hart implements Svvptc, and nothing retries
    // faults here: the walks come after the stores.
    let mut s = install(&m, unsafe { mmu(&m, 0, Bug::None).with_svvptc() });
    s.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.read_u64(VA).unwrap();
    m.check().unwrap();
    // Without Svvptc the same barrier (FENCE W, W) leaves the stores
    // pending.
    let m = SimMachine::<Sv39>::new();
    // SAFETY: simulated; the missing extension is what the test shows.
    let mut s = install(&m, unsafe { mmu(&m, 0, Bug::None).with_svvptc() });
    s.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    assert!(m.read_u64(VA).is_err());
    assert!(m.check_visible().is_err());
}
