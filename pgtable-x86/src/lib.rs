//! x86 page-table format and MMU operations for `pgtable-core` (work in progress).
#![no_std]
