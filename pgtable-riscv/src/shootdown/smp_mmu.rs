//! The SMP [`Mmu`]: the executing hart's [`HartMmu`] plus the remote
//! fences.

use pgtable_core::contract::{Mmu, Slot, TlbRange};
use pgtable_core::PhysAddr;

use super::{MmHarts, RemoteFence};
use crate::hart::{Hart, HartMmu};
use crate::regs::Asid;

/// The [`Mmu`] of an address space live on several harts: `local`'s
/// fences on the executing hart, then the same flush on every other hart
/// of its [`MmHarts`] through [`RemoteFence`] (SBI RFENCE), which returns
/// once they executed it. A flush therefore returns only once no hart on
/// which the space may be live can use the old translation.
///
/// Range flushes of leaves name the range (`SFENCE.VMA` per page, or
/// everything, as the SBI implementation decides); flushes of tables,
/// [`flush_tlb_mm`](Mmu::flush_tlb_mm) and
/// [`flush_tlb_all`](Mmu::flush_tlb_all) name everything (`size` all
/// ones). A tagged space's remote fences name its ASID
/// (`sbi_remote_sfence_vma_asid`, global mappings excepted: tagged spaces
/// hold no global leaves), an untagged one's none
/// (`sbi_remote_sfence_vma`, which reaches global entries too), and
/// `flush_tlb_all` never does.
pub struct SmpMmu<'a, H, R, const WORDS: usize = 1> {
    local: HartMmu<H>,
    fence: &'a R,
    mm: &'a MmHarts<WORDS>,
}

impl<'a, H, R, const WORDS: usize> SmpMmu<'a, H, R, WORDS> {
    /// The MMU of the space whose harts are `mm`, flushing the executing
    /// hart with `local` and the others through `fence`.
    pub const fn new(local: HartMmu<H>, fence: &'a R, mm: &'a MmHarts<WORDS>) -> Self {
        SmpMmu { local, fence, mm }
    }

    /// The executing hart's MMU.
    pub const fn local(&self) -> &HartMmu<H> {
        &self.local
    }

    /// The space's harts.
    pub const fn mm(&self) -> &'a MmHarts<WORDS> {
        self.mm
    }
}

impl<H: Hart, R: RemoteFence, const WORDS: usize> SmpMmu<'_, H, R, WORDS> {
    /// The remote half of a flush of `[start, start + size)` (`size`
    /// `u64::MAX`: everything of `asid`, or everything).
    fn remote(&self, start: u64, size: u64, asid: Option<Asid>) {
        for harts in self.mm.targets(self.fence.this_hart()) {
            self.fence.remote_sfence_vma(harts, start, size, asid);
        }
    }
}

impl<H, R, const WORDS: usize> core::fmt::Debug for SmpMmu<'_, H, R, WORDS> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SmpMmu")
            .field("asid", &self.local.asid())
            .finish_non_exhaustive()
    }
}

// SAFETY: the barriers and the install are `local`'s, which meets the
// contract on the executing hart; every flush also runs on the other
// harts the space may be live on through `RemoteFence`, which returns
// only after they executed the fence (its contract). A hart joins the
// set before it installs the root (`install_root`), so a hart missing
// from a flush's targets switched to the space after the flush began and
// holds no translation from before it.
unsafe impl<H: Hart, R: RemoteFence, const WORDS: usize> Mmu for SmpMmu<'_, H, R, WORDS> {
    const OBSERVES_WRITES: bool = H::OBSERVES_WRITES;

    fn walker_barrier(&self) {
        self.local.walker_barrier();
    }

    fn publish_barrier(&self) {
        self.local.publish_barrier();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.local.flush_tlb_range(range);
        let len = range.end.0.wrapping_sub(range.start.0);
        if range.last_level && len != 0 {
            self.remote(range.start.0, len, self.local.asid());
        } else {
            self.remote(0, u64::MAX, self.local.asid());
        }
    }

    fn flush_tlb_all(&self) {
        self.local.flush_tlb_all();
        self.remote(0, u64::MAX, None);
    }

    fn flush_tlb_mm(&self) {
        self.local.flush_tlb_mm();
        self.remote(0, u64::MAX, self.local.asid());
    }

    /// Marks the executing hart in the space's harts, then `local`'s
    /// install.
    unsafe fn install_root(&self, root: PhysAddr) {
        self.mm.add(self.fence.this_hart());
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.local.install_root(root) };
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.local.entry_written(slot, old);
    }
}
