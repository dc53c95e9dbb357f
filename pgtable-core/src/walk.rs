//! `translate` and range walks.

use core::sync::atomic::Ordering::Relaxed;

use crate::aspace::table_at;
use crate::contpte;
use crate::level::{entry_end, index, size};
use crate::{AddressSpace, Arch, Decoded, Error, Level, Mmu, PhysAddr, Prot, TableAlloc, VirtAddr};

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
    pub fn translate(&self, va: VirtAddr) -> Option<Translation> {
        self.check_va(va).ok()?;
        let mut h = A::LEVELS - 1;
        let mut tpa = self.root;
        loop {
            // SAFETY: the root or a table reached from it.
            let t = unsafe { table_at(&self.alloc, tpa) };
            // Relaxed: we hold the address space; the walker may write A/D.
            let raw = t.entries[index(va.0, h)].load(Relaxed);
            match A::decode(raw, h) {
                Decoded::Table(c) if h > 0 => tpa = c,
                Decoded::Leaf(pa) => {
                    let raw = if A::is_cont(raw, h) {
                        let run = contpte::run_slots::<A>(t, index(va.0, h), h);
                        let (young, dirty) = contpte::gather_ad::<A>(run);
                        contpte::with_ad::<A>(raw, h, young, dirty)
                    } else {
                        raw
                    };
                    return Some(Translation {
                        pa: PhysAddr(pa.0 + (va.0 & (size(h) - 1))),
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
    /// # Errors
    ///
    /// Misaligned or zero length, or a range outside the address space.
    pub fn walk(&self, va: VirtAddr, len: u64, mut f: impl FnMut(Mapping)) -> Result<(), Error> {
        let end = self.check_range(va, len)?;
        self.walk_table(A::LEVELS - 1, self.root, va.0, end, &mut f);
        Ok(())
    }

    fn walk_table(
        &self,
        height: u32,
        tpa: PhysAddr,
        mut va: u64,
        end: u64,
        f: &mut impl FnMut(Mapping),
    ) {
        // SAFETY: the root or a table reached from it.
        let t = unsafe { table_at(&self.alloc, tpa) };
        // The accessed/dirty state of the folded run last met: (index of
        // its first entry, young, dirty).
        let mut run_ad = (usize::MAX, false, false);
        loop {
            let next = entry_end(va, height, end);
            // Relaxed: we hold the address space; the walker may write A/D.
            let raw = t.entries[index(va, height)].load(Relaxed);
            match A::decode(raw, height) {
                Decoded::Table(c) if height > 0 => self.walk_table(height - 1, c, va, next, f),
                Decoded::Leaf(pa) => f(Mapping {
                    va: VirtAddr(va & !(size(height) - 1)),
                    pa,
                    size: size(height),
                    height,
                    entry: if A::is_cont(raw, height) {
                        let i = index(va, height);
                        let first = i & !(A::cont_entries(height) as usize - 1);
                        if run_ad.0 != first {
                            let run = contpte::run_slots::<A>(t, i, height);
                            let (young, dirty) = contpte::gather_ad::<A>(run);
                            run_ad = (first, young, dirty);
                        }
                        contpte::with_ad::<A>(raw, height, run_ad.1, run_ad.2)
                    } else {
                        raw
                    },
                    prot: A::leaf_prot(raw, height),
                }),
                _ => {}
            }
            va = next;
            if va == end {
                return;
            }
        }
    }
}
