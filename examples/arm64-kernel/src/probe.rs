//! Memory accesses whose faults come back as values.
//!
//! The load and the store are single instructions at known labels in
//! `boot.rs`; a data abort taken at one of them resumes at the probe's
//! fixup with the syndrome, so the hardware MMU (not a software walk) is
//! the judge of what is mapped and writable. The exec probe calls a `RET`
//! placed at the target address; an instruction abort there returns to
//! the probe the same way, so the MMU also judges execute permission.

use core::arch::asm;

use crate::memory::phys_to_virt;

/// An abort caught at a probe (a data abort, or an instruction abort at
/// the exec probe).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Fault {
    /// ESR_EL1 (exception syndrome).
    pub esr: u64,
    /// FAR_EL1 (the faulting virtual address).
    pub far: u64,
}

/// ESR_EL1.EC of an instruction abort from EL0.
pub const EC_IABT_LOWER: u64 = 0x20;
/// ESR_EL1.EC of an instruction abort taken without a change of EL.
pub const EC_IABT_CUR: u64 = 0x21;
/// ESR_EL1.EC of a data abort from EL0.
pub const EC_DABT_LOWER: u64 = 0x24;
/// ESR_EL1.EC of a data abort taken without a change of EL.
pub const EC_DABT_CUR: u64 = 0x25;
/// ESR_EL1.EC of an `SVC` from AArch64.
pub const EC_SVC64: u64 = 0x15;

/// ESR_EL1.EC (bits 31:26, Arm ARM D19.2.40): the exception class.
pub const fn esr_class(esr: u64) -> u64 {
    (esr >> 26) & 0x3f
}

/// Whether the fault status code of an abort syndrome (DFSC/IFSC, bits
/// 5:0) is a permission fault (0b0011xx, any level): the translation
/// exists but does not allow the access.
pub const fn is_permission_fault(esr: u64) -> bool {
    esr & 0x3c == 0x0c
}

/// Whether ESR_EL1 of a Data or Instruction Abort reports a translation
/// fault at any level: DFSC/IFSC 0b0001LL for levels 0 to 3, and 0b101011
/// for level -1, which the 5-level FEAT_LPA2 walks (4 KiB pages, 52-bit
/// VAs) report once an unmap freed every table under a root entry (Arm
/// ARM D24.2 "ESR_EL1", ISS encoding for a Data Abort; Linux
/// `esr_fsc_is_translation_fault`).
pub const fn is_translation_fault(esr: u64) -> bool {
    esr & 0x3c == 0x04 || esr & 0x3f == 0b10_1011
}

impl Fault {
    /// ESR_EL1.ISS.WnR (bit 6, Arm ARM D19.2.40): the abort was caused by a
    /// write.
    pub fn is_write(&self) -> bool {
        self.esr & (1 << 6) != 0
    }

    /// ESR_EL1.EC.
    pub fn class(&self) -> u64 {
        esr_class(self.esr)
    }

    /// A permission fault (see [`is_permission_fault`]).
    pub fn is_permission(&self) -> bool {
        is_permission_fault(self.esr)
    }
}

/// Loads the 64-bit word at `va`, or returns the fault the load raised.
#[inline]
pub fn read_u64(va: u64) -> Result<u64, Fault> {
    let (value, esr, far): (u64, u64, u64);
    // SAFETY: `pgk_probe_load` is a leaf function under the C ABI (declared
    // clobbered) whose only memory access is the probed load; a fault there
    // is turned into a return with x1 = ESR, so an unmapped `va` does not
    // crash. The load cannot alias Rust-owned memory in a way the compiler
    // relies on: the asm is not `nomem`, so it is treated as reading memory.
    unsafe {
        asm!(
            "bl pgk_probe_load",
            inout("x0") va => value,
            out("x1") esr,
            out("x2") far,
            clobber_abi("C"),
        );
    }
    if esr == 0 {
        Ok(value)
    } else {
        Err(Fault { esr, far })
    }
}

/// Stores `value` to the 64-bit word at `va`, or returns the fault the
/// store raised.
///
/// # Safety
///
/// A fault is caught, but a store that succeeds is a real store: `va` must
/// map nothing, or only memory no Rust object lives in (the RAM pool the
/// kernel hands to the suite and the benchmarks).
#[inline]
pub unsafe fn write_u64(va: u64, value: u64) -> Result<(), Fault> {
    let (esr, far): (u64, u64);
    // SAFETY: as `read_u64`; the store goes to `va`, which maps only pool
    // memory or faults (our caller's promise).
    unsafe {
        asm!(
            "bl pgk_probe_store",
            in("x0") va,
            inout("x1") value => esr,
            out("x2") far,
            clobber_abi("C"),
        );
    }
    if esr == 0 {
        Ok(())
    } else {
        Err(Fault { esr, far })
    }
}

/// The A64 `RET` instruction (return to x30).
pub const RET: u32 = 0xd65f_03c0;

/// The physical address `va` translates to for a kernel read (`AT S1E1R`),
/// or `None` if the translation faults.
pub fn translate(va: u64) -> Option<u64> {
    let par: u64;
    // SAFETY: address translation only writes PAR_EL1; the `isb` makes the
    // result visible to the following read (Arm ARM D8.7 "AT instructions").
    unsafe {
        asm!(
            "at s1e1r, {va}",
            "isb",
            "mrs {par}, par_el1",
            va = in(reg) va,
            par = out(reg) par,
            options(nostack, preserves_flags),
        );
    }
    // PAR_EL1.F (bit 0) set: the translation failed; else PA[47:12] in the
    // same bits.
    (par & 1 == 0).then_some((par & 0x0000_ffff_ffff_f000) | (va & 0xfff))
}

/// Makes the instruction at `alias` (an address whose word was just
/// stored) visible to instruction fetches (Arm ARM B2.4.4: clean the data
/// cache to the point of unification, invalidate the instruction cache,
/// then synchronise the context).
pub fn sync_icache(alias: u64) {
    // SAFETY: cache maintenance by VA on a mapped, readable address has no
    // effect on memory contents.
    unsafe {
        asm!(
            "dc cvau, {a}",
            "dsb ish",
            "ic ivau, {a}",
            "dsb ish",
            "isb",
            a = in(reg) alias,
            options(nostack, preserves_flags),
        );
    }
}

/// Calls the `RET` at `va` through the exec probe: `Ok` if it ran, or the
/// instruction abort the fetch raised.
///
/// # Safety
///
/// `va` holds a `RET` instruction, visible to instruction fetches (or the
/// fetch faults): whatever is there runs if the MMU allows it.
pub unsafe fn call_ret(va: u64) -> Result<(), Fault> {
    let (esr, far): (u64, u64);
    // SAFETY: `va` holds a RET (our caller's promise), or the fetch faults
    // and the vectors turn the abort into a return with x1 = ESR; the probe
    // preserves the stack and returns to us. Everything the C ABI allows
    // it to clobber is declared.
    unsafe {
        asm!(
            "bl pgk_probe_exec",
            in("x0") va,
            out("x1") esr,
            out("x2") far,
            clobber_abi("C"),
        );
    }
    if esr == 0 {
        Ok(())
    } else {
        Err(Fault { esr, far })
    }
}

/// Whether an instruction fetch from `va` (4-byte aligned) faults, judged by
/// the MMU: a `RET` is placed at the physical page behind `va` through the
/// kernel's linear map and called through `va`; the original word is put
/// back afterwards. `None` if `va` does not translate to RAM the kernel
/// maps writable (nothing is executed then).
///
/// # Safety
///
/// `va` maps nothing, or only memory no Rust object lives in (the pool, a
/// user page; see [`write_u64`]): the word behind it is overwritten for
/// the duration of the probe.
pub unsafe fn exec_faults(va: u64) -> Option<Result<(), Fault>> {
    let Some(pa) = translate(va) else {
        // Not even readable: a fetch would fault with a translation fault.
        return Some(Err(Fault { esr: 0, far: va }));
    };
    let word = phys_to_virt(pa & !7);
    let shift = (pa & 4) * 8;
    let old = read_u64(word).ok()?;
    let patched = (old & !(0xffff_ffff << shift)) | (u64::from(RET) << shift);
    // SAFETY: `word` is the linear alias of the memory `va` maps, which
    // holds no Rust object (our caller's promise).
    unsafe { write_u64(word, patched) }.ok()?;
    sync_icache(word);
    // SAFETY: `va` maps the RET just stored.
    let r = unsafe { call_ret(va) };
    // SAFETY: as above; the word gets its old value back.
    unsafe { write_u64(word, old) }.ok()?;
    sync_icache(word);
    Some(r)
}
