//! A small, documented format for tests of the generic algorithms.
//!
//! It behaves like a real MMU format (table/block/page descriptors,
//! write/user/execute-never permissions, accessed and dirty bits that the
//! (simulated) hardware sets) but its bits are easy to read in a failing
//! assertion. It uses every generic fallback of [`Arch`], so it is also the
//! reference for what the fallbacks do. The number of levels is a
//! parameter (3, 4 or 5).
//!
//! | bits | meaning |
//! |---|---|
//! | 0 | valid |
//! | 1 | height > 0: table (1) or block (0); height 0: must be 1 (page) |
//! | 2 | writable |
//! | 3 | user |
//! | 4 | execute-never |
//! | 5 | accessed |
//! | 6 | dirty |
//! | 7 | global |
//! | 8–9 | memory type (0 normal, 1 normal non-cacheable, 2 device) |
//! | 10 | [`Prot::NONE`] (with bit 0 clear) |
//! | 12–47 | output address |
//!
//! A [`Prot::NONE`] leaf is the kernel read-only leaf of its memory type
//! with bit 0 clear and bit 10 ([`PROT_NONE`]) set: invalid for the
//! walker, a leaf for the algorithms.
//!
//! A *software entry* ([`Format::swp_entry`]) has bit 0 clear, low 12 bits
//! exactly [`SWP_TAG`] (bit 1) and its 52-bit value in bits 12–63; the
//! walker ignores it (bit 0 clear) at every height.
//!
//! Table entries (valid, bit 1 set, above height 0) carry the table-level
//! attributes ([`TableAttrs`]) in bits 8–11: 8 no user access, 9 read-only,
//! 10 no user execution, 11 no privileged execution.

use crate::{Access, AccessFault, Arch, Decoded, Format, MemType, PhysAddr, Prot, TableAttrs};

/// The test format with `L` levels (default 4: 48-bit VA), pages of
/// `1 << P` bytes (default 12: 4 KiB; 14 and 16 give arm64's 16 KiB and
/// 64 KiB granules) and `VA` bits of virtual address (0, the default: as
/// many as full tables translate; fewer leave the root partly used, as
/// arm64 with 16 KiB pages and 48 bits does).
#[derive(Clone, Copy, Debug, Default)]
pub struct TestFormat<const L: u32 = 4, const P: u32 = 12, const VA: u32 = 0>;

/// Valid bit.
pub const VALID: u64 = 1 << 0;
/// Table (height > 0) or page (height 0) bit.
pub const TABLE_OR_PAGE: u64 = 1 << 1;
/// Writable.
pub const WRITE: u64 = 1 << 2;
/// User accessible.
pub const USER: u64 = 1 << 3;
/// Execute-never.
pub const XN: u64 = 1 << 4;
/// Accessed.
pub const ACCESSED: u64 = 1 << 5;
/// Dirty.
pub const DIRTY: u64 = 1 << 6;
/// Global.
pub const GLOBAL: u64 = 1 << 7;
/// Memory type field.
pub const MEM_MASK: u64 = 3 << 8;
/// Marks a [`Prot::NONE`] leaf (valid bit clear).
pub const PROT_NONE: u64 = 1 << 10;
/// Output address field.
pub const ADDR_MASK: u64 = ((1 << 48) - 1) & !0xfff;
/// The low 12 bits of a software entry (valid bit clear).
pub const SWP_TAG: u64 = 1 << 1;
/// Table entry: no user access below ([`TableAttrs::NO_USER`]).
pub const TABLE_NO_USER: u64 = 1 << 8;
/// Table entry: no writes below ([`TableAttrs::READ_ONLY`]).
pub const TABLE_READ_ONLY: u64 = 1 << 9;
/// Table entry: no user execution below ([`TableAttrs::UXN`]).
pub const TABLE_UXN: u64 = 1 << 10;
/// Table entry: no privileged execution below ([`TableAttrs::PXN`]).
pub const TABLE_PXN: u64 = 1 << 11;

const PROT_MASK: u64 = VALID | PROT_NONE | WRITE | USER | XN | GLOBAL | MEM_MASK;

/// The bits of [`PROT_MASK`] for `prot`: a `NONE` one is its accessible
/// twin with the valid bit swapped for [`PROT_NONE`].
fn prot_bits(prot: Prot) -> u64 {
    if prot.protnone() {
        return prot_bits(prot.without_none()) & !VALID | PROT_NONE;
    }
    let mut b = VALID;
    if prot.writable() {
        b |= WRITE;
    }
    if prot.user() {
        b |= USER;
    }
    if !prot.executable() {
        b |= XN;
    }
    if prot.global() {
        b |= GLOBAL;
    }
    b | match prot.mem() {
        MemType::Normal => 0,
        MemType::NormalNonCacheable => 1 << 8,
        MemType::Device => 2 << 8,
    }
}

// SAFETY: a table entry is the only value with both VALID and
// TABLE_OR_PAGE set at a height above 0, and decodes to the address it was
// built from (bits 12-47, and `PA_BITS` is 48; `table_entry_attrs` adds
// only bits 8-11); leaves above height 0 never
// get TABLE_OR_PAGE (`leaf_template` leaves it clear, `modify_prot` and
// `hw_access` and the `mk*` methods keep it, `split_leaf` sets it only for
// height-0 children);
// height 0 never decodes as a table. Software entries have VALID clear,
// so they decode as invalid at every height (their bit 10 is clear, so
// never as a PROT_NONE leaf, which decodes as a leaf or invalid, never a
// table). Every method is pure.
unsafe impl<const L: u32, const P: u32, const VA: u32> Format for TestFormat<L, P, VA> {
    const NAME: &'static str = "test";
    const LEVELS: u32 = L;
    const PA_BITS: u32 = 48;
    const PAGE_SHIFT: u32 = P;
    const VA_BITS: u32 = if VA == 0 { P + (P - 3) * L } else { VA };

    fn leaf_allowed(height: u32) -> bool {
        height <= 2
    }

    fn decode(raw: u64, height: u32) -> Decoded {
        if raw == 0 {
            Decoded::None
        } else if raw & VALID == 0 {
            // A PROT_NONE leaf: what the valid twin decodes to, if a leaf.
            match Self::decode(raw | VALID, height) {
                Decoded::Leaf(pa) if raw & PROT_NONE != 0 => Decoded::Leaf(pa),
                _ => Decoded::Invalid,
            }
        } else {
            let pa = PhysAddr(raw & ADDR_MASK);
            match (height, raw & TABLE_OR_PAGE != 0) {
                (0, true) => Decoded::Leaf(pa),
                (0, false) => Decoded::Invalid,
                (_, true) => Decoded::Table(pa),
                (h, false) if h <= 2 => Decoded::Leaf(pa),
                _ => Decoded::Invalid,
            }
        }
    }

    fn table_entry(pa: PhysAddr, _height: u32) -> u64 {
        pa.0 | VALID | TABLE_OR_PAGE
    }

    fn leaf_template(prot: Prot, height: u32) -> u64 {
        (if height == 0 { TABLE_OR_PAGE } else { 0 }) | prot_bits(prot)
    }

    fn leaf_prot(raw: u64, _height: u32) -> Prot {
        let mut bits = if raw & VALID == 0 {
            Prot::NONE
        } else {
            Prot::empty()
        };
        if raw & WRITE != 0 {
            bits |= Prot::WRITE;
        }
        if raw & USER != 0 {
            bits |= Prot::USER;
        }
        if raw & XN == 0 {
            bits |= Prot::EXEC;
        }
        if raw & GLOBAL != 0 {
            bits |= Prot::GLOBAL;
        }
        let mem = match (raw & MEM_MASK) >> 8 {
            0 => MemType::Normal,
            1 => MemType::NormalNonCacheable,
            _ => MemType::Device,
        };
        bits.with_mem(mem).normalized()
    }

    fn is_protnone(raw: u64, _height: u32) -> bool {
        raw & VALID == 0
    }

    fn modify_prot(raw: u64, prot: Prot, _height: u32) -> u64 {
        (raw & !PROT_MASK) | prot_bits(prot)
    }

    fn split_leaf(raw: u64, height: u32) -> u64 {
        if height == 1 {
            raw | TABLE_OR_PAGE
        } else {
            raw
        }
    }

    fn is_young(raw: u64) -> bool {
        raw & ACCESSED != 0
    }

    fn is_dirty(raw: u64) -> bool {
        raw & DIRTY != 0
    }

    fn is_settled(raw: u64, _height: u32) -> bool {
        raw & ACCESSED != 0 && (raw & DIRTY != 0 || raw & WRITE == 0)
    }

    fn hw_access(raw: u64, _height: u32, access: Access) -> Result<u64, AccessFault> {
        if access.user && raw & USER == 0 {
            return Err(AccessFault::Privilege);
        }
        if access.write && raw & WRITE == 0 {
            return Err(AccessFault::Write);
        }
        if access.exec && raw & XN != 0 {
            return Err(AccessFault::Exec);
        }
        Ok(raw | ACCESSED | if access.write { DIRTY } else { 0 })
    }

    const SWP_VALUE_BITS: u32 = 52;

    fn swp_entry(value: u64) -> Option<u64> {
        (value >> Self::SWP_VALUE_BITS == 0).then_some(value << 12 | SWP_TAG)
    }

    fn swp_value(raw: u64) -> Option<u64> {
        (raw & 0xfff == SWP_TAG).then_some(raw >> 12)
    }

    fn table_entry_attrs(pa: PhysAddr, height: u32, attrs: TableAttrs) -> u64 {
        // Bits 8-11 in the order of the `TableAttrs` flags.
        Self::table_entry(pa, height) | u64::from(attrs.bits() & 0xf) << 8
    }

    fn table_limits(raw: u64, _height: u32) -> TableAttrs {
        TableAttrs::new(((raw >> 8) & 0xf) as u8)
    }

    fn mkold(raw: u64, _height: u32) -> u64 {
        raw & !ACCESSED
    }

    fn mkyoung(raw: u64, _height: u32) -> u64 {
        raw | ACCESSED
    }

    /// The hardware sets DIRTY on a store through a writable leaf, so a
    /// clean leaf stays writable.
    fn mkclean(raw: u64, _height: u32) -> u64 {
        raw & !DIRTY
    }

    fn mkdirty(raw: u64, _height: u32) -> u64 {
        raw | DIRTY
    }
}

// SAFETY: every entry operation is the generic fallback.
unsafe impl<const L: u32, const P: u32, const VA: u32> Arch for TestFormat<L, P, VA> {
    const HAVE_MOVE_PMD: bool = true;
    const HAVE_MOVE_PUD: bool = true;
    const TLB_FLUSH_CEILING: u64 = 33;
    const NEEDS_WALKER_BARRIER: bool = true;
    const BREAK_BEFORE_MAKE: bool = true;
}
