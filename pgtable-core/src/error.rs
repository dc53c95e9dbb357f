//! Errors. Every operation validates its whole input before it changes
//! anything, so an error always leaves the tables exactly as they were and
//! no table frame allocated.

use core::fmt;

use crate::{PhysAddr, VaRange, VirtAddr};

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
    /// The range leaves the address space: it is not canonical for the
    /// format, or it lies (partly) outside the half the address space
    /// translates ([`AddressSpace::va_range`]; e.g. a kernel address given
    /// to a user space). The address is the first offending one (the start
    /// of the non-canonical hole, or the first address past the half, for
    /// a range that runs into it), or the range's start when the range
    /// starts outside or runs past the top of the 64-bit space, where no
    /// first offending address can be named.
    ///
    /// [`AddressSpace::va_range`]: crate::AddressSpace::va_range
    OutOfRange(VirtAddr),
    /// The physical range does not fit the format's output address bits.
    PhysOutOfRange(PhysAddr),
    /// Something is already mapped at this address (map, move destination).
    AlreadyMapped(VirtAddr),
    /// Source and destination ranges of a move overlap.
    Overlap,
    /// A table frame could not be allocated.
    OutOfMemory,
    /// The change of the live entry at this address needs break-before-make
    /// (the entry invalid for a moment, so a CPU using it faults; Arm ARM
    /// D8.16.1), for the [`BbmReason`] given, and the caller did not allow
    /// it ([`LiveOptions`](crate::LiveOptions)). A common surprise: a
    /// change of part of a folded contiguous run
    /// ([`BbmReason::ContiguousRun`]), which [`map`](crate::AddressSpace::map)
    /// makes by default (arm64: 16 pages, or 16 2 MiB blocks = 32 MiB of a
    /// linear map); map with
    /// [`MapOptions::no_contiguous`](crate::MapOptions::no_contiguous)
    /// what will be changed live in smaller pieces.
    BreakBeforeMake(VirtAddr, BbmReason),
    /// The value does not fit in a software entry of the format
    /// ([`Format::SWP_VALUE_BITS`](crate::Format::SWP_VALUE_BITS); `0` bits
    /// when the format has none).
    SwapValueTooWide(u64),
    /// A block (a huge page) maps this address where the operation works
    /// on one PTE ([`replace_pte`](crate::AddressSpace::replace_pte)):
    /// split or unmap the block first.
    BlockMapped(VirtAddr),
    /// The address space cannot share, or does not share, a kernel half:
    /// [`AddressSpace::share_kernel_half`] of a space that does not
    /// translate the upper half, or [`AddressSpace::new_user`] from one
    /// that does not share it.
    ///
    /// [`AddressSpace::share_kernel_half`]: crate::AddressSpace::share_kernel_half
    /// [`AddressSpace::new_user`]: crate::AddressSpace::new_user
    KernelHalf,
    /// The MMU installs roots into another half than the address space
    /// translates ([`Mmu::installs_into`]): on arm64, a
    /// [`VaRange::Upper`] space (a kernel's, from
    /// [`AddressSpace::new_kernel`]) needs an MMU that writes TTBR1_EL1,
    /// a [`VaRange::Lower`] one (a user's, from
    /// [`AddressSpace::new_user`]) one that writes TTBR0_EL1.
    ///
    /// [`Mmu::installs_into`]: crate::contract::Mmu::installs_into
    /// [`AddressSpace::new_kernel`]: crate::AddressSpace::new_kernel
    /// [`AddressSpace::new_user`]: crate::AddressSpace::new_user
    MmuHalf {
        /// The half the space translates.
        space: VaRange,
        /// The half whose root register the MMU writes.
        mmu: VaRange,
    },
    /// Nothing is mapped at this address (an operation on one present
    /// leaf, e.g. [`ptep_set_access_flags`](crate::AddressSpace::ptep_set_access_flags),
    /// or on one occupied PTE, [`replace_pte`](crate::AddressSpace::replace_pte)).
    NotMapped(VirtAddr),
    /// The leaf at this address is a [`Prot::NONE`](crate::Prot::NONE)
    /// mapping, whose rights only
    /// [`change_protection`](crate::AddressSpace::change_protection) gives
    /// back: [`ptep_set_access_flags`](crate::AddressSpace::ptep_set_access_flags)
    /// does not relax it (a fault on such a page is Linux's
    /// `do_numa_page`, not an access-flag fault).
    ProtNone(VirtAddr),
    /// The allocator's table frames are not the format's pages
    /// ([`TableAlloc::frame_shift`] differs from
    /// [`Format::PAGE_SHIFT`]): e.g. a 4 KiB-frame allocator given to an
    /// address space of arm64 16 KiB pages.
    ///
    /// [`TableAlloc::frame_shift`]: crate::contract::TableAlloc::frame_shift
    /// [`Format::PAGE_SHIFT`]: crate::contract::Format::PAGE_SHIFT
    FrameSize {
        /// log2 of the allocator's frame size.
        frame_shift: u32,
        /// log2 of the format's page size.
        page_shift: u32,
    },
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
            Error::KernelHalf => write!(f, "the address space shares no kernel half"),
            Error::MmuHalf { space, mmu } => write!(
                f,
                "a {space:?} address space with an MMU that installs into {mmu:?}"
            ),
            Error::BreakBeforeMake(a, why) => {
                write!(
                    f,
                    "changing the live entry at {a} needs break-before-make: {why}"
                )
            }
            Error::SwapValueTooWide(v) => {
                write!(f, "value {v:#x} does not fit in a software entry")
            }
            Error::BlockMapped(a) => write!(f, "a block maps {a}, not a page"),
            Error::NotMapped(a) => write!(f, "nothing is mapped at {a}"),
            Error::ProtNone(a) => write!(f, "the mapping at {a} is PROT_NONE"),
            Error::FrameSize {
                frame_shift,
                page_shift,
            } => write!(
                f,
                "table frames of {} KiB, but pages of {} KiB",
                (1u64 << frame_shift) >> 10,
                (1u64 << page_shift) >> 10
            ),
        }
    }
}

impl core::error::Error for Error {}

/// Why a change needs break-before-make ([`Error::BreakBeforeMake`]): the
/// rules of Arm ARM D8.16.1 "Using break-before-make when updating
/// translation table entries" and D8.6.1 "The Contiguous bit" (Linux
/// `pgattr_change_is_safe`, `contpte_try_unfold`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum BbmReason {
    /// The range covers part of a folded contiguous run (or a single-entry
    /// operation changes one entry's rights): the run must be unfolded,
    /// which clears all of its entries at once, because a valid entry
    /// without the hint in a cached run may raise a TLB conflict abort
    /// (rule RNGLXZ). [`map`](crate::AddressSpace::map) folds by default.
    ContiguousRun,
    /// The range covers part of a block, which is split into a table of
    /// smaller entries: a change of translation size.
    BlockSplit,
    /// The memory type (AttrIndx) or shareability changes.
    MemoryType,
    /// A non-global entry becomes global: a global and an ASID-tagged TLB
    /// entry could then both match the address.
    NonGlobalToGlobal,
    /// The output address changes.
    OutputAddress,
}

impl fmt::Display for BbmReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BbmReason::ContiguousRun => "it changes part of a folded contiguous run",
            BbmReason::BlockSplit => "it splits a block",
            BbmReason::MemoryType => "it changes the memory type",
            BbmReason::NonGlobalToGlobal => "it makes a non-global entry global",
            BbmReason::OutputAddress => "it changes the output address",
        })
    }
}
