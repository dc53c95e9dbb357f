//! `AddressSpace::ptdump`: the exact text of the dump on the test format
//! (merged ranges, splits, block sizes, attributes, software entries,
//! markers, the range form) and formatting into a fixed `core::fmt::Write`
//! buffer, as a `no_std` kernel does.
#![cfg(feature = "alloc")]

use core::fmt::{self, Write};
use pgtable_core::contract::NewPte;

use pgtable_core::contract::{Arena, NoopMmu};
use pgtable_core::test_format::TestFormat;
use pgtable_core::{AddressSpace, Error, MapOptions, MemType, PhysAddr, Prot, VaRange, VirtAddr};

type Space<const L: u32> = AddressSpace<TestFormat<L>, NoopMmu, Arena>;

const K4: u64 = 4096;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

fn space<const L: u32>() -> Space<L> {
    AddressSpace::new(NoopMmu, Arena::new()).expect("root")
}

fn map<const L: u32>(s: &mut Space<L>, va: u64, pa: u64, len: u64, prot: Prot, o: MapOptions) {
    s.map(VirtAddr(va), PhysAddr(pa), len, prot, o)
        .expect("map");
}

/// The dump as a `String`, and the lines it holds.
fn dump<const L: u32>(s: &Space<L>) -> String {
    s.ptdump().to_string()
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[test]
fn ptdump_merges_like_entries_one_line_per_level() {
    let mut s = space::<4>();
    // 1 GiB + 4 MiB + 12 KiB, physically contiguous: one PUD block, two
    // PMD blocks, three pages.
    let len = G1 + 2 * M2 + 3 * K4;
    map(
        &mut s,
        G1,
        2 * G1,
        len,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    );
    assert_eq!(
        lines(&dump(&s)),
        [
            "0x0000000040000000-0x0000000080000000     1G      1 x PUD 1G    RW NX K nG     WB",
            "0x0000000080000000-0x0000000080400000     4M      2 x PMD 2M    RW NX K nG     WB",
            "0x0000000080400000-0x0000000080403000    12K      3 x PTE 4K    RW NX K nG     WB",
        ]
    );
}

#[test]
fn ptdump_merges_across_tables() {
    let mut s = space::<4>();
    // 600 pages cross from one PTE table into the next (and 2 MiB later
    // a PMD table boundary does not matter either): still one range.
    map(
        &mut s,
        M2 - 100 * K4,
        0x10_0000,
        600 * K4,
        Prot::READ_ONLY,
        MapOptions::PAGES,
    );
    assert_eq!(
        dump(&s),
        "0x000000000019c000-0x00000000003f4000  2400K    600 x PTE 4K    ro NX K nG     WB\n"
    );
}

#[test]
fn ptdump_splits_at_attribute_changes() {
    let mut s = space::<4>();
    let va = 0x40_0000;
    map(
        &mut s,
        va,
        0x80_0000,
        8 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    s.change_protection(VirtAddr(va + 3 * K4), 2 * K4, Prot::READ_EXEC)
        .expect("protect");
    assert_eq!(
        lines(&dump(&s)),
        [
            "0x0000000000400000-0x0000000000403000    12K      3 x PTE 4K    RW NX K nG     WB",
            "0x0000000000403000-0x0000000000405000     8K      2 x PTE 4K    ro x  K nG     WB",
            "0x0000000000405000-0x0000000000408000    12K      3 x PTE 4K    RW NX K nG     WB",
        ]
    );
}

#[test]
fn ptdump_splits_at_discontiguous_output_and_holes() {
    let mut s = space::<4>();
    let va = 0x40_0000;
    // Two pages, then two more right after them in VA but not in PA.
    map(
        &mut s,
        va,
        0x80_0000,
        2 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    map(
        &mut s,
        va + 2 * K4,
        0x90_0000,
        2 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    // A hole of one page, then a page whose PA would continue the last one.
    map(
        &mut s,
        va + 5 * K4,
        0x90_3000,
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    // Two PMD blocks, contiguous in VA, not in PA.
    map(
        &mut s,
        G1,
        0x4000_0000,
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    );
    map(
        &mut s,
        G1 + M2,
        0x4080_0000,
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    );
    assert_eq!(
        lines(&dump(&s)),
        [
            "0x0000000000400000-0x0000000000402000     8K      2 x PTE 4K    RW NX K nG     WB",
            "0x0000000000402000-0x0000000000404000     8K      2 x PTE 4K    RW NX K nG     WB",
            "0x0000000000405000-0x0000000000406000     4K      1 x PTE 4K    RW NX K nG     WB",
            "0x0000000040000000-0x0000000040200000     2M      1 x PMD 2M    RW NX K nG     WB",
            "0x0000000040200000-0x0000000040400000     2M      1 x PMD 2M    RW NX K nG     WB",
        ]
    );
}

#[test]
fn ptdump_shows_user_global_and_memory_type() {
    let mut s = space::<4>();
    let cases = [
        Prot::WRITE | Prot::USER | Prot::EXEC,
        Prot::GLOBAL,
        Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable),
        Prot::WRITE | Prot::GLOBAL.with_mem(MemType::Device),
    ];
    for (i, p) in (0u64..).zip(cases) {
        // Physically contiguous, so only the attributes split the lines.
        map(
            &mut s,
            0x40_0000 + i * K4,
            0x80_0000 + i * K4,
            K4,
            p,
            MapOptions::PAGES,
        );
    }
    assert_eq!(
        lines(&dump(&s)),
        [
            "0x0000000000400000-0x0000000000401000     4K      1 x PTE 4K    RW x  U nG     WB",
            "0x0000000000401000-0x0000000000402000     4K      1 x PTE 4K    ro NX K  G     WB",
            "0x0000000000402000-0x0000000000403000     4K      1 x PTE 4K    RW NX K nG     NC",
            "0x0000000000403000-0x0000000000404000     4K      1 x PTE 4K    RW NX K  G     DEV",
        ]
    );
}

#[test]
fn ptdump_shows_software_entries_with_their_values() {
    let mut s = space::<4>();
    let va = 0x40_0000;
    for (i, v) in (0u64..).zip([0x10, 0x11, 0x12, 0x20]) {
        s.install_pte(VirtAddr(va + i * K4), NewPte::Swap(v))
            .expect("swap entry");
    }
    // A leaf right after them is its own range.
    map(
        &mut s,
        va + 4 * K4,
        0x80_0000,
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    assert_eq!(
        lines(&dump(&s)),
        [
            "0x0000000000400000-0x0000000000403000    12K      3 x PTE 4K    swap 0x10-0x12",
            "0x0000000000403000-0x0000000000404000     4K      1 x PTE 4K    swap 0x20",
            "0x0000000000404000-0x0000000000405000     4K      1 x PTE 4K    RW NX K nG     WB",
        ]
    );
}

#[test]
fn ptdump_of_an_empty_space_is_empty() {
    let s = space::<4>();
    assert_eq!(dump(&s), "");
    // Markers still head their (empty) sections, except past the end.
    let markers = [
        (VirtAddr(0), "user"),
        (VirtAddr(0xffff_8000_0000_0000), "kernel"),
    ];
    assert_eq!(
        s.ptdump().markers(&markers).to_string(),
        "---[ user ]---\n---[ kernel ]---\n"
    );
    let r = s.ptdump().range(VirtAddr(0), G1).expect("range");
    assert_eq!(r.markers(&markers).to_string(), "---[ user ]---\n");
}

#[test]
fn ptdump_markers_head_sections_and_cut_ranges() {
    let mut s = space::<4>();
    let va = 0x40_0000;
    map(
        &mut s,
        va,
        0x80_0000,
        4 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    map(&mut s, G1, G1, M2, Prot::READ_ONLY, MapOptions::BLOCKS);
    let markers = [
        (VirtAddr(va), "first"),
        (VirtAddr(va + 2 * K4), "second"),
        (VirtAddr(0x100_0000), "empty"),
        (VirtAddr(G1), "block"),
    ];
    assert_eq!(
        lines(&s.ptdump().markers(&markers).to_string()),
        [
            "---[ first ]---",
            "0x0000000000400000-0x0000000000402000     8K      2 x PTE 4K    RW NX K nG     WB",
            "---[ second ]---",
            "0x0000000000402000-0x0000000000404000     8K      2 x PTE 4K    RW NX K nG     WB",
            "---[ empty ]---",
            "---[ block ]---",
            "0x0000000040000000-0x0000000040200000     2M      1 x PMD 2M    ro NX K nG     WB",
        ]
    );
    // A range that starts inside a section is headed by that section.
    let r = s.ptdump().range(VirtAddr(va + 3 * K4), K4).expect("range");
    assert_eq!(
        r.markers(&markers).to_string(),
        "---[ second ]---\n\
         0x0000000000403000-0x0000000000404000     4K      1 x PTE 4K    RW NX K nG     WB\n"
    );
}

#[test]
fn ptdump_range_cuts_blocks_at_its_ends() {
    let mut s = space::<4>();
    map(
        &mut s,
        G1,
        2 * G1,
        3 * M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    );
    // From the middle of the first block to the middle of the third.
    let r = s
        .ptdump()
        .range(VirtAddr(G1 + M2 / 2), 2 * M2)
        .expect("range");
    assert_eq!(
        lines(&r.to_string()),
        [
            "0x0000000040100000-0x0000000040200000     1M      1 x PMD 2M    RW NX K nG     WB",
            "0x0000000040200000-0x0000000040400000     2M      1 x PMD 2M    RW NX K nG     WB",
            "0x0000000040400000-0x0000000040500000     1M      1 x PMD 2M    RW NX K nG     WB",
        ]
    );
    assert_eq!(
        s.ptdump().range(VirtAddr(G1 + 1), K4).err(),
        Some(Error::MisalignedVirt(VirtAddr(G1 + 1)))
    );
    assert_eq!(
        s.ptdump().range(VirtAddr(G1), 0).err(),
        Some(Error::ZeroLength)
    );
    assert_eq!(
        s.ptdump().range(VirtAddr(1 << 47), K4).err(),
        Some(Error::OutOfRange(VirtAddr(1 << 47)))
    );
}

#[test]
fn ptdump_prints_upper_half_addresses_and_the_top_of_the_space() {
    let mut s = space::<4>();
    let base = 0xffff_8000_0000_0000;
    map(
        &mut s,
        base,
        0x1000_0000,
        M2,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    );
    map(
        &mut s,
        u64::MAX - K4 + 1,
        0x2000_0000,
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    map(
        &mut s,
        0,
        0x3000_0000,
        K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    assert_eq!(
        lines(&dump(&s)),
        [
            "0x0000000000000000-0x0000000000001000     4K      1 x PTE 4K    RW NX K nG     WB",
            "0xffff800000000000-0xffff800000200000     2M      1 x PMD 2M    RW NX K nG     WB",
            "0xfffffffffffff000-0x10000000000000000     4K      1 x PTE 4K    RW NX K nG     WB",
        ]
    );
}

#[test]
fn ptdump_of_a_half_walks_only_that_half() {
    let mut k = Space::<4>::new_in(VaRange::Upper, NoopMmu, Arena::new()).expect("root");
    map(
        &mut k,
        0xffff_ffff_8000_0000,
        0x20_0000,
        2 * M2,
        Prot::READ_EXEC,
        MapOptions::BLOCKS,
    );
    assert_eq!(
        dump(&k),
        "0xffffffff80000000-0xffffffff80400000     4M      2 x PMD 2M    ro x  K nG     WB\n"
    );
}

#[test]
fn ptdump_names_the_root_level_of_a_three_level_format() {
    let mut s = space::<3>();
    // With three levels the 1 GiB entries are in the root table (PGD).
    map(&mut s, G1, G1, 2 * G1, Prot::READ_WRITE, MapOptions::BLOCKS);
    assert_eq!(
        dump(&s),
        "0x0000000040000000-0x00000000c0000000     2G      2 x PGD 1G    RW NX K nG     WB\n"
    );
}

/// A `core::fmt::Write` into a fixed buffer, as a `no_std` kernel without
/// an allocator would have.
struct FixedBuf<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> FixedBuf<N> {
    fn new() -> Self {
        FixedBuf {
            buf: [0; N],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).expect("utf-8")
    }
}

impl<const N: usize> Write for FixedBuf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let dst = self
            .buf
            .get_mut(self.len..self.len + s.len())
            .ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len += s.len();
        Ok(())
    }
}

#[test]
fn ptdump_formats_into_a_fixed_buffer() {
    let mut s = space::<4>();
    map(&mut s, G1, G1, 2 * M2, Prot::READ_WRITE, MapOptions::BLOCKS);
    s.install_pte(VirtAddr(G1 + 2 * M2), NewPte::Swap(0x7))
        .expect("swap entry");
    let mut out = FixedBuf::<256>::new();
    write!(out, "{}", s.ptdump()).expect("fits");
    assert_eq!(
        out.as_str(),
        "0x0000000040000000-0x0000000040400000     4M      2 x PMD 2M    RW NX K nG     WB\n\
         0x0000000040400000-0x0000000040401000     4K      1 x PTE 4K    swap 0x7\n"
    );
    // A buffer too small gets the formatting error, not a panic.
    let mut small = FixedBuf::<100>::new();
    assert_eq!(write!(small, "{}", s.ptdump()), Err(fmt::Error));
}

#[cfg(feature = "sim")]
#[test]
fn ptdump_shows_accessed_and_dirty_and_clears_neither() {
    use pgtable_core::sim::{Installed, SimMachine};

    type F = TestFormat<4>;
    let m = SimMachine::<F>::new();
    let s = AddressSpace::<F, _, _>::new(m.mmu(), m.alloc()).expect("root");
    // SAFETY: a `SimMmu`: only the simulated walker uses these tables.
    let mut s = unsafe { Installed::new(s) };
    let va = 0x40_0000;
    s.map(
        VirtAddr(va),
        PhysAddr(0x80_0000),
        4 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .expect("map");
    m.hw_touch(VirtAddr(va), false).expect("load");
    m.hw_touch(VirtAddr(va + K4), true).expect("store");
    let before: Vec<_> = (0..4)
        .map(|i| s.inspect().entry(VirtAddr(va + i * K4), 0))
        .collect();
    let text = s.ptdump().to_string();
    assert_eq!(
        lines(&text),
        [
            "0x0000000000400000-0x0000000000401000     4K      1 x PTE 4K    RW NX K nG A   WB",
            "0x0000000000401000-0x0000000000402000     4K      1 x PTE 4K    RW NX K nG A D WB",
            "0x0000000000402000-0x0000000000404000     8K      2 x PTE 4K    RW NX K nG     WB",
        ]
    );
    // Reading changed nothing: the same entries, the same dump, no flush.
    let after: Vec<_> = (0..4)
        .map(|i| s.inspect().entry(VirtAddr(va + i * K4), 0))
        .collect();
    assert_eq!(before, after);
    assert_eq!(s.ptdump().to_string(), text);
    let flushes = m.stats().flush_range + m.stats().flush_all;
    let _ = s.ptdump().to_string();
    assert_eq!(m.stats().flush_range + m.stats().flush_all, flushes);
}
