//! The bits of a VMSAv8-64 stage 1 descriptor, named as the Arm ARM names
//! them. The table shows the 4 KiB granule with 48-bit output addresses;
//! the other granules and 52-bit addresses differ only in the address
//! field (see [`Arm64Format`](crate::Arm64Format)): it starts at the
//! page shift (bit 14 for 16 KiB, 16 for 64 KiB), with FEAT_LPA2
//! (TCR_EL1.DS = 1) it holds OA\[49:12\] in place and OA\[51:50\] in
//! bits \[9:8\] ([`OA_HIGH_LPA2`], SH moves to TCR_EL1), and with 64 KiB
//! pages and FEAT_LPA OA\[51:48\] in bits \[15:12\] ([`OA_HIGH_LPA_64K`]).
//!
//! Bit positions are from the Arm Architecture Reference Manual for A-profile
//! (DDI 0487), section D8.3 "Translation table descriptor formats" (D5.3 in
//! older issues). The same layout serves every level:
//!
//! | bits | table descriptor (L0–L2) | block (L1, L2) / page (L3) descriptor |
//! |---|---|---|
//! | 0 | valid | valid |
//! | 1 | 1 = table | L1/L2: 0 = block; L3: 1 = page (0 is reserved) |
//! | 4:2 | ignored | AttrIndx (index into MAIR_EL1) |
//! | 5 | ignored | NS (ignored in the Non-secure regime) |
//! | 7:6 | ignored | AP\[2:1\]: bit 7 = read-only, bit 6 = EL0 access |
//! | 9:8 | ignored | SH (shareability) |
//! | 10 | ignored | AF (access flag) |
//! | 11 | ignored | nG (not global: tagged with the ASID) |
//! | 47:12 | next-level table address | output address (blocks: 47:30 or 47:21) |
//! | 50 | ignored | GP (BTI guarded page, unused here) |
//! | 51 | ignored | DBM (dirty bit modifier; Linux's `PTE_WRITE`) |
//! | 52 | ignored | Contiguous hint |
//! | 53 | ignored | PXN (privileged execute-never) |
//! | 54 | ignored | UXN (unprivileged execute-never) |
//! | 58:55 | ignored | software use; bit 55 = software dirty |
//! | 59 | PXNTable | ignored (PBHA) |
//! | 60 | UXNTable | ignored (PBHA) |
//! | 62:61 | APTable | ignored (PBHA) |
//! | 63 | NSTable | ignored |
//!
//! # Software entries
//!
//! A descriptor with bit 0 clear is invalid at every level, and the
//! hardware ignores its other bits (Arm ARM D8.3.1 "Invalid descriptors":
//! bits\[63:1\] are available to software); FEAT_HAFDBS never updates an
//! invalid descriptor (D8.5), and no TLB caches it. This crate's software
//! entries
//! ([`Format::swp_entry`](pgtable_core::contract::Format::swp_entry), Linux's swap
//! and migration entries) use:
//!
//! | bits | software entry |
//! |---|---|
//! | 0 | 0 (invalid) |
//! | 1 | 0 |
//! | 2 | 1 (tag) |
//! | 11:3 | 0 |
//! | 57:12 | the value (46 bits) |
//! | 63:58 | 0 (bit 58 marks a `PROT_NONE` leaf, [`PROT_NONE`]) |
//!
//! # `PROT_NONE` leaves
//!
//! A [`Prot::NONE`](pgtable_core::Prot::NONE) leaf is the kernel read-only
//! leaf of its memory type (nG set) with valid clear and bit 58
//! ([`PROT_NONE`]) set, as Linux's `PAGE_NONE` (`PTE_PROT_NONE`): the
//! hardware faults on it (Arm ARM D8.3.1) and caches nothing, software
//! still reads its output address. Software entries keep bit 58 clear, so
//! the two never meet.

use static_assertions::{const_assert, const_assert_eq};

/// Valid, bit \[0\].
pub const VALID: u64 = 1 << 0;
/// Table (L0–L2) or page (L3) descriptor, bit \[1\]; clear = block at L1/L2.
pub const TABLE_OR_PAGE: u64 = 1 << 1;
/// AttrIndx\[2:0\], bits \[4:2\]: index of the memory attributes in MAIR_EL1.
pub const ATTR_INDX_MASK: u64 = 0b111 << ATTR_INDX_SHIFT;
/// Shift of the AttrIndx field.
pub const ATTR_INDX_SHIFT: u32 = 2;
/// NS, bit \[5\] (ignored in the Non-secure EL1&0 regime; always 0 here).
pub const NS: u64 = 1 << 5;
/// AP\[1\], bit \[6\]: EL0 (user) access allowed (Linux `PTE_USER`).
pub const AP_EL0: u64 = 1 << 6;
/// AP\[2\], bit \[7\]: read-only at every exception level (Linux `PTE_RDONLY`).
pub const AP_RDONLY: u64 = 1 << 7;
/// SH\[1:0\], bits \[9:8\]: shareability.
pub const SH_MASK: u64 = 0b11 << 8;
/// SH = 0b11: Inner Shareable.
pub const SH_INNER: u64 = 0b11 << 8;
/// SH = 0b10: Outer Shareable.
pub const SH_OUTER: u64 = 0b10 << 8;
/// AF, bit \[10\]: access flag.
pub const AF: u64 = 1 << 10;
/// nG, bit \[11\]: not global (the TLB entry is tagged with the ASID).
pub const NG: u64 = 1 << 11;
/// Output address / next-level table address, bits \[47:12\].
pub const OA_MASK: u64 = ((1 << 48) - 1) & !0xfff;
/// GP, bit \[50\]: BTI guarded page (never set by this crate).
pub const GP: u64 = 1 << 50;
/// DBM, bit \[51\]: dirty bit modifier; here (as in Linux) "writable".
pub const DBM: u64 = 1 << 51;
/// Contiguous, bit \[52\]: hint that 16 adjacent entries map contiguous
/// output addresses with identical attributes.
pub const CONT: u64 = 1 << 52;
/// PXN, bit \[53\]: privileged (EL1) execute-never.
pub const PXN: u64 = 1 << 53;
/// UXN, bit \[54\]: unprivileged (EL0) execute-never.
pub const UXN: u64 = 1 << 54;
/// Software dirty, bit \[55\] (the first of the software bits \[58:55\]).
pub const SW_DIRTY: u64 = 1 << 55;
/// Software-use bits \[58:55\] of block and page descriptors.
pub const SW_MASK: u64 = 0b1111 << 55;
/// Software bit \[58\] with valid clear: a
/// [`Prot::NONE`](pgtable_core::Prot::NONE) leaf (Linux `PTE_PROT_NONE`),
/// the rest of the descriptor laid out as a kernel read-only leaf.
pub const PROT_NONE: u64 = 1 << 58;
/// The low 12 bits of a software entry (bit 0, valid, clear).
pub const SWP_TAG: u64 = 1 << 2;
/// The value field of a software entry (bits 12-57).
pub const SWP_VALUE_SHIFT: u32 = 12;
/// PXNTable, bit \[59\] of a table descriptor.
pub const PXN_TABLE: u64 = 1 << 59;
/// UXNTable, bit \[60\] of a table descriptor.
pub const UXN_TABLE: u64 = 1 << 60;
/// APTable\[1:0\], bits \[62:61\] of a table descriptor.
pub const AP_TABLE_MASK: u64 = 0b11 << 61;
/// APTable\[0\], bit \[61\]: no EL0 access at later levels.
pub const AP_TABLE_NO_EL0: u64 = 1 << 61;
/// APTable\[1\], bit \[62\]: no write access at later levels.
pub const AP_TABLE_RDONLY: u64 = 1 << 62;
/// NSTable, bit \[63\] of a table descriptor.
pub const NS_TABLE: u64 = 1 << 63;

/// MAIR_EL1 index of Normal memory, Inner/Outer Write-Back Non-transient,
/// Read/Write-Allocate (attribute byte `0xff`).
pub const MAIR_IDX_NORMAL: u64 = 0;
/// MAIR_EL1 index of Normal memory, Inner/Outer Non-cacheable (`0x44`).
pub const MAIR_IDX_NORMAL_NC: u64 = 1;
/// MAIR_EL1 index of Device-nGnRE memory (`0x04`).
pub const MAIR_IDX_DEVICE_NGNRE: u64 = 2;
/// MAIR_EL1 index of Device-nGnRnE memory (`0x00`; indices 4–7 are too).
pub const MAIR_IDX_DEVICE_NGNRNE: u64 = 3;

// Layout checks: the fields above are disjoint and where the Arm ARM puts them.
const_assert_eq!(
    VALID & TABLE_OR_PAGE & ATTR_INDX_MASK & AP_EL0 & AP_RDONLY & SH_MASK & AF & NG,
    0
);
const_assert_eq!(
    (VALID | TABLE_OR_PAGE | ATTR_INDX_MASK | NS | AP_EL0 | AP_RDONLY | SH_MASK | AF | NG)
        & OA_MASK,
    0
);
const_assert_eq!(
    (VALID | TABLE_OR_PAGE | ATTR_INDX_MASK | NS | AP_EL0 | AP_RDONLY | SH_MASK | AF | NG)
        .count_ones(),
    12
);
const_assert_eq!((GP | DBM | CONT | PXN | UXN | SW_MASK).count_ones(), 9);
const_assert_eq!((GP | DBM | CONT | PXN | UXN | SW_MASK) & OA_MASK, 0);
const_assert_eq!(OA_MASK.count_ones(), 36);
const_assert!(SW_DIRTY & SW_MASK != 0);
const_assert!(PROT_NONE & SW_MASK != 0 && PROT_NONE != SW_DIRTY);

/// OA\[51:50\] (and a table descriptor's next-level address bits
/// \[51:50\]) in descriptor bits \[9:8\] with the 4 and 16 KiB granules
/// and TCR_EL1.DS = 1 (FEAT_LPA2; Arm ARM D8.3.1, Linux `PTE_ADDR_HIGH`
/// with `PTE_ADDR_HIGH_SHIFT` 42). The SH field these bits hold otherwise
/// moves to TCR_EL1.SH0 / SH1.
pub const OA_HIGH_LPA2: u64 = 0b11 << 8;
/// OA\[51:48\] in descriptor bits \[15:12\] with the 64 KiB granule and
/// 52-bit output addresses (FEAT_LPA; Arm ARM D8.3.1, Linux
/// `PTE_ADDR_HIGH` with `PTE_ADDR_HIGH_SHIFT` 36).
pub const OA_HIGH_LPA_64K: u64 = 0xf << 12;

const_assert_eq!(OA_HIGH_LPA2, SH_MASK);
const_assert_eq!(
    OA_HIGH_LPA_64K & (VALID | TABLE_OR_PAGE | ATTR_INDX_MASK | AF | NG),
    0
);
