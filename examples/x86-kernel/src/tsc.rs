//! The time-stamp counter: reading it and finding its frequency.
//!
//! Frequency sources, best first: CPUID leaf 0x15 (TSC/crystal ratio and
//! crystal frequency, Intel SDM vol. 3 §18.7.3), the hypervisor timing leaf
//! 0x40000010 (EAX = TSC kHz; QEMU/KVM and VMware expose it), otherwise a
//! calibration against PIT channel 2 (1.193182 MHz).

use core::arch::x86_64::{__cpuid, __cpuid_count, _rdtsc};

use x86_64::instructions::port::Port;

/// Where the frequency came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// CPUID leaf 0x15.
    Cpuid15,
    /// Hypervisor leaf 0x40000010.
    Hypervisor,
    /// Calibrated against the PIT.
    Pit,
}

/// The TSC frequency.
#[derive(Clone, Copy, Debug)]
pub struct Tsc {
    /// Ticks per second.
    pub hz: u64,
    /// Where it came from.
    pub source: Source,
}

/// Reads the TSC, ordered after earlier instructions (`lfence; rdtsc`).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: LFENCE and RDTSC exist on every x86_64 CPU and only read state.
    unsafe {
        // LFENCE: earlier instructions complete before the TSC is read.
        core::arch::x86_64::_mm_lfence();
        _rdtsc()
    }
}

/// Whether CPUID reports a hypervisor (CPUID.1:ECX[31]): only then do the
/// hypervisor leaves from 0x40000000 mean anything.
pub fn under_hypervisor() -> bool {
    __cpuid(1).ecx & (1 << 31) != 0
}

impl Tsc {
    /// Finds the frequency.
    pub fn detect() -> Tsc {
        let max = __cpuid(0).eax;
        if max >= 0x15 {
            let l = __cpuid_count(0x15, 0);
            if l.eax != 0 && l.ebx != 0 && l.ecx != 0 {
                return Tsc {
                    hz: l.ecx as u64 * l.ebx as u64 / l.eax as u64,
                    source: Source::Cpuid15,
                };
            }
        }
        if under_hypervisor() {
            let top = __cpuid(0x4000_0000).eax;
            if top >= 0x4000_0010 {
                let khz = __cpuid(0x4000_0010).eax;
                if khz != 0 {
                    return Tsc {
                        hz: khz as u64 * 1000,
                        source: Source::Hypervisor,
                    };
                }
            }
        }
        Tsc {
            hz: pit_calibrate(),
            source: Source::Pit,
        }
    }

    /// Ticks to nanoseconds.
    pub fn ns(&self, ticks: u64) -> u64 {
        (ticks as u128 * 1_000_000_000 / self.hz as u128) as u64
    }
}

/// Counts TSC ticks over 50 ms of PIT channel 2 (mode 0, gate on, speaker
/// off); best of three.
fn pit_calibrate() -> u64 {
    const PIT_HZ: u64 = 1_193_182;
    const COUNT: u16 = 59_659; // 50 ms
    let mut best = u64::MAX;
    for _ in 0..3 {
        let mut p61 = Port::<u8>::new(0x61);
        let mut cmd = Port::<u8>::new(0x43);
        let mut ch2 = Port::<u8>::new(0x42);
        // SAFETY: the PIT and port 0x61 belong to this kernel; programming
        // channel 2 only affects the (disconnected) speaker.
        let ticks = unsafe {
            let v = p61.read();
            p61.write((v & !0x02) | 0x01); // gate 2 on, speaker off
            cmd.write(0b1011_0000); // channel 2, lobyte/hibyte, mode 0, binary
            ch2.write(COUNT as u8);
            ch2.write((COUNT >> 8) as u8);
            let t0 = now();
            while p61.read() & 0x20 == 0 {
                core::hint::spin_loop();
            }
            now() - t0
        };
        best = best.min(ticks);
    }
    best * PIT_HZ / COUNT as u64
}
