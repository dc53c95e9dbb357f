//! Random `map` / `unmap` / `change_protection` / `move_page_tables`
//! sequences on the simulated machine against a reference model, for the
//! RISC-V formats (Sv39, Sv48, Sv57; with Svpbmt, since the generator
//! draws every memory type). The engine is `pgtable_testkit::model`,
//! which also describes how to replay a failure and run the soak
//! (`cargo xtask soak`).

use pgtable_testkit::model;

use pgtable_riscv::{RiscvPaging, SVPBMT};

#[test]
fn model_riscv_sv39() {
    model::run_format::<RiscvPaging<3, SVPBMT>>("riscv-sv39", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_riscv_sv48() {
    model::run_format::<RiscvPaging<4, SVPBMT>>("riscv-sv48", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_riscv_sv57() {
    model::run_format::<RiscvPaging<5, SVPBMT>>("riscv-sv57", env!("CARGO_PKG_NAME"));
}
