//! Live kernel permission changes on x86-64 (Linux `__change_page_attr`):
//! in place, splits included (Intel SDM Vol. 3A 4.10.2.3), never an
//! invalid moment for a CPU using the range.

use pgtable_testkit::live;

use pgtable_x86::{X86_64La57, X86_64};

#[test]
fn a_live_permission_change_never_faults_a_cpu_using_the_range_4level() {
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<X86_64>();
}

#[test]
fn a_live_permission_change_never_faults_a_cpu_using_the_range_5level() {
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<X86_64La57>();
}

#[test]
fn memory_type_and_split_changes_are_made_in_place() {
    live::break_before_make_is_refused_unless_allowed::<X86_64>();
    live::break_before_make_is_refused_unless_allowed::<X86_64La57>();
}

#[test]
fn clear_then_commit_would_fault_a_cpu_using_the_range() {
    let o = live::change_under_agents::<X86_64>(live::Way::ClearThenCommit, 2);
    // The block is cleared before the commit in each change.
    assert!(o.gaps >= 2, "{}", o.gaps);
}

#[test]
fn a_live_change_out_of_memory_changes_nothing() {
    live::a_live_change_out_of_memory_changes_nothing::<X86_64>();
    live::a_live_change_out_of_memory_changes_nothing::<X86_64La57>();
}
