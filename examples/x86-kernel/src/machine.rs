//! The conformance suite's [`Machine`] on this kernel: loads and stores go
//! through the real (KVM) or emulated (TCG) MMU with the live tables; page
//! faults come back as values through the probes of [`crate::trap`].

use core::fmt;

use pgtable_core::suite::{Fault, Machine};
use pgtable_core::{PhysAddr, VirtAddr};

use crate::trap;
use crate::tsc::{self, Tsc};

/// Base of the virtual window the suite maps into: 64 GiB, far above RAM
/// and unmapped at boot (PML4 entry 0, PDPT entries 64..80).
pub const WINDOW_BASE: u64 = 0x10_0000_0000;
/// Length of the window: 16 GiB (the 2 GiB moves at odd PUD multiples
/// need more than the suite's minimum of 8).
pub const WINDOW_LEN: u64 = 16 << 30;

/// This kernel as a suite machine.
pub struct KernelMachine {
    /// The TSC frequency.
    pub tsc: Tsc,
    /// Running under TCG (timings are emulated).
    pub emulated: bool,
    /// The RAM pool handed to the suite.
    pub ram: (PhysAddr, u64),
}

/// Page-fault error code bit 1: the access was a write (Intel SDM vol. 3
/// §4.7, figure 4-12).
const PF_WRITE: u64 = 1 << 1;

/// The suite's view of a page fault a probe caught.
fn fault(f: trap::PageFault) -> Fault {
    Fault {
        va: VirtAddr(f.cr2),
        write: f.error & PF_WRITE != 0,
    }
}

impl Machine for KernelMachine {
    fn read_u64(&mut self, va: VirtAddr) -> Result<u64, Fault> {
        trap::read_u64(va.0).map_err(fault)
    }

    /// A store outside the window (which the suite never makes) is
    /// refused as a fault, so this safe method cannot write kernel memory.
    fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault> {
        if va.0.wrapping_sub(WINDOW_BASE) >= WINDOW_LEN {
            return Err(Fault { va, write: true });
        }
        // SAFETY: the window maps only the suite's RAM pool, or nothing.
        unsafe { trap::write_u64(va.0, val) }.map_err(fault)
    }

    fn cycles(&mut self) -> u64 {
        tsc::now()
    }

    fn cycle_hz(&self) -> Option<u64> {
        Some(self.tsc.hz)
    }

    fn emulated(&self) -> bool {
        self.emulated
    }

    fn print(&mut self, args: fmt::Arguments) {
        crate::println!("{}", args);
    }

    fn ram(&self) -> (PhysAddr, u64) {
        self.ram
    }

    fn window(&self) -> (VirtAddr, u64) {
        (VirtAddr(WINDOW_BASE), WINDOW_LEN)
    }
}
