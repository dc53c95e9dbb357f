//! Test MMUs: one that records every barrier, flush and entry write in
//! order, one that only counts barriers.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::{Mmu, Slot, TlbRange};
use pgtable_core::PhysAddr;

/// What the recording MMU saw.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    /// `walker_barrier`.
    Barrier,
    /// `flush_tlb_range`.
    Flush(TlbRange),
    /// `flush_tlb_all`.
    FlushAll,
    /// An entry changed from `old` to `new`.
    Write { old: u64, new: u64 },
}

/// Logs every operation in order (and observes entry writes).
#[derive(Default)]
pub struct Recorder {
    pub log: RefCell<Vec<Event>>,
}

impl Recorder {
    pub fn take(&self) -> Vec<Event> {
        std::mem::take(&mut *self.log.borrow_mut())
    }
}

// SAFETY: a host test MMU: no hardware walker uses these tables.
unsafe impl Mmu for Recorder {
    const OBSERVES_WRITES: bool = true;

    fn walker_barrier(&self) {
        self.log.borrow_mut().push(Event::Barrier);
    }
    fn flush_tlb_range(&self, range: TlbRange) {
        self.log.borrow_mut().push(Event::Flush(range));
    }
    fn flush_tlb_all(&self) {
        self.log.borrow_mut().push(Event::FlushAll);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
    fn entry_written(&self, slot: &Slot, old: u64) {
        let new = slot.load(Relaxed);
        self.log.borrow_mut().push(Event::Write { old, new });
    }
}

/// Counts barriers and flushes only.
#[derive(Default)]
pub struct Counter {
    pub barriers: Cell<u64>,
    pub flushes: Cell<u64>,
}

// SAFETY: a host test MMU: no hardware walker uses these tables.
unsafe impl Mmu for Counter {
    fn walker_barrier(&self) {
        self.barriers.set(self.barriers.get() + 1);
    }
    fn flush_tlb_range(&self, _range: TlbRange) {
        self.flushes.set(self.flushes.get() + 1);
    }
    fn flush_tlb_all(&self) {
        self.flushes.set(self.flushes.get() + 1);
    }
    unsafe fn install_root(&self, _root: PhysAddr) {}
}
