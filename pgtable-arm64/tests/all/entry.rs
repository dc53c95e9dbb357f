//! Checked descriptor construction: every error of `try_leaf`,
//! `try_table_entry` and `Arm64Entry::from_raw`, and that what they accept
//! is exactly what the unchecked `Format` methods build.

use pgtable_arm64::{Arm64, Arm64Entry, Arm64Va39, EntryError};
use pgtable_core::contract::{Decoded, Format, Level};
use pgtable_core::{PhysAddr, Prot};

const M2: u64 = 2 << 20;

#[test]
fn try_leaf_builds_what_leaf_builds_and_rejects_bad_input() {
    let rw = Prot::READ_WRITE;
    for (pa, h) in [(0x4000_1000, 0), (0x4020_0000, 1), (0x8000_0000, 2)] {
        assert_eq!(
            Arm64::try_leaf(PhysAddr(pa), rw, h),
            Ok(Arm64::leaf(PhysAddr(pa), rw, h)),
            "height {h}"
        );
    }
    let cases = [
        // A 2 MiB block must be 2 MiB aligned.
        (
            0x4020_1000,
            1,
            EntryError::MisalignedPhys(PhysAddr(0x4020_1000)),
        ),
        (
            M2 + (1 << 30),
            2,
            EntryError::MisalignedPhys(PhysAddr(M2 + (1 << 30))),
        ),
        // The output address has 48 bits.
        (1 << 48, 0, EntryError::PhysOutOfRange(PhysAddr(1 << 48))),
        // No block at level 0 with the 4 KiB granule.
        (0, 3, EntryError::LeafNotAllowed(3)),
        (0, 4, EntryError::BadHeight(4)),
    ];
    for (pa, h, want) in cases {
        assert_eq!(
            Arm64::try_leaf(PhysAddr(pa), rw, h),
            Err(want),
            "{pa:#x} at {h}"
        );
    }
    // A 3-level format has no height 3.
    assert_eq!(
        Arm64Va39::try_leaf(PhysAddr(0), rw, 3),
        Err(EntryError::BadHeight(3))
    );
}

#[test]
fn try_table_entry_builds_what_table_entry_builds_and_rejects_bad_input() {
    for h in 1..4 {
        assert_eq!(
            Arm64::try_table_entry(PhysAddr(0x4000_3000), h),
            Ok(Arm64::table_entry(PhysAddr(0x4000_3000), h))
        );
    }
    assert_eq!(
        Arm64::try_table_entry(PhysAddr(0x4000_3000), 0),
        Err(EntryError::BadHeight(0))
    );
    assert_eq!(
        Arm64::try_table_entry(PhysAddr(0x4000_3000), 4),
        Err(EntryError::BadHeight(4))
    );
    assert_eq!(
        Arm64::try_table_entry(PhysAddr(0x4000_3008), 1),
        Err(EntryError::MisalignedPhys(PhysAddr(0x4000_3008)))
    );
    assert_eq!(
        Arm64::try_table_entry(PhysAddr(1 << 48), 1),
        Err(EntryError::PhysOutOfRange(PhysAddr(1 << 48)))
    );
}

#[test]
fn from_raw_rejects_reserved_encodings_and_bad_heights() {
    // Level 3 with bit 1 clear is reserved; so is a block at level 0.
    for (raw, h) in [(0x4000_1001, 0), (0x0000_0000_0000_0401, 3)] {
        assert_eq!(
            Arm64Entry::<Arm64>::from_raw(raw, h),
            Err(EntryError::ReservedEncoding { raw, height: h })
        );
    }
    assert_eq!(
        Arm64Entry::<Arm64>::from_raw(0, 4),
        Err(EntryError::BadHeight(4))
    );
    assert_eq!(
        Arm64Entry::<Arm64Va39>::from_raw(0, 3),
        Err(EntryError::BadHeight(3))
    );
    // A software entry (valid bit clear) is accepted as it is.
    let swp = Arm64Entry::<Arm64>::from_raw(0x1234_5000 | 1 << 2, 0).unwrap();
    assert!(!swp.is_valid());
    assert_eq!(swp.decoded(), Decoded::Invalid);
}

#[test]
fn from_raw_reads_back_leaves_and_tables() {
    let raw = Arm64::leaf(PhysAddr(0x4020_0000), Prot::READ_ONLY, 1);
    let e = Arm64Entry::<Arm64>::from_raw(raw, 1).unwrap();
    assert_eq!((e.raw(), e.height(), e.level()), (raw, 1, Level::Pmd));
    assert_eq!(e.leaf_addr(), Some(PhysAddr(0x4020_0000)));
    assert_eq!(e.table_addr(), None);
    assert_eq!(e.prot(), Some(Prot::READ_ONLY));
    assert!(e.is_valid() && e.is_accessed());
    let t = Arm64Entry::<Arm64>::from_raw(Arm64::table_entry(PhysAddr(0x4000_3000), 2), 2).unwrap();
    assert_eq!(t.table_addr(), Some(PhysAddr(0x4000_3000)));
    assert_eq!((t.leaf_addr(), t.prot()), (None, None));
}
