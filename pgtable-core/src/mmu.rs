//! The side-effecting half of an architecture: barriers, TLB maintenance,
//! installing a root.
//!
//! Arch crates implement [`Mmu`] with real instructions, compiled only for
//! their target; the simulator implements it in software; [`NoopMmu`] does
//! nothing (for benchmarks of the algorithms alone and for tables that are
//! not live).
//!
//! # Rules for implementations
//!
//! - [`walker_barrier`](Mmu::walker_barrier) returns only once every entry
//!   written before it is visible to the hardware walker of every CPU that
//!   shares the tables (arm64 `dsb ishst; isb`; a no-op where stores are
//!   seen by the walker in program order, as on x86).
//! - A flush returns only once no CPU can use a translation for the range
//!   that was cached before the flush began, and it must itself order the
//!   entry writes that precede it (arm64 issues `dsb ishst` before `tlbi`).

use crate::level::{shift, size};
use crate::{PhysAddr, Slot, VirtAddr};

/// A range of virtual addresses to invalidate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TlbRange {
    /// First address.
    pub start: VirtAddr,
    /// One past the last address (0 means the top of the address space).
    pub end: VirtAddr,
    /// log2 of the smallest mapping size that changed (the stride to step by).
    pub stride_shift: u32,
    /// Only leaf entries changed: walk caches of intermediate tables may be
    /// kept (arm64 `tlbi vale1is` rather than `vae1is`).
    pub last_level: bool,
}

impl TlbRange {
    /// The range of the one leaf at `height` that maps `va`.
    #[inline]
    pub(crate) fn leaf(va: VirtAddr, height: u32) -> TlbRange {
        let start = va.align_down(size(height));
        TlbRange {
            start,
            end: start.add(size(height)),
            stride_shift: shift(height),
            last_level: true,
        }
    }

    /// Number of strides in the range.
    #[inline]
    pub fn strides(&self) -> u64 {
        self.end.0.wrapping_sub(self.start.0) >> self.stride_shift
    }
}

/// The machine operations the algorithms need.
pub trait Mmu {
    /// Whether this MMU wants to observe every entry write through
    /// [`entry_written`](Mmu::entry_written) (the simulator does; hardware
    /// does not, and the hook then costs nothing).
    const OBSERVES_WRITES: bool = false;

    /// Makes earlier table writes visible to the hardware walker.
    fn walker_barrier(&self);

    /// Invalidates cached translations for `range` on every CPU.
    fn flush_tlb_range(&self, range: TlbRange);

    /// Invalidates every cached translation of this address space.
    fn flush_tlb_all(&self);

    /// Installs `root` as the active translation table.
    ///
    /// # Safety
    ///
    /// `root` must be a complete table hierarchy of the format this MMU is
    /// configured for, mapping at least the code, stack and data the CPU
    /// uses next, and must stay alive while installed.
    unsafe fn install_root(&self, root: PhysAddr);

    /// Called after `slot` changed from `old` (only when
    /// [`OBSERVES_WRITES`](Mmu::OBSERVES_WRITES) is true).
    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        let _ = (slot, old);
    }
}

/// An MMU that does nothing: for tables that are not live and for measuring
/// the algorithms alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopMmu;

impl Mmu for NoopMmu {
    #[inline]
    fn walker_barrier(&self) {}
    #[inline]
    fn flush_tlb_range(&self, _range: TlbRange) {}
    #[inline]
    fn flush_tlb_all(&self) {}
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

impl<M: Mmu> Mmu for &M {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;
    #[inline]
    fn walker_barrier(&self) {
        (**self).walker_barrier()
    }
    #[inline]
    fn flush_tlb_range(&self, range: TlbRange) {
        (**self).flush_tlb_range(range)
    }
    #[inline]
    fn flush_tlb_all(&self) {
        (**self).flush_tlb_all()
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { (**self).install_root(root) }
    }
    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        (**self).entry_written(slot, old)
    }
}
