//! The flush plan: which fences a [`TlbRange`] turns into (a pure
//! function, tested on the host; `RiscvMmu` executes it on the hart, a
//! [`Hart`](crate::Hart) runs it on anything else, such as the simulator).
//!
//! The rules (privileged spec, "Supervisor Memory-Management Fence
//! Instruction", `SFENCE.VMA rs1, rs2`):
//!
//! - `rs1 = x0, rs2 = x0`: orders all reads and writes made to any level of
//!   the page tables, for all address spaces, and invalidates every
//!   address-translation cache entry, global ones included.
//! - `rs1 = x0, rs2 = asid`: any level of the page tables, for that ASID
//!   only, *except global mappings*.
//! - `rs1 = va, rs2 = x0`: only the *leaf* page-table entries for `va`, in
//!   all address spaces, global mappings included.
//! - `rs1 = va, rs2 = asid`: only the leaf entries for `va` in that ASID,
//!   *except global mappings*.
//!
//! Hence:
//! - a range flush of leaves goes per stride (one fence per page or
//!   superpage; a fence names any address inside a superpage), with the
//!   ASID only when the range holds no global mapping;
//! - a range whose *tables* changed (`last_level == false`: a table was
//!   unlinked or freed) needs `rs1 = x0`, because a fence with an address
//!   orders leaf entries only (Linux riscv's `tlb_flush` does a
//!   `flush_tlb_mm` when `freed_tables` for the same reason): the full
//!   flush of the ASID, or of everything when the range may hold global
//!   mappings or no ASID is in use;
//! - past [`TLB_FLUSH_CEILING`] strides, the full flush too.
//!
//! # Svinval
//!
//! With Svinval the per-stride fences may be split into an invalidation
//! and two fences ("Svinval" extension): `SFENCE.W.INVAL` (earlier stores
//! to the tables are ordered before the invalidations that follow), one
//! `SINVAL.VMA` per stride (same operands as `SFENCE.VMA`, but ordered only
//! against the two fences, so a hart may pipeline them), then
//! `SFENCE.INVAL.IR` (the invalidations are ordered before later implicit
//! references). [`FlushPlan::Svinval`] is that batched form.

use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;

use crate::regs::Asid;

/// Past this many strides a range flush becomes a full flush (Linux riscv
/// `tlb_flush_all_threshold`, 64).
pub const TLB_FLUSH_CEILING: u64 = 64;

/// The TLB maintenance a range flush performs.
///
/// The same shape as `pgtable_x86::flush::FlushPlan`: a per-stride variant
/// ([`PerStride`](FlushPlan::PerStride)) with the same first fields, the
/// arch's full flushes, and [`is_full`](Self::is_full).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlushPlan {
    /// `SFENCE.VMA va, asid` at `count` addresses `start`,
    /// `start + (1 << stride_shift)`, …; `asid` `None` is `rs2 = x0` (all
    /// address spaces, global mappings included).
    PerStride {
        /// First address.
        start: VirtAddr,
        /// log2 of the distance between two addresses.
        stride_shift: u32,
        /// Number of fences.
        count: u64,
        /// The ASID operand, or `None` for `x0`.
        asid: Option<Asid>,
    },
    /// Svinval: `SFENCE.W.INVAL`, then `SINVAL.VMA va, asid` at the same
    /// addresses as [`PerStride`](FlushPlan::PerStride), then
    /// `SFENCE.INVAL.IR`.
    Svinval {
        /// First address.
        start: VirtAddr,
        /// log2 of the distance between two addresses.
        stride_shift: u32,
        /// Number of `SINVAL.VMA`s.
        count: u64,
        /// The ASID operand, or `None` for `x0`.
        asid: Option<Asid>,
    },
    /// `SFENCE.VMA x0, asid`: every level, every non-global entry of the
    /// ASID.
    Asid(Asid),
    /// `SFENCE.VMA x0, x0`: everything, global entries included.
    All,
}

impl FlushPlan {
    /// Whether this plan invalidates everything of the address space
    /// rather than some pages.
    pub const fn is_full(self) -> bool {
        matches!(self, FlushPlan::Asid(_) | FlushPlan::All)
    }

    /// Whether this plan drops the global translations of the whole
    /// address space.
    pub const fn drops_all_globals(self) -> bool {
        matches!(self, FlushPlan::All)
    }
}

/// What the hart offers a flush: the address space's ASID (`None`: it runs
/// untagged, ASID 0 shared with other untagged roots, so its flushes use
/// `x0`) and whether it has Svinval.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FlushCaps {
    /// The ASID the address space runs with.
    pub asid: Option<Asid>,
    /// The hart implements Svinval.
    pub svinval: bool,
}

/// The full flush for an address space: by ASID, or everything when its
/// mappings may be global or it has no ASID.
#[inline]
pub const fn full_flush_plan(asid: Option<Asid>, global: bool) -> FlushPlan {
    match asid {
        Some(a) if !global => FlushPlan::Asid(a),
        _ => FlushPlan::All,
    }
}

/// Number of strides `range` covers, counted from its start rounded down
/// to a stride; `None` when it spans the whole 64-bit space or the stride
/// is not below 2^64.
pub fn strides(range: TlbRange) -> Option<u64> {
    if range.stride_shift >= 64 {
        return None;
    }
    let stride = 1u64 << range.stride_shift;
    let start = range.start.0 & !(stride - 1);
    let len = range.end.0.wrapping_sub(start);
    if len == 0 {
        return None;
    }
    Some(len.div_ceil(stride))
}

/// Which fences flush `range` (see the module docs): per stride while
/// only leaves changed and there are at most `ceiling` strides (batched
/// with Svinval), otherwise [`full_flush_plan`]. `global` says whether the
/// range may hold global mappings (then the per-stride fences use `x0` for
/// the ASID, which reaches them).
pub fn flush_plan(range: TlbRange, ceiling: u64, caps: FlushCaps, global: bool) -> FlushPlan {
    match strides(range) {
        Some(count) if count <= ceiling && range.last_level => {
            let start = VirtAddr(range.start.0 & !((1u64 << range.stride_shift) - 1));
            let stride_shift = range.stride_shift;
            let asid = if global { None } else { caps.asid };
            if caps.svinval {
                FlushPlan::Svinval {
                    start,
                    stride_shift,
                    count,
                    asid,
                }
            } else {
                FlushPlan::PerStride {
                    start,
                    stride_shift,
                    count,
                    asid,
                }
            }
        }
        _ => full_flush_plan(caps.asid, global),
    }
}
