//! The arm64 pieces the kernel uses from `pgtable-arm64`, in one place.

pub use pgtable_arm64::mmu::Arm64Mmu as Mmu;
pub use pgtable_arm64::mmu::Ttbr;
pub use pgtable_arm64::Arm64;

/// The MMU of the kernel's own address space: global mappings, ASID 0,
/// `install_root` writes TTBR1_EL1 only (at the root's upper half), so the
/// space translates the upper half, where the kernel lives.
pub const fn kernel_mmu() -> Mmu {
    Mmu::new().installing_into(Ttbr::Ttbr1)
}

/// The MMU of the lower-half spaces (the suite's test space, user spaces,
/// the benchmarks' spaces): ASID 0, `install_root` writes TTBR0_EL1 only,
/// so installing one never touches the kernel's upper half.
pub const fn lower_mmu() -> Mmu {
    Mmu::new().installing_into(Ttbr::Ttbr0)
}
