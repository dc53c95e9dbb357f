//! The six `smp_` cases (see the module docs of `smp_cases`), and the
//! local-only MMU handle of the negative control.

use core::arch::asm;
use core::sync::atomic::Ordering::Relaxed;

use crate::platform::Arm64;
use aarch64_cpu::registers::TTBR0_EL1;
use pgtable_arm64::bits::SW_DIRTY;
use pgtable_arm64::flush::tlbi_va_operand_for;
use pgtable_arm64::format::is_hw_dirty;
use pgtable_arm64::mmu::{local_flush_tlb_all, Arm64Mmu};
use pgtable_arm64::regs::{ttbr0_value, ttbr0_value_52, ttbr_root_52, Asid};
use pgtable_arm64::Arm64Geometry;
use pgtable_core::contract::{Mmu, TlbRange};
use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VaRange, VirtAddr};
use tock_registers::interfaces::Readable;

use super::hammer::{PAIR, READ, WRITE_PAGES, WRITE_RACE};
use super::{
    check_gone, cpus_of, no_wrong, peek, poke, row_of, Cases, CpuList, Row, Space, MOVED, PAGE, R,
    REUSE, WINDOW,
};
use crate::geom::{ENTRIES, GRANULE};
use crate::memory::KernelTables;
use crate::println;
use crate::smp::{CPUS, FAULT, OK};

/// A local-only MMU handle: like `Arm64Mmu` (untagged, TTBR0_EL1) but its
/// TLB invalidations are the non-shareable `tlbi vae1` / `vmalle1`
/// completed by `dsb nsh`, which reach only the CPU that issues them.
///
/// This **breaks the shootdown rule** of `pgtable_core::contract::Mmu` on purpose:
/// it exists for `smp_local_flush_misses_others`, which shows that the
/// cases catch it. Its space maps only pool frames and is never freed
/// before every CPU flushed its own TLB.
struct LocalMmu;

// SAFETY: deliberately not upheld for more than one CPU (see above); the
// only space using it is read by the other CPUs and torn down only after
// each of them invalidated its own TLB.
unsafe impl Mmu for LocalMmu {
    fn walker_barrier(&self) {
        // SAFETY: barriers only (as Arm64Mmu's).
        unsafe { asm!("dsb ishst", "isb", options(nostack, preserves_flags)) };
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        // SAFETY: barriers and a local TLB invalidation; no memory effects.
        unsafe { asm!("dsb ishst", options(nostack, preserves_flags)) };
        if range.strides() > ENTRIES {
            // More than one table's worth: the whole (local) TLB.
            local_flush_tlb_all();
            return;
        }
        let mut va = range.start.0;
        for _ in 0..range.strides() {
            // The operand of the granule (VA[55:12], the bits below the
            // page RES0), ASID 0, no TTL hint.
            let x = tlbi_va_operand_for(GRANULE, va, 0, 0);
            // SAFETY: as above.
            unsafe { asm!("tlbi vae1, {}", in(reg) x, options(nostack, preserves_flags)) };
            va += 1 << range.stride_shift;
        }
        // SAFETY: as above.
        unsafe { asm!("dsb nsh", "isb", options(nostack, preserves_flags)) };
    }

    fn flush_tlb_all(&self) {
        local_flush_tlb_all();
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: the caller's promise (tables complete and alive).
        unsafe {
            Arm64Mmu::new()
                .for_format::<Arm64>()
                .installing_into(VaRange::Lower)
                .install_root(root)
        }
    }
}

/// The TTBR0_EL1 value for `root` and `asid` in the BADDR layout of the
/// format: root bits \[51:48\] in register bits \[5:2\] with 52-bit output
/// addresses (Arm ARM D24.2 "TTBR0_EL1"), as `Arm64Mmu` writes it.
fn ttbr_of(root: u64, asid: Asid) -> u64 {
    if <Arm64 as Arm64Geometry>::OA52 {
        ttbr0_value_52(root, asid).unwrap_or(ttbr0_value(root, asid))
    } else {
        ttbr0_value(root, asid)
    }
}

/// The root address a TTBR0_EL1 value of the format holds (BADDR, without
/// the ASID and CnP).
fn root_of(ttbr: u64) -> u64 {
    if <Arm64 as Arm64Geometry>::OA52 {
        ttbr_root_52(ttbr)
    } else {
        ttbr & 0xffff_ffff_fffe
    }
}

/// After `unmap` returns, every other CPU's next load from the range
/// faults (a translation fault); before it they loaded the markers.
pub(super) fn unmap_faults_everywhere(k: &mut Cases, a: &mut Space) -> R {
    k.map_marked(a, WINDOW, 0, 16, Prot::READ_WRITE)?;
    a.stats().reset();
    let t = k.round(k.all, [READ, WINDOW, 0, 16], || {
        a.unmap(VirtAddr(WINDOW), 16 * PAGE)
            .map_err(|_| "unmap failed")
    })?;
    no_wrong(k.all)?;
    let seen = check_gone(k.all, 0, "load from the unmapped range", false)?;
    k.push(row_of("unmap 16 pages", a, t, seen, k.all));
    Ok(())
}

/// Readers on the other CPUs load from the old and the new address while
/// `move_page_tables` runs: after it returns, the old address faults and
/// the new one gives each page's data; no load ever gives other data.
pub(super) fn move_readers_follow(k: &mut Cases, a: &mut Space) -> R {
    k.map_marked(a, WINDOW, 0, 16, Prot::READ_WRITE)?;
    a.stats().reset();
    let t = k.round(k.all, [PAIR, WINDOW, MOVED, 16], || {
        a.move_page_tables(
            VirtAddr(WINDOW),
            VirtAddr(MOVED),
            16 * PAGE,
            MoveOptions::DEFAULT,
        )
        .map_err(|_| "move failed")
    })?;
    let row = row_of("move 16 pages", a, t, 0, k.all);
    let r = (|| {
        no_wrong(k.all)?;
        let seen = check_gone(k.all, 0, "load from the old address", false)?;
        for c in cpus_of(k.all) {
            let (ok, fault) = (CPUS[c].count(1, true, OK), CPUS[c].count(1, true, FAULT));
            if ok == 0 || fault != 0 {
                println!("  CPU {c}: after the move, {ok} loads at the new address saw the data and {fault} faulted");
                return Err("a CPU did not find the data at the new address");
            }
        }
        Ok(seen)
    })();
    a.unmap(VirtAddr(MOVED), 16 * PAGE)
        .map_err(|_| "unmap failed")?;
    k.push(Row {
        observed: r?,
        ..row
    });
    Ok(())
}

/// Writers on the other CPUs store through the old address, or the new one
/// once the old faults, while the range moves: after the move returns no
/// store goes through the old address, and the frame holds each writer's
/// last store that reported success (no lost write). Then the range is
/// unmapped (its table frames freed and taken again by a new mapping
/// elsewhere) and its frames refilled: no store may reach them, through
/// either address.
pub(super) fn writer_races_move(k: &mut Cases, a: &mut Space) -> R {
    k.map_marked(a, WINDOW, 16, 16, Prot::READ_WRITE)?;
    a.stats().reset();
    let t = k.round(k.all, [WRITE_RACE, WINDOW, MOVED, 16], || {
        a.move_page_tables(
            VirtAddr(WINDOW),
            VirtAddr(MOVED),
            16 * PAGE,
            MoveOptions::DEFAULT,
        )
        .map_err(|_| "move failed")
    })?;
    let row = row_of("move 16 pages (writers)", a, t, 0, k.all);
    let mut seen = 0;
    for c in cpus_of(k.all) {
        let r = &CPUS[c];
        let (old_after, new_after) = (r.count(0, true, OK), r.count(1, true, OK));
        if old_after != 0 || new_after == 0 {
            println!("  CPU {c}: after the move {old_after} stores went through the old address, {new_after} through the new one");
            a.unmap(VirtAddr(MOVED), 16 * PAGE)
                .map_err(|_| "unmap failed")?;
            return Err("a writer used the old translation after the move returned");
        }
        // The frame behind both addresses holds the last store that
        // reported success: none was lost.
        let frame = k.frame(16 + (c as u64 - 1) % 16);
        let (want, got) = (r.last_write.load(Relaxed), peek(frame, c as u64));
        if want != got {
            println!(
                "  CPU {c}: its last successful store wrote {want:#x}, the frame holds {got:#x}"
            );
            a.unmap(VirtAddr(MOVED), 16 * PAGE)
                .map_err(|_| "unmap failed")?;
            return Err("a store that succeeded is not in the frame (lost write)");
        }
        seen |= 1 << c;
    }
    // The frames are freed (unmapped), the table frames the unmap frees
    // are taken again by a new mapping elsewhere (the allocator's free list
    // gives the last freed frame first), and every data frame involved is
    // refilled: no writer may reach any of them through either address (a
    // stale TLB or walk-cache entry would).
    a.stats().reset();
    a.unmap(VirtAddr(MOVED), 16 * PAGE)
        .map_err(|_| "unmap failed")?;
    let freed = a.stats().tables_freed();
    const FILL: u64 = 0xf111_f111_f111_f111;
    for p in 0..32 {
        for w in 0..8 {
            poke(k.frame(p), w, FILL);
        }
    }
    a.stats().reset();
    a.map(
        VirtAddr(REUSE),
        PhysAddr(k.frame(0)),
        16 * PAGE,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .map_err(|_| "map failed")?;
    let reused = a.stats().tables_allocated();
    let r = k.round(k.all, [WRITE_RACE, WINDOW, MOVED, 16], || Ok(()));
    a.unmap(VirtAddr(REUSE), 16 * PAGE)
        .map_err(|_| "unmap failed")?;
    r?;
    for c in cpus_of(k.all) {
        let ok = CPUS[c].count(0, false, OK)
            + CPUS[c].count(0, true, OK)
            + CPUS[c].count(1, false, OK)
            + CPUS[c].count(1, true, OK);
        if ok != 0 {
            println!("  CPU {c}: {ok} stores succeeded after the frames were unmapped");
            return Err("a writer reached a freed frame");
        }
    }
    for p in 0..32 {
        for w in 0..8 {
            if peek(k.frame(p), w) != FILL {
                println!(
                    "  frame {p} word {w} is {:#x} after refilling",
                    peek(k.frame(p), w)
                );
                return Err("a store landed in a freed and refilled frame");
            }
        }
    }
    println!(
        "  no lost store; after the unmap ({freed} table frames freed, {reused} taken again by a new mapping) no store reached a refilled frame"
    );
    k.push(Row {
        observed: seen,
        ..row
    });
    Ok(())
}

/// Writers on the other CPUs store to 31 of 32 pages while
/// `change_protection` makes them read-only: after it returns no store
/// succeeds (a permission fault), and every page that took a store is
/// dirty (with FEAT_HAFDBS the pages start clean and the hardware marks
/// them dirty, concurrently with the change); the page nobody writes
/// stays clean (the control).
pub(super) fn protect_readonly_everywhere(k: &mut Cases, a: &mut Space, hd: bool) -> R {
    // With HD, user pages start clean (DBM, read-only): the first store
    // of a secondary makes the hardware set the dirty state. Page 31 is
    // never written: it must stay clean (a control for the check).
    let (rw, ro) = if hd {
        (Prot::WRITE | Prot::USER, Prot::USER)
    } else {
        (Prot::READ_WRITE, Prot::READ_ONLY)
    };
    k.map_marked(a, WINDOW, 32, 32, rw)?;
    a.stats().reset();
    let t = k.round(k.all, [WRITE_PAGES, WINDOW, 0, 31], || {
        a.change_protection(VirtAddr(WINDOW), 32 * PAGE, ro)
            .map_err(|_| "change_protection failed")
    })?;
    let row = row_of("protect 32 pages RO", a, t, 0, k.all);
    let r = (|| {
        let seen = check_gone(k.all, 0, "store to the read-only range", true)?;
        let mut written = 0u64;
        for c in cpus_of(k.all) {
            // Relaxed: after the acknowledgement.
            written |= CPUS[c].pages_written.load(Relaxed);
        }
        for p in 0..32u64 {
            let Some(raw) = a.inspect().entry(VirtAddr(WINDOW + p * PAGE), 0) else {
                return Err("a page lost its entry");
            };
            let dirty = is_hw_dirty(raw) || raw & SW_DIRTY != 0;
            if written & (1 << p) != 0 && !dirty {
                println!("  page {p} took a store but its entry {raw:#x} is clean");
                return Err("a dirty bit set by another CPU was lost");
            }
            if hd && p == 31 && dirty {
                println!("  page 31 took no store but its entry {raw:#x} is dirty");
                return Err("the dirty check cannot fail: an unwritten page is dirty");
            }
        }
        if written == 0 {
            return Err("no store succeeded before the change (no control)");
        }
        println!(
                "  {} of 31 pages took stores from CPUs 1-3 before the change, each entry dirty after it; page 31 (no store) {}",
                written.count_ones(),
                if hd { "clean" } else { "not checked (no HD)" }
            );
        Ok(seen)
    })();
    a.unmap(VirtAddr(WINDOW), 32 * PAGE)
        .map_err(|_| "unmap failed")?;
    k.push(Row {
        observed: r?,
        ..row
    });
    Ok(())
}

/// A space tagged with its own ASID, live on CPUs 1-3 (their TTBR0_EL1)
/// and not on CPU 0, is unmapped from CPU 0: the broadcast TLBI still
/// reaches the CPUs that use it.
pub(super) fn space_live_elsewhere(k: &mut Cases, a: &mut Space) -> R {
    // A space tagged with ASID 9, live on the secondaries only.
    const ASID: u8 = 9;
    let mut b = Space::new(
        Arm64Mmu::with_asid(ASID).for_format::<Arm64>(),
        KernelTables,
    )
    .map_err(|_| "no root")?;
    k.map_marked(&mut b, WINDOW, 0, 16, Prot::READ_WRITE)?;
    let r = (|| {
        k.ttbr0(k.all, ttbr_of(b.root().0, Asid::from_u8(ASID)))?;
        if root_of(TTBR0_EL1.get()) == b.root().0 {
            return Err("the space is live on CPU 0");
        }
        b.stats().reset();
        let t = k.round(k.all, [READ, WINDOW, 0, 16], || {
            b.unmap(VirtAddr(WINDOW), 16 * PAGE)
                .map_err(|_| "unmap failed")
        })?;
        no_wrong(k.all)?;
        let seen = check_gone(k.all, 0, "load from the unmapped range", false)?;
        Ok(row_of("unmap, space not on CPU 0", &b, t, seen, k.all))
    })();
    // Back to the cases' space (each secondary flushes its TLB), then
    // the space can go.
    k.ttbr0(k.all, a.root().0)?;
    drop(b);
    k.push(r?);
    Ok(())
}

/// The negative control: the same unmap through [`LocalMmu`] (a
/// local-only `tlbi vae1`) must leave a stale translation on another CPU,
/// which the case must see; it passes when it does.
pub(super) fn local_flush_misses_others(k: &mut Cases, a: &mut Space) -> R {
    // Negative control: the same unmap with a local-only TLBI. The case
    // passes when another CPU is seen still using the translation.
    let mut c = AddressSpace::<Arm64, LocalMmu, KernelTables>::new(LocalMmu, KernelTables)
        .map_err(|_| "no root")?;
    // Two pages, one unmapped: the table stays (nothing freed under a
    // stale walk).
    k.map_marked(&mut c, WINDOW, 0, 2, Prot::READ_WRITE)?;
    let r = (|| {
        k.ttbr0(k.all, c.root().0)?;
        c.stats().reset();
        let t = k.round(k.all, [READ, WINDOW, 0, 1], || {
            c.unmap(VirtAddr(WINDOW), PAGE).map_err(|_| "unmap failed")
        })?;
        no_wrong(k.all)?;
        let mut stale = 0;
        for cpu in cpus_of(k.all) {
            if CPUS[cpu].count(0, true, OK) != 0 {
                stale |= 1 << cpu;
            }
        }
        Ok((
            row_of("unmap, local-only TLBI", &c, t, k.all & !stale, k.all),
            stale,
        ))
    })();
    k.ttbr0(k.all, a.root().0)?;
    drop(c);
    let (row, stale) = r?;
    k.push(row);
    if stale == 0 {
        return Err("no CPU kept the stale translation: the cases could not tell a local flush from a shootdown");
    }
    println!(
            "  expected: after a local-only `tlbi vae1` on CPU 0, CPUs {} still loaded through the unmapped translation (stale TLB entry)",
            CpuList(stale)
        );
    Ok(())
}
