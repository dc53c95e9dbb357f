//! Random sequences of every address-space operation (`map`, `unmap`,
//! `unmap_with`, `change_protection`, `move_page_tables`, harvesting,
//! faults, software entries, fork, live changes, gathers; kernel and user
//! spaces) on the simulated machine against a reference model, for the
//! test formats (3, 4 and 5 levels, and the deferred block-protection
//! path, with 4 KiB pages; 16 KiB pages with 48-bit VA, 64 KiB pages with
//! 48-bit and 42-bit VA, 4 KiB pages with 52-bit VA). The engine, shared with the arch crates, and how to replay a
//! failure or run the soak (`cargo xtask soak`) are described in
//! `pgtable_testkit::model`.
#![cfg(feature = "sim")]

use pgtable_testkit::model;

use pgtable_core::test_format::TestFormat;
use pgtable_core::variants::DeferredBlockProt;

#[test]
fn model_test_format_3_levels() {
    model::run_format::<TestFormat<3>>("test-3level", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_test_format_4_levels() {
    model::run_format::<TestFormat<4>>("test-4level", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_test_format_5_levels() {
    model::run_format::<TestFormat<5>>("test-5level", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_test_format_deferred_block_protection() {
    model::run_format::<DeferredBlockProt<TestFormat<4>>>(
        "test-4level-deferred-block-prot",
        env!("CARGO_PKG_NAME"),
    );
}

#[test]
fn model_test_format_16k_48bit() {
    model::run_format::<TestFormat<4, 14, 48>>("test-16K-48bit", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_test_format_64k_48bit() {
    model::run_format::<TestFormat<3, 16, 48>>("test-64K-48bit", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_test_format_64k_42bit() {
    model::run_format::<TestFormat<2, 16, 0>>("test-64K-42bit", env!("CARGO_PKG_NAME"));
}

#[test]
fn model_test_format_4k_52bit() {
    model::run_format::<TestFormat<5, 12, 52>>("test-4K-52bit", env!("CARGO_PKG_NAME"));
}
