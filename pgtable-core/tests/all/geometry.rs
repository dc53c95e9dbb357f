//! The core on every page size and level count it supports: 4 KiB, 16 KiB
//! and 64 KiB pages, 2 to 5 levels, roots that VA_BITS fills only in part
//! (arm64 16 KiB pages with 48 bits: a root of 2 entries), on the
//! simulated walker, which walks the same geometry. The operations are
//! `pgtable_testkit::geometry`, which the arm64 formats of the same
//! geometries run too.
#![cfg(feature = "sim")]

use pgtable_testkit::geometry;

use pgtable_core::contract::{Arena, TableAlloc};
use pgtable_core::sim::SimMachine;
use pgtable_core::test_format::TestFormat;
use pgtable_core::{AddressSpace, Error, VaRange};

/// arm64 16 KiB pages, 48-bit VA: 4 levels, a root of 2 entries.
type K16x48 = TestFormat<4, 14, 48>;
/// arm64 16 KiB pages, 47-bit VA: 3 full levels.
type K16x47 = TestFormat<3, 14, 0>;
/// arm64 16 KiB pages, 36-bit VA: 2 levels.
type K16x36 = TestFormat<2, 14, 0>;
/// arm64 16 KiB pages, 52-bit VA (LPA2): 4 levels, a root of 32 entries.
type K16x52 = TestFormat<4, 14, 52>;
/// arm64 64 KiB pages, 48-bit VA: 3 levels, a root of 64 entries.
type K64x48 = TestFormat<3, 16, 48>;
/// arm64 64 KiB pages, 52-bit VA: 3 levels, a root of 1024 entries.
type K64x52 = TestFormat<3, 16, 52>;
/// arm64 64 KiB pages, 42-bit VA: 2 levels.
type K64x42 = TestFormat<2, 16, 0>;
/// arm64 4 KiB pages, 52-bit VA (LPA2): 5 levels, a root of 16 entries.
type K4x52 = TestFormat<5, 12, 52>;
/// arm64 4 KiB pages, 39-bit VA: 3 full levels.
type K4x39 = TestFormat<3>;

/// One test a geometry and half: `pgtable_testkit::geometry`.
macro_rules! geometry_tests {
    ($($name:ident: $f:ty, $range:expr;)*) => {$(
        #[test]
        fn $name() {
            geometry::every_operation_in_the_geometry::<$f>(&[$range]);
        }
    )*};
}

geometry_tests! {
    geometry_16k_48bit_two_entry_root_lower: K16x48, VaRange::Lower;
    geometry_16k_48bit_two_entry_root_upper: K16x48, VaRange::Upper;
    geometry_16k_47bit_lower: K16x47, VaRange::Lower;
    geometry_16k_47bit_upper: K16x47, VaRange::Upper;
    geometry_16k_36bit_two_levels_lower: K16x36, VaRange::Lower;
    geometry_16k_36bit_two_levels_upper: K16x36, VaRange::Upper;
    geometry_16k_52bit_partial_root_lower: K16x52, VaRange::Lower;
    geometry_16k_52bit_partial_root_upper: K16x52, VaRange::Upper;
    geometry_64k_48bit_partial_root_lower: K64x48, VaRange::Lower;
    geometry_64k_48bit_partial_root_upper: K64x48, VaRange::Upper;
    geometry_64k_52bit_lower: K64x52, VaRange::Lower;
    geometry_64k_52bit_upper: K64x52, VaRange::Upper;
    geometry_64k_42bit_two_levels_lower: K64x42, VaRange::Lower;
    geometry_64k_42bit_two_levels_upper: K64x42, VaRange::Upper;
    geometry_4k_52bit_five_levels_lower: K4x52, VaRange::Lower;
    geometry_4k_52bit_five_levels_upper: K4x52, VaRange::Upper;
    geometry_4k_48bit_lower: TestFormat<4>, VaRange::Lower;
    geometry_4k_48bit_upper: TestFormat<4>, VaRange::Upper;
    geometry_4k_39bit_both_halves: K4x39, VaRange::Both;
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
