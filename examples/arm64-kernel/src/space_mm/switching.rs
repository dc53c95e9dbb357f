//! The `space_` cases on switching user spaces by ASID (see the parent
//! module's docs).

use aarch64_cpu::registers::TTBR0_EL1;
use tock_registers::interfaces::Readable;

use super::*;

/// The height of the root table (3 with four levels, 4 with five, 2 with
/// three).
const ROOT: u32 = <Arm64 as Format>::LEVELS - 1;

pub(super) fn table_attrs(cx: &mut Ctx, ps: &mut [Option<Proc>; 1]) -> R {
    let k = cx
        .kernel
        .inspect()
        .entry(VirtAddr(PAGE_OFFSET), ROOT)
        .unwrap_or(0);
    ensure!(
        k & (AP_TABLE_NO_EL0 | UXN_TABLE) == AP_TABLE_NO_EL0 | UXN_TABLE && k & PXN_TABLE == 0,
        "the kernel's root entry for {PAGE_OFFSET:#x} is {k:#x}: expected APTable[0] and UXNTable, not PXNTable"
    );
    ps[0] = Some(cx.new_proc()?);
    let p = at(ps, 0)?;
    let u = p
        .space
        .inspect()
        .entry(VirtAddr(USER_CODE), ROOT)
        .unwrap_or(0);
    ensure!(
        u & PXN_TABLE != 0 && u & (AP_TABLE_NO_EL0 | UXN_TABLE) == 0,
        "a user root entry is {u:#x}: expected PXNTable only"
    );
    Ok(())
}

pub(super) fn isolation(cx: &mut Ctx, ps: &mut [Option<Proc>; 4]) -> R {
    let mut frames = [[0u64; 2]; 4];
    for (i, f) in frames.iter_mut().enumerate() {
        let (p, pa) = cx.proc_with_pages(i)?;
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
            let ttbr0 = TTBR0_EL1.get();
            ensure!(
                ttbr0 >> 48 == u64::from(a)
                    && ttbr0 & 0xffff_ffff_f000 == at(ps, i)?.space.root().0,
                "TTBR0_EL1 is {ttbr0:#x}: expected space {i}'s root with ASID {a}"
            );
            for (k, &va) in VAS.iter().enumerate() {
                load_is("EL1", va, marker_at(i, k))?;
                store_ok("EL1", va + 16, round << 32 | i as u64)?;
                cx.el0_returns("EL0", va, va, marker_at(i, k) + 1)?;
            }
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
        for (k, &f) in frames[i][..VAS.len()].iter().enumerate() {
            ensure!(
                word(f, 1) == marker_at(i, k) + 1 && word(f, 2) == 2 << 32 | i as u64,
                "frame of space {i} at {:#x} holds {:#x}, {:#x}: another space's stores reached it",
                VAS[k],
                word(f, 1),
                word(f, 2)
            );
        }
    }
    no_full_flush(f0)?;
    report_high("every space's page read and written at EL1 and EL0 after each switch");
    Ok(())
}

pub(super) fn no_stale_after_switch(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
    let (a, fa) = cx.proc_with_pages(0)?;
    let (b, fb) = cx.proc_with_pages(1)?;
    let mut fc = [0u64; 2];
    for (k, f) in fc[..VAS.len()].iter_mut().enumerate() {
        *f = cx.frames.take(marker_at(2, k))?;
    }
    ps[0] = Some(a);
    ps[1] = Some(b);
    let f0 = FlushCounts::now();
    for (round, (i, f)) in [(0, fa), (1, fb), (0, fa)].into_iter().enumerate() {
        let p = at(ps, i)?;
        cx.switch(p)?;
        for (k, &va) in VAS.iter().enumerate() {
            load_is("after the switch", va, marker_at(i, k))?;
            store_ok("after the switch", va + 8, 0xa0 + round as u64)?;
            ensure!(
                word(f[k], 1) == 0xa0 + round as u64,
                "the store of switch {round} to {va:#x} did not reach space {i}'s frame"
            );
        }
    }
    // Remap B while A runs (and holds its translations in the TLB).
    let b = at(ps, 1)?;
    for (k, &va) in VAS.iter().enumerate() {
        b.space
            .unmap(VirtAddr(va), PAGE)
            .map_err(|e| Why::new(format_args!("unmap {va:#x}: {e}")))?;
        map(&mut b.space, va, fc[k])?;
    }
    let f1 = FlushCounts::now();
    let b = at(ps, 1)?;
    cx.switch(b)?;
    for (k, &va) in VAS.iter().enumerate() {
        load_is("space B after its remap", va, marker_at(2, k))?;
    }
    let a = at(ps, 0)?;
    cx.switch(a)?;
    for (k, &va) in VAS.iter().enumerate() {
        load_is("space A after B's remap", va, marker_at(0, k))?;
    }
    no_full_flush(f0)?;
    no_full_flush(f1)?;
    report_high("no stale translation after switches away and back, and after a remap while another space ran");
    Ok(())
}

pub(super) fn no_stale_after_unmap_in_other_space(cx: &mut Ctx, ps: &mut [Option<Proc>; 2]) -> R {
    let (a, _) = cx.proc_with_pages(0)?;
    let (mut b, _) = cx.proc_with_pages(1)?;
    let stack = cx.frames.take(0)?;
    map(&mut b.space, STACK_VA, stack)?;
    ps[0] = Some(a);
    ps[1] = Some(b);
    let f0 = FlushCounts::now();
    // B's translations of its pages get into the TLB under B's ASID.
    let b = at(ps, 1)?;
    cx.switch(b)?;
    for (k, &va) in VAS.iter().enumerate() {
        load_is("space B", va, marker_at(1, k))?;
        cx.el0_returns("space B at EL0", va, STACK_VA, marker_at(1, k) + 1)?;
    }
    let a = at(ps, 0)?;
    cx.switch(a)?;
    for (k, &va) in VAS.iter().enumerate() {
        load_is("space A", va, marker_at(0, k))?;
    }
    // Unmap in B, which is not current.
    let b = at(ps, 1)?;
    for &va in VAS {
        b.space
            .unmap(VirtAddr(va), PAGE)
            .map_err(|e| Why::new(format_args!("unmap {va:#x}: {e}")))?;
    }
    cx.switch(b)?;
    for &va in VAS {
        load_faults("space B after the unmap", va)?;
        let e = cx.el0(va, STACK_VA);
        ensure!(
            esr_class(e.esr) == EC_DABT_LOWER && is_translation_fault(e.esr) && e.far == va,
            "space B at EL0 after the unmap: ESR {:#x} FAR {:#x} ELR {:#x}, expected a translation fault at {va:#x}",
            e.esr,
            e.far,
            e.elr
        );
    }
    let a = at(ps, 0)?;
    cx.switch(a)?;
    for (k, &va) in VAS.iter().enumerate() {
        load_is("space A after B's unmap", va, marker_at(0, k))?;
    }
    let d = FlushCounts::now().since(f0);
    ensure!(
        d.all == 0 && d.local == 0,
        "flushed everything: {} full, {} local",
        d.all,
        d.local
    );
    report_high("an unmap in a space that was not current faults at EL1 and EL0 once it runs");
    Ok(())
}

pub(super) fn no_stale_after_asid_rollover(
    cx: &mut Ctx,
    ps: &mut [Option<Proc>; ROLLOVER_SPACES],
) -> R {
    let mut frames = [[0u64; 2]; ROLLOVER_SPACES];
    for (i, f) in frames.iter_mut().enumerate() {
        let (p, pa) = cx.proc_with_pages(i)?;
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
            for (k, &va) in VAS.iter().enumerate() {
                load_is("after the switch", va, marker_at(i, k))?;
                store_ok("after the switch", va + 8, round << 32 | (i * 2 + k) as u64)?;
            }
        }
    }
    let rollovers = cx.small.rollovers() - r0;
    for (i, f) in frames.iter().enumerate() {
        for (k, &f) in f[..VAS.len()].iter().enumerate() {
            ensure!(
                word(f, 1) == 3 << 32 | (i * 2 + k) as u64,
                "frame of space {i} at {:#x} holds {:#x}: a store went to another space",
                VAS[k],
                word(f, 1)
            );
        }
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
    report_high("every space's page read and written after each switch across the roll-overs");
    Ok(())
}
