//! The harness shared by the two peer benchmarks (`benches/x86_peers.rs`
//! and `benches/arm64_peers.rs`) and the size sweep (`src/bin/sweep.rs`).
//! Each bench supplies its peer subjects and its architecture (`A`, and the
//! `<arch>` prefix of the group names, `x86` or `arm64`); the groups, the
//! checks and what is timed are defined here, once:
//!
//! | group | what one timed sample covers | per-entry figure |
//! |---|---|---|
//! | `<arch>-map-4K` | map 1 GiB of 4 KiB pages into an empty range | median / 262,144 |
//! | `<arch>-protect-4K` | toggle 1 GiB of 4 KiB pages RW <-> RO (every entry changes) | median / 262,144 |
//! | `<arch>-unmap-4K` | unmap 8 separate 1 GiB ranges of 4 KiB pages (8 calls) | median / 2,097,152 |
//! | `<arch>-map-2M` | map 32 separate 1 GiB ranges of 2 MiB blocks (32 calls) | median / 16,384 |
//! | `<arch>-move-1G` | move 1 GiB of 4 KiB pages (pgtable only: no peer can) | PUD: median; PTE: median / 262,144 |
//!
//! Criterion reports the time of one iteration; the throughput it prints
//! (elements per second) is the per-entry figure's inverse.
//!
//! Tables live in ordinary host memory and there is no TLB work. The
//! `pgtable` subject is `AddressSpace<A, NoopMmu, ZeroOnAlloc>` with one
//! ranged call per operation. Each bench's module docs say what its peers
//! call and why.
//!
//! # Fairness
//!
//! - **Same build.** Every subject is compiled by the workspace's
//!   `[profile.bench]`: fat LTO and one codegen unit, so cross-crate
//!   inlining favours no one (the peers are not generic, and without LTO
//!   their code could not be inlined into the bench at all).
//! - **Same work.** Every subject works on the same VA ranges, PA range and
//!   leaf attributes and starts a timed map with no tables below the root
//!   (or a fresh table, for a peer that can only free its tables by
//!   dropping the whole table). The PA starts 2 MiB past a 1 GiB boundary,
//!   so a library that would pick 1 GiB leaves maps 2 MiB blocks in
//!   `map-2M`, in one ranged call per range. Before any timing each
//!   subject's result is checked by translating addresses through the
//!   subject itself, so a broken setup cannot report a fast number.
//! - **Zeroing new tables: inside the timed map, for everyone.** The
//!   `x86_64` crate and page_table_multiarch zero a table when they create
//!   it; that is their design and cannot be moved. So every other subject
//!   does the same: pgtable takes its frames from [`ZeroOnAlloc`] (a warm
//!   free list that zeroes a frame when it hands it out, like Linux's
//!   `get_zeroed_page`) rather than from its [`Arena`] (which zeroes on
//!   free), and aarch64-paging's pool zeroes when it allocates. No subject
//!   zeroes on free, so unmap times are table freeing without zeroing.
//!   All frames come from warm free lists, so no subject pays the host
//!   allocator inside a timed part.
//! - **Table freeing is labelled.** pgtable and aarch64-paging free the
//!   tables an unmap empties; the `x86_64` crate's `unmap` and
//!   page_table_multiarch's `unmap_region` keep them (page_table_multiarch
//!   frees them only when the whole table is dropped). The report labels
//!   the columns "with table freeing" / "without"; `x86_64+clean_up` is the
//!   `x86_64` crate's cleanup variant (`clean_up_addr_range`, inside the
//!   timed unmap). pgtable has no mode that keeps empty tables.
//! - **Atomic vs plain stores are labelled.** `pgtable` maps kernel leaves
//!   that are settled (accessed and dirty), so its protection change uses
//!   plain stores, which is A/D-safe because the hardware never writes a
//!   settled entry. `pgtable-user` maps user leaves (A/D clean) and pays an
//!   atomic get-and-clear per entry, what an A/D-tracking OS pays.
//!   aarch64-paging swaps each descriptor atomically (not A/D-safe: the
//!   flags are read before the swap); the `x86_64` crate and
//!   page_table_multiarch use a plain read-modify-write (not A/D-safe).
//! - **Reporting removed frames is labelled.** pgtable's `unmap` does not
//!   visit the entries of a table it frees whole; its `unmap_with` reports
//!   every removed page with its dirty state (`x86-unmap-report-4K`). The
//!   `x86_64` crate's `unmap` returns each frame (its design), which the
//!   `unmap-4K` group discards.
//! - **The clock is amortised.** A pair of clock reads costs about 65 ns;
//!   every timed sample covers at least 16,000 entries and tens of
//!   microseconds (one 1 GiB ranged operation, or a batch of calls between
//!   one pair of clock reads), so the clock is about 0.1 % of a figure or
//!   less.
//!
//! Clock: with `PEERS_CLOCK=thread` (Linux; `cargo xtask bench` sets it)
//! the timed parts are measured in the thread's CPU time instead of wall
//! time, which leaves out the time the thread waited for a CPU on a
//! loaded, shared machine (criterion still calls it "time"). A read of
//! that clock is a system call (under a microsecond); the shortest timed
//! sample, pgtable's `unmap-4K` batch, lasts about 50 µs.
//!
//! [`Arena`]: pgtable_core::contract::Arena

use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use pgtable_core::contract::{Arch, NoopMmu, Table, TableAlloc};
use pgtable_core::{variants, AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};

/// 1 GiB: the size of the range most groups work on.
pub const G1: u64 = 1 << 30;
/// 2 MiB: a PMD block.
pub const M2: u64 = 2 << 20;
/// 4 KiB: a page.
pub const PAGE: u64 = 4096;
/// The 4 KiB pages of 1 GiB.
pub const PAGES: u64 = G1 / PAGE;
/// The 2 MiB blocks of 1 GiB.
pub const BLOCKS: u64 = G1 / M2;
/// The virtual range: `[VA, VA + 1 GiB)`, PUD-aligned; batches use the
/// 1 GiB ranges that follow it.
pub const VA: u64 = 8 * G1;
/// Where `<arch>-move-1G` moves it to and back (PUD-aligned).
pub const VA2: u64 = 64 * G1;
/// The physical range: 2 MiB past a 1 GiB boundary (see the module docs).
pub const PA: u64 = 4 * G1 + M2;
/// Ranges per timed sample of `<arch>-map-2M` (see the module docs).
pub const BLOCK_BATCH: u64 = 32;
/// Ranges per timed sample of `<arch>-unmap-4K`: pgtable unlinks whole
/// PTE tables without visiting their entries, so one 1 GiB unmap takes
/// only microseconds.
pub const UNMAP_BATCH: u64 = 8;

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

/// What one benchmark subject can do over a range `[va, va + len)`
/// (1 GiB-aligned `va`, `len` a multiple of 2 MiB), always mapped to
/// `[PA, PA + len)`.
pub trait Subject {
    /// Maps the range with 4 KiB pages, read-write.
    fn map_pages(&mut self, va: u64, len: u64);
    /// Maps the range with 2 MiB blocks, read-write.
    fn map_blocks(&mut self, va: u64, len: u64);
    /// Sets the range (4 KiB pages) read-write or read-only.
    fn protect(&mut self, va: u64, len: u64, writable: bool);
    /// Unmaps the 4 KiB pages of the range.
    fn unmap_pages(&mut self, va: u64, len: u64);
    /// Unmaps the 2 MiB blocks of the range.
    fn unmap_blocks(&mut self, va: u64, len: u64);
    /// Untimed: back to "nothing mapped, no tables below the root" where
    /// the timed unmap kept emptied tables.
    fn reset(&mut self);
    /// What `va` translates to: physical address, writable, leaf size.
    fn translate(&self, va: u64) -> Option<(u64, bool, u64)>;
    /// Table frames this subject holds now, where it can tell (for the
    /// report's memory chart; a subject on the shared [`frames`] pool
    /// counts the whole pool's frames in use).
    fn tables_held(&self) -> usize;
}

/// Named subjects, in the order their benchmarks run.
pub type Subjects = Vec<(&'static str, Box<dyn Subject>)>;

/// The layout of a 4 KiB frame.
const FRAME: std::alloc::Layout = match std::alloc::Layout::from_size_align(4096, 4096) {
    Ok(l) => l,
    Err(_) => panic!("bad layout"),
};

/// Table frames for the peers that take them from a global source (such as
/// page_table_multiarch, whose `PagingHandler` has no `self`): 4 KiB host
/// allocations recycled through a free list, per thread. A frame's
/// "physical" address is its host address. Contents of a handed-out frame
/// are unspecified: the peers that use it zero a table when they create it.
pub mod frames {
    use std::alloc::{alloc_zeroed, dealloc};
    use std::cell::RefCell;

    use super::FRAME;

    struct Pool {
        free: Vec<usize>,
        all: Vec<usize>,
    }

    impl Drop for Pool {
        fn drop(&mut self) {
            for &p in &self.all {
                // SAFETY: every address in `all` came from `alloc_zeroed(FRAME)`
                // and the pool is going away with the thread.
                unsafe { dealloc(p as *mut u8, FRAME) };
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
                // SAFETY: `FRAME` has a non-zero size.
                let f = unsafe { alloc_zeroed(FRAME) };
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

    /// Frames handed out and not returned.
    pub fn in_use() -> usize {
        POOL.with_borrow(|p| p.all.len() - p.free.len())
    }
}

/// pgtable's table allocator in the peer benchmarks: a free list of 4 KiB
/// host frames that zeroes a frame when it hands it out (Linux's
/// `get_zeroed_page`), so a new table is zeroed inside the timed map, as
/// the peers zero theirs (see the module docs). A frame's "physical"
/// address is its host address.
#[derive(Default)]
pub struct ZeroOnAlloc {
    free: Vec<PhysAddr>,
    all: Vec<PhysAddr>,
}

impl ZeroOnAlloc {
    /// Frames handed out and not returned.
    pub fn live(&self) -> usize {
        self.all.len() - self.free.len()
    }
}

// SAFETY: frames come from the global allocator with the layout of a
// `Table` (4 KiB, 4 KiB aligned), are zeroed when handed out, and are
// handed out once until freed; they are returned to the global allocator
// only when the allocator is dropped, which a benchmark does after its
// address space (whose tables are never live on a CPU) is gone. A frame's
// address is its host address, exposed when it is first allocated.
unsafe impl TableAlloc for ZeroOnAlloc {
    fn alloc_table(&mut self) -> Option<PhysAddr> {
        if let Some(pa) = self.free.pop() {
            // SAFETY: a frame of ours that nobody uses (it was freed).
            unsafe { self.phys_to_virt(pa).as_ptr().write_bytes(0, 1) };
            return Some(pa);
        }
        // SAFETY: `FRAME` has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(FRAME) };
        if p.is_null() {
            return None;
        }
        let pa = PhysAddr(p.expose_provenance() as u64);
        self.all.push(pa);
        Some(pa)
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        self.free.push(pa);
    }

    #[inline]
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        let p = std::ptr::with_exposed_provenance_mut::<Table>(pa.0 as usize);
        // SAFETY: the caller passes a frame of ours, never at address 0.
        unsafe { NonNull::new_unchecked(p) }
    }
}

impl Drop for ZeroOnAlloc {
    fn drop(&mut self) {
        for pa in self.all.drain(..) {
            let p = std::ptr::with_exposed_provenance_mut::<u8>(pa.0 as usize);
            // SAFETY: every frame came from `alloc_zeroed(FRAME)`; the
            // space that used them is gone (benchmarks drop it first).
            unsafe { std::alloc::dealloc(p, FRAME) };
        }
    }
}

// ----- pgtable -----

/// The address space of the `pgtable` subjects.
pub type Space<A> = AddressSpace<A, NoopMmu, ZeroOnAlloc>;

/// The `pgtable` (kernel) and `pgtable-user` subjects on architecture `A`.
pub struct Pgtable<A: Arch> {
    /// The address space.
    pub s: Space<A>,
    rw: Prot,
    ro: Prot,
}

impl<A: Arch> Pgtable<A> {
    /// A space whose allocator is warm: kernel leaves, or user leaves if
    /// `user`.
    pub fn new(user: bool) -> Pgtable<A> {
        let (rw, ro) = if user {
            (Prot::WRITE | Prot::USER, Prot::USER)
        } else {
            (Prot::READ_WRITE, Prot::READ_ONLY)
        };
        let s = AddressSpace::new(NoopMmu, ZeroOnAlloc::default()).unwrap();
        let mut p = Pgtable { s, rw, ro };
        // Warm the free list so every run reuses the same frames.
        p.map_pages(VA, G1);
        p.unmap_pages(VA, G1);
        p
    }
}

impl<A: Arch> Subject for Pgtable<A> {
    fn map_pages(&mut self, va: u64, len: u64) {
        self.s
            .map(VirtAddr(va), PhysAddr(PA), len, self.rw, MapOptions::PAGES)
            .unwrap();
    }
    fn map_blocks(&mut self, va: u64, len: u64) {
        self.s
            .map(
                VirtAddr(va),
                PhysAddr(PA),
                len,
                self.rw,
                MapOptions::PMD_BLOCKS,
            )
            .unwrap();
    }
    fn protect(&mut self, va: u64, len: u64, writable: bool) {
        let prot = if writable { self.rw } else { self.ro };
        self.s.change_protection(VirtAddr(va), len, prot).unwrap();
    }
    /// Frees the emptied tables (after the one TLB flush).
    fn unmap_pages(&mut self, va: u64, len: u64) {
        self.s.unmap(VirtAddr(va), len).unwrap();
    }
    fn unmap_blocks(&mut self, va: u64, len: u64) {
        self.s.unmap(VirtAddr(va), len).unwrap();
    }
    fn reset(&mut self) {}
    fn translate(&self, va: u64) -> Option<(u64, bool, u64)> {
        let t = self.s.translate(VirtAddr(va))?;
        Some((t.pa.0, t.prot.writable(), PAGE << (9 * t.height)))
    }
    fn tables_held(&self) -> usize {
        self.s.alloc().live()
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
    let one = [VA];
    let batch: Vec<u64> = (0..BLOCK_BATCH).map(|k| VA + k * G1).collect();
    bench_map(
        c,
        &format!("{arch}-map-4K"),
        &one,
        PAGES,
        PAGE,
        &mut subjects,
        |s, va| s.map_pages(va, G1),
        |s, va| s.unmap_pages(va, G1),
    );
    bench_protect::<A>(c, &format!("{arch}-protect-4K"), &mut subjects);
    bench_unmap(c, &format!("{arch}-unmap-4K"), &mut subjects, unmap_extra());
    bench_map(
        c,
        &format!("{arch}-map-2M"),
        &batch,
        BLOCKS,
        M2,
        &mut subjects,
        |s, va| s.map_blocks(va, G1),
        |s, va| s.unmap_blocks(va, G1),
    );
    bench_move::<A>(c, &format!("{arch}-move-1G"));
}

/// Times `op` on every range of `ranges`, back to back between one pair of
/// clock reads; `before` and `after` run on every range around it, untimed,
/// and `reset` after them.
pub fn timed_batch(
    s: &mut dyn Subject,
    iters: u64,
    ranges: &[u64],
    mut before: impl FnMut(&mut dyn Subject, u64),
    mut op: impl FnMut(&mut dyn Subject, u64),
    mut after: impl FnMut(&mut dyn Subject, u64),
) -> Duration {
    let mut t = Duration::ZERO;
    for _ in 0..iters {
        for &va in ranges {
            before(s, va);
        }
        let t0 = clock::now();
        for &va in ranges {
            op(s, va);
        }
        t += clock::now() - t0;
        for &va in ranges {
            after(s, va);
        }
        s.reset();
    }
    black_box(&*s);
    t
}

/// Asserts that `at` translates to its PA (in the range starting at `va`)
/// with `writable` and `size`.
fn expect_mapped(name: &str, s: &dyn Subject, va: u64, at: u64, writable: bool, size: u64) {
    let want = Some((PA + (at - va), writable, size));
    assert_eq!(s.translate(at), want, "{name}: translation of {at:#x}");
}

/// The addresses checked in the range at `va`: first byte, one in the
/// middle, last byte.
fn probes(va: u64) -> [u64; 3] {
    [va, va + G1 / 2 + 3 * PAGE + 0x123, va + G1 - 1]
}

/// Samples per benchmark: 20, or criterion's minimum of 10 when
/// `PGTABLE_BENCH_QUICK` is set (`cargo xtask bench --quick`).
pub fn sample_size() -> usize {
    if std::env::var_os("PGTABLE_BENCH_QUICK").is_some() {
        10
    } else {
        20
    }
}

fn group<'c>(c: &'c mut Criterion, name: &str, elements: u64) -> BenchmarkGroup<'c, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(sample_size());
    g.throughput(Throughput::Elements(elements));
    g
}

/// A map group: `map` (timed) creates `elements` leaves of `size` bytes in
/// each 1 GiB range of `ranges`; `unmap` and `reset` (untimed) take them
/// down again.
#[allow(clippy::too_many_arguments)]
fn bench_map(
    c: &mut Criterion,
    group_name: &str,
    ranges: &[u64],
    elements: u64,
    size: u64,
    subjects: &mut Subjects,
    map: impl Fn(&mut dyn Subject, u64),
    unmap: impl Fn(&mut dyn Subject, u64),
) {
    let mut g = group(c, group_name, elements * ranges.len() as u64);
    for (name, s) in subjects.iter_mut() {
        let s = &mut **s;
        for &va in ranges {
            map(s, va);
        }
        for &va in ranges {
            for at in probes(va) {
                expect_mapped(name, s, va, at, true, size);
            }
        }
        for &va in ranges {
            unmap(s, va);
        }
        s.reset();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| timed_batch(s, iters, ranges, |_, _| {}, &map, &unmap))
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
        s.map_pages(VA, G1);
        s.protect(VA, G1, false);
        for at in probes(VA) {
            expect_mapped(name, s, VA, at, false, PAGE);
        }
        s.protect(VA, G1, true);
        for at in probes(VA) {
            expect_mapped(name, s, VA, at, true, PAGE);
        }
        let mut writable = true;
        // One ranged change of 262,144 entries per clock pair.
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    writable = !writable;
                    let t0 = clock::now();
                    s.protect(VA, G1, writable);
                    t += clock::now() - t0;
                }
                t
            })
        });
        s.unmap_pages(VA, G1);
        s.reset();
    }
    g.finish();
}

fn bench_unmap(c: &mut Criterion, group_name: &str, subjects: &mut Subjects, mut extra: Subjects) {
    let ranges: Vec<u64> = (0..UNMAP_BATCH).map(|k| VA + k * G1).collect();
    let mut g = group(c, group_name, PAGES * UNMAP_BATCH);
    for (name, s) in subjects.iter_mut().chain(extra.iter_mut()) {
        let s = &mut **s;
        s.map_pages(VA, G1);
        s.unmap_pages(VA, G1);
        for at in probes(VA) {
            assert_eq!(s.translate(at), None, "{name}: {at:#x} still mapped");
        }
        s.reset();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                timed_batch(
                    s,
                    iters,
                    &ranges,
                    |s, va| s.map_pages(va, G1),
                    |s, va| s.unmap_pages(va, G1),
                    |_, _| {},
                )
            })
        });
    }
    g.finish();
}

/// pgtable only: no peer can move page tables. 1 GiB of kernel 4 KiB pages
/// moves between two PUD-aligned ranges, `iters` moves between one pair of
/// clock reads.
fn bench_move<A: Arch>(c: &mut Criterion, group_name: &str) {
    let mut g = group(c, group_name, 1);
    for (name, opts, elements) in [
        ("pud", MoveOptions::DEFAULT, 1),
        ("pte", variants::PTES_ONLY, PAGES),
    ] {
        let mut s = Pgtable::<A>::new(false);
        s.map_pages(VA, G1);
        let s = &mut s.s;
        // Warm the allocator for the destination tables: one round trip.
        s.move_page_tables(VirtAddr(VA), VirtAddr(VA2), G1, opts)
            .unwrap();
        s.move_page_tables(VirtAddr(VA2), VirtAddr(VA), G1, opts)
            .unwrap();
        let mut at_a = true;
        g.throughput(Throughput::Elements(elements));
        // Alternating direction; only moves run between the clock reads.
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let t0 = clock::now();
                for _ in 0..iters {
                    let (from, to) = if at_a { (VA, VA2) } else { (VA2, VA) };
                    s.move_page_tables(VirtAddr(from), VirtAddr(to), G1, opts)
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
