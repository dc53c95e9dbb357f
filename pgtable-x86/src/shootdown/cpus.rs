//! Sets of CPUs, and where an address space may be live.

use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicU32, AtomicU64};

use super::MAX_CPUS;
use crate::Pcid;

/// A set of CPUs, one bit per CPU number below [`MAX_CPUS`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CpuMask(pub u64);

impl CpuMask {
    /// No CPU.
    pub const EMPTY: CpuMask = CpuMask(0);

    /// CPU `cpu` alone (empty for a number past [`MAX_CPUS`]).
    pub const fn of(cpu: usize) -> CpuMask {
        if cpu < MAX_CPUS {
            CpuMask(1 << cpu)
        } else {
            CpuMask(0)
        }
    }

    /// Whether `cpu` is in the set.
    pub const fn contains(self, cpu: usize) -> bool {
        self.0 & CpuMask::of(cpu).0 != 0
    }

    /// Number of CPUs in the set.
    pub const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The CPUs of the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut m = self.0;
        core::iter::from_fn(move || {
            if m == 0 {
                return None;
            }
            let c = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(c)
        })
    }
}

/// Where an address space may be live, and how far each CPU has caught
/// up with its flushes (Linux `mm_cpumask` and `context.tlb_gen`). One per
/// address space; it must outlive every CPU's use of the space: switch
/// every CPU away from a space (and let lazy ones switch too) before its
/// `MmCpus` goes, as Linux does before it frees an mm (the CPUs compare
/// its address).
#[derive(Debug)]
pub struct MmCpus {
    /// CPUs that switched to the space and have not dropped their bit.
    pub(super) cpus: AtomicU64,
    /// The generation of the latest flush.
    pub(super) tlb_gen: AtomicU64,
    /// Per CPU: the generation its TLB has caught up with.
    pub(super) cpu_gen: [AtomicU64; MAX_CPUS],
    /// The kernel's own space: live on every online CPU.
    pub(super) kernel: bool,
    /// The PCID the space runs under (for INVLPGB), or `u32::MAX`.
    pub(super) pcid: AtomicU32,
}

impl Default for MmCpus {
    fn default() -> Self {
        Self::new()
    }
}

impl MmCpus {
    /// A user address space, live nowhere yet.
    pub const fn new() -> MmCpus {
        MmCpus {
            cpus: AtomicU64::new(0),
            tlb_gen: AtomicU64::new(0),
            cpu_gen: [const { AtomicU64::new(0) }; MAX_CPUS],
            kernel: false,
            pcid: AtomicU32::new(u32::MAX),
        }
    }

    /// The kernel's address space: live on every online CPU, lazy or not
    /// (Linux `flush_tlb_kernel_range` → `on_each_cpu`).
    pub const fn kernel() -> MmCpus {
        let mut m = MmCpus::new();
        m.kernel = true;
        m
    }

    /// The CPUs that may hold the space's translations now.
    pub fn cpus(&self) -> CpuMask {
        // Relaxed: a snapshot for reporting; the flush path reads it with
        // SeqCst (see `Shootdown::flush_start`).
        CpuMask(self.cpus.load(Relaxed))
    }

    /// The generation of the latest flush.
    pub fn tlb_gen(&self) -> u64 {
        // Relaxed: a snapshot for reporting.
        self.tlb_gen.load(Relaxed)
    }

    /// Names the PCID the space runs under, for INVLPGB's PCID operand
    /// (without it, INVLPGB invalidates the addresses in every PCID).
    pub fn set_pcid(&self, pcid: Option<Pcid>) {
        // Relaxed: read by the flush on the CPU that set it, or after the
        // allocator's lock that chose it.
        self.pcid
            .store(pcid.map_or(u32::MAX, |p| u32::from(p.get())), Relaxed);
    }

    pub(super) fn pcid(&self) -> Option<Pcid> {
        // Relaxed: see `set_pcid`.
        Pcid::new(u16::try_from(self.pcid.load(Relaxed)).ok()?).ok()
    }

    pub(super) fn id(&self) -> usize {
        self as *const MmCpus as usize
    }
}

/// What [`Shootdown::switch_mm`](super::Shootdown::switch_mm) asks of the switching CPU.
#[must_use = "a CPU that fell behind must flush before running the space"]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SwitchAction {
    /// Flush the space's translations on this CPU before they become
    /// usable (MOV to CR3 without the no-flush bit, or
    /// [`Mmu::flush_tlb_mm`](pgtable_core::contract::Mmu::flush_tlb_mm) *before*
    /// installing): flushes went by while this CPU was lazy or away.
    pub flush: bool,
}
