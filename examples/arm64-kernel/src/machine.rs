//! The conformance suite's `Machine` on this (emulated) hardware: loads
//! and stores are the probes of `probe.rs`, so the MMU decides what faults.

use core::fmt;

use pgtable_core::contract::level;
use pgtable_core::suite::{Fault, Machine};
use pgtable_core::{PhysAddr, VirtAddr};

use crate::memory::is_kernel_va;
use crate::platform::Arm64;
use crate::{print, probe, timer};

/// The unit the suite lays its window out in: a PUD entry (1 GiB with
/// 4 KiB pages, 64 GiB with 16 KiB, 4 TiB with 64 KiB).
const UNIT: u64 = level::size::<Arm64>(2);

/// The suite's virtual window in its test space (TTBR0_EL1): 16 units at
/// 64 GiB or at 16 units, whichever is higher (4 KiB pages: 16 GiB at
/// 64 GiB; 8 units is the suite's minimum; the moves of 2 units at PUD
/// alignment need 16 to place source and destination at odd multiples of
/// a unit).
pub const WINDOW: (u64, u64) = (max(0x10_0000_0000, 16 * UNIT), 16 * UNIT);

/// The window of the suite's run on the kernel's own space (TTBR1_EL1),
/// which runs only the cases at the last entries of the upper half: 16
/// units of the upper half the kernel does not use (from 160 TiB into a
/// 48-bit half). The suite only checks that it stays empty.
pub const KERNEL_SPACE_WINDOW: (u64, u64) = (0xffff_a000_0000_0000, 16 * UNIT);

const fn max(a: u64, b: u64) -> u64 {
    if a > b {
        a
    } else {
        b
    }
}

const _: () = assert!(KERNEL_SPACE_WINDOW.0 % UNIT == 0 && KERNEL_SPACE_WINDOW.1 <= 64 << 40);
const _: () = assert!(WINDOW.0 + WINDOW.1 <= 1 << 47);

/// The kernel as a suite machine.
pub struct KernelMachine {
    /// The RAM pool handed to the suite.
    pub pool: (u64, u64),
    /// The window handed to the suite ([`WINDOW`] or
    /// [`KERNEL_SPACE_WINDOW`]).
    pub window: (u64, u64),
    /// Probe accesses performed (loads, stores and exec probes).
    pub accesses: u64,
    /// Faults caught at the probes.
    pub faults: u64,
}

/// Whether `va` lies in the suite's part of the address space: its window
/// and everything above it (the cases at the last entries of each half)
/// but the kernel's own regions, where the suite maps only its RAM pool.
/// User spaces live below the window.
fn in_suite_space(va: VirtAddr) -> bool {
    va.0 >= WINDOW.0 && !is_kernel_va(va.0)
}

impl KernelMachine {
    fn fault(&mut self, va: VirtAddr, f: probe::Fault, write: bool) -> Fault {
        self.faults += 1;
        // A probe faults only on its own access: FAR_EL1 is `va` and
        // ESR_EL1.WnR says whether it was the store.
        debug_assert_eq!((f.far, f.is_write()), (va.0, write));
        Fault { va, write }
    }
}

impl Machine for KernelMachine {
    fn read_u64(&mut self, va: VirtAddr) -> Result<u64, Fault> {
        self.accesses += 1;
        probe::read_u64(va.0).map_err(|f| self.fault(va, f, false))
    }

    /// A store outside the suite's space (which the suite never makes) is
    /// refused as a fault, so this safe method cannot write kernel memory.
    fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault> {
        self.accesses += 1;
        if !in_suite_space(va) {
            self.faults += 1;
            return Err(Fault { va, write: true });
        }
        // SAFETY: the suite's space maps only the suite's RAM pool, or nothing.
        unsafe { probe::write_u64(va.0, val) }.map_err(|f| self.fault(va, f, true))
    }

    fn exec_faults(&mut self, va: VirtAddr) -> Option<bool> {
        if !in_suite_space(va) {
            return None;
        }
        self.accesses += 1;
        // SAFETY: the suite's space maps only the suite's RAM pool, or nothing.
        let r = unsafe { probe::exec_faults(va.0) }?;
        if r.is_err() {
            self.faults += 1;
        }
        Some(r.is_err())
    }

    fn cycles(&mut self) -> u64 {
        timer::ticks()
    }

    fn cycle_hz(&self) -> Option<u64> {
        Some(timer::frequency())
    }

    fn emulated(&self) -> bool {
        // arm64 runs under TCG only here (no KVM on an x86 host).
        true
    }

    fn print(&mut self, args: fmt::Arguments) {
        print!("{args}\n");
    }

    fn ram(&self) -> (PhysAddr, u64) {
        (PhysAddr(self.pool.0), self.pool.1 - self.pool.0)
    }

    fn window(&self) -> (VirtAddr, u64) {
        (VirtAddr(self.window.0), self.window.1)
    }
}
