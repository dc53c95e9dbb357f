//! The arm64 pieces the kernel uses from `pgtable-arm64`, in one place.

pub use pgtable_arm64::mmu::Arm64Mmu as Mmu;
pub use pgtable_arm64::mmu::Ttbr;
pub use pgtable_arm64::Arm64;

/// The MMU of the kernel's address spaces: global mappings, ASID 0, one
/// root for both TTBRs.
pub const fn new_mmu() -> Mmu {
    Mmu::new()
}

/// An MMU whose `install_root` writes TTBR1_EL1 only (at the root's high
/// half): for an address space that is live for the high canonical half
/// while the kernel keeps running on TTBR0_EL1.
pub const fn high_half_mmu() -> Mmu {
    Mmu::new().installing_into(Ttbr::Ttbr1)
}
