//! More address spaces than ASIDs on the simulator with the RISC-V formats
//! (leaves without G are tagged with the `satp.ASID` of their space): the
//! run is `pgtable_testkit::asid_switch`.

use pgtable_testkit::{asid_switch, miri_first, miri_scaled};

use asid_switch::{check_format, run, Glue};
use pgtable_riscv::{Sv39, Sv48, Sv57};

#[test]
fn forty_spaces_share_fifteen_asids_with_the_riscv_formats() {
    for &seed in miri_first(&[1, 2]) {
        let c = run::<Sv48>(seed, miri_scaled(2000), Glue::SwitchMm).unwrap();
        assert!(c.rollovers >= miri_scaled(10), "seed {seed}: {c:?}");
        assert_eq!(c.local_flushes, c.rollovers, "seed {seed}");
        assert_eq!(c.machine_full_flushes, c.local_flushes, "seed {seed}");
        assert!(c.local_flushes * 5 < c.switches, "seed {seed}: {c:?}");
        let c = run::<Sv39>(seed, miri_scaled(2000), Glue::SwitchMm).unwrap();
        assert!(c.rollovers >= miri_scaled(10), "seed {seed}: {c:?}");
    }
}

#[test]
fn skipping_the_rollover_flush_is_caught_with_the_riscv_format() {
    let err = run::<Sv48>(1, miri_scaled(2000), Glue::SkipRolloverFlush).unwrap_err();
    assert!(err.contains("reads") || err.contains("stale"), "{err}");
}

#[test]
fn switch_mm_is_right_on_every_riscv_format() {
    check_format::<Sv48>(&[3], miri_scaled(2000)).unwrap();
    check_format::<Sv39>(&[3], miri_scaled(2000)).unwrap();
    check_format::<Sv57>(&[3], miri_scaled(2000)).unwrap();
}
