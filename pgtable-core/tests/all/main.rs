//! The integration tests of pgtable-core, one binary (the model test is
//! `tests/model.rs`): the engine with the test formats, moves, protection
//! changes, the table reservation, ptdump, the ASID allocator, the
//! simulated machine and the broken variants it catches, and the cases
//! pgtable-testkit shares with the arch crates.

mod asid;
mod asid_sim;
mod common;
mod conformance;
mod engine;
mod geometry;
mod kernel_alloc;
mod kernel_half;
mod moves;
mod ops;
mod protect;
mod ptdump;
mod reservation;
mod sim_broken;
mod sim_machine;
mod swfork;
mod unwind;
