//! The harness shared by the two peer benchmarks, `pgtable-x86/benches/peers.rs`
//! and `pgtable-arm64/benches/peers.rs`. Each includes this
//! file as its module `harness` (`#[path]`); it sits in a subdirectory of
//! `pgtable-core/benches` so that cargo does not take it for a bench of its
//! own. Each bench supplies its peer subjects and its architecture (`A`, and
//! the `<arch>` prefix of the group names, `x86` or `arm64`); the groups,
//! the checks and what is timed are defined here, once:
//!
//! | group | what is timed | per-entry figure |
//! |---|---|---|
//! | `<arch>-map-4K` | map 1 GiB of 4 KiB pages into an empty range | median / 262,144 |
//! | `<arch>-protect-4K` | toggle 1 GiB of 4 KiB pages RW <-> RO (every entry changes) | median / 262,144 |
//! | `<arch>-unmap-4K` | unmap 1 GiB of 4 KiB pages | median / 262,144 |
//! | `<arch>-map-2M` | map 1 GiB of 2 MiB blocks into an empty range | median / 512 |
//! | `<arch>-move-1G` | move 1 GiB of 4 KiB pages (pgtable only: no peer can) | PUD: median; PTE: median / 262,144 |
//!
//! Tables live in ordinary host memory and there is no TLB work. The
//! `pgtable` subject is `AddressSpace<A, NoopMmu, Arena>` with one ranged
//! call per operation; `pgtable-user` (protection changes only) maps user
//! pages, which start with A/D (or DBM) clean, so its protection change
//! takes the atomic get-and-clear path per entry (what an A/D-tracking OS
//! pays). Each bench's module docs say what its peers call and why.
//!
//! Fairness: every subject works on the same VA range, PA range and leaf
//! attributes, starts a timed map with no tables below the root (or a fresh
//! table, for a peer that can only free its tables by dropping the whole
//! table) and takes table frames from a warm free list (pgtable: the
//! [`Arena`]; peers: [`frames`], or a pool of the same kind). The PA starts
//! 2 MiB past a 1 GiB boundary, so a library that would pick 1 GiB leaves
//! maps 2 MiB blocks in `map-2M`, in one ranged call. Before any timing
//! each subject's result is checked once by translating addresses through
//! the subject itself, so a broken setup cannot report a fast number.
//!
//! Clock: with `PEERS_CLOCK=thread` (Linux) the timed parts are measured in
//! the thread's CPU time instead of wall time, which leaves out the time
//! the thread waited for a CPU on a loaded, shared machine (criterion still
//! calls it "time"). Use it for the 4 KiB groups only: a read of that clock
//! is a system call, and the two reads around each sub-microsecond `map-2M`
//! operation would dominate it.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use pgtable_core::{
    variants, AddressSpace, Arch, Arena, MapOptions, MoveOptions, NoopMmu, PhysAddr, Prot, VirtAddr,
};

/// 1 GiB: the size of the range every group works on.
pub const G1: u64 = 1 << 30;
/// 2 MiB: a PMD block.
pub const M2: u64 = 2 << 20;
/// 4 KiB: a page.
pub const PAGE: u64 = 4096;
/// The 4 KiB pages of the range.
pub const PAGES: u64 = G1 / PAGE;
/// The 2 MiB blocks of the range.
pub const BLOCKS: u64 = G1 / M2;
/// The virtual range: `[VA, VA + 1 GiB)`, PUD-aligned.
pub const VA: u64 = 8 * G1;
/// Where `<arch>-move-1G` moves it to and back (PUD-aligned).
pub const VA2: u64 = 16 * G1;
/// The physical range: 2 MiB past a 1 GiB boundary (see the module docs).
pub const PA: u64 = 4 * G1 + M2;

/// The clock of the timed parts (see the module docs).
pub mod clock {
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
pub trait Subject {
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

/// Named subjects, in the order their benchmarks run.
pub type Subjects = Vec<(&'static str, Box<dyn Subject>)>;

/// Table frames for the peers that take them from a global source (such as
/// page_table_multiarch, whose `PagingHandler` has no `self`): 4 KiB host
/// allocations recycled through a free list (like pgtable's [`Arena`]),
/// per thread. A frame's "physical" address is its host address. Contents
/// of a handed-out frame are unspecified: the peers that use it zero a
/// table when they create it.
pub mod frames {
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

/// The `pgtable` (kernel) and `pgtable-user` subjects on architecture `A`.
pub struct Pgtable<A: Arch> {
    s: AddressSpace<A, NoopMmu, Arena>,
    rw: Prot,
    ro: Prot,
}

impl<A: Arch> Pgtable<A> {
    /// A space whose arena is warm: kernel leaves, or user leaves if `user`.
    pub fn new(user: bool) -> Pgtable<A> {
        let (rw, ro) = if user {
            (Prot::WRITE | Prot::USER, Prot::USER)
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

impl<A: Arch> Subject for Pgtable<A> {
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

// ----- page_table_multiarch -----

/// The `page_table_multiarch` subject: the crate's generic `PageTable64`
/// engine, ranged calls through a cursor (`map_region` / `protect_region`
/// / `unmap_region`, each a loop of per-page walks from the root inside the
/// crate), table frames from [`frames`]. Each bench picks the metadata and
/// entry types. Its TLB flush runs only on `target_os = "none"`, so none
/// happens here. `unmap_region` keeps emptied tables (they are freed when
/// the table is dropped). Its flag update is a plain read-modify-write,
/// not A/D-safe.
pub mod ptm {
    use memory_addr::{PhysAddr, VirtAddr};
    use page_table_multiarch::{
        GenericPTE, MappingFlags, PageSize, PageTable64, PagingHandler, PagingMetaData,
    };

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

    fn pa_of(va: VirtAddr) -> PhysAddr {
        PhysAddr::from_usize(va.as_usize() - VA as usize + PA as usize)
    }

    impl<M: PagingMetaData<VirtAddr = VirtAddr>, P: GenericPTE> Subject for Ptm<M, P> {
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
    }
}

// ----- the benchmarks -----

/// Runs the five groups `<arch>-…` (see the module docs) on architecture
/// `A`: `subjects` in every group but move, then `pgtable-user` in the
/// protect group and the subjects `unmap_extra` builds (when the unmap
/// group starts) in the unmap group.
pub fn run<A: Arch + 'static>(
    c: &mut Criterion,
    arch: &str,
    mut subjects: Subjects,
    unmap_extra: impl FnOnce() -> Subjects,
) {
    bench_map(
        c,
        &format!("{arch}-map-4K"),
        PAGES,
        PAGE,
        &mut subjects,
        |s| s.map_pages(),
        |s| s.unmap_pages(),
    );
    bench_protect::<A>(c, &format!("{arch}-protect-4K"), &mut subjects);
    bench_unmap(c, &format!("{arch}-unmap-4K"), &mut subjects, unmap_extra());
    bench_map(
        c,
        &format!("{arch}-map-2M"),
        BLOCKS,
        M2,
        &mut subjects,
        |s| s.map_blocks(),
        |s| s.unmap_blocks(),
    );
    bench_move::<A>(c, &format!("{arch}-move-1G"));
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

/// A map group: `map` (timed) creates `elements` leaves of `size` bytes,
/// `unmap` and `reset` (untimed) take them down again.
fn bench_map(
    c: &mut Criterion,
    group_name: &str,
    elements: u64,
    size: u64,
    subjects: &mut Subjects,
    map: impl Fn(&mut dyn Subject),
    unmap: impl Fn(&mut dyn Subject),
) {
    let mut g = group(c, group_name, elements);
    for (name, s) in subjects.iter_mut() {
        let s = &mut **s;
        map(s);
        for va in PROBES {
            expect_mapped(name, s, va, true, size);
        }
        unmap(s);
        s.reset();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                timed(
                    s,
                    iters,
                    |_| {},
                    |s| map(s),
                    |s| {
                        unmap(s);
                        s.reset();
                    },
                )
            })
        });
    }
    g.finish();
}

/// The protect group: `subjects`, then `pgtable-user`.
fn bench_protect<A: Arch + 'static>(c: &mut Criterion, group_name: &str, subjects: &mut Subjects) {
    let mut g = group(c, group_name, PAGES);
    let mut user = Pgtable::<A>::new(true);
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

fn bench_unmap(c: &mut Criterion, group_name: &str, subjects: &mut Subjects, mut extra: Subjects) {
    let mut g = group(c, group_name, PAGES);
    for (name, s) in subjects.iter_mut().chain(extra.iter_mut()) {
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

/// pgtable only: no peer can move page tables. 1 GiB of kernel 4 KiB pages
/// moves between two PUD-aligned ranges, one timed move per iteration.
fn bench_move<A: Arch>(c: &mut Criterion, group_name: &str) {
    let mut g = group(c, group_name, 1);
    for (name, opts, elements) in [
        ("pud", MoveOptions::DEFAULT, 1),
        ("pte", variants::PTES_ONLY, PAGES),
    ] {
        let mut s = Pgtable::<A>::new(false);
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
