//! A kernel's own table allocator on the simulator, and user-mode loads
//! and stores, on x86-64 (4- and 5-level paging).

use pgtable_x86::{X86_64La57, X86_64};

pgtable_testkit::kernel_alloc_tests!(x86_4level, X86_64);
pgtable_testkit::kernel_alloc_tests!(x86_5level, X86_64La57);
