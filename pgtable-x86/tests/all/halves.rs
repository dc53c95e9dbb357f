//! Translation regimes on x86-64: one root (CR3) for both canonical
//! halves, a lower space owning PML4 (PML5) entries 0–255 and an upper one
//! entries 256–511 (Intel SDM Vol. 3A 4.5).

use pgtable_core::contract::{Arch, Arena, NoopMmu};
use pgtable_core::sim::{Installed, SimMachine};
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};
use pgtable_x86::{X86_64La57, X86_64};

const PAGE: u64 = 4096;

fn half<A: Arch>(range: VaRange) -> AddressSpace<A, NoopMmu, Arena> {
    AddressSpace::new_in(range, NoopMmu, Arena::new()).unwrap()
}

fn root_index<A: Arch>(va: u64) -> usize {
    ((va >> (A::VA_BITS - 9)) & 511) as usize
}

fn halves_are_the_two_halves_of_one_root<A: Arch>() {
    assert!(!A::SEPARATE_HALVES);
    let size = 1u64 << (A::VA_BITS - 1);
    assert_eq!(VaRange::Lower.bounds::<A>(), (0, size - 1));
    assert_eq!(
        VaRange::Upper.bounds::<A>(),
        (size.wrapping_neg(), u64::MAX)
    );
    assert_eq!(VaRange::Upper.root_indices::<A>(), (256, 511));
    assert_eq!(VaRange::Lower.root_indices::<A>(), (0, 255));

    let mut up = half::<A>(VaRange::Upper);
    let first = size.wrapping_neg();
    assert_eq!(root_index::<A>(first), 256);
    let rw = Prot::READ_WRITE;
    let p = MapOptions::PAGES;
    up.map(VirtAddr(first), PhysAddr(0x4000_0000), PAGE, rw, p)
        .unwrap();
    assert_eq!(
        up.translate(VirtAddr(first)).unwrap().pa,
        PhysAddr(0x4000_0000)
    );
    assert_eq!(
        up.map(VirtAddr(0), PhysAddr(0), PAGE, rw, p),
        Err(Error::OutOfRange(VirtAddr(0)))
    );

    let mut lo = half::<A>(VaRange::Lower);
    let tables = lo.inspect().count_tables();
    assert_eq!(
        lo.map(VirtAddr(first), PhysAddr(0), PAGE, rw, p),
        Err(Error::OutOfRange(VirtAddr(first)))
    );
    // Runs into the non-canonical hole: the hole is named, as for a space
    // of both halves.
    assert_eq!(
        lo.map(VirtAddr(size - PAGE), PhysAddr(0), 2 * PAGE, rw, p),
        Err(Error::OutOfRange(VirtAddr(size)))
    );
    assert_eq!(lo.inspect().count_tables(), tables);
    assert!(lo.translate(VirtAddr(first)).is_none());
}

#[test]
fn x86_halves_are_root_entries_0_to_255_and_256_to_511_4level() {
    halves_are_the_two_halves_of_one_root::<X86_64>();
}

#[test]
fn x86_halves_are_root_entries_0_to_255_and_256_to_511_5level() {
    halves_are_the_two_halves_of_one_root::<X86_64La57>();
}

fn one_cr3_serves_both_halves<A: Arch>() {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::<A, _, _>::new_in(
        VaRange::Lower,
        m.mmu_installing_into(VaRange::Lower),
        m.alloc(),
    )
    .unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    s.map(
        VirtAddr(0x1000),
        PhysAddr(0x4000_0000),
        PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    m.write_u64(VirtAddr(0x1000), 5).unwrap();
    assert_eq!(m.root(), Some(s.root()), "a half's root is CR3");
    m.check().unwrap();
}

#[test]
fn the_simulator_has_one_root_for_both_halves_on_x86() {
    one_cr3_serves_both_halves::<X86_64>();
    one_cr3_serves_both_halves::<X86_64La57>();
}
