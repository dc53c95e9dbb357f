//! The `smp_` cases: a space live on every hart, changed by the boot hart
//! while the others hold its translations, flushed through [`SmpMmu`]
//! (local `SFENCE.VMA` plus SBI RFENCE). Each other hart is switched to
//! the space (`satp` with the space's ASID) and accesses the case page
//! through its own TLB; after every change, every hart must see the new
//! state.
//!
//! `smp_move_readers_follow` moves a whole PMD table of pages
//! (`move_page_tables`) while the others have both ends cached: the old
//! range must fault and the new one read the same frames on every hart.
//!
//! `smp_remote_fence_replaces_stale_translation` first turns the remote
//! fences off for one change and checks that another hart really keeps
//! the old translation (so the rest of the case proves the fences do the
//! work), then turns them on again.

use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::{satp_value, Asid, RiscvMmu, RiscvPaging};

use crate::cases::{ensure, fill, Counts, Why, R};
use crate::mem::{case_frame, kernel_space, Frames, CASE_VA};
use crate::smp::{ask, this_hart, Cmd, MmHarts, SmpMmu, HARTS};
use crate::trap::{CAUSE_LOAD_PAGE_FAULT, CAUSE_STORE_PAGE_FAULT};

type Space<'a, const L: u32> = AddressSpace<RiscvPaging<L>, SmpMmu<'a>, Frames>;

/// The other online harts.
fn others() -> impl Iterator<Item = usize> {
    let me = this_hart();
    let online = crate::smp::online();
    (0..HARTS).filter(move |&h| h != me && online & (1 << h) != 0)
}

fn answer(h: usize, cmd: Cmd, a: u64, b: u64) -> Result<Result<u64, u64>, Why> {
    ask(h, cmd, a, b).map_err(|e| Why("a hart did not answer", e.0 as u64))
}

/// Every other hart loads the case page and must read `want`.
fn all_read(want: u64) -> R {
    all_read_at(CASE_VA, want)
}

/// Every other hart loads `va` and must read `want`.
fn all_read_at(va: u64, want: u64) -> R {
    for h in others() {
        let got = answer(h, Cmd::Read, va, 0)?;
        ensure(
            got == Ok(want),
            "a hart read another value or faulted",
            h as u64,
        )?;
    }
    Ok(())
}

/// Every other hart's access to the case page must fault with `cause`.
fn all_fault(cmd: Cmd, cause: u64) -> R {
    all_fault_at(CASE_VA, cmd, cause)
}

/// Every other hart's access to `va` must fault with `cause`.
fn all_fault_at(va: u64, cmd: Cmd, cause: u64) -> R {
    for h in others() {
        let got = answer(h, cmd, va, 0x5757)?;
        ensure(got == Err(cause), "a hart still reached the page", h as u64)?;
    }
    Ok(())
}

fn map_page<const L: u32>(s: &mut Space<'_, L>, frame: u64, prot: Prot) -> R {
    s.map(
        VirtAddr(CASE_VA),
        PhysAddr(frame),
        4096,
        prot,
        MapOptions::PAGES,
    )
    .map_err(|_| Why("map failed", frame))
}

fn unmap_page<const L: u32>(s: &mut Space<'_, L>) -> R {
    s.unmap(VirtAddr(CASE_VA), 4096)
        .map_err(|_| Why("unmap failed", CASE_VA))
}

fn stale_replaced<const L: u32>(s: &mut Space<'_, L>, mm: &MmHarts) -> R {
    let v = |i: u64| 0x5111_0000 + i;
    for i in 0..3 {
        fill(case_frame(i), v(i));
    }
    map_page(s, case_frame(0), Prot::WRITE)?;
    all_read(v(0))?;
    // One change with local fences only: another hart keeps the old
    // translation (QEMU's per-hart TLB holds it until that hart fences).
    mm.set_remote(false);
    let r = unmap_page(s).and_then(|()| map_page(s, case_frame(1), Prot::WRITE));
    mm.set_remote(true);
    r?;
    let h = others().next().ok_or(Why("no other hart online", 0))?;
    let stale = answer(h, Cmd::Read, CASE_VA, 0)?;
    ensure(
        stale == Ok(v(0)),
        "without the remote fence the other hart did not keep the old translation, so this case proves nothing",
        stale.unwrap_or(0),
    )?;
    // The same change with the remote fences: every hart sees it.
    unmap_page(s)?;
    map_page(s, case_frame(2), Prot::WRITE)?;
    all_read(v(2))
}

fn unmap_everywhere<const L: u32>(s: &mut Space<'_, L>) -> R {
    // The page the previous case left mapped (to frame 2).
    all_read(0x5111_0002)?;
    unmap_page(s)?;
    all_fault(Cmd::Read, CAUSE_LOAD_PAGE_FAULT)
}

fn protect_everywhere<const L: u32>(s: &mut Space<'_, L>) -> R {
    fill(case_frame(3), 0);
    map_page(s, case_frame(3), Prot::WRITE)?;
    for h in others() {
        let got = answer(h, Cmd::Write, CASE_VA, 0x77)?;
        ensure(
            got.is_ok(),
            "a store to the writable page faulted",
            h as u64,
        )?;
    }
    all_read(0x77)?;
    s.change_protection(VirtAddr(CASE_VA), 4096, Prot::READ_ONLY)
        .map_err(|_| Why("change_protection failed", CASE_VA))?;
    all_fault(Cmd::Write, CAUSE_STORE_PAGE_FAULT)?;
    all_read(0x77)?;
    unmap_page(s)
}

/// Puts the space back to its start between cases, whatever the last one
/// left: nothing mapped at the cases' addresses, and every other hart
/// switched to the space again (`SFENCE.VMA x0, x0`: no stale entry), so
/// one failing case does not fail the next.
fn reset<const L: u32>(s: &mut Space<'_, L>, satp: u64) {
    let _ = s.unmap(VirtAddr(CASE_VA), 2 << 20);
    let _ = s.unmap(VirtAddr(MOVED_VA), 2 << 20);
    for h in others() {
        let _ = ask(h, Cmd::Satp, satp, 0);
    }
}

/// Where `smp_move_readers_follow` moves the case PMD: 1 GiB higher.
const MOVED_VA: u64 = CASE_VA + (1 << 30);

fn move_readers_follow<const L: u32>(s: &mut Space<'_, L>) -> R {
    // 2 MiB of pages over the cases' frames: one whole PMD table, which
    // the move relinks (a table changes: the remote fences are full).
    const LEN: u64 = 2 << 20;
    let last = LEN - 4096;
    fill(case_frame(0), 0x3030_0000);
    fill(case_frame(511), 0x3030_0511);
    s.map(
        VirtAddr(CASE_VA),
        PhysAddr(case_frame(0)),
        LEN,
        Prot::WRITE,
        MapOptions::PAGES,
    )
    .map_err(|_| Why("map failed", CASE_VA))?;
    all_read_at(CASE_VA, 0x3030_0000)?;
    all_read_at(CASE_VA + last, 0x3030_0511)?;
    s.move_page_tables(
        VirtAddr(CASE_VA),
        VirtAddr(MOVED_VA),
        LEN,
        MoveOptions::DEFAULT,
    )
    .map_err(|_| Why("move_page_tables failed", CASE_VA))?;
    all_fault_at(CASE_VA, Cmd::Read, CAUSE_LOAD_PAGE_FAULT)?;
    all_fault_at(CASE_VA + last, Cmd::Read, CAUSE_LOAD_PAGE_FAULT)?;
    all_read_at(MOVED_VA, 0x3030_0000)?;
    all_read_at(MOVED_VA + last, 0x3030_0511)?;
    s.unmap(VirtAddr(MOVED_VA), LEN)
        .map_err(|_| Why("unmap failed", MOVED_VA))?;
    all_fault_at(MOVED_VA, Cmd::Read, CAUSE_LOAD_PAGE_FAULT)
}

/// Runs the `smp_` cases on format `RiscvPaging<L>` over `ram`, with the
/// space tagged with `asid` when the harts have ASIDs.
pub fn run<const L: u32>(ram: (u64, u64), asid: Option<Asid>) -> Counts {
    let mut c = Counts::default();
    let before = Frames.live();
    let mm = MmHarts::new();
    let mut local = RiscvMmu::new::<L, 0>();
    if let Some(a) = asid {
        local = local.with_asid(a);
    }
    let mut s = match kernel_space::<RiscvPaging<L>, _>(
        ram,
        SmpMmu::new(local, &crate::smp::SBI_FENCE, &mm),
    ) {
        Ok(s) => s,
        Err(_) => {
            c.case("smp_setup", || Err(Why("cannot build the space", 0)));
            return c;
        }
    };
    let satp = satp_value(
        RiscvPaging::<L>::SATP_MODE,
        asid.unwrap_or(Asid::ZERO),
        s.root().0,
    );
    let mut switched = Ok(());
    for h in others() {
        mm.add(h);
        if ask(h, Cmd::Satp, satp, 0).is_err() {
            switched = Err(Why("a hart did not switch to the space", h as u64));
        }
    }
    if switched.is_err() {
        c.case("smp_setup", || switched);
        // A hart may still switch to the space later: keep its tables.
        let _kept = s.into_parts();
        return c;
    }
    c.case("smp_remote_fence_replaces_stale_translation", || {
        stale_replaced(&mut s, &mm)
    });
    c.case("smp_unmap_faults_everywhere", || unmap_everywhere(&mut s));
    reset(&mut s, satp);
    c.case("smp_protect_readonly_everywhere", || {
        protect_everywhere(&mut s)
    });
    reset(&mut s, satp);
    c.case("smp_move_readers_follow", || move_readers_follow(&mut s));
    reset(&mut s, satp);
    // Back to Bare on every hart (which fences everything), then the
    // space's tables may go. A hart that does not confirm may still walk
    // them (and set A/D bits in them): keep them then.
    let mut all_back = true;
    for h in others() {
        all_back &= matches!(ask(h, Cmd::Satp, 0, 0), Ok(Ok(_)));
    }
    if !all_back {
        let _kept = s.into_parts();
        c.case("smp_spaces_free_their_tables", || {
            Err(Why(
                "a hart did not switch back to Bare: the space's tables are kept",
                0,
            ))
        });
        return c;
    }
    drop(s);
    c.case("smp_spaces_free_their_tables", || {
        ensure(
            Frames.live() == before,
            "table frames left after the space was dropped",
            Frames.live(),
        )
    });
    c
}

/// Stops every other hart (`sbi_hart_stop`) and checks that HSM reports
/// each stopped: the suite then runs on the boot hart alone.
pub fn stop_others() -> Counts {
    let mut c = Counts::default();
    c.case("smp_secondaries_stopped", || {
        for h in others() {
            let _ = ask(h, Cmd::Stop, 0, 0);
            let start = crate::machine::now();
            while crate::sbi::hart_status(h as u64) != Ok(1) {
                if crate::machine::now() - start > crate::smp::PATIENCE {
                    return Err(Why("a hart did not stop", h as u64));
                }
            }
        }
        Ok(())
    });
    c
}
