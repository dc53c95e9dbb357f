//! The integration tests of pgtable-x86, one binary (the model test is
//! `tests/model.rs`): entry encodings, the entry operations, TLB
//! shootdowns and PCIDs, the translation regimes, and the cases
//! pgtable-testkit shares with the other crates, on the simulated machine.

mod asid_sim;
mod aspace;
mod conformance;
mod encoding;
mod entry_ops;
mod flush_plan;
mod halves;
mod kernel_alloc;
mod kernel_half;
mod live;
mod ops;
mod pcid_sim;
mod ptdump;
mod shootdown;
mod sim;
mod swfork;
