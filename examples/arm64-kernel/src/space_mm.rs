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
//!   table (by entries, then a whole 2 MiB table) is found at the new
//!   address, and every old address faults;
//! - `space_live_kernel_protect`: `change_protection_live` of a kernel data
//!   page RW -> RO -> RW, and a change that needs break-before-make is
//!   refused with nothing changed;
//! - `space_unmap_reports`: `unmap_with` reports every removed leaf (pa,
//!   size, dirty after EL1 stores to some of them through clean writable
//!   leaves, which the hardware marks dirty) and the swap entry, with one
//!   flush; the same through one `MmuGather` for two ranges (a 2 MiB
//!   block and pages), flushed once by `tlb_finish_mmu`;
//! - `space_asid_spaces_free_their_tables`: every table frame came back.
//!
//! Every case ends by installing the suite's test space again (untagged:
//! a full flush) and deactivating its spaces before they are dropped. The
//! switches inside a case must issue no full and no by-ASID flush: the
//! counts are checked, and printed in a table at the end.

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_arm64::desc::{AP_TABLE_NO_EL0, PXN_TABLE, UXN_TABLE};
use pgtable_arm64::mmu::asid_bits;
use pgtable_core::asid::AsidContext;
use pgtable_core::{
    CopyMode, Error, Format, LiveOptions, MapOptions, PhysAddr, Prot, Removed, VirtAddr,
};

use crate::asids::{Proc, Switcher};
use crate::kmap::{Image, KernelSpace, DATA, RODATA};
use crate::memory::{self, phys_to_virt, KernelTables, PAGE_OFFSET};
use crate::platform::{lower_mmu, Arm64, FlushCounts};
use crate::println;
use crate::probe::{self, esr_class, is_translation_fault, EC_DABT_CUR, EC_DABT_LOWER, EC_SVC64};
use crate::space::{ensure, expect_user_abort, fail, store_faults, Tally, Why, R};
use crate::user::{enter_user, load_program, ProgramLayout, USER_CODE};

/// The user address every space of a case maps, each to its own frame.
const SHARED_VA: u64 = 0x0100_0000;
/// A user stack page.
const STACK_VA: u64 = 0x0200_0000;
/// User read-write data.
const USER_RW: Prot = Prot::new(Prot::USER | Prot::WRITE);
/// The 16-bit allocator's bitmap words (65 536 ASIDs).
const WORDS16: usize = 1024;
/// Spaces of the roll-over case, and the width of its allocator.
const ROLLOVER_SPACES: usize = 10;
const ROLLOVER_BITS: u32 = 3;

/// The word 0 each space's frame holds: a marker of the space.
const fn marker(i: usize) -> u64 {
    0x5eed_0000_0000 | (i as u64) << 8
}

/// Pool frames handed out once each (never reused during the run).
struct Frames {
    next: u64,
    end: u64,
}

impl Frames {
    /// A zeroed frame with `word0` in its first word.
    fn take(&mut self, word0: u64) -> Result<u64, Why> {
        if self.next + 4096 > self.end {
            fail!("out of pool frames");
        }
        let pa = self.next;
        self.next += 4096;
        // SAFETY: a pool frame nobody else uses during the space cases,
        // reached through the linear map.
        unsafe {
            core::ptr::write_bytes(phys_to_virt(pa) as *mut u8, 0, 4096);
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
    rows: [Row; 10],
    nrows: usize,
}

/// The space `i` of a case, which must exist.
fn at<const N: usize>(ps: &mut [Option<Proc>; N], i: usize) -> Result<&mut Proc, Why> {
    match ps.get_mut(i).and_then(Option::as_mut) {
        Some(p) => Ok(p),
        None => fail!("space {i} was not built"),
    }
}

/// An EL1 load from `va` that must return `want`.
fn load_is(what: &str, va: u64, want: u64) -> R {
    match probe::read_u64(va) {
        Ok(v) => ensure!(
            v == want,
            "{what}: {va:#x} reads {v:#x}, expected {want:#x}"
        ),
        Err(f) => fail!("{what}: a load from {va:#x} faulted: ESR {:#x}", f.esr),
    }
    Ok(())
}

/// An EL1 load from `va` that must take a translation fault.
fn load_faults(what: &str, va: u64) -> R {
    match probe::read_u64(va) {
        Ok(v) => fail!("{what}: {va:#x} still translates (reads {v:#x})"),
        Err(f) => ensure!(
            f.class() == EC_DABT_CUR && is_translation_fault(f.esr) && f.far == va,
            "{what}: a load from {va:#x}: ESR {:#x} FAR {:#x}, expected a translation fault",
            f.esr,
            f.far
        ),
    }
    Ok(())
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
        let mut space = unsafe { KernelSpace::new_user(self.kernel, lower_mmu(), KernelTables) }
            .map_err(|e| Why::new(format_args!("new_user: {e}")))?;
        space
            .map(
                VirtAddr(USER_CODE),
                PhysAddr(self.code_pa),
                4096,
                Prot::new(Prot::USER | Prot::EXEC),
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
        unsafe { enter_user(USER_CODE, stack + 4096, x0, 0) }
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
        .map(VirtAddr(va), PhysAddr(pa), 4096, USER_RW, MapOptions::PAGES)
        .map_err(|e| Why::new(format_args!("map {va:#x}: {e}")))
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

fn table_attrs(cx: &mut Ctx, ps: &mut [Option<Proc>; 1]) -> R {
    let k = cx.kernel.entry(VirtAddr(PAGE_OFFSET), 3).unwrap_or(0);
    ensure!(
        k & (AP_TABLE_NO_EL0 | UXN_TABLE) == AP_TABLE_NO_EL0 | UXN_TABLE && k & PXN_TABLE == 0,
        "the kernel's root entry for {PAGE_OFFSET:#x} is {k:#x}: expected APTable[0] and UXNTable, not PXNTable"
    );
    ps[0] = Some(cx.new_proc()?);
    let p = at(ps, 0)?;
    let u = p.space.entry(VirtAddr(USER_CODE), 3).unwrap_or(0);
    ensure!(
        u & PXN_TABLE != 0 && u & (AP_TABLE_NO_EL0 | UXN_TABLE) == 0,
        "a user root entry is {u:#x}: expected PXNTable only"
    );
    Ok(())
}

fn isolation(cx: &mut Ctx, ps: &mut [Option<Proc>; 4]) -> R {
    let mut frames = [0u64; 4];
    for (i, f) in frames.iter_mut().enumerate() {
        let (p, pa) = cx.proc_with_frame(marker(i))?;
        ps[i] = Some(p);
        *f = pa;
    }
    let f0 = FlushCounts::now();
    let mut asids = [0u16; 4];
    for round in 0..3u64 {
        for (i, asid) in asids.iter_mut().enumerate() {
            let p = at(ps, i)?;
            let a = cx.switch(p)?;
            if round == 0 {
                *asid = a;
            }
            ensure!(
                a == *asid,
                "space {i} went from ASID {} to {a} without a roll-over",
                *asid
            );
            load_is("EL1", SHARED_VA, marker(i))?;
            store_ok("EL1", SHARED_VA + 16, round << 32 | i as u64)?;
            cx.el0_returns("EL0", SHARED_VA, SHARED_VA, marker(i) + 1)?;
        }
    }
    for i in 0..4 {
        for j in 0..i {
            ensure!(
                asids[i] != asids[j],
                "spaces {j} and {i} share ASID {}",
                asids[i]
            );
        }
        let f = frames[i];
        ensure!(
            word(f, 1) == marker(i) + 1 && word(f, 2) == 2 << 32 | i as u64,
            "frame of space {i} holds {:#x}, {:#x}: another space's stores reached it",
            word(f, 1),
            word(f, 2)
        );
    }
    no_full_flush(f0)
}

fn no_stale_after_switch(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
    let (a, fa) = cx.proc_with_frame(marker(0))?;
    let (b, fb) = cx.proc_with_frame(marker(1))?;
    let fc = cx.frames.take(marker(2))?;
    ps[0] = Some(a);
    ps[1] = Some(b);
    let f0 = FlushCounts::now();
    for (round, (i, m, f)) in [(0, marker(0), fa), (1, marker(1), fb), (0, marker(0), fa)]
        .into_iter()
        .enumerate()
    {
        let p = at(ps, i)?;
        cx.switch(p)?;
        load_is("after the switch", SHARED_VA, m)?;
        store_ok("after the switch", SHARED_VA + 8, 0xa0 + round as u64)?;
        ensure!(
            word(f, 1) == 0xa0 + round as u64,
            "the store of switch {round} did not reach space {i}'s frame"
        );
    }
    // Remap B while A runs (and holds its translation in the TLB).
    let b = at(ps, 1)?;
    b.space
        .unmap(VirtAddr(SHARED_VA), 4096)
        .map_err(|e| Why::new(format_args!("unmap: {e}")))?;
    map(&mut b.space, SHARED_VA, fc)?;
    let f1 = FlushCounts::now();
    let b = at(ps, 1)?;
    cx.switch(b)?;
    load_is("space B after its remap", SHARED_VA, marker(2))?;
    let a = at(ps, 0)?;
    cx.switch(a)?;
    load_is("space A after B's remap", SHARED_VA, marker(0))?;
    no_full_flush(f0)?;
    no_full_flush(f1)
}

fn no_stale_after_unmap_in_other_space(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
    let (a, _) = cx.proc_with_frame(marker(0))?;
    let (mut b, _) = cx.proc_with_frame(marker(1))?;
    let stack = cx.frames.take(0)?;
    map(&mut b.space, STACK_VA, stack)?;
    ps[0] = Some(a);
    ps[1] = Some(b);
    let f0 = FlushCounts::now();
    // B's translation of SHARED_VA gets into the TLB under B's ASID.
    let b = at(ps, 1)?;
    cx.switch(b)?;
    load_is("space B", SHARED_VA, marker(1))?;
    cx.el0_returns("space B at EL0", SHARED_VA, STACK_VA, marker(1) + 1)?;
    let a = at(ps, 0)?;
    cx.switch(a)?;
    load_is("space A", SHARED_VA, marker(0))?;
    // Unmap in B, which is not current.
    let b = at(ps, 1)?;
    b.space
        .unmap(VirtAddr(SHARED_VA), 4096)
        .map_err(|e| Why::new(format_args!("unmap: {e}")))?;
    cx.switch(b)?;
    load_faults("space B after the unmap", SHARED_VA)?;
    let e = cx.el0(SHARED_VA, STACK_VA);
    ensure!(
        esr_class(e.esr) == EC_DABT_LOWER && is_translation_fault(e.esr) && e.far == SHARED_VA,
        "space B at EL0 after the unmap: ESR {:#x} FAR {:#x} ELR {:#x}, expected a translation fault at {SHARED_VA:#x}",
        e.esr,
        e.far,
        e.elr
    );
    let a = at(ps, 0)?;
    cx.switch(a)?;
    load_is("space A after B's unmap", SHARED_VA, marker(0))?;
    let d = FlushCounts::now().since(f0);
    ensure!(
        d.all == 0 && d.local == 0,
        "flushed everything: {} full, {} local",
        d.all,
        d.local
    );
    Ok(())
}

fn no_stale_after_asid_rollover(cx: &mut Ctx, ps: &mut [Option<Proc>; ROLLOVER_SPACES]) -> R {
    let mut frames = [0u64; ROLLOVER_SPACES];
    for (i, f) in frames.iter_mut().enumerate() {
        let (p, pa) = cx.proc_with_frame(marker(i))?;
        ps[i] = Some(p);
        *f = pa;
    }
    // The small allocator reuses numbers the main one handed out: the TLB
    // holds none of them, since the previous case ended with the test
    // space's install (a full flush) and nothing ran under an ASID since.
    let f0 = FlushCounts::now();
    let r0 = cx.small.rollovers();
    let mut last = [0u16; ROLLOVER_SPACES];
    for round in 0..4u64 {
        for (i, l) in last.iter_mut().enumerate() {
            let p = at(ps, i)?;
            // SAFETY: as in `Ctx::switch`; the TLB held no entry of a
            // nonzero ASID when the case began (see above), and the install
            // of the test space at its end flushes it.
            let a = unsafe { cx.small.switch(p) }?;
            *l = a;
            load_is("after the switch", SHARED_VA, marker(i))?;
            store_ok("after the switch", SHARED_VA + 8, round << 32 | i as u64)?;
        }
    }
    let rollovers = cx.small.rollovers() - r0;
    for (i, &f) in frames.iter().enumerate() {
        ensure!(
            word(f, 1) == 3 << 32 | i as u64,
            "frame of space {i} holds {:#x}: a store went to another space",
            word(f, 1)
        );
    }
    let d = FlushCounts::now().since(f0);
    ensure!(
        rollovers >= 2,
        "{rollovers} roll-overs for {ROLLOVER_SPACES} spaces on {} ASIDs",
        (1 << ROLLOVER_BITS) - 1
    );
    ensure!(
        d.local == rollovers && d.all == 0 && d.asid == 0,
        "{rollovers} roll-overs but {} local, {} full, {} by-ASID flushes",
        d.local,
        d.all,
        d.asid
    );
    Ok(())
}

fn fork_cow(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
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
        .copy_page_range(&mut child.space, VirtAddr(SHARED_VA), 4096, CopyMode::Cow)
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

fn swap_entry_survives_move(cx: &mut Ctx, ps: &mut [Option<Proc>; 1]) -> R {
    const SRC: u64 = 0x0400_0000;
    const MID: u64 = 0x0800_5000;
    const MID_TABLE: u64 = 0x0800_0000;
    const DST_TABLE: u64 = 0x0a00_0000;
    const DST: u64 = DST_TABLE + (MID - MID_TABLE);
    const SWP: u64 = 0x5_a5a5;
    let mut p = cx.new_proc()?;
    let f0 = cx.frames.take(marker(0))?;
    let f2 = cx.frames.take(marker(2))?;
    map(&mut p.space, SRC, f0)?;
    map(&mut p.space, SRC + 0x2000, f2)?;
    p.space
        .set_swap_entry(VirtAddr(SRC + 0x1000), SWP)
        .map_err(|e| Why::new(format_args!("set_swap_entry: {e}")))?;
    ps[0] = Some(p);
    let p = at(ps, 0)?;
    cx.switch(p)?;
    let check = |p: &Proc, base: u64, old: &[u64]| -> R {
        ensure!(
            p.space.swap_entry(VirtAddr(base + 0x1000)) == Some(SWP),
            "no swap entry {SWP:#x} at {:#x}",
            base + 0x1000
        );
        load_is("a moved page", base, marker(0))?;
        load_is("a moved page", base + 0x2000, marker(2))?;
        load_faults("the swap entry", base + 0x1000)?;
        for &o in old {
            ensure!(
                p.space.swap_entry(VirtAddr(o + 0x1000)).is_none(),
                "the swap entry is still at {:#x}",
                o + 0x1000
            );
            for off in [0, 0x1000, 0x2000] {
                load_faults("an old address", o + off)?;
            }
        }
        Ok(())
    };
    check(p, SRC, &[])?;
    // A move of entries within PTE tables (not 2 MiB aligned).
    p.space
        .move_page_tables(VirtAddr(SRC), VirtAddr(MID), 0x3000)
        .map_err(|e| Why::new(format_args!("move of the PTEs: {e}")))?;
    check(p, MID, &[SRC])?;
    // A 2 MiB-aligned move: the whole PTE table goes.
    let table = p.space.entry(VirtAddr(MID_TABLE), 1).unwrap_or(0);
    p.space
        .move_page_tables(VirtAddr(MID_TABLE), VirtAddr(DST_TABLE), 2 << 20)
        .map_err(|e| Why::new(format_args!("move of the table: {e}")))?;
    let moved = p.space.entry(VirtAddr(DST_TABLE), 1).unwrap_or(0);
    ensure!(
        table != 0 && moved == table,
        "the 2 MiB move did not move the PTE table whole: entry {table:#x} before, {moved:#x} after"
    );
    ensure!(
        p.space.entry(VirtAddr(MID_TABLE), 1).unwrap_or(0) == 0,
        "the old PMD entry is still set"
    );
    check(p, DST, &[SRC, MID])
}

/// A page of kernel data of its own (in `.bss`).
#[repr(C, align(4096))]
struct LivePage([AtomicU64; 512]);

static LIVE_PAGE: LivePage = LivePage([const { AtomicU64::new(0) }; 512]);

fn live_kernel_protect(cx: &mut Ctx, pool: (u64, u64)) -> R {
    let va = &raw const LIVE_PAGE as u64;
    let (d0, d1) = cx.img.data;
    ensure!(va >= d0 && va < d1, "{va:#x} is not in the kernel data");
    let t = cx.kernel.translate(VirtAddr(va));
    ensure!(
        t.map(|t| t.height) == Some(0),
        "{va:#x} is not mapped by a 4 KiB page ({t:?})"
    );
    let in_place = |cx: &mut Ctx, prot: Prot| {
        cx.kernel
            .change_protection_live(VirtAddr(va), 4096, prot, LiveOptions::IN_PLACE)
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

    // A 4 KiB part of a linear-map block (pool memory): a split, which
    // needs break-before-make on arm64, is refused in place.
    let lin = phys_to_virt((pool.1 - (4 << 20)).next_multiple_of(2 << 20));
    let Some(t) = cx.kernel.translate(VirtAddr(lin)) else {
        fail!("{lin:#x} is not in the linear map");
    };
    ensure!(t.height >= 1, "{lin:#x} is mapped by a page, not a block");
    let before = cx.kernel.entry(VirtAddr(lin), t.height);
    let r = cx
        .kernel
        .change_protection_live(VirtAddr(lin), 4096, RODATA, LiveOptions::IN_PLACE);
    ensure!(
        r == Err(Error::BreakBeforeMake(VirtAddr(lin))),
        "splitting a block in place: {r:?}, expected BreakBeforeMake({lin:#x})"
    );
    ensure!(
        cx.kernel.entry(VirtAddr(lin), t.height) == before,
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
    fn push(&mut self, x: Removed<Arm64>) {
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

fn unmap_reports(cx: &mut Ctx, ps: &mut [Option<Proc>; 1], pool: (u64, u64)) -> R {
    use aarch64_cpu::registers::TCR_EL1;
    use tock_registers::interfaces::Readable;

    const BASE: u64 = 0x0300_0000;
    const PAGES: u64 = 8;
    const SWP_VA: u64 = BASE + PAGES * 4096;
    const SWP: u64 = 0x77;
    const DIRTY: [u64; 3] = [1, 3, 6];
    const BLK_VA: u64 = 0x0600_0000;
    const BASE2: u64 = 0x0a00_0000;
    ensure!(
        TCR_EL1.get() & (1 << 40) != 0,
        "needs hardware dirty-state updates (TCR_EL1.HD)"
    );
    let mut p = cx.new_proc()?;
    let mut fr = [0u64; PAGES as usize];
    for (i, f) in fr.iter_mut().enumerate() {
        *f = cx.frames.take(marker(i))?;
        map(&mut p.space, BASE + 4096 * i as u64, *f)?;
    }
    p.space
        .set_swap_entry(VirtAddr(SWP_VA), SWP)
        .map_err(|e| Why::new(format_args!("set_swap_entry: {e}")))?;
    // A 2 MiB block of pool memory (past the frames the cases take).
    let blk_pa = (pool.0 + (2 << 20)).next_multiple_of(2 << 20);
    ensure!(
        blk_pa + (2 << 20) <= pool.1,
        "no room for a 2 MiB block in the pool"
    );
    p.space
        .map(
            VirtAddr(BLK_VA),
            PhysAddr(blk_pa),
            2 << 20,
            USER_RW,
            MapOptions::PMD_BLOCKS,
        )
        .map_err(|e| Why::new(format_args!("map the block: {e}")))?;
    let fr2 = [cx.frames.take(marker(20))?, cx.frames.take(marker(21))?];
    for (i, &f) in fr2.iter().enumerate() {
        map(&mut p.space, BASE2 + 4096 * i as u64, f)?;
    }
    ps[0] = Some(p);
    let p = at(ps, 0)?;
    cx.switch(p)?;
    // Loads from every page, stores to some: only those become dirty.
    for i in 0..PAGES {
        load_is("a page", BASE + 4096 * i, marker(i as usize))?;
    }
    for i in DIRTY {
        store_ok("a page", BASE + 4096 * i + 8, 1)?;
    }
    store_ok("the block", BLK_VA + 0x1008, 1)?;
    load_is("a page", BASE2, marker(20))?;

    // unmap_with: the pages and the swap entry, one flush.
    let f0 = FlushCounts::now();
    let mut got = Reports::default();
    p.space
        .unmap_with(VirtAddr(BASE), (PAGES + 1) * 4096, |x| got.push(x))
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
        let i = (r.va - BASE) / 4096;
        ensure!(
            r.va >= BASE && i < PAGES && r.pa == fr[i as usize] && r.size == 4096,
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
        load_faults("an unmapped page", BASE + 4096 * i)?;
    }

    // One gather for the block and two pages: one flush at the end.
    let f0 = FlushCounts::now();
    let mut tlb = p.space.tlb_gather_mmu();
    let mut got = Reports::default();
    let r1 = p
        .space
        .unmap_with_gathered(&mut tlb, VirtAddr(BLK_VA), 2 << 20, |x| got.push(x));
    let r2 = p
        .space
        .unmap_with_gathered(&mut tlb, VirtAddr(BASE2), 2 * 4096, |x| got.push(x));
    let before_finish = FlushCounts::now().since(f0);
    if p.space.tlb_finish_mmu(tlb).is_err() {
        fail!("tlb_finish_mmu refused the space's own gather");
    }
    let d = FlushCounts::now().since(f0);
    r1.map_err(|e| Why::new(format_args!("unmap_with_gathered (block): {e}")))?;
    r2.map_err(|e| Why::new(format_args!("unmap_with_gathered (pages): {e}")))?;
    let g = got.get();
    ensure!(
        g.len() == 3
            && g[0].va == BLK_VA
            && g[0].pa == blk_pa
            && g[0].size == 2 << 20
            && g[0].dirty,
        "gathered reports {g:x?}: expected the dirty 2 MiB block at {blk_pa:#x} first"
    );
    for (k, r) in g[1..].iter().enumerate() {
        ensure!(
            r.va == BASE2 + 4096 * k as u64 && r.pa == fr2[k] && r.size == 4096 && !r.dirty,
            "gathered report {r:x?} does not match clean page {k}"
        );
    }
    ensure!(
        before_finish == FlushCounts::default() && d.range + d.asid + d.all == 1,
        "the gather flushed {before_finish:?} before tlb_finish_mmu and {d:?} in all: expected one flush, at the end"
    );
    load_faults("the unmapped block", BLK_VA + 0x1000)?;
    load_faults("an unmapped page", BASE2)
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
    // Frames from 1 MiB into the pool (the EL0 cases of space.rs use its
    // first two).
    let mut frames = Frames {
        next: pool.0 + (1 << 20),
        end: pool.0 + (2 << 20),
    };
    let setup = (|| {
        let code_pa = frames.take(0)?;
        // SAFETY: a pool frame of ours.
        let layout = unsafe { load_program(code_pa) };
        let main = Switcher::new(width.bits(), width)?;
        let small = Switcher::new(ROLLOVER_BITS, width)?;
        Ok::<_, Why>((code_pa, layout, main, small))
    })();
    let (code_pa, layout, main, small) = match setup {
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
        rows: [Row::default(); 10],
        nrows: 0,
    };
    println!(
        "ASIDs: {} bits (TCR_EL1.AS), allocators of {} and {} bits",
        width.bits(),
        cx.main.bits(),
        cx.small.bits()
    );
    cx.run(t, "space_table_attrs_kernel_and_user", table_attrs);
    cx.run(t, "space_isolation_by_asid", isolation);
    cx.run(t, "space_no_stale_after_switch", no_stale_after_switch);
    cx.run(
        t,
        "space_no_stale_after_unmap_in_other_space",
        no_stale_after_unmap_in_other_space,
    );
    cx.run(
        t,
        "space_no_stale_after_asid_rollover",
        no_stale_after_asid_rollover,
    );
    cx.run(t, "space_fork_cow_write_faults", fork_cow);
    cx.run(
        t,
        "space_swap_entry_survives_move",
        swap_entry_survives_move,
    );
    cx.run(
        t,
        "space_live_kernel_protect",
        |cx, _: &mut [Option<Proc>; 0]| live_kernel_protect(cx, pool),
    );
    cx.run(t, "space_unmap_reports", |cx, ps| {
        unmap_reports(cx, ps, pool)
    });
    let small_name = "space_no_stale_after_asid_rollover";
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
        } else if r.name == small_name {
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
