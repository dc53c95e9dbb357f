//! The integration tests of pgtable-riscv, one binary (the model test is
//! `tests/model.rs`): PTE encodings, Svnapot runs (and the simulator's
//! checks of them), the `SFENCE.VMA` plans, and
//! the cases pgtable-testkit shares with the other crates, on the
//! simulated machine.

mod asid_sim;
mod conformance;
mod encoding;
mod flush_plan;
mod hart_sim;
mod harts;
mod kernel_alloc;
mod kernel_half;
mod live;
mod napot;
mod napot_sim;
mod ops;
mod ptdump;
mod regs;
mod shootdown;
mod sim;
mod sim_broken;
mod swfork;
