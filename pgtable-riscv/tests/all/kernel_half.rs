//! The kernel half on RISC-V: one root translates both halves (as on
//! x86), so user roots copy the kernel's root entries 256–511, which link
//! tables the kernel preallocated and never frees while it lives.
//!
//! pgtable-core's `table_attributes_guard_the_halves`,
//! `table_attributes_keep_the_table_decodable` and
//! `a_kernel_half_needs_the_upper_half` (which checks the kernel tables'
//! no-user attribute) are not run: a non-leaf
//! RISC-V PTE has no permission bits (U, A and D are reserved in it), so
//! the tables cannot restrict the leaves below them; the leaves' own U bit
//! does. Sv39 has three levels with one root, whose root entries (1 GiB
//! each) may be moved whole, so pgtable-core refuses to share its kernel
//! half, as for every 3-level one-root format.

use pgtable_testkit::kernel_half;

use pgtable_core::sim::SimMachine;
use pgtable_core::{AddressSpace, Error, VaRange};
use pgtable_riscv::{Sv39, Sv48, Sv57};

#[test]
fn sv39_refuses_to_share_a_kernel_half() {
    let m = SimMachine::<Sv39>::new();
    let mut k = AddressSpace::<Sv39, _, _>::new_in(VaRange::Both, m.mmu(), m.alloc()).unwrap();
    assert_eq!(k.share_kernel_half(), Err(Error::KernelHalf));
    assert!(!k.inspect().is_kernel_half_shared());
}

#[test]
fn three_user_spaces_share_the_kernel_half_sv48() {
    kernel_half::three_user_spaces_share_the_kernel_half::<Sv48>();
}

#[test]
fn three_user_spaces_share_the_kernel_half_sv57() {
    kernel_half::three_user_spaces_share_the_kernel_half::<Sv57>();
}

#[test]
fn a_space_refuses_an_mmu_of_another_half() {
    kernel_half::a_space_refuses_an_mmu_of_another_half::<Sv39>();
    kernel_half::a_space_refuses_an_mmu_of_another_half::<Sv48>();
    kernel_half::a_space_refuses_an_mmu_of_another_half::<Sv57>();
}
