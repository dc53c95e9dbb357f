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
//!
//! # PCIDs
//!
//! With CR4.PCIDE = 1, CR3\[11:0\] is the current PCID and the TLB keeps
//! the entries of other PCIDs across a MOV to CR3 with bit 63 set (SDM Vol.
//! 3A §4.10.1 "Process-Context Identifiers"). But `INVLPG` and MOV to CR3
//! act only on the *current* PCID (and global entries): a flush for an
//! address space whose PCID is not current on this CPU must either name
//! the PCID with INVPCID (type 0 per address, type 1 for all of it) or be
//! deferred: [`PcidCpu::mark_stale`] records that the PCID owes a flush on
//! this CPU, and the next switch to it loads CR3 *without* the no-flush
//! bit ([`PcidCpu::take_stale`], [`cr3_value`](crate::cr3_value)), as Linux does with
//! `cpu_tlbstate` and `tlb_gen`. Until then the processor cannot use the
//! PCID's entries: it uses only the current PCID's (§4.10.2.4). Global
//! entries are shared by every PCID, so a range flush also drops the
//! range's global entries with `INVLPG` (which reaches them whatever the
//! PCID). [`pcid_flush_plan`] makes these choices; it is pure, and the
//! bare-metal `X86Mmu` executes it.
//!
//! The kernel half is the exception: every user space links it, so its
//! non-global leaves and its tables may be cached under every PCID. A
//! freed kernel-half table or a changed non-global kernel leaf must
//! therefore be invalidated for every PCID, not just the current one
//! ([`kernel_flush_plan`]: INVPCID type 3 after the `INVLPG`s, or type 2 /
//! a CR4.PGE toggle).

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;

use crate::regs::Pcid;

/// The TLB maintenance a range flush performs.
///
/// The same shape as `pgtable_arm64::flush::FlushPlan`: a per-stride
/// variant ([`PerStride`](FlushPlan::PerStride), one `INVLPG` per stride)
/// with the same fields, the arch's full flushes, and
/// [`is_full`](Self::is_full).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlushPlan {
    /// `INVLPG` at `count` addresses: `start`, `start + (1 << stride_shift)`, ….
    PerStride {
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
        !matches!(self, FlushPlan::PerStride { .. })
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
        Some(count) if count <= ceiling => FlushPlan::PerStride {
            start: VirtAddr(range.start.0 & !((1u64 << range.stride_shift) - 1)),
            stride_shift: range.stride_shift,
            count,
        },
        _ => full_flush_plan(has_invpcid, global),
    }
}

/// One CPU's record of the PCIDs that owe a flush on it (Linux
/// `cpu_tlbstate`): 4096 bits, one per PCID. Keep one per CPU (a `static`
/// array indexed by CPU number, or per-CPU data) and hand the executing
/// CPU's to the flushes and switches. Only its own CPU touches it (its
/// flushes, its switches, and flush IPIs it handles), so `Relaxed` atomics
/// suffice: they only make interrupt handlers on the same CPU safe.
#[derive(Debug)]
pub struct PcidCpu {
    stale: [AtomicU64; 64],
}

impl Default for PcidCpu {
    fn default() -> Self {
        Self::new()
    }
}

impl PcidCpu {
    /// No PCID owes a flush.
    pub const fn new() -> PcidCpu {
        PcidCpu {
            stale: [const { AtomicU64::new(0) }; 64],
        }
    }

    /// `pcid` owes a flush on this CPU: its next switch flushes it.
    pub fn mark_stale(&self, pcid: Pcid) {
        let (w, b) = (pcid.0 as usize / 64, pcid.0 % 64);
        // Relaxed: per-CPU state (type docs).
        self.stale[w].fetch_or(1 << b, Relaxed);
    }

    /// Whether `pcid` owes a flush.
    pub fn is_stale(&self, pcid: Pcid) -> bool {
        let (w, b) = (pcid.0 as usize / 64, pcid.0 % 64);
        // Relaxed: per-CPU state (type docs).
        self.stale[w].load(Relaxed) & (1 << b) != 0
    }

    /// Whether `pcid` owed a flush, clearing the mark: call it when
    /// switching to `pcid`, and load CR3 without the no-flush bit if it
    /// says so ([`cr3_value`](crate::cr3_value)).
    pub fn take_stale(&self, pcid: Pcid) -> bool {
        let (w, b) = (pcid.0 as usize / 64, pcid.0 % 64);
        // Relaxed: per-CPU state (type docs).
        self.stale[w].fetch_and(!(1 << b), Relaxed) & (1 << b) != 0
    }

    /// Forgets every mark: after this CPU invalidated every PCID's entries
    /// (INVPCID type 2 or 3, a CR4.PGE toggle).
    pub fn clear(&self) {
        for w in &self.stale {
            // Relaxed: per-CPU state (type docs).
            w.store(0, Relaxed);
        }
    }
}

/// What is flushed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FlushKind {
    /// [`Mmu::flush_tlb_range`](pgtable_core::contract::Mmu::flush_tlb_range): the
    /// range's entries, global ones included.
    Range(TlbRange),
    /// [`Mmu::flush_tlb_mm`](pgtable_core::contract::Mmu::flush_tlb_mm): the address
    /// space's non-global entries.
    Mm,
    /// [`Mmu::flush_tlb_all`](pgtable_core::contract::Mmu::flush_tlb_all):
    /// everything.
    All,
}

/// The part of a flush for an address space whose PCID is not current on
/// this CPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OtherPcid {
    /// INVPCID type 0 (individual address) for `pcid` at `count`
    /// addresses from `start`, `1 << stride_shift` apart.
    InvpcidAddress {
        /// The address space's PCID.
        pcid: Pcid,
        /// First address.
        start: VirtAddr,
        /// log2 of the distance between two addresses.
        stride_shift: u32,
        /// Number of INVPCIDs.
        count: u64,
    },
    /// INVPCID type 1 (single context) for `pcid`.
    InvpcidSingleContext(Pcid),
    /// No INVPCID: [`PcidCpu::mark_stale`]; the next switch to `pcid`
    /// flushes it.
    Defer(Pcid),
    /// INVPCID type 3 (all contexts, retaining globals): the non-global
    /// TLB entries and the paging-structure-cache entries of every PCID,
    /// then [`PcidCpu::clear`]. For the kernel half ([`kernel_flush_plan`]).
    AllNonGlobal,
}

/// How a flush is carried out on this CPU: `local` for the current PCID
/// and global entries (a [`FlushPlan`]), then `other` for the address
/// space's PCID when it is not the current one.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PcidFlush {
    /// What runs for the current PCID and the global entries.
    pub local: Option<FlushPlan>,
    /// What the address space's own PCID needs, when it is not current.
    pub other: Option<OtherPcid>,
}

/// The flush of `kind` for the kernel's address space, whose upper half
/// every user space links: its translations may be cached under *every*
/// PCID, each user space's walks filling paging-structure-cache entries
/// (and, for non-global leaves, TLB entries) under its own. `INVLPG`
/// reaches the global entries of every PCID but the non-global and
/// paging-structure-cache entries of the current one only (Intel SDM Vol.
/// 3A §4.10.4.1), so with PCIDs on (`pcids`), a freed kernel-half table or
/// a changed non-global kernel leaf could stay cached under another PCID
/// and be used after a no-flush switch to it. Hence, with PCIDs:
///
/// - [`FlushKind::Range`] up to the ceiling: `INVLPG` per stride (the
///   range's global entries, everywhere), then
///   [`OtherPcid::AllNonGlobal`] (INVPCID type 3), which keeps the other
///   global entries; without INVPCID a CR4.PGE toggle instead, which drops
///   everything;
/// - [`FlushKind::Mm`]: [`OtherPcid::AllNonGlobal`] (or the toggle);
/// - past the ceiling and [`FlushKind::All`]: INVPCID type 2 or the
///   toggle, every PCID and global entry.
///
/// Without PCIDs there is one context and this is the untagged plan of
/// [`pcid_flush_plan`]. Linux reaches every PCID the same way for kernel
/// mappings that are not global (`flush_tlb_one_kernel` sets
/// `invalidate_other` under PTI) and with `flush_tlb_all` past the ceiling
/// of `flush_tlb_kernel_range`.
pub fn kernel_flush_plan(
    kind: FlushKind,
    ceiling: u64,
    has_invpcid: bool,
    pcids: bool,
) -> PcidFlush {
    let untagged = pcid_flush_plan(kind, None, Pcid::ZERO, ceiling, has_invpcid);
    if !pcids {
        return untagged;
    }
    let all = PcidFlush {
        local: Some(full_flush_plan(has_invpcid, true)),
        other: None,
    };
    match (kind, untagged.local) {
        _ if !has_invpcid => all,
        (FlushKind::Mm, _) => PcidFlush {
            local: None,
            other: Some(OtherPcid::AllNonGlobal),
        },
        (FlushKind::Range(_), Some(plan @ FlushPlan::PerStride { .. })) => PcidFlush {
            local: Some(plan),
            other: Some(OtherPcid::AllNonGlobal),
        },
        _ => all,
    }
}

/// The flush of `kind` for the address space tagged `space` (`None`:
/// untagged, or PCIDs off) on a CPU whose current PCID is `current`:
///
/// - the space is current (or untagged): the [`flush_plan`] /
///   [`full_flush_plan`] of today;
/// - [`FlushKind::All`]: INVPCID type 2 or a CR4.PGE toggle, which reach
///   every PCID;
/// - [`FlushKind::Mm`] of another PCID: INVPCID type 1 for it, or
///   [`OtherPcid::Defer`];
/// - [`FlushKind::Range`] of another PCID: `INVLPG` per stride for the
///   range's global entries (it also drops the current PCID's, harmlessly),
///   then INVPCID type 0 per stride for the space's PCID, or
///   [`OtherPcid::Defer`]; past `ceiling` strides one flush of every PCID
///   and global entry.
pub fn pcid_flush_plan(
    kind: FlushKind,
    space: Option<Pcid>,
    current: Pcid,
    ceiling: u64,
    has_invpcid: bool,
) -> PcidFlush {
    let other = space.filter(|&p| p != current);
    let local = |plan| PcidFlush {
        local: Some(plan),
        other: None,
    };
    match (kind, other) {
        (FlushKind::All, _) => local(full_flush_plan(has_invpcid, true)),
        (FlushKind::Range(r), None) => local(flush_plan(r, ceiling, has_invpcid, true)),
        (FlushKind::Mm, None) => local(full_flush_plan(has_invpcid, false)),
        (FlushKind::Mm, Some(p)) => PcidFlush {
            local: None,
            other: Some(if has_invpcid {
                OtherPcid::InvpcidSingleContext(p)
            } else {
                OtherPcid::Defer(p)
            }),
        },
        (FlushKind::Range(r), Some(p)) => match flush_plan(r, ceiling, has_invpcid, true) {
            plan @ FlushPlan::PerStride {
                start,
                stride_shift,
                count,
            } => PcidFlush {
                local: Some(plan),
                other: Some(if has_invpcid {
                    OtherPcid::InvpcidAddress {
                        pcid: p,
                        start,
                        stride_shift,
                        count,
                    }
                } else {
                    OtherPcid::Defer(p)
                }),
            },
            // Past the ceiling: a flush of everything, every PCID.
            full => local(full),
        },
    }
}
