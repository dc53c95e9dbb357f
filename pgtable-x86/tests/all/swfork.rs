//! Software entries (swap entries) and `copy_page_range` (fork) on the
//! simulated machine, for the x86 formats. The cases are
//! `pgtable_testkit::swfork`.

use pgtable_testkit::swfork;

use pgtable_x86::{X86_64La57, X86_64};

#[test]
fn encoding() {
    swfork::encoding::<X86_64>();
    swfork::encoding::<X86_64La57>();
}

#[test]
fn install_read_and_swap_in() {
    swfork::install_read_and_swap_in::<X86_64>();
    swfork::install_read_and_swap_in::<X86_64La57>();
}

#[test]
fn moves_keep_software_entries() {
    swfork::moves_keep_them::<X86_64>();
    swfork::moves_keep_them::<X86_64La57>();
}

#[test]
fn protect_keeps_software_entries() {
    swfork::protect_keeps_them::<X86_64>();
}

#[test]
fn unmap_clears_software_entries() {
    swfork::unmap_clears_them::<X86_64>();
}

#[test]
fn fork_cow_x86_64_4level() {
    swfork::fork_cow::<X86_64>();
}

#[test]
fn fork_cow_x86_64_5level() {
    swfork::fork_cow::<X86_64La57>();
}

#[test]
fn fork_shared() {
    swfork::fork_shared::<X86_64>();
}

#[test]
fn fork_partial_blocks() {
    swfork::fork_partial_blocks::<X86_64>();
}

#[test]
fn fork_fails_unchanged() {
    swfork::fork_fails_unchanged::<X86_64>();
}

#[test]
fn fork_race_keeps_dirty() {
    swfork::fork_race_keeps_dirty::<X86_64>(20);
    let (lost, set) = swfork::fork_direct_race::<X86_64>(50);
    assert_eq!(lost, 0, "dirty states lost ({set} set)");
    assert!(set > 0, "the agent never stored");
}
