//! A kernel's own table allocator on the simulator, and user-mode loads
//! and stores, on arm64 (48- and 39-bit VA).

use pgtable_arm64::{Arm64, Arm64Va39};

pgtable_testkit::kernel_alloc_tests!(arm64_48, Arm64);
pgtable_testkit::kernel_alloc_tests!(arm64_39, Arm64Va39);
