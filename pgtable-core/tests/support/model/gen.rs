//! The operations and their random generator.
//!
//! Inputs are drawn around the places where page-table code goes wrong:
//! PMD and PUD boundaries, blocks covered in part, the top pages below the
//! non-canonical hole and at the very top of the 64-bit space, occupied and
//! overlapping destinations, zero, misaligned and huge lengths,
//! non-canonical addresses, physical ranges at the edge of `PA_BITS`, and
//! allocation failures.

use std::fmt;

use pgtable_core::contract::{Format, PAGE_SIZE};
use pgtable_core::{variants, ClearRefs, FaultFlags, MemType, MoveOptions, Prot, VaRange};

use super::reference::Model;

const K4: u64 = PAGE_SIZE;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;
/// A folded run of 16 PTEs (arm64 contiguous hint) and of 16 PMD blocks.
const K64: u64 = 16 * K4;
const M32: u64 = 16 * M2;
/// Bytes of each address region the operations work in.
pub const REGION: u64 = 4 * G1;

/// SplitMix64: one `u64` of state, so a seed alone replays a sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    /// One of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// The seed of episode `i` of a run with `seed`: episode 0 uses the seed
/// itself, so a printed episode seed replays that episode first.
pub fn episode_seed(seed: u64, i: u64) -> u64 {
    if i == 0 {
        seed
    } else {
        Rng::new(seed ^ i.wrapping_mul(0xd1b5_4a32_d192_ed03)).next()
    }
}

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
            MoveKind::FreeBelow => MoveOptions {
                free_below: true,
                ..MoveOptions::DEFAULT
            },
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
    /// `set_swap_entry`: a software entry carrying `value` at `va`.
    Swap {
        va: u64,
        value: u64,
        fail: Option<u64>,
    },
    /// `swap_in`: the software entry at `va` becomes a page.
    SwapIn { va: u64, pa: u64, prot: Prot },
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

    fn src(self) -> &'static str {
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

/// Rust source for a protection.
pub struct ProtSrc(pub Prot);

impl fmt::Display for ProtSrc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prot::from_bits_retain({:#06b})", self.0.bits())?;
        if self.0.mem() != MemType::Normal {
            write!(f, ".with_mem(MemType::{:?})", self.0.mem())?;
        }
        Ok(())
    }
}

/// Each operation as the Rust call that replays it (`space`, `machine`).
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(k) = self.fail() {
            write!(f, "machine.fail_after(Some({k})); ")?;
        }
        match *self {
            Op::Map {
                va,
                pa,
                len,
                prot,
                kind,
                barrier_per_entry,
                no_cont,
                ..
            } => {
                let opts = match (kind, no_cont) {
                    (MapKind::Pages, false) => "PAGES",
                    (MapKind::PmdBlocks, false) => "PMD_BLOCKS",
                    (MapKind::Blocks, false) => "BLOCKS",
                    (MapKind::Pages, true) => "PAGES.no_contiguous()",
                    (MapKind::PmdBlocks, true) => "PMD_BLOCKS.no_contiguous()",
                    (MapKind::Blocks, true) => "BLOCKS.no_contiguous()",
                };
                let opts = if barrier_per_entry {
                    format!("variants::barrier_per_entry(MapOptions::{opts})")
                } else {
                    format!("MapOptions::{opts}")
                };
                write!(
                    f,
                    "space.map(VirtAddr({va:#x}), PhysAddr({pa:#x}), {len:#x}, {}, {opts})",
                    ProtSrc(prot)
                )
            }
            Op::Unmap { va, len, .. } => write!(f, "space.unmap(VirtAddr({va:#x}), {len:#x})"),
            Op::Protect { va, len, prot, .. } => write!(
                f,
                "space.change_protection(VirtAddr({va:#x}), {len:#x}, {})",
                ProtSrc(prot)
            ),
            Op::Move {
                old,
                new,
                len,
                kind,
                ..
            } => {
                let opts = match kind {
                    MoveKind::Default => "MoveOptions::DEFAULT",
                    MoveKind::PtesOnly => "variants::PTES_ONLY",
                    MoveKind::PmdOnly => "variants::PMD_ONLY",
                    MoveKind::FreeBelow => {
                        "MoveOptions { free_below: true, ..MoveOptions::DEFAULT }"
                    }
                };
                write!(
                    f,
                    "space.move_page_tables(VirtAddr({old:#x}), VirtAddr({new:#x}), {len:#x}, {opts})"
                )
            }
            Op::Swap { va, value, .. } => {
                write!(f, "space.set_swap_entry(VirtAddr({va:#x}), {value:#x})")
            }
            Op::SwapIn { va, pa, prot } => write!(
                f,
                "space.swap_in(VirtAddr({va:#x}), PhysAddr({pa:#x}), {})",
                ProtSrc(prot)
            ),
            Op::Touch { va, write: None } => write!(f, "machine.read_u64(VirtAddr({va:#x}))"),
            Op::Touch { va, write: Some(v) } => {
                write!(f, "machine.write_u64(VirtAddr({va:#x}), {v:#x})")
            }
            Op::Switch => write!(f, "std::mem::swap(&mut space, &mut other)"),
            Op::UnmapWith { va, len, .. } => {
                write!(
                    f,
                    "space.unmap_with(VirtAddr({va:#x}), {len:#x}, |r| reports.push(r))"
                )
            }
            Op::ClearRefs { va, len, what } => write!(
                f,
                "space.clear_refs(VirtAddr({va:#x}), {len:#x}, {}, |r| reports.push(r))",
                what.src()
            ),
            Op::Young { va } => write!(f, "space.test_and_clear_young(VirtAddr({va:#x}))"),
            Op::Get { va } => write!(f, "space.ptep_get(VirtAddr({va:#x}))"),
            Op::Fault { va, flags } => write!(
                f,
                "space.ptep_set_access_flags(VirtAddr({va:#x}), FaultFlags::{})",
                match flags {
                    Fault::Access => "ACCESS",
                    Fault::Dirty => "DIRTY",
                    Fault::Write => "WRITE",
                }
            ),
            Op::Install { va, pa, prot, .. } => write!(
                f,
                "space.install_pte(VirtAddr({va:#x}), PhysAddr({pa:#x}), {})",
                ProtSrc(prot)
            ),
            Op::Copy { va, len, cow, .. } => write!(
                f,
                "space.copy_page_range(&mut other, VirtAddr({va:#x}), {len:#x}, CopyMode::{})",
                if cow { "Cow" } else { "Shared" }
            ),
            Op::Live {
                va, len, prot, bbm, ..
            } => write!(
                f,
                "space.change_protection_live(VirtAddr({va:#x}), {len:#x}, {}, LiveOptions::{})",
                ProtSrc(prot),
                if bbm { "ALLOW_BBM" } else { "IN_PLACE" }
            ),
            Op::Gather { steps, n } => {
                write!(f, "let mut g = space.tlb_gather_mmu(); ")?;
                for s in &steps[..usize::from(n)] {
                    write!(f, "{s}; ")?;
                }
                write!(f, "g.finish()")
            }
        }?;
        if self.fail().is_some() {
            write!(f, "; machine.fail_after(None)")?;
        }
        Ok(())
    }
}

/// The generator for one format.
pub struct Gen {
    pub rng: Rng,
    va_bits: u32,
    pa_bits: u32,
    /// Start of the non-canonical hole (2^(VA_BITS-1)).
    half: u64,
    /// The regions operations work in, for each half ([`VaRange::bounds`]
    /// of `Lower`, then of `Upper`): the bottom of the half, the pages
    /// below and above its middle (arm64: the lower half's `[2^47, 2^48)`
    /// that only a one-half space translates) and its top (the last
    /// entries below the hole, the very top of the 64-bit space).
    regions: [[u64; 4]; 2],
    /// The first address of the upper half: the distance to a page's
    /// alias in the other half.
    upper: u64,
    /// The range of the space the next operation acts on (set by the
    /// episode): most operations aim inside it.
    pub range: VaRange,
    /// `Format::SWP_VALUE_BITS`.
    swp_bits: u32,
}

impl Gen {
    /// A generator for `A` starting at `seed`.
    pub fn new<A: Format>(seed: u64) -> Gen {
        let swp_bits = A::SWP_VALUE_BITS;
        let half = 1u64 << (A::VA_BITS - 1);
        let regions = [VaRange::Lower, VaRange::Upper].map(|r| {
            let (first, last) = r.bounds::<A>();
            let mid = first + (last - first) / 2 + 1;
            [first, mid - REGION, mid, (last - (REGION - 1))]
        });
        for (i, half_regions) in regions.iter().enumerate() {
            let r = [VaRange::Lower, VaRange::Upper][i];
            for &start in half_regions {
                assert!(
                    r.contains::<A>(start) && r.contains::<A>(start + (REGION - 1)),
                    "{}: region {start:#x} is not in {r:?}",
                    A::NAME
                );
            }
        }
        Gen {
            rng: Rng::new(seed),
            va_bits: A::VA_BITS,
            pa_bits: A::PA_BITS,
            half,
            regions,
            upper: VaRange::Upper.bounds::<A>().0,
            range: VaRange::Both,
            swp_bits,
        }
    }

    /// The same address in the other half (`va` plus or minus the start
    /// of the upper half).
    pub fn alias(&self, va: u64) -> u64 {
        if va >> 63 == 0 {
            va.wrapping_add(self.upper)
        } else {
            va.wrapping_sub(self.upper)
        }
    }

    /// A software-entry operation (one in eight operations): install one
    /// near a mapped page or a boundary (sometimes with a value that does
    /// not fit), or swap one in.
    fn swap_op(&mut self, model: &Model, swapped: Option<u64>) -> Op {
        if let Some(vpn) = swapped.filter(|_| self.rng.chance(30)) {
            let va = if self.rng.chance(10) {
                self.va(model, 50)
            } else {
                vpn << 12
            };
            let pa = if self.rng.chance(5) {
                1 + (self.rng.below(1 << 20) << 12)
            } else {
                self.rng.below(64 << 18) << 12
            };
            return Op::SwapIn {
                va,
                pa,
                prot: self.prot(),
            };
        }
        // Mostly next to what is mapped, so moves and unmaps meet them.
        let va = self.va(model, 70);
        let va = if self.rng.chance(50) {
            va & !(K4 - 1)
        } else {
            va
        };
        let bits = self.swp_bits.min(63);
        let value = match self.rng.below(20) {
            0 => 1u64 << bits,
            1 => u64::MAX,
            2 => (1u64 << bits) - 1,
            3 => 0,
            _ => self.rng.below(1 << bits.min(40)),
        };
        Op::Swap {
            va,
            value,
            fail: self.rng.chance(12).then(|| self.rng.below(6)),
        }
    }

    /// The next operation (never a [`Op::Touch`]). `swapped`: a page with
    /// a software entry, if there is one.
    pub fn op(&mut self, model: &Model, swapped: Option<u64>) -> Op {
        let fail = |g: &mut Gen| g.rng.chance(12).then(|| g.rng.below(8));
        match self.rng.below(100) {
            0..=7 => self.swap_op(model, swapped),
            8..=57 => self.classic_op(model),
            58..=63 => {
                let va = self.va(model, 75);
                Op::UnmapWith {
                    va,
                    len: self.len(va),
                    fail: fail(self),
                }
            }
            64..=68 => {
                let va = self.va(model, 75);
                Op::ClearRefs {
                    va,
                    len: self.len(va),
                    what: self.harvest(),
                }
            }
            69..=71 => Op::Young {
                va: self.point(model),
            },
            72..=75 => Op::Get {
                va: self.point(model),
            },
            76..=81 => Op::Fault {
                va: self.point(model),
                flags: self
                    .rng
                    .pick(&[Fault::Access, Fault::Dirty, Fault::Write, Fault::Write]),
            },
            82..=85 => {
                let va = self.va(model, 40);
                let va = if self.rng.chance(60) {
                    // Next to what is mapped: an empty slot of a table.
                    (va & !(K4 - 1)).wrapping_add(self.rng.pick(&[K4, 2 * K4, K4.wrapping_neg()]))
                } else {
                    va
                };
                Op::Install {
                    va,
                    pa: self.pa(va, K4),
                    prot: self.prot(),
                    fail: fail(self),
                }
            }
            86..=89 => {
                let va = self.va(model, 80);
                Op::Copy {
                    va,
                    len: self.len(va),
                    cow: self.rng.chance(60),
                    fail: fail(self),
                }
            }
            90..=93 => {
                let va = self.va(model, 75);
                let prot = match model.lookup(va >> 12) {
                    // Mostly a change that can be made in place.
                    Some((_, p)) if self.rng.chance(70) => {
                        let flip = self.rng.pick(&[Prot::WRITE, Prot::EXEC, Prot::USER]);
                        p.symmetric_difference(flip)
                    }
                    _ => self.prot(),
                };
                Op::Live {
                    va,
                    len: self.len(va),
                    prot,
                    bbm: self.rng.chance(30),
                    fail: fail(self),
                }
            }
            94..=97 => {
                let mut steps = [GStep::Unmap { va: 0, len: 0 }; 3];
                for st in &mut steps {
                    let va = self.va(model, 75);
                    let len = self.len(va);
                    *st = match self.rng.below(4) {
                        0 => GStep::Unmap { va, len },
                        1 => GStep::UnmapWith { va, len },
                        2 => GStep::Protect {
                            va,
                            len,
                            prot: self.prot(),
                        },
                        _ => GStep::ClearRefs {
                            va,
                            len,
                            what: self.harvest(),
                        },
                    };
                }
                Op::Gather {
                    steps,
                    n: 1 + self.rng.below(3) as u8,
                }
            }
            _ => Op::Switch,
        }
    }

    fn harvest(&mut self) -> Harvest {
        self.rng
            .pick(&[Harvest::Young, Harvest::Dirty, Harvest::All])
    }

    /// One address for a single-entry operation: mostly in a mapped page
    /// (at any offset), sometimes its alias in the other half.
    fn point(&mut self, model: &Model) -> u64 {
        let va = self.va(model, 85);
        let va = if self.rng.chance(50) {
            (va & !(K4 - 1)) + self.rng.below(K4)
        } else {
            va
        };
        if self.rng.chance(8) {
            self.alias(va)
        } else {
            va
        }
    }

    /// The operations of the first model: map, unmap, change_protection,
    /// move.
    fn classic_op(&mut self, model: &Model) -> Op {
        let fail = |g: &mut Gen| g.rng.chance(12).then(|| g.rng.below(8));
        let no_cont = self.rng.chance(25);
        match self.rng.below(100) {
            // Blocks: whole 2 MiB or 1 GiB entries, sometimes a few pages
            // more (pages after the blocks), or a folded run of 16 PMD
            // blocks (32 MiB).
            0..=11 => {
                let a = if self.rng.chance(35) { G1 } else { M2 };
                let run = a == M2 && self.rng.chance(30);
                let va = self.region_va() & !(if run { M32 } else { a } - 1);
                let extra = if self.rng.chance(20) {
                    self.rng.below(4) * K4
                } else {
                    0
                };
                let len = if run {
                    (1 + self.rng.below(2)) * M32
                } else {
                    (1 + self.rng.below(3)) * a
                } + extra;
                Op::Map {
                    va,
                    pa: (self.rng.below(64) << 30) + (va & (G1 - 1)),
                    len,
                    prot: self.prot(),
                    kind: if a == M2 && self.rng.chance(50) {
                        MapKind::PmdBlocks
                    } else {
                        MapKind::Blocks
                    },
                    barrier_per_entry: self.rng.chance(10),
                    no_cont,
                    fail: fail(self),
                }
            }
            12..=39 => {
                let va = self.va(model, 15);
                let (va, len) = if self.rng.chance(20) {
                    // Whole folded runs of pages.
                    (va & !(K64 - 1), (1 + self.rng.below(4)) * K64)
                } else {
                    (va, self.len(va))
                };
                let kind = self.rng.pick(&[
                    MapKind::Pages,
                    MapKind::PmdBlocks,
                    MapKind::Blocks,
                    MapKind::Blocks,
                ]);
                Op::Map {
                    va,
                    pa: self.pa(va, len),
                    len,
                    prot: self.prot(),
                    kind,
                    barrier_per_entry: self.rng.chance(15),
                    no_cont,
                    fail: fail(self),
                }
            }
            40..=59 => {
                let va = self.va(model, 60);
                Op::Unmap {
                    va,
                    len: self.len(va),
                    fail: fail(self),
                }
            }
            60..=79 => {
                let va = self.va(model, 60);
                let prot = match model.lookup(va >> 12) {
                    // Often the protection the range already has.
                    Some((_, p)) if self.rng.chance(30) => p,
                    _ => self.prot(),
                };
                Op::Protect {
                    va,
                    len: self.len(va),
                    prot,
                    fail: fail(self),
                }
            }
            _ => {
                let old = self.va(model, 70);
                let len = self.len(old);
                let new = match self.rng.below(100) {
                    // Same offset in a PMD or PUD: the fast paths.
                    0..=29 => {
                        let a = if self.rng.chance(60) { M2 } else { G1 };
                        let base = self.region_va() & !(a - 1);
                        base | (old & (a - 1))
                    }
                    // Overlapping ranges.
                    30..=39 => {
                        let d = (1 + self.rng.below((len / K4).clamp(1, 1024))) * K4;
                        if self.rng.chance(50) {
                            old.wrapping_add(d)
                        } else {
                            old.wrapping_sub(d)
                        }
                    }
                    // An occupied destination.
                    40..=54 => self.va(model, 100),
                    _ => self.va(model, 10),
                };
                let kind = match self.rng.below(10) {
                    0 => MoveKind::PtesOnly,
                    1 => MoveKind::PmdOnly,
                    2 => MoveKind::FreeBelow,
                    _ => MoveKind::Default,
                };
                Op::Move {
                    old,
                    new,
                    len,
                    kind,
                    fail: fail(self),
                }
            }
        }
    }

    /// A protection: any combination of the flags, mostly normal memory.
    pub fn prot(&mut self) -> Prot {
        let mut bits = Prot::from_bits_truncate(self.rng.below(8) as u8)
            & (Prot::WRITE | Prot::EXEC | Prot::USER);
        if self.rng.chance(25) {
            bits |= Prot::GLOBAL;
        }
        let mem = match self.rng.below(10) {
            0 => MemType::Device,
            1 => MemType::NormalNonCacheable,
            _ => MemType::Normal,
        };
        bits.with_mem(mem)
    }

    /// A page-aligned address inside one of the regions, near a PUD
    /// boundary of it.
    fn region_va(&mut self) -> u64 {
        // Mostly the space's own half; sometimes the other one.
        let own = match self.range {
            VaRange::Lower => 0,
            VaRange::Upper => 1,
            VaRange::Both => self.rng.below(2) as usize,
        };
        let h = if self.rng.chance(6) { 1 - own } else { own };
        let base = self.regions[h][self.rng.below(4) as usize];
        let boundary = (self.rng.below(5) * G1) as i64;
        let sign = if self.rng.chance(50) { 1 } else { -1 };
        let delta = sign
            * match self.rng.below(6) {
                0 => 0,
                1 => (1 + self.rng.below(8)) * K4,
                2 => self.rng.below(4) * M2 + self.rng.below(4) * K4,
                3 => self.rng.below(32) * M2,
                4 => self.rng.below(4096) * K4,
                _ => self.rng.below(3) * G1,
            } as i64;
        let off = (boundary + delta).clamp(0, (REGION - K4) as i64) as u64;
        base + off
    }

    /// A virtual address: with `mapped_pct` percent near a mapped page,
    /// rarely misaligned or non-canonical, else near a boundary of a region.
    pub fn va(&mut self, model: &Model, mapped_pct: u64) -> u64 {
        if !model.is_empty() && self.rng.chance(mapped_pct) {
            let hint = self.region_va() >> 12;
            let page = model.random_page(&mut self.rng, hint).expect("not empty") << 12;
            return match self.rng.below(10) {
                0 => page & !(M2 - 1),
                1 => page & !(G1 - 1),
                2 => page.wrapping_sub((1 + self.rng.below(4)) * K4),
                3 => page.wrapping_add((1 + self.rng.below(4)) * K4),
                4 => page & !(K64 - 1),
                5 => page & !(M32 - 1),
                6 if self.rng.chance(30) => self.alias(page),
                _ => page,
            };
        }
        match self.rng.below(100) {
            0..=2 => self.region_va() + 1 + self.rng.below(K4 - 1),
            3..=5 => {
                let k = self.rng.below(4) * K4;
                self.rng.pick(&[
                    self.half + k,
                    self.half.wrapping_neg() - K4 - k,
                    1 << 63,
                    self.half - K4 - k,
                ])
            }
            _ => self.region_va(),
        }
    }

    /// A length for a range starting at `va`.
    pub fn len(&mut self, va: u64) -> u64 {
        let k = self.rng.below(4) * K4;
        match self.rng.below(100) {
            0..=34 => {
                let most = if self.rng.chance(80) { 16 } else { 600 };
                (1 + self.rng.below(most)) * K4
            }
            35..=54 => {
                let j = (1 + self.rng.below(3)) * M2;
                if self.rng.chance(50) {
                    j + k
                } else {
                    j - k
                }
            }
            55..=60 => (1 + self.rng.below(2)) * G1 + if self.rng.chance(50) { k } else { 0 },
            // Whole or partial folded runs.
            61..=62 => self
                .rng
                .pick(&[K64, 2 * K64, M32, 2 * M32, M32 - M2, M32 + K4]),
            // Up to the hole or the top of the space, or a page past it.
            63..=72 => {
                let to_edge = if va < self.half {
                    self.half - va
                } else {
                    va.wrapping_neg()
                };
                if self.rng.chance(70) {
                    to_edge
                } else {
                    to_edge.wrapping_add(K4)
                }
            }
            73..=76 => 0,
            77..=80 => (1 + self.rng.below(16)) * K4 + 1 + self.rng.below(K4 - 1),
            81..=86 => self.rng.pick(&[
                !(K4 - 1),
                1 << self.va_bits,
                self.half,
                1 << 62,
                va.wrapping_neg().wrapping_add(K4),
            ]),
            _ => (1 + self.rng.below(4)) * K4,
        }
    }

    /// A physical address for mapping `len` bytes at `va`: mostly
    /// congruent with `va` modulo 1 GiB or 2 MiB (so blocks can be used),
    /// sometimes at the top of `PA_BITS` or misaligned.
    pub fn pa(&mut self, va: u64, len: u64) -> u64 {
        let top = 1u64 << self.pa_bits;
        match self.rng.below(100) {
            0..=79 => (self.rng.below(64) << 30) + (va & (G1 - 1)),
            80..=89 => (self.rng.below(64 << 9) << 21) + (va & (M2 - 1)),
            90..=94 => self.rng.below(64 << 18) << 12,
            95..=97 => {
                let fit = top.wrapping_sub(len) & !(K4 - 1);
                if self.rng.chance(50) {
                    fit
                } else {
                    fit.wrapping_add(K4)
                }
            }
            _ => (self.rng.below(64 << 18) << 12) + 1 + self.rng.below(K4 - 1),
        }
    }
}
