//! Contiguous mappings (Arm ARM D8.6.1 "Contiguous bit"; Linux
//! `arch/arm64/mm/contpte.c`) on the simulator: folding on map, unfolding
//! before a change to part of a run, whole-run changes, accessed/dirty
//! aggregation, moves, and the simulator's checks.

use pgtable_arm64::desc::is_contiguous;
use pgtable_arm64::Arm64;
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

const PAGE: u64 = 4096;
const RUN: u64 = 16 * PAGE;
const PMD_RUN: u64 = 16 * (2 << 20);
const VA: VirtAddr = VirtAddr(1 << 30);
const PA: PhysAddr = PhysAddr(0x4000_0000);

type Space = Installed<Arm64, SimMmu<Arm64>, SimAlloc>;

fn machine() -> (SimMachine<Arm64>, Space) {
    let m = SimMachine::<Arm64>::new();
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m.clone(), unsafe { Installed::new(s) })
}

/// The contiguous hint of the leaf at `height` for every entry of
/// `[va, va + len)`, one flag per entry.
fn hints(s: &Space, va: VirtAddr, len: u64, height: u32) -> Vec<bool> {
    let step = 1u64 << (12 + 9 * height);
    (0..len / step)
        .map(|k| is_contiguous(s.entry(va.add(k * step), height).unwrap()))
        .collect()
}

#[test]
fn contpte_map_folds_whole_aligned_runs_only() {
    let (m, mut s) = machine();
    // 3 pages before the first run boundary, two whole runs, 5 pages after.
    let va = VA.add(RUN - 3 * PAGE);
    let len = 3 * PAGE + 2 * RUN + 5 * PAGE;
    s.map(
        va,
        PhysAddr(PA.0 + RUN - 3 * PAGE),
        len,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    let h = hints(&s, va, len, 0);
    let want: Vec<bool> = (0..len / PAGE).map(|k| (3..35).contains(&k)).collect();
    assert_eq!(h, want);
    // Every page still translates to its own address.
    for k in 0..len / PAGE {
        let (pa, _) = m
            .access(va.add(k * PAGE), pgtable_core::Access::READ)
            .unwrap();
        assert_eq!(pa.0, PA.0 + RUN - 3 * PAGE + k * PAGE);
    }
    m.check().unwrap();
}

#[test]
fn contpte_map_opt_out_and_misaligned_physical_do_not_fold() {
    let (m, mut s) = machine();
    s.map(
        VA,
        PA,
        4 * RUN,
        Prot::READ_WRITE,
        MapOptions::PAGES.no_contiguous(),
    )
    .unwrap();
    assert!(hints(&s, VA, 4 * RUN, 0).iter().all(|&c| !c));
    // Physical address 4 KiB off the run alignment: no run maps an aligned
    // physical run.
    let va2 = VA.add(8 * RUN);
    s.map(
        va2,
        PhysAddr(PA.0 + 64 * RUN + PAGE),
        4 * RUN,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    assert!(hints(&s, va2, 4 * RUN, 0).iter().all(|&c| !c));
    // Two halves of one run, mapped by two calls (with different
    // attributes, or not): neither call covers the run, nothing folds.
    let va3 = VA.add(16 * RUN);
    s.map(
        va3,
        PhysAddr(PA.0 + 128 * RUN),
        RUN / 2,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        va3.add(RUN / 2),
        PhysAddr(PA.0 + 128 * RUN + RUN / 2),
        RUN / 2,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert!(hints(&s, va3, RUN, 0).iter().all(|&c| !c));
    m.check().unwrap();
}

#[test]
fn contpte_map_folds_pmd_block_runs() {
    let (m, mut s) = machine();
    // 2 MiB blocks: one block before a 32 MiB boundary, one whole run.
    let va = VirtAddr(PMD_RUN * 4 - (2 << 20));
    let len = (2 << 20) + PMD_RUN;
    s.map(
        va,
        PhysAddr(PMD_RUN * 8 - (2 << 20)),
        len,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let h = hints(&s, va, len, 1);
    let want: Vec<bool> = (0..17).map(|k| k > 0).collect();
    assert_eq!(h, want);
    m.check().unwrap();
}

#[test]
fn contpte_partial_protect_unfolds_the_run_whole_run_protect_keeps_it() {
    let (m, mut s) = machine();
    s.map(VA, PA, 4 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // Fill the TLB with the runs' translations.
    for k in 0..4 * RUN / PAGE {
        m.access(VA.add(k * PAGE), pgtable_core::Access::READ)
            .unwrap();
    }
    // One page of the first run: that run is unfolded, the others stay.
    s.change_protection(VA.add(PAGE), PAGE, Prot::READ_ONLY)
        .unwrap();
    m.check().unwrap();
    let h = hints(&s, VA, 4 * RUN, 0);
    assert!(h[..16].iter().all(|&c| !c), "{h:?}");
    assert!(h[16..].iter().all(|&c| c), "{h:?}");
    assert_eq!(s.translate(VA.add(PAGE)).unwrap().prot, Prot::READ_ONLY);
    assert_eq!(s.translate(VA).unwrap().prot, Prot::READ_WRITE);
    // Two whole runs: all 32 entries change and keep the hint.
    s.change_protection(VA.add(RUN), 2 * RUN, Prot::READ_ONLY)
        .unwrap();
    m.check().unwrap();
    let h = hints(&s, VA, 4 * RUN, 0);
    assert!(h[16..].iter().all(|&c| c), "{h:?}");
    for k in 16..48 {
        assert_eq!(s.translate(VA.add(k * PAGE)).unwrap().prot, Prot::READ_ONLY);
    }
    assert_eq!(
        s.translate(VA.add(48 * PAGE)).unwrap().prot,
        Prot::READ_WRITE
    );
}
