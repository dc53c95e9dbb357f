//! The kernel half on x86-64: user roots copy the kernel's PML4 (PML5)
//! entries 256–511, which link tables the kernel preallocated and never
//! frees while it lives.

use pgtable_testkit::kernel_half;

use pgtable_x86::{X86_64La57, X86_64};

#[test]
fn three_user_spaces_share_the_kernel_half_4level() {
    kernel_half::three_user_spaces_share_the_kernel_half::<X86_64>();
}

#[test]
fn three_user_spaces_share_the_kernel_half_5level() {
    kernel_half::three_user_spaces_share_the_kernel_half::<X86_64La57>();
}

#[test]
fn a_kernel_half_needs_the_upper_half() {
    kernel_half::a_kernel_half_needs_the_upper_half::<X86_64>();
    kernel_half::a_kernel_half_needs_the_upper_half::<X86_64La57>();
}

#[test]
fn table_attributes_guard_the_halves() {
    kernel_half::table_attributes_guard_the_halves::<X86_64>();
    kernel_half::table_attributes_guard_the_halves::<X86_64La57>();
}

#[test]
fn table_attributes_keep_the_table_decodable() {
    kernel_half::table_attributes_keep_the_table_decodable::<X86_64>();
    kernel_half::table_attributes_keep_the_table_decodable::<X86_64La57>();
}

use pgtable_testkit::ranges;

#[test]
fn every_operation_checks_the_space_s_range_4level() {
    ranges::every_operation_checks_the_space_s_range::<X86_64>();
}

#[test]
fn every_operation_checks_the_space_s_range_5level() {
    ranges::every_operation_checks_the_space_s_range::<X86_64La57>();
}

#[test]
fn a_space_refuses_an_mmu_of_another_half() {
    kernel_half::a_space_refuses_an_mmu_of_another_half::<X86_64>();
    kernel_half::a_space_refuses_an_mmu_of_another_half::<X86_64La57>();
}
