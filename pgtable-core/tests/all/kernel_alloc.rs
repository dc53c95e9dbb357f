//! A kernel's own table allocator on the simulator, and user-mode loads
//! and stores, on the test formats.

use pgtable_core::test_format::TestFormat;

type T3 = TestFormat<3>;
type T4 = TestFormat<4>;
type T5 = TestFormat<5>;

pgtable_testkit::kernel_alloc_tests!(test3, T3);
pgtable_testkit::kernel_alloc_tests!(test4, T4);
pgtable_testkit::kernel_alloc_tests!(test5, T5);
