//! The range-flush policy: which instructions a [`TlbRange`] turns into.
//!
//! This is a pure function so the host can test it; `X86Mmu` (bare metal
//! only) executes the plan.
//!
//! The rules (Intel SDM Vol. 3A §4.10.4.1 "Operations that Invalidate TLBs
//! and Paging-Structure Caches"):
//!
//! - `INVLPG addr` invalidates every TLB entry for the page containing
//!   `addr` (all of them if a large page is cached as several entries),
//!   global ones included, and every paging-structure-cache entry of the
//!   current PCID. One `INVLPG` per stride therefore also covers removed
//!   tables (`last_level == false`) and pages larger than 4 KiB.
//! - Past the ceiling (more than `ceiling` strides, Linux's
//!   `tlb_single_page_flush_ceiling` = 33) one full flush is cheaper:
//!   - non-global mappings: MOV to CR3 (invalidates the current PCID's
//!     non-global entries) or, with INVPCID, INVPCID type 1
//!     (single-context, the current PCID) — the same effect;
//!   - global mappings: INVPCID type 2 (all contexts, globals included) or,
//!     without INVPCID, toggling CR4.PGE (any change of CR4.PGE
//!     invalidates all TLB entries, globals included).

use pgtable_core::{TlbRange, VirtAddr};

/// The TLB maintenance a range flush performs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlushPlan {
    /// `INVLPG` at `count` addresses: `start`, `start + (1 << stride_shift)`, ….
    Invlpg {
        /// First address.
        start: VirtAddr,
        /// log2 of the distance between two addresses.
        stride_shift: u32,
        /// Number of `INVLPG`s.
        count: u64,
    },
    /// Reload CR3 with its current value: the current PCID's non-global
    /// entries go.
    ReloadCr3,
    /// INVPCID type 1 (single-context) for the current PCID: non-global
    /// entries of that PCID go.
    InvpcidSingleContext,
    /// INVPCID type 2 (all-context, including globals): everything goes.
    InvpcidAllContexts,
    /// Clear and set CR4.PGE again: everything goes, globals included.
    ToggleCr4Pge,
}

impl FlushPlan {
    /// Whether this plan drops global translations of the whole address
    /// space (not just of some pages).
    pub const fn drops_all_globals(self) -> bool {
        matches!(
            self,
            FlushPlan::InvpcidAllContexts | FlushPlan::ToggleCr4Pge
        )
    }

    /// Whether this plan invalidates everything of the current address
    /// space rather than some pages.
    pub const fn is_full(self) -> bool {
        !matches!(self, FlushPlan::Invlpg { .. })
    }
}

/// The full flush for an address space: `global` says whether its mappings
/// may be global (then the flush must drop global entries too).
pub const fn full_flush_plan(has_invpcid: bool, global: bool) -> FlushPlan {
    match (has_invpcid, global) {
        (true, false) => FlushPlan::InvpcidSingleContext,
        (false, false) => FlushPlan::ReloadCr3,
        (true, true) => FlushPlan::InvpcidAllContexts,
        (false, true) => FlushPlan::ToggleCr4Pge,
    }
}

/// Number of strides `range` covers, counted from its start rounded down
/// to a stride; `None` when it spans the whole 64-bit space (`start ==
/// end`: [`TlbRange`] encodes the top of the space as `end == 0`) or the
/// stride is not below 2^64.
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

/// Which instructions flush `range`: one `INVLPG` per stride while there
/// are at most `ceiling` strides, otherwise the full flush of
/// [`full_flush_plan`]. `global` says whether the range may hold global
/// mappings; `INVLPG` drops those too, so it matters only for the full
/// flush.
pub fn flush_plan(range: TlbRange, ceiling: u64, has_invpcid: bool, global: bool) -> FlushPlan {
    match strides(range) {
        Some(count) if count <= ceiling => FlushPlan::Invlpg {
            start: VirtAddr(range.start.0 & !((1u64 << range.stride_shift) - 1)),
            stride_shift: range.stride_shift,
            count,
        },
        _ => full_flush_plan(has_invpcid, global),
    }
}
