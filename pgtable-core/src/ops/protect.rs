//! `change_protection`: mprotect for page tables (Linux "arm64: mm: rework the pmd protect
//! changing flow").
//!
//! Shaped like Linux's `change_protection` → `change_p4d_range` →
//! `change_pud_range` → `change_pmd_range` → `change_pte_range`, one
//! recursive function here because every level has the same layout:
//!
//! 1. check: walk the range read-only and count the tables that splitting
//!    the partly covered blocks needs (only blocks at the two ends of the
//!    range can be partly covered; blocks that already have the new
//!    protection are not split);
//! 2. reserve: allocate exactly that many tables, or fail with nothing
//!    changed;
//! 3. change: per PTE `ptep_modify_prot_start` → [`Format::modify_prot`] →
//!    `ptep_modify_prot_commit`; per whole block `pmdp_modify_prot_start` /
//!    `pmdp_modify_prot_commit`; one gathered TLB flush at the end.
//!
//! # Accessed/dirty state
//!
//! The start operations are atomic get-and-clear swaps: between start and
//! commit the entry is not present, so the hardware cannot set an accessed
//! or dirty bit that the commit would then overwrite; whatever it set before
//! the swap is in the returned value and [`Format::modify_prot`] keeps it.
//! An entry the format calls *settled* ([`Format::is_settled`]: accessed
//! and dirty, or accessed and unable to become dirty) is never written by
//! the hardware (Intel SDM vol. 3 §4.8; arm64 hardware AF/DBM updates
//! likewise), so it is changed with a plain load and store instead; this
//! avoids a locked instruction per page.
//!
//! # Break-before-make
//!
//! A [`Prot`] carries a memory type and a global flag. Linux's mprotect
//! never changes either, but this function can, and where the arch needs
//! break-before-make for the change ([`Arch::BREAK_BEFORE_MAKE`] and
//! [`Arch::change_is_safe`]; arm64: a change of memory type or cacheability,
//! or non-global to global, of a live mapping: Arm ARM D8.16
//! "break-before-make", Linux arm64 `pgattr_change_is_safe`) such an entry
//! is cleared, its translation flushed at once, and only then the new entry
//! written. The same rule decides for pages, blocks and block splits.
//! Permission changes alone are made in place, as Linux does.
//!
//! # Counters
//!
//! [`Stats::entries_written`](crate::Stats::entries_written) counts each
//! changed entry once (a start/commit pair is one logical write); entries
//! that already grant the protection are not counted, nor written.
//!
//! # Walker barriers
//!
//! The entry operations of one table run in a lazy-MMU scope, as Linux's
//! `change_pte_range` runs inside `arch_enter_lazy_mmu_mode`: the walker
//! barrier an arch's commit would issue per entry (`set_pte_at`) is
//! replaced by one per table, after its last changed entry, issued where the
//! arch needs it ([`Arch::NEEDS_WALKER_BARRIER`]) and deferred further
//! inside [`AddressSpace::lazy_mmu`]. This is safe because nothing depends
//! on a new entry being visible to the walker before the operation's final
//! flush, and a flush orders the entry writes before it (the rules in
//! [`Mmu`]); until then a CPU may still see the old or the cleared entry,
//! exactly as during Linux's mprotect. TLB flushes an arch issues inside an
//! entry operation (the generic `pmdp_modify_prot_start`) are never
//! deferred, and neither is the barrier of a break-before-make split.
//!
//! # Costs
//!
//! Per changed PTE: one load, one atomic swap and one store (or a load and a
//! store for a settled entry); no barrier; no flush. Per table: one walker
//! barrier and one range added to the gather. Per operation: one TLB flush
//! (range, or full past the ceiling), plus one per block for an arch that
//! keeps the generic block start.
//!
//! [`Format::modify_prot`]: crate::Format::modify_prot
//! [`Format::is_settled`]: crate::Format::is_settled

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{entry_end, page_size, size};
use crate::ops::contpte;
use crate::space::aspace::{break_entry, covers, needs_bbm, FreeQueue, Reservation, TableSpan};
use crate::space::walker::{Next, Span, TableRef};
use crate::{
    AddressSpace, Arch, Decoded, Error, Mmu, PhysAddr, Prot, Slot, TableAlloc, TlbGather, TlbRange,
    VirtAddr,
};

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Changes the protection of every mapping in `[va, va + len)` to
    /// `prot` (Linux `change_protection`, the page-table half of
    /// `mprotect`).
    ///
    /// - Output addresses and accessed/dirty state are kept; a hardware
    ///   accessed/dirty update racing the change is never lost.
    /// - A block the range covers only in part is split into next-level
    ///   leaves first; the part outside the range keeps its protection and
    ///   its physical addresses.
    /// - A folded contiguous run (arm64) the range covers only in part is
    ///   unfolded first, with break-before-make for the whole run; whole
    ///   runs stay folded and are changed entry by entry (the get-and-clear
    ///   transaction, or a plain store for a settled entry), so a CPU may
    ///   take a translation fault on one of their entries until it is
    ///   committed (retried by a user fault handler, as after
    ///   Linux's arm64 `modify_prot_start_ptes`; use
    ///   [`change_protection_live`](Self::change_protection_live) for
    ///   mappings that must not fault). A memory-type change breaks whole
    ///   runs at once.
    /// - Entries that already grant `prot` are not written and add nothing
    ///   to the TLB flush.
    /// - Holes (unmapped parts of the range, and software-only invalid
    ///   entries) are skipped, as [`unmap`](Self::unmap) skips them: it is
    ///   not an error to change the protection of a partly mapped range.
    /// - The TLB is flushed once for the whole operation (a full flush past
    ///   [`Arch::TLB_FLUSH_CEILING`]), plus one flush per block where the
    ///   arch keeps Linux's generic `pmdp_modify_prot_start`, which
    ///   invalidates and flushes each block at once (Linux "arm64: mm:
    ///   rework the pmd protect changing flow"). Splitting a block, changing
    ///   a memory type and making a leaf global flush at once where the arch
    ///   needs break-before-make (see the module docs); elsewhere (x86) a
    ///   block split in place is flushed at once before its covered part
    ///   changes (Intel SDM Vol. 3A 4.10.2.3).
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// space.map(va, PhysAddr(0x8000_0000), 2 << 20, Prot::READ_WRITE, MapOptions::BLOCKS).unwrap();
    /// // Make the second 4 KiB page read-only: the 2 MiB block is split.
    /// space.change_protection(va.add(0x1000), 0x1000, Prot::READ_ONLY).unwrap();
    /// assert_eq!(space.translate(va.add(0x1000)).unwrap().prot, Prot::READ_ONLY);
    /// assert_eq!(space.translate(va).unwrap().prot, Prot::READ_WRITE);
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::ZeroLength`], [`Error::MisalignedVirt`] /
    /// [`Error::MisalignedLength`], [`Error::OutOfRange`] for a range
    /// outside the address space, or [`Error::OutOfMemory`] when a partly
    /// covered block cannot be split. On error nothing was changed and no
    /// table frame stays allocated.
    pub fn change_protection(&mut self, va: VirtAddr, len: u64, prot: Prot) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        // As the leaves report it, so an equal protection is no change.
        self.change_prot_with(end, va, prot.normalized(), Self::protect_change)
    }

    /// The phases both `change_protection` and `change_protection_live`
    /// share once the range is checked (exclusive end `end`): reserve the
    /// tables that splitting blocks needs (a block that already grants
    /// `prot` is left whole), run `change` over the tree, then flush once.
    pub(crate) fn change_prot_with(
        &mut self,
        end: u64,
        va: VirtAddr,
        prot: Prot,
        change: fn(&mut Self, TableSpan, Prot, &mut Reservation, &mut TlbGather),
    ) -> Result<(), Error> {
        let top = A::LEVELS - 1;
        let differs = |raw, h| A::leaf_prot(raw, h) != prot;
        let need = self.split_check(va.0, end, &differs);
        let mut stash = self.reserve(need)?;
        self.may_hold_global |= prot.global();
        // A run the range covers in part is unfolded first; whole runs are
        // changed entry by entry and keep the hint (Linux
        // `contpte_wrprotect_ptes`): they agree again by the final flush.
        self.contpte_unfold_edges_if(va.0, end, &differs);
        let mut gather = TlbGather::new();
        let root = TableSpan::new(top, self.root, va.0, end);
        change(self, root, prot, &mut stash, &mut gather);
        // Short only if `split_check` under-counted (see `take`).
        let settled = self.settle(stash);
        self.finish(gather, FreeQueue::new());
        settled
    }

    /// Phase 3: changes `[va, end)` of `span` (the root's) on the cursor:
    /// each PTE span through the PTE loop, the spans above it through
    /// [`protect_span`](Self::protect_span), one barrier per table that
    /// changed when the cursor leaves it.
    pub(crate) fn protect_change(
        &mut self,
        span: TableSpan,
        prot: Prot,
        stash: &mut Reservation,
        gather: &mut TlbGather,
    ) {
        debug_assert!(span.height == A::LEVELS - 1 && span.table == self.root);
        let s = &*self;
        let mut c = Change {
            prot,
            stash,
            gather,
        };
        let mut changed = [0u64; crate::space::walker::MAX_LEVELS];
        let mut cur = s.cursor(span.va, span.end);
        while let Some(sp) = cur.span() {
            let h = sp.height as usize;
            if h == 0 {
                s.protect_ptes(sp, prot, c.gather);
            } else if let Some((child, va)) = s.protect_span(sp, &mut c, &mut changed[h]) {
                cur.descend(child, va);
                continue;
            }
            for h in cur.advance(sp.next) {
                let n = core::mem::take(&mut changed[h as usize]);
                if n > 0 {
                    s.mmu.stats.add_entries_written(n);
                    s.table_done();
                }
            }
        }
    }

    /// Changes the leaves of `span` (above the PTE level) up to its first
    /// table entry, splitting a block it covers in part, counting the
    /// changed entries in `changed`; returns that entry's table and first
    /// address (`None`: the span is done).
    fn protect_span<'a>(
        &'a self,
        span: Span<'a, A>,
        c: &mut Change<'_>,
        changed: &mut u64,
    ) -> Option<(TableRef<'a>, u64)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        let prot = c.prot;
        let mut i = span.from;
        while i < span.to {
            let next = entry_end::<A>(va, height, end);
            let slot = t.slot(i);
            // A racing hardware update is picked up by the atomic start
            // below.
            match self.read(t, i, height) {
                (_, Next::Table(c)) => return Some((c, va)),
                (raw, Next::Leaf(_)) if A::leaf_prot(raw, height) == prot => {}
                (raw, Next::Leaf(_))
                    if A::is_cont(raw, height)
                        && needs_bbm::<A>(raw, A::modify_prot(raw, prot, height), height) =>
                {
                    // A whole folded run of blocks: see `protect_ptes`.
                    let n = A::cont_entries(height) as usize;
                    self.protect_block_run(t, i, va, height, c);
                    *changed += n as u64;
                    let run = n as u64 * size::<A>(height);
                    va = (va & !(run - 1)).wrapping_add(run);
                    i = (i & !(n - 1)) + n;
                    continue;
                }
                (raw, Next::Leaf(_)) if covers::<A>(va, next, height) => {
                    self.protect_block(slot, raw, VirtAddr(va), height, c);
                    *changed += 1;
                }
                (raw, Next::Leaf(_)) => {
                    // Partly covered (Linux `__split_huge_pmd`): split, then
                    // change the covered part one level down, through the
                    // table the split linked.
                    // (No table: the count was short, see `take`; the
                    // block keeps its protection.)
                    if self
                        .split_block_to_change(slot, raw, VirtAddr(va), height, c.stash)
                        .is_some()
                    {
                        if let (_, Next::Table(c)) = self.read(t, i, height) {
                            return Some((c, va));
                        }
                    }
                }
                (_, Next::None | Next::Invalid) => {}
            }
            va = next;
            i += 1;
        }
        None
    }

    /// Changes the whole block `raw` at `height` in `slot` (mapping `va`):
    /// Linux `pmdp_modify_prot_start` / `pmdp_modify_prot_commit`, or
    /// break-before-make where the change needs it.
    fn protect_block(&self, slot: &Slot, raw: u64, va: VirtAddr, height: u32, c: &mut Change<'_>) {
        let lazy = LazyBarrier::new(&self.mmu);
        let old = if needs_bbm::<A>(raw, A::modify_prot(raw, c.prot, height), height) {
            break_entry::<A, _>(&lazy, slot, va, height)
        } else {
            A::pmdp_modify_prot_start(&lazy, va, slot, height)
        };
        let new = A::modify_prot(old, c.prot, height);
        A::pmdp_modify_prot_commit(&lazy, va, slot, height, new);
        c.gather.add_leaf::<A>(va, height);
    }

    /// Changes the whole folded run of blocks at `height` that holds entry
    /// `i` of `t` (mapping `va`): see [`break_run_prot`].
    fn protect_block_run(
        &self,
        t: TableRef<'_>,
        i: usize,
        va: u64,
        height: u32,
        c: &mut Change<'_>,
    ) {
        let n = A::cont_entries(height) as usize;
        let at = i & !(n - 1);
        let run = n as u64 * size::<A>(height);
        let base = va & !(run - 1);
        let lazy = LazyBarrier::new(&self.mmu);
        break_run_prot::<A, _>(&lazy, t.slots(at, at + n), base, height, c.prot);
        c.gather.add_range::<A>(VirtAddr(base), run, height);
    }

    /// The PTE loop (Linux `change_pte_range`) over `span`.
    fn protect_ptes(&self, span: Span<'_, A>, prot: Prot, gather: &mut TlbGather) {
        let lazy = LazyBarrier::new(&self.mmu);
        let Span { from: i, va, .. } = span;
        let n = span.to - i;
        let mut done = Changed::new();
        // What to do with a leaf is a function of its attribute word (the
        // entry without its address: `Format` rules), so it is decided once
        // per distinct attribute word (usually once per table), not per
        // entry. No leaf has the attribute word 0 (a value with the low 12
        // bits clear is never valid), so 0 means "nothing decided yet".
        let mut memo_attrs = 0u64;
        let mut memo = PteAction::Keep;
        let entries = span.table.slots(i, span.to);
        let mut k = 0;
        while k < n {
            let slot = &entries[k];
            // Relaxed: we hold the address space exclusively; the hardware
            // may set accessed/dirty state, which the start below catches
            // (or which cannot happen to a settled entry).
            let raw = slot.load(Relaxed);
            let Decoded::Leaf(pa) = A::decode(raw, 0) else {
                k += 1;
                continue;
            };
            let attrs = raw ^ A::oa_field(pa);
            if attrs != memo_attrs {
                memo_attrs = attrs;
                memo = PteAction::decide::<A>(raw, prot);
            }
            match memo {
                PteAction::Keep => {
                    k += 1;
                    continue;
                }
                PteAction::Plain(delta) => {
                    // The hardware never writes a settled entry, so nothing
                    // can change between the load above and this store.
                    A::set_pte_nosync(&lazy, slot, raw ^ delta);
                    let run = 1 + plain_run::<A, _>(&lazy, &entries[k + 1..], memo_attrs, delta);
                    done.add(k, run);
                    k += run;
                    continue;
                }
                PteAction::Transaction(delta) => {
                    let v = VirtAddr(va + k as u64 * page_size::<A>());
                    let old = A::ptep_modify_prot_start(&lazy, v, slot);
                    // The entry as loaded: the change decided for its
                    // attribute word; changed by the hardware since (its
                    // accessed/dirty state): worked out again.
                    let new = if old == raw {
                        raw ^ delta
                    } else {
                        A::modify_prot(old, prot, 0)
                    };
                    A::ptep_modify_prot_commit(&lazy, v, slot, old, new);
                }
                PteAction::BreakBeforeMake if A::is_cont(raw, 0) && whole_run::<A>(i, k, n) => {
                    // A whole folded run (runs the range covers in part
                    // were unfolded first): all its entries at once.
                    let c = A::cont_entries(0) as usize;
                    let at = ((i + k) & !(c - 1)) - i;
                    let v = va + at as u64 * page_size::<A>();
                    break_run_prot::<A, _>(&lazy, &entries[at..at + c], v, 0, prot);
                    done.add(at, c);
                    k = at + c;
                    continue;
                }
                PteAction::BreakBeforeMake => {
                    // See the module docs.
                    let v = VirtAddr(va + k as u64 * page_size::<A>());
                    commit_pte::<A, _>(&lazy, slot, v, prot, true);
                }
            }
            done.add(k, 1);
            k += 1;
        }
        self.ptes_changed(&done, va, gather);
    }

    /// The end of the PTE loop over a table from `va`: its changed entries
    /// gathered as one range, counted, and the table's walker barrier.
    #[inline]
    fn ptes_changed(&self, done: &Changed, va: u64, gather: &mut TlbGather) {
        if done.written == 0 {
            return;
        }
        gather.add_range::<A>(
            VirtAddr(va + done.first as u64 * page_size::<A>()),
            (done.last + 1 - done.first) as u64 * page_size::<A>(),
            0,
        );
        self.mmu.stats.add_entries_written(done.written);
        self.table_done();
    }
}

/// The state of one protection change that its steps share.
struct Change<'g> {
    prot: Prot,
    stash: &'g mut Reservation,
    gather: &'g mut TlbGather,
}

/// The entries the PTE loop changed in one table: the first and last
/// index (for one gathered range) and how many (a start/commit pair
/// counts as one write).
struct Changed {
    first: usize,
    last: usize,
    written: u64,
}

impl Changed {
    #[inline]
    fn new() -> Changed {
        Changed {
            first: usize::MAX,
            last: 0,
            written: 0,
        }
    }

    /// The `n` entries from `k` were changed.
    #[inline]
    fn add(&mut self, k: usize, n: usize) {
        if self.first == usize::MAX {
            self.first = k;
        }
        self.last = k + n - 1;
        self.written += n as u64;
    }
}

/// The plain stores of the PTE loop after a settled leaf: the leaves that
/// follow in `entries` with the same attribute word `attrs` take the same
/// store of the entry XOR `delta`, without deciding again (the common
/// case: a whole table of them). Returns how many it stored. Not inlined:
/// on its own it keeps `attrs` and `delta` in registers (inlined into the
/// PTE loop, they were spilled to the stack).
#[inline(never)]
fn plain_run<A: Arch, M: Mmu>(mmu: &M, entries: &[Slot], attrs: u64, delta: u64) -> usize {
    let mut run = 0;
    for next in entries {
        // Relaxed: as in the PTE loop; a settled entry is never written
        // by the hardware.
        let raw = next.load(Relaxed);
        match A::decode(raw, 0) {
            Decoded::Leaf(pa) if raw ^ A::oa_field(pa) == attrs => {
                A::set_pte_nosync(mmu, next, raw ^ delta);
                run += 1;
            }
            _ => break,
        }
    }
    run
}

/// Changes the PTE in `slot` (mapping `va`) to `prot`: Linux
/// `ptep_modify_prot_start` → [`Format::modify_prot`] →
/// `ptep_modify_prot_commit`, with the start replaced by the break of
/// break-before-make when `bbm` (see the module docs).
#[inline(always)]
fn commit_pte<A: Arch, M: Mmu>(mmu: &M, slot: &Slot, va: VirtAddr, prot: Prot, bbm: bool) {
    let old = if bbm {
        break_entry::<A, _>(mmu, slot, va, 0)
    } else {
        A::ptep_modify_prot_start(mmu, va, slot)
    };
    let new = A::modify_prot(old, prot, 0);
    A::ptep_modify_prot_commit(mmu, va, slot, old, new);
}

/// Changes the whole folded run `slots` at `height` (from `base`) to
/// `prot` with break-before-make for all its entries at once, so no two
/// of them disagree in memory type while valid; the run stays folded.
#[inline]
fn break_run_prot<A: Arch, M: Mmu>(mmu: &M, slots: &[Slot], base: u64, height: u32, prot: Prot) {
    contpte::break_run::<A, _>(mmu, slots, base, height, |o, _, _, _| {
        A::modify_prot(o, prot, height)
    });
}

/// Whether entry `k` of the PTE loop's `n` entries (from table index `i`)
/// lies in a contiguous run that the loop covers whole.
#[inline]
fn whole_run<A: Arch>(i: usize, k: usize, n: usize) -> bool {
    let c = A::cont_entries(0) as usize;
    let first = (i + k) & !(c.max(1) - 1);
    c != 0 && first >= i && first + c <= i + n
}

/// What the PTE loop does with leaves of one attribute word.
#[derive(Clone, Copy)]
enum PteAction {
    /// The protection is already `prot`: not touched, not flushed.
    Keep,
    /// Settled: a plain store of the entry XOR this delta (what
    /// `modify_prot` changes, which by the `Format` rules depends only on
    /// the attribute word).
    Plain(u64),
    /// The atomic `ptep_modify_prot_start` / `_commit` transaction; the
    /// new entry is the old XOR this delta unless the hardware changed the
    /// entry since it was read.
    Transaction(u64),
    /// A change the arch allows only with break-before-make
    /// ([`needs_bbm`]): a memory type, or non-global to global on arm64.
    BreakBeforeMake,
}

impl PteAction {
    #[inline]
    fn decide<A: Arch>(raw: u64, prot: Prot) -> PteAction {
        let now = A::leaf_prot(raw, 0);
        if now == prot {
            PteAction::Keep
        } else if needs_bbm::<A>(raw, A::modify_prot(raw, prot, 0), 0) {
            PteAction::BreakBeforeMake
        } else if A::is_settled(raw, 0) {
            PteAction::Plain(A::modify_prot(raw, prot, 0) ^ raw)
        } else {
            PteAction::Transaction(A::modify_prot(raw, prot, 0) ^ raw)
        }
    }
}

/// An [`Mmu`] adapter for one table's entry operations (the lazy-MMU scope
/// of the module docs): the walker barrier an arch's commit issues is
/// dropped, because the caller issues the per-table barrier
/// (`table_done`) after the last changed entry of the table.
/// TLB flushes and write observation pass through.
struct LazyBarrier<'m, M: Mmu> {
    inner: &'m M,
}

impl<'m, M: Mmu> LazyBarrier<'m, M> {
    #[inline]
    fn new(inner: &'m M) -> Self {
        LazyBarrier { inner }
    }
}

// SAFETY: everything but the walker barrier forwards to `M`; the barrier
// is issued by the caller once per table before the operation ends (see
// the type docs), which is what the contract needs.
unsafe impl<M: Mmu> Mmu for LazyBarrier<'_, M> {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;

    #[inline]
    fn walker_barrier(&self) {
        // Deferred to the per-table barrier; see the type docs.
    }

    #[inline]
    fn publish_barrier(&self) {
        self.inner.publish_barrier()
    }

    #[inline]
    fn flush_tlb_range(&self, range: TlbRange) {
        self.inner.flush_tlb_range(range)
    }

    #[inline]
    fn flush_tlb_all(&self) {
        self.inner.flush_tlb_all()
    }

    #[inline]
    fn flush_tlb_mm(&self) {
        self.inner.flush_tlb_mm()
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.install_root(root) }
    }

    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        self.inner.entry_written(slot, old)
    }
}
