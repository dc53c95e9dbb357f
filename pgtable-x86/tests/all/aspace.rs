//! Map / unmap / translate round trips with the x86 formats through
//! pgtable-core's `AddressSpace` and `Arena`, in both halves of the
//! canonical address space.

use pgtable_core::contract::{Arch, Arena, Level, NoopMmu};
use pgtable_core::{AddressSpace, Error, MapOptions, Mapping, PhysAddr, Prot, VirtAddr};
use std::sync::atomic::Ordering::Relaxed;

use pgtable_x86::{X86Paging, X86_64La57, X86_64};

const KIB4: u64 = 0x1000;
const MIB2: u64 = 0x20_0000;
const GIB1: u64 = 0x4000_0000;

fn space<A: Arch>() -> AddressSpace<A, NoopMmu, Arena> {
    AddressSpace::new(NoopMmu, Arena::new()).unwrap()
}

fn mappings<A: Arch>(s: &AddressSpace<A, NoopMmu, Arena>, va: u64, len: u64) -> Vec<Mapping> {
    let mut v = Vec::new();
    s.walk(VirtAddr(va), len, |m| v.push(m)).unwrap();
    v
}

/// Maps 1 GiB + 2 MiB + 4 KiB at `base` with blocks allowed and checks the
/// leaves, then unmaps part of the 2 MiB block and everything.
fn round_trip<A: Arch>(base: u64) {
    let mut s = space::<A>();
    let pa = 0x1_0000_0000u64;
    let len = GIB1 + MIB2 + KIB4;
    s.map(
        VirtAddr(base),
        PhysAddr(pa),
        len,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();

    let leaves = mappings(&s, base, len);
    let heights: Vec<u32> = leaves.iter().map(|m| m.height).collect();
    assert_eq!(heights, [2, 1, 0], "1 GiB, 2 MiB and 4 KiB leaves");
    for m in &leaves {
        assert_eq!(m.pa.0 - pa, m.va.0 - base, "linear");
        // Exactly the hand-written SDM pattern for a kernel RW NX leaf:
        // P | R/W | A | D (| PS) | XD.
        let ps = if m.height > 0 { 0x80 } else { 0 };
        assert_eq!(m.entry, (1 << 63) | m.pa.0 | 0x63 | ps);
    }

    for (off, level) in [
        (0x1234, Level::Pud),
        (GIB1 - 8, Level::Pud),
        (GIB1 + 0x1_2345, Level::Pmd),
        (GIB1 + MIB2 + 0xfff, Level::Pte),
    ] {
        let t = s.translate(VirtAddr(base + off)).unwrap();
        assert_eq!(t.pa, PhysAddr(pa + off), "{off:#x}");
        assert_eq!(t.level, level, "{off:#x}");
        assert_eq!(t.prot, Prot::READ_WRITE);
    }
    assert!(s.translate(VirtAddr(base + len)).is_none());

    // Unmap 4 KiB in the middle of the 2 MiB block: it splits into a page
    // table whose other 511 entries still map the same frames.
    let hole = base + GIB1 + 0x10_0000;
    s.unmap(VirtAddr(hole), KIB4).unwrap();
    assert!(s.translate(VirtAddr(hole)).is_none());
    for off in [GIB1, GIB1 + 0xf_f000, GIB1 + 0x10_1000, GIB1 + MIB2 - KIB4] {
        let t = s.translate(VirtAddr(base + off)).unwrap();
        assert_eq!(t.pa, PhysAddr(pa + off));
        assert_eq!(t.level, Level::Pte);
        assert_eq!(t.prot, Prot::READ_WRITE);
        // The split leaves are valid PTEs: no PS, same A/D and rights.
        assert_eq!(t.entry, (1 << 63) | (pa + off) | 0x63);
    }
    // Unmap 2 MiB straddling the 1 GiB block's end: splits the 1 GiB block.
    s.unmap(VirtAddr(base + GIB1 - 0x10_0000), MIB2).unwrap();
    // The last 2 MiB of the old 1 GiB block is half unmapped: pages.
    let t = s.translate(VirtAddr(base + GIB1 - MIB2)).unwrap();
    assert_eq!(t.level, Level::Pte);
    assert_eq!(t.pa, PhysAddr(pa + GIB1 - MIB2));
    // The 2 MiB before it is still a block.
    let t = s.translate(VirtAddr(base + GIB1 - MIB2 - KIB4)).unwrap();
    assert_eq!(t.level, Level::Pmd);
    assert_eq!(t.pa, PhysAddr(pa + GIB1 - MIB2 - KIB4));
    assert!(s.translate(VirtAddr(base + GIB1 - 0x10_0000)).is_none());
    assert!(s.translate(VirtAddr(base + GIB1 + 0xf_f000)).is_none());

    s.unmap(VirtAddr(base), len).unwrap();
    assert!(mappings(&s, base, len).is_empty());
    assert_eq!(s.inspect().count_tables(), 1, "only the root is left");
    assert_eq!(s.alloc().live(), 1, "no leaked frames");
}

#[test]
fn four_level_round_trip_lower_half() {
    round_trip::<X86_64>(0x40_0000_0000);
}

#[test]
fn four_level_round_trip_upper_half() {
    round_trip::<X86_64>(0xffff_8000_0000_0000);
}

#[test]
fn five_level_round_trip_lower_half_above_48_bits() {
    round_trip::<X86_64La57>(0x0000_8000_0000_0000);
}

#[test]
fn five_level_round_trip_upper_half() {
    round_trip::<X86_64La57>(0xff00_0000_0000_0000);
}

#[test]
fn five_level_uses_five_tables_for_one_page() {
    let mut s = space::<X86_64La57>();
    s.map(
        VirtAddr(0xff00_0000_0000_0000),
        PhysAddr(0x5000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(s.inspect().count_tables(), 5);
    let mut s4 = space::<X86_64>();
    s4.map(
        VirtAddr(0xffff_8000_0000_0000),
        PhysAddr(0x5000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(s4.inspect().count_tables(), 4);
    let t = s.translate(VirtAddr(0xff00_0000_0000_0abc)).unwrap();
    assert_eq!(t.pa, PhysAddr(0x5abc));
    // The PGD (PML5) entry for 0xff00_.. is index 0x100 (bits 56:48).
    // SAFETY: only the entry's address is taken.
    let pgd =
        unsafe { s.inspect().slot(VirtAddr(0xff00_0000_0000_0000), 4) }.unwrap() as *const _ as u64;
    assert_eq!(pgd & 0xfff, 0x100 * 8);
}

#[test]
fn user_mappings_start_without_accessed_and_dirty() {
    let mut s = space::<X86_64>();
    let p = Prot::USER | Prot::WRITE;
    s.map(
        VirtAddr(0x40_0000),
        PhysAddr(0x40_0000),
        MIB2,
        p,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let t = s.translate(VirtAddr(0x40_0000)).unwrap();
    // P | R/W | U/S | PS | XD, 2 MiB at 0x40_0000.
    assert_eq!(t.entry, (1 << 63) | 0x40_0000 | 0x87);
    assert_eq!(t.prot, p);
}

/// Runs `f` and checks that it failed with `want` and changed nothing.
fn rejects<A: Arch>(
    s: &mut AddressSpace<A, NoopMmu, Arena>,
    want: Error,
    f: impl FnOnce(&mut AddressSpace<A, NoopMmu, Arena>) -> Result<(), Error>,
) {
    let before = (
        s.inspect().count_tables(),
        s.alloc().live(),
        mappings(s, 0, 1 << 40),
    );
    assert_eq!(f(s), Err(want));
    let after = (
        s.inspect().count_tables(),
        s.alloc().live(),
        mappings(s, 0, 1 << 40),
    );
    assert_eq!(before, after, "tables changed on error");
}

#[test]
fn non_canonical_virtual_addresses_are_out_of_range() {
    let mut s = space::<X86_64>();
    s.map(
        VirtAddr(0x1000),
        PhysAddr(0x1000),
        KIB4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    let rw = Prot::READ_WRITE;
    // In the hole of a 48-bit space.
    rejects(
        &mut s,
        Error::OutOfRange(VirtAddr(0x0000_8000_0000_0000)),
        |s| {
            s.map(
                VirtAddr(0x0000_8000_0000_0000),
                PhysAddr(0),
                KIB4,
                rw,
                MapOptions::PAGES,
            )
        },
    );
    rejects(
        &mut s,
        Error::OutOfRange(VirtAddr(0xffff_7fff_ffff_f000)),
        |s| {
            s.map(
                VirtAddr(0xffff_7fff_ffff_f000),
                PhysAddr(0),
                KIB4,
                rw,
                MapOptions::PAGES,
            )
        },
    );
    // Running from the lower half into the hole.
    rejects(
        &mut s,
        Error::OutOfRange(VirtAddr(0x0000_8000_0000_0000)),
        |s| {
            s.map(
                VirtAddr(0x7fff_ffff_f000),
                PhysAddr(0),
                2 * KIB4,
                rw,
                MapOptions::PAGES,
            )
        },
    );
    rejects(
        &mut s,
        Error::OutOfRange(VirtAddr(0x0000_8000_0000_0000)),
        |s| s.unmap(VirtAddr(0x0000_8000_0000_0000), KIB4),
    );
    // What is canonical for 57 bits is not for 48.
    let mut s5 = space::<X86_64La57>();
    s5.map(
        VirtAddr(0x0000_8000_0000_0000),
        PhysAddr(0),
        KIB4,
        rw,
        MapOptions::PAGES,
    )
    .unwrap();
    rejects(
        &mut s5,
        Error::OutOfRange(VirtAddr(0x0100_0000_0000_0000)),
        |s| {
            s.map(
                VirtAddr(0x0100_0000_0000_0000),
                PhysAddr(0),
                KIB4,
                rw,
                MapOptions::PAGES,
            )
        },
    );
    assert!(s5.translate(VirtAddr(0x0100_0000_0000_0000)).is_none());
}

#[test]
fn physical_addresses_above_maxphyaddr_are_rejected() {
    let rw = Prot::READ_WRITE;
    let mut s = space::<X86_64>();
    rejects(&mut s, Error::PhysOutOfRange(PhysAddr(1 << 52)), |s| {
        s.map(
            VirtAddr(0x1000),
            PhysAddr(1 << 52),
            KIB4,
            rw,
            MapOptions::PAGES,
        )
    });
    // The last page below 2^52 is fine.
    s.map(
        VirtAddr(0x1000),
        PhysAddr((1 << 52) - KIB4),
        KIB4,
        rw,
        MapOptions::PAGES,
    )
    .unwrap();
    // With MAXPHYADDR = 46 a range reaching past 2^46 is rejected whole.
    let mut s46 = space::<X86Paging<4, 46>>();
    rejects(
        &mut s46,
        Error::PhysOutOfRange(PhysAddr((1 << 46) - KIB4)),
        |s| {
            s.map(
                VirtAddr(0x1000),
                PhysAddr((1 << 46) - KIB4),
                2 * KIB4,
                rw,
                MapOptions::PAGES,
            )
        },
    );
    let mut s5 = space::<X86Paging<5, 46>>();
    rejects(&mut s5, Error::PhysOutOfRange(PhysAddr(1 << 46)), |s| {
        s.map(
            VirtAddr(0x1000),
            PhysAddr(1 << 46),
            MIB2,
            rw,
            MapOptions::BLOCKS,
        )
    });
}

#[test]
fn raw_entries_with_reserved_bits_are_invalid_to_the_walk() {
    let mut s = space::<X86_64>();
    s.map(
        VirtAddr(0x20_0000),
        PhysAddr(0x20_0000),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let poke = |s: &AddressSpace<X86_64, NoopMmu, Arena>, f: &dyn Fn(u64) -> u64| {
        // SAFETY: the block entry only gets a reserved bit set (Invalid to
        // the walk) and cleared again; the space is never installed.
        let slot = unsafe { s.inspect().slot(VirtAddr(0x20_0000), 1) }.unwrap();
        // Relaxed: single-threaded test.
        slot.store(f(slot.load(Relaxed)), Relaxed);
    };
    // Set bit 13 (reserved in a 2 MiB PDE): the walk no longer sees a leaf.
    poke(&s, &|raw| raw | 1 << 13);
    assert!(s.translate(VirtAddr(0x20_0000)).is_none());
    // And the map algorithm treats the slot as occupied, not as free.
    assert_eq!(
        s.map(
            VirtAddr(0x20_0000),
            PhysAddr(0),
            KIB4,
            Prot::READ_WRITE,
            MapOptions::PAGES
        ),
        Err(Error::AlreadyMapped(VirtAddr(0x20_0000)))
    );
    poke(&s, &|raw| raw & !(1 << 13));
    assert_eq!(
        s.translate(VirtAddr(0x20_1000)).unwrap().pa,
        PhysAddr(0x20_1000)
    );
}

#[test]
fn blocks_need_aligned_physical_addresses() {
    // VA 2 MiB aligned, PA only 4 KiB aligned: pages, not a block.
    let mut s = space::<X86_64>();
    s.map(
        VirtAddr(0xffff_8000_0020_0000),
        PhysAddr(0x30_1000),
        MIB2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let leaves = mappings(&s, 0xffff_8000_0020_0000, MIB2);
    assert_eq!(leaves.len(), 512);
    assert!(leaves.iter().all(|m| m.height == 0));
    assert_eq!(leaves[511].pa, PhysAddr(0x30_1000 + MIB2 - KIB4));
}
