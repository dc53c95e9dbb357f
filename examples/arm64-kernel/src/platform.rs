//! The arm64 pieces the kernel uses from `pgtable-arm64`, in one place,
//! and the MMU handle every address space of the kernel uses: pgtable's
//! [`Arm64Mmu`] with a count of every TLB flush it issues, by kind, so the
//! `space_` cases can show that switching address spaces by ASID flushes
//! nothing.

use core::ops::Deref;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use crate::geom::Arm64;
use pgtable_arm64::flush::{flush_plan, FlushPlan};
pub use pgtable_arm64::mmu::local_flush_tlb_all;
use pgtable_arm64::mmu::{has_tlb_range, Arm64Mmu};
use pgtable_core::contract::{Mmu as MmuOps, Slot, TlbRange};
use pgtable_core::{PhysAddr, VaRange};

/// Range flushes (`tlbi va…e1is` / `rva…e1is`, one count per flush call).
static FLUSH_RANGE: AtomicU64 = AtomicU64::new(0);
/// Flushes of one ASID (`tlbi aside1is`).
static FLUSH_ASID: AtomicU64 = AtomicU64::new(0);
/// Full flushes (`tlbi vmalle1is`): untagged installs, untagged
/// `flush_tlb_mm`, `flush_tlb_all`, range flushes too large for TLBIs.
static FLUSH_ALL: AtomicU64 = AtomicU64::new(0);
/// Local full flushes (`tlbi vmalle1`) an ASID roll-over asked for.
static FLUSH_LOCAL: AtomicU64 = AtomicU64::new(0);

/// The TLB flushes issued so far through [`Mmu`] and [`local_flush`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct FlushCounts {
    /// Range flushes.
    pub range: u64,
    /// Flushes of one ASID.
    pub asid: u64,
    /// Full flushes of every CPU's TLB.
    pub all: u64,
    /// Local full flushes after ASID roll-overs.
    pub local: u64,
}

impl FlushCounts {
    /// The counts now.
    pub fn now() -> FlushCounts {
        // Relaxed: one CPU; the counts are statistics.
        FlushCounts {
            range: FLUSH_RANGE.load(Relaxed),
            asid: FLUSH_ASID.load(Relaxed),
            all: FLUSH_ALL.load(Relaxed),
            local: FLUSH_LOCAL.load(Relaxed),
        }
    }

    /// The flushes since `earlier`.
    pub fn since(self, earlier: FlushCounts) -> FlushCounts {
        FlushCounts {
            range: self.range - earlier.range,
            asid: self.asid - earlier.asid,
            all: self.all - earlier.all,
            local: self.local - earlier.local,
        }
    }
}

fn count(c: &AtomicU64) {
    // Relaxed: a statistic.
    c.fetch_add(1, Relaxed);
}

/// `local_flush_tlb_all`, counted.
pub fn local_flush() {
    count(&FLUSH_LOCAL);
    local_flush_tlb_all();
}

/// [`Arm64Mmu`] with its flushes counted (see [`FlushCounts`]); derefs to
/// it for the ASID (`set_asid`, `asid`).
#[derive(Clone, Debug)]
pub struct Mmu(Arm64Mmu);

impl Deref for Mmu {
    type Target = Arm64Mmu;
    fn deref(&self) -> &Arm64Mmu {
        &self.0
    }
}

// SAFETY: every operation forwards to `Arm64Mmu`, which upholds the
// contract; the wrapper only counts.
unsafe impl MmuOps for Mmu {
    #[inline]
    fn walker_barrier(&self) {
        self.0.walker_barrier()
    }

    #[inline]
    fn publish_barrier(&self) {
        self.0.publish_barrier()
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        if self.0.is_unassigned() {
            // Not counted: `Arm64Mmu` issues nothing for a space that
            // never ran.
            return self.0.flush_tlb_range(range);
        }
        match flush_plan(range, has_tlb_range()) {
            FlushPlan::All => count(&FLUSH_ALL),
            _ => count(&FLUSH_RANGE),
        }
        self.0.flush_tlb_range(range)
    }

    fn flush_tlb_all(&self) {
        count(&FLUSH_ALL);
        self.0.flush_tlb_all()
    }

    fn flush_tlb_mm(&self) {
        if self.0.is_unassigned() {
            return self.0.flush_tlb_mm();
        }
        match self.0.asid() {
            Some(_) => count(&FLUSH_ASID),
            None => count(&FLUSH_ALL),
        }
        self.0.flush_tlb_mm()
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // An untagged install ends with a full flush; a tagged one flushes
        // nothing.
        if self.0.asid().is_none() {
            count(&FLUSH_ALL);
        }
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.0.install_root(root) }
    }

    #[inline]
    fn installs_into(&self) -> Option<VaRange> {
        self.0.installs_into()
    }

    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        self.0.entry_written(slot, old)
    }
}

/// The MMU of the kernel's own address space (a `VaRange::Upper` space):
/// global mappings, ASID 0, `install_root` writes TTBR1_EL1 only, at the
/// root itself (T1SZ = 16: the root's 512 entries translate the upper
/// 2^48 bytes).
pub const fn kernel_mmu() -> Mmu {
    Mmu(Arm64Mmu::new()
        .for_format::<Arm64>()
        .installing_into(VaRange::Upper))
}

/// The MMU of the lower-half spaces (the suite's test space, user spaces,
/// the benchmarks' spaces): untagged (ASID 0, every install flushes the
/// TLB) until `set_asid` tags it; `install_root` writes TTBR0_EL1 only,
/// so installing one never touches the kernel's upper half.
pub const fn lower_mmu() -> Mmu {
    Mmu(Arm64Mmu::new()
        .for_format::<Arm64>()
        .installing_into(VaRange::Lower))
}

/// The MMU of a user space switched by `AsidAllocator::switch_mm`: no ASID
/// until its first switch (`Arm64Mmu::unassigned`), TTBR0_EL1.
pub const fn unassigned_mmu() -> Mmu {
    Mmu(Arm64Mmu::unassigned().for_format::<Arm64>())
}

// SAFETY: forwarded to `Arm64Mmu`, which upholds the contract;
// `local_flush_all` is its `local_flush_tlb_all`, counted.
unsafe impl pgtable_core::contract::TaggedMmu for Mmu {
    #[inline]
    fn tag(&self) -> Option<u16> {
        self.0.tag()
    }

    #[inline]
    fn set_tag(&self, tag: u16) -> Result<(), pgtable_core::asid::AsidError> {
        self.0.set_tag(tag)
    }

    fn local_flush_all(&self) {
        local_flush();
    }
}
