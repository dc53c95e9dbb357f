//! The operations and their random generator.
//!
//! Inputs are drawn around the places where page-table code goes wrong:
//! PMD and PUD boundaries, blocks covered in part, the top pages below the
//! non-canonical hole and at the very top of the 64-bit space, occupied and
//! overlapping destinations, zero, misaligned and huge lengths,
//! non-canonical addresses, physical ranges at the edge of `PA_BITS`, and
//! allocation failures.
//!
//! [`Op`] and its parts are in `op.rs`, the Rust call each operation
//! replays as in `replay.rs`, the random source in `rng.rs`, and the
//! values the generator draws (protections, addresses, lengths) in
//! `values.rs`.

mod op;
mod replay;
mod rng;
mod values;

use pgtable_core::contract::Format;
use pgtable_core::{Prot, VaRange};

use super::geometry;
use super::reference::Model;

pub use op::{Fault, GStep, Harvest, MapKind, MoveKind, Op};
pub use replay::ProtSrc;
pub use rng::{episode_seed, Rng};

/// The sizes operations are drawn around, from the format's geometry (for
/// 4 KiB pages: 4 KiB, 2 MiB, 1 GiB, 64 KiB, 32 MiB).
#[derive(Clone, Copy)]
pub(super) struct Sizes {
    /// A page.
    k4: u64,
    /// A PMD block.
    m2: u64,
    /// A PUD block (the top level's entry for two levels).
    g1: u64,
    /// A folded run of PTEs (arm64 contiguous hint; 16 pages where the
    /// format folds none).
    k64: u64,
    /// A folded run of PMD blocks.
    m32: u64,
    /// `PAGE_SHIFT`.
    shift: u32,
    /// Bytes of each address region the operations work in: four PUDs.
    region: u64,
    /// PUD-congruent physical addresses are drawn among this many PUDs
    /// (64, fewer where 64 PUDs pass half of `PA_BITS`).
    puds: u64,
}

impl Sizes {
    fn of<A: Format>() -> Sizes {
        let k4 = geometry::page::<A>();
        let m2 = geometry::pmd::<A>();
        let g1 = geometry::pud::<A>();
        let fold = |h: u32| match A::cont_entries(h) {
            0 | 1 => 16,
            n => u64::from(n),
        };
        Sizes {
            k4,
            m2,
            g1,
            k64: fold(0) * k4,
            m32: fold(1) * m2,
            shift: A::PAGE_SHIFT,
            region: 4 * g1,
            puds: ((1u64 << (A::PA_BITS - 1)) / g1).clamp(1, 64),
        }
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
    /// The format's page, PMD and PUD sizes.
    sz: Sizes,
}

impl Gen {
    /// A generator for `A` starting at `seed`.
    pub fn new<A: Format>(seed: u64) -> Gen {
        let swp_bits = A::SWP_VALUE_BITS;
        let half = 1u64 << (A::VA_BITS - 1);
        let sz = Sizes::of::<A>();
        let region = sz.region;
        let regions = [VaRange::Lower, VaRange::Upper].map(|r| {
            let (first, last) = r.bounds::<A>();
            let mid = first + (last - first) / 2 + 1;
            [first, mid - region, mid, (last - (region - 1))]
        });
        for (i, half_regions) in regions.iter().enumerate() {
            let r = [VaRange::Lower, VaRange::Upper][i];
            for &start in half_regions {
                assert!(
                    r.contains::<A>(start) && r.contains::<A>(start + (region - 1)),
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
            sz,
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
    /// not fit), or swap one in (or replace a page by another).
    fn swap_op(&mut self, model: &Model, swapped: Option<u64>) -> Op {
        // Sometimes a mapped page: `replace_pte` replaces it in place (or
        // refuses a block).
        let mapped = if self.rng.chance(10) {
            let hint = self.va(model, 0) >> self.sz.shift;
            model.random_page(&mut self.rng, hint)
        } else {
            None
        };
        if let Some(vpn) = mapped.or(swapped.filter(|_| self.rng.chance(30))) {
            let va = if self.rng.chance(10) {
                self.va(model, 50)
            } else {
                vpn << self.sz.shift
            };
            let pa = if self.rng.chance(5) {
                1 + (self.rng.below(1 << 20) << self.sz.shift)
            } else {
                self.rng.below((64 << 30) >> self.sz.shift) << self.sz.shift
            };
            // A page mostly swapped out, a software entry swapped in.
            let swap = (mapped.is_some() && self.rng.chance(60)).then(|| {
                let bits = self.swp_bits.min(63);
                if self.rng.chance(5) {
                    1u64 << bits
                } else {
                    self.rng.below(1 << bits.min(40))
                }
            });
            return Op::Replace {
                va,
                pa,
                prot: self.prot(),
                swap,
            };
        }
        // Mostly next to what is mapped, so moves and unmaps meet them.
        let va = self.va(model, 70);
        let va = if self.rng.chance(50) {
            va & !(self.sz.k4 - 1)
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
                    (va & !(self.sz.k4 - 1)).wrapping_add(self.rng.pick(&[
                        self.sz.k4,
                        2 * self.sz.k4,
                        self.sz.k4.wrapping_neg(),
                    ]))
                } else {
                    va
                };
                Op::Install {
                    va,
                    pa: self.pa(va, self.sz.k4),
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
                let prot = match model.lookup(va >> self.sz.shift) {
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
            (va & !(self.sz.k4 - 1)) + self.rng.below(self.sz.k4)
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
            // Blocks: whole PMD or PUD entries, sometimes a few pages
            // more (pages after the blocks), or a folded run of 16 PMD
            // blocks (32 MiB with 4 KiB pages).
            0..=11 => {
                let a = if self.rng.chance(35) {
                    self.sz.g1
                } else {
                    self.sz.m2
                };
                let run = a == self.sz.m2 && self.rng.chance(30);
                let va = self.region_va() & !(if run { self.sz.m32 } else { a } - 1);
                let extra = if self.rng.chance(20) {
                    self.rng.below(4) * self.sz.k4
                } else {
                    0
                };
                let len = if run {
                    (1 + self.rng.below(2)) * self.sz.m32
                } else {
                    (1 + self.rng.below(3)) * a
                } + extra;
                Op::Map {
                    va,
                    pa: self.rng.below(self.sz.puds) * self.sz.g1 + (va & (self.sz.g1 - 1)),
                    len,
                    prot: self.prot(),
                    kind: if a == self.sz.m2 && self.rng.chance(50) {
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
                    (
                        va & !(self.sz.k64 - 1),
                        (1 + self.rng.below(4)) * self.sz.k64,
                    )
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
                let prot = match model.lookup(va >> self.sz.shift) {
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
                        let a = if self.rng.chance(60) {
                            self.sz.m2
                        } else {
                            self.sz.g1
                        };
                        let base = self.region_va() & !(a - 1);
                        base | (old & (a - 1))
                    }
                    // Overlapping ranges.
                    30..=39 => {
                        let d =
                            (1 + self.rng.below((len / self.sz.k4).clamp(1, 1024))) * self.sz.k4;
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
}
