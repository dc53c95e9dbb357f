//! `MmuGather`, `unmap_with`, harvesting and the fault-time operations on
//! the simulated machine with the test format (3, 4 and 5 levels). The
//! cases are `pgtable_testkit::ops`, shared with the arch crates.
#![cfg(feature = "sim")]

use pgtable_core::test_format::TestFormat;

type T4 = TestFormat<4>;
type T3 = TestFormat<3>;
type T5 = TestFormat<5>;

pgtable_testkit::ops_tests!(test4, T4);
pgtable_testkit::ops_tests!(test3, T3);
pgtable_testkit::ops_tests!(test5, T5);
