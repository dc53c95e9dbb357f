//! `MmuGather`, `unmap_with`, harvesting and the fault-time operations on
//! the simulated machine with the arm64 formats (48-bit and 39-bit VA).
//! The cases are `pgtable_testkit::ops`.

use pgtable_arm64::{Arm64, Arm64Va39};

pgtable_testkit::ops_tests!(arm64_48, Arm64);
pgtable_testkit::ops_tests!(arm64_39, Arm64Va39);
