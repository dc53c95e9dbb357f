//! The arm64 benchmarks, printed as tables like the seeds print them.
//!
//! Times are CNTVCT_EL0 ticks under QEMU TCG: they measure *emulated*
//! execution, so the tables give counts (entries written, barriers, TLB
//! flushes, which are exact) and ratios; the ticks are labelled EMULATED.
//!
//! - 1 GiB move (`HAVE_MOVE_PMD` / `HAVE_MOVE_PUD`): PTE, PMD and PUD paths selected at run
//!   time with `MoveOptions`, 10 moves each (alternating direction), mean;
//! - mprotect of 64–512 MiB of 2 MiB blocks (Linux "arm64: mm: rework the pmd protect changing
//!   flow"): the generic
//!   invalidate-and-flush block path (`GenericBlockProt<Arm64>`) against
//!   the arm64 override (one deferred flush), each on its own address
//!   space made live through TTBR0_EL1 (in place of the test space) and
//!   checked by the MMU;
//! - building a linear map of 1 GiB of 4 KiB pages (Linux "arm64: mm: Batch dsb and isb when
//!   populating pgtables"): one walker
//!   barrier per table against one per entry.

use pgtable_core::contract::{Arch, Mmu as _};
use pgtable_core::{
    variants, variants::GenericBlockProt, AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot,
    VirtAddr,
};

use crate::memory::KernelTables;
use crate::platform::{lower_mmu, Arm64, Mmu};
use crate::{println, probe, timer};

/// Where the benchmarks map in the lower half (outside the suite's
/// window, below the upper half's kernel).
const BENCH_WINDOW: u64 = 0x40_0000_0000;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const ITERATIONS: usize = 10;

type Space<A> = AddressSpace<A, Mmu, KernelTables>;

fn mean(xs: &[u64]) -> u64 {
    xs.iter().sum::<u64>() / xs.len().max(1) as u64
}

fn median<const N: usize>(mut xs: [u64; N]) -> u64 {
    xs.sort_unstable();
    xs[N / 2]
}

/// Ratio `a / b` with two decimals, as text.
struct Ratio(u64, u64);

impl core::fmt::Display for Ratio {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.1 == 0 {
            return f.write_str("-");
        }
        let centi = self.0 * 100 / self.1;
        write!(f, "{}.{:02}x", centi / 100, centi % 100)
    }
}

/// Runs every benchmark on `space` (the live test space, installed in
/// TTBR0_EL1) and on fresh spaces; `pool` is RAM the mappings may point at
/// (not written except through the move benchmark's marker word).
pub fn run(space: &mut Space<Arm64>, pool: (u64, u64)) -> Result<(), &'static str> {
    println!();
    println!(
        "=== arm64 benchmarks: CNTVCT_EL0 ticks @ {} Hz, EMULATED (TCG): compare counts and ratios only ===",
        timer::frequency()
    );
    bench_move(space, pool)?;
    bench_mprotect(pool, space.root())?;
    bench_linear_map(pool)?;
    Ok(())
}

/// Linux's mremap speed-ups (HAVE_MOVE_PMD, HAVE_MOVE_PUD): mremap of a PUD-aligned 1 GiB
/// region of 4 KiB pages.
fn bench_move(space: &mut Space<Arm64>, pool: (u64, u64)) -> Result<(), &'static str> {
    let a = BENCH_WINDOW;
    let b = BENCH_WINDOW + 4 * GIB;
    let pa = PhysAddr(pool.0.next_multiple_of(2 * MIB));
    if pa.0 + GIB > pool.1 {
        return Err("pool smaller than 1 GiB");
    }
    space
        .map(VirtAddr(a), pa, GIB, Prot::READ_WRITE, MapOptions::PAGES)
        .map_err(|_| "bench: map 1 GiB")?;
    // A marker in the last page: each move must carry it along.
    let marker = 0x6d6f_7665_0000_0000 | timer::ticks() & 0xffff_ffff;
    let last = GIB - 4096;
    // SAFETY: `a` maps the pool (just above).
    unsafe { probe::write_u64(a + last, marker) }.map_err(|_| "bench: marker store faulted")?;

    let paths = [
        ("PTE", variants::PTES_ONLY),
        ("PMD", variants::PMD_ONLY),
        ("PUD", MoveOptions::DEFAULT),
    ];
    let mut ticks = [[0u64; ITERATIONS]; 3];
    let mut entries = [0u64; 3];
    let mut flushes = [0u64; 3];
    let mut at = a;
    for (p, (name, opts)) in paths.iter().enumerate() {
        for t in ticks[p].iter_mut() {
            let to = if at == a { b } else { a };
            space.stats().reset();
            let t0 = timer::ticks();
            space
                .move_page_tables(VirtAddr(at), VirtAddr(to), GIB, *opts)
                .map_err(|_| "bench: move 1 GiB failed")?;
            *t = timer::ticks() - t0;
            entries[p] = space.stats().entries_written();
            flushes[p] = space.stats().flushes();
            // The hardware must find the marker at the new place and
            // nothing at the old one.
            if probe::read_u64(to + last) != Ok(marker) || probe::read_u64(at + last).is_ok() {
                println!("bench: {name} move did not carry the mapping");
                return Err("bench: move check failed");
            }
            at = to;
        }
    }
    space.unmap(VirtAddr(at), GIB).map_err(|_| "bench: unmap")?;

    println!();
    println!("1 GiB move (mremap of 4 KiB pages, PUD-aligned), 10 iterations, EMULATED ticks");
    println!(
        "{:>6} {:>12} {:>12} {:>12}",
        "iter", "PTE path", "PMD path", "PUD path"
    );
    for (i, ((pte, pmd), pud)) in ticks[0].iter().zip(&ticks[1]).zip(&ticks[2]).enumerate() {
        println!("{:>6} {:>12} {:>12} {:>12}", i, pte, pmd, pud);
    }
    let means = [mean(&ticks[0]), mean(&ticks[1]), mean(&ticks[2])];
    let medians = [median(ticks[0]), median(ticks[1]), median(ticks[2])];
    println!(
        "{:>6} {:>12} {:>12} {:>12}   <-- mean",
        "mean", means[0], means[1], means[2]
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12}   <-- median",
        "median", medians[0], medians[1], medians[2]
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12}   <-- entries written per move",
        "writes", entries[0], entries[1], entries[2]
    );
    println!(
        "{:>6} {:>12} {:>12} {:>12}   <-- TLB flushes per move",
        "flush", flushes[0], flushes[1], flushes[2]
    );
    println!(
        "speed-up over the PTE path (medians): PMD {}, PUD {}",
        Ratio(medians[0], medians[1]),
        Ratio(medians[0], medians[2])
    );
    Ok(())
}

/// Where the mprotect benchmark maps, in its own lower-half space.
const MPROTECT_WINDOW: u64 = 0x80_0000_0000;

/// One mprotect measurement on a live address space: map `len` of 2 MiB
/// blocks at [`MPROTECT_WINDOW`], install it in TTBR0_EL1 in place of the
/// test space (whose root is `test_root`), touch every block
/// (so the TLB holds them, as for memory in use), then change it read-only
/// and back, 5 changes. The MMU checks every change (a store must fault
/// after the read-only change and work after the read-write one). Returns
/// the median ticks and the TLB flushes per change.
fn mprotect_once<A: Arch>(
    len: u64,
    pa: PhysAddr,
    test_root: PhysAddr,
) -> Result<(u64, u64), &'static str> {
    const REPS: usize = 5;
    let base = MPROTECT_WINDOW;
    let blocks = len / (2 * MIB);
    let mut space: Space<A> =
        AddressSpace::new(lower_mmu(), KernelTables).map_err(|_| "bench: no root")?;
    space
        .map(
            VirtAddr(base),
            pa,
            len,
            Prot::READ_WRITE,
            MapOptions::PMD_BLOCKS,
        )
        .map_err(|_| "bench: map blocks")?;
    // SAFETY: TTBR0_EL1 only translates the lower half, which the kernel
    // does not use (it runs on TTBR1_EL1); the test space is put back and
    // the bench space deactivated below before it is dropped.
    unsafe { space.install() };
    let result = (|| {
        for i in 0..blocks {
            // SAFETY: `base` maps the pool (just above).
            unsafe { probe::write_u64(base + i * 2 * MIB, i) }
                .map_err(|_| "bench: block not writable")?;
        }
        space.stats().reset();
        let mut ticks = [0u64; REPS];
        for (r, t) in ticks.iter_mut().enumerate() {
            let read_only = r % 2 == 0;
            let prot = if read_only {
                Prot::READ_ONLY
            } else {
                Prot::READ_WRITE
            };
            let t0 = timer::ticks();
            space
                .change_protection(VirtAddr(base), len, prot)
                .map_err(|_| "bench: change_protection")?;
            *t = timer::ticks() - t0;
            let last = base + len - 8;
            // SAFETY: `last` maps the pool, read-only or writable.
            if unsafe { probe::write_u64(last, r as u64) }.is_ok() == read_only {
                return Err("bench: the MMU does not enforce the new protection");
            }
        }
        Ok((median(ticks), space.stats().flushes() / REPS as u64))
    })();
    // SAFETY: the test space maps nothing the kernel uses; putting it back
    // in TTBR0_EL1 (with a full TLB flush) makes the bench space
    // unreachable before it is dropped.
    unsafe { lower_mmu().install_root(test_root) };
    // SAFETY: the one CPU's TTBR0_EL1 holds the test space again and
    // `install_root` ended with `flush_tlb_all` (a TLBI of everything the
    // MMU's ASID, the only one in use, holds), so no TLB or walk-cache
    // entry made from the bench tables is left.
    unsafe { space.deactivate() };
    result
}

/// Linux "arm64: mm: rework the pmd protect changing flow": mprotect of 2 MiB blocks, generic
/// path against the override.
fn bench_mprotect(pool: (u64, u64), test_root: PhysAddr) -> Result<(), &'static str> {
    let pa = PhysAddr(pool.0.next_multiple_of(2 * MIB));
    println!();
    println!(
        "mprotect of 2 MiB blocks, live in TTBR0 with the TLB warm (RW <-> RO, median of 5 changes), EMULATED ticks"
    );
    println!(
        "{:>8} {:>14} {:>8} {:>14} {:>8} {:>9}",
        "MiB", "generic ticks", "flushes", "arm64 ticks", "flushes", "speed-up"
    );
    for mb in [64u64, 128, 256, 512] {
        let (g_t, g_f) = mprotect_once::<GenericBlockProt<Arm64>>(mb * MIB, pa, test_root)?;
        let (o_t, o_f) = mprotect_once::<Arm64>(mb * MIB, pa, test_root)?;
        println!(
            "{:>8} {:>14} {:>8} {:>14} {:>8} {:>9}",
            mb,
            g_t,
            g_f,
            o_t,
            o_f,
            Ratio(g_t, o_t)
        );
    }
    Ok(())
}

/// Linux "arm64: mm: Batch dsb and isb when populating pgtables": a linear map of 1 GiB of 4
/// KiB pages, barrier per table
/// against barrier per entry.
fn bench_linear_map(pool: (u64, u64)) -> Result<(), &'static str> {
    const REPS: usize = 3;
    let pa = PhysAddr(pool.0.next_multiple_of(2 * MIB));
    let mut rows = [(0u64, 0u64, 0u64); 2];
    for (k, opts) in [
        MapOptions::PAGES,
        variants::barrier_per_entry(MapOptions::PAGES),
    ]
    .into_iter()
    .enumerate()
    {
        let mut ticks = [0u64; REPS];
        for t in ticks.iter_mut() {
            let mut space: Space<Arm64> =
                AddressSpace::new(lower_mmu(), KernelTables).map_err(|_| "bench: no root")?;
            let t0 = timer::ticks();
            space
                .map(VirtAddr(BENCH_WINDOW), pa, GIB, Prot::READ_WRITE, opts)
                .map_err(|_| "bench: linear map")?;
            *t = timer::ticks() - t0;
            rows[k] = (0, space.stats().barriers(), space.stats().entries_written());
        }
        rows[k].0 = median(ticks);
    }
    println!();
    println!("linear map of 1 GiB of 4 KiB pages (median of 3 builds), EMULATED ticks");
    println!(
        "{:>22} {:>12} {:>10} {:>10}",
        "variant", "ticks", "barriers", "entries"
    );
    for (name, r) in ["barrier per table", "barrier per entry"].iter().zip(rows) {
        println!("{:>22} {:>12} {:>10} {:>10}", name, r.0, r.1, r.2);
    }
    println!(
        "per-table barriers: {} fewer barriers, {} faster",
        Ratio(rows[1].1, rows[0].1),
        Ratio(rows[1].0, rows[0].0)
    );
    Ok(())
}
