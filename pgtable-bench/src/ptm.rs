//! The `page_table_multiarch` subject: the crate's generic `PageTable64`
//! engine, ranged calls through a cursor (`map_region` / `protect_region`
//! / `unmap_region`, each a loop of per-page walks from the root inside the
//! crate), table frames from [`frames`], zeroed by the crate when it
//! creates a table. Each architecture picks the metadata and entry types.
//! Its TLB flush runs only on `target_os = "none"`, so none happens here.
//! `unmap_region` keeps emptied tables (they are freed when the table is
//! dropped). Its flag update is a plain read-modify-write, not A/D-safe.

use memory_addr::{PhysAddr, VirtAddr};
use page_table_multiarch::{
    GenericPTE, MappingFlags, PageSize, PageTable64, PagingHandler, PagingMetaData,
};

use pgtable_core::Prot;

use crate::harness::{frames, Subject, PA};

const RW: MappingFlags = MappingFlags::READ.union(MappingFlags::WRITE);
const RO: MappingFlags = MappingFlags::READ;

/// The permissions of `flags` as pgtable's `Prot` (write, execute, user),
/// for the entry types this bench plugs into the engine.
pub fn prot_of(flags: MappingFlags) -> Prot {
    let mut prot = Prot::empty();
    if flags.contains(MappingFlags::WRITE) {
        prot |= Prot::WRITE;
    }
    if flags.contains(MappingFlags::EXECUTE) {
        prot |= Prot::EXEC;
    }
    if flags.contains(MappingFlags::USER) {
        prot |= Prot::USER;
    }
    prot
}

/// The engine's flags of a present leaf with permissions `prot` (read,
/// and write, execute, user as `prot` says).
pub fn flags_of(prot: Prot) -> MappingFlags {
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
    f
}

/// Table frames from the shared free list.
pub struct Handler;

impl PagingHandler for Handler {
    fn alloc_frames(num: usize, align: usize) -> Option<PhysAddr> {
        assert!(num == 1 && align <= 4096, "tables are single frames");
        Some(PhysAddr::from_usize(frames::alloc()))
    }
    fn dealloc_frames(paddr: PhysAddr, num: usize) {
        assert_eq!(num, 1);
        frames::free(paddr.as_usize());
    }
    fn phys_to_virt(paddr: PhysAddr) -> VirtAddr {
        VirtAddr::from_usize(paddr.as_usize())
    }
}

/// A table of metadata `M` and entries `P`, its frames from [`Handler`].
pub struct Ptm<M: PagingMetaData, P: GenericPTE>(Option<PageTable64<M, P, Handler>>);

impl<M: PagingMetaData, P: GenericPTE> Ptm<M, P> {
    /// The subject, starting from `table` (fresh, from `try_new`).
    pub fn new(table: PageTable64<M, P, Handler>) -> Ptm<M, P> {
        Ptm(Some(table))
    }
    fn pt(&mut self) -> &mut PageTable64<M, P, Handler> {
        self.0.as_mut().unwrap()
    }
}

impl<M: PagingMetaData<VirtAddr = VirtAddr>, P: GenericPTE> Subject for Ptm<M, P> {
    fn map_pages(&mut self, va: u64, len: u64) {
        let base = va as usize;
        let pa_of = |v: VirtAddr| PhysAddr::from_usize(v.as_usize() - base + PA as usize);
        self.pt()
            .cursor()
            .map_region(VirtAddr::from_usize(base), pa_of, len as usize, RW, false)
            .unwrap();
    }
    /// One ranged call; PA is not 1 GiB-aligned, so it picks 2 MiB blocks.
    fn map_blocks(&mut self, va: u64, len: u64) {
        let base = va as usize;
        let pa_of = |v: VirtAddr| PhysAddr::from_usize(v.as_usize() - base + PA as usize);
        self.pt()
            .cursor()
            .map_region(VirtAddr::from_usize(base), pa_of, len as usize, RW, true)
            .unwrap();
    }
    fn protect(&mut self, va: u64, len: u64, writable: bool) {
        let flags = if writable { RW } else { RO };
        self.pt()
            .cursor()
            .protect_region(VirtAddr::from_usize(va as usize), len as usize, flags)
            .unwrap();
    }
    /// Keeps the emptied tables.
    fn unmap_pages(&mut self, va: u64, len: u64) {
        self.pt()
            .cursor()
            .unmap_region(VirtAddr::from_usize(va as usize), len as usize)
            .unwrap();
    }
    fn unmap_blocks(&mut self, va: u64, len: u64) {
        self.unmap_pages(va, len);
    }
    /// The only way to free its tables: drop the whole table.
    fn reset(&mut self) {
        self.0 = None;
        self.0 = Some(PageTable64::try_new().unwrap());
    }
    fn translate(&self, va: u64) -> Option<(u64, bool, u64)> {
        let pt = self.0.as_ref().unwrap();
        let (pa, flags, size) = pt.query(VirtAddr::from_usize(va as usize)).ok()?;
        let size = match size {
            PageSize::Size4K => 4096,
            PageSize::Size2M => 2 << 20,
            PageSize::Size1G => 1 << 30,
            PageSize::Size1M => 1 << 20,
        };
        Some((
            pa.as_usize() as u64,
            flags.contains(MappingFlags::WRITE),
            size,
        ))
    }
    fn tables_held(&self) -> usize {
        frames::in_use()
    }
}
