//! Software entries (swap entries) and `copy_page_range` (fork) on the
//! simulated machine, for the arm64 formats. The cases are
//! `pgtable_testkit::swfork`.

use pgtable_testkit::swfork;

use pgtable_arm64::{Arm64, Arm64Va39};

#[test]
fn encoding() {
    swfork::encoding::<Arm64>();
    swfork::encoding::<Arm64Va39>();
}

#[test]
fn install_read_and_swap_in() {
    swfork::install_read_and_swap_in::<Arm64>();
    swfork::install_read_and_swap_in::<Arm64Va39>();
}

#[test]
fn moves_keep_software_entries() {
    swfork::moves_keep_them::<Arm64>();
    swfork::moves_keep_them::<Arm64Va39>();
}

#[test]
fn protect_keeps_software_entries() {
    swfork::protect_keeps_them::<Arm64>();
}

#[test]
fn unmap_clears_software_entries() {
    swfork::unmap_clears_them::<Arm64>();
}

#[test]
fn fork_cow_arm64_48bit() {
    swfork::fork_cow::<Arm64>();
}

#[test]
fn fork_cow_arm64_39bit() {
    swfork::fork_cow::<Arm64Va39>();
}

#[test]
fn fork_shared() {
    swfork::fork_shared::<Arm64>();
}

#[test]
fn fork_partial_blocks() {
    swfork::fork_partial_blocks::<Arm64>();
}

#[test]
fn fork_fails_unchanged() {
    swfork::fork_fails_unchanged::<Arm64>();
}

#[test]
fn fork_race_keeps_dirty() {
    swfork::fork_race_keeps_dirty::<Arm64>(20);
    let (lost, set) = swfork::fork_direct_race::<Arm64>(50);
    assert_eq!(lost, 0, "dirty states lost ({set} set)");
    assert!(set > 0, "the agent never stored");
}
