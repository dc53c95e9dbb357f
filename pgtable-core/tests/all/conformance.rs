//! The conformance suite on the simulated MMU with the test format at 3, 4
//! and 5 levels of 4 KiB pages, and on the arm64 geometries of 16 and
//! 64 KiB pages (2 to 4 levels, partly used roots) and of 4 KiB pages with
//! 52 bits. Every operation of every case is followed by the simulator's
//! stale-TLB and walker-visibility check.
#![cfg(all(feature = "sim", feature = "suite"))]

use crate::common::ProbesOnly;
use pgtable_core::contract::Arch;
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu, SimSuiteMachine};
use pgtable_core::suite::{self, Config, Summary};
use pgtable_core::test_format::TestFormat;
use pgtable_core::AddressSpace;

/// Runs the suite on a fresh simulated machine; returns the summary, the
/// failure lines and the number of table frames still live after the
/// address space was dropped.
fn run<A: Arch>(cfg: &Config) -> (Summary, Vec<String>, usize) {
    let (sum, fails, _, live) = run_lines::<A>(cfg);
    (sum, fails, live)
}

/// [`run`], also returning the `skip` lines.
fn run_lines<A: Arch>(cfg: &Config) -> (Summary, Vec<String>, Vec<String>, usize) {
    let (machine, mut space) = fresh::<A>();
    let mut mach = SimSuiteMachine::new(machine.clone());
    let sum = suite::run(&mut space, &mut mach, cfg);
    let fails = mach.failures().map(String::from).collect();
    let skips = mach
        .lines()
        .iter()
        .filter(|l| l.starts_with("skip "))
        .cloned()
        .collect();
    let last = mach.lines().last().cloned().unwrap_or_default();
    assert_eq!(
        last,
        format!("{} passed, {} failed", sum.passed, sum.failed),
        "the final line is the summary"
    );
    drop(space);
    (sum, fails, skips, machine.live_tables())
}

type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

/// A fresh simulated machine and an address space of both halves on it.
fn fresh<A: Arch>() -> (SimMachine<A>, Space<A>) {
    let machine = SimMachine::<A>::new();
    let space = AddressSpace::<A, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (machine, unsafe { Installed::new(space) })
}

/// The cases `only` of the suite on a fresh space through a forgetful
/// [`ProbesOnly`] machine (no echo): the summary, the machine and the
/// space.
fn run_forgetful<A: Arch>(only: &'static [&'static str]) -> (Summary, ProbesOnly<A>, Space<A>) {
    let (machine, mut space) = fresh::<A>();
    let mut mach = ProbesOnly::forgetful(SimSuiteMachine::new(machine).with_echo(false));
    let cfg = Config { only, ..cfg() };
    let sum = suite::run(&mut space, &mut mach, &cfg);
    (sum, mach, space)
}

/// The configuration of the host runs: a 256 KiB threshold keeps debug
/// builds quick (every validated word is a simulated load and store); the
/// 4-level run validates 1 MiB.
fn cfg() -> Config {
    Config {
        seed: 0x5eed_0001,
        threshold_bytes: 256 << 10,
        // The 1 and 2 GiB moves run in their own test (release builds).
        big_moves: false,
        ..Config::DEFAULT
    }
}

/// Cases in a run without the big moves: 14 map/unmap/protect cases, 4
/// move cases outside the matrix (3 errors, protection kept), 5
/// alignments of the 8 KiB move (pages only), 5 alignments times
/// pages/blocks of the 2, 4 and 5 MiB moves, and protect / move / unmap at
/// the last entries of each half.
const CASES: u32 = 14 + 4 + 5 + 3 * 5 * 2 + 3 * 2;
/// The 1 and 2 GiB moves add 5 alignments times pages/blocks each.
const BIG_CASES: u32 = 2 * 5 * 2;

fn assert_green(sum: Summary, fails: Vec<String>, live: usize, cases: u32) {
    assert!(fails.is_empty(), "failed cases:\n{}", fails.join("\n"));
    assert_eq!(sum.failed, 0);
    // `unsampled`: the move cases a Miri run leaves out (0 otherwise).
    assert_eq!(sum.passed + sum.skipped + sum.unsampled, cases, "cases run");
    assert_eq!(live, 0, "table frames leaked");
}

#[test]
fn suite_passes_on_the_simulator_with_4_levels() {
    let cfg = Config {
        threshold_bytes: 1 << 20,
        ..cfg()
    };
    let (sum, fails, live) = run::<TestFormat<4>>(&cfg);
    assert_green(sum, fails, live, CASES);
    // The test format allows 1 GiB blocks and the default RAM holds one,
    // and the simulator can test execution: nothing may be skipped.
    assert_eq!(sum.skipped, 0);
}

#[test]
fn suite_passes_on_the_simulator_with_3_levels() {
    let (sum, fails, live) = run::<TestFormat<3>>(&cfg());
    assert_green(sum, fails, live, CASES);
}

#[test]
fn suite_passes_on_the_simulator_with_5_levels() {
    let (sum, fails, live) = run::<TestFormat<5>>(&cfg());
    assert_green(sum, fails, live, CASES);
}

#[test]
fn suite_passes_with_a_small_unaligned_ram_pool() {
    // 40 MiB + 12 KiB starting 12 KiB past a 2 MiB boundary: no 1 GiB
    // block is possible (those cases skip), 2 MiB blocks are.
    let (machine, mut space) = fresh::<TestFormat<4>>();
    let mut mach = SimSuiteMachine::new(machine)
        .with_ram(pgtable_core::PhysAddr(0x8020_3000), (40 << 20) + 0x3000);
    let sum = suite::run(&mut space, &mut mach, &cfg());
    let fails: Vec<String> = mach.failures().map(String::from).collect();
    assert!(fails.is_empty(), "failed cases:\n{}", fails.join("\n"));
    // Under Miri either 1 GiB case may be left out (`unsampled`; never
    // printed otherwise).
    let left_out = |case: &str| mach.lines().contains(&format!("unsampled {case}"));
    let gib_cases = ["map_1g_block", "unmap_part_of_1g_block_splits_it"];
    let gib_left_out = gib_cases.iter().filter(|c| left_out(c)).count() as u32;
    assert_eq!(sum.passed + sum.unsampled, CASES - 2 + gib_left_out);
    assert_eq!(sum.skipped + gib_left_out, 2);
    assert!(
        mach.lines()
            .iter()
            .any(|l| l.starts_with("skip map_1g_block"))
            || left_out("map_1g_block"),
        "the 1 GiB block case should skip without a 1 GiB aligned RAM block"
    );
}

#[test]
fn suite_reports_a_failing_case_and_counts_it() {
    // A machine whose stores are silently dropped must fail the data
    // checks, and the summary must say so.
    use suite::Machine;
    let (sum, mach, space) = run_forgetful::<TestFormat<4>>(&["map_4k_pages", "map_2m_block"]);
    assert_eq!(
        sum,
        Summary {
            passed: 0,
            failed: 2,
            skipped: 0,
            unsampled: 0,
        }
    );
    assert_eq!(mach.sim.lines().last().unwrap(), "0 passed, 2 failed");
    assert!(mach.sim.failures().all(|l| l.contains("expected")));
    // The failed cases cleaned the window up.
    let mut left = 0;
    let (w, wl) = mach.window();
    space.walk(w, wl, |_| left += 1).unwrap();
    assert_eq!(left, 0);
}

#[test]
fn suite_big_moves_pass_on_the_simulator() {
    // The 1 GiB and 2 GiB moves of the matrix, with a smaller threshold to
    // keep debug builds quick (the samples at the middle and the end of
    // each range are still checked).
    let cfg = Config {
        threshold_bytes: 256 << 10,
        big_moves: true,
        only: &["move_1g", "move_2g"],
        ..cfg()
    };
    let (sum, fails, live) = run::<TestFormat<4>>(&cfg);
    assert_green(sum, fails, live, BIG_CASES);
    assert_eq!(sum.skipped, 0);
}

// ----- the suite on 16 and 64 KiB pages and on 52-bit addresses -----
//
// The same cases in the format's sizes (a page, a PMD and a PUD entry are
// 16 KiB, 32 MiB and 64 GiB with 16 KiB pages, 64 KiB, 512 MiB and 4 TiB
// with 64 KiB pages); the simulator's suite machine sizes its window and
// RAM pool from the geometry, so the PUD block cases run too.

/// arm64 16 KiB pages, 48-bit VA: 4 levels, a root of 2 entries (one per
/// half).
type K16x48 = TestFormat<4, 14, 48>;
/// arm64 16 KiB pages, 47-bit VA: 3 full levels.
type K16x47 = TestFormat<3, 14, 0>;
/// arm64 64 KiB pages, 48-bit VA: 3 levels, a root of 64 entries.
type K64x48 = TestFormat<3, 16, 48>;
/// arm64 64 KiB pages, 42-bit VA: 2 levels, no PUD.
type K64x42 = TestFormat<2, 16, 0>;
/// arm64 4 KiB pages, 52-bit VA (LPA2): 5 levels, a root of 16 entries.
type K4x52 = TestFormat<5, 12, 52>;

/// Counts the skip lines whose reason contains `why`.
fn skipped_for(skips: &[String], why: &str) -> u32 {
    skips.iter().filter(|l| l.contains(why)).count() as u32
}

/// Runs every case on `A` and checks that exactly the expected ones skip.
fn green_on<A: Arch>(skipped: u32) -> Vec<String> {
    let (sum, fails, skips, live) = run_lines::<A>(&cfg());
    assert_green(sum, fails, live, CASES);
    if sum.unsampled == 0 {
        assert_eq!(sum.skipped, skipped, "skipped cases: {skips:?}");
        assert_eq!(sum.passed, CASES - skipped);
    } else {
        // Under Miri, cases left out skip nothing.
        assert!(sum.skipped <= skipped, "skipped cases: {skips:?}");
    }
    skips
}

#[test]
fn suite_passes_with_16k_pages_and_48_bits() {
    // Both halves of the 2-entry root: the last entries of each half pass
    // (no skip), as do the 64 GiB PUD blocks.
    green_on::<K16x48>(0);
}

#[test]
fn suite_passes_with_16k_pages_and_47_bits() {
    green_on::<K16x47>(0);
}

#[test]
fn suite_passes_with_64k_pages_and_48_bits() {
    green_on::<K64x48>(0);
}

#[test]
fn suite_passes_with_64k_pages_and_42_bits() {
    // Two levels: no PUD, so the two PUD block cases and the 7 moves at PUD
    // alignment (one of two pages, the others of pages and blocks) skip.
    let skips = green_on::<K64x42>(9);
    // Exactly these skip; under Miri, where cases are left out, at most.
    let exact = |n: u32, want: u32| n == want || cfg!(miri) && n < want;
    let blocks = skipped_for(&skips, "none at height 2");
    assert!(exact(blocks, 2), "{skips:?}");
    assert!(exact(skipped_for(&skips, "no PUD level"), 7), "{skips:?}");
    assert!(cfg!(miri) || skips.iter().any(|l| l.starts_with("skip map_4t_block")));
    assert!(skips
        .iter()
        .all(|l| !l.contains("align_pud") || l.contains("no PUD level")));
}

#[test]
fn suite_passes_with_4k_pages_and_52_bits() {
    // The 4 KiB names and sizes, with a 16-entry root.
    let (sum, fails, skips, live) = run_lines::<K4x52>(&cfg());
    assert_green(sum, fails, live, CASES);
    assert_eq!(sum.skipped, 0, "{skips:?}");
}

/// Runs the PUD-sized moves (`only`: their names, which give the sizes) on
/// `A`; returns the summary and the skip lines.
fn big_moves_on<A: Arch>(only: &'static [&'static str]) -> (Summary, Vec<String>) {
    let cfg = Config {
        big_moves: true,
        only,
        ..cfg()
    };
    let (sum, fails, skips, live) = run_lines::<A>(&cfg);
    assert_green(sum, fails, live, BIG_CASES);
    (sum, skips)
}

#[test]
fn suite_big_moves_of_puds_with_16k_and_64k_pages() {
    // One and two PUD entries (64 and 128 GiB, 4 and 8 TiB): the moves of
    // pages, and of blocks to another offset inside a PMD entry (which
    // become pages), would need more than 4 MiB of last-level tables per
    // range and skip; the moves of blocks that stay blocks (half-PMD, PMD,
    // PUD and mutual alignment) pass.
    for (sum, skips) in [
        big_moves_on::<K16x48>(&["move_64g", "move_128g"]),
        big_moves_on::<K64x48>(&["move_4t", "move_8t"]),
    ] {
        assert_eq!(sum.passed, 2 * 4, "{skips:?}");
        assert_eq!(sum.skipped, 2 * 5 + 2, "{skips:?}");
        assert_eq!(skipped_for(&skips, "of last-level tables"), 12);
        // The skipped ones: every move of pages, and the blocks at page
        // alignment (`align_16k_blocks`, `align_64k_blocks`).
        assert!(
            skips
                .iter()
                .all(|l| l.contains("_pages:") || l.contains("k_blocks:")),
            "{skips:?}"
        );
    }
    // With two levels there is no PUD to move.
    let (sum, skips) = big_moves_on::<K64x42>(&["move_4t", "move_8t"]);
    assert_eq!(sum.skipped, BIG_CASES);
    assert_eq!(skipped_for(&skips, "no PUD level"), BIG_CASES);
}

#[test]
fn suite_fails_on_a_forgetful_machine_with_64k_pages() {
    // The cases named in the format's sizes check data as with 4 KiB pages:
    // dropped stores fail the page, PMD block and PUD block cases.
    let only = &["map_64k_pages", "map_512m_block", "map_4t_block"];
    let (sum, mach, _space) = run_forgetful::<K64x48>(only);
    assert_eq!(
        sum,
        Summary {
            passed: 0,
            failed: 3,
            skipped: 0,
            unsampled: 0
        },
        "{:?}",
        mach.sim.lines()
    );
    assert!(mach.sim.failures().all(|l| l.contains("expected")));
}

#[test]
fn suite_refuses_a_window_too_small_for_the_geometry() {
    // A window that serves 4 KiB pages (1 GiB aligned, 8 GiB long) is too
    // small for 16 KiB pages: a PUD entry maps 64 GiB.
    let (machine, mut space) = fresh::<K16x48>();
    let mut mach = SimSuiteMachine::new(machine)
        .with_echo(false)
        .with_window(pgtable_core::VirtAddr((1 << 44) + (1 << 30)), 8 << 30);
    let sum = suite::run(&mut space, &mut mach, &cfg());
    assert_eq!((sum.passed, sum.failed), (0, 1));
    assert_eq!(
        mach.failures().collect::<Vec<_>>(),
        ["FAIL setup: the window must be 64 GiB aligned and at least 512 GiB long"]
    );
}
