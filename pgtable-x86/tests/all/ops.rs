//! `MmuGather`, `unmap_with`, harvesting and the fault-time operations on
//! the simulated machine with the x86 formats (4-level and LA57).
//! The cases are `pgtable_testkit::ops`.

use pgtable_x86::{X86_64La57, X86_64};

pgtable_testkit::ops_tests!(x86_4level, X86_64);
pgtable_testkit::ops_tests!(x86_5level, X86_64La57);
