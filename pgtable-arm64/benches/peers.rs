//! pgtable against its Rust peers on arm64, one criterion run over 1 GiB
//! of address space: the groups `arm64-map-4K`, `arm64-protect-4K`,
//! `arm64-unmap-4K`, `arm64-map-2M` and `arm64-move-1G`. What each group
//! times, the checks before timing, the common fairness rules and the
//! clock are those of the shared harness,
//! `pgtable-core/benches/support/peers_harness.rs` (its module docs); this
//! file adds the arm64 peers. The descriptors are arm64's (4 KiB granule,
//! 48-bit VA, 4 levels); the host is whatever runs the bench, so these are
//! figures for the algorithms and the table memory, not for an arm64 CPU.
//!
//! Subjects, each with its fastest honest API:
//!
//! - `pgtable`: `AddressSpace<Arm64, NoopMmu, Arena>`, one ranged call per
//!   operation. Kernel leaves are created with AF set and writable ones
//!   dirty (DBM, AP\[2\] clear), so protection changes take the plain-store
//!   path for settled entries (A/D-safe: hardware never writes them).
//!   `pgtable-user` maps user pages, which start clean (AP\[2\] | DBM), so
//!   its protection change takes the atomic get-and-clear path per entry.
//! - `aarch64-paging` (0.12): a `Mapping<_, El1And0>` (the type under
//!   `IdMap`, used directly because it takes an explicit PA), root level 0.
//!   Ranged calls: `map_range` (with `Constraints::NO_BLOCK_MAPPINGS` for
//!   4 KiB pages), `modify_range` with a callback that calls
//!   `modify_flags` per descriptor (an atomic swap per entry, not A/D-safe:
//!   the flags are read before the swap), and unmap = `map_range` with
//!   invalid (empty) attributes, which frees a subtable its range covers
//!   whole, as pgtable does. The mapping is never activated: for an active
//!   mapping it first walks the range to check break-before-make rules and
//!   invalidates the TLB per entry (compiled out off aarch64), which
//!   pgtable's `NoopMmu` run has no counterpart for. Its table frames come
//!   from a warm free list with zero-on-free, exactly like pgtable's arena
//!   (its own `IdTranslation` would go through the global allocator).
//! - `page_table_multiarch` (0.6): the harness's `ptm` subject, on the
//!   crate's generic `PageTable64` engine (ranged calls through a cursor,
//!   emptied tables kept until the table is dropped, flag updates not
//!   A/D-safe: details there). The crate's own `aarch64::A64PageTable` (and
//!   `page_table_entry::aarch64::A64PTE`) are compiled only for
//!   `target_arch = "aarch64"`, so on other hosts the bench plugs a small
//!   arm64 entry type into the same engine, encoding the same descriptor
//!   bits as pgtable (through `pgtable_arm64::Arm64`) and converting its
//!   `MappingFlags` per call as `A64PTE` does. It takes table frames from
//!   the harness's free list and zeroes a table when it creates it.
//!
//! Fairness, arm64 specifics: the peers' leaves carry pgtable's attribute
//! bits.
//!
//! Run: `cargo bench -p pgtable-arm64 --bench peers -- --warm-up-time 1
//! --measurement-time 3` (`PEERS_CLOCK=thread` for CPU time, 4 KiB groups
//! only: see the harness docs).
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion};
use pgtable_arm64::Arm64;

#[path = "../../pgtable-core/benches/support/peers_harness.rs"]
mod harness;

use harness::{Pgtable, Subjects};

// ----- aarch64-paging -----

mod aarch64_paging_crate {
    use std::ptr::NonNull;

    use aarch64_paging::descriptor::{El1Attributes as Attr, PhysicalAddress, UpdatableDescriptor};
    use aarch64_paging::paging::{
        Constraints, El1And0, MemoryRegion, PageTable, Translation, VaRange,
    };
    use aarch64_paging::Mapping;
    use pgtable_arm64::Arm64;
    use pgtable_core::{Format, Prot};

    use crate::harness::{Subject, G1, PA, PAGE, VA};

    /// Table frames on a free list, zeroed when freed (like pgtable's
    /// arena); a frame's "physical" address is its host address.
    pub struct Pool {
        free: Vec<NonNull<PageTable<Attr>>>,
        all: Vec<NonNull<PageTable<Attr>>>,
    }

    const LAYOUT: std::alloc::Layout = std::alloc::Layout::new::<PageTable<Attr>>();

    impl Translation<Attr> for Pool {
        fn allocate_table(&mut self) -> (NonNull<PageTable<Attr>>, PhysicalAddress) {
            let t = self.free.pop().unwrap_or_else(|| {
                // SAFETY: `LAYOUT` (4 KiB) has a non-zero size.
                let p = unsafe { std::alloc::alloc_zeroed(LAYOUT) };
                let t = NonNull::new(p.cast()).expect("out of host memory");
                self.all.push(t);
                t
            });
            (t, PhysicalAddress(t.as_ptr() as usize))
        }

        unsafe fn deallocate_table(&mut self, t: NonNull<PageTable<Attr>>) {
            // SAFETY: the caller returns a table of ours that nothing uses
            // any more; zeroing it keeps the "allocated tables are zeroed"
            // promise for its next use.
            unsafe { t.as_ptr().cast::<u8>().write_bytes(0, LAYOUT.size()) };
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

    /// pgtable's kernel read-write leaf attributes (the block form: the
    /// crate adds the page bit at level 3 itself).
    fn rw() -> Attr {
        Attr::from_bits_retain(Arm64::leaf_template(Prot::READ_WRITE, 1) as usize)
    }

    pub struct Aarch64Paging(Mapping<Pool, El1And0>);

    impl Aarch64Paging {
        pub fn new() -> Aarch64Paging {
            let pool = Pool {
                free: Vec::new(),
                all: Vec::new(),
            };
            Aarch64Paging(Mapping::with_asid_and_va_range(
                pool,
                1,
                0,
                El1And0,
                VaRange::Lower,
            ))
        }

        fn range() -> MemoryRegion {
            MemoryRegion::new(VA as usize, (VA + G1) as usize)
        }

        fn map(&mut self, constraints: Constraints) {
            self.0
                .map_range(
                    &Self::range(),
                    PhysicalAddress(PA as usize),
                    rw(),
                    constraints,
                )
                .unwrap();
        }
    }

    impl Subject for Aarch64Paging {
        fn map_pages(&mut self) {
            self.map(Constraints::NO_BLOCK_MAPPINGS | Constraints::NO_CONTIGUOUS_HINT);
        }
        fn map_blocks(&mut self) {
            self.map(Constraints::NO_CONTIGUOUS_HINT);
        }
        /// RW <-> RO as pgtable does it: AP\[2\] (READ_ONLY) and DBM swap.
        fn protect(&mut self, writable: bool) {
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
            self.0.modify_range(&Self::range(), &f).unwrap();
        }
        /// `map_range` with invalid attributes: frees the subtables.
        fn unmap_pages(&mut self) {
            self.0
                .map_range(
                    &Self::range(),
                    PhysicalAddress(0),
                    Attr::empty(),
                    Constraints::empty(),
                )
                .unwrap();
        }
        fn unmap_blocks(&mut self) {
            self.unmap_pages();
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
    }
}

// ----- page_table_multiarch -----

mod ptm {
    use core::fmt;

    use memory_addr::{PhysAddr, VirtAddr};
    use page_table_multiarch::{GenericPTE, MappingFlags, PageTable64, PagingMetaData};
    use pgtable_arm64::Arm64;
    use pgtable_core::{Format, MemType, Prot};

    use crate::harness::ptm::{Handler, Ptm};

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
        let mut bits = Prot::empty();
        if flags.contains(MappingFlags::WRITE) {
            bits |= Prot::WRITE;
        }
        if flags.contains(MappingFlags::EXECUTE) {
            bits |= Prot::EXEC;
        }
        if flags.contains(MappingFlags::USER) {
            bits |= Prot::USER;
        }
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
            let mut f = MappingFlags::READ;
            if prot.writable() {
                f |= MappingFlags::WRITE;
            }
            if prot.executable() {
                f |= MappingFlags::EXECUTE;
            }
            if prot.user() {
                f |= MappingFlags::USER;
            }
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
    pub fn subject() -> Ptm<HostA64, Pte> {
        Ptm::new(PageTable64::<HostA64, Pte, Handler>::try_new().unwrap())
    }
}

// ----- the benchmarks -----

/// Every subject of all groups but move (the harness adds `pgtable-user`
/// to the protect group).
fn subjects() -> Subjects {
    vec![
        ("pgtable", Box::new(Pgtable::<Arm64>::new(false))),
        (
            "aarch64-paging",
            Box::new(aarch64_paging_crate::Aarch64Paging::new()),
        ),
        ("page_table_multiarch", Box::new(ptm::subject())),
    ]
}

fn peers(c: &mut Criterion) {
    harness::run::<Arm64>(c, "arm64", subjects(), Vec::new);
}

criterion_group!(benches, peers);
criterion_main!(benches);
