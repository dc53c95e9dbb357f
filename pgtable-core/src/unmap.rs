//! `unmap`: remove translations for a range.
//!
//! Phases as in `map`: count the tables that splitting partly covered
//! blocks needs (only blocks at the two ends of the range can be partly
//! covered), reserve them, then clear. Holes in the range are skipped, as
//! Linux's `zap_page_range` skips them. Tables that become empty are
//! unlinked and freed after the one gathered TLB flush.
//!
//! A table whose whole span is unmapped is unlinked without clearing its
//! entries one by one: after the flush no walker can reach it, and the
//! allocator takes frames back with any contents. The accessed/dirty state
//! of unmapped entries is discarded (this crate keeps no per-page state).

use core::sync::atomic::Ordering::Relaxed;

use crate::aspace::{covers, table_at, FreeQueue, Stash};
use crate::level::{entry_end, index};
use crate::{AddressSpace, Arch, Decoded, Error, Mmu, PhysAddr, TableAlloc, TlbGather, VirtAddr};

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Unmaps `[va, va + len)`: clears its entries, splits blocks the range
    /// covers only in part, frees tables that become empty, and flushes the
    /// TLB once.
    ///
    /// # Errors
    ///
    /// Misaligned or zero length, a range outside the address space, or
    /// [`Error::OutOfMemory`] when a partly covered block cannot be split.
    /// On error nothing was changed.
    pub fn unmap(&mut self, va: VirtAddr, len: u64) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        let top = A::LEVELS - 1;
        let need = self.split_check(top, self.root, va.0, end, &|_, _| true);
        let mut stash = self.reserve(need)?;
        let mut gather = TlbGather::new();
        let mut q = FreeQueue::new();
        self.unmap_clear(top, self.root, va.0, end, &mut stash, &mut gather, &mut q);
        debug_assert_eq!(stash.count, 0, "split reservation over-counted");
        // Short only if `split_check` under-counted (see `take`).
        let short = stash.short;
        self.release(stash);
        self.finish(gather, q);
        if short {
            return Err(Error::OutOfMemory);
        }
        Ok(())
    }

    /// Clears `[va, end)` in the table `tpa` at `height`; returns whether
    /// the table is now empty.
    #[allow(clippy::too_many_arguments)]
    fn unmap_clear(
        &mut self,
        height: u32,
        tpa: PhysAddr,
        mut va: u64,
        end: u64,
        stash: &mut Stash,
        gather: &mut TlbGather,
        q: &mut FreeQueue,
    ) -> bool {
        let start = va;
        // SAFETY: reached from the root (or just linked by a split).
        let t = unsafe { table_at(&self.alloc, tpa) };
        let mut written = 0u64;
        let mut invalid_cleared = false;
        loop {
            let next = entry_end(va, height, end);
            let slot = &t.entries[index(va, height)];
            // Relaxed: we hold the address space exclusively; a hardware
            // A/D update racing the clear below is discarded on purpose.
            let raw = slot.load(Relaxed);
            match A::decode(raw, height) {
                Decoded::None => {}
                Decoded::Invalid => {
                    // A software entry: nothing to flush, but the clear
                    // still wants this table's walker barrier (below).
                    A::set_pte_nosync(&self.mmu, slot, 0);
                    written += 1;
                    invalid_cleared = true;
                }
                Decoded::Leaf(_) if height == 0 || covers(va, next, height) => {
                    A::set_pte_nosync(&self.mmu, slot, 0);
                    written += 1;
                    gather.add_leaf(VirtAddr(va), height);
                }
                Decoded::Leaf(_) => {
                    // (No table: the count was short, see `take`; the block
                    // stays.)
                    if let Some(c) =
                        self.split_block(slot, raw, VirtAddr(va), height, stash, gather)
                    {
                        self.unmap_clear(height - 1, c, va, next, stash, gather, q);
                    }
                }
                Decoded::Table(c) => {
                    // A pinned kernel-half table is emptied, never unlinked.
                    let keep = self.pinned(height, va);
                    let whole = covers(va, next, height) && !keep;
                    if (whole || self.unmap_clear(height - 1, c, va, next, stash, gather, q))
                        && !keep
                    {
                        A::set_pte_nosync(&self.mmu, slot, 0);
                        written += 1;
                        gather.add_tables(VirtAddr(va), next.wrapping_sub(va));
                        self.queue_free_subtree(q, c, height - 1);
                    }
                }
            }
            va = next;
            if va == end {
                break;
            }
        }
        self.mmu.stats.add_entries_written(written);
        if invalid_cleared {
            self.table_done();
        }
        // The caller only frees a table it does not cover whole when it is
        // empty, so scan unless this call covered every entry.
        covers(start, end, height + 1) || t.entries.iter().all(|e| e.load(Relaxed) == 0)
    }
}
