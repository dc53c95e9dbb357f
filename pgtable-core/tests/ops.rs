//! `MmuGather`, `unmap_with`, harvesting and the fault-time operations on
//! the simulated machine with the test format (3, 4 and 5 levels). The
//! cases are `tests/support/ops/mod.rs`, shared with the arch crates.
#![cfg(feature = "sim")]

#[path = "support/ops/mod.rs"]
#[macro_use]
mod ops;

use pgtable_core::test_format::TestFormat;

type T4 = TestFormat<4>;
type T3 = TestFormat<3>;
type T5 = TestFormat<5>;

ops_tests!(test4, T4);
ops_tests!(test3, T3);
ops_tests!(test5, T5);
