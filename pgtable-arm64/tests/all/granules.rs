//! Every arm64 geometry: 4 KiB (39, 48, 52 bits), 16 KiB (36, 47, 48, 52)
//! and 64 KiB (42, 48, 52). Descriptor encodings at every level with the
//! largest output address, checked against the address fields written
//! out here from the Arm ARM (D8.3.1; Linux `__phys_to_pte_val`), and the
//! core's operations on each geometry on the simulated machine, with
//! mappings above 2^48 (virtual and physical) for the 52-bit formats
//! (`pgtable_testkit::geometry`, which pgtable-core's test formats of the
//! same geometries run too).

use pgtable_testkit::geometry;

use crate::common::{Event, Recorder};
use pgtable_arm64::bits::{CONT, SH_INNER, SH_MASK, TABLE_OR_PAGE, VALID};
use pgtable_arm64::{
    bbm_reason_for, set_live_entry_for, Arm64, Arm64Entry, Arm64Format, Arm64Geometry, Arm64K16,
    Arm64K16Lpa2, Arm64K16Va36, Arm64K16Va47, Arm64K64, Arm64K64Va42, Arm64K64Va52, Arm64Lpa2,
    Arm64Va39, EntryError, LiveEntry,
};
use pgtable_core::contract::{level, BbmReason, Decoded, Format, Slot, TableAttrs, TlbRange};
use pgtable_core::{Error, LiveOptions, PhysAddr, Prot, VaRange, VirtAddr};

/// What each geometry must be, written from the Arm ARM and Linux's
/// Kconfig, not from the format: page shift, VA bits, levels, root
/// entries, PA bits, the heights that may hold a leaf, CONT_PTES,
/// CONT_PMDS and the name.
struct Expect {
    page_shift: u32,
    va_bits: u32,
    levels: u32,
    root_entries: usize,
    pa_bits: u32,
    leaves: &'static [u32],
    cont: (u32, u32),
    name: &'static str,
}

/// Where the address bits of `pa` go in a descriptor, by hand: in place
/// up to bit 47; FEAT_LPA2 (4 and 16 KiB, 52 bits): in place up to bit 49,
/// OA[51:50] in bits [9:8]; 64 KiB with 52 bits: OA[51:48] in bits
/// [15:12].
fn expected_oa(page_shift: u32, pa_bits: u32, pa: u64) -> u64 {
    match (page_shift, pa_bits) {
        (_, 48) => pa,
        (16, 52) => (pa & ((1 << 48) - 1)) | ((pa >> 48) << 12),
        _ => (pa & ((1 << 50) - 1)) | ((pa >> 50) << 8),
    }
}

fn size_at(e: &Expect, h: u32) -> u64 {
    1 << (e.page_shift + (e.page_shift - 3) * h)
}

/// The largest address of `pa_bits` aligned to `align`.
fn top_pa(pa_bits: u32, align: u64) -> u64 {
    ((1u64 << pa_bits) - 1) & !(align - 1)
}

fn descriptors<F: Arm64Geometry + TryAny>(e: &Expect) {
    assert_eq!(F::NAME, e.name);
    assert_eq!(F::PAGE_SHIFT, e.page_shift);
    assert_eq!(F::VA_BITS, e.va_bits);
    assert_eq!(F::LEVELS, e.levels);
    assert_eq!(F::PA_BITS, e.pa_bits);
    assert_eq!(level::top_entries::<F>(), e.root_entries);
    assert_eq!(F::DS, e.pa_bits == 52 && e.page_shift != 16);
    let prots = [
        Prot::READ_WRITE,
        Prot::READ_ONLY | Prot::GLOBAL,
        Prot::WRITE | Prot::USER,
        Prot::USER | Prot::EXEC,
    ];
    let page = 1u64 << e.page_shift;
    for h in 0..e.levels {
        let allowed = e.leaves.contains(&h);
        assert_eq!(F::leaf_allowed(h), allowed, "{} height {h}", e.name);
        assert_eq!(
            F::cont_entries(h),
            match h {
                0 => e.cont.0,
                1 => e.cont.1,
                _ => 0,
            }
        );
        // Tables above height 0, with the largest frame and a pattern.
        if h > 0 {
            for pa in [
                top_pa(e.pa_bits, page),
                0x5555_5555_5555_5555 & top_pa(e.pa_bits, page),
            ] {
                let t = F::table_entry(PhysAddr(pa), h);
                assert_eq!(t, expected_oa(e.page_shift, e.pa_bits, pa) | 0b11);
                assert_eq!(F::decode(t, h), Decoded::Table(PhysAddr(pa)));
                let a = TableAttrs::new(0xf);
                let ta = F::table_entry_attrs(PhysAddr(pa), h, a);
                assert_eq!(F::decode(ta, h), Decoded::Table(PhysAddr(pa)));
                assert_eq!(F::try_table_entry_any(PhysAddr(pa), h), Ok(t));
                assert_eq!(
                    Arm64Entry::<F>::from_raw(t, h).unwrap().table_addr(),
                    Some(PhysAddr(pa))
                );
            }
        } else {
            // A table descriptor's encoding is a page at height 0.
            let t = F::table_entry(PhysAddr(top_pa(e.pa_bits, page)), 1);
            assert!(matches!(F::decode(t, 0), Decoded::Leaf(_)));
        }
        let size = size_at(e, h);
        let pa = top_pa(e.pa_bits, size);
        if !allowed {
            // A block descriptor where the granule has none is reserved.
            let block = expected_oa(e.page_shift, e.pa_bits, pa) | VALID | 1 << 10;
            assert_eq!(F::decode(block, h), Decoded::Invalid);
            assert_eq!(
                F::try_leaf_any(PhysAddr(pa), Prot::READ_ONLY, h),
                Err(EntryError::LeafNotAllowed(h))
            );
            assert!(matches!(
                Arm64Entry::<F>::from_raw(block, h),
                Err(EntryError::ReservedEncoding { .. })
            ));
            continue;
        }
        for prot in prots {
            let leaf = F::leaf(PhysAddr(pa), prot, h);
            let template = F::leaf_template(prot, h);
            assert_eq!(leaf ^ template, expected_oa(e.page_shift, e.pa_bits, pa));
            assert_eq!(leaf, template | F::oa_field(PhysAddr(pa)));
            assert_eq!(F::try_leaf_any(PhysAddr(pa), prot, h), Ok(leaf));
            assert_eq!(F::decode(leaf, h), Decoded::Leaf(PhysAddr(pa)));
            assert_eq!(F::leaf_prot(leaf, h), prot.normalized());
            assert_eq!(leaf & TABLE_OR_PAGE != 0, h == 0);
            // With FEAT_LPA2 bits [9:8] are address, SH is TCR_EL1's.
            if F::DS {
                assert_eq!(template & SH_MASK, 0);
            } else {
                assert_eq!(template & SH_MASK, SH_INNER);
            }
            // The protection changes, the 52-bit address stays.
            for to in prots {
                let m = F::modify_prot(leaf, to, h);
                assert_eq!(F::decode(m, h), Decoded::Leaf(PhysAddr(pa)), "{}", e.name);
                assert_eq!(F::leaf_prot(m, h), to.normalized());
            }
            let none = F::modify_prot(leaf, Prot::NONE, h);
            assert_eq!(F::decode(none, h), Decoded::Leaf(PhysAddr(pa)));
            assert!(F::is_protnone(none, h) && F::swp_value(none).is_none());
            // Contiguous, young/old, clean/dirty keep it a leaf there.
            for v in [
                F::mk_cont(leaf, h),
                F::mkold(leaf, h),
                F::mkclean(leaf, h),
                F::mkdirty(leaf, h),
            ] {
                assert_eq!(F::decode(v, h), Decoded::Leaf(PhysAddr(pa)));
            }
            assert_eq!(F::mk_cont(leaf, h) & CONT, CONT);
            if h > 0 {
                // Split: the first child maps the block's first part, the
                // last child (address advanced) its last page-sized part.
                let child = F::split_leaf(F::mk_cont(leaf, h), h);
                assert_eq!(F::decode(child, h - 1), Decoded::Leaf(PhysAddr(pa)));
                assert_eq!(child & CONT, 0);
                let step = size_at(e, h - 1);
                let last = child + ((size - step) >> F::OA_SHIFT);
                assert_eq!(
                    F::decode(last, h - 1),
                    Decoded::Leaf(PhysAddr(pa + size - step))
                );
                assert_eq!(F::leaf_prot(last, h - 1), prot.normalized());
            }
        }
        // Input the checked constructors refuse.
        assert_eq!(
            F::try_leaf_any(PhysAddr(1 << e.pa_bits), Prot::READ_ONLY, h),
            Err(EntryError::PhysOutOfRange(PhysAddr(1 << e.pa_bits)))
        );
        assert_eq!(
            F::try_leaf_any(PhysAddr(pa + page / 2), Prot::READ_ONLY, h),
            Err(EntryError::MisalignedPhys(PhysAddr(pa + page / 2)))
        );
        // Changing only the top address bits is an output-address change.
        let leaf = F::leaf(PhysAddr(pa), Prot::READ_WRITE, h);
        let lower = F::leaf(PhysAddr(pa & ((1 << 48) - 1)), Prot::READ_WRITE, h);
        if e.pa_bits == 52 {
            assert_ne!(leaf, lower);
            assert_eq!(
                bbm_reason_for::<F>(lower, leaf, h),
                BbmReason::OutputAddress
            );
        }
    }
    // Software entries: invalid at every height, round trip.
    let max = (1u64 << F::SWP_VALUE_BITS) - 1;
    for v in [1, max, 0x2a5 << 20] {
        let s = F::swp_entry(v).unwrap();
        assert_eq!(F::swp_value(s), Some(v));
        for h in 0..e.levels {
            assert_eq!(F::decode(s, h), Decoded::Invalid);
        }
    }
    assert_eq!(F::swp_entry(max + 1), None);
    assert_eq!(
        F::try_table_entry_any(PhysAddr(page), 0),
        Err(EntryError::BadHeight(0))
    );
}

/// `try_leaf` / `try_table_entry` of any format, through a trait so the
/// test can be generic.
trait TryAny {
    fn try_leaf_any(pa: PhysAddr, prot: Prot, h: u32) -> Result<u64, EntryError>;
    fn try_table_entry_any(pa: PhysAddr, h: u32) -> Result<u64, EntryError>;
}

impl<const P: u32, const V: u32> TryAny for Arm64Format<P, V> {
    fn try_leaf_any(pa: PhysAddr, prot: Prot, h: u32) -> Result<u64, EntryError> {
        Self::try_leaf(pa, prot, h)
    }
    fn try_table_entry_any(pa: PhysAddr, h: u32) -> Result<u64, EntryError> {
        Self::try_table_entry(pa, h)
    }
}

macro_rules! geometries {
    ($($name:ident: $f:ty, $e:expr, [$($range:expr),+];)*) => {$(
        #[test]
        fn $name() {
            descriptors::<$f>(&$e);
            geometry::every_operation_in_the_geometry::<$f>(&[$($range),+]);
        }
    )*};
}

geometries! {
    granule_4k_39bit: Arm64Va39, Expect {
        page_shift: 12, va_bits: 39, levels: 3, root_entries: 512, pa_bits: 48,
        leaves: &[0, 1, 2], cont: (16, 16), name: "arm64-4K-39bit",
    }, [VaRange::Lower, VaRange::Both];
    granule_4k_48bit: Arm64, Expect {
        page_shift: 12, va_bits: 48, levels: 4, root_entries: 512, pa_bits: 48,
        leaves: &[0, 1, 2], cont: (16, 16), name: "arm64-4K-48bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_4k_52bit_lpa2: Arm64Lpa2, Expect {
        page_shift: 12, va_bits: 52, levels: 5, root_entries: 16, pa_bits: 52,
        leaves: &[0, 1, 2, 3], cont: (16, 16), name: "arm64-4K-52bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_16k_36bit: Arm64K16Va36, Expect {
        page_shift: 14, va_bits: 36, levels: 2, root_entries: 2048, pa_bits: 48,
        leaves: &[0, 1], cont: (128, 32), name: "arm64-16K-36bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_16k_47bit: Arm64K16Va47, Expect {
        page_shift: 14, va_bits: 47, levels: 3, root_entries: 2048, pa_bits: 48,
        leaves: &[0, 1], cont: (128, 32), name: "arm64-16K-47bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_16k_48bit: Arm64K16, Expect {
        page_shift: 14, va_bits: 48, levels: 4, root_entries: 2, pa_bits: 48,
        leaves: &[0, 1], cont: (128, 32), name: "arm64-16K-48bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_16k_52bit_lpa2: Arm64K16Lpa2, Expect {
        page_shift: 14, va_bits: 52, levels: 4, root_entries: 32, pa_bits: 52,
        leaves: &[0, 1, 2], cont: (128, 32), name: "arm64-16K-52bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_64k_42bit: Arm64K64Va42, Expect {
        page_shift: 16, va_bits: 42, levels: 2, root_entries: 8192, pa_bits: 48,
        leaves: &[0, 1], cont: (32, 32), name: "arm64-64K-42bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_64k_48bit: Arm64K64, Expect {
        page_shift: 16, va_bits: 48, levels: 3, root_entries: 64, pa_bits: 48,
        leaves: &[0, 1], cont: (32, 32), name: "arm64-64K-48bit",
    }, [VaRange::Lower, VaRange::Upper];
    granule_64k_52bit_lpa: Arm64K64Va52, Expect {
        page_shift: 16, va_bits: 52, levels: 3, root_entries: 1024, pa_bits: 52,
        leaves: &[0, 1, 2], cont: (32, 32), name: "arm64-64K-52bit",
    }, [VaRange::Lower, VaRange::Upper];
}

#[test]
fn one_root_serves_both_halves_except_16k_48bit() {
    // A half of VA_BITS - 1 bits takes the same levels (Linux
    // ARM64_HW_PGTABLE_LEVELS), except 16 KiB / 48 bits: 47 bits take 3.
    let shared = [
        Arm64Va39::SHARED_ROOT,
        Arm64::SHARED_ROOT,
        Arm64Lpa2::SHARED_ROOT,
        Arm64K16Va36::SHARED_ROOT,
        Arm64K16Va47::SHARED_ROOT,
        Arm64K16::SHARED_ROOT,
        Arm64K16Lpa2::SHARED_ROOT,
        Arm64K64Va42::SHARED_ROOT,
        Arm64K64::SHARED_ROOT,
        Arm64K64Va52::SHARED_ROOT,
    ];
    assert_eq!(
        shared,
        [true, true, true, true, true, false, true, true, true, true]
    );
}

#[test]
fn the_4k_formats_keep_their_48_bit_layout() {
    // The 52-bit fields are only the 52-bit formats': Arm64's bits [9:8]
    // stay SH and an address above 2^48 does not fit.
    let leaf = Arm64::leaf(PhysAddr(0x4020_0000), Prot::WRITE | Prot::GLOBAL, 1);
    assert_eq!(leaf, 0x0068_0000_4020_0701);
    assert_eq!(Arm64::OA_FIELD_MASK, ((1 << 48) - 1) & !0xfff);
    assert_eq!(Arm64Va39::OA_FIELD_MASK, Arm64::OA_FIELD_MASK);
    assert_eq!(Arm64Lpa2::OA_FIELD_MASK, (((1 << 50) - 1) & !0xfff) | 0x300);
    assert_eq!(
        Arm64K64Va52::OA_FIELD_MASK,
        (((1 << 48) - 1) & !0xffff) | 0xf000
    );
    assert_eq!(Arm64K16::OA_FIELD_MASK, ((1 << 48) - 1) & !0x3fff);
    assert_eq!(
        Arm64::try_leaf(PhysAddr(1 << 48), Prot::READ_ONLY, 0),
        Err(EntryError::PhysOutOfRange(PhysAddr(1 << 48)))
    );
    assert_eq!(
        Arm64Lpa2::try_leaf(PhysAddr(1 << 51), Prot::READ_ONLY, 0).map(|r| r & 0x300),
        Ok(0x200)
    );
}

/// A live change of a PMD block in place flushes that block's range with
/// its own stride (32 MiB for 16 KiB, 512 MiB for 64 KiB pages); one of a
/// table entry flushes page by page of the granule; a break-before-make
/// of a 52-bit block flushes the block it took out.
fn live_changes<F: Arm64Geometry>() {
    let pmd_shift = level::shift::<F>(1);
    let page_shift = level::page_shift::<F>();
    let va = VirtAddr(5 << pmd_shift | 3 << page_shift);
    let start = VirtAddr(5 << pmd_shift);
    let pa = PhysAddr(((1u64 << F::PA_BITS) - 1) & !((1u64 << pmd_shift) - 1));
    let old = F::leaf(pa, Prot::READ_WRITE, 1);
    let new = F::leaf(pa, Prot::READ_ONLY, 1);
    let mmu = Recorder::default();
    let slot = Slot::new(old);
    let at = LiveEntry {
        va,
        slot: &slot,
        height: 1,
    };
    set_live_entry_for::<F, _>(&mmu, at, new, LiveOptions::IN_PLACE).unwrap();
    let block = TlbRange {
        start,
        end: start.add(1 << pmd_shift),
        stride_shift: pmd_shift,
        last_level: true,
    };
    assert_eq!(
        mmu.take(),
        vec![
            Event::Write { old, new },
            Event::Barrier,
            Event::Flush(block)
        ]
    );
    // A table entry's hierarchical permission: every page below it.
    let table = F::table_entry(PhysAddr(1 << page_shift), 1);
    let slot = Slot::new(table);
    let at = LiveEntry {
        va,
        slot: &slot,
        height: 1,
    };
    let limited = F::table_entry_attrs(PhysAddr(1 << page_shift), 1, TableAttrs::new(0xf));
    set_live_entry_for::<F, _>(&mmu, at, limited, LiveOptions::IN_PLACE).unwrap();
    let log = mmu.take();
    assert_eq!(
        log.last(),
        Some(&Event::Flush(TlbRange {
            start,
            end: start.add(1 << pmd_shift),
            stride_shift: page_shift,
            last_level: false,
        }))
    );
    // Another output address: refused in place, done with
    // break-before-make (the block goes, its range is flushed, the new
    // block is written).
    // With 52 bits only the top address bits change (bits [9:8] or
    // [15:12] of the descriptor), otherwise bit 47.
    let other = if F::PA_BITS == 52 {
        pa.0 & ((1 << 48) - 1)
    } else {
        pa.0 ^ 1 << 47
    };
    let moved = F::leaf(PhysAddr(other), Prot::READ_WRITE, 1);
    let slot = Slot::new(old);
    let at = LiveEntry {
        va,
        slot: &slot,
        height: 1,
    };
    let why = BbmReason::OutputAddress;
    assert_eq!(
        set_live_entry_for::<F, _>(&mmu, at, moved, LiveOptions::IN_PLACE),
        Err(Error::BreakBeforeMake(va, why))
    );
    assert_eq!(slot.load(std::sync::atomic::Ordering::Relaxed), old);
    assert!(mmu.take().is_empty());
    set_live_entry_for::<F, _>(&mmu, at, moved, LiveOptions::ALLOW_BBM).unwrap();
    assert_eq!(
        mmu.take(),
        vec![
            Event::Write { old, new: 0 },
            Event::Barrier,
            Event::Flush(block),
            Event::Write { old: 0, new: moved },
            Event::Barrier,
        ]
    );
}

#[test]
fn live_changes_flush_the_entry_of_each_granule() {
    live_changes::<Arm64>();
    live_changes::<Arm64Lpa2>();
    live_changes::<Arm64K16>();
    live_changes::<Arm64K16Lpa2>();
    live_changes::<Arm64K64>();
    live_changes::<Arm64K64Va52>();
}
