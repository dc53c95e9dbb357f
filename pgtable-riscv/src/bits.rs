//! The bits of an Sv39/Sv48/Sv57 page-table entry, named as the RISC-V
//! privileged specification names them.
//!
//! References are to "The RISC-V Instruction Set Manual, Volume II:
//! Privileged Architecture", chapter "Supervisor-Level ISA": the sections
//! "Sv32: Page-Based 32-bit Virtual-Memory Systems" (the PTE bits V, R, W,
//! X, U, G, A, D and RSW, and the address-translation process), "Sv39",
//! "Sv48" and "Sv57" (the 64-bit PTE with its 44-bit PPN), and the chapters
//! of the extensions "Svnapot" (bit 63, N), "Svpbmt" (bits 62:61, PBMT) and
//! "Svinval".
//!
//! | bits | leaf PTE (R, W or X set) | non-leaf PTE (R = W = X = 0) |
//! |---|---|---|
//! | 0 | V (valid) | V |
//! | 1, 2, 3 | R, W, X | 0 |
//! | 4 | U (user) | reserved (0) |
//! | 5 | G (global) | G (global below) |
//! | 6, 7 | A (accessed), D (dirty) | reserved (0) |
//! | 9:8 | RSW (for supervisor software) | RSW |
//! | 53:10 | PPN\[\*\] of the page | PPN of the next table |
//! | 60:54 | reserved (0) | reserved (0) |
//! | 62:61 | PBMT (Svpbmt; reserved without it) | reserved (0) |
//! | 63 | N (Svnapot; reserved without it) | reserved (0) |
//!
//! The privileged specification requires a page fault for a walk that
//! meets a set reserved bit or encoding ("if any bits or encodings that are
//! reserved for future standard use are set within pte, stop and raise a
//! page-fault exception"), for W = 1 with R = 0, and for a misaligned
//! superpage; [`Format::decode`](pgtable_core::contract::Format::decode) reports all
//! of them as [`Decoded::Invalid`](pgtable_core::contract::Decoded::Invalid).

use static_assertions::const_assert;

/// Bit 0, V: the PTE is valid. With V = 0 every other bit is free for
/// software and the walker raises a page fault.
pub const V: u64 = 1 << 0;
/// Bit 1, R: readable.
pub const R: u64 = 1 << 1;
/// Bit 2, W: writable. W = 1 with R = 0 is reserved.
pub const W: u64 = 1 << 2;
/// Bit 3, X: executable.
pub const X: u64 = 1 << 3;
/// R, W and X: all clear in a pointer to the next level of the table.
pub const RWX: u64 = R | W | X;
/// Bit 4, U: accessible to U-mode (and to S-mode only for loads and stores
/// with sstatus.SUM = 1; S-mode never executes from it).
pub const U: u64 = 1 << 4;
/// Bit 5, G: a global mapping, present in every address space (ASID).
pub const G: u64 = 1 << 5;
/// Bit 5 with V clear: a [`Prot::NONE`](pgtable_core::Prot::NONE) leaf
/// (Linux `_PAGE_PROT_NONE`, which reuses G: with V = 0 every other bit is
/// free for software). The rest is laid out as a kernel read-only leaf (R
/// set, so it reads as a leaf at any level, as Linux's `PAGE_NONE` does).
pub const PROT_NONE: u64 = G;
/// Bit 6, A: accessed.
pub const A: u64 = 1 << 6;
/// Bit 7, D: dirty (written).
pub const D: u64 = 1 << 7;
/// Bits 9:8, RSW: reserved for use by supervisor software; the hardware
/// ignores them.
pub const RSW: u64 = 0b11 << 8;
/// First bit of the PPN field.
pub const PPN_SHIFT: u32 = 10;
/// Bits 53:10, the 44-bit PPN (physical address bits 55:12).
pub const PPN_MASK: u64 = ((1 << 44) - 1) << PPN_SHIFT;
/// Physical-address bits an Sv39/Sv48/Sv57 PTE names (56).
pub const PA_BITS: u32 = 56;
/// Bits 60:54: reserved for future standard use, must be zero.
pub const RESERVED: u64 = 0x7f << 54;
/// First bit of the Svpbmt PBMT field.
pub const PBMT_SHIFT: u32 = 61;
/// Bits 62:61, PBMT (Svpbmt): the page-based memory type of a leaf.
pub const PBMT_MASK: u64 = 0b11 << PBMT_SHIFT;
/// PBMT = 0, PMA: no override; the physical memory attributes of the
/// address decide.
pub const PBMT_PMA: u64 = 0;
/// PBMT = 1, NC: non-cacheable, idempotent, weakly-ordered (RVWMO) main
/// memory.
pub const PBMT_NC: u64 = 1 << PBMT_SHIFT;
/// PBMT = 2, IO: non-cacheable, non-idempotent, strongly-ordered I/O.
pub const PBMT_IO: u64 = 2 << PBMT_SHIFT;
/// PBMT = 3: reserved for future standard use.
pub const PBMT_RESERVED: u64 = 3 << PBMT_SHIFT;
/// Bit 63, N (Svnapot): the leaf is part of a naturally aligned
/// power-of-two run; with PPN\[0\]\[3:0\] = `0b1000` a 64 KiB run of 16
/// 4 KiB pages (the only size Svnapot defines).
pub const N: u64 = 1 << 63;
/// PPN\[0\]\[3:0\] of a 64 KiB NAPOT PTE: `0b1000`, i.e. entry bit 13.
pub const NAPOT_64K_PPN: u64 = 0b1000 << PPN_SHIFT;
/// The 4 KiB pages of a 64 KiB NAPOT run (16 PTEs).
pub const NAPOT_64K_PAGES: u32 = 16;
/// PPN\[0\]\[3:0\], the bits a NAPOT PTE replaces by the address's
/// VPN\[0\]\[3:0\].
pub const NAPOT_64K_MASK: u64 = 0b1111 << PPN_SHIFT;
/// The tag of this crate's software entries: RSW bit 8 in an entry with
/// V = 0 (see the format docs).
pub const SWP_TAG: u64 = 1 << 8;
/// First bit of a software entry's value.
pub const SWP_VALUE_SHIFT: u32 = 10;

/// The entry field for the 4 KiB-aligned physical address `pa`: its PPN
/// (`pa >> 12`) at bit 10.
#[inline]
pub const fn ppn_bits(pa: u64) -> u64 {
    pa >> (12 - PPN_SHIFT)
}

/// The physical address the PPN field of `raw` names.
#[inline]
pub const fn pa_of(raw: u64) -> u64 {
    (raw & PPN_MASK) << (12 - PPN_SHIFT)
}

// The fields do not overlap and cover the 64 bits.
const_assert!((V | RWX | U | G | A | D) & (RSW | PPN_MASK | RESERVED | PBMT_MASK | N) == 0);
const_assert!(RSW & (PPN_MASK | RESERVED | PBMT_MASK | N) == 0);
const_assert!(PPN_MASK & (RESERVED | PBMT_MASK | N) == 0);
const_assert!(V | RWX | U | G | A | D | RSW | PPN_MASK | RESERVED | PBMT_MASK | N == u64::MAX);
// The PPN field holds exactly the 56-bit physical address space.
const_assert!(pa_of(u64::MAX) == ((1 << PA_BITS) - 1) & !0xfff);

/// Address bits one level translates with 4 KiB pages: 512 eight-byte
/// entries per table.
pub(crate) const LEVEL_BITS: u32 = 9;
