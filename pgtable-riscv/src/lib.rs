//! # pgtable-riscv
//!
//! The RISC-V half of the pgtable family:
//!
//! - [`format`]: [`Sv39`], [`Sv48`] and [`Sv57`] ([`RiscvPaging`] with 3, 4
//!   or 5 levels; [`pgtable_core::contract::Format`] + [`pgtable_core::contract::Arch`]), pure
//!   data, testable on any host, with the optional Svpbmt memory types and
//!   Svnapot PTEs chosen by a type parameter ([`SVPBMT`], [`SVNAPOT`]).
//!   Every bit is documented with its privileged-spec reference in
//!   [`bits`].
//! - [`flush`]: the range-flush policy (`SFENCE.VMA` per stride up to a
//!   ceiling, by ASID, global; the Svinval batch) as a pure function
//!   ([`FlushPlan`]), run on a hart by [`FlushPlan::run`].
//! - [`hart`]: the fence and `satp` instructions as a trait ([`Hart`])
//!   and the [`pgtable_core::contract::Mmu`] built on them ([`HartMmu`]),
//!   host-compiled so the same MMU runs on pgtable-core's simulated hart
//!   (`SimMachine::hart`, feature `sim`) in this crate's tests.
//! - `mmu`: `LocalHart` and `RiscvMmu` = `HartMmu<LocalHart>` (bare
//!   metal only: `target_arch = "riscv64"`), optionally tagged with an
//!   ASID; `probe_asid_bits` (ASIDLEN).
//! - [`regs`]: `satp` ([`Satp`], [`SatpMode`] Bare/Sv39/Sv48/Sv57), the
//!   typed [`Asid`] ([`AsidTooWide`]), ASIDLEN from the probe's read-back
//!   ([`asid_bits_from_probe`]).
//! - [`shootdown`]: SMP through SBI RFENCE: the kernel's SBI call behind
//!   [`shootdown::RemoteFence`], the harts a space may be live on
//!   ([`shootdown::MmHarts`], SBI hart-mask windows for any hart ID) and
//!   [`shootdown::SmpMmu`].
//! - [`entry`]: [`RiscvEntry`] and [`EntryError`]: checked construction of
//!   entries ([`RiscvPaging::try_leaf`], [`RiscvPaging::try_table_entry`],
//!   [`RiscvPaging::try_napot_64k`]); W without R and the other reserved
//!   encodings are refused.
//!
//! ## Decisions (details in the item docs)
//!
//! - The hart's extensions are a type parameter, since a [`Format`](pgtable_core::contract::Format) cannot
//!   fail: without Svpbmt every leaf is PBMT = PMA and the checked
//!   constructors refuse another memory type ([`EntryError::NoSvpbmt`];
//!   [`RiscvPaging::check_prot`] before a map).
//! - New leaves have A set, kernel writable ones D too; user writable
//!   leaves start clean. Non-leaf PTEs are V and the PPN only.
//! - The walker barrier is an `SFENCE.VMA x0, x0` (a PTE store is visible
//!   to the walker only after a fence covering it), or `FENCE W, W` with
//!   Svvptc; no break-before-make. Without Svvptc that barrier after each
//!   table's writes also drops every translation of the hart, so the range
//!   flushes that follow matter only with Svvptc (or for other harts).
//! - With [`SVNAPOT`], 64 KiB NAPOT runs are pgtable-core's contiguous
//!   runs (folded on map, unfolded before a partial change, A/D over the
//!   run, as on arm64); all 16 PTEs of a run hold the run's base, and the
//!   format's `cont_pa` / `clear_cont_at` give each entry its own page.
//!   Without it, maps write plain PTEs.
//!
//! ## Example
//!
//! ```
//! use pgtable_core::{MemType, PhysAddr, Prot};
//! use pgtable_core::contract::{Decoded, Format};
//! use pgtable_riscv::{EntryError, RiscvPaging, Sv39, SVPBMT};
//!
//! // A 2 MiB kernel megapage at 0x8020_0000, read-write.
//! let pte = Sv39::leaf(PhysAddr(0x8020_0000), Prot::READ_WRITE, 1);
//! // PPN (0x8020_0000 >> 2) | D | A | W | R | V
//! assert_eq!(pte, 0x2008_00c7);
//! assert_eq!(Sv39::decode(pte, 1), Decoded::Leaf(PhysAddr(0x8020_0000)));
//! // A device page needs Svpbmt.
//! let mmio = Prot::READ_WRITE.with_mem(MemType::Device);
//! assert_eq!(
//!     Sv39::try_leaf(PhysAddr(0x1000_0000), mmio, 0),
//!     Err(EntryError::NoSvpbmt(MemType::Device))
//! );
//! let io = RiscvPaging::<3, SVPBMT>::try_leaf(PhysAddr(0x1000_0000), mmio, 0).unwrap();
//! assert_eq!(io >> 61, 2); // PBMT = IO
//! ```
#![no_std]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bits;
pub mod entry;
pub mod flush;
pub mod format;
pub mod hart;
// Documented on every host too (`cfg(doc)`), as docs.rs shows it.
#[cfg(any(target_arch = "riscv64", doc))]
#[cfg_attr(docsrs, doc(cfg(target_arch = "riscv64")))]
pub mod mmu;
pub mod regs;
pub mod shootdown;

pub use entry::{EntryError, RiscvEntry};
pub use flush::{flush_plan, full_flush_plan, FlushCaps, FlushPlan, TLB_FLUSH_CEILING};
pub use format::{
    hw_access_with, mem_of, pbmt_of, AdUpdates, RiscvPaging, Sv39, Sv48, Sv57, SVNAPOT, SVPBMT,
};
pub use hart::{Hart, HartMmu};
#[cfg(any(target_arch = "riscv64", doc))]
#[cfg_attr(docsrs, doc(cfg(target_arch = "riscv64")))]
pub use mmu::{probe_asid_bits, LocalHart, RiscvMmu};
pub use regs::{asid_bits_from_probe, satp_value, Asid, AsidTooWide, Satp, SatpError, SatpMode};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
