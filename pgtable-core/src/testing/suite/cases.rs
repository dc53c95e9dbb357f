//! Map, unmap and protection cases.

use super::{ensure, fail, pattern, skip, Ctx, Machine, G1, K4, M2, R};
use crate::contract::level::size;
use crate::{Arch, Error, MapOptions, Mmu, PhysAddr, Prot, TableAlloc, VirtAddr};

/// Runs every map / unmap / protection case.
pub(crate) fn all<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) {
    cx.case(format_args!("map_4k_pages"), map_4k_pages);
    cx.case(
        format_args!("map_pages_across_table_boundaries"),
        map_across,
    );
    cx.case(format_args!("map_2m_block"), |cx| map_block(cx, 1));
    cx.case(format_args!("map_1g_block"), |cx| map_block(cx, 2));
    cx.case(format_args!("map_over_a_mapping_fails"), map_over_mapping);
    cx.case(format_args!("map_bad_input_fails"), map_bad_input);
    cx.case(format_args!("unmap_hole_in_pages"), unmap_hole_in_pages);
    cx.case(format_args!("unmap_part_of_2m_block_splits_it"), |cx| {
        unmap_splits(cx, 1)
    });
    cx.case(format_args!("unmap_part_of_1g_block_splits_it"), |cx| {
        unmap_splits(cx, 2)
    });
    cx.case(format_args!("protect_4k_read_only_then_writable"), |cx| {
        protect_rw(cx, 0)
    });
    cx.case(
        format_args!("protect_2m_block_read_only_then_writable"),
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
    if !A::leaf_allowed(height) {
        skip!("the format has no leaf at height {height}");
    }
    if cx.ram.gran < size::<A>(height) {
        skip!(
            "the RAM pool holds no aligned {:#x}-byte block",
            size::<A>(height)
        );
    }
    Ok(())
}

fn map_4k_pages<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let va = cx.win + K4;
    let alias = cx.win + 8 * M2 + 5 * K4;
    let pa = cx.ram.pa_for(0, 0);
    let n = 4;
    cx.map(va, pa, n * K4, Prot::READ_WRITE, MapOptions::PAGES)?;
    let seed = cx.seed();
    for i in 0..n {
        let p = va + i * K4;
        ensure!(cx.height(p)? == 0, "{p:#x} is not a 4 KiB page");
        ensure!(
            cx.pa(p + 8) == Some(pa + i * K4 + 8),
            "{p:#x} translates to {:?}, expected {:#x}",
            cx.pa(p + 8),
            pa + i * K4 + 8
        );
        cx.write(p, pattern(seed, 2 * i))?;
        cx.write(p + K4 - 8, pattern(seed, 2 * i + 1))?;
    }
    // A second mapping of the same frames sees the same bytes: the machine
    // really translates to the physical address the tables say.
    cx.map(alias, pa, n * K4, Prot::READ_ONLY, MapOptions::PAGES)?;
    for i in 0..n {
        cx.expect(alias + i * K4, pattern(seed, 2 * i))?;
        cx.expect(alias + i * K4 + K4 - 8, pattern(seed, 2 * i + 1))?;
    }
    cx.write_faults(alias)?;
    cx.unmap(va, n * K4)?;
    cx.unmap(alias, n * K4)?;
    for i in 0..n {
        cx.read_faults(va + i * K4)?;
        cx.write_faults(va + i * K4)?;
        cx.read_faults(alias + i * K4)?;
    }
    Ok(())
}

fn map_across<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    // Pages straddling a 2 MiB boundary inside a 1 GiB boundary straddle.
    let va = cx.win + 2 * G1 - 2 * K4;
    let len = 4 * K4;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, len, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    let seed = cx.seed();
    for i in 0..4 {
        cx.write(va + i * K4 + 8 * i, pattern(seed, i))?;
    }
    for i in 0..4 {
        ensure!(
            cx.pa(va + i * K4) == Some(pa + i * K4),
            "page {i} translates wrongly"
        );
        cx.expect(va + i * K4 + 8 * i, pattern(seed, i))?;
    }
    cx.read_faults(va - K4)?;
    cx.read_faults(va + len)?;
    cx.unmap(va, len)?;
    cx.read_faults(va + 2 * K4)
}

fn map_block<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    need_block(cx, height)?;
    let bs = size::<A>(height);
    // An odd multiple of the block size inside the window.
    let va = cx.win + bs * if bs == G1 { 3 } else { 5 };
    let pa = cx.ram.base;
    let alias = cx.win + 6 * G1 + 3 * K4;
    cx.map(va, pa, bs, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    ensure!(
        cx.height(va)? == height,
        "mapped with height {}, expected a block at {height}",
        cx.height(va)?
    );
    let offs = [0, 8, bs / 2 + K4 + 16, bs - 8];
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
        // Through a 4 KiB alias of the same frame.
        let page = o & !(K4 - 1);
        cx.map(alias, pa + page, K4, Prot::READ_ONLY, MapOptions::PAGES)?;
        cx.expect(alias + (o - page), pattern(seed, i as u64))?;
        cx.unmap(alias, K4)?;
    }
    cx.read_faults(va - 8)?;
    cx.read_faults(va + bs)?;
    cx.unmap(va, bs)?;
    cx.read_faults(va)?;
    cx.read_faults(va + bs - 8)
}

fn map_over_mapping<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let va = cx.win + 3 * K4;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, 2 * K4, Prot::READ_WRITE, MapOptions::PAGES)?;
    let vas = [va - K4, va, va + K4, va + 2 * K4];
    let before = cx.snap(&vas);
    let r = cx.space.map(
        VirtAddr(va - K4),
        PhysAddr(pa),
        4 * K4,
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
    cx.unmap(va, 2 * K4)
}

fn map_bad_input<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    let va = cx.win + 16 * K4;
    let pa = cx.ram.pa_for(0, 0);
    let vas = [va, va + K4];
    let before = cx.snap(&vas);
    let rw = Prot::READ_WRITE;
    let p = MapOptions::PAGES;
    let r = cx.space.map(VirtAddr(va + 8), PhysAddr(pa), K4, rw, p);
    cx.expect_error(
        "misaligned va",
        r,
        Error::MisalignedVirt(VirtAddr(va + 8)),
        &vas,
        &before,
    )?;
    let r = cx.space.map(VirtAddr(va), PhysAddr(pa + 8), K4, rw, p);
    cx.expect_error(
        "misaligned pa",
        r,
        Error::MisalignedPhys(PhysAddr(pa + 8)),
        &vas,
        &before,
    )?;
    let r = cx.space.map(VirtAddr(va), PhysAddr(pa), K4 + 8, rw, p);
    cx.expect_error(
        "misaligned length",
        r,
        Error::MisalignedLength(K4 + 8),
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
    let va = cx.win + G1 + M2 - 8 * K4;
    let n = 16;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, n * K4, Prot::READ_WRITE, MapOptions::PAGES)?;
    let seed = cx.seed();
    for i in 0..n {
        cx.write(va + i * K4, pattern(seed, i))?;
    }
    // A hole across the 2 MiB boundary.
    cx.unmap(va + 6 * K4, 4 * K4)?;
    for i in 0..n {
        if (6..10).contains(&i) {
            cx.read_faults(va + i * K4)?;
            cx.write_faults(va + i * K4)?;
        } else {
            cx.expect(va + i * K4, pattern(seed, i))?;
        }
    }
    // Unmapping over the hole again skips it.
    cx.unmap(va, n * K4)?;
    cx.read_faults(va)
}

fn unmap_splits<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    need_block(cx, height)?;
    let bs = size::<A>(height);
    let va = cx.win + if bs == G1 { 3 * G1 } else { 5 * M2 };
    let pa = cx.ram.base;
    cx.map(va, pa, bs, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    // The hole: one 4 KiB page in the second half of the block's second
    // next-level entry, so every level down to pages must split.
    let sub = size::<A>(height - 1);
    let hole = va + sub + K4;
    // Offsets around the hole and at the ends of the block.
    let offs = [
        0,
        sub,
        sub + 2 * K4,
        sub - 8,
        bs - 8,
        sub + K4 - 8,
        sub + 2 * K4 + 8,
    ];
    let seed = cx.seed();
    for (i, &o) in offs.iter().enumerate() {
        cx.write(va + o, pattern(seed, i as u64))?;
    }
    cx.write(hole + 8, 0x1234)?;
    cx.unmap(hole, K4)?;
    cx.read_faults(hole)?;
    cx.read_faults(hole + K4 - 8)?;
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
        cx.height(hole - K4)? == 0,
        "the pages around the hole are not 4 KiB pages"
    );
    if height == 2 {
        ensure!(
            cx.height(va)? == 1 || !A::leaf_allowed(1),
            "the untouched first 2 MiB of a split 1 GiB block should stay a block"
        );
    }
    cx.unmap(va, bs)?;
    cx.read_faults(va)
}

fn protect_rw<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &mut Ctx<'_, A, M, T, H>,
    height: u32,
) -> R {
    let (va, pa, len) = if height == 0 {
        (cx.win + 7 * K4, cx.ram.pa_for(0, 0), 4 * K4)
    } else {
        need_block(cx, height)?;
        (cx.win + 9 * M2, cx.ram.base, M2)
    };
    cx.map(va, pa, len, Prot::READ_WRITE, MapOptions::BLOCKS)?;
    ensure!(cx.height(va)? == height, "mapped at the wrong height");
    let seed = cx.seed();
    let step = len / 4;
    for i in 0..4 {
        cx.write(va + i * step, pattern(seed, i))?;
    }
    // The first quarter stays writable for 4 KiB pages; a block changes
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
    let va = cx.win + 13 * K4;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, K4, Prot::READ_WRITE, MapOptions::PAGES)?;
    match cx.mach.exec_faults(VirtAddr(va)) {
        None => {
            cx.unmap(va, K4)?;
            skip!("the machine cannot test instruction fetches");
        }
        Some(true) => {}
        Some(false) => fail!("a fetch from an execute-never page did not fault"),
    }
    cx.protect(va, K4, Prot::READ_EXEC)?;
    if cx.mach.exec_faults(VirtAddr(va)) != Some(false) {
        fail!("a fetch from a page made executable faulted");
    }
    cx.write_faults(va)?;
    cx.protect(va, K4, Prot::READ_WRITE)?;
    if cx.mach.exec_faults(VirtAddr(va)) != Some(true) {
        fail!("a fetch from a page made execute-never again did not fault");
    }
    cx.unmap(va, K4)?;
    match cx.mach.exec_faults(VirtAddr(va)) {
        Some(true) => Ok(()),
        _ => fail!("a fetch from an unmapped page did not fault"),
    }
}

fn protect_holes<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    // Pages 0-1 and 4-5 mapped, 2-3 a hole; protect all six.
    let va = cx.win + 21 * K4;
    let pa = cx.ram.pa_for(0, 0);
    cx.map(va, pa, 2 * K4, Prot::READ_WRITE, MapOptions::PAGES)?;
    cx.map(
        va + 4 * K4,
        pa + 4 * K4,
        2 * K4,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )?;
    let seed = cx.seed();
    for i in [0, 1, 4, 5] {
        cx.write(va + i * K4, pattern(seed, i))?;
    }
    cx.protect(va, 6 * K4, Prot::READ_ONLY)?;
    for i in 0..6 {
        let p = va + i * K4;
        if (2..4).contains(&i) {
            ensure!(cx.pa(p).is_none(), "the hole at {p:#x} got mapped");
            cx.read_faults(p)?;
        } else {
            cx.expect(p, pattern(seed, i))?;
            cx.write_faults(p)?;
        }
    }
    cx.unmap(va, 6 * K4)
}

fn map_lazy<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(cx: &mut Ctx<'_, A, M, T, H>) -> R {
    // Several mappings inside one lazy-MMU scope: their walker barriers are
    // deferred to the end of the scope, after which all must be usable.
    let pa = cx.ram.pa_for(0, 0);
    let vas = [
        cx.win + 3 * K4,
        cx.win + G1 + 7 * K4,
        cx.win + 2 * G1 + M2 - K4,
    ];
    let mut err = None;
    cx.space.lazy_mmu(|s| {
        for (i, &va) in vas.iter().enumerate() {
            let r = s.map(
                VirtAddr(va),
                PhysAddr(pa + 2 * i as u64 * K4),
                2 * K4,
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
        cx.write(va + K4, pattern(seed, i as u64))?;
    }
    for (i, &va) in vas.iter().enumerate() {
        cx.expect(va + K4, pattern(seed, i as u64))?;
        cx.unmap(va, 2 * K4)?;
    }
    Ok(())
}
