//! Cases at the last entries of each half of the address space.
//!
//! The last pages below the top of the lower half (`2^(VA_BITS - 1)`) and
//! below the top of the upper half (`2^64`) sit at the last index of every
//! table on their path (of the half's part of the root, where `VA_BITS`
//! leaves the root partly used); the pages just below the middle of each
//! half sit at the last indices of every table below the highest one whose
//! index differs from the end's: the root, or with one root entry per half
//! (16 KiB pages, 48 bits) the level below it. The addresses come from
//! [`Format::VA_BITS`](crate::Format::VA_BITS), so the same cases reach
//! 0x7fff_ffff_f000 with 4-level x86 paging and 0x00ff_ffff_ffff_f000 (far
//! above 2^47) with 5-level paging.
//!
//! Each case touches a page before the operation, so the TLB holds its
//! old translation, and checks after the operation that the MMU sees the
//! new state: an unmapped page faults, a page made read-only refuses
//! stores, a moved page faults at its old address and reads its data at
//! the new one. A flush that invalidates the wrong address (for instance
//! one truncated to 48 bits under 5-level paging) leaves the old
//! translation in use, and the probe after the operation fails.
//!
//! The pages must be unmapped when a case starts (a machine whose own
//! mappings sit there gets `skip`); a case unmaps them again however it
//! ends.

use super::{ensure, fail, pattern, skip, Ctx, Machine, R};
use crate::contract::level::page_size;
use crate::{Arch, MapOptions, Mmu, MoveOptions, Prot, TableAlloc, VaRange, VirtAddr};

/// Runs the cases in both halves.
pub(crate) fn all<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) {
    for half in [Half::Lower, Half::Upper] {
        let h = half.name();
        cx.case(
            format_args!("last_entries_of_the_{h}_half_change_protection"),
            |cx| guarded(cx, half, protect),
        );
        cx.case(format_args!("last_entries_of_the_{h}_half_move"), |cx| {
            guarded(cx, half, moves)
        });
        cx.case(format_args!("last_entries_of_the_{h}_half_unmap"), |cx| {
            guarded(cx, half, unmap)
        });
    }
}

/// One half of the canonical address space.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Half {
    /// `[0, 2^(VA_BITS - 1))`.
    Lower,
    /// `[2^64 - 2^(VA_BITS - 1), 2^64)`.
    Upper,
}

impl Half {
    fn name(self) -> &'static str {
        match self {
            Half::Lower => "lower",
            Half::Upper => "upper",
        }
    }
}

/// Pages a case may map at the end of a half.
const END_PAGES: u64 = 4;
/// Pages a case may map below the middle of a half.
const MID_PAGES: u64 = 3;

/// Where a case works in one half of format `A`'s address space.
#[derive(Clone, Copy, Debug)]
struct Place {
    /// The last [`END_PAGES`] pages of the half.
    end: u64,
    /// The last [`MID_PAGES`] pages below the middle of the half.
    mid: u64,
}

impl Place {
    fn of<A: Arch>(half: Half) -> Place {
        let pg = page_size::<A>();
        let size = 1u64 << (A::VA_BITS - 1);
        let base = match half {
            Half::Lower => 0,
            Half::Upper => size.wrapping_neg(),
        };
        // One past the last byte of the half: 0 stands for 2^64.
        let top = base.wrapping_add(size);
        Place {
            end: top.wrapping_sub(END_PAGES * pg),
            mid: base + size / 2 - MID_PAGES * pg,
        }
    }
}

/// Runs `body` on the pages of `half` when they are free, and unmaps them
/// again if it fails.
fn guarded<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    half: Half,
    body: fn(&mut Ctx<'_, A, M, T, H>, Place) -> R,
) -> R {
    let pg = cx.geo.page;
    let p = Place::of::<A>(half);
    let ranges = [(p.end, END_PAGES * pg), (p.mid, MID_PAGES * pg)];
    for (va, len) in ranges {
        if !VaRange::Both.contains::<A>(va) {
            skip!("the format has no {} half", half.name());
        }
        let mut used = None;
        if let Err(e) = cx.space.walk(VirtAddr(va), len, |m| {
            used.get_or_insert(m.va.0);
        }) {
            fail!("walk of {va:#x}+{len:#x}: {e}");
        }
        if let Some(at) = used {
            skip!("the machine maps {at:#x}, which this case needs unmapped");
        }
    }
    let r = body(cx, p);
    if r.is_err() {
        for (va, len) in ranges {
            let _ = cx.space.unmap(VirtAddr(va), len);
        }
    }
    r
}

/// Fails unless nothing is mapped at the case's pages any more.
fn left_empty<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    p: Place,
) -> R {
    let pg = cx.geo.page;
    for (va, len) in [(p.end, END_PAGES * pg), (p.mid, MID_PAGES * pg)] {
        let mut left = None;
        let _ = cx.space.walk(VirtAddr(va), len, |m| {
            left.get_or_insert(m.va.0);
        });
        if let Some(at) = left {
            fail!("the case left a mapping at {at:#x}");
        }
    }
    Ok(())
}

/// Moves `len` bytes from `from` to `to`, failing the case on error.
fn mv<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    from: u64,
    to: u64,
    len: u64,
) -> R {
    if let Err(e) =
        cx.space
            .move_page_tables(VirtAddr(from), VirtAddr(to), len, MoveOptions::DEFAULT)
    {
        fail!("move {from:#x} -> {to:#x} ({len:#x} bytes): {e}");
    }
    cx.consistent("move_page_tables")
}

/// Maps the `END_PAGES` pages at `va` read-write and stores a pattern
/// through each (caching writable translations); returns its seed.
fn map_end_pages<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    va: u64,
) -> R<u64> {
    let pg = cx.geo.page;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, END_PAGES * pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    let seed = cx.seed();
    for i in 0..END_PAGES {
        cx.write(va + i * pg, pattern(seed, i))?;
    }
    Ok(seed)
}

/// The last two pages of the half made read-only and writable again,
/// after stores through every page cached writable translations.
fn protect<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    p: Place,
) -> R {
    let pg = cx.geo.page;
    let va = p.end;
    let seed = map_end_pages(cx, va)?;
    let ro = va + 2 * pg;
    cx.protect(ro, 2 * pg, Prot::READ_ONLY)?;
    for i in 0..END_PAGES {
        let page = va + i * pg;
        cx.expect(page, pattern(seed, i))?;
        if page >= ro {
            // A stale writable translation would take this store.
            cx.write_faults(page)?;
            cx.expect(page, pattern(seed, i))?;
        } else {
            cx.write(page + 8, i)?;
        }
    }
    // Back to writable: a stale read-only translation would refuse this.
    cx.protect(ro, 2 * pg, Prot::READ_WRITE)?;
    for i in 2..END_PAGES {
        let page = va + i * pg;
        cx.write(page, !pattern(seed, i))?;
        cx.expect(page, !pattern(seed, i))?;
    }
    cx.unmap(va, END_PAGES * pg)?;
    left_empty(cx, p)
}

/// The last two pages of the half moved below its middle and back, each
/// move after loads through the source cached its translations.
///
/// A neighbour page stays mapped in each PTE table, so neither table
/// empties and the moves go entry by entry: a move that empties a source
/// table mutually aligned with its destination moves the table itself,
/// and the flush of its whole span becomes a full flush past the ceiling,
/// which would hide a wrong per-page flush.
fn moves<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>, p: Place) -> R {
    let pg = cx.geo.page;
    let n = 2;
    let end = p.end + (END_PAGES - n) * pg;
    let mid = p.mid + (MID_PAGES - n) * pg;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(
        p.end,
        pa,
        END_PAGES * pg,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )?;
    let pa_end = pa + (END_PAGES - n) * pg;
    let pa_mid = cx.ram.pa_for(0, END_PAGES * pg);
    cx.map(p.mid, pa_mid, pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    let seed = cx.seed();
    for i in 0..n {
        cx.write(end + i * pg, pattern(seed, i))?;
    }
    for (from, to) in [(end, mid), (mid, end)] {
        for i in 0..n {
            cx.expect(from + i * pg, pattern(seed, i))?;
        }
        mv(cx, from, to, n * pg)?;
        ensure!(
            cx.pa(to) == Some(pa_end) && cx.pa(from).is_none(),
            "after the move {from:#x} -> {to:#x} the tables disagree"
        );
        for i in 0..n {
            // A stale translation of the old address would still read.
            cx.read_faults(from + i * pg)?;
            cx.expect(to + i * pg, pattern(seed, i))?;
        }
        cx.write_faults(from)?;
    }
    cx.unmap(p.end, END_PAGES * pg)?;
    cx.unmap(p.mid, pg)?;
    left_empty(cx, p)
}

/// The last pages of the half unmapped in two steps, each after loads and
/// stores cached their translations.
fn unmap<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>, p: Place) -> R {
    let pg = cx.geo.page;
    let va = p.end;
    let seed = map_end_pages(cx, va)?;
    // The last two pages first: the first two keep their tables alive.
    let tail = va + 2 * pg;
    cx.unmap(tail, 2 * pg)?;
    for i in 0..END_PAGES {
        let page = va + i * pg;
        if page >= tail {
            // A stale translation would still read and write.
            cx.read_faults(page)?;
            cx.write_faults(page)?;
        } else {
            cx.expect(page, pattern(seed, i))?;
        }
    }
    // The rest, which frees the tables on the path as well.
    cx.unmap(va, 2 * pg)?;
    for i in 0..END_PAGES {
        cx.read_faults(va + i * pg)?;
    }
    left_empty(cx, p)
}
