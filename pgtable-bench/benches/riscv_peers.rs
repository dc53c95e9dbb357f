//! pgtable against its Rust peer on RISC-V, one criterion run over 1 GiB
//! of address space, for Sv39 and Sv48: the groups `riscv-sv39-map-4K`,
//! `-protect-4K`, `-unmap-4K`, `-map-2M` and `-move-1G` (and the same
//! with `riscv-sv48`). What each group times, the checks before timing,
//! the fairness rules and the clock are those of the shared harness,
//! `pgtable-bench/src/harness.rs` (its module docs); the peer subject is
//! in `pgtable-bench/src/riscv.rs`. The host is whatever runs the bench,
//! so these are figures for the algorithms and the table memory, not for
//! a RISC-V hart.
//!
//! Subjects, each with its fastest honest API:
//!
//! - `pgtable`: `AddressSpace<Sv39 | Sv48, NoopMmu, ZeroOnAlloc>`, one
//!   ranged call per operation. Kernel leaves are created accessed and
//!   (writable ones) dirty, so protection changes take the plain-store
//!   path for settled entries; `pgtable-user` maps user pages, which start
//!   clean, so its protection change takes the atomic path per entry.
//! - `page_table_multiarch` (0.6), the only Rust peer with RISC-V tables
//!   that has ranged map, protect and unmap calls: the harness's `ptm`
//!   subject on the crate's generic `PageTable64` engine with the
//!   metadata of its `Sv39PageTable` / `Sv48PageTable` (its `riscv`
//!   module is compiled only for RISC-V targets, so the bench plugs a host
//!   RV64 entry type into the same engine, with pgtable's leaf bits). It
//!   keeps emptied tables until the table is dropped, and its flag update
//!   is a plain read-modify-write (not A/D-safe).
//!
//! Run: `cargo bench -p pgtable-bench --bench riscv_peers -- --warm-up-time
//! 1 --measurement-time 3` (`PEERS_CLOCK=thread` for CPU time: see the
//! harness docs).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use pgtable_bench::harness::{self, Pgtable, Subjects};
use pgtable_bench::riscv::{subject_sv39, subject_sv48};
use pgtable_riscv::{Sv39, Sv48};

fn peers(c: &mut Criterion) {
    let sv39: Subjects = vec![
        ("pgtable", Box::new(Pgtable::<Sv39>::new(false))),
        ("page_table_multiarch", Box::new(subject_sv39())),
    ];
    harness::run::<Sv39>(c, "riscv-sv39", sv39, Vec::new);
    let sv48: Subjects = vec![
        ("pgtable", Box::new(Pgtable::<Sv48>::new(false))),
        ("page_table_multiarch", Box::new(subject_sv48())),
    ];
    harness::run::<Sv48>(c, "riscv-sv48", sv48, Vec::new);
}

criterion_group!(benches, peers);
criterion_main!(benches);
