//! Checked entries: [`RiscvEntry`], a checked view of one PTE built from
//! raw bits, the checked constructors ([`RiscvPaging::try_leaf`],
//! [`RiscvPaging::try_table_entry`], [`RiscvPaging::try_napot_64k`]) and
//! their error, [`EntryError`] (the role `pgtable_arm64::entry` and
//! `pgtable_x86::entry` have on the other architectures).
//!
//! The algorithms of `pgtable-core` report [`pgtable_core::Error`]; these
//! are for code that builds or inspects entries directly.

use core::fmt;

use crate::bits::LEVEL_BITS;
use pgtable_core::contract::{Decoded, Format, Level, PAGE_SHIFT};
use pgtable_core::{MemType, PhysAddr, Prot};

use crate::bits::{self, N, NAPOT_64K_PPN, R, V, W};
use crate::format::RiscvPaging;

/// Why an entry could not be built or accepted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum EntryError {
    /// No table of the format sits at this height.
    BadHeight(u32),
    /// The physical address is not aligned to the size the entry maps (or
    /// to 4 KiB for a table, 64 KiB for a NAPOT PTE).
    MisalignedPhys(PhysAddr),
    /// The physical address does not fit the 56 bits of the PPN.
    PhysOutOfRange(PhysAddr),
    /// A memory type other than `Normal` on harts without Svpbmt.
    NoSvpbmt(MemType),
    /// A NAPOT PTE on harts without Svnapot.
    NoSvnapot,
    /// W = 1 with R = 0: a reserved encoding.
    WriteWithoutRead(u64),
    /// The valid entry has another reserved bit or encoding set (see
    /// [`RiscvPaging::is_reserved`]): the walker would raise a page fault.
    Reserved {
        /// The entry.
        raw: u64,
        /// Height of its table.
        height: u32,
    },
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::BadHeight(h) => write!(f, "no table at height {h}"),
            EntryError::MisalignedPhys(a) => write!(f, "physical address {a} is misaligned"),
            EntryError::PhysOutOfRange(a) => {
                write!(f, "physical address {a} does not fit 56 bits")
            }
            EntryError::NoSvpbmt(m) => write!(f, "memory type {m:?} needs Svpbmt"),
            EntryError::NoSvnapot => write!(f, "a NAPOT PTE needs Svnapot"),
            EntryError::WriteWithoutRead(r) => {
                write!(f, "entry {r:#018x} is writable but not readable (reserved)")
            }
            EntryError::Reserved { raw, height } => write!(
                f,
                "entry {raw:#018x} at height {height} has a reserved bit or encoding"
            ),
        }
    }
}

impl core::error::Error for EntryError {}

/// Bytes an entry at `height` maps.
const fn size(height: u32) -> u64 {
    1 << (PAGE_SHIFT + LEVEL_BITS * height)
}

impl<const L: u32, const E: u32> RiscvPaging<L, E> {
    /// Builds a leaf like [`Format::leaf`], checking the input: the height
    /// exists, `pa` is aligned to the size mapped and below 2^56, and the
    /// memory type can be encoded ([`check_prot`](Self::check_prot)).
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`], [`EntryError::MisalignedPhys`],
    /// [`EntryError::PhysOutOfRange`], [`EntryError::NoSvpbmt`].
    pub fn try_leaf(pa: PhysAddr, prot: Prot, height: u32) -> Result<u64, EntryError> {
        if height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        Self::check_pa(pa, size(height))?;
        Self::check_prot(prot)?;
        Ok(Self::leaf(pa, prot, height))
    }

    /// Builds a non-leaf PTE like [`Format::table_entry`], checking that
    /// `pa` is 4 KiB aligned and below 2^56 and that a table entry may sit
    /// at `height` (not level 0).
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`], [`EntryError::MisalignedPhys`],
    /// [`EntryError::PhysOutOfRange`].
    pub fn try_table_entry(pa: PhysAddr, height: u32) -> Result<u64, EntryError> {
        if height == 0 || height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        Self::check_pa(pa, size(0))?;
        Ok(Self::table_entry(pa, height))
    }

    /// A 64 KiB NAPOT PTE (Svnapot) mapping the 64 KiB-aligned `pa` with
    /// `prot`: a level-0 leaf with N set and PPN\[0\]\[3:0\] = `0b1000`.
    /// All 16 entries of the run take this same value (see the format
    /// docs on Svnapot).
    ///
    /// # Errors
    ///
    /// [`EntryError::NoSvnapot`], [`EntryError::MisalignedPhys`] (not
    /// 64 KiB aligned), [`EntryError::PhysOutOfRange`],
    /// [`EntryError::NoSvpbmt`].
    pub fn try_napot_64k(pa: PhysAddr, prot: Prot) -> Result<u64, EntryError> {
        if !Self::HAS_SVNAPOT {
            return Err(EntryError::NoSvnapot);
        }
        Self::check_pa(pa, 16 * size(0))?;
        Self::check_prot(prot)?;
        Ok(Self::leaf(pa, prot, 0) | N | NAPOT_64K_PPN)
    }

    fn check_pa(pa: PhysAddr, align: u64) -> Result<(), EntryError> {
        if !pa.is_aligned(align) {
            return Err(EntryError::MisalignedPhys(pa));
        }
        if pa.0 >> bits::PA_BITS != 0 {
            return Err(EntryError::PhysOutOfRange(pa));
        }
        Ok(())
    }
}

/// One PTE of [`RiscvPaging<LEVELS, EXT>`] at a known height, checked on
/// construction: its height exists and, when it is valid, it has no
/// reserved bit or encoding (so the walker would not fault on it for that
/// reason).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RiscvEntry<const LEVELS: u32, const EXT: u32 = 0> {
    raw: u64,
    height: u32,
}

impl<const L: u32, const E: u32> RiscvEntry<L, E> {
    /// Accepts `raw` as an entry of a table at `height`.
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`]; for a valid entry
    /// [`EntryError::WriteWithoutRead`] (W = 1, R = 0) or
    /// [`EntryError::Reserved`] (any other reserved bit or encoding).
    pub fn from_raw(raw: u64, height: u32) -> Result<Self, EntryError> {
        if height >= <RiscvPaging<L, E> as Format>::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        if raw & V != 0 {
            if raw & (R | W) == W {
                return Err(EntryError::WriteWithoutRead(raw));
            }
            if RiscvPaging::<L, E>::is_reserved(raw, height) {
                return Err(EntryError::Reserved { raw, height });
            }
        }
        Ok(RiscvEntry { raw, height })
    }

    /// The raw value.
    pub const fn raw(self) -> u64 {
        self.raw
    }

    /// Height of the entry's table (the spec's level).
    pub const fn height(self) -> u32 {
        self.height
    }

    /// The Linux name of the entry's level.
    pub const fn level(self) -> Level {
        Level::at_height(self.height, L)
    }

    /// What the walker sees (never [`Decoded::Invalid`] for a valid entry,
    /// since the reserved encodings were checked).
    pub fn decoded(self) -> Decoded {
        RiscvPaging::<L, E>::decode(self.raw, self.height)
    }

    /// Whether V is set.
    pub const fn is_valid(self) -> bool {
        self.raw & V != 0
    }

    /// Whether it is a valid 64 KiB NAPOT PTE.
    pub const fn is_napot(self) -> bool {
        self.is_valid() && self.raw & N != 0
    }
}
