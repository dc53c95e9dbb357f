//! The values the generator draws: protections, addresses, lengths and
//! physical addresses, shaped around the boundaries page-table code gets
//! wrong.

use pgtable_core::{MemType, Prot, VaRange};

use super::super::reference::Model;
use super::Gen;

impl Gen {
    /// A protection: any combination of the flags, mostly normal memory;
    /// now and then [`Prot::NONE`] (Linux `mprotect(PROT_NONE)`), as a
    /// mapping of it reports itself ([`Prot::normalized`]).
    pub fn prot(&mut self) -> Prot {
        let mut bits = Prot::from_bits_truncate(self.rng.below(8) as u8)
            & (Prot::WRITE | Prot::EXEC | Prot::USER);
        if self.rng.chance(25) {
            bits |= Prot::GLOBAL;
        }
        if self.rng.chance(8) {
            bits = Prot::NONE;
        }
        let mem = match self.rng.below(10) {
            0 => MemType::Device,
            1 => MemType::NormalNonCacheable,
            _ => MemType::Normal,
        };
        bits.with_mem(mem)
    }

    /// A misalignment: an offset in `[1, page)`. With pages larger than
    /// 4 KiB, half of them are multiples of 4 KiB (what code that assumes
    /// 4 KiB pages would accept).
    fn sub_page(&mut self) -> u64 {
        const K: u64 = 4096;
        if self.sz.k4 > K && self.rng.chance(50) {
            (1 + self.rng.below(self.sz.k4 / K - 1)) * K
        } else {
            1 + self.rng.below(self.sz.k4 - 1)
        }
    }

    /// A page-aligned address inside one of the regions, near a PUD
    /// boundary of it.
    pub(super) fn region_va(&mut self) -> u64 {
        // Mostly the space's own half; sometimes the other one.
        let own = match self.range {
            VaRange::Lower => 0,
            VaRange::Upper => 1,
            VaRange::Both => self.rng.below(2) as usize,
        };
        let h = if self.rng.chance(6) { 1 - own } else { own };
        let base = self.regions[h][self.rng.below(4) as usize];
        let boundary = (self.rng.below(5) * self.sz.g1) as i64;
        let sign = if self.rng.chance(50) { 1 } else { -1 };
        let delta = sign
            * match self.rng.below(6) {
                0 => 0,
                1 => (1 + self.rng.below(8)) * self.sz.k4,
                2 => self.rng.below(4) * self.sz.m2 + self.rng.below(4) * self.sz.k4,
                3 => self.rng.below(32) * self.sz.m2,
                4 => self.rng.below(4096) * self.sz.k4,
                _ => self.rng.below(3) * self.sz.g1,
            } as i64;
        let off = (boundary + delta).clamp(0, (self.sz.region - self.sz.k4) as i64) as u64;
        base + off
    }

    /// A virtual address: with `mapped_pct` percent near a mapped page,
    /// rarely misaligned or non-canonical, else near a boundary of a region.
    pub fn va(&mut self, model: &Model, mapped_pct: u64) -> u64 {
        if !model.is_empty() && self.rng.chance(mapped_pct) {
            let hint = self.region_va() >> self.sz.shift;
            let page = model.random_page(&mut self.rng, hint).expect("not empty") << self.sz.shift;
            return match self.rng.below(10) {
                0 => page & !(self.sz.m2 - 1),
                1 => page & !(self.sz.g1 - 1),
                2 => page.wrapping_sub((1 + self.rng.below(4)) * self.sz.k4),
                3 => page.wrapping_add((1 + self.rng.below(4)) * self.sz.k4),
                4 => page & !(self.sz.k64 - 1),
                5 => page & !(self.sz.m32 - 1),
                6 if self.rng.chance(30) => self.alias(page),
                _ => page,
            };
        }
        match self.rng.below(100) {
            0..=2 => self.region_va() + self.sub_page(),
            3..=5 => {
                let k = self.rng.below(4) * self.sz.k4;
                self.rng.pick(&[
                    self.half + k,
                    self.half.wrapping_neg() - self.sz.k4 - k,
                    1 << 63,
                    self.half - self.sz.k4 - k,
                ])
            }
            _ => self.region_va(),
        }
    }

    /// A length for a range starting at `va`.
    pub fn len(&mut self, va: u64) -> u64 {
        let k = self.rng.below(4) * self.sz.k4;
        match self.rng.below(100) {
            0..=34 => {
                let most = if self.rng.chance(80) { 16 } else { 600 };
                (1 + self.rng.below(most)) * self.sz.k4
            }
            35..=54 => {
                let j = (1 + self.rng.below(3)) * self.sz.m2;
                if self.rng.chance(50) {
                    j + k
                } else {
                    j - k
                }
            }
            55..=60 => {
                (1 + self.rng.below(2)) * self.sz.g1 + if self.rng.chance(50) { k } else { 0 }
            }
            // Whole or partial folded runs.
            61..=62 => self.rng.pick(&[
                self.sz.k64,
                2 * self.sz.k64,
                self.sz.m32,
                2 * self.sz.m32,
                self.sz.m32 - self.sz.m2,
                self.sz.m32 + self.sz.k4,
            ]),
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
                    to_edge.wrapping_add(self.sz.k4)
                }
            }
            73..=76 => 0,
            77..=80 => (1 + self.rng.below(16)) * self.sz.k4 + self.sub_page(),
            81..=86 => self.rng.pick(&[
                !(self.sz.k4 - 1),
                1 << self.va_bits,
                self.half,
                1 << 62,
                va.wrapping_neg().wrapping_add(self.sz.k4),
            ]),
            _ => (1 + self.rng.below(4)) * self.sz.k4,
        }
    }

    /// A physical address for mapping `len` bytes at `va`: mostly
    /// congruent with `va` modulo a PUD or a PMD block (1 GiB or 2 MiB with
    /// 4 KiB pages; so blocks can be used),
    /// sometimes at the top of `PA_BITS` or misaligned.
    pub fn pa(&mut self, va: u64, len: u64) -> u64 {
        let top = 1u64 << self.pa_bits;
        match self.rng.below(100) {
            0..=79 => self.rng.below(self.sz.puds) * self.sz.g1 + (va & (self.sz.g1 - 1)),
            80..=89 => {
                self.rng.below((64 << 30) / self.sz.m2) * self.sz.m2 + (va & (self.sz.m2 - 1))
            }
            90..=94 => self.rng.below((64 << 30) >> self.sz.shift) << self.sz.shift,
            95..=97 => {
                let fit = top.wrapping_sub(len) & !(self.sz.k4 - 1);
                if self.rng.chance(50) {
                    fit
                } else {
                    fit.wrapping_add(self.sz.k4)
                }
            }
            _ => (self.rng.below((64 << 30) >> self.sz.shift) << self.sz.shift) + self.sub_page(),
        }
    }
}
