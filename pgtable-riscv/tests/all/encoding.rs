//! The RISC-V PTE encodings bit by bit (privileged spec, "Supervisor-Level
//! ISA", Sv39/Sv48/Sv57, Svpbmt, Svnapot): leaves, non-leaf PTEs, the
//! reserved encodings, memory types, NAPOT PTEs, software entries, A/D and
//! the access model.

use pgtable_core::contract::{Access, AccessFault, Decoded, Format};
use pgtable_core::{MemType, PhysAddr, Prot, VaRange, VirtAddr};
use pgtable_riscv::bits::{A, D, G, N, PBMT_IO, PBMT_MASK, PBMT_NC, R, U, V, W, X};
use pgtable_riscv::{
    hw_access_with, AdUpdates, EntryError, RiscvEntry, RiscvPaging, Sv39, Sv48, Sv57, SVNAPOT,
    SVPBMT,
};

type Full39 = RiscvPaging<3, { SVPBMT | SVNAPOT }>;

const USER: Access = Access {
    write: false,
    exec: false,
    user: true,
};

#[test]
fn every_leaf_bit_follows_the_protection() {
    let pa = PhysAddr(0x8000_1000);
    let cases: [(Prot, u64); 6] = [
        (Prot::READ_ONLY, V | R | A),
        (Prot::READ_WRITE, V | R | W | A | D),
        (Prot::READ_EXEC, V | R | X | A),
        (Prot::USER, V | R | U | A),
        // User writable leaves start clean.
        (Prot::USER | Prot::WRITE, V | R | W | U | A),
        (Prot::GLOBAL | Prot::EXEC, V | R | X | G | A),
    ];
    for (prot, flags) in cases {
        let e = Sv39::leaf(pa, prot, 0);
        assert_eq!(e, flags | 0x8000_1000 >> 2, "{prot:?}");
        assert_eq!(Sv39::decode(e, 0), Decoded::Leaf(pa));
        assert_eq!(Sv39::leaf_prot(e, 0), prot);
    }
}

#[test]
fn leaves_are_allowed_at_every_level_and_must_be_aligned() {
    fn check<F: Format>() {
        for h in 0..F::LEVELS {
            assert!(F::leaf_allowed(h));
            let size = 1u64 << (12 + 9 * h);
            let pa = PhysAddr(size.min(1 << 55));
            let e = F::leaf(pa, Prot::READ_WRITE, h);
            assert_eq!(F::decode(e, h), Decoded::Leaf(pa), "height {h}");
            if h > 0 {
                // A misaligned superpage: the walker faults on it.
                assert_eq!(F::decode(e | 1 << 10, h), Decoded::Invalid, "height {h}");
            }
        }
    }
    check::<Sv39>();
    check::<Sv48>();
    check::<Sv57>();
}

#[test]
fn non_leaf_entries_are_v_and_the_ppn_only() {
    let pa = PhysAddr(0x00ff_ffff_ffff_f000);
    for h in 1..5 {
        let t = Sv57::table_entry(pa, h);
        assert_eq!(t, V | 0x00ff_ffff_ffff_f000 >> 2);
        assert_eq!(Sv57::decode(t, h), Decoded::Table(pa));
        // U, A, D are reserved in a non-leaf PTE.
        for bit in [U, A, D] {
            assert_eq!(Sv57::decode(t | bit, h), Decoded::Invalid, "{bit:#x}");
        }
        // G is allowed (everything below is global).
        assert_eq!(Sv57::decode(t | G, h), Decoded::Table(pa));
    }
    // At level 0 a pointer is reserved: the walk has no next level.
    assert_eq!(Sv57::decode(Sv57::table_entry(pa, 1), 0), Decoded::Invalid);
    assert_eq!(Sv57::try_table_entry(pa, 0), Err(EntryError::BadHeight(0)));
    assert_eq!(
        Sv57::try_table_entry(PhysAddr(0x1_0000_0800), 1),
        Err(EntryError::MisalignedPhys(PhysAddr(0x1_0000_0800)))
    );
    assert_eq!(
        Sv57::try_table_entry(PhysAddr(1 << 56), 1),
        Err(EntryError::PhysOutOfRange(PhysAddr(1 << 56)))
    );
}

#[test]
fn write_without_read_is_refused_by_checked_construction() {
    let raw = V | W | A | D | 0x4000_0000 >> 2;
    assert_eq!(Sv39::decode(raw, 0), Decoded::Invalid);
    assert_eq!(
        RiscvEntry::<3>::from_raw(raw, 0),
        Err(EntryError::WriteWithoutRead(raw))
    );
    assert_eq!(
        RiscvEntry::<3>::from_raw(raw | X, 0),
        Err(EntryError::WriteWithoutRead(raw | X))
    );
    // With R it is a valid leaf.
    let ok = RiscvEntry::<3>::from_raw(raw | R, 0).unwrap();
    assert_eq!(ok.decoded(), Decoded::Leaf(PhysAddr(0x4000_0000)));
    // An invalid entry carries anything.
    assert!(RiscvEntry::<3>::from_raw(raw & !V, 0).is_ok());
}

#[test]
fn reserved_bits_make_an_entry_invalid() {
    let leaf = Sv39::leaf(PhysAddr(0x4000_0000), Prot::READ_WRITE, 0);
    for bit in 54..61 {
        assert_eq!(
            Sv39::decode(leaf | 1 << bit, 0),
            Decoded::Invalid,
            "bit {bit}"
        );
    }
    // PBMT and N are reserved without Svpbmt / Svnapot.
    assert_eq!(Sv39::decode(leaf | PBMT_NC, 0), Decoded::Invalid);
    assert_eq!(Sv39::decode(leaf | N | 0b1000 << 10, 0), Decoded::Invalid);
    assert_eq!(
        RiscvEntry::<3>::from_raw(leaf | 1 << 60, 0),
        Err(EntryError::Reserved {
            raw: leaf | 1 << 60,
            height: 0
        })
    );
    // PBMT = 3 is reserved even with Svpbmt.
    assert_eq!(Full39::decode(leaf | PBMT_MASK, 0), Decoded::Invalid);
    assert_eq!(
        RiscvEntry::<3>::from_raw(0, 7),
        Err(EntryError::BadHeight(7))
    );
}

#[test]
fn svpbmt_memory_types() {
    let pa = PhysAddr(0x1000_0000);
    for (mem, pbmt) in [
        (MemType::Normal, 0),
        (MemType::NormalNonCacheable, PBMT_NC),
        (MemType::Device, PBMT_IO),
    ] {
        let prot = Prot::READ_WRITE.with_mem(mem);
        let e = Full39::try_leaf(pa, prot, 0).unwrap();
        assert_eq!(e & PBMT_MASK, pbmt, "{mem:?}");
        assert_eq!(Full39::leaf_prot(e, 0), prot);
        assert_eq!(Full39::decode(e, 0), Decoded::Leaf(pa));
        // A protection change replaces the memory type.
        let back = Full39::modify_prot(e, Prot::READ_WRITE, 0);
        assert_eq!(back & PBMT_MASK, 0);
    }
}

#[test]
fn a_memory_type_without_svpbmt_is_a_typed_error() {
    let pa = PhysAddr(0x1000_0000);
    for mem in [MemType::NormalNonCacheable, MemType::Device] {
        let prot = Prot::READ_WRITE.with_mem(mem);
        assert_eq!(Sv48::try_leaf(pa, prot, 0), Err(EntryError::NoSvpbmt(mem)));
        assert_eq!(Sv48::check_prot(prot), Err(EntryError::NoSvpbmt(mem)));
        // The unchecked path writes PMA (no reserved bit) and reads Normal.
        let e = Sv48::leaf(pa, prot, 0);
        assert_eq!(e & PBMT_MASK, 0);
        assert_eq!(Sv48::leaf_prot(e, 0).mem(), MemType::Normal);
    }
    assert!(Sv48::try_leaf(pa, Prot::READ_WRITE, 0).is_ok());
}

#[test]
fn napot_64k_encode_and_decode() {
    let pa = PhysAddr(0x8001_0000);
    let e = Full39::try_napot_64k(pa, Prot::READ_WRITE).unwrap();
    // N, and PPN[3:0] = 1000 in place of the low 4 bits of the PPN.
    assert_eq!(e, Full39::leaf(pa, Prot::READ_WRITE, 0) | N | 0b1000 << 10);
    assert!(RiscvEntry::<3, { SVPBMT | SVNAPOT }>::from_raw(e, 0)
        .unwrap()
        .is_napot());
    // decode names the run's first page; each address gets its own page.
    assert_eq!(Full39::decode(e, 0), Decoded::Leaf(pa));
    for j in 0..16u64 {
        let va = VirtAddr(0x4000_0000 + j * 0x1000 + 0x123);
        assert_eq!(
            Full39::napot_page(e, 0, va),
            Some(PhysAddr(0x8001_0000 + j * 0x1000))
        );
    }
    // Other PPN[3:0] values with N are reserved, as is N above level 0.
    assert_eq!(Full39::decode(e ^ 0b1100 << 10, 0), Decoded::Invalid);
    let mega = Full39::leaf(PhysAddr(0x8020_0000), Prot::READ_WRITE, 1);
    assert_eq!(Full39::decode(mega | N, 1), Decoded::Invalid);
    // Checked construction.
    assert_eq!(
        Full39::try_napot_64k(PhysAddr(0x8001_1000), Prot::READ_WRITE),
        Err(EntryError::MisalignedPhys(PhysAddr(0x8001_1000)))
    );
    assert_eq!(
        RiscvPaging::<3, SVPBMT>::try_napot_64k(pa, Prot::READ_WRITE),
        Err(EntryError::NoSvnapot)
    );
    // The algorithms fold 64 KiB runs at the PTE level only, and only
    // where the harts have Svnapot.
    assert_eq!(Full39::cont_entries(0), 16);
    assert_eq!(Full39::cont_entries(1), 0);
    assert_eq!(RiscvPaging::<3, SVPBMT>::cont_entries(0), 0);
    // The run's PTE from the PTE of any of its pages, and back.
    for j in 0..16u64 {
        let page = Full39::leaf(PhysAddr(pa.0 + j * 0x1000), Prot::READ_WRITE, 0);
        assert_eq!(Full39::mk_cont(page, 0), e, "page {j}");
        assert!(Full39::is_cont(e, 0));
        // Entry `j` of the run, at table index 32 + j.
        let ix = 32 + j as usize;
        assert_eq!(Full39::clear_cont_at(e, 0, ix), page, "page {j}");
        assert_eq!(Full39::cont_pa(e, pa, 0, ix), PhysAddr(pa.0 + j * 0x1000));
        // A plain PTE names its own page whatever its index.
        assert_eq!(Full39::clear_cont_at(page, 0, ix + 1), page);
        assert_eq!(
            Full39::cont_pa(page, PhysAddr(pa.0 + j * 0x1000), 0, 7),
            PhysAddr(pa.0 + j * 0x1000)
        );
    }
}

#[test]
fn software_entries_use_rsw_and_decode_invalid_at_every_height() {
    for v in [0u64, 1, 0x1234_5678, (1 << 54) - 1] {
        let e = Sv57::swp_entry(v).unwrap();
        assert_ne!(e, 0);
        assert_eq!(e & V, 0);
        assert_eq!(e & 0x3ff, 1 << 8, "the RSW tag");
        assert_eq!(Sv57::swp_value(e), Some(v));
        for h in 0..5 {
            assert_eq!(Sv57::decode(e, h), Decoded::Invalid);
        }
    }
    assert_eq!(Sv57::swp_entry(1 << 54), None);
    let leaf = Sv57::leaf(PhysAddr(0x1000), Prot::READ_WRITE, 0);
    assert_eq!(Sv57::swp_value(leaf), None);
    assert_eq!(
        Sv57::swp_value(Sv57::table_entry(PhysAddr(0x1000), 1)),
        None
    );
    assert_eq!(Sv57::swp_value(0), None);
}

#[test]
fn modify_prot_keeps_address_and_accessed_dirty() {
    let pa = PhysAddr(0x8000_0000);
    let e = Sv39::leaf(pa, Prot::USER | Prot::WRITE, 1) | D | 1 << 9;
    let ro = Sv39::modify_prot(e, Prot::USER | Prot::EXEC, 1);
    assert_eq!(ro, (e & !W) | X);
    assert_eq!(Sv39::decode(ro, 1), Decoded::Leaf(pa));
    assert!(Sv39::is_dirty(ro) && Sv39::is_young(ro));
    assert!(Sv39::is_settled(ro, 1));
    let clean = Sv39::mkclean(Sv39::mkold(e, 1), 1);
    assert!(!Sv39::is_young(clean) && !Sv39::is_dirty(clean));
    assert!(!Sv39::is_settled(clean, 1));
    assert_eq!(Sv39::mkdirty(Sv39::mkyoung(clean, 1), 1), e);
    assert_eq!(Sv39::split_leaf(e, 1), e);
}

#[test]
fn canonical_addresses() {
    assert!(VaRange::Both.contains::<Sv39>(0x3f_ffff_ffff));
    assert!(!VaRange::Both.contains::<Sv39>(0x40_0000_0000));
    assert!(VaRange::Both.contains::<Sv39>(0xffff_ffc0_0000_0000));
    assert!(!VaRange::Both.contains::<Sv39>(0xffff_ff80_0000_0000));
    assert!(VaRange::Both.contains::<Sv48>(0x7fff_ffff_ffff));
    assert!(!VaRange::Both.contains::<Sv48>(0x8000_0000_0000));
    assert!(VaRange::Both.contains::<Sv57>(0x00ff_ffff_ffff_ffff));
    assert!(!VaRange::Both.contains::<Sv57>(0x0100_0000_0000_0000));
    assert!(VaRange::Both.contains::<Sv57>(0xff00_0000_0000_0000));
}

#[test]
fn access_rights_and_accessed_dirty_updates() {
    let user_rw = Sv39::leaf(PhysAddr(0x1000), Prot::USER | Prot::WRITE, 0);
    let kernel_x = Sv39::leaf(PhysAddr(0x2000), Prot::READ_EXEC, 0);
    // U-mode needs U; S-mode never executes from a U page (SUM aside).
    assert_eq!(
        Sv39::hw_access(kernel_x, 0, USER),
        Err(AccessFault::Privilege)
    );
    assert!(Sv39::hw_access(user_rw, 0, Access::READ).is_ok());
    let user_x = Sv39::modify_prot(user_rw, Prot::USER | Prot::EXEC, 0);
    assert_eq!(
        Sv39::hw_access(user_x, 0, Access::EXEC),
        Err(AccessFault::Privilege)
    );
    assert_eq!(
        Sv39::hw_access(kernel_x, 0, Access::WRITE),
        Err(AccessFault::Write)
    );
    assert_eq!(
        Sv39::hw_access(user_rw, 0, Access { exec: true, ..USER }),
        Err(AccessFault::Exec)
    );
    // Hardware A/D (Svadu): a store sets D.
    let w = Access {
        write: true,
        ..USER
    };
    assert_eq!(Sv39::hw_access(user_rw, 0, w), Ok(user_rw | D));
    // Software A/D (Svade): the same store faults, and so does any access
    // with A clear; a settled entry is used as it is.
    assert_eq!(
        hw_access_with(user_rw, 0, w, AdUpdates::Software),
        Err(AccessFault::AccessFlag)
    );
    assert_eq!(
        hw_access_with(user_rw & !A, 0, USER, AdUpdates::Software),
        Err(AccessFault::AccessFlag)
    );
    assert_eq!(
        hw_access_with(user_rw | D, 0, w, AdUpdates::Software),
        Ok(user_rw | D)
    );
}
