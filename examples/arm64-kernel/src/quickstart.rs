//! The workspace README's arm64 quick start for split halves, verbatim
//! between the `README begin` / `README end` lines (xtask's README test
//! keeps the two copies equal), so the README's example is built with the
//! real `Arm64Mmu` for `aarch64-unknown-none`. The kernel does not call it:
//! it would build a second kernel space beside the running one. What it
//! shows runs elsewhere in this kernel (`kmap::build`: the kernel space in
//! TTBR1_EL1; `user` and `asids`: user spaces with ASIDs in TTBR0_EL1), and
//! the half checks run on the simulator for every format.
#![allow(dead_code)]

use crate::memory::KernelTables;

// README begin
use pgtable_arm64::mmu::Arm64Mmu;
use pgtable_arm64::Arm64;
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};

/// The kernel space in TTBR1_EL1 and two processes in TTBR0_EL1, each with
/// its ASID (`KernelTables` is the kernel's `TableAlloc`, a `Copy` handle).
fn kernel_and_two_processes() -> Result<(), Error> {
    let page = MapOptions::PAGES;
    // The kernel: the upper half, global mappings, installed into TTBR1_EL1.
    let kernel_mmu = Arm64Mmu::new().installing_into(VaRange::Upper);
    let mut kernel = AddressSpace::<Arm64, _, _>::new_kernel(kernel_mmu, KernelTables)?;
    let (kva, kpa) = (VirtAddr(0xffff_0000_0010_0000), PhysAddr(0x4010_0000));
    kernel.map(kva, kpa, 4096, Prot::WRITE | Prot::GLOBAL, page)?;
    // Processes: the lower half; an MMU with an ASID installs into
    // TTBR0_EL1 (`VaRange::Lower`) with the ASID in TTBR0_EL1[63:48].
    // SAFETY: dropped before `kernel`.
    let mut a = unsafe { AddressSpace::new_user(&kernel, Arm64Mmu::with_asid(1), KernelTables)? };
    // SAFETY: dropped before `kernel`.
    let mut b = unsafe { AddressSpace::new_user(&kernel, Arm64Mmu::with_asid(2), KernelTables)? };
    let (va, user) = (VirtAddr(0x40_0000), Prot::WRITE | Prot::USER);
    a.map(va, PhysAddr(0x4020_0000), 4096, user, page)?;
    b.map(va, PhysAddr(0x4030_0000), 4096, user, page)?;
    // An MMU of the wrong half is refused here, not at the first access.
    let wrong = AddressSpace::<Arm64, _, _>::new_kernel(Arm64Mmu::new(), KernelTables);
    assert!(matches!(wrong, Err(Error::MmuHalf { .. })));
    // At boot: `enable_mmu_separate_halves::<Arm64>(a.root(), kernel.root())`
    // (TCR_EL1.T0SZ = T1SZ = 16). A context switch writes TTBR0_EL1 and
    // the ASID, and flushes nothing:
    // SAFETY: `b` stays alive while installed; the kernel half is TTBR1's.
    unsafe { b.install() };
    // SAFETY: as above, for `a`.
    unsafe { a.install() };
    Ok(())
}
// README end
