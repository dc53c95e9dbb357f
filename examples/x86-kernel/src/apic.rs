//! The local APIC in xAPIC mode (Intel SDM vol. 3A ch. 11 "Advanced
//! Programmable Interrupt Controller (APIC)"): its registers are 4 KiB of
//! memory-mapped I/O at the physical address in IA32_APIC_BASE (0xfee0_0000
//! after reset, §11.4.4), which the kernel maps once, as uncacheable device
//! memory, at its linear-map address ([`crate::mem::phys_to_virt`]; the
//! linear map proper covers only the GiBs that hold RAM). Every CPU sees
//! its own APIC at the same address.
//!
//! xAPIC rather than x2APIC: QEMU's TCG CPU model `max` of the 5-level run
//! has no x2APIC in QEMU 7.2, and KVM starts every vCPU in xAPIC mode, so
//! one path serves both runs.

use core::sync::atomic::{AtomicU64, Ordering};

use pgtable_core::contract::{Arch, PAGE_SIZE};
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86Mmu;

use crate::mem::{phys_to_virt, Frames};
use crate::tsc;

/// IA32_APIC_BASE MSR (§11.4.4): bits 35:12 the base, bit 11 the global
/// enable, bit 8 BSP.
const IA32_APIC_BASE: u32 = 0x1b;

/// Register offsets (§11.4.1, table 11-1).
const REG_ID: usize = 0x20;
const REG_EOI: usize = 0xb0;
const REG_SVR: usize = 0xf0;
const REG_ESR: usize = 0x280;
const REG_ICR_LO: usize = 0x300;
const REG_ICR_HI: usize = 0x310;

/// ICR bit 12: delivery status (1 = send pending, §11.6.1).
const ICR_PENDING: u32 = 1 << 12;
/// ICR bit 14: level assert (required for INIT assert and every
/// non-INIT delivery mode).
const ICR_ASSERT: u32 = 1 << 14;
/// ICR delivery mode INIT (101b, bits 10:8).
const ICR_INIT: u32 = 0b101 << 8;
/// ICR delivery mode Start-Up (110b).
const ICR_STARTUP: u32 = 0b110 << 8;

/// SVR bit 8: APIC software enable (§11.4.7.2); bits 7:0 the spurious
/// vector.
const SVR_ENABLE: u32 = 1 << 8;
/// The spurious-interrupt vector (the IDT's default gate ignores it).
const SPURIOUS_VECTOR: u32 = 0xff;

/// Virtual address of the register page (0: not mapped yet). Relaxed
/// loads suffice: it is stored once before any AP starts, and starting an
/// AP (the ICR write) orders it for the AP.
static BASE: AtomicU64 = AtomicU64::new(0);

/// Maps the BSP's APIC page (uncacheable, read-write, global, not
/// executable) into `space`, the kernel's address space, and remembers
/// where. Returns its physical address.
pub fn map<A: Arch>(
    space: &mut AddressSpace<A, X86Mmu, Frames>,
) -> Result<u64, pgtable_core::Error> {
    // SAFETY: reading IA32_APIC_BASE has no side effect; every x86-64 CPU
    // has it.
    let msr = unsafe { x86_64::registers::model_specific::Msr::new(IA32_APIC_BASE).read() };
    let pa = msr & 0x000f_ffff_ffff_f000;
    let va = phys_to_virt(pa);
    space.map(
        VirtAddr(va),
        PhysAddr(pa),
        PAGE_SIZE,
        Prot::WRITE | Prot::GLOBAL.with_mem(MemType::Device),
        MapOptions::PAGES,
    )?;
    BASE.store(va, Ordering::Relaxed);
    Ok(pa)
}

fn reg(off: usize) -> *mut u32 {
    (BASE.load(Ordering::Relaxed) as usize + off) as *mut u32
}

fn read(off: usize) -> u32 {
    // SAFETY: `map` mapped the APIC page before anyone calls this; the
    // register is an aligned 32-bit MMIO word.
    unsafe { reg(off).read_volatile() }
}

fn write(off: usize, v: u32) {
    // SAFETY: as in `read`.
    unsafe { reg(off).write_volatile(v) }
}

/// The executing CPU's APIC ID (bits 31:24 of the ID register in xAPIC
/// mode, §11.4.6).
pub fn id() -> u32 {
    read(REG_ID) >> 24
}

/// Software-enables the executing CPU's APIC with the spurious vector.
pub fn enable() {
    write(REG_SVR, SVR_ENABLE | SPURIOUS_VECTOR);
    // Writing ESR arms it; the read clears it (§11.5.3).
    write(REG_ESR, 0);
    let _ = read(REG_ESR);
}

/// Signals end of interrupt for the one being handled (§11.8.5).
pub fn eoi() {
    write(REG_EOI, 0);
}

/// Writes the ICR (high word first: the low-word write sends) and waits
/// until the APIC has accepted it (delivery status idle).
fn send(dest: u32, lo: u32) {
    write(REG_ICR_HI, dest << 24);
    write(REG_ICR_LO, lo);
    while read(REG_ICR_LO) & ICR_PENDING != 0 {
        core::hint::spin_loop();
    }
}

/// Sends the fixed interrupt `vector` to the CPU with APIC ID `dest`.
pub fn send_ipi(dest: u32, vector: u8) {
    send(dest, ICR_ASSERT | u32::from(vector));
}

/// Busy-waits `us` microseconds on the TSC.
fn delay_us(hz: u64, us: u64) {
    let end = tsc::now() + hz / 1_000_000 * us;
    while tsc::now() < end {
        core::hint::spin_loop();
    }
}

/// INIT-SIPI-SIPI to the CPU with APIC ID `dest` (SDM vol. 3A §9.4.4.1
/// "Typical BSP Initialization Sequence"): an INIT, 10 ms, then two
/// Start-Up IPIs 200 µs apart with `page` (the trampoline's page number:
/// the AP starts in real mode at CS:IP = page << 8 : 0). A second SIPI to
/// a CPU that already left wait-for-SIPI is ignored.
pub fn start_ap(dest: u32, page: u8, tsc_hz: u64) {
    send(dest, ICR_INIT | ICR_ASSERT);
    delay_us(tsc_hz, 10_000);
    for _ in 0..2 {
        send(dest, ICR_STARTUP | ICR_ASSERT | u32::from(page));
        delay_us(tsc_hz, 200);
    }
}
