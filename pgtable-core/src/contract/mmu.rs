//! The side-effecting half of an architecture: barriers, TLB maintenance,
//! installing a root.
//!
//! Arch crates implement [`Mmu`] with real instructions, compiled only for
//! their target; the simulator implements it in software; [`NoopMmu`] does
//! nothing (for benchmarks of the algorithms alone and for tables that are
//! not live).
//!
//! The rules an implementation must follow are in the [`Mmu`] docs.

use crate::contract::level::{shift, size};
use crate::{PhysAddr, Slot, VaRange, VirtAddr};

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
    pub(crate) fn leaf<F: crate::Format>(va: VirtAddr, height: u32) -> TlbRange {
        let start = va.align_down(size::<F>(height));
        TlbRange {
            start,
            end: start.add(size::<F>(height)),
            stride_shift: shift::<F>(height),
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
///
/// # Safety
///
/// [`Mmu`] is an `unsafe trait`: the algorithms free table frames and hand
/// physical pages back to their owner as soon as a flush returns, so a
/// flush that does less than promised is a use-after-free in the kernel,
/// not a wrong answer. An implementation promises:
///
/// - [`walker_barrier`](Mmu::walker_barrier) returns only once every entry
///   written before it is visible to the hardware walker of every CPU that
///   shares the tables (arm64 `dsb ishst; isb`; a no-op where stores are
///   seen by the walker in program order, as on x86).
/// - **Shootdown.** A flush returns only once *no CPU* on which the address
///   space may be live can use a translation for the flushed range that was
///   cached before the flush began: broadcast invalidation (arm64 `tlbi
///   …is` followed by `dsb ish`), or a local flush plus an IPI to every
///   other such CPU and a wait for its acknowledgement (x86 without
///   INVLPGB; Linux `flush_tlb_mm_range`). A flush of the executing CPU
///   only is correct only on a machine with one CPU.
/// - A flush must itself order the entry writes that precede it (arm64
///   issues `dsb ishst` before `tlbi`), so no CPU refills the old entry
///   after the invalidation.
/// - A range flush drops global and non-global translations alike for the
///   range (x86 `invlpg`; arm64 `tlbi vae1is` matches global entries
///   whatever the ASID operand). [`flush_tlb_mm`](Mmu::flush_tlb_mm) may
///   keep global translations; [`flush_tlb_all`](Mmu::flush_tlb_all) may
///   not.
/// - [`entry_written`](Mmu::entry_written) receives live entries and must
///   never write them.
pub unsafe trait Mmu {
    /// Whether this MMU wants to observe every entry write through
    /// [`entry_written`](Mmu::entry_written) (the simulator does; hardware
    /// does not, and the hook then costs nothing).
    const OBSERVES_WRITES: bool = false;

    /// Makes earlier table writes visible to the hardware walker.
    fn walker_barrier(&self);

    /// Orders every earlier write to a new table (its zeroing and its
    /// entries) before the store that links it, for every walker: Linux's
    /// `smp_wmb()` before `pmd_populate` (arm64 `dmb ishst`; on x86, whose
    /// walkers see stores in program order, only the compiler must not
    /// reorder). The populate operations ([`Arch::pmd_populate`], …) call
    /// it. The default is a release fence, which is all of that on both
    /// (on arm64 it is `dmb ish`).
    ///
    /// [`Arch::pmd_populate`]: crate::Arch::pmd_populate
    #[inline]
    fn publish_barrier(&self) {
        // Release: orders the table's writes before the linking store.
        core::sync::atomic::fence(core::sync::atomic::Ordering::Release);
    }

    /// Invalidates cached translations for `range` on every CPU.
    fn flush_tlb_range(&self, range: TlbRange);

    /// Invalidates every cached translation on every CPU, global ones
    /// included (Linux `flush_tlb_all`: arm64 `tlbi vmalle1is`; x86
    /// INVPCID type 2 or a CR4.PGE toggle).
    fn flush_tlb_all(&self);

    /// Invalidates this address space's cached translations (Linux
    /// `flush_tlb_mm`: arm64 `tlbi aside1is` for its ASID; x86 MOV to CR3
    /// or INVPCID type 1 for its PCID). It may keep global translations:
    /// the algorithms call [`flush_tlb_all`](Mmu::flush_tlb_all) instead
    /// when global leaves changed. The default is `flush_tlb_all`, which
    /// is always enough.
    #[inline]
    fn flush_tlb_mm(&self) {
        self.flush_tlb_all()
    }

    /// Installs `root` as the active translation table.
    ///
    /// # Safety
    ///
    /// `root` must be a complete table hierarchy of the format this MMU is
    /// configured for, mapping at least the code, stack and data the CPU
    /// uses next, and must stay alive while installed.
    unsafe fn install_root(&self, root: PhysAddr);

    /// The half of the virtual address space whose root register
    /// [`install_root`](Mmu::install_root) writes, on an architecture with
    /// a root per half ([`Format::SEPARATE_HALVES`]: arm64 TTBR0_EL1 for
    /// [`VaRange::Lower`], TTBR1_EL1 for [`VaRange::Upper`], both for
    /// [`VaRange::Both`]); `None` where one root register serves every
    /// address (x86 CR3, RISC-V `satp`) or the MMU does not say.
    ///
    /// [`AddressSpace::new_in`](crate::AddressSpace::new_in) (and so
    /// `new_kernel` and `new_user`) refuses an MMU whose half is not the
    /// space's ([`Error::MmuHalf`](crate::Error::MmuHalf)), so a kernel
    /// space whose root would land in TTBR0_EL1 fails when it is made,
    /// not at its first access. The default is `None`: an MMU that wraps
    /// another forwards it.
    ///
    /// [`Format::SEPARATE_HALVES`]: crate::Format::SEPARATE_HALVES
    #[inline]
    fn installs_into(&self) -> Option<VaRange> {
        None
    }

    /// Called after `slot` changed from `old` (only when
    /// [`OBSERVES_WRITES`](Mmu::OBSERVES_WRITES) is true).
    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        let _ = (slot, old);
    }
}

/// An MMU handle whose address space's TLB entries carry a tag: an ASID
/// (arm64, Arm ARM D8.14 "Address space identifiers"; RISC-V `satp.ASID`)
/// or a PCID (x86, Intel SDM Vol. 3A §4.10.1). The one contract that
/// [`AsidAllocator::switch_mm`](crate::asid::AsidAllocator::switch_mm)
/// (Linux `switch_mm`) drives on every architecture.
///
/// A handle is in one of three states:
///
/// - **unassigned** ([`tag`](TaggedMmu::tag) is `None`): made for an
///   address space that has not run yet, before its first `switch_mm`.
///   Its flushes ([`Mmu::flush_tlb_range`], [`Mmu::flush_tlb_mm`]) do
///   nothing: the space's root was never installed, so no walker has read
///   its tables and no TLB or walk-cache entry can have been filled from
///   them, under any tag. (Its leaves that are global are the kernel's,
///   flushed by the kernel's MMU, and [`Mmu::flush_tlb_all`] still drops
///   everything.) Installing an unassigned handle directly
///   ([`AddressSpace::install`](crate::AddressSpace::install)) makes it
///   untagged, so that the no-op flushes never meet entries of it;
/// - **tagged** (`tag` is `Some`): installs keep the other tags' entries
///   (no flush), flushes name the tag;
/// - **untagged** (an implementation's plain constructor, not this
///   trait's business): tag 0, every install flushes.
///
/// # Safety
///
/// [`switch_mm`](crate::asid::AsidAllocator::switch_mm) frees nobody's
/// frames, but it relies on these to keep other address spaces'
/// translations out of the one it installs, so they are promises:
///
/// - after [`set_tag`](TaggedMmu::set_tag)`(t)` returns `Ok`, the handle's
///   flushes invalidate the entries tagged `t` (and the global ones a
///   range names), and its next [`Mmu::install_root`] makes `t` the
///   current tag of the executing CPU;
/// - [`local_flush_all`](TaggedMmu::local_flush_all) returns only once the
///   executing CPU's TLB holds no non-global entry of any tag (and no
///   walk-cache entry), including deferred flushes' targets;
/// - an unassigned handle's flushes may do nothing only because, as above,
///   it has never been installed.
pub unsafe trait TaggedMmu: Mmu {
    /// The tag this handle flushes by and installs with; `None` while
    /// unassigned (and on an untagged handle).
    fn tag(&self) -> Option<u16>;

    /// Gives the handle tag `tag` (an allocator's
    /// [`Switch::asid`](crate::asid::Switch::asid)): its flushes name it
    /// from now on and its next install loads it. The caller makes sure no
    /// CPU runs the address space under its old tag while the tag changes
    /// (an allocator changes a space's tag only after a roll-over).
    ///
    /// # Errors
    ///
    /// [`AsidError::Tag`](crate::asid::AsidError::Tag), handle unchanged,
    /// if the handle cannot take `tag`: wider than the hardware's ASIDs or
    /// PCIDs, or a handle that cannot be tagged at all.
    fn set_tag(&self, tag: u16) -> Result<(), crate::asid::AsidError>;

    /// Invalidates the non-global TLB entries of every tag, and the walk
    /// caches, on the executing CPU only (Linux `local_flush_tlb_all`;
    /// arm64 `tlbi vmalle1` + `dsb nsh`; x86 INVPCID type 3 or a CR4.PGE
    /// toggle; RISC-V `sfence.vma` with `x0, x0`): the flush an
    /// allocator's roll-over asks for
    /// ([`Switch::flush_local`](crate::asid::Switch::flush_local)). It may
    /// drop global entries too. Not a shootdown.
    fn local_flush_all(&self);
}

// SAFETY: forwarded to `M`, which upholds the contract.
unsafe impl<M: TaggedMmu> TaggedMmu for &M {
    #[inline]
    fn tag(&self) -> Option<u16> {
        (**self).tag()
    }
    #[inline]
    fn set_tag(&self, tag: u16) -> Result<(), crate::asid::AsidError> {
        (**self).set_tag(tag)
    }
    #[inline]
    fn local_flush_all(&self) {
        (**self).local_flush_all()
    }
}

/// An MMU that does nothing: for tables that are not live and for measuring
/// the algorithms alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopMmu;

// SAFETY: for tables that no walker uses there is nothing to make visible
// or to invalidate; `AddressSpace::install` with a `NoopMmu` installs
// nothing.
unsafe impl Mmu for NoopMmu {
    #[inline]
    fn walker_barrier(&self) {}
    #[inline]
    fn flush_tlb_range(&self, _range: TlbRange) {}
    #[inline]
    fn flush_tlb_all(&self) {}
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

// SAFETY: every operation forwards to `M`, which upholds the contract.
unsafe impl<M: Mmu> Mmu for &M {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;
    #[inline]
    fn walker_barrier(&self) {
        (**self).walker_barrier()
    }
    #[inline]
    fn publish_barrier(&self) {
        (**self).publish_barrier()
    }
    #[inline]
    fn flush_tlb_range(&self, range: TlbRange) {
        (**self).flush_tlb_range(range)
    }
    #[inline]
    fn flush_tlb_all(&self) {
        (**self).flush_tlb_all()
    }
    #[inline]
    fn flush_tlb_mm(&self) {
        (**self).flush_tlb_mm()
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { (**self).install_root(root) }
    }
    #[inline]
    fn installs_into(&self) -> Option<VaRange> {
        (**self).installs_into()
    }
    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        (**self).entry_written(slot, old)
    }
}
