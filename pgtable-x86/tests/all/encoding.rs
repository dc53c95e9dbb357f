//! Entry encodings against bit patterns written by hand from the Intel SDM
//! (Vol. 3A §4.5, Tables 4-14..4-20), for 4-level and 5-level paging.

use pgtable_core::contract::{Access, AccessFault, Decoded, Format};
use pgtable_core::{MemType, PhysAddr, Prot, VaRange};
use pgtable_x86::{bits, EntryError, ReservedBits, X86Entry, X86Paging, X86_64La57, X86_64};

type F4 = X86_64;
type F5 = X86_64La57;
type F4m46 = X86Paging<4, 46>;

const XD: u64 = 1 << 63;

fn user(bits: Prot) -> Prot {
    bits | Prot::USER
}

/// (height, pa, prot, expected raw) — the same for both layouts at the
/// PTE, PDE and PDPTE levels.
fn leaf_cases() -> Vec<(u32, u64, Prot, u64)> {
    vec![
        // PTE, kernel RW NX: P | R/W | A | D | XD.
        (0, 0x1234_5000, Prot::READ_WRITE, XD | 0x1234_5000 | 0x63),
        // PTE, kernel RO exec: P | A.
        (0, 0x1000, Prot::READ_EXEC, 0x1021),
        // PTE, kernel RO NX: P | A | XD.
        (0, 0x2000, Prot::READ_ONLY, XD | 0x2021),
        // PTE, user RX: P | U/S, no A/D for user leaves.
        (0, 0x7000, user(Prot::EXEC), 0x7005),
        // PTE, user RW NX: P | R/W | U/S | XD.
        (0, 0x7000, user(Prot::WRITE), XD | 0x7007),
        // PTE, kernel RW NX device (UC, PAT index 3): PWT | PCD.
        (
            0,
            0xfee0_0000,
            Prot::READ_WRITE.with_mem(MemType::Device),
            XD | 0xfee0_0000 | 0x7b,
        ),
        // PTE at the top of a 52-bit physical space.
        (
            0,
            0x000f_ffff_ffff_f000,
            Prot::READ_EXEC,
            0x000f_ffff_ffff_f021,
        ),
        // PDE 2 MiB, kernel RW NX: P | R/W | A | D | PS | XD.
        (1, 0x20_0000, Prot::READ_WRITE, 0x8000_0000_0020_00e3),
        // PDE 2 MiB, kernel RW NX non-cacheable (UC-, PAT index 2): PCD.
        (
            1,
            0x8000_0000,
            Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable),
            0x8000_0000_8000_00f3,
        ),
        // PDE 2 MiB, user RO NX global: P | U/S | PS | G | XD.
        (
            1,
            0x40_0000,
            Prot::USER | Prot::GLOBAL,
            XD | 0x40_0000 | 0x185,
        ),
        // PDPTE 1 GiB, kernel RWX global: P | R/W | A | D | PS | G.
        (
            2,
            0x4000_0000,
            Prot::WRITE | Prot::EXEC | Prot::GLOBAL,
            0x4000_01e3,
        ),
        // PDPTE 1 GiB, kernel RW NX device: PWT | PCD as well.
        (
            2,
            0x1_0000_0000,
            Prot::READ_WRITE.with_mem(MemType::Device),
            XD | 0x1_0000_0000 | 0xfb,
        ),
    ]
}

#[test]
fn leaves_encode_to_sdm_bit_patterns_and_decode_back_in_both_layouts() {
    for (h, pa, prot, raw) in leaf_cases() {
        for (name, built, decoded, back) in [
            (
                "4-level",
                F4::leaf(PhysAddr(pa), prot, h),
                F4::decode(raw, h),
                F4::leaf_prot(raw, h),
            ),
            (
                "5-level",
                F5::leaf(PhysAddr(pa), prot, h),
                F5::decode(raw, h),
                F5::leaf_prot(raw, h),
            ),
        ] {
            assert_eq!(built, raw, "{name} h{h} {prot:?}: {built:#x} != {raw:#x}");
            assert_eq!(decoded, Decoded::Leaf(PhysAddr(pa)), "{name} h{h}");
            assert_eq!(back, prot, "{name} h{h}");
        }
    }
}

#[test]
fn leaf_is_template_or_address() {
    for (h, pa, prot, raw) in leaf_cases() {
        assert_eq!(F4::leaf_template(prot, h) | pa, raw);
        assert_eq!(
            F4::leaf_template(prot, h) & pa,
            0,
            "template overlaps address"
        );
    }
}

#[test]
fn table_entries_are_present_writable_user_accessed_at_every_level() {
    // P | R/W | U/S | A = 0x27.
    for h in 1..4 {
        assert_eq!(F4::table_entry(PhysAddr(0x5000), h), 0x5027);
        assert_eq!(F4::decode(0x5027, h), Decoded::Table(PhysAddr(0x5000)));
    }
    for h in 1..5 {
        assert_eq!(F5::table_entry(PhysAddr(0xabc_d000), h), 0xabc_d027);
        assert_eq!(
            F5::decode(0xabc_d027, h),
            Decoded::Table(PhysAddr(0xabc_d000))
        );
    }
    // The widest 52-bit table address.
    assert_eq!(
        F4::decode(0x000f_ffff_ffff_f027, 3),
        Decoded::Table(PhysAddr(0x000f_ffff_ffff_f000))
    );
}

#[test]
fn ps_is_reserved_in_pml4e_and_pml5e() {
    // Table 4-15 (PML4E) and 4-14 (PML5E): bit 7 reserved.
    let raw = 0x5027 | bits::PS;
    assert_eq!(F4::decode(raw, 3), Decoded::Invalid);
    assert_eq!(F5::decode(raw, 3), Decoded::Invalid);
    assert_eq!(F5::decode(raw, 4), Decoded::Invalid);
    assert_eq!(
        F4::validate(raw, 3),
        Err(ReservedBits {
            raw,
            height: 3,
            bits: bits::PS
        })
    );
    // The same bit is a valid PS in a PDPTE/PDE and PAT in a PTE.
    assert_eq!(
        F5::decode(0x4000_0000 | 0xa7, 2),
        Decoded::Leaf(PhysAddr(0x4000_0000))
    );
    // (0x5000 has bits 12 and 14 set: bit 14 is reserved in a 1 GiB PDPTE.)
    assert_eq!(F5::decode(raw, 2), Decoded::Invalid);
    assert_eq!(F5::decode(raw, 0), Decoded::Leaf(PhysAddr(0x5000)));
}

#[test]
fn reserved_bits_of_huge_pages_decode_as_invalid() {
    let pde = 0x8000_0000_0020_00e3u64;
    // Table 4-18: bits 20:13 of a 2 MiB PDE are reserved.
    for bit in 13..=20 {
        let raw = pde | 1 << bit;
        assert_eq!(F4::decode(raw, 1), Decoded::Invalid, "bit {bit}");
        assert_eq!(F5::decode(raw, 1), Decoded::Invalid, "bit {bit}");
        assert_eq!(F4::validate(raw, 1).unwrap_err().bits, 1 << bit);
    }
    // Bit 21 is address, bit 12 is PAT.
    assert_eq!(
        F4::decode(pde | 1 << 22, 1),
        Decoded::Leaf(PhysAddr(0x60_0000))
    );
    assert_eq!(
        F4::decode(pde | bits::PAT_HUGE, 1),
        Decoded::Leaf(PhysAddr(0x20_0000))
    );
    let pdpte = 0x4000_01e3u64;
    // Table 4-16: bits 29:13 of a 1 GiB PDPTE are reserved.
    for bit in 13..=29 {
        assert_eq!(
            F4::decode(pdpte | 1 << bit, 2),
            Decoded::Invalid,
            "bit {bit}"
        );
        assert_eq!(
            F5::decode(pdpte | 1 << bit, 2),
            Decoded::Invalid,
            "bit {bit}"
        );
    }
    assert_eq!(
        F4::decode(pdpte | bits::PAT_HUGE, 2),
        Decoded::Leaf(PhysAddr(0x4000_0000))
    );
    // The same bits are address bits in a PDE/PDPTE that references a table.
    assert_eq!(
        F4::decode(0x0020_3027, 2),
        Decoded::Table(PhysAddr(0x0020_3000))
    );
}

#[test]
fn bits_at_or_above_maxphyaddr_are_reserved() {
    let pte = 0x0000_4000_0000_0003u64; // bit 46 of the address, P | R/W
    assert_eq!(F4m46::decode(pte, 0), Decoded::Invalid);
    assert_eq!(
        F4m46::validate(pte, 0),
        Err(ReservedBits {
            raw: pte,
            height: 0,
            bits: 1 << 46
        })
    );
    assert_eq!(F4::decode(pte, 0), Decoded::Leaf(PhysAddr(1 << 46)));
    // Table entries too, at every level.
    assert_eq!(F4m46::decode(pte | 0x24, 3), Decoded::Invalid);
    assert_eq!(
        F4m46::decode((1 << 45) | 0x27, 3),
        Decoded::Table(PhysAddr(1 << 45))
    );
    // Bit 51 is the top address bit with MAXPHYADDR = 52.
    assert_eq!(
        F5::decode((1 << 51) | 0x27, 4),
        Decoded::Table(PhysAddr(1 << 51))
    );
    assert_eq!(X86Paging::<5, 46>::RESERVED_HIGH, 0x000f_c000_0000_0000);
}

#[test]
fn not_present_and_ignored_bits() {
    assert_eq!(F4::decode(0, 0), Decoded::None);
    // Not present: every other bit ignored, even "reserved" ones.
    let np = 0x0000_0000_0020_20e2u64;
    assert_eq!(F4::decode(np, 1), Decoded::Invalid);
    assert_eq!(F4::validate(np, 1), Ok(()));
    // Ignored bits 11:9 and 58:52 and the protection key do not change the
    // decoding (Table 4-20).
    let pte = 0x7ff0_0000_0000_1e01u64;
    assert_eq!(F4::decode(pte, 0), Decoded::Leaf(PhysAddr(0x1000)));
    assert_eq!(
        F4::decode(0x7ff0_0000_0000_1e27, 3),
        Decoded::Table(PhysAddr(0x1000))
    );
}

#[test]
fn pat_index_selects_memory_type_with_the_power_up_pat() {
    // PTE: PAT is bit 7, PDE/PDPTE: bit 12.
    let cases: [(u64, u32, u8, MemType); 8] = [
        (0x1001, 0, 0, MemType::Normal),
        (0x1009, 0, 1, MemType::Normal), // WT is cacheable
        (0x1011, 0, 2, MemType::NormalNonCacheable),
        (0x1019, 0, 3, MemType::Device),
        (0x1081, 0, 4, MemType::Normal),
        (0x1099, 0, 7, MemType::Device),
        (0x20_1081, 1, 4, MemType::Normal),
        (0x4000_1091, 2, 6, MemType::NormalNonCacheable),
    ];
    for (raw, h, idx, mem) in cases {
        assert_eq!(F4::pat_index(raw, h), idx, "{raw:#x}");
        assert_eq!(F4::leaf_prot(raw, h).mem(), mem, "{raw:#x}");
    }
}

#[test]
fn modify_prot_keeps_address_ad_pkey_software_bits_and_matching_memory_type() {
    let pde = 0x8000_0000_0020_00e3u64;
    // RW NX -> RO NX: only R/W goes.
    assert_eq!(
        F4::modify_prot(pde, Prot::READ_ONLY, 1),
        0x8000_0000_0020_00e1
    );
    // -> RO exec: XD goes too.
    assert_eq!(
        F4::modify_prot(pde, Prot::READ_EXEC, 1),
        0x0000_0000_0020_00e1
    );
    // -> user RW global.
    assert_eq!(
        F4::modify_prot(pde, Prot::USER | Prot::WRITE | Prot::GLOBAL, 1),
        XD | 0x20_01e7
    );
    // A user PTE without A/D stays without them.
    assert_eq!(F4::modify_prot(0x7005, user(Prot::WRITE), 0), XD | 0x7007);
    // Pkey and software bits survive.
    let pte = 0x7ff0_0000_0000_1e63u64;
    assert_eq!(
        F4::modify_prot(pte, Prot::READ_EXEC, 0),
        0x7ff0_0000_0000_1e61
    );
    // A WT leaf (PAT index 1) asked to stay Normal keeps PWT...
    let wt = 0x1000 | 0x6b; // P | R/W | PWT | A | D
    assert_eq!(F4::modify_prot(wt, Prot::READ_EXEC, 0), 0x1069);
    // ...but a change of memory type rewrites PAT/PCD/PWT.
    let dev = Prot::READ_WRITE.with_mem(MemType::Device);
    assert_eq!(F4::modify_prot(wt, dev, 0), XD | 0x107b);
    // PAT index 4 (bit 12 in a PDE) -> non-cacheable: PAT cleared, PCD set.
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    assert_eq!(
        F4::modify_prot(pde | bits::PAT_HUGE, nc, 1),
        pde | bits::PCD
    );
}

#[test]
fn split_moves_pat_from_bit_12_to_bit_7_and_clears_ps() {
    // 2 MiB, PAT index 6 (PAT | PCD), A | D | R/W | P.
    let pde = 0x0020_1000u64 | 0xf3;
    let pte = F4::split_leaf(pde, 1);
    assert_eq!(pte, 0x0020_00f3);
    assert_eq!(F4::pat_index(pte, 0), 6);
    assert_eq!(F4::pat_index(pde, 1), 6);
    assert_eq!(F4::leaf_prot(pte, 0), F4::leaf_prot(pde, 1));
    assert_eq!(F4::decode(pte, 0), Decoded::Leaf(PhysAddr(0x20_0000)));
    // Without PAT: PS just goes.
    assert_eq!(
        F5::split_leaf(0x8000_0000_0020_00e3, 1),
        0x8000_0000_0020_0063
    );
    // 1 GiB -> 2 MiB: same layout.
    let pdpte = 0x4000_11e3u64;
    assert_eq!(F4::split_leaf(pdpte, 2), pdpte);
    assert_eq!(F4::decode(pdpte, 1), Decoded::Leaf(PhysAddr(0x4000_0000)));
}

#[test]
fn hw_access_follows_sdm_access_rights_with_wp_and_nxe() {
    let kernel_rw = F4::leaf(PhysAddr(0x1000), Prot::READ_WRITE, 0);
    let kernel_ro = 0x1001u64; // P only: A clear so the update is visible
    let user_rx = 0x7005u64;
    let user_rw_nx = XD | 0x7007;
    let user_write = Access {
        write: true,
        exec: false,
        user: true,
    };
    let user_read = Access {
        write: false,
        exec: false,
        user: true,
    };
    let user_exec = Access {
        write: false,
        exec: true,
        user: true,
    };
    assert_eq!(
        F4::hw_access(kernel_rw, 0, user_read),
        Err(AccessFault::Privilege)
    );
    assert_eq!(
        F4::hw_access(user_rx, 0, user_write),
        Err(AccessFault::Write)
    );
    // CR0.WP = 1: supervisor writes to read-only pages fault too.
    assert_eq!(
        F4::hw_access(kernel_ro, 0, Access::WRITE),
        Err(AccessFault::Write)
    );
    assert_eq!(
        F4::hw_access(user_rw_nx, 0, user_exec),
        Err(AccessFault::Exec)
    );
    assert_eq!(
        F4::hw_access(user_rw_nx, 0, Access::EXEC),
        Err(AccessFault::Exec)
    );
    // A set on a read, A and D on a write (§4.8).
    assert_eq!(F4::hw_access(kernel_ro, 0, Access::READ), Ok(0x1021));
    assert_eq!(F4::hw_access(user_rw_nx, 0, user_write), Ok(XD | 0x7067));
    assert_eq!(F4::hw_access(user_rx, 0, user_exec), Ok(0x7025));
    // No SMAP/SMEP: the kernel may read, write and fetch user pages.
    assert_eq!(F4::hw_access(user_rx, 0, Access::EXEC), Ok(0x7025));
    assert_eq!(F4::hw_access(user_rw_nx, 0, Access::WRITE), Ok(XD | 0x7067));
    // Already accessed and dirty: nothing changes.
    assert_eq!(F4::hw_access(kernel_rw, 0, Access::WRITE), Ok(kernel_rw));
    // Huge leaves the same way.
    assert_eq!(
        F5::hw_access(0x4000_0081, 2, Access::WRITE),
        Err(AccessFault::Write)
    );
    assert_eq!(
        F5::hw_access(0x4000_0083, 2, Access::WRITE),
        Ok(0x4000_00e3)
    );
}

#[test]
fn settled_means_accessed_and_dirty_or_read_only() {
    assert!(F4::is_settled(0x1063, 0)); // RW, A, D
    assert!(F4::is_settled(0x1021, 0)); // RO, A
    assert!(!F4::is_settled(0x1023, 0)); // RW, A, not D
    assert!(!F4::is_settled(0x1001, 0)); // RO, not A
                                         // Kernel leaves are born settled, user leaves are not.
    for h in 0..3 {
        assert!(F4::is_settled(
            F4::leaf(PhysAddr(0), Prot::READ_WRITE, h),
            h
        ));
        assert!(F4::is_settled(F4::leaf(PhysAddr(0), Prot::READ_ONLY, h), h));
        assert!(!F4::is_settled(
            F4::leaf(PhysAddr(0), user(Prot::empty()), h),
            h
        ));
        assert!(!F4::is_young(F4::leaf(PhysAddr(0), user(Prot::WRITE), h)));
        assert!(!F4::is_dirty(F4::leaf(PhysAddr(0), user(Prot::WRITE), h)));
    }
}

#[test]
fn canonical_checks_for_48_and_57_bits() {
    let ok4 = [0, 0x0000_7fff_ffff_f000, 0xffff_8000_0000_0000, u64::MAX];
    let bad4 = [
        0x0000_8000_0000_0000,
        0xffff_7fff_ffff_ffff,
        0x00ff_0000_0000_0000,
    ];
    let ok5 = [
        0x00ff_ffff_ffff_f000,
        0xff00_0000_0000_0000,
        0x0000_8000_0000_0000,
    ];
    let bad5 = [
        0x0100_0000_0000_0000,
        0xfeff_ffff_ffff_ffff,
        0x8000_0000_0000_0000,
    ];
    assert_eq!(F4::VA_BITS, 48);
    assert_eq!(F5::VA_BITS, 57);
    for va in ok4 {
        assert!(VaRange::Both.contains::<F4>(va), "{va:#x}");
    }
    for va in bad4 {
        assert!(!VaRange::Both.contains::<F4>(va), "{va:#x}");
    }
    for va in ok5 {
        assert!(VaRange::Both.contains::<F5>(va), "{va:#x}");
    }
    for va in bad5 {
        assert!(!VaRange::Both.contains::<F5>(va), "{va:#x}");
    }
}

#[test]
fn format_constants() {
    assert_eq!(F4::LEVELS, 4);
    assert_eq!(F5::LEVELS, 5);
    assert_eq!(F4::PA_BITS, 52);
    assert_eq!(F4m46::PA_BITS, 46);
    assert_ne!(F4::NAME, F5::NAME);
    for h in 0..3 {
        assert!(F4::leaf_allowed(h));
    }
    assert!(!F4::leaf_allowed(3));
    assert!(!F5::leaf_allowed(4));
}

#[test]
fn entries_from_raw_bits_are_checked() {
    let pml4e = 0x5027 | bits::PS;
    assert_eq!(
        X86Entry::<4>::from_raw(pml4e, 3),
        Err(EntryError::ReservedBits(ReservedBits {
            raw: pml4e,
            height: 3,
            bits: bits::PS
        }))
    );
    assert_eq!(
        X86Entry::<4>::from_raw(0x5027, 4),
        Err(EntryError::BadHeight(4))
    );
    let e = X86Entry::<5>::from_raw(0x5027, 4).unwrap();
    assert_eq!(e.table_addr(), Some(PhysAddr(0x5000)));
    assert_eq!(e.level(), pgtable_core::contract::Level::Pgd);
    assert_eq!(e.leaf_addr(), None);
    let pte = X86Entry::<4, 46>::from_raw(0x8000_0000_1234_5063, 0).unwrap();
    assert_eq!(pte.leaf_addr(), Some(PhysAddr(0x1234_5000)));
    assert_eq!(pte.prot(), Some(Prot::READ_WRITE));
    assert_eq!(pte.pat_index(), Some(0));
    assert_eq!(pte.pkey(), Some(0));
    assert!(pte.is_accessed() && pte.is_dirty() && pte.is_present());
    assert!(matches!(
        X86Entry::<4, 46>::from_raw(0x0000_4000_0000_0003, 0),
        Err(EntryError::ReservedBits(ReservedBits { bits, .. })) if bits == 1 << 46
    ));
    // Not present: accepted whatever the other bits.
    let np = X86Entry::<4>::from_raw(0x0000_0000_0020_20e2, 1).unwrap();
    assert!(!np.is_present());
    assert_eq!(np.decoded(), Decoded::Invalid);
}

#[test]
fn checked_builders_reject_bad_addresses_and_heights() {
    let rw = Prot::READ_WRITE;
    assert_eq!(
        F4::try_leaf(PhysAddr(0x20_1000), rw, 1),
        Err(EntryError::MisalignedPhys(PhysAddr(0x20_1000)))
    );
    assert_eq!(
        F4::try_leaf(PhysAddr(1 << 52), rw, 0),
        Err(EntryError::PhysOutOfRange(PhysAddr(1 << 52)))
    );
    assert_eq!(
        F4m46::try_leaf(PhysAddr(1 << 46), rw, 0),
        Err(EntryError::PhysOutOfRange(PhysAddr(1 << 46)))
    );
    assert_eq!(
        F4::try_leaf(PhysAddr(0), rw, 3),
        Err(EntryError::LeafNotAllowed(3))
    );
    assert_eq!(
        F4::try_leaf(PhysAddr(0), rw, 4),
        Err(EntryError::BadHeight(4))
    );
    assert_eq!(
        F4::try_leaf(PhysAddr(0x4000_0000), rw, 2),
        Ok(F4::leaf(PhysAddr(0x4000_0000), rw, 2))
    );
    assert_eq!(
        F4::try_table_entry(PhysAddr(0x5000), 0),
        Err(EntryError::BadHeight(0))
    );
    assert_eq!(F5::try_table_entry(PhysAddr(0x5000), 4), Ok(0x5027));
    assert_eq!(
        F5::try_table_entry(PhysAddr(0x5800), 1),
        Err(EntryError::MisalignedPhys(PhysAddr(0x5800)))
    );
}

#[test]
fn protection_keys_live_in_bits_62_to_59_of_leaves() {
    let pte = 0x8000_0000_1234_5063u64;
    let keyed = F4::with_pkey(pte, 0, 5).unwrap();
    assert_eq!(keyed, pte | 5 << 59);
    assert_eq!(F4::pkey(keyed), 5);
    assert_eq!(F4::with_pkey(keyed, 0, 15).unwrap(), pte | 0xf << 59);
    assert_eq!(F4::decode(keyed, 0), F4::decode(pte, 0));
    assert_eq!(F4::leaf_prot(keyed, 0), F4::leaf_prot(pte, 0));
    assert_eq!(F4::with_pkey(pte, 0, 16), Err(EntryError::BadPkey(16)));
    assert_eq!(F4::with_pkey(0x5027, 1, 1), Err(EntryError::NotALeaf));
    assert_eq!(F4::with_pkey(0, 0, 1), Err(EntryError::NotALeaf));
    assert!(matches!(
        F4::with_pkey(0x20_20e3, 1, 1),
        Err(EntryError::ReservedBits(_))
    ));
}

#[test]
fn errors_display_their_context() {
    let e = ReservedBits {
        raw: 0x20_20e3,
        height: 1,
        bits: 0x2000,
    };
    let s = e.to_string();
    assert!(s.contains("0x2000") && s.contains("height 1"), "{s}");
    let s = EntryError::PhysOutOfRange(PhysAddr(1 << 52)).to_string();
    assert!(s.contains("0x10000000000000"), "{s}");
}
