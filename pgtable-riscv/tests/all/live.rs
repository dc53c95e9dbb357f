//! Live kernel permission changes on RISC-V: in place (a hart may use the
//! old or the new PTE until the `SFENCE.VMA`, so no invalid step is
//! needed), splits included, never an invalid moment for a hart using the
//! range.

use pgtable_testkit::live;

use pgtable_riscv::{RiscvPaging, SVPBMT};

type Sv39 = RiscvPaging<3, SVPBMT>;
type Sv57 = RiscvPaging<5, SVPBMT>;

#[test]
fn a_live_permission_change_never_faults_a_cpu_using_the_range_sv39() {
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<Sv39>();
}

#[test]
fn a_live_permission_change_never_faults_a_cpu_using_the_range_sv57() {
    live::a_live_permission_change_never_faults_a_cpu_using_the_range::<Sv57>();
}

#[test]
fn memory_type_and_split_changes_are_made_in_place() {
    live::break_before_make_is_refused_unless_allowed::<Sv39>();
    live::break_before_make_is_refused_unless_allowed::<Sv57>();
}

#[test]
fn clear_then_commit_would_fault_a_cpu_using_the_range() {
    let o = live::change_under_agents::<Sv39>(live::Way::ClearThenCommit, 2);
    // The block is cleared before the commit in each change.
    assert!(o.gaps >= 2, "{}", o.gaps);
}

#[test]
fn a_live_change_out_of_memory_changes_nothing() {
    live::a_live_change_out_of_memory_changes_nothing::<Sv39>();
    live::a_live_change_out_of_memory_changes_nothing::<Sv57>();
}
