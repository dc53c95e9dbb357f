//! `MmuGather`, `unmap_with`, harvesting and the fault-time operations on
//! the simulated machine with the RISC-V formats (Sv39, Sv48, Sv57).
//! The cases are `pgtable_testkit::ops`.

use pgtable_riscv::{RiscvPaging, SVPBMT};

type Sv39 = RiscvPaging<3, SVPBMT>;
type Sv48 = RiscvPaging<4, SVPBMT>;
type Sv57 = RiscvPaging<5, SVPBMT>;

pgtable_testkit::ops_tests!(riscv_sv39, Sv39);
pgtable_testkit::ops_tests!(riscv_sv48, Sv48);
pgtable_testkit::ops_tests!(riscv_sv57, Sv57);
