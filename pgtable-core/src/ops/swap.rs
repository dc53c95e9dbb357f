//! Software entries: non-present PTEs that carry an OS value (Linux swap
//! and migration entries, `mm/swapfile.c`, `include/linux/swapops.h`).
//!
//! A software entry is a PTE the hardware walker treats as not present (a
//! translation fault, and nothing is cached in a TLB), built by the format
//! ([`Format::swp_entry`]) from a value of up to
//! [`Format::SWP_VALUE_BITS`] bits that the OS reads back
//! ([`Format::swp_value`]), e.g. a swap slot or a migration target. The
//! operations of this crate keep them as Linux keeps swap PTEs:
//!
//! - [`move_page_tables`](AddressSpace::move_page_tables) moves them with
//!   their tables or entry by entry (Linux `move_ptes` moves every non-none
//!   PTE);
//! - [`change_protection`](AddressSpace::change_protection) leaves them
//!   unchanged (Linux `change_pte_range` only rewrites present PTEs here;
//!   this crate has no writable migration entries to downgrade);
//! - [`unmap`](AddressSpace::unmap) clears them (Linux `zap_pte_range`
//!   frees the swap slot, which is the caller's business here);
//! - [`copy_page_range`](AddressSpace::copy_page_range) copies them, and
//!   reports each to its caller (who takes a reference on the swap slot,
//!   Linux `swap_duplicate`);
//! - [`exit_mmap`](AddressSpace::exit_mmap) reports and clears them with
//!   everything else;
//! - [`translate`](AddressSpace::translate) and
//!   [`walk`](AddressSpace::walk) do not report them: they map nothing.
//!   [`Inspector::entries`](crate::contract::Inspector::entries) walks a
//!   range reporting them too.
//!
//! One is put into an empty PTE with
//! [`install_pte`](AddressSpace::install_pte) and
//! [`NewPte::Swap`](crate::contract::NewPte::Swap).
//!
//! Software entries live at the PTE level only: the operations here never
//! put one higher up. A present page becomes one, and one becomes a page
//! again, in place with [`replace_pte`](AddressSpace::replace_pte).
//!
//! [`Format::swp_entry`]: crate::Format::swp_entry
//! [`Format::swp_value`]: crate::Format::swp_value
//! [`Format::SWP_VALUE_BITS`]: crate::Format::SWP_VALUE_BITS

use crate::contract::level::{index, page_size};
use crate::space::walker::Next;
use crate::{AddressSpace, Arch, Error, Mmu, TableAlloc, VirtAddr};

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// [`install_pte`](Self::install_pte) of a software entry carrying
    /// `value` (Linux `set_pte_at(mm, addr, pte, swp_entry_to_pte(entry))`):
    /// the PTE must be none; allocates the missing tables on the way.
    /// Not present before and after, so no TLB maintenance. On error
    /// nothing was changed and no table frame is kept.
    #[cold]
    #[inline(never)]
    pub(crate) fn install_swap(&mut self, va: VirtAddr, value: u64) -> Result<(), Error> {
        self.check_range(va, page_size::<A>())?;
        let entry = A::swp_entry(value).ok_or(Error::SwapValueTooWide(value))?;
        // Check: walk down, counting the missing tables.
        let mut t = self.root_table();
        let mut h = A::LEVELS - 1;
        let need = loop {
            if h == 0 {
                let raw = t.load(index::<A>(va.0, 0));
                if raw != 0 {
                    return Err(Error::AlreadyMapped(va));
                }
                break 0;
            }
            match self.read(t, index::<A>(va.0, h), h).1 {
                Next::Table(c) => t = c,
                Next::None => break h as usize,
                Next::Leaf(_) | Next::Invalid => return Err(Error::AlreadyMapped(va)),
            }
            h -= 1;
        };
        let mut stash = self.reserve(need)?;
        // Write: link the missing tables top-down (populate publishes each
        // zeroed table before its link), then the entry.
        let mut t = self.root_table();
        let mut h = A::LEVELS - 1;
        let mut linked = false;
        let short = loop {
            let slot = t.slot(index::<A>(va.0, h));
            if h == 0 {
                // Not present before and after: no TLB holds either.
                A::set_pte_nosync(&self.mmu, slot, entry);
                self.mmu.stats.add_entries_written(1);
                break false;
            }
            match self.read(t, index::<A>(va.0, h), h).1 {
                Next::Table(c) => t = c,
                _ => {
                    // Checked none above. (No table: the count was short,
                    // see `take`; nothing is written below.)
                    let Some(c) = self.take_table(&mut stash) else {
                        break true;
                    };
                    A::populate_attrs(&self.mmu, slot, c.pa(), h, self.table_attrs);
                    self.mmu.stats.add_entries_written(1);
                    linked = true;
                    t = c;
                }
            }
            h -= 1;
        };
        if linked || !short {
            // One barrier for the links and the entry (a software entry
            // needs none for itself; the links want one before the next
            // walk can rely on them).
            self.table_done();
        }
        self.settle(stash)
    }
}
