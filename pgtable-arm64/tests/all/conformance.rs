//! The conformance suite and simulator checks with the real arm64 formats:
//! the exact descriptor bits are walked by pgtable-core's simulated MMU
//! (FEAT_HAFDBS semantics from `Format::hw_access`, a TLB, and the rule that
//! a table write is invisible to the walker until a barrier).

use std::sync::atomic::Ordering::Relaxed;

use pgtable_arm64::{
    set_live_entry, Arm64, Arm64K16, Arm64K16Lpa2, Arm64K16Va36, Arm64K16Va47, Arm64K64,
    Arm64K64Va42, Arm64K64Va52, Arm64Lpa2, Arm64Va39, LiveEntry,
};
use pgtable_core::contract::{Access, AccessFault, Arch, Format, Mmu};
use pgtable_core::sim::{CheckError, Installed, SimFaultKind, SimMachine, SimSuiteMachine};
use pgtable_core::suite::{self, Config};
use pgtable_core::test_format::TestFormat;
use pgtable_core::{AddressSpace, LiveOptions, MapOptions, PhysAddr, Prot, VirtAddr};

const VA: VirtAddr = VirtAddr(0x4000_0000);
const PAGE: u64 = 4096;

/// Runs the suite on a fresh simulated machine with format `A`; returns
/// the summary and the names of the failed cases.
fn run_suite<A: Arch + Send>() -> (suite::Summary, Vec<String>) {
    let machine = SimMachine::<A>::new();
    let space = AddressSpace::<A, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    let mut mach = SimSuiteMachine::new(machine.clone()).with_echo(false);
    // A 64 KiB validation threshold keeps the debug-build run short; every
    // case still maps, moves and checks its whole range.
    let cfg = Config {
        threshold_bytes: 64 << 10,
        ..Config::DEFAULT
    };
    let sum = suite::run(&mut space, &mut mach, &cfg);
    let last = mach.lines().last().unwrap().clone();
    assert_eq!(
        last,
        format!("{} passed, {} failed", sum.passed, sum.failed),
        "final line"
    );
    let failed = mach
        .failures()
        .map(|l| l.split(':').next().unwrap().to_string())
        .collect();
    (sum, failed)
}

/// The arm64 format must pass every case the reference format of
/// pgtable-core (`TestFormat`) passes: a case failing for both is a
/// finding against the suite or the core, not against the format (and is
/// printed).
fn check_against_reference<A: Arch + Send>() {
    compare::<A, TestFormat<4>>(0);
}

/// As [`check_against_reference`], against `R`, the reference format of
/// `A`'s geometry (pages, levels, VA bits), which allows blocks at every
/// height up to the PUD: `no_pud_blocks` is 2 where `A` has none there
/// (16 KiB pages without LPA2, 64 KiB pages without a 52-bit output
/// address), the two PUD block cases that skip for `A` only.
fn check_against<A: Arch + Send, R: Arch + Send>(no_pud_blocks: u32) {
    assert_eq!(
        (A::PAGE_SHIFT, A::LEVELS, A::VA_BITS),
        (R::PAGE_SHIFT, R::LEVELS, R::VA_BITS)
    );
    assert_eq!(A::leaf_allowed(2), no_pud_blocks == 0 && A::LEVELS > 2);
    compare::<A, R>(no_pud_blocks);
}

fn compare<A: Arch + Send, R: Arch + Send>(skipped_more: u32) {
    let (sum, failed) = run_suite::<A>();
    let (ref_sum, ref_failed) = run_suite::<R>();
    let own: Vec<&String> = failed.iter().filter(|f| !ref_failed.contains(f)).collect();
    assert!(
        own.is_empty(),
        "{} fails where the reference passes: {own:#?}",
        A::NAME
    );
    println!("{}: {sum:?}; reference: {ref_sum:?}", A::NAME);
    if !failed.is_empty() {
        println!(
            "{}: failing for the reference format too: {failed:?}",
            A::NAME
        );
    }
    assert!(sum.passed > 0);
    // Under Miri each run leaves a different part of the move matrix out
    // (`unsampled`, 0 otherwise).
    assert!(
        sum.passed + sum.unsampled + skipped_more >= ref_sum.passed + ref_sum.unsampled,
        "{sum:?} vs reference {ref_sum:?}"
    );
    // Exact when both ran every case (always, except under Miri, where
    // the two formats leave different cases out).
    if sum.unsampled == 0 && ref_sum.unsampled == 0 {
        assert_eq!(
            sum.skipped,
            ref_sum.skipped + skipped_more,
            "{sum:?} vs {ref_sum:?}"
        );
    }
}

#[test]
fn conformance_suite_passes_on_the_simulated_machine_48bit() {
    check_against_reference::<Arm64>();
}

#[test]
fn conformance_suite_passes_on_the_simulated_machine_39bit() {
    check_against_reference::<Arm64Va39>();
}

/// One test a geometry: `name: format, reference format of the same
/// geometry, PUD block cases that skip for the format only;`
/// ([`check_against`]).
macro_rules! against_the_same_geometry {
    ($($name:ident: $a:ty, $r:ty, $no_pud_blocks:expr;)*) => {$(
        #[test]
        fn $name() {
            check_against::<$a, $r>($no_pud_blocks);
        }
    )*};
}

against_the_same_geometry! {
    conformance_suite_passes_on_the_simulated_machine_4k_52bit_lpa2:
        Arm64Lpa2, TestFormat<5, 12, 52>, 0;
    conformance_suite_passes_on_the_simulated_machine_16k_48bit:
        Arm64K16, TestFormat<4, 14, 48>, 2;
    conformance_suite_passes_on_the_simulated_machine_16k_47bit:
        Arm64K16Va47, TestFormat<3, 14, 0>, 2;
    conformance_suite_passes_on_the_simulated_machine_16k_36bit:
        Arm64K16Va36, TestFormat<2, 14, 0>, 0;
    conformance_suite_passes_on_the_simulated_machine_16k_52bit_lpa2:
        Arm64K16Lpa2, TestFormat<4, 14, 52>, 0;
    conformance_suite_passes_on_the_simulated_machine_64k_48bit:
        Arm64K64, TestFormat<3, 16, 48>, 2;
    conformance_suite_passes_on_the_simulated_machine_64k_42bit:
        Arm64K64Va42, TestFormat<2, 16, 0>, 0;
    conformance_suite_passes_on_the_simulated_machine_64k_52bit:
        Arm64K64Va52, TestFormat<3, 16, 52>, 0;
}

/// A space with one mapped kernel page at `VA` and an empty PTE slot next
/// to it (so the PTE table exists).
fn one_page<A: Arch>() -> (
    SimMachine<A>,
    Installed<A, pgtable_core::sim::SimMmu<A>, pgtable_core::sim::SimAlloc>,
) {
    let machine = SimMachine::<A>::new();
    let space = AddressSpace::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    space
        .map(
            VA,
            PhysAddr(0x8000_0000),
            PAGE,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
    machine.check().unwrap();
    (machine, space)
}

#[test]
fn nosync_write_without_barrier_is_invisible_to_the_walker() {
    let (machine, space) = one_page::<Arm64>();
    let va = VirtAddr(VA.0 + PAGE);
    // SAFETY: a leaf into an empty entry; the missing barrier is the point
    // (the simulated machine reports it).
    let slot = unsafe { space.inspect().slot(va, 0) }.unwrap();
    let pte = Arm64::leaf(PhysAddr(0x8000_1000), Prot::READ_WRITE, 0);
    Arm64::set_pte_nosync(space.mmu(), slot, pte);
    // The walker still sees the empty entry, and the check names the write.
    let fault = machine.read_u64(va).unwrap_err();
    assert_eq!(fault.kind, SimFaultKind::Translation { height: 0 });
    match machine.check() {
        Err(CheckError::Pending(p)) => assert_eq!((p.old, p.new), (0, pte)),
        other => panic!("expected a pending write, got {other:?}"),
    }
    // The barrier makes it visible.
    space.mmu().walker_barrier();
    machine.check().unwrap();
    machine.phys_write_u64(PhysAddr(0x8000_1000), 0xfeed);
    assert_eq!(machine.read_u64(va).unwrap(), 0xfeed);
}

#[test]
fn set_pte_at_is_visible_at_once() {
    let (machine, space) = one_page::<Arm64>();
    let va = VirtAddr(VA.0 + PAGE);
    // SAFETY: a leaf into an empty entry, by the arch's own setter.
    let slot = unsafe { space.inspect().slot(va, 0) }.unwrap();
    let pte = Arm64::leaf(PhysAddr(0x8000_1000), Prot::READ_WRITE, 0);
    Arm64::set_pte_at(space.mmu(), va, slot, pte);
    machine.check().unwrap();
    assert!(machine.read_u64(va).is_ok());
}

#[test]
fn break_before_make_leaves_no_stale_translation() {
    let (machine, space) = one_page::<Arm64>();
    machine.phys_write_u64(PhysAddr(0x8000_0000), 1);
    machine.phys_write_u64(PhysAddr(0x9000_0000), 2);
    assert_eq!(machine.read_u64(VA).unwrap(), 1); // now cached in the TLB
                                                  // SAFETY: leaves only; the plain store of the control skips the
                                                  // break-before-make on purpose (the simulated machine reports it).
    let slot = unsafe { space.inspect().slot(VA, 0) }.unwrap();
    let new = Arm64::leaf(PhysAddr(0x9000_0000), Prot::READ_WRITE, 0);
    // Refused without permission: nothing changes.
    assert!(set_live_entry(
        space.mmu(),
        LiveEntry {
            va: VA,
            slot,
            height: 0
        },
        new,
        LiveOptions::IN_PLACE
    )
    .is_err());
    assert_eq!(machine.read_u64(VA).unwrap(), 1);
    set_live_entry(
        space.mmu(),
        LiveEntry {
            va: VA,
            slot,
            height: 0,
        },
        new,
        LiveOptions::ALLOW_BBM,
    )
    .unwrap();
    machine.check().unwrap();
    assert_eq!(machine.read_u64(VA).unwrap(), 2);

    // Control: the same output-address change as a plain store, while the
    // old translation is cached, breaks break-before-make, which the
    // simulator reports.
    assert_eq!(machine.read_u64(VA).unwrap(), 2); // cached again
    let back = Arm64::leaf(PhysAddr(0x8000_0000), Prot::READ_WRITE, 0);
    Arm64::set_pte_at(space.mmu(), VA, slot, back);
    assert!(matches!(machine.check(), Err(CheckError::Conflict(_))));
}

#[test]
fn safe_in_place_change_flushes_the_old_permissions() {
    let (machine, space) = one_page::<Arm64>();
    machine.write_u64(VA, 5).unwrap();
    // SAFETY: the same page read-only, stored by `set_live_entry`.
    let slot = unsafe { space.inspect().slot(VA, 0) }.unwrap();
    let ro = Arm64::modify_prot(slot.load(Relaxed), Prot::READ_ONLY, 0);
    set_live_entry(
        space.mmu(),
        LiveEntry {
            va: VA,
            slot,
            height: 0,
        },
        ro,
        LiveOptions::IN_PLACE,
    )
    .unwrap();
    machine.check().unwrap();
    let fault = machine.write_u64(VA, 6).unwrap_err();
    assert_eq!(fault.kind, SimFaultKind::Permission(AccessFault::Write));
    assert_eq!(machine.read_u64(VA).unwrap(), 5);
}

#[test]
fn simulated_hardware_marks_user_pages_dirty_through_dbm() {
    let machine = SimMachine::<Arm64>::new();
    let space = AddressSpace::<Arm64, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    let user_rw = Prot::WRITE | Prot::USER;
    space
        .map(VA, PhysAddr(0x8000_0000), PAGE, user_rw, MapOptions::PAGES)
        .unwrap();
    let before = space.translate(VA).unwrap().entry;
    assert!(!Arm64::is_dirty(before));
    let user_write = Access {
        write: true,
        exec: false,
        user: true,
    };
    let (_, upd) = machine.access(VA, user_write).unwrap();
    assert!(upd.dirty);
    let after = space.translate(VA).unwrap().entry;
    assert_eq!(after, before & !(1 << 7), "AP[2] cleared by the hardware");
    assert!(Arm64::is_dirty(after) && Arm64::is_settled(after, 0));
    machine.check().unwrap();
    // User fetch of a UXN page faults; kernel access to it is fine.
    let user_exec = Access {
        write: false,
        exec: true,
        user: true,
    };
    assert_eq!(
        machine.access(VA, user_exec).unwrap_err().kind,
        SimFaultKind::Permission(AccessFault::Exec)
    );
    assert!(machine.read_u64(VA).is_ok());
}

#[test]
fn lazy_linear_map_is_visible_after_the_scope_and_checks_clean() {
    let machine = SimMachine::<Arm64>::new();
    let space = AddressSpace::<Arm64, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    space.lazy_mmu(|s| {
        s.map(
            VA,
            PhysAddr(0x8000_0000),
            4 << 20,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
        // Inside the scope the writes are still pending for the walker.
        assert!(matches!(machine.check(), Err(CheckError::Pending(_))));
    });
    machine.check().unwrap();
    assert_eq!(
        machine.translate(VirtAddr(VA.0 + (3 << 20))).unwrap(),
        PhysAddr(0x8000_0000 + (3 << 20))
    );
    assert_eq!(Arm64::LEVELS, 4);
}

#[test]
fn no_dirty_state_is_lost_while_the_hardware_races_change_protection() {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    let machine = SimMachine::<Arm64>::new();
    let space = AddressSpace::<Arm64, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut space = unsafe { Installed::new(space) };
    let pages = 64;
    let len = pages * PAGE;
    let user_rw = Prot::WRITE | Prot::USER;
    let user_ro = Prot::USER;
    // Without the hint: the walk below counts dirty entries one by one,
    // and a folded run would report its gathered state on every page.
    let pages_only = MapOptions::PAGES.no_contiguous();
    space
        .map(VA, PhysAddr(0x8000_0000), len, user_rw, pages_only)
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let agent = machine.spawn_agent(VA, len, stop.clone());
    // At least 200 rounds, and on until the hardware thread has dirtied
    // something (a starved thread on a loaded machine may not have run yet),
    // bounded in time. Each round ends writable.
    let t0 = std::time::Instant::now();
    let mut rounds = 0;
    while rounds < 200 || (machine.stats().dirty_set == 0 && t0.elapsed().as_secs() < 30) {
        space.change_protection(VA, len, user_ro).unwrap();
        space.change_protection(VA, len, user_rw).unwrap();
        if rounds >= 200 {
            std::thread::yield_now();
        }
        rounds += 1;
    }
    stop.store(true, Relaxed);
    let report = agent.join().unwrap();
    machine.check().unwrap();
    // Dirty state is sticky (modify_prot keeps it), so the hardware can
    // mark each page dirty once: a lost dirty bit shows up as a page marked
    // twice or a marked page that is clean now.
    let mut dirty = 0;
    space
        .walk(VA, len, |m| dirty += u64::from(Arm64::is_dirty(m.entry)))
        .unwrap();
    assert!(
        report.dirty_set > 0,
        "the agent dirtied something: {report:?}"
    );
    assert_eq!(report.dirty_set, dirty, "{report:?}");
}

/// Non-global to global is unsafe in place (Linux `pgattr_change_is_safe`):
/// `change_protection` adding `Prot::GLOBAL` must break before it makes,
/// for 4 KiB pages and 2 MiB / 1 GiB blocks whose old translations are
/// cached, so the simulator sees no conflict and no stale entry.
fn non_global_to_global_breaks_before_make<A: Arch>() {
    let machine = SimMachine::<A>::new();
    let space = AddressSpace::<A, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
    // SAFETY: simulated; only the simulator walks these tables.
    let mut space = unsafe { Installed::new(space) };
    let (g1, m2) = (1u64 << 30, 2u64 << 20);
    let rw = Prot::READ_WRITE;
    let global = Prot::WRITE | Prot::GLOBAL;
    let cases = [
        (VirtAddr(g1), PhysAddr(0x8000_0000), PAGE),
        (VirtAddr(g1 + m2), PhysAddr(0x8020_0000), m2),
        (VirtAddr(2 * g1), PhysAddr(4 * g1), g1),
    ];
    for (va, pa, len) in cases {
        space.map(va, pa, len, rw, MapOptions::BLOCKS).unwrap();
        machine.write_u64(va, va.0).unwrap(); // cached, dirty
    }
    for (va, _, len) in cases {
        space.change_protection(va, len, global).unwrap();
        machine
            .check()
            .unwrap_or_else(|e| panic!("{}: {len:#x}: {e}", A::NAME));
        assert_eq!(space.translate(va).unwrap().prot, global);
        assert_eq!(machine.read_u64(va).unwrap(), va.0);
    }
    // Global to non-global is safe in place: no break needed, still clean.
    let flushes = space.stats().flushes();
    space.change_protection(VirtAddr(g1), PAGE, rw).unwrap();
    machine.check().unwrap();
    assert_eq!(
        space.stats().flushes(),
        flushes + 1,
        "one gathered flush, no break"
    );
}

#[test]
fn change_protection_to_global_breaks_before_make_48_bit() {
    non_global_to_global_breaks_before_make::<Arm64>();
}

#[test]
fn change_protection_to_global_breaks_before_make_39_bit() {
    non_global_to_global_breaks_before_make::<Arm64Va39>();
}
