//! Benchmarks of pgtable against its peer crates (unpublished).
//!
//! The library holds what the criterion benches (`benches/`) and the size
//! sweep (`src/bin/sweep.rs`) share: the [`harness`] (the subjects'
//! common interface, the fairness rules and the criterion groups), and the
//! peer subjects of each architecture ([`x86`], [`arm64`], [`riscv`], and
//! [`ptm`] for page_table_multiarch on each).
//!
//! `cargo xtask bench` runs them all and draws the report
//! (`target/bench-report/index.html`).

pub mod arm64;
pub mod harness;
pub mod ptm;
pub mod riscv;
pub mod x86;
