//! System register values the format assumes (pure, host-testable).
//!
//! [`MAIR_VALUE`] gives the memory types of the AttrIndx
//! values; [`tcr_value`] the translation control; [`SCTLR_MMU_BITS`] the
//! SCTLR_EL1 bits that turn the MMU and caches on; [`Asid`], [`AsidBits`]
//! and [`ttbr0_value`] the address space identifier in TTBR0_EL1.
//! [`tcr_value_for`] is [`tcr_value`] for any [`Granule`], with
//! TCR_EL1.DS for 52-bit addresses ([`TcrGeometry`]).

use core::fmt;

use bit_field::BitField;
use static_assertions::const_assert_eq;

use crate::bits::{
    MAIR_IDX_DEVICE_NGNRE, MAIR_IDX_DEVICE_NGNRNE, MAIR_IDX_NORMAL, MAIR_IDX_NORMAL_NC,
};
use crate::granule::{pa_bits_of_range, Geometry, GeometryError, Granule};

/// The MAIR_EL1 value the format assumes (Arm ARM D19.2 "MAIR_EL1"): one
/// attribute byte per AttrIndx, Attr0 in bits \[7:0\].
///
/// | AttrIndx | byte | memory type |
/// |---|---|---|
/// | 0 | `0xff` | Normal, Inner/Outer Write-Back RW-Allocate ([`MemType::Normal`]) |
/// | 1 | `0x44` | Normal, Inner/Outer Non-cacheable ([`MemType::NormalNonCacheable`]) |
/// | 2 | `0x04` | Device-nGnRE ([`MemType::Device`]) |
/// | 3–7 | `0x00` | Device-nGnRnE |
///
/// [`MemType::Normal`]: pgtable_core::MemType::Normal
/// [`MemType::NormalNonCacheable`]: pgtable_core::MemType::NormalNonCacheable
/// [`MemType::Device`]: pgtable_core::MemType::Device
pub const MAIR_VALUE: u64 = 0xff << (8 * MAIR_IDX_NORMAL)
    | 0x44 << (8 * MAIR_IDX_NORMAL_NC)
    | 0x04 << (8 * MAIR_IDX_DEVICE_NGNRE)
    | 0x00 << (8 * MAIR_IDX_DEVICE_NGNRNE);

const_assert_eq!(MAIR_VALUE, 0x0004_44ff);

/// TCR_EL1.IPS / ID_AA64MMFR0_EL1.PARange encoding of 48 bits, the most the
/// format encodes.
pub const PARANGE_48: u64 = 0b101;

/// SCTLR_EL1.M, bit \[0\]: stage 1 MMU enable.
pub const SCTLR_M: u64 = 1 << 0;
/// SCTLR_EL1.A, bit \[1\]: alignment checking (cleared).
pub const SCTLR_A: u64 = 1 << 1;
/// SCTLR_EL1.C, bit \[2\]: data cacheability.
pub const SCTLR_C: u64 = 1 << 2;
/// SCTLR_EL1.I, bit \[12\]: instruction cacheability.
pub const SCTLR_I: u64 = 1 << 12;
/// SCTLR_EL1.WXN, bit \[19\]: write implies execute-never (cleared: the
/// format's permissions say what is executable).
pub const SCTLR_WXN: u64 = 1 << 19;
/// The bits `enable_mmu` (aarch64 only) sets in SCTLR_EL1.
pub const SCTLR_MMU_BITS: u64 = SCTLR_M | SCTLR_C | SCTLR_I;
/// The bits it clears.
pub const SCTLR_MMU_CLEAR: u64 = SCTLR_A | SCTLR_WXN;

/// What [`tcr_value`] configures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TcrConfig {
    /// The format's `VA_BITS` (48 for [`Arm64`](crate::Arm64), 39 for
    /// [`Arm64Va39`](crate::Arm64Va39)). Each half (TTBR0 low, TTBR1 high)
    /// translates `VA_BITS - 1` bits, matching the canonical addresses the
    /// format accepts.
    pub va_bits: u32,
    /// Walk TTBR1_EL1 for the high half (EPD1 = 0); otherwise high-half
    /// accesses fault without a walk (EPD1 = 1).
    pub ttbr1: bool,
    /// Intermediate physical address size, ID_AA64MMFR0_EL1.PARange
    /// encoding (capped at [`PARANGE_48`]).
    pub pa_range: u64,
    /// TCR_EL1.HA: hardware access-flag updates (needs FEAT_HAFDBS).
    pub hw_access_flag: bool,
    /// TCR_EL1.HD: hardware dirty-state updates (needs HA and FEAT_HAFDBS
    /// with dirty state).
    pub hw_dirty: bool,
    /// TCR_EL1.AS: 16-bit ASIDs (needs ID_AA64MMFR0_EL1.ASIDBits =
    /// 0b0010, see [`AsidBits::from_mmfr0`]). With AS = 0 the hardware
    /// ignores TTBR0_EL1.ASID\[15:8\], so only 8-bit [`Asid`]s may be used.
    pub asid16: bool,
}

impl TcrConfig {
    /// 48-bit VA in both halves, 48-bit PA, HA and HD on.
    pub const DEFAULT_48: TcrConfig = TcrConfig {
        va_bits: 48,
        ttbr1: true,
        pa_range: PARANGE_48,
        hw_access_flag: true,
        hw_dirty: true,
        asid16: false,
    };
}

/// The TCR_EL1 value for `cfg` (Arm ARM D19.2 "TCR_EL1"):
///
/// | field | bits | value |
/// |---|---|---|
/// | T0SZ | 5:0 | `65 - va_bits` |
/// | IRGN0 / ORGN0 | 9:8 / 11:10 | 0b01: walks Write-Back Read/Write-Allocate |
/// | SH0 | 13:12 | 0b11: Inner Shareable |
/// | TG0 | 15:14 | 0b00: 4 KiB |
/// | T1SZ | 21:16 | `65 - va_bits` |
/// | A1 | 22 | 0: the ASID comes from TTBR0_EL1 |
/// | EPD1 | 23 | `!ttbr1` |
/// | IRGN1 / ORGN1 / SH1 | 25:24 / 27:26 / 29:28 | as for TTBR0 |
/// | TG1 | 31:30 | 0b10: 4 KiB (TG1 encodes differently from TG0) |
/// | IPS | 34:32 | `pa_range` |
/// | AS | 36 | `asid16` (0: 8-bit ASIDs, 1: 16-bit) |
/// | HA / HD | 39 / 40 | `hw_access_flag` / `hw_dirty` |
///
/// This is the layout where one root serves both halves (each half
/// `VA_BITS - 1` bits, [`VaRange::Both`](pgtable_core::VaRange::Both)); for
/// separate TTBR0/TTBR1 roots use [`tcr_value_separate_halves`].
pub fn tcr_value(cfg: TcrConfig) -> u64 {
    tcr_with_txsz(cfg, txsz(cfg.va_bits, false))
}

/// The TCR_EL1 value for `cfg` with separate roots for the two halves, as
/// Linux configures arm64: TTBR0_EL1 translates `[0, 2^va_bits)` (a
/// [`VaRange::Lower`](pgtable_core::VaRange::Lower) address space) and
/// TTBR1_EL1 `[2^64 - 2^va_bits, 2^64)` (a
/// [`VaRange::Upper`](pgtable_core::VaRange::Upper) one), each through all
/// 512 entries of its own root: T0SZ = T1SZ = `64 - va_bits` (Arm ARM
/// D8.2.2 "The VA space"; Linux `TCR_T0SZ(vabits_actual)` /
/// `TCR_T1SZ(vabits_actual)`). Every other field is as in [`tcr_value`].
pub fn tcr_value_separate_halves(cfg: TcrConfig) -> u64 {
    tcr_with_txsz(cfg, txsz(cfg.va_bits, true))
}

/// The TnSZ value (T0SZ and T1SZ alike) for a format of `va_bits` bits:
/// `64 - va_bits` when each TTBR translates a whole `va_bits` half
/// (`separate_halves`), `65 - va_bits` when one root's two halves serve
/// both registers.
pub const fn txsz(va_bits: u32, separate_halves: bool) -> u64 {
    (if separate_halves { 64 } else { 65 }) - va_bits as u64
}

/// TCR_EL1.T0SZ, bits \[5:0\]: TTBR0_EL1 translates `2^(64 - T0SZ)` bytes.
pub fn tcr_t0sz(tcr: u64) -> u64 {
    tcr.get_bits(0..6)
}

/// TCR_EL1.T1SZ, bits \[21:16\]: TTBR1_EL1 translates the top
/// `2^(64 - T1SZ)` bytes.
pub fn tcr_t1sz(tcr: u64) -> u64 {
    tcr.get_bits(16..22)
}

fn tcr_with_txsz(cfg: TcrConfig, txsz: u64) -> u64 {
    tcr_fields(cfg, txsz, Granule::K4, false, cfg.pa_range.min(PARANGE_48))
}

/// TCR_EL1 from its parts; `ips` is already capped.
fn tcr_fields(cfg: TcrConfig, txsz: u64, granule: Granule, ds: bool, ips: u64) -> u64 {
    let mut v = 0u64;
    v.set_bits(0..6, txsz); // T0SZ
    v.set_bits(8..10, 0b01); // IRGN0
    v.set_bits(10..12, 0b01); // ORGN0
    v.set_bits(12..14, 0b11); // SH0
    v.set_bits(14..16, granule.tcr_tg0()); // TG0
    v.set_bits(16..22, txsz); // T1SZ
    v.set_bit(23, !cfg.ttbr1); // EPD1
    v.set_bits(24..26, 0b01); // IRGN1
    v.set_bits(26..28, 0b01); // ORGN1
    v.set_bits(28..30, 0b11); // SH1
    v.set_bits(30..32, granule.tcr_tg1()); // TG1
    v.set_bits(32..35, ips); // IPS
    v.set_bit(36, cfg.asid16); // AS
    v.set_bit(39, cfg.hw_access_flag); // HA
    v.set_bit(40, cfg.hw_access_flag && cfg.hw_dirty); // HD
    v.set_bit(59, ds); // DS
    v
}

/// TCR_EL1.IPS / ID_AA64MMFR0_EL1.PARange encoding of 52 bits (FEAT_LPA;
/// with 4 and 16 KiB pages it means 52 bits only with TCR_EL1.DS = 1).
pub const PARANGE_52: u64 = 0b110;

/// TCR_EL1.DS, bit \[59\]: 52-bit addresses with the 4 and 16 KiB granules
/// (FEAT_LPA2). RES0 with 64 KiB.
pub const TCR_DS: u64 = 1 << 59;

/// What [`tcr_value_for`] configures: a [`TcrConfig`] plus the granule and
/// TCR_EL1.DS. `cfg.va_bits` must be one of the granule's
/// [choices](Granule::va_bits_choices).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TcrGeometry {
    /// Everything the 4 KiB [`tcr_value`] takes.
    pub cfg: TcrConfig,
    /// The granule of both halves (TG0 and TG1).
    pub granule: Granule,
    /// TCR_EL1.DS: 52-bit virtual and physical addresses with the 4 and
    /// 16 KiB granules (FEAT_LPA2; Arm ARM D24.2 "TCR_EL1", DS). Needed
    /// for `va_bits` = 52 with those granules, and for IPS to mean 52 bits
    /// with them; an error with 64 KiB, where the bit is RES0.
    pub ds: bool,
}

impl TcrGeometry {
    /// The 4 KiB geometry of `cfg`, DS = 0: [`tcr_value_for`] gives what
    /// [`tcr_value`] gives.
    pub const fn k4(cfg: TcrConfig) -> TcrGeometry {
        TcrGeometry {
            cfg,
            granule: Granule::K4,
            ds: false,
        }
    }

    /// The largest IPS this geometry describes: 52 bits ([`PARANGE_52`])
    /// with 64 KiB or with DS = 1, 48 bits ([`PARANGE_48`]) otherwise
    /// (Arm ARM D24.2 "TCR_EL1", IPS: with 4 or 16 KiB and DS = 0, 0b110
    /// stands for 48 bits).
    pub const fn max_pa_range(self) -> u64 {
        if self.ds || !self.granule.has_ds() {
            PARANGE_52
        } else {
            PARANGE_48
        }
    }

    fn check(self) -> Result<(), GeometryError> {
        let geometry = Geometry::new(self.granule, self.cfg.va_bits)?;
        if self.ds && !self.granule.has_ds() {
            return Err(GeometryError::DsWith64K);
        }
        if geometry.is_52bit() && self.granule.has_ds() && !self.ds {
            return Err(GeometryError::NeedsDs {
                granule: self.granule,
                va_bits: self.cfg.va_bits,
                pa_bits: pa_bits_of_range(self.cfg.pa_range.min(PARANGE_52)).unwrap_or(52),
            });
        }
        Ok(())
    }
}

impl From<TcrConfig> for TcrGeometry {
    fn from(cfg: TcrConfig) -> TcrGeometry {
        TcrGeometry::k4(cfg)
    }
}

/// The TCR_EL1 value for `geo`, one root serving both halves: the fields
/// of [`tcr_value`] (T0SZ = T1SZ = `65 - va_bits`), with TG0 / TG1 from
/// the granule ([`Granule::tcr_tg0`], [`Granule::tcr_tg1`]), DS in bit 59,
/// and IPS = `pa_range` capped at [`TcrGeometry::max_pa_range`].
///
/// Errors: `va_bits` not a [`Geometry`] of the granule, DS with 64 KiB,
/// or 52-bit VA with 4 or 16 KiB without DS. For [`TcrGeometry::k4`] of a
/// valid `cfg` the value is [`tcr_value`]'s, bit for bit.
pub fn tcr_value_for(geo: TcrGeometry) -> Result<u64, GeometryError> {
    geo.check()?;
    Ok(tcr_fields(
        geo.cfg,
        txsz(geo.cfg.va_bits, false),
        geo.granule,
        geo.ds,
        geo.cfg.pa_range.min(geo.max_pa_range()),
    ))
}

/// [`tcr_value_for`] with separate TTBR0/TTBR1 roots: T0SZ = T1SZ =
/// `64 - va_bits` (Linux `TCR_T0SZ(vabits_actual)`), as
/// [`tcr_value_separate_halves`] for 4 KiB.
pub fn tcr_value_for_separate_halves(geo: TcrGeometry) -> Result<u64, GeometryError> {
    geo.check()?;
    Ok(tcr_fields(
        geo.cfg,
        txsz(geo.cfg.va_bits, true),
        geo.granule,
        geo.ds,
        geo.cfg.pa_range.min(geo.max_pa_range()),
    ))
}

/// TCR_EL1.TG0, bits \[15:14\], as a granule (`None` for the reserved
/// 0b11).
pub fn tcr_tg0_granule(tcr: u64) -> Option<Granule> {
    match tcr.get_bits(14..16) {
        0b00 => Some(Granule::K4),
        0b01 => Some(Granule::K64),
        0b10 => Some(Granule::K16),
        _ => None,
    }
}

/// TCR_EL1.TG1, bits \[31:30\], as a granule (`None` for the reserved
/// 0b00).
pub fn tcr_tg1_granule(tcr: u64) -> Option<Granule> {
    match tcr.get_bits(30..32) {
        0b01 => Some(Granule::K16),
        0b10 => Some(Granule::K4),
        0b11 => Some(Granule::K64),
        _ => None,
    }
}

/// The TTBR1_EL1 base that makes a root's high half (entries 256–511)
/// translate the high canonical half: the root plus 2 KiB. With T1SZ =
/// 65 - VA the TTBR1 walk's top table has 256 entries and must be aligned
/// to 2 KiB, which the root's second half is.
#[inline]
pub const fn ttbr1_base(root: u64) -> u64 {
    root + 256 * 8
}

/// The ASID width a CPU uses: 8 bits, or 16 with FEAT_ASID16 and
/// TCR_EL1.AS = 1 (Arm ARM D8 "The AArch64 Virtual Memory System
/// Architecture", "Address Space Identifiers"; D19.2 "ID_AA64MMFR0_EL1").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AsidBits {
    /// 8-bit ASIDs (0..=255).
    Bits8,
    /// 16-bit ASIDs (0..=65535).
    Bits16,
}

impl AsidBits {
    /// The widest ASIDs an ID_AA64MMFR0_EL1 value reports: ASIDBits,
    /// bits \[7:4\], 0b0010 = 16 bits, 0b0000 = 8 bits (other values are
    /// reserved and taken as 8).
    pub const fn from_mmfr0(mmfr0: u64) -> AsidBits {
        if (mmfr0 >> 4) & 0xf == 0b0010 {
            AsidBits::Bits16
        } else {
            AsidBits::Bits8
        }
    }

    /// The number of bits (8 or 16), for an ASID allocator
    /// (`pgtable_core::asid`).
    pub const fn bits(self) -> u32 {
        match self {
            AsidBits::Bits8 => 8,
            AsidBits::Bits16 => 16,
        }
    }
}

/// An ASID that fits the width it was checked against: what goes into
/// TTBR0_EL1.ASID and the TLBI operands. An 8-bit value always fits
/// ([`Asid::from_u8`]); a wider one only with [`AsidBits::Bits16`]
/// ([`Asid::new`]). The hardware would silently drop ASID\[15:8\] with
/// TCR_EL1.AS = 0, making two address spaces share an ASID, so a value
/// that does not fit is an error, never truncated.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Asid(u16);

impl Asid {
    /// `asid`, if it fits `width`.
    pub const fn new(asid: u16, width: AsidBits) -> Result<Asid, AsidTooWide> {
        match width {
            AsidBits::Bits8 if asid > 0xff => Err(AsidTooWide { asid }),
            _ => Ok(Asid(asid)),
        }
    }

    /// An 8-bit ASID (fits every width).
    pub const fn from_u8(asid: u8) -> Asid {
        Asid(asid as u16)
    }

    /// The value.
    pub const fn get(self) -> u16 {
        self.0
    }
}

/// An ASID above 255 for a CPU (or TCR_EL1.AS setting) with 8-bit ASIDs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AsidTooWide {
    /// The value that did not fit.
    pub asid: u16,
}

impl fmt::Display for AsidTooWide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ASID {:#x} does not fit 8 bits", self.asid)
    }
}

impl core::error::Error for AsidTooWide {}

/// The TTBR0_EL1 value for `root` and `asid`: BADDR in bits \[47:1\] (the
/// 4 KiB-aligned root), ASID in bits \[63:48\] (Arm ARM D19.2
/// "TTBR0_EL1"; TCR_EL1.A1 = 0 takes the ASID from TTBR0_EL1). One register
/// write switches table and ASID together, so no walk can combine the new
/// table with the old ASID.
#[inline]
pub const fn ttbr0_value(root: u64, asid: Asid) -> u64 {
    (root & ((1 << 48) - 1)) | ((asid.0 as u64) << 48)
}

/// The TTBR0_EL1 value for `root` and `asid` when BADDR represents a
/// 52-bit address (TCR_EL1.IPS = 52 bits, or TCR_EL1.DS = 1): root
/// bits \[47:6\] in register bits \[47:6\], root bits \[51:48\] in register
/// bits \[5:2\], ASID in bits \[63:48\] (Arm ARM D24.2 "TTBR0_EL1",
/// BADDR; Linux `phys_to_ttbr` with 52-bit physical addresses). The same
/// BADDR layout serves TTBR1_EL1.
///
/// The root must be 64-byte aligned (the least the architecture allows
/// then; a root table must also be aligned to its own size) and below
/// 2^52; otherwise [`BadRoot`].
pub const fn ttbr0_value_52(root: u64, asid: Asid) -> Result<u64, BadRoot> {
    if root & 0x3f != 0 || root >> 52 != 0 {
        return Err(BadRoot { root });
    }
    Ok((root & ((1 << 48) - 1)) | (((root >> 48) & 0xf) << 2) | ((asid.0 as u64) << 48))
}

/// The root address a 52-bit-format TTBR value holds (the inverse of
/// [`ttbr0_value_52`], without the ASID).
pub const fn ttbr_root_52(ttbr: u64) -> u64 {
    (ttbr & ((1 << 48) - 1) & !0x3f) | (((ttbr >> 2) & 0xf) << 48)
}

/// A root address [`ttbr0_value_52`] cannot hold: not 64-byte aligned, or
/// 2^52 or above.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BadRoot {
    /// The address given.
    pub root: u64,
}

impl fmt::Display for BadRoot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "translation table root {:#x} is not a 64-byte aligned 52-bit address",
            self.root
        )
    }
}

impl core::error::Error for BadRoot {}
