//! The generic timer's virtual count (CNTVCT_EL0) as the cycle counter.
//!
//! Under QEMU TCG it advances with host time, so it measures emulated
//! execution: report counts and ratios, never absolute times as hardware
//! figures.

use aarch64_cpu::asm::barrier;
use aarch64_cpu::registers::{CNTFRQ_EL0, CNTVCT_EL0};
use tock_registers::interfaces::Readable;

/// The current count. The `isb` keeps the read from being performed
/// before earlier instructions complete (Arm ARM D12.1.2: reads of the
/// counter may be speculated).
#[inline]
pub fn ticks() -> u64 {
    barrier::isb(barrier::SY);
    CNTVCT_EL0.get()
}

/// Counter frequency in Hz.
pub fn frequency() -> u64 {
    CNTFRQ_EL0.get()
}
