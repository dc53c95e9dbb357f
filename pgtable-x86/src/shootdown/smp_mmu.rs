//! The SMP [`Mmu`]: the local MMU plus the shootdown.

use pgtable_core::contract::{Mmu, Slot, TlbRange};
use pgtable_core::PhysAddr;

use super::{IpiSender, MmCpus, Shootdown};
use crate::flush::FlushKind;

/// An [`Mmu`] for SMP x86: `local`'s barriers and installs, and flushes
/// that reach every CPU on which the space may be live (the local flush,
/// then one IPI round and the wait, or INVLPGB).
pub struct SmpMmu<'a, M: Mmu, I: IpiSender> {
    local: M,
    sd: &'a Shootdown<I>,
    mm: &'a MmCpus,
}

impl<'a, M: Mmu, I: IpiSender> SmpMmu<'a, M, I> {
    /// The MMU of the address space whose CPU set is `mm`, flushing
    /// locally with `local` (an `X86Mmu`, tagged or not, which acts on
    /// the executing CPU) and remotely through `sd`.
    pub fn new(local: M, sd: &'a Shootdown<I>, mm: &'a MmCpus) -> Self {
        SmpMmu { local, sd, mm }
    }

    /// The local MMU.
    pub fn local(&self) -> &M {
        &self.local
    }

    /// The space's CPU set.
    pub fn mm(&self) -> &'a MmCpus {
        self.mm
    }

    /// The shootdown state.
    pub fn shootdown(&self) -> &'a Shootdown<I> {
        self.sd
    }

    /// Flushes `kind` on every CPU the space may be live on and waits.
    fn flush(&self, kind: FlushKind) {
        // SAFETY: waited for at once.
        unsafe { self.sd.flush_start(self.mm, kind, &self.local) }.wait();
    }

    /// Switches the executing CPU to this space: [`Shootdown::switch_mm`],
    /// the flush it asks for, and the install. What a context switch
    /// calls (interrupts disabled), with the space's root.
    ///
    /// The flush comes first: under a PCID the install keeps the PCID's
    /// cached entries (CR3 with the no-flush bit), which the processor may
    /// use as soon as CR3 is loaded, so stale ones must be gone by then
    /// (Linux `switch_mm_irqs_off` loads CR3 *without* the no-flush bit
    /// when a flush is owed). With a tagged `X86Mmu` whose PCID is not
    /// current, [`Mmu::flush_tlb_mm`] is INVPCID type 1 for the PCID or,
    /// without INVPCID, a mark ([`PcidCpu`](crate::PcidCpu)) that makes the
    /// install load CR3 without the no-flush bit. (An untagged install
    /// flushes by itself; the flush before it is then redundant.)
    ///
    /// # Safety
    ///
    /// As [`Mmu::install_root`].
    pub unsafe fn switch_to(&self, root: PhysAddr) {
        let act = self.sd.switch_mm(self.sd.sender().this_cpu(), self.mm);
        if act.flush {
            self.local.flush_tlb_mm();
        }
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.local.install_root(root) };
    }
}

// SAFETY: a flush returns only after the local flush and the
// acknowledgement of every CPU the space may be live on that is not lazy
// (lazy ones catch up at their next switch before using the space, and
// flushes that free tables reach them too), or after INVLPGB + TLBSYNC,
// which complete on every processor; `local` upholds the rest (barriers,
// installs, global entries).
unsafe impl<M: Mmu, I: IpiSender> Mmu for SmpMmu<'_, M, I> {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;

    fn walker_barrier(&self) {
        self.local.walker_barrier();
    }

    fn publish_barrier(&self) {
        self.local.publish_barrier();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.flush(FlushKind::Range(range));
    }

    fn flush_tlb_all(&self) {
        self.flush(FlushKind::All);
    }

    fn flush_tlb_mm(&self) {
        self.flush(FlushKind::Mm);
    }

    /// [`switch_to`](SmpMmu::switch_to).
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.switch_to(root) }
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.local.entry_written(slot, old);
    }
}
