//! The conformance suite's [`Machine`] on this kernel: loads, stores and
//! instruction fetches go through QEMU's emulated MMU with the live
//! tables; page faults come back as values through the probes of
//! [`crate::trap`].

use core::arch::asm;
use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_core::suite::{Fault, Machine};
use pgtable_core::{PhysAddr, VirtAddr};
use pgtable_riscv::regs::{Satp, SatpMode};

use crate::trap;

/// Base of the suite's window: 64 GiB, in the lower half of every format
/// (Sv39's lower half ends at 256 GiB), above RAM.
pub const WINDOW_BASE: u64 = 0x10_0000_0000;
/// Length of the window: 16 GiB.
pub const WINDOW_LEN: u64 = 16 << 30;

/// The frequency of the `time` CSR on QEMU virt (its device tree's
/// `timebase-frequency`).
pub const TIMEBASE_HZ: u64 = 10_000_000;

/// The `time` CSR (`rdtime`).
pub fn now() -> u64 {
    let t: u64;
    // SAFETY: reads the time CSR, which OpenSBI lets S-mode read
    // (`mcounteren.TM`).
    unsafe { asm!("rdtime {0}", out(reg) t, options(nomem, nostack)) };
    t
}

/// This kernel as a suite machine.
pub struct KernelMachine {
    /// The RAM pool handed to the suite.
    pub ram: (PhysAddr, u64),
    /// The last page [`Machine::exec_faults`] probed and the frame it
    /// mapped then: `(va page, pa page)`.
    pub exec_page: Option<(u64, u64)>,
}

/// `ret` (`jalr x0, 0(ra)`), 4 bytes.
const RET: u32 = 0x0000_8067;

/// The physical address `va` maps to in the tables `satp` names (a
/// software walk with the privileged spec's Sv39/Sv48/Sv57 layout: V bit
/// 0, a leaf has R or X, PPN at bits 53:10), or `None`. Only says where a
/// `ret` must go; whether the fetch faults is the MMU's call.
fn walk_tables(va: u64) -> Option<u64> {
    let satp: u64;
    // SAFETY: reads satp.
    unsafe { asm!("csrr {0}, satp", out(reg) satp, options(nomem, nostack)) };
    let satp = Satp::from_bits(satp);
    let levels = match satp.mode() {
        Some(SatpMode::Bare) | None => return None,
        Some(m) => m.levels(),
    };
    let mut table = satp.root().0;
    for height in (0..levels).rev() {
        let shift = 12 + 9 * height;
        let slot = (table + ((va >> shift) & 511) * 8) as *const AtomicU64;
        // SAFETY: table frames are RAM at their physical address, mapped
        // identically; the entry is an aligned u64 that the hardware may
        // update (A/D), hence atomic; Relaxed: a snapshot suffices.
        let pte = unsafe { (*slot).load(Relaxed) };
        if pte & 1 == 0 {
            return None;
        }
        let pa = ((pte >> 10) & ((1 << 44) - 1)) << 12;
        if pte & 0b1010 != 0 {
            let mask = (1u64 << shift) - 1;
            return Some((pa & !mask) | (va & mask));
        }
        table = pa;
    }
    None
}

fn fault(va: VirtAddr, cause: u64) -> Fault {
    Fault {
        va,
        write: cause == trap::CAUSE_STORE_PAGE_FAULT,
    }
}

impl Machine for KernelMachine {
    fn read_u64(&mut self, va: VirtAddr) -> Result<u64, Fault> {
        trap::read_u64(va.0).map_err(|c| fault(va, c))
    }

    /// A store below the suite's window (RAM and the kernel's own ranges,
    /// which the suite never maps) is refused as a fault, so this safe
    /// method cannot write kernel memory: from the window up only the
    /// suite's pool is mapped.
    fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault> {
        if va.0 < WINDOW_BASE
            || (va.0 >= crate::mem::CASE_VA && va.0 < crate::mem::CASE_VA + (1 << 30))
        {
            return Err(Fault { va, write: true });
        }
        // SAFETY: from the window up only the suite's pool is mapped.
        unsafe { trap::write_u64(va.0, val) }.map_err(|c| fault(va, c))
    }

    /// Places a `ret` at the physical address `va` maps to (through the
    /// identity map of the pool), calls `va`, and puts the word back. When
    /// the tables map nothing at `va` any more, the `ret` goes to the
    /// frame the last probe of the same page found, so a stale
    /// translation still cached runs that `ret`; a page never probed and
    /// not mapped has no translation a fetch could use, so it faults
    /// without being tried. `None` for a page outside the pool.
    fn exec_faults(&mut self, va: VirtAddr) -> Option<bool> {
        let page = va.0 & !0xfff;
        let pa = match walk_tables(va.0) {
            Some(pa) => {
                self.exec_page = Some((page, pa & !0xfff));
                pa
            }
            None => match self.exec_page {
                Some((p, frame)) if p == page => frame | (va.0 & 0xfff),
                _ => return Some(true),
            },
        };
        let (base, len) = (self.ram.0 .0, self.ram.1);
        if pa < base || pa + 4 > base + len || pa % 4 != 0 {
            return None;
        }
        let word = pa as *mut u32;
        // SAFETY: `pa` lies in the suite's pool, identity-mapped, which
        // nothing but the suite uses; the word is put back below.
        let old = unsafe { word.read_volatile() };
        // SAFETY: as above.
        unsafe { word.write_volatile(RET) };
        // FENCE.I: the stored instruction is what this hart fetches next
        // (unprivileged spec, "Zifencei").
        // SAFETY: an instruction-stream fence only.
        unsafe { asm!("fence.i", options(nostack)) };
        // SAFETY: a `ret` is behind `va` (the frame the tables or the last
        // probe map it to), so a fetch that does not fault returns at once.
        let r = unsafe { trap::exec(va.0) };
        // SAFETY: as above.
        unsafe { word.write_volatile(old) };
        match r {
            Ok(()) => Some(false),
            Err(trap::CAUSE_FETCH_PAGE_FAULT) => Some(true),
            Err(c) => {
                crate::println!("UNEXPECTED trap {c:#x} at the fetch probe (va {:#x})", va.0);
                crate::sbi::shutdown(false)
            }
        }
    }

    fn cycles(&mut self) -> u64 {
        now()
    }

    fn cycle_hz(&self) -> Option<u64> {
        Some(TIMEBASE_HZ)
    }

    fn emulated(&self) -> bool {
        true
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
