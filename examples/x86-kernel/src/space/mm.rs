//! The `mm_` cases: a memory manager's in-place replacements of one PTE
//! (`replace_pte`), checked on the MMU:
//!
//! - `mm_reclaim_full_table_no_alloc`: the 512 pages of one PTE table
//!   swapped out in place while the table allocator refuses every frame
//!   (each returned with its frame and the accessed/dirty state the MMU
//!   set, one page flush each, every page then faulting), and swapped in
//!   again, the data there;
//! - `mm_cow_replace`: a copy-on-write fault handled with `replace_pte`:
//!   the child's PTE goes from the shared read-only frame to its copy with
//!   one page flush, the child's next load reads the copy (no stale
//!   translation) and its store goes through, the parent still shares the
//!   frame read-only;
//! - `mm_switch_mm`: user spaces with unassigned MMU handles (no PCID, and
//!   an unmap and remap before their first switch) switched only by
//!   `AsidAllocator::switch_mm` on a 3-bit allocator: every switch reads
//!   the space's own frame, a space remapped while another ran reads its
//!   new frame (no stale translation), the handle holds the allocator's
//!   PCID, one local flush per roll-over. Without PCIDs (the CPU has
//!   none) the same `switch_mm` calls install with plain CR3 writes, said
//!   so.

use pgtable_core::contract::{Arch, NewPte, TaggedMmu, PAGE_SIZE};
use pgtable_core::{AddressSpace, CopyMode, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86Mmu;

use super::multi::{frame, load_faults, loads, map_page, set_word};
use super::switch::{pcids, with_users, Switcher, COUNTS};
use super::{store_faults, Tally, Why};
use crate::mem::{phys_to_virt, Frames, POOL_START};
use crate::println;
use crate::trap;

/// The kernel's address space.
type Kernel<A> = AddressSpace<A, X86Mmu, Frames>;

/// Where the reclaim case maps its PTE table's pages (212 GiB, 2 MiB
/// aligned), and the start of the 2 MiB of the test pool they map.
const RECLAIM_VA: u64 = 0x35_0000_0000;
const RECLAIM_PA: u64 = POOL_START;
/// The page the copy-on-write case forks (216 GiB).
const COW_VA: u64 = 0x36_0000_0000;

const USER_RW: Prot = Prot::USER.union(Prot::WRITE);

/// Runs the cases.
pub fn run<A: Arch>(kernel: &mut Kernel<A>, t: &mut Tally) {
    t.case(
        "mm_reclaim_full_table_no_alloc",
        reclaim_full_table_no_alloc(kernel),
    );
    t.case("mm_cow_replace", cow_replace(kernel));
    t.case("mm_switch_mm", switch_mm(kernel));
}

/// Spaces switched only by `switch_mm` (through [`Switcher::switch_user`]
/// of a 3-bit allocator), unassigned until their first switch.
fn switch_mm<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    const N: usize = 10;
    const ROUNDS: u64 = 4;
    /// Where the spaces map their page (220 GiB).
    const VA: u64 = 0x37_0000_0000;
    let marker = |i: u64| 0x5357_4d4d_0000_0000 | i;
    for i in 0..N as u64 + 3 {
        set_word(frame(100 + i), marker(i));
    }
    with_users::<A, N>(kernel, |kernel, users| {
        let mut frames = [0u64; N];
        for (i, u) in users.iter_mut().enumerate() {
            ensure!(u.space.mmu().tag().is_none(), "a new space has a PCID");
            frames[i] = frame(100 + i as u64);
            map_page(&mut u.space, VA, frames[i], USER_RW)?;
        }
        // A space that never ran unmaps and remaps its page (its flush
        // does nothing: no TLB entry can come from its tables yet); its
        // first switch must read the frame.
        if let Err(e) = users[0].space.unmap(VirtAddr(VA), PAGE_SIZE) {
            bail!("unmap: {e}");
        }
        map_page(&mut users[0].space, VA, frames[0], USER_RW)?;
        let mut sw = Switcher::new(3)?;
        let l0 = COUNTS
            .local_flushes
            .load(core::sync::atomic::Ordering::Relaxed);
        let mut remaps = 0u64;
        for round in 0..ROUNDS {
            for i in 0..N {
                sw.switch_user(&mut users[i])?;
                let what = Why::new(format_args!("space {i} (round {round})"));
                loads(what.as_str(), VA, super::multi::word(frames[i]))?;
                // `switch_mm` tagged the handle (loaded into CR3 only with
                // PCIDs on).
                ensure!(
                    users[i].space.mmu().tag().is_some(),
                    "space {i} runs without a PCID"
                );
                // A space that is not current moves its page to another
                // frame (an unmap flush by its PCID, maybe an old one).
                if round == 1 && i % 3 == 0 && remaps < 3 {
                    let t = (i + 5) % N;
                    let pa = frame(100 + N as u64 + remaps);
                    if let Err(e) = users[t].space.unmap(VirtAddr(VA), PAGE_SIZE) {
                        bail!("unmap: {e}");
                    }
                    map_page(&mut users[t].space, VA, pa, USER_RW)?;
                    frames[t] = pa;
                    remaps += 1;
                }
            }
        }
        let r = sw.rollovers();
        let local = COUNTS
            .local_flushes
            .load(core::sync::atomic::Ordering::Relaxed)
            - l0;
        sw.switch_kernel(kernel);
        load_faults("the kernel's space", VA)?;
        ensure!(r >= 2, "{r} roll-overs for {N} spaces on 7 PCIDs");
        ensure!(local == r, "{r} roll-overs but {local} local flushes");
        println!(
            "  switch_mm: {N} spaces, 3-bit PCIDs, {} switches, {r} roll-overs, {local} local flushes, {remaps} remaps of spaces not current; every switch read its own frame{}",
            N as u64 * ROUNDS,
            if pcids() { "" } else { " (no PCID: switch_mm's installs were plain CR3 writes)" }
        );
        Ok(())
    })
}

/// Word `i` of the frame at `pa`.
fn word_at(pa: u64, i: u64) -> u64 {
    // SAFETY: a frame of the cases' RAM (SPACE_FRAMES or the test pool,
    // which nothing else uses while the cases run), through the linear map.
    unsafe { (phys_to_virt(pa + 8 * i) as *const u64).read_volatile() }
}

/// Stores `v` into word `i` of the frame at `pa`.
fn set_word_at(pa: u64, i: u64, v: u64) {
    // SAFETY: as in `word_at`.
    unsafe { (phys_to_virt(pa + 8 * i) as *mut u64).write_volatile(v) }
}

/// A CPL-0 store of `v` to `va` goes through.
fn stores(what: &str, va: u64, v: u64) -> Result<(), Why> {
    // SAFETY: `va` is a user page of the installed space, mapping RAM of
    // the cases only.
    match unsafe { trap::write_u64(va, v) } {
        Ok(()) => Ok(()),
        Err(f) => bail!("{what}: store to {va:#x} faulted: error {:#x}", f.error),
    }
}

fn reclaim_full_table_no_alloc<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    with_users::<A, 1>(kernel, |_, [u]| {
        if let Err(e) = u.space.map(
            VirtAddr(RECLAIM_VA),
            PhysAddr(RECLAIM_PA),
            2 << 20,
            USER_RW,
            MapOptions::PAGES,
        ) {
            bail!("map the table's pages: {e}");
        }
        let mut sw = Switcher::new(12)?;
        sw.switch_user(u)?;
        // Loads from every page (the TLB caches them), stores to every
        // third (the MMU sets D).
        for i in 0..512u64 {
            let va = RECLAIM_VA + i * PAGE_SIZE;
            if i % 3 == 0 {
                stores("a page", va + 8, 0xda7a_0000 + i)?;
            }
            if let Err(f) = trap::read_u64(va) {
                bail!("load {va:#x}: error {:#x}", f.error);
            }
        }
        let live = Frames.live();
        let flushes = u.space.stats().flushes();
        Frames.refuse(true);
        let out = swap_out(&mut u.space);
        Frames.refuse(false);
        out?;
        let flushed = u.space.stats().flushes() - flushes;
        ensure!(
            Frames.live() == live,
            "{live} table frames before the swap-out, {} after",
            Frames.live()
        );
        ensure!(
            flushed == 512,
            "{flushed} flushes for 512 pages swapped out"
        );
        for i in 0..512u64 {
            load_faults("a swapped-out page", RECLAIM_VA + i * PAGE_SIZE)?;
        }
        Frames.refuse(true);
        let back = swap_in(&mut u.space);
        Frames.refuse(false);
        back?;
        ensure!(
            Frames.live() == live,
            "{live} table frames before the swap-in, {} after",
            Frames.live()
        );
        for i in (0..512u64).step_by(3) {
            loads(
                "a swapped-in page",
                RECLAIM_VA + i * PAGE_SIZE + 8,
                0xda7a_0000 + i,
            )?;
        }
        println!("  512 pages of one PTE table swapped out and in with every table allocation refused; {live} table frames throughout, one page flush each");
        Ok(())
    })
}

/// Every page of the reclaim case's table to a swap entry (slot `i`).
fn swap_out<A: Arch>(s: &mut AddressSpace<A, X86Mmu, Frames>) -> Result<(), Why> {
    for i in 0..512u64 {
        let va = VirtAddr(RECLAIM_VA + i * PAGE_SIZE);
        let old = match s.replace_pte(va, NewPte::Swap(i)) {
            Ok(old) => old,
            Err(e) => bail!("replace_pte {va} (swap-out): {e}"),
        };
        let pa = RECLAIM_PA + i * PAGE_SIZE;
        ensure!(
            old.pa() == Some(PhysAddr(pa)) && old.young(),
            "page {i}: replace_pte returned {old:?}, not the accessed page at {pa:#x}"
        );
        ensure!(
            old.dirty() == (i % 3 == 0),
            "page {i}: returned dirty = {}, but it was {}stored to",
            old.dirty(),
            if i % 3 == 0 { "" } else { "not " }
        );
        let now = s.ptep_get(va).and_then(|e| e.swap_value());
        ensure!(
            now == Some(i),
            "page {i}: the PTE holds {now:?}, not swap slot {i}"
        );
    }
    Ok(())
}

/// Every swap entry of the reclaim case back to its frame.
fn swap_in<A: Arch>(s: &mut AddressSpace<A, X86Mmu, Frames>) -> Result<(), Why> {
    for i in 0..512u64 {
        let va = VirtAddr(RECLAIM_VA + i * PAGE_SIZE);
        let page = NewPte::Page {
            pa: PhysAddr(RECLAIM_PA + i * PAGE_SIZE),
            prot: USER_RW,
        };
        match s.replace_pte(va, page) {
            Ok(old) => ensure!(
                old.swap_value() == Some(i),
                "page {i}: swap-in replaced {old:?}, not swap slot {i}"
            ),
            Err(e) => bail!("replace_pte {va} (swap-in): {e}"),
        }
    }
    Ok(())
}

fn cow_replace<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    const DATA: u64 = 0x0c0e_0000_0777;
    const MARK: u64 = 0x0c0b_0000_0001;
    let (f, copy) = (frame(70), frame(71));
    for i in 0..512 {
        set_word_at(f, i, 0);
    }
    set_word_at(f, 0, DATA);
    with_users::<A, 2>(kernel, |_, [parent, child]| {
        map_page(&mut parent.space, COW_VA, f, USER_RW)?;
        if let Err(e) = parent.space.copy_page_range(
            &mut child.space,
            VirtAddr(COW_VA),
            PAGE_SIZE,
            CopyMode::Cow,
            |_| {},
        ) {
            bail!("copy_page_range: {e}");
        }
        let mut sw = Switcher::new(12)?;
        sw.switch_user(child)?;
        loads("the child before the copy", COW_VA, DATA)?;
        store_faults(COW_VA + 16)?;
        // The fault handler: copy the frame, mark the copy, replace the
        // PTE.
        for i in 0..512 {
            set_word_at(copy, i, word_at(f, i));
        }
        set_word_at(copy, 3, MARK);
        let tables = Frames.live();
        let flushes = child.space.stats().flushes();
        let new = NewPte::Page {
            pa: PhysAddr(copy),
            prot: USER_RW,
        };
        let old = match child.space.replace_pte(VirtAddr(COW_VA), new) {
            Ok(old) => old,
            Err(e) => bail!("replace_pte (copy-on-write): {e}"),
        };
        let flushed = child.space.stats().flushes() - flushes;
        ensure!(
            old.pa() == Some(PhysAddr(f)) && old.prot().is_some_and(|p| !p.writable()),
            "replace_pte returned {old:?}, not the read-only shared frame {f:#x}"
        );
        ensure!(
            flushed == 1,
            "{flushed} flushes for the copy-on-write replace"
        );
        ensure!(
            Frames.live() == tables,
            "replace_pte allocated or freed a table"
        );
        loads("the child's copy", COW_VA + 24, MARK)?;
        loads("the child's copy", COW_VA, DATA)?;
        stores("the child's copy", COW_VA + 16, 0x5707e)?;
        ensure!(
            word_at(copy, 2) == 0x5707e && word_at(f, 2) == 0,
            "the child's store: copy word {:#x}, shared word {:#x}",
            word_at(copy, 2),
            word_at(f, 2)
        );
        sw.switch_user(parent)?;
        loads("the parent after the copy", COW_VA + 24, 0)?;
        store_faults(COW_VA + 16)?;
        println!("  copy-on-write fault in the child: frame {f:#x} replaced by its copy {copy:#x} with one page flush; the parent still shares {f:#x}, read-only");
        Ok(())
    })
}
