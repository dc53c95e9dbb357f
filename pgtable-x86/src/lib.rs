//! # pgtable-x86
//!
//! The x86-64 half of the pgtable family:
//!
//! - [`format`]: [`X86_64`] and [`X86_64La57`], the 4-level and 5-level
//!   (LA57) paging formats ([`pgtable_core::contract::Format`] + [`pgtable_core::contract::Arch`]), pure data,
//!   testable on any host. Every bit is documented with its Intel SDM
//!   reference in [`bits`].
//! - [`flush`]: the range-flush policy (`INVLPG` up to a ceiling, then one
//!   full flush; global pages) and the PCID policy (INVPCID for an address
//!   space that is not current, or a flush deferred to its next switch) as
//!   pure functions.
//! - [`regs`]: register values and instruction operands, pure: CR3 with a
//!   [`Pcid`] ([`cr3_value`]), the CR4 and CPUID bits paging uses, the
//!   INVPCID types and descriptor.
//! - `mmu`: `X86Mmu` (bare metal only: `target_arch = "x86_64"`,
//!   `target_os = "none"`): [`pgtable_core::contract::Mmu`] with `INVLPG`, CR3,
//!   INVPCID and CR4.PGE, through the `x86_64` crate; optionally tagged
//!   with a [`Pcid`] (switches without a flush).
//! - [`shootdown`]: TLB shootdown for SMP kernels ([`SmpMmu`]: local
//!   flush, one IPI round to the CPUs the space may be live on, the wait
//!   for acknowledgements; lazy CPUs; INVLPGB + TLBSYNC where AMD
//!   processors have it).
//! - [`entry`]: [`X86Entry`], [`ReservedBits`], [`EntryError`]: checked
//!   construction of entries from raw bits ([`X86Paging::try_leaf`],
//!   [`X86Paging::try_table_entry`]).
//!
//! ## Decisions (details in the item docs)
//!
//! - Memory types assume the power-up PAT MSR: `Normal` = WB (index 0),
//!   `NormalNonCacheable` = UC- (PCD, index 2), `Device` = UC (PCD | PWT,
//!   index 3).
//! - New kernel leaves have A set (and D when writable), like Linux's
//!   `__PAGE_KERNEL`, so they are settled from birth; new user leaves start
//!   with A and D clear. Table entries are `P | RW | US | A`.
//! - No walker barrier (`NEEDS_WALKER_BARRIER = false`) and no
//!   break-before-make (`BREAK_BEFORE_MAKE = false`); the setters are single
//!   64-bit stores, `ptep_get_and_clear` an atomic exchange.
//! - `pmdp_modify_prot_start` is overridden with the deferred form (atomic
//!   clear, one gathered flush at the end), as Linux x86's
//!   `pmdp_invalidate_ad` skips its flush.
//! - [`Format::hw_access`](pgtable_core::contract::Format::hw_access) models CR0.WP = 1
//!   and EFER.NXE = 1 without SMEP, SMAP or protection keys.
//! - Reserved bits make an entry [`Decoded::Invalid`](pgtable_core::contract::Decoded)
//!   (the processor's reserved-bit fault); MAXPHYADDR is a type parameter
//!   of [`X86Paging`] (52 by default).
//!
//! ## Example
//!
//! ```
//! use pgtable_core::{PhysAddr, Prot};
//! use pgtable_core::contract::{Decoded, Format};
//! use pgtable_x86::X86_64;
//!
//! // A 2 MiB kernel page at 0x20_0000, read-write, not executable.
//! let pde = X86_64::leaf(PhysAddr(0x20_0000), Prot::READ_WRITE, 1);
//! // XD | 2 MiB address | PS | D | A | R/W | P
//! assert_eq!(pde, 0x8000_0000_0020_00e3);
//! assert_eq!(X86_64::decode(pde, 1), Decoded::Leaf(PhysAddr(0x20_0000)));
//! // Bit 13 is reserved in a PDE that maps a 2 MiB page.
//! assert!(X86_64::validate(pde | 1 << 13, 1).is_err());
//! assert_eq!(X86_64::decode(pde | 1 << 13, 1), Decoded::Invalid);
//! ```
#![no_std]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bits;
pub mod entry;
mod error;
pub mod flush;
pub mod format;
// Documented on x86-64 hosts too (`cfg(doc)`), as docs.rs shows it.
#[cfg(any(
    all(target_arch = "x86_64", target_os = "none"),
    all(doc, target_arch = "x86_64")
))]
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub mod mmu;
pub mod regs;
pub mod shootdown;

pub use entry::X86Entry;
pub use error::{EntryError, ReservedBits};
pub use flush::{
    flush_plan, full_flush_plan, kernel_flush_plan, pcid_flush_plan, FlushKind, FlushPlan,
    OtherPcid, PcidCpu, PcidFlush,
};
pub use format::{mem_type_of_pat_index, pat_index_of, X86Paging, X86_64La57, X86_64};
#[cfg(any(
    all(target_arch = "x86_64", target_os = "none"),
    all(doc, target_arch = "x86_64")
))]
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub use mmu::{cpu_has_pcid, enable_pcids, X86Mmu};
pub use regs::{cr3_value, Pcid, PcidTooWide};
pub use shootdown::{CpuMask, IpiSender, MmCpus, Shootdown, ShootdownStats, SmpMmu, SwitchAction};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
