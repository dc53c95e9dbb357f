//! The conformance suite's [`Machine`] on this kernel: loads, stores and
//! instruction fetches go through the real (KVM) or emulated (TCG) MMU
//! with the live tables; page faults come back as values through the
//! probes of [`crate::trap`].

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_core::suite::{Fault, Machine};
use pgtable_core::{PhysAddr, VirtAddr};
use pgtable_x86::X86Mmu;
use x86_64::registers::control::Cr3;

use crate::mem::{phys_to_virt, KERNEL_VMA, LINEAR_BASE, LINEAR_MAX};
use crate::trap;
use crate::tsc::{self, Tsc};

/// Base of the virtual window the suite maps into: 64 GiB, in the lower
/// half, which the kernel leaves empty (PML4 entry 0, PDPT entries
/// 64..80). Its `last_entries_of_the_*` cases also map the last pages of
/// each half of the address space and the pages below the middle of each
/// half (with 5-level paging far above 2^47): the kernel's own mappings
/// (the linear map and the image, [`crate::mem`]) leave those free too —
/// the image ends below the last GiB.
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
    /// The last page [`Machine::exec_faults`] probed and the frame it
    /// mapped then: `(va page, pa page)`.
    pub exec_page: Option<(u64, u64)>,
}

/// The `ret` instruction (near return, opcode C3).
const RET: u8 = 0xc3;

/// Page-fault error code bit 3: a reserved bit was set in an entry
/// (Intel SDM vol. 3 §4.7).
const PF_RSVD: u64 = 1 << 3;
/// Page-fault error code bit 4: the access was an instruction fetch
/// (reported with IA32_EFER.NXE = 1, §4.7).
const PF_FETCH: u64 = 1 << 4;

/// The physical address `va` maps to in the installed tables (a software
/// walk from CR3 with the SDM's bit layout: P = bit 0, PS = bit 7 in PDPTEs
/// and PDEs, address bits 51:12), or `None` if it maps nothing. Only says
/// where a `ret` must go; whether the fetch faults is the MMU's call.
fn walk_tables(va: u64) -> Option<u64> {
    const ADDR: u64 = 0x000f_ffff_ffff_f000;
    let levels = if X86Mmu::la57_enabled() { 5 } else { 4 };
    let mut table = Cr3::read_raw().0.start_address().as_u64();
    for height in (0..levels).rev() {
        let shift = 12 + 9 * height;
        let slot = phys_to_virt(table + ((va >> shift) & 511) * 8) as *const AtomicU64;
        // SAFETY: table frames are RAM, which the linear map covers, and each
        // entry is an aligned u64 (the processor may update its A/D bits
        // atomically, hence the atomic load; Relaxed: a snapshot suffices).
        let entry = unsafe { (*slot).load(Relaxed) };
        if entry & 1 == 0 {
            return None;
        }
        if height == 0 || (height <= 2 && entry & (1 << 7) != 0) {
            let mask = (1u64 << shift) - 1;
            return Some((entry & ADDR & !mask) | (va & mask));
        }
        table = entry & ADDR;
    }
    None
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

    /// A store below the suite's window or into the kernel's own ranges
    /// (the linear map and the image; the suite makes neither) is refused
    /// as a fault, so this safe method cannot write kernel memory: the
    /// suite maps only its RAM pool everywhere else (the window and the
    /// pages at the last entries of each half).
    fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault> {
        let kernel = (LINEAR_BASE..LINEAR_BASE + LINEAR_MAX).contains(&va.0)
            || (KERNEL_VMA..KERNEL_VMA + (1 << 30)).contains(&va.0);
        if va.0 < WINDOW_BASE || kernel {
            return Err(Fault { va, write: true });
        }
        // SAFETY: outside the kernel's ranges and from the window up only
        // the suite's RAM pool is mapped.
        unsafe { trap::write_u64(va.0, val) }.map_err(fault)
    }

    /// Places a `ret` at the physical address `va` maps to (through the
    /// kernel's linear map of the pool), calls `va`, and puts the byte
    /// back: the MMU decides whether the fetch faults. When the tables map
    /// nothing at `va` any more, the `ret` goes to the frame the last probe
    /// of the same page found, so a stale translation the TLB still holds
    /// runs that `ret` instead of whatever the frame held; a page the
    /// tables do not map and no probe fetched from has no translation a
    /// fetch could use, so it faults without being tried. `None` (cannot
    /// test) for a page outside the RAM pool.
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
        if pa < base || pa >= base + len {
            return None;
        }
        let byte = phys_to_virt(pa) as *mut u8;
        // SAFETY: `pa` lies in the suite's RAM pool, which the kernel's
        // linear map covers and nothing but the suite uses; the byte is
        // put back below.
        let old = unsafe { byte.read_volatile() };
        // SAFETY: as above.
        unsafe { byte.write_volatile(RET) };
        // The probe's call is the jump that makes the stored byte the
        // instruction fetched next (SDM vol. 3A, "Handling Self- and
        // Cross-Modifying Code", option 1).
        // SAFETY: a `ret` is behind `va` (the frame the tables or the last
        // probe map it to), so a fetch that does not fault returns at once.
        let r = unsafe { trap::exec(va.0) };
        // SAFETY: as above.
        unsafe { byte.write_volatile(old) };
        match r {
            Ok(()) => Some(false),
            Err(f) if f.cr2 == va.0 && f.error & (PF_FETCH | PF_RSVD) == PF_FETCH => Some(true),
            Err(f) => {
                // Not the execute-never or not-present fault of a fetch
                // (a reserved-bit fault means XD without EFER.NXE): no
                // answer the suite could judge.
                crate::println!(
                    "UNEXPECTED page fault at the fetch probe: CR2={:#x} error={:#x} (va {:#x})",
                    f.cr2,
                    f.error,
                    va.0
                );
                crate::exit(false)
            }
        }
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
