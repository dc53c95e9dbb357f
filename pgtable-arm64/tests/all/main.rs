//! The integration tests of pgtable-arm64, one binary (the model test is
//! `tests/model.rs`): descriptor encodings, break-before-make, contiguous
//! runs, TLB maintenance, the translation regimes, and the cases
//! pgtable-testkit shares with the other crates, on the simulated machine.

#[macro_use]
mod asid_sim;
mod aspace;
mod bbm;
mod common;
mod conformance;
mod contpte;
mod contpte_sim;
mod descriptors;
mod entry;
mod flush_plan;
mod granule;
mod granule_regs;
mod granule_tlbi;
mod granules;
mod halves;
mod kernel_alloc;
mod kernel_half;
mod live;
mod ops;
mod ptdump;
mod sim_broken_granules;
mod smp_sim;
mod swfork;
