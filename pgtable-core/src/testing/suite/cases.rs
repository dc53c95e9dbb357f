//! Map, unmap and protection cases.

use super::{ensure, fail, pattern, skip, Ctx, Human, Machine, Short, R};
use crate::contract::level::size;
use crate::{Arch, Error, MapOptions, Mmu, PhysAddr, Prot, TableAlloc, VirtAddr};

/// Runs every map / unmap / protection case.
///
/// The names give the format's sizes: `map_4k_pages`, `map_2m_block` and
/// `map_1g_block` with 4 KiB pages are `map_16k_pages`, `map_32m_block`
/// and `map_64g_block` with 16 KiB pages.
pub(crate) fn all<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) {
    let (page, pmd, pud) = (Short(cx.geo.page), Short(cx.geo.pmd), Short(cx.geo.pud));
    cx.case(format_args!("map_{page}_pages"), map_pages);
    cx.case(
        format_args!("map_pages_across_table_boundaries"),
        map_across,
    );
    cx.case(format_args!("map_{pmd}_block"), |cx| map_block(cx, 1));
    cx.case(format_args!("map_{pud}_block"), |cx| map_block(cx, 2));
    cx.case(format_args!("map_over_a_mapping_fails"), map_over_mapping);
    cx.case(format_args!("map_bad_input_fails"), map_bad_input);
    cx.case(format_args!("unmap_hole_in_pages"), unmap_hole_in_pages);
    cx.case(format_args!("unmap_part_of_{pmd}_block_splits_it"), |cx| {
        unmap_splits(cx, 1)
    });
    cx.case(format_args!("unmap_part_of_{pud}_block_splits_it"), |cx| {
        unmap_splits(cx, 2)
    });
    cx.case(
        format_args!("protect_{page}_read_only_then_writable"),
        |cx| protect_rw(cx, 0),
    );
    cx.case(
        format_args!("protect_{pmd}_block_read_only_then_writable"),
        |cx| protect_rw(cx, 1),
    );
    cx.case(format_args!("protect_execute_never"), protect_exec);
    cx.case(format_args!("protect_skips_holes"), protect_holes);
    cx.case(format_args!("map_in_a_lazy_mmu_scope"), map_lazy);
}

/// Fails with a skip unless a block at `height` is possible here.
fn need_block<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    if height >= A::LEVELS {
        skip!(
            "the format has {} levels, none at height {height}",
            A::LEVELS
        );
    }
    if !A::leaf_allowed(height) {
        skip!("the format has no leaf at height {height}");
    }
    if cx.ram.gran < size::<A>(height) {
        skip!(
            "the RAM pool holds no aligned {} block",
            Human(size::<A>(height))
        );
    }
    Ok(())
}

fn map_pages<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo { page: pg, pmd, .. } = cx.geo;
    let va = cx.win + pg;
    let alias = cx.win + 8 * pmd + 5 * pg;
    let pa = cx.ram.pa_for(0, 0);
    let n = 4;
    cx.map(va, pa, n * pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    let seed = cx.seed();
    for i in 0..n {
        let p = va + i * pg;
        ensure!(cx.height(p)? == 0, "{p:#x} is not a page");
        ensure!(
            cx.pa(p + 8) == Some(pa + i * pg + 8),
            "{p:#x} translates to {:?}, expected {:#x}",
            cx.pa(p + 8),
            pa + i * pg + 8
        );
        cx.write(p, pattern(seed, 2 * i))?;
        cx.write(p + pg - 8, pattern(seed, 2 * i + 1))?;
    }
    // A second mapping of the same frames sees the same bytes: the machine
    // really translates to the physical address the tables say.
    cx.map(alias, pa, n * pg, Prot::READ_ONLY, MapOptions::PAGES)?;
    for i in 0..n {
        cx.expect(alias + i * pg, pattern(seed, 2 * i))?;
        cx.expect(alias + i * pg + pg - 8, pattern(seed, 2 * i + 1))?;
    }
    cx.write_faults(alias)?;
    cx.unmap(va, n * pg)?;
    cx.unmap(alias, n * pg)?;
    for i in 0..n {
        cx.read_faults(va + i * pg)?;
        cx.write_faults(va + i * pg)?;
        cx.read_faults(alias + i * pg)?;
    }
    Ok(())
}

fn map_across<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo { page: pg, unit, .. } = cx.geo;
    // Pages straddling a PMD entry's boundary inside a PUD entry's boundary
    // straddle (2 MiB and 1 GiB with 4 KiB pages).
    let va = cx.win + 2 * unit - 2 * pg;
    let len = 4 * pg;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, len, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    let seed = cx.seed();
    for i in 0..4 {
        cx.write(va + i * pg + 8 * i, pattern(seed, i))?;
    }
    for i in 0..4 {
        ensure!(
            cx.pa(va + i * pg) == Some(pa + i * pg),
            "page {i} translates wrongly"
        );
        cx.expect(va + i * pg + 8 * i, pattern(seed, i))?;
    }
    cx.read_faults(va - pg)?;
    cx.read_faults(va + len)?;
    cx.unmap(va, len)?;
    cx.read_faults(va + 2 * pg)
}

fn map_block<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    let super::Geo { page: pg, unit, .. } = cx.geo;
    need_block(cx, height)?;
    let bs = size::<A>(height);
    // An odd multiple of the block size inside the window.
    let va = cx.win + bs * if height == 2 { 3 } else { 5 };
    let pa = cx.ram.base;
    let alias = cx.win + 6 * unit + 3 * pg;
    cx.map(va, pa, bs, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    ensure!(
        cx.height(va)? == height,
        "mapped with height {}, expected a block at {height}",
        cx.height(va)?
    );
    let offs = [0, 8, bs / 2 + pg + 16, bs - 8];
    let seed = cx.seed();
    for (i, &o) in offs.iter().enumerate() {
        cx.write(va + o, pattern(seed, i as u64))?;
    }
    for (i, &o) in offs.iter().enumerate() {
        ensure!(
            cx.pa(va + o) == Some(pa + o),
            "{:#x} translates wrongly",
            va + o
        );
        cx.expect(va + o, pattern(seed, i as u64))?;
        // Through a page-sized alias of the same frame.
        let page = o & !(pg - 1);
        cx.map(alias, pa + page, pg, Prot::READ_ONLY, MapOptions::PAGES)?;
        cx.expect(alias + (o - page), pattern(seed, i as u64))?;
        cx.unmap(alias, pg)?;
    }
    cx.read_faults(va - 8)?;
    cx.read_faults(va + bs)?;
    cx.unmap(va, bs)?;
    cx.read_faults(va)?;
    cx.read_faults(va + bs - 8)
}

fn map_over_mapping<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo { page: pg, .. } = cx.geo;
    let va = cx.win + 3 * pg;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, 2 * pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    let vas = [va - pg, va, va + pg, va + 2 * pg];
    let before = cx.snap(&vas);
    let r = cx.space.map(
        VirtAddr(va - pg),
        PhysAddr(pa),
        4 * pg,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    );
    cx.expect_error(
        "map over a mapping",
        r,
        Error::AlreadyMapped(VirtAddr(va)),
        &vas,
        &before,
    )?;
    cx.unmap(va, 2 * pg)
}

fn map_bad_input<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo { page: pg, .. } = cx.geo;
    let va = cx.win + 16 * pg;
    let pa = cx.ram.pa_for(0, 0);
    let vas = [va, va + pg];
    let before = cx.snap(&vas);
    let rw = Prot::READ_WRITE;
    let p = MapOptions::PAGES;
    let r = cx.space.map(VirtAddr(va + 8), PhysAddr(pa), pg, rw, p);
    cx.expect_error(
        "misaligned va",
        r,
        Error::MisalignedVirt(VirtAddr(va + 8)),
        &vas,
        &before,
    )?;
    let r = cx.space.map(VirtAddr(va), PhysAddr(pa + 8), pg, rw, p);
    cx.expect_error(
        "misaligned pa",
        r,
        Error::MisalignedPhys(PhysAddr(pa + 8)),
        &vas,
        &before,
    )?;
    let r = cx.space.map(VirtAddr(va), PhysAddr(pa), pg + 8, rw, p);
    cx.expect_error(
        "misaligned length",
        r,
        Error::MisalignedLength(pg + 8),
        &vas,
        &before,
    )?;
    let r = cx.space.map(VirtAddr(va), PhysAddr(pa), 0, rw, p);
    cx.expect_error("zero length", r, Error::ZeroLength, &vas, &before)?;
    cx.read_faults(va)
}

fn unmap_hole_in_pages<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
) -> R {
    let super::Geo {
        page: pg,
        pmd,
        unit,
        ..
    } = cx.geo;
    let va = cx.win + unit + pmd - 8 * pg;
    let n = 16;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, n * pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    let seed = cx.seed();
    for i in 0..n {
        cx.write(va + i * pg, pattern(seed, i))?;
    }
    // A hole across the PMD entry's boundary.
    cx.unmap(va + 6 * pg, 4 * pg)?;
    for i in 0..n {
        if (6..10).contains(&i) {
            cx.read_faults(va + i * pg)?;
            cx.write_faults(va + i * pg)?;
        } else {
            cx.expect(va + i * pg, pattern(seed, i))?;
        }
    }
    // Unmapping over the hole again skips it.
    cx.unmap(va, n * pg)?;
    cx.read_faults(va)
}

fn unmap_splits<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    let super::Geo { page: pg, .. } = cx.geo;
    need_block(cx, height)?;
    let bs = size::<A>(height);
    let va = cx.win + if height == 2 { 3 * bs } else { 5 * bs };
    let pa = cx.ram.base;
    cx.map(va, pa, bs, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    // The hole: one page in the second half of the block's second
    // next-level entry, so every level down to pages must split.
    let sub = size::<A>(height - 1);
    let hole = va + sub + pg;
    // Offsets around the hole and at the ends of the block.
    let offs = [
        0,
        sub,
        sub + 2 * pg,
        sub - 8,
        bs - 8,
        sub + pg - 8,
        sub + 2 * pg + 8,
    ];
    let seed = cx.seed();
    for (i, &o) in offs.iter().enumerate() {
        cx.write(va + o, pattern(seed, i as u64))?;
    }
    cx.write(hole + 8, 0x1234)?;
    cx.unmap(hole, pg)?;
    cx.read_faults(hole)?;
    cx.read_faults(hole + pg - 8)?;
    cx.write_faults(hole + 8)?;
    for (i, &o) in offs.iter().enumerate() {
        let p = va + o;
        ensure!(
            cx.pa(p) == Some(pa + o),
            "{p:#x} translates to {:?} after the split, expected {:#x}",
            cx.pa(p),
            pa + o
        );
        cx.expect(p, pattern(seed, i as u64))?;
    }
    ensure!(
        cx.height(hole - pg)? == 0,
        "the pages around the hole are not pages"
    );
    if height == 2 {
        ensure!(
            cx.height(va)? == 1 || !A::leaf_allowed(1),
            "the untouched first PMD entry of a split PUD block should stay a block"
        );
    }
    cx.unmap(va, bs)?;
    cx.read_faults(va)
}

fn protect_rw<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    let super::Geo { page: pg, pmd, .. } = cx.geo;
    let (va, pa, len) = if height == 0 {
        (cx.win + 7 * pg, cx.ram.pa_for(0, 0), 4 * pg)
    } else {
        need_block(cx, height)?;
        (cx.win + 9 * pmd, cx.ram.base, pmd)
    };
    cx.map(va, pa, len, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    ensure!(cx.height(va)? == height, "mapped at the wrong height");
    let seed = cx.seed();
    let step = len / 4;
    for i in 0..4 {
        cx.write(va + i * step, pattern(seed, i))?;
    }
    // The first quarter stays writable for pages; a block changes
    // whole.
    let (pva, plen) = if height == 0 {
        (va + step, len - step)
    } else {
        (va, len)
    };
    cx.protect(pva, plen, Prot::READ_ONLY)?;
    ensure!(
        cx.height(va)? == height,
        "change_protection changed the leaf size"
    );
    for i in 0..4 {
        let p = va + i * step;
        cx.expect(p, pattern(seed, i))?;
        if p >= pva {
            cx.write_faults(p)?;
            cx.write_faults(p + step - 8)?;
            // The refused store changed nothing.
            cx.expect(p, pattern(seed, i))?;
        } else {
            cx.write(p + 8, 7)?;
        }
    }
    cx.protect(pva, plen, Prot::READ_WRITE)?;
    for i in 0..4 {
        let p = va + i * step;
        cx.expect(p, pattern(seed, i))?;
        cx.write(p, !pattern(seed, i))?;
        cx.expect(p, !pattern(seed, i))?;
    }
    cx.unmap(va, len)?;
    cx.read_faults(va)
}

fn protect_exec<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo { page: pg, .. } = cx.geo;
    let va = cx.win + 13 * pg;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    match cx.mach.exec_faults(VirtAddr(va)) {
        None => {
            cx.unmap(va, pg)?;
            skip!("the machine cannot test instruction fetches");
        }
        Some(true) => {}
        Some(false) => fail!("a fetch from an execute-never page did not fault"),
    }
    cx.protect(va, pg, Prot::READ_EXEC)?;
    if cx.mach.exec_faults(VirtAddr(va)) != Some(false) {
        fail!("a fetch from a page made executable faulted");
    }
    cx.write_faults(va)?;
    cx.protect(va, pg, Prot::READ_WRITE)?;
    if cx.mach.exec_faults(VirtAddr(va)) != Some(true) {
        fail!("a fetch from a page made execute-never again did not fault");
    }
    cx.unmap(va, pg)?;
    match cx.mach.exec_faults(VirtAddr(va)) {
        Some(true) => Ok(()),
        _ => fail!("a fetch from an unmapped page did not fault"),
    }
}

fn protect_holes<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo { page: pg, .. } = cx.geo;
    // Pages 0-1 and 4-5 mapped, 2-3 a hole; protect all six.
    let va = cx.win + 21 * pg;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, 2 * pg, Prot::READ_WRITE, MapOptions::PAGES)?;
    cx.map(
        va + 4 * pg,
        pa + 4 * pg,
        2 * pg,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )?;
    let seed = cx.seed();
    for i in [0, 1, 4, 5] {
        cx.write(va + i * pg, pattern(seed, i))?;
    }
    cx.protect(va, 6 * pg, Prot::READ_ONLY)?;
    for i in 0..6 {
        let p = va + i * pg;
        if (2..4).contains(&i) {
            ensure!(cx.pa(p).is_none(), "the hole at {p:#x} got mapped");
            cx.read_faults(p)?;
        } else {
            cx.expect(p, pattern(seed, i))?;
            cx.write_faults(p)?;
        }
    }
    cx.unmap(va, 6 * pg)
}

fn map_lazy<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let super::Geo {
        page: pg,
        pmd,
        unit,
        ..
    } = cx.geo;
    // Several mappings inside one lazy-MMU scope: their walker barriers are
    // deferred to the end of the scope, after which all must be usable.
    let pa = cx.ram.pa_for(0, 0);
    let vas = [
        cx.win + 3 * pg,
        cx.win + unit + 7 * pg,
        cx.win + 2 * unit + pmd - pg,
    ];
    let mut err = None;
    cx.space.lazy_mmu(|s| {
        for (i, &va) in vas.iter().enumerate() {
            let r = s.map(
                VirtAddr(va),
                PhysAddr(pa + 2 * i as u64 * pg),
                2 * pg,
                Prot::READ_WRITE,
                MapOptions::PAGES,
            );
            if let Err(e) = r {
                err.get_or_insert((va, e));
            }
        }
    });
    if let Some((va, e)) = err {
        fail!("map {va:#x} in a lazy-MMU scope: {e}");
    }
    cx.consistent("a lazy-MMU scope")?;
    let seed = cx.seed();
    for (i, &va) in vas.iter().enumerate() {
        cx.write(va + pg, pattern(seed, i as u64))?;
    }
    for (i, &va) in vas.iter().enumerate() {
        cx.expect(va + pg, pattern(seed, i as u64))?;
        cx.unmap(va, 2 * pg)?;
    }
    Ok(())
}
