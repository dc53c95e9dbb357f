//! The `mm_` cases: a memory manager's in-place replacements of one PTE
//! (`replace_pte`), judged by the MMU (see the parent module's docs).

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use pgtable_core::contract::NewPte;

use super::*;

/// Where the reclaim case maps its PTE table's [`ENTRIES`] pages (PMD
/// aligned: 192 MiB with 4 KiB pages).
const RECLAIM_VA: u64 = 96 * PMD_SIZE;

/// Reclaim of a whole PTE table under an allocator that refuses every
/// frame: each of the table's [`ENTRIES`] pages (512 with 4 KiB pages)
/// becomes a swap entry in place, with its
/// frame and the dirty state the hardware set returned; the table count
/// does not move; every page then faults. Swap-in maps the frames back,
/// still without a table frame to spare, and the data is there.
pub(super) fn reclaim_full_table_no_alloc(cx: &mut Ctx, ps: &mut [Option<Proc>; 1], pa: u64) -> R {
    // `pa`: a PMD's span of pool memory nothing else uses.
    ensure!(pa % PAGE == 0, "the pages at {pa:#x} are not page aligned");
    let mut p = cx.new_proc()?;
    p.space
        .map(
            VirtAddr(RECLAIM_VA),
            PhysAddr(pa),
            PMD_SIZE,
            USER_RW,
            MapOptions::PAGES.no_contiguous(),
        )
        .map_err(|e| Why::new(format_args!("map the table's pages: {e}")))?;
    ps[0] = Some(p);
    let p = at(ps, 0)?;
    cx.switch(p)?;
    // Loads from every page (the TLB caches them), stores to every third
    // (the hardware marks them dirty).
    for i in 0..ENTRIES {
        let va = RECLAIM_VA + i * PAGE;
        if i % 3 == 0 {
            store_ok("a page", va + 8, 0xda7a_0000 + i)?;
        }
        probe::read_u64(va)
            .map_err(|f| Why::new(format_args!("load {va:#x}: ESR {:#x}", f.esr)))?;
    }
    let (live, _) = memory::tables_live();
    let f0 = FlushCounts::now();
    memory::refuse_tables(true);
    let out = swap_out(p, pa);
    memory::refuse_tables(false);
    out?;
    let d = FlushCounts::now().since(f0);
    ensure!(
        memory::tables_live().0 == live,
        "{live} table frames before the swap-out, {} after",
        memory::tables_live().0
    );
    ensure!(
        d.asid == 0 && d.all == 0 && d.range == ENTRIES,
        "swap-out flushed {} ranges, {} ASIDs, {} all: expected one page each",
        d.range,
        d.asid,
        d.all
    );
    for i in 0..ENTRIES {
        load_faults("a swapped-out page", RECLAIM_VA + i * PAGE)?;
    }
    memory::refuse_tables(true);
    let back = swap_in(p, pa);
    memory::refuse_tables(false);
    back?;
    ensure!(
        memory::tables_live().0 == live,
        "{live} table frames before the swap-in, {} after",
        memory::tables_live().0
    );
    for i in (0..ENTRIES).step_by(3) {
        load_is(
            "a swapped-in page",
            RECLAIM_VA + i * PAGE + 8,
            0xda7a_0000 + i,
        )?;
    }
    println!(
        "  {ENTRIES} pages of {} KiB (one PTE table) swapped out and in with every table allocation refused; {live} table frames throughout, one page flush each",
        PAGE >> 10
    );
    Ok(())
}

/// Every page of the reclaim case's table to a swap entry (slot `i`).
fn swap_out(p: &mut Proc, pa: u64) -> R {
    for i in 0..ENTRIES {
        let va = VirtAddr(RECLAIM_VA + i * PAGE);
        let old = p
            .space
            .replace_pte(va, NewPte::Swap(i))
            .map_err(|e| Why::new(format_args!("replace_pte {va} (swap-out): {e}")))?;
        ensure!(
            old.pa() == Some(PhysAddr(pa + i * PAGE)) && old.young(),
            "page {i}: replace_pte returned {old:?}, not the accessed page at {:#x}",
            pa + i * PAGE
        );
        ensure!(
            old.dirty() == (i % 3 == 0),
            "page {i}: returned dirty = {}, but it was {}stored to",
            old.dirty(),
            if i % 3 == 0 { "" } else { "not " }
        );
        let now = p.space.ptep_get(va).and_then(|e| e.swap_value());
        ensure!(
            now == Some(i),
            "page {i}: the PTE holds {now:?}, not swap slot {i}"
        );
    }
    Ok(())
}

/// Every swap entry of the reclaim case back to its frame.
fn swap_in(p: &mut Proc, pa: u64) -> R {
    for i in 0..ENTRIES {
        let va = VirtAddr(RECLAIM_VA + i * PAGE);
        let page = NewPte::Page {
            pa: PhysAddr(pa + i * PAGE),
            prot: USER_RW,
        };
        let old = p
            .space
            .replace_pte(va, page)
            .map_err(|e| Why::new(format_args!("replace_pte {va} (swap-in): {e}")))?;
        ensure!(
            old.swap_value() == Some(i),
            "page {i}: swap-in replaced {old:?}, not swap slot {i}"
        );
    }
    Ok(())
}

/// A copy-on-write fault handled in place: after `copy_page_range` with
/// `CopyMode::Cow` a store to the child's page faults; the handler copies
/// the frame and `replace_pte` puts the copy in the child's PTE (one page
/// flush, the shared frame returned). The child's TLB held the read-only
/// translation of the shared frame: its next load reads the copy, and its
/// store goes through; the parent still reads the shared frame, unchanged,
/// and its store still faults.
pub(super) fn cow_replace(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
    const DATA: u64 = 0xc0de_0000_0777;
    const MARK: u64 = 0xc0b1_0000_0001;
    let (parent, f) = cx.proc_with_frame(DATA)?;
    ps[0] = Some(parent);
    let mut child = cx.new_proc()?;
    at(ps, 0)?
        .space
        .copy_page_range(
            &mut child.space,
            VirtAddr(SHARED_VA),
            PAGE,
            CopyMode::Cow,
            |_| {},
        )
        .map_err(|e| Why::new(format_args!("copy_page_range: {e}")))?;
    ps[1] = Some(child);
    let child = at(ps, 1)?;
    cx.switch(child)?;
    load_is("the child before the copy", SHARED_VA, DATA)?;
    store_faults("a store to the copy-on-write page", SHARED_VA + 16)?;
    // The fault handler: copy the frame, mark the copy, replace the PTE.
    let copy = cx.frames.take(0)?;
    for i in 0..PAGE / 8 {
        // SAFETY: `copy` is a pool frame of ours, in the linear map.
        unsafe { (phys_to_virt(copy + 8 * i) as *mut u64).write_volatile(word(f, i)) };
    }
    // SAFETY: as above.
    unsafe { (phys_to_virt(copy + 24) as *mut u64).write_volatile(MARK) };
    let f0 = FlushCounts::now();
    let tables = memory::tables_live().0;
    let new = NewPte::Page {
        pa: PhysAddr(copy),
        prot: USER_RW,
    };
    let old = child
        .space
        .replace_pte(VirtAddr(SHARED_VA), new)
        .map_err(|e| Why::new(format_args!("replace_pte (copy-on-write): {e}")))?;
    let d = FlushCounts::now().since(f0);
    ensure!(
        old.pa() == Some(PhysAddr(f)) && old.prot().is_some_and(|p| !p.writable()),
        "replace_pte returned {old:?}, not the read-only shared frame {f:#x}"
    );
    ensure!(
        d.range == 1 && d.asid == 0 && d.all == 0,
        "the copy-on-write replace flushed {} ranges, {} ASIDs, {} all: expected one page",
        d.range,
        d.asid,
        d.all
    );
    ensure!(
        memory::tables_live().0 == tables,
        "replace_pte allocated or freed a table"
    );
    load_is("the child's copy", SHARED_VA + 24, MARK)?;
    load_is("the child's copy", SHARED_VA, DATA)?;
    store_ok("the child's copy", SHARED_VA + 16, 0x5707e)?;
    ensure!(
        word(copy, 2) == 0x5707e && word(f, 2) == 0,
        "the child's store went to {} (copy word {:#x}, shared word {:#x})",
        if word(f, 2) == 0 {
            "neither frame"
        } else {
            "the shared frame"
        },
        word(copy, 2),
        word(f, 2)
    );
    let parent = at(ps, 0)?;
    cx.switch(parent)?;
    load_is("the parent after the copy", SHARED_VA + 24, 0)?;
    store_faults("a store to the parent's shared page", SHARED_VA + 16)?;
    println!("  copy-on-write fault in the child: frame {f:#x} replaced by its copy {copy:#x} with one page flush; the parent still shares {f:#x}, read-only");
    Ok(())
}

/// Spaces switched only by `AsidAllocator::switch_mm` (through
/// [`Switcher::switch`] of the small, 3-bit allocator), with unassigned
/// MMU handles until their first switch.
pub(super) fn switch_mm(cx: &mut Ctx, ps: &mut [Option<Proc>; ROLLOVER_SPACES]) -> R {
    use pgtable_core::contract::TaggedMmu;
    let f0 = FlushCounts::now();
    let mut frames = [0u64; ROLLOVER_SPACES];
    for (i, f) in frames.iter_mut().enumerate() {
        let (mut p, pa) = cx.proc_with_frame(marker(i))?;
        ensure!(p.space.mmu().tag().is_none(), "a new space has an ASID");
        if i == 0 {
            // A space that never ran: its unmap flushes nothing.
            p.space
                .unmap(VirtAddr(SHARED_VA), PAGE)
                .map_err(|e| Why::new(format_args!("unmap: {e}")))?;
            map(&mut p.space, SHARED_VA, pa)?;
        }
        ps[i] = Some(p);
        *f = pa;
    }
    let d = FlushCounts::now().since(f0);
    ensure!(
        d.range == 0 && d.asid == 0 && d.local == 0,
        "spaces that never ran flushed: {} range, {} by ASID, {} local",
        d.range,
        d.asid,
        d.local
    );
    // As in the roll-over case: the TLB holds no entry of a nonzero ASID
    // now (the previous case ended with the test space's full flush).
    let f0 = FlushCounts::now();
    let r0 = cx.small.rollovers();
    let mut remaps = 0;
    for round in 0..4u64 {
        for i in 0..ROLLOVER_SPACES {
            let p = at(ps, i)?;
            // SAFETY: as in `Ctx::switch`, and see above; the install of the
            // test space at the end of the case flushes the TLB.
            let a = unsafe { cx.small.switch(p) }?;
            ensure!(
                p.space.mmu().tag() == Some(a),
                "space {i} is not tagged {a}"
            );
            load_is("after switch_mm", SHARED_VA, word(frames[i], 0))?;
            store_ok("after switch_mm", SHARED_VA + 8, round << 32 | i as u64)?;
            // Now and then a space that is not current moves its page to a
            // fresh frame (a flush by its ASID, perhaps an old one).
            if round == 1 && i % 3 == 0 && remaps < 3 {
                let t = (i + 5) % ROLLOVER_SPACES;
                let q = at(ps, t)?;
                let pa = cx.frames.take(marker(t) | 0xff)?;
                q.space
                    .unmap(VirtAddr(SHARED_VA), PAGE)
                    .map_err(|e| Why::new(format_args!("unmap: {e}")))?;
                map(&mut q.space, SHARED_VA, pa)?;
                frames[t] = pa;
                remaps += 1;
            }
        }
    }
    let rollovers = cx.small.rollovers() - r0;
    let d = FlushCounts::now().since(f0);
    ensure!(remaps == 3, "{remaps} remaps");
    ensure!(rollovers >= 2, "{rollovers} roll-overs");
    ensure!(
        d.local == rollovers && d.all == 0,
        "{rollovers} roll-overs but {} local and {} full flushes",
        d.local,
        d.all
    );
    Ok(())
}
