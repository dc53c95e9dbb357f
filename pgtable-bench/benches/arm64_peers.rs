//! pgtable against its Rust peers on arm64, one criterion run over 1 GiB
//! of address space: the groups `arm64-map-4K`, `arm64-protect-4K`,
//! `arm64-unmap-4K`, `arm64-map-2M` and `arm64-move-1G`. What each group
//! times, the checks before timing, the common fairness rules and the
//! clock are those of the shared harness, `pgtable-bench/src/harness.rs`
//! (its module docs); the peer subjects are in `pgtable-bench/src/arm64.rs`. The descriptors are arm64's (4 KiB granule,
//! 48-bit VA, 4 levels); the host is whatever runs the bench, so these are
//! figures for the algorithms and the table memory, not for an arm64 CPU.
//!
//! Subjects, each with its fastest honest API:
//!
//! - `pgtable`: `AddressSpace<Arm64, NoopMmu, ZeroOnAlloc>`, one ranged call per
//!   operation. Kernel leaves are created with AF set and writable ones
//!   dirty (DBM, AP\[2\] clear), so protection changes take the plain-store
//!   path for settled entries (A/D-safe: hardware never writes them).
//!   `pgtable-user` maps user pages, which start clean (AP\[2\] | DBM), so
//!   its protection change takes the atomic get-and-clear path per entry.
//! - `aarch64-paging` (0.12): a `Mapping<_, El1And0>` (the type under
//!   `IdMap`, used directly because it takes an explicit PA), root level 0.
//!   Ranged calls: `map_range` (with `Constraints::NO_BLOCK_MAPPINGS` for
//!   4 KiB pages), `modify_range` with a callback that calls
//!   `modify_flags` per descriptor (an atomic swap per entry, not A/D-safe:
//!   the flags are read before the swap), and unmap = `map_range` with
//!   invalid (empty) attributes, which frees a subtable its range covers
//!   whole, as pgtable does (a table the range covers in part stays even
//!   when it becomes empty: the level 1 table above a 1 GiB range; pgtable
//!   frees that too). The mapping is never activated: for an active
//!   mapping it first walks the range to check break-before-make rules and
//!   invalidates the TLB per entry (compiled out off aarch64), which
//!   pgtable's `NoopMmu` run has no counterpart for. Its table frames come
//!   from a warm free list that zeroes a frame when it hands it out,
//!   exactly like pgtable's `ZeroOnAlloc` (its own `IdTranslation` would go
//!   through the global allocator).
//! - `page_table_multiarch` (0.6): the harness's `ptm` subject, on the
//!   crate's generic `PageTable64` engine (ranged calls through a cursor,
//!   emptied tables kept until the table is dropped, flag updates not
//!   A/D-safe: details there). The crate's own `aarch64::A64PageTable` (and
//!   `page_table_entry::aarch64::A64PTE`) are compiled only for
//!   `target_arch = "aarch64"`, so on other hosts the bench plugs a small
//!   arm64 entry type into the same engine, encoding the same descriptor
//!   bits as pgtable (through `pgtable_arm64::Arm64`) and converting its
//!   `MappingFlags` per call as `A64PTE` does. It takes table frames from
//!   the harness's free list and zeroes a table when it creates it.
//!
//! Fairness, arm64 specifics: the peers' leaves carry pgtable's attribute
//! bits.
//!
//! Run: `cargo bench -p pgtable-bench --bench arm64_peers -- --warm-up-time 1
//! --measurement-time 3` (`PEERS_CLOCK=thread` for CPU time: see the
//! harness docs).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use pgtable_arm64::Arm64;
use pgtable_bench::arm64::{ptm, Aarch64Paging};
use pgtable_bench::harness::{self, Pgtable, Subjects};

/// Every subject of all groups but move (the harness adds `pgtable-user`
/// to the protect group).
fn subjects() -> Subjects {
    vec![
        ("pgtable", Box::new(Pgtable::<Arm64>::new(false))),
        ("aarch64-paging", Box::new(Aarch64Paging::default())),
        ("page_table_multiarch", Box::new(ptm::subject())),
    ]
}

fn peers(c: &mut Criterion) {
    harness::run::<Arm64>(c, "arm64", subjects(), Vec::new);
}

criterion_group!(benches, peers);
criterion_main!(benches);
