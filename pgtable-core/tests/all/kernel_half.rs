//! A kernel half shared by user spaces, on the test format (one root for
//! both halves, like x86).

use pgtable_testkit::kernel_half;

use pgtable_core::test_format::TestFormat;

#[test]
fn three_user_spaces_share_the_kernel_half_4_levels() {
    kernel_half::three_user_spaces_share_the_kernel_half::<TestFormat<4>>();
}

#[test]
fn three_user_spaces_share_the_kernel_half_5_levels() {
    kernel_half::three_user_spaces_share_the_kernel_half::<TestFormat<5>>();
}

#[test]
fn a_kernel_half_needs_the_upper_half() {
    kernel_half::a_kernel_half_needs_the_upper_half::<TestFormat<4>>();
}

#[test]
fn table_attributes_guard_the_halves() {
    kernel_half::table_attributes_guard_the_halves::<TestFormat<4>>();
}

#[test]
fn table_attributes_keep_the_table_decodable() {
    kernel_half::table_attributes_keep_the_table_decodable::<TestFormat<3>>();
    kernel_half::table_attributes_keep_the_table_decodable::<TestFormat<4>>();
    kernel_half::table_attributes_keep_the_table_decodable::<TestFormat<5>>();
}

use pgtable_testkit::ranges;

#[test]
fn every_operation_checks_the_space_s_range_4_levels() {
    ranges::every_operation_checks_the_space_s_range::<TestFormat<4>>();
}

#[test]
fn every_operation_checks_the_space_s_range_5_levels() {
    ranges::every_operation_checks_the_space_s_range::<TestFormat<5>>();
}

#[test]
fn a_space_refuses_an_mmu_of_another_half() {
    kernel_half::a_space_refuses_an_mmu_of_another_half::<TestFormat<3>>();
    kernel_half::a_space_refuses_an_mmu_of_another_half::<TestFormat<4>>();
    kernel_half::a_space_refuses_an_mmu_of_another_half::<TestFormat<5>>();
}
