//! `space_` cases with several address spaces: the kernel's and user
//! spaces that share its kernel half, switched by PCID when the CPU has
//! PCIDs and by plain CR3 writes otherwise ([`super::switch`]).
//!
//! - isolation: the kernel's space and three user spaces map the same
//!   user address to four frames; whichever is installed, a CPL-0 load and
//!   a CPL-3 load/store reach its own frame only, and a kernel page mapped
//!   after the user spaces were made is visible in all of them (in the
//!   shared kernel half);
//! - no stale translation after a switch (a page one space maps and
//!   another does not faults in the other), after an unmap and a remap in
//!   a space that is not installed (its flush goes to its PCID by INVPCID,
//!   or is deferred to its next switch), and after PCID roll-overs (3-bit
//!   PCIDs, twelve spaces).

use pgtable_core::contract::{Arch, PAGE_SIZE};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86Mmu;

use super::switch::{this_cpu, with_users, Switcher, User};
use super::{
    expect_fault, load_user_program, map_user_program, user_run_on, Mode, Tally, Why, PF_I, PF_P,
    PF_RSVD, PF_U, PF_W, USER_EXIT,
};
use crate::mem::{phys_to_virt, Frames, SPACE_FRAMES, SPACE_FRAME_COUNT};
use crate::println;
use crate::trap;

/// The kernel's address space.
type Kernel<A> = AddressSpace<A, X86Mmu, Frames>;

/// The user address every space of the isolation case maps (lower half,
/// 192 GiB: clear of the suite's window and of the ring-3 pages).
const ISO_VA: u64 = 0x30_0000_0000;
/// A kernel-half address nothing maps (PML4 entry 402, past the linear
/// map's 128 entries; with 5-level paging in PML5 entry 511).
const KNEW_VA: u64 = 0xffff_c900_0000_0000;
/// Where the stale-translation cases map their pages (lower half, 196
/// GiB).
const STALE_VA: u64 = 0x31_0000_0000;

/// First word of frame `i` before a case changes it.
const MAGIC: u64 = 0x5ace_0000_0000;
/// First word of the kernel page of the isolation case.
const KMAGIC: u64 = 0x4b4e_5057_0000_0001;

/// The physical address of frame `i` of [`SPACE_FRAMES`].
pub(super) fn frame(i: u64) -> u64 {
    debug_assert!(i < SPACE_FRAME_COUNT);
    SPACE_FRAMES + i * PAGE_SIZE
}

/// Stores `v` into the first word of the frame at `pa`.
pub(super) fn set_word(pa: u64, v: u64) {
    // SAFETY: a frame of SPACE_FRAMES (RAM nothing else uses, mem.rs),
    // through the linear map.
    unsafe { (phys_to_virt(pa) as *mut u64).write_volatile(v) }
}

/// The first word of the frame at `pa`.
pub(super) fn word(pa: u64) -> u64 {
    // SAFETY: as in `set_word`.
    unsafe { (phys_to_virt(pa) as *const u64).read_volatile() }
}

/// Maps the page at `va` to `pa` with `prot`.
pub(super) fn map_page<A: Arch>(
    s: &mut AddressSpace<A, X86Mmu, Frames>,
    va: u64,
    pa: u64,
    prot: Prot,
) -> Result<(), Why> {
    match s.map(
        VirtAddr(va),
        PhysAddr(pa),
        PAGE_SIZE,
        prot,
        MapOptions::PAGES,
    ) {
        Ok(()) => Ok(()),
        Err(e) => bail!("map {va:#x} -> {pa:#x}: {e}"),
    }
}

/// A CPL-0 load from `va` reads `want` (`what` names the space).
pub(super) fn loads(what: &str, va: u64, want: u64) -> Result<(), Why> {
    match trap::read_u64(va) {
        Ok(v) => {
            ensure!(
                v == want,
                "{what}: load from {va:#x} read {v:#x}, expected {want:#x}"
            );
            Ok(())
        }
        Err(f) => bail!("{what}: load from {va:#x} faulted: error {:#x}", f.error),
    }
}

/// A CPL-0 load from `va` faults as not present.
pub(super) fn load_faults(what: &str, va: u64) -> Result<(), Why> {
    match trap::read_u64(va) {
        Ok(v) => bail!("{what}: load from {va:#x} read {v:#x}: a stale translation (expected a not-present fault)"),
        Err(f) => expect_fault(f, va, 0, PF_P | PF_W | PF_U | PF_RSVD | PF_I),
    }
}

/// Runs the user program at CPL 3 on the word at `data`, which holds
/// `before`: it must add one and come back through the page fault at
/// [`USER_EXIT`]. Returns the new value.
fn user_increments(what: &str, data: u64, before: u64) -> Result<u64, Why> {
    let t = user_run_on(data, Mode::Load, USER_EXIT);
    ensure!(
        t.vector == 14 && t.cr2 == USER_EXIT && t.cs & 3 == 3 && t.error & (PF_P | PF_U) == PF_U,
        "{what}: ring 3 ended with vector {:#x} (error {:#x}, RIP {:#x}, CR2 {:#x}), not the page fault at {USER_EXIT:#x}",
        t.vector,
        t.error,
        t.rip,
        t.cr2
    );
    ensure!(
        t.rax == before + 1,
        "{what}: ring 3 read {:#x} from {data:#x}, expected {before:#x}",
        t.rax.wrapping_sub(1)
    );
    Ok(t.rax)
}

/// The user program, run on the word at `data`, which holds `before`,
/// adds one to it, then its CPL-3 load from `va` faults with P = 1, U = 1
/// (a supervisor page). Returns the new value of the word.
fn user_load_faults(what: &str, data: u64, before: u64, va: u64) -> Result<u64, Why> {
    let t = user_run_on(data, Mode::Load, va);
    ensure!(
        t.vector == 14
            && t.cs & 3 == 3
            && t.cr2 == va
            && t.error & (PF_P | PF_U | PF_W) == PF_P | PF_U
            && t.rax == before + 1,
        "{what}: ring-3 load from {va:#x}: vector {:#x} error {:#x} CR2 {:#x} rax {:#x}, expected a protection fault after reading {before:#x}",
        t.vector,
        t.error,
        t.cr2,
        t.rax
    );
    Ok(t.rax)
}

/// Runs the cases.
pub fn run<A: Arch>(kernel: &mut Kernel<A>, pcids: bool, t: &mut Tally) {
    println!();
    println!("== address spaces: the kernel's and user spaces sharing its half ==");
    let name = if pcids {
        "space_isolation_by_pcid"
    } else {
        "space_isolation_by_cr3"
    };
    t.case(name, isolation(kernel, pcids));
    t.case("space_no_stale_after_switch", no_stale_after_switch(kernel));
    t.case(
        "space_no_stale_after_unmap_in_other_space",
        no_stale_after_unmap_in_other_space(kernel),
    );
    t.case(
        "space_no_stale_after_pcid_rollover",
        no_stale_after_pcid_rollover(kernel),
    );
}

fn isolation<A: Arch>(kernel: &mut Kernel<A>, pcids: bool) -> Result<(), Why> {
    const N: usize = 3;
    const KFRAME: u64 = 8;
    load_user_program();
    for i in 0..=N as u64 {
        set_word(frame(i), MAGIC + i);
    }
    set_word(frame(KFRAME), KMAGIC);
    with_users::<A, N>(kernel, |kernel, users| {
        for (i, u) in users.iter_mut().enumerate() {
            map_user_program(&mut u.space, false)?;
            map_page(
                &mut u.space,
                ISO_VA,
                frame(i as u64 + 1),
                Prot::USER | Prot::WRITE,
            )?;
        }
        map_page(kernel, ISO_VA, frame(0), Prot::WRITE)?;
        // A kernel mapping made after the user spaces: it lands in the
        // pinned tables of the kernel half, which every user root links.
        map_page(kernel, KNEW_VA, frame(KFRAME), Prot::WRITE | Prot::GLOBAL)?;
        let r = isolation_rounds(kernel, users, pcids);
        super::switch::to_kernel(kernel);
        for va in [ISO_VA, KNEW_VA] {
            if let Err(e) = kernel.unmap(VirtAddr(va), PAGE_SIZE) {
                bail!("unmap {va:#x} from the kernel's space: {e}");
            }
        }
        r
    })
}

fn isolation_rounds<A: Arch>(
    kernel: &mut Kernel<A>,
    users: &mut [User<A>; 3],
    pcids: bool,
) -> Result<(), Why> {
    let mut sw = Switcher::new(12)?;
    let mut want = [MAGIC, MAGIC + 1, MAGIC + 2, MAGIC + 3];
    // 0: the kernel's space, 1..=3: the user spaces.
    let order = [0usize, 1, 2, 3, 3, 1, 0, 2];
    let mut switches = 0;
    for round in 0..3 {
        for &s in &order {
            if s == 0 {
                sw.switch_kernel(kernel);
            } else {
                sw.switch_user(&mut users[s - 1])?;
            }
            switches += 1;
            let what = Why::new(format_args!("space {s} (round {round})"));
            let what = what.as_str();
            loads(what, ISO_VA, want[s])?;
            loads(what, KNEW_VA, KMAGIC)?;
            if s > 0 {
                want[s] = user_increments(what, ISO_VA, want[s])?;
                if round == 0 {
                    want[s] = user_load_faults(what, ISO_VA, want[s], KNEW_VA)?;
                }
            }
        }
    }
    for (s, &w) in want.iter().enumerate() {
        let got = word(frame(s as u64));
        ensure!(
            got == w,
            "frame of space {s} holds {got:#x}, expected {w:#x}"
        );
    }
    println!(
        "  {}: the kernel's space and 3 user spaces map {ISO_VA:#x} to 4 frames; {switches} switches: each saw its own frame at CPL 0 and CPL 3 (user frames +{} each), none another's; a kernel page mapped at {KNEW_VA:#x} after the user spaces were made read {KMAGIC:#x} in all (CPL 3: U/S fault)",
        if pcids {
            "PCIDs (tagged CR3 writes)"
        } else {
            "CR3 writes (no PCID)"
        },
        want[1] - (MAGIC + 1)
    );
    Ok(())
}

fn no_stale_after_switch<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    let (fa, fa2, fb) = (frame(10), frame(11), frame(12));
    let va2 = STALE_VA + PAGE_SIZE;
    set_word(fa, MAGIC + 10);
    set_word(fa2, MAGIC + 11);
    set_word(fb, MAGIC + 12);
    with_users::<A, 2>(kernel, |kernel, [a, b]| {
        let rw = Prot::USER | Prot::WRITE;
        map_page(&mut a.space, STALE_VA, fa, rw)?;
        map_page(&mut a.space, va2, fa2, rw)?;
        map_page(&mut b.space, STALE_VA, fb, rw)?;
        let mut sw = Switcher::new(12)?;
        for round in 0..2 {
            sw.switch_user(a)?;
            loads("A", STALE_VA, MAGIC + 10)?;
            loads("A", va2, MAGIC + 11)?;
            sw.switch_user(b)?;
            loads("B after A", STALE_VA, MAGIC + 12)?;
            load_faults("B after A (A maps it, B does not)", va2)?;
            sw.switch_user(a)?;
            loads("A after B", STALE_VA, MAGIC + 10)?;
            loads("A after B", va2, MAGIC + 11)?;
            sw.switch_kernel(kernel);
            load_faults("the kernel's space after A", STALE_VA)?;
            load_faults("the kernel's space after A", va2)?;
            if round == 0 {
                println!(
                    "  A, B, A, kernel: each saw its own page at {STALE_VA:#x} and faulted where only the other maps ({va2:#x})"
                );
            }
        }
        Ok(())
    })
}

fn no_stale_after_unmap_in_other_space<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    let (f1, f2, f3) = (frame(13), frame(14), frame(15));
    let va2 = STALE_VA + PAGE_SIZE;
    set_word(f1, MAGIC + 13);
    set_word(f2, MAGIC + 14);
    set_word(f3, MAGIC + 15);
    with_users::<A, 2>(kernel, |_, [a, b]| {
        let rw = Prot::USER | Prot::WRITE;
        map_page(&mut b.space, STALE_VA, f1, rw)?;
        map_page(&mut b.space, va2, f2, rw)?;
        let mut sw = Switcher::new(12)?;
        sw.switch_user(b)?;
        // B's translations are cached now (under its PCID, if any).
        loads("B", STALE_VA, MAGIC + 13)?;
        loads("B", va2, MAGIC + 14)?;
        sw.switch_user(a)?;
        // B is not installed: its flushes reach its PCID by INVPCID, or are
        // deferred to its next switch (without PCIDs every switch flushes).
        if let Err(e) = b.space.unmap(VirtAddr(STALE_VA), PAGE_SIZE) {
            bail!("unmap in B: {e}");
        }
        if let Err(e) = b.space.unmap(VirtAddr(va2), PAGE_SIZE) {
            bail!("unmap in B: {e}");
        }
        map_page(&mut b.space, va2, f3, rw)?;
        let how = match b.pcid() {
            None => "no PCID: the switch back is a flushing MOV to CR3",
            Some(p) if b.space.mmu().has_invpcid() => {
                ensure!(
                    !this_cpu().is_stale(p),
                    "PCID {} marked stale although INVPCID flushed it",
                    p.get()
                );
                "INVPCID for B's PCID while A ran"
            }
            Some(p) => {
                ensure!(
                    this_cpu().is_stale(p),
                    "B's PCID {} does not owe a flush after an unmap while A ran",
                    p.get()
                );
                "deferred: B's PCID owed a flush, paid by the switch back"
            }
        };
        sw.switch_user(b)?;
        load_faults("B after an unmap while A ran", STALE_VA)?;
        loads("B after a remap while A ran", va2, MAGIC + 15)?;
        println!(
            "  B unmapped {STALE_VA:#x} and remapped {va2:#x} while A was installed ({how}): B faults at the first and reads the new frame at the second"
        );
        Ok(())
    })
}

fn no_stale_after_pcid_rollover<A: Arch>(kernel: &mut Kernel<A>) -> Result<(), Why> {
    const N: usize = 12;
    const BITS: u32 = 3;
    const ROUNDS: u64 = 3;
    for i in 0..N as u64 {
        set_word(frame(20 + i), MAGIC + 20 + i);
    }
    with_users::<A, N>(kernel, |kernel, users| {
        for (i, u) in users.iter_mut().enumerate() {
            map_page(
                &mut u.space,
                STALE_VA,
                frame(20 + i as u64),
                Prot::USER | Prot::WRITE,
            )?;
        }
        let mut sw = Switcher::new(BITS)?;
        for round in 0..ROUNDS {
            for (i, u) in users.iter_mut().enumerate() {
                let f = frame(20 + i as u64);
                sw.switch_user(u)?;
                let what = Why::new(format_args!(
                    "space {i} (round {round}, PCID {:?})",
                    u.pcid().map(|p| p.get())
                ));
                let what = what.as_str();
                let want = MAGIC + 20 + i as u64 + (round << 32);
                loads(what, STALE_VA, want)?;
                let next = want + (1 << 32);
                // SAFETY: STALE_VA maps frame `f` of this space (user, RW,
                // no SMAP), which only this case uses.
                if let Err(e) = unsafe { trap::write_u64(STALE_VA, next) } {
                    bail!(
                        "{what}: store to {STALE_VA:#x} faulted: error {:#x}",
                        e.error
                    );
                }
                ensure!(
                    word(f) == next,
                    "{what}: the store did not reach its frame {f:#x}"
                );
            }
            sw.switch_kernel(kernel);
            load_faults("the kernel's space", STALE_VA)?;
        }
        let r = sw.rollovers();
        ensure!(
            r >= ROUNDS,
            "{r} roll-overs for {N} spaces over {} PCIDs in {ROUNDS} rounds",
            (1 << BITS) - 1
        );
        println!(
            "  {N} user spaces, {BITS}-bit PCIDs ({} usable): {} switches, {r} roll-overs; every space read and wrote its own frame every time{}",
            (1 << BITS) - 1,
            N as u64 * ROUNDS,
            if super::switch::pcids() {
                ""
            } else {
                " (no PCID: the allocator ran, CR3 writes installed the roots)"
            }
        );
        Ok(())
    })
}
