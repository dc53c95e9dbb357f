//! The conformance suite of `pgtable-core` on the simulated machine with
//! the real RISC-V formats (Sv39, Sv48, Sv57), in the lower and the upper
//! half of the canonical address space. Every operation of every case is
//! followed by the simulator's stale-TLB and walker-visibility check, and
//! every access goes through the simulated walker, which decodes the exact
//! RISC-V bits and applies `hw_access` (rights, A/D).

use pgtable_core::contract::Arch;
use pgtable_core::sim::{Installed, SimMachine, SimSuiteMachine};
use pgtable_core::suite::{self, Config, Summary};
use pgtable_core::{AddressSpace, VirtAddr};
use pgtable_riscv::{RiscvPaging, Sv39, Sv48, Sv57, SVNAPOT, SVPBMT};

/// Runs the suite on a fresh simulated machine with the window at `window`
/// (default placement when `None`); returns the summary, the failure lines,
/// every line, and the table frames still live after the address space was
/// dropped.
fn run<A: Arch>(cfg: &Config, window: Option<u64>) -> (Summary, Vec<String>, Vec<String>, usize) {
    let machine = SimMachine::<A>::new();
    let space = AddressSpace::<A, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    let mut mach = SimSuiteMachine::new(machine.clone());
    if let Some(w) = window {
        mach = mach.with_window(VirtAddr(w), 16 << 30);
    }
    let sum = suite::run(&mut space, &mut mach, cfg);
    let fails = mach.failures().map(String::from).collect();
    let lines = mach.lines().to_vec();
    let last = mach.lines().last().cloned().unwrap_or_default();
    assert_eq!(
        last,
        format!("{} passed, {} failed", sum.passed, sum.failed),
        "the final line is the summary"
    );
    drop(space);
    (sum, fails, lines, machine.live_tables())
}

fn cfg() -> Config {
    Config {
        seed: 0x5c_0001,
        threshold_bytes: 1 << 20,
        // The 1 and 2 GiB moves are left to the release-mode runs.
        big_moves: false,
        ..Config::DEFAULT
    }
}

/// Cases that exercise what is RISC-V-specific: gigapages and megapages
/// (leaves above level 0, their PPN alignment), splits of both in place
/// (no break-before-make), protection changes of megapages, X clear, and
/// moves of whole PMD/PUD tables (PPN at bit 10: `OA_SHIFT`).
const MUST_PASS: &[&str] = &[
    "map_1g_block",
    "map_2m_block",
    "unmap_part_of_2m_block_splits_it",
    "unmap_part_of_1g_block_splits_it",
    "protect_2m_block_read_only_then_writable",
    "protect_execute_never",
    "move_2m_align_pmd_blocks",
    "move_4m_align_mutual_pages",
];

fn assert_green((sum, fails, lines, live): (Summary, Vec<String>, Vec<String>, usize)) {
    assert!(fails.is_empty(), "failed cases:\n{}", fails.join("\n"));
    assert_eq!(sum.failed, 0);
    // Every level may hold a leaf and the simulator can test execution, so
    // no case may be skipped.
    assert_eq!(sum.skipped, 0, "skipped cases");
    // `unsampled`: the move cases a Miri run leaves out (0 otherwise).
    assert!(
        sum.passed + sum.unsampled >= 40,
        "only {} cases passed",
        sum.passed
    );
    for case in MUST_PASS {
        let ok = format!("ok {case}");
        // Or left out of a Miri run (never printed otherwise).
        let unsampled = format!("unsampled {case}");
        assert!(
            lines.contains(&ok) || lines.contains(&unsampled),
            "no `{ok}` line"
        );
    }
    assert_eq!(live, 0, "table frames leaked");
}

#[test]
fn suite_passes_with_sv39() {
    assert_green(run::<Sv39>(&cfg(), None));
}

#[test]
fn suite_passes_with_sv39_in_the_upper_half() {
    assert_green(run::<Sv39>(&cfg(), Some(0xffff_ffc0_0000_0000)));
}

#[test]
fn suite_passes_with_sv48() {
    assert_green(run::<Sv48>(&cfg(), None));
}

#[test]
fn suite_passes_with_sv48_in_the_upper_half() {
    assert_green(run::<Sv48>(&cfg(), Some(0xffff_8000_0000_0000)));
}

#[test]
fn suite_passes_with_sv57() {
    assert_green(run::<Sv57>(&cfg(), None));
}

#[test]
fn suite_passes_with_sv57_in_the_upper_half() {
    assert_green(run::<Sv57>(&cfg(), Some(0xff00_0000_0000_0000)));
}

#[test]
fn suite_passes_with_sv48_and_svpbmt() {
    assert_green(run::<RiscvPaging<4, SVPBMT>>(&cfg(), None));
}

// With Svnapot the suite's maps of aligned 64 KiB fold into NAPOT runs,
// and its partial changes, moves and harvests go through the unfold.

#[test]
fn suite_passes_with_sv39_and_svnapot() {
    assert_green(run::<RiscvPaging<3, SVNAPOT>>(&cfg(), None));
}

#[test]
fn suite_passes_with_sv48_svpbmt_and_svnapot_in_both_halves() {
    type Full48 = RiscvPaging<4, { SVPBMT | SVNAPOT }>;
    assert_green(run::<Full48>(&cfg(), None));
    assert_green(run::<Full48>(&cfg(), Some(0xffff_8000_0000_0000)));
}

#[test]
fn suite_passes_with_sv57_and_svnapot() {
    assert_green(run::<RiscvPaging<5, { SVPBMT | SVNAPOT }>>(&cfg(), None));
}
