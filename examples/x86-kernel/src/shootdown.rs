//! TLB shootdown through pgtable-x86's [`Shootdown`]: the kernel's part is
//! an [`IpiSender`] ([`KernelIpi`]: the CPU number from the stack, flush
//! IPIs through the local APIC) and the flush vector's handler, which
//! calls [`Shootdown::handle_flush_ipi`] with this CPU's local
//! [`X86Mmu`]. Every address space that may be live on several CPUs
//! uses [`SmpMmu`] over an [`MmCpus`] of its own; the kernel's own root
//! is [`KERNEL_MM`] for the CPUs switching back to it.

use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

use pgtable_core::contract::NoopMmu;
use pgtable_core::PhysAddr;
use pgtable_x86::{CpuMask, IpiSender, MmCpus, Shootdown, ShootdownStats, X86Mmu};

use crate::smp;

/// The kernel's IPI sender.
pub struct KernelIpi;

impl IpiSender for KernelIpi {
    fn this_cpu(&self) -> usize {
        smp::this_cpu()
    }

    fn send_flush_ipi(&self, cpus: CpuMask) {
        smp::send_flush_ipis(cpus.0);
    }
}

/// The machine's shootdown state.
pub static SHOOTDOWN: Shootdown<KernelIpi> = Shootdown::new(KernelIpi);

/// The CPU set of the kernel's own root (what a CPU switches back to).
pub static KERNEL_MM: MmCpus = MmCpus::kernel();

/// The MMU of the `smp_` cases' spaces.
pub type SmpMmu<'a> = pgtable_x86::SmpMmu<'a, X86Mmu, KernelIpi>;

/// A new [`SmpMmu`] for the space whose CPU set is `mm`.
pub fn smp_mmu(mm: &MmCpus) -> SmpMmu<'_> {
    SmpMmu::new(X86Mmu::new(), &SHOOTDOWN, mm)
}

/// Shootdowns switched off (`noshootdown` on the command line): the
/// targets acknowledge without flushing, so flushes act on the executing
/// CPU only, which is wrong with several CPUs; for seeing the `smp_` cases
/// fail.
static NO_SHOOTDOWN: AtomicBool = AtomicBool::new(false);

/// Switches shootdowns off (see [`NO_SHOOTDOWN`]).
pub fn disable_shootdown() {
    NO_SHOOTDOWN.store(true, Relaxed);
}

/// The flush vector's work on `cpu` (interrupts disabled).
pub fn handle_flush_ipi(cpu: usize) {
    if NO_SHOOTDOWN.load(Relaxed) {
        SHOOTDOWN.handle_flush_ipi(cpu, &NoopMmu);
    } else {
        SHOOTDOWN.handle_flush_ipi(cpu, &X86Mmu::new());
    }
}

/// Marks the executing CPU online for shootdowns.
pub fn set_online() {
    SHOOTDOWN.set_online(smp::this_cpu());
}

/// The shootdown counters.
pub fn stats() -> ShootdownStats {
    SHOOTDOWN.stats()
}

/// Switches this CPU to `root` with the CPU set `mm` (`switch_mm`, the
/// MOV to CR3 and the catch-up flush if one is due).
///
/// # Safety
///
/// `root` maps the kernel half like the kernel's root and stays alive
/// while installed; `mm` outlives this CPU's use of the space (the CPU
/// switches to [`KERNEL_MM`] before it goes).
pub unsafe fn switch_to(root: u64, mm: &MmCpus) {
    let mmu = pgtable_x86::SmpMmu::new(X86Mmu::new(), &SHOOTDOWN, mm);
    // SAFETY: our caller's promise.
    unsafe { mmu.switch_to(PhysAddr(root)) };
}
