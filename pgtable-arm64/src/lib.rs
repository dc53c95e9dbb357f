//! arm64 page-table format and MMU operations for `pgtable-core` (work in progress).
#![no_std]
