//! # pgtable-core
//!
//! The generic half of the pgtable family: Linux's page-table algorithms
//! written once against a small contract that each architecture
//! implements. The crate root is what a kernel's memory manager uses; the
//! [`contract`] module is what an architecture port (or a frame
//! allocator, a test, a benchmark) implements and names.
//!
//! ## For kernel authors
//!
//! An [`AddressSpace`] over one arch, one MMU handle and one table
//! allocator is the whole API; its operations have Linux's names:
//! [`map`], [`unmap`], [`change_protection`], [`move_page_tables`],
//! [`translate`] and [`walk`], software (swap) entries
//! ([`install_pte`] with `NewPte::Swap`; [`replace_pte`] swaps a page out or in, or
//! replaces it by its copy-on-write copy, in place), fork's copy-on-write copy
//! ([`copy_page_range`], which reports each entry it copies) and a process
//! exit's teardown ([`exit_mmap`]: every page and software entry reported,
//! one flush, every table freed). The options of each are plain values at the
//! root ([`MapOptions`], [`MoveOptions`], [`LiveOptions`], [`ClearRefs`],
//! [`FaultFlags`], [`CopyMode`]); every error is an [`Error`] that left
//! the tables unchanged (a refused live change says why:
//! [`contract::BbmReason`]).
//!
//! A [`Prot`] is a set of rights on top of kernel read-only
//! ([`Prot::READ_ONLY`] is the empty set, user read-only is
//! [`Prot::USER`]); [`Prot::NONE`] is Linux's `PROT_NONE`, a mapping that
//! keeps its frame but faults on every access. Kernel mappings are global
//! only with [`Prot::GLOBAL`] ([`new_kernel`](AddressSpace::new_kernel)).
//!
//! For a kernel's memory manager there is more: a caller-owned flush
//! batch ([`MmuGather`], Linux `tlb_gather_mmu` / `tlb_finish_mmu`) that
//! borrows its space and runs the batched operations, [`unmap_with`]
//! reporting every removed page as a [`LeafEntry`] with its final
//! accessed/dirty state, accessed/dirty harvesting ([`clear_refs`],
//! [`test_and_clear_young`]) and the fault-time single-entry operations
//! [`install_pte`] and [`ptep_set_access_flags`], with [`ptep_get`] to read
//! one entry safely. [`ptdump`](AddressSpace::ptdump) prints the tables
//! the way Linux's `kernel_page_tables` file does, through `core::fmt`
//! ([`PtDump`]).
//!
//! ## For arch authors
//!
//! An arch implements [`Format`] (the pure descriptor
//! encoding), [`Arch`] (capabilities and the Linux-named
//! entry operations, each with Linux's generic fallback as its default)
//! and [`Mmu`] (barriers, TLB maintenance, installing a
//! root). The [`contract`] module lists the minimum port and which hooks
//! each of the three arch crates overrides, and why.
//!
//! The code Linux ran before the changes this crate follows (a barrier per
//! entry, PTE-by-PTE moves, the generic block protection change) is kept
//! in [`variants`], for benchmarks and tests that compare both ways;
//! `sim` (a simulated MMU) and `suite` (the conformance suite) are
//! features for tests.
//!
//! The crate is `#![no_std]`, contains no `asm!` and no `cfg(target_arch)`.
//! Arch crates (`pgtable-arm64`, `pgtable-x86`, `pgtable-riscv`) implement
//! the traits; a kernel or a host test picks one arch, one
//! [`Mmu`] (the real one or a simulated one) and one
//! [`TableAlloc`].
//!
//! ## Example
//!
//! ```
//! # #[cfg(feature = "alloc")] {
//! use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
//! use pgtable_core::contract::{Arena, NoopMmu};
//! use pgtable_core::test_format::TestFormat;
//!
//! let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
//! // Map 4 MiB at 1 GiB to physical 0x8000_0000, allowing 2 MiB blocks.
//! space
//!     .map(VirtAddr(1 << 30), PhysAddr(0x8000_0000), 4 << 20, Prot::READ_WRITE, MapOptions::BLOCKS)
//!     .unwrap();
//! let t = space.translate(VirtAddr((1 << 30) + 0x1234)).unwrap();
//! assert_eq!(t.pa, PhysAddr(0x8000_1234));
//! space.unmap(VirtAddr(1 << 30), 4 << 20).unwrap();
//! assert!(space.translate(VirtAddr(1 << 30)).is_none());
//! # }
//! ```
//!
//! [`map`]: AddressSpace::map
//! [`unmap`]: AddressSpace::unmap
//! [`change_protection`]: AddressSpace::change_protection
//! [`move_page_tables`]: AddressSpace::move_page_tables
//! [`translate`]: AddressSpace::translate
//! [`walk`]: AddressSpace::walk
//! [`replace_pte`]: AddressSpace::replace_pte
//! [`copy_page_range`]: AddressSpace::copy_page_range
//! [`unmap_with`]: AddressSpace::unmap_with
//! [`clear_refs`]: AddressSpace::clear_refs
//! [`test_and_clear_young`]: AddressSpace::test_and_clear_young
//! [`install_pte`]: AddressSpace::install_pte
//! [`exit_mmap`]: AddressSpace::exit_mmap
//! [`ptep_set_access_flags`]: AddressSpace::ptep_set_access_flags
//! [`ptep_get`]: AddressSpace::ptep_get
#![no_std]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "alloc")]
extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod addr;
mod error;
mod ops;
mod ptdump;
mod space;
mod stats;
mod testing;

pub mod asid;
pub mod contract;
#[cfg(feature = "sim")]
pub use testing::sim;
#[cfg(feature = "suite")]
pub use testing::suite;
pub use testing::{test_format, variants};

pub use addr::{PhysAddr, VirtAddr};
pub use contract::format::{MemType, Prot};
pub use error::Error;
pub use ops::entry::LeafEntry;
pub use ops::fault::FaultFlags;
pub use ops::fork::CopyMode;
pub use ops::harvest::ClearRefs;
pub use ops::live::LiveOptions;
pub use ops::moves::MoveOptions;
pub use ops::walk::{Mapping, Translation};
pub use ptdump::PtDump;
pub use space::aspace::{AddressSpace, MapOptions};
pub use space::half::VaRange;
pub use space::mmu_gather::MmuGather;

// The contract's names also at the root, crate-private, for the crate's
// own code (`crate::Slot`, …).
pub(crate) use contract::*;
pub(crate) use ops::entry::Removed;
pub(crate) use space::gather::TlbGather;

/// Doctests that are no part of the API: the READMEs' examples and the
/// misuses that must not compile.
#[cfg(all(doctest, feature = "alloc"))]
mod doctests {
    /// The README's examples, compiled and run as doctests. The workspace
    /// README's examples are copies of this crate's and the arch crates'
    /// (`cargo test -p xtask` checks that they stay identical).
    #[cfg(all(doctest, feature = "alloc"))]
    #[doc = include_str!("../README.md")]
    pub struct ReadmeDoctests;

    /// What safe code must not be able to do, each shown not to compile.
    ///
    /// Reach a live entry (it could store a forged table pointer):
    ///
    /// ```compile_fail,E0133
    /// use pgtable_core::test_format::TestFormat;
    /// use pgtable_core::{AddressSpace, VirtAddr};
    /// use pgtable_core::contract::{Arena, NoopMmu};
    ///
    /// let s = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let _ = s.inspect().slot(VirtAddr(0), 3);
    /// ```
    ///
    /// Replace the allocator the tables came from:
    ///
    /// ```compile_fail,E0133
    /// use pgtable_core::test_format::TestFormat;
    /// use pgtable_core::AddressSpace;
    /// use pgtable_core::contract::{Arena, NoopMmu};
    ///
    /// let mut s = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let _old = core::mem::replace(s.alloc_mut(), Arena::new());
    /// ```
    ///
    /// Ask an allocator for the address of something that is not its frame:
    ///
    /// ```compile_fail,E0133
    /// use pgtable_core::PhysAddr;
    /// use pgtable_core::contract::{Arena, TableAlloc};
    ///
    /// let _ = Arena::new().phys_to_virt(PhysAddr(0));
    /// ```
    ///
    /// Implement a format whose decoding the algorithms would trust without
    /// promising it is right:
    ///
    /// ```compile_fail,E0200
    /// use pgtable_core::test_format::TestFormat;
    /// use pgtable_core::{PhysAddr, Prot};
    /// use pgtable_core::contract::{Access, AccessFault, Decoded, Format};
    ///
    /// type T = TestFormat<4>;
    /// struct Lying;
    /// impl Format for Lying {
    ///     const NAME: &'static str = "lying";
    ///     const LEVELS: u32 = 4;
    ///     const PA_BITS: u32 = 52;
    ///     fn leaf_allowed(h: u32) -> bool { T::leaf_allowed(h) }
    ///     // Every non-zero entry "points at a table" wherever its bits say.
    ///     fn decode(raw: u64, _h: u32) -> Decoded {
    ///         if raw == 0 { Decoded::None } else { Decoded::Table(PhysAddr(raw & !0xfff)) }
    ///     }
    ///     fn table_entry(pa: PhysAddr, h: u32) -> u64 { <T as Format>::table_entry(pa, h) }
    ///     fn leaf_template(p: Prot, h: u32) -> u64 { T::leaf_template(p, h) }
    ///     fn leaf_prot(raw: u64, h: u32) -> Prot { T::leaf_prot(raw, h) }
    ///     fn modify_prot(raw: u64, p: Prot, h: u32) -> u64 { T::modify_prot(raw, p, h) }
    ///     fn split_leaf(raw: u64, h: u32) -> u64 { T::split_leaf(raw, h) }
    ///     fn is_young(raw: u64) -> bool { T::is_young(raw) }
    ///     fn is_dirty(raw: u64) -> bool { T::is_dirty(raw) }
    ///     fn hw_access(raw: u64, h: u32, a: Access) -> Result<u64, AccessFault> {
    ///         T::hw_access(raw, h, a)
    ///     }
    /// }
    /// ```
    #[cfg(all(doctest, feature = "alloc"))]
    pub struct UnsafeAccessDoctests;
}
