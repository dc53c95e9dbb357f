//! The address space: the handle (creation, installation, drop, the
//! kernel half and the two halves), the walker and the reservation every
//! operation is built on, table freeing, block splits, break-before-make
//! and the TLB gathers.

pub(crate) mod aspace;
pub(crate) mod gather;
pub(crate) mod half;
pub(crate) mod kernel_half;
pub(crate) mod mmu_gather;
pub(crate) mod table_attrs;
pub(crate) mod walker;
