//! Checked entries: a checked view of one entry built from user-supplied
//! raw bits, and the errors of the checked constructors (the role
//! `pgtable_arm64::entry` has on arm64).

use core::fmt;

use pgtable_core::contract::{Decoded, Format, Level};
use pgtable_core::{PhysAddr, Prot};

use crate::bits;
pub use crate::error::{EntryError, ReservedBits};
use crate::format::X86Paging;

/// One paging-structure entry of [`X86Paging<LEVELS, MAXPHYADDR>`] at a
/// known height, checked on construction: its height exists and, when it
/// is present, no reserved bit is set (so the processor would not raise a
/// reserved-bit fault on it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct X86Entry<const LEVELS: u32, const MAXPHYADDR: u32 = 52> {
    raw: u64,
    height: u32,
}

impl<const L: u32, const M: u32> X86Entry<L, M> {
    /// Accepts `raw` as an entry of a table at `height`.
    ///
    /// # Errors
    ///
    /// [`EntryError::BadHeight`] when the format has no table at `height`;
    /// [`EntryError::ReservedBits`] when `raw` is present and has reserved
    /// bits set (see [`X86Paging::reserved_bits`]).
    pub fn from_raw(raw: u64, height: u32) -> Result<Self, EntryError> {
        if height >= <X86Paging<L, M> as Format>::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        X86Paging::<L, M>::validate(raw, height)?;
        Ok(X86Entry { raw, height })
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
        Level::at_height(self.height, L)
    }

    /// What the walker sees (never [`Decoded::Invalid`] for a present
    /// entry, since the reserved bits were checked).
    pub fn decoded(self) -> Decoded {
        X86Paging::<L, M>::decode(self.raw, self.height)
    }

    /// Whether P is set.
    pub const fn is_present(self) -> bool {
        self.raw & bits::P != 0
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
            .map(|_| X86Paging::<L, M>::leaf_prot(self.raw, self.height))
    }

    /// The PAT index (`PAT:PCD:PWT`) of a leaf.
    pub fn pat_index(self) -> Option<u8> {
        self.leaf_addr()
            .map(|_| X86Paging::<L, M>::pat_index(self.raw, self.height))
    }

    /// The protection key of a leaf (bits 62:59).
    pub fn pkey(self) -> Option<u8> {
        self.leaf_addr().map(|_| X86Paging::<L, M>::pkey(self.raw))
    }

    /// Whether A is set.
    pub const fn is_accessed(self) -> bool {
        self.raw & bits::A != 0
    }

    /// Whether D is set (meaningful for leaves only).
    pub const fn is_dirty(self) -> bool {
        self.raw & bits::D != 0
    }
}

impl<const L: u32, const M: u32> fmt::Debug for X86Entry<L, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "X86Entry({:?} {:#018x} {:?})",
            self.level(),
            self.raw,
            self.decoded()
        )
    }
}
