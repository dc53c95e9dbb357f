//! Grace periods for lockless page-table readers (Linux RCU as the
//! page-table code uses it: `tlb_remove_table` under
//! `CONFIG_MMU_GATHER_RCU_TABLE_FREE`, `pte_free_defer`, and GUP-fast,
//! which walks with interrupts off).
//!
//! A reader that walks tables without their locks (`translate`, a
//! GUP-fast-style walk) may hold a reference to a table at the moment a
//! writer unlinks it. The writer may free or reuse that frame only when no
//! walker can still reach it: the hardware walkers stop after the TLB
//! flush, the software ones after a *grace period*, once every read-side
//! section that could have seen the table has ended. The kernel supplies
//! the mechanism as a [`GracePeriod`]; [`ReaderSlots`] is one that works
//! anywhere atomics do (the host, and a kernel without an RCU of its own).

#[cfg(loom)]
use loom::sync::atomic::{fence, AtomicU64};

#[cfg(not(loom))]
use core::sync::atomic::{fence, AtomicU64};

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

/// Read-side sections and the grace periods that wait for them, as the
/// kernel provides them (Linux `rcu_read_lock` / `rcu_read_unlock` /
/// `synchronize_rcu`; or `local_irq_save` / `local_irq_restore` and an IPI
/// to every CPU that may walk, as `tlb_remove_table_sync_one` does for
/// GUP-fast).
///
/// A reader brackets its walk with [`enter`](GracePeriod::enter) and
/// [`exit`](GracePeriod::exit) (or [`read`](GracePeriod::read), a guard
/// that exits when dropped); a writer that unlinked a table calls
/// [`synchronize`](GracePeriod::synchronize) before it frees the frame.
///
/// # Safety
///
/// Implementations promise, for every call of `synchronize` (S):
///
/// - when S returns, every section whose `enter` happened before S began
///   has ended (its `exit` happens before S returns), and
/// - every section that S does not wait for sees every store the thread
///   calling S made before S began (so a reader that S does not wait for
///   finds the table already unlinked).
///
/// The algorithms free an unlinked table on the strength of this promise;
/// a wrong implementation lets a reader use a freed frame.
pub unsafe trait GracePeriod {
    /// What [`enter`](GracePeriod::enter) hands to
    /// [`exit`](GracePeriod::exit): the reader's slot, the interrupt state
    /// saved, or nothing.
    type Section;

    /// Enters a read-side section. Sections of one thread may nest only
    /// where the implementation says so.
    fn enter(&self) -> Self::Section;

    /// Leaves the section `enter` returned.
    fn exit(&self, section: Self::Section);

    /// Waits until every section entered before this call has ended.
    fn synchronize(&self);

    /// A read-side section that ends when the guard is dropped.
    fn read(&self) -> ReadGuard<'_, Self>
    where
        Self: Sized,
    {
        ReadGuard {
            grace: self,
            section: Some(self.enter()),
        }
    }
}

/// A read-side section of `G`, left when dropped
/// ([`GracePeriod::read`]).
#[must_use = "the section ends when the guard is dropped"]
pub struct ReadGuard<'g, G: GracePeriod> {
    grace: &'g G,
    section: Option<G::Section>,
}

impl<G: GracePeriod> Drop for ReadGuard<'_, G> {
    fn drop(&mut self) {
        if let Some(s) = self.section.take() {
            self.grace.exit(s);
        }
    }
}

/// A slot's value while no reader holds it.
const IDLE: u64 = 0;

/// A [`GracePeriod`] of `N` reader slots and a counter of grace periods,
/// with no allocation and no help from the scheduler: at most `N` sections
/// at once (an `enter` beyond them spins until a slot frees), each in a
/// slot of its own, so sections may nest up to `N` deep.
///
/// A reader takes an idle slot and writes the current period into it; a
/// writer starts a new period and waits for every slot that holds an
/// older one. Readers that enter after the writer started are not waited
/// for, so a stream of readers cannot hold a writer up forever.
///
/// ```
/// use pgtable_core::contract::{GracePeriod, ReaderSlots};
///
/// let grace = ReaderSlots::<4>::new();
/// {
///     let _walk = grace.read();
///     // ... lockless walk ...
/// }
/// // No section is open: returns at once.
/// grace.synchronize();
/// ```
pub struct ReaderSlots<const N: usize> {
    /// The current grace period, from 1 (0 is [`IDLE`]).
    period: AtomicU64,
    /// Per slot: [`IDLE`], or the period its reader entered in.
    slots: [AtomicU64; N],
}

#[cfg(not(loom))]
impl<const N: usize> ReaderSlots<N> {
    /// No reader, period 1. A `const fn`, so a kernel can keep one in a
    /// `static`.
    pub const fn new() -> Self {
        ReaderSlots {
            period: AtomicU64::new(1),
            slots: [const { AtomicU64::new(IDLE) }; N],
        }
    }
}

#[cfg(loom)]
impl<const N: usize> ReaderSlots<N> {
    /// No reader, period 1 (loom's atomics are not `const`).
    pub fn new() -> Self {
        ReaderSlots {
            period: AtomicU64::new(1),
            slots: core::array::from_fn(|_| AtomicU64::new(IDLE)),
        }
    }
}

impl<const N: usize> Default for ReaderSlots<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> core::fmt::Debug for ReaderSlots<N> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let busy = self
            .slots
            .iter()
            .filter(|s| s.load(Relaxed) != IDLE)
            .count();
        f.debug_struct("ReaderSlots")
            .field("period", &self.period.load(Relaxed))
            .field("readers", &busy)
            .finish()
    }
}

/// One step of a wait: a spin-loop hint on hardware, a yield to the model
/// checker under loom (which must see the wait to schedule the thread it
/// waits for).
#[inline]
fn relax() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

// SAFETY: `synchronize` returns only when every slot holds `IDLE` or a
// period at least the one it started, read with `Acquire` after the
// reader's `Release` store of `IDLE`: the sections it saw in an older
// period have ended, and their accesses happen before it returns. A
// section it did not wait for either wrote its slot after `synchronize`
// read it or entered in the new period; in both cases the `SeqCst` fences
// (the reader's after taking its slot, the writer's before reading the
// slots) order the writer's earlier stores before the reader's walk (the
// store-buffering pattern: of two threads that each store, fence and then
// load the other's location, at least one sees the other's store).
unsafe impl<const N: usize> GracePeriod for ReaderSlots<N> {
    /// The slot's index.
    type Section = usize;

    fn enter(&self) -> usize {
        loop {
            // Relaxed: a stale (older) period only makes a writer wait
            // for this section longer than needed.
            let p = self.period.load(Relaxed);
            for (i, slot) in self.slots.iter().enumerate() {
                // Relaxed: the fence below orders the slot's store before
                // the walk; a failed exchange publishes nothing.
                if slot.compare_exchange(IDLE, p, Relaxed, Relaxed).is_ok() {
                    // SeqCst: the slot's store before every load of the
                    // walk (see the impl's SAFETY: store buffering).
                    fence(SeqCst);
                    return i;
                }
            }
            relax();
        }
    }

    fn exit(&self, section: usize) {
        if let Some(slot) = self.slots.get(section) {
            // Release: the walk's loads before a writer's `Acquire` read
            // of the idle slot, and so before it frees what was walked.
            slot.store(IDLE, Release);
        }
    }

    fn synchronize(&self) {
        // SeqCst: the caller's unlinking stores before the loads of the
        // slots below (store buffering against `enter`'s fence).
        fence(SeqCst);
        // Relaxed: the fence above orders the caller's stores; a reader
        // reading the new period only means it entered after it began.
        let started = self.period.fetch_add(1, Relaxed) + 1;
        for slot in &self.slots {
            loop {
                // Acquire: pairs with `exit`'s Release store.
                let v = slot.load(Acquire);
                if v == IDLE || v >= started {
                    break;
                }
                relax();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;

    use super::{GracePeriod, ReaderSlots};
    use std::format;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Barrier;

    #[test]
    fn sections_take_distinct_slots_and_give_them_back() {
        let g = ReaderSlots::<2>::new();
        let a = g.enter();
        let b = g.enter();
        assert_ne!(a, b);
        g.exit(a);
        // The freed slot is taken again.
        assert_eq!(g.enter(), a);
        g.exit(a);
        g.exit(b);
        assert!(format!("{g:?}").contains("readers: 0"), "{g:?}");
        g.synchronize();
    }

    #[test]
    fn a_grace_period_waits_for_the_section_open_when_it_began() {
        let g = ReaderSlots::<4>::new();
        let left = AtomicBool::new(false);
        let entered = Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                let guard = g.read();
                entered.wait();
                // Give a grace period that does not wait time to return.
                std::thread::sleep(std::time::Duration::from_millis(50));
                left.store(true, SeqCst);
                drop(guard);
            });
            entered.wait();
            g.synchronize();
            assert!(
                left.load(SeqCst),
                "the grace period ended inside the section"
            );
        });
    }

    #[test]
    fn a_section_entered_after_the_grace_period_began_is_not_waited_for() {
        let g = ReaderSlots::<2>::new();
        // A reader that read the period the next grace period starts (it
        // entered after the writer's increment).
        let p = g.period.load(SeqCst);
        g.slots[0].store(p + 1, SeqCst);
        // Returns although slot 0 is busy.
        g.synchronize();
        g.slots[0].store(super::IDLE, SeqCst);
        // A reader of the old period is waited for: with slot 1 busy in
        // it, another thread's grace period cannot end until it leaves.
        let old = g.enter();
        let left = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                left.store(true, SeqCst);
                g.exit(old);
            });
            g.synchronize();
            assert!(left.load(SeqCst));
        });
    }
}
