//! The `space_` cases of user address spaces switched by ASID, judged by
//! the MMU: each case builds user spaces with `new_user` (lower half,
//! TTBR0_EL1, user table attributes) beside the kernel's space (upper
//! half, TTBR1_EL1, kernel table attributes), switches among them through
//! an ASID allocator ([`Switcher`]) and checks with EL1 probes, and EL0
//! runs of the user program, what each space sees:
//!
//! - `space_table_attrs_kernel_and_user`: the table descriptors carry the
//!   kernel's (APTable\[0\], UXNTable) and the user's (PXNTable) table
//!   attributes;
//! - `space_isolation_by_asid`: four spaces map the same user address to
//!   four frames; every switch (by ASID, no flush) shows its own frame, to
//!   EL1 loads and stores and to EL0;
//! - `space_no_stale_after_switch`: after switching away and back, and
//!   after a space was remapped while another ran;
//! - `space_no_stale_after_unmap_in_other_space`: an unmap in a space that
//!   is not current faults once it is switched to;
//! - `space_no_stale_after_asid_rollover`: a 3-bit allocator (7 ASIDs), 10
//!   spaces, every switch checked across the roll-overs;
//! - `space_fork_cow_write_faults`: after `copy_page_range` with
//!   `CopyMode::Cow` a store faults in parent and child, at EL1 and EL0,
//!   and both read the same data;
//! - `space_swap_entry_survives_move`: a software entry moved with its PTE
//!   table (by entries, then a whole PTE table: 2 MiB with 4 KiB pages) is
//!   found at the new address, and every old address faults;
//! - `space_live_kernel_protect`: `change_protection_live` of a kernel data
//!   page RW -> RO -> RW, and a change that needs break-before-make is
//!   refused with nothing changed;
//! - `space_unmap_reports`: `unmap_with` reports every removed leaf (pa,
//!   size, dirty after EL1 stores to some of them through clean writable
//!   leaves, which the hardware marks dirty) and the swap entry, with one
//!   flush; the same through one `MmuGather` for two ranges (a PMD block,
//!   2 MiB with 4 KiB pages, and pages), flushed once by
//!   `MmuGather::finish`;
//! - `mm_reclaim_full_table_no_alloc`: `replace_pte` swaps out the pages
//!   of one whole PTE table (512, 2048 or 8192 with 4, 16 or 64 KiB
//!   pages) in place while the table allocator refuses
//!   every frame (each returned with its frame and the dirty state the
//!   hardware set, one page flush each, every page then faulting), and
//!   swaps them in again, the data there;
//! - `mm_cow_replace`: a copy-on-write fault handled with `replace_pte`:
//!   the child's PTE goes from the shared read-only frame to its copy
//!   with one page flush, the child's next load reads the copy (no stale
//!   translation) and its store goes through, the parent still shares the
//!   frame read-only;
//! - `mm_switch_mm`: spaces with unassigned MMU handles (no ASID, and a
//!   remap before their first switch flushes nothing) switched only by
//!   `AsidAllocator::switch_mm` on a 3-bit allocator: every switch reads
//!   the space's own frame, a space remapped while another ran reads its
//!   new frame (no stale translation), one local flush per roll-over and
//!   no other full flush;
//! - `space_asid_spaces_free_their_tables`: every table frame came back.
//!
//! Every size is the build's geometry (`geom.rs`): a page is
//! [`PAGE`] bytes, a PTE table maps [`PMD_SIZE`] bytes with [`ENTRIES`]
//! entries, and the fixed user addresses are aligned to what they need in
//! every geometry. In the 52-bit builds the switching cases (isolation,
//! stale translations after a switch, after an unmap in another space and
//! across roll-overs) give each space a second page at [`HIGH_VA`], above
//! 2^48, with a frame and a marker of its own, and check it as they check
//! the first.
//!
//! The cases on switching are in `switching.rs`, the `mm_` cases in
//! `mm.rs`, those on the other operations in `ops.rs`.
//!
//! Every case ends by installing the suite's test space again (untagged:
//! a full flush) and deactivating its spaces before they are dropped. The
//! switches inside a case must issue no full and no by-ASID flush: the
//! counts are checked, and printed in a table at the end.

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_arm64::bits::{AP_TABLE_NO_EL0, PXN_TABLE, UXN_TABLE};
use pgtable_arm64::mmu::asid_bits;
use pgtable_core::asid::AsidContext;
use pgtable_core::contract::{BbmReason, Format};
use pgtable_core::{
    CopyMode, Error, LeafEntry, LiveOptions, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr,
};

mod mm;
mod ops;
mod switching;

use crate::asids::{Proc, Switcher};
use crate::geom::{ENTRIES, MAX_PAGE, PAGE, PMD_SIZE, VA_BITS};
use crate::kmap::{Image, KernelSpace, DATA, RODATA};
use crate::memory::{self, phys_to_virt, KernelTables, PAGE_OFFSET};
use crate::platform::{unassigned_mmu, Arm64, FlushCounts};
use crate::println;
use crate::probe::{self, esr_class, is_translation_fault, EC_DABT_CUR, EC_DABT_LOWER, EC_SVC64};
use crate::space::{
    ensure, expect_user_abort, fail, load_faults, load_is, store_faults, Tally, Why, R,
};
use crate::user::{enter_user, load_program, ProgramLayout, USER_CODE};

/// The user address every space of a case maps, each to its own frame.
const SHARED_VA: u64 = 0x0100_0000;
/// A user stack page.
const STACK_VA: u64 = 0x0200_0000;
/// An address above 2^48 in the lower half, which the 52-bit builds
/// translate (TCR_EL1.T0SZ = 12): there the switching cases map a second
/// page of each space (see [`VAS`]).
const HIGH_VA: u64 = 0x000f_0000_0000_0000 + SHARED_VA;
/// Where the switching cases map and check the pages of each space: at
/// [`SHARED_VA`], and in the 52-bit builds also at [`HIGH_VA`] (each page
/// a frame of its own, [`marker_at`] in its first word).
const VAS: &[u64] = if VA_BITS == 52 {
    &[SHARED_VA, HIGH_VA]
} else {
    &[SHARED_VA]
};
/// Set in the marker of a space's page at [`HIGH_VA`] (the low byte of a
/// [`marker`] is 0).
const HIGH_MARK: u64 = 0x80;

const _: () = assert!(SHARED_VA % MAX_PAGE == 0 && STACK_VA % MAX_PAGE == 0);
const _: () = assert!(HIGH_VA >= 1 << 48 && HIGH_VA < 1 << 52);
/// User read-write data.
const USER_RW: Prot = Prot::USER.union(Prot::WRITE);
/// The 16-bit allocator's bitmap words (65 536 ASIDs).
const WORDS16: usize = 1024;
/// Spaces of the roll-over case, and the width of its allocator.
const ROLLOVER_SPACES: usize = 10;
const ROLLOVER_BITS: u32 = 3;

/// The word 0 each space's frame holds: a marker of the space.
const fn marker(i: usize) -> u64 {
    0x5eed_0000_0000 | (i as u64) << 8
}

/// The word 0 of space `i`'s page at `VAS[k]`.
const fn marker_at(i: usize, k: usize) -> u64 {
    if k == 0 {
        marker(i)
    } else {
        marker(i) | HIGH_MARK
    }
}

/// The frames of a space's pages at [`VAS`] (as many as it has).
type Pages = [u64; 2];

/// Pool frames handed out once each (never reused during the run).
struct Frames {
    next: u64,
    end: u64,
}

impl Frames {
    /// A zeroed frame with `word0` in its first word.
    fn take(&mut self, word0: u64) -> Result<u64, Why> {
        if self.next + PAGE > self.end {
            fail!("out of pool frames");
        }
        let pa = self.next;
        self.next += PAGE;
        // SAFETY: a pool frame nobody else uses during the space cases,
        // reached through the linear map.
        unsafe {
            core::ptr::write_bytes(phys_to_virt(pa) as *mut u8, 0, PAGE as usize);
            (phys_to_virt(pa) as *mut u64).write_volatile(word0);
        }
        Ok(pa)
    }
}

/// Word `i` of the frame at `pa`, through the linear map.
fn word(pa: u64, i: u64) -> u64 {
    // SAFETY: a pool frame of ours, in the linear map.
    unsafe { (phys_to_virt(pa + 8 * i) as *const u64).read_volatile() }
}

/// One line of the counts table.
#[derive(Clone, Copy, Default)]
struct Row {
    name: &'static str,
    switches: u64,
    rollovers: u64,
    flushes: FlushCounts,
}

/// Everything the cases share.
struct Ctx<'a> {
    kernel: &'a mut KernelSpace,
    test: &'a mut KernelSpace,
    img: Image,
    frames: Frames,
    code_pa: u64,
    layout: ProgramLayout,
    /// The allocator of the real user spaces: as wide as the CPU's ASIDs.
    main: Switcher<WORDS16>,
    /// A deliberately small one, for the roll-over case.
    small: Switcher<1>,
    rows: [Row; 13],
    nrows: usize,
}

/// The space `i` of a case, which must exist.
fn at<const N: usize>(ps: &mut [Option<Proc>; N], i: usize) -> Result<&mut Proc, Why> {
    match ps.get_mut(i).and_then(Option::as_mut) {
        Some(p) => Ok(p),
        None => fail!("space {i} was not built"),
    }
}

/// An EL1 store of `v` to user memory at `va` that must work.
fn store_ok(what: &str, va: u64, v: u64) -> R {
    // SAFETY: every caller passes a user address of the current space,
    // which maps only pool frames of the cases.
    if let Err(f) = unsafe { probe::write_u64(va, v) } {
        fail!("{what}: a store to {va:#x} faulted: ESR {:#x}", f.esr);
    }
    Ok(())
}

impl Ctx<'_> {
    /// A new user space of the kernel with the user program at
    /// [`USER_CODE`].
    fn new_proc(&mut self) -> Result<Proc, Why> {
        // SAFETY: the kernel space lives until the run ends.
        let mut space =
            unsafe { KernelSpace::new_user(self.kernel, unassigned_mmu(), KernelTables) }
                .map_err(|e| Why::new(format_args!("new_user: {e}")))?;
        space
            .map(
                VirtAddr(USER_CODE),
                PhysAddr(self.code_pa),
                PAGE,
                Prot::USER | Prot::EXEC,
                MapOptions::PAGES,
            )
            .map_err(|e| Why::new(format_args!("mapping the program: {e}")))?;
        Ok(Proc {
            space,
            ctx: AsidContext::NEW,
        })
    }

    /// A new user space mapping a fresh frame holding `word0` at
    /// [`SHARED_VA`]; returns it and the frame.
    fn proc_with_frame(&mut self, word0: u64) -> Result<(Proc, u64), Why> {
        let mut p = self.new_proc()?;
        let f = self.frames.take(word0)?;
        map(&mut p.space, SHARED_VA, f)?;
        Ok((p, f))
    }

    /// A new user space with a page at every address of [`VAS`], each a
    /// fresh frame holding [`marker_at`]`(i, k)`; returns it and the
    /// frames.
    fn proc_with_pages(&mut self, i: usize) -> Result<(Proc, Pages), Why> {
        let mut p = self.new_proc()?;
        let mut f = [0; 2];
        for (k, &va) in VAS.iter().enumerate() {
            f[k] = self.frames.take(marker_at(i, k))?;
            map(&mut p.space, va, f[k])?;
        }
        Ok((p, f))
    }

    /// Runs `body` as the case `name` on `N` spaces, then puts the test
    /// space back and retires the spaces; records the switches, roll-overs
    /// and flushes of the case.
    fn run<const N: usize>(
        &mut self,
        t: &mut Tally,
        name: &'static str,
        body: impl FnOnce(&mut Self, &mut [Option<Proc>; N]) -> R,
    ) {
        t.case(name, || {
            let mut ps: [Option<Proc>; N] = [const { None }; N];
            let f0 = FlushCounts::now();
            let (s0, r0) = (
                self.main.switches + self.small.switches,
                self.main.rollovers() + self.small.rollovers(),
            );
            let r = body(self, &mut ps);
            let row = Row {
                name,
                switches: self.main.switches + self.small.switches - s0,
                rollovers: self.main.rollovers() + self.small.rollovers() - r0,
                flushes: FlushCounts::now().since(f0),
            };
            if let Some(slot) = self.rows.get_mut(self.nrows) {
                *slot = row;
                self.nrows += 1;
            }
            // SAFETY: the test space maps nothing the kernel uses; its
            // untagged install ends with a full TLB flush, so no entry of
            // the case's spaces (any ASID) is left when they are
            // deactivated and dropped.
            unsafe { self.test.install() };
            for p in ps.iter_mut().flatten() {
                // SAFETY: see above.
                unsafe { p.space.deactivate() };
            }
            r
        });
    }

    /// Switches to `p` through the main allocator.
    fn switch(&mut self, p: &mut Proc) -> Result<u16, Why> {
        // SAFETY: case spaces map only pool frames and the program, in the
        // lower half; only the main allocator switches them (the roll-over
        // case, the one user of the small allocator, starts and ends with
        // a full flush).
        unsafe { self.main.switch(p) }
    }

    /// Runs the user program at EL0 with x0 = `x0` and its stack at the
    /// top of the page at `stack`: it loads [x0], returns that plus 1 and
    /// stores it at [x0 + 8].
    fn el0(&self, x0: u64, stack: u64) -> crate::user::UserExit {
        // SAFETY: the installed TTBR0_EL1 space maps the program.
        unsafe { enter_user(USER_CODE, stack + PAGE, x0, 0) }
    }

    /// Checks an EL0 run that must end with the program's SVC returning
    /// `want`.
    fn el0_returns(&self, what: &str, x0: u64, stack: u64, want: u64) -> R {
        let e = self.el0(x0, stack);
        ensure!(
            esr_class(e.esr) == EC_SVC64 && e.elr == USER_CODE + self.layout.after_svc,
            "{what}: EL0 came back with ESR {:#x} FAR {:#x} ELR {:#x}, not its SVC",
            e.esr,
            e.far,
            e.elr
        );
        ensure!(
            e.x0 == want,
            "{what}: EL0 returned {:#x}, expected {want:#x}",
            e.x0
        );
        Ok(())
    }
}

/// Maps the frame `pa` at `va`, user read-write.
fn map(space: &mut KernelSpace, va: u64, pa: u64) -> R {
    space
        .map(VirtAddr(va), PhysAddr(pa), PAGE, USER_RW, MapOptions::PAGES)
        .map_err(|e| Why::new(format_args!("map {va:#x}: {e}")))
}

/// Prints, in the 52-bit builds, that `what` was checked at [`HIGH_VA`].
fn report_high(what: &str) {
    if VAS.contains(&HIGH_VA) {
        println!("  {HIGH_VA:#x} (above 2^48, {VA_BITS}-bit VAs; a page of its own in each space) checked too: {what}");
    }
}

/// The parts of the test pool the cases use (physical, each aligned to
/// what it holds).
#[derive(Clone, Copy)]
struct PoolUse {
    /// The frames handed out by [`Frames`]: 256 pages from 1 MiB into the
    /// pool (the EL0 cases of space.rs use its first two pages).
    frames: (u64, u64),
    /// A PMD block for `space_unmap_reports`.
    block: u64,
    /// A PTE table's worth of pages for `mm_reclaim_full_table_no_alloc`.
    reclaim: u64,
}

impl PoolUse {
    fn new(pool: (u64, u64)) -> Result<PoolUse, Why> {
        let frames = (pool.0 + (1 << 20), pool.0 + (1 << 20) + 256 * PAGE);
        let block = frames.1.next_multiple_of(PMD_SIZE);
        let reclaim = block + PMD_SIZE;
        ensure!(
            pool.0 % PAGE == 0 && reclaim + PMD_SIZE <= pool.1,
            "the pool {:#x}..{:#x} has no room for 256 pages and two PMDs ({PMD_SIZE:#x} bytes each)",
            pool.0,
            pool.1
        );
        Ok(PoolUse {
            frames,
            block,
            reclaim,
        })
    }
}

/// Fails if switches issued a full or by-ASID flush since `f0`.
fn no_full_flush(f0: FlushCounts) -> R {
    let d = FlushCounts::now().since(f0);
    ensure!(
        d.all == 0 && d.asid == 0 && d.local == 0,
        "switching flushed: {} full, {} by ASID, {} local",
        d.all,
        d.asid,
        d.local
    );
    Ok(())
}

/// Runs the cases on user spaces of `kernel`; `test` is the suite's test
/// space, installed in TTBR0_EL1 before and after; `pool` the test pool.
pub fn cases(
    t: &mut Tally,
    kernel: &mut KernelSpace,
    test: &mut KernelSpace,
    img: &Image,
    pool: (u64, u64),
) {
    let (live_before, _) = memory::tables_live();
    let width = asid_bits();
    let setup = (|| {
        let parts = PoolUse::new(pool)?;
        let mut frames = Frames {
            next: parts.frames.0,
            end: parts.frames.1,
        };
        let code_pa = frames.take(0)?;
        // SAFETY: a pool frame of ours.
        let layout = unsafe { load_program(code_pa) };
        let main = Switcher::new(width.bits(), width)?;
        let small = Switcher::new(ROLLOVER_BITS, width)?;
        Ok::<_, Why>((parts, frames, code_pa, layout, main, small))
    })();
    let (parts, frames, code_pa, layout, main, small) = match setup {
        Ok(s) => s,
        Err(why) => {
            t.case("space_isolation_by_asid", || Err(why));
            return;
        }
    };
    let mut cx = Ctx {
        kernel,
        test,
        img: *img,
        frames,
        code_pa,
        layout,
        main,
        small,
        rows: [Row::default(); 13],
        nrows: 0,
    };
    println!(
        "ASIDs: {} bits (TCR_EL1.AS), allocators of {} and {} bits",
        width.bits(),
        cx.main.bits(),
        cx.small.bits()
    );
    cx.run(
        t,
        "space_table_attrs_kernel_and_user",
        switching::table_attrs,
    );
    cx.run(t, "space_isolation_by_asid", switching::isolation);
    cx.run(
        t,
        "space_no_stale_after_switch",
        switching::no_stale_after_switch,
    );
    cx.run(
        t,
        "space_no_stale_after_unmap_in_other_space",
        switching::no_stale_after_unmap_in_other_space,
    );
    cx.run(
        t,
        "space_no_stale_after_asid_rollover",
        switching::no_stale_after_asid_rollover,
    );
    cx.run(t, "space_fork_cow_write_faults", ops::fork_cow);
    cx.run(
        t,
        "space_swap_entry_survives_move",
        ops::swap_entry_survives_move,
    );
    cx.run(
        t,
        "space_live_kernel_protect",
        |cx, _: &mut [Option<Proc>; 0]| ops::live_kernel_protect(cx, pool),
    );
    cx.run(t, "space_unmap_reports", |cx, ps| {
        ops::unmap_reports(cx, ps, parts.block)
    });
    cx.run(t, "mm_reclaim_full_table_no_alloc", |cx, ps| {
        mm::reclaim_full_table_no_alloc(cx, ps, parts.reclaim)
    });
    cx.run(t, "mm_cow_replace", mm::cow_replace);
    cx.run(t, "mm_prot_none", ops::prot_none);
    cx.run(t, "mm_switch_mm", mm::switch_mm);
    let small_names = ["space_no_stale_after_asid_rollover", "mm_switch_mm"];
    println!();
    println!("ASID switches and TLB flushes per case (flushes: range / by ASID / all / local after a roll-over)");
    println!(
        "{:<44} {:>5} {:>9} {:>10} {:>6} {:>8} {:>4} {:>6}",
        "case", "bits", "switches", "roll-overs", "range", "by-ASID", "all", "local"
    );
    let mut sum = Row::default();
    for r in &cx.rows[..cx.nrows] {
        let bits = if r.switches == 0 {
            0
        } else if small_names.contains(&r.name) {
            cx.small.bits()
        } else {
            cx.main.bits()
        };
        println!(
            "{:<44} {:>5} {:>9} {:>10} {:>6} {:>8} {:>4} {:>6}",
            r.name,
            bits,
            r.switches,
            r.rollovers,
            r.flushes.range,
            r.flushes.asid,
            r.flushes.all,
            r.flushes.local
        );
        sum.switches += r.switches;
        sum.rollovers += r.rollovers;
        sum.flushes.range += r.flushes.range;
        sum.flushes.asid += r.flushes.asid;
        sum.flushes.all += r.flushes.all;
        sum.flushes.local += r.flushes.local;
    }
    println!(
        "{:<44} {:>5} {:>9} {:>10} {:>6} {:>8} {:>4} {:>6}",
        "total",
        "",
        sum.switches,
        sum.rollovers,
        sum.flushes.range,
        sum.flushes.asid,
        sum.flushes.all,
        sum.flushes.local
    );
    println!();
    t.case("space_asid_spaces_free_their_tables", || {
        let (live, _) = memory::tables_live();
        ensure!(
            live == live_before,
            "{live_before} table frames live before the cases, {live} after"
        );
        Ok(())
    });
}
