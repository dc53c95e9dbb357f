//! pgtable against its Rust peers on x86_64 (DESIGN §6–§7), one criterion
//! run: 1 GiB of address space, tables in ordinary host memory, no TLB work.
//!
//! | group | what is timed | per-entry figure |
//! |---|---|---|
//! | `x86-map-4K` | map 1 GiB of 4 KiB pages into an empty range | median / 262,144 |
//! | `x86-protect-4K` | toggle 1 GiB of 4 KiB pages RW <-> RO (every entry changes) | median / 262,144 |
//! | `x86-unmap-4K` | unmap 1 GiB of 4 KiB pages | median / 262,144 |
//! | `x86-map-2M` | map 1 GiB of 2 MiB blocks into an empty range | median / 512 |
//! | `x86-move-1G` | move 1 GiB of 4 KiB pages (pgtable only: no peer can) | PUD: median; PTE: median / 262,144 |
//!
//! Subjects, each with its fastest honest API:
//!
//! - `pgtable`: `AddressSpace<X86_64, NoopMmu, Arena>`, one ranged call per
//!   operation. Kernel leaves are created accessed and dirty (Linux's
//!   `__PAGE_KERNEL`), so protection changes take the plain-store path for
//!   settled entries, which is A/D-safe because the processor never writes a
//!   settled entry. `pgtable-user` maps user pages, created with A and D
//!   clear: its protection change takes the atomic get-and-clear path per
//!   entry (what an A/D-tracking OS pays).
//! - `x86_64`: the `x86_64` crate's `OffsetPageTable` (physical offset 0: a
//!   table frame's "physical" address is its host address). It has per-page
//!   calls only: `map_to` / `update_flags` / `unmap`, each walking from the
//!   root; the `MapperFlush` is `ignore()`d. `unmap` keeps emptied tables;
//!   `x86_64+clean_up` adds `CleanUp::clean_up_addr_range`, which frees them
//!   (what pgtable's unmap does).
//! - `page_table_multiarch`: `x86_64::X64PageTable`, ranged calls through a
//!   cursor: `map_region` / `protect_region` / `unmap_region` (each is a loop
//!   of per-page walks from the root inside the crate). Its TLB flush runs
//!   only on `target_os = "none"`, so none happens here. `unmap_region`
//!   keeps emptied tables (they are freed when the table is dropped). Its
//!   flag update is a plain read-modify-write, not A/D-safe.
//!
//! Fairness: same VA range, PA range and leaf attributes (kernel, read-write
//! or read-only, not executable, write-back; the `x86_64` crate's leaves are
//! bit-identical to pgtable's, A and D included; page_table_multiarch cannot
//! set A/D). Every subject starts a timed map with no tables below the root
//! (or, for page_table_multiarch, a fresh table) and takes table frames from
//! a warm free list (pgtable: the [`Arena`]; peers: the same kind of free
//! list of 4 KiB host frames). The peers zero a table when they allocate it
//! (their design); the arena zeroes it when it is freed, so pgtable pays
//! that in unmap. The PA starts 2 MiB past a 1 GiB boundary, so a library
//! that would pick 1 GiB pages maps 2 MiB blocks in `map-2M`, in one ranged
//! call. Before any timing each subject's result is checked once by
//! translating addresses through the subject itself, so a broken setup
//! cannot report a fast number.
//!
//! Run: `cargo bench -p pgtable-x86 --bench peers -- --warm-up-time 1
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
use pgtable_core::{
    AddressSpace, Arena, MapOptions, MoveOptions, NoopMmu, PhysAddr, Prot, VirtAddr,
};
use pgtable_x86::X86_64;

const G1: u64 = 1 << 30;
const M2: u64 = 2 << 20;
const PAGE: u64 = 4096;
const PAGES: u64 = G1 / PAGE;
const BLOCKS: u64 = G1 / M2;
/// The virtual range: `[VA, VA + 1 GiB)`, PUD-aligned.
const VA: u64 = 8 * G1;
/// Where `x86-move-1G` moves it to and back (PUD-aligned).
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

/// Table frames for the peers: 4 KiB host allocations recycled through a
/// free list (like pgtable's [`Arena`]), per thread because
/// page_table_multiarch's `PagingHandler` has no `self`. A frame's
/// "physical" address is its host address. Contents of a handed-out frame
/// are unspecified: both peers zero a table when they create it.
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
    s: AddressSpace<X86_64, NoopMmu, Arena>,
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

// ----- the x86_64 crate -----

mod x86_64_crate {
    use std::ptr::NonNull;

    use x86_64::structures::paging::mapper::{MappedFrame, TranslateResult};
    use x86_64::structures::paging::{
        mapper::CleanUp, FrameAllocator, FrameDeallocator, Mapper, OffsetPageTable, Page,
        PageTable, PageTableFlags as F, PhysFrame, Size2MiB, Size4KiB, Translate,
    };
    use x86_64::{PhysAddr, VirtAddr};

    use super::{frames, Subject, G1, PA, PAGE, VA};

    /// pgtable's kernel read-write leaf, bit for bit.
    const RW: F = F::PRESENT
        .union(F::WRITABLE)
        .union(F::NO_EXECUTE)
        .union(F::ACCESSED)
        .union(F::DIRTY);
    /// pgtable's kernel read-only leaf (A and D kept), bit for bit.
    const RO: F = F::PRESENT
        .union(F::NO_EXECUTE)
        .union(F::ACCESSED)
        .union(F::DIRTY);

    /// The frame allocator the crate's `map_to` and `clean_up` use.
    struct Frames;

    // SAFETY: `frames::alloc` hands out each 4 KiB-aligned frame once until
    // it is freed, and with physical offset 0 the frame is addressable.
    unsafe impl FrameAllocator<Size4KiB> for Frames {
        fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
            Some(PhysFrame::containing_address(PhysAddr::new(
                frames::alloc() as u64,
            )))
        }
    }

    impl FrameDeallocator<Size4KiB> for Frames {
        unsafe fn deallocate_frame(&mut self, frame: PhysFrame<Size4KiB>) {
            frames::free(frame.start_address().as_u64() as usize);
        }
    }

    pub struct X86_64Crate {
        root: NonNull<PageTable>,
        /// Free the emptied tables in the timed unmap (`clean_up_addr_range`).
        pub clean_up_in_unmap: bool,
    }

    impl X86_64Crate {
        pub fn new(clean_up_in_unmap: bool) -> X86_64Crate {
            let p = frames::alloc() as *mut PageTable;
            // SAFETY: a fresh 4 KiB-aligned frame of ours.
            unsafe { p.write(PageTable::new()) };
            X86_64Crate {
                root: NonNull::new(p).unwrap(),
                clean_up_in_unmap,
            }
        }

        fn mapper(&mut self) -> OffsetPageTable<'_> {
            // SAFETY: the root is ours and every table below it is a host
            // frame whose address is its "physical" address (offset 0);
            // `&mut self` makes the borrow exclusive.
            unsafe { OffsetPageTable::new(self.root.as_mut(), VirtAddr::zero()) }
        }

        fn pages() -> impl Iterator<Item = (Page<Size4KiB>, PhysFrame<Size4KiB>)> {
            let p0 = Page::containing_address(VirtAddr::new(VA));
            let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
            Page::range(p0, p0 + G1 / PAGE).zip(PhysFrame::range(f0, f0 + G1 / PAGE))
        }

        fn blocks() -> impl Iterator<Item = (Page<Size2MiB>, PhysFrame<Size2MiB>)> {
            let p0 = Page::containing_address(VirtAddr::new(VA));
            let f0 = PhysFrame::containing_address(PhysAddr::new(PA));
            Page::range(p0, p0 + super::BLOCKS).zip(PhysFrame::range(f0, f0 + super::BLOCKS))
        }

        fn clean_up(&mut self) {
            let first = Page::<Size4KiB>::containing_address(VirtAddr::new(VA));
            let last = Page::containing_address(VirtAddr::new(VA + G1 - 1));
            // SAFETY: nothing is mapped in the range any more and no CPU
            // uses these tables.
            unsafe {
                self.mapper()
                    .clean_up_addr_range(Page::range_inclusive(first, last), &mut Frames)
            };
        }
    }

    impl Drop for X86_64Crate {
        fn drop(&mut self) {
            // SAFETY: no CPU uses these tables; everything is unmapped first.
            unsafe { self.mapper().clean_up(&mut Frames) };
            frames::free(self.root.as_ptr() as usize);
        }
    }

    impl Subject for X86_64Crate {
        fn map_pages(&mut self) {
            let mut m = self.mapper();
            for (page, frame) in Self::pages() {
                // SAFETY: the frames are never accessed; the tables are not live.
                unsafe { m.map_to(page, frame, RW, &mut Frames) }
                    .unwrap()
                    .ignore();
            }
        }
        fn map_blocks(&mut self) {
            let mut m = self.mapper();
            for (page, frame) in Self::blocks() {
                // SAFETY: as in `map_pages`.
                unsafe { m.map_to(page, frame, RW, &mut Frames) }
                    .unwrap()
                    .ignore();
            }
        }
        fn protect(&mut self, writable: bool) {
            let flags = if writable { RW } else { RO };
            let mut m = self.mapper();
            for (page, _) in Self::pages() {
                // SAFETY: the tables are not live.
                unsafe { m.update_flags(page, flags) }.unwrap().ignore();
            }
        }
        fn unmap_pages(&mut self) {
            let mut m = self.mapper();
            for (page, _) in Self::pages() {
                Mapper::<Size4KiB>::unmap(&mut m, page).unwrap().1.ignore();
            }
            if self.clean_up_in_unmap {
                self.clean_up();
            }
        }
        fn unmap_blocks(&mut self) {
            let mut m = self.mapper();
            for (page, _) in Self::blocks() {
                Mapper::<Size2MiB>::unmap(&mut m, page).unwrap().1.ignore();
            }
        }
        fn reset(&mut self) {
            self.clean_up();
        }
        fn translate(&self, va: u64) -> Option<(u64, bool, u64)> {
            // SAFETY: as in `mapper`; the mapper is only read through.
            let m = unsafe { OffsetPageTable::new(&mut *self.root.as_ptr(), VirtAddr::zero()) };
            match m.translate(VirtAddr::new(va)) {
                TranslateResult::Mapped {
                    frame,
                    offset,
                    flags,
                } => {
                    let size = match frame {
                        MappedFrame::Size4KiB(_) => PAGE,
                        MappedFrame::Size2MiB(_) => 2 << 20,
                        MappedFrame::Size1GiB(_) => 1 << 30,
                    };
                    Some((
                        frame.start_address().as_u64() + offset,
                        flags.contains(F::WRITABLE),
                        size,
                    ))
                }
                _ => None,
            }
        }
    }
}

// ----- page_table_multiarch -----

/// page_table_multiarch's x86_64 table exists only on x86_64 hosts.
#[cfg(target_arch = "x86_64")]
mod ptm {
    use memory_addr::{PhysAddr, VirtAddr};
    use page_table_multiarch::x86_64::X64PageTable;
    use page_table_multiarch::{MappingFlags, PageSize, PagingHandler};

    use super::{frames, Subject, G1, PA, VA};

    const RW: MappingFlags = MappingFlags::READ.union(MappingFlags::WRITE);
    const RO: MappingFlags = MappingFlags::READ;

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

    pub struct Ptm(Option<X64PageTable<Handler>>);

    impl Ptm {
        pub fn new() -> Ptm {
            Ptm(Some(X64PageTable::try_new().unwrap()))
        }
        fn pt(&mut self) -> &mut X64PageTable<Handler> {
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
            self.0 = Some(X64PageTable::try_new().unwrap());
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
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut v: Subjects = vec![
        ("pgtable", Box::new(Pgtable::new(false))),
        ("x86_64", Box::new(x86_64_crate::X86_64Crate::new(false))),
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(("page_table_multiarch", Box::new(ptm::Ptm::new())));
    v
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
    let mut g = group(c, "x86-map-4K", PAGES);
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
    let mut g = group(c, "x86-protect-4K", PAGES);
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
    let mut g = group(c, "x86-unmap-4K", PAGES);
    let mut cleaning = x86_64_crate::X86_64Crate::new(true);
    let all = subjects
        .iter_mut()
        .map(|(n, s)| (*n, &mut **s))
        .chain([("x86_64+clean_up", &mut cleaning as &mut dyn Subject)]);
    for (name, s) in all {
        s.map_pages();
        s.unmap_pages();
        for va in PROBES {
            assert_eq!(s.translate(va), None, "{name}: {va:#x} still mapped");
        }
        s.reset();
        g.bench_function(name, |b| {
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
    let mut g = group(c, "x86-map-2M", BLOCKS);
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
    let mut g = group(c, "x86-move-1G", 1);
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
