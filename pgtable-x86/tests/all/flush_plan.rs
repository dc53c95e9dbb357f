//! The range-flush policy: which instructions a `TlbRange` becomes.

use pgtable_core::contract::TlbRange;
use pgtable_core::VirtAddr;
use pgtable_x86::flush::strides;
use pgtable_x86::{flush_plan, full_flush_plan, FlushPlan};

fn range(start: u64, pages: u64, stride_shift: u32) -> TlbRange {
    TlbRange {
        start: VirtAddr(start),
        end: VirtAddr(start.wrapping_add(pages << stride_shift)),
        stride_shift,
        last_level: true,
    }
}

#[test]
fn up_to_the_ceiling_every_page_gets_an_invlpg() {
    for pages in [1, 2, 32, 33] {
        assert_eq!(
            flush_plan(range(0x40_0000, pages, 12), 33, true, false),
            FlushPlan::PerStride {
                start: VirtAddr(0x40_0000),
                stride_shift: 12,
                count: pages
            },
            "{pages} pages"
        );
    }
}

#[test]
fn past_the_ceiling_one_full_flush() {
    let r = range(0x40_0000, 34, 12);
    assert_eq!(flush_plan(r, 33, false, false), FlushPlan::ReloadCr3);
    assert_eq!(
        flush_plan(r, 33, true, false),
        FlushPlan::InvpcidSingleContext
    );
    // A bigger ceiling keeps the INVLPGs.
    assert!(matches!(
        flush_plan(r, 64, true, false),
        FlushPlan::PerStride { count: 34, .. }
    ));
    // Ceiling 0: always a full flush.
    assert_eq!(
        flush_plan(range(0, 1, 12), 0, false, false),
        FlushPlan::ReloadCr3
    );
}

#[test]
fn global_mappings_need_a_flush_that_drops_globals_past_the_ceiling() {
    let r = range(0xffff_8000_0000_0000, 100, 12);
    let with = flush_plan(r, 33, true, true);
    let without = flush_plan(r, 33, false, true);
    assert_eq!(with, FlushPlan::InvpcidAllContexts);
    assert_eq!(without, FlushPlan::ToggleCr4Pge);
    assert!(with.drops_all_globals() && without.drops_all_globals());
    assert!(!FlushPlan::ReloadCr3.drops_all_globals());
    assert!(!FlushPlan::InvpcidSingleContext.drops_all_globals());
    // Below the ceiling INVLPG drops global entries of its page anyway.
    let small = flush_plan(range(0xffff_8000_0000_0000, 3, 12), 33, false, true);
    assert_eq!(
        small,
        FlushPlan::PerStride {
            start: VirtAddr(0xffff_8000_0000_0000),
            stride_shift: 12,
            count: 3
        }
    );
    assert!(!small.is_full());
}

#[test]
fn huge_pages_are_counted_by_their_stride() {
    // 64 MiB of 2 MiB pages = 32 INVLPGs; 68 MiB = 34 -> full.
    assert_eq!(
        flush_plan(range(0x4000_0000, 32, 21), 33, false, false),
        FlushPlan::PerStride {
            start: VirtAddr(0x4000_0000),
            stride_shift: 21,
            count: 32
        }
    );
    assert_eq!(
        flush_plan(range(0x4000_0000, 34, 21), 33, false, false),
        FlushPlan::ReloadCr3
    );
    // 1 GiB pages.
    assert!(matches!(
        flush_plan(range(0, 4, 30), 33, false, false),
        FlushPlan::PerStride {
            count: 4,
            stride_shift: 30,
            ..
        }
    ));
}

#[test]
fn unaligned_starts_and_the_top_of_the_space_are_covered() {
    // A start inside a page still flushes that page and the one the end
    // reaches into.
    let r = TlbRange {
        start: VirtAddr(0x1800),
        end: VirtAddr(0x2800),
        stride_shift: 12,
        last_level: false,
    };
    assert_eq!(strides(r), Some(2));
    assert_eq!(
        flush_plan(r, 33, false, false),
        FlushPlan::PerStride {
            start: VirtAddr(0x1000),
            stride_shift: 12,
            count: 2
        }
    );
    // The last page of the 64-bit space (end wraps to 0).
    let top = range(0xffff_ffff_ffff_f000, 1, 12);
    assert_eq!(top.end, VirtAddr(0));
    assert_eq!(strides(top), Some(1));
    // start == end: the whole space, always a full flush.
    let all = TlbRange {
        start: VirtAddr(0),
        end: VirtAddr(0),
        stride_shift: 12,
        last_level: false,
    };
    assert_eq!(strides(all), None);
    assert_eq!(
        flush_plan(all, u64::MAX, true, true),
        FlushPlan::InvpcidAllContexts
    );
}

#[test]
fn full_flush_choice_depends_on_invpcid_and_globals() {
    assert_eq!(full_flush_plan(false, false), FlushPlan::ReloadCr3);
    assert_eq!(
        full_flush_plan(true, false),
        FlushPlan::InvpcidSingleContext
    );
    assert_eq!(full_flush_plan(true, true), FlushPlan::InvpcidAllContexts);
    assert_eq!(full_flush_plan(false, true), FlushPlan::ToggleCr4Pge);
    assert!(full_flush_plan(false, false).is_full());
}

mod pcid {
    use super::range;
    use pgtable_core::VirtAddr;
    use pgtable_x86::regs::{
        invpcid_descriptor, CR3_ADDR_MASK, CR3_NOFLUSH, CR3_PCID_MASK, INVPCID_ADDRESS,
        INVPCID_ALL_INCLUDING_GLOBAL, INVPCID_ALL_NON_GLOBAL, INVPCID_SINGLE_CONTEXT,
    };
    use pgtable_x86::{
        cr3_value, flush_plan, full_flush_plan, kernel_flush_plan, pcid_flush_plan, FlushKind,
        FlushPlan, OtherPcid, Pcid, PcidCpu, PcidFlush, PcidTooWide,
    };

    fn p(v: u16) -> Pcid {
        Pcid::new(v).unwrap()
    }

    #[test]
    fn pcids_that_do_not_fit_12_bits_are_errors() {
        assert_eq!(p(4095).get(), 4095);
        assert_eq!(Pcid::new(4096), Err(PcidTooWide { pcid: 4096 }));
        assert_eq!(
            cr3_value(0x12_3000, p(7), false),
            0x8000_0000_0012_3007,
            "root, PCID in bits 11:0, bit 63 keeps the PCID's entries"
        );
        assert_eq!(cr3_value(0x12_3000, p(7), true), 0x12_3007);
        assert_eq!(cr3_value(0x12_3000, p(7), true) & CR3_NOFLUSH, 0);
    }

    #[test]
    fn cr3_keeps_the_root_frame_and_the_pcid_in_their_fields_only() {
        // Low bits of the root and bits past MAXPHYADDR 52 never reach CR3.
        let v = cr3_value(0xfff0_0000_0012_3fff, p(0xabc), true);
        assert_eq!(v & CR3_ADDR_MASK, 0x12_3000);
        assert_eq!(v & CR3_PCID_MASK, 0xabc);
        assert_eq!(v & !(CR3_ADDR_MASK | CR3_PCID_MASK), 0);
        assert_eq!(CR3_ADDR_MASK & (CR3_PCID_MASK | CR3_NOFLUSH), 0);
    }

    #[test]
    fn invpcid_descriptors_carry_the_pcid_then_the_address() {
        // SDM Vol. 2A INVPCID: PCID in bits 11:0 of the first quadword,
        // the linear address in the second; types 0 to 3.
        assert_eq!(
            invpcid_descriptor(p(4095), 0xffff_8000_0000_1000),
            [0xfff, 0xffff_8000_0000_1000]
        );
        assert_eq!(
            [
                INVPCID_ADDRESS,
                INVPCID_SINGLE_CONTEXT,
                INVPCID_ALL_INCLUDING_GLOBAL,
                INVPCID_ALL_NON_GLOBAL
            ],
            [0, 1, 2, 3]
        );
    }

    #[test]
    fn the_current_or_an_untagged_space_flushes_as_without_pcids() {
        let r = range(0x40_0000, 3, 12);
        for (space, inv) in [(None, false), (Some(p(5)), true), (Some(p(5)), false)] {
            let cur = if space.is_some() { p(5) } else { p(9) };
            let plan = pcid_flush_plan(FlushKind::Range(r), space, cur, 33, inv);
            assert_eq!(plan.local, Some(flush_plan(r, 33, inv, true)));
            assert_eq!(plan.other, None);
            let mm = pcid_flush_plan(FlushKind::Mm, space, cur, 33, inv);
            assert_eq!(mm.local, Some(full_flush_plan(inv, false)));
            assert_eq!(mm.other, None);
        }
    }

    #[test]
    fn a_space_that_is_not_current_is_flushed_by_invpcid_or_deferred() {
        let (space, cur) = (Some(p(5)), p(6));
        // Its whole PCID.
        assert_eq!(
            pcid_flush_plan(FlushKind::Mm, space, cur, 33, true),
            PcidFlush {
                local: None,
                other: Some(OtherPcid::InvpcidSingleContext(p(5)))
            }
        );
        assert_eq!(
            pcid_flush_plan(FlushKind::Mm, space, cur, 33, false),
            PcidFlush {
                local: None,
                other: Some(OtherPcid::Defer(p(5)))
            }
        );
        // A range: INVLPG for the range's global entries, then its PCID.
        let r = range(0x40_0000, 3, 12);
        let invlpg = FlushPlan::PerStride {
            start: VirtAddr(0x40_0000),
            stride_shift: 12,
            count: 3,
        };
        assert_eq!(
            pcid_flush_plan(FlushKind::Range(r), space, cur, 33, true),
            PcidFlush {
                local: Some(invlpg),
                other: Some(OtherPcid::InvpcidAddress {
                    pcid: p(5),
                    start: VirtAddr(0x40_0000),
                    stride_shift: 12,
                    count: 3
                })
            }
        );
        assert_eq!(
            pcid_flush_plan(FlushKind::Range(r), space, cur, 33, false),
            PcidFlush {
                local: Some(invlpg),
                other: Some(OtherPcid::Defer(p(5)))
            }
        );
        // Past the ceiling, and `All`: one flush of every PCID.
        let big = range(0x40_0000, 100, 12);
        for kind in [FlushKind::Range(big), FlushKind::All] {
            for inv in [false, true] {
                let plan = pcid_flush_plan(kind, space, cur, 33, inv);
                assert_eq!(plan.other, None);
                assert!(plan.local.unwrap().drops_all_globals(), "{plan:?}");
            }
        }
    }

    #[test]
    fn the_kernel_half_is_flushed_for_every_pcid() {
        let r = range(0x40_0000, 3, 12);
        let invlpg = FlushPlan::PerStride {
            start: VirtAddr(0x40_0000),
            stride_shift: 12,
            count: 3,
        };
        // Without PCIDs: as an untagged space.
        for kind in [FlushKind::Range(r), FlushKind::Mm, FlushKind::All] {
            for inv in [false, true] {
                assert_eq!(
                    kernel_flush_plan(kind, 33, inv, false),
                    pcid_flush_plan(kind, None, p(0), 33, inv)
                );
            }
        }
        // With PCIDs and INVPCID: INVLPG for the range's global entries,
        // then every PCID's non-global and paging-structure-cache entries.
        assert_eq!(
            kernel_flush_plan(FlushKind::Range(r), 33, true, true),
            PcidFlush {
                local: Some(invlpg),
                other: Some(OtherPcid::AllNonGlobal)
            }
        );
        assert_eq!(
            kernel_flush_plan(FlushKind::Mm, 33, true, true),
            PcidFlush {
                local: None,
                other: Some(OtherPcid::AllNonGlobal)
            }
        );
        // Without INVPCID, past the ceiling, and `All`: everything.
        let big = range(0x40_0000, 100, 12);
        for (kind, inv) in [
            (FlushKind::Range(r), false),
            (FlushKind::Mm, false),
            (FlushKind::Range(big), true),
            (FlushKind::All, true),
        ] {
            let plan = kernel_flush_plan(kind, 33, inv, true);
            assert_eq!(plan.other, None, "{kind:?}");
            assert!(plan.local.unwrap().drops_all_globals(), "{plan:?}");
        }
    }

    #[test]
    fn a_stale_pcid_is_flushed_once_at_its_next_switch() {
        let cpu = PcidCpu::new();
        assert!(!cpu.take_stale(p(4095)));
        cpu.mark_stale(p(4095));
        cpu.mark_stale(p(64));
        assert!(cpu.is_stale(p(4095)) && cpu.is_stale(p(64)) && !cpu.is_stale(p(65)));
        assert!(cpu.take_stale(p(4095)));
        assert!(!cpu.take_stale(p(4095)), "the switch flushed it");
        assert!(cpu.is_stale(p(64)));
        cpu.clear();
        assert!(!cpu.is_stale(p(64)));
    }
}
