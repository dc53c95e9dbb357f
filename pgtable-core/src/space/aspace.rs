//! The address space handle and the machinery the algorithms share:
//! table access, input validation, pre-reserved tables, deferred frees,
//! walker barriers and the lazy-MMU scope.

use core::cell::Cell;
use core::marker::PhantomData;
use core::mem::ManuallyDrop;
use core::sync::atomic::Ordering::Relaxed;

use crate::contract::level::{entries, entry_end, index, page_size, shift, size};
use crate::contract::Inspector;
use crate::space::half::VaWindow;
use crate::space::walker::{split_parts, Next, Span, TableRef};
use crate::{
    Arch, BbmReason, Decoded, Error, Format, Mmu, PhysAddr, Slot, Stats, TableAlloc, TableAttrs,
    TlbGather, TlbRange, VaRange, VirtAddr,
};

/// What [`AddressSpace::map`] may use besides 4 KiB pages.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MapOptions {
    /// Bit `h` set: leaves (blocks) at height `h` are allowed.
    block_heights: u8,
    /// Write every entry with the synchronising setter, one barrier per
    /// entry ([`variants::barrier_per_entry`](crate::variants::barrier_per_entry)).
    sync_each: bool,
    /// Opt-out of the contiguous hint ([`MapOptions::no_contiguous`]).
    no_cont: bool,
}

impl MapOptions {
    /// Only last-level pages.
    pub const PAGES: MapOptions = MapOptions {
        block_heights: 0,
        sync_each: false,
        no_cont: false,
    };
    /// PMD blocks (2 MiB) but no PUD blocks.
    pub const PMD_BLOCKS: MapOptions = MapOptions {
        block_heights: 1 << 1,
        sync_each: false,
        no_cont: false,
    };
    /// Every block size the format allows (2 MiB and 1 GiB).
    pub const BLOCKS: MapOptions = MapOptions {
        block_heights: 0b110,
        sync_each: false,
        no_cont: false,
    };

    /// The same options, every entry written with a barrier each (see
    /// [`variants::barrier_per_entry`](crate::variants::barrier_per_entry)).
    pub(crate) const fn with_sync_each(self) -> MapOptions {
        MapOptions {
            block_heights: self.block_heights,
            sync_each: true,
            no_cont: self.no_cont,
        }
    }

    /// The same options, but without the contiguous hint: every entry is
    /// written unfolded even where the format has a hint
    /// ([`Format::cont_entries`](crate::Format::cont_entries)) and a run of
    /// the range qualifies. By default [`map`](AddressSpace::map) folds
    /// every aligned run the call covers whole (Linux `contpte_set_ptes`).
    pub const fn no_contiguous(self) -> MapOptions {
        MapOptions {
            block_heights: self.block_heights,
            sync_each: self.sync_each,
            no_cont: true,
        }
    }

    /// Whether [`map`](AddressSpace::map) may set the contiguous hint.
    #[inline]
    pub const fn allows_contiguous(self) -> bool {
        !self.no_cont
    }

    /// Whether entries are written with a barrier each.
    #[inline]
    pub(crate) const fn is_barrier_per_entry(self) -> bool {
        self.sync_each
    }

    /// Whether a block at `height` is allowed.
    #[inline]
    pub const fn allows(self, height: u32) -> bool {
        self.block_heights & (1 << height) != 0
    }
}

/// One address space: a root table, the MMU it is live on and the
/// allocator its tables come from.
///
/// Every operation takes `&mut self`, so no two operations on one address
/// space run at once; the hardware walker (and, in tests, the simulated
/// hardware agent) is the only concurrent party.
///
/// Dropping the address space frees every table it owns, unless it is
/// *active*: [`install`](Self::install) makes it active, and only
/// [`deactivate`](Self::deactivate), whose caller promises that no CPU uses
/// the tables any more, makes it inactive again. An active address space
/// that is dropped leaks its tables (a CPU may still walk them) and debug
/// builds report the drop as a bug. [`into_parts`](Self::into_parts) gives
/// the tables up without freeing them, on purpose.
pub struct AddressSpace<A: Arch, M: Mmu, T: TableAlloc> {
    pub(crate) root: PhysAddr,
    pub(crate) mmu: Counted<M>,
    pub(crate) alloc: T,
    lazy_depth: u32,
    /// A per-table walker barrier was deferred to the end of the lazy-MMU
    /// scope (a `Cell`: written by walks that borrow the space shared).
    barrier_pending: Cell<bool>,
    /// Global leaves may exist (set when one is mapped or made global, and
    /// for adopted tables): full flushes must then drop global
    /// translations too.
    pub(crate) may_hold_global: bool,
    /// Installed on the MMU and not deactivated since.
    pub(crate) active: bool,
    /// The part of the virtual address space this space translates.
    pub(crate) range: VaRange,
    /// `range` as one add-and-mask test, for [`check_va`](Self::check_va).
    window: VaWindow,
    /// The upper half's root entries link tables shared with user spaces
    /// (see `kernel_half.rs`): they are never unlinked nor freed while the
    /// space lives.
    pub(crate) kernel_half: bool,
    /// The attributes of every table this space links.
    pub(crate) table_attrs: TableAttrs,
    _arch: PhantomData<A>,
}

/// The MMU wrapped with the `stats` counters, so barriers and flushes
/// issued anywhere (also inside arch entry operations) are counted.
pub(crate) struct Counted<M> {
    pub(crate) inner: M,
    pub(crate) stats: Stats,
}

// SAFETY: every operation forwards to `M`, which upholds the contract.
unsafe impl<M: Mmu> Mmu for Counted<M> {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;

    #[inline]
    fn walker_barrier(&self) {
        self.stats.add_barriers(1);
        self.inner.walker_barrier();
    }

    #[inline]
    fn publish_barrier(&self) {
        self.inner.publish_barrier();
    }

    #[inline]
    fn flush_tlb_range(&self, range: TlbRange) {
        self.stats.add_flush_range(1);
        self.stats.add_flush_range_pages(range.strides());
        self.inner.flush_tlb_range(range);
    }

    #[inline]
    fn flush_tlb_all(&self) {
        self.stats.add_flush_all(1);
        self.inner.flush_tlb_all();
    }

    #[inline]
    fn flush_tlb_mm(&self) {
        self.stats.add_flush_all(1);
        self.inner.flush_tlb_mm();
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.install_root(root) }
    }

    #[inline]
    fn entry_written(&self, slot: &Slot, old: u64) {
        self.inner.entry_written(slot, old);
    }
}

/// Returns the table at `pa`.
///
/// # Safety
///
/// `pa` must be a live table frame of `alloc`, and the returned reference
/// must not be used after that frame is freed.
#[inline]
pub(crate) unsafe fn table_at<'t, T: TableAlloc>(alloc: &T, pa: PhysAddr, n: usize) -> &'t [Slot] {
    // SAFETY: the caller guarantees the frame is a live frame of `alloc`
    // of at least `n` entries, which is what `phys_to_virt` asks;
    // `TableAlloc` guarantees the pointer is valid for reads and atomic
    // writes of the whole frame while it lives, and a frame is nothing but
    // atomics, so shared references to them may coexist with the walker's
    // and other threads' atomic accesses.
    unsafe { core::slice::from_raw_parts(alloc.phys_to_virt(pa).as_ptr().cast::<Slot>(), n) }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// A frame of ours that no walk reaches: one of a reservation, or of an
    /// unlinked subtree queued for freeing (the free queue and the
    /// reservation link their frames through the first word). Tables the
    /// operations walk are [`TableRef`](crate::space::walker::TableRef)s instead.
    ///
    /// # Safety
    ///
    /// `pa` is a frame of `self.alloc` that is not freed while the
    /// reference is used.
    #[inline]
    pub(crate) unsafe fn owned_frame(&self, pa: PhysAddr) -> &[Slot] {
        // SAFETY: a live frame of our allocator (the caller's guarantee),
        // of a page of `A`'s size (checked when the space is made).
        unsafe { table_at(&self.alloc, pa, entries::<A>()) }
    }
}

/// The tables an operation may take, allocated up front so its write
/// phase cannot fail (check → reserve → write): made by
/// [`reserve`](AddressSpace::reserve) with the count of the check phase,
/// handed out one by one by [`take`](AddressSpace::take), and closed by
/// [`settle`](AddressSpace::settle), which checks (debug) that the count
/// was exact, frees what is left and returns the operation's `Result`
/// ([`release`](AddressSpace::release) only for an operation that stops
/// before its write phase). The frames are linked through their first word
/// (a value with the low 12 bits clear, which no format treats as valid).
pub(crate) struct Reservation {
    head: u64,
    count: usize,
    /// A [`take`](AddressSpace::take) found the reservation empty (a
    /// counting bug; see there).
    short: bool,
}

/// Table frames unlinked by an operation, freed after its TLB flush.
///
/// One list per height, linked through the first word of each queued
/// table. A table queued at height `h > 0` stands for its whole subtree:
/// the tables below it are found again through its entries `1..` when it
/// is freed, so they are never written (a subtree costs one store, not one
/// per table); the child of entry 0, whose slot holds the link, is queued
/// on its own.
pub(crate) struct FreeQueue {
    heads: [u64; MAX_LEVELS],
    nodes: [usize; MAX_LEVELS],
    /// Every table frame the queue will free.
    pub(crate) count: usize,
}

/// The most translation levels a format may have (x86 LA57).
const MAX_LEVELS: usize = 5;

/// Where a recursive walk of the tables stands: the part `[va, end)` of
/// the range that the table `table` at `height` translates.
#[derive(Clone, Copy)]
pub(crate) struct TableSpan {
    pub(crate) height: u32,
    pub(crate) table: PhysAddr,
    pub(crate) va: u64,
    pub(crate) end: u64,
}

/// A block to split: the entry `raw` at `height` in `slot`, covering `va`.
#[derive(Clone, Copy)]
pub(crate) struct Block<'a> {
    pub(crate) slot: &'a Slot,
    pub(crate) raw: u64,
    pub(crate) va: VirtAddr,
    pub(crate) height: u32,
}

impl TableSpan {
    /// `[va, end)` of the table `table` at `height`.
    #[inline]
    pub(crate) const fn new(height: u32, table: PhysAddr, va: u64, end: u64) -> TableSpan {
        TableSpan {
            height,
            table,
            va,
            end,
        }
    }
}

impl Reservation {
    /// An empty reservation.
    pub(crate) const fn new() -> Reservation {
        Reservation {
            head: 0,
            count: 0,
            short: false,
        }
    }

    /// Whether a [`take`](AddressSpace::take) found the reservation empty:
    /// the check phase under-counted, and the write phase stops where it
    /// is.
    #[inline]
    pub(crate) fn is_short(&self) -> bool {
        self.short
    }
}

impl FreeQueue {
    pub(crate) const fn new() -> FreeQueue {
        FreeQueue {
            heads: [0; MAX_LEVELS],
            nodes: [0; MAX_LEVELS],
            count: 0,
        }
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// A new, empty address space with a freshly allocated root table,
    /// translating every canonical address ([`VaRange::Both`]).
    pub fn new(mmu: M, alloc: T) -> Result<Self, Error> {
        Self::new_in(VaRange::Both, mmu, alloc)
    }

    /// A new, empty address space that translates `range` only: an
    /// address outside it is [`Error::OutOfRange`] for every operation
    /// (and the tables stay as they were), [`translate`](Self::translate)
    /// and [`Inspector::entry`] return `None` for it, and dropping the
    /// space frees only the tables under the root entries of `range`
    /// ([`VaRange::root_indices`]).
    ///
    /// On arm64 ([`Format::SEPARATE_HALVES`](crate::Format::SEPARATE_HALVES))
    /// a [`VaRange::Lower`] space is a TTBR0_EL1 root for `[0, 2^VA_BITS)`
    /// and a [`VaRange::Upper`] one a TTBR1_EL1 root for
    /// `[2^64 - 2^VA_BITS, 2^64)`, each using all 512 root entries; on x86
    /// a half is root entries 0–255 or 256–511 of a CR3 root.
    ///
    /// # Errors
    ///
    /// [`Error::MmuHalf`] on arm64 if `range` is a half and the MMU
    /// installs roots into another ([`Mmu::installs_into`]: a
    /// [`VaRange::Upper`] space needs an MMU writing TTBR1_EL1, a
    /// [`VaRange::Lower`] one an MMU writing TTBR0_EL1 only);
    /// [`Error::OutOfMemory`].
    pub fn new_in(range: VaRange, mmu: M, mut alloc: T) -> Result<Self, Error> {
        // The geometry `A` declares must be one the walks support.
        const { assert!(crate::contract::level::check::<A>()) };
        // A table is one page: the allocator's frames must be `A`'s pages.
        if alloc.frame_shift() != A::PAGE_SHIFT {
            return Err(Error::FrameSize {
                frame_shift: alloc.frame_shift(),
                page_shift: A::PAGE_SHIFT,
            });
        }
        if A::SEPARATE_HALVES && range != VaRange::Both {
            match mmu.installs_into() {
                Some(half) if half != range => {
                    return Err(Error::MmuHalf {
                        space: range,
                        mmu: half,
                    })
                }
                _ => {}
            }
        }
        let root = alloc.alloc_table().ok_or(Error::OutOfMemory)?;
        let mut s = AddressSpace::from_parts(root, mmu, alloc);
        s.set_range(range);
        s.mmu.stats.add_tables_allocated(1);
        Ok(s)
    }

    /// Sets the range the space translates, and its window with it (the
    /// two never differ).
    fn set_range(&mut self, range: VaRange) {
        self.range = range;
        self.window = VaWindow::of::<A>(range);
    }

    /// The part of the virtual address space this space translates.
    pub fn va_range(&self) -> VaRange {
        self.range
    }

    /// Sets the attributes of every table the space links from now on
    /// (tables linked before keep theirs): [`TableAttrs::USER`] for a user
    /// space, [`TableAttrs::KERNEL`] for the kernel's (what
    /// [`new_user`](Self::new_user) and [`new_kernel`](Self::new_kernel)
    /// set). A new space starts with [`TableAttrs::NONE`].
    pub fn set_table_attrs(&mut self, attrs: TableAttrs) {
        self.table_attrs = attrs;
    }

    /// Adopts an existing root table, e.g. one given up by
    /// [`into_parts`](Self::into_parts). The address space starts inactive.
    ///
    /// # Safety
    ///
    /// `root` and every table reachable from it must be allocated frames of
    /// `alloc` holding valid tables of format `A` (every table entry links a
    /// table that is linked nowhere else), owned by nothing else from now
    /// on. If a CPU may be using `root`, the caller must not let the
    /// address space be dropped before it stops (or must
    /// [`install`](Self::install) it, which makes it active).
    ///
    /// The adopted space translates both halves and pins nothing: if its
    /// upper half is a kernel half that user spaces link
    /// ([`new_user`](Self::new_user)), call
    /// [`share_kernel_half`](Self::share_kernel_half) again before any
    /// unmap or move, so its shared tables are never freed.
    pub unsafe fn from_root(root: PhysAddr, mmu: M, alloc: T) -> Self {
        let mut s = AddressSpace::from_parts(root, mmu, alloc);
        // Adopted tables may hold global leaves.
        s.may_hold_global = true;
        s
    }

    /// Dismantles the address space without freeing its tables: the root,
    /// the MMU and the allocator, from which every table stays allocated.
    /// [`from_root`](Self::from_root) puts them back together. Use it for
    /// tables that must outlive the handle (a kernel's own address space
    /// that stays installed until power-off). Nothing is freed, so this is
    /// safe whether or not the address space is active.
    pub fn into_parts(self) -> (PhysAddr, M, T) {
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped nor used again, so `mmu.inner`
        // and `alloc` are each moved out exactly once; the other fields
        // (plain data and the counters) need no drop.
        unsafe {
            (
                this.root,
                core::ptr::read(&this.mmu.inner),
                core::ptr::read(&this.alloc),
            )
        }
    }

    fn from_parts(root: PhysAddr, mmu: M, alloc: T) -> Self {
        AddressSpace {
            root,
            mmu: Counted {
                inner: mmu,
                stats: Stats::default(),
            },
            alloc,
            lazy_depth: 0,
            barrier_pending: Cell::new(false),
            may_hold_global: false,
            active: false,
            range: VaRange::Both,
            window: VaWindow::of::<A>(VaRange::Both),
            kernel_half: false,
            table_attrs: TableAttrs::NONE,
            _arch: PhantomData,
        }
    }

    /// The physical address of the root table (for TTBR / CR3).
    pub fn root(&self) -> PhysAddr {
        self.root
    }

    /// The MMU.
    pub fn mmu(&self) -> &M {
        &self.mmu.inner
    }

    /// The table allocator (e.g. to inject failures in tests:
    /// `Arena::fail_after`, feature `alloc`, takes `&self`).
    pub fn alloc(&self) -> &T {
        &self.alloc
    }

    /// The table allocator, mutably: to take a frame from it and link it
    /// through [`Inspector::slot`].
    ///
    /// # Safety
    ///
    /// The allocator must stay the owner of every frame the tables use,
    /// because the address space hands those frames back to it: do not
    /// replace it (`core::mem::replace`, `swap`, assignment) and do not
    /// free through it a frame the tables use. A frame the caller allocates
    /// through it is the caller's until it is freed or linked as
    /// [`Inspector::slot`] allows.
    pub unsafe fn alloc_mut(&mut self) -> &mut T {
        &mut self.alloc
    }

    /// The counters (all zero without the `stats` feature).
    pub fn stats(&self) -> &Stats {
        &self.mmu.stats
    }

    /// Installs this address space's root on the MMU (Linux `switch_mm`;
    /// with ASIDs or PCIDs, switch through
    /// [`AsidAllocator::switch_mm`](crate::asid::AsidAllocator::switch_mm),
    /// which calls this) and marks it active: until [`deactivate`](Self::deactivate), dropping
    /// it leaks its tables instead of freeing them under a CPU that may
    /// still walk them.
    ///
    /// # Safety
    ///
    /// As [`Mmu::install_root`]: the tables must map everything the CPU
    /// touches next. (They stay alive while installed: an active address
    /// space never frees them.) The space may be live only on CPUs that
    /// the MMU's flushes reach (the shootdown rule of [`Mmu`]).
    pub unsafe fn install(&mut self) {
        self.active = true;
        // SAFETY: the tables map what the CPU needs (our caller's promise)
        // and, the space being active now, are never freed while they may
        // be installed.
        unsafe { self.mmu.install_root(self.root) }
    }

    /// Marks the address space as no longer installed (Linux
    /// `deactivate_mm`), so that dropping it frees its tables. It does not
    /// touch the MMU: switch every CPU to another root first.
    ///
    /// # Safety
    ///
    /// No CPU can use these tables any more: every CPU that had this root
    /// installed has installed another one (or turned translation off), and
    /// no TLB or walk-cache entry made from these tables remains (a root
    /// switch that flushes, as this crate's MMUs do, removes them; with
    /// ASIDs or PCIDs that are kept across the switch, invalidate this
    /// address space's).
    pub unsafe fn deactivate(&mut self) {
        self.active = false;
    }

    /// Runs `f` in a lazy-MMU scope (Linux `arch_enter_lazy_mmu_mode`): the
    /// per-table walker barriers of the operations inside are deferred and
    /// issued once when the scope ends. Barriers that break-before-make
    /// needs are never deferred.
    pub fn lazy_mmu<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.lazy_depth += 1;
        let r = f(self);
        // Saturating: `f` may have swapped another space into `self`.
        self.lazy_depth = self.lazy_depth.saturating_sub(1);
        if self.lazy_depth == 0 && self.barrier_pending.get() {
            self.barrier_pending.set(false);
            self.mmu.walker_barrier();
        }
        r
    }

    /// A read-only view of the raw entries, for tests, arch ports and
    /// diagnostics ([`Inspector`]: one entry's raw value, the table count,
    /// the live slot behind an `unsafe` door).
    ///
    /// ```
    /// # #[cfg(feature = "alloc")] {
    /// use pgtable_core::contract::{Arena, Decoded, Format, NoopMmu};
    /// use pgtable_core::test_format::TestFormat;
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    ///
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    /// let va = VirtAddr(1 << 30);
    /// space.map(va, PhysAddr(0x8000_0000), 0x1000, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
    /// let raw = space.inspect().entry(va, 0).unwrap();
    /// assert_eq!(TestFormat::<4>::decode(raw, 0), Decoded::Leaf(PhysAddr(0x8000_0000)));
    /// assert_eq!(space.inspect().count_tables(), 4); // root, PUD, PMD and PTE tables
    /// # }
    /// ```
    pub fn inspect(&self) -> Inspector<'_, A, M, T> {
        Inspector { space: self }
    }

    /// The slot of the entry at `height` on the path to `va`.
    pub(crate) fn find_slot(&self, va: VirtAddr, height: u32) -> Option<&Slot> {
        if self.check_va(va).is_err() || height >= A::LEVELS {
            return None;
        }
        Some(self.table_for(va.0, height)?.slot(index::<A>(va.0, height)))
    }

    /// The tables linked below the root entries `first..=last` (the root
    /// not included), counted on the cursor; PTE tables are counted from
    /// their parent's entries, not visited.
    pub(crate) fn count_below_root(&self, first: usize, last: usize) -> usize {
        let top = A::LEVELS - 1;
        let va = (first as u64) << shift::<A>(top);
        let end = (last as u64 + 1) << shift::<A>(top);
        let mut n = 0;
        let mut cur = self.cursor_under(self.root_table(), top, va, end);
        while let Some(sp) = cur.span() {
            match self.count_span(sp, &mut n) {
                Some((c, va)) => cur.descend(c, va),
                None => {
                    cur.advance(sp.next);
                }
            }
        }
        n
    }

    /// [`count_below_root`](Self::count_below_root) over `sp`, counting
    /// into `n`, up to the first table above the PTE level: that table and
    /// its first address (`None`: the span is done).
    fn count_span<'a>(&'a self, sp: Span<'a, A>, n: &mut usize) -> Option<(TableRef<'a>, u64)> {
        let h = sp.height;
        let mut va = sp.va;
        for i in sp.from..sp.to {
            if let (_, Next::Table(c)) = self.read(sp.table, i, h) {
                *n += 1;
                if h > 1 {
                    return Some((c, va));
                }
            }
            va = entry_end::<A>(va, h, sp.next);
        }
        None
    }

    // ----- shared machinery for the algorithms -----

    /// Checks one virtual address against the space's
    /// [range](Self::va_range): the one check of every operation on one
    /// address (and of the start of every range, in
    /// [`check_range`](Self::check_range)). An address of the other half,
    /// of the kernel half seen from a user space, or a non-canonical one
    /// is [`Error::OutOfRange`]; on arm64 a half is `2^VA_BITS` bytes,
    /// so a lower space holds `[2^(VA_BITS - 1), 2^VA_BITS)` too, and
    /// the upper half's alias of a lower address (same table indices) is
    /// refused rather than walked.
    #[inline]
    pub(crate) fn check_va(&self, va: VirtAddr) -> Result<(), Error> {
        if self.window.contains(va.0) {
            Ok(())
        } else {
            Err(Error::OutOfRange(va))
        }
    }

    /// Checks a virtual range against the space's [range](Self::va_range)
    /// (its start through [`check_va`](Self::check_va)) and returns its
    /// exclusive end (0 when the range reaches the top of the 64-bit
    /// space): the one check of every operation on a range.
    pub(crate) fn check_range(&self, va: VirtAddr, len: u64) -> Result<u64, Error> {
        Self::check_shape(va, len)?;
        self.check_va(va)?;
        // The last address of the part of the range that holds `va`: the
        // space's half, or for `Both` the end of `va`'s canonical half
        // (the hole between the halves is not translated).
        let last = match self.range {
            VaRange::Both => va.0 | ((1u64 << (A::VA_BITS - 1)) - 1),
            half => half.bounds::<A>().1,
        };
        // `last - va` bytes are left after the first page, which also
        // rules out wrapping past 2^64.
        if len - 1 > last - va.0 {
            // The first address past that part; past the top of the
            // 64-bit space there is none, so the range is named by its
            // start.
            return Err(Error::OutOfRange(last.checked_add(1).map_or(va, VirtAddr)));
        }
        Ok(va.0.wrapping_add(len))
    }

    /// Checks that a range is not empty and page aligned.
    fn check_shape(va: VirtAddr, len: u64) -> Result<(), Error> {
        if len == 0 {
            return Err(Error::ZeroLength);
        }
        if !va.is_aligned(page_size::<A>()) {
            return Err(Error::MisalignedVirt(va));
        }
        if len % page_size::<A>() != 0 {
            return Err(Error::MisalignedLength(len));
        }
        Ok(())
    }

    /// Checks that a physical range is page aligned and encodable.
    pub(crate) fn check_phys(pa: PhysAddr, len: u64) -> Result<(), Error> {
        if !pa.is_aligned(page_size::<A>()) {
            return Err(Error::MisalignedPhys(pa));
        }
        match pa.0.checked_add(len) {
            Some(end) if A::PA_BITS >= 64 || end <= 1u64 << A::PA_BITS => Ok(()),
            _ => Err(Error::PhysOutOfRange(pa)),
        }
    }

    /// Allocates `n` tables up front, or none at all.
    ///
    /// The `tables_allocated` counter counts tables when they are taken
    /// into the tables, not here, so that it tells how many the write
    /// phase used (a reservation that was counted exactly is used up).
    pub(crate) fn reserve(&mut self, n: usize) -> Result<Reservation, Error> {
        let mut stash = Reservation::new();
        for _ in 0..n {
            match self.alloc.alloc_table() {
                // `Format` promises that `table_entry` decodes back to the
                // frame only for such addresses; a frame the format cannot
                // link must never be linked.
                Some(pa)
                    if pa.0 % page_size::<A>() != 0
                        || (A::PA_BITS < 64 && pa.0 >> A::PA_BITS != 0) =>
                {
                    // SAFETY: just allocated, never linked.
                    unsafe { self.alloc.free_table(pa) };
                    self.release_raw(stash);
                    return Err(Error::PhysOutOfRange(pa));
                }
                Some(pa) => {
                    // SAFETY: freshly allocated frame of ours.
                    let t = unsafe { self.owned_frame(pa) };
                    // Relaxed: the frame is private to this thread.
                    t[0].store(stash.head, Relaxed);
                    stash.head = pa.0;
                    stash.count += 1;
                }
                None => {
                    self.release_raw(stash);
                    return Err(Error::OutOfMemory);
                }
            }
        }
        Ok(stash)
    }

    /// Takes one reserved, zeroed table.
    ///
    /// Never `None` for an operation whose check phase counted right: each
    /// operation counts exactly the tables its write phase takes, in a
    /// read-only pass over the same tables that the write phase then walks
    /// (see `map_check`, `split_check` and the dry run of
    /// `move_page_tables`), and nothing the count relied on changes before
    /// the write phase has taken its last table (`move_page_tables` unlinks
    /// emptied source tables only after that). `tests/reservation.rs`
    /// checks the counts over a grid of ranges and layouts.
    ///
    /// Should a count ever be short all the same, this does not panic in
    /// the middle of a write: it returns `None` and marks the stash, the
    /// caller leaves the rest of its work undone without losing a mapping,
    /// and the operation returns [`Error::OutOfMemory`] with the tables
    /// partly changed. Debug builds assert instead.
    pub(crate) fn take(&self, stash: &mut Reservation) -> Option<PhysAddr> {
        debug_assert!(stash.count > 0, "table reservation under-counted");
        let pa = self.pop(stash)?;
        self.mmu.stats.add_tables_allocated(1);
        Some(pa)
    }

    /// The next frame of the stash, marking it short when it is empty.
    fn pop(&self, stash: &mut Reservation) -> Option<PhysAddr> {
        if stash.count == 0 {
            stash.short = true;
            return None;
        }
        let pa = PhysAddr(stash.head);
        // SAFETY: stash frames are live frames of ours, not yet linked.
        let t = unsafe { self.owned_frame(pa) };
        // Relaxed: the frame is private to this thread until linked.
        stash.head = t[0].swap(0, Relaxed);
        stash.count -= 1;
        Some(pa)
    }

    /// Closes the reservation of an operation whose write phase ran: checks
    /// (debug builds) that the check phase did not over-count, frees the
    /// tables left (none when the count was exact; never taken into the
    /// tables, so the counters do not count them), and returns
    /// [`Error::OutOfMemory`] if a [`take`](Self::take) came up short (the
    /// check phase under-counted; see there), `Ok` otherwise.
    pub(crate) fn settle(&mut self, res: Reservation) -> Result<(), Error> {
        debug_assert_eq!(res.count, 0, "table reservation over-counted");
        let short = res.short;
        self.release_raw(res);
        if short {
            return Err(Error::OutOfMemory);
        }
        Ok(())
    }

    /// Frees a reservation whose operation stops before its write phase
    /// (an error of another check, or of the other space's reservation).
    pub(crate) fn release(&mut self, res: Reservation) {
        self.release_raw(res);
    }

    fn release_raw(&mut self, mut stash: Reservation) {
        while let Some(pa) = self.pop(&mut stash) {
            // SAFETY: never linked into the tables, so no walker reaches it.
            unsafe { self.alloc.free_table(pa) };
        }
    }

    /// Queues an unlinked table for freeing after the TLB flush.
    pub(crate) fn queue_free(&self, q: &mut FreeQueue, pa: PhysAddr) {
        self.queue_node(q, pa, 0);
        q.count += 1;
    }

    /// Links `pa` into the queue's list for `height`.
    fn queue_node(&self, q: &mut FreeQueue, pa: PhysAddr, height: u32) {
        let h = height as usize;
        // SAFETY: the frame is ours and unlinked; a walker that still uses a
        // cached pointer to it reads the link as an invalid entry (a value
        // with the low 12 bits clear, by the `Format` rules).
        let t = unsafe { self.owned_frame(pa) };
        // Relaxed: only this thread follows the link.
        t[0].store(q.heads[h], Relaxed);
        q.heads[h] = pa.0;
        q.nodes[h] += 1;
    }

    /// Queues an unlinked table at `height` and every table below it.
    pub(crate) fn queue_free_subtree(&self, q: &mut FreeQueue, pa: PhysAddr, height: u32) {
        if height == 0 {
            self.queue_free(q, pa);
            return;
        }
        // SAFETY: the subtree is ours; it was reachable until unlinked.
        let t = unsafe { self.owned_frame(pa) };
        // Entry 0 is about to hold the link: its subtree goes on its own.
        // Relaxed: the subtree is unlinked; the hardware may still set
        // accessed bits in it, which never change an entry's kind.
        if let Decoded::Table(c) = A::decode(t[0].load(Relaxed), height) {
            self.queue_free_subtree(q, c, height - 1);
        }
        q.count += 1 + self.count_subtree(pa, 1, height);
        self.queue_node(q, pa, height);
    }

    /// The number of tables below entries `from..` of the table `pa` at
    /// `height` (reads tables above the PTE level only).
    fn count_subtree(&self, pa: PhysAddr, from: usize, height: u32) -> usize {
        // SAFETY: a table of an unlinked subtree of ours.
        let t = unsafe { self.owned_frame(pa) };
        let mut n = 0;
        for e in &t[from..] {
            // Relaxed: as in `queue_free_subtree`.
            if let Decoded::Table(c) = A::decode(e.load(Relaxed), height) {
                n += 1;
                if height > 1 {
                    n += self.count_subtree(c, 0, height - 1);
                }
            }
        }
        n
    }

    /// Frees the tables below entries `from..` of the table `pa` at
    /// `height`, deepest first.
    ///
    /// # Safety
    ///
    /// As [`free_queued`](Self::free_queued): the subtree is unlinked and
    /// the TLB flush has completed.
    unsafe fn free_below(&mut self, pa: PhysAddr, from: usize, height: u32) {
        let mut i = from;
        loop {
            // The next child table at or after entry `i`. SAFETY: the
            // subtree is ours and unreachable (our caller's guarantee); the
            // reference ends before anything is freed.
            let t = unsafe { self.owned_frame(pa) };
            // Relaxed: as in `queue_free_subtree`.
            let next = t[i..].iter().enumerate().find_map(|(k, e)| {
                match A::decode(e.load(Relaxed), height) {
                    Decoded::Table(c) => Some((i + k, c)),
                    _ => None,
                }
            });
            let Some((j, c)) = next else {
                return;
            };
            if height > 1 {
                // SAFETY: as ours.
                unsafe { self.free_below(c, 0, height - 1) };
            }
            // SAFETY: unreachable by any walker (our caller's guarantee).
            unsafe { self.alloc.free_table(c) };
            i = j + 1;
        }
    }

    /// Flushes the gathered TLB range, then frees the queued tables (in that
    /// order: a walker may use an unlinked table until the flush).
    pub(crate) fn finish(&mut self, gather: TlbGather, q: FreeQueue) {
        self.flush(gather);
        self.mmu.stats.add_tables_freed(q.count as u64);
        // SAFETY: the queued frames are unlinked and the TLB flush above
        // has completed.
        unsafe { self.free_queued(q) };
    }

    /// Flushes the gathered TLB range (the flush of
    /// [`finish`](Self::finish), for an operation that still uses the
    /// tables it unlinked after the flush).
    pub(crate) fn flush(&self, mut gather: TlbGather) {
        if self.may_hold_global {
            gather.global_changed();
        }
        gather.flush::<A, _>(&self.mmu);
    }

    /// Returns every queued frame to the allocator.
    ///
    /// # Safety
    ///
    /// No hardware walker can reach the queued frames any more.
    unsafe fn free_queued(&mut self, mut q: FreeQueue) {
        for h in 0..MAX_LEVELS {
            while q.nodes[h] > 0 {
                let pa = PhysAddr(q.heads[h]);
                // SAFETY: queued frames are ours and unlinked.
                let t = unsafe { self.owned_frame(pa) };
                // Relaxed: private to this thread now.
                q.heads[h] = t[0].load(Relaxed);
                q.nodes[h] -= 1;
                if h > 0 {
                    // SAFETY: the subtree below the queued table is as
                    // unreachable as the table itself.
                    unsafe { self.free_below(pa, 1, h as u32) };
                }
                // SAFETY: unreachable by any walker (our caller's guarantee).
                unsafe { self.alloc.free_table(pa) };
            }
        }
    }

    /// The per-table walker barrier after writing a table's entries: now,
    /// or at the end of the lazy-MMU scope.
    #[inline]
    pub(crate) fn table_done(&self) {
        if !A::NEEDS_WALKER_BARRIER {
            return;
        }
        if self.lazy_depth > 0 {
            self.barrier_pending.set(true);
        } else {
            self.mmu.walker_barrier();
        }
    }

    /// Replaces the block `raw` at `height` in `slot` (covering `va`: the
    /// fields of `block`) with a table of equivalent next-level leaves taken from `stash`. Uses
    /// break-before-make where the arch needs it; otherwise the old block's
    /// translation is added to `gather`. Returns the new table, or `None`,
    /// changing nothing, when the reservation is short (see
    /// [`take`](Self::take)).
    pub(crate) fn split_block(
        &self,
        block: Block<'_>,
        stash: &mut Reservation,
        gather: &mut TlbGather,
    ) -> Option<PhysAddr> {
        let Block {
            slot,
            raw,
            va,
            height,
        } = block;
        let ct = self.take_table(stash)?;
        let child = ct.pa();
        let new = A::table_entry_attrs(child, height, self.table_attrs);
        let fill = |raw: u64| {
            let first = A::split_leaf(raw, height);
            let step = size::<A>(height - 1);
            for (i, e) in ct.slots(0, entries::<A>()).iter().enumerate() {
                // Relaxed: the table is not reachable yet; the link below
                // is ordered after these stores by the barrier.
                e.store(first + ((i as u64 * step) >> A::OA_SHIFT), Relaxed);
            }
        };
        if needs_bbm::<A>(raw, new, height) {
            // Break: take the block out (atomically, so its final
            // accessed/dirty state is what the children inherit), make
            // sure no TLB holds it, then make the table.
            let old = break_entry::<A, _>(&self.mmu, slot, va, height);
            fill(old);
            A::populate_attrs(&self.mmu, slot, child, height, self.table_attrs);
            // Never deferred: the table must be live before we go on.
            self.mmu.walker_barrier();
        } else {
            // A change of this block still in `gather` (an earlier step of
            // the operation or of the caller's gather) may leave its old
            // value cached: children made from the new one would differ
            // from it in size and attributes, which the Intel SDM (Vol. 3A
            // 4.10.2.3) leaves undefined. Flush what is pending first (the
            // gather stays open).
            let block = va.0 & !(size::<A>(height) - 1);
            if gather.overlaps(block, size::<A>(height)) {
                let mut pending = core::mem::take(gather);
                if self.may_hold_global {
                    pending.global_changed();
                }
                pending.flush::<A, _>(&self.mmu);
            }
            // In place: retry if the hardware updated accessed/dirty state
            // between our read and the exchange, so it is not lost.
            let mut cur = raw;
            loop {
                fill(cur);
                // The children are visible before the link (populate's
                // ordering, for an exchange).
                self.mmu.publish_barrier();
                // Relaxed: atomicity is what matters against the hardware
                // agent; the walker is ordered by the barrier below.
                match slot.compare_exchange(cur, new, Relaxed, Relaxed) {
                    Ok(_) => break,
                    Err(now) => cur = now,
                }
            }
            if M::OBSERVES_WRITES {
                self.mmu.entry_written(slot, cur);
            }
            self.table_done();
            gather.add_leaf::<A>(va, height);
        }
        self.mmu
            .stats
            .add_entries_written(entries::<A>() as u64 + 1);
        Some(child)
    }

    /// [`split_block`](Self::split_block) for a caller that then changes
    /// some of the new entries (their rights, or a write-protect): an
    /// in-place split also flushes the block's translation at once, before
    /// any entry below it differs from it. The Intel SDM (Vol. 3A 4.10.2.3
    /// "Details of TLB Use") leaves behaviour undefined while translations
    /// of different sizes for one address that differ in page frame or
    /// attributes may both be cached; Linux `__split_large_page` splits
    /// with the block's attributes and flushes before the change. One flush
    /// per split block (only the two ends of a range split), besides the
    /// operation's gathered one, which then need not cover the block.
    pub(crate) fn split_block_to_change(
        &self,
        slot: &Slot,
        raw: u64,
        va: VirtAddr,
        height: u32,
        stash: &mut Reservation,
    ) -> Option<PhysAddr> {
        // Only an in-place split gathers anything (the block); a
        // break-before-make split has flushed it already.
        let mut flush = TlbGather::new();
        let block = Block {
            slot,
            raw,
            va,
            height,
        };
        let child = self.split_block(block, stash, &mut flush);
        flush.flush::<A, _>(&self.mmu);
        child
    }

    /// Phase 1 of unmap and change_protection: the tables needed to split
    /// the blocks that `[va, end)` covers only in part and for which
    /// `needs_split(raw, height)` holds, on the cursor (only the first and
    /// the last entry of a span can be covered in part, so only they are
    /// read).
    pub(crate) fn split_check(
        &self,
        va: u64,
        end: u64,
        needs_split: &impl Fn(u64, u32) -> bool,
    ) -> usize {
        let mut need = 0;
        let mut cur = self.cursor(va, end);
        while let Some(sp) = cur.span() {
            match self.split_check_span(sp, needs_split, &mut need) {
                Some((c, va)) => cur.descend(c, va),
                None => {
                    cur.advance(sp.next);
                }
            }
        }
        need
    }

    /// [`split_check`](Self::split_check) over the ends of `sp`, counting
    /// into `need`, up to the first table it must look into: that table
    /// and its first address (`None`: the span is done).
    fn split_check_span<'a>(
        &'a self,
        sp: Span<'a, A>,
        needs_split: &impl Fn(u64, u32) -> bool,
        need: &mut usize,
    ) -> Option<(TableRef<'a>, u64)> {
        let h = sp.height;
        if h == 0 {
            return None;
        }
        for (i, va, next) in sp.partial() {
            match self.read(sp.table, i, h) {
                (raw, Next::Leaf(_)) if needs_split(raw, h) => {
                    *need += Self::split_need(va, next, h);
                }
                (_, Next::Table(c)) => return Some((c, va)),
                _ => {}
            }
        }
        None
    }

    /// How many tables splitting the block at `height` around the partial
    /// range `[va, end)` needs, splits of partly covered children included.
    #[inline]
    pub(crate) fn split_need(va: u64, end: u64, height: u32) -> usize {
        1 + split_parts::<A>(va, end, height - 1)
    }
}

/// Whether replacing the live entry `old` at `height` by `new` needs
/// break-before-make on this arch ([`Arch::BREAK_BEFORE_MAKE`] and
/// [`Arch::change_is_safe`]). Every in-place change of a live entry asks
/// this, and takes [`break_entry`] when it says yes.
#[inline]
pub(crate) fn needs_bbm<A: Arch>(old: u64, new: u64, height: u32) -> bool {
    A::BREAK_BEFORE_MAKE && !A::change_is_safe(old, new, height)
}

/// Why replacing the entry `old` at `height` by `new` needs
/// break-before-make (for an error, once [`needs_bbm`] said it does): the
/// first of the rules of [`BbmReason`] the change breaks.
pub(crate) fn bbm_reason<A: Arch>(old: u64, new: u64, height: u32) -> BbmReason {
    let (Decoded::Leaf(a), Decoded::Leaf(b)) = (A::decode(old, height), A::decode(new, height))
    else {
        // A leaf replaced by a table or the other way: the size changes.
        return BbmReason::BlockSplit;
    };
    let (p, q) = (A::leaf_prot(old, height), A::leaf_prot(new, height));
    if A::is_cont(old, height) != A::is_cont(new, height) {
        BbmReason::ContiguousRun
    } else if a != b {
        BbmReason::OutputAddress
    } else if p.mem() == q.mem() && !p.global() && q.global() {
        BbmReason::NonGlobalToGlobal
    } else {
        // The memory type, or what is left that an arch refuses in place:
        // shareability.
        BbmReason::MemoryType
    }
}

/// The *break* of break-before-make for the leaf at `height` in `slot`
/// (covering `va`): atomically clear it, so its final accessed/dirty state
/// is returned, and invalidate its translation at once (the flush orders
/// the clear before the invalidation: the rules of [`Mmu`]). The caller
/// then writes the new entry (the *make*).
#[inline]
pub(crate) fn break_entry<A: Arch, M: Mmu>(mmu: &M, slot: &Slot, va: VirtAddr, height: u32) -> u64 {
    let old = if height == 0 {
        A::ptep_get_and_clear(mmu, slot)
    } else {
        A::pmdp_huge_get_and_clear(mmu, slot)
    };
    mmu.flush_tlb_range(TlbRange::leaf::<A>(va, height));
    old
}

/// The first address in `[va, end)` whose entry in `t`, a table at
/// `height`, is not none. The range lies inside the table and is aligned to
/// its entry size.
#[inline]
pub(crate) fn first_used<A: Format>(
    t: &[Slot],
    height: u32,
    va: u64,
    end: u64,
) -> Option<VirtAddr> {
    let i = index::<A>(va, height);
    let n = (end.wrapping_sub(va) >> shift::<A>(height)) as usize;
    // Relaxed: we hold the address space exclusively.
    let k = t[i..i + n].iter().position(|e| e.load(Relaxed) != 0)?;
    Some(VirtAddr(va + ((k as u64) << shift::<A>(height))))
}

/// Whether `[va, next)` is exactly one whole entry at `height`.
#[inline]
pub(crate) fn covers<A: Format>(va: u64, next: u64, height: u32) -> bool {
    va & (size::<A>(height) - 1) == 0 && next.wrapping_sub(va) == size::<A>(height)
}

impl<A: Arch, M: Mmu, T: TableAlloc> Drop for AddressSpace<A, M, T> {
    fn drop(&mut self) {
        if self.active {
            // A CPU may still walk the tables: leak them (they stay
            // allocated even after the allocator is dropped, as
            // `TableAlloc` requires). Dropping an installed address space
            // is a bug of the caller's; `into_parts` is the way to keep
            // tables on purpose. (Not asserted while a panic unwinds: a
            // second panic would abort the process and hide the first.)
            #[cfg(feature = "std")]
            if std::thread::panicking() {
                return;
            }
            debug_assert!(
                !self.active,
                "an installed AddressSpace was dropped: its tables are leaked \
                 (deactivate it first, or keep them with into_parts)"
            );
            return;
        }
        self.free_tables();
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> AddressSpace<A, M, T> {
    /// Frees every table of the (inactive) space: those below the root
    /// entries of its range, and the root.
    pub(crate) fn free_tables(&mut self) {
        debug_assert!(!self.active);
        let mut q = FreeQueue::new();
        // Only the root entries of our range: on x86 a user space's root
        // also links the kernel half's tables, which are not ours.
        let (first, last) = self.range.root_indices::<A>();
        let top = A::LEVELS - 1;
        for i in first..=last {
            // No CPU uses the tables any more.
            if let Next::Table(c) = self.read(self.root_table(), i, top).1 {
                self.queue_free_subtree(&mut q, c.pa(), top - 1);
            }
        }
        self.queue_free(&mut q, self.root);
        // SAFETY: the address space is inactive (our caller checked), so
        // by the contract of `deactivate` (or because it was never
        // installed) no CPU can reach its tables.
        unsafe { self.free_queued(q) };
    }
}
