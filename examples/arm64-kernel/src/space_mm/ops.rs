//! The `space_` cases on fork, swap entries, live kernel protection and
//! unmap reports (see the parent module's docs).

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use super::*;
use pgtable_arm64::bits::CONT;
use pgtable_core::contract::NewPte;

pub(super) fn fork_cow(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
    const DATA: u64 = 0xc0de_0000_0042;
    let (mut parent, f) = cx.proc_with_frame(DATA)?;
    let stack = cx.frames.take(0)?;
    map(&mut parent.space, STACK_VA, stack)?;
    ps[0] = Some(parent);
    let parent = at(ps, 0)?;
    cx.switch(parent)?;
    // Before the fork the page is writable at EL1 and EL0 (and the TLB
    // holds its writable translation).
    store_ok("parent before the fork", SHARED_VA + 16, 1)?;
    cx.el0_returns(
        "parent at EL0 before the fork",
        SHARED_VA,
        STACK_VA,
        DATA + 1,
    )?;
    let mut child = cx.new_proc()?;
    let parent = at(ps, 0)?;
    parent
        .space
        .copy_page_range(
            &mut child.space,
            VirtAddr(SHARED_VA),
            PAGE,
            CopyMode::Cow,
            |_| {},
        )
        .map_err(|e| Why::new(format_args!("copy_page_range: {e}")))?;
    let stack = cx.frames.take(0)?;
    map(&mut child.space, STACK_VA, stack)?;
    ps[1] = Some(child);
    for (i, who) in [(0, "parent"), (1, "child"), (0, "parent")] {
        let p = at(ps, i)?;
        let pa = p.space.translate(VirtAddr(SHARED_VA)).map(|t| t.pa.0);
        ensure!(
            pa == Some(f),
            "{who} maps {SHARED_VA:#x} to {pa:x?}, not the shared frame {f:#x}"
        );
        cx.switch(p)?;
        load_is(who, SHARED_VA, DATA)?;
        store_faults("an EL1 store to the copy-on-write page", SHARED_VA + 16)
            .map_err(|w| Why::new(format_args!("{who}: {}", w.as_str())))?;
        let e = cx.el0(SHARED_VA, STACK_VA);
        expect_user_abort(who, e, EC_DABT_LOWER, SHARED_VA + 8)?;
        ensure!(
            e.esr & (1 << 6) != 0,
            "{who}: ESR.WnR is clear for the EL0 store"
        );
    }
    ensure!(
        word(f, 1) == DATA + 1 && word(f, 2) == 1,
        "the shared frame changed after the fork"
    );
    Ok(())
}

pub(super) fn swap_entry_survives_move(cx: &mut Ctx, ps: &mut [Option<Proc>; 1]) -> R {
    // Each in a PTE table of its own (PMD-aligned; with 4 KiB pages 64,
    // 128 and 160 MiB); MID five pages into its table.
    const SRC: u64 = 32 * PMD_SIZE;
    const MID_TABLE: u64 = 64 * PMD_SIZE;
    const MID: u64 = MID_TABLE + 5 * PAGE;
    const DST_TABLE: u64 = 80 * PMD_SIZE;
    const DST: u64 = DST_TABLE + (MID - MID_TABLE);
    const SWP: u64 = 0x5_a5a5;
    let mut p = cx.new_proc()?;
    let f0 = cx.frames.take(marker(0))?;
    let f2 = cx.frames.take(marker(2))?;
    map(&mut p.space, SRC, f0)?;
    map(&mut p.space, SRC + 2 * PAGE, f2)?;
    p.space
        .install_pte(VirtAddr(SRC + PAGE), NewPte::Swap(SWP))
        .map_err(|e| Why::new(format_args!("install_pte (software entry): {e}")))?;
    ps[0] = Some(p);
    let p = at(ps, 0)?;
    cx.switch(p)?;
    let check = |p: &Proc, base: u64, old: &[u64]| -> R {
        ensure!(
            p.space
                .ptep_get(VirtAddr(base + PAGE))
                .and_then(|e| e.swap_value())
                == Some(SWP),
            "no swap entry {SWP:#x} at {:#x}",
            base + PAGE
        );
        load_is("a moved page", base, marker(0))?;
        load_is("a moved page", base + 2 * PAGE, marker(2))?;
        load_faults("the swap entry", base + PAGE)?;
        for &o in old {
            ensure!(
                p.space
                    .ptep_get(VirtAddr(o + PAGE))
                    .and_then(|e| e.swap_value())
                    .is_none(),
                "the swap entry is still at {:#x}",
                o + PAGE
            );
            for off in [0, PAGE, 2 * PAGE] {
                load_faults("an old address", o + off)?;
            }
        }
        Ok(())
    };
    check(p, SRC, &[])?;
    // A move of entries within PTE tables (not PMD aligned).
    p.space
        .move_page_tables(VirtAddr(SRC), VirtAddr(MID), 3 * PAGE, MoveOptions::DEFAULT)
        .map_err(|e| Why::new(format_args!("move of the PTEs: {e}")))?;
    check(p, MID, &[SRC])?;
    // A PMD-aligned move of a PMD's span: the whole PTE table goes.
    let table = p.space.inspect().entry(VirtAddr(MID_TABLE), 1).unwrap_or(0);
    p.space
        .move_page_tables(
            VirtAddr(MID_TABLE),
            VirtAddr(DST_TABLE),
            PMD_SIZE,
            MoveOptions::DEFAULT,
        )
        .map_err(|e| Why::new(format_args!("move of the table: {e}")))?;
    let moved = p.space.inspect().entry(VirtAddr(DST_TABLE), 1).unwrap_or(0);
    ensure!(
        table != 0 && moved == table,
        "the move of {PMD_SIZE:#x} bytes did not move the PTE table whole: entry {table:#x} before, {moved:#x} after"
    );
    ensure!(
        p.space.inspect().entry(VirtAddr(MID_TABLE), 1).unwrap_or(0) == 0,
        "the old PMD entry is still set"
    );
    check(p, DST, &[SRC, MID])
}

/// Words of [`LivePage`].
const LIVE_WORDS: usize = (MAX_PAGE / 8) as usize;

/// A page of kernel data of its own (in `.bss`), as large and aligned as
/// the largest page (64 KiB), so that it is a whole page, alone, in every
/// geometry.
#[repr(C, align(65536))]
struct LivePage([AtomicU64; LIVE_WORDS]);

const _: () = assert!(core::mem::align_of::<LivePage>() as u64 == MAX_PAGE);

static LIVE_PAGE: LivePage = LivePage([const { AtomicU64::new(0) }; LIVE_WORDS]);

pub(super) fn live_kernel_protect(cx: &mut Ctx, pool: (u64, u64)) -> R {
    let va = &raw const LIVE_PAGE as u64;
    let (d0, d1) = cx.img.data;
    ensure!(va >= d0 && va < d1, "{va:#x} is not in the kernel data");
    let t = cx.kernel.translate(VirtAddr(va));
    ensure!(
        t.map(|t| t.height) == Some(0),
        "{va:#x} is not mapped by a page ({t:?})"
    );
    let in_place = |cx: &mut Ctx, prot: Prot| {
        cx.kernel
            .change_protection_live(VirtAddr(va), PAGE, prot, LiveOptions::IN_PLACE)
            .map_err(|e| Why::new(format_args!("change_protection_live: {e}")))
    };
    // The TLB holds the writable translation.
    LIVE_PAGE.0[0].store(1, Relaxed);
    in_place(cx, RODATA)?;
    let r = store_faults("a store to the kernel page made read-only", va);
    let back = in_place(cx, DATA);
    r?;
    back?;
    ensure!(
        LIVE_PAGE.0[0].load(Relaxed) == 1,
        "the read-only page changed"
    );
    // SAFETY: LIVE_PAGE is atomics only the cases touch.
    if let Err(f) = unsafe { probe::write_u64(va, 2) } {
        fail!(
            "a store after the change back to RW faulted: ESR {:#x}",
            f.esr
        );
    }
    ensure!(LIVE_PAGE.0[0].load(Relaxed) == 2, "the store was lost");

    // A page of a linear-map block of pool memory outside any contiguous
    // run: a split, which needs break-before-make on arm64, is refused in
    // place. The highest such block: with 4 and 64 KiB pages the one at the
    // end of RAM (1 GiB, 512 MiB); with 16 KiB pages the whole GiBs of
    // 32 MiB blocks are folded into runs, so one of the first GiB.
    let Some((lin, height, before)) = unfolded_linear_block(cx.kernel, pool) else {
        fail!("no block outside a contiguous run maps the pool in the linear map");
    };
    let before = Some(before);
    let r = cx
        .kernel
        .change_protection_live(VirtAddr(lin), PAGE, RODATA, LiveOptions::IN_PLACE);
    ensure!(
        r == Err(Error::BreakBeforeMake(VirtAddr(lin), BbmReason::BlockSplit)),
        "splitting a block in place: {r:?}, expected BreakBeforeMake({lin:#x})"
    );
    ensure!(
        cx.kernel.inspect().entry(VirtAddr(lin), height) == before,
        "the refused change wrote the block entry"
    );
    let old = probe::read_u64(lin).map_err(|f| Why::new(format_args!("ESR {:#x}", f.esr)))?;
    // SAFETY: pool memory holding no Rust object; the same value goes back.
    if let Err(f) = unsafe { probe::write_u64(lin, old) } {
        fail!(
            "the block is no longer writable after the refused change: ESR {:#x}",
            f.esr
        );
    }
    Ok(())
}

/// The highest PMD-aligned linear-map address of pool memory mapped by a
/// block (height 1 or more) without the contiguous hint: the address, the
/// block's height and its entry.
fn unfolded_linear_block(kernel: &KernelSpace, pool: (u64, u64)) -> Option<(u64, u32, u64)> {
    let mut pa = pool.1.checked_sub(PMD_SIZE)? & !(PMD_SIZE - 1);
    while pa >= pool.0 {
        let va = phys_to_virt(pa);
        if let Some(t) = kernel.translate(VirtAddr(va)) {
            let e = kernel.inspect().entry(VirtAddr(va), t.height).unwrap_or(0);
            if t.height >= 1 && e & CONT == 0 {
                return Some((va, t.height, e));
            }
        }
        pa = pa.checked_sub(PMD_SIZE)?;
    }
    None
}

/// `mprotect(PROT_NONE)` of a kernel page and back (Linux `PAGE_NONE`,
/// `PTE_PROT_NONE` with `PTE_VALID` clear): every EL1 load and store takes
/// a translation fault (the writable translation the TLB held is flushed,
/// and `AT S1E1R` finds no translation either), while `ptep_get` and
/// `translate` still report the page's frame; the change back finds the
/// data again.
pub(super) fn prot_none(cx: &mut Ctx, _: &mut [Option<Proc>; 0]) -> R {
    const WORD: u64 = 0x0bad_c0de;
    let va = &raw const LIVE_PAGE as u64;
    let Some(before) = cx.kernel.translate(VirtAddr(va)) else {
        fail!("{va:#x} is not mapped");
    };
    ensure!(before.height == 0, "{va:#x} is not mapped by a page");
    // The TLB holds the writable translation.
    LIVE_PAGE.0[1].store(WORD, Relaxed);
    let protect = |cx: &mut Ctx, prot: Prot| {
        cx.kernel
            .change_protection(VirtAddr(va), PAGE, prot)
            .map_err(|e| Why::new(format_args!("change_protection({prot:?}): {e}")))
    };
    protect(cx, Prot::NONE)?;
    let closed = (|| {
        load_faults("a load from the PROT_NONE page", va + 8)?;
        // SAFETY: LIVE_PAGE is atomics only the cases touch, and the value
        // stored is the one already there.
        match unsafe { probe::write_u64(va + 8, WORD) } {
            Ok(()) => fail!(
                "a store to the PROT_NONE page at {:#x} went through",
                va + 8
            ),
            Err(f) => ensure!(
                f.class() == EC_DABT_CUR && is_translation_fault(f.esr) && f.is_write(),
                "a store to the PROT_NONE page: ESR {:#x}, expected a translation fault",
                f.esr
            ),
        }
        ensure!(
            probe::translate(va).is_none(),
            "AT S1E1R still translates the PROT_NONE page"
        );
        let Some(e) = cx.kernel.ptep_get(VirtAddr(va)) else {
            fail!("ptep_get finds nothing at the PROT_NONE page");
        };
        ensure!(
            e.is_present() && e.prot() == Some(Prot::NONE) && e.pa() == Some(before.pa),
            "ptep_get of the PROT_NONE page: present {}, prot {:?}, pa {:x?} (frame {:#x})",
            e.is_present(),
            e.prot(),
            e.pa(),
            before.pa.0
        );
        let t = cx.kernel.translate(VirtAddr(va)).map(|t| (t.pa, t.prot));
        ensure!(
            t == Some((before.pa, Prot::NONE)),
            "translate of the PROT_NONE page: {t:x?}"
        );
        Ok(())
    })();
    let back = protect(cx, DATA);
    closed?;
    back?;
    load_is("the page opened again", va + 8, WORD)?;
    // SAFETY: as above.
    if let Err(f) = unsafe { probe::write_u64(va + 8, WORD + 1) } {
        fail!("a store after the change back faulted: ESR {:#x}", f.esr);
    }
    ensure!(
        LIVE_PAGE.0[1].load(Relaxed) == WORD + 1,
        "the store was lost"
    );
    Ok(())
}

/// One report of `unmap_with`: va, pa (0: none), size, dirty, and the
/// software entry's value (if it was one).
#[derive(Clone, Copy, Default, Debug)]
struct Rep {
    va: u64,
    pa: u64,
    size: u64,
    dirty: bool,
    swp: Option<u64>,
}

/// Up to 16 reports.
#[derive(Default)]
struct Reports {
    r: [Rep; 16],
    n: usize,
}

impl Reports {
    fn push(&mut self, x: LeafEntry<Arm64>) {
        let rep = Rep {
            va: x.va().0,
            pa: x.pa().map_or(0, |p| p.0),
            size: x.size(),
            dirty: x.dirty(),
            swp: if x.is_present() {
                None
            } else {
                <Arm64 as Format>::swp_value(x.raw())
            },
        };
        if let Some(slot) = self.r.get_mut(self.n) {
            *slot = rep;
        }
        self.n += 1;
    }

    fn get(&self) -> &[Rep] {
        &self.r[..self.n.min(16)]
    }
}

/// `blk_pa`: a PMD-aligned PMD's span of pool memory nothing else uses.
pub(super) fn unmap_reports(cx: &mut Ctx, ps: &mut [Option<Proc>; 1], blk_pa: u64) -> R {
    use aarch64_cpu::registers::TCR_EL1;
    use tock_registers::interfaces::Readable;

    // Each in a PMD of its own (with 4 KiB pages 48, 96 and 160 MiB).
    const BASE: u64 = 24 * PMD_SIZE;
    const PAGES: u64 = 8;
    const SWP_VA: u64 = BASE + PAGES * PAGE;
    const SWP: u64 = 0x77;
    const DIRTY: [u64; 3] = [1, 3, 6];
    const BLK_VA: u64 = 48 * PMD_SIZE;
    const BASE2: u64 = 80 * PMD_SIZE;
    ensure!(
        TCR_EL1.get() & (1 << 40) != 0,
        "needs hardware dirty-state updates (TCR_EL1.HD)"
    );
    let mut p = cx.new_proc()?;
    let mut fr = [0u64; PAGES as usize];
    for (i, f) in fr.iter_mut().enumerate() {
        *f = cx.frames.take(marker(i))?;
        map(&mut p.space, BASE + PAGE * i as u64, *f)?;
    }
    p.space
        .install_pte(VirtAddr(SWP_VA), NewPte::Swap(SWP))
        .map_err(|e| Why::new(format_args!("install_pte (software entry): {e}")))?;
    // A PMD block (2 MiB with 4 KiB pages, 512 MiB with 64 KiB pages).
    ensure!(
        blk_pa % PMD_SIZE == 0,
        "the block's frame {blk_pa:#x} is not PMD aligned"
    );
    p.space
        .map(
            VirtAddr(BLK_VA),
            PhysAddr(blk_pa),
            PMD_SIZE,
            USER_RW,
            MapOptions::PMD_BLOCKS,
        )
        .map_err(|e| Why::new(format_args!("map the block: {e}")))?;
    let fr2 = [cx.frames.take(marker(20))?, cx.frames.take(marker(21))?];
    for (i, &f) in fr2.iter().enumerate() {
        map(&mut p.space, BASE2 + PAGE * i as u64, f)?;
    }
    ps[0] = Some(p);
    let p = at(ps, 0)?;
    cx.switch(p)?;
    // Loads from every page, stores to some: only those become dirty.
    for i in 0..PAGES {
        load_is("a page", BASE + PAGE * i, marker(i as usize))?;
    }
    for i in DIRTY {
        store_ok("a page", BASE + PAGE * i + 8, 1)?;
    }
    store_ok("the block", BLK_VA + PAGE + 8, 1)?;
    load_is("a page", BASE2, marker(20))?;

    // unmap_with: the pages and the swap entry, one flush.
    let f0 = FlushCounts::now();
    let mut got = Reports::default();
    p.space
        .unmap_with(VirtAddr(BASE), (PAGES + 1) * PAGE, |x| got.push(x))
        .map_err(|e| Why::new(format_args!("unmap_with: {e}")))?;
    let d = FlushCounts::now().since(f0);
    ensure!(
        got.n == PAGES as usize + 1,
        "{} reports for {PAGES} pages and a swap entry",
        got.n
    );
    for r in got.get() {
        if r.va == SWP_VA {
            ensure!(
                r.swp == Some(SWP) && r.pa == 0,
                "the swap entry was reported as {r:x?}"
            );
            continue;
        }
        let i = r.va.wrapping_sub(BASE) / PAGE;
        ensure!(
            r.va >= BASE && i < PAGES && r.pa == fr[i as usize] && r.size == PAGE,
            "a report {r:x?} that does not match a mapped page"
        );
        ensure!(
            r.dirty == DIRTY.contains(&i),
            "page {i}: reported dirty = {}, but it was {}stored to",
            r.dirty,
            if DIRTY.contains(&i) { "" } else { "not " }
        );
    }
    ensure!(
        d.range + d.asid + d.all == 1 && d.all == 0,
        "unmap_with flushed {} ranges, {} ASIDs, {} all: expected one flush",
        d.range,
        d.asid,
        d.all
    );
    for i in 0..=PAGES {
        load_faults("an unmapped page", BASE + PAGE * i)?;
    }

    // One gather for the block and two pages: one flush at the end.
    let f0 = FlushCounts::now();
    let mut tlb = p.space.tlb_gather_mmu();
    let mut got = Reports::default();
    let r1 = tlb.unmap_with(VirtAddr(BLK_VA), PMD_SIZE, |x| got.push(x));
    let r2 = tlb.unmap_with(VirtAddr(BASE2), 2 * PAGE, |x| got.push(x));
    let before_finish = FlushCounts::now().since(f0);
    tlb.finish();
    let d = FlushCounts::now().since(f0);
    r1.map_err(|e| Why::new(format_args!("MmuGather::unmap_with (block): {e}")))?;
    r2.map_err(|e| Why::new(format_args!("MmuGather::unmap_with (pages): {e}")))?;
    let g = got.get();
    ensure!(
        g.len() == 3
            && g[0].va == BLK_VA
            && g[0].pa == blk_pa
            && g[0].size == PMD_SIZE
            && g[0].dirty,
        "gathered reports {g:x?}: expected the dirty PMD block at {blk_pa:#x} first"
    );
    for (k, r) in g[1..].iter().enumerate() {
        ensure!(
            r.va == BASE2 + PAGE * k as u64 && r.pa == fr2[k] && r.size == PAGE && !r.dirty,
            "gathered report {r:x?} does not match clean page {k}"
        );
    }
    ensure!(
        before_finish == FlushCounts::default() && d.range + d.asid + d.all == 1,
        "the gather flushed {before_finish:?} before finish and {d:?} in all: expected one flush, at the end"
    );
    load_faults("the unmapped block", BLK_VA + PAGE)?;
    load_faults("an unmapped page", BASE2)
}
