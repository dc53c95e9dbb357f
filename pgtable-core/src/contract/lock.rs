//! Per-table locks kept where the kernel's frame allocator says (Linux's
//! split page-table locks, `ptlock_ptr(ptdesc)`; Asterinas OSTD's lock in
//! each page-table frame's metadata): one word per table frame, no
//! allocation.

#[cfg(loom)]
use loom::sync::atomic::AtomicU32;

#[cfg(not(loom))]
use core::sync::atomic::AtomicU32;

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use crate::{PhysAddr, TableAlloc};

/// The lock word's value while the table is unlocked.
const UNLOCKED: u32 = 0;
/// ... and while a CPU holds it.
const LOCKED: u32 = 1;

/// The lock of one table frame: a spin lock in one 32-bit word, which a
/// kernel keeps in the frame's metadata (its `struct page` or `ptdesc`).
/// A holder may change the table's entries; lockless readers may still
/// load them (single-copy-atomic loads), as Linux's rules for page-table
/// locks allow.
///
/// ```
/// use pgtable_core::contract::TableLock;
///
/// let lock = TableLock::new();
/// let held = lock.lock();
/// assert!(lock.try_lock().is_none());
/// drop(held);
/// assert!(lock.try_lock().is_some());
/// ```
#[repr(transparent)]
pub struct TableLock {
    word: AtomicU32,
}

#[cfg(not(loom))]
impl TableLock {
    /// An unlocked lock; a `const fn`, so a frame-metadata array can be a
    /// `static`.
    pub const fn new() -> TableLock {
        TableLock {
            word: AtomicU32::new(UNLOCKED),
        }
    }
}

#[cfg(loom)]
impl TableLock {
    /// An unlocked lock (loom's atomics are not `const`).
    pub fn new() -> TableLock {
        TableLock {
            word: AtomicU32::new(UNLOCKED),
        }
    }
}

impl Default for TableLock {
    fn default() -> TableLock {
        TableLock::new()
    }
}

impl core::fmt::Debug for TableLock {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("TableLock")
            .field("locked", &self.is_locked())
            .finish()
    }
}

impl TableLock {
    /// Takes the lock, spinning while another CPU holds it (reading the
    /// word until it is free, then trying once: test-and-test-and-set, so
    /// the waiters do not keep its cache line moving).
    pub fn lock(&self) -> TableLockGuard<'_> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            // Relaxed: only a hint that the lock may be free; the
            // exchange in `try_lock` synchronizes.
            while self.word.load(Relaxed) != UNLOCKED {
                relax();
            }
        }
    }

    /// Takes the lock if no CPU holds it.
    pub fn try_lock(&self) -> Option<TableLockGuard<'_>> {
        // Acquire: the previous holder's writes to the table (released by
        // its unlock) before ours. Relaxed on failure: nothing was taken.
        self.word
            .compare_exchange(UNLOCKED, LOCKED, Acquire, Relaxed)
            .ok()
            .map(|_| TableLockGuard { lock: self })
    }

    /// Whether a CPU holds the lock now (a snapshot, for assertions and
    /// diagnostics).
    pub fn is_locked(&self) -> bool {
        // Relaxed: a snapshot orders nothing.
        self.word.load(Relaxed) != UNLOCKED
    }
}

/// A held [`TableLock`], released when dropped.
#[must_use = "the lock is released when the guard is dropped"]
pub struct TableLockGuard<'l> {
    lock: &'l TableLock,
}

impl Drop for TableLockGuard<'_> {
    fn drop(&mut self) {
        // Release: our writes to the table before the next holder's
        // Acquire.
        self.lock.word.store(UNLOCKED, Release);
    }
}

impl core::fmt::Debug for TableLockGuard<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("TableLockGuard")
    }
}

/// One step of a wait (as in the grace period): a spin-loop hint, or a
/// yield to loom.
#[inline]
fn relax() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    core::hint::spin_loop();
}

/// A [`TableAlloc`] that keeps a [`TableLock`] for every frame it hands
/// out, where the kernel keeps per-frame metadata (Linux `ptdesc`).
///
/// # Safety
///
/// For a frame from [`alloc_table`](TableAlloc::alloc_table) that is not
/// freed yet, [`table_lock`](TableLocks::table_lock) returns the same lock
/// on every call from any CPU, unlocked when the frame is handed out, and
/// distinct frames have distinct locks. The lock stays valid until the
/// frame is freed.
pub unsafe trait TableLocks: TableAlloc {
    /// The lock of the table frame at `pa`.
    ///
    /// # Safety
    ///
    /// `pa` is a frame this allocator handed out and has not freed, and
    /// the reference is not used after the frame is freed.
    unsafe fn table_lock(&self, pa: PhysAddr) -> &TableLock;
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;

    use super::TableLock;
    use std::format;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[test]
    fn a_held_lock_is_not_taken_twice() {
        let l = TableLock::new();
        assert!(!l.is_locked());
        let g = l.lock();
        assert!(l.is_locked());
        assert!(l.try_lock().is_none());
        assert!(format!("{l:?}").contains("true"));
        drop(g);
        assert!(!l.is_locked());
        assert!(l.try_lock().is_some());
    }

    #[test]
    fn holders_exclude_each_other() {
        // Fewer under Miri, which interprets every step.
        const ROUNDS: u64 = if cfg!(miri) { 50 } else { 1000 };
        let l = TableLock::new();
        // A read-modify-write split into a load and a store: only mutual
        // exclusion keeps every increment.
        let count = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..ROUNDS {
                        let _g = l.lock();
                        let v = count.load(Relaxed);
                        std::thread::yield_now();
                        count.store(v + 1, Relaxed);
                    }
                });
            }
        });
        assert_eq!(count.load(Relaxed), 4 * ROUNDS);
    }
}
