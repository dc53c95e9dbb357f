//! The `move_page_tables` cases, modelled on Linux's
//! `tools/testing/selftests/mm/mremap_test.c`.

use super::{ensure, fail, pattern, skip, Ctx, Geo, Human, Machine, Short, R};
use crate::{Arch, Error, MapOptions, Mmu, MoveOptions, Prot, TableAlloc, VirtAddr};

/// How source and destination are placed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Align {
    /// Both starts are odd multiples of this many bytes.
    To(u64),
    /// Both starts at the same offset inside a PMD (not PMD aligned), moved
    /// with `free_below`.
    Mutual,
}

/// A length in the format's sizes: `pages` pages plus `pmd_halves` halves
/// of a PMD entry plus `puds` PUD entries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Len {
    pages: u64,
    pmd_halves: u64,
    puds: u64,
}

impl Len {
    fn bytes(self, g: &Geo) -> u64 {
        self.pages * g.page + self.pmd_halves * (g.pmd / 2) + self.puds * g.pud
    }
}

/// The move lengths (8 KiB, 2, 4 and 5 MiB, 1 and 2 GiB with 4 KiB
/// pages): two pages, one PMD entry, two, two and a half, and with
/// [`Config::big_moves`](super::Config::big_moves) one and two PUD
/// entries. The flag marks the big ones.
const SIZES: [(Len, bool); 6] = [
    (
        Len {
            pages: 2,
            pmd_halves: 0,
            puds: 0,
        },
        false,
    ),
    (
        Len {
            pages: 0,
            pmd_halves: 2,
            puds: 0,
        },
        false,
    ),
    (
        Len {
            pages: 0,
            pmd_halves: 4,
            puds: 0,
        },
        false,
    ),
    (
        Len {
            pages: 0,
            pmd_halves: 5,
            puds: 0,
        },
        false,
    ),
    (
        Len {
            pages: 0,
            pmd_halves: 0,
            puds: 1,
        },
        true,
    ),
    (
        Len {
            pages: 0,
            pmd_halves: 0,
            puds: 2,
        },
        true,
    ),
];

/// How source and destination are placed, by name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    /// Odd multiples of a page (4 KiB with 4 KiB pages).
    Page,
    /// Odd multiples of half a PMD entry (1 MiB).
    HalfPmd,
    /// Odd multiples of a PMD entry (2 MiB).
    Pmd,
    /// Odd multiples of a PUD entry (1 GiB).
    Pud,
    /// [`Align::Mutual`].
    Mutual,
}

const ALIGNS: [Place; 5] = [
    Place::Page,
    Place::HalfPmd,
    Place::Pmd,
    Place::Pud,
    Place::Mutual,
];

/// A range of pages longer than this many pages is not mapped: its
/// last-level tables alone would take more than 4 MiB (8 bytes a page),
/// as much as the 2 GiB move of 4 KiB pages needs per range. With 16 and
/// 64 KiB pages the PUD-sized moves of pages skip.
const MAX_PAGES: u64 = 1 << 19;

/// Runs the move matrix and the move error cases.
///
/// The names give the format's sizes: `move_8k_align_4k_pages` with
/// 4 KiB pages is `move_32k_align_16k_pages` with 16 KiB pages.
pub(crate) fn all<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) {
    cx.case(format_args!("move_overlapping_fails"), move_overlap);
    cx.case(format_args!("move_misaligned_fails"), move_misaligned);
    cx.case(format_args!("move_onto_a_mapping_fails"), move_onto_mapping);
    cx.case(format_args!("move_keeps_protection"), move_keeps_protection);
    let g = cx.geo;
    for &(l, big) in &SIZES {
        if big && !cx.cfg.big_moves {
            continue;
        }
        let size = l.bytes(&g);
        let sname = Short(size);
        for &place in &ALIGNS {
            let (align, aname): (Align, &dyn core::fmt::Display) = match place {
                Place::Page => (Align::To(g.page), &Short(g.page)),
                Place::HalfPmd => (Align::To(g.pmd / 2), &Short(g.pmd / 2)),
                Place::Pmd => (Align::To(g.pmd), &"pmd"),
                Place::Pud => (Align::To(g.pud), &"pud"),
                Place::Mutual => (Align::Mutual, &"mutual"),
            };
            for blocks in [false, true] {
                // Blocks need a range that can hold one.
                if blocks && size < g.pmd {
                    continue;
                }
                let kind = if blocks { "blocks" } else { "pages" };
                cx.matrix_case(format_args!("move_{sname}_align_{aname}_{kind}"), |cx| {
                    move_case(cx, size, l.puds > 0 || place == Place::Pud, align, blocks)
                });
            }
        }
    }
}

/// The `k`-th odd multiple of `align` at or above `base`.
fn odd_multiple(base: u64, align: u64, k: u64) -> u64 {
    let mut a = base.div_ceil(align) * align;
    if (a / align) % 2 == 0 {
        a += align;
    }
    a + 2 * k * align
}

/// Maps `[va, va + len)` read-write over the RAM pool (repeatedly when the
/// pool is smaller), congruent to `va` modulo the pool's granule so blocks
/// are possible where `opts` allows them.
fn map_source<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    va: u64,
    len: u64,
    opts: MapOptions,
) -> R {
    let mut off = 0;
    while off < len {
        let pa = cx.ram.pa_for(va, off);
        let chunk = (len - off).min(cx.ram.base + cx.ram.len - pa);
        cx.map(va + off, pa, chunk, Prot::READ_WRITE, opts)?;
        off += chunk;
    }
    Ok(())
}

fn move_case<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    len: u64,
    needs_pud: bool,
    align: Align,
    blocks: bool,
) -> R {
    let g = cx.geo;
    if needs_pud && !Geo::has_pud::<A>() {
        skip!("the format has {} levels, no PUD level", A::LEVELS);
    }
    let (src, dst, opts) = placement(cx, len, align)?;
    if blocks && cx.ram.gran < g.pmd {
        skip!("the RAM pool holds no aligned {} block", Human(g.pmd));
    }
    // Blocks stay blocks only when the move keeps their offset inside a
    // PMD entry; otherwise the destination is mapped page by page.
    let paged = !blocks || (dst - src) % g.pmd != 0;
    if paged && len / g.page > MAX_PAGES {
        skip!(
            "{} of {} pages would need {} of last-level tables per range, more than the suite's {}",
            Human(len),
            Human(g.page),
            Human(len / g.page * 8),
            Human(MAX_PAGES * 8)
        );
    }
    map_moved_source(cx, src, len, blocks)?;
    let filled = fill_source(cx, src, len)?;

    let t0 = cx.mach.cycles();
    let r = cx
        .space
        .move_page_tables(VirtAddr(src), VirtAddr(dst), len, opts);
    let t1 = cx.mach.cycles();
    if let Err(e) = r {
        fail!("move {src:#x} -> {dst:#x} ({len:#x} bytes): {e}");
    }
    cx.consistent("move_page_tables")?;
    let emulated = if cx.mach.emulated() {
        " (emulated)"
    } else {
        ""
    };
    cx.note(format_args!(
        "move {src:#x} -> {dst:#x} len {len:#x}: {} cycles{emulated}",
        t1.wrapping_sub(t0)
    ));

    check_new_range(cx, dst, len, &filled)?;
    check_old_range_gone(cx, src, len)?;
    cx.unmap(dst, len)?;
    cx.read_faults(dst)
}

/// Source start, destination start and options of a move of `len` bytes
/// placed as `align` says in the window (skips when it does not fit).
fn placement<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    len: u64,
    align: Align,
) -> R<(u64, u64, MoveOptions)> {
    let Geo { page: pg, pmd, .. } = cx.geo;
    let half = cx.win_len / 2;
    let (src, dst, opts) = match align {
        Align::To(a) => (
            odd_multiple(cx.win, a, 0),
            // The next odd multiple: the offsets differ at the level above.
            odd_multiple(cx.win + half, a, 1),
            MoveOptions::DEFAULT,
        ),
        Align::Mutual => {
            let off = 37 * pg;
            (
                odd_multiple(cx.win, pmd, 0) + off,
                odd_multiple(cx.win + half, pmd, 1) + off,
                MoveOptions::DEFAULT.free_below(),
            )
        }
    };
    // In a small window, fall back to the first odd multiple.
    let dst = if dst + len > cx.win + cx.win_len {
        dst - match align {
            Align::To(a) => 2 * a,
            Align::Mutual => 2 * pmd,
        }
    } else {
        dst
    };
    if src + len > cx.win + half || dst + len > cx.win + cx.win_len {
        skip!("the window is too small for this placement");
    }
    Ok((src, dst, opts))
}

/// Maps the source of a move with pages or, when `blocks`, with blocks
/// where possible (and notes how many).
fn map_moved_source<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    src: u64,
    len: u64,
    blocks: bool,
) -> R {
    let mopts = if blocks {
        MapOptions::BLOCKS
    } else {
        MapOptions::PAGES
    };
    map_source(cx, src, len, mopts)?;
    if blocks {
        let mut leaves = 0u64;
        let mut big = 0u64;
        let _ = cx.space.walk(VirtAddr(src), len, |m| {
            leaves += 1;
            if m.height > 0 {
                big += 1;
            }
        });
        cx.note(format_args!("source: {leaves} leaves, {big} blocks"));
    }
    Ok(())
}

/// What the source held before the move.
struct Filled {
    /// The pattern's seed and the bytes filled with it.
    seed: u64,
    thr: u64,
    /// Offsets of sample words beyond the threshold, and their values.
    samples: [u64; 3],
    before: [u64; 3],
    /// The frames of the first and last words.
    pa_first: Option<u64>,
    pa_last: Option<u64>,
}

/// At most this many bytes are filled and validated under Miri, where each
/// simulated load and store costs hundreds of times more: 4 KiB (a page
/// with 4 KiB pages), and the sample words beyond it as in every run.
const MIRI_THRESHOLD: u64 = 4 << 10;

/// Fills the first `threshold` bytes of the source with the pattern,
/// through the MMU, and samples words beyond it.
fn fill_source<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    src: u64,
    len: u64,
) -> R<Filled> {
    let Geo { page: pg, .. } = cx.geo;
    let seed = cx.seed();
    let mut thr = cx.cfg.threshold_bytes.min(len).min(cx.ram.len) & !7;
    if cfg!(miri) {
        thr = thr.min(MIRI_THRESHOLD);
    }
    for i in 0..thr / 8 {
        cx.write(src + 8 * i, pattern(seed, i))?;
    }
    // Sample words beyond the threshold: the same before and after.
    let samples = [len / 2 - 8, len - pg, len - 8];
    let mut before = [0u64; 3];
    for (b, &o) in before.iter_mut().zip(&samples) {
        *b = cx.read(src + o)?;
    }
    Ok(Filled {
        seed,
        thr,
        samples,
        before,
        pa_first: cx.pa(src),
        pa_last: cx.pa(src + len - 8),
    })
}

/// The new range holds the same bytes, in the same frames, and maps all
/// of `len`.
fn check_new_range<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    dst: u64,
    len: u64,
    f: &Filled,
) -> R {
    ensure!(
        cx.pa(dst) == f.pa_first && cx.pa(dst + len - 8) == f.pa_last,
        "the new range translates to other frames than the old one did"
    );
    for i in 0..f.thr / 8 {
        let got = cx.read(dst + 8 * i)?;
        let want = pattern(f.seed, i);
        ensure!(
            got == want,
            "moved data differs at offset {:#x}: {got:#x}, expected {want:#x} (seed {:#x})",
            8 * i,
            f.seed
        );
    }
    for (&b, &o) in f.before.iter().zip(&f.samples) {
        cx.expect(dst + o, b)?;
    }
    let mut mapped = 0u64;
    let _ = cx.space.walk(VirtAddr(dst), len, |m| mapped += m.size);
    ensure!(
        mapped == len,
        "the new range maps {mapped:#x} bytes, expected {len:#x}"
    );
    Ok(())
}

/// The old range is gone, for the tables and for the MMU.
fn check_old_range_gone<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    src: u64,
    len: u64,
) -> R {
    let mut left = None;
    let _ = cx.space.walk(VirtAddr(src), len, |m| {
        left.get_or_insert(m.va.0);
    });
    if let Some(va) = left {
        fail!("the old range still maps {va:#x}");
    }
    for o in [0, 8, len / 2 - 8, len - 8] {
        cx.read_faults(src + o)?;
    }
    cx.write_faults(src)
}

fn move_overlap<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let Geo { page: pg, .. } = cx.geo;
    let va = cx.win + 5 * pg;
    let len = 4 * pg;
    map_source(cx, va, len, MapOptions::PAGES)?;
    let vas = [va, va + pg, va + 3 * pg, va + 4 * pg, va - pg, va + 5 * pg];
    let before = cx.snap(&vas);
    let r = cx
        .space
        .move_page_tables(VirtAddr(va), VirtAddr(va + pg), len, MoveOptions::DEFAULT);
    cx.expect_error("a move up by one page", r, Error::Overlap, &vas, &before)?;
    let r = cx
        .space
        .move_page_tables(VirtAddr(va), VirtAddr(va - pg), len, MoveOptions::DEFAULT);
    cx.expect_error("a move down by one page", r, Error::Overlap, &vas, &before)?;
    let r = cx
        .space
        .move_page_tables(VirtAddr(va), VirtAddr(va), len, MoveOptions::DEFAULT);
    cx.expect_error("a move onto itself", r, Error::Overlap, &vas, &before)?;
    cx.unmap(va, len)
}

fn move_misaligned<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let Geo { page: pg, unit, .. } = cx.geo;
    let va = cx.win + 9 * pg;
    let dst = cx.win + 4 * unit + 9 * pg;
    let len = 2 * pg;
    map_source(cx, va, len, MapOptions::PAGES)?;
    let vas = [va, va + pg, dst, dst + pg];
    let before = cx.snap(&vas);
    let r = cx
        .space
        .move_page_tables(VirtAddr(va + 8), VirtAddr(dst), len, MoveOptions::DEFAULT);
    cx.expect_error(
        "a move from a misaligned address",
        r,
        Error::MisalignedVirt(VirtAddr(va + 8)),
        &vas,
        &before,
    )?;
    let r = cx.space.move_page_tables(
        VirtAddr(va),
        VirtAddr(dst + pg / 2),
        len,
        MoveOptions::DEFAULT,
    );
    cx.expect_error(
        "a move to a misaligned address",
        r,
        Error::MisalignedVirt(VirtAddr(dst + pg / 2)),
        &vas,
        &before,
    )?;
    let r = cx
        .space
        .move_page_tables(VirtAddr(va), VirtAddr(dst), len - 8, MoveOptions::DEFAULT);
    cx.expect_error(
        "a move of a misaligned length",
        r,
        Error::MisalignedLength(len - 8),
        &vas,
        &before,
    )?;
    let r = cx
        .space
        .move_page_tables(VirtAddr(va), VirtAddr(dst), 0, MoveOptions::DEFAULT);
    cx.expect_error("a move of nothing", r, Error::ZeroLength, &vas, &before)?;
    cx.unmap(va, len)
}

fn move_onto_mapping<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
) -> R {
    let Geo { page: pg, unit, .. } = cx.geo;
    let va = cx.win + 11 * pg;
    let dst = cx.win + 4 * unit + 11 * pg;
    let len = 4 * pg;
    map_source(cx, va, len, MapOptions::PAGES)?;
    // One page mapped in the middle of the destination.
    map_source(cx, dst + 2 * pg, pg, MapOptions::PAGES)?;
    let vas = [va, va + 3 * pg, dst, dst + 2 * pg, dst + 3 * pg];
    let before = cx.snap(&vas);
    let r = cx
        .space
        .move_page_tables(VirtAddr(va), VirtAddr(dst), len, MoveOptions::DEFAULT);
    match r {
        Err(Error::AlreadyMapped(_)) => {
            ensure!(
                cx.snap(&vas) == before,
                "the refused move changed the tables"
            );
        }
        other => fail!("a move onto a mapping returned {other:?}, expected AlreadyMapped"),
    }
    cx.consistent("a refused move")?;
    cx.unmap(va, len)?;
    cx.unmap(dst + 2 * pg, pg)
}

fn move_keeps_protection<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
) -> R {
    let Geo {
        page: pg,
        pmd,
        unit,
        ..
    } = cx.geo;
    // A read-only page and a writable one move together and keep their
    // rights and their data.
    let va = cx.win + 13 * pg;
    let dst = cx.win + 4 * unit + pmd + 3 * pg;
    map_source(cx, va, 2 * pg, MapOptions::PAGES)?;
    let seed = cx.seed();
    cx.write(va, pattern(seed, 0))?;
    cx.write(va + pg, pattern(seed, 1))?;
    cx.protect(va, pg, Prot::READ_ONLY)?;
    if let Err(e) =
        cx.space
            .move_page_tables(VirtAddr(va), VirtAddr(dst), 2 * pg, MoveOptions::DEFAULT)
    {
        fail!("move: {e}");
    }
    cx.consistent("move_page_tables")?;
    cx.expect(dst, pattern(seed, 0))?;
    cx.write_faults(dst)?;
    cx.expect(dst + pg, pattern(seed, 1))?;
    cx.write(dst + pg, 3)?;
    cx.read_faults(va)?;
    cx.unmap(dst, 2 * pg)
}
