//! The operations of a sequence and their parts.

use std::fmt;

use pgtable_core::{variants, ClearRefs, FaultFlags, MoveOptions, Prot};

use super::ProtSrc;

/// Which [`MapOptions`] a map uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MapKind {
    Pages,
    PmdBlocks,
    Blocks,
}

/// Which [`MoveOptions`] a move uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MoveKind {
    Default,
    PtesOnly,
    PmdOnly,
    /// Every fast path, claiming the space below both starts free.
    FreeBelow,
}

impl MoveKind {
    /// The options.
    pub fn options(self) -> MoveOptions {
        match self {
            MoveKind::Default => MoveOptions::DEFAULT,
            MoveKind::PtesOnly => variants::PTES_ONLY,
            MoveKind::PmdOnly => variants::PMD_ONLY,
            MoveKind::FreeBelow => MoveOptions::DEFAULT.free_below(),
        }
    }
}

/// One step of a sequence. `fail`: the table allocations that succeed
/// before every later one fails (`None`: none fails).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Map {
        va: u64,
        pa: u64,
        len: u64,
        prot: Prot,
        kind: MapKind,
        barrier_per_entry: bool,
        /// `MapOptions::no_contiguous()`.
        no_cont: bool,
        fail: Option<u64>,
    },
    Unmap {
        va: u64,
        len: u64,
        fail: Option<u64>,
    },
    Protect {
        va: u64,
        len: u64,
        prot: Prot,
        fail: Option<u64>,
    },
    Move {
        old: u64,
        new: u64,
        len: u64,
        kind: MoveKind,
        fail: Option<u64>,
    },
    /// A kernel load (`write == None`) or store of a `u64` through the MMU.
    Touch { va: u64, write: Option<u64> },
    /// `install_pte` of `NewPte::Swap`: a software entry carrying `value` at `va`.
    Swap {
        va: u64,
        value: u64,
        fail: Option<u64>,
    },
    /// `replace_pte`: the software entry or the page at `va` becomes a
    /// page mapping `pa` with `prot` (swap-in, copy-on-write), or with
    /// `swap` a software entry carrying that value (swap-out).
    Replace {
        va: u64,
        pa: u64,
        prot: Prot,
        swap: Option<u64>,
    },
    /// The following operations act on the episode's other address space
    /// (the fork child, or the kernel / the user space).
    Switch,
    /// `unmap_with`, every report checked.
    UnmapWith {
        va: u64,
        len: u64,
        fail: Option<u64>,
    },
    /// `clear_refs`.
    ClearRefs { va: u64, len: u64, what: Harvest },
    /// `test_and_clear_young`.
    Young { va: u64 },
    /// `ptep_get`.
    Get { va: u64 },
    /// `ptep_set_access_flags`.
    Fault { va: u64, flags: Fault },
    /// `install_pte`.
    Install {
        va: u64,
        pa: u64,
        prot: Prot,
        fail: Option<u64>,
    },
    /// `copy_page_range` into the other address space.
    Copy {
        va: u64,
        len: u64,
        cow: bool,
        fail: Option<u64>,
    },
    /// `change_protection_live`, `bbm`: `LiveOptions::ALLOW_BBM`.
    Live {
        va: u64,
        len: u64,
        prot: Prot,
        bbm: bool,
        fail: Option<u64>,
    },
    /// The first `n` steps into one gather, finished once.
    Gather { steps: [GStep; 3], n: u8 },
}

/// Which state `clear_refs` clears.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Harvest {
    Young,
    Dirty,
    All,
}

impl Harvest {
    /// The argument.
    pub fn what(self) -> ClearRefs {
        match self {
            Harvest::Young => ClearRefs::YOUNG,
            Harvest::Dirty => ClearRefs::DIRTY,
            Harvest::All => ClearRefs::ALL,
        }
    }

    pub(super) fn src(self) -> &'static str {
        match self {
            Harvest::Young => "ClearRefs::YOUNG",
            Harvest::Dirty => "ClearRefs::DIRTY",
            Harvest::All => "ClearRefs::ALL",
        }
    }
}

/// Which `FaultFlags` a fault sets.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Fault {
    Access,
    Dirty,
    Write,
}

impl Fault {
    /// The argument.
    pub fn flags(self) -> FaultFlags {
        match self {
            Fault::Access => FaultFlags::ACCESS,
            Fault::Dirty => FaultFlags::DIRTY,
            Fault::Write => FaultFlags::WRITE,
        }
    }

    /// Whether the dirty state is set.
    pub fn dirty(self) -> bool {
        self != Fault::Access
    }

    /// Whether the leaf is made writable.
    pub fn write(self) -> bool {
        self == Fault::Write
    }
}

/// One operation of a gather.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GStep {
    Unmap { va: u64, len: u64 },
    UnmapWith { va: u64, len: u64 },
    Protect { va: u64, len: u64, prot: Prot },
    ClearRefs { va: u64, len: u64, what: Harvest },
}

impl GStep {
    /// The range it works on.
    pub fn range(&self) -> (u64, u64) {
        match *self {
            GStep::Unmap { va, len }
            | GStep::UnmapWith { va, len }
            | GStep::Protect { va, len, .. }
            | GStep::ClearRefs { va, len, .. } => (va, len),
        }
    }
}

impl fmt::Display for GStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GStep::Unmap { va, len } => write!(f, "g.unmap(VirtAddr({va:#x}), {len:#x})"),
            GStep::UnmapWith { va, len } => {
                write!(f, "g.unmap_with(VirtAddr({va:#x}), {len:#x}, |_| ())")
            }
            GStep::Protect { va, len, prot } => write!(
                f,
                "g.change_protection(VirtAddr({va:#x}), {len:#x}, {})",
                ProtSrc(prot)
            ),
            GStep::ClearRefs { va, len, what } => write!(
                f,
                "g.clear_refs(VirtAddr({va:#x}), {len:#x}, {}, |_| ())",
                what.src()
            ),
        }
    }
}

impl Op {
    /// The allocation failure point, for operations that allocate.
    pub fn fail(&self) -> Option<u64> {
        match *self {
            Op::Map { fail, .. }
            | Op::Unmap { fail, .. }
            | Op::Protect { fail, .. }
            | Op::Move { fail, .. }
            | Op::Swap { fail, .. }
            | Op::UnmapWith { fail, .. }
            | Op::Install { fail, .. }
            | Op::Copy { fail, .. }
            | Op::Live { fail, .. } => fail,
            _ => None,
        }
    }
}
