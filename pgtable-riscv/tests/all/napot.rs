//! Svnapot through pgtable-core's contiguous runs, on the simulated
//! machine: `map` writes a 64 KiB NAPOT run (16 identical PTEs with N set
//! and PPN\[0\]\[3:0\] = `0b1000`) where it covers an aligned 64 KiB with
//! an aligned physical address, a change to part of a run first unfolds it
//! into plain PTEs that each name their own page, accessed/dirty state is
//! read over the run, and every page translates to its own frame
//! throughout. Without Svnapot every map writes plain PTEs.

use pgtable_core::contract::{Access, Arch, BbmReason, Decoded, Format};
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{
    AddressSpace, Error, LiveOptions, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr,
};
use pgtable_riscv::bits::{N, NAPOT_64K_MASK, NAPOT_64K_PPN};
use pgtable_riscv::{RiscvPaging, SVNAPOT, SVPBMT};

type Full48 = RiscvPaging<4, { SVPBMT | SVNAPOT }>;

const PAGE: u64 = 0x1000;
const RUN: u64 = 16 * PAGE;
const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);

type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

fn machine<A: Arch>() -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m.clone(), unsafe { Installed::new(s) })
}

fn pte<A: Arch>(s: &Space<A>, va: VirtAddr) -> u64 {
    s.inspect().entry(va, 0).unwrap()
}

/// Every page of `[va, va + len)` translates to its own frame from `pa`,
/// through the tables (`translate`) and through the simulated hart.
fn assert_translates<A: Arch>(
    m: &SimMachine<A>,
    s: &Space<A>,
    va: VirtAddr,
    pa: PhysAddr,
    len: u64,
) {
    for k in 0..len / PAGE {
        let want = PhysAddr(pa.0 + k * PAGE + 0x18);
        assert_eq!(
            s.translate(va.add(k * PAGE + 0x18)).unwrap().pa,
            want,
            "page {k}"
        );
        assert_eq!(
            m.translate(va.add(k * PAGE + 0x18)).unwrap(),
            want,
            "page {k}"
        );
    }
}

#[test]
fn map_of_aligned_64k_writes_napot_runs_of_identical_ptes() {
    let (m, mut s) = machine::<Full48>();
    s.map(VA, PA, 4 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    for r in 0..4u64 {
        let first = pte(&s, VA.add(r * RUN));
        assert_ne!(first & N, 0, "run {r}");
        assert_eq!(first & NAPOT_64K_MASK, NAPOT_64K_PPN, "run {r}");
        assert_eq!(
            Full48::decode(first, 0),
            Decoded::Leaf(PhysAddr(PA.0 + r * RUN))
        );
        for k in 0..16 {
            assert_eq!(
                pte(&s, VA.add(r * RUN + k * PAGE)),
                first,
                "run {r} page {k}"
            );
        }
    }
    assert_translates(&m, &s, VA, PA, 4 * RUN);
    assert!(m.tlb_holds_run(VA));
    // `walk` reports each page with its own frame.
    let mut seen = Vec::new();
    s.walk(VA, RUN, |mp| seen.push((mp.va, mp.pa))).unwrap();
    let want: Vec<_> = (0..16)
        .map(|k| (VA.add(k * PAGE), PhysAddr(PA.0 + k * PAGE)))
        .collect();
    assert_eq!(seen, want);
    m.check().unwrap();
}

#[test]
fn only_whole_aligned_runs_are_folded() {
    let (m, mut s) = machine::<Full48>();
    // A map from the middle of a run: its head and tail stay plain, the
    // whole run between them is folded.
    let va = VA.add(8 * PAGE);
    let pa = PhysAddr(PA.0 + 8 * PAGE);
    s.map(va, pa, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    for k in 0..32 {
        let raw = pte(&s, va.add(k * PAGE));
        assert_eq!(raw & N != 0, (8..24).contains(&k), "page {k}");
    }
    assert_translates(&m, &s, va, pa, 2 * RUN);
    // A physical address that is not congruent to the virtual one modulo
    // 64 KiB: nothing folds.
    let va2 = VirtAddr(0x5000_0000);
    let pa2 = PhysAddr(0x9000_1000);
    s.map(va2, pa2, RUN * 2, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    for k in 0..32 {
        assert_eq!(pte(&s, va2.add(k * PAGE)) & N, 0, "page {k}");
    }
    assert_translates(&m, &s, va2, pa2, 2 * RUN);
    m.check().unwrap();
}

#[test]
fn no_contiguous_and_harts_without_svnapot_get_plain_ptes() {
    let (m, mut s) = machine::<Full48>();
    s.map(
        VA,
        PA,
        RUN,
        Prot::READ_WRITE,
        MapOptions::PAGES.no_contiguous(),
    )
    .unwrap();
    for k in 0..16 {
        let raw = pte(&s, VA.add(k * PAGE));
        assert_eq!(raw & N, 0, "page {k}");
        assert_eq!(
            Full48::decode(raw, 0),
            Decoded::Leaf(PhysAddr(PA.0 + k * PAGE))
        );
    }
    assert_translates(&m, &s, VA, PA, RUN);
    m.check().unwrap();
    // The same map on a format without Svnapot (N reserved): plain PTEs.
    let (m, mut s) = machine::<RiscvPaging<4, SVPBMT>>();
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    for k in 0..16 {
        assert_eq!(pte(&s, VA.add(k * PAGE)) & N, 0, "page {k}");
    }
    assert_translates(&m, &s, VA, PA, RUN);
    m.check().unwrap();
}

#[test]
fn a_partial_change_unfolds_the_run_into_ptes_of_their_own_pages() {
    let (m, mut s) = machine::<Full48>();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    assert_translates(&m, &s, VA, PA, 2 * RUN);
    s.change_protection(VA.add(5 * PAGE), PAGE, Prot::READ_ONLY)
        .unwrap();
    for k in 0..16 {
        let raw = pte(&s, VA.add(k * PAGE));
        assert_eq!(raw & N, 0, "page {k}");
        assert_eq!(
            Full48::decode(raw, 0),
            Decoded::Leaf(PhysAddr(PA.0 + k * PAGE))
        );
        assert_eq!(Full48::leaf_prot(raw, 0).writable(), k != 5, "page {k}");
    }
    // The other run is whole: still folded.
    assert_ne!(pte(&s, VA.add(RUN)) & N, 0);
    assert_translates(&m, &s, VA, PA, 2 * RUN);
    assert!(m.access(VA.add(5 * PAGE), Access::WRITE).is_err());
    m.access(VA.add(6 * PAGE), Access::WRITE).unwrap();
    // A whole-run change keeps the run folded.
    s.change_protection(VA.add(RUN), RUN, Prot::READ_ONLY)
        .unwrap();
    let raw = pte(&s, VA.add(RUN + 3 * PAGE));
    assert_ne!(raw & N, 0);
    assert!(!Full48::leaf_prot(raw, 0).writable());
    m.check().unwrap();
}

#[test]
fn a_live_partial_change_of_a_run_is_refused_unless_break_before_make_is_allowed() {
    let (m, mut s) = machine::<Full48>();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let before: Vec<u64> = (0..32).map(|k| pte(&s, VA.add(k * PAGE))).collect();
    // Unfolding clears the whole run for a moment: not "live".
    assert_eq!(
        s.change_protection_live(
            VA.add(RUN + 3 * PAGE),
            PAGE,
            Prot::READ_ONLY,
            LiveOptions::IN_PLACE
        ),
        Err(Error::BreakBeforeMake(
            VA.add(RUN + 3 * PAGE),
            BbmReason::ContiguousRun
        ))
    );
    let after: Vec<u64> = (0..32).map(|k| pte(&s, VA.add(k * PAGE))).collect();
    assert_eq!(before, after);
    // Whole runs change in place, entry by entry, and stay folded.
    s.change_protection_live(VA, RUN, Prot::READ_ONLY, LiveOptions::IN_PLACE)
        .unwrap();
    assert_ne!(pte(&s, VA) & N, 0);
    assert!(!Full48::leaf_prot(pte(&s, VA.add(4 * PAGE)), 0).writable());
    // Allowed, the partial change unfolds the run.
    s.change_protection_live(
        VA.add(RUN + 3 * PAGE),
        PAGE,
        Prot::READ_ONLY,
        LiveOptions::ALLOW_BBM,
    )
    .unwrap();
    assert_eq!(pte(&s, VA.add(RUN)) & N, 0);
    assert!(!Full48::leaf_prot(pte(&s, VA.add(RUN + 3 * PAGE)), 0).writable());
    assert_translates(&m, &s, VA, PA, 2 * RUN);
    m.check().unwrap();
}

#[test]
fn accessed_and_dirty_state_is_read_over_the_run() {
    let (m, mut s) = machine::<Full48>();
    let user = Prot::READ_WRITE | Prot::USER;
    s.map(VA, PA, RUN, user, MapOptions::PAGES).unwrap();
    // User writable leaves start clean; a store to page 9 dirties the
    // PTE the hart walked (or the first of the run).
    assert!(!Full48::is_dirty(s.translate(VA).unwrap().entry));
    m.access(
        VA.add(9 * PAGE),
        Access {
            write: true,
            exec: false,
            user: true,
        },
    )
    .unwrap();
    for k in 0..16 {
        assert!(
            Full48::is_dirty(s.translate(VA.add(k * PAGE)).unwrap().entry),
            "page {k}"
        );
        assert!(s.ptep_get(VA.add(k * PAGE)).unwrap().dirty(), "page {k}");
    }
    // Unfolding keeps it: every plain PTE carries the run's state.
    s.change_protection(VA, PAGE, Prot::READ_ONLY | Prot::USER)
        .unwrap();
    for k in 0..16 {
        let raw = pte(&s, VA.add(k * PAGE));
        assert_eq!(raw & N, 0);
        assert!(Full48::is_dirty(raw), "page {k}");
    }
    m.check().unwrap();
}

#[test]
fn unmap_of_a_run_reports_every_page_with_its_own_frame() {
    let (m, mut s) = machine::<Full48>();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let mut frames = Vec::new();
    s.unmap_with(VA.add(RUN - 4 * PAGE), 8 * PAGE, |e| {
        frames.push((e.va(), e.pa()))
    })
    .unwrap();
    let want: Vec<_> = (12..20)
        .map(|k| (VA.add(k * PAGE), Some(PhysAddr(PA.0 + k * PAGE))))
        .collect();
    assert_eq!(frames, want);
    // Both runs were unfolded: the rest of them maps as before.
    for k in (0..12).chain(20..32) {
        let raw = pte(&s, VA.add(k * PAGE));
        assert_eq!(raw & N, 0, "page {k}");
        assert_eq!(
            Full48::decode(raw, 0),
            Decoded::Leaf(PhysAddr(PA.0 + k * PAGE))
        );
    }
    m.check().unwrap();
}

#[test]
fn moves_keep_congruent_runs_folded_and_unfold_the_others() {
    let (m, mut s) = machine::<Full48>();
    s.map(VA, PA, 2 * RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // To a 64 KiB-aligned destination: the runs move folded.
    let new = VirtAddr(0x6000_0000);
    s.move_page_tables(VA, new, 2 * RUN, MoveOptions::DEFAULT)
        .unwrap();
    assert_ne!(pte(&s, new) & N, 0);
    assert_translates(&m, &s, new, PA, 2 * RUN);
    // To a destination off by one page: every run is unfolded first.
    let off = VirtAddr(0x7000_1000);
    s.move_page_tables(new, off, 2 * RUN, MoveOptions::DEFAULT)
        .unwrap();
    for k in 0..32 {
        assert_eq!(pte(&s, off.add(k * PAGE)) & N, 0, "page {k}");
    }
    assert_translates(&m, &s, off, PA, 2 * RUN);
    m.check().unwrap();
}

#[test]
fn a_napot_run_maps_each_address_to_its_own_page() {
    let base = PhysAddr(0x8000_0000);
    let pte = Full48::try_napot_64k(base, Prot::READ_WRITE).unwrap();
    // The 16 entries of the run all hold `pte`.
    let run = [pte; 16];
    for (j, e) in run.iter().enumerate() {
        let va = VirtAddr(0x4000_0000 + j as u64 * 0x1000);
        assert_eq!(
            Full48::napot_page(*e, 0, va),
            Some(PhysAddr(base.0 + j as u64 * 0x1000))
        );
        // A/D are per entry, as the hardware updates the one it walked.
        assert!(Full48::is_young(*e));
        assert!(!Full48::is_dirty(Full48::mkclean(*e, 0)));
    }
    // Without Svnapot N is reserved.
    assert_eq!(RiscvPaging::<4>::decode(pte, 0), Decoded::Invalid);
}

/// `Prot::NONE` with Svnapot and Svpbmt: a mapping made `NONE` is folded
/// into NAPOT runs like any other (V clear, so the hart ignores them),
/// faults on every access, and opens again in part (the run unfolded) and
/// whole; the encoding keeps its PPN and PBMT at every level.
#[test]
fn prot_none_runs_fault_and_open_again_with_svnapot() {
    let (m, mut s) = machine::<Full48>();
    s.map(VA, PA, RUN, Prot::NONE, MapOptions::PAGES).unwrap();
    assert!((0..16).all(|k| Full48::is_cont(pte(&s, VA.add(k * PAGE)), 0)));
    assert!(m.read_u64(VA.add(5 * PAGE)).is_err());
    assert_eq!(s.translate(VA.add(5 * PAGE)).unwrap().pa, PA.add(5 * PAGE));
    pgtable_testkit::ops::map_prot_none_then_open_part_then_unmap::<Full48>();
    pgtable_testkit::ops::prot_none_encoding_is_a_leaf_and_never_a_software_entry::<Full48>();
    pgtable_testkit::ops::prot_none_faults_every_access_and_keeps_its_frame::<Full48>();
}
