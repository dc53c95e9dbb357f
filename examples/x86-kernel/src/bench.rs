//! In-kernel benchmarks, timed with the TSC, printed as the seeds' tables:
//!
//! 1. 1 GiB move (`move_page_tables`, `HAVE_MOVE_PMD` / `HAVE_MOVE_PUD`) through the PUD, PMD
//!    and PTE paths (runtime [`MoveOptions`]), 10 iterations each and the
//!    mean, in ns, the TLB flush included; the data is validated.
//! 2. mprotect (`change_protection`) of 64–512 MiB of 2 MiB blocks
//!    (Linux "arm64: mm: rework the pmd protect changing flow"): the invalidate-and-flush-each path
//!    ([`GenericBlockProt`]) against the transaction path with one
//!    deferred flush (the x86 format's own `pmdp_modify_prot_start`).
//! 3. Building a linear map (Linux "arm64: mm: Batch dsb and isb when populating pgtables"):
//!    barriers once per entry
//!    (`MapOptions::barrier_per_entry`) against once per table, with the
//!    counts. x86 needs no walker barrier, so the x86 format issues none
//!    either way; the table also shows [`WalkerBarriers`], the x86 format
//!    with the barrier requirement switched on (as arm64 has it), whose
//!    counts are the barriers an arm64 kernel would issue for the same
//!    map (each one a no-op call on x86).
//!
//! Every benchmark runs on live tables (the kernel's own address space, or a
//! second one with the same kernel mappings, installed for the
//! measurement), in the suite's window, over the suite's RAM pool.

use core::marker::PhantomData;

use pgtable_core::contract::{Access, AccessFault, Arch, Decoded, Format, Mmu, PAGE_SIZE};
use pgtable_core::{
    variants, variants::GenericBlockProt, AddressSpace, Error, MapOptions, MoveOptions, PhysAddr,
    Prot, VirtAddr,
};
use pgtable_x86::X86Mmu;

use crate::machine::{KernelMachine, WINDOW_BASE};
use crate::mem::{Frames, RamMap};
use crate::{print, println, trap, tsc};

const G1: u64 = 1 << 30;
const M2: u64 = 2 << 20;
const ITERS: usize = 10;

/// Why a benchmark could not run or produced wrong data.
enum Failure {
    Op(&'static str, Error),
    Data(&'static str, u64),
}

impl core::fmt::Display for Failure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Failure::Op(what, e) => write!(f, "{what}: {e}"),
            Failure::Data(what, va) => write!(f, "{what} at {va:#x}"),
        }
    }
}

type R<T = ()> = Result<T, Failure>;

fn op<T>(what: &'static str, r: Result<T, Error>) -> R<T> {
    r.map_err(|e| Failure::Op(what, e))
}

/// The value stored in page `i` of a moved range.
fn tag(i: u64) -> u64 {
    (i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) ^ 0x5a5a_0000_0000_0000 ^ i
}

fn mean(v: &[u64]) -> u64 {
    v.iter().sum::<u64>() / v.len() as u64
}

fn median(mut v: [u64; ITERS]) -> u64 {
    v.sort_unstable();
    v[ITERS / 2]
}

/// Runs every benchmark; false if one failed (wrong data or an error).
pub fn run<A: Arch>(
    space: &mut AddressSpace<A, X86Mmu, Frames>,
    mach: &KernelMachine,
    ram: &RamMap,
    kvm: bool,
    skip: &str,
) -> bool {
    let skipped = |name: &str| skip.split(',').any(|s| s == name);
    let unit = if kvm {
        "KVM, native TSC"
    } else {
        "EMULATED timings (TCG or KVM-PVM), not hardware figures"
    };
    let pool = mach.ram.0;
    let mut ok = true;
    println!();
    println!("== benchmarks ({unit}; TSC {} kHz) ==", mach.tsc.hz / 1000);
    if skipped("move") {
        println!("skip bench move");
    } else if let Err(e) = bench_moves(space, mach, pool, kvm) {
        println!("FAIL bench move: {e}");
        ok = false;
    }
    if skipped("mprotect") {
        println!("skip bench mprotect");
    } else if let Err(e) = bench_mprotect(space, mach, pool, ram, kvm) {
        println!("FAIL bench mprotect: {e}");
        ok = false;
    }
    if skipped("linear") {
        println!("skip bench linear");
    } else if let Err(e) = bench_linear_map::<A>(mach, pool) {
        println!("FAIL bench linear map: {e}");
        ok = false;
    }
    ok
}

/// Maps 1 GiB of 4 KiB pages at `src`, tags each page, moves it back and
/// forth 10 times with `opts` (timed), validates every page at the end.
fn move_1g<A: Arch>(
    space: &mut AddressSpace<A, X86Mmu, Frames>,
    mach: &KernelMachine,
    pool: PhysAddr,
    opts: MoveOptions,
) -> R<[u64; ITERS]> {
    let a = WINDOW_BASE;
    let b = WINDOW_BASE + 2 * G1;
    let pages = G1 / PAGE_SIZE;
    op(
        "map 1 GiB",
        space.map(VirtAddr(a), pool, G1, Prot::READ_WRITE, MapOptions::PAGES),
    )?;
    // One word per page (at a page-dependent offset) carries the tag.
    let word = |base: u64, i: u64| base + i * PAGE_SIZE + (i % 512) * 8;
    for i in 0..pages {
        // SAFETY: `a` maps the pool (just above).
        unsafe { trap::write_u64(word(a, i), tag(i)) }
            .map_err(|_| Failure::Data("fill faulted", word(a, i)))?;
    }
    let mut t = [0u64; ITERS];
    for (n, t) in t.iter_mut().enumerate() {
        let (from, to) = if n % 2 == 0 { (a, b) } else { (b, a) };
        let t0 = tsc::now();
        let r = space.move_page_tables(VirtAddr(from), VirtAddr(to), G1, opts);
        let t1 = tsc::now();
        op("move 1 GiB", r)?;
        *t = mach.tsc.ns(t1 - t0);
        // The flush must have removed the old translations.
        for i in [0, pages / 2, pages - 1] {
            if trap::read_u64(word(from, i)).is_ok() {
                return Err(Failure::Data(
                    "old range still readable after the move",
                    word(from, i),
                ));
            }
            if trap::read_u64(word(to, i)) != Ok(tag(i)) {
                return Err(Failure::Data(
                    "moved page holds the wrong data",
                    word(to, i),
                ));
            }
        }
    }
    // An even number of moves brings the range back to `a`: check all.
    for i in 0..pages {
        if trap::read_u64(word(a, i)) != Ok(tag(i)) {
            return Err(Failure::Data("page lost by the moves", word(a, i)));
        }
    }
    op("unmap 1 GiB", space.unmap(VirtAddr(a), G1))?;
    Ok(t)
}

fn bench_moves<A: Arch>(
    space: &mut AddressSpace<A, X86Mmu, Frames>,
    mach: &KernelMachine,
    pool: PhysAddr,
    kvm: bool,
) -> R {
    // In the order of the table's columns: PUD, PMD, PTE path.
    let variants = [
        MoveOptions::DEFAULT,
        variants::PMD_ONLY,
        variants::PTES_ONLY,
    ];
    let mut res = [[0u64; ITERS]; 3];
    let mut writes = [0u64; 3];
    for (k, opts) in variants.into_iter().enumerate() {
        space.stats().reset();
        res[k] = move_1g(space, mach, pool, opts)?;
        writes[k] = space.stats().entries_written();
    }
    println!();
    println!("Total move_page_tables times for 1 GiB of 4 KiB pages (PUD-aligned source and");
    println!("destination), TLB flush included, data validated. All times in nanoseconds.");
    println!();
    println!(
        "{:>6}  {:>12}  {:>12}  {:>12}",
        "iter", "PUD path", "PMD path", "PTE path"
    );
    for (i, ((pud, pmd), pte)) in res[0].iter().zip(&res[1]).zip(&res[2]).enumerate() {
        println!("{:>6}  {:>12}  {:>12}  {:>12}", i + 1, pud, pmd, pte);
    }
    let m = [mean(&res[0]), mean(&res[1]), mean(&res[2])];
    let md = [median(res[0]), median(res[1]), median(res[2])];
    println!(
        "{:>6}  {:>12}  {:>12}  {:>12}   <-- mean",
        "mean", m[0], m[1], m[2]
    );
    println!(
        "{:>6}  {:>12}  {:>12}  {:>12}",
        "median", md[0], md[1], md[2]
    );
    println!(
        "entries written (whole benchmark incl. map/fill/unmap): {} / {} / {}",
        writes[0], writes[1], writes[2]
    );
    let per_page = m[2] as f64 / (G1 / PAGE_SIZE) as f64;
    println!("PTE path: {per_page:.2} ns per page (mean)");
    if kvm {
        let met = |b: bool| if b { "met" } else { "NOT met" };
        println!(
            "bars (KVM, mean): PUD <= 1 us: {} ({} ns); PMD <= 10 us: {} ({} ns); PTE <= 4 ns/page: {} ({per_page:.2})",
            met(m[0] <= 1_000),
            m[0],
            met(m[1] <= 10_000),
            m[1],
            met(per_page <= 4.0)
        );
    } else {
        println!("bars: not judged (timings are emulated)");
    }
    Ok(())
}

/// 10 alternating read-only / read-write changes of `size` bytes of 2 MiB
/// blocks; returns the mean ns. A store must fault exactly while read-only.
fn mprotect_blocks<B: Arch>(
    space: &mut AddressSpace<B, X86Mmu, Frames>,
    mach: &KernelMachine,
    pool: PhysAddr,
    size: u64,
) -> R<u64> {
    let va = VirtAddr(WINDOW_BASE);
    op(
        "map blocks",
        space.map(va, pool, size, Prot::READ_WRITE, MapOptions::PMD_BLOCKS),
    )?;
    let mut t = [0u64; ITERS];
    for (n, t) in t.iter_mut().enumerate() {
        let ro = n % 2 == 0;
        let prot = if ro {
            Prot::READ_ONLY
        } else {
            Prot::READ_WRITE
        };
        let t0 = tsc::now();
        let r = space.change_protection(va, size, prot);
        let t1 = tsc::now();
        op("change_protection", r)?;
        *t = mach.tsc.ns(t1 - t0);
        for off in [0, size / 2, size - 8] {
            // SAFETY: `va` maps the pool, read-only or writable.
            let faulted = unsafe { trap::write_u64(va.0 + off, n as u64) }.is_err();
            if faulted != ro {
                return Err(Failure::Data(
                    if ro {
                        "store to a read-only block succeeded"
                    } else {
                        "store to a writable block faulted"
                    },
                    va.0 + off,
                ));
            }
        }
    }
    op("unmap blocks", space.unmap(va, size))?;
    Ok(mean(&t))
}

fn bench_mprotect<A: Arch>(
    space: &mut AddressSpace<A, X86Mmu, Frames>,
    mach: &KernelMachine,
    pool: PhysAddr,
    ram: &RamMap,
    kvm: bool,
) -> R {
    const SIZES: [u64; 4] = [64, 128, 256, 512];
    let mut tx = [0u64; 4];
    for (k, mb) in SIZES.iter().enumerate() {
        tx[k] = mprotect_blocks(space, mach, pool, mb << 20)?;
    }
    // The control variant: a second address space with the kernel's
    // mappings, whose block protection start invalidates and flushes at once.
    let mut ctl = op(
        "control space",
        crate::kernel_space::<GenericBlockProt<A>>(ram),
    )?;
    // SAFETY: `ctl` maps the image and all RAM like the kernel's space; it is
    // uninstalled (the kernel's space reinstalled) and deactivated before
    // it is dropped.
    unsafe { ctl.install() };
    let mut each = [0u64; 4];
    let r = (|| {
        for (k, mb) in SIZES.iter().enumerate() {
            each[k] = mprotect_blocks(&mut ctl, mach, pool, mb << 20)?;
        }
        Ok(())
    })();
    // SAFETY: the kernel's own space maps everything the CPU uses and
    // outlives this call.
    unsafe { space.install() };
    // `ctl` holds the kernel's global mappings too (the same translations,
    // from its own tables): drop global TLB entries as well.
    space.mmu().flush_tlb_all();
    // SAFETY: the one CPU runs on the kernel's root again; that MOV to CR3
    // (PCID 0) invalidated every paging-structure cache entry and every
    // non-global TLB entry, and the full flush above the global ones, so
    // nothing made from `ctl`'s tables is left.
    unsafe { ctl.deactivate() };
    drop(ctl);
    r?;
    println!();
    println!("mprotect (change_protection) of 2 MiB blocks, RW <-> RO, mean of {ITERS}, in ms");
    println!();
    print!("{:<34}", "memory size (MiB)");
    for mb in SIZES {
        print!("{mb:>10}");
    }
    println!();
    let ms = |ns: u64| ns as f64 / 1e6;
    print!("{:<34}", "invalidate-each (generic)");
    for v in each {
        print!("{:>10.4}", ms(v));
    }
    println!();
    print!("{:<34}", "transaction (one deferred flush)");
    for v in tx {
        print!("{:>10.4}", ms(v));
    }
    println!();
    print!("{:<34}", "speed-up");
    for k in 0..4 {
        print!("{:>9.1}x", each[k] as f64 / tx[k].max(1) as f64);
    }
    println!();
    let ratio = each[3] as f64 / tx[3].max(1) as f64;
    if kvm {
        println!(
            "bar (KVM): 512 MiB transaction path >= 10x faster: {} ({ratio:.1}x)",
            if ratio >= 10.0 { "met" } else { "NOT met" }
        );
    } else {
        println!("bar: not judged (timings are emulated; ratio {ratio:.1}x)");
    }
    Ok(())
}

/// The format `A` with [`Arch::NEEDS_WALKER_BARRIER`] on: every entry
/// operation is the generic fallback, so `set_pte_at` issues a walker
/// barrier per entry and the per-table path one per table, as on arm64.
/// The barrier itself is x86's (nothing), so only the counts differ.
struct WalkerBarriers<A>(PhantomData<A>);

// SAFETY: every method is `A`'s, which upholds the contract.
unsafe impl<A: Arch> Format for WalkerBarriers<A> {
    const NAME: &'static str = A::NAME;
    const LEVELS: u32 = A::LEVELS;
    const PA_BITS: u32 = A::PA_BITS;
    const VA_BITS: u32 = A::VA_BITS;

    fn leaf_allowed(height: u32) -> bool {
        A::leaf_allowed(height)
    }
    fn decode(raw: u64, height: u32) -> Decoded {
        A::decode(raw, height)
    }
    fn table_entry(pa: PhysAddr, height: u32) -> u64 {
        A::table_entry(pa, height)
    }
    fn leaf_template(prot: Prot, height: u32) -> u64 {
        A::leaf_template(prot, height)
    }
    fn leaf(pa: PhysAddr, prot: Prot, height: u32) -> u64 {
        A::leaf(pa, prot, height)
    }
    fn leaf_prot(raw: u64, height: u32) -> Prot {
        A::leaf_prot(raw, height)
    }
    fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64 {
        A::modify_prot(raw, prot, height)
    }
    fn split_leaf(raw: u64, height: u32) -> u64 {
        A::split_leaf(raw, height)
    }
    fn is_young(raw: u64) -> bool {
        A::is_young(raw)
    }
    fn is_dirty(raw: u64) -> bool {
        A::is_dirty(raw)
    }
    fn is_settled(raw: u64, height: u32) -> bool {
        A::is_settled(raw, height)
    }
    fn hw_access(raw: u64, height: u32, access: Access) -> Result<u64, AccessFault> {
        A::hw_access(raw, height, access)
    }
}

// SAFETY: every entry operation is the generic fallback.
unsafe impl<A: Arch> Arch for WalkerBarriers<A> {
    const HAVE_MOVE_PMD: bool = A::HAVE_MOVE_PMD;
    const HAVE_MOVE_PUD: bool = A::HAVE_MOVE_PUD;
    const TLB_FLUSH_CEILING: u64 = A::TLB_FLUSH_CEILING;
    const NEEDS_WALKER_BARRIER: bool = true;
    const BREAK_BEFORE_MAKE: bool = A::BREAK_BEFORE_MAKE;
}

/// Maps `len` bytes at VA 0 in a fresh, not installed space of format `F`
/// and prints one row.
fn linear_row<F: Arch>(
    mach: &KernelMachine,
    pool: PhysAddr,
    name: &str,
    label: &str,
    len: u64,
    o: MapOptions,
) -> R {
    let mut s = op(
        "new space",
        AddressSpace::<F, X86Mmu, Frames>::new(X86Mmu::new(), Frames),
    )?;
    s.stats().reset();
    let t0 = tsc::now();
    let r = s.map(VirtAddr(0), pool, len, Prot::READ_WRITE, o);
    let t1 = tsc::now();
    op("linear map", r)?;
    let ns = mach.tsc.ns(t1 - t0);
    let entries = s.stats().entries_written();
    println!(
        "{:<20} {:<26} {:>12.1} {:>9.2} {:>9} {:>7} {:>9}",
        name,
        label,
        ns as f64 / 1e3,
        ns as f64 / entries.max(1) as f64,
        entries,
        s.stats().tables_allocated(),
        s.stats().barriers()
    );
    Ok(())
}

/// Builds a linear map of 1 GiB of 4 KiB pages and of all the pool with
/// 2 MiB blocks in a fresh (not installed) address space, once with a
/// barrier per entry and once per table.
fn bench_linear_map<A: Arch>(mach: &KernelMachine, pool: PhysAddr) -> R {
    let cases: [(&str, u64, MapOptions); 2] = [
        ("1 GiB, 4 KiB pages", G1, MapOptions::PAGES),
        (
            "pool, 2 MiB blocks",
            mach.ram.1 & !(M2 - 1),
            MapOptions::PMD_BLOCKS,
        ),
    ];
    // Warm-up (not reported): the first map touches the table frames and
    // the code for the first time.
    for (_, len, opts) in cases {
        let mut s = op(
            "new space",
            AddressSpace::<A, X86Mmu, Frames>::new(X86Mmu::new(), Frames),
        )?;
        op(
            "linear map",
            s.map(VirtAddr(0), pool, len, Prot::READ_WRITE, opts),
        )?;
    }
    println!();
    println!("linear map creation (fresh tables, not installed): barriers and time per variant");
    println!(
        "(x86 needs no walker barrier; \"with barriers\" counts what an arm64-style format issues)"
    );
    println!();
    println!(
        "{:<20} {:<26} {:>12} {:>9} {:>9} {:>7} {:>9}",
        "mapping", "variant", "time (us)", "ns/entry", "entries", "tables", "barriers"
    );
    for (name, len, opts) in cases {
        let per_entry = variants::barrier_per_entry(opts);
        linear_row::<A>(mach, pool, name, "x86, per entry", len, per_entry)?;
        linear_row::<A>(mach, pool, name, "x86, per table", len, opts)?;
        linear_row::<WalkerBarriers<A>>(
            mach,
            pool,
            name,
            "with barriers, per entry",
            len,
            per_entry,
        )?;
        linear_row::<WalkerBarriers<A>>(mach, pool, name, "with barriers, per table", len, opts)?;
    }
    Ok(())
}
