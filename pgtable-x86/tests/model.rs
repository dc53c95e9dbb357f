//! Random sequences of every address-space operation (`map`, `unmap`,
//! `unmap_with`, `change_protection`, `move_page_tables`, harvesting,
//! faults, software entries, fork, live changes, gathers; kernel and user
//! spaces) on the simulated machine against a reference model, for the
//! x86-64 formats (4-level and 5-level LA57).
//! The engine is `pgtable_testkit::model`, which also describes how to
//! replay a failure and run the soak (`cargo xtask soak`).

use pgtable_testkit::model;

use pgtable_x86::{X86_64La57, X86_64};

#[test]
fn model_x86_64_4level() {
    model::run_format::<X86_64>("x86_64-4level", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_x86_64_5level_la57() {
    model::run_format::<X86_64La57>("x86_64-5level-la57", env!("CARGO_PKG_NAME"));
}
