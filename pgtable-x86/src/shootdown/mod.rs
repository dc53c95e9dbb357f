//! TLB shootdown for SMP x86: the [`Mmu`](pgtable_core::contract::Mmu) rule "a flush returns only once
//! no CPU can use the old translation" on hardware whose invalidation
//! instructions (`INVLPG`, MOV to CR3, INVPCID) reach the executing CPU
//! only (Intel SDM Vol. 3A §4.10.5, "Propagation of Paging-Structure
//! Changes to Multiple Processors": software must tell the other
//! processors, usually with an IPI).
//!
//! The shape follows Linux's `flush_tlb_mm_range` → `flush_tlb_multi` →
//! `flush_tlb_func` (arch/x86/mm/tlb.c):
//!
//! - **Where an address space may be live.** Every address space has an
//!   [`MmCpus`]: the CPUs that switched to it (an atomic bitmap, Linux
//!   `mm_cpumask`, set on switch-in and cleared lazily: a CPU that gets a
//!   flush for a space it no longer runs drops its bit) and a flush
//!   generation (Linux `mm->context.tlb_gen`) with, per CPU, the
//!   generation that CPU has caught up with.
//! - **Lazy CPUs.** A CPU that runs only kernel code while keeping the
//!   last user space loaded ([`Shootdown::enter_lazy`], Linux
//!   `enter_lazy_tlb` / `cpu_tlbstate_shared.is_lazy`) gets no IPI for a
//!   flush that frees no table; its generation falls behind, and its next
//!   [`switch_mm`](Shootdown::switch_mm) to the space says to flush it
//!   fully. A flush that frees tables (a [`TlbRange`](pgtable_core::contract::TlbRange) that is not
//!   `last_level`, or a whole-space flush) reaches lazy CPUs too, since
//!   their walkers may still walk the old tables speculatively (Linux
//!   `flush_tlb_mm_range` with `freed_tables`).
//! - **One IPI round per flush.** The initiator bumps the generation,
//!   flushes locally, writes one request (the range, or a whole flush past
//!   the ceiling: the receiving CPU's local MMU decides) into its per-CPU
//!   slot, marks each target, sends *one* IPI to the set
//!   ([`IpiSender::send_flush_ipi`], Linux `native_flush_tlb_multi`) and
//!   waits until every target acknowledged; while it waits it serves
//!   requests addressed to itself, so two CPUs that shoot each other down
//!   with interrupts disabled do not deadlock.
//! - **The receiving side.** [`Shootdown::handle_flush_ipi`], called from
//!   the kernel's IPI vector: for each request, the local flush it
//!   describes if this CPU runs the space and has not caught up with the
//!   request's generation (a range if it is exactly one generation
//!   behind, otherwise a full flush, as Linux's `flush_tlb_func`), then
//!   the acknowledgement.
//! - **INVLPGB.** On AMD processors with INVLPGB ([`invlpgb`]), one
//!   broadcast invalidation plus TLBSYNC replaces the IPI round
//!   (`Shootdown::use_invlpgb`, bare metal only).
//!
//! # For kernel authors
//!
//! ```
//! use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
//! use pgtable_core::contract::{Arena, NoopMmu};
//! use pgtable_x86::{CpuMask, IpiSender, MmCpus, Shootdown, SmpMmu, X86_64};
//!
//! // The kernel's part: the CPU number and the IPI (x2APIC ICR writes).
//! struct Ipi;
//! impl IpiSender for Ipi {
//!     fn this_cpu(&self) -> usize { 0 }
//!     fn send_flush_ipi(&self, _cpus: CpuMask) { /* write the ICR */ }
//! }
//! static SHOOTDOWN: Shootdown<Ipi> = Shootdown::new(Ipi);
//! static CPUS: MmCpus = MmCpus::new(); // one per address space
//!
//! SHOOTDOWN.set_online(0); // at boot, on each CPU
//! // `NoopMmu` stands for `X86Mmu::new()` (bare metal) here.
//! let mmu = SmpMmu::new(NoopMmu, &SHOOTDOWN, &CPUS);
//! let mut space = AddressSpace::<X86_64, _, _>::new(mmu, Arena::new()).unwrap();
//! // A context switch to the space on this CPU (interrupts disabled):
//! // `switch_mm`, the CR3 load, and the catch-up flush if one is due.
//! unsafe { space.mmu().switch_to(space.root()) };
//! space.map(VirtAddr(0x40_0000), PhysAddr(0x20_0000), 0x1000, Prot::READ_WRITE,
//!           MapOptions::PAGES).unwrap();
//! space.unmap(VirtAddr(0x40_0000), 0x1000).unwrap(); // live on CPU 0 only: no IPI
//! assert_eq!(SHOOTDOWN.stats().ipi_rounds, 0);
//! // A kernel thread keeps the space loaded: `SHOOTDOWN.enter_lazy(cpu)`.
//! // The flush IPI vector: `SHOOTDOWN.handle_flush_ipi(cpu, &LOCAL_X86MMU)`, then EOI.
//! # unsafe { space.deactivate() };
//! ```
//!
//! The kernel's own address space (the upper half every CPU maps) uses
//! [`MmCpus::kernel`]: its flushes go to every online CPU, lazy or not.
//! When user spaces run under PCIDs, say so with
//! [`Shootdown::set_user_pcids`]: the kernel half may then be cached under
//! every PCID, and its flushes invalidate them all on every CPU.

mod cpus;
pub mod invlpgb;
mod round;
mod smp_mmu;

pub use cpus::{CpuMask, MmCpus, SwitchAction};
pub use round::{PendingFlush, Shootdown};
pub use smp_mmu::SmpMmu;

/// The most CPUs a [`Shootdown`] serves (one bit each in a [`CpuMask`]).
pub const MAX_CPUS: usize = 64;

/// What the kernel provides: the executing CPU's number and a way to send
/// the flush IPI vector.
pub trait IpiSender {
    /// The executing CPU's number, below [`MAX_CPUS`] (its APIC ID mapped
    /// to a dense number, or a per-CPU variable).
    fn this_cpu(&self) -> usize;

    /// Sends the flush vector to every CPU in `cpus` (never the executing
    /// one): x2APIC ICR writes, or one "all excluding self" shorthand when
    /// `cpus` is every other online CPU. The targets' handlers call
    /// [`Shootdown::handle_flush_ipi`].
    fn send_flush_ipi(&self, cpus: CpuMask);

    /// Called while waiting for acknowledgements (default: a spin-loop
    /// hint, `pause`).
    fn relax(&self) {
        core::hint::spin_loop();
    }
}

/// Counters a kernel can print.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ShootdownStats {
    /// Flushes requested through [`SmpMmu`] (or
    /// [`Shootdown::flush_start`]).
    pub flushes: u64,
    /// IPI rounds sent (at most one per flush).
    pub ipi_rounds: u64,
    /// CPUs reached by those rounds, summed.
    pub cpus_reached: u64,
    /// Targets skipped because they were lazy.
    pub lazy_skipped: u64,
    /// Requests handled by receiving CPUs.
    pub ipis_handled: u64,
    /// Requests a receiving CPU found already done (or for a space it no
    /// longer runs).
    pub ipis_ignored: u64,
    /// Local flushes carried out (initiator and receivers).
    pub local_flushes: u64,
    /// Flushes done by INVLPGB + TLBSYNC instead of IPIs.
    pub broadcast_flushes: u64,
}
