//! The RISC-V flush plan (privileged spec, `SFENCE.VMA`; Svinval): per
//! stride up to the ceiling, by ASID or everything past it or when tables
//! changed, `x0` as the ASID operand where global mappings may be cached,
//! the Svinval batch; `satp` values and ASID widths.

use pgtable_core::contract::{Arch, TlbRange};
use pgtable_core::VirtAddr;
use pgtable_riscv::{
    flush_plan, full_flush_plan, satp_value, Asid, AsidTooWide, FlushCaps, FlushPlan, RiscvPaging,
    Sv39, Sv48, Sv57, TLB_FLUSH_CEILING,
};

fn range(start: u64, pages: u64, last_level: bool) -> TlbRange {
    TlbRange {
        start: VirtAddr(start),
        end: VirtAddr(start + pages * 0x1000),
        stride_shift: 12,
        last_level,
    }
}

fn tagged(asid: u16) -> FlushCaps {
    FlushCaps {
        asid: Some(Asid::new(asid, 16).unwrap()),
        svinval: false,
    }
}

#[test]
fn the_ceiling_is_linux_riscv_tlb_flush_all_threshold() {
    assert_eq!(TLB_FLUSH_CEILING, 64);
    assert_eq!(<Sv39 as Arch>::TLB_FLUSH_CEILING, 64);
}

#[test]
fn leaves_up_to_the_ceiling_are_flushed_per_stride_with_the_asid() {
    let caps = tagged(7);
    let p = flush_plan(range(0x4000_0000, 64, true), 64, caps, false);
    assert_eq!(
        p,
        FlushPlan::PerStride {
            start: VirtAddr(0x4000_0000),
            stride_shift: 12,
            count: 64,
            asid: caps.asid,
        }
    );
    assert!(!p.is_full());
    // One more page: the ASID's full flush.
    let p = flush_plan(range(0x4000_0000, 65, true), 64, caps, false);
    assert_eq!(p, FlushPlan::Asid(caps.asid.unwrap()));
    assert!(p.is_full() && !p.drops_all_globals());
}

#[test]
fn global_mappings_are_reached_with_x0() {
    let caps = tagged(7);
    // `SFENCE.VMA va, asid` skips global mappings: a range that may hold
    // them uses `x0` as the ASID.
    let p = flush_plan(range(0x4000_0000, 2, true), 64, caps, true);
    assert!(matches!(
        p,
        FlushPlan::PerStride {
            asid: None,
            count: 2,
            ..
        }
    ));
    // Past the ceiling, `SFENCE.VMA x0, x0`.
    let p = flush_plan(range(0x4000_0000, 100, true), 64, caps, true);
    assert_eq!(p, FlushPlan::All);
    assert!(p.drops_all_globals());
    // Untagged spaces flush everything (ASID 0 is shared).
    assert_eq!(
        flush_plan(range(0, 100, true), 64, FlushCaps::default(), false),
        FlushPlan::All
    );
    assert_eq!(full_flush_plan(None, false), FlushPlan::All);
}

#[test]
fn a_table_change_needs_a_fence_without_an_address() {
    // An address operand orders leaf PTEs only; freed or unlinked tables
    // need `rs1 = x0`.
    let caps = tagged(3);
    assert_eq!(
        flush_plan(range(0x4000_0000, 1, false), 64, caps, false),
        FlushPlan::Asid(caps.asid.unwrap())
    );
    assert_eq!(
        flush_plan(range(0x4000_0000, 1, false), 64, caps, true),
        FlushPlan::All
    );
}

#[test]
fn svinval_batches_the_same_strides() {
    let caps = FlushCaps {
        svinval: true,
        ..tagged(9)
    };
    let r = TlbRange {
        start: VirtAddr(0x4020_1000),
        end: VirtAddr(0x4080_0000),
        stride_shift: 21,
        last_level: true,
    };
    // Strides count from the start rounded down to a stride.
    assert_eq!(
        flush_plan(r, 64, caps, false),
        FlushPlan::Svinval {
            start: VirtAddr(0x4020_0000),
            stride_shift: 21,
            count: 3,
            asid: caps.asid,
        }
    );
    assert!(!flush_plan(r, 64, caps, false).is_full());
    assert_eq!(
        flush_plan(r, 2, caps, false),
        FlushPlan::Asid(caps.asid.unwrap())
    );
}

#[test]
fn the_whole_space_is_a_full_flush() {
    let r = TlbRange {
        start: VirtAddr(0),
        end: VirtAddr(0),
        stride_shift: 12,
        last_level: true,
    };
    assert_eq!(
        flush_plan(r, u64::MAX, tagged(1), false),
        FlushPlan::Asid(Asid::new(1, 16).unwrap())
    );
}

#[test]
fn asids_must_fit_asidlen() {
    assert_eq!(Asid::new(0xff, 8).map(Asid::get), Ok(0xff));
    assert_eq!(
        Asid::new(0x100, 8),
        Err(AsidTooWide {
            asid: 0x100,
            asid_bits: 8
        })
    );
    assert_eq!(
        Asid::new(1, 0),
        Err(AsidTooWide {
            asid: 1,
            asid_bits: 0
        })
    );
    assert_eq!(Asid::new(0, 0), Ok(Asid::ZERO));
    assert_eq!(Asid::new(0xffff, 16).map(Asid::get), Ok(0xffff));
}

#[test]
fn satp_holds_mode_asid_and_root_ppn() {
    assert_eq!(Sv39::SATP_MODE, 8);
    assert_eq!(Sv48::SATP_MODE, 9);
    assert_eq!(Sv57::SATP_MODE, 10);
    assert_eq!(RiscvPaging::<4, 1>::SATP_MODE, 9);
    let asid = Asid::new(0xabcd, 16).unwrap();
    assert_eq!(
        satp_value(Sv48::SATP_MODE, asid, 0x8123_4000),
        9 << 60 | 0xabcd << 44 | 0x81234
    );
    assert_eq!(
        satp_value(Sv39::SATP_MODE, Asid::ZERO, 0x00ff_ffff_ffff_f000),
        8 << 60 | 0xfff_ffff_ffff
    );
}
