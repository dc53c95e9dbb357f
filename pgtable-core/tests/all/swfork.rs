//! Software entries (swap entries) and `copy_page_range` (fork) on the
//! simulated machine, for the test formats. The cases are shared with the
//! arch crates: `pgtable_testkit::swfork`.
#![cfg(feature = "sim")]

use pgtable_testkit::swfork;

use pgtable_core::test_format::TestFormat;

type T3 = TestFormat<3>;
type T4 = TestFormat<4>;
type T5 = TestFormat<5>;

#[test]
fn encoding() {
    swfork::encoding::<T3>();
    swfork::encoding::<T4>();
    swfork::encoding::<T5>();
}

#[test]
fn install_read_and_swap_in() {
    swfork::install_read_and_swap_in::<T3>();
    swfork::install_read_and_swap_in::<T4>();
    swfork::install_read_and_swap_in::<T5>();
}

#[test]
fn moves_keep_software_entries() {
    swfork::moves_keep_them::<T4>();
    swfork::moves_keep_them::<T5>();
}

#[test]
fn protect_keeps_software_entries() {
    swfork::protect_keeps_them::<T4>();
}

#[test]
fn unmap_clears_software_entries() {
    swfork::unmap_clears_them::<T4>();
}

#[test]
fn fork_cow() {
    swfork::fork_cow::<T3>();
    swfork::fork_cow::<T4>();
}

#[test]
fn fork_shared() {
    swfork::fork_shared::<T4>();
}

#[test]
fn fork_partial_blocks() {
    swfork::fork_partial_blocks::<T4>();
}

#[test]
fn fork_fails_unchanged() {
    swfork::fork_fails_unchanged::<T4>();
}

#[test]
fn fork_race_keeps_dirty() {
    swfork::fork_race_keeps_dirty::<T4>(20);
}

#[test]
fn fork_direct_race_keeps_dirty() {
    let (lost, set) = swfork::fork_direct_race::<T4>(100);
    assert_eq!(lost, 0, "dirty states lost ({set} set)");
    assert!(set > 0, "the agent never stored");
}
