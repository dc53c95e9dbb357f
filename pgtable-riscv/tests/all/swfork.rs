//! Software entries (swap entries) and `copy_page_range` (fork) on the
//! simulated machine, for the RISC-V formats. The cases are
//! `pgtable_testkit::swfork`.

use pgtable_testkit::swfork;

use pgtable_riscv::{Sv39, Sv48, Sv57};

#[test]
fn encoding() {
    swfork::encoding::<Sv39>();
    swfork::encoding::<Sv48>();
    swfork::encoding::<Sv57>();
}

#[test]
fn install_read_and_swap_in() {
    swfork::install_read_and_swap_in::<Sv39>();
    swfork::install_read_and_swap_in::<Sv57>();
}

#[test]
fn moves_keep_software_entries() {
    swfork::moves_keep_them::<Sv39>();
    swfork::moves_keep_them::<Sv57>();
}

#[test]
fn protect_keeps_software_entries() {
    swfork::protect_keeps_them::<Sv39>();
}

#[test]
fn unmap_clears_software_entries() {
    swfork::unmap_clears_them::<Sv39>();
}

#[test]
fn fork_cow_sv39() {
    swfork::fork_cow::<Sv39>();
}

#[test]
fn fork_cow_sv57() {
    swfork::fork_cow::<Sv57>();
}

#[test]
fn fork_shared() {
    swfork::fork_shared::<Sv39>();
}

#[test]
fn fork_partial_blocks() {
    swfork::fork_partial_blocks::<Sv39>();
}

#[test]
fn fork_fails_unchanged() {
    swfork::fork_fails_unchanged::<Sv39>();
}

#[test]
fn fork_race_keeps_dirty() {
    swfork::fork_race_keeps_dirty::<Sv39>(20);
    let (lost, set) = swfork::fork_direct_race::<Sv39>(50);
    assert_eq!(lost, 0, "dirty states lost ({set} set)");
    assert!(set > 0, "the agent never stored");
}
