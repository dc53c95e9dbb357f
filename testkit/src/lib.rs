//! Test cases shared by the integration tests of pgtable-core (the test
//! formats) and of the arch crates (their formats), written once, generic
//! over the format and run on pgtable-core's simulated machine:
//!
//! - [`model`]: random operation sequences against a reference model (the
//!   `model` test binary of each crate, and `cargo xtask soak`);
//! - [`ops`]: `MmuGather`, `unmap_with`, harvesting and the fault-time
//!   operations, instantiated per format by [`ops_tests!`];
//! - [`swfork`]: software entries and `copy_page_range`;
//! - [`kernel_half`] and [`ranges`]: a kernel half shared by user spaces,
//!   and every operation against the edges of the space's range;
//! - [`live`]: live permission changes under CPUs using the range;
//! - [`geometry`]: the core's operations on a format's page size, levels
//!   and VA and PA sizes (16 KiB and 64 KiB pages, 52 bits);
//! - [`asid_switch`]: more address spaces than ASIDs;
//! - [`kernel_alloc`]: a kernel's own table allocator on the simulator,
//!   and user-mode loads and stores.
//!
//! Not published: it exists for the tests of this repository.

pub mod asid_switch;
pub mod geometry;
pub mod kernel_alloc;
pub mod kernel_half;
pub mod live;
pub mod model;
pub mod ops;
pub mod ranges;
pub mod swfork;

/// Every case of an exhaustive grid in a native run; under Miri every
/// [`MIRI_STRIDE`]-th (`i` counts the grid's cases from 0). The stride is
/// prime and larger than any one dimension of the grids that use it, so
/// the cases kept still vary every dimension.
pub const fn miri_sample(i: usize) -> bool {
    !cfg!(miri) || i % MIRI_STRIDE == 0
}

/// The stride of [`miri_sample`].
pub const MIRI_STRIDE: usize = 29;

/// [`miri_sample`] for the grids of thousands of cases (the reservation
/// grids of pgtable-core): under Miri every [`MIRI_SPARSE_STRIDE`]-th case.
pub const fn miri_sample_sparse(i: usize) -> bool {
    !cfg!(miri) || i % MIRI_SPARSE_STRIDE == 0
}

/// The stride of [`miri_sample_sparse`], prime like [`MIRI_STRIDE`].
pub const MIRI_SPARSE_STRIDE: usize = 1009;

/// Every seed (or other case list) of a test in a native run; under Miri
/// only the first, for a loop whose iterations run the same code on
/// different random data.
pub fn miri_first<T>(all: &[T]) -> &[T] {
    if cfg!(miri) {
        &all[..all.len().min(1)]
    } else {
        all
    }
}

/// `n` in a native run, `n / 10` under Miri (`cargo xtask miri`): the
/// step count of a long randomized loop (ASID switches), and any bound
/// proportional to it, so the same code runs on fewer steps where each
/// step costs hundreds of times more.
pub const fn miri_scaled(n: u64) -> u64 {
    if cfg!(miri) {
        n / 10
    } else {
        n
    }
}
