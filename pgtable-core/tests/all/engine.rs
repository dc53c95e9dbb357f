//! Host tests of the generic map / unmap / translate / walk engine with the
//! test format: every level, every bad input (tables byte-for-byte
//! unchanged, no leaked frame), allocation failure at every allocation
//! point, barrier batching and TLB gathering.
#![cfg(feature = "alloc")]

use crate::common::test_format_variant;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use pgtable_core::contract::{Arena, Format, Mmu, NoopMmu, Table, TableAlloc, TlbRange};
use pgtable_core::{
    test_format::{TestFormat, ACCESSED, DIRTY},
    MoveOptions,
};
use pgtable_core::{variants, AddressSpace, Error, MapOptions, PhysAddr, Prot, VirtAddr};

const K4: u64 = 4 << 10;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

type Space<const L: u32 = 4> = AddressSpace<TestFormat<L>, Rec, Arena>;
type T4 = TestFormat<4>;

test_format_variant!(
    /// The test format able to encode output addresses below 4 KiB only,
    /// so no table frame an allocator hands out can be linked.
    Pa12,
    "test-pa12",
    pa_bits = 12
);

// SAFETY: every entry operation is the generic fallback.
unsafe impl pgtable_core::contract::Arch for Pa12 {}

/// An MMU that records what the algorithms asked of it.
#[derive(Default)]
struct Rec {
    events: RefCell<Vec<Ev>>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Ev {
    Barrier,
    Range(TlbRange),
    All,
}

impl Rec {
    fn take(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.events.borrow_mut())
    }
    fn flushes(&self) -> Vec<Ev> {
        self.take()
            .into_iter()
            .filter(|e| *e != Ev::Barrier)
            .collect()
    }
}

// SAFETY: a host test MMU: no hardware walker uses these tables.
unsafe impl Mmu for Rec {
    fn walker_barrier(&self) {
        self.events.borrow_mut().push(Ev::Barrier);
    }
    fn flush_tlb_range(&self, range: TlbRange) {
        self.events.borrow_mut().push(Ev::Range(range));
    }
    fn flush_tlb_all(&self) {
        self.events.borrow_mut().push(Ev::All);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

fn space<const L: u32>() -> Space<L> {
    AddressSpace::new(Rec::default(), Arena::new()).unwrap()
}

/// Everything observable about the tables: every leaf, every table frame.
#[derive(Debug, PartialEq)]
struct Snapshot {
    leaves: Vec<(u64, u64, u64, u32, u64)>,
    tables: usize,
    live: usize,
}

fn snapshot<const L: u32, M: Mmu>(s: &AddressSpace<TestFormat<L>, M, Arena>) -> Snapshot {
    let mut leaves = Vec::new();
    let half = 1u64 << (TestFormat::<L>::VA_BITS_PUB - 1);
    for (start, len) in [(0, half), (half.wrapping_neg(), half)] {
        s.walk(VirtAddr(start), len, |m| {
            leaves.push((m.va.0, m.pa.0, m.size, m.height, m.entry))
        })
        .unwrap();
    }
    Snapshot {
        leaves,
        tables: s.inspect().count_tables(),
        live: s.alloc().live(),
    }
}

trait VaBits {
    const VA_BITS_PUB: u32;
}
impl<const L: u32> VaBits for TestFormat<L> {
    const VA_BITS_PUB: u32 = <TestFormat<L> as pgtable_core::contract::Format>::VA_BITS;
}

fn pa_of<const L: u32, M: Mmu>(s: &AddressSpace<TestFormat<L>, M, Arena>, va: u64) -> Option<u64> {
    s.translate(VirtAddr(va)).map(|t| t.pa.0)
}

#[test]
fn map_translate_unmap_at_every_level() {
    let mut s = space::<4>();
    // 4 KiB pages, a 2 MiB block and a 1 GiB block, each with its own PA.
    let cases = [
        (0x4000_0000_u64 + K4, 0x1_0000_0000_u64, 3 * K4, 0u32),
        (0x8000_0000 + 2 * M2, 0x2_0000_0000 + 4 * M2, M2, 1),
        (0x10_0000_0000, 0x3_0000_0000, G1, 2),
    ];
    for (va, pa, len, h) in cases {
        s.map(
            VirtAddr(va),
            PhysAddr(pa),
            len,
            Prot::READ_WRITE,
            MapOptions::BLOCKS,
        )
        .unwrap();
        for off in [0, len / 2 + 8, len - 8] {
            let t = s.translate(VirtAddr(va + off)).unwrap();
            assert_eq!(t.pa.0, pa + off, "va {:#x}", va + off);
            assert_eq!(t.height, h);
            assert_eq!(t.prot, Prot::READ_WRITE);
        }
        assert_eq!(pa_of(&s, va + len), None);
    }
    // Four tables for the 4 KiB pages (root, PUD, PMD, PTE) plus a PUD
    // table for the 1 GiB block region, whose PMD shares the first PUD.
    assert_eq!(s.inspect().count_tables(), 5);
    let mut seen = Vec::new();
    s.walk(VirtAddr(0), 1 << 47, |m| seen.push((m.va.0, m.height)))
        .unwrap();
    assert_eq!(
        seen,
        vec![
            (0x4000_1000, 0),
            (0x4000_2000, 0),
            (0x4000_3000, 0),
            (0x8040_0000, 1),
            (0x10_0000_0000, 2)
        ]
    );
    for (va, _, len, _) in cases {
        s.unmap(VirtAddr(va), len).unwrap();
        assert_eq!(pa_of(&s, va), None);
    }
    assert_eq!(s.inspect().count_tables(), 1, "empty tables are freed");
    assert_eq!(s.alloc().live(), 1);
}

#[test]
fn walk_reports_the_protection_of_each_leaf_as_translate_does() {
    let mut s = space::<4>();
    // A read-only 2 MiB block, then writable 4 KiB pages, then an
    // executable page.
    let cases = [
        (G1, 0x8000_0000, M2, Prot::READ_ONLY, MapOptions::BLOCKS),
        (
            G1 + M2,
            0x9000_0000,
            2 * K4,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        ),
        (
            G1 + M2 + 2 * K4,
            0xa000_0000,
            K4,
            Prot::READ_EXEC,
            MapOptions::PAGES,
        ),
    ];
    for (va, pa, len, prot, opts) in cases {
        s.map(VirtAddr(va), PhysAddr(pa), len, prot, opts).unwrap();
    }
    let mut seen = Vec::new();
    s.walk(VirtAddr(G1), M2 + 3 * K4, |m| {
        seen.push((m.va.0, m.size, m.prot))
    })
    .unwrap();
    assert_eq!(
        seen,
        vec![
            (G1, M2, Prot::READ_ONLY),
            (G1 + M2, K4, Prot::READ_WRITE),
            (G1 + M2 + K4, K4, Prot::READ_WRITE),
            (G1 + M2 + 2 * K4, K4, Prot::READ_EXEC),
        ]
    );
    for (va, _, prot) in seen {
        assert_eq!(s.translate(VirtAddr(va)).unwrap().prot, prot);
    }
}

#[test]
fn blocks_are_used_only_when_allowed_and_aligned() {
    let mut s = space::<4>();
    // VA aligned, PA not aligned to 2 MiB: pages.
    s.map(
        VirtAddr(0x4000_0000),
        PhysAddr(0x1000),
        M2,
        Prot::READ_ONLY,
        MapOptions::BLOCKS,
    )
    .unwrap();
    assert_eq!(s.translate(VirtAddr(0x4000_0000)).unwrap().height, 0);
    // Aligned but blocks not allowed: pages.
    s.map(
        VirtAddr(0x4020_0000),
        PhysAddr(0x20_0000),
        M2,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(s.translate(VirtAddr(0x4020_0000)).unwrap().height, 0);
    // 1 GiB aligned, PMD blocks only: 512 PMD blocks, no PUD block.
    s.map(
        VirtAddr(G1 * 8),
        PhysAddr(G1 * 2),
        G1,
        Prot::READ_ONLY,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    assert_eq!(s.translate(VirtAddr(G1 * 8 + 5)).unwrap().height, 1);
    // Mixed range: head pages, middle blocks, tail pages.
    let va = 0x80_0000_0000 - 3 * K4;
    s.map(
        VirtAddr(va),
        PhysAddr(0x4000_0000 - 3 * K4),
        3 * K4 + 2 * M2 + K4,
        Prot::READ_ONLY,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let heights: Vec<u32> = [va, va + 3 * K4, va + 3 * K4 + M2, va + 3 * K4 + 2 * M2]
        .iter()
        .map(|&v| s.translate(VirtAddr(v)).unwrap().height)
        .collect();
    assert_eq!(heights, [0, 1, 1, 0]);
}

#[test]
fn three_and_five_level_formats_fold_like_linux() {
    let mut s3 = space::<3>();
    s3.map(
        VirtAddr(G1),
        PhysAddr(0),
        G1,
        Prot::READ_ONLY,
        MapOptions::BLOCKS,
    )
    .unwrap();
    assert_eq!(
        s3.inspect().count_tables(),
        1,
        "a 1 GiB block sits in the root"
    );
    let t = s3.translate(VirtAddr(G1 + 0x1234)).unwrap();
    assert_eq!(
        (t.pa.0, t.level),
        (0x1234, pgtable_core::contract::Level::Pgd)
    );
    // 39-bit VA: 1 << 38 is the start of the upper half.
    assert_eq!(
        s3.map(
            VirtAddr(1 << 38),
            PhysAddr(0),
            K4,
            Prot::READ_ONLY,
            MapOptions::PAGES
        ),
        Err(Error::OutOfRange(VirtAddr(1 << 38)))
    );

    let mut s5 = space::<5>();
    let va = 0x00ff_0000_0000_0000; // needs 57-bit VA
    s5.map(
        VirtAddr(va),
        PhysAddr(0x5000),
        K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(s5.inspect().count_tables(), 5);
    assert_eq!(pa_of(&s5, va + 8), Some(0x5008));
    s5.unmap(VirtAddr(va), K4).unwrap();
    assert_eq!(s5.inspect().count_tables(), 1);
}

#[test]
fn the_top_page_of_the_upper_half_maps_and_unmaps() {
    let mut s = space::<4>();
    let va = 0xffff_ffff_ffff_f000;
    s.map(
        VirtAddr(va),
        PhysAddr(0x7000),
        K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(pa_of(&s, va + 0xff8), Some(0x7ff8));
    s.unmap(VirtAddr(va - M2 + K4), M2).unwrap();
    assert_eq!(pa_of(&s, va), None);
    assert_eq!(s.inspect().count_tables(), 1);
}

#[test]
fn the_top_page_maps_with_a_barrier_per_entry_too() {
    // The per-entry control variant advanced its address past the last
    // page: 2^64 overflowed (a panic with overflow checks, a silent wrap
    // without).
    for (va, len) in [(0xffff_ffff_ffff_f000, K4), (0xffff_ffff_ffff_d000, 3 * K4)] {
        let mut s = space::<4>();
        let opts = variants::barrier_per_entry(MapOptions::PAGES);
        s.map(VirtAddr(va), PhysAddr(0x7000), len, Prot::READ_ONLY, opts)
            .unwrap();
        assert_eq!(pa_of(&s, 0xffff_ffff_ffff_fff8), Some(0x7000 + len - 8));
        s.unmap(VirtAddr(va), len).unwrap();
        assert_eq!(s.inspect().count_tables(), 1);
    }
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(0x4000_0000),
        PhysAddr(0x10_0000),
        4 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(0x8000_0000),
        PhysAddr(0x4000_0000),
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let before = snapshot(&s);
    s.mmu().take();
    let rw = Prot::READ_WRITE;
    let p = MapOptions::BLOCKS;
    let cases: Vec<(&str, Result<(), Error>, Error)> = vec![
        (
            "zero length",
            s.map(VirtAddr(0), PhysAddr(0), 0, rw, p),
            Error::ZeroLength,
        ),
        (
            "misaligned va",
            s.map(VirtAddr(0x123), PhysAddr(0), K4, rw, p),
            Error::MisalignedVirt(VirtAddr(0x123)),
        ),
        (
            "misaligned pa",
            s.map(VirtAddr(0), PhysAddr(0x10), K4, rw, p),
            Error::MisalignedPhys(PhysAddr(0x10)),
        ),
        (
            "misaligned len",
            s.map(VirtAddr(0), PhysAddr(0), 100, rw, p),
            Error::MisalignedLength(100),
        ),
        (
            "non-canonical",
            s.map(VirtAddr(1 << 47), PhysAddr(0), K4, rw, p),
            Error::OutOfRange(VirtAddr(1 << 47)),
        ),
        (
            "crosses the hole",
            s.map(VirtAddr((1 << 47) - K4), PhysAddr(0), 2 * K4, rw, p),
            Error::OutOfRange(VirtAddr(1 << 47)),
        ),
        (
            "wraps",
            s.map(VirtAddr(0xffff_ffff_ffff_f000), PhysAddr(0), 2 * K4, rw, p),
            Error::OutOfRange(VirtAddr(0xffff_ffff_ffff_f000)),
        ),
        (
            "pa too wide",
            s.map(VirtAddr(0), PhysAddr(1 << 48), K4, rw, p),
            Error::PhysOutOfRange(PhysAddr(1 << 48)),
        ),
        (
            "page taken",
            s.map(VirtAddr(0x4000_0000 - K4), PhysAddr(0), 3 * K4, rw, p),
            Error::AlreadyMapped(VirtAddr(0x4000_0000)),
        ),
        (
            "block taken",
            s.map(VirtAddr(0x8010_0000), PhysAddr(0), K4, rw, p),
            Error::AlreadyMapped(VirtAddr(0x8010_0000)),
        ),
        (
            "table under block",
            s.map(VirtAddr(0x4000_0000), PhysAddr(0), M2, rw, p),
            Error::AlreadyMapped(VirtAddr(0x4000_0000)),
        ),
        ("unmap zero", s.unmap(VirtAddr(0), 0), Error::ZeroLength),
        (
            "unmap misaligned",
            s.unmap(VirtAddr(0x4000_0800), K4),
            Error::MisalignedVirt(VirtAddr(0x4000_0800)),
        ),
        (
            "unmap non-canonical",
            s.unmap(VirtAddr(0x8000_0000_0000), K4),
            Error::OutOfRange(VirtAddr(0x8000_0000_0000)),
        ),
    ];
    for (name, got, want) in cases {
        assert_eq!(got, Err(want), "{name}");
        assert_eq!(snapshot(&s), before, "{name} changed the tables");
    }
    assert!(
        s.mmu().take().is_empty(),
        "no barrier or flush for rejected input"
    );
}

#[test]
fn already_mapped_names_the_first_mapped_address_not_the_block_slot() {
    // One page in the middle of a 2 MiB slot; a map wanting blocks over
    // the slot must report that page, which the caller can act on.
    let page = 0x4000_3000;
    let cases = [
        ("one block", M2, MapOptions::BLOCKS),
        ("a run of blocks", 2 * M2, MapOptions::BLOCKS),
        (
            "blocks, one barrier each",
            M2,
            variants::barrier_per_entry(MapOptions::BLOCKS),
        ),
        ("a 1 GiB block", G1, MapOptions::BLOCKS),
    ];
    for (name, len, opts) in cases {
        let mut s = space::<4>();
        s.map(
            VirtAddr(page),
            PhysAddr(0x7000),
            K4,
            Prot::READ_ONLY,
            MapOptions::PAGES,
        )
        .unwrap();
        let before = snapshot(&s);
        let r = s.map(
            VirtAddr(0x4000_0000),
            PhysAddr(0x8000_0000),
            len,
            Prot::READ_WRITE,
            opts,
        );
        assert_eq!(r, Err(Error::AlreadyMapped(VirtAddr(page))), "{name}");
        assert_eq!(snapshot(&s), before, "{name} changed the tables");
    }
}

#[test]
fn out_of_range_names_the_hole_also_when_the_length_wraps_past_the_top() {
    // A lower-half range whose end would pass 2^64: the first address it
    // cannot have is still the start of the non-canonical hole.
    let mut s = space::<4>();
    let va = VirtAddr(0x7fff_ffff_f000);
    let len = !(K4 - 1);
    let hole = Err(Error::OutOfRange(VirtAddr(1 << 47)));
    let rw = Prot::READ_WRITE;
    assert_eq!(s.map(va, PhysAddr(0), len, rw, MapOptions::PAGES), hole);
    assert_eq!(s.unmap(va, len), hole);
    assert_eq!(s.change_protection(va, len, rw), hole);
    assert_eq!(s.walk(va, len, |_| {}), hole);
    assert_eq!(
        s.move_page_tables(VirtAddr(0), va, len, MoveOptions::DEFAULT),
        hole
    );
    // An upper-half range that passes 2^64 has no first invalid address
    // in 64 bits: it is named by its start.
    let top = VirtAddr(0xffff_ffff_ffff_e000);
    assert_eq!(s.unmap(top, 3 * K4), Err(Error::OutOfRange(top)));
}

#[test]
fn a_range_past_the_top_of_an_upper_half_space_is_named_by_its_start() {
    // The upper half ends at 2^64: a range that runs past it has no first
    // invalid address in 64 bits, so every range operation names its
    // start, in a plain upper space and in a kernel space alike.
    use pgtable_core::{ClearRefs, CopyMode, LiveOptions, VaRange};
    type New = fn() -> Space;
    let spaces: [(&str, New); 2] = [
        ("new_in(Upper)", || {
            AddressSpace::new_in(VaRange::Upper, Rec::default(), Arena::new()).unwrap()
        }),
        ("new_kernel", || {
            AddressSpace::new_kernel(Rec::default(), Arena::new()).unwrap()
        }),
    ];
    let top = VirtAddr(0xffff_ffff_ffff_f000);
    let (va, len) = (top, 2 * K4);
    let err = Err(Error::OutOfRange(top));
    let rw = Prot::READ_WRITE;
    for (name, new) in spaces {
        let mut s = new();
        s.map(
            top,
            PhysAddr(0x7000),
            K4,
            Prot::READ_ONLY,
            MapOptions::PAGES,
        )
        .unwrap();
        let mut other = new();
        let other_tables = other.inspect().count_tables();
        let leaves = |s: &Space| {
            let mut v = Vec::new();
            s.walk(VirtAddr(top.0 - M2 + K4), M2, |m| v.push(m))
                .unwrap();
            (v, s.inspect().count_tables(), s.alloc().live())
        };
        let before = leaves(&s);
        let r = |op: &str, got: Result<(), Error>| assert_eq!(got, err, "{name}: {op}");
        r("map", s.map(va, PhysAddr(0), len, rw, MapOptions::PAGES));
        r("unmap", s.unmap(va, len));
        r("unmap_with", s.unmap_with(va, len, |_| panic!("reported")));
        r("change_protection", s.change_protection(va, len, rw));
        let live = LiveOptions::ALLOW_BBM;
        r(
            "change_protection_live",
            s.change_protection_live(va, len, rw, live),
        );
        r("walk", s.walk(va, len, |_| panic!("reported")));
        let young = ClearRefs::YOUNG;
        r(
            "clear_refs",
            s.clear_refs(va, len, young, |_| panic!("reported")),
        );
        r("ptdump_range", s.ptdump().range(va, len).map(|_| ()));
        r(
            "copy_page_range",
            s.copy_page_range(&mut other, va, len, CopyMode::Cow, |_| {}),
        );
        let below = VirtAddr(top.0 - M2);
        r(
            "move_page_tables (src)",
            s.move_page_tables(va, below, len, MoveOptions::DEFAULT),
        );
        r(
            "move_page_tables (dst)",
            s.move_page_tables(below, va, len, MoveOptions::DEFAULT),
        );
        let mut tlb = s.tlb_gather_mmu();
        r("MmuGather::unmap", tlb.unmap(va, len));
        let f = |_| panic!("reported");
        r("MmuGather::unmap_with", tlb.unmap_with(va, len, f));
        let cp = tlb.change_protection(va, len, rw);
        r("MmuGather::change_protection", cp);
        let cr = tlb.clear_refs(va, len, young, |_| panic!("reported"));
        r("MmuGather::clear_refs", cr);
        tlb.finish();
        assert_eq!(leaves(&s), before, "{name}: the tables changed");
        assert_eq!(
            other.inspect().count_tables(),
            other_tables,
            "{name}: the child changed"
        );
    }
}

#[test]
fn map_out_of_memory_at_every_allocation_point_changes_nothing() {
    // A range across the 5 GiB boundary: 3 pages below it, a 2 MiB block,
    // 5 pages above. The PUD table exists (the page at 1 GiB); it needs two
    // PMD tables and two PTE tables.
    let va = 5 * G1 - 3 * K4;
    let len = 3 * K4 + 2 * M2 + 5 * K4;
    let mut s = space::<4>();
    s.map(
        VirtAddr(0x4000_0000),
        PhysAddr(0),
        K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    let before = snapshot(&s);
    let mut needed = None;
    for k in 0..16 {
        s.alloc().fail_after(Some(k));
        match s.map(
            VirtAddr(va),
            PhysAddr(0x10_0000_0000 - 3 * K4),
            len,
            Prot::READ_ONLY,
            MapOptions::BLOCKS,
        ) {
            Err(Error::OutOfMemory) => assert_eq!(snapshot(&s), before, "after failure {k}"),
            Ok(()) => {
                needed = Some(k);
                break;
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }
    assert_eq!(needed, Some(4), "2 PMD + 2 PTE tables");
    assert_eq!(s.translate(VirtAddr(5 * G1)).unwrap().height, 1);
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

#[test]
fn partial_unmap_of_a_block_splits_it_down_to_pages() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(G1),
        PhysAddr(4 * G1),
        G1,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    assert_eq!(s.inspect().count_tables(), 2);
    // A 4 KiB hole in the middle of the 1 GiB block.
    let hole = G1 + 300 * M2 + 7 * K4;
    s.unmap(VirtAddr(hole), K4).unwrap();
    assert_eq!(pa_of(&s, hole), None);
    for (va, h) in [(G1, 1), (hole - K4, 0), (hole + K4, 0), (2 * G1 - 8, 1)] {
        let t = s.translate(VirtAddr(va)).unwrap();
        assert_eq!(t.pa.0, va - G1 + 4 * G1, "va {va:#x}");
        assert_eq!(t.height, h, "va {va:#x}");
        assert_eq!(t.prot, Prot::READ_WRITE);
    }
    // Root, PUD, the new PMD table and one PTE table.
    assert_eq!(s.inspect().count_tables(), 4);
    // Break-before-make (the test format asks for it): the block was
    // invalidated and flushed before the table went in.
    let flushes = s.mmu().flushes();
    assert!(flushes.len() >= 2, "{flushes:?}");
    assert_eq!(s.alloc().live(), s.inspect().count_tables());
}

#[test]
fn unmap_out_of_memory_while_splitting_changes_nothing() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        G1,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let before = snapshot(&s);
    for k in 0..2 {
        s.alloc().fail_after(Some(k));
        assert_eq!(s.unmap(VirtAddr(G1 + K4), K4), Err(Error::OutOfMemory));
        assert_eq!(snapshot(&s), before);
    }
    s.alloc().fail_after(Some(2));
    s.unmap(VirtAddr(G1 + K4), K4).unwrap();
    assert_eq!(pa_of(&s, G1 + K4), None);
    assert_eq!(pa_of(&s, G1 + 2 * K4), Some(2 * K4));
}

#[test]
fn unmap_skips_holes_and_frees_tables_that_become_empty() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(0x4000_0000),
        PhysAddr(0),
        2 * K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(0x4000_0000 + 8 * K4),
        PhysAddr(0),
        K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(0x5000_0000),
        PhysAddr(0),
        K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(s.inspect().count_tables(), 5);
    // Covers the first table's mappings and its holes, not the whole table.
    s.unmap(VirtAddr(0x4000_0000), 9 * K4).unwrap();
    assert_eq!(
        s.inspect().count_tables(),
        4,
        "the emptied PTE table is freed"
    );
    assert_eq!(pa_of(&s, 0x5000_0000), Some(0));
    assert_eq!(s.alloc().live(), 4);
    // One range flush for the whole operation.
    let flushes = s.mmu().flushes();
    assert_eq!(flushes.len(), 1, "{flushes:?}");
    match flushes[0] {
        Ev::Range(r) => {
            assert_eq!(r.start.0, 0x4000_0000);
            assert!(!r.last_level, "a table was freed: walk caches must go");
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn tlb_gather_switches_to_a_full_flush_past_the_ceiling() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(0x4000_0000),
        PhysAddr(0),
        200 * K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    s.mmu().take();
    // 4 pages: one range flush of 4 strides, leaf-only.
    s.unmap(VirtAddr(0x4000_0000), 4 * K4).unwrap();
    assert_eq!(
        s.mmu().flushes(),
        vec![Ev::Range(TlbRange {
            start: VirtAddr(0x4000_0000),
            end: VirtAddr(0x4000_4000),
            stride_shift: 12,
            last_level: true
        })]
    );
    // 40 pages > 33 (the test format's ceiling): one full flush.
    s.unmap(VirtAddr(0x4000_4000), 40 * K4).unwrap();
    assert_eq!(s.mmu().flushes(), vec![Ev::All]);
}

#[cfg(feature = "stats")]
#[test]
fn mapping_1gib_of_pages_issues_one_barrier_per_table_not_per_entry() {
    let mut s = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        G1,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    let st = s.stats();
    // 512 PTE tables, one PMD, one PUD, the root.
    assert_eq!(st.barriers(), 512 + 3);
    assert_eq!(st.entries_written(), 262_144 + 512 + 1 + 1);
    assert_eq!(st.tables_allocated(), 1 + 1 + 1 + 512);
    s.unmap(VirtAddr(G1), G1).unwrap();
    assert_eq!(st_tables(&s), 1);

    // The control variant (before Linux "arm64: mm: Batch dsb and isb when populating pgtables"): a barrier per entry.
    let mut c = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    c.map(
        VirtAddr(G1),
        PhysAddr(0),
        G1,
        Prot::READ_WRITE,
        variants::barrier_per_entry(MapOptions::PAGES),
    )
    .unwrap();
    assert!(c.stats().barriers() >= 262_144);
    assert!(c.stats().barriers() / s.stats().barriers() >= 500);
}

#[cfg(feature = "stats")]
#[test]
fn the_barrier_per_entry_control_variant_also_covers_blocks() {
    let mut s = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        G1,
        Prot::READ_WRITE,
        variants::barrier_per_entry(MapOptions::PMD_BLOCKS),
    )
    .unwrap();
    // 512 blocks with a barrier each, then one per table written (the
    // PMD, PUD and root tables).
    assert_eq!(s.stats().barriers(), 512 + 3);
    assert_eq!(s.translate(VirtAddr(G1)).unwrap().height, 1);
}

#[cfg(feature = "stats")]
fn st_tables<M: Mmu>(s: &AddressSpace<TestFormat, M, Arena>) -> usize {
    s.inspect().count_tables()
}

#[test]
fn a_lazy_mmu_scope_issues_one_barrier_for_everything_inside() {
    let mut s = space::<4>();
    s.lazy_mmu(|s| {
        for i in 0..4u64 {
            s.map(
                VirtAddr(G1 * (i + 1)),
                PhysAddr(0),
                4 * M2,
                Prot::READ_ONLY,
                MapOptions::PAGES,
            )
            .unwrap();
        }
        assert!(s.mmu().take().is_empty(), "no barrier inside the scope");
    });
    assert_eq!(s.mmu().take(), vec![Ev::Barrier]);
}

#[test]
fn accessed_and_dirty_state_survives_a_split() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    // SAFETY: sets the accessed and dirty state of the block, as the
    // hardware does on a write through it; the space is not installed.
    let slot = unsafe { s.inspect().slot(VirtAddr(G1), 1) }.unwrap();
    slot.fetch_or(ACCESSED | DIRTY, std::sync::atomic::Ordering::Relaxed);
    s.unmap(VirtAddr(G1), K4).unwrap();
    let t = s.translate(VirtAddr(G1 + K4)).unwrap();
    assert_eq!(t.entry & (ACCESSED | DIRTY), ACCESSED | DIRTY);
}

/// A small deterministic generator for the model test.
struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn random_map_unmap_sequences_agree_with_a_reference_model() {
    // Window of 4 GiB, operations of page/block granularity.
    let mut s = space::<4>();
    let mut model = std::collections::BTreeMap::<u64, u64>::new(); // page -> pa
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let base = 0x40_0000_0000u64;
    for step in 0..pgtable_testkit::miri_scaled(600) {
        let page = rng.next() % (4 * G1 / K4);
        let pages = 1 + rng.next() % if rng.next() % 8 == 0 { 2048 } else { 16 };
        let va = base + page * K4;
        let len = pages * K4;
        if va + len > base + 4 * G1 {
            continue;
        }
        if rng.next() % 2 == 0 {
            let pa = (rng.next() % 64) * M2 + (va & (M2 - 1));
            let taken = (0..pages).any(|i| model.contains_key(&(page + i)));
            let r = s.map(
                VirtAddr(va),
                PhysAddr(pa),
                len,
                Prot::READ_WRITE,
                MapOptions::BLOCKS,
            );
            if taken {
                assert!(
                    matches!(r, Err(Error::AlreadyMapped(_))),
                    "step {step}: {r:?}"
                );
            } else {
                r.unwrap();
                for i in 0..pages {
                    model.insert(page + i, pa + i * K4);
                }
            }
        } else {
            s.unmap(VirtAddr(va), len).unwrap();
            for i in 0..pages {
                model.remove(&(page + i));
            }
        }
        if step % 50 == 0 {
            let mut got = std::collections::BTreeMap::new();
            s.walk(VirtAddr(base), 4 * G1, |m| {
                for i in 0..m.size / K4 {
                    got.insert((m.va.0 - base) / K4 + i, m.pa.0 + i * K4);
                }
            })
            .unwrap();
            assert_eq!(got, model, "step {step}");
            assert_eq!(
                s.alloc().live(),
                s.inspect().count_tables(),
                "step {step}: leak"
            );
        }
    }
    s.unmap(VirtAddr(base), 4 * G1).unwrap();
    assert_eq!(s.inspect().count_tables(), 1);
    assert_eq!(s.alloc().live(), 1);
}

/// An arena the test shares with the address space, so its counts can be
/// read after the address space (and its handle) is gone.
#[derive(Clone, Default)]
struct SharedArena(Rc<RefCell<Arena>>);

impl SharedArena {
    fn live(&self) -> usize {
        self.0.borrow().live()
    }
}

// SAFETY: every handle forwards to the one `Arena`, which upholds the
// contract; the handles share its frames.
unsafe impl TableAlloc for SharedArena {
    fn alloc_table(&mut self) -> Option<PhysAddr> {
        self.0.borrow_mut().alloc_table()
    }
    unsafe fn free_table(&mut self, pa: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.0.borrow_mut().free_table(pa) }
    }
    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.0.borrow().phys_to_virt(pa) }
    }
}

/// A space of 4 + 7 tables on a shared arena.
fn shared_space(arena: &SharedArena) -> AddressSpace<TestFormat, Rec, SharedArena> {
    let mut s = AddressSpace::new(Rec::default(), arena.clone()).unwrap();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        8 * M2,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(arena.live(), 4 + 7);
    s
}

#[test]
fn dropping_the_address_space_frees_every_table() {
    let arena = SharedArena::default();
    drop(shared_space(&arena));
    assert_eq!(arena.live(), 0);
    // Installed, then deactivated: freed too.
    let mut s = shared_space(&arena);
    // SAFETY: `Rec` installs nothing.
    unsafe { s.install() };
    assert!(s.inspect().is_active());
    // SAFETY: no CPU ever used the tables.
    unsafe { s.deactivate() };
    assert!(!s.inspect().is_active());
    drop(s);
    assert_eq!(arena.live(), 0);
}

#[test]
fn dropping_an_installed_address_space_leaks_its_tables() {
    let arena = SharedArena::default();
    let mut s = shared_space(&arena);
    // SAFETY: `Rec` installs nothing.
    unsafe { s.install() };
    let root = s.root();
    // Debug builds report the misuse (a panic in `drop`); every build
    // leaves the tables allocated, as a CPU may still be walking them.
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(s)));
    assert_eq!(dropped.is_err(), cfg!(debug_assertions));
    assert_eq!(arena.live(), 4 + 7, "tables of an installed space freed");
    // Take them back (the test's own clean-up): all 11 are still there.
    // SAFETY: the leaked tables, owned by nothing now; `Rec` installs
    // nothing, so no CPU uses them.
    let s =
        unsafe { AddressSpace::<TestFormat, _, _>::from_root(root, Rec::default(), arena.clone()) };
    assert_eq!(s.inspect().count_tables(), 4 + 7);
    assert_eq!(s.translate(VirtAddr(G1)).unwrap().pa, PhysAddr(0));
    drop(s);
    assert_eq!(arena.live(), 0);
}

#[test]
fn into_parts_keeps_the_tables_and_from_root_takes_them_back() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        8 * M2,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    )
    .unwrap();
    // SAFETY: `Rec` installs nothing.
    unsafe { s.install() };
    let (root, mmu, arena) = s.into_parts();
    assert_eq!(arena.live(), 4 + 7);
    assert_eq!(arena.frees(), 0);
    // SAFETY: the tables given up above, owned by nothing now; `Rec`
    // installs nothing.
    let s = unsafe { Space::<4>::from_root(root, mmu, arena) };
    assert!(!s.inspect().is_active());
    assert_eq!(s.inspect().count_tables(), 4 + 7);
    assert_eq!(
        s.translate(VirtAddr(G1 + 5 * K4)).unwrap().pa,
        PhysAddr(5 * K4)
    );
}

#[test]
fn entry_reads_the_raw_entry_at_each_height() {
    let mut s = space::<4>();
    s.map(
        VirtAddr(G1),
        PhysAddr(0),
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    let leaf = s.translate(VirtAddr(G1)).unwrap().entry;
    assert_eq!(s.inspect().entry(VirtAddr(G1), 1), Some(leaf));
    assert!(matches!(
        TestFormat::<4>::decode(s.inspect().entry(VirtAddr(G1), 2).unwrap(), 2),
        pgtable_core::contract::Decoded::Table(_)
    ));
    // No table below a block, none past the levels, none outside the
    // address space.
    assert_eq!(s.inspect().entry(VirtAddr(G1), 0), None);
    assert_eq!(s.inspect().entry(VirtAddr(G1), 4), None);
    assert_eq!(s.inspect().entry(VirtAddr(1 << 60), 3), None);
    // An empty entry of an existing table reads 0.
    assert_eq!(s.inspect().entry(VirtAddr(G1 + M2), 1), Some(0));
}

#[test]
fn a_table_frame_the_format_cannot_encode_is_never_linked() {
    let mut s = AddressSpace::<Pa12, _, _>::new(Rec::default(), Arena::new()).unwrap();
    // Physical 0 is encodable; the PUD table the mapping needs is not.
    let err = s
        .map(
            VirtAddr(G1),
            PhysAddr(0),
            K4,
            Prot::READ_ONLY,
            MapOptions::PAGES,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::PhysOutOfRange(pa) if pa.0 >= K4),
        "{err:?}"
    );
    assert_eq!(
        s.inspect().entry(VirtAddr(G1), 3),
        Some(0),
        "root entry written"
    );
    assert_eq!(
        (s.inspect().count_tables(), s.alloc().live()),
        (1, 1),
        "frames leaked"
    );
}
