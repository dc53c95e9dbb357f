//! Errors of the x86 entry helpers.
//!
//! The algorithms of `pgtable-core` report [`pgtable_core::Error`]; the
//! types here are for code that builds or inspects entries directly, from
//! raw bits a user supplied.

use core::fmt;

use pgtable_core::PhysAddr;

/// Reserved bits are set in a present entry: the processor would raise a
/// page fault with the RSVD flag of the error code set (Intel SDM Vol. 3A
/// §4.7, "Page-Fault Exceptions").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ReservedBits {
    /// The entry.
    pub raw: u64,
    /// Height of its table above the PTE level.
    pub height: u32,
    /// The offending bits (a subset of `raw`).
    pub bits: u64,
}

impl fmt::Display for ReservedBits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "entry {:#018x} at height {} has reserved bits {:#x} set",
            self.raw, self.height, self.bits
        )
    }
}

impl core::error::Error for ReservedBits {}

/// Why an entry could not be built or accepted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum EntryError {
    /// The raw value has reserved bits set.
    ReservedBits(ReservedBits),
    /// No table of the format sits at this height.
    BadHeight(u32),
    /// A leaf is not allowed at this height (x86: only PTE, PDE and PDPTE
    /// map pages).
    LeafNotAllowed(u32),
    /// The physical address is not aligned to the size the entry maps (or
    /// to 4 KiB for a table).
    MisalignedPhys(PhysAddr),
    /// The physical address has bits at or above MAXPHYADDR.
    PhysOutOfRange(PhysAddr),
    /// The operation needs a present leaf and the entry is not one.
    NotALeaf,
    /// A protection key must be below 16.
    BadPkey(u8),
}

impl From<ReservedBits> for EntryError {
    fn from(e: ReservedBits) -> Self {
        EntryError::ReservedBits(e)
    }
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EntryError::ReservedBits(r) => r.fmt(f),
            EntryError::BadHeight(h) => write!(f, "no table at height {h}"),
            EntryError::LeafNotAllowed(h) => write!(f, "no leaf allowed at height {h}"),
            EntryError::MisalignedPhys(a) => write!(f, "physical address {a} is misaligned"),
            EntryError::PhysOutOfRange(a) => {
                write!(f, "physical address {a} is above MAXPHYADDR")
            }
            EntryError::NotALeaf => write!(f, "the entry is not a present leaf"),
            EntryError::BadPkey(k) => write!(f, "protection key {k} is not below 16"),
        }
    }
}

impl core::error::Error for EntryError {}
