//! TLBI operands, range splits and flush plans for 4, 16 and 64 KiB
//! pages and TCR_EL1.DS, against values worked out by hand from the Arm
//! ARM (C5.5 "TLBI VAE1IS", "TLBI RVAE1IS") and Linux's
//! `__flush_tlb_range_op`.

use pgtable_arm64::flush::{
    flush_plan, flush_plan_for, max_tlbi_ops_for, tlbi_range_base, tlbi_range_operand,
    tlbi_range_operand_for, tlbi_range_ops, tlbi_range_ops_for, tlbi_range_ttl, tlbi_ttl,
    tlbi_va_operand, tlbi_va_operand_for, FlushPlan, RangeOperand, TlbiOp, MAX_TLBI_OPS,
};
use pgtable_arm64::granule::Granule;
use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;

use Granule::{K16, K4, K64};

#[test]
fn tlbi_by_va_operands() {
    // 4 KiB, no hint: the 4 KiB operand, bit for bit.
    for va in [0, 0x1234_5000, 0x1234_5fff, 0x000f_ffff_ffff_f000, u64::MAX] {
        for asid in [0, 1, 0xff, 0xbeef, 0xffff] {
            assert_eq!(
                tlbi_va_operand_for(K4, va, asid, 0),
                tlbi_va_operand(va, asid)
            );
        }
    }
    // 0x1234_7000 >> 12 = 0x12347. 16 KiB clears bits [1:0] (VA[13:12])
    // -> 0x12344; 64 KiB bits [3:0] (VA[15:12]) -> 0x12340.
    assert_eq!(
        tlbi_va_operand_for(K16, 0x1234_7000, 5, 0),
        0x0005_0000_0001_2344
    );
    assert_eq!(
        tlbi_va_operand_for(K64, 0x1234_7000, 5, 0),
        0x0005_0000_0001_2340
    );
    // A 52-bit VA: 0x000f_ffff_ffff_0000 >> 12 = 0xff_ffff_fff0, in 44 bits.
    assert_eq!(
        tlbi_va_operand_for(K64, 0x000f_ffff_ffff_0000, 0, 0),
        0x0000_00ff_ffff_fff0
    );
    // TTL in bits [47:44]: 16 KiB level 3 = 0b10 << 2 | 3 = 0xb.
    assert_eq!(
        tlbi_va_operand_for(K16, 0x1234_4000, 0, tlbi_ttl(K16, 3, false)),
        0x0000_b000_0001_2344
    );
    // 4 KiB level 2 = 0b01 << 2 | 2 = 0x6.
    assert_eq!(
        tlbi_va_operand_for(K4, 0x4020_0000, 1, tlbi_ttl(K4, 2, false)),
        0x0001_6000_0004_0200
    );
}

#[test]
fn ttl_hints() {
    // "TLBI VAE1IS", TTL: TG << 2 | level, where defined.
    assert_eq!(tlbi_ttl(K4, 0, false), 0);
    assert_eq!(tlbi_ttl(K4, 0, true), 0b0100);
    assert_eq!(tlbi_ttl(K4, 1, false), 0b0101);
    assert_eq!(tlbi_ttl(K4, 2, false), 0b0110);
    assert_eq!(tlbi_ttl(K4, 3, false), 0b0111);
    assert_eq!(tlbi_ttl(K4, -1, true), 0);
    assert_eq!(tlbi_ttl(K4, 4, true), 0);
    assert_eq!(tlbi_ttl(K16, 0, true), 0);
    assert_eq!(tlbi_ttl(K16, 1, false), 0);
    assert_eq!(tlbi_ttl(K16, 1, true), 0b1001);
    assert_eq!(tlbi_ttl(K16, 2, false), 0b1010);
    assert_eq!(tlbi_ttl(K16, 3, false), 0b1011);
    assert_eq!(tlbi_ttl(K64, 0, true), 0);
    assert_eq!(tlbi_ttl(K64, 1, false), 0b1101);
    assert_eq!(tlbi_ttl(K64, 2, false), 0b1110);
    assert_eq!(tlbi_ttl(K64, 3, false), 0b1111);
    // "TLBI RVAE1IS", TTL[38:37]: 1..=3 = level, 16 KiB level 1 only with
    // FEAT_LPA2, level 0 never.
    for g in Granule::ALL {
        assert_eq!(tlbi_range_ttl(g, 0, true), 0);
        assert_eq!(tlbi_range_ttl(g, 2, false), 0b10);
        assert_eq!(tlbi_range_ttl(g, 3, false), 0b11);
        assert_eq!(tlbi_range_ttl(g, -1, true), 0);
    }
    assert_eq!(tlbi_range_ttl(K4, 1, false), 0b01);
    assert_eq!(tlbi_range_ttl(K64, 1, false), 0b01);
    assert_eq!(tlbi_range_ttl(K16, 1, false), 0);
    assert_eq!(tlbi_range_ttl(K16, 1, true), 0b01);
}

#[test]
fn tlbi_range_operands() {
    // 4 KiB, no DS, no hint: the 4 KiB operand, bit for bit.
    for base in [0, 1, 0x4_0000, (1 << 37) - 1, 1 << 37, u64::MAX] {
        for (scale, num) in [(0, 0), (1, 3), (3, 31), (4, 32)] {
            for asid in [0, 0xff, 0xffff] {
                assert_eq!(
                    tlbi_range_operand_for(K4, false, op(base, scale, num, asid, 0)),
                    tlbi_range_operand(base, scale, num, asid)
                );
            }
        }
    }
    // 16 KiB, page 0x48d1 (VA 0x1234_4000 >> 14), SCALE 1, NUM 3, ASID 7,
    // TTL 3: 7 << 48 | 0b10 << 46 (0x8000 << 32) | 1 << 44 (0x1000 << 32)
    // | 3 << 39 (0x180 << 32) | 3 << 37 (0x60 << 32) | 0x48d1.
    assert_eq!(
        tlbi_range_operand_for(K16, false, op(0x48d1, 1, 3, 7, 3)),
        0x0007_91e0_0000_48d1
    );
    // 64 KiB, TG 0b11 << 46 = 0xc000 << 32, page 0x1234.
    assert_eq!(
        tlbi_range_operand_for(K64, false, op(0x1234, 0, 0, 0, 0)),
        0x0000_c000_0000_1234
    );
    // DS = 1: BaseADDR = VA[52:16]. VA 0x1234_0000 is page 0x12340 (4K),
    // 0x48d0 (16K), 0x1234 (64K); all give 0x1234.
    assert_eq!(tlbi_range_base(K4, true, 0x12340), 0x1234);
    assert_eq!(tlbi_range_base(K16, true, 0x48d0), 0x1234);
    assert_eq!(tlbi_range_base(K64, true, 0x1234), 0x1234);
    assert_eq!(tlbi_range_base(K64, false, 0x1234), 0x1234);
    assert_eq!(tlbi_range_base(K4, false, 0x12340), 0x12340);
    assert_eq!(
        tlbi_range_operand_for(K4, true, op(0x12340, 0, 0, 0, 0)),
        0x0000_4000_0000_1234
    );
    // A 52-bit address with DS: VA 0x000f_ffff_fff0_0000 >> 16 =
    // 0xf_ffff_fff0 (36 bits), page 0xff_ffff_ff00 with 4 KiB.
    assert_eq!(tlbi_range_base(K4, true, 0xff_ffff_ff00), 0xf_ffff_fff0);
}

fn range(scale: u8, num: u8, base: u64) -> TlbiOp {
    TlbiOp::Range { scale, num, base }
}

fn page(page: u64) -> TlbiOp {
    TlbiOp::Page { page }
}

#[test]
fn range_split_without_ds_is_the_4k_split() {
    for g in Granule::ALL {
        for start in [0, 1, 3, 0x1000, 0x1_0003] {
            for pages in [0, 1, 2, 3, 63, 64, 65, 131, 2047, 70_001, 1 << 21, 1 << 22] {
                let a: Vec<_> = tlbi_range_ops_for(g, false, start, pages).collect();
                let b: Vec<_> = tlbi_range_ops(start, pages).collect();
                assert_eq!(a, b, "{g} {start} {pages}");
            }
        }
    }
    // 64 KiB has no DS: the split is the same with it.
    let a: Vec<_> = tlbi_range_ops_for(K64, true, 1, 3).collect();
    assert_eq!(a, [page(1), range(0, 0, 2)]);
}

#[test]
fn range_split_with_ds_starts_aligned() {
    let ops = |g, start, pages| tlbi_range_ops_for(g, true, start, pages).collect::<Vec<_>>();
    // 4 KiB: 64 KiB = 16 pages. From 0x10003, 20 pages: 13 single pages
    // (0x10003..=0x1000f), then 7 left at 0x10010: scale 0 takes
    // 7 >> 1 = 3 units (NUM 2, 6 pages), then the last page 0x10016.
    let mut want: Vec<_> = (0x10003..0x10010).map(page).collect();
    want.push(range(0, 2, 0x10010));
    want.push(page(0x10016));
    assert_eq!(ops(K4, 0x10003, 20), want);
    // Aligned, 131 pages = 2 x 64 + 3: scale 1 NUM 1 (128 pages), scale 0
    // NUM 0 (2 pages) at 0x10080, the last page 0x10082. Without DS the
    // odd page goes first and the scale 1 range starts at 0x10001.
    assert_eq!(
        ops(K4, 0x10000, 131),
        [range(1, 1, 0x10000), range(0, 0, 0x10080), page(0x10082)]
    );
    assert_eq!(
        tlbi_range_ops(0x10000, 131).collect::<Vec<_>>(),
        [page(0x10000), range(1, 1, 0x10001), range(0, 0, 0x10081)]
    );
    // 16 KiB: 64 KiB = 4 pages. From 0x4001, 8 pages: 3 single pages, then
    // 5 at 0x4004: scale 0 NUM 1 (4 pages), the last page 0x4008.
    assert_eq!(
        ops(K16, 0x4001, 8),
        [
            page(0x4001),
            page(0x4002),
            page(0x4003),
            range(0, 1, 0x4004),
            page(0x4008)
        ]
    );
    // One page is one single-page TLBI, aligned or not.
    assert_eq!(ops(K4, 0x10000, 1), [page(0x10000)]);
    assert_eq!(ops(K16, 0x4003, 1), [page(0x4003)]);
    assert!(ops(K4, 0x10000, 0).is_empty());
}

#[test]
fn range_split_with_ds_covers_exactly_and_every_range_is_aligned() {
    for (g, align) in [(K4, 16u64), (K16, 4)] {
        for start in [0u64, 1, 2, 5, 15, 16, 17, 0x1_0003, 0xffff] {
            for pages in [1u64, 2, 3, 15, 16, 17, 64, 65, 100, 2049, 65_537, 1 << 21] {
                let mut next = start;
                let mut n = 0;
                for op in tlbi_range_ops_for(g, true, start, pages) {
                    match op {
                        TlbiOp::Page { page } => assert_eq!(page, next),
                        TlbiOp::Range { base, .. } => {
                            assert_eq!(base, next);
                            assert_eq!(base % align, 0, "{g} {start} {pages}: {op:?}");
                        }
                    }
                    next += op.pages();
                    n += 1;
                }
                assert_eq!(next - start, pages, "{g} {start} {pages}");
                // At most align - 1 leading pages, four ranges, one last page.
                assert!(n < align + 5, "{g} {start} {pages}: {n} ops");
            }
        }
    }
}

fn r(start: u64, len: u64, shift: u32) -> TlbRange {
    TlbRange {
        start: VirtAddr(start),
        end: VirtAddr(start.wrapping_add(len)),
        stride_shift: shift,
        last_level: true,
    }
}

#[test]
fn flush_plans_per_granule() {
    // 4 KiB: flush_plan, bit for bit.
    for (start, len, shift) in [
        (0x4000_0000, 4 << 12, 12),
        (0x4010_0000, 1 << 21, 21),
        (0, 513 << 12, 12),
        (0, 0, 12),
        (0x1234, 0x10, 0),
        (0x4000_0000, 1 << 30, 21),
        (0, 1 << 34, 12),
    ] {
        for has_range in [false, true] {
            assert_eq!(
                flush_plan_for(K4, r(start, len, shift), has_range),
                flush_plan(r(start, len, shift), has_range)
            );
        }
    }
    // Ceilings: PTRS_PER_PTE.
    assert_eq!(max_tlbi_ops_for(K4), MAX_TLBI_OPS);
    assert_eq!(max_tlbi_ops_for(K16), 2048);
    assert_eq!(max_tlbi_ops_for(K64), 8192);
    // 16 KiB, a stride of 4 KiB is taken as 16 KiB: start 0x1_2345_6000
    // rounds down to 0x1_2345_4000; 0x1_0000 + 0x2000 rounds up to
    // 0x1_4000 = 5 pages; first page 0x1_2345_4000 >> 14 = 0x48d15.
    assert_eq!(
        flush_plan_for(K16, r(0x1_2345_6000, 0x1_0000, 12), true),
        FlushPlan::Range {
            start_page: 0x48d15,
            pages: 5,
            last_level: true
        }
    );
    assert_eq!(
        flush_plan_for(K16, r(0x1_2345_6000, 0x1_0000, 12), false),
        FlushPlan::PerStride {
            start: VirtAddr(0x1_2345_4000),
            stride_shift: 14,
            count: 5,
            last_level: true
        }
    );
    // 64 KiB: 8192 pages (512 MiB) per page is still per stride, 8193 not;
    // 4 KiB pages over the same 512 MiB would be far past 512.
    assert!(matches!(
        flush_plan_for(K64, r(0, 8192 << 16, 16), false),
        FlushPlan::PerStride { count: 8192, .. }
    ));
    assert_eq!(
        flush_plan_for(K64, r(0, 8193 << 16, 16), false),
        FlushPlan::All
    );
    assert_eq!(flush_plan(r(0, 8192 << 16, 12), false), FlushPlan::All);
    // 16 KiB: 2048 per-stride TLBIs, then a full flush.
    assert!(matches!(
        flush_plan_for(K16, r(0, 2048 << 14, 14), false),
        FlushPlan::PerStride { count: 2048, .. }
    ));
    assert_eq!(
        flush_plan_for(K16, r(0, 2049 << 14, 14), false),
        FlushPlan::All
    );
    // The range ceiling is in pages: 2^21 pages of 64 KiB = 128 GiB.
    assert!(matches!(
        flush_plan_for(K64, r(0, 1 << 37, 16), true),
        FlushPlan::Range {
            pages: 0x20_0000,
            ..
        }
    ));
    assert_eq!(
        flush_plan_for(K64, r(0, (1 << 37) + (1 << 16), 16), true),
        FlushPlan::All
    );
}

/// A [`RangeOperand`] from its fields in operand order.
fn op(base_page: u64, scale: u8, num: u8, asid: u16, ttl: u8) -> RangeOperand {
    RangeOperand {
        base_page,
        scale,
        num,
        asid,
        ttl,
    }
}
