//! Arm semihosting (Arm "Semihosting for AArch32 and AArch64", v2): the
//! call is `hlt #0xf000` with the operation in `w0` and a parameter-block
//! pointer in `x1`. QEMU answers it when started with `-semihosting`.

use core::arch::asm;

/// SYS_EXIT.
const SYS_EXIT: u64 = 0x18;
/// SYS_GET_CMDLINE.
const SYS_GET_CMDLINE: u64 = 0x15;
/// ADP_Stopped_ApplicationExit: with a subcode, QEMU exits with it.
const ADP_STOPPED_APPLICATION_EXIT: u64 = 0x20026;

/// Exit code of a run whose suite passed.
pub const EXIT_SUCCESS: u32 = 33;
/// Exit code of a failed run.
pub const EXIT_FAILURE: u32 = 35;

/// Makes the semihosting call `op` with the parameter block at `param`.
///
/// # Safety
///
/// `param` is a live parameter block of the layout `op` defines, and every
/// buffer it names is valid for what `op` does with it (SYS_GET_CMDLINE
/// writes its buffer).
unsafe fn call(op: u64, param: u64) -> u64 {
    let ret;
    // SAFETY: the semihosting trap reads the parameter block at `param`
    // and writes only what the operation documents, into buffers our
    // caller vouches for; it touches no other guest state but x0.
    unsafe {
        asm!("hlt #0xf000", inout("x0") op => ret, in("x1") param, options(nostack));
    }
    ret
}

/// Ends the run: QEMU exits with `code`.
pub fn exit(code: u32) -> ! {
    let block = [ADP_STOPPED_APPLICATION_EXIT, u64::from(code)];
    // SAFETY: `block` is SYS_EXIT's two-word block, live for the call.
    unsafe { call(SYS_EXIT, block.as_ptr() as u64) };
    // Without `-semihosting` the trap is an undefined instruction or a
    // no-op; stop here either way.
    loop {
        aarch64_cpu::asm::wfe();
    }
}

/// The command line QEMU holds for the guest (`-append`, after the kernel
/// file name), copied into `buf`; the length, or `None` if it failed.
pub fn cmdline(buf: &mut [u8]) -> Option<usize> {
    let mut block = [buf.as_mut_ptr() as u64, buf.len() as u64];
    // The call writes the string into `buf` and its length into block[1]
    // (the asm is not `nomem`, so the compiler reloads both afterwards).
    // SAFETY: `block` is SYS_GET_CMDLINE's block: `buf`, writable for
    // its whole length, and that length.
    let ok = unsafe { call(SYS_GET_CMDLINE, block.as_mut_ptr() as u64) } == 0;
    let len = block[1] as usize;
    (ok && len <= buf.len()).then_some(len)
}
