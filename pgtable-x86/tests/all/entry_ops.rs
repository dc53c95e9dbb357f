//! The x86 entry operations: single stores, no walker barrier, atomic
//! get-and-clear, deferred flush for huge protection changes.

use std::cell::Cell;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use pgtable_core::contract::{Arch, Arena, Format, Mmu, Slot, TlbRange};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_testkit::miri_scaled;
use pgtable_x86::{X86_64La57, X86_64};

/// Counts what the operations ask of the machine.
#[derive(Default)]
struct Counting {
    barriers: Cell<u64>,
    range_flushes: Cell<u64>,
    full_flushes: Cell<u64>,
}

// SAFETY: a host test MMU: no hardware walker uses these tables.
unsafe impl Mmu for Counting {
    fn walker_barrier(&self) {
        self.barriers.set(self.barriers.get() + 1);
    }
    fn flush_tlb_range(&self, _range: TlbRange) {
        self.range_flushes.set(self.range_flushes.get() + 1);
    }
    fn flush_tlb_all(&self) {
        self.full_flushes.set(self.full_flushes.get() + 1);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
}

#[test]
fn capabilities_match_x86() {
    fn check<A: Arch>() {
        assert!(A::HAVE_MOVE_PMD);
        assert!(A::HAVE_MOVE_PUD);
        assert_eq!(A::TLB_FLUSH_CEILING, 33);
        assert!(!A::NEEDS_WALKER_BARRIER);
        assert!(!A::BREAK_BEFORE_MAKE);
    }
    check::<X86_64>();
    check::<X86_64La57>();
}

#[test]
fn setters_store_without_barriers() {
    let mmu = Counting::default();
    let slot: Slot = AtomicU64::new(0);
    let va = VirtAddr(0x20_0000);
    let pte = X86_64::leaf(PhysAddr(0x5000), Prot::READ_WRITE, 0);
    X86_64::set_pte_at(&mmu, va, &slot, pte);
    assert_eq!(slot.load(Relaxed), pte);
    let pmd = X86_64::leaf(PhysAddr(0x20_0000), Prot::READ_WRITE, 1);
    X86_64::set_pmd_at(&mmu, va, &slot, pmd);
    assert_eq!(slot.load(Relaxed), pmd);
    let pud = X86_64La57::leaf(PhysAddr(0x4000_0000), Prot::READ_WRITE, 2);
    X86_64La57::set_pud_at(&mmu, va, &slot, pud);
    assert_eq!(slot.load(Relaxed), pud);
    assert_eq!(mmu.barriers.get(), 0);
    assert_eq!(mmu.range_flushes.get() + mmu.full_flushes.get(), 0);
}

#[test]
fn get_and_clear_returns_hardware_updates() {
    let mmu = Counting::default();
    // A user PTE the "hardware" has since marked accessed and dirty.
    let slot: Slot = AtomicU64::new(0x7007);
    slot.fetch_or(0x60, Relaxed);
    assert_eq!(X86_64::ptep_get_and_clear(&mmu, &slot), 0x7067);
    assert_eq!(slot.load(Relaxed), 0);
}

#[test]
fn get_and_clear_never_loses_a_concurrent_dirty_update() {
    // One thread plays the processor: it sets D with a locked OR whenever
    // it finds the entry present and clean. The other repeatedly takes the
    // entry out and puts it back clean. Every D the "processor" set must be
    // returned by exactly one get-and-clear.
    // Bounded in sets and in time, whatever the scheduler does; a tenth of
    // the sets under Miri.
    const SETS: u64 = miri_scaled(1_000);
    const LIMIT: Duration = Duration::from_secs(3);
    let slot: &'static Slot = Box::leak(Box::new(AtomicU64::new(0x7027)));
    let done: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let hw = std::thread::spawn(move || {
        let mut set = 0u64;
        let t0 = Instant::now();
        while set < SETS && t0.elapsed() < LIMIT {
            let cur = slot.load(Relaxed);
            // Relaxed: only the atomicity of the OR matters. An OR that
            // lands on the cleared entry is overwritten by the next store
            // and not counted (fetch_or returned P = 0).
            if cur & 0x41 == 1 && slot.fetch_or(0x40, Relaxed) & 0x41 == 1 {
                set += 1;
            }
        }
        // Release: the ORs above happen before `done` is seen.
        done.store(true, Release);
        set
    });
    let mmu = Counting::default();
    let mut seen = 0u64;
    loop {
        // Acquire: pairs with the Release above.
        let finished = done.load(Acquire);
        let old = X86_64::ptep_get_and_clear(&mmu, slot);
        if old & 0x40 != 0 {
            seen += 1;
        }
        if finished {
            break;
        }
        slot.store(0x7027, Relaxed);
    }
    let set = hw.join().unwrap();
    assert!(set > 0, "the race never happened");
    assert_eq!(seen, set);
}

#[test]
fn huge_protection_change_defers_its_flush() {
    let mmu = Counting::default();
    let block = X86_64::leaf(PhysAddr(0x4000_0000), Prot::READ_WRITE, 2);
    let slot: Slot = AtomicU64::new(block);
    let va = VirtAddr(0x4000_0000);
    let old = X86_64::pmdp_modify_prot_start(&mmu, va, &slot, 2);
    assert_eq!(old, block);
    assert_eq!(
        slot.load(Relaxed),
        0,
        "not present between start and commit"
    );
    assert_eq!(mmu.range_flushes.get() + mmu.full_flushes.get(), 0);
    let new = X86_64::modify_prot(old, Prot::READ_ONLY, 2);
    X86_64::pmdp_modify_prot_commit(&mmu, va, &slot, 2, new);
    assert_eq!(slot.load(Relaxed), block & !0x2);
    assert_eq!(mmu.barriers.get(), 0);
    assert_eq!(mmu.range_flushes.get() + mmu.full_flushes.get(), 0);
}

#[test]
fn splitting_a_block_in_place_needs_no_break_before_make() {
    // 2 MiB block, then unmap one page of it: the split happens in place
    // (no flush of the block before the table is linked) and one gathered
    // flush follows at the end; no walker barriers at all.
    let mut s = AddressSpace::<X86_64, _, _>::new(Counting::default(), Arena::new()).unwrap();
    s.map(
        VirtAddr(0x20_0000),
        PhysAddr(0x20_0000),
        0x20_0000,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .unwrap();
    s.unmap(VirtAddr(0x20_0000), 0x1000).unwrap();
    let m = s.mmu();
    assert_eq!(m.barriers.get(), 0);
    assert_eq!(m.range_flushes.get() + m.full_flushes.get(), 1);
    assert_eq!(
        s.translate(VirtAddr(0x20_1000)).unwrap().pa,
        PhysAddr(0x20_1000)
    );
}
