//! The operations, each written once against the contract on the walker:
//! map, unmap (and its reporting form, and the teardown of a whole space), protection changes (and the live
//! form), translate and walk, fork's copy, software entries, replacing one
//! PTE in place, accessed/dirty
//! harvesting, the fault-time single-entry operations, contiguous runs and
//! `move_page_tables`.

pub(crate) mod contpte;
pub(crate) mod entry;
pub(crate) mod exit;
pub(crate) mod fault;
pub(crate) mod fork;
pub(crate) mod harvest;
pub(crate) mod live;
pub(crate) mod map;
pub(crate) mod moves;
pub(crate) mod protect;
pub(crate) mod replace;
pub(crate) mod swap;
pub(crate) mod unmap;
pub(crate) mod walk;
