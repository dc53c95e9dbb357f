//! TCR_EL1 and TTBR0_EL1 for every granule and 52-bit addresses, against
//! values assembled by hand from the Arm ARM (D24.2 "TCR_EL1",
//! "TTBR0_EL1").

use pgtable_arm64::granule::{GeometryError, Granule};
use pgtable_arm64::regs::{
    tcr_tg0_granule, tcr_tg1_granule, tcr_value, tcr_value_for, tcr_value_for_separate_halves,
    tcr_value_separate_halves, TcrConfig, TcrGeometry, PARANGE_48, PARANGE_52, TCR_DS,
};

use Granule::{K16, K4, K64};

fn configs() -> Vec<TcrConfig> {
    let mut v = Vec::new();
    for va_bits in [39, 48] {
        for ttbr1 in [false, true] {
            for pa_range in 0..8 {
                for (ha, hd) in [(false, false), (true, false), (true, true), (false, true)] {
                    for asid16 in [false, true] {
                        v.push(TcrConfig {
                            va_bits,
                            ttbr1,
                            pa_range,
                            hw_access_flag: ha,
                            hw_dirty: hd,
                            asid16,
                        });
                    }
                }
            }
        }
    }
    v
}

#[test]
fn tcr_for_4k_is_tcr_value_bit_for_bit() {
    for cfg in configs() {
        let geo = TcrGeometry::k4(cfg);
        assert_eq!(geo, TcrGeometry::from(cfg));
        assert_eq!(tcr_value_for(geo), Ok(tcr_value(cfg)), "{cfg:?}");
        assert_eq!(
            tcr_value_for_separate_halves(geo),
            Ok(tcr_value_separate_halves(cfg)),
            "{cfg:?}"
        );
    }
    // The hand-assembled DEFAULT_48 value (see flush_plan.rs) once more.
    assert_eq!(
        tcr_value_for(TcrGeometry::k4(TcrConfig::DEFAULT_48)),
        Ok(0x0000_0185_b511_3511)
    );
}

#[test]
fn tcr_for_16k_and_64k_and_lpa2() {
    // 16 KiB, 47 bits, separate halves: T0SZ = T1SZ = 64 - 47 = 17 =
    // 0x11; IRGN0 0x100 | ORGN0 0x400 | SH0 0x3000 | TG0 0b10 << 14 =
    // 0x8000 -> low half 0xb511; T1SZ 0x11 << 16, IRGN1 / ORGN1 / SH1
    // 0x3500 << 16, TG1 0b01 << 30 = 0x4000 << 16 -> 0x7511 << 16;
    // IPS 0b101 << 32, HA 1 << 39, HD 1 << 40 -> 0x185 << 32.
    let k16_47 = TcrGeometry {
        cfg: TcrConfig {
            va_bits: 47,
            ..TcrConfig::DEFAULT_48
        },
        granule: K16,
        ds: false,
    };
    assert_eq!(
        tcr_value_for_separate_halves(k16_47),
        Ok(0x0000_0185_7511_b511)
    );
    // 16 KiB, 48 bits, one root for both halves: 65 - 48 = 17 as well.
    let k16_48 = TcrGeometry {
        cfg: TcrConfig::DEFAULT_48,
        granule: K16,
        ds: false,
    };
    assert_eq!(tcr_value_for(k16_48), Ok(0x0000_0185_7511_b511));
    // 64 KiB, 52 bits (FEAT_LVA, no DS), 52-bit IPS: TnSZ = 12 = 0xc;
    // TG0 0b01 << 14 = 0x4000 -> 0x750c; TG1 0b11 << 30 -> 0xf50c << 16;
    // IPS 0b110 -> 0x186 << 32.
    let k64_52 = TcrGeometry {
        cfg: TcrConfig {
            va_bits: 52,
            pa_range: 0b110,
            ..TcrConfig::DEFAULT_48
        },
        granule: K64,
        ds: false,
    };
    assert_eq!(
        tcr_value_for_separate_halves(k64_52),
        Ok(0x0000_0186_f50c_750c)
    );
    // 4 KiB, 52 bits with DS: TnSZ 12, TG0 0, TG1 0b10 -> 0xb50c_350c;
    // IPS 0b110, HA, HD -> 0x186; DS bit 59 -> 0x0800_0000 << 32.
    let k4_52 = TcrGeometry {
        cfg: TcrConfig {
            va_bits: 52,
            pa_range: 0b110,
            ..TcrConfig::DEFAULT_48
        },
        granule: K4,
        ds: true,
    };
    assert_eq!(
        tcr_value_for_separate_halves(k4_52),
        Ok(0x0800_0186_b50c_350c)
    );
    assert_eq!(
        tcr_value_for_separate_halves(k4_52).unwrap() & TCR_DS,
        TCR_DS
    );
    // IPS: 52 bits only with DS (4K/16K) or 64 KiB; capped at 48 otherwise;
    // 0b111 (56 bits) is capped at 52.
    let ips = |geo: TcrGeometry| (tcr_value_for(geo).unwrap() >> 32) & 0b111;
    let wide = |granule, ds, va_bits, pa_range| TcrGeometry {
        cfg: TcrConfig {
            va_bits,
            pa_range,
            ..TcrConfig::DEFAULT_48
        },
        granule,
        ds,
    };
    assert_eq!(ips(wide(K16, false, 48, 0b110)), PARANGE_48);
    assert_eq!(ips(wide(K16, true, 48, 0b110)), PARANGE_52);
    assert_eq!(ips(wide(K64, false, 48, 0b111)), PARANGE_52);
    assert_eq!(ips(wide(K4, false, 48, 0b111)), PARANGE_48);
    assert_eq!(ips(wide(K64, false, 42, 0b010)), 0b010);
    // The granule fields decode back.
    for g in Granule::ALL {
        for va in g.va_bits_choices() {
            let v = tcr_value_for(wide(g, *va == 52 && g.has_ds(), *va, 5)).unwrap();
            assert_eq!(tcr_tg0_granule(v), Some(g));
            assert_eq!(tcr_tg1_granule(v), Some(g));
            assert_eq!(v & TCR_DS != 0, *va == 52 && g.has_ds());
        }
    }
    assert_eq!(tcr_tg0_granule(0b11 << 14), None);
    assert_eq!(tcr_tg1_granule(0), None);
}

#[test]
fn tcr_rejects_inconsistent_geometries() {
    let geo = |granule, ds, va_bits| TcrGeometry {
        cfg: TcrConfig {
            va_bits,
            ..TcrConfig::DEFAULT_48
        },
        granule,
        ds,
    };
    // DS is RES0 with 64 KiB.
    assert_eq!(
        tcr_value_for(geo(K64, true, 48)),
        Err(GeometryError::DsWith64K)
    );
    // 52-bit VA with 4 or 16 KiB needs DS.
    assert_eq!(
        tcr_value_for_separate_halves(geo(K16, false, 52)),
        Err(GeometryError::NeedsDs {
            granule: K16,
            va_bits: 52,
            pa_bits: 48
        })
    );
    assert!(matches!(
        tcr_value_for(geo(K4, false, 52)),
        Err(GeometryError::NeedsDs { granule: K4, .. })
    ));
    // Sizes that are not geometries of the granule.
    assert_eq!(
        tcr_value_for(geo(K4, false, 47)),
        Err(GeometryError::VaBits {
            granule: K4,
            va_bits: 47
        })
    );
    assert_eq!(
        tcr_value_for(geo(K64, false, 39)),
        Err(GeometryError::VaBits {
            granule: K64,
            va_bits: 39
        })
    );
    assert!(GeometryError::DsWith64K.to_string().contains("RES0"));
    assert!(GeometryError::NeedsDs {
        granule: K16,
        va_bits: 52,
        pa_bits: 48
    }
    .to_string()
    .contains("TCR_EL1.DS = 1"));
}

#[test]
fn ttbr_with_52_bit_roots() {
    use pgtable_arm64::regs::{ttbr0_value, ttbr0_value_52, ttbr_root_52, BadRoot};
    use pgtable_arm64::Asid;
    // Root 0x000f_0000_4008_0000: bits [47:6] stay, bits [51:48] = 0xf go
    // to register bits [5:2] (0xf << 2 = 0x3c), ASID 1 in [63:48].
    let root = 0x000f_0000_4008_0000;
    let v = ttbr0_value_52(root, Asid::from_u8(1)).unwrap();
    assert_eq!(v, 0x0001_0000_4008_003c);
    assert_eq!(ttbr_root_52(v), root);
    // Below 2^48 it is the 48-bit value.
    assert_eq!(
        ttbr0_value_52(0x4008_0040, Asid::from_u8(7)),
        Ok(ttbr0_value(0x4008_0040, Asid::from_u8(7)))
    );
    // 64-byte alignment and 52 bits at most.
    assert_eq!(
        ttbr0_value_52(0x4008_0020, Asid::from_u8(0)),
        Err(BadRoot { root: 0x4008_0020 })
    );
    assert_eq!(
        ttbr0_value_52(1 << 52, Asid::from_u8(0)),
        Err(BadRoot { root: 1 << 52 })
    );
    assert!(BadRoot { root: 0x20 }.to_string().contains("0x20"));
}
