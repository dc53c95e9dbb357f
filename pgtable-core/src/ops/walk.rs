//! `translate` and range walks.

use crate::contract::level::{entry_end, index, size};
use crate::ops::contpte;
use crate::space::walker::{Next, Span, TableRef};
use crate::{AddressSpace, Arch, Error, Level, Mmu, PhysAddr, Prot, TableAlloc, VirtAddr};

/// Where a virtual address translates to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Translation {
    /// The physical address of the byte at the virtual address.
    pub pa: PhysAddr,
    /// The level of the leaf.
    pub level: Level,
    /// Height of the leaf above the PTE level (0 = 4 KiB page).
    pub height: u32,
    /// The raw leaf entry; for a leaf of a folded contiguous run, with the
    /// accessed/dirty state of the whole run ORed in (Linux
    /// `contpte_ptep_get`: the hardware may mark any entry of the run).
    pub entry: u64,
    /// The protection the leaf grants.
    pub prot: Prot,
}

/// One leaf found by [`AddressSpace::walk`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mapping {
    /// First virtual address the leaf maps (aligned to its size).
    pub va: VirtAddr,
    /// First physical address it maps to.
    pub pa: PhysAddr,
    /// Bytes the leaf maps.
    pub size: u64,
    /// Height above the PTE level.
    pub height: u32,
    /// The raw entry; for a leaf of a folded contiguous run, with the
    /// accessed/dirty state of the whole run ORed in (as
    /// [`Translation::entry`]).
    pub entry: u64,
    /// The protection the leaf grants (as [`Translation::prot`]).
    pub prot: Prot,
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// What `va` maps to, walking the tables as the hardware would (the
    /// TLB is not consulted).
    ///
    /// A [`Prot::NONE`] leaf is reported, with its frame and `prot` equal
    /// to `Prot::NONE` (and its memory type): as for Linux's `pte_present`
    /// and `follow_page`, the page is still mapped for the kernel's own
    /// bookkeeping, although every access through the address faults.
    /// Check [`Prot::protnone`] before treating the result as accessible.
    pub fn translate(&self, va: VirtAddr) -> Option<Translation> {
        self.check_va(va).ok()?;
        let mut h = A::LEVELS - 1;
        let mut t = self.root_table();
        loop {
            match self.read(t, index::<A>(va.0, h), h) {
                (_, Next::Table(c)) => t = c,
                (raw, Next::Leaf(pa)) => {
                    let raw = if A::is_cont(raw, h) {
                        let run = contpte::run_slots::<A>(t.all(), index::<A>(va.0, h), h);
                        let (young, dirty) = contpte::gather_ad::<A>(run);
                        contpte::with_ad::<A>(raw, h, young, dirty)
                    } else {
                        raw
                    };
                    return Some(Translation {
                        pa: PhysAddr(pa.0 + (va.0 & (size::<A>(h) - 1))),
                        level: Level::at_height(h, A::LEVELS),
                        height: h,
                        entry: raw,
                        prot: A::leaf_prot(raw, h),
                    });
                }
                _ => return None,
            }
            h -= 1;
        }
    }

    /// Calls `f` for every leaf that maps part of `[va, va + len)`, in
    /// address order, with its address, size, raw entry and protection.
    ///
    /// Software entries (swap and migration entries) map nothing and are
    /// not reported. To see them too, e.g. to take a reference on every
    /// swap slot of a range, walk with
    /// [`inspect().entries`](crate::contract::Inspector::entries), which
    /// reports every present leaf and every software entry as a
    /// [`LeafEntry`](crate::LeafEntry).
    ///
    /// # Errors
    ///
    /// Misaligned or zero length, or a range outside the address space.
    pub fn walk(&self, va: VirtAddr, len: u64, mut f: impl FnMut(Mapping)) -> Result<(), Error> {
        self.visit(va, len, false, |va, height, entry, pa| {
            if let Some(pa) = pa {
                f(Mapping {
                    va: VirtAddr(va),
                    pa,
                    size: size::<A>(height),
                    height,
                    entry,
                    prot: A::leaf_prot(entry, height),
                });
            }
        })
    }

    /// The walk of [`walk`](Self::walk) and of
    /// [`Inspector::entries`](crate::contract::Inspector::entries): calls
    /// `f` in address order with the first address, height, raw entry
    /// (for a folded run, with the run's accessed/dirty state) and frame
    /// of each present leaf meeting `[va, va + len)`, and with `swaps`
    /// also of each other non-zero entry (no frame).
    pub(crate) fn visit(
        &self,
        va: VirtAddr,
        len: u64,
        swaps: bool,
        mut f: impl FnMut(u64, u32, u64, Option<PhysAddr>),
    ) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        let mut cur = self.cursor(va.0, end);
        while let Some(span) = cur.span() {
            match self.walk_span(span, swaps, &mut f) {
                Some((child, va)) => cur.descend(child, va),
                None => {
                    cur.advance(span.next);
                }
            }
        }
        Ok(())
    }

    /// Reports the entries of `span` up to its first table entry, and
    /// returns that entry's table and first address (`None`: the span is
    /// done).
    fn walk_span<'a>(
        &'a self,
        span: Span<'a, A>,
        swaps: bool,
        f: &mut impl FnMut(u64, u32, u64, Option<PhysAddr>),
    ) -> Option<(TableRef<'a>, u64)> {
        let Span {
            table: t,
            height,
            mut va,
            next: end,
            ..
        } = span;
        // The accessed/dirty state of the folded run last met: (index of
        // its first entry, young, dirty).
        let mut run_ad = (usize::MAX, false, false);
        for i in span.from..span.to {
            let next = entry_end::<A>(va, height, end);
            let first = va & !(size::<A>(height) - 1);
            match self.read(t, i, height) {
                (_, Next::Table(c)) => return Some((c, va)),
                (raw, Next::Leaf(pa)) => {
                    let entry = if A::is_cont(raw, height) {
                        let first = i & !(A::cont_entries(height) as usize - 1);
                        if run_ad.0 != first {
                            let run = contpte::run_slots::<A>(t.all(), i, height);
                            let (young, dirty) = contpte::gather_ad::<A>(run);
                            run_ad = (first, young, dirty);
                        }
                        contpte::with_ad::<A>(raw, height, run_ad.1, run_ad.2)
                    } else {
                        raw
                    };
                    f(first, height, entry, Some(pa));
                }
                (raw, Next::Invalid) if swaps => f(first, height, raw, None),
                _ => {}
            }
            va = next;
        }
        None
    }
}
