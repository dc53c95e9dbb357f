//! The operations and their random generator.
//!
//! Inputs are drawn around the places where page-table code goes wrong:
//! PMD and PUD boundaries, blocks covered in part, the top pages below the
//! non-canonical hole and at the very top of the 64-bit space, occupied and
//! overlapping destinations, zero, misaligned and huge lengths,
//! non-canonical addresses, physical ranges at the edge of `PA_BITS`, and
//! allocation failures.

use std::fmt;

use pgtable_core::{variants, Format, MemType, MoveOptions, Prot, PAGE_SIZE};

use super::reference::{canonical, Model};

const K4: u64 = PAGE_SIZE;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;
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
}

impl Op {
    /// The allocation failure point, for operations that allocate.
    pub fn fail(&self) -> Option<u64> {
        match *self {
            Op::Map { fail, .. }
            | Op::Unmap { fail, .. }
            | Op::Protect { fail, .. }
            | Op::Move { fail, .. }
            | Op::Swap { fail, .. } => fail,
            Op::Touch { .. } | Op::SwapIn { .. } => None,
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
                ..
            } => {
                let opts = match kind {
                    MapKind::Pages => "PAGES",
                    MapKind::PmdBlocks => "PMD_BLOCKS",
                    MapKind::Blocks => "BLOCKS",
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
                    "space.move_page_tables_with(VirtAddr({old:#x}), VirtAddr({new:#x}), {len:#x}, {opts})"
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
    /// The regions operations work in: the bottom of the space, the top of
    /// the lower half (last entries below the hole), the bottom of the
    /// upper half and the very top of the 64-bit space.
    regions: [u64; 4],
    /// `Format::SWP_VALUE_BITS`.
    swp_bits: u32,
}

impl Gen {
    /// A generator for `A` starting at `seed`.
    pub fn new<A: Format>(seed: u64) -> Gen {
        let swp_bits = A::SWP_VALUE_BITS;
        let half = 1u64 << (A::VA_BITS - 1);
        let regions = [0, half - REGION, half.wrapping_neg(), REGION.wrapping_neg()];
        for r in regions {
            assert!(
                canonical::<A>(r) && canonical::<A>(r + (REGION - 1)),
                "{}: region {r:#x} is not canonical",
                A::NAME
            );
        }
        Gen {
            rng: Rng::new(seed),
            va_bits: A::VA_BITS,
            pa_bits: A::PA_BITS,
            half,
            regions,
            swp_bits,
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
        if self.rng.chance(12) {
            return self.swap_op(model, swapped);
        }
        let fail = |g: &mut Gen| g.rng.chance(12).then(|| g.rng.below(8));
        match self.rng.below(100) {
            // Blocks: whole 2 MiB or 1 GiB entries, sometimes a few pages
            // more (pages after the blocks).
            0..=11 => {
                let a = if self.rng.chance(35) { G1 } else { M2 };
                let va = self.region_va() & !(a - 1);
                let extra = if self.rng.chance(20) {
                    self.rng.below(4) * K4
                } else {
                    0
                };
                let len = (1 + self.rng.below(3)) * a + extra;
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
                    fail: fail(self),
                }
            }
            12..=39 => {
                let va = self.va(model, 15);
                let len = self.len(va);
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
        let base = self.regions[self.rng.below(4) as usize];
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
            return match self.rng.below(6) {
                0 => page & !(M2 - 1),
                1 => page & !(G1 - 1),
                2 => page.wrapping_sub((1 + self.rng.below(4)) * K4),
                3 => page.wrapping_add((1 + self.rng.below(4)) * K4),
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
            55..=62 => (1 + self.rng.below(2)) * G1 + if self.rng.chance(50) { k } else { 0 },
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
