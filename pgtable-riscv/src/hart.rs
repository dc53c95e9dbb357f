//! The fence instructions of one hart as a trait ([`Hart`]), and the
//! [`Mmu`] built on them ([`HartMmu`]): which fence each operation of the
//! contract executes is decided here, host-testable, while a [`Hart`]
//! only executes instructions. On bare metal `RiscvMmu` is
//! `HartMmu<LocalHart>`; on the host a test runs the same `HartMmu` on
//! pgtable-core's simulated hart (feature `sim`, `SimMachine::hart`).
//!
//! # Ordering (privileged spec, "Supervisor Memory-Management Fence
//! Instruction")
//!
//! The hart's implicit reads of the page tables (the walker) are not
//! ordered with its own explicit stores to them: `SFENCE.VMA`
//! "guarantees that any previous stores already visible to the current
//! RISC-V hart are ordered before certain implicit references by
//! subsequent instructions in that hart to the memory-management data
//! structures". So:
//!
//! - the walker barrier ([`Mmu::walker_barrier`]) is `SFENCE.VMA x0, x0`
//!   (every level, every address space): a PTE store is guaranteed visible
//!   to this hart's walker only after it, even one that makes an invalid
//!   entry valid (a hart may cache invalid entries), unless the hart has
//!   Svvptc ("Obviating Memory-Management Instructions after Marking PTEs
//!   Valid"): then such a store becomes visible in bounded time, and
//!   [`HartMmu::with_svvptc`] makes the walker barrier a `FENCE W, W` (a
//!   walk that still sees the old entry faults and the fault handler's
//!   retry finds the new one); changes of valid entries are followed by a
//!   flush, which is an `SFENCE.VMA` anyway.
//! - the publish barrier ([`Mmu::publish_barrier`], before linking a new
//!   table) is `FENCE W, W` (Linux `smp_wmb()`).
//! - a flush is the [`FlushPlan`] of [`flush_plan`]: one `SFENCE.VMA` per
//!   stride, the Svinval sequence, or one full fence; each orders the
//!   preceding PTE stores before its invalidation.
//!
//! Every fence acts on the executing hart only. Other harts need an
//! `SFENCE.VMA` of their own: [`crate::shootdown::SmpMmu`] adds the SBI
//! remote fences; on its own a [`HartMmu`] meets the [`Mmu`] contract only
//! for an address space live on one hart.

use pgtable_core::contract::{Arch, Mmu, Slot, TlbRange};
use pgtable_core::{PhysAddr, VirtAddr};

use crate::flush::{flush_plan, full_flush_plan, FlushCaps, FlushPlan};
use crate::regs::{satp_value, Asid};

/// The fence and `satp` instructions of the executing hart.
///
/// `None` for an operand is `x0`.
///
/// # Safety
///
/// Each method has the effect of the instruction it names on the hart
/// that calls it (or, for a simulator, on the simulated hart it stands
/// for): [`HartMmu`]'s [`Mmu`] implementation relies on it.
pub unsafe trait Hart {
    /// Whether [`entry_written`](Hart::entry_written) wants every entry
    /// write (a simulator does; a real hart does not).
    const OBSERVES_WRITES: bool = false;

    /// `SFENCE.VMA rs1, rs2`.
    fn sfence_vma(&self, va: Option<VirtAddr>, asid: Option<Asid>);

    /// `SFENCE.W.INVAL` (Svinval).
    fn sfence_w_inval(&self);

    /// `SINVAL.VMA rs1, rs2` (Svinval).
    fn sinval_vma(&self, va: Option<VirtAddr>, asid: Option<Asid>);

    /// `SFENCE.INVAL.IR` (Svinval).
    fn sfence_inval_ir(&self);

    /// `FENCE W, W`.
    fn fence_w_w(&self);

    /// `csrw satp, value`.
    ///
    /// # Safety
    ///
    /// `value` selects tables that map what the hart uses next.
    unsafe fn write_satp(&self, value: u64);

    /// The algorithms wrote `slot`, which held `old` (for simulators).
    fn entry_written(&self, _slot: &Slot, _old: u64) {}
}

impl FlushPlan {
    /// Executes the plan on `hart` (the instructions the variants name,
    /// in order).
    pub fn run<H: Hart>(self, hart: &H) {
        match self {
            FlushPlan::PerStride {
                start,
                stride_shift,
                count,
                asid,
            } => {
                for i in 0..count {
                    let va = start.0.wrapping_add(i << stride_shift);
                    hart.sfence_vma(Some(VirtAddr(va)), asid);
                }
            }
            FlushPlan::Svinval {
                start,
                stride_shift,
                count,
                asid,
            } => {
                // The earlier PTE stores before the invalidations, the
                // invalidations before later implicit references.
                hart.sfence_w_inval();
                for i in 0..count {
                    let va = start.0.wrapping_add(i << stride_shift);
                    hart.sinval_vma(Some(VirtAddr(va)), asid);
                }
                hart.sfence_inval_ir();
            }
            FlushPlan::Asid(a) => hart.sfence_vma(None, Some(a)),
            FlushPlan::All => hart.sfence_vma(None, None),
        }
    }
}

/// [`Mmu`] for one RISC-V hart `H`, optionally tagged with an ASID.
///
/// Untagged (ASID 0 for every root), [`install_root`](Mmu::install_root)
/// writes `satp` and flushes everything; tagged
/// ([`with_asid`](HartMmu::with_asid)), it writes `satp` with the ASID and
/// no fence, and every flush names the ASID (global mappings excepted,
/// which range flushes of an untagged handle reach with `x0`).
#[derive(Clone, Copy, Debug)]
pub struct HartMmu<H> {
    hart: H,
    mode: u64,
    caps: FlushCaps,
    svvptc: bool,
    ceiling: u64,
}

impl<H> HartMmu<H> {
    /// An untagged handle for the format `RiscvPaging<L, E>` (its
    /// `satp.MODE`) on `hart`, without Svinval or Svvptc.
    pub const fn on<const L: u32, const E: u32>(hart: H) -> HartMmu<H> {
        HartMmu {
            hart,
            mode: crate::RiscvPaging::<L, E>::SATP_MODE,
            caps: FlushCaps {
                asid: None,
                svinval: false,
            },
            svvptc: false,
            ceiling: <crate::Sv39 as Arch>::TLB_FLUSH_CEILING,
        }
    }

    /// The same handle tagged with `asid` (checked against the hart's
    /// ASIDLEN by [`Asid::new`]).
    ///
    /// For address spaces without global leaves (user spaces): a fence
    /// with an ASID skips global mappings, so its range flushes name the
    /// ASID. An address space with global leaves (the kernel's) uses an
    /// untagged handle, whose fences use `x0`.
    pub const fn with_asid(mut self, asid: Asid) -> HartMmu<H> {
        self.caps.asid = Some(asid);
        self
    }

    /// The same handle using the Svinval sequence for range flushes.
    ///
    /// # Safety
    ///
    /// Every hart that runs this handle's flushes implements Svinval
    /// (otherwise `SINVAL.VMA` is an illegal instruction).
    pub const unsafe fn with_svinval(mut self) -> HartMmu<H> {
        self.caps.svinval = true;
        self
    }

    /// The same handle with the walker barrier reduced to `FENCE W, W`
    /// (see the module docs).
    ///
    /// # Safety
    ///
    /// Every hart that walks these tables implements Svvptc, and the
    /// kernel retries a page fault on an entry that is valid (the walk saw
    /// it before the store became visible).
    pub const unsafe fn with_svvptc(mut self) -> HartMmu<H> {
        self.svvptc = true;
        self
    }

    /// The ASID, for a tagged handle.
    pub const fn asid(&self) -> Option<Asid> {
        self.caps.asid
    }

    /// The hart.
    pub const fn hart(&self) -> &H {
        &self.hart
    }

    /// The fences a range flush of `range` executes.
    pub fn plan(&self, range: TlbRange) -> FlushPlan {
        // The range may hold global entries: per-stride fences use `x0`
        // for the ASID unless the handle is tagged; tagged spaces hold
        // user mappings, which are never global.
        flush_plan(range, self.ceiling, self.caps, self.caps.asid.is_none())
    }
}

impl<H: Hart> HartMmu<H> {
    /// Executes `plan` on the hart.
    pub fn execute(&self, plan: FlushPlan) {
        plan.run(&self.hart);
    }
}

// SAFETY: the walker barrier is `SFENCE.VMA x0, x0` (or, with Svvptc, the
// bounded-time visibility the extension promises); flushes are
// `SFENCE.VMA`s or the Svinval sequence (`Hart`'s contract: they have the
// instructions' effect), which order the earlier PTE stores and complete
// before the next instruction's implicit references; `flush_tlb_all` uses
// `x0, x0` (globals included) and range flushes reach global entries with
// `x0` unless the handle is tagged (whose spaces hold no global leaves).
// They reach the executing hart only, which meets the contract for an
// address space live on one hart (module docs).
unsafe impl<H: Hart> Mmu for HartMmu<H> {
    const OBSERVES_WRITES: bool = H::OBSERVES_WRITES;

    #[inline]
    fn walker_barrier(&self) {
        if self.svvptc {
            self.hart.fence_w_w();
        } else {
            self.hart.sfence_vma(None, None);
        }
    }

    /// `FENCE W, W` (Linux riscv `smp_wmb()`; see the module docs).
    #[inline]
    fn publish_barrier(&self) {
        self.hart.fence_w_w();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.execute(self.plan(range));
    }

    fn flush_tlb_all(&self) {
        self.hart.sfence_vma(None, None);
    }

    fn flush_tlb_mm(&self) {
        self.execute(full_flush_plan(self.caps.asid, false));
    }

    /// Writes `satp` (MODE, ASID, root PPN). Untagged, then `SFENCE.VMA
    /// x0, x0`, since every untagged root shares ASID 0 (a write of `satp`
    /// does not itself invalidate anything); tagged, no fence: the ASID's
    /// entries are this address space's.
    unsafe fn install_root(&self, root: PhysAddr) {
        let asid = self.caps.asid.unwrap_or(Asid::ZERO);
        let satp = satp_value(self.mode, asid, root.0);
        // SAFETY: the caller guarantees `root` is a complete hierarchy of
        // this format mapping what the hart uses next.
        unsafe { self.hart.write_satp(satp) };
        if self.caps.asid.is_none() {
            self.hart.sfence_vma(None, None);
        }
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.hart.entry_written(slot, old);
    }
}
