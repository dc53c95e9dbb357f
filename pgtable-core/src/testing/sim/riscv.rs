//! The RISC-V fences on the simulated machine: a [`SimHart`] executes
//! `SFENCE.VMA`, the Svinval instructions and `satp` writes on one
//! simulated CPU (a hart) with the privileged spec's reach, so an MMU
//! built from those instructions (pgtable-riscv's `HartMmu`) runs here
//! exactly as it runs on a hart. The rules are [`SimHart`]'s docs.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, MutexGuard};
use std::vec::Vec;

use super::state::{key_span, Set, State, GLOBAL};
use super::{lock, Shared, SimMachine};
use crate::{Arch, Decoded, PhysAddr, Slot, VirtAddr};

/// A hart's Svinval batch: what `SFENCE.W.INVAL` ordered and the
/// `SINVAL.VMA`s waiting for `SFENCE.INVAL.IR`.
#[derive(Default)]
pub(super) struct Batch {
    /// The writes pending at the last `SFENCE.W.INVAL` of the batch
    /// (`None`: none executed since the last `SFENCE.INVAL.IR`).
    ordered: Option<Set<u64>>,
    /// Invalidations executed and not yet in effect.
    queued: Vec<Inval>,
}

/// One `SINVAL.VMA`: its operands and the pending writes it orders.
struct Inval {
    va: Option<u64>,
    asid: Option<u32>,
    visible: Vec<u64>,
}

/// One simulated hart's fence and `satp` instructions: made by
/// [`SimMachine::hart`], `Send + Sync`. A RISC-V `Mmu` built from these
/// instructions (pgtable-riscv's `HartMmu`) runs on it as on a hart.
///
/// # Rules (privileged spec, "Supervisor Memory-Management Fence
/// Instruction"; "Svinval" and "Svvptc" extensions)
///
/// - **A PTE store reaches the walker only through a fence covering it.**
///   Every entry write is pending (the walker keeps seeing the old value,
///   as in the arm64 model) until a fence *orders* it:
///   `SFENCE.VMA x0, …` orders writes to every level; `SFENCE.VMA va, …`
///   only the *leaf* entries that translate `va` (from the hart's root and
///   the roots its cached entries came from): a write to a non-leaf entry
///   (a table linked or unlinked) stays pending under it.
/// - **Reach of the invalidation**, on the executing hart only:
///   - `x0, x0`: every entry, global ones included;
///   - `x0, asid`: every entry (leaves and walk cache) of `asid`, *not*
///     global ones;
///   - `va, x0`: the leaves covering `va` of every ASID, global ones
///     included; walk-cache entries stay;
///   - `va, asid`: the leaves covering `va` of `asid`, not global ones;
///     walk-cache entries stay.
/// - **Global entries**: a leaf with G set is cached as global
///   ([`Prot::global`](crate::Prot::global)) and matches every ASID.
/// - **Svinval**: `SFENCE.W.INVAL` orders the writes pending at that
///   moment before the `SINVAL.VMA`s that follow; a `SINVAL.VMA` has the
///   reach of `SFENCE.VMA` with the same operands, but takes effect (the
///   entries are dropped, the ordered writes become visible) only at the
///   next `SFENCE.INVAL.IR` (or `SFENCE.VMA`). So a `SINVAL.VMA` without
///   `SFENCE.W.INVAL` before it leaves its writes pending (the walker may
///   refill the old value: [`CheckError::Pending`]), and one without
///   `SFENCE.INVAL.IR` after it leaves the old entries cached
///   ([`CheckError::Stale`]) and the writes pending.
/// - **Svvptc** ([`SimMachine::set_svvptc`]): a store that makes an
///   invalid entry valid is visible to the walker at once (the extension
///   says "eventually"; a walk that missed it would fault and be retried).
/// - **Svade** ([`SimMachine::set_software_ad`]): the walker never sets A
///   or D; an access that would need it faults
///   ([`AccessFault::AccessFlag`]) and the kernel's fault path sets them.
/// - **`satp`**: a write switches the hart's root and ASID and neither
///   flushes nor orders anything.
///
/// Not modelled: visibility per hart (a write ordered by one hart's fence
/// is visible to every walker), and the ASID of `x0, asid` orderings (it
/// orders every level's writes of every address space here).
///
/// [`CheckError::Pending`]: super::CheckError::Pending
/// [`CheckError::Stale`]: super::CheckError::Stale
/// [`AccessFault::AccessFlag`]: crate::contract::AccessFault::AccessFlag
pub struct SimHart<A: Arch> {
    shared: Arc<Shared>,
    cpu: usize,
    _arch: PhantomData<fn() -> A>,
}

impl<A: Arch> Clone for SimHart<A> {
    fn clone(&self) -> Self {
        SimHart {
            shared: self.shared.clone(),
            cpu: self.cpu,
            _arch: PhantomData,
        }
    }
}

impl<A: Arch> fmt::Debug for SimHart<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimHart").field("cpu", &self.cpu).finish()
    }
}

impl<A: Arch> SimMachine<A> {
    /// The hart of this handle's CPU, executing RISC-V fences (see
    /// [`SimHart`]).
    pub fn hart(&self) -> SimHart<A> {
        SimHart {
            shared: self.shared.clone(),
            cpu: self.cpu,
            _arch: PhantomData,
        }
    }

    /// Turns software management of the accessed/dirty state on or off
    /// (RISC-V Svade, arm64 without FEAT_HAFDBS): on, an access whose
    /// leaf lacks A, or a store whose leaf lacks D, faults with
    /// [`AccessFault::AccessFlag`](crate::contract::AccessFault::AccessFlag) and
    /// changes nothing; the kernel's fault path sets the bits
    /// ([`AddressSpace::ptep_set_access_flags`](crate::AddressSpace::ptep_set_access_flags))
    /// and the access is retried. Off (the default), the walker sets
    /// them as the format's [`hw_access`](crate::Format::hw_access)
    /// says.
    pub fn set_software_ad(&self, on: bool) {
        self.state().software_ad = on;
    }

    /// Turns RISC-V Svvptc on or off: on, a store that makes an invalid
    /// entry valid is visible to the walker without a barrier.
    pub fn set_svvptc(&self, on: bool) {
        self.state().svvptc = on;
    }
}

impl<A: Arch> SimHart<A> {
    /// The CPU this hart is.
    pub fn cpu(&self) -> usize {
        self.cpu
    }

    /// The machine, seen from this hart.
    pub fn machine(&self) -> SimMachine<A> {
        SimMachine {
            shared: self.shared.clone(),
            cpu: self.cpu,
            _arch: PhantomData,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        let mut s = lock(&self.shared);
        let n = s.cpus();
        assert!(self.cpu < n, "hart {} of a machine with {n} CPUs", self.cpu);
        s.select(self.cpu);
        s
    }

    /// `SFENCE.VMA rs1, rs2` (`None` is `x0`).
    pub fn sfence_vma(&self, va: Option<VirtAddr>, asid: Option<u16>) {
        let mut s = self.state();
        s.settle_batch::<A>();
        s.rv_sfence::<A>(va.map(|v| v.0), asid.map(u32::from));
    }

    /// `SFENCE.W.INVAL`: the writes pending now are ordered before the
    /// `SINVAL.VMA`s that follow.
    pub fn sfence_w_inval(&self) {
        let mut s = self.state();
        let now: Set<u64> = s.pending.keys().copied().collect();
        let ordered = s.cpu.svinval.ordered.get_or_insert_with(Set::default);
        ordered.extend(now);
    }

    /// `SINVAL.VMA rs1, rs2`: queued until `SFENCE.INVAL.IR`.
    pub fn sinval_vma(&self, va: Option<VirtAddr>, asid: Option<u16>) {
        let mut s = self.state();
        let va = va.map(|v| v.0);
        let asid = asid.map(u32::from);
        let visible = match &s.cpu.svinval.ordered {
            None => Vec::new(),
            Some(ordered) => s
                .ordered_by::<A>(va)
                .into_iter()
                .filter(|a| ordered.contains(a))
                .collect(),
        };
        s.cpu.svinval.queued.push(Inval { va, asid, visible });
    }

    /// `SFENCE.INVAL.IR`: the queued invalidations take effect.
    pub fn sfence_inval_ir(&self) {
        self.state().settle_batch::<A>();
    }

    /// `FENCE W, W`: a publish point (Linux `smp_wmb()`).
    pub fn fence_w_w(&self) {
        lock(&self.shared).publish();
    }

    /// `csrw satp`: the hart translates through `root` (`None`: Bare)
    /// with `asid`; nothing is flushed or ordered. The ASID's cached
    /// entries are usable from now on, so a stale one is reported.
    ///
    /// # Safety
    ///
    /// `root` is a table frame of this machine's allocator, or `None`
    /// (simulated: the walker checks every frame it reads).
    pub unsafe fn write_satp(&self, root: Option<PhysAddr>, asid: u16) {
        let mut s = self.state();
        s.cpu.split = false;
        s.cpu.upper_root = None;
        s.cpu.root = root;
        let tag = u32::from(asid);
        s.cpu.asid = tag;
        s.cpu.owed.remove(&tag);
        s.check_switch::<A>();
    }

    /// Reports an entry write (what `Mmu::entry_written` forwards).
    pub fn entry_written(&self, slot: &Slot, old: u64) {
        lock(&self.shared).entry_written::<A>(slot, old);
    }
}

impl State {
    /// An SFENCE.VMA on the selected CPU (`None` operands are `x0`).
    fn rv_sfence<A: Arch>(&mut self, va: Option<u64>, asid: Option<u32>) {
        let me = self.sel;
        match (va, asid) {
            (None, None) => self.flush_all(me, false),
            (None, Some(a)) => self.flush_mm(a, me, false),
            (Some(v), _) => {
                for a in self.ordered_by::<A>(Some(v)) {
                    self.pending.remove(&a);
                }
                self.publish();
                self.invalidate_leaves::<A>(v, asid);
            }
        }
    }

    /// Drops the selected CPU's leaves covering `va` of `asid` (not
    /// global ones), or of every ASID (`None`); walk-cache entries stay.
    fn invalidate_leaves<A: Arch>(&mut self, va: u64, asid: Option<u32>) {
        self.stats.flush_range += 1;
        let n = self.drop_where(|&(base, h, leaf, tag)| {
            let covers = va.wrapping_sub(base) < key_span::<A>(h);
            let tagged = asid.is_none_or(|a| tag == a && tag != GLOBAL);
            leaf && covers && tagged
        });
        self.stats.tlb_entries_flushed += n as u64;
        self.prune_splits();
    }

    /// The pending writes a fence with `rs1 = va` orders: with `x0`, all;
    /// with an address, the entries that are leaves (and were, before the
    /// write) on the walks for `va` from the selected CPU's roots and the
    /// roots of its cached entries.
    fn ordered_by<A: Arch>(&self, va: Option<u64>) -> Vec<u64> {
        let Some(va) = va else {
            return self.pending.keys().copied().collect();
        };
        let mut roots: Vec<PhysAddr> = [self.cpu.root, self.cpu.upper_root]
            .into_iter()
            .flatten()
            .collect();
        for c in self.cpu.tlb.values() {
            if !roots.contains(&c.root) {
                roots.push(c.root);
            }
        }
        roots
            .into_iter()
            .filter_map(|r| self.leaf_slot::<A>(r, va))
            .filter(|a| {
                // A write that replaced a table pointer is a non-leaf one.
                self.pending
                    .get(a)
                    .is_some_and(|&(old, _)| !(0..A::LEVELS).any(|h| is_table::<A>(old, h)))
            })
            .collect()
    }

    /// Host address of the entry where the walk for `va` from `root`
    /// (through memory as it is) ends: the leaf, or the entry that is not
    /// a table.
    fn leaf_slot<A: Arch>(&self, root: PhysAddr, va: u64) -> Option<u64> {
        let mut h = A::LEVELS - 1;
        let mut tpa = root;
        loop {
            let t = self.table(tpa).ok()?;
            let slot = &t[super::state::hw_index::<A>(va, h)];
            // Relaxed: the simulated walker needs single-copy atomicity.
            match A::decode(slot.load(std::sync::atomic::Ordering::Relaxed), h) {
                Decoded::Table(c) if h > 0 => tpa = c,
                _ => return Some(slot as *const Slot as u64),
            }
            h -= 1;
        }
    }

    /// The selected CPU's queued `SINVAL.VMA`s take effect
    /// (`SFENCE.INVAL.IR`, or an `SFENCE.VMA`, which is ordered after
    /// them); the batch ends.
    fn settle_batch<A: Arch>(&mut self) {
        let batch = std::mem::take(&mut self.cpu.svinval);
        if batch.queued.is_empty() && batch.ordered.is_none() {
            return;
        }
        let me = self.sel;
        for inv in batch.queued {
            for a in &inv.visible {
                self.pending.remove(a);
            }
            match (inv.va, inv.asid) {
                (None, None) => {
                    self.stats.tlb_entries_flushed += self.drop_where(|_| true) as u64;
                    self.cpu.owed.clear();
                }
                (None, Some(a)) => {
                    self.stats.tlb_entries_flushed += self.drop_where(|k| k.3 == a) as u64;
                    self.cpu.owed.remove(&a);
                }
                (Some(v), asid) => self.invalidate_leaves::<A>(v, asid),
            }
            debug_assert_eq!(self.sel, me);
        }
        self.publish();
        self.prune_splits();
    }

    /// With Svvptc, whether the write of `new` over `old` at `addr` is
    /// visible to the walker at once: it makes an invalid entry valid and
    /// no earlier write to the entry is pending.
    pub(super) fn visible_at_once<A: Arch>(&self, addr: u64, old: u64, new: u64) -> bool {
        let valid = |raw| {
            (0..A::LEVELS)
                .any(|h| matches!(A::decode(raw, h), Decoded::Leaf(_) | Decoded::Table(_)))
        };
        self.svvptc && !self.pending.contains_key(&addr) && !valid(old) && valid(new)
    }
}

/// Whether `raw` is a table pointer at height `h`.
fn is_table<A: Arch>(raw: u64, h: u32) -> bool {
    h > 0 && matches!(A::decode(raw, h), Decoded::Table(_))
}
