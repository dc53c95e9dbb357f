//! [`LeafEntry`]: a copy of one leaf-level entry, decoded on demand.

use core::fmt;
use core::marker::PhantomData;

use crate::contract::level::{index, size};
use crate::{Decoded, Format, PhysAddr, Prot, VirtAddr};

/// A copy of one leaf-level entry (a page, a block, or a non-present
/// software entry such as a swap entry) with the address it translates.
///
/// It is three words and [`Copy`]; nothing is decoded until an accessor
/// asks, so handing one to a callback per removed page costs almost
/// nothing. What [`AddressSpace::unmap_with`] reports is the value its
/// atomic get-and-clear returned (Linux `ptep_get_and_clear`), so the
/// accessed and dirty state the hardware set up to the clear is included.
///
/// [`AddressSpace::replace_pte`] returns the entry it replaced the same
/// way.
///
/// [`AddressSpace::unmap_with`]: crate::AddressSpace::unmap_with
/// [`AddressSpace::replace_pte`]: crate::AddressSpace::replace_pte
pub struct LeafEntry<A: Format> {
    va: u64,
    raw: u64,
    height: u32,
    _format: PhantomData<fn() -> A>,
}

/// What [`AddressSpace::unmap_with`](crate::AddressSpace::unmap_with)
/// reports for each entry it removed (Linux `zap_pte_range` handing each
/// page to `tlb_remove_page`), under the name the unmap code uses.
pub(crate) type Removed<A> = LeafEntry<A>;

impl<A: Format> Clone for LeafEntry<A> {
    #[inline]
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: Format> Copy for LeafEntry<A> {}

impl<A: Format> PartialEq for LeafEntry<A> {
    fn eq(&self, other: &Self) -> bool {
        (self.va, self.raw, self.height) == (other.va, other.raw, other.height)
    }
}

impl<A: Format> Eq for LeafEntry<A> {}

impl<A: Format> fmt::Debug for LeafEntry<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeafEntry")
            .field("va", &self.va())
            .field("height", &self.height)
            .field("raw", &format_args!("{:#x}", self.raw))
            .finish()
    }
}

impl<A: Format> LeafEntry<A> {
    #[inline]
    pub(crate) fn new(va: u64, height: u32, raw: u64) -> Self {
        LeafEntry {
            va,
            raw,
            height,
            _format: PhantomData,
        }
    }

    /// The first virtual address the entry translates (the start of its
    /// page or block).
    #[inline]
    pub fn va(&self) -> VirtAddr {
        VirtAddr(self.va & !(size::<A>(self.height) - 1))
    }

    /// The height of the table the entry was in (0: a page; 1: a PMD
    /// block; 2: a PUD block).
    #[inline]
    pub fn height(&self) -> u32 {
        self.height
    }

    /// The bytes the entry covers: 4 KiB, 2 MiB or 1 GiB.
    #[inline]
    pub fn size(&self) -> u64 {
        size::<A>(self.height)
    }

    /// The raw entry.
    #[inline]
    pub fn raw(&self) -> u64 {
        self.raw
    }

    /// Whether it was a present leaf. A non-present, non-zero entry (a
    /// software entry such as a swap entry; [`Decoded::Invalid`]) is
    /// reported too, so that its owner can release what it names. A
    /// [`Prot::NONE`](crate::Prot::NONE) leaf is present (Linux
    /// `pte_present`): it keeps its frame, and [`prot`](Self::prot) says
    /// `NONE`.
    #[inline]
    pub fn is_present(&self) -> bool {
        matches!(A::decode(self.raw, self.height), Decoded::Leaf(_))
    }

    /// The physical address of the page or block, if present.
    #[inline]
    pub fn pa(&self) -> Option<PhysAddr> {
        crate::ops::contpte::leaf_pa::<A>(self.raw, self.height, index::<A>(self.va, self.height))
    }

    /// The protection it granted, if present.
    #[inline]
    pub fn prot(&self) -> Option<Prot> {
        self.is_present()
            .then(|| A::leaf_prot(self.raw, self.height))
    }

    /// Whether it was accessed (young) since the state was last cleared
    /// (Linux `pte_young`). `false` if not present.
    #[inline]
    pub fn young(&self) -> bool {
        self.is_present() && A::is_young(self.raw)
    }

    /// Whether it was dirty (Linux `pte_dirty`): the page must be written
    /// back before it is reused. `false` if not present.
    #[inline]
    pub fn dirty(&self) -> bool {
        self.is_present() && A::is_dirty(self.raw)
    }

    /// The value of the software entry (swap or migration entry) it is,
    /// Linux `is_swap_pte` and `pte_to_swp_entry`: `None` for a present
    /// page, a block, or anything at a height above the PTE level.
    #[inline]
    pub fn swap_value(&self) -> Option<u64> {
        if self.height == 0 {
            A::swp_value(self.raw)
        } else {
            None
        }
    }
}
