//! Random `map` / `unmap` / `change_protection` / `move_page_tables`
//! sequences on the simulated machine against a reference model, for the
//! RISC-V formats (Sv39, Sv48, Sv57; with Svpbmt, since the generator
//! draws every memory type; and each with Svnapot, so that maps fold into
//! 64 KiB NAPOT runs and every partial change unfolds them). The engine is `pgtable_testkit::model`,
//! which also describes how to replay a failure and run the soak
//! (`cargo xtask soak`).

use pgtable_testkit::model;

use pgtable_riscv::{RiscvPaging, SVNAPOT, SVPBMT};

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

#[test]
fn model_riscv_sv39_svnapot() {
    model::run_format::<RiscvPaging<3, { SVPBMT | SVNAPOT }>>(
        "riscv-sv39-svnapot",
        env!("CARGO_PKG_NAME"),
    );
}

#[test]
fn model_riscv_sv48_svnapot() {
    model::run_format::<RiscvPaging<4, { SVPBMT | SVNAPOT }>>(
        "riscv-sv48-svnapot",
        env!("CARGO_PKG_NAME"),
    );
}

#[test]
fn model_riscv_sv57_svnapot() {
    model::run_format::<RiscvPaging<5, { SVPBMT | SVNAPOT }>>(
        "riscv-sv57-svnapot",
        env!("CARGO_PKG_NAME"),
    );
}
