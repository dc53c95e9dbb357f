//! Batching of TLB maintenance (Linux `struct mmu_gather`).

use crate::contract::level::shift;
use crate::{Arch, Format, Mmu, TlbRange, VirtAddr};

/// Collects the translations an operation invalidated and flushes them once.
///
/// The gathered range grows to cover everything added (as Linux's
/// `mmu_gather` does). [`flush`](TlbGather::flush) issues one range flush,
/// or one full flush when the range spans more than
/// [`Arch::TLB_FLUSH_CEILING`] strides: [`Mmu::flush_tlb_mm`], or
/// [`Mmu::flush_tlb_all`] when global leaves may have changed
/// ([`global_changed`](TlbGather::global_changed)), since a flush by address
/// space keeps global translations. A gather must be flushed: dropping
/// one that holds work is a bug (checked in debug builds, except while a
/// panic unwinds).
#[must_use = "a TLB gather must be flushed"]
#[derive(Debug)]
pub struct TlbGather {
    start: u64,
    /// Inclusive last byte, so a range reaching the top of the space works.
    last: u64,
    stride_shift: u32,
    last_level: bool,
    global: bool,
    empty: bool,
}

impl Default for TlbGather {
    fn default() -> Self {
        Self::new()
    }
}

impl TlbGather {
    /// An empty gather.
    pub const fn new() -> TlbGather {
        TlbGather {
            start: u64::MAX,
            last: 0,
            stride_shift: u32::MAX,
            last_level: true,
            global: false,
            empty: true,
        }
    }

    /// Whether nothing was gathered.
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// A leaf at `height` covering `va` was removed or changed.
    #[inline]
    pub fn add_leaf<A: Format>(&mut self, va: VirtAddr, height: u32) {
        let s = shift::<A>(height);
        let start = va.0 >> s << s;
        self.add(start, start + ((1u64 << s) - 1), s, true);
    }

    /// `[start, start + len)` held leaves of height `height` that changed.
    #[inline]
    pub fn add_range<A: Format>(&mut self, start: VirtAddr, len: u64, height: u32) {
        debug_assert!(len > 0);
        self.add(start.0, start.0 + (len - 1), shift::<A>(height), true);
    }

    /// Table entries covering `[start, start + len)` were removed: cached
    /// walks through them must go too (not last-level only). Invalidating
    /// any address a removed table translated drops the walk-cache entry
    /// for that table (arm64 `tlbi vae1is`; x86 `invlpg` drops all
    /// paging-structure caches), so the range need not grow to the table's
    /// whole span.
    #[inline]
    pub fn add_tables<A: Format>(&mut self, start: VirtAddr, len: u64) {
        debug_assert!(len > 0);
        // The leaves below may be as small as a page.
        self.add(start.0, start.0 + (len - 1), shift::<A>(0), false);
    }

    /// Global leaves (not tagged with an ASID/PCID) may be among those
    /// gathered: a full flush must drop global translations too.
    #[inline]
    pub fn global_changed(&mut self) {
        self.global = true;
    }

    #[inline]
    fn add(&mut self, start: u64, last: u64, stride_shift: u32, last_level: bool) {
        self.start = self.start.min(start);
        self.last = self.last.max(last);
        self.stride_shift = self.stride_shift.min(stride_shift);
        self.last_level &= last_level;
        self.empty = false;
    }

    /// Whether the range gathered so far meets `[start, start + len)`.
    #[inline]
    pub(crate) fn overlaps(&self, start: u64, len: u64) -> bool {
        !self.empty && start <= self.last && self.start <= start + (len - 1)
    }

    /// The range gathered so far, if any.
    pub fn range(&self) -> Option<TlbRange> {
        (!self.empty).then(|| TlbRange {
            start: VirtAddr(self.start),
            end: VirtAddr(self.last.wrapping_add(1)),
            stride_shift: self.stride_shift,
            last_level: self.last_level,
        })
    }

    /// Issues the gathered invalidation: one range flush, or a full flush
    /// past the arch's ceiling. Nothing when empty.
    pub fn flush<A: Arch, M: Mmu>(mut self, mmu: &M) {
        if let Some(r) = self.range() {
            let strides = ((self.last - self.start) >> r.stride_shift) + 1;
            if strides <= A::TLB_FLUSH_CEILING {
                mmu.flush_tlb_range(r);
            } else if self.global {
                mmu.flush_tlb_all();
            } else {
                mmu.flush_tlb_mm();
            }
        }
        self.empty = true;
        self.global = false;
    }
}

impl Drop for TlbGather {
    fn drop(&mut self) {
        // Not while a panic unwinds through the operation that held it: a
        // second panic would abort the process and hide the first.
        #[cfg(feature = "std")]
        if std::thread::panicking() {
            return;
        }
        debug_assert!(self.empty, "TlbGather dropped without flush");
    }
}

#[cfg(all(test, feature = "std"))]
mod tests {
    /// The 4 KiB, 4-level geometry the cases below are written for.
    type A = crate::testing::test_format::TestFormat<4>;

    use std::panic::catch_unwind;

    use super::TlbGather;
    use crate::VirtAddr;

    /// A gather that still holds work, dropped while a panic unwinds
    /// through the caller, does not panic a second time (which would
    /// abort the process instead of letting the first panic be caught).
    #[test]
    fn unflushed_tlb_gather_dropped_while_unwinding_does_not_abort() {
        let r = catch_unwind(|| {
            let mut gather = TlbGather::new();
            gather.add_leaf::<A>(VirtAddr(0x1000), 0);
            assert!(!gather.is_empty());
            panic!("an operation fails while its gather holds work");
        });
        assert!(r.is_err());
    }
}
