//! A kernel's own table allocator on the simulator, and user-mode loads
//! and stores, on RISC-V Sv39, Sv48 and Sv57.

use pgtable_riscv::{Sv39, Sv48, Sv57};

pgtable_testkit::kernel_alloc_tests!(riscv_sv39, Sv39);
pgtable_testkit::kernel_alloc_tests!(riscv_sv48, Sv48);
pgtable_testkit::kernel_alloc_tests!(riscv_sv57, Sv57);
