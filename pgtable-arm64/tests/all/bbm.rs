//! Break-before-make: which live changes are safe in place, and the exact
//! sequence `set_live_entry` issues for each kind.

use crate::common::{Event, Recorder};
use pgtable_arm64::bits::{
    self, AF, AP_EL0, AP_RDONLY, CONT, DBM, NG, PXN, PXN_TABLE, SH_OUTER, UXN,
};
use pgtable_arm64::{bbm_reason, pgattr_change_is_safe, set_live_entry, Arm64, LiveEntry};
use pgtable_core::contract::{Arch, BbmReason, Format, Slot, TlbRange};
use pgtable_core::{Error, LiveOptions, MemType, PhysAddr, Prot, VirtAddr};

const VA: VirtAddr = VirtAddr(0x4020_3000);

fn page(pa: u64, prot: Prot) -> u64 {
    Arm64::leaf(PhysAddr(pa), prot, 0)
}

#[test]
fn permission_af_and_dirty_changes_are_safe_in_place() {
    let rw = page(0x8000, Prot::READ_WRITE);
    let cases = [
        ("read-only", rw | AP_RDONLY),
        ("DBM cleared", (rw & !DBM) | AP_RDONLY),
        ("PXN cleared", rw & !PXN),
        ("UXN cleared", rw & !UXN),
        ("EL0 access", rw | AP_EL0),
        ("AF cleared", rw & !AF),
        ("software dirty", rw | bits::SW_DIRTY),
        ("global to non-global", (rw & !NG) | NG),
    ];
    for (what, new) in cases {
        assert!(pgattr_change_is_safe(rw, new, 0), "{what}");
        assert!(Arm64::change_is_safe(rw, new, 0), "{what} via Arch");
    }
    // Creating and removing are safe.
    assert!(pgattr_change_is_safe(0, rw, 0));
    assert!(pgattr_change_is_safe(rw, 0, 0));
}

#[test]
fn address_type_size_and_global_changes_need_break_before_make() {
    let g = Arm64::leaf(PhysAddr(0x8000), Prot::WRITE | Prot::GLOBAL, 0);
    let ng = page(0x8000, Prot::READ_WRITE);
    assert_eq!(ng, g | NG);
    let cases = [
        ("output address", g + 0x1000),
        (
            "memory type",
            Arm64::leaf(
                PhysAddr(0x8000),
                Prot::WRITE | Prot::GLOBAL.with_mem(MemType::Device),
                0,
            ),
        ),
        ("shareability", (g & !bits::SH_MASK) | SH_OUTER),
        ("contiguous hint", g | CONT),
    ];
    for (what, new) in cases {
        assert!(!pgattr_change_is_safe(g, new, 0), "{what}");
    }
    assert!(!pgattr_change_is_safe(ng, g, 0), "non-global to global");
    // Block to table and back at L2.
    let block = Arm64::leaf(PhysAddr(0x4020_0000), Prot::READ_WRITE, 1);
    let table = Arm64::table_entry(PhysAddr(0x9000), 1);
    assert!(!pgattr_change_is_safe(block, table, 1));
    assert!(!pgattr_change_is_safe(table, block, 1));
    // A table may change its hierarchical permissions, not its address.
    assert!(pgattr_change_is_safe(table, table | PXN_TABLE, 1));
    assert!(!pgattr_change_is_safe(
        table,
        Arm64::table_entry(PhysAddr(0xa000), 1),
        1
    ));
}

#[test]
fn safe_change_writes_in_place_then_flushes_the_old_translation() {
    let mmu = Recorder::default();
    let old = page(0x8000, Prot::READ_WRITE);
    let new = page(0x8000, Prot::READ_ONLY);
    let slot = Slot::new(old);
    set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 0,
        },
        new,
        LiveOptions::IN_PLACE,
    )
    .unwrap();
    assert_eq!(slot.into_inner(), new);
    assert_eq!(
        mmu.take(),
        vec![
            Event::Write { old, new },
            Event::Barrier,
            Event::Flush(TlbRange {
                start: VirtAddr(0x4020_3000),
                end: VirtAddr(0x4020_4000),
                stride_shift: 12,
                last_level: true
            }),
        ]
    );
}

#[test]
fn creating_an_entry_needs_no_flush() {
    let mmu = Recorder::default();
    let new = page(0x8000, Prot::READ_WRITE);
    let slot = Slot::new(0);
    set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 0,
        },
        new,
        LiveOptions::IN_PLACE,
    )
    .unwrap();
    assert_eq!(
        mmu.take(),
        vec![Event::Write { old: 0, new }, Event::Barrier]
    );
}

#[test]
fn unsafe_change_without_permission_is_refused_and_leaves_the_entry() {
    let mmu = Recorder::default();
    let old = page(0x8000, Prot::READ_WRITE);
    let slot = Slot::new(old);
    let r = set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 0,
        },
        page(0x9000, Prot::READ_WRITE),
        LiveOptions::IN_PLACE,
    );
    assert_eq!(r, Err(Error::BreakBeforeMake(VA, BbmReason::OutputAddress)));
    assert_eq!(slot.into_inner(), old);
    assert!(mmu.take().is_empty(), "nothing issued");
}

#[test]
fn unsafe_change_breaks_flushes_then_makes() {
    let mmu = Recorder::default();
    let old = page(0x8000, Prot::READ_WRITE);
    let new = page(0x9000, Prot::READ_WRITE);
    let slot = Slot::new(old);
    set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 0,
        },
        new,
        LiveOptions::ALLOW_BBM,
    )
    .unwrap();
    assert_eq!(slot.into_inner(), new);
    assert_eq!(
        mmu.take(),
        vec![
            Event::Write { old, new: 0 },
            Event::Barrier,
            Event::Flush(TlbRange {
                start: VirtAddr(0x4020_3000),
                end: VirtAddr(0x4020_4000),
                stride_shift: 12,
                last_level: true
            }),
            Event::Write { old: 0, new },
            Event::Barrier,
        ]
    );
}

#[test]
fn block_to_table_break_flushes_the_whole_block_and_table_removal_its_walks() {
    let mmu = Recorder::default();
    let block = Arm64::leaf(PhysAddr(0x4020_0000), Prot::READ_WRITE, 1);
    let table = Arm64::table_entry(PhysAddr(0x7000), 1);
    let slot = Slot::new(block);
    set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 1,
        },
        table,
        LiveOptions::ALLOW_BBM,
    )
    .unwrap();
    let log = mmu.take();
    assert_eq!(
        log[2],
        Event::Flush(TlbRange {
            start: VirtAddr(0x4020_0000),
            end: VirtAddr(0x4040_0000),
            stride_shift: 21,
            last_level: true
        })
    );
    // And back: the old entry is a table, so intermediate walks go too.
    set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 1,
        },
        block,
        LiveOptions::ALLOW_BBM,
    )
    .unwrap();
    let log = mmu.take();
    assert_eq!(log[0], Event::Write { old: table, new: 0 });
    assert_eq!(
        log[2],
        Event::Flush(TlbRange {
            start: VirtAddr(0x4020_0000),
            end: VirtAddr(0x4040_0000),
            stride_shift: 12,
            last_level: false
        })
    );
    assert_eq!(log.len(), 5);
}

#[test]
fn writing_the_same_value_does_nothing() {
    let mmu = Recorder::default();
    let e = page(0x8000, Prot::READ_WRITE);
    let slot = Slot::new(e);
    set_live_entry(
        &mmu,
        LiveEntry {
            va: VA,
            slot: &slot,
            height: 0,
        },
        e,
        LiveOptions::IN_PLACE,
    )
    .unwrap();
    assert!(mmu.take().is_empty());
}

#[test]
fn entry_setters_barrier_valid_entries_only_and_nosync_never() {
    let mmu = Recorder::default();
    let slot = Slot::new(0);
    let e = page(0x8000, Prot::READ_WRITE);
    Arm64::set_pte_at(&mmu, VA, &slot, e);
    Arm64::set_pmd_at(&mmu, VA, &slot, 0);
    Arm64::set_pud_at(&mmu, VA, &slot, e);
    Arm64::set_pte_nosync(&mmu, &slot, 0);
    assert_eq!(
        mmu.take(),
        vec![
            Event::Write { old: 0, new: e },
            Event::Barrier,
            Event::Write { old: e, new: 0 },
            Event::Write { old: 0, new: e },
            Event::Barrier,
            Event::Write { old: e, new: 0 },
        ]
    );
}

#[test]
fn get_and_clear_returns_hardware_updates_and_pmd_start_does_not_flush() {
    let mmu = Recorder::default();
    let clean = Arm64::leaf(PhysAddr(0x4020_0000), Prot::WRITE | Prot::USER, 1);
    // The walker marked it dirty after we built it.
    let slot = Slot::new(clean & !AP_RDONLY);
    let got = Arm64::pmdp_modify_prot_start(&mmu, VA, &slot, 1);
    assert!(Arm64::is_dirty(got));
    assert_eq!(slot.into_inner(), 0);
    assert_eq!(
        mmu.take(),
        vec![Event::Write { old: got, new: 0 }],
        "pmdp_modify_prot_start: no flush at start"
    );
    let slot = Slot::new(clean);
    assert_eq!(Arm64::ptep_get_and_clear(&mmu, &slot), clean);
    assert_eq!(
        Arm64::pmdp_huge_get_and_clear(&mmu, &Slot::new(clean)),
        clean
    );
}

#[test]
fn arch_constants_are_the_arm64_ones() {
    assert_eq!((Arm64::HAVE_MOVE_PMD, Arm64::HAVE_MOVE_PUD), (true, true));
    assert_eq!(Arm64::TLB_FLUSH_CEILING, 512);
    assert_eq!(
        (Arm64::NEEDS_WALKER_BARRIER, Arm64::BREAK_BEFORE_MAKE),
        (true, true)
    );
}

/// Each unsafe change names the rule it breaks.
#[test]
fn each_refused_change_names_its_reason() {
    let rw = page(0x8000, Prot::READ_WRITE);
    let block = Arm64::leaf(PhysAddr(0x4020_0000), Prot::READ_WRITE, 1);
    let cases = [
        (
            rw,
            page(0x9000, Prot::READ_WRITE),
            0,
            BbmReason::OutputAddress,
        ),
        (
            rw,
            page(0x8000, Prot::READ_WRITE.with_mem(MemType::Device)),
            0,
            BbmReason::MemoryType,
        ),
        (
            rw,
            page(0x8000, Prot::READ_WRITE | Prot::GLOBAL),
            0,
            BbmReason::NonGlobalToGlobal,
        ),
        (rw, Arm64::mk_cont(rw, 0), 0, BbmReason::ContiguousRun),
        (
            block,
            Arm64::table_entry(PhysAddr(0x7000), 1),
            1,
            BbmReason::BlockSplit,
        ),
    ];
    for (old, new, h, why) in cases {
        assert!(!pgattr_change_is_safe(old, new, h), "{why:?}");
        assert_eq!(bbm_reason(old, new, h), why);
        let slot = Slot::new(old);
        let entry = LiveEntry {
            va: VA,
            slot: &slot,
            height: h,
        };
        let r = set_live_entry(&Recorder::default(), entry, new, LiveOptions::IN_PLACE);
        assert_eq!(r, Err(Error::BreakBeforeMake(VA, why)));
        assert_eq!(slot.into_inner(), old, "{why:?}: unchanged");
    }
}
