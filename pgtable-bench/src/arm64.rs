//! The arm64 peers (see `benches/arm64_peers.rs` for what each calls and
//! why): [`Aarch64Paging`] and [`ptm::subject`].

use std::cell::Cell;
use std::ptr::NonNull;
use std::rc::Rc;

use aarch64_paging::descriptor::{El1Attributes as Attr, PhysicalAddress, UpdatableDescriptor};
use aarch64_paging::paging::{Constraints, El1And0, MemoryRegion, PageTable, Translation, VaRange};
use aarch64_paging::Mapping;
use pgtable_arm64::Arm64;
use pgtable_core::contract::Format;
use pgtable_core::Prot;

use crate::harness::{Subject, PA, PAGE};

/// Table frames on a free list, zeroed when handed out (as every subject
/// zeroes its new tables inside the timed map: see the harness docs); a
/// frame's "physical" address is its host address.
pub struct Pool {
    free: Vec<NonNull<PageTable<Attr>>>,
    all: Vec<NonNull<PageTable<Attr>>>,
    /// Frames handed out and not returned (shared with the subject, which
    /// cannot reach the pool inside its `Mapping`).
    live: Rc<Cell<usize>>,
}

const LAYOUT: std::alloc::Layout = std::alloc::Layout::new::<PageTable<Attr>>();

impl Translation<Attr> for Pool {
    fn allocate_table(&mut self) -> (NonNull<PageTable<Attr>>, PhysicalAddress) {
        let t = match self.free.pop() {
            Some(t) => {
                // SAFETY: a frame of ours that nothing uses (it was freed);
                // the crate expects a zeroed table.
                unsafe { t.as_ptr().cast::<u8>().write_bytes(0, LAYOUT.size()) };
                t
            }
            None => {
                // SAFETY: `LAYOUT` (4 KiB) has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(LAYOUT) };
                let t = NonNull::new(p.cast()).expect("out of host memory");
                self.all.push(t);
                t
            }
        };
        self.live.set(self.live.get() + 1);
        (t, PhysicalAddress(t.as_ptr() as usize))
    }

    unsafe fn deallocate_table(&mut self, t: NonNull<PageTable<Attr>>) {
        self.live.set(self.live.get() - 1);
        self.free.push(t);
    }

    fn physical_to_virtual(&self, pa: PhysicalAddress) -> NonNull<PageTable<Attr>> {
        NonNull::new(pa.0 as *mut PageTable<Attr>).expect("table at 0")
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for t in self.all.drain(..) {
            // SAFETY: every frame came from `alloc_zeroed(LAYOUT)`; the
            // mapping that used them is gone (it is dropped first).
            unsafe { std::alloc::dealloc(t.as_ptr().cast(), LAYOUT) };
        }
    }
}

/// pgtable's kernel read-write leaf attributes (the block form: the crate
/// adds the page bit at level 3 itself).
fn rw() -> Attr {
    Attr::from_bits_retain(Arm64::leaf_template(Prot::READ_WRITE, 1) as usize)
}

/// The aarch64-paging subject: a `Mapping<_, El1And0>` (the type under
/// `IdMap`, used directly because it takes an explicit PA), root level 0,
/// never activated.
pub struct Aarch64Paging(Mapping<Pool, El1And0>, Rc<Cell<usize>>);

impl Default for Aarch64Paging {
    fn default() -> Aarch64Paging {
        let live = Rc::new(Cell::new(0));
        let pool = Pool {
            free: Vec::new(),
            all: Vec::new(),
            live: live.clone(),
        };
        let m = Mapping::with_asid_and_va_range(pool, 1, 0, El1And0, VaRange::Lower);
        Aarch64Paging(m, live)
    }
}

impl Aarch64Paging {
    fn region(va: u64, len: u64) -> MemoryRegion {
        MemoryRegion::new(va as usize, (va + len) as usize)
    }

    fn map(&mut self, va: u64, len: u64, constraints: Constraints) {
        self.0
            .map_range(
                &Self::region(va, len),
                PhysicalAddress(PA as usize),
                rw(),
                constraints,
            )
            .unwrap();
    }
}

impl Subject for Aarch64Paging {
    fn map_pages(&mut self, va: u64, len: u64) {
        self.map(
            va,
            len,
            Constraints::NO_BLOCK_MAPPINGS | Constraints::NO_CONTIGUOUS_HINT,
        );
    }
    fn map_blocks(&mut self, va: u64, len: u64) {
        self.map(va, len, Constraints::NO_CONTIGUOUS_HINT);
    }
    /// RW <-> RO as pgtable does it: AP\[2\] (READ_ONLY) and DBM swap.
    fn protect(&mut self, va: u64, len: u64, writable: bool) {
        let (set, clear) = if writable {
            (Attr::DBM, Attr::READ_ONLY)
        } else {
            (Attr::READ_ONLY, Attr::DBM)
        };
        let f = |_: &MemoryRegion, d: &mut UpdatableDescriptor<Attr>| {
            if d.flags().contains(Attr::VALID) {
                d.modify_flags(set, clear)
            } else {
                Ok(())
            }
        };
        self.0.modify_range(&Self::region(va, len), &f).unwrap();
    }
    /// `map_range` with invalid attributes: frees the subtables.
    fn unmap_pages(&mut self, va: u64, len: u64) {
        self.0
            .map_range(
                &Self::region(va, len),
                PhysicalAddress(0),
                Attr::empty(),
                Constraints::empty(),
            )
            .unwrap();
    }
    fn unmap_blocks(&mut self, va: u64, len: u64) {
        self.unmap_pages(va, len);
    }
    fn reset(&mut self) {}
    fn translate(&self, va: u64) -> Option<(u64, bool, u64)> {
        let mut out = None;
        let region = MemoryRegion::new(va as usize, va as usize + 1);
        self.0
            .walk_range(&region, &mut |_, d, level| {
                if d.is_valid() {
                    let size = PAGE << (9 * (3 - level as u64));
                    let pa = d.output_address().0 as u64 + (va & (size - 1));
                    out = Some((pa, !d.flags().contains(Attr::READ_ONLY), size));
                }
                Ok(())
            })
            .unwrap();
        out
    }
    fn tables_held(&self) -> usize {
        self.1.get()
    }
}

/// page_table_multiarch's engine with an arm64 entry type (see the bench's
/// module docs).
pub mod ptm {
    use core::fmt;

    use memory_addr::{PhysAddr, VirtAddr};
    use page_table_multiarch::{GenericPTE, MappingFlags, PageTable64, PagingMetaData};
    use pgtable_arm64::Arm64;
    use pgtable_core::contract::Format;
    use pgtable_core::MemType;

    use crate::harness::Subject;
    use crate::ptm::{flags_of, prot_of, Handler, Ptm};

    /// Output address bits 47:12 of a page, block or table descriptor.
    const OA: u64 = 0x0000_ffff_ffff_f000;
    const VALID: u64 = 1 << 0;
    const TABLE_OR_PAGE: u64 = 1 << 1;

    /// The metadata of `A64PagingMetaData` (4 levels, 48-bit PA and VA)
    /// without its TLB instructions, which the engine calls only on
    /// `target_os = "none"` anyway.
    pub struct HostA64;

    impl PagingMetaData for HostA64 {
        const LEVELS: usize = 4;
        const PA_MAX_BITS: usize = 48;
        const VA_MAX_BITS: usize = 48;
        type VirtAddr = VirtAddr;
        fn flush_tlb(_vaddr: Option<VirtAddr>) {}
    }

    /// An arm64 stage 1 descriptor for the engine (see the module docs).
    #[derive(Clone, Copy)]
    #[repr(transparent)]
    pub struct Pte(u64);

    impl fmt::Debug for Pte {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "Pte({:#x})", self.0)
        }
    }

    /// The leaf attributes for `flags`, converted per call as `A64PTE` does.
    #[inline]
    fn leaf_attrs(flags: MappingFlags, is_huge: bool) -> u64 {
        let bits = prot_of(flags);
        let mem = if flags.contains(MappingFlags::DEVICE) {
            MemType::Device
        } else if flags.contains(MappingFlags::UNCACHED) {
            MemType::NormalNonCacheable
        } else {
            MemType::Normal
        };
        Arm64::leaf_template(bits.with_mem(mem), if is_huge { 1 } else { 0 })
    }

    impl GenericPTE for Pte {
        fn new_page(paddr: PhysAddr, flags: MappingFlags, is_huge: bool) -> Self {
            Pte(leaf_attrs(flags, is_huge) | (paddr.as_usize() as u64 & OA))
        }
        fn new_table(paddr: PhysAddr) -> Self {
            Pte(Arm64::table_entry(
                pgtable_core::PhysAddr(paddr.as_usize() as u64 & OA),
                1,
            ))
        }
        fn paddr(&self) -> PhysAddr {
            PhysAddr::from_usize((self.0 & OA) as usize)
        }
        fn flags(&self) -> MappingFlags {
            if self.0 & VALID == 0 {
                return MappingFlags::empty();
            }
            let height = if self.is_huge() { 1 } else { 0 };
            let prot = Arm64::leaf_prot(self.0, height);
            let mut f = flags_of(prot);
            match prot.mem() {
                MemType::Device => f |= MappingFlags::DEVICE,
                MemType::NormalNonCacheable => f |= MappingFlags::UNCACHED,
                MemType::Normal => {}
            }
            f
        }
        fn set_paddr(&mut self, paddr: PhysAddr) {
            self.0 = (self.0 & !OA) | (paddr.as_usize() as u64 & OA);
        }
        fn set_flags(&mut self, flags: MappingFlags, is_huge: bool) {
            self.0 = (self.0 & OA) | leaf_attrs(flags, is_huge);
        }
        fn bits(self) -> usize {
            self.0 as usize
        }
        fn is_unused(&self) -> bool {
            self.0 == 0
        }
        fn is_present(&self) -> bool {
            self.0 & VALID != 0
        }
        /// As `A64PTE`: a descriptor without the table/page bit.
        fn is_huge(&self) -> bool {
            self.0 & TABLE_OR_PAGE == 0
        }
        fn clear(&mut self) {
            self.0 = 0;
        }
    }

    /// The `page_table_multiarch` subject: the harness's, on this engine.
    pub fn subject() -> impl Subject {
        Ptm::new(PageTable64::<HostA64, Pte, Handler>::try_new().unwrap())
    }
}
