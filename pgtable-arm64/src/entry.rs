//! Checked construction of descriptors from user-supplied input.
//!
//! The [`Format`] methods of [`Arm64Format`] trust their input: the
//! algorithms of `pgtable-core` check ranges and alignment before they
//! build an entry. The functions here check first and say what is wrong
//! with an [`EntryError`], for code that builds or inspects descriptors
//! directly (the role `pgtable_x86::entry` has on x86).
//!
//! The descriptor formats are those of the Arm ARM D8.3 "Translation table
//! descriptor formats" for the format's granule and output address size.

use core::fmt;

use core::marker::PhantomData;

use pgtable_core::contract::{level, Decoded, Format, Level};
use pgtable_core::{PhysAddr, Prot};

use crate::bits::{AF, VALID};
use crate::format::{Arm64, Arm64Format, Arm64Geometry};

/// Why a descriptor could not be built or accepted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum EntryError {
    /// No table of the format sits at this height.
    BadHeight(u32),
    /// A leaf is not allowed at this height (pages at level 3, blocks
    /// where the granule has them: see [`Arm64Format`]).
    LeafNotAllowed(u32),
    /// The physical address is not aligned to the size the entry maps (or
    /// to the page size for a table).
    MisalignedPhys(PhysAddr),
    /// The physical address does not fit the output address
    /// ([`Format::PA_BITS`]: 48 bits, or 52).
    PhysOutOfRange(PhysAddr),
    /// A valid descriptor whose encoding is reserved at its level: a
    /// level 3 descriptor with bit 1 clear, or a block where the granule
    /// has none (Arm ARM
    /// D8.3; the walker reports a translation fault).
    ReservedEncoding {
        /// The descriptor.
        raw: u64,
        /// Height of its table above the PTE level.
        height: u32,
    },
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::BadHeight(h) => write!(f, "no table at height {h}"),
            EntryError::LeafNotAllowed(h) => write!(f, "no leaf allowed at height {h}"),
            EntryError::MisalignedPhys(a) => write!(f, "physical address {a} is misaligned"),
            EntryError::PhysOutOfRange(a) => {
                write!(f, "physical address {a} does not fit the output address")
            }
            EntryError::ReservedEncoding { raw, height } => write!(
                f,
                "descriptor {raw:#018x} at height {height} has a reserved encoding"
            ),
        }
    }
}

impl core::error::Error for EntryError {}

impl<const P: u32, const V: u32> Arm64Format<P, V> {
    /// Builds a leaf like [`Format::leaf`], checking the input: the height
    /// allows a leaf, `pa` is aligned to the size mapped and fits the
    /// output address ([`Format::PA_BITS`] bits).
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`], [`EntryError::LeafNotAllowed`],
    /// [`EntryError::MisalignedPhys`] or [`EntryError::PhysOutOfRange`].
    pub fn try_leaf(pa: PhysAddr, prot: Prot, height: u32) -> Result<u64, EntryError> {
        if height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        if !Self::leaf_allowed(height) {
            return Err(EntryError::LeafNotAllowed(height));
        }
        check_pa::<Self>(pa, level::size::<Self>(height))?;
        Ok(Self::leaf(pa, prot, height))
    }

    /// Builds a table descriptor like [`Format::table_entry`], checking
    /// that `pa` is page aligned and fits the output address and
    /// that a table descriptor may sit at `height` (not level 3).
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`], [`EntryError::MisalignedPhys`] or
    /// [`EntryError::PhysOutOfRange`].
    pub fn try_table_entry(pa: PhysAddr, height: u32) -> Result<u64, EntryError> {
        if height == 0 || height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        check_pa::<Self>(pa, level::page_size::<Self>())?;
        Ok(Self::table_entry(pa, height))
    }
}

fn check_pa<F: Format>(pa: PhysAddr, align: u64) -> Result<(), EntryError> {
    if !pa.is_aligned(align) {
        return Err(EntryError::MisalignedPhys(pa));
    }
    if pa.0 >> F::PA_BITS != 0 {
        return Err(EntryError::PhysOutOfRange(pa));
    }
    Ok(())
}

/// One descriptor of the arm64 format `F` ([`Arm64`] unless named) at a
/// known height, checked on construction: its height exists and, when it
/// is valid, its encoding is not reserved at that level (so the walker
/// would not fault on the encoding itself).
pub struct Arm64Entry<F: Arm64Geometry = Arm64> {
    raw: u64,
    height: u32,
    format: PhantomData<F>,
}

impl<F: Arm64Geometry> Clone for Arm64Entry<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F: Arm64Geometry> Copy for Arm64Entry<F> {}

impl<F: Arm64Geometry> PartialEq for Arm64Entry<F> {
    fn eq(&self, other: &Self) -> bool {
        (self.raw, self.height) == (other.raw, other.height)
    }
}

impl<F: Arm64Geometry> Eq for Arm64Entry<F> {}

impl<F: Arm64Geometry> Arm64Entry<F> {
    /// Accepts `raw` as a descriptor of a table at `height`.
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`] when the format has no table at `height`;
    /// [`EntryError::ReservedEncoding`] when `raw` is valid and its
    /// encoding is reserved at that level.
    pub fn from_raw(raw: u64, height: u32) -> Result<Self, EntryError> {
        if height >= F::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        if raw & VALID != 0 && F::decode(raw, height) == Decoded::Invalid {
            return Err(EntryError::ReservedEncoding { raw, height });
        }
        Ok(Arm64Entry {
            raw,
            height,
            format: PhantomData,
        })
    }

    /// The raw value.
    pub const fn raw(self) -> u64 {
        self.raw
    }

    /// Height of the entry's table above the PTE level.
    pub const fn height(self) -> u32 {
        self.height
    }

    /// The Linux name of the entry's level.
    pub const fn level(self) -> Level {
        Level::at_height(self.height, F::LEVELS)
    }

    /// What the walker sees (never [`Decoded::Invalid`] for a valid
    /// descriptor, since its encoding was checked; software entries, with
    /// the valid bit clear, decode as invalid).
    pub fn decoded(self) -> Decoded {
        F::decode(self.raw, self.height)
    }

    /// Whether the valid bit is set.
    pub const fn is_valid(self) -> bool {
        self.raw & VALID != 0
    }

    /// The output address, if the entry maps a page or block.
    pub fn leaf_addr(self) -> Option<PhysAddr> {
        match self.decoded() {
            Decoded::Leaf(pa) => Some(pa),
            _ => None,
        }
    }

    /// The next-level table, if the entry references one.
    pub fn table_addr(self) -> Option<PhysAddr> {
        match self.decoded() {
            Decoded::Table(pa) => Some(pa),
            _ => None,
        }
    }

    /// The protection of a leaf.
    pub fn prot(self) -> Option<Prot> {
        self.leaf_addr()
            .map(|_| F::leaf_prot(self.raw, self.height))
    }

    /// Whether the access flag (AF) is set.
    pub const fn is_accessed(self) -> bool {
        self.raw & AF != 0
    }

    /// Whether the leaf is dirty (hardware DBM state or the software dirty
    /// bit, as Linux `pte_dirty`).
    pub fn is_dirty(self) -> bool {
        F::is_dirty(self.raw)
    }
}

impl<F: Arm64Geometry> fmt::Debug for Arm64Entry<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Arm64Entry({:?} {:#018x} {:?})",
            self.level(),
            self.raw,
            self.decoded()
        )
    }
}
