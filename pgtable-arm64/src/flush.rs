//! The flush plan and the TLB maintenance encodings (pure functions,
//! testable on the host).
//!
//! Arm ARM C5.5 "A64 System instructions for TLB maintenance" and D8.14
//! "TLB maintenance". With a 4 KiB granule:
//!
//! - `TLBI VAE1IS` / `VALE1IS` take `Xt` = ASID\[63:48\], TTL\[47:44\]
//!   (0: no level hint), VA\[55:12\] in bits \[43:0\].
//! - `TLBI RVAE1IS` / `RVALE1IS` (FEAT_TLBIRANGE) take `Xt` = ASID\[63:48\],
//!   TG\[47:46\] (0b01 = 4 KiB), SCALE\[45:44\], NUM\[43:39\], TTL\[38:37\],
//!   BaseADDR\[36:0\] = VA\[48:12\]; they invalidate
//!   `(NUM + 1) * 2^(5 * SCALE + 1)` pages from BaseADDR. The largest range
//!   (NUM 31, SCALE 3) is 2,097,152 pages ([`MAX_TLBI_RANGE_PAGES`]).
//! - `TLBI ASIDE1IS` takes the ASID in `Xt`\[63:48\]; `VMALLE1IS` none.
//!
//! A range of `n` pages is split as Linux's `__flush_tlb_range_op` does: an
//! odd page count first takes one single-page TLBI, then range operations
//! from the largest scale down, at most one per scale — so any range up to
//! the limit needs at most five instructions.
//!
//! ## Other granules and 52-bit addresses
//!
//! The `*_for` functions take a [`Granule`] (and, for the range forms,
//! TCR_EL1.DS) and give what the plain ones give for 4 KiB:
//!
//! - By VA ([`tlbi_va_operand_for`]): VA\[55:12\] in bits \[43:0\] for every
//!   granule, with the bits below the page RES0 (bits \[1:0\] for 16 KiB,
//!   \[3:0\] for 64 KiB: "TLBI VAE1IS", VA\[55:12\]); TTL\[47:44\] =
//!   TG << 2 | level with FEAT_TTL ([`tlbi_ttl`], Linux `__tlbi_level`).
//! - By range ([`tlbi_range_operand_for`]): TG\[47:46\] = 0b01 / 0b10 /
//!   0b11 for 4 / 16 / 64 KiB ([`Granule::tlbi_tg`]), TTL\[38:37\]
//!   ([`tlbi_range_ttl`]), BaseADDR\[36:0\] = the page number in units of
//!   the granule; with TCR_EL1.DS = 1 it is VA\[52:16\] whatever the
//!   granule, so a range must start 64 KiB-aligned ("TLBI RVAE1IS",
//!   BaseADDR; Linux `__TLBI_VADDR_RANGE`).
//! - The split ([`tlbi_range_ops_for`]): with DS = 1, as Linux's
//!   `__flush_tlb_range_op` with `lpa2`, single-page TLBIs until the start
//!   is 64 KiB-aligned, then range operations from scale 3 down, then the
//!   last odd page — so every range operation starts aligned.
//! - The ceiling ([`max_tlbi_ops_for`]): Linux `MAX_DVM_OPS` is
//!   `PTRS_PER_PTE`, the entries of one table: 512, 2048, 8192.

use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;
use static_assertions::const_assert_eq;

use crate::granule::Granule;

/// Past this many per-stride TLBIs a full flush is issued (Linux arm64
/// `MAX_TLBI_OPS` = `PTRS_PER_PTE`).
pub const MAX_TLBI_OPS: u64 = 512;

/// [`MAX_TLBI_OPS`] for `granule`: Linux `MAX_DVM_OPS` = `PTRS_PER_PTE`,
/// the entries of one table ([`Granule::entries_per_table`]): 512 for
/// 4 KiB, 2048 for 16 KiB, 8192 for 64 KiB.
pub const fn max_tlbi_ops_for(granule: Granule) -> u64 {
    granule.entries_per_table()
}

const_assert_eq!(max_tlbi_ops_for(Granule::K4), MAX_TLBI_OPS);
/// The most pages one range TLBI can cover: NUM 31, SCALE 3 (Linux
/// `MAX_TLBI_RANGE_PAGES`).
pub const MAX_TLBI_RANGE_PAGES: u64 = range_pages(31, 3);

/// Pages covered by a range TLBI with `num` and `scale`:
/// `(num + 1) << (5 * scale + 1)`.
#[inline]
pub const fn range_pages(num: u8, scale: u8) -> u64 {
    ((num as u64) + 1) << (5 * scale as u32 + 1)
}

/// One TLB invalidation instruction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum TlbiOp {
    /// A single-page `TLBI VAE1IS` / `VALE1IS` of the page number `page`
    /// (virtual address >> 12, or >> the page shift of the granule given
    /// to [`tlbi_range_ops_for`]).
    Page {
        /// Virtual page number.
        page: u64,
    },
    /// A range `TLBI RVAE1IS` / `RVALE1IS`.
    Range {
        /// SCALE, 0..=3.
        scale: u8,
        /// NUM, 0..=31.
        num: u8,
        /// First virtual page number of the range.
        base: u64,
    },
}

impl TlbiOp {
    /// Pages this operation invalidates.
    pub const fn pages(self) -> u64 {
        match self {
            TlbiOp::Page { .. } => 1,
            TlbiOp::Range { scale, num, .. } => range_pages(num, scale),
        }
    }
}

/// The range TLBI sequence for `pages` pages from page number `start_page`.
///
/// `pages` must be at most [`MAX_TLBI_RANGE_PAGES`] (more is clamped to it;
/// the caller issues a full flush instead, see [`flush_plan`]).
pub fn tlbi_range_ops(start_page: u64, pages: u64) -> TlbiRangeOps {
    TlbiRangeOps {
        next: start_page,
        left: pages.min(MAX_TLBI_RANGE_PAGES),
        scale: 4,
        align: 1,
    }
}

/// [`tlbi_range_ops`] for pages of `granule` (page numbers are virtual
/// address >> [`Granule::page_shift`]), with TCR_EL1.DS = `ds`.
///
/// Without DS (and always with 64 KiB, where DS is RES0 and BaseADDR is in
/// 64 KiB units anyway) the split is [`tlbi_range_ops`]'s. With DS and 4 or
/// 16 KiB, BaseADDR holds VA\[52:16\], so, as Linux's
/// `__flush_tlb_range_op` does with `lpa2`: single-page operations until
/// the start is 64 KiB-aligned (at most 15 for 4 KiB, 3 for 16 KiB), then
/// range operations from scale 3 down (scales 1 to 3 cover multiples of
/// 64 pages, so each starts aligned; scale 0 comes last), then a last
/// single page if one is left.
pub fn tlbi_range_ops_for(granule: Granule, ds: bool, start_page: u64, pages: u64) -> TlbiRangeOps {
    let align = if ds && granule.has_ds() {
        1 << (16 - granule.page_shift())
    } else {
        1
    };
    TlbiRangeOps {
        next: start_page,
        left: pages.min(MAX_TLBI_RANGE_PAGES),
        scale: 4,
        align,
    }
}

/// Iterator returned by [`tlbi_range_ops`].
#[derive(Clone, Debug)]
pub struct TlbiRangeOps {
    next: u64,
    left: u64,
    /// The next scale to try, plus one (4 = start at scale 3).
    scale: u8,
    /// Pages a range operation's start must be aligned to (1: any). Above
    /// 1 (TCR_EL1.DS = 1) the odd page goes last, not first.
    align: u64,
}

impl Iterator for TlbiRangeOps {
    type Item = TlbiOp;

    fn next(&mut self) -> Option<TlbiOp> {
        if self.left == 0 {
            return None;
        }
        let single = if self.align > 1 {
            // DS = 1: range operations start 64 KiB-aligned; the odd page
            // is the one left after scale 0.
            self.next % self.align != 0 || self.left == 1
        } else {
            // A range operation covers an even number of pages.
            self.left % 2 == 1
        };
        if single {
            let op = TlbiOp::Page { page: self.next };
            self.next += 1;
            self.left -= 1;
            return Some(op);
        }
        while self.scale > 0 {
            self.scale -= 1;
            let scale = self.scale;
            // How many units of 2^(5*scale+1) pages fit, at most 32.
            let units = (self.left >> (5 * scale as u32 + 1)).min(32);
            if units > 0 {
                let num = (units - 1) as u8;
                let op = TlbiOp::Range {
                    scale,
                    num,
                    base: self.next,
                };
                self.next += range_pages(num, scale);
                self.left -= range_pages(num, scale);
                return Some(op);
            }
        }
        unreachable!("an even page count below the limit is covered by scales 0..=3")
    }
}

/// The `Xt` operand of `TLBI VAE1IS` / `VALE1IS` for `va` and `asid` (no
/// TTL hint).
#[inline]
pub const fn tlbi_va_operand(va: u64, asid: u16) -> u64 {
    ((asid as u64) << 48) | ((va >> 12) & ((1 << 44) - 1))
}

/// The `Xt` operand of `TLBI RVAE1IS` / `RVALE1IS`: ASID, TG = 4 KiB,
/// SCALE, NUM, TTL = 0 (no hint), BaseADDR = the page number's low 37 bits.
#[inline]
pub const fn tlbi_range_operand(base_page: u64, scale: u8, num: u8, asid: u16) -> u64 {
    ((asid as u64) << 48)
        | (0b01 << 46)
        | (((scale & 0b11) as u64) << 44)
        | (((num & 0x1f) as u64) << 39)
        | (base_page & ((1 << 37) - 1))
}

/// The `Xt` operand of `TLBI VAE1IS` / `VALE1IS` for `va` and `asid` with
/// pages of `granule` and the TTL hint `ttl` ([`tlbi_ttl`]; 0: none):
/// ASID\[63:48\], TTL\[47:44\], VA\[55:12\] in bits \[43:0\] with the
/// bits below the page cleared, as they are RES0 (bits \[1:0\] for
/// 16 KiB, \[3:0\] for 64 KiB; Arm ARM C5.5 "TLBI VAE1IS"). For 4 KiB and
/// `ttl` 0 this is [`tlbi_va_operand`].
#[inline]
pub const fn tlbi_va_operand_for(granule: Granule, va: u64, asid: u16, ttl: u8) -> u64 {
    let res0 = (1u64 << (granule.page_shift() - 12)) - 1;
    ((asid as u64) << 48) | (((ttl & 0xf) as u64) << 44) | ((va >> 12) & ((1 << 44) - 1) & !res0)
}

/// The TTL\[47:44\] hint (FEAT_TTL) of a by-VA TLBI for a leaf at Arm
/// lookup `level` with pages of `granule`: TG << 2 | level, as Linux's
/// `__tlbi_level` builds it, where the Arm ARM defines it ("TLBI VAE1IS",
/// TTL): 4 KiB levels 1 to 3, and level 0 with FEAT_LPA2 (`lpa2`);
/// 16 KiB levels 2 and 3, and level 1 with FEAT_LPA2; 64 KiB levels 1 to
/// 3. Elsewhere 0, no hint (the hardware would ignore a reserved hint
/// too). Only a CPU with FEAT_TTL may be given a non-zero TTL.
pub const fn tlbi_ttl(granule: Granule, level: i8, lpa2: bool) -> u8 {
    let lowest = match granule {
        Granule::K4 => {
            if lpa2 {
                0
            } else {
                1
            }
        }
        Granule::K16 => {
            if lpa2 {
                1
            } else {
                2
            }
        }
        Granule::K64 => 1,
    };
    if level < lowest || level > 3 {
        return 0;
    }
    ((granule.tlbi_tg() as u8) << 2) | level as u8
}

/// The TTL\[38:37\] hint of a range TLBI whose leaves are at Arm lookup
/// `level` ("TLBI RVAE1IS", TTL): 0b01 = level 1 (with 16 KiB only with
/// FEAT_LPA2, `lpa2`), 0b10 = level 2, 0b11 = level 3; otherwise 0b00, any
/// level (Linux `__TLBI_VADDR_RANGE` passes 1..=3 and 0 otherwise).
pub const fn tlbi_range_ttl(granule: Granule, level: i8, lpa2: bool) -> u8 {
    match level {
        1 if matches!(granule, Granule::K16) && !lpa2 => 0,
        1..=3 => level as u8,
        _ => 0,
    }
}

/// The BaseADDR\[36:0\] field of a range TLBI starting at page `page` of
/// `granule`: the page number itself, or with TCR_EL1.DS = 1 the address
/// bits \[52:16\] (`(page << page_shift) >> 16`), which for 64 KiB pages
/// is the page number again. The caller aligns the start to 64 KiB with
/// DS = 1 ([`tlbi_range_ops_for`]); lower bits are dropped.
pub const fn tlbi_range_base(granule: Granule, ds: bool, page: u64) -> u64 {
    let base = if ds {
        (page << granule.page_shift()) >> 16
    } else {
        page
    };
    base & ((1 << 37) - 1)
}

/// The fields of one range TLBI besides the granule and DS: the first
/// page (in units of the granule), SCALE and NUM (the range is
/// `(NUM + 1) << (5 * SCALE + 1)` pages, [`range_pages`]), the ASID and
/// the TTL hint ([`tlbi_range_ttl`]; 0: none).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RangeOperand {
    /// The first page of the range, in units of the granule.
    pub base_page: u64,
    /// SCALE\[45:44\].
    pub scale: u8,
    /// NUM\[43:39\].
    pub num: u8,
    /// The ASID, bits \[63:48\].
    pub asid: u16,
    /// TTL\[38:37\].
    pub ttl: u8,
}

/// The `Xt` operand of `TLBI RVAE1IS` / `RVALE1IS` for pages of `granule`
/// with TCR_EL1.DS = `ds`: ASID\[63:48\], TG\[47:46\]
/// ([`Granule::tlbi_tg`]), SCALE\[45:44\], NUM\[43:39\], TTL\[38:37\],
/// BaseADDR\[36:0\] ([`tlbi_range_base`]). For 4 KiB, no DS and `ttl` 0
/// this is [`tlbi_range_operand`].
#[inline]
pub const fn tlbi_range_operand_for(granule: Granule, ds: bool, op: RangeOperand) -> u64 {
    ((op.asid as u64) << 48)
        | (granule.tlbi_tg() << 46)
        | (((op.scale & 0b11) as u64) << 44)
        | (((op.num & 0x1f) as u64) << 39)
        | (((op.ttl & 0b11) as u64) << 37)
        | tlbi_range_base(granule, ds, op.base_page)
}

/// The `Xt` operand of `TLBI ASIDE1IS`.
#[inline]
pub const fn tlbi_asid_operand(asid: u16) -> u64 {
    (asid as u64) << 48
}

/// How to carry out one [`TlbRange`] flush.
///
/// The same shape as `pgtable_x86::flush::FlushPlan`: a per-stride variant
/// ([`PerStride`](FlushPlan::PerStride), one TLBI by VA per stride) with
/// the same fields, the arch's other forms, and [`is_full`](Self::is_full).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlushPlan {
    /// Range TLBIs ([`tlbi_range_ops`]) over `pages` pages from `start_page`.
    Range {
        /// First page number.
        start_page: u64,
        /// Number of pages: 4 KiB from [`flush_plan`], of the granule from
        /// [`flush_plan_for`].
        pages: u64,
        /// Use the last-level forms (`RVALE1IS`, `VALE1IS`).
        last_level: bool,
    },
    /// One `VAE1IS` / `VALE1IS` at each of `count` addresses: `start`,
    /// `start + (1 << stride_shift)`, ….
    PerStride {
        /// First address.
        start: VirtAddr,
        /// log2 of the distance between two addresses.
        stride_shift: u32,
        /// Number of TLBIs.
        count: u64,
        /// Use the last-level form (`VALE1IS`).
        last_level: bool,
    },
    /// Invalidate the whole address space (`ASIDE1IS` or `VMALLE1IS`).
    All,
}

impl FlushPlan {
    /// Whether this plan invalidates everything of the address space
    /// rather than some pages.
    pub const fn is_full(self) -> bool {
        matches!(self, FlushPlan::All)
    }
}

/// Chooses how to flush `range`, as Linux's `__flush_tlb_range` does:
/// with FEAT_TLBIRANGE (`has_range`), range operations up to
/// [`MAX_TLBI_RANGE_PAGES`]; without, one TLBI per stride up to
/// [`MAX_TLBI_OPS`]; a full flush past either limit.
pub fn flush_plan(range: TlbRange, has_range: bool) -> FlushPlan {
    flush_plan_for(Granule::K4, range, has_range)
}

/// [`flush_plan`] for pages of `granule`: strides below the page are taken
/// as the page, [`FlushPlan::Range`] counts pages of the granule (page
/// numbers are address >> [`Granule::page_shift`]; split them with
/// [`tlbi_range_ops_for`]), and the per-stride ceiling is
/// [`max_tlbi_ops_for`]. The range ceiling, [`MAX_TLBI_RANGE_PAGES`], is
/// the same number of pages for every granule. For [`Granule::K4`] this is
/// [`flush_plan`].
pub fn flush_plan_for(granule: Granule, range: TlbRange, has_range: bool) -> FlushPlan {
    let len = range.end.0.wrapping_sub(range.start.0);
    // A zero length means the range wraps to the top of the space: huge.
    if len == 0 {
        return FlushPlan::All;
    }
    let page_shift = granule.page_shift();
    let stride_shift = range.stride_shift.max(page_shift);
    // Whole stride-sized entries, as Linux rounds the range to the stride:
    // from the entry holding `start` (a TLBI by VA drops whatever entry
    // translates that VA) to the one holding the last byte.
    let step = 1u64 << stride_shift;
    let first = range.start.0 & !(step - 1);
    let len = (len + (range.start.0 - first)).next_multiple_of(step);
    if has_range {
        let pages = len >> page_shift;
        if pages > MAX_TLBI_RANGE_PAGES {
            return FlushPlan::All;
        }
        return FlushPlan::Range {
            start_page: first >> page_shift,
            pages,
            last_level: range.last_level,
        };
    }
    let count = len >> stride_shift;
    if count > max_tlbi_ops_for(granule) {
        return FlushPlan::All;
    }
    FlushPlan::PerStride {
        start: VirtAddr(first),
        stride_shift,
        count,
        last_level: range.last_level,
    }
}
