//! Loom models of the lock-free protocols many CPUs sharing one address
//! space rely on: the grace period lockless readers wait for, and the
//! per-table lock. Built only with `--cfg loom` (`cargo xtask ci` runs them:
//! `RUSTFLAGS="--cfg loom" cargo test -p pgtable-core --test loom
//! --release`), where pgtable-core's atomics are loom's, so loom explores
//! every interleaving of the library's own code up to a preemption bound
//! (`LOOM_MAX_PREEMPTIONS`, 3 unless set). Each model prints how many
//! interleavings it explored.
#![cfg(loom)]

use std::sync::atomic::AtomicUsize as StdCounter;
use std::sync::atomic::Ordering::Relaxed as StdRelaxed;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use loom::sync::Arc;
use loom::thread;
use pgtable_core::contract::{GracePeriod, ReaderSlots, TableLock};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

/// Runs `f` under loom (preemptions bounded as the module says) and
/// returns the number of interleavings explored.
fn explore(name: &str, f: impl Fn() + Sync + Send + 'static) -> usize {
    // Each model's own counter: the tests run in parallel.
    let runs = std::sync::Arc::new(StdCounter::new(0));
    let counted = runs.clone();
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b.check(move || {
        counted.fetch_add(1, StdRelaxed);
        f();
    });
    let n = runs.load(StdRelaxed);
    println!("loom: {name}: {n} interleavings");
    n
}

/// A table linked from a parent entry, a writer that unlinks it, waits a
/// grace period and frees it, and `readers` lockless readers that walk
/// through the entry: no reader may find the table freed while it walks.
fn unlink_then_free<G: GracePeriod + Send + Sync + 'static>(grace: fn() -> G, readers: usize) {
    let g = Arc::new(grace());
    // The parent entry: 1 links the table, 0 is empty.
    let entry = Arc::new(AtomicUsize::new(1));
    // The table's frame has been freed (and may be reused).
    let freed = Arc::new(AtomicBool::new(false));
    let walkers: Vec<_> = (0..readers)
        .map(|_| {
            let (g, entry, freed) = (g.clone(), entry.clone(), freed.clone());
            thread::spawn(move || {
                let _walk = g.read();
                // Acquire, as a walker's load of a table entry.
                if entry.load(Acquire) == 1 {
                    // The walk reads the table it found.
                    assert!(
                        !freed.load(Relaxed),
                        "a lockless reader walked a freed table"
                    );
                }
            })
        })
        .collect();
    // Unlink, wait for the readers that may hold the table, free.
    entry.store(0, Release);
    g.synchronize();
    freed.store(true, Relaxed);
    for w in walkers {
        w.join().unwrap();
    }
}

#[test]
fn a_table_is_freed_only_after_every_reader_that_could_see_it_left() {
    let n = explore("grace period, one reader", || {
        unlink_then_free(ReaderSlots::<1>::new, 1)
    });
    assert!(n > 1, "the model did not branch");
}

#[test]
fn two_readers_in_two_slots_are_both_waited_for() {
    let n = explore("grace period, two readers", || {
        unlink_then_free(ReaderSlots::<2>::new, 2)
    });
    assert!(n > 1, "the model did not branch");
}

/// A broken grace period: returns at once.
struct NoWait;

// SAFETY: none; it breaks the contract on purpose, to show the model fails.
unsafe impl GracePeriod for NoWait {
    type Section = ();
    fn enter(&self) {}
    fn exit(&self, _: ()) {}
    fn synchronize(&self) {}
}

#[test]
#[should_panic(expected = "a lockless reader walked a freed table")]
fn a_grace_period_that_does_not_wait_is_caught() {
    explore("broken: no wait", || unlink_then_free(|| NoWait, 1));
}

/// A broken grace period: [`ReaderSlots`]' protocol without its two
/// `SeqCst` fences, so a reader's slot store and a writer's unlinking
/// store may each miss the other (store buffering).
struct Unfenced {
    slot: AtomicU64,
}

// SAFETY: none; it breaks the contract on purpose, to show the model fails.
unsafe impl GracePeriod for Unfenced {
    type Section = ();
    fn enter(&self) {
        while self.slot.compare_exchange(0, 1, Relaxed, Relaxed).is_err() {
            thread::yield_now();
        }
    }
    fn exit(&self, _: ()) {
        self.slot.store(0, Release);
    }
    fn synchronize(&self) {
        while self.slot.load(Acquire) != 0 {
            thread::yield_now();
        }
    }
}

#[test]
#[should_panic(expected = "a lockless reader walked a freed table")]
fn a_grace_period_without_its_fences_is_caught() {
    explore("broken: no fences", || {
        unlink_then_free(
            || Unfenced {
                slot: AtomicU64::new(0),
            },
            1,
        )
    });
}

/// Two CPUs change one table's entry under its lock, each as a load and a
/// store of a plain (non-atomic) cell: loom reports any access of one not
/// ordered after the other's (a data race) and any lost update.
fn two_holders(lock: impl Fn(&dyn Fn()) + Send + Sync + 'static) {
    let lock = Arc::new(lock);
    let cell = Arc::new(UnsafeCell::new(0u32));
    let add = {
        let cell = cell.clone();
        move || {
            // SAFETY: only under the lock (the property checked).
            cell.with_mut(|p| unsafe { *p += 1 });
        }
    };
    let t = {
        let (lock, add) = (lock.clone(), add.clone());
        thread::spawn(move || lock(&add))
    };
    lock(&add);
    t.join().unwrap();
    // SAFETY: both threads are done.
    assert_eq!(cell.with(|p| unsafe { *p }), 2);
}

#[test]
fn table_lock_holders_exclude_each_other() {
    let n = explore("table lock, two holders", || {
        let l = Arc::new(TableLock::new());
        two_holders(move |f| {
            let _g = l.lock();
            f();
        })
    });
    assert!(n > 1, "the model did not branch");
}

#[test]
fn try_lock_fails_only_while_the_lock_is_held() {
    let n = explore("table lock, try_lock", || {
        let l = Arc::new(TableLock::new());
        let other = {
            let l = l.clone();
            thread::spawn(move || l.try_lock().is_some())
        };
        let mine = l.try_lock().is_some();
        let theirs = other.join().unwrap();
        // Both may succeed one after the other; at least one does.
        assert!(mine || theirs);
        assert!(!l.is_locked());
    });
    assert!(n > 1, "the model did not branch");
}

#[test]
#[should_panic(expected = "Causality violation")]
fn a_lock_that_does_not_acquire_is_caught() {
    // A broken lock: the flag is taken with Relaxed ordering and released
    // with Relaxed, so the holders' accesses are not ordered.
    explore("broken: relaxed lock", || {
        let flag = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        two_holders(move |f| {
            while flag
                .compare_exchange(false, true, Relaxed, Relaxed)
                .is_err()
            {
                thread::yield_now();
            }
            f();
            flag.store(false, Relaxed);
        })
    });
}
