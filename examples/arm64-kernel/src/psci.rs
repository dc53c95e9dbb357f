//! PSCI (Arm DEN 0022, "Power State Coordination Interface") calls and
//! the device-tree facts they need: the conduit (`/psci` `method`,
//! `"hvc"` or `"smc"`) and the CPUs (`/cpus/cpu@N` `reg`, their MPIDR
//! affinity values).
//!
//! QEMU `virt` without firmware emulates PSCI itself and starts every CPU
//! but the first powered off; `CPU_ON` starts one at a physical entry
//! address, at the caller's exception level, with the MMU off and the
//! context id in x0.

use core::arch::asm;

/// PSCI `CPU_ON`, SMC64 (DEN 0022 5.1.4).
const CPU_ON: u64 = 0xc400_0003;
/// PSCI `CPU_OFF` (DEN 0022 5.1.3).
const CPU_OFF: u64 = 0x8400_0002;
/// PSCI `AFFINITY_INFO`, SMC64 (DEN 0022 5.1.5).
const AFFINITY_INFO: u64 = 0xc400_0004;
/// `AFFINITY_INFO`'s answer for a CPU that is off.
pub const AFFINITY_OFF: i64 = 1;

/// The most CPUs the kernel looks for.
pub const MAX_CPUS: usize = 8;

/// How PSCI calls reach the firmware (here QEMU).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Conduit {
    /// `HVC #0`.
    Hvc,
    /// `SMC #0`.
    Smc,
}

/// What the device tree says about the CPUs.
#[derive(Clone, Copy, Debug)]
pub struct Cpus {
    /// The PSCI conduit, if there is a `/psci` node with a `method`.
    pub conduit: Option<Conduit>,
    /// MPIDR affinity values of the `/cpus/cpu@N` nodes, in tree order.
    pub mpidr: [u64; MAX_CPUS],
    /// How many of `mpidr` are valid.
    pub count: usize,
}

const BEGIN_NODE: u32 = 1;
const END_NODE: u32 = 2;
const PROP: u32 = 3;
const NOP: u32 = 4;
const END: u32 = 9;

fn be32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn cstr(b: &[u8]) -> Option<&[u8]> {
    Some(&b[..b.iter().position(|&c| c == 0)?])
}

/// Reads the conduit and the CPUs from the flattened device tree `b`
/// (devicetree spec v0.4, ch. 5). `None` if the tree is malformed.
pub fn from_fdt(b: &[u8]) -> Option<Cpus> {
    let structs = be32(b, 8)? as usize;
    let strings = be32(b, 12)? as usize;
    let mut out = Cpus {
        conduit: None,
        mpidr: [0; MAX_CPUS],
        count: 0,
    };
    let mut off = structs;
    let mut depth = 0u32;
    // Which node we are in: /psci, /cpus, or a /cpus/cpu@N.
    let (mut in_psci, mut in_cpus, mut in_cpu) = (false, false, false);
    let mut cpu_cells = 1usize;
    let (mut reg, mut is_cpu) = (None, false);
    loop {
        let token = be32(b, off)?;
        off += 4;
        match token {
            BEGIN_NODE => {
                let len = b.get(off..)?.iter().position(|&c| c == 0)?;
                let name = &b[off..off + len];
                depth += 1;
                if depth == 2 {
                    in_psci = name == b"psci";
                    in_cpus = name == b"cpus";
                } else if depth == 3 && in_cpus {
                    in_cpu = name.starts_with(b"cpu@");
                    (reg, is_cpu) = (None, false);
                }
                off = (off + len + 1 + 3) & !3;
            }
            END_NODE => {
                if depth == 3 && in_cpu {
                    if let (Some(r), true) = (reg, is_cpu) {
                        if out.count < MAX_CPUS {
                            out.mpidr[out.count] = r;
                            out.count += 1;
                        }
                    }
                    in_cpu = false;
                }
                if depth == 2 {
                    (in_psci, in_cpus) = (false, false);
                }
                depth = depth.checked_sub(1)?;
            }
            PROP => {
                let len = be32(b, off)? as usize;
                let name_off = be32(b, off + 4)? as usize;
                let value = b.get(off + 8..off + 8 + len)?;
                let name = cstr(b.get(strings + name_off..)?)?;
                if depth == 2 && in_psci && name == b"method" {
                    out.conduit = match cstr(value) {
                        Some(b"hvc") => Some(Conduit::Hvc),
                        Some(b"smc") => Some(Conduit::Smc),
                        _ => None,
                    };
                } else if depth == 2 && in_cpus && name == b"#address-cells" {
                    cpu_cells = be32(value, 0)? as usize;
                } else if depth == 3 && in_cpu && name == b"reg" {
                    reg = (0..cpu_cells).try_fold(0u64, |acc, i| {
                        Some(acc << 32 | u64::from(be32(value, i * 4)?))
                    });
                } else if depth == 3 && in_cpu && name == b"device_type" {
                    is_cpu = cstr(value) == Some(b"cpu");
                }
                off = (off + 8 + len + 3) & !3;
            }
            NOP => {}
            END => return Some(out),
            _ => return None,
        }
    }
}

/// A PSCI call with up to three arguments; returns x0.
fn call(conduit: Conduit, fid: u64, a1: u64, a2: u64, a3: u64) -> i64 {
    let ret: u64;
    match conduit {
        // SAFETY: a PSCI call (SMC Calling Convention, DEN 0028): the
        // firmware may clobber x0-x17, declared through the C ABI; it
        // touches no memory of ours.
        Conduit::Hvc => unsafe {
            asm!("hvc #0", inout("x0") fid => ret, in("x1") a1, in("x2") a2, in("x3") a3,
                clobber_abi("C"), options(nostack));
        },
        // SAFETY: as above.
        Conduit::Smc => unsafe {
            asm!("smc #0", inout("x0") fid => ret, in("x1") a1, in("x2") a2, in("x3") a3,
                clobber_abi("C"), options(nostack));
        },
    }
    ret as i64
}

/// `CPU_ON`: starts the CPU with affinity `mpidr` at physical `entry`
/// with `context` in x0. 0 on success, else the PSCI error (-2 invalid
/// parameters, -4 already on, ...).
pub fn cpu_on(conduit: Conduit, mpidr: u64, entry: u64, context: u64) -> i64 {
    call(conduit, CPU_ON, mpidr, entry, context)
}

/// `CPU_OFF`: turns the calling CPU off. Returns only on failure.
pub fn cpu_off(conduit: Conduit) -> i64 {
    call(conduit, CPU_OFF, 0, 0, 0)
}

/// `AFFINITY_INFO` of the CPU `mpidr` (level 0): 0 on, 1 off, 2 on
/// pending, or a PSCI error.
pub fn affinity_info(conduit: Conduit, mpidr: u64) -> i64 {
    call(conduit, AFFINITY_INFO, mpidr, 0, 0)
}
