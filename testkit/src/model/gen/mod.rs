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

use pgtable_core::contract::{Format, PAGE_SIZE};
use pgtable_core::{Prot, VaRange};

use super::reference::Model;

pub use op::{Fault, GStep, Harvest, MapKind, MoveKind, Op};
pub use replay::ProtSrc;
pub use rng::{episode_seed, Rng};

const K4: u64 = PAGE_SIZE;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;
/// A folded run of 16 PTEs (arm64 contiguous hint) and of 16 PMD blocks.
const K64: u64 = 16 * K4;
const M32: u64 = 16 * M2;
/// Bytes of each address region the operations work in.
pub const REGION: u64 = 4 * G1;

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
    /// not fit), or swap one in (or replace a page by another).
    fn swap_op(&mut self, model: &Model, swapped: Option<u64>) -> Op {
        // Sometimes a mapped page: `replace_pte` replaces it in place (or
        // refuses a block).
        let mapped = if self.rng.chance(10) {
            let hint = self.va(model, 0) >> 12;
            model.random_page(&mut self.rng, hint)
        } else {
            None
        };
        if let Some(vpn) = mapped.or(swapped.filter(|_| self.rng.chance(30))) {
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
}
