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
//! - `contpte_live_protect_of_part_refused`: `change_protection_live`
//!   refuses to change one page of a folded run in place
//!   (`Error::BreakBeforeMake`, nothing written), and with
//!   break-before-make allowed unfolds the run and changes the page;
//! - `contpte_access_dirty_aggregation` (hardware access flag and dirty
//!   state: FEAT_HAFDBS, which `set_tcr` enables through TCR_EL1.HA/HD
//!   only where ID_AA64MMFR1_EL1.HAFDBS reports it; run only there) and
//!   `contpte_access_dirty_aggregation_software` (always, with TCR_EL1.HA
//!   and HD cleared for the case where they were set: a store to a clean
//!   page takes a permission fault, a load through a cleared access flag
//!   an Access flag fault, and the kernel's fault path,
//!   `ptep_set_access_flags`, does what the hardware would): on a run of
//!   user pages (created clean), the accessed and
//!   dirty state is gathered over the 16 entries whichever one got the
//!   update (`ptep_get`), and cleared over the run with one flush of the
//!   whole run (`test_and_clear_young`, `clear_refs`), so the next access
//!   through a translation the TLB held sets it again; `unmap_with`
//!   reports every page of the run dirty;
//! - `contpte_cases_free_their_tables`: every table frame came back.
//!
//! Two kinds of evidence: the MMU's (a store to the protected page faults,
//! its neighbours take stores, an unmapped page faults, moved data reads
//! back at the new address, a stale TLB entry skips an access-flag update)
//! and the descriptors' (the hint on all 16 entries of a whole run, on
//! none of a partly changed one). QEMU 7.2 shows no effect of the hint
//! itself: with the library's unfold skipped, the MMU checks still pass
//! and only the descriptor checks fail, which is why both are made.
//!
//! Each case prints `ok <name>` or `FAIL <name>: <reason>` and unmaps
//! what it mapped.

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

mod cases;
mod linear;

use aarch64_cpu::asm::barrier::{isb, SY};
use aarch64_cpu::registers::{ID_AA64MMFR1_EL1, TCR_EL1};
use pgtable_arm64::bits::{AF, AP_RDONLY, CONT, DBM, OA_MASK, SW_DIRTY};
use pgtable_arm64::format::{is_contiguous, is_hw_dirty};
use pgtable_arm64::mmu::local_flush_tlb_all;
use pgtable_core::contract::{Decoded, Format};
use pgtable_core::{ClearRefs, FaultFlags, MapOptions, PhysAddr, Prot, VirtAddr};
use tock_registers::interfaces::Readable;

use crate::geom;
use crate::kmap::{KernelSpace, Size};
use crate::memory::{self, phys_to_virt, KERNEL_VA_END, PAGE_OFFSET};
use crate::platform::Arm64;
use crate::println;
use crate::probe::{self, EC_DABT_CUR};
use crate::space::{ensure, fail, load_faults, load_is, store_faults, Tally, Why, R};

/// Where the cases map, in the test space (away from the suite's window,
/// the benchmarks' and the `smp_` cases'); 16 GiB aligned, so a run of
/// level-2 blocks of every granule can start here.
const WINDOW: u64 = 0xe0_0000_0000;
/// The destination of the moves.
const MOVED: u64 = WINDOW + (16 << 20);
/// The destination of a move of part of a run.
const MOVED2: u64 = WINDOW + (24 << 20);
/// Where the run of level-2 blocks is mapped (aligned to the run).
const BLOCKS_VA: u64 = WINDOW
    + if CONT_PMD > 32 << 20 {
        CONT_PMD
    } else {
        32 << 20
    };
/// Everything the cases map lies in `[WINDOW, WINDOW + SPAN)`.
const SPAN: u64 = BLOCKS_VA - WINDOW + CONT_PMD;

/// Bytes of a page and of a level-2 block (4 KiB and 2 MiB with the
/// 4 KiB granule, 16 KiB and 32 MiB with 16 KiB, 64 KiB and 512 MiB with
/// 64 KiB).
const PAGE: u64 = geom::PAGE;
const BLOCK: u64 = geom::PMD_SIZE;
/// Entries in a contiguous run of pages and of level-2 blocks (Linux
/// `CONT_PTES` and `CONT_PMDS`: 16 and 16, 128 and 32, 32 and 32).
const RUN: u64 = geom::GRANULE.cont_ptes();
const RUN_PMD: u64 = geom::GRANULE.cont_pmds();
/// Bytes of a run of pages (64 KiB, 2 MiB, 2 MiB) and of blocks (32 MiB,
/// 1 GiB, 16 GiB).
const CONT_PTE: u64 = RUN * PAGE;
const CONT_PMD: u64 = RUN_PMD * BLOCK;
/// The most entries a run has at any granule.
const MAX_RUN: usize = 128;
/// Pages of the page-level cases: two runs.
const PAGES: u64 = 2 * RUN;

const _: () = assert!(RUN as usize <= MAX_RUN && RUN_PMD as usize <= MAX_RUN);
const _: () = assert!(WINDOW % CONT_PMD == 0 && MOVED2 + PAGES * PAGE <= BLOCKS_VA);

/// One bit per entry of a run.
type Mask = u128;

/// The mask of all `n` entries of a run.
const fn full(n: u64) -> Mask {
    if n >= 128 {
        Mask::MAX
    } else {
        (1 << n) - 1
    }
}

/// Entries in a run at `height` (0: pages, 1: level-2 blocks).
const fn run_len(height: u32) -> u64 {
    if height == 0 {
        RUN
    } else {
        RUN_PMD
    }
}

/// User read-write data.
const USER_RW: Prot = Prot::WRITE.union(Prot::USER);
/// The marker of page `p` (word 0 of its frame) is `MARK ^ p`.
const MARK: u64 = 0xc047_0000_0000_0000;

/// Physical memory the cases map: a run of level-2 blocks aligned to the
/// run (or, where such a run does not fit in the pool, one block: 64 KiB
/// pages, 32 x 512 MiB), then two runs of frames.
#[derive(Clone, Copy)]
struct Mem {
    blocks: u64,
    /// Whether `blocks` holds a whole run of blocks (otherwise one block).
    block_run: bool,
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

/// TCR_EL1.HA (bit 39) and TCR_EL1.HD (bit 40).
const TCR_HA_HD: u64 = (1 << 39) | (1 << 40);

/// Runs `f` with the hardware access-flag and dirty-state updates off
/// (TCR_EL1.HA and TCR_EL1.HD clear) on this CPU, the only one running,
/// then turns them back on as they were. Every entry the kernel itself
/// uses has the access flag set and its writable leaves are created
/// dirty, so nothing but the case's own pages needs the updates meanwhile.
fn without_hw_ad(hw: HwAd, f: impl FnOnce() -> R) -> R {
    use tock_registers::interfaces::Writeable;
    if !(hw.ha || hw.hd) {
        return f();
    }
    let tcr = TCR_EL1.get();
    TCR_EL1.set(tcr & !TCR_HA_HD);
    // The write takes effect after the isb; the architecture lets TLB
    // entries hold TCR_EL1 fields, so the local flush drops those made
    // under the old value.
    isb(SY);
    local_flush_tlb_all();
    let r = f();
    TCR_EL1.set(tcr);
    isb(SY);
    local_flush_tlb_all();
    r
}

/// Writes word 0 of the frame at `pa` through the linear map.
fn poke(pa: u64, v: u64) {
    // SAFETY: pool frames hold no Rust object; the linear map maps them
    // read-write.
    unsafe { (phys_to_virt(pa) as *mut u64).write_volatile(v) };
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

/// The raw entries of a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct RunEntries {
    raw: [u64; MAX_RUN],
    len: usize,
}

impl RunEntries {
    fn entries(&self) -> &[u64] {
        &self.raw[..self.len]
    }
}

/// The `n` raw entries at `height` from `va` on (a run: [`run_len`]).
fn entries_at(s: &KernelSpace, va: u64, height: u32, n: u64) -> Result<RunEntries, Why> {
    let size = if height == 0 { PAGE } else { BLOCK };
    let mut e = RunEntries {
        raw: [0; MAX_RUN],
        len: n as usize,
    };
    for (i, x) in e.raw[..n as usize].iter_mut().enumerate() {
        let at = va + i as u64 * size;
        match s.inspect().entry(VirtAddr(at), height) {
            Some(raw) => *x = raw,
            None => fail!("no table holds the entry at height {height} for {at:#x}"),
        }
    }
    Ok(e)
}

/// The raw entries at `height` of the run that starts at `va`.
fn run_entries(s: &KernelSpace, va: u64, height: u32) -> Result<RunEntries, Why> {
    entries_at(s, va, height, run_len(height))
}

/// Bit `i` set: entry `i` has the contiguous hint.
fn cont_mask(e: &RunEntries) -> Mask {
    e.entries()
        .iter()
        .enumerate()
        .fold(0, |m, (i, &r)| m | (Mask::from(is_contiguous(r)) << i))
}

/// Whether `raw` is a present leaf at `height`.
fn is_leaf(raw: u64, height: u32) -> bool {
    matches!(<Arm64 as Format>::decode(raw, height), Decoded::Leaf(_))
}

/// The run at `va` must be folded: all its entries present leaves, each
/// with the hint.
fn expect_folded(s: &KernelSpace, what: &str, va: u64, height: u32) -> R {
    let e = run_entries(s, va, height)?;
    for (i, &r) in e.entries().iter().enumerate() {
        ensure!(
            is_leaf(r, height),
            "{what}: entry {i} of the run at {va:#x} is {r:#x}, not a leaf at height {height}"
        );
    }
    let m = cont_mask(&e);
    ensure!(
        m == full(e.len as u64),
        "{what}: the run at {va:#x} has the contiguous hint on entries {m:#06x} only, expected all {}",
        e.len
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

/// The cases; `test` is the suite's test space, installed in TTBR0_EL1,
/// `kernel` the kernel's space, `pool` the test pool.
pub fn cases(t: &mut Tally, kernel: &KernelSpace, test: &mut KernelSpace, pool: (u64, u64)) {
    let (live_before, _) = memory::tables_live();
    let run_blocks = (pool.0 + (4 << 20)).next_multiple_of(CONT_PMD);
    let block_run = run_blocks + CONT_PMD + PAGES * PAGE <= pool.1;
    let mem = if block_run {
        Mem {
            blocks: run_blocks,
            block_run,
            pages: run_blocks + CONT_PMD,
        }
    } else {
        let blocks = (pool.0 + (4 << 20)).next_multiple_of(BLOCK);
        Mem {
            blocks,
            block_run,
            pages: blocks + BLOCK,
        }
    };
    println!(
        "contpte: {} runs of {RUN} x {} pages ({}) and of {RUN_PMD} x {} blocks ({}){}",
        geom::NAME,
        Size(PAGE),
        Size(CONT_PTE),
        Size(BLOCK),
        Size(CONT_PMD),
        if block_run {
            ""
        } else {
            "; a run of blocks does not fit in the test pool, so contpte_block_run_split splits one block"
        }
    );
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
        let [pte, pmd] = linear::linear_map_runs(kernel)?;
        println!(
            "contpte: linear map: {} x {} runs folded (of {} that can be), {} x {} runs folded (of {})",
            pte.folded,
            Size(CONT_PTE),
            pte.foldable,
            pmd.folded,
            Size(CONT_PMD),
            pmd.foldable
        );
        // A run of blocks folds only where RAM holds one, aligned: not a
        // 16 GiB run of 64 KiB pages' 512 MiB blocks in this RAM.
        let ram_holds_block_run = CONT_PMD <= 1 << 30;
        ensure!(
            pte.folded > 0 && (pmd.folded > 0 || !ram_holds_block_run),
            "no folded run of pages ({}) or of blocks ({}) in the linear map",
            pte.folded,
            pmd.folded
        );
        if !ram_holds_block_run {
            println!(
                "contpte: linear map: a {} run of blocks is larger than the RAM's aligned ranges; no run of blocks to fold",
                Size(CONT_PMD)
            );
        }
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
    run("contpte_partial_protect", cases::partial_protect);
    run("contpte_block_run_split", cases::block_run_split);
    run("contpte_partial_unmap", cases::partial_unmap);
    run("contpte_misaligned_move", cases::misaligned_move);
    run("contpte_congruent_move", cases::congruent_move);
    run(
        "contpte_live_protect_of_part_refused",
        cases::live_protect_refused,
    );
    if hw.hardware() {
        run("contpte_access_dirty_aggregation", |s, m, _| {
            cases::access_dirty(s, m, true)
        });
    }
    // The software path: on a CPU without FEAT_HAFDBS as it is; on one
    // with it, with TCR_EL1.HA/HD cleared for the case.
    run("contpte_access_dirty_aggregation_software", |s, m, hw| {
        without_hw_ad(hw, || cases::access_dirty(s, m, false))
    });
    t.case("contpte_cases_free_their_tables", || {
        let (live, _) = memory::tables_live();
        ensure!(
            live == live_before,
            "{live_before} table frames live before the cases, {live} after"
        );
        Ok(())
    });
}
