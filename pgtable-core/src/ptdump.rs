//! The page-table dump (Linux `ptdump`): see [`PtDump`].

use core::fmt;

use crate::contract::level::{entry_end, size};
use crate::space::walker::{Next, Span, TableRef};
use crate::{AddressSpace, Arch, Error, Level, MemType, Mmu, Prot, TableAlloc, VaRange, VirtAddr};

/// A read-only, human-readable dump of an address space's tables, in the
/// style of Linux's `ptdump` (`/sys/kernel/debug/kernel_page_tables`, Linux
/// `ptdump_walk_pgd` with the arm64 and x86 `note_page` printers).
///
/// [`AddressSpace::ptdump`] returns this value; it implements
/// [`fmt::Display`]: formatting it walks the tables and writes one line per
/// *range* of entries that look the same, so it works without an allocator
/// (`no_std`, into any [`core::fmt::Write`]) and reads only what it prints.
/// The walk is a plain read of the tables through the [`Format`](crate::Format) methods
/// ([`decode`](crate::Format::decode), [`leaf_prot`](crate::Format::leaf_prot),
/// [`is_young`](crate::Format::is_young), [`is_dirty`](crate::Format::is_dirty),
/// [`swp_value`](crate::Format::swp_value)): nothing is written, no accessed or
/// dirty state is cleared, no TLB is flushed.
///
/// # What it prints
///
/// ```text
/// ---[ linear map ]---
/// 0xffff800000000000-0xffff800000600000     6M      3 x PMD 2M    RW NX K  G A D WB
/// 0xffff800000600000-0xffff800000608000    32K      8 x PTE 4K    ro x  K nG A   DEV
/// 0xffff800000608000-0xffff80000060a000     8K      2 x PTE 4K    swap 0x11-0x12
/// ```
///
/// Each line is one range: its first and its exclusive end virtual
/// address (the end of a range that reaches the top of the 64-bit space
/// prints as `0x10000000000000000`), its size in the largest binary unit
/// that divides it exactly (`K`, `M`, `G`, `T`, `P`), the number of entries
/// and their level (Linux names: `PTE`, `PMD`, `PUD`, `P4D`, `PGD` for a
/// block in the root table) and the bytes one entry maps, then:
///
/// - for a leaf (a page or a block): `RW` or `ro` (writable; `--` for a
///   [`Prot::NONE`](crate::Prot::NONE) leaf, which no access may use), `x` or `NX`
///   (executable), `U` or `K` (user or kernel only), `G` or `nG` (global or
///   tagged with an address-space identifier; spelt out both ways, as
///   arm64's ptdump does, so a column is never blank), `A` if accessed
///   (young) and `D` if dirty (blank otherwise, as Linux prints absent
///   bits), and the memory type: `WB` normal write-back, `NC` normal
///   non-cacheable, `DEV` device;
/// - for a software (swap) entry ([`Format::swp_entry`](crate::Format::swp_entry)): `swap` and its
///   value, or the first and the last value of the range;
/// - for any other non-zero entry the walker ignores: `invalid` and its raw
///   value.
///
/// Consecutive leaves share a line when they are at the same level, have
/// the same protection, accessed and dirty state and memory type, and map
/// contiguous physical memory (each one starts where the previous one
/// ended). Consecutive software entries share a line when they are at the
/// same level and their values count up by one; other invalid entries when
/// their raw values are equal. A hole (empty entries) ends a range and is
/// not printed, unlike Linux, which prints holes as lines without
/// attributes: a kernel's dump stays a screenful.
///
/// The attributes are the leaf's own ([`Format::leaf_prot`](crate::Format::leaf_prot)); restrictions
/// that table entries above it add ([`Format::table_limits`](crate::Format::table_limits), arm64
/// `APTable`/`UXNTable`/`PXNTable`, x86 U/S and R/W at every level) are not
/// folded in.
///
/// # Section headers
///
/// [`markers`](PtDump::markers) takes named addresses in ascending order, like Linux's
/// `address_markers`: before the first range at or after a marker's address
/// the dump writes `---[ name ]---`, and no range of several entries
/// continues past a marker (one block may contain it). The
/// marker of the section the dump starts in is written first; markers at or
/// past the end of the dump are not written.
///
/// # Example
///
/// ```
/// # #[cfg(feature = "alloc")] {
/// use core::fmt::Write;
/// use pgtable_core::test_format::TestFormat;
/// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
/// use pgtable_core::contract::{Arena, NoopMmu};
///
/// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
/// let va = VirtAddr(1 << 30);
/// space.map(va, PhysAddr(0x8000_0000), 4 << 20, Prot::READ_WRITE, MapOptions::BLOCKS).unwrap();
/// space.map(VirtAddr(va.0 + (4 << 20)), PhysAddr(0x9000_0000), 0x3000, Prot::READ_EXEC,
///           MapOptions::PAGES).unwrap();
///
/// // Any `core::fmt::Write` will do; a kernel would hand it its console.
/// let mut out = String::new();
/// write!(out, "{}", space.ptdump().markers(&[(va, "data")])).unwrap();
/// assert_eq!(
///     out,
///     "---[ data ]---\n\
///      0x0000000040000000-0x0000000040400000     4M      2 x PMD 2M    RW NX K nG     WB\n\
///      0x0000000040400000-0x0000000040403000    12K      3 x PTE 4K    ro x  K nG     WB\n"
/// );
/// # }
/// ```
#[must_use = "the tables are read only when the dump is formatted"]
pub struct PtDump<'a, A: Arch, M: Mmu, T: TableAlloc> {
    space: &'a AddressSpace<A, M, T>,
    /// `Some((start, end))` for a range (`end` 0 for the top of the 64-bit
    /// space); `None` for everything the space translates.
    range: Option<(u64, u64)>,
    markers: &'a [(VirtAddr, &'a str)],
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// A dump of everything the space translates (its
    /// [`va_range`](Self::va_range)), one line per range of like entries;
    /// see [`PtDump`] for the format, [`PtDump::range`] for part of the
    /// space and [`PtDump::markers`] for section headers. The tables are
    /// read when the result is formatted, not before.
    pub fn ptdump(&self) -> PtDump<'_, A, M, T> {
        PtDump {
            space: self,
            range: None,
            markers: &[],
        }
    }
}

impl<'a, A: Arch, M: Mmu, T: TableAlloc> PtDump<'a, A, M, T> {
    /// The same dump of `[va, va + len)` only. Ranges are cut at its
    /// ends: a block that starts below `va` prints from `va`.
    ///
    /// # Errors
    ///
    /// Misaligned or zero length, or a range outside the address space.
    pub fn range(self, va: VirtAddr, len: u64) -> Result<Self, Error> {
        let end = self.space.check_range(va, len)?;
        Ok(PtDump {
            range: Some((va.0, end)),
            ..self
        })
    }

    /// The same dump with section headers: each `(address, name)` of
    /// `markers` (in ascending address order) is written as
    /// `---[ name ]---` before the first range at or after its address
    /// (see [Section headers](PtDump#section-headers)).
    pub fn markers(self, markers: &'a [(VirtAddr, &'a str)]) -> Self {
        PtDump { markers, ..self }
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> fmt::Display for PtDump<'_, A, M, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The pieces of the virtual address space to walk, each
        // `[start, end)` inside one half (`end` 0: the top of the space).
        let half = 1u64 << (A::VA_BITS - 1);
        let pieces: [Option<(u64, u64)>; 2] = match (self.range, self.space.range) {
            (Some(r), _) => [Some(r), None],
            (None, VaRange::Both) => [Some((0, half)), Some((half.wrapping_neg(), 0))],
            (None, r) => {
                let (first, last) = r.bounds::<A>();
                [Some((first, last.wrapping_add(1))), None]
            }
        };
        let start = pieces[0].map_or(0, |p| p.0);
        let mut out = Printer {
            f,
            levels: A::LEVELS,
            size: size::<A>,
            markers: self.markers,
            next_marker: 0,
            run: None,
        };
        out.begin(start)?;
        for (start, end) in pieces.into_iter().flatten() {
            out.walk(self.space, start, end)?;
        }
        let end = pieces.into_iter().flatten().last().map_or(0, |p| p.1);
        out.finish(end)
    }
}

/// What one entry (or one range of like entries) is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Pages or blocks; `pa` is the output address of the next entry that
    /// would continue the range.
    Leaf {
        pa: u64,
        prot: Prot,
        young: bool,
        dirty: bool,
    },
    /// Software entries with values `first..=last`.
    Swap { first: u64, last: u64 },
    /// Other invalid entries, all equal to `raw`.
    Invalid { raw: u64 },
}

/// A range being collected: `count` entries at `height` from `start`.
struct Run {
    start: u64,
    count: u64,
    height: u32,
    /// Bytes one entry at `height` maps.
    size: u64,
    kind: Kind,
}

impl Run {
    /// The exclusive end of the range (2^64 for the top of the space).
    fn end(&self) -> u128 {
        self.start as u128 + self.count as u128 * self.size as u128
    }

    /// Adds the entry at `va` to the range if it continues it.
    fn extend(&mut self, va: u64, height: u32, kind: Kind) -> bool {
        if height != self.height || va as u128 != self.end() {
            return false;
        }
        let step = self.size;
        let next = match (self.kind, kind) {
            (
                Kind::Leaf {
                    pa,
                    prot,
                    young,
                    dirty,
                },
                Kind::Leaf {
                    pa: p,
                    prot: q,
                    young: y,
                    dirty: d,
                },
            ) if pa + step == p && prot == q && young == y && dirty == d => Kind::Leaf {
                pa: p,
                prot,
                young,
                dirty,
            },
            (Kind::Swap { first, last }, Kind::Swap { first: v, .. })
                if last.wrapping_add(1) == v =>
            {
                Kind::Swap { first, last: v }
            }
            (Kind::Invalid { raw }, Kind::Invalid { raw: r }) if raw == r => kind,
            _ => return false,
        };
        self.kind = next;
        self.count += 1;
        true
    }
}

/// The walk's output state: the range being collected and the next
/// section header.
struct Printer<'f, 'g, 'm> {
    f: &'f mut fmt::Formatter<'g>,
    /// The format's number of levels, for the level names.
    levels: u32,
    /// The format's entry size at a height (`level::size`).
    size: fn(u32) -> u64,
    markers: &'m [(VirtAddr, &'m str)],
    next_marker: usize,
    run: Option<Run>,
}

impl Printer<'_, '_, '_> {
    /// Writes the header of the section `start` lies in and skips the
    /// markers before it.
    fn begin(&mut self, start: u64) -> fmt::Result {
        while self
            .markers
            .get(self.next_marker)
            .is_some_and(|m| m.0 .0 <= start)
        {
            self.next_marker += 1;
        }
        match self.next_marker.checked_sub(1) {
            Some(i) => self.header(i),
            None => Ok(()),
        }
    }

    /// Ends the dump at `end` (0: the top of the space): the last range,
    /// then the markers below `end`.
    fn finish(&mut self, end: u64) -> fmt::Result {
        self.flush()?;
        while let Some(m) = self.markers.get(self.next_marker) {
            if end != 0 && m.0 .0 >= end {
                break;
            }
            self.header(self.next_marker)?;
            self.next_marker += 1;
        }
        Ok(())
    }

    fn header(&mut self, i: usize) -> fmt::Result {
        writeln!(self.f, "---[ {} ]---", self.markers[i].1)
    }

    /// Walks `[start, end)` of `space`'s tables.
    fn walk<A: Arch, M: Mmu, T: TableAlloc>(
        &mut self,
        space: &AddressSpace<A, M, T>,
        start: u64,
        end: u64,
    ) -> fmt::Result {
        let mut cur = space.cursor(start, end);
        while let Some(span) = cur.span() {
            match self.span(space, span)? {
                Some((child, va)) => cur.descend(child, va),
                None => {
                    cur.advance(span.next);
                }
            }
        }
        Ok(())
    }

    /// Adds the entries of `span` up to its first table entry, and returns
    /// that entry's table and first address (`None`: the span is done).
    /// The loads are snapshots: the walker may set A/D concurrently and
    /// the dump shows whichever value it sees.
    fn span<'a, A: Arch, M: Mmu, T: TableAlloc>(
        &mut self,
        space: &'a AddressSpace<A, M, T>,
        span: Span<'a, A>,
    ) -> Result<Option<(TableRef<'a>, u64)>, fmt::Error> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        for i in span.from..span.to {
            let next = entry_end::<A>(va, height, end);
            let kind = match space.read(t, i, height) {
                (_, Next::None) => None,
                (_, Next::Table(c)) => return Ok(Some((c, va))),
                (raw, Next::Leaf(pa)) => Some(Kind::Leaf {
                    // A range form may start inside a block.
                    pa: pa.0 + (va & (size::<A>(height) - 1)),
                    prot: A::leaf_prot(raw, height),
                    young: A::is_young(raw),
                    dirty: A::is_dirty(raw),
                }),
                (raw, Next::Invalid) => Some(match A::swp_value(raw) {
                    Some(v) => Kind::Swap { first: v, last: v },
                    None => Kind::Invalid { raw },
                }),
            };
            if let Some(kind) = kind {
                self.entry(va, next, height, kind)?;
            }
            va = next;
        }
        Ok(None)
    }

    /// Adds the entry (or the part of it in the dump) `[va, next)`.
    fn entry(&mut self, va: u64, next: u64, height: u32, kind: Kind) -> fmt::Result {
        while let Some(m) = self.markers.get(self.next_marker) {
            if m.0 .0 > va {
                break;
            }
            self.flush()?;
            self.header(self.next_marker)?;
            self.next_marker += 1;
        }
        let len = next.wrapping_sub(va);
        if len != (self.size)(height) {
            // A part of a block, cut by the range form: printed on its own.
            self.flush()?;
            return self.line(va, len as u128, 1, height, kind);
        }
        if let Some(run) = &mut self.run {
            if run.extend(va, height, kind) {
                return Ok(());
            }
        }
        self.flush()?;
        self.run = Some(Run {
            start: va,
            count: 1,
            height,
            size: (self.size)(height),
            kind,
        });
        Ok(())
    }

    /// Writes the range being collected, if any.
    fn flush(&mut self) -> fmt::Result {
        match self.run.take() {
            Some(r) => {
                let len = r.end() - r.start as u128;
                self.line(r.start, len, r.count, r.height, r.kind)
            }
            None => Ok(()),
        }
    }

    fn line(&mut self, start: u64, len: u128, count: u64, height: u32, kind: Kind) -> fmt::Result {
        let f = &mut *self.f;
        write!(
            f,
            "{:#018x}-{:#018x} {:>6} {:>6} x {} {:<4}  ",
            start,
            start as u128 + len,
            Human(len),
            count,
            level_name(Level::at_height(height, self.levels)),
            Human((self.size)(height) as u128),
        )?;
        match kind {
            Kind::Leaf {
                prot, young, dirty, ..
            } => writeln!(
                f,
                "{} {} {} {} {} {} {}",
                match (prot.protnone(), prot.writable()) {
                    (true, _) => "--",
                    (_, true) => "RW",
                    _ => "ro",
                },
                if prot.executable() { "x " } else { "NX" },
                if prot.user() { "U" } else { "K" },
                if prot.global() { " G" } else { "nG" },
                if young { "A" } else { " " },
                if dirty { "D" } else { " " },
                match prot.mem() {
                    MemType::Normal => "WB",
                    MemType::NormalNonCacheable => "NC",
                    MemType::Device => "DEV",
                },
            ),
            Kind::Swap { first, last } if first == last => writeln!(f, "swap {first:#x}"),
            Kind::Swap { first, last } => writeln!(f, "swap {first:#x}-{last:#x}"),
            Kind::Invalid { raw } => writeln!(f, "invalid {raw:#018x}"),
        }
    }
}

/// A level's Linux name, upper case.
fn level_name(level: Level) -> &'static str {
    match level {
        Level::Pte => "PTE",
        Level::Pmd => "PMD",
        Level::Pud => "PUD",
        Level::P4d => "P4D",
        Level::Pgd => "PGD",
    }
}

/// A byte count in the largest binary unit that divides it exactly
/// (`4K`, `6M`, `1G`), padded to the formatter's width.
struct Human(u128);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut n = self.0;
        let mut unit = 0;
        while n != 0 && n % 1024 == 0 && unit < 6 {
            n /= 1024;
            unit += 1;
        }
        let suffix = ["B", "K", "M", "G", "T", "P", "E"][unit];
        let mut digits = 1;
        let mut m = n;
        while m >= 10 {
            m /= 10;
            digits += 1;
        }
        let pad = f.width().unwrap_or(0).saturating_sub(digits + 1);
        let left = matches!(f.align(), Some(fmt::Alignment::Left));
        if !left {
            write!(f, "{:pad$}", "")?;
        }
        write!(f, "{n}{suffix}")?;
        if left {
            write!(f, "{:pad$}", "")?;
        }
        Ok(())
    }
}
