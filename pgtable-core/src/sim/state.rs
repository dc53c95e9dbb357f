//! The machine state behind the handles: memory, table frames, the TLB
//! with its walk cache, pending (not yet visible) table writes, and the
//! table walker.

use std::boxed::Box;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;

use super::{AdUpdate, CheckError, PendingWrite, SimFault, SimFaultKind, SimStats, StaleTlb};
use crate::level::{index, size};
use crate::{Access, Arch, Arena, Decoded, PhysAddr, Slot, Table, TableAlloc, TlbRange, VirtAddr};

/// One cached translation: a leaf (TLB proper) or a table entry (walk
/// cache).
#[derive(Clone, Copy, Debug)]
pub(super) struct Cached {
    /// The entry as the walker read it (after its own A/D update).
    pub(super) raw: u64,
}

/// A small, fast, deterministic hasher for the simulator's maps (keys are
/// addresses; no hash-flooding concern in a test model).
#[derive(Default)]
pub(super) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
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
/// and whether it is a leaf (`true`) or a table entry (`false`).
type Key = (u64, u32, bool);

pub(super) struct State {
    /// Data memory, sparse: page number to contents.
    pub(super) mem: Map<u64, Box<[u8; 4096]>>,
    /// Table frames.
    pub(super) arena: Arena,
    /// Every frame the arena ever handed out: their memory stays valid
    /// until the arena is dropped, so the walker may read them.
    pub(super) frames: Set<u64>,
    /// Frames allocated now.
    pub(super) live: Set<u64>,
    pub(super) root: Option<PhysAddr>,
    pub(super) tlb: Map<Key, Cached>,
    /// Insertion order of `tlb` keys, for FIFO eviction (may hold keys
    /// flushed since; they are skipped).
    fifo: VecDeque<Key>,
    pub(super) tlb_capacity: usize,
    /// Key of the leaf that served the last access (looked up first).
    mru: Option<Key>,
    /// Slot address to the value the walker still sees (arm64 model) and
    /// the latest value written.
    pub(super) pending: Map<u64, (u64, u64)>,
    pub(super) stats: SimStats,
}

/// A leaf found by a walk.
pub(super) struct Leaf<'a> {
    pub(super) raw: u64,
    pub(super) height: u32,
    pub(super) slot: &'a Slot,
    /// The walker saw an older value than memory holds (pending write).
    pub(super) stale: bool,
}

impl State {
    pub(super) fn new() -> State {
        State {
            mem: Map::default(),
            arena: Arena::new(),
            frames: Set::default(),
            live: Set::default(),
            root: None,
            tlb: Map::default(),
            fifo: VecDeque::new(),
            tlb_capacity: 1024,
            mru: None,
            pending: Map::default(),
            stats: SimStats::default(),
        }
    }

    // ----- table frames -----

    pub(super) fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = self.arena.alloc_table()?;
        self.frames.insert(pa.0);
        self.live.insert(pa.0);
        Some(pa)
    }

    /// # Safety
    ///
    /// As [`TableAlloc::free_table`].
    pub(super) unsafe fn free_table(&mut self, pa: PhysAddr) {
        self.live.remove(&pa.0);
        // A frame freed without a flush (an address space being dropped)
        // must not carry pending writes into its next life.
        if !self.pending.is_empty() {
            // SAFETY: our caller passes a frame of ours that is not freed.
            let base = unsafe { self.arena.phys_to_virt(pa) }.as_ptr() as u64;
            self.pending
                .retain(|&slot, _| !(base..base + 4096).contains(&slot));
        }
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

    /// The table frame at `pa`, if `pa` is one (live or freed).
    fn table(&self, pa: PhysAddr) -> Result<&Table, SimFaultKind> {
        if !self.frames.contains(&pa.0) {
            return Err(SimFaultKind::NotATable(pa));
        }
        if !self.live.contains(&pa.0) {
            return Err(SimFaultKind::FreedTable(pa));
        }
        // SAFETY: `pa` is a frame of `self.arena` that is not freed (both
        // checked above), as `phys_to_virt` asks; it stays valid while
        // `self` is borrowed, because freeing it needs `&mut self`; entries
        // are atomics, so shared access is sound.
        Ok(unsafe { self.arena.phys_to_virt(pa).as_ref() })
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
        let root = self.root.ok_or(SimFaultKind::NoRoot)?;
        if !A::va_ok(va) {
            return Err(SimFaultKind::Translation { height: A::LEVELS });
        }
        // Start below the deepest cached table entry.
        let mut h = A::LEVELS - 1;
        let mut tpa = root;
        for k in 1..A::LEVELS {
            if let Some(c) = self.tlb.get(&(va & !(size(k) - 1), k, false)) {
                if let Decoded::Table(pa) = A::decode(c.raw, k) {
                    tpa = pa;
                    h = k - 1;
                    self.stats.walk_cache_hits += 1;
                    break;
                }
            }
        }
        self.stats.walks += 1;
        let mut stale = false;
        loop {
            let t = self.table(tpa)?;
            // SAFETY: table frames stay allocated for the life of the
            // state (see `table`); the 'static lifetime never escapes a
            // method that holds the state's lock (callers use the leaf's
            // slot before releasing it).
            let slot: &'static Slot = unsafe { &*(&t.entries[index(va, h)] as *const Slot) };
            let (raw, st) = self.walker_read::<A>(slot);
            stale |= st;
            match A::decode(raw, h) {
                Decoded::Table(c) if h > 0 => {
                    self.cache(va & !(size(h) - 1), h, false, raw);
                    tpa = c;
                }
                Decoded::Leaf(_) if A::leaf_allowed(h) => {
                    return Ok(Leaf {
                        raw,
                        height: h,
                        slot,
                        stale,
                    })
                }
                _ => return Err(SimFaultKind::Translation { height: h }),
            }
            h -= 1;
        }
    }

    /// The entry at `height` on the path to `va` in memory as it is (no
    /// pending view, no cache): `(raw, height)` of the leaf or of the entry
    /// at `height`, whichever comes first; `None` when the walk ends
    /// earlier.
    fn fresh<A: Arch>(&self, va: u64, height: u32, leaf: bool) -> Option<(u64, u32)> {
        let mut h = A::LEVELS - 1;
        let mut tpa = self.root?;
        loop {
            let t = self.table(tpa).ok()?;
            // Relaxed: see `walker_read`.
            let raw = t.entries[index(va, h)].load(Relaxed);
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

    fn cache(&mut self, base: u64, height: u32, leaf: bool, raw: u64) {
        let key = (base, height, leaf);
        if self.tlb.insert(key, Cached { raw }).is_none() {
            self.fifo.push_back(key);
            self.shrink_to(self.tlb_capacity);
        }
    }

    /// Evicts the oldest entries until at most `n` remain.
    pub(super) fn shrink_to(&mut self, n: usize) {
        while self.tlb.len() > n {
            let Some(k) = self.fifo.pop_front() else {
                break;
            };
            if self.tlb.remove(&k).is_some() {
                self.stats.tlb_evictions += 1;
                if self.mru == Some(k) {
                    self.mru = None;
                }
            }
        }
        // Keys flushed since they were queued pile up: compact.
        if self.fifo.len() > 4 * self.tlb_capacity.max(self.tlb.len()) {
            let tlb = &self.tlb;
            let mut seen = Set::default();
            self.fifo.retain(|k| tlb.contains_key(k) && seen.insert(*k));
        }
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
        // TLB lookup: the entry that served the last access, then every
        // leaf size, smallest first.
        let mru = self
            .mru
            .filter(|&(b, h, _)| va & !(size(h) - 1) == b)
            .map(|(_, h, _)| h);
        for h in mru.into_iter().chain(0..A::LEVELS) {
            let base = va & !(size(h) - 1);
            let Some(c) = self.tlb.get(&(base, h, true)).copied() else {
                continue;
            };
            self.mru = Some((base, h, true));
            match A::hw_access(c.raw, h, access) {
                Err(f) => {
                    self.stats.tlb_hits += 1;
                    return Err(fault(SimFaultKind::Permission(f)));
                }
                // Nothing to update: the cached entry serves the access.
                Ok(new) if new == c.raw => {
                    self.stats.tlb_hits += 1;
                    let Decoded::Leaf(pa) = A::decode(c.raw, h) else {
                        unreachable!("only leaves are cached as leaves")
                    };
                    return Ok((pa.0 + (va - base), AdUpdate::default()));
                }
                // An accessed/dirty update is due: the hardware walks the
                // tables again to make it (as x86 does for a store through
                // a clean cached entry).
                Ok(_) => break,
            }
        }
        self.stats.tlb_misses += 1;
        loop {
            let leaf = self.walk::<A>(va).map_err(fault)?;
            let h = leaf.height;
            let new = A::hw_access(leaf.raw, h, access)
                .map_err(|f| fault(SimFaultKind::Permission(f)))?;
            let mut upd = AdUpdate::default();
            if new != leaf.raw && !leaf.stale {
                // Relaxed: hardware A/D updates are atomic read-modify-writes
                // of the entry; only atomicity matters against software.
                if leaf
                    .slot
                    .compare_exchange(leaf.raw, new, Relaxed, Relaxed)
                    .is_err()
                {
                    self.stats.ad_retries += 1;
                    continue;
                }
                upd.accessed = A::is_young(new) && !A::is_young(leaf.raw);
                upd.dirty = A::is_dirty(new) && !A::is_dirty(leaf.raw);
                self.stats.accessed_set += u64::from(upd.accessed);
                self.stats.dirty_set += u64::from(upd.dirty);
            }
            let base = va & !(size(h) - 1);
            self.cache(base, h, true, new);
            let Decoded::Leaf(pa) = A::decode(new, h) else {
                unreachable!("hw_access keeps a leaf a leaf")
            };
            return Ok((pa.0 + (va - base), upd));
        }
    }

    // ----- maintenance -----

    pub(super) fn entry_written<A: Arch>(&mut self, slot: &Slot, old: u64) {
        self.stats.entries_written += 1;
        if A::NEEDS_WALKER_BARRIER {
            // Relaxed: the value this thread just wrote (or a later one).
            let new = slot.load(Relaxed);
            // The walker keeps seeing the oldest value not yet ordered.
            self.pending
                .entry(slot as *const Slot as u64)
                .and_modify(|e| e.1 = new)
                .or_insert((old, new));
        }
    }

    pub(super) fn barrier(&mut self) {
        self.stats.barriers += 1;
        self.pending.clear();
    }

    pub(super) fn flush_range(&mut self, r: TlbRange) {
        self.stats.flush_range += 1;
        // A flush orders the table writes before it (mmu.rs rules).
        self.pending.clear();
        let start = r.start.0;
        let last = r.end.0.wrapping_sub(1);
        let before = self.tlb.len();
        self.tlb.retain(|&(base, h, leaf), _| {
            let elast = base + (size(h) - 1);
            let overlaps = base <= last && elast >= start;
            !(overlaps && (leaf || !r.last_level))
        });
        self.stats.tlb_entries_flushed += (before - self.tlb.len()) as u64;
    }

    pub(super) fn flush_all(&mut self) {
        self.stats.flush_all += 1;
        self.pending.clear();
        self.stats.tlb_entries_flushed += self.tlb.len() as u64;
        self.tlb.clear();
        self.fifo.clear();
        self.mru = None;
    }

    /// Every cached entry against a fresh walk of memory.
    pub(super) fn check_tlb<A: Arch>(&self) -> Result<(), StaleTlb> {
        for (&(base, h, leaf), c) in &self.tlb {
            let fresh = self.fresh::<A>(base, h, leaf);
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
            if !ok {
                return Err(StaleTlb {
                    va: VirtAddr(base),
                    height: h,
                    leaf,
                    cached: c.raw,
                    fresh: fresh.map(|f| f.0),
                });
            }
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
        self.check_tlb::<A>().map_err(CheckError::Stale)?;
        self.check_visible().map_err(CheckError::Pending)
    }
}
