//! The RISC-V MMU operations on the executing hart: [`LocalHart`] (the
//! fence and `satp` instructions), [`RiscvMmu`] (the [`HartMmu`] on it),
//! the ASIDLEN probe.
//!
//! Compiled only for `target_arch = "riscv64"` (and documented by
//! `cargo doc` on every host, as on docs.rs); host tests run the same
//! [`HartMmu`] on the simulated hart. The decisions (which fences for an
//! operation, see [`crate::hart`]) are host-tested; this module only
//! executes instructions.

use core::arch::asm;

use pgtable_core::VirtAddr;

use crate::hart::{Hart, HartMmu};
use crate::regs::{asid_bits_from_probe, Asid, SATP_ASID_MASK};

/// The executing hart's instructions.
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(docsrs, doc(cfg(target_arch = "riscv64")))]
pub struct LocalHart;

/// [`HartMmu`] on the executing hart (see [`crate::hart`] for which
/// fence each operation executes).
#[cfg_attr(docsrs, doc(cfg(target_arch = "riscv64")))]
pub type RiscvMmu = HartMmu<LocalHart>;

impl HartMmu<LocalHart> {
    /// An untagged handle for the format `RiscvPaging<L, E>` (its
    /// `satp.MODE`), without Svinval or Svvptc.
    pub const fn new<const L: u32, const E: u32>() -> RiscvMmu {
        HartMmu::on::<L, E>(LocalHart)
    }
}

fn rs2(asid: Option<Asid>) -> u64 {
    asid.map_or(0, |a| u64::from(a.get()))
}

// SAFETY: each method executes the instruction it names on this hart.
unsafe impl Hart for LocalHart {
    #[inline]
    fn sfence_vma(&self, va: Option<VirtAddr>, asid: Option<Asid>) {
        match (va, asid) {
            // SAFETY: invalidates translations only; no `nomem`, so the
            // compiler keeps the earlier PTE stores before the fence.
            (None, None) => unsafe { asm!("sfence.vma x0, x0", options(nostack)) },
            // SAFETY: as above.
            (None, Some(a)) => unsafe {
                asm!("sfence.vma x0, {0}", in(reg) u64::from(a.get()), options(nostack))
            },
            // SAFETY: as above.
            (Some(v), None) => unsafe { asm!("sfence.vma {0}, x0", in(reg) v.0, options(nostack)) },
            // SAFETY: as above.
            (Some(v), Some(a)) => unsafe {
                asm!("sfence.vma {0}, {1}", in(reg) v.0, in(reg) u64::from(a.get()),
                    options(nostack))
            },
        }
    }

    #[inline]
    fn sfence_w_inval(&self) {
        // SAFETY: `HartMmu::with_svinval`'s caller guarantees Svinval.
        // SFENCE.W.INVAL orders the earlier PTE stores before the
        // SINVAL.VMAs; no `nomem`, so the compiler keeps the stores
        // before it too.
        unsafe { asm!(".4byte 0x18000073", options(nostack)) };
    }

    #[inline]
    fn sinval_vma(&self, va: Option<VirtAddr>, asid: Option<Asid>) {
        let rs1 = va.map_or(0, |v| v.0);
        // SAFETY: SINVAL.VMA rs1, rs2 (funct7 0b0001011) invalidates
        // translations only; a zero register operand is `x0`'s meaning.
        unsafe {
            asm!(".insn r 0x73, 0, 0x0b, x0, {0}, {1}", in(reg) rs1, in(reg) rs2(asid),
                options(nostack))
        };
    }

    #[inline]
    fn sfence_inval_ir(&self) {
        // SAFETY: SFENCE.INVAL.IR orders the invalidations before later
        // implicit references.
        unsafe { asm!(".4byte 0x18100073", options(nostack)) };
    }

    #[inline]
    fn fence_w_w(&self) {
        // SAFETY: an ordering fence only.
        unsafe { asm!("fence w, w", options(nostack)) };
    }

    #[inline]
    unsafe fn write_satp(&self, value: u64) {
        // SAFETY: the caller guarantees `value` selects tables that map
        // what the hart uses next; no `nomem`, so the table stores are
        // emitted before the write.
        unsafe { asm!("csrw satp, {0}", in(reg) value, options(nostack)) };
    }
}

/// The hart's ASIDLEN (0..=16), probed as the privileged spec describes:
/// write ones to every bit of `satp.ASID`, read back which stuck
/// ([`asid_bits_from_probe`]), then restore `satp` and fence (the probe
/// ran briefly with another ASID).
///
/// # Safety
///
/// Runs in S-mode with translation on (`satp.MODE` is not Bare, whose
/// other fields must be zero) and the current `satp` translating the
/// running code through global mappings or with no other ASID in use yet
/// (at boot), so the moment with the probe's ASID translates the same way.
pub unsafe fn probe_asid_bits() -> u32 {
    let probed: u64;
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
            ones = in(reg) SATP_ASID_MASK,
            options(nostack),
        )
    };
    asid_bits_from_probe(probed)
}
