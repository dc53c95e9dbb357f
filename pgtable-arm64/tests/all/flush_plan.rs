//! TLB maintenance encodings and register values against worked examples.

use pgtable_arm64::flush::{
    flush_plan, range_pages, tlbi_asid_operand, tlbi_range_operand, tlbi_va_operand, FlushPlan,
};
use pgtable_arm64::regs::{tcr_value, ttbr1_base, TcrConfig, PARANGE_48};
use pgtable_arm64::{tlbi_range_ops, TlbiOp, MAX_TLBI_OPS, MAX_TLBI_RANGE_PAGES};
use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;

fn ops(start: u64, pages: u64) -> Vec<TlbiOp> {
    tlbi_range_ops(start, pages).collect()
}

fn range(scale: u8, num: u8, base: u64) -> TlbiOp {
    TlbiOp::Range { scale, num, base }
}

#[test]
fn single_page_is_one_page_tlbi() {
    assert_eq!(ops(0x100, 1), vec![TlbiOp::Page { page: 0x100 }]);
    assert!(ops(0x100, 0).is_empty());
}

#[test]
fn odd_page_count_starts_with_a_single_page_tlbi() {
    // 3 pages: one page, then (0 + 1) << 1 = 2 pages at scale 0.
    assert_eq!(
        ops(0x1000, 3),
        vec![TlbiOp::Page { page: 0x1000 }, range(0, 0, 0x1001)]
    );
    // 65 pages: one page, then 64 = (0 + 1) << 6 at scale 1.
    assert_eq!(ops(7, 65), vec![TlbiOp::Page { page: 7 }, range(1, 0, 8)]);
}

#[test]
fn each_scale_covers_its_unit() {
    // Units: scale 0 = 2 pages, 1 = 64, 2 = 2048, 3 = 65536.
    assert_eq!(ops(0, 2), vec![range(0, 0, 0)]);
    assert_eq!(ops(0, 62), vec![range(0, 30, 0)]);
    assert_eq!(ops(0, 64), vec![range(1, 0, 0)]);
    assert_eq!(ops(0, 2048), vec![range(2, 0, 0)]);
    assert_eq!(ops(0, 65536), vec![range(3, 0, 0)]);
    assert_eq!(ops(0, 3 * 65536), vec![range(3, 2, 0)]);
    // 1 GiB of 4 KiB pages: 262144 = 4 * 65536.
    assert_eq!(ops(0x40000, 262_144), vec![range(3, 3, 0x40000)]);
}

#[test]
fn mixed_count_uses_every_scale_once_from_the_largest() {
    // 65536 + 3 * 2048 + 5 * 64 + 7 * 2 + 1 pages.
    let n = 65536 + 3 * 2048 + 5 * 64 + 7 * 2 + 1;
    let b = 0x10;
    assert_eq!(
        ops(b, n),
        vec![
            TlbiOp::Page { page: b },
            range(3, 0, b + 1),
            range(2, 2, b + 1 + 65536),
            range(1, 4, b + 1 + 65536 + 3 * 2048),
            range(0, 6, b + 1 + 65536 + 3 * 2048 + 5 * 64),
        ]
    );
}

#[test]
fn page_limit_is_one_maximal_range_and_larger_counts_flush_all() {
    assert_eq!(MAX_TLBI_RANGE_PAGES, 2_097_152);
    assert_eq!(range_pages(31, 3), MAX_TLBI_RANGE_PAGES);
    assert_eq!(ops(0, MAX_TLBI_RANGE_PAGES), vec![range(3, 31, 0)]);
    // One page short: an odd count, then 2^21 - 2 = 31 units of every
    // scale (31 * (65536 + 2048 + 64 + 2)).
    let v = ops(0, MAX_TLBI_RANGE_PAGES - 1);
    assert_eq!(
        v,
        vec![
            TlbiOp::Page { page: 0 },
            range(3, 30, 1),
            range(2, 30, 1 + 31 * 65536),
            range(1, 30, 1 + 31 * 65536 + 31 * 2048),
            range(0, 30, 1 + 31 * 65536 + 31 * 2048 + 31 * 64),
        ]
    );
    let bytes = (MAX_TLBI_RANGE_PAGES + 1) << 12;
    let r = TlbRange {
        start: VirtAddr(0),
        end: VirtAddr(bytes),
        stride_shift: 12,
        last_level: true,
    };
    assert_eq!(flush_plan(r, true), FlushPlan::All);
}

#[test]
fn range_ops_tile_every_count_exactly() {
    let counts = (1..=4200u64).chain([
        65535,
        65537,
        131_071,
        262_143,
        1_000_001,
        MAX_TLBI_RANGE_PAGES - 2,
    ]);
    for n in counts {
        let start = 0x123_4567;
        let mut next = start;
        let mut last_scale = 4u8;
        let v = ops(start, n);
        assert!(v.len() <= 5, "{n}: {v:?}");
        for (i, op) in v.iter().enumerate() {
            match *op {
                TlbiOp::Page { page } => {
                    assert_eq!(i, 0, "{n}: a page op only first");
                    assert_eq!(page, next);
                }
                TlbiOp::Range { scale, num, base } => {
                    assert!(scale < last_scale, "{n}: scales strictly decrease");
                    assert!(num <= 31);
                    assert_eq!(base, next, "{n}: contiguous");
                    last_scale = scale;
                }
            }
            next += op.pages();
        }
        assert_eq!(next - start, n, "{n}: covers exactly");
    }
}

#[test]
fn operands_place_fields_as_the_arm_arm_says() {
    // ASID 5 [63:48], TG 0b01 [47:46], SCALE 2 [45:44], NUM 7 [43:39],
    // TTL 0, BaseADDR 0x12345 [36:0].
    assert_eq!(tlbi_range_operand(0x12345, 2, 7, 5), 0x0005_6380_0001_2345);
    // BaseADDR keeps VA[48:12]: a high-half address keeps bits 48 and 47
    // (page-number bits 36 and 35).
    let hi = 0xffff_8000_0020_0000u64 >> 12;
    assert_eq!(tlbi_range_operand(hi, 0, 0, 0), 0x0000_4018_0000_0200);
    // VA[55:12] in [43:0], ASID in [63:48].
    assert_eq!(
        tlbi_va_operand(0xffff_8000_0020_1000, 3),
        0x0003_0ff8_0000_0201
    );
    assert_eq!(tlbi_va_operand(0x4020_1000, 0), 0x4_0201);
    assert_eq!(tlbi_asid_operand(0x42), 0x0042_0000_0000_0000);
}

#[test]
fn flush_plan_per_stride_without_range_tlbi_up_to_512_ops() {
    let r = |start: u64, len: u64, shift: u32| TlbRange {
        start: VirtAddr(start),
        end: VirtAddr(start + len),
        stride_shift: shift,
        last_level: true,
    };
    assert_eq!(
        flush_plan(r(0x4000_0000, 4 << 12, 12), false),
        FlushPlan::PerStride {
            start: VirtAddr(0x4000_0000),
            count: 4,
            stride_shift: 12,
            last_level: true
        }
    );
    // Three 2 MiB blocks: three TLBIs, 2 MiB apart.
    assert_eq!(
        flush_plan(r(0x4000_0000, 3 << 21, 21), false),
        FlushPlan::PerStride {
            start: VirtAddr(0x4000_0000),
            count: 3,
            stride_shift: 21,
            last_level: true
        }
    );
    // A start inside a block: the TLBIs start at the block holding it and
    // reach the block holding the last byte (1 MiB into one block, 2 MiB
    // long: two blocks).
    assert_eq!(
        flush_plan(r(0x4010_0000, 1 << 21, 21), false),
        FlushPlan::PerStride {
            start: VirtAddr(0x4000_0000),
            count: 2,
            stride_shift: 21,
            last_level: true
        }
    );
    // The range form covers the same two whole blocks.
    assert_eq!(
        flush_plan(r(0x4010_0000, 1 << 21, 21), true),
        FlushPlan::Range {
            start_page: 0x4_0000,
            pages: 1024,
            last_level: true
        }
    );
    assert!(matches!(
        flush_plan(r(0, MAX_TLBI_OPS << 12, 12), false),
        FlushPlan::PerStride { count: 512, .. }
    ));
    assert_eq!(
        flush_plan(r(0, (MAX_TLBI_OPS + 1) << 12, 12), false),
        FlushPlan::All
    );
    // With FEAT_TLBIRANGE the same range is a range flush in pages.
    assert_eq!(
        flush_plan(r(0x4000_0000, 1 << 30, 21), true),
        FlushPlan::Range {
            start_page: 0x40000,
            pages: 262_144,
            last_level: true
        }
    );
    // A range that wraps to the top of the space is everything.
    let top = TlbRange {
        start: VirtAddr(0),
        end: VirtAddr(0),
        stride_shift: 12,
        last_level: false,
    };
    assert_eq!(flush_plan(top, true), FlushPlan::All);
}

#[test]
fn tcr_values_match_hand_assembled_fields() {
    // T0SZ = T1SZ = 17, IRGNx/ORGNx = 01, SHx = 11, TG0 = 00, TG1 = 10,
    // IPS = 101, HA, HD.
    assert_eq!(tcr_value(TcrConfig::DEFAULT_48), 0x0000_0185_b511_3511);
    // 39-bit: T0SZ = T1SZ = 26, EPD1, IPS = 010 (40 bits), no HA/HD.
    let cfg = TcrConfig {
        va_bits: 39,
        ttbr1: false,
        pa_range: 0b010,
        hw_access_flag: false,
        hw_dirty: false,
        asid16: false,
    };
    assert_eq!(tcr_value(cfg), 0x0000_0002_b59a_351a);
    // PARange above 48 bits is capped; HD without HA is not set.
    let big = TcrConfig {
        pa_range: 0b110,
        hw_access_flag: false,
        ..TcrConfig::DEFAULT_48
    };
    let v = tcr_value(big);
    assert_eq!((v >> 32) & 0b111, PARANGE_48);
    assert_eq!((v >> 39) & 0b11, 0);
    assert_eq!(ttbr1_base(0x4008_0000), 0x4008_0800);
}

#[test]
fn asids_that_do_not_fit_are_errors_and_ttbr0_carries_the_asid() {
    use pgtable_arm64::{ttbr0_value, Asid, AsidBits, AsidTooWide};
    // ID_AA64MMFR0_EL1.ASIDBits, bits [7:4]: 0b0010 = 16 bits.
    assert_eq!(
        AsidBits::from_mmfr0(0x0000_0000_0000_0025),
        AsidBits::Bits16
    );
    assert_eq!(AsidBits::from_mmfr0(0x0000_0000_0000_0005), AsidBits::Bits8);
    assert_eq!(AsidBits::from_mmfr0(0x20), AsidBits::Bits16);
    assert_eq!(AsidBits::Bits16.bits(), 16);
    // 8-bit CPUs: 255 fits, 256 does not (the hardware would alias it to 0).
    assert_eq!(Asid::new(255, AsidBits::Bits8).unwrap().get(), 255);
    assert_eq!(
        Asid::new(256, AsidBits::Bits8),
        Err(AsidTooWide { asid: 256 })
    );
    let wide = Asid::new(0xbeef, AsidBits::Bits16).unwrap();
    assert_eq!(
        ttbr0_value(0x4008_0000, wide),
        0xbeef_0000_4008_0000,
        "ASID in TTBR0_EL1[63:48], BADDR below"
    );
    assert_eq!(
        ttbr0_value(0x4008_0000, Asid::from_u8(7)),
        0x0007_0000_4008_0000
    );
    // The TLBI operands carry all 16 bits.
    assert_eq!(tlbi_asid_operand(wide.get()), 0xbeef_0000_0000_0000);
    assert_eq!(tlbi_va_operand(0x1234_5000, wide.get()) >> 48, 0xbeef);
    // TCR_EL1.AS (bit 36) selects 16-bit ASIDs.
    let as16 = TcrConfig {
        asid16: true,
        ..TcrConfig::DEFAULT_48
    };
    assert_eq!(tcr_value(as16), tcr_value(TcrConfig::DEFAULT_48) | 1 << 36);
}
