//! The machine state behind the handles: memory, table frames, the TLB
//! with its walk cache, pending (not yet visible) table writes, and the
//! table walker.

use std::boxed::Box;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::vec::Vec;

use super::{
    AdUpdate, BbmConflict, CheckError, ContConflict, DecodeMismatch, HwDecoder, MixedSizes,
    PendingWrite, SimFault, SimFaultKind, SimStats, StaleTlb, UnknownTable, UnknownTableKind,
    UnorderedLink,
};
use crate::contract::level::size;
use crate::ops::contpte::leaf_pa;
use crate::{
    Access, AccessFault, Arch, Arena, Decoded, PhysAddr, Slot, Table, TableAlloc, TableAttrs,
    TlbRange, VaRange, VirtAddr,
};

/// The index of `va` in a table at `height` as the hardware walker forms
/// it, written here rather than taken from the library so that a wrong
/// index there (e.g. the root's index not cut to the bits `VA_BITS`
/// leaves it) is caught: the root translates `VA_BITS - shift(top)` bits,
/// every other table `PAGE_SHIFT - 3` (Arm ARM D8.2, "Translation table
/// walk"; Intel SDM 4.5; RISC-V privileged spec 12.3.2).
pub(super) fn hw_index<A: Arch>(va: u64, height: u32) -> usize {
    let below = A::PAGE_SHIFT + (A::PAGE_SHIFT - 3) * height;
    let bits = if height + 1 == A::LEVELS {
        A::VA_BITS - below
    } else {
        A::PAGE_SHIFT - 3
    };
    ((va >> below) & ((1u64 << bits) - 1)) as usize
}

/// One cached translation: a leaf (TLB proper) or a table entry (walk
/// cache).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    /// The entry as the walker read it (after its own A/D update).
    pub(super) raw: u64,
    /// Host address of the table entry it was read from.
    pub(super) slot: u64,
    /// The root of the walk that filled it (what a fresh walk starts from).
    pub(super) root: PhysAddr,
    /// The table-level restrictions of the walk down to this entry, its
    /// own included for a table entry (Arm ARM D8.4.2, Intel SDM 4.6.1).
    pub(super) limits: TableAttrs,
    /// Number of adjacent entries it was read from (the whole run for a
    /// folded contiguous run, else 1), starting at `slot`.
    pub(super) nslots: u32,
}

impl Cached {
    /// `raw`, read from `nslots` adjacent entries from `slot` on by a walk
    /// from `root` under `limits`.
    fn new(raw: u64, slot: &Slot, root: PhysAddr, limits: TableAttrs, nslots: u32) -> Cached {
        Cached {
            raw,
            slot: slot as *const Slot as u64,
            root,
            limits,
            nslots,
        }
    }

    /// Whether it was read from the entry at host address `slot`.
    #[inline]
    fn read_from(&self, slot: u64) -> bool {
        slot.wrapping_sub(self.slot) < 8 * u64::from(self.nslots)
    }
}

/// A small, fast, deterministic hasher for the simulator's maps (keys are
/// addresses; no hash-flooding concern in a test model).
#[derive(Default)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        // The multiply leaves the low bits a function of the keys' low
        // bits, which are zero for frame addresses: fold the well-mixed
        // high half in, since the maps pick buckets by the low bits.
        self.0 ^ (self.0 >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

pub(super) type Map<K, V> = HashMap<K, V, BuildHasherDefault<AddrHasher>>;
pub(super) type Set<K> = HashSet<K, BuildHasherDefault<AddrHasher>>;

/// Key of a cached entry: base address of the region it covers, height,
/// whether it is a leaf (`true`) or a table entry (`false`), and its tag:
/// the ASID it was filled under, or [`GLOBAL`] for a global leaf.
pub(super) type Key = (u64, u32, bool, u32);

/// The tag of global leaves: they match every ASID.
pub(super) const GLOBAL: u32 = u32::MAX;

/// Flag in a key's height: the entry caches a whole folded contiguous run
/// of leaves at that height (Arm ARM D8.6.1), its base the run's start.
pub(super) const CONT_KEY: u32 = 0x100;

/// Whether the entries of a cached run may disagree in memory type until
/// the flush: where the arch has no break-before-make rule
/// ([`Arch::BREAK_BEFORE_MAKE`] false: RISC-V, whose Svnapot translation
/// caches hold a copy of one entry of the run, so a page then has the old
/// or the new type, as through any stale entry). On arm64 a cached run
/// whose entries disagree in memory type may serve any page with either
/// type, misprogramming the Contiguous bit (Arm ARM D8.6.1, RJQQTC).
#[inline]
pub(super) fn run_mem_may_differ<A: Arch>() -> bool {
    !A::BREAK_BEFORE_MAKE
}

/// The size of the region a key's height covers.
#[inline]
pub(super) fn key_span<A: Arch>(h: u32) -> u64 {
    if h & CONT_KEY != 0 {
        let h = h & !CONT_KEY;
        u64::from(A::cont_entries(h)) * size::<A>(h)
    } else {
        size::<A>(h)
    }
}

/// The key heights a leaf may be cached under: every height, and the run
/// flag for heights with a contiguous hint (runs first: one entry covers
/// more).
pub(super) fn leaf_keys<A: Arch>() -> impl Iterator<Item = u32> {
    let runs = (0..A::LEVELS)
        .filter(|&h| A::cont_entries(h) != 0)
        .map(|h| h | CONT_KEY);
    runs.chain(0..A::LEVELS)
}

/// A table that replaced a block in place while a TLB still held the
/// block: its entries must agree with that cached translation (see
/// [`MixedSizes`]) as long as it is cached.
#[derive(Clone, Copy, Debug)]
pub(super) struct SplitRec {
    /// The CPU that caches the block.
    cpu: usize,
    /// The block's key in that CPU's TLB.
    key: Key,
    /// Host address of the entry the block was read from.
    slot: u64,
    /// Height of the table's entries.
    height: u32,
    /// The address the table's first entry maps.
    va: u64,
}

/// One CPU's translation state: its root registers, current ASID, TLB
/// and walk cache. Filled from the shared tables; kept until a flush that
/// reaches this CPU removes it.
#[derive(Default)]
pub(super) struct Cpu {
    /// The installed root: the only one (x86 CR3, or an arm64 root that
    /// serves both halves), or TTBR0_EL1 when `split`.
    pub(super) root: Option<PhysAddr>,
    /// TTBR1_EL1 when `split`.
    pub(super) upper_root: Option<PhysAddr>,
    /// The halves are translated by separate roots of `VA_BITS` each
    /// (arm64 T0SZ = T1SZ = 64 - VA_BITS): set by installing into a half
    /// on a [`Format::SEPARATE_HALVES`](crate::Format::SEPARATE_HALVES)
    /// format, cleared by installing a root for both.
    pub(super) split: bool,
    /// The ASID of the installed root (0 for untagged MMUs).
    pub(super) asid: u32,
    /// ASIDs whose flush was deferred to their next install (x86 without
    /// INVPCID): their entries are not checked until then.
    pub(super) owed: Set<u32>,
    /// Cached leaves and table entries.
    pub(super) tlb: Map<Key, Cached>,
    /// Entry address to the keys cached from it (may hold keys flushed
    /// since; they are checked against `tlb`).
    by_slot: Map<u64, Vec<Key>>,
    /// Insertion order of `tlb` keys, for FIFO eviction (may hold keys
    /// flushed since; they are skipped).
    fifo: VecDeque<Key>,
    /// Key of the leaf that served the last access (looked up first).
    mru: Option<Key>,
    /// The RISC-V Svinval batch in progress (riscv.rs).
    pub(super) svinval: super::riscv::Batch,
}

impl Cpu {
    /// The root that translates `va`: with split halves (arm64 Arm ARM
    /// D8.2.2), TTBR0_EL1 for `[0, 2^VA_BITS)` and TTBR1_EL1 for
    /// `[2^64 - 2^VA_BITS, 2^64)`, and a Translation fault at the walk's
    /// start for anything in between; otherwise the one root, for the
    /// format's canonical addresses.
    pub(super) fn root_for<A: Arch>(&self, va: u64) -> Result<PhysAddr, SimFaultKind> {
        let outside = SimFaultKind::Translation { height: A::LEVELS };
        if A::SEPARATE_HALVES && self.split {
            if VaRange::Lower.contains::<A>(va) {
                self.root.ok_or(SimFaultKind::NoRoot)
            } else if VaRange::Upper.contains::<A>(va) {
                self.upper_root.ok_or(SimFaultKind::NoRoot)
            } else {
                Err(outside)
            }
        } else if VaRange::Both.contains::<A>(va) {
            self.root.ok_or(SimFaultKind::NoRoot)
        } else if self.root.is_none() {
            Err(SimFaultKind::NoRoot)
        } else {
            Err(outside)
        }
    }
}

pub(super) struct State {
    /// Data memory, sparse: page number to contents.
    pub(super) mem: Map<u64, Box<[u8; 4096]>>,
    /// Table frames.
    pub(super) arena: Arena,
    /// Every frame the arena ever handed out: their memory stays valid
    /// until the arena is dropped, so the walker may read them.
    pub(super) frames: Set<u64>,
    /// Frames allocated now (the arena's and the adopted ones).
    pub(super) live: Set<u64>,
    /// The [`TableLock`](crate::contract::TableLock) of each live arena
    /// frame that was asked for one (boxed: a lock stays where it is while
    /// others come and go), dropped when the frame is freed.
    pub(super) locks: Map<u64, Box<crate::contract::TableLock>>,
    /// Frames of other allocators ([`SimAllocFrom`](super::SimAllocFrom)),
    /// live or freed: physical address to host address. Disjoint from
    /// `frames`; the memory of a freed one may be gone, so only live ones
    /// are read.
    foreign: Map<u64, u64>,
    /// Host address to physical address of the live frames in `foreign`.
    foreign_host: Map<u64, u64>,
    /// The first table frame met that no allocator of the machine handed
    /// out, or the first clash of two allocators' frames.
    unknown: Option<UnknownTable>,
    /// The CPU the state is looking at now ([`select`](State::select)):
    /// its TLB, walk cache, root registers and ASID.
    pub(super) cpu: Cpu,
    /// Every CPU's state, by number; the selected CPU's slot holds an
    /// empty placeholder while it is selected.
    parked: Vec<Cpu>,
    /// The selected CPU.
    pub(super) sel: usize,
    /// The first break-before-make violation seen.
    pub(super) conflict: Option<BbmConflict>,
    /// The first table linked before its contents were published.
    pub(super) unordered: Option<UnorderedLink>,
    /// The first misprogrammed contiguous run a TLB fill met.
    pub(super) contig: Option<ContConflict>,
    /// The first entry that disagreed with a cached block above it.
    mixed: Option<MixedSizes>,
    /// The first stale entry of an ASID at the moment a root was installed
    /// with it (usable from then on, whatever a flush removes later).
    switched_stale: Option<StaleTlb>,
    /// Host address of a table frame to the cached blocks it replaced.
    split_under: Map<u64, Vec<SplitRec>>,
    /// Publication epoch: advanced by every barrier, publish and flush.
    epoch: u64,
    /// Table frame to the epoch of its last write (or its allocation).
    last_write: Map<u64, u64>,
    pub(super) tlb_capacity: usize,
    /// Accessed/dirty updates of a leaf in a folded run go to the run's
    /// first entry ([`SimMachine::set_run_ad_on_first_entry`]).
    ///
    /// [`SimMachine::set_run_ad_on_first_entry`]: super::SimMachine::set_run_ad_on_first_entry
    pub(super) run_ad_first: bool,
    /// Slot address to the value the walker still sees (arm64 model) and
    /// the latest value written.
    pub(super) pending: Map<u64, (u64, u64)>,
    /// Accessed/dirty updates are the software's: an access that needs
    /// one faults (RISC-V Svade; riscv.rs).
    pub(super) software_ad: bool,
    /// A store that makes an invalid entry valid needs no barrier
    /// (RISC-V Svvptc; riscv.rs).
    pub(super) svvptc: bool,
    /// The second decoder of every entry a walk reads
    /// ([`SimMachine::set_hw_decoder`](super::SimMachine::set_hw_decoder)).
    pub(super) hw_decoder: Option<HwDecoder>,
    /// The first entry it read differently from the format.
    decode_mismatch: Option<DecodeMismatch>,
    pub(super) stats: SimStats,
}

/// Whether the hardware walker uses `raw` at some height: a table, or a
/// leaf that is not [`Prot::NONE`](crate::Prot::NONE).
fn walker_valid<A: Arch>(raw: u64) -> bool {
    (0..A::LEVELS).any(|h| match A::decode(raw, h) {
        Decoded::Table(_) => h > 0,
        Decoded::Leaf(_) => !A::is_protnone(raw, h),
        _ => false,
    })
}

/// A leaf found by a walk.
pub(super) struct Leaf<'a> {
    pub(super) raw: u64,
    pub(super) height: u32,
    pub(super) slot: &'a Slot,
    /// The table holding it and its index there (a run's other entries
    /// are reached through the table, never from `slot`, whose borrow
    /// covers that one entry).
    pub(super) table: &'a [Slot],
    pub(super) index: usize,
    /// The walker saw an older value than memory holds (pending write).
    pub(super) stale: bool,
    /// The table-level restrictions of the tables the walk went through.
    pub(super) limits: TableAttrs,
}

impl State {
    pub(super) fn new<A: Arch>(cpus: usize) -> State {
        State {
            mem: Map::default(),
            arena: Arena::for_format::<A>(),
            frames: Set::default(),
            live: Set::default(),
            locks: Map::default(),
            foreign: Map::default(),
            foreign_host: Map::default(),
            unknown: None,
            cpu: Cpu::default(),
            parked: (0..cpus.max(1)).map(|_| Cpu::default()).collect(),
            sel: 0,
            conflict: None,
            unordered: None,
            contig: None,
            mixed: None,
            switched_stale: None,
            split_under: Map::default(),
            epoch: 0,
            last_write: Map::default(),
            tlb_capacity: 1024,
            run_ad_first: false,
            pending: Map::default(),
            software_ad: false,
            svvptc: false,
            hw_decoder: None,
            decode_mismatch: None,
            stats: SimStats::default(),
        }
    }

    // ----- CPUs -----

    /// Number of simulated CPUs.
    pub(super) fn cpus(&self) -> usize {
        self.parked.len()
    }

    /// Makes CPU `i` the one [`cpu`](Self::cpu) refers to (and the one
    /// accesses and local maintenance act on).
    pub(super) fn select(&mut self, i: usize) {
        if i != self.sel {
            // The placeholder in the selected slot goes back to the
            // selected CPU's slot; CPU `i` comes out of its slot.
            std::mem::swap(&mut self.cpu, &mut self.parked[self.sel]);
            std::mem::swap(&mut self.cpu, &mut self.parked[i]);
            self.sel = i;
        }
    }

    /// CPU `i`'s state, selected or not.
    pub(super) fn cpu_ref(&self, i: usize) -> &Cpu {
        if i == self.sel {
            &self.cpu
        } else {
            &self.parked[i]
        }
    }

    // ----- table frames -----

    pub(super) fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = self.arena.alloc_table()?;
        if self.live.contains(&pa.0) {
            // A live frame of another allocator at the same address: the
            // arena's frame is leaked (never handed out).
            self.clash(pa);
            return None;
        }
        self.foreign.remove(&pa.0);
        // The allocator zeroed the frame: a write that must be published
        // before the frame is linked. An arena frame's host address is
        // its physical address.
        self.last_write.insert(pa.0, self.epoch);
        self.frames.insert(pa.0);
        self.live.insert(pa.0);
        Some(pa)
    }

    /// Records that two allocators handed out frames at `pa`.
    fn clash(&mut self, pa: PhysAddr) {
        self.unknown.get_or_insert(UnknownTable {
            pa,
            kind: UnknownTableKind::Clash,
        });
    }

    /// Takes the frame `pa`, at host address `host`, that another
    /// allocator just handed out, as a table frame the walker may read
    /// until [`release`](Self::release). `false` (recorded for the check):
    /// `pa` is a frame of this machine already.
    ///
    /// # Safety
    ///
    /// `host` points to the frame, valid for reads and atomic writes until
    /// `release(pa)` (the allocator's `phys_to_virt` of a frame it handed
    /// out and that is not freed: [`TableAlloc`]).
    pub(super) unsafe fn adopt(&mut self, pa: PhysAddr, host: NonNull<Table>) -> bool {
        if self.live.contains(&pa.0) || self.frames.contains(&pa.0) {
            self.clash(pa);
            return false;
        }
        let host = host.as_ptr() as u64;
        // The allocator zeroed the frame: see `alloc_table`.
        self.last_write.insert(host, self.epoch);
        self.foreign.insert(pa.0, host);
        self.foreign_host.insert(host, pa.0);
        self.live.insert(pa.0);
        true
    }

    /// Gives back an adopted frame before its allocator frees it: the
    /// walker no longer reads it ([`SimFaultKind::FreedTable`]).
    pub(super) fn release(&mut self, pa: PhysAddr) {
        let Some(&host) = self.foreign.get(&pa.0) else {
            return;
        };
        if self.live.remove(&pa.0) {
            self.forget_frame(host);
        }
        self.foreign_host.remove(&host);
    }

    /// Drops what the machine keeps about the entries of the table frame
    /// at host address `host`, which is being freed.
    fn forget_frame(&mut self, host: u64) {
        self.split_under.remove(&host);
        // A frame freed without a flush (an address space being dropped)
        // must not carry pending writes into its next life.
        if !self.pending.is_empty() {
            self.pending
                .retain(|&slot, _| !(host..host + 4096).contains(&slot));
        }
    }

    /// The host address of the live table frame `pa`.
    fn host_of(&self, pa: PhysAddr) -> Option<u64> {
        if !self.live.contains(&pa.0) {
            None
        } else if let Some(&host) = self.foreign.get(&pa.0) {
            Some(host)
        } else {
            // An arena frame's host address is its physical address.
            Some(pa.0)
        }
    }

    /// Whether the table frame at host address `host` may be read: an
    /// arena frame (valid for the life of the state, freed or not) or a
    /// live adopted one.
    fn readable(&self, host: u64) -> bool {
        self.frames.contains(&host) || self.foreign_host.contains_key(&host)
    }

    /// # Safety
    ///
    /// As [`TableAlloc::free_table`].
    pub(super) unsafe fn free_table(&mut self, pa: PhysAddr) {
        self.live.remove(&pa.0);
        self.locks.remove(&pa.0);
        // An arena frame's host address is its physical address.
        self.forget_frame(pa.0);
        // SAFETY: forwarded from our caller.
        unsafe { self.arena.free_table(pa) };
    }

    /// # Safety
    ///
    /// As [`TableAlloc::phys_to_virt`].
    pub(super) unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: forwarded from our caller.
        unsafe { self.arena.phys_to_virt(pa) }
    }

    /// Entries in one table frame of the machine's format.
    fn frame_entries(&self) -> usize {
        1 << (self.arena.frame_shift() - 3)
    }

    /// The table frame at `pa`, if `pa` is one (live or freed).
    pub(super) fn table(&self, pa: PhysAddr) -> Result<&[Slot], SimFaultKind> {
        let n = self.frame_entries();
        if self.frames.contains(&pa.0) {
            if !self.live.contains(&pa.0) {
                return Err(SimFaultKind::FreedTable(pa));
            }
            // SAFETY: `pa` is a frame of `self.arena` that is not freed
            // (both checked above), as `phys_to_virt` asks; it stays valid
            // while `self` is borrowed, because freeing it needs `&mut
            // self`; entries are atomics, so shared access is sound.
            let first = unsafe { self.arena.phys_to_virt(pa) }.cast::<Slot>();
            // SAFETY: as above: the frame holds `n` entries.
            return Ok(unsafe { core::slice::from_raw_parts(first.as_ptr(), n) });
        }
        let Some(&host) = self.foreign.get(&pa.0) else {
            return Err(SimFaultKind::NotATable(pa));
        };
        if !self.live.contains(&pa.0) {
            return Err(SimFaultKind::FreedTable(pa));
        }
        // SAFETY: `host` is what the frame's allocator's `phys_to_virt`
        // gave for it, valid until the frame is released (`adopt`'s
        // contract), which it is not (live, checked above); releasing needs
        // `&mut self`, so it stays valid while `self` is borrowed; entries
        // are atomics, so shared access is sound.
        Ok(unsafe { core::slice::from_raw_parts(host as *const Slot, n) })
    }

    /// Whether `pa` is a table frame some allocator of the machine handed
    /// out (live or freed).
    fn known(&self, pa: PhysAddr) -> bool {
        self.frames.contains(&pa.0) || self.foreign.contains_key(&pa.0)
    }

    /// The first table frame met that the machine does not know: recorded
    /// by a walk or the clash of two allocators, else an installed root.
    fn check_known(&self) -> Result<(), UnknownTable> {
        if let Some(u) = self.unknown {
            return Err(u);
        }
        for i in 0..self.parked.len() {
            let cpu = self.cpu_ref(i);
            for r in [cpu.root, cpu.upper_root].into_iter().flatten() {
                if !self.known(r) {
                    return Err(UnknownTable {
                        pa: r,
                        kind: UnknownTableKind::Root,
                    });
                }
            }
        }
        Ok(())
    }

    // ----- data memory -----

    pub(super) fn mem_read(&self, pa: u64, buf: &mut [u8]) {
        let (page, off) = (pa >> 12, (pa & 0xfff) as usize);
        debug_assert!(off + buf.len() <= 4096);
        match self.mem.get(&page) {
            Some(p) => buf.copy_from_slice(&p[off..off + buf.len()]),
            None => buf.fill(0),
        }
    }

    pub(super) fn mem_write(&mut self, pa: u64, buf: &[u8]) {
        let (page, off) = (pa >> 12, (pa & 0xfff) as usize);
        debug_assert!(off + buf.len() <= 4096);
        let p = self.mem.entry(page).or_insert_with(|| Box::new([0; 4096]));
        p[off..off + buf.len()].copy_from_slice(buf);
    }

    // ----- the walker -----

    /// What the walker sees in `slot`: the oldest pending value if a write
    /// to it is not visible yet, else memory.
    fn walker_read<A: Arch>(&mut self, slot: &Slot) -> (u64, bool) {
        // Relaxed: the simulated walker needs single-copy atomicity only;
        // visibility is modelled by `pending`.
        let now = slot.load(Relaxed);
        if A::NEEDS_WALKER_BARRIER {
            if let Some(&(old, _)) = self.pending.get(&(slot as *const Slot as u64)) {
                if old != now {
                    self.stats.stale_walker_reads += 1;
                }
                return (old, old != now);
            }
        }
        (now, false)
    }

    /// Walks to the leaf for `va` as the walker sees the tables, using and
    /// filling the walk cache.
    fn walk<A: Arch>(&mut self, va: u64) -> Result<Leaf<'static>, SimFaultKind> {
        let root = self.root_for::<A>(va)?;
        // Start below the deepest cached table entry.
        let mut h = A::LEVELS - 1;
        let mut tpa = root;
        let mut limits = TableAttrs::NONE;
        for k in 1..A::LEVELS {
            if let Some(c) = self
                .cpu
                .tlb
                .get(&(va & !(size::<A>(k) - 1), k, false, self.cpu.asid))
            {
                if let Decoded::Table(pa) = A::decode(c.raw, k) {
                    tpa = pa;
                    h = k - 1;
                    limits = c.limits;
                    self.stats.walk_cache_hits += 1;
                    break;
                }
            }
        }
        self.stats.walks += 1;
        let mut stale = false;
        loop {
            let t = match self.table(tpa) {
                Ok(t) => t,
                Err(e) => {
                    if let SimFaultKind::NotATable(pa) = e {
                        let kind = if pa == root {
                            UnknownTableKind::Root
                        } else {
                            UnknownTableKind::Entry
                        };
                        self.unknown.get_or_insert(UnknownTable { pa, kind });
                    }
                    return Err(e);
                }
            };
            // SAFETY: a table frame stays readable until it is freed (see
            // `table`), which needs the state's lock; the 'static lifetime
            // never escapes a method that holds the lock (callers use the
            // leaf's slot before releasing it).
            let t: &'static [Slot] = unsafe { &*(t as *const [Slot]) };
            let idx = hw_index::<A>(va, h);
            let slot = &t[idx];
            let (raw, st) = self.walker_read::<A>(slot);
            stale |= st;
            if let Some(hw) = self.hw_decoder {
                self.compare_decoders::<A>(hw, va, raw, h);
            }
            match A::decode(raw, h) {
                Decoded::Table(c) if h > 0 => {
                    limits = limits.union(A::table_limits(raw, h));
                    let key = (va & !(size::<A>(h) - 1), h, false, self.cpu.asid);
                    self.cache(key, Cached::new(raw, slot, root, limits, 1));
                    tpa = c;
                }
                // A PROT_NONE leaf is invalid for the walker: a
                // translation fault, nothing cached.
                Decoded::Leaf(_) if A::leaf_allowed(h) && !A::is_protnone(raw, h) => {
                    return Ok(Leaf {
                        raw,
                        height: h,
                        slot,
                        table: t,
                        index: idx,
                        stale,
                        limits,
                    })
                }
                _ => return Err(SimFaultKind::Translation { height: h }),
            }
            h -= 1;
        }
    }

    /// Records the first entry (`raw`, at `height`, on the walk of `va`)
    /// that the format and `hw` read differently, each as the walker would
    /// use it: a table above height 0, a leaf where the format allows one
    /// and that is not `Prot::NONE`, else a fault ([`Decoded::Invalid`]).
    fn compare_decoders<A: Arch>(&mut self, hw: HwDecoder, va: u64, raw: u64, height: u32) {
        if self.decode_mismatch.is_some() {
            return;
        }
        let format = match A::decode(raw, height) {
            Decoded::Table(pa) if height > 0 => Decoded::Table(pa),
            Decoded::Leaf(pa) if A::leaf_allowed(height) && !A::is_protnone(raw, height) => {
                Decoded::Leaf(pa)
            }
            _ => Decoded::Invalid,
        };
        let hardware = match hw(raw, height) {
            Decoded::Table(pa) if height > 0 => Decoded::Table(pa),
            Decoded::Leaf(pa) => Decoded::Leaf(pa),
            _ => Decoded::Invalid,
        };
        if format != hardware {
            self.decode_mismatch = Some(DecodeMismatch {
                va: VirtAddr(va),
                height,
                raw,
                format,
                hardware,
            });
        }
    }

    /// The selected CPU's root for `va` (see [`Cpu::root_for`]).
    pub(super) fn root_for<A: Arch>(&self, va: u64) -> Result<PhysAddr, SimFaultKind> {
        self.cpu.root_for::<A>(va)
    }

    /// The entry at `height` on the path to `va` in memory as it is (no
    /// pending view, no cache): `(raw, height)` of the leaf or of the entry
    /// at `height`, whichever comes first; `None` when the walk ends
    /// earlier.
    fn fresh<A: Arch>(
        &self,
        root: PhysAddr,
        va: u64,
        height: u32,
        leaf: bool,
    ) -> Option<(u64, u32)> {
        let mut h = A::LEVELS - 1;
        let mut tpa = root;
        loop {
            let t = self.table(tpa).ok()?;
            // Relaxed: see `walker_read`.
            let raw = t[hw_index::<A>(va, h)].load(Relaxed);
            if !leaf && h == height {
                return Some((raw, h));
            }
            match A::decode(raw, h) {
                Decoded::Table(c) if h > 0 => tpa = c,
                Decoded::Leaf(_) if A::leaf_allowed(h) => return Some((raw, h)),
                _ => return None,
            }
            h -= 1;
        }
    }

    /// Caches `c` under `key` (a leaf entry counts as a TLB fill).
    fn cache(&mut self, key: Key, c: Cached) {
        if key.2 {
            self.stats.tlb_fills += 1;
        }
        if self.cpu.tlb.insert(key, c).is_none() {
            self.cpu.fifo.push_back(key);
            for i in 0..u64::from(c.nslots) {
                let s = c.slot + 8 * i;
                let tlb = &self.cpu.tlb;
                let keys = self.cpu.by_slot.entry(s).or_default();
                keys.retain(|k| *k != key && tlb.get(k).is_some_and(|c| c.read_from(s)));
                keys.push(key);
            }
            self.shrink_to(self.tlb_capacity);
        }
    }

    /// A walk found the leaf `raw` with the contiguous hint at `height` in
    /// `slot`, for `va`: checks its run as the hardware may assume it
    /// (every entry a valid leaf with the hint, one aligned contiguous
    /// physical range, one memory type; `0` entries are tolerated, see
    /// [`ContConflict`]) and returns the slot of its first entry and the
    /// run's first output address, or records the conflict and returns
    /// `None`.
    fn run_of<A: Arch>(
        &mut self,
        va: u64,
        height: u32,
        raw: u64,
        table: &'static [Slot],
    ) -> Option<(&'static Slot, u64)> {
        let n = A::cont_entries(height);
        if n == 0 {
            return None;
        }
        let step = size::<A>(height);
        let j = (hw_index::<A>(va, height) & (n as usize - 1)) as u64;
        let pa = leaf_pa::<A>(raw, height, hw_index::<A>(va, height))?;
        let base_pa = pa.0.wrapping_sub(j * step);
        let mem = A::leaf_prot(raw, height).mem();
        // The run is aligned and `n` divides the table's entry count, so
        // its entries are `first..first + n` of the same table.
        let first = hw_index::<A>(va, height) - j as usize;
        let run = &table[first..first + n as usize];
        let run_va = va & !(u64::from(n) * step - 1);
        let mut bad = None;
        if base_pa & (u64::from(n) * step - 1) != 0 {
            bad = Some((j as u32, raw));
        }
        for i in 0..n {
            if bad.is_some() {
                break;
            }
            let e = &run[i as usize];
            let (r, _) = self.walker_read::<A>(e);
            if r == 0 {
                continue;
            }
            let ok = leaf_pa::<A>(r, height, first + i as usize)
                == Some(PhysAddr(base_pa + u64::from(i) * step))
                && A::is_cont(r, height)
                && (run_mem_may_differ::<A>() || A::leaf_prot(r, height).mem() == mem);
            if !ok {
                bad = Some((i, r));
            }
        }
        if let Some((index, raw)) = bad {
            if self.contig.is_none() {
                self.contig = Some(ContConflict {
                    va: VirtAddr(run_va),
                    height,
                    index,
                    raw,
                    at_fill: true,
                    cached_on: None,
                });
            }
            return None;
        }
        Some((&run[0], base_pa))
    }

    /// Removes the cached entries for which `drop` holds; returns how many.
    pub(super) fn drop_where(&mut self, mut drop: impl FnMut(&Key) -> bool) -> usize {
        let before = self.cpu.tlb.len();
        self.cpu.tlb.retain(|k, _| !drop(k));
        if self.cpu.mru.is_some_and(|k| !self.cpu.tlb.contains_key(&k)) {
            self.cpu.mru = None;
        }
        // Keys flushed since they were indexed pile up: compact.
        if self.cpu.by_slot.len() > 4 * self.tlb_capacity.max(self.cpu.tlb.len()) + 64 {
            self.cpu.by_slot.clear();
            for (k, c) in &self.cpu.tlb {
                self.cpu.by_slot.entry(c.slot).or_default().push(*k);
            }
        }
        before - self.cpu.tlb.len()
    }

    /// Evicts the oldest entries until at most `n` remain.
    pub(super) fn shrink_to(&mut self, n: usize) {
        while self.cpu.tlb.len() > n {
            let Some(k) = self.cpu.fifo.pop_front() else {
                break;
            };
            if self.cpu.tlb.remove(&k).is_some() {
                self.stats.tlb_evictions += 1;
                if self.cpu.mru == Some(k) {
                    self.cpu.mru = None;
                }
            }
        }
        // Keys flushed since they were queued pile up: compact.
        if self.cpu.fifo.len() > 4 * self.tlb_capacity.max(self.cpu.tlb.len()) {
            let tlb = &self.cpu.tlb;
            let mut seen = Set::default();
            self.cpu
                .fifo
                .retain(|k| tlb.contains_key(k) && seen.insert(*k));
        }
    }

    /// With `run_ad_first`, where the hardware records the accessed/dirty
    /// update `access` makes to the leaf it walked at `va` when that leaf
    /// is in a folded run: the run's first entry, its value and the
    /// updated value. `None`: in the walked entry itself.
    fn run_ad_target<A: Arch>(
        &mut self,
        va: u64,
        leaf: &Leaf<'static>,
        access: Access,
    ) -> Option<(&'static Slot, u64, u64)> {
        let h = leaf.height;
        let n = A::cont_entries(h) as usize;
        if !self.run_ad_first || n == 0 || !A::is_cont(leaf.raw, h) {
            return None;
        }
        let j = hw_index::<A>(va, h) & (n - 1);
        // The run is aligned and `n` divides the table's entry count, so
        // its first entry is `j` entries before the walked one.
        let first: &'static Slot = &leaf.table[leaf.index - j];
        let (raw, stale) = self.walker_read::<A>(first);
        if stale || !A::is_cont(raw, h) {
            return None;
        }
        let set = A::hw_access(raw, h, access).ok()?;
        Some((first, raw, set))
    }

    /// Performs `access` at `va`: the output address of the byte, plus the
    /// accessed/dirty update the walker made.
    pub(super) fn access<A: Arch>(
        &mut self,
        va: u64,
        access: Access,
    ) -> Result<(u64, AdUpdate), SimFault> {
        let fault = |kind| SimFault {
            va: VirtAddr(va),
            write: access.write,
            kind,
        };
        if let Some(hit) = self.tlb_lookup::<A>(va, access) {
            return hit.map(|pa| (pa, AdUpdate::default())).map_err(fault);
        }
        self.stats.tlb_misses += 1;
        loop {
            let leaf = self.walk::<A>(va).map_err(fault)?;
            let h = leaf.height;
            // The leaf's rights, then those of every table above it
            // (hierarchical permissions): a fault leaves the entry as it is.
            let new = A::hw_access(leaf.raw, h, access)
                .and_then(|n| leaf.limits.check(access).map(|()| n))
                .map_err(|f| fault(SimFaultKind::Permission(f)))?;
            if new != leaf.raw && self.software_ad {
                // Svade: the page fault the kernel answers by setting A/D.
                return Err(fault(SimFaultKind::Permission(AccessFault::AccessFlag)));
            }
            let mut upd = AdUpdate::default();
            if new != leaf.raw && !leaf.stale {
                // The entry that records the update: the one walked, or
                // the first of its folded run.
                let (slot, old, set) = self
                    .run_ad_target::<A>(va, &leaf, access)
                    .unwrap_or((leaf.slot, leaf.raw, new));
                // Relaxed: hardware A/D updates are atomic read-modify-writes
                // of the entry; only atomicity matters against software.
                if slot.compare_exchange(old, set, Relaxed, Relaxed).is_err() {
                    self.stats.ad_retries += 1;
                    continue;
                }
                upd.accessed = A::is_young(set) && !A::is_young(old);
                upd.dirty = A::is_dirty(set) && !A::is_dirty(old);
                self.stats.accessed_set += u64::from(upd.accessed);
                self.stats.dirty_set += u64::from(upd.dirty);
            }
            self.fill_leaf::<A>(va, &leaf, new).map_err(fault)?;
            let Some(pa) = leaf_pa::<A>(new, h, leaf.index) else {
                unreachable!("hw_access keeps a leaf a leaf")
            };
            return Ok((pa.0 + (va & (size::<A>(h) - 1)), upd));
        }
    }

    /// The TLB lookup of [`access`](Self::access): the entry that served
    /// the last access, then every leaf size, smallest first. `Some`: the
    /// cached entry decides (the output address, or the permission
    /// fault); `None`: a miss, or an accessed/dirty update is due, which
    /// the hardware makes by walking the tables again (as x86 does for a
    /// store through a clean cached entry).
    fn tlb_lookup<A: Arch>(
        &mut self,
        va: u64,
        access: Access,
    ) -> Option<Result<u64, SimFaultKind>> {
        let asid = self.cpu.asid;
        let mru = self
            .cpu
            .mru
            .filter(|&(b, h, _, tag)| {
                va & !(key_span::<A>(h) - 1) == b && (tag == asid || tag == GLOBAL)
            })
            .map(|k| (k.1, k.3));
        let tags = [asid, GLOBAL];
        let all = leaf_keys::<A>().flat_map(|h| tags.map(|t| (h, t)));
        for (kh, tag) in mru.into_iter().chain(all) {
            let base = va & !(key_span::<A>(kh) - 1);
            let Some(c) = self.cpu.tlb.get(&(base, kh, true, tag)).copied() else {
                continue;
            };
            let h = kh & !CONT_KEY;
            self.cpu.mru = Some((base, kh, true, tag));
            match A::hw_access(c.raw, h, access).and_then(|n| c.limits.check(access).map(|()| n)) {
                Err(f) => {
                    self.stats.tlb_hits += 1;
                    return Some(Err(SimFaultKind::Permission(f)));
                }
                // Nothing to update: the cached entry serves the access.
                Ok(new) if new == c.raw => {
                    self.stats.tlb_hits += 1;
                    let Decoded::Leaf(pa) = A::decode(c.raw, h) else {
                        unreachable!("only leaves are cached as leaves")
                    };
                    return Some(Ok(pa.0 + (va - base)));
                }
                Ok(_) => return None,
            }
        }
        None
    }

    /// Caches the leaf `leaf` walked for `va`, whose value is now `new`
    /// (after the walker's accessed/dirty update): one entry for the
    /// page or block, or one for its whole folded run.
    fn fill_leaf<A: Arch>(
        &mut self,
        va: u64,
        leaf: &Leaf<'static>,
        new: u64,
    ) -> Result<(), SimFaultKind> {
        let h = leaf.height;
        let tag = if A::leaf_prot(new, h).global() {
            GLOBAL
        } else {
            self.cpu.asid
        };
        let root = self.root_for::<A>(va)?;
        let run = if A::is_cont(new, h) {
            self.run_of::<A>(va, h, new, leaf.table)
        } else {
            None
        };
        match run {
            // One entry for the whole folded run (Arm ARM D8.6.1),
            // holding the run's first output address.
            Some((first, base_pa)) => {
                let n = A::cont_entries(h);
                let span = u64::from(n) * size::<A>(h);
                let Decoded::Leaf(pa) = A::decode(new, h) else {
                    unreachable!("hw_access keeps a leaf a leaf")
                };
                let raw = new - ((pa.0 - base_pa) >> A::OA_SHIFT);
                let key = (va & !(span - 1), h | CONT_KEY, true, tag);
                self.cache(key, Cached::new(raw, first, root, leaf.limits, n));
            }
            None => {
                let key = (va & !(size::<A>(h) - 1), h, true, tag);
                self.cache(key, Cached::new(new, leaf.slot, root, leaf.limits, 1));
            }
        }
        Ok(())
    }

    // ----- maintenance -----

    pub(super) fn entry_written<A: Arch>(&mut self, slot: &Slot, old: u64) {
        self.stats.entries_written += 1;
        // Relaxed: the value this thread just wrote (or a later one).
        let new = slot.load(Relaxed);
        let addr = slot as *const Slot as u64;
        if self.contig.is_none() && new != 0 && (0..A::LEVELS).any(|h| A::cont_entries(h) != 0) {
            self.check_cached_run::<A>(addr);
        }
        if A::BREAK_BEFORE_MAKE && new != 0 && self.conflict.is_none() {
            self.check_bbm::<A>(addr, new);
        }
        if self.unordered.is_none() {
            self.check_link::<A>(addr, new);
        }
        if self.mixed.is_none() {
            self.check_mixed::<A>(addr, new);
        }
        self.last_write.insert(addr & !0xfff, self.epoch);
        // A write between two values the walker cannot use (empty,
        // software or `Prot::NONE` entries) needs no barrier: whichever it
        // reads, it faults, and no TLB holds either (Linux arm64
        // `__set_pte` issues none for an entry that is not valid).
        let walker_cares =
            self.pending.contains_key(&addr) || walker_valid::<A>(old) || walker_valid::<A>(new);
        if A::NEEDS_WALKER_BARRIER && walker_cares && !self.visible_at_once::<A>(addr, old, new) {
            // The walker keeps seeing the oldest value not yet ordered.
            self.pending
                .entry(slot as *const Slot as u64)
                .and_modify(|e| e.1 = new)
                .or_insert((old, new));
        }
    }

    /// Break-before-make: `new` was written to the entry at `addr` while
    /// the TLB may hold a translation read from it that the arch does not
    /// allow to coexist with `new` (Arm ARM D8.16; [`Arch::change_is_safe`]).
    fn check_bbm<A: Arch>(&mut self, addr: u64, new: u64) {
        for i in 0..self.parked.len() {
            let cpu = self.cpu_ref(i);
            let Some(keys) = cpu.by_slot.get(&addr) else {
                continue;
            };
            for k in keys {
                let Some(c) = cpu.tlb.get(k) else { continue };
                let h = k.1 & !CONT_KEY;
                // The cached value of this entry: a run's entry maps its
                // part of the run (leaves are linear in the address).
                if !c.read_from(addr) {
                    continue;
                }
                let cached = c.raw + (addr - c.slot) / 8 * size::<A>(h);
                if !A::change_is_safe(cached, new, h) {
                    self.conflict = Some(BbmConflict {
                        cpu: i,
                        va: VirtAddr(k.0),
                        height: h,
                        cached,
                        new,
                    });
                    return;
                }
            }
        }
    }

    /// The entry at `addr` was written: if some CPU's TLB holds a folded
    /// run read from it, the run's entries must still agree as the rules
    /// for a cached run ask (see [`ContConflict`]): every entry the walker can
    /// use (not `0`, a software or a `Prot::NONE` entry) a leaf with the hint, mapping its part of the cached run's
    /// output range, with its memory type. Permissions may differ until
    /// the flush (Arm ARM rule RJQQTC).
    fn check_cached_run<A: Arch>(&mut self, addr: u64) {
        for i in 0..self.parked.len() {
            let cpu = self.cpu_ref(i);
            let Some(keys) = cpu.by_slot.get(&addr) else {
                continue;
            };
            for k in keys {
                let Some(c) = cpu.tlb.get(k) else { continue };
                if k.1 & CONT_KEY == 0 || !c.read_from(addr) {
                    continue;
                }
                let h = k.1 & !CONT_KEY;
                let Decoded::Leaf(base_pa) = A::decode(c.raw, h) else {
                    continue;
                };
                let mem = A::leaf_prot(c.raw, h).mem();
                let step = size::<A>(h);
                if !self.readable(c.slot & !0xfff) {
                    continue;
                }
                for j in 0..c.nslots {
                    // SAFETY: the run was filled from `nslots` adjacent
                    // entries of one table frame from `c.slot` on, and
                    // that frame is readable (checked above: an arena
                    // frame, valid for the life of the state, or a live
                    // adopted one); entries are atomics.
                    let e: &Slot = unsafe { &*((c.slot + 8 * u64::from(j)) as *const Slot) };
                    // Relaxed: see `walker_read`; what is programmed now.
                    let r = e.load(Relaxed);
                    let at = PhysAddr(base_pa.0 + u64::from(j) * step);
                    // The entry's index in its table, from its address.
                    let ix = ((c.slot + 8 * u64::from(j)) & 0xfff) as usize / 8;
                    // An entry the walker cannot use (empty, software or
                    // `Prot::NONE`: not valid for the hardware) is
                    // ignored by it, whatever its other bits.
                    let ok = !walker_valid::<A>(r)
                        || (leaf_pa::<A>(r, h, ix) == Some(at)
                            && A::is_cont(r, h)
                            && (run_mem_may_differ::<A>() || A::leaf_prot(r, h).mem() == mem));
                    if !ok {
                        self.contig = Some(ContConflict {
                            va: VirtAddr(k.0),
                            height: h,
                            index: j,
                            raw: r,
                            at_fill: false,
                            cached_on: Some(i),
                        });
                        return;
                    }
                }
            }
        }
    }

    /// Mixed page sizes ([`MixedSizes`]): `new`, written to the entry at
    /// `addr`, replaces a block some TLB still holds by a table (whose
    /// entries must then agree with the block), or is an entry of such a
    /// table (which must agree too, or is a table whose entries must).
    fn check_mixed<A: Arch>(&mut self, addr: u64, new: u64) {
        let mut recs = Vec::new();
        for i in 0..self.parked.len() {
            let cpu = self.cpu_ref(i);
            let Some(keys) = cpu.by_slot.get(&addr) else {
                continue;
            };
            for &k in keys {
                let (base, h, leaf, _) = k;
                let held = cpu.tlb.get(&k).is_some_and(|c| c.slot == addr);
                if !leaf || h & CONT_KEY != 0 || h == 0 || !held {
                    continue;
                }
                if let Decoded::Table(t) = A::decode(new, h) {
                    let rec = SplitRec {
                        cpu: i,
                        key: k,
                        slot: addr,
                        height: h - 1,
                        va: base,
                    };
                    recs.push((t, rec));
                }
            }
        }
        if let Some(under) = self.split_under.get(&(addr & !0xfff)) {
            let i = (addr & 0xfff) / 8;
            for rec in under.clone() {
                let va = rec.va + i * size::<A>(rec.height);
                match A::decode(new, rec.height) {
                    Decoded::Table(t) if rec.height > 0 => recs.push((
                        t,
                        SplitRec {
                            height: rec.height - 1,
                            va,
                            ..rec
                        },
                    )),
                    Decoded::Leaf(_) => self.agree::<A>(rec, va, new),
                    _ => {}
                }
            }
        }
        for (t, rec) in recs {
            let Some(host) = self.host_of(t) else {
                continue;
            };
            // The entries the table was filled with before it was linked.
            let Ok(table) = self.table(t) else { continue };
            let leaves: Vec<(u64, u64)> = (0..512u64)
                .filter_map(|j| {
                    // Relaxed: see `walker_read`.
                    let raw = table[j as usize].load(Relaxed);
                    let va = rec.va + j * size::<A>(rec.height);
                    matches!(A::decode(raw, rec.height), Decoded::Leaf(_)).then_some((va, raw))
                })
                .collect();
            for (va, raw) in leaves {
                self.agree::<A>(rec, va, raw);
            }
            self.split_under.entry(host).or_default().push(rec);
        }
    }

    /// Records a [`MixedSizes`] if the leaf `raw` for `va` under the block
    /// of `rec` disagrees with the block while that is still cached.
    fn agree<A: Arch>(&mut self, rec: SplitRec, va: u64, raw: u64) {
        if self.mixed.is_some() {
            return;
        }
        let Some(c) = self.cpu_ref(rec.cpu).tlb.get(&rec.key) else {
            return;
        };
        let bh = rec.key.1;
        let (Some(pa), Decoded::Leaf(bpa)) = (
            leaf_pa::<A>(raw, rec.height, hw_index::<A>(va, rec.height)),
            A::decode(c.raw, bh),
        ) else {
            return;
        };
        let same = pa.0 == bpa.0 + (va - rec.key.0)
            && A::leaf_prot(raw, rec.height) == A::leaf_prot(c.raw, bh);
        if c.slot == rec.slot && !same {
            self.mixed = Some(MixedSizes {
                cpu: rec.cpu,
                va: VirtAddr(va),
                height: rec.height,
                new: raw,
                block_height: bh,
                cached: c.raw,
            });
        }
    }

    /// Forgets the split tables whose blocks no TLB holds any more.
    pub(super) fn prune_splits(&mut self) {
        if self.split_under.is_empty() {
            return;
        }
        let mut under = std::mem::take(&mut self.split_under);
        under.retain(|_, recs| {
            recs.retain(|r| {
                self.cpu_ref(r.cpu)
                    .tlb
                    .get(&r.key)
                    .is_some_and(|c| c.slot == r.slot)
            });
            !recs.is_empty()
        });
        self.split_under = under;
    }

    /// Publication order: `new`, written to the entry at `addr`, links a
    /// table whose contents (its zeroing or an entry) were written since
    /// the last publish point, so a walker may follow the link into stale
    /// contents (Linux orders them with `smp_wmb()` before `pmd_populate`).
    fn check_link<A: Arch>(&mut self, addr: u64, new: u64) {
        for h in 1..A::LEVELS {
            if let Decoded::Table(c) = A::decode(new, h) {
                let host = self.host_of(c);
                if host.is_some_and(|h| self.last_write.get(&h) == Some(&self.epoch)) {
                    self.unordered = Some(UnorderedLink {
                        slot: addr,
                        table: c,
                    });
                    return;
                }
            }
        }
    }

    /// A publish point (Linux `smp_wmb()`): writes before it are seen by
    /// any walker before writes after it.
    pub(super) fn publish(&mut self) {
        self.epoch += 1;
    }

    pub(super) fn barrier(&mut self) {
        self.stats.barriers += 1;
        self.epoch += 1;
        self.pending.clear();
    }

    /// The CPUs a flush executed on `cpu` reaches: all of them for a
    /// broadcast (arm64 `tlbi …is`), `cpu` alone otherwise.
    fn reach(&self, cpu: usize, broadcast: bool) -> std::ops::Range<usize> {
        if broadcast {
            0..self.parked.len()
        } else {
            cpu..cpu + 1
        }
    }

    /// A flush orders the table writes before it (mmu.rs rules).
    fn flush_orders(&mut self) {
        self.pending.clear();
        self.epoch += 1;
    }

    /// A range flush executed on `cpu` by an MMU whose ASID is `asid`:
    /// global leaves in the range go too, whatever the ASID (x86 `invlpg`,
    /// arm64 `tlbi vae1is`).
    pub(super) fn flush_range<A: Arch>(
        &mut self,
        r: TlbRange,
        asid: u32,
        cpu: usize,
        broadcast: bool,
    ) {
        self.stats.flush_range += 1;
        self.flush_orders();
        let start = r.start.0;
        let last = r.end.0.wrapping_sub(1);
        for i in self.reach(cpu, broadcast) {
            self.select(i);
            let n = self.drop_where(|&(base, h, leaf, tag)| {
                let elast = base + (key_span::<A>(h) - 1);
                let overlaps = base <= last && elast >= start;
                overlaps && (leaf || !r.last_level) && (tag == asid || tag == GLOBAL)
            });
            self.stats.tlb_entries_flushed += n as u64;
        }
        self.prune_splits();
    }

    /// A flush of the address space tagged `asid`, executed on `cpu`:
    /// global leaves stay (x86 MOV to CR3, arm64 `tlbi aside1is`).
    pub(super) fn flush_mm(&mut self, asid: u32, cpu: usize, broadcast: bool) {
        self.stats.flush_all += 1;
        self.flush_orders();
        for i in self.reach(cpu, broadcast) {
            self.select(i);
            let n = self.drop_where(|k| k.3 == asid);
            self.stats.tlb_entries_flushed += n as u64;
            self.cpu.owed.remove(&asid);
        }
        self.prune_splits();
    }

    /// A flush of everything, executed on `cpu`.
    pub(super) fn flush_all(&mut self, cpu: usize, broadcast: bool) {
        self.stats.flush_all += 1;
        self.flush_orders();
        for i in self.reach(cpu, broadcast) {
            self.select(i);
            self.stats.tlb_entries_flushed += self.cpu.tlb.len() as u64;
            self.cpu.tlb.clear();
            self.cpu.by_slot.clear();
            self.cpu.fifo.clear();
            self.cpu.mru = None;
            self.cpu.owed.clear();
        }
        self.prune_splits();
    }

    /// Every CPU's cached entries against a fresh walk of memory (see
    /// [`check_cpu`](Self::check_cpu)); the lowest-numbered CPU with a
    /// stale entry is reported.
    pub(super) fn check_tlb<A: Arch>(&self) -> Result<(), StaleTlb> {
        (0..self.parked.len()).try_for_each(|i| self.check_cpu::<A>(i))
    }

    /// Every cached entry of CPU `i` against a fresh walk of memory. Of
    /// several stale entries, the smallest leaf at the lowest address is
    /// reported (a deterministic answer whatever the map's order).
    ///
    /// An entry of the CPU's current ASID is walked from its current root,
    /// since that is what the hardware uses it for, whichever root filled
    /// it: an ASID reused for another address space without a flush leaves
    /// the old space's entries serving the new one. Entries of other ASIDs
    /// (and global ones) are walked from the root that filled them.
    pub(super) fn check_cpu<A: Arch>(&self, i: usize) -> Result<(), StaleTlb> {
        self.check_cpu_tags::<A>(i, |_| true)
    }

    /// A tagged root was just installed on the selected CPU: its ASID's
    /// cached entries are usable from now on, so any of them that is stale
    /// is recorded for [`check`](Self::check) even if a flush removes it
    /// right after (the window Linux `switch_mm_irqs_off` closes by
    /// loading CR3 without the no-flush bit when a flush is owed).
    pub(super) fn check_switch<A: Arch>(&mut self) {
        if self.switched_stale.is_some() {
            return;
        }
        let asid = self.cpu.asid;
        if let Err(s) = self.check_cpu_tags::<A>(self.sel, |t| t == asid) {
            self.switched_stale = Some(s);
        }
    }

    /// [`check_cpu`](Self::check_cpu) for the entries whose tag `want`
    /// accepts.
    fn check_cpu_tags<A: Arch>(
        &self,
        i: usize,
        want: impl Fn(u32) -> bool,
    ) -> Result<(), StaleTlb> {
        let cpu = self.cpu_ref(i);
        let mut worst: Option<StaleTlb> = None;
        for (&(base, h, leaf, tag), c) in &cpu.tlb {
            if cpu.owed.contains(&tag) || !want(tag) {
                continue;
            }
            // The current ASID's entries are checked against the root
            // that translates them now (an ASID reused without a flush
            // shows up as stale); other entries against the root they
            // were filled from.
            let root = match cpu.root_for::<A>(base) {
                Ok(r) if tag == cpu.asid => r,
                _ => c.root,
            };
            if h & CONT_KEY != 0 {
                if let Err(s) = self.check_run::<A>(i, root, base, h & !CONT_KEY, c) {
                    let rank = |s: &StaleTlb| (!s.leaf, s.height, s.va.0);
                    if worst.as_ref().is_none_or(|w| rank(&s) < rank(w)) {
                        worst = Some(s);
                    }
                }
                continue;
            }
            let fresh = self.fresh::<A>(root, base, h, leaf);
            let ok = match fresh {
                None => false,
                Some((raw, fh)) if leaf => {
                    fh == h
                        && A::decode(raw, h) == A::decode(c.raw, h)
                        && A::leaf_prot(raw, h) == A::leaf_prot(c.raw, h)
                        // A cached dirty state whose entry is clean again
                        // means a store would not set dirty: lost.
                        && (A::is_dirty(raw) || !A::is_dirty(c.raw))
                }
                Some((raw, _)) => A::decode(raw, h) == A::decode(c.raw, h),
            };
            let rank = |s: &StaleTlb| (!s.leaf, s.height, s.va.0);
            if !ok {
                let s = StaleTlb {
                    cpu: i,
                    va: VirtAddr(base),
                    height: h,
                    leaf,
                    cached: c.raw,
                    fresh: fresh.map(|f| f.0),
                };
                if worst.as_ref().is_none_or(|w| rank(&s) < rank(w)) {
                    worst = Some(s);
                }
            }
        }
        worst.map_or(Ok(()), Err)
    }

    /// A cached folded run (CPU `cpu`, from `root`, at `base`, entries at
    /// `h`) against a fresh walk of each of its entries: each must still be
    /// the same leaf with the hint, mapping its part of the run with the
    /// cached rights, and the run must not have become clean while the
    /// cached entry is dirty.
    fn check_run<A: Arch>(
        &self,
        cpu: usize,
        root: PhysAddr,
        base: u64,
        h: u32,
        c: &Cached,
    ) -> Result<(), StaleTlb> {
        let step = size::<A>(h);
        let mut dirty = false;
        let mut first_bad = None;
        // The cached entry holds the run's first output address.
        let Decoded::Leaf(base_pa) = A::decode(c.raw, h) else {
            return Ok(());
        };
        for i in 0..u64::from(A::cont_entries(h)) {
            let va = base + i * step;
            let fresh = self.fresh::<A>(root, va, h, true);
            let want = PhysAddr(base_pa.0 + i * step);
            let ok = match fresh {
                Some((raw, fh)) => {
                    dirty |= A::is_dirty(raw);
                    fh == h
                        && A::is_cont(raw, h)
                        && leaf_pa::<A>(raw, h, hw_index::<A>(va, h)) == Some(want)
                        && A::leaf_prot(raw, h) == A::leaf_prot(c.raw, h)
                }
                None => false,
            };
            if !ok && first_bad.is_none() {
                first_bad = Some((base + i * step, fresh.map(|f| f.0)));
            }
        }
        if first_bad.is_none() && A::is_dirty(c.raw) && !dirty {
            first_bad = Some((base, self.fresh::<A>(root, base, h, true).map(|f| f.0)));
        }
        match first_bad {
            None => Ok(()),
            Some((va, fresh)) => Err(StaleTlb {
                cpu,
                va: VirtAddr(va),
                height: h,
                leaf: true,
                cached: c.raw,
                fresh,
            }),
        }
    }

    /// Every folded contiguous run reachable from an installed root of
    /// any CPU (see [`ContConflict`]), after an operation: all entries
    /// valid leaves with the hint, one aligned contiguous physical range,
    /// equal rights and memory type. Reports a fill-time conflict first.
    pub(super) fn check_contiguous<A: Arch>(&self) -> Result<(), ContConflict> {
        if let Some(c) = self.contig {
            return Err(c);
        }
        if (0..A::LEVELS).all(|h| A::cont_entries(h) == 0) {
            return Ok(());
        }
        let mut roots: Vec<PhysAddr> = Vec::new();
        for i in 0..self.parked.len() {
            let cpu = self.cpu_ref(i);
            for r in [cpu.root, cpu.upper_root].into_iter().flatten() {
                if !roots.contains(&r) {
                    roots.push(r);
                }
            }
        }
        for r in roots {
            self.check_runs_in::<A>(r, A::LEVELS - 1, 0)?;
        }
        Ok(())
    }

    /// [`check_contiguous`](Self::check_contiguous) below the table `tpa`
    /// at height `h`, whose first entry maps `va`.
    fn check_runs_in<A: Arch>(&self, tpa: PhysAddr, h: u32, va: u64) -> Result<(), ContConflict> {
        let Ok(t) = self.table(tpa) else {
            return Ok(());
        };
        let n = A::cont_entries(h) as usize;
        let step = size::<A>(h);
        let mut i = 0;
        while i < t.len() {
            // Relaxed: see `walker_read`.
            let raw = t[i].load(Relaxed);
            if raw == 0 {
                // Nothing to decode (most entries of a test's tables).
                i += 1;
                continue;
            }
            let eva = va.wrapping_add(i as u64 * step);
            match A::decode(raw, h) {
                Decoded::Table(c) if h > 0 => self.check_runs_in::<A>(c, h - 1, eva)?,
                Decoded::Leaf(pa) if n != 0 && A::is_cont(raw, h) => {
                    let first = i & !(n - 1);
                    let run = (n as u64) * step;
                    let pa = A::cont_pa(raw, pa, h, i);
                    let base_pa = pa.0.wrapping_sub((i - first) as u64 * step);
                    let prot = A::leaf_prot(raw, h);
                    for (k, e) in t[first..first + n].iter().enumerate() {
                        // Relaxed: as above.
                        let r = e.load(Relaxed);
                        let ok = base_pa & (run - 1) == 0
                            && leaf_pa::<A>(r, h, first + k)
                                == Some(PhysAddr(base_pa + k as u64 * step))
                            && A::is_cont(r, h)
                            && A::leaf_prot(r, h) == prot;
                        if !ok {
                            return Err(ContConflict {
                                va: VirtAddr(va.wrapping_add(first as u64 * step)),
                                height: h,
                                index: k as u32,
                                raw: r,
                                at_fill: false,
                                cached_on: None,
                            });
                        }
                    }
                    i = first + n;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        Ok(())
    }

    pub(super) fn check_visible(&self) -> Result<(), PendingWrite> {
        // Report the lowest slot for a deterministic message.
        match self.pending.iter().min_by_key(|(&s, _)| s) {
            None => Ok(()),
            Some((&slot, &(old, new))) => Err(PendingWrite { slot, old, new }),
        }
    }

    pub(super) fn check<A: Arch>(&self) -> Result<(), CheckError> {
        self.check_known().map_err(CheckError::UnknownTable)?;
        if let Some(d) = self.decode_mismatch {
            return Err(CheckError::HwDecode(d));
        }
        if let Some(c) = self.conflict {
            return Err(CheckError::Conflict(c));
        }
        if let Some(m) = self.mixed {
            return Err(CheckError::MixedSizes(m));
        }
        if let Some(s) = self.switched_stale {
            return Err(CheckError::Stale(s));
        }
        if let Some(u) = self.unordered {
            return Err(CheckError::Unordered(u));
        }
        self.check_contiguous::<A>()
            .map_err(CheckError::Contiguous)?;
        self.check_tlb::<A>().map_err(CheckError::Stale)?;
        self.check_visible().map_err(CheckError::Pending)
    }
}
