//! Granules, geometries and the CPU feature checks for 4, 16 and 64 KiB
//! pages, against values worked out by hand from the Arm ARM (D8.2.8 to
//! D8.2.10, D8.7.1, D24.2) and Linux's definitions.

use pgtable_arm64::granule::{
    check_geometry, needs_ds, pa_bits_of_range, pa_range_of_bits, Geometry, GeometryError,
    GeometryUnsupported, Granule, GranuleSupport, MmuFeatures,
};

use Granule::{K16, K4, K64};

#[test]
fn page_sizes_and_table_sizes() {
    // 4 KiB = 2^12, 16 KiB = 2^14, 64 KiB = 2^16; a table is one page of
    // 8-byte entries, so 2^(shift - 3) entries.
    assert_eq!(
        (K4.page_shift(), K16.page_shift(), K64.page_shift()),
        (12, 14, 16)
    );
    assert_eq!(
        (K4.page_size(), K16.page_size(), K64.page_size()),
        (4096, 16384, 65536)
    );
    assert_eq!(
        (
            K4.bits_per_level(),
            K16.bits_per_level(),
            K64.bits_per_level()
        ),
        (9, 11, 13)
    );
    assert_eq!(
        (
            K4.entries_per_table(),
            K16.entries_per_table(),
            K64.entries_per_table()
        ),
        (512, 2048, 8192)
    );
    assert_eq!(Granule::ALL, [K4, K16, K64]);
    assert_eq!(K16.to_string(), "16 KiB granule");
}

#[test]
fn levels_of_every_linux_geometry() {
    // (va_bits - 4) / (page_shift - 3), worked out:
    // 4K: 35/9 = 3, 44/9 = 4, 48/9 = 5; 16K: 32/11 = 2, 43/11 = 3,
    // 44/11 = 4, 48/11 = 4; 64K: 38/13 = 2, 44/13 = 3, 48/13 = 3.
    // Root entries: 2^(va_bits - (9|11|13) * levels - 3).
    let table: [(Granule, u32, u32, i8, u64); 10] = [
        (K4, 39, 3, 1, 512),   // 39 - 30 = 9 bits
        (K4, 48, 4, 0, 512),   // 48 - 39 = 9
        (K4, 52, 5, -1, 16),   // 52 - 48 = 4
        (K16, 36, 2, 2, 2048), // 36 - 25 = 11
        (K16, 47, 3, 1, 2048), // 47 - 36 = 11
        (K16, 48, 4, 0, 2),    // 48 - 47 = 1
        (K16, 52, 4, 0, 32),   // 52 - 47 = 5
        (K64, 42, 2, 2, 8192), // 42 - 29 = 13
        (K64, 48, 3, 1, 64),   // 48 - 42 = 6
        (K64, 52, 3, 1, 1024), // 52 - 42 = 10
    ];
    for (g, va, levels, start, root) in table {
        let geo = Geometry::new(g, va).unwrap();
        assert_eq!(geo.granule(), g);
        assert_eq!(geo.va_bits(), va);
        assert_eq!(geo.levels(), levels, "{g} {va}");
        assert_eq!(g.levels(va), levels);
        assert_eq!(geo.start_level(), start, "{g} {va}");
        assert_eq!(geo.root_entries(), root, "{g} {va}");
        assert_eq!(geo.is_52bit(), va == 52);
    }
    // Every choice is in the table, and only those.
    let n: usize = Granule::ALL.iter().map(|g| g.va_bits_choices().len()).sum();
    assert_eq!(n, table.len());
    assert_eq!(K4.levels(12), 0);
}

#[test]
fn other_va_sizes_are_not_geometries() {
    for (g, va) in [
        (K4, 36),
        (K4, 42),
        (K4, 47),
        (K16, 39),
        (K16, 42),
        (K64, 36),
        (K64, 39),
        (K64, 47),
        (K4, 0),
        (K64, 64),
    ] {
        assert_eq!(
            Geometry::new(g, va),
            Err(GeometryError::VaBits {
                granule: g,
                va_bits: va
            }),
            "{g} {va}"
        );
    }
    let msg = GeometryError::VaBits {
        granule: K64,
        va_bits: 47,
    }
    .to_string();
    assert!(msg.contains("47-bit") && msg.contains("64 KiB") && msg.contains("[42, 48, 52]"));
}

#[test]
fn level_shifts() {
    // (page_shift - 3) * (4 - level) + 3.
    assert_eq!(K4.level_shift(3), Some(12));
    assert_eq!(K4.level_shift(2), Some(21));
    assert_eq!(K4.level_shift(1), Some(30));
    assert_eq!(K4.level_shift(0), Some(39));
    assert_eq!(K4.level_shift(-1), Some(48));
    assert_eq!(K16.level_shift(3), Some(14));
    assert_eq!(K16.level_shift(2), Some(25));
    assert_eq!(K16.level_shift(1), Some(36));
    assert_eq!(K16.level_shift(0), Some(47));
    assert_eq!(K64.level_shift(3), Some(16));
    assert_eq!(K64.level_shift(2), Some(29));
    assert_eq!(K64.level_shift(1), Some(42));
    assert_eq!(K4.level_shift(4), None);
    assert_eq!(K4.level_shift(-2), None);
}

#[test]
fn block_sizes_per_granule_and_level() {
    // Arm ARM Tables D8-17 / D8-27 / D8-36.
    // 4 KiB: L1 1 GiB (2^30), L2 2 MiB (2^21); L0 512 GiB (2^39) only
    // with DS = 1.
    assert_eq!(K4.block_shift(1, false), Some(30));
    assert_eq!(K4.block_shift(2, false), Some(21));
    assert_eq!(K4.block_shift(0, false), None);
    assert_eq!(K4.block_shift(0, true), Some(39));
    assert_eq!(K4.block_shift(-1, true), None);
    // 16 KiB: L2 32 MiB (2^25); L1 64 GiB (2^36) only with DS = 1.
    assert_eq!(K16.block_shift(2, false), Some(25));
    assert_eq!(K16.block_shift(1, false), None);
    assert_eq!(K16.block_shift(1, true), Some(36));
    assert_eq!(K16.block_shift(0, true), None);
    // 64 KiB: L2 512 MiB (2^29); L1 4 TiB (2^42) only with FEAT_LPA.
    assert_eq!(K64.block_shift(2, false), Some(29));
    assert_eq!(K64.block_shift(1, false), None);
    assert_eq!(K64.block_shift(1, true), Some(42));
    // Level 3 holds pages, never blocks.
    for g in Granule::ALL {
        assert_eq!(g.block_shift(3, true), None);
        assert_eq!(g.block_shift(3, false), None);
    }
}

#[test]
fn contiguous_runs() {
    // Arm ARM Table D8-104.
    assert_eq!(K4.contiguous_entries(1), Some(16));
    assert_eq!(K4.contiguous_entries(2), Some(16));
    assert_eq!(K4.contiguous_entries(3), Some(16));
    assert_eq!(K4.contiguous_entries(0), None);
    assert_eq!(K16.contiguous_entries(1), None);
    assert_eq!(K16.contiguous_entries(2), Some(32));
    assert_eq!(K16.contiguous_entries(3), Some(128));
    assert_eq!(K64.contiguous_entries(1), None);
    assert_eq!(K64.contiguous_entries(2), Some(32));
    assert_eq!(K64.contiguous_entries(3), Some(32));
    // Linux CONT_PTES / CONT_PMDS (2^CONT_PTE_SHIFT, 2^CONT_PMD_SHIFT).
    assert_eq!((K4.cont_ptes(), K4.cont_pmds()), (16, 16));
    assert_eq!((K16.cont_ptes(), K16.cont_pmds()), (128, 32));
    assert_eq!((K64.cont_ptes(), K64.cont_pmds()), (32, 32));
    // The region sizes: 4K 16 x 4 KiB = 64 KiB, 16 x 2 MiB = 32 MiB;
    // 16K 128 x 16 KiB = 2 MiB, 32 x 32 MiB = 1 GiB; 64K 32 x 64 KiB =
    // 2 MiB, 32 x 512 MiB = 16 GiB.
    let size = |g: Granule, level: i8| {
        g.contiguous_entries(level).unwrap() << g.level_shift(level).unwrap()
    };
    assert_eq!(size(K4, 3), 64 << 10);
    assert_eq!(size(K4, 2), 32 << 20);
    assert_eq!(size(K16, 3), 2 << 20);
    assert_eq!(size(K16, 2), 1 << 30);
    assert_eq!(size(K64, 3), 2 << 20);
    assert_eq!(size(K64, 2), 16 << 30);
    for g in Granule::ALL {
        assert_eq!(g.contiguous_entries(3), Some(g.cont_ptes()));
        assert_eq!(g.contiguous_entries(2), Some(g.cont_pmds()));
    }
}

#[test]
fn granule_encodings() {
    // TCR_EL1.TG0: 4K 0b00, 64K 0b01, 16K 0b10. TG1: 16K 0b01, 4K 0b10,
    // 64K 0b11. TLBI TG: 4K 0b01, 16K 0b10, 64K 0b11.
    assert_eq!((K4.tcr_tg0(), K16.tcr_tg0(), K64.tcr_tg0()), (0, 2, 1));
    assert_eq!((K4.tcr_tg1(), K16.tcr_tg1(), K64.tcr_tg1()), (2, 1, 3));
    assert_eq!((K4.tlbi_tg(), K16.tlbi_tg(), K64.tlbi_tg()), (1, 2, 3));
    assert!(K4.has_ds() && K16.has_ds() && !K64.has_ds());
}

// ID_AA64MMFR0_EL1 values assembled by hand: TGran4 [31:28],
// TGran64 [27:24], TGran16 [23:20], ASIDBits [7:4], PARange [3:0].
/// 4K and 64K (0b0000), 16K (0b0001), 16-bit ASIDs, 48-bit PA (0b0101).
const MMFR0_V8: u64 = 0x0000_0000_0010_0025;
/// 16K only (TGran4 = TGran64 = 0b1111, TGran16 = 0b0001), 36-bit PA.
const MMFR0_16K_ONLY: u64 = 0x0000_0000_ff10_0001;
/// FEAT_LPA2: TGran4 = 0b0001, TGran16 = 0b0010, 64K 0b0000, 52-bit PA.
const MMFR0_LPA2: u64 = 0x0000_0000_1020_0026;
/// No 16K (TGran16 = 0b0000), 4K and 64K, 52-bit PA (FEAT_LPA).
const MMFR0_NO16K_PA52: u64 = 0x0000_0000_0000_0006;
/// ID_AA64MMFR2_EL1.VARange [19:16] = 0b0001 (FEAT_LVA).
const MMFR2_LVA: u64 = 0x0000_0000_0001_0000;

#[test]
fn id_register_fields() {
    let f = MmuFeatures::from_id_regs(MMFR0_LPA2, MMFR2_LVA);
    assert_eq!(
        f,
        MmuFeatures {
            tgran4: 1,
            tgran16: 2,
            tgran64: 0,
            pa_range: 6,
            va_range: 1
        }
    );
    assert_eq!(f.granule(K4), GranuleSupport::Lpa2);
    assert_eq!(f.granule(K16), GranuleSupport::Lpa2);
    assert_eq!(f.granule(K64), GranuleSupport::Supported);
    assert_eq!(f.pa_bits(), Some(52));
    assert!(f.has_lva());
    let m1 = MmuFeatures::from_id_regs(MMFR0_16K_ONLY, 0);
    assert_eq!(m1.granule(K4), GranuleSupport::None);
    assert_eq!(m1.granule(K16), GranuleSupport::Supported);
    assert_eq!(m1.granule(K64), GranuleSupport::None);
    assert_eq!(m1.pa_bits(), Some(36));
    assert!(!m1.has_lva());
    let v8 = MmuFeatures::from_id_regs(MMFR0_V8, 0);
    assert_eq!(v8.granule(K4), GranuleSupport::Supported);
    assert_eq!(v8.granule(K16), GranuleSupport::Supported);
    assert_eq!(v8.granule(K64), GranuleSupport::Supported);
    assert_eq!(
        MmuFeatures::from_id_regs(MMFR0_NO16K_PA52, 0).granule(K16),
        GranuleSupport::None
    );
    // Reserved values, read as Linux does: TGran4 / TGran64 signed
    // (0b0010..=0b0111 above "supported", 0b1000.. negative), TGran16
    // unsigned (0b0011.. above LPA2).
    let raw = |tgran4: u8, tgran16: u8, tgran64: u8| MmuFeatures {
        tgran4,
        tgran16,
        tgran64,
        pa_range: 5,
        va_range: 0,
    };
    assert_eq!(raw(0b0010, 1, 0).granule(K4), GranuleSupport::Lpa2);
    assert_eq!(raw(0b1000, 1, 0).granule(K4), GranuleSupport::None);
    assert_eq!(raw(0, 0b0011, 0).granule(K16), GranuleSupport::Lpa2);
    assert_eq!(raw(0, 1, 0b0111).granule(K64), GranuleSupport::Supported);
    assert_eq!(raw(0, 1, 0b1000).granule(K64), GranuleSupport::None);
    // PARange encodings.
    let bits: Vec<_> = (0..9).map(pa_bits_of_range).collect();
    assert_eq!(
        bits,
        [
            Some(32),
            Some(36),
            Some(40),
            Some(42),
            Some(44),
            Some(48),
            Some(52),
            Some(56),
            None
        ]
    );
    for (enc, b) in [
        (0, 32),
        (1, 36),
        (2, 40),
        (3, 42),
        (4, 44),
        (5, 48),
        (6, 52),
    ] {
        assert_eq!(pa_range_of_bits(b), Ok(enc));
    }
    assert_eq!(
        pa_range_of_bits(56),
        Err(GeometryError::PaBits { pa_bits: 56 })
    );
    assert_eq!(
        pa_range_of_bits(47),
        Err(GeometryError::PaBits { pa_bits: 47 })
    );
}

#[test]
fn geometries_a_cpu_can_run() {
    assert_eq!(check_geometry(K4, 48, 48, MMFR0_V8, 0), Ok(()));
    assert_eq!(check_geometry(K4, 39, 40, MMFR0_V8, 0), Ok(()));
    assert_eq!(check_geometry(K16, 47, 48, MMFR0_V8, 0), Ok(()));
    assert_eq!(check_geometry(K16, 36, 36, MMFR0_16K_ONLY, 0), Ok(()));
    assert_eq!(check_geometry(K64, 42, 48, MMFR0_V8, 0), Ok(()));
    assert_eq!(check_geometry(K64, 48, 52, MMFR0_NO16K_PA52, 0), Ok(()));
    assert_eq!(check_geometry(K64, 52, 52, MMFR0_LPA2, MMFR2_LVA), Ok(()));
    assert_eq!(check_geometry(K4, 52, 52, MMFR0_LPA2, 0), Ok(()));
    assert_eq!(check_geometry(K16, 52, 48, MMFR0_LPA2, 0), Ok(()));
    assert_eq!(check_geometry(K16, 48, 52, MMFR0_LPA2, 0), Ok(()));
}

#[test]
fn what_a_cpu_lacks() {
    // Invalid pairs and sizes, whatever the CPU.
    assert_eq!(
        check_geometry(K64, 47, 48, MMFR0_LPA2, MMFR2_LVA),
        Err(GeometryUnsupported::Invalid(GeometryError::VaBits {
            granule: K64,
            va_bits: 47
        }))
    );
    assert_eq!(
        check_geometry(K4, 48, 50, MMFR0_LPA2, 0),
        Err(GeometryUnsupported::Invalid(GeometryError::PaBits {
            pa_bits: 50
        }))
    );
    // Granules the CPU lacks: TGran4 = 0b1111, TGran64 = 0b1111,
    // TGran16 = 0b0000.
    assert_eq!(
        check_geometry(K4, 48, 36, MMFR0_16K_ONLY, 0),
        Err(GeometryUnsupported::NoGranule {
            granule: K4,
            field: 0b1111
        })
    );
    assert_eq!(
        check_geometry(K64, 48, 36, MMFR0_16K_ONLY, 0),
        Err(GeometryUnsupported::NoGranule {
            granule: K64,
            field: 0b1111
        })
    );
    assert_eq!(
        check_geometry(K16, 47, 48, MMFR0_NO16K_PA52, 0),
        Err(GeometryUnsupported::NoGranule {
            granule: K16,
            field: 0
        })
    );
    // 52-bit VA or PA with 4 / 16 KiB without FEAT_LPA2.
    assert_eq!(
        check_geometry(K4, 52, 48, MMFR0_V8, 0),
        Err(GeometryUnsupported::NoLpa2 {
            granule: K4,
            field: 0,
            va_bits: 52,
            pa_bits: 48
        })
    );
    assert_eq!(
        check_geometry(K4, 48, 52, MMFR0_NO16K_PA52, 0),
        Err(GeometryUnsupported::NoLpa2 {
            granule: K4,
            field: 0,
            va_bits: 48,
            pa_bits: 52
        })
    );
    assert_eq!(
        check_geometry(K16, 52, 48, MMFR0_V8, 0),
        Err(GeometryUnsupported::NoLpa2 {
            granule: K16,
            field: 1,
            va_bits: 52,
            pa_bits: 48
        })
    );
    // 52-bit VA with 64 KiB without FEAT_LVA (VARange 0), even with
    // FEAT_LPA2 for the other granules.
    assert_eq!(
        check_geometry(K64, 52, 48, MMFR0_LPA2, 0),
        Err(GeometryUnsupported::NoLva { va_range: 0 })
    );
    // PA wider than PARange: 40 bits on a 36-bit CPU; 52 bits (FEAT_LPA)
    // on a 48-bit one with 64 KiB; 52 on an LPA2 CPU of 48 bits.
    assert_eq!(
        check_geometry(K16, 47, 40, MMFR0_16K_ONLY, 0),
        Err(GeometryUnsupported::PaRange {
            pa_bits: 40,
            pa_range: 1
        })
    );
    assert_eq!(
        check_geometry(K64, 48, 52, MMFR0_V8, 0),
        Err(GeometryUnsupported::PaRange {
            pa_bits: 52,
            pa_range: 5
        })
    );
    let lpa2_pa48 = (MMFR0_LPA2 & !0xf) | 0b0101;
    assert_eq!(
        check_geometry(K4, 52, 52, lpa2_pa48, 0),
        Err(GeometryUnsupported::PaRange {
            pa_bits: 52,
            pa_range: 5
        })
    );
    // A reserved PARange is no range at all.
    assert_eq!(
        check_geometry(K4, 48, 32, (MMFR0_V8 & !0xf) | 0b1000, 0),
        Err(GeometryUnsupported::PaRange {
            pa_bits: 32,
            pa_range: 0b1000
        })
    );
}

#[test]
fn unsupported_geometries_say_what_is_missing() {
    let s = |e: GeometryUnsupported| e.to_string();
    assert_eq!(
        s(GeometryUnsupported::NoGranule {
            granule: K4,
            field: 0b1111
        }),
        "the CPU does not implement the 4 KiB granule (ID_AA64MMFR0_EL1.TGran4 = 0b1111)"
    );
    assert_eq!(
        s(GeometryUnsupported::NoLpa2 {
            granule: K16,
            field: 1,
            va_bits: 52,
            pa_bits: 48
        }),
        "52-bit VA / 48-bit PA with the 16 KiB granule needs FEAT_LPA2 \
         (ID_AA64MMFR0_EL1.TGran16 = 0b0010); the CPU reports 0b0001"
    );
    assert_eq!(
        s(GeometryUnsupported::NoLva { va_range: 0 }),
        "52-bit virtual addresses with the 64 KiB granule need FEAT_LVA \
         (ID_AA64MMFR2_EL1.VARange = 0b0001); the CPU reports 0b0000"
    );
    assert_eq!(
        s(GeometryUnsupported::PaRange {
            pa_bits: 52,
            pa_range: 5
        }),
        "52-bit physical addresses need ID_AA64MMFR0_EL1.PARange for 52 bits; \
         the CPU reports 0b0101 (48 bits)"
    );
    assert!(s(GeometryUnsupported::PaRange {
        pa_bits: 32,
        pa_range: 9
    })
    .ends_with("(reserved)"));
    assert_eq!(
        s(GeometryError::PaBits { pa_bits: 50 }.into()),
        GeometryError::PaBits { pa_bits: 50 }.to_string()
    );
}

#[test]
fn when_ds_is_needed() {
    let g = |granule, va| Geometry::new(granule, va).unwrap();
    assert!(!needs_ds(g(K4, 48), 48));
    assert!(needs_ds(g(K4, 52), 48));
    assert!(needs_ds(g(K4, 48), 52));
    assert!(needs_ds(g(K16, 47), 52));
    assert!(!needs_ds(g(K16, 47), 48));
    assert!(!needs_ds(g(K64, 52), 52));
}
