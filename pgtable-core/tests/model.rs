//! Random sequences of every address-space operation (`map`, `unmap`,
//! `unmap_with`, `change_protection`, `move_page_tables`, harvesting,
//! faults, software entries, fork, live changes, gathers; kernel and user
//! spaces) on the simulated machine against a reference model, for the
//! test formats (3, 4 and 5 levels, and the deferred block-protection
//! path, with 4 KiB pages; 16 KiB pages with 48-bit VA, 64 KiB pages with
//! 48-bit and 42-bit VA, 4 KiB pages with 52-bit VA). The engine, shared
//! with the arch crates, and how to replay a failure or run the soak
//! (`cargo xtask soak`) are described in `pgtable_testkit::model`; one
//! test a format, by `pgtable_testkit::model_tests!`.
#![cfg(feature = "sim")]

use pgtable_core::test_format::TestFormat;
use pgtable_core::variants::DeferredBlockProt;

pgtable_testkit::model_tests! {
    model_test_format_3_levels: TestFormat<3> = "test-3level";
    model_test_format_4_levels: TestFormat<4> = "test-4level";
    model_test_format_5_levels: TestFormat<5> = "test-5level";
    model_test_format_deferred_block_protection: DeferredBlockProt<TestFormat<4>> =
        "test-4level-deferred-block-prot";
    model_test_format_16k_48bit: TestFormat<4, 14, 48> = "test-16K-48bit";
    model_test_format_64k_48bit: TestFormat<3, 16, 48> = "test-64K-48bit";
    model_test_format_64k_42bit: TestFormat<2, 16, 0> = "test-64K-42bit";
    model_test_format_4k_52bit: TestFormat<5, 12, 52> = "test-4K-52bit";
}
