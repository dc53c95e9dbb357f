//! The kernel half on arm64: the kernel space lives in TTBR1_EL1 and user
//! spaces in TTBR0_EL1, so nothing is shared at the table level; the same
//! calls as on x86 work.

use pgtable_testkit::kernel_half;

use pgtable_arm64::{Arm64, Arm64Va39};

#[test]
fn three_user_spaces_share_the_kernel_half_48() {
    kernel_half::three_user_spaces_share_the_kernel_half::<Arm64>();
}

#[test]
fn three_user_spaces_share_the_kernel_half_39() {
    kernel_half::three_user_spaces_share_the_kernel_half::<Arm64Va39>();
}

#[test]
fn a_kernel_half_needs_the_upper_half() {
    kernel_half::a_kernel_half_needs_the_upper_half::<Arm64>();
    kernel_half::a_kernel_half_needs_the_upper_half::<Arm64Va39>();
}

#[test]
fn table_attributes_guard_the_halves() {
    kernel_half::table_attributes_guard_the_halves::<Arm64>();
    kernel_half::table_attributes_guard_the_halves::<Arm64Va39>();
}

#[test]
fn table_attributes_keep_the_table_decodable() {
    kernel_half::table_attributes_keep_the_table_decodable::<Arm64>();
    kernel_half::table_attributes_keep_the_table_decodable::<Arm64Va39>();
}

use pgtable_testkit::ranges;

#[test]
fn every_operation_checks_the_space_s_range_48() {
    ranges::every_operation_checks_the_space_s_range::<Arm64>();
}

#[test]
fn every_operation_checks_the_space_s_range_39() {
    ranges::every_operation_checks_the_space_s_range::<Arm64Va39>();
}

#[test]
fn a_space_refuses_an_mmu_of_another_half() {
    kernel_half::a_space_refuses_an_mmu_of_another_half::<Arm64>();
    kernel_half::a_space_refuses_an_mmu_of_another_half::<Arm64Va39>();
}
