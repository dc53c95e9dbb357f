//! More address spaces than ASIDs on the simulator (the run is
//! `pgtable_testkit::asid_switch`): roll-overs must happen, every switch
//! must see only the current space's translations, and full flushes must
//! stay far below the number of switches.
#![cfg(feature = "sim")]

use pgtable_testkit::{asid_switch, miri_first, miri_scaled};

use asid_switch::{check_format, run, Glue};
use pgtable_core::test_format::TestFormat;

type T4 = TestFormat<4>;

#[test]
fn forty_spaces_share_fifteen_asids_without_a_stale_translation() {
    for &seed in miri_first(&[1, 2, 3, 0x5eed]) {
        let c = run::<T4>(seed, miri_scaled(3000), Glue::SwitchMm).unwrap();
        println!("seed {seed}: {c:?}");
        assert!(c.rollovers >= miri_scaled(10), "seed {seed}: {c:?}");
        // One CPU: one local flush per roll-over, and nothing else flushes
        // the whole TLB (the remaps flush one page by ASID).
        assert_eq!(c.local_flushes, c.rollovers, "seed {seed}");
        assert_eq!(c.machine_full_flushes, c.local_flushes, "seed {seed}");
        assert!(c.local_flushes * 5 < c.switches, "seed {seed}: {c:?}");
        assert!(c.remaps > miri_scaled(100), "seed {seed}: {c:?}");
    }
}

#[test]
fn skipping_the_rollover_flush_is_caught() {
    let err = run::<T4>(1, miri_scaled(3000), Glue::SkipRolloverFlush).unwrap_err();
    println!("{err}");
    assert!(err.contains("reads") || err.contains("stale"), "{err}");
}

#[test]
fn installing_before_the_new_asid_is_caught() {
    let err = run::<T4>(1, miri_scaled(3000), Glue::InstallBeforeTag).unwrap_err();
    assert!(err.contains("reads") || err.contains("stale"), "{err}");
}

#[test]
fn a_space_that_never_ran_flushes_nothing_before_its_first_switch_mm() {
    assert_eq!(asid_switch::unassigned_space::<T4>(), Ok(0));
}

#[test]
fn switch_mm_is_right_on_the_test_formats() {
    check_format::<T4>(&[7], miri_scaled(2000)).unwrap();
    check_format::<TestFormat<3>>(&[7], miri_scaled(2000)).unwrap();
    check_format::<TestFormat<5>>(&[7], miri_scaled(2000)).unwrap();
}

#[test]
fn an_unassigned_handle_installed_directly_becomes_untagged_and_flushes() {
    use pgtable_core::contract::{Mmu, TaggedMmu};
    use pgtable_core::sim::SimMachine;
    use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    let m = SimMachine::<T4>::new();
    let mut s = AddressSpace::<T4, _, _>::new(m.mmu_unassigned(), m.alloc()).unwrap();
    let va = VirtAddr(0x40_0000);
    let (a, b) = (PhysAddr(0x8000_0000), PhysAddr(0x8000_1000));
    m.phys_write_u64(a, 1);
    m.phys_write_u64(b, 2);
    s.map(va, a, 4096, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // SAFETY: simulated.
    unsafe { s.install() };
    assert_eq!(s.mmu().tag(), None);
    assert_eq!(m.asid(), 0);
    assert_eq!(m.read_u64(va), Ok(1)); // cached now
    let flushes = m.stats().flush_range;
    s.unmap(va, 4096).unwrap();
    assert_eq!(
        m.stats().flush_range,
        flushes + 1,
        "the unmap flushed nothing"
    );
    s.map(va, b, 4096, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    assert_eq!(m.read_u64(va), Ok(2));
    m.check().unwrap();
    m.mmu().flush_tlb_all();
    // SAFETY: simulated; nothing is cached any more.
    unsafe { s.deactivate() };
}
