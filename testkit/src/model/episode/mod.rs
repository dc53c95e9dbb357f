//! One episode's machine, address space and model, and the operations
//! applied to them with the results the model expects.
//!
//! Each step is applied in `step.rs`; `checked.rs` runs one operation
//! with an allocation failure injected and checks its result, its tables
//! and, on error, that nothing changed.

mod checked;
mod step;

use pgtable_core::contract::level;
use pgtable_core::contract::level::page_size;
use std::collections::{BTreeSet, HashMap};
use std::ops::{Deref, DerefMut};

use pgtable_core::contract::Arch;
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{variants, AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};

use super::gen::{Gen, MapKind, Op, Rng};
use super::oracle::{self, Space};
use super::reference::{check_phys, check_range_in, pages, Model, Run};
use super::MAP_BUDGET;

/// The address spaces of an episode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// A space of both halves (`AddressSpace::new`), and a fork child.
    Both,
    /// A space of one half (`new_in`), and a fork child of the same half.
    Lower,
    Upper,
    /// A kernel space (`new_kernel`) and a user space sharing its kernel
    /// half (`new_user`), both installed.
    KernelUser,
}

impl Kind {
    /// The kind of the episode with `seed`.
    pub fn of(seed: u64) -> Kind {
        match Rng::new(seed ^ 0x6b69_6e64).below(100) {
            0..=39 => Kind::Both,
            40..=54 => Kind::Lower,
            55..=69 => Kind::Upper,
            _ => Kind::KernelUser,
        }
    }
}

/// An address space of the episode: installed on the machine, or not (a
/// fork child).
pub enum Sp<A: Arch> {
    Live(Installed<A, SimMmu<A>, SimAlloc>),
    Plain(Space<A>),
}

impl<A: Arch> Deref for Sp<A> {
    type Target = Space<A>;
    fn deref(&self) -> &Space<A> {
        match self {
            Sp::Live(s) => s,
            Sp::Plain(s) => s,
        }
    }
}

impl<A: Arch> DerefMut for Sp<A> {
    fn deref_mut(&mut self) -> &mut Space<A> {
        match self {
            Sp::Live(s) => s,
            Sp::Plain(s) => s,
        }
    }
}

/// One address space and its model.
pub struct Slot<A: Arch> {
    pub(super) space: Sp<A>,
    pub(super) model: Model,
    /// What it translates.
    pub(super) range: VaRange,
    /// Whether loads and stores go through it.
    pub(super) installed: bool,
    /// The kernel space of a [`Kind::KernelUser`] episode (dropped last).
    pub(super) kernel: bool,
    /// Pages at the edges of every range operated on.
    pub(super) touched: BTreeSet<u64>,
}

impl<A: Arch> Slot<A> {
    fn new(space: Sp<A>, installed: bool, kernel: bool) -> Self {
        Slot {
            range: space.va_range(),
            space,
            model: Model::default(),
            installed,
            kernel,
            touched: BTreeSet::new(),
        }
    }
}

/// One machine, its address spaces and the model of both.
pub struct Episode<A: Arch> {
    pub(super) machine: SimMachine<A>,
    /// The space the operations act on.
    pub(super) cur: Slot<A>,
    /// The other one ([`Op::Switch`] exchanges them): the fork child, or
    /// the kernel / user space.
    pub(super) other: Slot<A>,
    /// Values stored through the MMU, by physical address.
    pub(super) phys: HashMap<u64, u64>,
    /// `other.space.inspect().count_tables()` while it holds (only [`Op::Switch`]
    /// and copies change the other space).
    pub(super) other_tables: std::cell::Cell<Option<usize>>,
    /// Whether the other space may have changed since the last full check.
    pub(super) other_changed: std::cell::Cell<bool>,
}

/// What the model expects of one operation: its name (for the tally),
/// its result before any injected allocation failure, and the tables it
/// takes (`None` when only the operation itself can tell).
pub(super) struct Expected {
    pub(super) name: &'static str,
    pub(super) want: Result<(), Error>,
    pub(super) need: Option<u64>,
}

/// The accessed and dirty state of a new leaf mapping `pa` with `prot`.
pub(super) fn fresh<A: Arch>(pa: u64, prot: Prot) -> (bool, bool) {
    let raw = A::leaf(PhysAddr(pa), prot, 0);
    (A::is_young(raw), A::is_dirty(raw))
}

/// The accessed and dirty state of the leaves of `r` once their
/// protection is changed to `prot` ([`Format::modify_prot`] of a leaf
/// in that state).
///
/// [`Format::modify_prot`]: pgtable_core::contract::Format::modify_prot
pub(super) fn reprotect<A: Arch>(r: &Run, prot: Prot) -> (bool, bool) {
    let mut raw = A::leaf(PhysAddr(r.ppn << A::PAGE_SHIFT), r.prot, 0);
    raw = if r.young {
        A::mkyoung(raw, 0)
    } else {
        A::mkold(raw, 0)
    };
    raw = if r.dirty {
        A::mkdirty(raw, 0)
    } else {
        A::mkclean(raw, 0)
    };
    let new = A::modify_prot(raw, prot, 0);
    (A::is_young(new), A::is_dirty(new))
}

/// A new run of `pages` pages from `pa`.
pub(super) fn new_run<A: Arch>(pages: u64, pa: u64, prot: Prot) -> Run {
    let (young, dirty) = fresh::<A>(pa, prot);
    Run {
        pages,
        ppn: pa >> A::PAGE_SHIFT,
        prot: prot.normalized(),
        young,
        dirty,
    }
}

impl<A: Arch> Episode<A> {
    pub(super) fn new(kind: Kind) -> Self {
        let machine = SimMachine::<A>::new();
        let alloc = || machine.alloc();
        let live = |s: Space<A>| {
            // SAFETY: the MMU is a `SimMmu`: only the simulated walker uses
            // these tables.
            Sp::Live(unsafe { Installed::new(s) })
        };
        let half = |r: VaRange| {
            let parent = AddressSpace::new_in(r, machine.mmu_installing_into(r), alloc())
                .expect("root table");
            let child = AddressSpace::new_in(r, machine.mmu_installing_into(r), alloc())
                .expect("root table");
            (live(parent), child)
        };
        let (cur, other) = match kind {
            Kind::Lower | Kind::Upper => {
                let r = if kind == Kind::Lower {
                    VaRange::Lower
                } else {
                    VaRange::Upper
                };
                let (p, c) = half(r);
                (
                    Slot::new(p, true, false),
                    Slot::new(Sp::Plain(c), false, false),
                )
            }
            Kind::KernelUser => {
                match AddressSpace::new_kernel(machine.mmu_installing_into(VaRange::Upper), alloc())
                {
                    Ok(k) => {
                        let k = live(k);
                        // SAFETY: the user space is dropped before the
                        // kernel space (`drop_check`; on a failure both go
                        // with the episode).
                        let u = unsafe {
                            AddressSpace::new_user(
                                &k,
                                machine.mmu_installing_into(VaRange::Lower),
                                alloc(),
                            )
                        }
                        .expect("user root");
                        (Slot::new(live(u), true, false), Slot::new(k, true, true))
                    }
                    // A format whose kernel half cannot be shared (one
                    // root of 3 levels): a space of both halves instead.
                    Err(Error::KernelHalf) => {
                        return Episode::new(Kind::Both);
                    }
                    Err(e) => panic!("new_kernel: {e:?}"),
                }
            }
            Kind::Both => {
                let p = AddressSpace::new(machine.mmu(), alloc()).expect("root table");
                let c = AddressSpace::new(machine.mmu(), alloc()).expect("root table");
                (
                    Slot::new(live(p), true, false),
                    Slot::new(Sp::Plain(c), false, false),
                )
            }
        };
        Episode {
            machine,
            cur,
            other,
            phys: HashMap::new(),
            other_tables: std::cell::Cell::new(None),
            other_changed: std::cell::Cell::new(true),
        }
    }

    /// The range check of the current space.
    pub(super) fn check(&self, va: u64, len: u64) -> Result<(), Error> {
        check_range_in::<A>(self.cur.range, va, len)
    }

    /// Whether the current space translates `va`.
    pub(super) fn contains(&self, va: u64) -> bool {
        self.cur.range.contains::<A>(va)
    }

    /// Adjusts a generated operation before it runs: failure points
    /// spread over every allocation the operation makes, maps kept within
    /// the leaf budget. `None`: draw another one.
    pub(super) fn refine(&self, op: Op, gen: &mut Gen) -> Option<Op> {
        match op {
            Op::Map {
                va, pa, len, fail, ..
            } => {
                if self.check(va, len).and(check_phys::<A>(pa, len)).is_ok() {
                    // Valid input: the map walks its whole range (also to
                    // find a conflict), so keep the range small in entries.
                    let need = self.map_need(&op);
                    if need.leaves > MAP_BUDGET {
                        return None;
                    }
                    if fail.is_some() {
                        return Some(with_fail(op, gen.rng.below(need.tables + 1)));
                    }
                }
                Some(op)
            }
            Op::Unmap { va, len, fail }
            | Op::UnmapWith { va, len, fail }
            | Op::Protect { va, len, fail, .. }
            | Op::Live { va, len, fail, .. } => {
                if fail.is_some() && self.check(va, len).is_ok() {
                    let k = gen.rng.below(self.split_need(&op) + 1);
                    return Some(with_fail(op, k));
                }
                Some(op)
            }
            Op::Move {
                old,
                new,
                len,
                kind,
                ..
            } => {
                if self.move_expected(old, new, len, kind).is_ok() {
                    // A destination at another offset in a PMD turns every
                    // block of the source into pages: keep those few.
                    let (s, e) = pages::<A>(old, len);
                    let splits_all = (new.wrapping_sub(old) >> A::PAGE_SHIFT)
                        % level::entries::<A>() as u64
                        != 0;
                    let pages: u64 = self.cur.model.runs_in(s, e).iter().map(|r| r.1.pages).sum();
                    if splits_all && pages > MAP_BUDGET {
                        return None;
                    }
                }
                Some(op)
            }
            Op::Swap { va, value, fail } => {
                if fail.is_some() && self.swap_expected(va, value).is_ok() {
                    let k = gen.rng.below(self.swap_need(va) + 1);
                    return Some(Op::Swap {
                        va,
                        value,
                        fail: Some(k),
                    });
                }
                Some(op)
            }
            Op::Install { va, pa, fail, .. } => {
                if fail.is_some() && self.install_expected(va, pa).is_ok() {
                    let k = gen.rng.below(self.swap_need(va) + 1);
                    return Some(with_fail(op, k));
                }
                Some(op)
            }
            _ => Some(op),
        }
    }

    /// What `install_pte` must return: the page's range, the physical
    /// page, then whether anything is there.
    pub(super) fn install_expected(&self, va: u64, pa: u64) -> Result<(), Error> {
        self.check(va, page_size::<A>())?;
        check_phys::<A>(pa, page_size::<A>())?;
        match self
            .cur
            .model
            .first_mapped(va >> A::PAGE_SHIFT, (va >> A::PAGE_SHIFT) + 1)
        {
            Some(_) => Err(Error::AlreadyMapped(VirtAddr(va))),
            None => Ok(()),
        }
    }

    /// What `install_pte` of a software entry must return: the page's
    /// range, the value's width, then whether anything (a page or a
    /// software entry) is there.
    fn swap_expected(&self, va: u64, value: u64) -> Result<(), Error> {
        self.check(va, page_size::<A>())?;
        let bits = A::SWP_VALUE_BITS;
        if bits == 0 || (bits < 64 && value >> bits != 0) {
            return Err(Error::SwapValueTooWide(value));
        }
        if self.cur.model.lookup(va >> A::PAGE_SHIFT).is_some()
            || self.cur.model.swp(va >> A::PAGE_SHIFT).is_some()
        {
            return Err(Error::AlreadyMapped(VirtAddr(va)));
        }
        Ok(())
    }

    /// The tables `install_pte` of a software entry at `va` takes: those a
    /// one-page map there would.
    pub(super) fn swap_need(&self, va: u64) -> u64 {
        oracle::map_need::<A>(
            &self.cur.space,
            va,
            page_size::<A>(),
            0,
            MapOptions::PAGES,
            1,
        )
        .tables
    }

    /// A load or store near what `op` worked on, or of a mapped page.
    pub(super) fn touch_op(&self, op: &Op, gen: &mut Gen) -> Op {
        let page = if !self.cur.model.is_empty() && gen.rng.chance(70) {
            let hint = gen.va(&self.cur.model, 0) >> A::PAGE_SHIFT;
            self.cur
                .model
                .random_page(&mut gen.rng, hint)
                .expect("not empty")
                << A::PAGE_SHIFT
        } else {
            let base = match *op {
                Op::Map { va, .. }
                | Op::Unmap { va, .. }
                | Op::Protect { va, .. }
                | Op::Touch { va, .. }
                | Op::Swap { va, .. }
                | Op::Replace { va, .. }
                | Op::UnmapWith { va, .. }
                | Op::ClearRefs { va, .. }
                | Op::Young { va }
                | Op::Get { va }
                | Op::Fault { va, .. }
                | Op::Install { va, .. }
                | Op::Copy { va, .. }
                | Op::Live { va, .. } => va,
                Op::Move { old, new, .. } => {
                    if gen.rng.chance(50) {
                        old
                    } else {
                        new
                    }
                }
                Op::Gather { steps, .. } => steps[0].range().0,
                Op::Switch => gen.va(&self.cur.model, 0),
            };
            (base & !(page_size::<A>() - 1)).wrapping_add(gen.rng.below(4) << A::PAGE_SHIFT)
        };
        let va = page + gen.rng.below(page_size::<A>() / 8) * 8;
        let write = gen.rng.chance(40).then(|| gen.rng.next());
        Op::Touch { va, write }
    }

    fn map_expected(&self, va: u64, pa: u64, len: u64) -> Result<(), Error> {
        self.check(va, len)?;
        check_phys::<A>(pa, len)?;
        let (s, e) = pages::<A>(va, len);
        match self.cur.model.first_mapped(s, e) {
            Some(p) => Err(Error::AlreadyMapped(VirtAddr(p << A::PAGE_SHIFT))),
            None => Ok(()),
        }
    }

    fn map_need(&self, op: &Op) -> oracle::MapNeed {
        let Op::Map {
            va,
            pa,
            len,
            kind,
            barrier_per_entry,
            no_cont,
            ..
        } = *op
        else {
            unreachable!()
        };
        let opts = map_options(kind, barrier_per_entry, no_cont);
        oracle::map_need::<A>(&self.cur.space, va, len, pa, opts, MAP_BUDGET)
    }

    pub(super) fn split_need(&self, op: &Op) -> u64 {
        match *op {
            Op::Unmap { va, len, .. } | Op::UnmapWith { va, len, .. } => {
                oracle::split_need::<A>(&self.cur.space, va, len, &|_, _| true)
            }
            Op::Protect { va, len, prot, .. } | Op::Live { va, len, prot, .. } => {
                oracle::split_need::<A>(&self.cur.space, va, len, &|raw, h| {
                    A::leaf_prot(raw, h) != prot.normalized()
                })
            }
            _ => unreachable!(),
        }
    }
}

fn with_fail(op: Op, k: u64) -> Op {
    match op {
        Op::Map {
            va,
            pa,
            len,
            prot,
            kind,
            barrier_per_entry,
            no_cont,
            ..
        } => Op::Map {
            va,
            pa,
            len,
            prot,
            kind,
            barrier_per_entry,
            no_cont,
            fail: Some(k),
        },
        Op::UnmapWith { va, len, .. } => Op::UnmapWith {
            va,
            len,
            fail: Some(k),
        },
        Op::Install { va, pa, prot, .. } => Op::Install {
            va,
            pa,
            prot,
            fail: Some(k),
        },
        Op::Live {
            va, len, prot, bbm, ..
        } => Op::Live {
            va,
            len,
            prot,
            bbm,
            fail: Some(k),
        },
        Op::Unmap { va, len, .. } => Op::Unmap {
            va,
            len,
            fail: Some(k),
        },
        Op::Protect { va, len, prot, .. } => Op::Protect {
            va,
            len,
            prot,
            fail: Some(k),
        },
        Op::Move {
            old,
            new,
            len,
            kind,
            ..
        } => Op::Move {
            old,
            new,
            len,
            kind,
            fail: Some(k),
        },
        Op::Swap { va, value, .. } => Op::Swap {
            va,
            value,
            fail: Some(k),
        },
        t => t,
    }
}

fn map_options(kind: MapKind, barrier_per_entry: bool, no_cont: bool) -> MapOptions {
    let o = match kind {
        MapKind::Pages => MapOptions::PAGES,
        MapKind::PmdBlocks => MapOptions::PMD_BLOCKS,
        MapKind::Blocks => MapOptions::BLOCKS,
    };
    let o = if no_cont { o.no_contiguous() } else { o };
    if barrier_per_entry {
        variants::barrier_per_entry(o)
    } else {
        o
    }
}
