//! Errors. Every operation validates its whole input before it changes
//! anything, so an error always leaves the tables exactly as they were and
//! no table frame allocated.

use core::fmt;

use crate::{PhysAddr, VirtAddr};

/// An error from a page-table operation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Error {
    /// A virtual address is not a multiple of the page size (a length that
    /// is not is [`Error::MisalignedLength`]).
    MisalignedVirt(VirtAddr),
    /// A physical address is not a multiple of the page size.
    MisalignedPhys(PhysAddr),
    /// The length is not a multiple of the page size.
    MisalignedLength(u64),
    /// The length is zero.
    ZeroLength,
    /// The range leaves the format's virtual address space or is not
    /// canonical; the address is the first offending one (the start of
    /// the non-canonical hole for a range that runs into it), or the
    /// range's start when the range runs past the top of the 64-bit
    /// space, where no first offending address can be named.
    OutOfRange(VirtAddr),
    /// The physical range does not fit the format's output address bits.
    PhysOutOfRange(PhysAddr),
    /// Something is already mapped at this address (map, move destination).
    AlreadyMapped(VirtAddr),
    /// Source and destination ranges of a move overlap.
    Overlap,
    /// A table frame could not be allocated.
    OutOfMemory,
    /// The change needs break-before-make and the caller did not allow it.
    BreakBeforeMake(VirtAddr),
    /// An [`MmuGather`](crate::MmuGather) was handed to an address space
    /// other than the one it was started on (Linux `tlb_gather_mmu`
    /// binds a gather to one `mm`).
    ForeignGather,
    /// Nothing is mapped at this address (an operation on one present
    /// leaf, e.g. [`ptep_set_access_flags`](crate::AddressSpace::ptep_set_access_flags)).
    NotMapped(VirtAddr),
}

/// The broad class of an [`Error`], for callers that only branch on it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input was malformed (alignment, length, range).
    InvalidInput,
    /// The input conflicts with what is mapped.
    Conflict,
    /// Out of memory for a table.
    OutOfMemory,
}

impl Error {
    /// The broad class of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::MisalignedVirt(_)
            | Error::MisalignedPhys(_)
            | Error::MisalignedLength(_)
            | Error::ZeroLength
            | Error::OutOfRange(_)
            | Error::PhysOutOfRange(_)
            | Error::Overlap
            | Error::ForeignGather => ErrorKind::InvalidInput,
            Error::AlreadyMapped(_) | Error::BreakBeforeMake(_) | Error::NotMapped(_) => {
                ErrorKind::Conflict
            }
            Error::OutOfMemory => ErrorKind::OutOfMemory,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::MisalignedVirt(a) => write!(f, "virtual address {a} is not page aligned"),
            Error::MisalignedPhys(a) => write!(f, "physical address {a} is not page aligned"),
            Error::MisalignedLength(l) => write!(f, "length {l:#x} is not a page multiple"),
            Error::ZeroLength => write!(f, "length is zero"),
            Error::OutOfRange(a) => write!(f, "address {a} is outside the address space"),
            Error::PhysOutOfRange(a) => write!(f, "physical address {a} is not encodable"),
            Error::AlreadyMapped(a) => write!(f, "address {a} is already mapped"),
            Error::Overlap => write!(f, "source and destination overlap"),
            Error::OutOfMemory => write!(f, "out of memory for a page table"),
            Error::BreakBeforeMake(a) => {
                write!(f, "changing the live entry at {a} needs break-before-make")
            }
            Error::ForeignGather => {
                write!(f, "the TLB gather belongs to another address space")
            }
            Error::NotMapped(a) => write!(f, "nothing is mapped at {a}"),
        }
    }
}

impl core::error::Error for Error {}
