//! The `contpte_` cases: arm64 contiguous mappings (the contiguous hint,
//! descriptor bit 52: one TLB entry may cover 16 adjacent pages, 64 KiB,
//! or 16 adjacent 2 MiB blocks, 32 MiB; Arm ARM D8.6.1), judged by the
//! MMU through the probes and by the descriptors themselves.
//!
//! pgtable folds every aligned run of 16 entries that maps contiguous,
//! aligned physical memory with one set of attributes, and unfolds a
//! whole run (break-before-make for its 16 entries) before it changes
//! part of it, as Linux does since 6.9 (`arch/arm64/mm/contpte.c`). The
//! cases, on the suite's test space (TTBR0_EL1) at [`WINDOW`]:
//!
//! - `contpte_linear_map_folded`: every run of the kernel's linear map
//!   that can be folded is, and no run carries the hint on only some of
//!   its entries; the folded runs are counted and printed;
//! - `contpte_partial_protect`: a page of a folded run made read-only
//!   faults on a store, the other 15 pages of the run still take stores,
//!   the run's 16 entries lose the hint and the next run keeps it; a
//!   change of a whole run keeps it folded;
//! - `contpte_block_run_split`: the same for a 4 KiB page inside a folded
//!   run of 2 MiB blocks (the block is split, the other 15 blocks stay
//!   blocks without the hint);
//! - `contpte_partial_unmap`: an unmapped page of a run faults, the rest
//!   of the run keeps its data and takes stores without the hint;
//! - `contpte_misaligned_move`: two runs moved to a destination that is
//!   not 64 KiB-congruent with their memory read back there, unfolded,
//!   and the old addresses fault;
//! - `contpte_congruent_move`: a move to a congruent destination keeps
//!   the runs folded; a move of part of a run unfolds the rest of it;
//! - `contpte_access_dirty_aggregation` (hardware access flag and dirty
//!   state, FEAT_HAFDBS with TCR_EL1.HA/HD) or
//!   `contpte_access_dirty_aggregation_software` (without them: the
//!   kernel's fault path, `ptep_set_access_flags`, stands in for the
//!   hardware): the accessed and dirty state of a folded run is gathered
//!   over its 16 entries, whichever one got the update, and cleared over
//!   the run.
//!
//! Each case prints `ok <name>` or `FAIL <name>: <reason>`; every case
//! unmaps what it mapped, and the last check is that every table frame
//! came back.

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use aarch64_cpu::registers::{ID_AA64MMFR1_EL1, TCR_EL1};
use pgtable_arm64::desc::{
    is_contiguous, is_hw_dirty, AF, AP_RDONLY, CONT, DBM, OA_MASK, SW_DIRTY,
};
use pgtable_core::{ClearRefs, Decoded, FaultFlags, Format, MapOptions, PhysAddr, Prot, VirtAddr};
use tock_registers::interfaces::Readable;

use crate::kmap::KernelSpace;
use crate::memory::{self, phys_to_virt, KERNEL_VA_END, PAGE_OFFSET};
use crate::platform::Arm64;
use crate::println;
use crate::probe::{self, is_translation_fault, EC_DABT_CUR};
use crate::space::{ensure, fail, store_faults, Tally, Why, R};

/// Where the cases map, in the test space (away from the suite's window,
/// the benchmarks' and the `smp_` cases').
const WINDOW: u64 = 0xe0_0000_0000;
/// The destination of the moves.
const MOVED: u64 = WINDOW + (16 << 20);
/// The destination of a move of part of a run.
const MOVED2: u64 = WINDOW + (24 << 20);
/// Where the run of 2 MiB blocks is mapped (32 MiB aligned).
const BLOCKS_VA: u64 = WINDOW + (32 << 20);
/// Everything the cases map lies in `[WINDOW, WINDOW + SPAN)`.
const SPAN: u64 = 64 << 20;

const PAGE: u64 = 4096;
const BLOCK: u64 = 2 << 20;
/// Entries in a contiguous run (4 KiB granule, at both levels).
const RUN: u64 = 16;
/// Bytes of a run of pages (64 KiB) and of 2 MiB blocks (32 MiB).
const CONT_PTE: u64 = RUN * PAGE;
const CONT_PMD: u64 = RUN * BLOCK;
/// Pages of the page-level cases: two runs.
const PAGES: u64 = 2 * RUN;
/// User read-write data.
const USER_RW: Prot = Prot::new(Prot::WRITE | Prot::USER);
/// The marker of page `p` (word 0 of its frame) is `MARK ^ p`.
const MARK: u64 = 0xc047_0000_0000_0000;

/// Physical memory the cases map: a 32 MiB-aligned run for the blocks,
/// then two 64 KiB runs of frames.
#[derive(Clone, Copy)]
struct Mem {
    blocks: u64,
    pages: u64,
}

/// The accessed/dirty mode the kernel runs with (ID_AA64MMFR1_EL1.HAFDBS,
/// TCR_EL1.HA and TCR_EL1.HD, which `set_tcr` sets only where the CPU
/// has them).
#[derive(Clone, Copy, Debug)]
pub struct HwAd {
    /// ID_AA64MMFR1_EL1.HAFDBS: 0 none, 1 access flag, 2 and dirty state.
    pub hafdbs: u64,
    /// TCR_EL1.HA (bit 39).
    pub ha: bool,
    /// TCR_EL1.HD (bit 40).
    pub hd: bool,
}

impl HwAd {
    /// Reads the feature field and the live TCR_EL1.
    pub fn now() -> HwAd {
        let tcr = TCR_EL1.get();
        HwAd {
            hafdbs: ID_AA64MMFR1_EL1.get() & 0xf,
            ha: tcr & (1 << 39) != 0,
            hd: tcr & (1 << 40) != 0,
        }
    }

    /// Whether the hardware sets both the access flag and the dirty state.
    fn hardware(self) -> bool {
        self.ha && self.hd
    }
}

/// Writes word 0 of the frame at `pa` through the linear map.
fn poke(pa: u64, v: u64) {
    // SAFETY: pool frames hold no Rust object; the linear map maps them
    // read-write.
    unsafe { (phys_to_virt(pa) as *mut u64).write_volatile(v) };
}

/// An EL1 load from `va` that must return `want`.
fn load_is(what: &str, va: u64, want: u64) -> R {
    match probe::read_u64(va) {
        Ok(v) => ensure!(
            v == want,
            "{what}: {va:#x} reads {v:#x}, expected {want:#x}"
        ),
        Err(f) => fail!("{what}: a load from {va:#x} faulted: ESR {:#x}", f.esr),
    }
    Ok(())
}

/// An EL1 load from `va` that must take a translation fault.
fn load_faults(what: &str, va: u64) -> R {
    match probe::read_u64(va) {
        Ok(v) => fail!("{what}: {va:#x} still translates (reads {v:#x})"),
        Err(f) => ensure!(
            f.class() == EC_DABT_CUR && is_translation_fault(f.esr) && f.far == va,
            "{what}: a load from {va:#x}: ESR {:#x} FAR {:#x}, expected a translation fault",
            f.esr,
            f.far
        ),
    }
    Ok(())
}

/// An EL1 store of `v` to `va` that must work.
fn store_ok(what: &str, va: u64, v: u64) -> R {
    // SAFETY: every caller passes an address of the window, which maps
    // only pool frames of the cases.
    if let Err(f) = unsafe { probe::write_u64(va, v) } {
        fail!("{what}: a store to {va:#x} faulted: ESR {:#x}", f.esr);
    }
    Ok(())
}

/// The 16 raw entries at `height` of the run that starts at `va`.
fn run_entries(s: &KernelSpace, va: u64, height: u32) -> Result<[u64; 16], Why> {
    let size = if height == 0 { PAGE } else { BLOCK };
    let mut e = [0u64; 16];
    for (i, x) in e.iter_mut().enumerate() {
        let at = va + i as u64 * size;
        match s.entry(VirtAddr(at), height) {
            Some(raw) => *x = raw,
            None => fail!("no table holds the entry at height {height} for {at:#x}"),
        }
    }
    Ok(e)
}

/// Bit `i` set: entry `i` has the contiguous hint.
fn cont_mask(e: &[u64; 16]) -> u16 {
    e.iter()
        .enumerate()
        .fold(0, |m, (i, &r)| m | (u16::from(is_contiguous(r)) << i))
}

/// Whether `raw` is a present leaf at `height`.
fn is_leaf(raw: u64, height: u32) -> bool {
    matches!(<Arm64 as Format>::decode(raw, height), Decoded::Leaf(_))
}

/// The run at `va` must be folded: 16 present leaves, each with the hint.
fn expect_folded(s: &KernelSpace, what: &str, va: u64, height: u32) -> R {
    let e = run_entries(s, va, height)?;
    for (i, &r) in e.iter().enumerate() {
        ensure!(
            is_leaf(r, height),
            "{what}: entry {i} of the run at {va:#x} is {r:#x}, not a leaf at height {height}"
        );
    }
    let m = cont_mask(&e);
    ensure!(
        m == 0xffff,
        "{what}: the run at {va:#x} has the contiguous hint on entries {m:#06x} only, expected all 16"
    );
    Ok(())
}

/// No entry of the run at `va` may carry the hint.
fn expect_unfolded(s: &KernelSpace, what: &str, va: u64, height: u32) -> R {
    let m = cont_mask(&run_entries(s, va, height)?);
    ensure!(
        m == 0,
        "{what}: entries {m:#06x} of the run at {va:#x} still have the contiguous hint"
    );
    Ok(())
}

/// Maps `pages` frames of `pa` at `va` (page by page, folded where
/// pgtable can) with a marker in each frame (page `p`: `MARK ^ p`),
/// kernel read-write (created dirty, as Linux's `PAGE_KERNEL`).
fn map_marked(s: &mut KernelSpace, va: u64, pa: u64, pages: u64) -> R {
    map_marked_prot(s, va, pa, pages, Prot::READ_WRITE)
}

/// [`map_marked`] with `prot`.
fn map_marked_prot(s: &mut KernelSpace, va: u64, pa: u64, pages: u64, prot: Prot) -> R {
    for p in 0..pages {
        poke(pa + p * PAGE, MARK ^ p);
    }
    s.map(
        VirtAddr(va),
        PhysAddr(pa),
        pages * PAGE,
        prot,
        MapOptions::PAGES,
    )
    .map_err(|e| Why::new(format_args!("map {va:#x}: {e}")))
}

/// Every page `p` of `[va, va + pages * PAGE)` reads `MARK ^ (first + p)`.
fn reads_markers(what: &str, va: u64, first: u64, pages: u64) -> R {
    for p in 0..pages {
        load_is(what, va + p * PAGE, MARK ^ (first + p))?;
    }
    Ok(())
}

/// Attributes that must agree over a run for it to fold: the entry
/// without its output address, the hint itself and the accessed/dirty
/// state (which the hardware updates on any one entry of a run).
fn fold_attrs(raw: u64) -> u64 {
    let mut a = raw & !(OA_MASK | AF | CONT | SW_DIRTY);
    if raw & DBM != 0 {
        a &= !AP_RDONLY;
    }
    a
}

/// Runs of the linear map at one level: folded, and foldable.
#[derive(Clone, Copy, Default, Debug)]
struct RunCount {
    folded: u64,
    foldable: u64,
}

/// Counts the folded runs of the kernel's linear map (pages and 2 MiB
/// blocks), and checks that every run that could be folded is, and that
/// no run has the hint on only some of its entries.
fn linear_map_runs(k: &KernelSpace) -> Result<[RunCount; 2], Why> {
    let mut counts = [RunCount::default(); 2];
    // The leaves of one run being gathered, per height: its start, the
    // entries seen so far.
    let mut cur = [(u64::MAX, [0u64; 16], 0u32); 2];
    let mut bad: Option<(u64, u32)> = None;
    let mut finish = |h: usize, start: u64, e: &[u64; 16], seen: u32| {
        let size = if h == 0 { PAGE } else { BLOCK };
        let m = cont_mask(e);
        let foldable = seen == 0xffff
            && e[0] & OA_MASK & (RUN * size - 1) == 0
            && e.iter().enumerate().all(|(i, &r)| {
                r & OA_MASK == (e[0] & OA_MASK) + i as u64 * size
                    && fold_attrs(r) == fold_attrs(e[0])
            });
        counts[h].foldable += u64::from(foldable);
        counts[h].folded += u64::from(foldable && m == 0xffff);
        if (foldable && m != 0xffff) || (!foldable && m != 0) {
            bad.get_or_insert((start, m as u32 | (u32::from(foldable) << 16)));
        }
    };
    k.walk(VirtAddr(PAGE_OFFSET), KERNEL_VA_END - PAGE_OFFSET, |m| {
        let h = m.height as usize;
        if h > 1 || m.va.0 >= PAGE_OFFSET + (1 << 39) {
            return; // 1 GiB blocks, or not the linear map
        }
        let size = m.size;
        let start = m.va.0 & !(RUN * size - 1);
        let (s, e, seen) = &mut cur[h];
        if *s != start {
            if *s != u64::MAX {
                let (s0, e0, seen0) = (*s, *e, *seen);
                finish(h, s0, &e0, seen0);
            }
            *s = start;
            *e = [0; 16];
            *seen = 0;
        }
        let i = ((m.va.0 - start) / size) as usize;
        e[i] = m.entry;
        *seen |= 1 << i;
    })
    .map_err(|e| Why::new(format_args!("walking the linear map: {e}")))?;
    for (h, &(s, e, seen)) in cur.iter().enumerate() {
        if s != u64::MAX {
            finish(h, s, &e, seen);
        }
    }
    if let Some((start, why)) = bad {
        fail!(
            "the linear map's run at {start:#x} is {}foldable but has the hint on entries {:#06x}",
            if why >> 16 != 0 { "" } else { "not " },
            why & 0xffff
        );
    }
    Ok(counts)
}

/// The cases; `test` is the suite's test space, installed in TTBR0_EL1,
/// `kernel` the kernel's space, `pool` the test pool.
pub fn cases(t: &mut Tally, kernel: &KernelSpace, test: &mut KernelSpace, pool: (u64, u64)) {
    let (live_before, _) = memory::tables_live();
    let blocks = (pool.0 + (4 << 20)).next_multiple_of(CONT_PMD);
    let mem = Mem {
        blocks,
        pages: blocks + CONT_PMD,
    };
    let hw = HwAd::now();
    println!(
        "contpte: ID_AA64MMFR1_EL1.HAFDBS = {} ({}), TCR_EL1.HA = {}, TCR_EL1.HD = {}",
        hw.hafdbs,
        match hw.hafdbs {
            0 => "no hardware access flag or dirty state",
            1 => "hardware access flag",
            _ => "hardware access flag and dirty state",
        },
        u8::from(hw.ha),
        u8::from(hw.hd)
    );
    if mem.pages + PAGES * PAGE > pool.1 {
        t.case("contpte_partial_protect", || {
            fail!("no room in the pool for the contiguous runs")
        });
        return;
    }
    t.case("contpte_linear_map_folded", || {
        let [pte, pmd] = linear_map_runs(kernel)?;
        println!(
            "contpte: linear map: {} x 64 KiB runs folded (of {} that can be), {} x 32 MiB runs folded (of {})",
            pte.folded, pte.foldable, pmd.folded, pmd.foldable
        );
        ensure!(
            pte.folded > 0 && pmd.folded > 0,
            "no folded run of pages ({}) or of 2 MiB blocks ({}) in the linear map",
            pte.folded,
            pmd.folded
        );
        Ok(())
    });
    let mut run = |name: &str, body: fn(&mut KernelSpace, Mem, HwAd) -> R| {
        t.case(name, || {
            let r = body(test, mem, hw);
            let clean = test.unmap(VirtAddr(WINDOW), SPAN);
            r?;
            clean.map_err(|e| Why::new(format_args!("unmapping the window: {e}")))
        })
    };
    run("contpte_partial_protect", partial_protect);
    run("contpte_block_run_split", block_run_split);
    run("contpte_partial_unmap", partial_unmap);
    run("contpte_misaligned_move", misaligned_move);
    run("contpte_congruent_move", congruent_move);
    if hw.hardware() {
        run("contpte_access_dirty_aggregation", |s, m, _| {
            access_dirty(s, m, true)
        });
    } else {
        run("contpte_access_dirty_aggregation_software", |s, m, _| {
            access_dirty(s, m, false)
        });
    }
    t.case("contpte_cases_free_their_tables", || {
        let (live, _) = memory::tables_live();
        ensure!(
            live == live_before,
            "{live_before} table frames live before the cases, {live} after"
        );
        Ok(())
    });
}

fn partial_protect(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const RO: u64 = 5;
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    expect_folded(s, "after map", WINDOW + CONT_PTE, 0)?;
    // Stores to every page: the TLB holds their writable translations.
    for p in 0..PAGES {
        store_ok("before the change", WINDOW + p * PAGE + 8, p)?;
    }
    let va = WINDOW + RO * PAGE;
    s.change_protection(VirtAddr(va), PAGE, Prot::READ_ONLY)
        .map_err(|e| Why::new(format_args!("change_protection of one page: {e}")))?;
    expect_unfolded(s, "after protecting one page", WINDOW, 0)?;
    expect_folded(s, "the next run", WINDOW + CONT_PTE, 0)?;
    store_faults("a store to the read-only page", va)?;
    for p in (0..RUN).filter(|&p| p != RO) {
        store_ok("a neighbour in the former run", WINDOW + p * PAGE + 8, !p)?;
    }
    reads_markers("after the change", WINDOW, 0, PAGES)?;
    // A whole run: it stays folded, all 16 entries read-only.
    s.change_protection(VirtAddr(WINDOW + CONT_PTE), CONT_PTE, Prot::READ_ONLY)
        .map_err(|e| Why::new(format_args!("change_protection of a run: {e}")))?;
    expect_folded(s, "after protecting a whole run", WINDOW + CONT_PTE, 0)?;
    for p in RUN..PAGES {
        store_faults("a store to the read-only run", WINDOW + p * PAGE)?;
    }
    reads_markers("after protecting the run", WINDOW + CONT_PTE, RUN, RUN)
}

fn block_run_split(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const SPLIT: u64 = 6;
    s.map(
        VirtAddr(BLOCKS_VA),
        PhysAddr(mem.blocks),
        CONT_PMD,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .map_err(|e| Why::new(format_args!("map the blocks: {e}")))?;
    expect_folded(s, "after map", BLOCKS_VA, 1)?;
    for b in 0..RUN {
        store_ok("before the change", BLOCKS_VA + b * BLOCK + 0x1008, b)?;
    }
    // The page at 0x1000 of block SPLIT becomes read-only.
    // One page in the middle of block SPLIT.
    let va = BLOCKS_VA + SPLIT * BLOCK + 0x1000;
    s.change_protection(VirtAddr(va), PAGE, Prot::READ_ONLY)
        .map_err(|e| Why::new(format_args!("change_protection of a page of a block: {e}")))?;
    let e = run_entries(s, BLOCKS_VA, 1)?;
    ensure!(
        cont_mask(&e) == 0,
        "after the split: entries {:#06x} of the block run still have the contiguous hint",
        cont_mask(&e)
    );
    for (b, &raw) in e.iter().enumerate() {
        ensure!(
            (b as u64 == SPLIT) != is_leaf(raw, 1),
            "after the split: PMD entry {b} is {raw:#x}: expected {}",
            if b as u64 == SPLIT {
                "a table"
            } else {
                "a 2 MiB block"
            }
        );
    }
    expect_unfolded(
        s,
        "the split block's run of the page",
        va & !(CONT_PTE - 1),
        0,
    )?;
    store_faults("a store to the read-only page", va)?;
    for b in 0..RUN {
        let at = BLOCKS_VA + b * BLOCK;
        load_is("the earlier store", at + 0x1008, b)?;
        store_ok("a neighbour in the former block run", at + 0x2010, b)?;
    }
    store_ok("the page before the read-only one", va - PAGE, 1)
}

fn partial_unmap(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const HOLE: u64 = 9;
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    reads_markers("before the unmap", WINDOW, 0, PAGES)?;
    let va = WINDOW + HOLE * PAGE;
    s.unmap(VirtAddr(va), PAGE)
        .map_err(|e| Why::new(format_args!("unmap of one page: {e}")))?;
    let e = run_entries(s, WINDOW, 0)?;
    ensure!(
        cont_mask(&e) == 0,
        "after unmapping one page: entries {:#06x} of its run still have the contiguous hint",
        cont_mask(&e)
    );
    ensure!(
        e[HOLE as usize] == 0,
        "the unmapped entry is {:#x}",
        e[HOLE as usize]
    );
    expect_folded(s, "the next run", WINDOW + CONT_PTE, 0)?;
    load_faults("the unmapped page", va)?;
    for p in (0..RUN).filter(|&p| p != HOLE) {
        load_is("a neighbour in the former run", WINDOW + p * PAGE, MARK ^ p)?;
        store_ok("a neighbour in the former run", WINDOW + p * PAGE + 8, p)?;
    }
    reads_markers("the next run", WINDOW + CONT_PTE, RUN, RUN)?;
    // A whole run goes at once.
    s.unmap(VirtAddr(WINDOW + CONT_PTE), CONT_PTE)
        .map_err(|e| Why::new(format_args!("unmap of a run: {e}")))?;
    for p in RUN..PAGES {
        load_faults("the unmapped run", WINDOW + p * PAGE)?;
    }
    Ok(())
}

fn misaligned_move(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    // Not 64 KiB-congruent with the frames (which are 64 KiB aligned).
    const DST: u64 = MOVED + PAGE;
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    expect_folded(s, "after map", WINDOW + CONT_PTE, 0)?;
    reads_markers("before the move", WINDOW, 0, PAGES)?;
    s.move_page_tables(VirtAddr(WINDOW), VirtAddr(DST), PAGES * PAGE)
        .map_err(|e| Why::new(format_args!("move_page_tables: {e}")))?;
    // The destination spans three runs there, none of which may fold.
    for r in 0..3 {
        expect_unfolded(s, "the destination", MOVED + r * CONT_PTE, 0)?;
    }
    reads_markers("at the destination", DST, 0, PAGES)?;
    for p in 0..PAGES {
        load_faults("the source", WINDOW + p * PAGE)?;
    }
    store_ok("at the destination", DST + 8, 1)
}

fn congruent_move(s: &mut KernelSpace, mem: Mem, _: HwAd) -> R {
    const PART: (u64, u64) = (6, 4);
    map_marked(s, WINDOW, mem.pages, PAGES)?;
    reads_markers("before the move", WINDOW, 0, PAGES)?;
    s.move_page_tables(VirtAddr(WINDOW), VirtAddr(MOVED), PAGES * PAGE)
        .map_err(|e| Why::new(format_args!("move_page_tables: {e}")))?;
    expect_folded(s, "after a congruent move", MOVED, 0)?;
    expect_folded(s, "after a congruent move", MOVED + CONT_PTE, 0)?;
    reads_markers("at the destination", MOVED, 0, PAGES)?;
    for p in 0..PAGES {
        load_faults("the source", WINDOW + p * PAGE)?;
    }
    // Part of the first run moves on: the rest of it unfolds.
    let from = MOVED + PART.0 * PAGE;
    let to = MOVED2 + PART.0 * PAGE;
    s.move_page_tables(VirtAddr(from), VirtAddr(to), PART.1 * PAGE)
        .map_err(|e| Why::new(format_args!("move of part of a run: {e}")))?;
    expect_unfolded(s, "the rest of the run", MOVED, 0)?;
    expect_folded(s, "the other run", MOVED + CONT_PTE, 0)?;
    reads_markers("the moved part", to, PART.0, PART.1)?;
    for p in 0..RUN {
        let va = MOVED + p * PAGE;
        if (PART.0..PART.0 + PART.1).contains(&p) {
            load_faults("the moved part's old address", va)?;
        } else {
            load_is("the rest of the run", va, MARK ^ p)?;
            store_ok("the rest of the run", va + 8, p)?;
        }
    }
    Ok(())
}

/// Bit `i`: entry `i` of the run at `va` has the hardware dirty state
/// (`young == false`) or the access flag (`young == true`).
fn ad_mask(s: &KernelSpace, va: u64, young: bool) -> Result<u16, Why> {
    let e = run_entries(s, va, 0)?;
    Ok(e.iter().enumerate().fold(0, |m, (i, &r)| {
        let set = if young {
            r & AF != 0
        } else {
            is_hw_dirty(r) || r & SW_DIRTY != 0
        };
        m | (u16::from(set) << i)
    }))
}

/// What pgtable says about the page at `va`: (young, dirty).
fn library_ad(s: &KernelSpace, va: u64) -> Result<(bool, bool), Why> {
    match s.ptep_get(VirtAddr(va)) {
        Some(e) if e.is_present() => Ok((e.young(), e.dirty())),
        _ => fail!("ptep_get({va:#x}) found no present page"),
    }
}

/// A store to page `p` of the run at [`WINDOW`]: the hardware marks an
/// entry of the run dirty, or (`hardware == false`) the write fault's
/// software path does first, as a kernel without FEAT_HAFDBS would.
fn dirtying_store(s: &mut KernelSpace, p: u64, v: u64, hardware: bool) -> R {
    let va = WINDOW + p * PAGE;
    if !hardware {
        s.ptep_set_access_flags(VirtAddr(va), FaultFlags::DIRTY)
            .map_err(|e| Why::new(format_args!("ptep_set_access_flags (write): {e}")))?;
    }
    store_ok("a store", va + 8, v)
}

/// A load from page `p` of the run at [`WINDOW`], after the access
/// fault's software path when `hardware == false`.
fn accessing_load(s: &mut KernelSpace, p: u64, hardware: bool) -> R {
    let va = WINDOW + p * PAGE;
    if !hardware {
        s.ptep_set_access_flags(VirtAddr(va), FaultFlags::ACCESS)
            .map_err(|e| Why::new(format_args!("ptep_set_access_flags (read): {e}")))?;
    }
    load_is("a load", va, MARK ^ p)
}

fn access_dirty(s: &mut KernelSpace, mem: Mem, hardware: bool) -> R {
    const STORE: u64 = 7;
    const LOAD: u64 = 12;
    const ASK: u64 = 2;
    let ask = WINDOW + ASK * PAGE;
    // User read-write: created clean (writable through DBM, AP[2] set), so
    // the first store needs the dirty-state update. The kernel reaches
    // user pages at EL1 (PAN is off).
    map_marked_prot(s, WINDOW, mem.pages, RUN, USER_RW)?;
    expect_folded(s, "after map", WINDOW, 0)?;
    let dirty0 = ad_mask(s, WINDOW, false)?;
    ensure!(
        dirty0 == 0,
        "entries {dirty0:#06x} are dirty right after map"
    );
    // The TLB gets the load's translation; the store marks an entry of
    // the run dirty.
    accessing_load(s, LOAD, hardware)?;
    dirtying_store(s, STORE, 1, hardware)?;
    let dirty = ad_mask(s, WINDOW, false)?;
    ensure!(dirty != 0, "no entry of the run became dirty after a store");
    let (_, d) = library_ad(s, ask)?;
    ensure!(
        d,
        "ptep_get of page {ASK} says clean, but entries {dirty:#06x} of its run are dirty"
    );
    // The accessed state is cleared over the whole run, and the run
    // flushed: the load's cached translation is gone, so the next load
    // sets the access flag again.
    let was = s
        .test_and_clear_young(VirtAddr(ask))
        .map_err(|e| Why::new(format_args!("test_and_clear_young: {e}")))?;
    ensure!(
        was,
        "test_and_clear_young of page {ASK}: not young after map and accesses"
    );
    let young0 = ad_mask(s, WINDOW, true)?;
    ensure!(
        young0 == 0,
        "after test_and_clear_young entries {young0:#06x} still have the access flag"
    );
    ensure!(
        !library_ad(s, WINDOW + LOAD * PAGE)?.0,
        "ptep_get says young right after test_and_clear_young"
    );
    accessing_load(s, LOAD, hardware)?;
    let young = ad_mask(s, WINDOW, true)?;
    ensure!(
        young != 0,
        "no entry of the run has the access flag after a load (a stale TLB entry?)"
    );
    ensure!(
        library_ad(s, ask)?.0,
        "ptep_get of page {ASK} says old, but entries {young:#06x} of its run have the access flag"
    );
    // The dirty state is cleared over the run and the run flushed: the
    // next store to the same page marks it dirty again.
    s.clear_refs(VirtAddr(WINDOW), CONT_PTE, ClearRefs::DIRTY, |_| {})
        .map_err(|e| Why::new(format_args!("clear_refs: {e}")))?;
    let clean = ad_mask(s, WINDOW, false)?;
    ensure!(
        clean == 0,
        "entries {clean:#06x} are dirty after clear_refs"
    );
    ensure!(
        !library_ad(s, ask)?.1,
        "ptep_get says dirty after clear_refs"
    );
    dirtying_store(s, STORE, 2, hardware)?;
    let dirty2 = ad_mask(s, WINDOW, false)?;
    ensure!(
        dirty2 != 0 && library_ad(s, ask)?.1,
        "after clear_refs a store to page {STORE} left the run clean (entries {dirty2:#06x} dirty; a stale writable TLB entry?)"
    );
    println!(
        "contpte: A/D by {}: a store to page {STORE} dirtied entries {dirty:#06x}, a load from page {LOAD} set the access flag in {young:#06x}; pgtable reports page {ASK} young and dirty",
        if hardware {
            "the hardware (TCR_EL1.HA/HD)"
        } else {
            "the fault path (ptep_set_access_flags)"
        }
    );
    expect_folded(s, "after the accessed/dirty updates", WINDOW, 0)
}
