//! The Supervisor Binary Interface calls the kernel makes (RISC-V SBI
//! specification v2.0): `ECALL` from S-mode with the extension ID in a7,
//! the function ID in a6 and the arguments in a0..a5; the firmware
//! (OpenSBI, QEMU `-bios default`) returns an error code in a0 and a value
//! in a1 (chapter 3, "Binary Encoding").
//!
//! - Base (chapter 4): the spec version and `sbi_probe_extension`.
//! - Console: the Debug Console extension (DBCN, chapter 12) when the
//!   firmware has it, otherwise the legacy `sbi_console_putchar` (chapter
//!   5; QEMU 7.2's OpenSBI 1.1 predates DBCN).
//! - System Reset (SRST, chapter 10): shutdown with "no reason" (success)
//!   or "system failure".
//! - Hart State Management (HSM, chapter 9): `sbi_hart_start`.
//! - RFENCE (chapter 8): `sbi_remote_sfence_vma` and
//!   `sbi_remote_sfence_vma_asid`.

use core::arch::asm;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

const EID_BASE: u64 = 0x10;
const EID_LEGACY_PUTCHAR: u64 = 0x01;
const EID_DBCN: u64 = 0x4442_434e;
const EID_SRST: u64 = 0x5352_5354;
const EID_HSM: u64 = 0x0048_534d;
const EID_RFENCE: u64 = 0x5246_4e43;

/// An SBI error code (chapter 3, table 1), e.g. -2 `SBI_ERR_NOT_SUPPORTED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SbiError(pub i64);

/// One SBI call.
#[inline]
fn call(eid: u64, fid: u64, args: [u64; 5]) -> Result<u64, SbiError> {
    let (err, val): (i64, u64);
    // SAFETY: an ECALL to the SBI firmware, which preserves every register
    // but a0 and a1 (chapter 3); it reads memory only where a call's
    // arguments say (the console buffer), hence no `nomem`.
    unsafe {
        asm!(
            "ecall",
            inlateout("a0") args[0] => err,
            inlateout("a1") args[1] => val,
            in("a2") args[2],
            in("a3") args[3],
            in("a4") args[4],
            in("a6") fid,
            in("a7") eid,
            options(nostack),
        )
    };
    if err == 0 {
        Ok(val)
    } else {
        Err(SbiError(err))
    }
}

/// The SBI specification version: (major, minor).
pub fn spec_version() -> (u64, u64) {
    let v = call(EID_BASE, 0, [0; 5]).unwrap_or(0);
    ((v >> 24) & 0x7f, v & 0xff_ffff)
}

/// Whether the firmware implements extension `eid` (`sbi_probe_extension`).
pub fn has_extension(eid: u64) -> bool {
    matches!(call(EID_BASE, 3, [eid, 0, 0, 0, 0]), Ok(v) if v != 0)
}

/// Whether the firmware has the Debug Console extension (probed once at
/// boot by [`init`]).
static DBCN: AtomicBool = AtomicBool::new(false);

/// Probes the extensions the kernel depends on: returns the console in
/// use and, for HSM, RFENCE and SRST, whether the firmware has each.
pub fn init() -> (&'static str, [(&'static str, bool); 3]) {
    // Relaxed: read by later console writes on the same hart, or on harts
    // started afterwards (the HSM start orders it).
    DBCN.store(has_extension(EID_DBCN), Relaxed);
    let console = if DBCN.load(Relaxed) {
        "SBI debug console (DBCN)"
    } else {
        "legacy sbi_console_putchar"
    };
    (
        console,
        [
            ("HSM", has_extension(EID_HSM)),
            ("RFENCE", has_extension(EID_RFENCE)),
            ("SRST", has_extension(EID_SRST)),
        ],
    )
}

/// Writes `bytes` to the console.
pub fn console_write(bytes: &[u8]) {
    if DBCN.load(Relaxed) {
        let mut rest = bytes;
        while !rest.is_empty() {
            // `sbi_debug_console_write(num_bytes, base_lo, base_hi)` with a
            // physical address: the kernel's addresses are physical (the
            // identity map, mem.rs). It may write fewer bytes than asked.
            match call(
                EID_DBCN,
                0,
                [rest.len() as u64, rest.as_ptr() as u64, 0, 0, 0],
            ) {
                Ok(n) if n > 0 => rest = &rest[(n as usize).min(rest.len())..],
                _ => break,
            }
        }
    } else {
        for &b in bytes {
            let _ = call(EID_LEGACY_PUTCHAR, 0, [u64::from(b), 0, 0, 0, 0]);
        }
    }
}

/// QEMU virt's test finisher ("sifive,test1", at 0x10_0000 in its
/// device tree): a 32-bit store of 0x3333 | code << 16 ends QEMU with
/// exit status `code`.
const VIRT_TEST_FINISHER: u64 = 0x10_0000;

/// Shuts the machine down through SRST (`sbi_system_reset`, type
/// shutdown): reason "no reason" when `success` (QEMU exits with 0),
/// otherwise "system failure".
///
/// OpenSBI passes the reason on to QEMU's test finisher, but as "fail"
/// with code 0, which QEMU 7.2 turns into exit status 0 too. So on
/// failure the kernel first turns translation off (the finisher is not in
/// its tables; the code runs on at the same addresses, which are
/// physical) and writes the finisher itself with code 1: QEMU exits with
/// status 1. SRST follows in case that store did nothing (another
/// machine).
pub fn shutdown(success: bool) -> ! {
    if !success {
        // SAFETY: the kernel's addresses are physical (mem.rs), so the
        // code keeps running with translation off; the store ends QEMU.
        unsafe {
            asm!(
                "csrw satp, zero",
                "sfence.vma x0, x0",
                "sw {v}, 0({a})",
                v = in(reg) 0x1_3333u64,
                a = in(reg) VIRT_TEST_FINISHER,
                options(nostack),
            )
        };
    }
    let reason = if success { 0 } else { 1 };
    let _ = call(EID_SRST, 0, [0, reason, 0, 0, 0]);
    // No SRST (or it returned): the legacy shutdown, then park.
    let _ = call(0x08, 0, [0; 5]);
    loop {
        // SAFETY: waits for an interrupt; none is enabled.
        unsafe { asm!("wfi", options(nomem, nostack)) };
    }
}

/// Starts hart `hartid` at physical address `start` in S-mode with
/// translation off, a0 = `hartid` and a1 = `opaque` (`sbi_hart_start`).
pub fn hart_start(hartid: u64, start: u64, opaque: u64) -> Result<(), SbiError> {
    call(EID_HSM, 0, [hartid, start, opaque, 0, 0]).map(|_| ())
}

/// `sbi_hart_get_status`: 0 started, 1 stopped, 2 start pending, …
pub fn hart_status(hartid: u64) -> Result<u64, SbiError> {
    call(EID_HSM, 2, [hartid, 0, 0, 0, 0])
}

/// Instructs the harts of `mask` (bit i = hart `base + i`; `base`
/// all ones: every hart, SBI "Hart List Parameter") to execute
/// `SFENCE.VMA` for `[start, start + size)` in every address space, or
/// everything when `size` is `u64::MAX` (`sbi_remote_sfence_vma`).
/// OpenSBI returns once every target hart has executed it.
pub fn remote_sfence_vma(mask: u64, base: u64, start: u64, size: u64) -> Result<(), SbiError> {
    call(EID_RFENCE, 1, [mask, base, start, size, 0]).map(|_| ())
}

/// The same for address space `asid` only (`sbi_remote_sfence_vma_asid`:
/// `SFENCE.VMA va, asid` on each target, global mappings excepted).
pub fn remote_sfence_vma_asid(
    mask: u64,
    base: u64,
    start: u64,
    size: u64,
    asid: u16,
) -> Result<(), SbiError> {
    call(EID_RFENCE, 2, [mask, base, start, size, u64::from(asid)]).map(|_| ())
}

/// A console writer for `print!`.
pub struct Console;

impl core::fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        console_write(s.as_bytes());
        Ok(())
    }
}

/// Prints to the SBI console.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => {{
        let _ = core::fmt::Write::write_fmt(&mut $crate::sbi::Console, format_args!($($arg)*));
    }};
}

/// Prints a line to the SBI console.
#[macro_export]
macro_rules! println {
    () => { $crate::print!("\n") };
    ($($arg:tt)*) => {{
        $crate::print!("{}\n", format_args!($($arg)*));
    }};
}

/// Stops the executing hart (`sbi_hart_stop`); returns only on error.
pub fn hart_stop() -> Result<(), SbiError> {
    call(EID_HSM, 1, [0; 5]).map(|_| ())
}
