//! # pgtable-arm64
//!
//! The arm64 half of the pgtable family, for every granule:
//!
//! - **Format** (pure, host-testable): [`Arm64Format`] for each of Linux's
//!   geometries, [`Arm64`] (4 KiB, 48-bit VA, 4 levels: L0 = PGD,
//!   L1 = PUD, L2 = PMD, L3 = PTE), [`Arm64Va39`] (39-bit VA, 3 levels),
//!   the 16 KiB [`Arm64K16`] (48 bits), [`Arm64K16Va47`],
//!   [`Arm64K16Va36`], the 64 KiB [`Arm64K64`] (48 bits),
//!   [`Arm64K64Va42`], and the 52-bit [`Arm64Lpa2`], [`Arm64K16Lpa2`]
//!   (FEAT_LPA2) and [`Arm64K64Va52`] (FEAT_LVA, FEAT_LPA), implementing [`pgtable_core::contract::Format`] and
//!   [`pgtable_core::contract::Arch`]: table, block (1 GiB at L1, 2 MiB at L2) and
//!   page descriptors, the [`MAIR_VALUE`] memory types, AP / UXN / PXN
//!   permissions, SH, AF, nG, DBM-based dirty state as Linux does it, the
//!   contiguous hint. Every bit is named, with its Arm ARM reference, in
//!   [`bits`].
//! - **Entry operations** as Linux arm64 has them: `set_p*_at` with the
//!   walker barrier, `set_pte_nosync` without (Linux "arm64: mm: Batch dsb and isb when
//!   populating pgtables"), atomic
//!   get-and-clear, `pmdp_modify_prot_start` without the immediate flush
//!   (Linux "arm64: mm: rework the pmd protect changing flow"), and the break-before-make rules
//!   ([`bbm`]) with
//!   [`set_live_entry`].
//! - **Checked entries** ([`entry`]): [`Arm64Entry`] accepts raw bits
//!   only with an existing height and no reserved encoding;
//!   [`Arm64Format::try_leaf`] / [`Arm64Format::try_table_entry`] build
//!   descriptors from checked input, with an [`EntryError`] otherwise.
//! - **TLB maintenance encodings and the flush plan** ([`flush`]): which
//!   TLBIs a range flush takes ([`flush_plan`]), the range-TLBI split
//!   (FEAT_TLBIRANGE) and operands, pure and tested on the host; for any
//!   granule and TCR_EL1.DS with [`flush_plan_for`] and
//!   [`tlbi_range_ops_for`].
//! - **Register values** ([`regs`]): [`MAIR_VALUE`], [`tcr_value`], SCTLR bits, [`Asid`]
//!   (8- or 16-bit, checked) and [`ttbr0_value`]; [`tcr_value_for`] for
//!   any granule and 52-bit addresses (TCR_EL1.DS).
//! - **Granules** ([`granule`]): [`Granule`] (4, 16, 64 KiB) with its
//!   levels, block sizes and contiguous runs, the [`Geometry`]s Linux
//!   builds, and [`check_geometry`] against a CPU's ID registers, which
//!   the formats follow ([`Arm64Geometry`]).
//! - **MMU operations** (`mmu`, only for `target_arch = "aarch64"`):
//!   `Arm64Mmu` with `dsb ishst; isb`, `tlbi vale1is` / `vae1is` /
//!   `rvale1is` / `aside1is` / `vmalle1is` by the address space's ASID,
//!   switching ASIDs without a flush, and `enable_mmu`; the TLBI operands,
//!   TTBRs and TCR_EL1 of other geometries with `Arm64Mmu::for_format`
//!   and `enable_mmu_for`. Pair it with
//!   `pgtable_core::asid::AsidAllocator` when there are more address
//!   spaces than ASIDs.
//!
//! ## Example
//!
//! ```
//! use pgtable_arm64::{format, Arm64};
//! use pgtable_core::{PhysAddr, Prot};
//! use pgtable_core::contract::{Decoded, Format};
//!
//! // A kernel read-write 2 MiB block: AttrIndx 0, SH inner, AF, UXN|PXN,
//! // DBM (writable, already dirty), nG clear (global).
//! let prot = Prot::WRITE | Prot::GLOBAL;
//! let raw = Arm64::leaf(PhysAddr(0x4020_0000), prot, 1);
//! assert_eq!(raw, 0x0068_0000_4020_0701);
//! assert_eq!(Arm64::decode(raw, 1), Decoded::Leaf(PhysAddr(0x4020_0000)));
//! assert!(Arm64::is_dirty(raw) && !format::is_contiguous(raw));
//! ```
#![no_std]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod bbm;
pub mod bits;
pub mod entry;
pub mod flush;
pub mod format;
pub mod granule;
pub mod regs;

// Documented on every host (`cfg(doc)`), as docs.rs shows it.
#[cfg(any(target_arch = "aarch64", doc))]
#[cfg_attr(docsrs, doc(cfg(target_arch = "aarch64")))]
pub mod mmu;

pub use bbm::{
    bbm_reason, bbm_reason_for, pgattr_change_is_safe, set_live_entry, set_live_entry_for,
    LiveEntry,
};
pub use entry::{Arm64Entry, EntryError};
pub use flush::{
    flush_plan, flush_plan_for, tlbi_range_ops, tlbi_range_ops_for, FlushPlan, TlbiOp,
    MAX_TLBI_OPS, MAX_TLBI_RANGE_PAGES,
};
pub use format::{
    Arm64, Arm64Format, Arm64Geometry, Arm64K16, Arm64K16Lpa2, Arm64K16Va36, Arm64K16Va47,
    Arm64K64, Arm64K64Va42, Arm64K64Va52, Arm64Lpa2, Arm64Va39, Descriptor, HwFeatures,
};
pub use granule::{
    check_geometry, Geometry, GeometryError, GeometryUnsupported, Granule, GranuleSupport,
    MmuFeatures,
};
#[cfg(any(target_arch = "aarch64", doc))]
#[cfg_attr(docsrs, doc(cfg(target_arch = "aarch64")))]
pub use mmu::{
    asid_bits, enable_mmu, enable_mmu_for, enable_mmu_separate_halves, has_tlb_range,
    local_flush_tlb_all, Arm64Mmu,
};
pub use regs::{
    tcr_t0sz, tcr_t1sz, tcr_value, tcr_value_separate_halves, ttbr0_value, txsz, Asid, AsidBits,
    AsidTooWide, TcrConfig, MAIR_VALUE,
};
pub use regs::{
    tcr_value_for, tcr_value_for_separate_halves, ttbr0_value_52, BadRoot, TcrGeometry,
};
/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
