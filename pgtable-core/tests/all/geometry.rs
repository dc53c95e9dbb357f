//! The core on every page size and level count it supports: 4 KiB, 16 KiB
//! and 64 KiB pages, 2 to 5 levels, roots that VA_BITS fills only in part
//! (arm64 16 KiB pages with 48 bits: a root of 2 entries), on the
//! simulated walker, which walks the same geometry.
#![cfg(feature = "sim")]

use pgtable_core::contract::{level, Access, Arch, Arena, TableAlloc};
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::test_format::TestFormat;
use pgtable_core::{
    AddressSpace, CopyMode, Error, MapOptions, MoveOptions, PhysAddr, Prot, VaRange, VirtAddr,
};

type Space<A> = AddressSpace<A, SimMmu<A>, SimAlloc>;

/// arm64 16 KiB pages, 48-bit VA: 4 levels, a root of 2 entries.
type K16x48 = TestFormat<4, 14, 48>;
/// arm64 16 KiB pages, 47-bit VA: 3 full levels.
type K16x47 = TestFormat<3, 14, 0>;
/// arm64 16 KiB pages, 36-bit VA: 2 levels.
type K16x36 = TestFormat<2, 14, 0>;
/// arm64 64 KiB pages, 48-bit VA: 3 levels, a root of 64 entries.
type K64x48 = TestFormat<3, 16, 48>;
/// arm64 64 KiB pages, 52-bit VA: 3 levels, a root of 1024 entries.
type K64x52 = TestFormat<3, 16, 52>;
/// arm64 64 KiB pages, 42-bit VA: 2 levels.
type K64x42 = TestFormat<2, 16, 0>;
/// arm64 4 KiB pages, 52-bit VA (LPA2): 5 levels, a root of 16 entries.
type K4x52 = TestFormat<5, 12, 52>;

fn setup<A: Arch>(range: VaRange) -> (SimMachine<A>, Installed<A, SimMmu<A>, SimAlloc>) {
    let m = SimMachine::<A>::new();
    let s = Space::<A>::new_in(range, m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

/// Maps, writes, splits, protects, moves, forks and unmaps on `A`'s
/// geometry in `range`, checking every result on the simulated walker and
/// that every table is freed at the end.
fn exercise<A: Arch>(range: VaRange) {
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    let (m, mut s) = setup::<A>(range);
    let (lo, hi) = range.bounds::<A>();
    // Two PMD blocks from the fourth PMD entry of the half, and the last
    // five pages of the half (its root's last entry).
    let blocks = VirtAddr(lo + 3 * pmd);
    let top = VirtAddr(hi - 5 * page + 1);
    let pa = PhysAddr(0x4000_0000);
    s.map(
        blocks,
        pa,
        2 * pmd,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.map(
        top,
        PhysAddr(0x8000_0000),
        5 * page,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    let t = s.translate(blocks.add(pmd + 3 * page)).unwrap();
    assert_eq!((t.height, t.pa), (1, PhysAddr(pa.0 + pmd + 3 * page)));
    let t = s.translate(top.add(4 * page + 8)).unwrap();
    assert_eq!((t.height, t.pa), (0, PhysAddr(0x8000_0000 + 4 * page + 8)));
    assert_eq!(
        s.translate(top.add(5 * page - 1)).map(|t| t.height),
        Some(0)
    );

    // Data through the simulated walker, at both ends.
    m.write_u64(blocks.add(pmd + page), 0x1616).unwrap();
    m.write_u64(top.add(4 * page), 0x6464).unwrap();
    assert_eq!(m.read_u64(blocks.add(pmd + page)).unwrap(), 0x1616);

    // One page of the second block read-only: the block splits into a
    // table of `entries` pages, only that one loses its write right.
    let ro = blocks.add(pmd + page);
    s.change_protection(ro, page, Prot::READ_ONLY).unwrap();
    let t = s.translate(ro).unwrap();
    assert_eq!((t.height, t.prot.writable()), (0, false));
    assert!(m.access(ro, Access::WRITE).is_err());
    assert!(s.translate(ro.add(page)).unwrap().prot.writable());
    assert_eq!(m.read_u64(ro).unwrap(), 0x1616);
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

    // Fork the pages at the top into a second space, copy-on-write.
    let (m2, mut child) = setup::<A>(range);
    let mut copied = 0;
    s.copy_page_range(&mut child, top, 5 * page, CopyMode::Cow, |_| copied += 1)
        .unwrap();
    assert_eq!(copied, 5);
    assert_eq!(
        child.translate(top.add(4 * page)).unwrap().pa,
        PhysAddr(0x8000_0000 + 4 * page)
    );
    assert!(!s.translate(top).unwrap().prot.writable());
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

/// Input aligned to half a page (8 KiB and 32 KiB for the larger
/// granules: more than a 4 KiB page) is rejected at the format's page
/// size, and nothing changes.
fn rejects_smaller_alignment<A: Arch>() {
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
    assert_eq!(m.live_tables(), 1);
}

macro_rules! geometry_tests {
    ($($name:ident: $f:ty, $range:expr;)*) => {$(
        #[test]
        fn $name() {
            exercise::<$f>($range);
            rejects_smaller_alignment::<$f>();
        }
    )*};
}

geometry_tests! {
    geometry_16k_48bit_two_entry_root_lower: K16x48, VaRange::Lower;
    geometry_16k_48bit_two_entry_root_upper: K16x48, VaRange::Upper;
    geometry_16k_47bit: K16x47, VaRange::Lower;
    geometry_16k_36bit_two_levels: K16x36, VaRange::Lower;
    geometry_64k_48bit_partial_root_lower: K64x48, VaRange::Lower;
    geometry_64k_48bit_partial_root_upper: K64x48, VaRange::Upper;
    geometry_64k_52bit: K64x52, VaRange::Upper;
    geometry_64k_42bit_two_levels: K64x42, VaRange::Lower;
    geometry_4k_52bit_five_levels_lpa2: K4x52, VaRange::Upper;
    geometry_4k_48bit: TestFormat<4>, VaRange::Lower;
}

#[test]
fn a_frame_size_other_than_the_page_size_is_a_typed_error() {
    // A 4 KiB arena for 16 KiB pages, and the other way round.
    let m = SimMachine::<K16x48>::new();
    let r = AddressSpace::<K16x48, _, _>::new(m.mmu(), Arena::new());
    assert!(matches!(
        r,
        Err(Error::FrameSize {
            frame_shift: 12,
            page_shift: 14
        })
    ));
    let m = SimMachine::<TestFormat<4>>::new();
    let r = AddressSpace::<TestFormat<4>, _, _>::new(m.mmu(), Arena::for_format::<K64x48>());
    assert!(matches!(
        r,
        Err(Error::FrameSize {
            frame_shift: 16,
            page_shift: 12
        })
    ));
    // The right one works, and hands out aligned frames of the page size.
    let mut a = Arena::for_format::<K64x48>();
    let f = a.alloc_table().unwrap();
    assert_eq!(f.0 % (64 << 10), 0);
    // SAFETY: a frame of `a`, never linked.
    unsafe { a.free_table(f) };
}
