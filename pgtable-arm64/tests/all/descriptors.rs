//! Descriptor encodings checked against bit patterns written by hand from
//! the Arm ARM (D8.3): every kind (table, L1 block, L2 block, L3 page) at
//! every level, both formats.

use pgtable_arm64::format::{self, HwFeatures};
use pgtable_arm64::{Arm64, Arm64Va39, Descriptor, MAIR_VALUE};
use pgtable_core::contract::{Access, AccessFault, Decoded, Format};
use pgtable_core::{MemType, PhysAddr, Prot, VaRange};

const KERNEL_RW_GLOBAL: Prot = Prot::WRITE.union(Prot::GLOBAL);
const KERNEL_RO_GLOBAL: Prot = Prot::GLOBAL;

/// Hand-written descriptors: (height, pa, prot, the exact u64).
///
/// Bits used: 0 valid, 1 table/page, 4:2 AttrIndx, 6 AP[1], 7 AP[2],
/// 9:8 SH (0b11 = 0x300), 10 AF (0x400), 11 nG (0x800), 51 DBM,
/// 53 PXN, 54 UXN.
fn hand_written() -> Vec<(u32, u64, Prot, u64)> {
    vec![
        // 2 MiB block at 0x4020_0000, AttrIndx 0, SH inner, AF, UXN|PXN,
        // read-only (AP[2]), global: 0x1 | 0x80 | 0x300 | 0x400, bits 54+53.
        (1, 0x4020_0000, KERNEL_RO_GLOBAL, 0x0060_0000_4020_0781),
        // The same block writable: AP[2] clear, DBM (bit 51) set.
        (1, 0x4020_0000, KERNEL_RW_GLOBAL, 0x0068_0000_4020_0701),
        // 1 GiB block at 0x8000_0000, kernel read-only executable, not
        // global: 0x1 | 0x80 | 0x300 | 0x400 | 0x800, UXN only.
        (2, 0x8000_0000, Prot::READ_EXEC, 0x0040_0000_8000_0f81),
        // 4 KiB page at 0x0912_3000, user read-write, device (AttrIndx 2 =
        // 0x8), not global: 0x3 | 0x8 | 0x40 | 0x80 | 0x300 | 0x400 | 0x800,
        // DBM | PXN | UXN (clean: AP[2] set with DBM).
        (
            0,
            0x0912_3000,
            Prot::WRITE | Prot::USER.with_mem(MemType::Device),
            0x0068_0000_0912_3fcb,
        ),
        // 4 KiB page at 0x1000, user read-execute, Normal-NC (AttrIndx 1 =
        // 0x4): 0x3 | 0x4 | 0x40 | 0x80 | 0x300 | 0x400 | 0x800, PXN only.
        (
            0,
            0x1000,
            Prot::EXEC | Prot::USER.with_mem(MemType::NormalNonCacheable),
            0x0020_0000_0000_1fc7,
        ),
        // 4 KiB page at the top of the 48-bit PA space, kernel RW global.
        (0, 0xffff_ffff_f000, KERNEL_RW_GLOBAL, 0x0068_ffff_ffff_f703),
    ]
}

#[test]
fn leaves_encode_to_hand_written_bits_and_decode_back() {
    for (h, pa, prot, want) in hand_written() {
        let raw = Arm64::leaf(PhysAddr(pa), prot, h);
        assert_eq!(raw, want, "encode h{h} {prot:?}: {:?}", Descriptor(raw));
        assert_eq!(Arm64::decode(want, h), Decoded::Leaf(PhysAddr(pa)));
        assert_eq!(Arm64::leaf_prot(want, h), prot, "h{h}");
        // The 39-bit format shares the descriptor layout.
        assert_eq!(Arm64Va39::leaf(PhysAddr(pa), prot, h), want);
        assert_eq!(Arm64Va39::decode(want, h), Decoded::Leaf(PhysAddr(pa)));
    }
}

#[test]
fn table_descriptors_encode_and_decode_at_every_table_level() {
    for h in 1..=3 {
        let raw = Arm64::table_entry(PhysAddr(0x1234_5000), h);
        assert_eq!(raw, 0x0000_0000_1234_5003);
        assert_eq!(Arm64::decode(raw, h), Decoded::Table(PhysAddr(0x1234_5000)));
    }
    // Hierarchical attributes (PXNTable, UXNTable, APTable) do not change
    // what the entry points at.
    let with_attrs = 0x7800_0000_1234_5003u64;
    assert_eq!(
        Arm64::decode(with_attrs, 2),
        Decoded::Table(PhysAddr(0x1234_5000))
    );
    for h in 1..=2 {
        let raw = Arm64Va39::table_entry(PhysAddr(0xffff_ffff_f000), h);
        assert_eq!(raw, 0x0000_ffff_ffff_f003);
        assert_eq!(
            Arm64Va39::decode(raw, h),
            Decoded::Table(PhysAddr(0xffff_ffff_f000))
        );
    }
}

#[test]
fn reserved_and_invalid_encodings_decode_as_invalid_or_none() {
    assert_eq!(Arm64::decode(0, 0), Decoded::None);
    assert_eq!(Arm64::decode(0, 3), Decoded::None);
    // Low 12 bits clear: never valid (the free-list link rule).
    assert_eq!(Arm64::decode(0x8000_1000, 0), Decoded::Invalid);
    assert_eq!(Arm64::decode(0x8000_1000, 2), Decoded::Invalid);
    // Valid bit clear with other bits set (a software encoding).
    assert_eq!(Arm64::decode(0x0060_0000_4020_0780, 1), Decoded::Invalid);
    // L3 with bit 1 clear is reserved.
    assert_eq!(Arm64::decode(0x0060_0000_4020_0781, 0), Decoded::Invalid);
    // A block at L0 is not allowed with the 4 KiB granule.
    assert_eq!(Arm64::decode(0x0060_0080_0000_0781, 3), Decoded::Invalid);
    assert!(!Arm64::leaf_allowed(3));
    assert!(Arm64::leaf_allowed(2) && Arm64::leaf_allowed(1) && Arm64::leaf_allowed(0));
    assert!(Arm64Va39::leaf_allowed(2));
}

#[test]
fn block_address_ignores_bits_below_the_block_size() {
    // A 2 MiB block with nT (bit 16) set: the address is still 0x4020_0000.
    assert_eq!(
        Arm64::decode(0x0060_0000_4021_0781, 1),
        Decoded::Leaf(PhysAddr(0x4020_0000))
    );
    // A 1 GiB block with bit 29 set in the address field.
    assert_eq!(
        Arm64::decode(0x0060_0000_6000_0781, 2),
        Decoded::Leaf(PhysAddr(0x4000_0000))
    );
}

#[test]
fn every_prot_round_trips_at_every_leaf_level() {
    let mems = [
        MemType::Normal,
        MemType::NormalNonCacheable,
        MemType::Device,
    ];
    for bits in 0..16u8 {
        for mem in mems {
            let prot = Prot::from_bits_truncate(bits).with_mem(mem);
            for h in 0..=2 {
                let pa = PhysAddr(0x1_0000_0000u64 << (h * 2));
                let raw = Arm64::leaf(pa, prot, h);
                assert_eq!(Arm64::leaf_template(prot, h) | pa.0, raw);
                assert_eq!(Arm64::decode(raw, h), Decoded::Leaf(pa));
                assert_eq!(Arm64::leaf_prot(raw, h), prot, "h{h} {prot:?}");
                assert!(Arm64::is_young(raw), "new leaves have AF set");
                let d = Descriptor(raw);
                assert_eq!(d.sh(), 0b11, "inner shareable");
                assert_eq!(d.ng(), !prot.global());
                assert_eq!(d.ap() & 1 == 1, prot.user());
                // Kernel writable leaves are created dirty (PAGE_KERNEL),
                // user writable leaves clean.
                assert_eq!(
                    Arm64::is_dirty(raw),
                    prot.writable() && !prot.user(),
                    "{prot:?}"
                );
                assert_eq!(d.dbm(), prot.writable());
            }
        }
    }
}

#[test]
fn mair_layout_matches_attr_indices() {
    let byte = |i: u64| (MAIR_VALUE >> (8 * i)) & 0xff;
    let idx = |m| format::attr_index(m);
    assert_eq!(byte(idx(MemType::Normal)), 0xff);
    assert_eq!(byte(idx(MemType::NormalNonCacheable)), 0x44);
    assert_eq!(byte(idx(MemType::Device)), 0x04);
    for i in 3..8 {
        assert_eq!(byte(i), 0x00, "Device-nGnRnE");
        assert_eq!(format::mem_type(i), MemType::Device);
    }
}

#[test]
fn contiguous_hint_is_queryable_and_survives_modify_but_not_split() {
    let raw = Arm64::leaf(PhysAddr(0x20_0000), Prot::READ_WRITE, 0);
    assert!(!format::is_contiguous(raw));
    let cont = format::mk_contiguous(raw);
    assert_eq!(cont, raw | 1 << 52);
    assert!(format::is_contiguous(cont));
    assert!(Descriptor(cont).contiguous());
    assert!(format::is_contiguous(Arm64::modify_prot(
        cont,
        Prot::READ_ONLY,
        0
    )));
    let block = format::mk_contiguous(Arm64::leaf(PhysAddr(0x4000_0000), Prot::READ_WRITE, 1));
    assert!(!format::is_contiguous(Arm64::split_leaf(block, 1)));
}

#[test]
fn split_makes_pages_from_2m_blocks_and_2m_blocks_from_1g_blocks() {
    let g = Arm64::leaf(PhysAddr(0x4000_0000), KERNEL_RW_GLOBAL, 2);
    let child = Arm64::split_leaf(g, 2);
    assert_eq!(
        child, g,
        "a 1 GiB block splits into 2 MiB blocks with the same bits"
    );
    assert_eq!(
        Arm64::decode(child, 1),
        Decoded::Leaf(PhysAddr(0x4000_0000))
    );
    let m = Arm64::leaf(PhysAddr(0x4020_0000), KERNEL_RW_GLOBAL, 1);
    let page = Arm64::split_leaf(m, 1);
    assert_eq!(page, 0x0068_0000_4020_0703);
    assert_eq!(Arm64::decode(page, 0), Decoded::Leaf(PhysAddr(0x4020_0000)));
    assert_eq!(Arm64::leaf_prot(page, 0), KERNEL_RW_GLOBAL);
}

#[test]
fn modify_prot_keeps_address_access_flag_and_dirty_state() {
    let rw_user = Prot::WRITE | Prot::USER;
    let ro_user = Prot::USER;
    let clean = Arm64::leaf(PhysAddr(0x5000), rw_user, 0);
    // The hardware marks it dirty: AP[2] cleared.
    let dirty = Arm64::hw_access(
        clean,
        0,
        Access {
            write: true,
            exec: false,
            user: true,
        },
    )
    .unwrap();
    assert_eq!(dirty, clean & !(1 << 7));
    assert!(Arm64::is_dirty(dirty));
    // Read-only: AP[2] set, DBM clear, the dirty state moves to bit 55.
    let ro = Arm64::modify_prot(dirty, ro_user, 0);
    assert_eq!(ro, (clean & !(1 << 51)) | 1 << 55);
    assert!(Arm64::is_dirty(ro));
    assert_eq!(Arm64::leaf_prot(ro, 0), ro_user);
    // Writable again: hardware dirty again (AP[2] clear).
    let rw = Arm64::modify_prot(ro, rw_user, 0);
    assert_eq!(rw, dirty | 1 << 55);
    assert!(format::is_hw_dirty(rw));
    // A clean leaf stays clean; an old (AF clear) leaf stays old.
    let old = clean & !(1 << 10);
    let m = Arm64::modify_prot(old, ro_user, 0);
    assert!(!Arm64::is_dirty(m) && !Arm64::is_young(m));
    assert_eq!(Arm64::decode(m, 0), Decoded::Leaf(PhysAddr(0x5000)));
    // Blocks keep their address too.
    let b = Arm64::leaf(PhysAddr(0x8000_0000), KERNEL_RW_GLOBAL, 2);
    let bm = Arm64::modify_prot(b, Prot::READ_EXEC, 2);
    assert_eq!(Arm64::decode(bm, 2), Decoded::Leaf(PhysAddr(0x8000_0000)));
    assert_eq!(Arm64::leaf_prot(bm, 2), Prot::READ_EXEC);
}

const UW: Access = Access {
    write: true,
    exec: false,
    user: true,
};
const UR: Access = Access {
    write: false,
    exec: false,
    user: true,
};
const UX: Access = Access {
    write: false,
    exec: true,
    user: true,
};

#[test]
fn hardware_marks_dbm_leaves_dirty_and_refuses_read_only_stores() {
    let rw_user = Arm64::leaf(PhysAddr(0x7000), Prot::WRITE | Prot::USER, 0);
    assert!(!Arm64::is_settled(rw_user, 0), "writable and clean");
    let after = Arm64::hw_access(rw_user, 0, UW).unwrap();
    assert!(Arm64::is_dirty(after) && Arm64::is_settled(after, 0));
    // A read changes nothing (AF already set).
    assert_eq!(Arm64::hw_access(rw_user, 0, UR), Ok(rw_user));
    // Without FEAT_HAFDBS dirty management the store faults.
    assert_eq!(
        format::hw_access_with(rw_user, 0, UW, HwFeatures::NONE),
        Err(AccessFault::Write)
    );
    // Read-only (no DBM): a store faults even with HAFDBS.
    let ro = Arm64::leaf(PhysAddr(0x7000), Prot::READ_ONLY, 0);
    assert_eq!(
        Arm64::hw_access(ro, 0, Access::WRITE),
        Err(AccessFault::Write)
    );
    assert!(Arm64::is_settled(ro, 0));
    // Kernel writable leaves are created dirty and settled.
    let krw = Arm64::leaf(PhysAddr(0x7000), Prot::READ_WRITE, 0);
    assert!(Arm64::is_settled(krw, 0));
    assert_eq!(Arm64::hw_access(krw, 0, Access::WRITE), Ok(krw));
}

#[test]
fn hardware_sets_the_access_flag_only_with_hafdbs() {
    let old = Arm64::leaf(PhysAddr(0x9000), Prot::READ_WRITE, 1) & !(1 << 10);
    assert!(!Arm64::is_young(old) && !Arm64::is_settled(old, 1));
    assert_eq!(Arm64::hw_access(old, 1, Access::READ), Ok(old | 1 << 10));
    assert_eq!(
        format::hw_access_with(old, 1, Access::READ, HwFeatures::NONE),
        Err(AccessFault::AccessFlag)
    );
    // A faulting access leaves the entry as it was.
    assert_eq!(Arm64::hw_access(old, 1, UR), Err(AccessFault::Privilege));
}

#[test]
fn el0_access_and_execute_never_are_enforced() {
    let kernel = Arm64::leaf(PhysAddr(0x9000), Prot::READ_EXEC, 0);
    assert_eq!(Arm64::hw_access(kernel, 0, UR), Err(AccessFault::Privilege));
    assert_eq!(Arm64::hw_access(kernel, 0, Access::EXEC), Ok(kernel));
    let kdata = Arm64::leaf(PhysAddr(0x9000), Prot::READ_WRITE, 0);
    assert_eq!(
        Arm64::hw_access(kdata, 0, Access::EXEC),
        Err(AccessFault::Exec)
    );
    let utext = Arm64::leaf(PhysAddr(0x9000), Prot::EXEC | Prot::USER, 0);
    assert_eq!(Arm64::hw_access(utext, 0, UX), Ok(utext));
    // The kernel never executes user pages (PXN).
    assert_eq!(
        Arm64::hw_access(utext, 0, Access::EXEC),
        Err(AccessFault::Exec)
    );
    let udata = Arm64::leaf(PhysAddr(0x9000), Prot::WRITE | Prot::USER, 0);
    assert_eq!(Arm64::hw_access(udata, 0, UX), Err(AccessFault::Exec));
    // EL1 fetch from EL0-writable memory is refused even without PXN.
    let el0_writable = 0x0000_0000_0000_9443u64; // valid page, AP[2:1] = 01, AF
    assert_eq!(
        Arm64::hw_access(el0_writable, 0, Access::EXEC),
        Err(AccessFault::Exec)
    );
    // The kernel may read and write user data (PAN off).
    assert!(Arm64::hw_access(udata, 0, Access::WRITE).is_ok());
}

#[test]
fn formats_have_the_documented_geometry() {
    assert_eq!((Arm64::LEVELS, Arm64::VA_BITS, Arm64::PA_BITS), (4, 48, 48));
    assert_eq!((Arm64Va39::LEVELS, Arm64Va39::VA_BITS), (3, 39));
    assert!(VaRange::Both.contains::<Arm64>(0x0000_7fff_ffff_f000));
    assert!(VaRange::Both.contains::<Arm64>(0xffff_8000_0000_0000));
    assert!(!VaRange::Both.contains::<Arm64>(0x0000_8000_0000_0000));
    assert!(VaRange::Both.contains::<Arm64Va39>(0x3f_ffff_f000));
    assert!(!VaRange::Both.contains::<Arm64Va39>(0x40_0000_0000));
    assert_ne!(Arm64::NAME, Arm64Va39::NAME);
}

#[test]
fn descriptor_field_setters_place_bits_where_the_arm_arm_says() {
    let d = Descriptor(0b11)
        .with_address(PhysAddr(0x1234_5000))
        .with_attr_index(2)
        .with_sh(0b11)
        .with_contiguous(true);
    // 0x3 | AttrIndx 2 << 2 (0x8) | SH 0x300 | address | bit 52.
    assert_eq!(d.0, 0x0010_0000_1234_530b);
    assert_eq!(
        (d.attr_index(), d.sh(), d.address(), d.contiguous()),
        (2, 0b11, PhysAddr(0x1234_5000), true)
    );
    assert!(d.valid() && d.table_or_page() && !d.af() && !d.ng());
    assert!(!d.pxn() && !d.uxn() && !d.dbm());
    assert_eq!(d.software(), 0);
    assert_eq!(d.with_contiguous(false).0, 0x0000_0000_1234_530b);
    let dbg = format!("{d:?}");
    assert!(dbg.contains("attr2") && dbg.contains("cont1"), "{dbg}");
}
