//! Linux's generic fallbacks for the entry operations, as free functions.
//!
//! These are the default bodies of the [`Arch`] methods. An arch crate that
//! overrides a method can still call the fallback from here.
//!
//! Memory ordering: every entry access is `Relaxed`. Ordering toward the
//! hardware walker is the job of [`Mmu::walker_barrier`], of
//! [`Mmu::publish_barrier`] before a table is linked ([`populate`]) and of
//! the TLB flushes (a Rust ordering does not order the walker), and no software
//! thread reads the tables concurrently: the algorithms hold the address
//! space exclusively. What the atomics buy is single-copy atomicity (the
//! walker never sees a torn entry) and read-modify-writes that cannot lose a
//! concurrent hardware accessed/dirty update.

use core::sync::atomic::Ordering::Relaxed;

use crate::{Arch, Mmu, PhysAddr, Slot, TableAttrs, TlbRange, VirtAddr};

/// Stores `val` without a walker barrier (Linux `set_pte_nosync`).
#[inline]
pub fn set_entry_nosync<M: Mmu>(mmu: &M, slot: &Slot, val: u64) {
    if M::OBSERVES_WRITES {
        // Relaxed: see the module docs; the simulator is the only observer.
        let old = slot.swap(val, Relaxed);
        mmu.entry_written(slot, old);
    } else {
        // Relaxed: ordering toward the walker comes from the barrier.
        slot.store(val, Relaxed);
    }
}

/// Stores `val` and, where the arch needs it, issues the walker barrier
/// (Linux `set_pte_at` / `set_pmd_at` / `set_pud_at`).
#[inline]
pub fn set_entry_at<A: Arch, M: Mmu>(mmu: &M, _va: VirtAddr, slot: &Slot, val: u64) {
    set_entry_nosync(mmu, slot, val);
    if A::NEEDS_WALKER_BARRIER {
        mmu.walker_barrier();
    }
}

/// Links the next-level table at `table` into the entry `slot` at
/// `height` (Linux `pmd_populate` / `pud_populate` / `p4d_populate` /
/// `pgd_populate`): a publish barrier, then the table entry, with no walker
/// barrier (the caller's per-table barrier follows).
///
/// The barrier comes first because a walker on another CPU may read the
/// new entry at any moment after the store, not only after the walker
/// barrier: the table's zeroing and its entries must be visible to it
/// before the link is (Linux `__pte_alloc`: "ensure all pte setup … is
/// visible before the pte is made visible to other CPUs").
#[inline]
pub fn populate<A: Arch, M: Mmu>(mmu: &M, slot: &Slot, table: PhysAddr, height: u32) {
    mmu.publish_barrier();
    set_entry_nosync(mmu, slot, A::table_entry(table, height));
}

/// [`populate`] with table attributes: the entry is
/// [`Format::table_entry_attrs`](crate::Format::table_entry_attrs).
#[inline]
pub fn populate_attrs<A: Arch, M: Mmu>(
    mmu: &M,
    slot: &Slot,
    table: PhysAddr,
    height: u32,
    attrs: TableAttrs,
) {
    mmu.publish_barrier();
    set_entry_nosync(mmu, slot, A::table_entry_attrs(table, height, attrs));
}

/// Atomically reads and clears an entry (Linux `ptep_get_and_clear`).
#[inline]
pub fn get_and_clear<M: Mmu>(mmu: &M, slot: &Slot) -> u64 {
    // Relaxed: an atomic swap cannot lose a concurrent hardware A/D update
    // whatever its ordering; the walker is ordered by barriers and flushes.
    let old = slot.swap(0, Relaxed);
    if M::OBSERVES_WRITES {
        mmu.entry_written(slot, old);
    }
    old
}

/// Generic `ptep_modify_prot_start`: an atomic get-and-clear. The entry is
/// not present until the commit, so no hardware update can be lost.
#[inline]
pub fn ptep_modify_prot_start<A: Arch, M: Mmu>(mmu: &M, _va: VirtAddr, slot: &Slot) -> u64 {
    A::ptep_get_and_clear(mmu, slot)
}

/// Generic `ptep_modify_prot_commit`: `set_pte_at` of the new value.
#[inline]
pub fn ptep_modify_prot_commit<A: Arch, M: Mmu>(
    mmu: &M,
    va: VirtAddr,
    slot: &Slot,
    _old: u64,
    new: u64,
) {
    A::set_pte_at(mmu, va, slot, new)
}

/// Generic `pmdp_modify_prot_start` (Linux `pmdp_invalidate`): atomically
/// clear the block and flush its range immediately.
#[inline]
pub fn pmdp_modify_prot_start<A: Arch, M: Mmu>(
    mmu: &M,
    va: VirtAddr,
    slot: &Slot,
    height: u32,
) -> u64 {
    let old = A::pmdp_huge_get_and_clear(mmu, slot);
    mmu.flush_tlb_range(TlbRange::leaf::<A>(va, height));
    old
}

/// The deferred form of `pmdp_modify_prot_start` (arm64, Linux "arm64: mm: rework the pmd
/// protect changing flow"): an
/// atomic get-and-clear and no flush; the caller's gathered flush at the end
/// of the operation removes the old translation.
#[inline]
pub fn pmdp_modify_prot_start_deferred<A: Arch, M: Mmu>(
    mmu: &M,
    _va: VirtAddr,
    slot: &Slot,
    _height: u32,
) -> u64 {
    A::pmdp_huge_get_and_clear(mmu, slot)
}

/// Generic `pmdp_modify_prot_commit`: `set_pmd_at` (or `set_pud_at`).
#[inline]
pub fn pmdp_modify_prot_commit<A: Arch, M: Mmu>(
    mmu: &M,
    va: VirtAddr,
    slot: &Slot,
    height: u32,
    new: u64,
) {
    if height >= 2 {
        A::set_pud_at(mmu, va, slot, new)
    } else {
        A::set_pmd_at(mmu, va, slot, new)
    }
}

/// Generic rule for in-place changes of a live entry (break-before-make is
/// not needed): from or to an entry the walker does not use (none or
/// invalid), the same table, or a leaf with the same output address, size
/// and memory type whose permissions or accessed/dirty state change, as
/// long as it does not become global while it was not (a TLB could then
/// hold an ASID-tagged and a global translation of one address). These are
/// the Arm ARM D8.16 rules in format-neutral terms.
#[inline]
pub fn change_is_safe<A: Arch>(old: u64, new: u64, height: u32) -> bool {
    use crate::Decoded::{Invalid, Leaf, None, Table};
    match (A::decode(old, height), A::decode(new, height)) {
        (None | Invalid, _) | (_, None | Invalid) => true,
        // A PROT_NONE leaf is invalid for the hardware: nothing cached.
        (Leaf(_), _) if A::is_protnone(old, height) => true,
        (_, Leaf(_)) if A::is_protnone(new, height) => true,
        (Leaf(a), Leaf(b)) => {
            let (p, q) = (A::leaf_prot(old, height), A::leaf_prot(new, height));
            a == b && p.mem() == q.mem() && (p.global() || !q.global())
        }
        (Table(a), Table(b)) => a == b,
        _ => false,
    }
}
