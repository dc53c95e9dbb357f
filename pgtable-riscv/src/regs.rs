//! The `satp` register (privileged spec, "Supervisor Address Translation
//! and Protection (satp) Register"): its fields, the MODE values, a typed
//! ASID, and the ASIDLEN probe's arithmetic. Pure values, tested on the
//! host; `RiscvMmu` writes them on the hart.
//!
//! For RV64, `satp` is MODE\[63:60\], ASID\[59:44\] and PPN\[43:0\] (the
//! root table's physical page number). MODE 0 is Bare (no translation;
//! the other fields must then be zero), 8 Sv39, 9 Sv48, 10 Sv57.
//!
//! # Example
//!
//! ```
//! use pgtable_core::PhysAddr;
//! use pgtable_riscv::regs::{asid_bits_from_probe, Asid, Satp, SatpMode};
//!
//! // A hart whose satp.ASID keeps the low 9 bits of the ones written.
//! let bits = asid_bits_from_probe(8 << 60 | 0x1ff << 44);
//! assert_eq!(bits, 9);
//! let asid = Asid::new(0x1ff, bits).unwrap();
//! assert!(Asid::new(0x200, bits).is_err());
//!
//! let satp = Satp::new(SatpMode::Sv48, asid, PhysAddr(0x8020_0000)).unwrap();
//! assert_eq!(satp.bits(), 9 << 60 | 0x1ff << 44 | 0x80200);
//! assert_eq!(satp.mode(), Some(SatpMode::Sv48));
//! assert_eq!(satp.root(), PhysAddr(0x8020_0000));
//! ```

use core::fmt;

use pgtable_core::PhysAddr;

/// The widest ASID of Sv39, Sv48 and Sv57 (`satp.ASID` is 16 bits).
pub const ASID_BITS_MAX: u32 = 16;

/// First bit of `satp.ASID`.
pub const SATP_ASID_SHIFT: u32 = 44;
/// First bit of `satp.MODE`.
pub const SATP_MODE_SHIFT: u32 = 60;
/// `satp.PPN`, bits 43:0.
pub const SATP_PPN_MASK: u64 = (1 << 44) - 1;
/// `satp.ASID`, bits 59:44, in place.
pub const SATP_ASID_MASK: u64 = 0xffff << SATP_ASID_SHIFT;

/// An address-space identifier: at most `ASIDLEN` bits (16 at most for
/// Sv39, Sv48 and Sv57: `satp.ASID` is bits 59:44). A value that does not
/// fit the hart's ASIDLEN is an error ([`Asid::new`]), never truncated.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Asid(u16);

impl Asid {
    /// ASID 0, for untagged roots.
    pub const ZERO: Asid = Asid(0);

    /// `asid`, if it fits `asid_bits` (the hart's ASIDLEN, 0..=16; see
    /// [`asid_bits_from_probe`] and `probe_asid_bits` on bare metal).
    ///
    /// # Errors
    ///
    /// [`AsidTooWide`] when it does not fit.
    pub const fn new(asid: u16, asid_bits: u32) -> Result<Asid, AsidTooWide> {
        if asid_bits >= ASID_BITS_MAX || (asid as u32) >> asid_bits == 0 {
            Ok(Asid(asid))
        } else {
            Err(AsidTooWide { asid, asid_bits })
        }
    }

    /// The value.
    pub const fn get(self) -> u16 {
        self.0
    }
}

/// An ASID that does not fit the hart's ASIDLEN.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AsidTooWide {
    /// The value.
    pub asid: u16,
    /// The ASIDLEN it had to fit.
    pub asid_bits: u32,
}

impl fmt::Display for AsidTooWide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ASID {:#x} does not fit {} bits",
            self.asid, self.asid_bits
        )
    }
}

impl core::error::Error for AsidTooWide {}

/// The ASIDLEN a hart implements, from the `satp` value read back after
/// writing ones to every bit of `satp.ASID` (privileged spec: "The
/// least-significant bits of ASID are implemented first: that is, if
/// ASIDLEN > 0, ASID\[ASIDLEN-1:0\] is writable"): the number of ones
/// from bit 44 up, 0..=16. Bits above the first zero are not counted,
/// since they cannot be implemented.
pub const fn asid_bits_from_probe(readback: u64) -> u32 {
    ((readback & SATP_ASID_MASK) >> SATP_ASID_SHIFT).trailing_ones()
}

/// `satp.MODE` values for RV64 (privileged spec, table "Encoding of satp
/// MODE field").
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
#[repr(u8)]
pub enum SatpMode {
    /// No translation or protection.
    Bare = 0,
    /// Page-based 39-bit virtual addressing (3 levels).
    Sv39 = 8,
    /// Page-based 48-bit virtual addressing (4 levels).
    Sv48 = 9,
    /// Page-based 57-bit virtual addressing (5 levels).
    Sv57 = 10,
}

impl SatpMode {
    /// The mode of a MODE field value; `None` for the reserved and
    /// custom values (1–7, 11–15).
    pub const fn from_field(field: u64) -> Option<SatpMode> {
        match field {
            0 => Some(SatpMode::Bare),
            8 => Some(SatpMode::Sv39),
            9 => Some(SatpMode::Sv48),
            10 => Some(SatpMode::Sv57),
            _ => None,
        }
    }

    /// The translating mode with `levels` levels (3, 4 or 5).
    pub const fn for_levels(levels: u32) -> Option<SatpMode> {
        match levels {
            3 => Some(SatpMode::Sv39),
            4 => Some(SatpMode::Sv48),
            5 => Some(SatpMode::Sv57),
            _ => None,
        }
    }

    /// Number of table levels (0 for Bare).
    pub const fn levels(self) -> u32 {
        match self {
            SatpMode::Bare => 0,
            SatpMode::Sv39 => 3,
            SatpMode::Sv48 => 4,
            SatpMode::Sv57 => 5,
        }
    }

    /// The MODE field value.
    pub const fn field(self) -> u64 {
        self as u64
    }
}

/// Why a `satp` value cannot be built.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum SatpError {
    /// The root is not 4 KiB aligned.
    Unaligned(PhysAddr),
    /// The root's page number does not fit the 44 bits of `satp.PPN`.
    RootTooHigh(PhysAddr),
    /// Bare mode with a nonzero ASID or root (the spec requires zeros).
    BareWithFields,
}

impl fmt::Display for SatpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SatpError::Unaligned(pa) => write!(f, "root {:#x} is not 4 KiB aligned", pa.0),
            SatpError::RootTooHigh(pa) => write!(f, "root {:#x} does not fit satp.PPN", pa.0),
            SatpError::BareWithFields => f.write_str("satp.MODE Bare needs ASID and PPN zero"),
        }
    }
}

impl core::error::Error for SatpError {}

/// A `satp` value: MODE, ASID and the root's PPN.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Satp(u64);

impl Satp {
    /// Translation off (MODE Bare, every field zero).
    pub const BARE: Satp = Satp(0);

    /// The value selecting `mode` with `asid` and the root table at
    /// `root`.
    ///
    /// # Errors
    ///
    /// [`SatpError`] for a root that is not 4 KiB aligned or beyond
    /// `satp.PPN`, and for Bare with a nonzero ASID or root.
    pub const fn new(mode: SatpMode, asid: Asid, root: PhysAddr) -> Result<Satp, SatpError> {
        if root.0 & 0xfff != 0 {
            return Err(SatpError::Unaligned(root));
        }
        if (root.0 >> 12) & !SATP_PPN_MASK != 0 {
            return Err(SatpError::RootTooHigh(root));
        }
        if matches!(mode, SatpMode::Bare) && (asid.0 != 0 || root.0 != 0) {
            return Err(SatpError::BareWithFields);
        }
        Ok(Satp(satp_value(mode.field(), asid, root.0)))
    }

    /// A value read from the register.
    pub const fn from_bits(bits: u64) -> Satp {
        Satp(bits)
    }

    /// The register value.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// The mode, `None` for a reserved MODE value.
    pub const fn mode(self) -> Option<SatpMode> {
        SatpMode::from_field(self.0 >> SATP_MODE_SHIFT)
    }

    /// The ASID field.
    pub const fn asid(self) -> u16 {
        ((self.0 & SATP_ASID_MASK) >> SATP_ASID_SHIFT) as u16
    }

    /// The root table's physical address (PPN × 4096).
    pub const fn root(self) -> PhysAddr {
        PhysAddr((self.0 & SATP_PPN_MASK) << 12)
    }
}

/// The raw `satp` value that selects the translation `mode` (8 Sv39, 9
/// Sv48, 10 Sv57: `RiscvPaging::SATP_MODE`) with the root table at `root`
/// (4 KiB aligned; lower bits and bits past `satp.PPN` are dropped) and
/// `asid`: MODE\[63:60\], ASID\[59:44\], PPN\[43:0\]. [`Satp::new`] is
/// the checked form.
#[inline]
pub const fn satp_value(mode: u64, asid: Asid, root: u64) -> u64 {
    mode << SATP_MODE_SHIFT | (asid.0 as u64) << SATP_ASID_SHIFT | (root >> 12) & SATP_PPN_MASK
}
