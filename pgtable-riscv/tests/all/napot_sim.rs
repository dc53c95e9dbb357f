//! The simulator's checks of Svnapot runs: broken variants it must catch
//! (a run whose 16 PTEs disagree in N or PPN, a run left partly written, a
//! change made entry by entry to the N bit or the PPN of a run a hart
//! holds), and beside them what RISC-V allows and arm64 does not: a
//! memory-type (PBMT) change of a cached run entry by entry, which on a
//! hart without break-before-make rules is only a stale translation until
//! the `SFENCE.VMA`.

use std::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::{Access, Arch, Format, Mmu, TlbRange};
use pgtable_core::sim::{CheckError, Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::bits::{N, NAPOT_64K_MASK, PPN_SHIFT};
use pgtable_riscv::{RiscvPaging, SVNAPOT, SVPBMT};

type Full39 = RiscvPaging<3, { SVPBMT | SVNAPOT }>;
type Space = Installed<Full39, SimMmu<Full39>, SimAlloc>;

const PAGE: u64 = 0x1000;
const RUN: u64 = 16 * PAGE;
const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);

/// A machine with `cpus` harts sharing one space, which holds one folded
/// run at `VA`.
fn run_machine(cpus: usize) -> (SimMachine<Full39>, Space) {
    let m = SimMachine::<Full39>::with_cpus(cpus);
    let s = AddressSpace::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    for i in 1..cpus {
        // SAFETY: the same complete hierarchy, on another simulated hart.
        unsafe { m.cpu(i).mmu().install_root(s.root()) };
    }
    s.map(VA, PA, RUN, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    m.check().unwrap();
    (m, s)
}

/// Loads every page of the run through the simulated TLB of `m`.
fn touch(m: &SimMachine<Full39>) {
    for k in 0..16 {
        m.access(VA.add(k * PAGE), Access::READ).unwrap();
    }
    assert!(m.tlb_holds_run(VA));
}

/// Stores `f(raw)` into entry `k` of the run.
fn rewrite(s: &Space, k: u64, f: impl Fn(u64) -> u64) {
    // SAFETY: a leaf replaced by another value of the format (the broken
    // part, where there is one, is what the value or the order is).
    let slot = unsafe { s.inspect().slot(VA.add(k * PAGE), 0) }.unwrap();
    let raw = slot.load(Relaxed);
    Full39::set_pte_at(s.mmu(), VA.add(k * PAGE), slot, f(raw));
}

fn flush_run(s: &Space) {
    s.mmu().flush_tlb_range(TlbRange {
        start: VA,
        end: VA.add(RUN),
        stride_shift: 12,
        last_level: true,
    });
}

/// What the simulator reported: the run, the entry, whether at a TLB fill
/// and on which hart's cached run.
fn caught(m: &SimMachine<Full39>) -> (VirtAddr, u32, bool, Option<usize>) {
    match m.check() {
        Err(CheckError::Contiguous(c)) => (c.va, c.index, c.at_fill, c.cached_on),
        other => panic!("not caught: {other:?}"),
    }
}

/// A change of one page that keeps N (what a protection change of part of
/// a run would do without unfolding it): the run's PTEs disagree in their
/// rights after the operation.
#[test]
fn napot_sim_catches_n_left_on_a_partly_changed_run() {
    let (m, s) = run_machine(1);
    rewrite(&s, 3, |raw| Full39::modify_prot(raw, Prot::READ_ONLY, 0));
    assert_eq!(caught(&m), (VA, 3, false, None));
}

/// One PTE of the run naming another 64 KiB region: a hart that fills
/// through the run reports it.
#[test]
fn napot_sim_catches_a_fill_through_a_run_with_another_ppn() {
    let (m, s) = run_machine(1);
    rewrite(&s, 9, |raw| raw + ((RUN >> 12) << PPN_SHIFT));
    m.access(VA, Access::READ).unwrap();
    assert_eq!(caught(&m), (VA, 9, true, None));
}

/// A run written in part (8 of its 16 PTEs cleared, as a map or unmap of
/// part of a run that did not unfold it would leave): reported after the
/// operation.
#[test]
fn napot_sim_catches_a_partly_written_run() {
    let (m, s) = run_machine(1);
    for k in 8..16 {
        rewrite(&s, k, |_| 0);
    }
    assert_eq!(caught(&m), (VA, 8, false, None));
}

/// A plain PTE of its own page among the NAPOT PTEs (one page unfolded
/// alone): the run is inconsistent.
#[test]
fn napot_sim_catches_a_plain_pte_inside_a_run() {
    let (m, s) = run_machine(1);
    rewrite(&s, 4, |raw| Full39::clear_cont_at(raw, 0, 4));
    assert_eq!(caught(&m), (VA, 4, false, None));
}

/// An unfold made entry by entry in place (no clear, no flush in between)
/// while another hart holds the run: that hart's cached NAPOT translation
/// meets a PTE without N at the first write.
#[test]
fn napot_sim_catches_an_in_place_unfold_of_a_cached_run_at_the_write() {
    let (m, s) = run_machine(2);
    touch(&m.cpu(1));
    for k in 0..16 {
        rewrite(&s, k, |raw| Full39::clear_cont_at(raw, 0, k as usize));
    }
    flush_run(&s);
    // After the flush the PTEs are consistent plain PTEs again; the
    // conflict was at the first write.
    assert_eq!(caught(&m), (VA, 0, false, Some(1)));
}

/// The PPN of a cached run changed entry by entry (a remap without
/// break-before-make): until the flush a hart may translate any page of
/// the run through either PPN.
#[test]
fn napot_sim_catches_an_in_place_remap_of_a_cached_run_at_the_write() {
    let (m, s) = run_machine(2);
    touch(&m.cpu(1));
    for k in 0..16 {
        rewrite(&s, k, |raw| raw + ((RUN >> 12) << PPN_SHIFT));
    }
    flush_run(&s);
    assert_eq!(caught(&m), (VA, 0, false, Some(1)));
}

/// The correct sequence beside them: PBMT (and rights) changed entry by
/// entry while another hart holds the run. RISC-V has no break-before-make
/// rule, so this is accepted: the cached copy is one stale PTE until the
/// flush. The run's N and PPN never change.
#[test]
fn napot_in_place_memory_type_change_of_a_cached_run_is_accepted() {
    let (m, s) = run_machine(2);
    touch(&m.cpu(1));
    let io = Prot::READ_ONLY.with_mem(MemType::Device);
    for k in 0..16 {
        rewrite(&s, k, |raw| Full39::modify_prot(raw, io, 0));
        // The holding hart may go on using its copy meanwhile.
        m.cpu(1).access(VA.add(k * PAGE), Access::READ).unwrap();
    }
    flush_run(&s);
    m.check().unwrap();
    let raw = s.inspect().entry(VA.add(7 * PAGE), 0).unwrap();
    assert_ne!(raw & N, 0);
    assert_eq!(raw & NAPOT_64K_MASK, 0b1000 << PPN_SHIFT);
    assert_eq!(Full39::leaf_prot(raw, 0).mem(), MemType::Device);
    assert_eq!(
        m.translate(VA.add(7 * PAGE + 8)).unwrap(),
        PhysAddr(PA.0 + 7 * PAGE + 8)
    );
}

/// `change_protection` of a whole run to another memory type does it the
/// same way (no break), and the simulator accepts it.
#[test]
fn napot_change_protection_of_a_whole_cached_run_to_io_passes_the_checks() {
    let (m, mut s) = run_machine(2);
    touch(&m.cpu(1));
    let io = Prot::READ_WRITE.with_mem(MemType::Device);
    s.change_protection(VA, RUN, io).unwrap();
    m.check().unwrap();
    for k in 0..16 {
        let raw = s.inspect().entry(VA.add(k * PAGE), 0).unwrap();
        assert_ne!(raw & N, 0, "page {k}");
        assert_eq!(Full39::leaf_prot(raw, 0).mem(), MemType::Device);
        assert_eq!(
            m.cpu(1).translate(VA.add(k * PAGE)).unwrap(),
            PhysAddr(PA.0 + k * PAGE)
        );
    }
}

/// `replace_pte` of a page inside a Svnapot run (swap-out, then a
/// copy-on-write copy in another run) unfolds the run first, on Sv39 and
/// Sv57.
#[test]
fn napot_replace_pte_unfolds_the_run() {
    pgtable_testkit::ops::replace_pte_in_a_folded_run_unfolds_it::<Full39>();
    pgtable_testkit::ops::replace_pte_in_a_folded_run_unfolds_it::<
        RiscvPaging<5, { SVPBMT | SVNAPOT }>,
    >();
}
