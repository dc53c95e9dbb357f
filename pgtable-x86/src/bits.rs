//! The bits of an x86-64 paging-structure entry, named as the Intel SDM
//! names them.
//!
//! References are to the Intel 64 and IA-32 Architectures Software
//! Developer's Manual, Volume 3A, Chapter 4 "Paging", §4.5 "4-Level Paging
//! and 5-Level Paging" and its entry-format tables (numbering of the
//! editions that describe 5-level paging):
//!
//! | table | entry |
//! |---|---|
//! | 4-14 | PML5E, references a PML4 table (5-level only) |
//! | 4-15 | PML4E, references a page-directory-pointer table |
//! | 4-16 | PDPTE, maps a 1-GByte page (PS = 1) |
//! | 4-17 | PDPTE, references a page directory (PS = 0) |
//! | 4-18 | PDE, maps a 2-MByte page (PS = 1) |
//! | 4-19 | PDE, references a page table (PS = 0) |
//! | 4-20 | PTE, maps a 4-KByte page |
//!
//! 5-level paging (CR4.LA57 = 1) adds the PML5 level above PML4 and uses the
//! same formats for every other level (§4.5, Figure 4-11). Bits this module
//! does not name are either part of the address field, *ignored* (free for
//! software: 11:8 / 11:9 and 62:52 / 58:52) or *reserved* (must be 0, see
//! [`validate`](crate::X86Paging::validate)).

use static_assertions::{const_assert, const_assert_eq};

/// Bit 0, P (Present): must be 1 to reference a table or map a page; every
/// other bit is ignored when it is 0 (Tables 4-14..4-20, bit 0; §4.5.4:
/// a not-present entry causes a page fault).
pub const P: u64 = 1 << 0;

/// Bit 1, R/W (Read/write): if 0, writes are not allowed to the region the
/// entry controls (with CR0.WP = 1 not even from supervisor mode;
/// Tables 4-14..4-20, bit 1; §4.6).
pub const RW: u64 = 1 << 1;

/// Bit 2, U/S (User/supervisor): if 0, user-mode accesses (CPL = 3) are not
/// allowed to the region the entry controls (Tables 4-14..4-20, bit 2; §4.6).
pub const US: u64 = 1 << 2;

/// Bit 3, PWT (Page-level write-through): bit 0 of the PAT index of a page,
/// or the memory type used to access the next table (Tables 4-14..4-20,
/// bit 3; §4.9.2 and the PAT section "Selecting a Memory Type from the PAT").
pub const PWT: u64 = 1 << 3;

/// Bit 4, PCD (Page-level cache disable): bit 1 of the PAT index of a page,
/// or the memory type used to access the next table (Tables 4-14..4-20,
/// bit 4; §4.9.2).
pub const PCD: u64 = 1 << 4;

/// Bit 5, A (Accessed): set by the processor whenever it uses the entry for
/// a translation (Tables 4-14..4-20, bit 5; §4.8).
pub const A: u64 = 1 << 5;

/// Bit 6, D (Dirty): set by the processor on a write through a leaf (PTE, or
/// PDPTE/PDE with PS = 1); ignored in entries that reference a table
/// (Tables 4-16, 4-18, 4-20, bit 6; §4.8).
pub const D: u64 = 1 << 6;

/// Bit 7, PS (Page size) in a PDPTE or PDE: 1 maps a 1-GByte / 2-MByte page,
/// 0 references the next table (Tables 4-16..4-19, bit 7). Reserved (must
/// be 0) in a PML4E and a PML5E (Tables 4-14, 4-15, bit 7). In a PTE the
/// same bit is [`PAT_4K`].
pub const PS: u64 = 1 << 7;

/// Bit 7, PAT in a PTE: bit 2 of the PAT index of a 4-KByte page (Table 4-20,
/// bit 7; §4.9.2). The same bit position as [`PS`] at the upper levels.
pub const PAT_4K: u64 = 1 << 7;

/// Bit 8, G (Global): with CR4.PGE = 1 the translation is global, i.e. not
/// invalidated by a MOV to CR3 (leaves only: Tables 4-16, 4-18, 4-20, bit 8;
/// §4.10.2.4). Ignored in entries that reference a table.
pub const G: u64 = 1 << 8;

/// Bit 8 with P clear: a [`Prot::NONE`](pgtable_core::Prot::NONE) leaf
/// (Linux `_PAGE_PROTNONE`, which reuses G: the processor ignores every
/// bit of a not-present entry, §4.5.4). The rest of the entry is laid out
/// as a kernel read-only leaf of its memory type (PS kept in a huge one).
pub const PROTNONE: u64 = G;

/// Bit 12, PAT in a PDPTE or PDE that maps a page (PS = 1): bit 2 of the PAT
/// index of a 1-GByte / 2-MByte page (Tables 4-16, 4-18, bit 12; §4.9.2).
/// Inside the address field of every other entry.
pub const PAT_HUGE: u64 = 1 << 12;

/// Bits 62:59, protection key of a leaf (Tables 4-16, 4-18, 4-20; §4.6.2):
/// selects the PKRU (user pages, CR4.PKE) or IA32_PKRS (supervisor pages,
/// CR4.PKS) rights. Ignored when those features are off and in entries that
/// reference a table.
pub const PKEY_MASK: u64 = 0xf << PKEY_SHIFT;
/// First bit of the protection key.
pub const PKEY_SHIFT: u32 = 59;

/// Bit 63, XD (Execute-disable): with IA32_EFER.NXE = 1, instruction fetches
/// are not allowed from the region the entry controls (Tables 4-14..4-20,
/// bit 63; §4.6). Reserved when NXE = 0; this crate requires NXE = 1.
pub const XD: u64 = 1 << 63;

/// Bits 51:12, the widest physical-address field (MAXPHYADDR = 52). With a
/// smaller MAXPHYADDR `M`, bits 51:M are reserved (Tables 4-14..4-20,
/// "(M–1):12" / "51:M Reserved (must be 0)"; §4.1.4 for MAXPHYADDR).
pub const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

/// The architectural limit of MAXPHYADDR (§4.1.4: at most 52).
pub const MAX_PHYS_BITS: u32 = 52;

/// Bits 20:13 of a PDE that maps a 2-MByte page: reserved, must be 0
/// (Table 4-18).
pub const RSVD_2M: u64 = ((1 << 21) - 1) & !((1 << 13) - 1);

/// Bits 29:13 of a PDPTE that maps a 1-GByte page: reserved, must be 0
/// (Table 4-16).
pub const RSVD_1G: u64 = ((1 << 30) - 1) & !((1 << 13) - 1);

/// The software-available (ignored) bits of a leaf: 11:9 and 58:52
/// (Tables 4-16, 4-18, 4-20). This crate never sets them and keeps them
/// through every entry transformation.
pub const SW_LEAF: u64 = (0x7 << 9) | (0x7f << 52);

/// The low 12 bits of a software entry (P clear; see the format docs).
pub const SWP_TAG: u64 = 1 << 1;

/// The first bit of a software entry's (inverted) value.
pub const SWP_VALUE_SHIFT: u32 = 12;

/// Bits 51:M, reserved for a MAXPHYADDR of `m` (Tables 4-14..4-20).
#[inline]
pub const fn reserved_high(m: u32) -> u64 {
    ADDR_MASK & !((1u64 << m) - 1)
}

/// The PAT bit of a leaf at `height`: bit 7 at the PTE level, bit 12 in a
/// PDPTE or PDE that maps a page.
#[inline]
const fn pat_bit(height: u32) -> u64 {
    if height == 0 {
        PAT_4K
    } else {
        PAT_HUGE
    }
}

/// The PAT/PCD/PWT bits of a leaf at `height` (the PAT bit moves from bit 7
/// at the PTE level to bit 12 in a PDPTE or PDE that maps a page).
#[inline]
pub const fn mem_bits(height: u32) -> u64 {
    PWT | PCD | pat_bit(height)
}

/// The 3-bit PAT index `PAT:PCD:PWT` of a leaf at `height` (§4.9.2, and
/// the PAT section's table "Selection of PAT Entries with PAT, PCD, and PWT
/// Flags").
#[inline]
pub const fn pat_index(raw: u64, height: u32) -> u8 {
    ((raw & pat_bit(height) != 0) as u8) << 2
        | ((raw & PCD != 0) as u8) << 1
        | (raw & PWT != 0) as u8
}

/// The PAT/PCD/PWT bits that select PAT entry `index` (0..8) for a leaf at
/// `height`.
#[inline]
pub const fn pat_bits(index: u8, height: u32) -> u64 {
    (if index & 4 != 0 { pat_bit(height) } else { 0 })
        | (if index & 2 != 0 { PCD } else { 0 })
        | (if index & 1 != 0 { PWT } else { 0 })
}

// The PTE's PAT bit shares bit 7 with PS of the upper levels (Table 4-20).
const_assert_eq!(PAT_4K, PS);
// The huge-page PAT bit is bit 12, inside the 4-KByte address field but
// below the smallest huge-page alignment (2 MiB), and outside the reserved
// bits of both huge formats.
const_assert!(PAT_HUGE & ADDR_MASK != 0);
const_assert!(PAT_HUGE & (RSVD_2M | RSVD_1G) == 0);
const_assert!(PAT_HUGE < (1 << 21));
// Flags, protection key, software bits and address do not overlap.
const_assert!((P | RW | US | PWT | PCD | A | D | PS | G | XD) & (ADDR_MASK | PKEY_MASK) == 0);
const_assert!(PKEY_MASK & (ADDR_MASK | SW_LEAF | XD) == 0);
const_assert!(SW_LEAF & (ADDR_MASK | P | RW | US | PWT | PCD | A | D | PS | G) == 0);
const_assert!(RSVD_1G & RSVD_2M == RSVD_2M);
const_assert_eq!(reserved_high(MAX_PHYS_BITS), 0);

/// Address bits one level translates with 4 KiB pages: 512 eight-byte
/// entries per table.
pub(crate) const LEVEL_BITS: u32 = 9;
