//! The RISC-V peer (see `benches/riscv_peers.rs` for what it calls and
//! why): page_table_multiarch's engine with a host-built RV64 entry type,
//! for Sv39 and Sv48 ([`subject_sv39`], [`subject_sv48`]).

use core::fmt;

use memory_addr::{PhysAddr, VirtAddr};
use page_table_multiarch::{GenericPTE, MappingFlags, PageTable64, PagingMetaData};
use pgtable_core::contract::Format;
use pgtable_riscv::bits::{pa_of, ppn_bits, PPN_MASK, R, V, X};
use pgtable_riscv::Sv39;

use crate::harness::Subject;
use crate::ptm::{flags_of, prot_of, Handler, Ptm};

/// The metadata of the crate's `Sv39MetaData` (3 levels, 56-bit PA,
/// 39-bit VA) without its `sfence.vma`, which the engine calls only on
/// `target_os = "none"` anyway.
pub struct HostSv39;

impl PagingMetaData for HostSv39 {
    const LEVELS: usize = 3;
    const PA_MAX_BITS: usize = 56;
    const VA_MAX_BITS: usize = 39;
    type VirtAddr = VirtAddr;
    fn flush_tlb(_vaddr: Option<VirtAddr>) {}
}

/// The metadata of the crate's `Sv48MetaData` (4 levels, 56-bit PA,
/// 48-bit VA), as [`HostSv39`].
pub struct HostSv48;

impl PagingMetaData for HostSv48 {
    const LEVELS: usize = 4;
    const PA_MAX_BITS: usize = 56;
    const VA_MAX_BITS: usize = 48;
    type VirtAddr = VirtAddr;
    fn flush_tlb(_vaddr: Option<VirtAddr>) {}
}

/// An RV64 PTE for the engine: the crate's `Rv64PTE` is compiled only for
/// RISC-V targets, so the bench builds the same entry on the host. Its
/// leaves carry pgtable's attribute bits (the same for Sv39, Sv48 and
/// Sv57), converted from `MappingFlags` per call as `Rv64PTE` does.
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Pte(u64);

impl fmt::Debug for Pte {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pte({:#x})", self.0)
    }
}

/// The leaf attributes for `flags`.
#[inline]
fn leaf_attrs(flags: MappingFlags) -> u64 {
    Sv39::leaf_template(prot_of(flags), 0)
}

impl GenericPTE for Pte {
    fn new_page(paddr: PhysAddr, flags: MappingFlags, _is_huge: bool) -> Self {
        Pte(leaf_attrs(flags) | ppn_bits(paddr.as_usize() as u64))
    }
    fn new_table(paddr: PhysAddr) -> Self {
        Pte(Sv39::table_entry(
            pgtable_core::PhysAddr(paddr.as_usize() as u64),
            1,
        ))
    }
    fn paddr(&self) -> PhysAddr {
        PhysAddr::from_usize(pa_of(self.0) as usize)
    }
    fn flags(&self) -> MappingFlags {
        if self.0 & V == 0 {
            return MappingFlags::empty();
        }
        flags_of(Sv39::leaf_prot(self.0, 0))
    }
    fn set_paddr(&mut self, paddr: PhysAddr) {
        self.0 = (self.0 & !PPN_MASK) | ppn_bits(paddr.as_usize() as u64);
    }
    fn set_flags(&mut self, flags: MappingFlags, _is_huge: bool) {
        self.0 = (self.0 & PPN_MASK) | leaf_attrs(flags);
    }
    fn bits(self) -> usize {
        self.0 as usize
    }
    fn is_unused(&self) -> bool {
        self.0 == 0
    }
    fn is_present(&self) -> bool {
        self.0 & V != 0
    }
    /// As `Rv64PTE`: a leaf (R or X set) is "huge" to the engine, which
    /// asks only above the last level.
    fn is_huge(&self) -> bool {
        self.0 & (R | X) != 0
    }
    fn clear(&mut self) {
        self.0 = 0;
    }
}

/// The `page_table_multiarch` subject on Sv39 tables.
pub fn subject_sv39() -> impl Subject {
    Ptm::new(PageTable64::<HostSv39, Pte, Handler>::try_new().unwrap())
}

/// The `page_table_multiarch` subject on Sv48 tables.
pub fn subject_sv48() -> impl Subject {
    Ptm::new(PageTable64::<HostSv48, Pte, Handler>::try_new().unwrap())
}
