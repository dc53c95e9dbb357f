//! The RISC-V MMU operations on one hart: fences, `satp`, the ASIDLEN
//! probe.
//!
//! Compiled only for `target_arch = "riscv64"`; host tests use the
//! simulator with the same format. The decisions (which fences for a
//! range) are the pure functions of [`crate::flush`], so the host tests
//! cover them; this module only executes them.
//!
//! # Ordering (privileged spec, "Supervisor Memory-Management Fence
//! Instruction")
//!
//! The hart's implicit reads of the page tables (the walker) are not
//! ordered with its own explicit stores to them: "SFENCE.VMA is used to
//! synchronize updates to in-memory memory-management data structures with
//! current execution"; it "guarantees that any previous stores already
//! visible to the current RISC-V hart are ordered before certain implicit
//! references by subsequent instructions in that hart to the
//! memory-management data structures". So:
//!
//! - the walker barrier ([`Mmu::walker_barrier`]) is `SFENCE.VMA x0, x0`
//!   (every level, every address space): a PTE store is guaranteed visible
//!   to this hart's walker only after it. This holds even for a store that
//!   makes an invalid entry valid, since an implementation may cache
//!   invalid entries or read the table early ("a fence is required" after
//!   such a store unless the hart has Svvptc). With Svvptc ("Obviating
//!   Memory-Management Instructions after Marking PTEs Valid") a store that
//!   sets V becomes visible to the walker in bounded time without a fence,
//!   so [`RiscvMmu::with_svvptc`] makes the walker barrier a `FENCE W, W`
//!   (a walk that still sees the old entry faults, and the fault handler's
//!   retry finds the new one); changes of valid entries are followed by a
//!   flush, which is an `SFENCE.VMA` anyway.
//! - the publish barrier ([`Mmu::publish_barrier`], before linking a new
//!   table) is `FENCE W, W` (Linux `smp_wmb()`): under RVWMO the table's
//!   zeroing and entries become visible before the link to every hart, so
//!   a walker that reads the link after its fence reads the contents too.
//! - a flush is one `SFENCE.VMA` per stride (or the Svinval sequence, or
//!   one full fence), which also orders the preceding PTE stores before the
//!   invalidation, so no refill of the old entry follows it.
//!
//! Every fence here acts on the executing hart only. Other harts need an
//! `SFENCE.VMA` of their own (SBI RFENCE `sbi_remote_sfence_vma_asid`);
//! until an SMP shootdown exists in this crate, [`RiscvMmu`] meets the
//! [`Mmu`] contract only for an address space live on one hart.

use core::arch::asm;

use pgtable_core::contract::{Arch, Mmu, TlbRange};
use pgtable_core::PhysAddr;

use crate::flush::{
    flush_plan, full_flush_plan, satp_value, Asid, FlushCaps, FlushPlan, SATP_ASID_SHIFT,
};

/// [`Mmu`] for one RISC-V hart, optionally tagged with an ASID.
///
/// Untagged (ASID 0 for every root), [`install_root`](Mmu::install_root)
/// writes `satp` and flushes the non-global entries; tagged
/// ([`with_asid`](RiscvMmu::with_asid)), it writes `satp` with the ASID and
/// no fence, and every flush names the ASID (global mappings excepted,
/// which range flushes reach with `x0`).
#[derive(Clone, Copy, Debug)]
#[cfg_attr(docsrs, doc(cfg(target_arch = "riscv64")))]
pub struct RiscvMmu {
    mode: u64,
    caps: FlushCaps,
    svvptc: bool,
    ceiling: u64,
}

impl RiscvMmu {
    /// An untagged handle for the format `F` (its `satp.MODE`), without
    /// Svinval or Svvptc.
    pub const fn new<const L: u32, const E: u32>() -> RiscvMmu {
        RiscvMmu {
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
    /// ASIDLEN by [`Asid::new`]; see [`probe_asid_bits`]).
    ///
    /// For address spaces without global leaves (user spaces): a fence
    /// with an ASID skips global mappings, so its range flushes name the
    /// ASID. An address space with global leaves (the kernel's) uses an
    /// untagged handle, whose fences use `x0`.
    pub const fn with_asid(mut self, asid: Asid) -> RiscvMmu {
        self.caps.asid = Some(asid);
        self
    }

    /// The same handle using the Svinval sequence for range flushes.
    ///
    /// # Safety
    ///
    /// Every hart that runs this handle's flushes implements Svinval
    /// (otherwise `SINVAL.VMA` is an illegal instruction).
    pub const unsafe fn with_svinval(mut self) -> RiscvMmu {
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
    pub const unsafe fn with_svvptc(mut self) -> RiscvMmu {
        self.svvptc = true;
        self
    }

    /// The ASID, for a tagged handle.
    pub const fn asid(&self) -> Option<Asid> {
        self.caps.asid
    }

    /// The fences a range flush of `range` executes.
    pub fn plan(&self, range: TlbRange) -> FlushPlan {
        // The range may hold global entries: per-stride fences use `x0`
        // for the ASID unless the handle is tagged; tagged spaces hold
        // user mappings, which are never global.
        flush_plan(range, self.ceiling, self.caps, self.caps.asid.is_none())
    }

    /// Executes `plan` on this hart.
    pub fn execute(&self, plan: FlushPlan) {
        match plan {
            FlushPlan::PerStride {
                start,
                stride_shift,
                count,
                asid,
            } => {
                let rs2 = asid.map_or(0, |a| u64::from(a.get()));
                for i in 0..count {
                    let va = start.0.wrapping_add(i << stride_shift);
                    sfence_vma(va, rs2, asid.is_some());
                }
            }
            FlushPlan::Svinval {
                start,
                stride_shift,
                count,
                asid,
            } => {
                let rs2 = asid.map_or(0, |a| u64::from(a.get()));
                // SAFETY: the hart has Svinval (`with_svinval`).
                // SFENCE.W.INVAL orders the earlier PTE stores before the
                // SINVAL.VMAs; no `nomem`, so the compiler keeps the stores
                // before it too.
                unsafe { asm!(".4byte 0x18000073", options(nostack)) };
                for i in 0..count {
                    let va = start.0.wrapping_add(i << stride_shift);
                    // SAFETY: SINVAL.VMA rs1, rs2 (funct7 0b0001011)
                    // invalidates translations only.
                    unsafe {
                        asm!(".insn r 0x73, 0, 0x0b, x0, {0}, {1}", in(reg) va, in(reg) rs2,
                            options(nostack))
                    };
                }
                // SAFETY: SFENCE.INVAL.IR orders the invalidations before
                // later implicit references.
                unsafe { asm!(".4byte 0x18100073", options(nostack)) };
            }
            FlushPlan::Asid(a) => {
                // SAFETY: invalidates translations only; no `nomem`, so
                // the compiler keeps earlier PTE stores before it.
                unsafe { asm!("sfence.vma x0, {0}", in(reg) u64::from(a.get()), options(nostack)) };
            }
            FlushPlan::All => sfence_all(),
        }
    }
}

/// `SFENCE.VMA va, rs2` (`rs2` is the ASID when `tagged`, else `x0`).
#[inline]
fn sfence_vma(va: u64, rs2: u64, tagged: bool) {
    if tagged {
        // SAFETY: invalidates translations only; no `nomem`, so the
        // compiler keeps the earlier PTE stores before the fence.
        unsafe { asm!("sfence.vma {0}, {1}", in(reg) va, in(reg) rs2, options(nostack)) };
    } else {
        // SAFETY: as above.
        unsafe { asm!("sfence.vma {0}, x0", in(reg) va, options(nostack)) };
    }
}

/// `SFENCE.VMA x0, x0`: every level, every address space, globals
/// included.
#[inline]
fn sfence_all() {
    // SAFETY: invalidates translations only; no `nomem` (see above).
    unsafe { asm!("sfence.vma x0, x0", options(nostack)) };
}

/// The hart's ASIDLEN (0..=16), probed as the privileged spec describes:
/// write ones to every bit of `satp.ASID`, read back which stuck, then
/// restore `satp` and fence (the probe ran briefly with another ASID).
///
/// # Safety
///
/// Runs in S-mode with translation on (`satp.MODE` is not Bare, whose
/// other fields must be zero) and the current `satp` translating the
/// running code through global mappings or with no other ASID in use yet
/// (at boot), so the moment with the probe's ASID translates the same way.
pub unsafe fn probe_asid_bits() -> u32 {
    let probed: u64;
    let ones = 0xffffu64 << SATP_ASID_SHIFT;
    // SAFETY: the caller guarantees the same tables translate the code
    // under the probe's ASID; `satp` is restored before the fence.
    unsafe {
        asm!(
            "csrr {old}, satp",
            "or {tmp}, {old}, {ones}",
            "csrw satp, {tmp}",
            "csrr {tmp}, satp",
            "csrw satp, {old}",
            "sfence.vma x0, x0",
            old = out(reg) _,
            tmp = out(reg) probed,
            ones = in(reg) ones,
            options(nostack),
        )
    };
    ((probed & ones) >> SATP_ASID_SHIFT).count_ones()
}

// SAFETY: the walker barrier is `SFENCE.VMA x0, x0` (or, with Svvptc, the
// bounded-time visibility the extension promises); flushes are
// `SFENCE.VMA`s or the Svinval sequence, which order the earlier PTE
// stores and complete before the next instruction's implicit references;
// `flush_tlb_all` uses `x0, x0` (globals included) and range flushes reach
// global entries with `x0` unless the handle is tagged (whose spaces hold
// no global leaves). They reach the executing hart only, which meets the
// contract for an address space live on one hart (type docs).
unsafe impl Mmu for RiscvMmu {
    #[inline]
    fn walker_barrier(&self) {
        if self.svvptc {
            // SAFETY: an ordering fence only.
            unsafe { asm!("fence w, w", options(nostack)) };
        } else {
            sfence_all();
        }
    }

    /// `FENCE W, W` (Linux riscv `smp_wmb()`; see the module docs).
    #[inline]
    fn publish_barrier(&self) {
        // SAFETY: an ordering fence only.
        unsafe { asm!("fence w, w", options(nostack)) };
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.execute(self.plan(range));
    }

    fn flush_tlb_all(&self) {
        sfence_all();
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
        // this format mapping what the hart uses next; the write has no
        // `nomem`, so the table stores are emitted before it.
        unsafe { asm!("csrw satp, {0}", in(reg) satp, options(nostack)) };
        if self.caps.asid.is_none() {
            sfence_all();
        }
    }
}
