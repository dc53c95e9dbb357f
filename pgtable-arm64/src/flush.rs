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

use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;

/// Past this many per-stride TLBIs a full flush is issued (Linux arm64
/// `MAX_TLBI_OPS` = `PTRS_PER_PTE`).
pub const MAX_TLBI_OPS: u64 = 512;
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
    /// (virtual address >> 12).
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
    }
}

/// Iterator returned by [`tlbi_range_ops`].
#[derive(Clone, Debug)]
pub struct TlbiRangeOps {
    next: u64,
    left: u64,
    /// The next scale to try, plus one (4 = start at scale 3).
    scale: u8,
}

impl Iterator for TlbiRangeOps {
    type Item = TlbiOp;

    fn next(&mut self) -> Option<TlbiOp> {
        if self.left == 0 {
            return None;
        }
        if self.left % 2 == 1 {
            // A range operation covers an even number of pages.
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
        /// Number of 4 KiB pages.
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
    let len = range.end.0.wrapping_sub(range.start.0);
    // A zero length means the range wraps to the top of the space: huge.
    if len == 0 {
        return FlushPlan::All;
    }
    let stride_shift = range.stride_shift.max(12);
    // Whole stride-sized entries, as Linux rounds the range to the stride:
    // from the entry holding `start` (a TLBI by VA drops whatever entry
    // translates that VA) to the one holding the last byte.
    let step = 1u64 << stride_shift;
    let first = range.start.0 & !(step - 1);
    let len = (len + (range.start.0 - first)).next_multiple_of(step);
    if has_range {
        let pages = len >> 12;
        if pages > MAX_TLBI_RANGE_PAGES {
            return FlushPlan::All;
        }
        return FlushPlan::Range {
            start_page: first >> 12,
            pages,
            last_level: range.last_level,
        };
    }
    let count = len >> stride_shift;
    if count > MAX_TLBI_OPS {
        return FlushPlan::All;
    }
    FlushPlan::PerStride {
        start: VirtAddr(first),
        stride_shift,
        count,
        last_level: range.last_level,
    }
}
