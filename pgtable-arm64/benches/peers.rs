//! pgtable against its Rust peers on arm64 (DESIGN §6–§7), one criterion
//! run: 1 GiB of address space, tables in ordinary host memory, no TLB work.
//! The descriptors are arm64's (4 KiB granule, 48-bit VA, 4 levels); the
//! host is whatever runs the bench, so these are figures for the
//! algorithms and the table memory, not for an arm64 CPU.
//!
//! | group | what is timed | per-entry figure |
//! |---|---|---|
//! | `arm64-map-4K` | map 1 GiB of 4 KiB pages into an empty range | median / 262,144 |
//! | `arm64-protect-4K` | toggle 1 GiB of 4 KiB pages RW <-> RO (every entry changes) | median / 262,144 |
//! | `arm64-unmap-4K` | unmap 1 GiB of 4 KiB pages | median / 262,144 |
//! | `arm64-map-2M` | map 1 GiB of 2 MiB blocks into an empty range | median / 512 |
//! | `arm64-move-1G` | move 1 GiB of 4 KiB pages (pgtable only: no peer can) | PUD: median; PTE: median / 262,144 |
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
//! - `page_table_multiarch` (0.6): its generic `PageTable64` engine with
//!   ranged calls through a cursor: `map_region` / `protect_region` /
//!   `unmap_region` (loops of per-page walks from the root). The crate's own
//!   `aarch64::A64PageTable` (and `page_table_entry::aarch64::A64PTE`) are
//!   compiled only for `target_arch = "aarch64"`, so on other hosts the
//!   bench plugs a small arm64 entry type into the same engine, encoding
//!   the same descriptor bits as pgtable (through `pgtable_arm64::Arm64`)
//!   and converting its `MappingFlags` per call as `A64PTE` does. Its TLB
//!   flush runs only on `target_os = "none"`. `unmap_region` keeps emptied
//!   tables (freed when the table is dropped); its flag update is a plain
//!   read-modify-write, not A/D-safe.
//!
//! Fairness: same VA range, PA range and leaf attributes (the peers' leaves
//! carry pgtable's attribute bits). Every subject starts a timed map with
//! no tables below the root (page_table_multiarch: a fresh table) and takes
//! table frames from a warm free list. The PA starts 2 MiB past a 1 GiB
//! boundary, so a library that would pick 1 GiB blocks maps 2 MiB blocks in
//! `map-2M`, in one ranged call. Before any timing each subject's result is
//! checked once by translating addresses through the subject itself, so a
//! broken setup cannot report a fast number.
//!
//! Run: `cargo bench -p pgtable-arm64 --bench peers -- --warm-up-time 1
//! --measurement-time 3`. With `PEERS_CLOCK=thread` (Linux) the timed parts
//! are measured in the thread's CPU time instead of wall time, which leaves
//! out the time the thread waited for a CPU on a loaded, shared machine
//! (criterion still calls it "time"). Use it for the 4 KiB groups only: a
//! read of that clock is a system call, and the two reads around each
//! sub-microsecond `map-2M` operation would dominate it.
// criterion's macros generate undocumented public functions.
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use pgtable_arm64::Arm64;
use pgtable_core::{
    AddressSpace, Arena, MapOptions, MoveOptions, NoopMmu, PhysAddr, Prot, VirtAddr,
};

const G1: u64 = 1 << 30;
const M2: u64 = 2 << 20;
const PAGE: u64 = 4096;
const PAGES: u64 = G1 / PAGE;
const BLOCKS: u64 = G1 / M2;
/// The virtual range: `[VA, VA + 1 GiB)`, PUD-aligned.
const VA: u64 = 8 * G1;
/// Where `arm64-move-1G` moves it to and back (PUD-aligned).
const VA2: u64 = 16 * G1;
/// The physical range: 2 MiB past a 1 GiB boundary (see the module docs).
const PA: u64 = 4 * G1 + M2;

/// The clock of the timed parts (see the module docs).
mod clock {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// Time since an arbitrary origin: wall time, or the thread's CPU time
    /// when `PEERS_CLOCK=thread`.
    pub fn now() -> Duration {
        static THREAD: OnceLock<bool> = OnceLock::new();
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        if *THREAD.get_or_init(|| std::env::var("PEERS_CLOCK").is_ok_and(|v| v == "thread")) {
            thread_cpu()
        } else {
            ORIGIN.get_or_init(Instant::now).elapsed()
        }
    }

    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    fn thread_cpu() -> Duration {
        /// `struct timespec` of 64-bit Linux.
        #[repr(C)]
        struct Timespec {
            tv_sec: i64,
            tv_nsec: i64,
        }
        extern "C" {
            fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut ts = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable `struct timespec`, and the
        // clock id is Linux's constant for the calling thread's CPU time.
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
    fn thread_cpu() -> Duration {
        panic!("PEERS_CLOCK=thread needs 64-bit Linux");
    }
}

/// What one benchmark subject can do over `[VA, VA + 1 GiB)`.
trait Subject {
    /// Maps the range to `[PA, ..)` with 4 KiB pages, read-write.
    fn map_pages(&mut self);
    /// Maps the range with 2 MiB blocks, read-write.
    fn map_blocks(&mut self);
    /// Sets the range (4 KiB pages) read-write or read-only.
    fn protect(&mut self, writable: bool);
    /// Unmaps the 4 KiB pages of the range.
    fn unmap_pages(&mut self);
    /// Unmaps the 2 MiB blocks of the range.
    fn unmap_blocks(&mut self);
    /// Untimed: back to "nothing mapped, no tables below the root" where
    /// the timed unmap kept emptied tables.
    fn reset(&mut self);
    /// What `va` translates to: physical address, writable, leaf size.
    fn translate(&self, va: u64) -> Option<(u64, bool, u64)>;
}

/// Table frames for page_table_multiarch: 4 KiB host allocations recycled
/// through a free list (like pgtable's [`Arena`]), per thread because its
/// `PagingHandler` has no `self`. A frame's "physical" address is its host
/// address. Contents of a handed-out frame are unspecified: the crate
/// zeroes a table when it creates it.
mod frames {
    use std::alloc::{alloc_zeroed, dealloc, Layout};
    use std::cell::RefCell;

    const LAYOUT: Layout = match Layout::from_size_align(4096, 4096) {
        Ok(l) => l,
        Err(_) => panic!("bad layout"),
    };

    struct Pool {
        free: Vec<usize>,
        all: Vec<usize>,
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            for &p in &self.all {
                // SAFETY: every address in `all` came from `alloc_zeroed(LAYOUT)`
                // and the pool is going away with the thread.
                unsafe { dealloc(p as *mut u8, LAYOUT) };
            }
        }
    }

    thread_local! {
        static POOL: RefCell<Pool> = const {
            RefCell::new(Pool { free: Vec::new(), all: Vec::new() })
        };
    }

    /// A 4 KiB-aligned frame.
    pub fn alloc() -> usize {
        POOL.with_borrow_mut(|p| {
            p.free.pop().unwrap_or_else(|| {
                // SAFETY: `LAYOUT` has a non-zero size.
                let f = unsafe { alloc_zeroed(LAYOUT) };
                assert!(!f.is_null(), "out of host memory");
                p.all.push(f as usize);
                f as usize
            })
        })
    }

    /// Returns a frame from [`alloc`].
    pub fn free(frame: usize) {
        POOL.with_borrow_mut(|p| p.free.push(frame));
    }
}

// ----- pgtable -----

struct Pgtable {
    s: AddressSpace<Arm64, NoopMmu, Arena>,
    rw: Prot,
    ro: Prot,
}

impl Pgtable {
    fn new(user: bool) -> Pgtable {
        let (rw, ro) = if user {
            (Prot::new(Prot::WRITE | Prot::USER), Prot::new(Prot::USER))
        } else {
            (Prot::READ_WRITE, Prot::READ_ONLY)
        };
        let mut s = AddressSpace::new(NoopMmu, Arena::new()).unwrap();
        // Warm the arena's free list so every run reuses the same frames.
        s.map(VirtAddr(VA), PhysAddr(PA), G1, rw, MapOptions::PAGES)
            .unwrap();
        s.unmap(VirtAddr(VA), G1).unwrap();
        Pgtable { s, rw, ro }
    }
}

impl Subject for Pgtable {
    fn map_pages(&mut self) {
        self.s
            .map(VirtAddr(VA), PhysAddr(PA), G1, self.rw, MapOptions::PAGES)
            .unwrap();
    }
    fn map_blocks(&mut self) {
        self.s
            .map(
                VirtAddr(VA),
                PhysAddr(PA),
                G1,
                self.rw,
                MapOptions::PMD_BLOCKS,
            )
            .unwrap();
    }
    fn protect(&mut self, writable: bool) {
        let prot = if writable { self.rw } else { self.ro };
        self.s.change_protection(VirtAddr(VA), G1, prot).unwrap();
    }
    /// Frees the emptied tables (after the one TLB flush).
    fn unmap_pages(&mut self) {
        self.s.unmap(VirtAddr(VA), G1).unwrap();
    }
    fn unmap_blocks(&mut self) {
        self.s.unmap(VirtAddr(VA), G1).unwrap();
    }
    fn reset(&mut self) {}
    fn translate(&self, va: u64) -> Option<(u64, bool, u64)> {
        let t = self.s.translate(VirtAddr(va))?;
        Some((t.pa.0, t.prot.writable(), PAGE << (9 * t.height)))
    }
}

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

    use super::{Subject, G1, PA, PAGE, VA};

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
    use page_table_multiarch::{
        GenericPTE, MappingFlags, PageSize, PageTable64, PagingHandler, PagingMetaData,
    };
    use pgtable_arm64::Arm64;
    use pgtable_core::{Format, MemType, Prot};

    use super::{frames, Subject, G1, PA, VA};

    const RW: MappingFlags = MappingFlags::READ.union(MappingFlags::WRITE);
    const RO: MappingFlags = MappingFlags::READ;
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
        let mut bits = 0;
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
        Arm64::leaf_template(Prot::new(bits).with_mem(mem), if is_huge { 1 } else { 0 })
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
            match prot.mem {
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

    type Table = PageTable64<HostA64, Pte, Handler>;

    pub struct Ptm(Option<Table>);

    impl Ptm {
        pub fn new() -> Ptm {
            Ptm(Some(Table::try_new().unwrap()))
        }
        fn pt(&mut self) -> &mut Table {
            self.0.as_mut().unwrap()
        }
    }

    fn pa_of(va: VirtAddr) -> PhysAddr {
        PhysAddr::from_usize(va.as_usize() - VA as usize + PA as usize)
    }

    impl Subject for Ptm {
        fn map_pages(&mut self) {
            let va = VirtAddr::from_usize(VA as usize);
            self.pt()
                .cursor()
                .map_region(va, pa_of, G1 as usize, RW, false)
                .unwrap();
        }
        /// One ranged call; PA is not 1 GiB-aligned, so it picks 2 MiB blocks.
        fn map_blocks(&mut self) {
            let va = VirtAddr::from_usize(VA as usize);
            self.pt()
                .cursor()
                .map_region(va, pa_of, G1 as usize, RW, true)
                .unwrap();
        }
        fn protect(&mut self, writable: bool) {
            let flags = if writable { RW } else { RO };
            let va = VirtAddr::from_usize(VA as usize);
            self.pt()
                .cursor()
                .protect_region(va, G1 as usize, flags)
                .unwrap();
        }
        /// Keeps the emptied tables.
        fn unmap_pages(&mut self) {
            let va = VirtAddr::from_usize(VA as usize);
            self.pt().cursor().unmap_region(va, G1 as usize).unwrap();
        }
        fn unmap_blocks(&mut self) {
            self.unmap_pages();
        }
        /// The only way to free its tables: drop the whole table.
        fn reset(&mut self) {
            self.0 = None;
            self.0 = Some(Table::try_new().unwrap());
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
    }
}

// ----- the benchmarks -----

type Subjects = Vec<(&'static str, Box<dyn Subject>)>;

/// Every subject of the map/unmap groups (the `pgtable-user` variant only
/// matters for protection changes, see [`bench_protect`]).
fn subjects() -> Subjects {
    vec![
        ("pgtable", Box::new(Pgtable::new(false))),
        (
            "aarch64-paging",
            Box::new(aarch64_paging_crate::Aarch64Paging::new()),
        ),
        ("page_table_multiarch", Box::new(ptm::Ptm::new())),
    ]
}

/// Times `op` only; `before` and `after` run around it untimed.
fn timed(
    s: &mut dyn Subject,
    iters: u64,
    mut before: impl FnMut(&mut dyn Subject),
    mut op: impl FnMut(&mut dyn Subject),
    mut after: impl FnMut(&mut dyn Subject),
) -> Duration {
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        before(s);
        let t0 = clock::now();
        op(s);
        t += clock::now() - t0;
        after(s);
    }
    black_box(&*s);
    t
}

/// Asserts that `va` translates to its PA with `writable` and `size`.
fn expect_mapped(name: &str, s: &dyn Subject, va: u64, writable: bool, size: u64) {
    let want = Some((PA + (va - VA), writable, size));
    assert_eq!(s.translate(va), want, "{name}: translation of {va:#x}");
}

/// The addresses checked: first byte, one in the middle, last byte.
const PROBES: [u64; 3] = [VA, VA + G1 / 2 + 3 * PAGE + 0x123, VA + G1 - 1];

fn group<'c>(c: &'c mut Criterion, name: &str, elements: u64) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(20);
    g.throughput(Throughput::Elements(elements));
    g
}

fn bench_map(c: &mut Criterion, subjects: &mut Subjects) {
    let mut g = group(c, "arm64-map-4K", PAGES);
    for (name, s) in subjects.iter_mut() {
        let s = &mut **s;
        s.map_pages();
        for va in PROBES {
            expect_mapped(name, s, va, true, PAGE);
        }
        s.unmap_pages();
        s.reset();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                timed(
                    s,
                    iters,
                    |_| {},
                    |s| s.map_pages(),
                    |s| {
                        s.unmap_pages();
                        s.reset();
                    },
                )
            })
        });
    }
    g.finish();
}

fn bench_protect(c: &mut Criterion, subjects: &mut Subjects) {
    let mut g = group(c, "arm64-protect-4K", PAGES);
    let mut user = Pgtable::new(true);
    let all = subjects
        .iter_mut()
        .map(|(n, s)| (*n, &mut **s))
        .chain([("pgtable-user", &mut user as &mut dyn Subject)]);
    for (name, s) in all {
        s.map_pages();
        s.protect(false);
        for va in PROBES {
            expect_mapped(name, s, va, false, PAGE);
        }
        s.protect(true);
        for va in PROBES {
            expect_mapped(name, s, va, true, PAGE);
        }
        let mut writable = true;
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    writable = !writable;
                    let t0 = clock::now();
                    s.protect(writable);
                    t += clock::now() - t0;
                }
                t
            })
        });
        s.unmap_pages();
        s.reset();
    }
    g.finish();
}

fn bench_unmap(c: &mut Criterion, subjects: &mut Subjects) {
    let mut g = group(c, "arm64-unmap-4K", PAGES);
    for (name, s) in subjects.iter_mut() {
        let s = &mut **s;
        s.map_pages();
        s.unmap_pages();
        for va in PROBES {
            assert_eq!(s.translate(va), None, "{name}: {va:#x} still mapped");
        }
        s.reset();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                timed(
                    s,
                    iters,
                    |s| s.map_pages(),
                    |s| s.unmap_pages(),
                    |s| s.reset(),
                )
            })
        });
    }
    g.finish();
}

fn bench_map_blocks(c: &mut Criterion, subjects: &mut Subjects) {
    let mut g = group(c, "arm64-map-2M", BLOCKS);
    for (name, s) in subjects.iter_mut() {
        let s = &mut **s;
        s.map_blocks();
        for va in PROBES {
            expect_mapped(name, s, va, true, M2);
        }
        s.unmap_blocks();
        s.reset();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                timed(
                    s,
                    iters,
                    |_| {},
                    |s| s.map_blocks(),
                    |s| {
                        s.unmap_blocks();
                        s.reset();
                    },
                )
            })
        });
    }
    g.finish();
}

/// pgtable only: no peer can move page tables. 1 GiB of kernel 4 KiB pages
/// moves between two PUD-aligned ranges, one timed move per iteration.
fn bench_move(c: &mut Criterion) {
    let mut g = group(c, "arm64-move-1G", 1);
    for (name, opts, elements) in [
        ("pud", MoveOptions::DEFAULT, 1),
        ("pte", MoveOptions::PTES_ONLY, PAGES),
    ] {
        let mut s = Pgtable::new(false);
        s.map_pages();
        let s = &mut s.s;
        // Warm the arena for the destination tables: one round trip.
        s.move_page_tables_with(VirtAddr(VA), VirtAddr(VA2), G1, opts)
            .unwrap();
        s.move_page_tables_with(VirtAddr(VA2), VirtAddr(VA), G1, opts)
            .unwrap();
        let mut at_a = true;
        g.throughput(Throughput::Elements(elements));
        // One move per iteration, alternating direction; only moves run
        // between the two clock reads.
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t0 = clock::now();
                for _ in 0..iters {
                    let (from, to) = if at_a { (VA, VA2) } else { (VA2, VA) };
                    s.move_page_tables_with(VirtAddr(from), VirtAddr(to), G1, opts)
                        .unwrap();
                    at_a = !at_a;
                }
                clock::now() - t0
            })
        });
        // Every page is still mapped, wherever the last move left it, and
        // nothing is left at the other range.
        let (at, other) = if at_a { (VA, VA2) } else { (VA2, VA) };
        for off in [0, G1 / 2 + 0x123, G1 - 1] {
            let t = s.translate(VirtAddr(at + off)).unwrap();
            assert_eq!((t.pa.0, t.height), (PA + off, 0), "move-1G/{name}");
            assert!(s.translate(VirtAddr(other + off)).is_none());
        }
    }
    g.finish();
}

fn peers(c: &mut Criterion) {
    let mut subjects = subjects();
    bench_map(c, &mut subjects);
    bench_protect(c, &mut subjects);
    bench_unmap(c, &mut subjects);
    bench_map_blocks(c, &mut subjects);
    bench_move(c);
}

criterion_group!(benches, peers);
criterion_main!(benches);
