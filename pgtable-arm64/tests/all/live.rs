//! Live kernel permission changes on arm64 (Linux `__change_memory_common`
//! → `change_page_range`): in place where `pgattr_change_is_safe` allows
//! it, `Error::BreakBeforeMake` before anything changes where it does not
//! (memory type, non-global to global, splitting a block: Arm ARM D8.16).

use pgtable_testkit::live;

use pgtable_arm64::{Arm64, Arm64Va39};

#[test]
fn a_live_permission_change_never_faults_a_cpu_using_the_range_48() {
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<Arm64>();
}

#[test]
fn a_live_permission_change_never_faults_a_cpu_using_the_range_39() {
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<Arm64Va39>();
}

#[test]
fn break_before_make_is_refused_unless_allowed() {
    live::break_before_make_is_refused_unless_allowed::<Arm64>();
    live::break_before_make_is_refused_unless_allowed::<Arm64Va39>();
}

#[test]
fn a_live_change_out_of_memory_changes_nothing() {
    live::a_live_change_out_of_memory_changes_nothing::<Arm64>();
    live::a_live_change_out_of_memory_changes_nothing::<Arm64Va39>();
}
