//! Translation regimes on arm64: a TTBR0 (lower) or TTBR1 (upper) address
//! space translates a whole `VA_BITS` half through all 512 entries of its
//! own root, as Linux configures TCR_EL1 (T0SZ = T1SZ = 64 - VA_BITS), and
//! the simulator walks the two roots separately.

use pgtable_arm64::{
    tcr_t0sz, tcr_t1sz, tcr_value, tcr_value_separate_halves, Arm64, Arm64Va39, TcrConfig,
};
use pgtable_core::contract::{Arch, Arena, Format, NoopMmu};
use pgtable_core::sim::{Installed, SimFaultKind, SimMachine};
use pgtable_core::{
    AddressSpace, Error, MapOptions, MoveOptions, PhysAddr, Prot, VaRange, VirtAddr,
};

const PAGE: u64 = 4096;

fn half<A: Arch>(range: VaRange) -> AddressSpace<A, NoopMmu, Arena> {
    AddressSpace::new_in(range, NoopMmu, Arena::new()).unwrap()
}

/// The root index `va` uses.
fn root_index<A: Arch>(va: u64) -> usize {
    ((va >> (A::VA_BITS - 9)) & 511) as usize
}

fn upper_space_uses_every_root_entry<A: Arch>() {
    let mut s = half::<A>(VaRange::Upper);
    let first = (1u64 << A::VA_BITS).wrapping_neg();
    let last = u64::MAX - (PAGE - 1);
    assert_eq!(VaRange::Upper.bounds::<A>(), (first, u64::MAX));
    assert_eq!((root_index::<A>(first), root_index::<A>(last)), (0, 511));
    s.map(
        VirtAddr(first),
        PhysAddr(0x4000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(last),
        PhysAddr(0x5000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(
        s.translate(VirtAddr(first + 8)).unwrap().pa,
        PhysAddr(0x4000_0008)
    );
    assert_eq!(
        s.translate(VirtAddr(last)).unwrap().pa,
        PhysAddr(0x5000_0000)
    );
    // Root entries 0 and 511 are the two tables' parents.
    assert!(s.inspect().entry(VirtAddr(first), A::LEVELS - 1).unwrap() != 0);
    assert!(s.inspect().entry(VirtAddr(last), A::LEVELS - 1).unwrap() != 0);
    // A space for both halves (one root, VA_BITS - 1 per half) cannot
    // reach the bottom of the TTBR1 half.
    let mut both = half::<A>(VaRange::Both);
    assert_eq!(
        both.map(
            VirtAddr(first),
            PhysAddr(0),
            PAGE,
            Prot::READ_ONLY,
            MapOptions::PAGES
        ),
        Err(Error::OutOfRange(VirtAddr(first)))
    );
}

#[test]
fn an_upper_space_translates_the_whole_ttbr1_half_through_all_512_root_entries_48() {
    upper_space_uses_every_root_entry::<Arm64>();
}

#[test]
fn an_upper_space_translates_the_whole_ttbr1_half_through_all_512_root_entries_39() {
    upper_space_uses_every_root_entry::<Arm64Va39>();
}

fn lower_space_reaches_2_pow_va_bits<A: Arch>() {
    let mut s = half::<A>(VaRange::Lower);
    let top = 1u64 << A::VA_BITS;
    // The upper half of TTBR0's range: not canonical for a shared root.
    let mid = 1u64 << (A::VA_BITS - 1);
    s.map(
        VirtAddr(mid),
        PhysAddr(0x4000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(top - PAGE),
        PhysAddr(0x5000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(root_index::<A>(mid), 256);
    assert_eq!(root_index::<A>(top - PAGE), 511);
    assert_eq!(
        s.translate(VirtAddr(top - PAGE)).unwrap().pa,
        PhysAddr(0x5000_0000)
    );
    s.unmap(VirtAddr(mid), top - mid).unwrap();
    assert_eq!(
        s.inspect().count_tables(),
        1,
        "unmap freed every table but the root"
    );
}

#[test]
fn a_lower_space_translates_the_whole_ttbr0_half_48() {
    lower_space_reaches_2_pow_va_bits::<Arm64>();
}

#[test]
fn a_lower_space_translates_the_whole_ttbr0_half_39() {
    lower_space_reaches_2_pow_va_bits::<Arm64Va39>();
}

fn outside_the_half_is_out_of_range_and_changes_nothing<A: Arch>() {
    let mut lo = half::<A>(VaRange::Lower);
    let top = 1u64 << A::VA_BITS;
    lo.map(
        VirtAddr(top - 2 * PAGE),
        PhysAddr(0x4000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    let tables = lo.inspect().count_tables();
    let before = lo.inspect().entry(VirtAddr(top - 2 * PAGE), 0);
    let upper = VirtAddr(u64::MAX - (PAGE - 1));
    let rw = Prot::READ_WRITE;
    let p = MapOptions::PAGES;
    // Starts outside.
    assert_eq!(
        lo.map(upper, PhysAddr(0), PAGE, rw, p),
        Err(Error::OutOfRange(upper))
    );
    assert_eq!(lo.unmap(upper, PAGE), Err(Error::OutOfRange(upper)));
    assert_eq!(
        lo.change_protection(upper, PAGE, rw),
        Err(Error::OutOfRange(upper))
    );
    assert_eq!(lo.walk(upper, PAGE, |_| {}), Err(Error::OutOfRange(upper)));
    assert!(lo.translate(upper).is_none());
    assert!(lo.inspect().entry(upper, A::LEVELS - 1).is_none());
    // Runs past the end: the first address outside is named.
    let tail = VirtAddr(top - PAGE);
    assert_eq!(
        lo.map(tail, PhysAddr(0), 2 * PAGE, rw, p),
        Err(Error::OutOfRange(VirtAddr(top)))
    );
    assert_eq!(
        lo.unmap(VirtAddr(top - 2 * PAGE), 2 * PAGE + PAGE),
        Err(Error::OutOfRange(VirtAddr(top)))
    );
    assert_eq!(
        lo.move_page_tables(
            VirtAddr(top - 2 * PAGE),
            tail,
            2 * PAGE,
            MoveOptions::DEFAULT
        ),
        Err(Error::OutOfRange(VirtAddr(top)))
    );
    assert_eq!(lo.inspect().count_tables(), tables);
    assert_eq!(lo.inspect().entry(VirtAddr(top - 2 * PAGE), 0), before);

    let mut up = half::<A>(VaRange::Upper);
    let below = VirtAddr((1u64 << A::VA_BITS).wrapping_neg() - PAGE);
    assert_eq!(
        up.map(below, PhysAddr(0), PAGE, rw, p),
        Err(Error::OutOfRange(below))
    );
    assert_eq!(
        up.map(VirtAddr(0), PhysAddr(0), PAGE, rw, p),
        Err(Error::OutOfRange(VirtAddr(0)))
    );
    assert_eq!(up.inspect().count_tables(), 1);
}

#[test]
fn addresses_outside_the_half_are_out_of_range_and_change_nothing_48() {
    outside_the_half_is_out_of_range_and_changes_nothing::<Arm64>();
}

#[test]
fn addresses_outside_the_half_are_out_of_range_and_change_nothing_39() {
    outside_the_half_is_out_of_range_and_changes_nothing::<Arm64Va39>();
}

fn simulator_walks_two_roots<A: Arch + Send>() {
    let m = SimMachine::<A>::new();
    let k = AddressSpace::<A, _, _>::new_in(
        VaRange::Upper,
        m.mmu_installing_into(VaRange::Upper),
        m.alloc(),
    )
    .unwrap();
    let u = AddressSpace::<A, _, _>::new_in(
        VaRange::Lower,
        m.mmu_installing_into(VaRange::Lower),
        m.alloc(),
    )
    .unwrap();
    // SAFETY: simulated MMUs.
    let (mut k, mut u) = unsafe { (Installed::new(k), Installed::new(u)) };
    // Root index 0 of each root: the bottom of each half.
    let kva = VirtAddr((1u64 << A::VA_BITS).wrapping_neg());
    let uva = VirtAddr(0x1000);
    k.map(
        kva,
        PhysAddr(0x4000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    u.map(
        uva,
        PhysAddr(0x5000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    // The top of TTBR0's half, not canonical for a shared root.
    let utop = VirtAddr((1u64 << A::VA_BITS) - PAGE);
    u.map(
        utop,
        PhysAddr(0x6000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    m.write_u64(kva, 1).unwrap();
    m.write_u64(uva, 2).unwrap();
    m.write_u64(utop, 3).unwrap();
    assert_eq!(m.phys_read_u64(PhysAddr(0x4000_0000)), 1);
    assert_eq!(m.phys_read_u64(PhysAddr(0x5000_0000)), 2);
    assert_eq!(m.phys_read_u64(PhysAddr(0x6000_0000)), 3);
    // Between the halves: a Translation fault at the start of the walk.
    let hole = VirtAddr(1u64 << A::VA_BITS);
    assert_eq!(
        m.read_u64(hole).unwrap_err().kind,
        SimFaultKind::Translation { height: A::LEVELS }
    );
    m.check().unwrap();
    // The kernel's root installed in the wrong register (TTBR0): its
    // mapping is not reachable at the kernel address (TTBR1 is empty now)
    // and the user address walks the kernel's tables, which do not map it.
    let wrong = m.mmu_installing_into(VaRange::Lower);
    // SAFETY: the simulated MMU.
    unsafe { pgtable_core::contract::Mmu::install_root(&wrong, k.root()) };
    let upper_only = m.mmu_installing_into(VaRange::Upper);
    // SAFETY: the simulated MMU; a root of nothing but zeroes is a
    // valid (empty) root.
    unsafe { pgtable_core::contract::Mmu::install_root(&upper_only, u.root()) };
    assert!(m.read_u64(kva).is_err(), "the user root in TTBR1");
    assert!(m.read_u64(uva).is_err(), "the kernel root in TTBR0");
    m.check().unwrap();
}

#[test]
fn the_simulator_walks_ttbr0_and_ttbr1_separately_48() {
    simulator_walks_two_roots::<Arm64>();
}

#[test]
fn the_simulator_walks_ttbr0_and_ttbr1_separately_39() {
    simulator_walks_two_roots::<Arm64Va39>();
}

#[test]
fn tcr_gives_t0sz_and_t1sz_for_shared_and_separate_roots() {
    for (va, shared, separate) in [(48, 17, 16), (39, 26, 25)] {
        let cfg = TcrConfig {
            va_bits: va,
            ..TcrConfig::DEFAULT_48
        };
        let (a, b) = (tcr_value(cfg), tcr_value_separate_halves(cfg));
        assert_eq!((tcr_t0sz(a), tcr_t1sz(a)), (shared, shared));
        assert_eq!((tcr_t0sz(b), tcr_t1sz(b)), (separate, separate));
        // 2^(64 - TnSZ) bytes per register: the whole half of the space.
        assert_eq!(64 - separate, va as u64);
        // Every other field is the same.
        let txsz_fields = 0x3f | 0x3f << 16;
        assert_eq!(a & !txsz_fields, b & !txsz_fields);
    }
    const { assert!(Arm64::SEPARATE_HALVES && Arm64Va39::SEPARATE_HALVES) };
}
