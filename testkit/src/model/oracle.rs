//! What the tables themselves say: snapshots, empty tables, and how many
//! tables an operation needs (its allocation failure points), computed
//! from the tables as they are before the operation.
//!
//! The counts restate the rules the operations document, independently of
//! their code: `map` uses a block exactly where the options and the format
//! allow one and the entry's whole span is inside the range with a
//! block-aligned physical address, and needs one new table for each entry
//! it must descend through that holds nothing; `unmap` and
//! `change_protection` need one table for each block, at every height,
//! that the range covers only in part (after splitting its parent), and
//! `change_protection` only for blocks whose protection changes.
//! Arithmetic is in `u128`, so the top of the 64-bit space needs no care.

use crate::model::geometry::top_vpn;
use std::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::{level, Arch, Decoded, Slot, TableAlloc};
use pgtable_core::sim::{SimAlloc, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr};

/// The address space under test.
pub type Space<A> = AddressSpace<A, SimMmu<A>, SimAlloc>;

/// Every table reachable from the root, depth first: (frame, height,
/// entries; none for a table of zeros, such as a pinned kernel table).
pub type Snapshot = Vec<(u64, u32, Vec<u64>)>;

fn table<A: Arch>(space: &Space<A>, pa: PhysAddr) -> &[Slot] {
    // SAFETY: `pa` is the root or a table reached from it, so a live frame
    // of the space's allocator of `entries::<A>()` entries (the contract of
    // `phys_to_virt`), and the shared borrow of the space keeps every
    // operation (and so every free) away while the slice lives.
    unsafe {
        let first = space.alloc().phys_to_virt(pa).cast::<Slot>();
        core::slice::from_raw_parts(first.as_ptr(), level::entries::<A>())
    }
}

/// Every table's entries reachable through the root entries of the
/// space's range (an x86 user root also links the kernel's tables, which
/// the kernel space's own checks cover).
pub fn snapshot<A: Arch>(space: &Space<A>) -> Snapshot {
    let mut out = Vec::new();
    let root = entries(space, space.root());
    let (first, last) = space.va_range().root_indices::<A>();
    out.push((space.root().0, A::LEVELS - 1, root.clone()));
    for raw in &root[first..=last] {
        if let Decoded::Table(c) = A::decode(*raw, A::LEVELS - 1) {
            snap::<A>(space, c, A::LEVELS - 2, &mut out);
        }
    }
    out
}

/// The entries of the table at `pa`.
fn entries<A: Arch>(space: &Space<A>, pa: PhysAddr) -> Vec<u64> {
    let t = table(space, pa);
    // Relaxed: no operation runs; only the simulated walker, which this
    // test drives from the same thread, writes entries.
    t.iter().map(|e| e.load(Relaxed)).collect()
}

fn snap<A: Arch>(space: &Space<A>, pa: PhysAddr, h: u32, out: &mut Snapshot) {
    let mut entries = entries(space, pa);
    if h > 0 {
        for &raw in &entries {
            if let Decoded::Table(c) = A::decode(raw, h) {
                snap::<A>(space, c, h - 1, out);
            }
        }
    }
    if entries.iter().all(|&e| e == 0) {
        entries = Vec::new();
    }
    out.push((pa.0, h, entries));
}

/// The first entry that differs between two snapshots, described.
pub fn diff(before: &Snapshot, after: &Snapshot) -> Option<String> {
    if before == after {
        return None;
    }
    for (b, a) in before.iter().zip(after) {
        if b.0 != a.0 || b.1 != a.1 {
            return Some(format!(
                "table {:#x} (height {}) became table {:#x} (height {})",
                b.0, b.1, a.0, a.1
            ));
        }
        let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
        if let Some(i) = (0..b.2.len().max(a.2.len())).find(|&i| at(&b.2, i) != at(&a.2, i)) {
            return Some(format!(
                "table {:#x} (height {}) entry {i}: {:#x} -> {:#x}",
                b.0,
                b.1,
                at(&b.2, i),
                at(&a.2, i)
            ));
        }
    }
    (before.len() != after.len()).then(|| {
        format!(
            "{} reachable tables before, {} after",
            before.len(),
            after.len()
        )
    })
}

/// The first non-root table that holds no entry (an operation must free
/// the tables it empties), as (an address it translates, its height).
/// Only under the root entries of the space's range, and not the pinned
/// tables of a shared kernel half (x86: they stay linked when empty).
pub fn empty_table<A: Arch>(space: &Space<A>) -> Option<(u64, u32)> {
    empty_below::<A>(space, space.root(), A::LEVELS - 1, 0)
}

fn empty_below<A: Arch>(space: &Space<A>, pa: PhysAddr, h: u32, va: u64) -> Option<(u64, u32)> {
    if h == 0 {
        return None;
    }
    let top = h == A::LEVELS - 1;
    let (first, last) = space.va_range().root_indices::<A>();
    let pinned = top && space.inspect().is_kernel_half_shared() && !A::SEPARATE_HALVES;
    for (i, raw) in entries(space, pa).into_iter().enumerate() {
        if top && (i < first || i > last) {
            continue;
        }
        if let Decoded::Table(c) = A::decode(raw, h) {
            let mut cva = va | ((i as u64) << level::shift::<A>(h));
            if h == A::LEVELS - 1 && i >= level::top_entries::<A>() / 2 {
                // Sign-extend: the upper half.
                cva |= !0u64 << (A::VA_BITS - 1);
            }
            if !pinned && entries(space, c).iter().all(|&e| e == 0) {
                return Some((cva, h - 1));
            }
            if let Some(hit) = empty_below::<A>(space, c, h - 1, cva) {
                return Some(hit);
            }
        }
    }
    None
}

/// The software entries ([`Format::swp_value`]) of the PTEs in pages
/// `[s, e)` (one canonical half), as (page number, value); also any other
/// non-zero PTE that is no leaf, with value `u64::MAX`, so that a stray
/// value shows.
///
/// [`Format::swp_value`]: pgtable_core::contract::Format::swp_value
pub fn swap_entries<A: Arch>(space: &Space<A>, s: u64, e: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (s, e) = (
        u128::from(s) << A::PAGE_SHIFT,
        u128::from(e) << A::PAGE_SHIFT,
    );
    swp_walk::<A>(space, space.root(), A::LEVELS - 1, s, e, &mut out);
    out
}

fn swp_walk<A: Arch>(
    space: &Space<A>,
    pa: PhysAddr,
    h: u32,
    mut va: u128,
    end: u128,
    out: &mut Vec<(u64, u64)>,
) {
    let t = table(space, pa);
    while va < end {
        let n = next::<A>(va, h, end);
        // Relaxed: no operation runs; only the simulated walker, which this
        // test drives from the same thread, writes entries.
        let raw = t[index::<A>(va, h)].load(Relaxed);
        match A::decode(raw, h) {
            Decoded::Table(c) if h > 0 => swp_walk::<A>(space, c, h - 1, va, n, out),
            Decoded::Invalid => {
                let v = if h == 0 { A::swp_value(raw) } else { None };
                out.push((
                    (va >> A::PAGE_SHIFT) as u64 & (top_vpn::<A>() - 1),
                    v.unwrap_or(u64::MAX),
                ));
            }
            _ => {}
        }
        va = n;
    }
}

fn size<A: Arch>(h: u32) -> u128 {
    u128::from(level::size::<A>(h))
}

fn index<A: Arch>(va: u128, h: u32) -> usize {
    level::index::<A>(va as u64, h)
}

/// The end of the entry at height `h` holding `va`, clamped to `end`.
fn next<A: Arch>(va: u128, h: u32, end: u128) -> u128 {
    ((va / size::<A>(h) + 1) * size::<A>(h)).min(end)
}

/// Tables and leaves a map needs.
#[derive(Clone, Copy, Default, Debug)]
pub struct MapNeed {
    /// New tables.
    pub tables: u64,
    /// Leaf entries written.
    pub leaves: u64,
    /// The range meets an entry a map cannot go through or replace (a
    /// leaf, or a table where a block goes).
    pub blocked: bool,
}

/// What mapping `[va, va + len)` to `pa` with `opts` needs; stops counting
/// leaves past `budget`.
pub fn map_need<A: Arch>(
    space: &Space<A>,
    va: u64,
    len: u64,
    pa: u64,
    opts: MapOptions,
    budget: u64,
) -> MapNeed {
    let mut walk = MapWalk {
        space,
        opts,
        budget,
        need: MapNeed::default(),
    };
    let (va, end) = (u128::from(va), u128::from(va) + u128::from(len));
    walk.walk(A::LEVELS - 1, Some(space.root()), va, end, u128::from(pa));
    walk.need
}

/// `map_need`'s walk: the space and options it counts for, the leaf
/// budget, and the count so far.
struct MapWalk<'s, A: Arch> {
    space: &'s Space<A>,
    opts: MapOptions,
    budget: u64,
    need: MapNeed,
}

impl<A: Arch> MapWalk<'_, A> {
    /// Counts mapping `[va, end)` to `pa` below the table `tpa` at `h`
    /// (`None`: a table the map creates).
    fn walk(&mut self, h: u32, tpa: Option<PhysAddr>, va: u128, end: u128, pa: u128) {
        if h == 0 {
            self.need.leaves += ((end - va) / size::<A>(0)) as u64;
            return;
        }
        let t = tpa.map(|t| table(self.space, t));
        let mut v = va;
        while v < end && self.need.leaves <= self.budget {
            let n = next::<A>(v, h, end);
            let p = pa + (v - va);
            let whole = v % size::<A>(h) == 0 && n - v == size::<A>(h);
            // Relaxed: no operation runs; only the simulated walker, which this
            // test drives from the same thread, writes entries.
            let raw = t.map_or(0, |t| t[index::<A>(v, h)].load(Relaxed));
            if self.opts.allows(h) && A::leaf_allowed(h) && whole && p % size::<A>(h) == 0 {
                self.need.leaves += 1;
                self.need.blocked |= raw != 0;
            } else {
                match A::decode(raw, h) {
                    Decoded::None => {
                        self.need.tables += 1;
                        self.walk(h - 1, None, v, n, p);
                    }
                    Decoded::Table(c) => self.walk(h - 1, Some(c), v, n, p),
                    Decoded::Leaf(_) | Decoded::Invalid => self.need.blocked = true,
                }
            }
            v = n;
        }
    }
}

/// Tables that splitting the blocks `[va, va + len)` covers in part needs,
/// counting only blocks for which `split(raw, height)` holds.
pub fn split_need<A: Arch>(
    space: &Space<A>,
    va: u64,
    len: u64,
    split: &dyn Fn(u64, u32) -> bool,
) -> u64 {
    let (va, end) = (u128::from(va), u128::from(va) + u128::from(len));
    split_walk::<A>(space, A::LEVELS - 1, space.root(), va, end, split)
}

fn split_walk<A: Arch>(
    space: &Space<A>,
    h: u32,
    tpa: PhysAddr,
    va: u128,
    end: u128,
    split: &dyn Fn(u64, u32) -> bool,
) -> u64 {
    let t = table(space, tpa);
    let mut need = 0;
    let mut v = va;
    while v < end {
        let n = next::<A>(v, h, end);
        let whole = v % size::<A>(h) == 0 && n - v == size::<A>(h);
        // Relaxed: no operation runs; only the simulated walker, which this
        // test drives from the same thread, writes entries.
        let raw = t[index::<A>(v, h)].load(Relaxed);
        match A::decode(raw, h) {
            Decoded::Table(c) if h > 1 => need += split_walk::<A>(space, h - 1, c, v, n, split),
            Decoded::Leaf(_) if h > 0 && !whole && split(raw, h) => {
                need += block_need::<A>(h, v, n)
            }
            _ => {}
        }
        v = n;
    }
    need
}

/// Tables to split a block at height `h` around `[va, end)`, children
/// covered in part included.
fn block_need<A: Arch>(h: u32, va: u128, end: u128) -> u64 {
    let mut need = 1;
    if h > 1 {
        let mut v = va;
        while v < end {
            let n = next::<A>(v, h - 1, end);
            if !(v % size::<A>(h - 1) == 0 && n - v == size::<A>(h - 1)) {
                need += block_need::<A>(h - 1, v, n);
            }
            v = n;
        }
    }
    need
}
