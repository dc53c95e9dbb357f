//! Table frames from an allocator that is not the machine's own: a
//! kernel's frame allocator run on the simulator.

use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::{lock, Shared};
use crate::{PhysAddr, Table, TableAlloc};

/// A [`TableAlloc`] of the user's, made known to a [`SimMachine`]
/// ([`SimMachine::alloc_from`]): it forwards every call to the wrapped
/// allocator, and tells the machine about each frame it hands out and
/// takes back, so the simulated walker reads the tables the algorithms
/// write.
///
/// The wrapped allocator's [`phys_to_virt`](TableAlloc::phys_to_virt) must
/// give one address for a frame for as long as it is allocated (a direct
/// map or a frame array, not a temporary window that moves): the machine
/// reads the frame, and tracks its entries, at the address it gave when
/// the frame was handed out.
///
/// [`SimMachine`]: super::SimMachine
/// [`SimMachine::alloc_from`]: super::SimMachine::alloc_from
pub struct SimAllocFrom<T: TableAlloc> {
    shared: Arc<Shared>,
    inner: T,
}

impl<T: TableAlloc> fmt::Debug for SimAllocFrom<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SimAllocFrom")
    }
}

impl<T: TableAlloc> SimAllocFrom<T> {
    pub(super) fn new(shared: Arc<Shared>, inner: T) -> Self {
        SimAllocFrom { shared, inner }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The wrapped allocator, mutably. A frame allocated from it directly,
    /// not through this handle, is unknown to the machine.
    pub fn inner_mut(&mut self) -> &mut T {
        &mut self.inner
    }
}

// SAFETY: every call is forwarded to `inner`, which upholds the contract
// (its frames, its `phys_to_virt`); the machine only reads the frames, and
// stops before `inner` may reuse one (`release` comes first in
// `free_table`).
unsafe impl<T: TableAlloc> TableAlloc for SimAllocFrom<T> {
    fn frame_shift(&self) -> u32 {
        self.inner.frame_shift()
    }

    fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = self.inner.alloc_table()?;
        // SAFETY: `pa` was just handed out by `inner` and is not freed.
        let host = unsafe { self.inner.phys_to_virt(pa) };
        // SAFETY: `host` is `inner`'s pointer to the frame, valid while
        // the frame is allocated (the `TableAlloc` contract), and `free_table`
        // releases it from the machine before it frees it.
        if unsafe { lock(&self.shared).adopt(pa, host) } {
            return Some(pa);
        }
        // SAFETY: a frame of `inner` handed out just now and never linked,
        // so no walker can reach it.
        unsafe { self.inner.free_table(pa) };
        None
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        lock(&self.shared).release(pa);
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.free_table(pa) }
    }

    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.phys_to_virt(pa) }
    }
}
