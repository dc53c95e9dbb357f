//! A kernel half shared by every user address space.

use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{shift, top_entries};
use crate::{AddressSpace, Arch, Decoded, Error, Mmu, TableAlloc, VaRange, VirtAddr};

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// A new kernel address space whose upper half can be shared with
    /// user spaces ([`share_kernel_half`](Self::share_kernel_half) of a
    /// new [`VaRange::Upper`] space): on x86 it preallocates the 256
    /// upper-half tables, on arm64 it is the TTBR1_EL1 space.
    ///
    /// Every process of a kernel sees the same kernel mappings. How the
    /// hardware gets there differs, and these functions give both one API:
    ///
    /// - **x86-64** has one root (CR3) per process for both halves. Linux
    ///   makes the kernel half shared by *table*, not by copy: the kernel's
    ///   top-level entries 256–511 each link a next-level table that exists
    ///   for the life of the system (x86 `preallocate_vmalloc_pages`, and
    ///   `pgd_alloc` → `pgd_ctor` copying the kernel's top-level entries into
    ///   every new PGD; `sync_global_pgds` for the rest). A kernel mapping
    ///   added later goes into those shared tables, so every process sees it
    ///   at once. [`AddressSpace::share_kernel_half`] preallocates the tables
    ///   and pins them (the kernel space never unlinks, replaces nor frees
    ///   them, even when they become empty or a whole 512 GiB entry is
    ///   unmapped); [`AddressSpace::new_user`] copies the 256 entries into a
    ///   new user root. The user space translates its lower half only
    ///   ([`VaRange::Lower`]): its operations never reach the kernel's tables
    ///   and its `Drop` frees only its own half.
    /// - **arm64** translates the kernel half through TTBR1_EL1 and user
    ///   spaces through TTBR0_EL1 ([`Format::SEPARATE_HALVES`]): the kernel's
    ///   root stays in TTBR1 while user roots are switched in TTBR0, so
    ///   nothing is shared at the table level and **no entries are copied**.
    ///   The same calls work: the kernel space is a [`VaRange::Upper`] space,
    ///   and `new_user` makes an empty [`VaRange::Lower`] one.
    ///
    /// Tables linked into a user space get the user table attributes and those
    /// of the kernel half the kernel ones ([`TableAttrs`](crate::TableAttrs)).
    ///
    /// # Kernel mappings are global only if you say so
    ///
    /// **Pass [`Prot::GLOBAL`](crate::Prot::GLOBAL) for every kernel
    /// mapping** (Linux's `PAGE_KERNEL` has it: x86 `_PAGE_GLOBAL`, arm64 nG
    /// clear). The kernel space does not add it: a mapping gets exactly the
    /// [`Prot`](crate::Prot) it is given, so what
    /// [`translate`](Self::translate) reports is what the caller asked for,
    /// and [`change_protection`](Self::change_protection) with the same
    /// `Prot` does not change it. Without `GLOBAL` a kernel mapping is
    /// tagged with the current ASID (arm64) or PCID (x86 with PCIDs): it is
    /// still correct, but every address space refills its own TLB entries
    /// for it after each switch, which costs TLB misses on every kernel
    /// entry. A
    /// [`Prot::NONE`](crate::Prot::NONE) mapping is never global (x86 and
    /// RISC-V keep the marker in the global bit).
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::test_format::TestFormat;
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    /// use pgtable_core::contract::{Arena, NoopMmu};
    ///
    /// type F = TestFormat<4>; // one root for both halves, like x86
    /// let mut kernel = AddressSpace::<F, _, _>::new_kernel(NoopMmu, Arena::new()).unwrap();
    /// // SAFETY: `user` is dropped before `kernel`.
    /// let user = unsafe { AddressSpace::<F, _, _>::new_user(&kernel, NoopMmu, Arena::new()) }.unwrap();
    /// // A kernel mapping made after the user space exists ...
    /// let kva = VirtAddr(0xffff_8000_0000_0000);
    /// kernel.map(kva, PhysAddr(0x20_0000), 0x1000, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// // ... lies in a table the user root links too (the user space itself
    /// // does not translate the upper half).
    /// assert!(user.translate(kva).is_none());
    /// assert_eq!(user.inspect().count_tables(), 1);
    /// drop(user);
    /// # }
    /// ```
    ///
    /// [`Format::SEPARATE_HALVES`]: crate::Format::SEPARATE_HALVES
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`], with nothing leaked.
    pub fn new_kernel(mmu: M, alloc: T) -> Result<Self, Error> {
        let mut s = Self::new_in(VaRange::Upper, mmu, alloc)?;
        s.table_attrs = crate::TableAttrs::KERNEL;
        s.share_kernel_half()?;
        Ok(s)
    }

    /// Makes this space's upper half the kernel half that
    /// [`new_user`](Self::new_user) shares.
    ///
    /// On a format with one root for both halves (x86) it links a table
    /// under every empty root entry of the upper half (256–511), with
    /// [`TableAttrs::KERNEL`](crate::TableAttrs::KERNEL), and pins those tables: from now on this
    /// space never unlinks, replaces nor frees them (not when they become
    /// empty, not when a whole top-level entry's range is unmapped or
    /// moved away) until it is dropped. A second call does nothing.
    ///
    /// On arm64 ([`Format::SEPARATE_HALVES`](crate::Format::SEPARATE_HALVES))
    /// nothing is allocated: the space must be a [`VaRange::Upper`]
    /// (TTBR1_EL1) space, which user spaces never replace.
    ///
    /// # Errors
    ///
    /// [`Error::KernelHalf`] if the space does not translate the upper
    /// half (a [`VaRange::Lower`] space; on arm64 anything but
    /// [`VaRange::Upper`]; a 3-level format with one root, whose root
    /// entries may be moved whole); [`Error::AlreadyMapped`] if a root
    /// entry of the upper half is a leaf or a software entry;
    /// [`Error::OutOfMemory`]. On error nothing was changed.
    pub fn share_kernel_half(&mut self) -> Result<(), Error> {
        let ok = if A::SEPARATE_HALVES {
            self.range == VaRange::Upper
        } else {
            self.range != VaRange::Lower && A::LEVELS >= 4
        };
        if !ok {
            return Err(Error::KernelHalf);
        }
        if A::SEPARATE_HALVES || self.kernel_half {
            self.kernel_half = true;
            return Ok(());
        }
        let top = A::LEVELS - 1;
        let root = self.root_table().all();
        let upper = top_entries::<A>() / 2..top_entries::<A>();
        let mut need = 0;
        for (i, e) in root.iter().enumerate().take(upper.end).skip(upper.start) {
            // Relaxed: we hold the address space exclusively.
            match A::decode(e.load(Relaxed), top) {
                Decoded::None => need += 1,
                Decoded::Table(_) => {}
                Decoded::Leaf(_) | Decoded::Invalid => {
                    return Err(Error::AlreadyMapped(VirtAddr(upper_va::<A>(i))));
                }
            }
        }
        let mut stash = self.reserve(need)?;
        let attrs = crate::TableAttrs::KERNEL;
        for e in &self.root_table().all()[upper] {
            // Relaxed: as above.
            if e.load(Relaxed) == 0 {
                // Not short: counted above, and nothing changed since.
                if let Some(c) = self.take(&mut stash) {
                    A::populate_attrs(&self.mmu, e, c, top, attrs);
                    self.mmu.stats.add_entries_written(1);
                }
            }
        }
        self.table_done();
        self.settle(stash)?;
        self.kernel_half = true;
        Ok(())
    }

    /// A new user address space ([`VaRange::Lower`]) that sees `kernel`'s
    /// shared kernel half (Linux `pgd_alloc`).
    ///
    /// On x86 the new root gets a copy of `kernel`'s root entries 256–511,
    /// which link the kernel's pinned tables: kernel mappings made later,
    /// in those tables, are visible through every user root at once. The
    /// user space never walks, changes nor frees them. On arm64 nothing is
    /// copied (the kernel half is TTBR1_EL1's); the new space is empty.
    ///
    /// Tables the user space links get the user table attributes
    /// ([`TableAttrs::USER`](crate::TableAttrs::USER)).
    ///
    /// # Safety
    ///
    /// On x86 the user root links tables that `kernel` owns and frees when
    /// it is dropped. The caller must keep `kernel` alive (not dropped,
    /// nor dismantled with [`into_parts`](Self::into_parts) and freed)
    /// while the new space's root may be in use by any CPU, i.e. until the
    /// user space is [deactivated](Self::deactivate) or dropped. A kernel
    /// address space normally lives until power-off.
    ///
    /// # Errors
    ///
    /// [`Error::KernelHalf`] if `kernel` does not share its kernel half;
    /// [`Error::OutOfMemory`].
    pub unsafe fn new_user<M2: Mmu, T2: TableAlloc>(
        kernel: &AddressSpace<A, M2, T2>,
        mmu: M,
        alloc: T,
    ) -> Result<Self, Error> {
        if !kernel.kernel_half {
            return Err(Error::KernelHalf);
        }
        let mut s = Self::new_in(VaRange::Lower, mmu, alloc)?;
        s.table_attrs = crate::TableAttrs::USER;
        if !A::SEPARATE_HALVES {
            // The user root is not linked or installed anywhere yet.
            let (k, u) = (kernel.root_table().all(), s.root_table().all());
            let upper = top_entries::<A>() / 2..top_entries::<A>();
            for (d, e) in u[upper.clone()].iter().zip(&k[upper]) {
                // Relaxed: the kernel's root entries of the upper half are
                // pinned (never written again while it lives), and the new
                // root is private until installed, which orders it.
                d.store(e.load(Relaxed), Relaxed);
            }
        }
        Ok(s)
    }

    /// Whether the root entry covering `va` at `height` is a pinned
    /// kernel-half entry that must never be unlinked.
    #[inline]
    pub(crate) fn pinned(&self, height: u32, va: u64) -> bool {
        height == A::LEVELS - 1 && self.kernel_half && !A::SEPARATE_HALVES && va >> 63 != 0
    }
}

/// The first address of the upper-half root entry `i` (256–511 with a
/// full root of 512).
fn upper_va<A: Arch>(i: usize) -> u64 {
    let sign = !((1u64 << (A::VA_BITS - 1)) - 1);
    sign | ((i as u64) << shift::<A>(A::LEVELS - 1))
}
