//! The core's operations on a format's geometry (page size, levels, a
//! root that `VA_BITS` fills only in part, 52-bit virtual and physical
//! addresses), on the simulated walker, which walks the same geometry:
//! run by the geometry tests of pgtable-core (the test formats of 16 KiB
//! and 64 KiB pages and of 52 bits) and of pgtable-arm64 (every arm64
//! granule and VA size).
//!
//! Every size and address comes from the format ([`level::page_size`],
//! [`level::size`], [`VaRange::bounds`], [`Format::PA_BITS`]), none is
//! written for 4 KiB pages.
//!
//! [`Format::PA_BITS`]: pgtable_core::contract::Format::PA_BITS

use pgtable_core::contract::{level, Access, Arch};
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{
    AddressSpace, CopyMode, Error, MapOptions, MoveOptions, PhysAddr, Prot, VaRange, VirtAddr,
};

type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

/// Where the PMD blocks point.
const BLOCKS_PA: PhysAddr = PhysAddr(0x4000_0000);

/// A machine and a space of `range` on it, installed into that half (on
/// arm64 TTBR0_EL1 or TTBR1_EL1; one root for both halves elsewhere).
fn setup<A: Arch>(range: VaRange) -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let s =
        AddressSpace::<A, _, _>::new_in(range, m.mmu_installing_into(range), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

/// Where the pages at the top of the half point: above 2^48 on a format
/// with 52-bit output addresses (arm64 LPA2, 64 KiB LPA).
fn top_pa<A: Arch>() -> PhysAddr {
    if A::PA_BITS == 52 {
        PhysAddr(0xf << 48 | 0x8000_0000)
    } else {
        PhysAddr(0x8000_0000)
    }
}

/// [`operations_in_one_half`] in each of `ranges`, then
/// [`rejects_input_aligned_below_the_page`]: the whole geometry test of
/// one format.
pub fn every_operation_in_the_geometry<A: Arch>(ranges: &[VaRange]) {
    assert!(!ranges.is_empty(), "no half to exercise");
    for &range in ranges {
        operations_in_one_half::<A>(range);
    }
    rejects_input_aligned_below_the_page::<A>();
}

/// The core's operations on `A`'s geometry in `range`, every result
/// checked on the simulated walker: two PMD blocks from the fourth PMD
/// entry of the half and five pages at its very top (its root's last
/// entry; above 2^48 with 52-bit VAs, at a physical address above 2^48
/// with 52-bit PAs); the largest block the format has, at the highest
/// physical address aligned to it; a block split by `change_protection`;
/// a protection change of the top pages and back; whole PMD entries moved
/// (`HAVE_MOVE_PMD`); a copy-on-write fork; and the unmaps, after which
/// only the root is left.
pub fn operations_in_one_half<A: Arch>(range: VaRange) {
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    let (m, mut s) = setup::<A>(range);
    let (lo, hi) = range.bounds::<A>();
    let blocks = VirtAddr(lo + 3 * pmd);
    let top = VirtAddr(hi - 5 * page + 1);
    if A::VA_BITS == 52 && range != VaRange::Upper {
        assert!(top.0 > 1 << 48, "{top:?} is not above 2^48");
    }
    let pa = BLOCKS_PA;
    let top_pa = top_pa::<A>();
    s.map(
        blocks,
        pa,
        2 * pmd,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.map(top, top_pa, 5 * page, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    let t = s.translate(blocks.add(pmd + 3 * page)).unwrap();
    assert_eq!((t.height, t.pa), (1, PhysAddr(pa.0 + pmd + 3 * page)));
    let t = s.translate(top.add(4 * page + 8)).unwrap();
    assert_eq!((t.height, t.pa), (0, PhysAddr(top_pa.0 + 4 * page + 8)));
    // The last byte of the half.
    assert_eq!(
        s.translate(top.add(5 * page - 1)).map(|t| t.height),
        Some(0)
    );

    // Data through the simulated walker, at both ends.
    m.write_u64(blocks.add(pmd + page), 0x1616).unwrap();
    m.write_u64(top.add(4 * page), 0x6464).unwrap();
    assert_eq!(m.read_u64(blocks.add(pmd + page)).unwrap(), 0x1616);
    assert_eq!(m.read_u64(top.add(4 * page)).unwrap(), 0x6464);
    m.check().unwrap();

    largest_block(&m, &mut s, range, top);

    // One page of the second block read-only: the block splits into a
    // table of pages, only that one loses its write right.
    let ro = blocks.add(pmd + page);
    s.change_protection(ro, page, Prot::READ_ONLY).unwrap();
    let t = s.translate(ro).unwrap();
    assert_eq!((t.height, t.prot.writable()), (0, false));
    assert!(m.access(ro, Access::WRITE).is_err());
    assert!(s.translate(ro.add(page)).unwrap().prot.writable());
    assert_eq!(m.read_u64(ro).unwrap(), 0x1616);
    // The top pages read-only and back: the (52-bit) address stays.
    s.change_protection(top, 5 * page, Prot::READ_ONLY).unwrap();
    assert!(m.access(top.add(4 * page), Access::WRITE).is_err());
    s.change_protection(top, 5 * page, Prot::READ_WRITE)
        .unwrap();
    assert_eq!(
        s.translate(top.add(4 * page)).unwrap().pa,
        PhysAddr(top_pa.0 + 4 * page)
    );
    assert_eq!(m.read_u64(top.add(4 * page)).unwrap(), 0x6464);
    m.check().unwrap();

    // A whole PMD entry moves as one (`HAVE_MOVE_PMD`): the first block,
    // to the PMD entry after the second.
    let to = VirtAddr(blocks.0 + 4 * pmd);
    s.move_page_tables(blocks, to, pmd, MoveOptions::default())
        .unwrap();
    assert_eq!(s.translate(to.add(page)).unwrap().pa, PhysAddr(pa.0 + page));
    assert!(s.translate(blocks).is_none());
    // The split second block's table moves as a whole PTE table.
    let to2 = VirtAddr(blocks.0 + 6 * pmd);
    s.move_page_tables(blocks.add(pmd), to2, pmd, MoveOptions::default())
        .unwrap();
    assert_eq!(m.read_u64(to2.add(page)).unwrap(), 0x1616);
    assert!(!s.translate(to2.add(page)).unwrap().prot.writable());
    m.check().unwrap();

    // Fork the top pages into a second space, copy-on-write.
    let (m2, mut child) = setup::<A>(range);
    let mut copied = 0;
    s.copy_page_range(&mut child, top, 5 * page, CopyMode::Cow, |_| copied += 1)
        .unwrap();
    assert_eq!(copied, 5);
    assert_eq!(
        child.translate(top.add(4 * page)).unwrap().pa,
        PhysAddr(top_pa.0 + 4 * page)
    );
    assert!(!s.translate(top).unwrap().prot.writable());
    assert!(!child.translate(top).unwrap().prot.writable());
    child.unmap(top, 5 * page).unwrap();
    m2.check().unwrap();
    assert_eq!(m2.live_tables(), 1);

    for (va, len) in [(to, pmd), (to2, pmd), (top, 5 * page)] {
        s.unmap(va, len).unwrap();
    }
    assert!(s.translate(top.add(4 * page)).is_none());
    m.check().unwrap();
    // Only the root is left.
    assert_eq!(m.live_tables(), 1);
}

/// The largest block the format has above the PMD level (a PUD block; an
/// L0 block of arm64 4 KiB LPA2), at the highest physical address aligned
/// to it, mapped, translated and unmapped where the half has room for it
/// between the PMD blocks of [`operations_in_one_half`] and `top`. Every
/// format with 52-bit output addresses has that room.
fn largest_block<A: Arch>(m: &SimMachine<A>, s: &mut Space<A>, range: VaRange, top: VirtAddr) {
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    let (lo, _) = range.bounds::<A>();
    let big = (1..A::LEVELS).rev().find(|&h| A::leaf_allowed(h)).unwrap();
    let big_size = level::size::<A>(big);
    let big_va = (lo + 7 * pmd).next_multiple_of(big_size).max(lo + big_size);
    let room = big > 1 && big_va + big_size <= top.0 - page;
    assert!(
        room || A::PA_BITS == 48,
        "no room for a block of height {big} in {range:?}"
    );
    if !room {
        return;
    }
    let big_pa = PhysAddr(((1u64 << A::PA_BITS) - 1) & !(big_size - 1));
    s.map(
        VirtAddr(big_va),
        big_pa,
        big_size,
        Prot::READ_ONLY,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let t = s.translate(VirtAddr(big_va + big_size - 8)).unwrap();
    // `map` makes blocks up to PUD size (height 2); an L0 block of 4 KiB
    // LPA2 (height 3) is mapped as PUD blocks.
    assert_eq!(t.height, big.min(2));
    assert_eq!(t.pa, PhysAddr(big_pa.0 + big_size - 8));
    m.check().unwrap();
    s.unmap(VirtAddr(big_va), big_size).unwrap();
    m.check().unwrap();
}

/// Input aligned to half a page (8 KiB and 32 KiB for the larger
/// granules: more than a 4 KiB page) is rejected at the format's page
/// size, with the typed error of the misaligned argument, and nothing
/// changes.
pub fn rejects_input_aligned_below_the_page<A: Arch>() {
    let page = level::page_size::<A>();
    let (m, mut s) = setup::<A>(VaRange::Lower);
    let va = VirtAddr(8 * page);
    let half = page / 2;
    let r = s.map(
        va.add(half),
        PhysAddr(0),
        page,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    );
    assert_eq!(r, Err(Error::MisalignedVirt(va.add(half))));
    let r = s.map(va, PhysAddr(half), page, Prot::READ_ONLY, MapOptions::PAGES);
    assert_eq!(r, Err(Error::MisalignedPhys(PhysAddr(half))));
    let r = s.map(va, PhysAddr(0), half, Prot::READ_ONLY, MapOptions::PAGES);
    assert_eq!(r, Err(Error::MisalignedLength(half)));
    assert!(s.translate(va).is_none());
    assert_eq!(m.live_tables(), 1);
}
