//! SMP: flushes that reach every hart an address space may be live on,
//! through the SBI RFENCE extension (SBI specification, chapter "RFENCE
//! Extension": `sbi_remote_sfence_vma`, `sbi_remote_sfence_vma_asid`).
//!
//! `SFENCE.VMA` acts on the executing hart only (privileged spec,
//! "Supervisor Memory-Management Fence Instruction"); another hart drops
//! a translation only by executing a fence itself. The SBI implementation
//! (OpenSBI) makes the target harts execute it and returns once all of
//! them have. This module is the same contract as pgtable-x86's IPI
//! rounds, with the SBI call behind a seam so the logic runs on the host:
//!
//! - [`RemoteFence`]: what the kernel implements, with its SBI ecall (or
//!   a test, with a fake that fences simulated harts);
//! - [`MmHarts`]: where an address space may be live (Linux
//!   `mm_cpumask`), as windows of [`HartMask`]s the way the SBI calls
//!   take them (`hart_mask`, `hart_mask_base`), for any hart ID;
//! - [`SmpMmu`]: the [`Mmu`](pgtable_core::contract::Mmu) of such a space,
//!   a [`HartMmu`](crate::HartMmu) for the executing hart plus the remote
//!   fences to the others.
//!
//! # Example (host: a fake fence that records the calls)
//!
//! ```
//! use core::cell::RefCell;
//! use pgtable_riscv::shootdown::{HartMask, MmHarts, RemoteFence};
//! use pgtable_riscv::Asid;
//!
//! struct Recorder(RefCell<Vec<HartMask>>);
//! // SAFETY: a recorder for the example; nothing runs on its "harts".
//! unsafe impl RemoteFence for Recorder {
//!     fn this_hart(&self) -> usize { 0 }
//!     fn remote_sfence_vma(&self, harts: HartMask, _start: u64, _size: u64, _asid: Option<Asid>) {
//!         self.0.borrow_mut().push(harts);
//!     }
//! }
//!
//! let mm = MmHarts::<4>::new();
//! for hart in [0, 1, 70, 255] {
//!     mm.add(hart);
//! }
//! let windows: Vec<HartMask> = mm.targets(0).collect();
//! // Hart 1 in the first window; 70 and 255 in their own.
//! assert_eq!(windows, [
//!     HartMask { mask: 1 << 1, base: 0 },
//!     HartMask { mask: 1 << 6, base: 64 },
//!     HartMask { mask: 1 << 63, base: 192 },
//! ]);
//! ```

mod harts;
mod smp_mmu;

pub use harts::{HartMask, MmHarts, Targets};
pub use smp_mmu::SmpMmu;

use crate::regs::Asid;

/// The remote half of a flush: the SBI RFENCE calls of the kernel.
///
/// # Safety
///
/// [`remote_sfence_vma`](RemoteFence::remote_sfence_vma) returns only
/// once every hart of `harts` executed the fences it names (`SFENCE.VMA`
/// for each page of `[start, start + size)`, or for everything when
/// `size` is `u64::MAX`; with the ASID operand when `asid` is `Some`), as
/// OpenSBI's RFENCE does. When that cannot be done (the SBI call
/// failed), it must not return at all (halt, shut down): the
/// [`Mmu`](pgtable_core::contract::Mmu) contract has no error path, and
/// returning would leave translations live that the caller is about to
/// reuse. [`this_hart`](RemoteFence::this_hart) is the executing hart's
/// ID.
pub unsafe trait RemoteFence {
    /// The executing hart's ID (the `hartid` the SBI calls use).
    fn this_hart(&self) -> usize;

    /// `sbi_remote_sfence_vma(hart_mask, hart_mask_base, start, size)`,
    /// or `sbi_remote_sfence_vma_asid(…, asid)` with an ASID, to the
    /// harts of `harts`.
    fn remote_sfence_vma(&self, harts: HartMask, start: u64, size: u64, asid: Option<Asid>);
}
