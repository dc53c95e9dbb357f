//! One episode's machine, address space and model, and the operations
//! applied to them with the results the model expects.

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};

use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{variants, AddressSpace, Arch, Error, MapOptions, PhysAddr, VirtAddr};

use super::gen::{Gen, MapKind, MoveKind, Op};
use super::oracle::{self, Space};
use super::reference::{check_phys, check_range, pages, Model, Run};
use super::{fail, panic_msg, Failure, Tally, MAP_BUDGET, QUIET};

/// One machine, its address space and the model of both.
pub struct Episode<A: Arch> {
    pub(super) machine: SimMachine<A>,
    /// Installed on the machine; deactivated when dropped.
    pub(super) space: Installed<A, SimMmu<A>, SimAlloc>,
    pub(super) model: Model,
    /// Values stored through the MMU, by physical address.
    pub(super) phys: HashMap<u64, u64>,
    /// Pages at the edges of every range operated on.
    pub(super) touched: BTreeSet<u64>,
}

/// What the model expects of one operation: its name (for the tally),
/// its result before any injected allocation failure, and the tables it
/// takes (`None` when only the operation itself can tell).
struct Expected {
    name: &'static str,
    want: Result<(), Error>,
    need: Option<u64>,
}

impl<A: Arch> Episode<A> {
    pub(super) fn new() -> Self {
        let machine = SimMachine::<A>::new();
        let space = AddressSpace::new(machine.mmu(), machine.alloc()).expect("root table");
        // SAFETY: the MMU is a `SimMmu`: only the simulated walker uses
        // these tables.
        let space = unsafe { Installed::new(space) };
        Episode {
            machine,
            space,
            model: Model::default(),
            phys: HashMap::new(),
            touched: BTreeSet::new(),
        }
    }

    /// Adjusts a generated operation before it runs: failure points
    /// spread over every allocation the operation makes, maps kept within
    /// the leaf budget. `None`: draw another one.
    pub(super) fn refine(&self, op: Op, gen: &mut Gen) -> Option<Op> {
        match op {
            Op::Map {
                va, pa, len, fail, ..
            } => {
                if check_range::<A>(va, len)
                    .and(check_phys::<A>(pa, len))
                    .is_ok()
                {
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
            Op::Unmap { va, len, fail } | Op::Protect { va, len, fail, .. } => {
                if fail.is_some() && check_range::<A>(va, len).is_ok() {
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
                    let (s, e) = pages(old, len);
                    let splits_all = (new.wrapping_sub(old) >> 12) % 512 != 0;
                    let pages: u64 = self.model.runs_in(s, e).iter().map(|r| r.1.pages).sum();
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
            Op::Touch { .. } | Op::SwapIn { .. } => Some(op),
        }
    }

    /// What `set_swap_entry` must return: the page's range, the value's
    /// width, then whether something present is there.
    fn swap_expected(&self, va: u64, value: u64) -> Result<(), Error> {
        check_range::<A>(va, 4096)?;
        let bits = A::SWP_VALUE_BITS;
        if bits == 0 || (bits < 64 && value >> bits != 0) {
            return Err(Error::SwapValueTooWide(value));
        }
        match self.model.lookup(va >> 12) {
            Some(_) => Err(Error::AlreadyMapped(VirtAddr(va))),
            None => Ok(()),
        }
    }

    /// The tables `set_swap_entry` at `va` takes: none over a software
    /// entry, else those a one-page map there would.
    fn swap_need(&self, va: u64) -> u64 {
        if self.model.swp(va >> 12).is_some() {
            return 0;
        }
        oracle::map_need::<A>(&self.space, va, 4096, 0, MapOptions::PAGES, 1).tables
    }

    /// A load or store near what `op` worked on, or of a mapped page.
    pub(super) fn touch_op(&self, op: &Op, gen: &mut Gen) -> Op {
        let page = if !self.model.is_empty() && gen.rng.chance(70) {
            let hint = gen.va(&self.model, 0) >> 12;
            self.model
                .random_page(&mut gen.rng, hint)
                .expect("not empty")
                << 12
        } else {
            let base = match *op {
                Op::Map { va, .. } | Op::Unmap { va, .. } | Op::Protect { va, .. } => va,
                Op::Move { old, new, .. } => {
                    if gen.rng.chance(50) {
                        old
                    } else {
                        new
                    }
                }
                Op::Touch { va, .. } | Op::Swap { va, .. } | Op::SwapIn { va, .. } => va,
            };
            (base & !0xfff).wrapping_add(gen.rng.below(4) << 12)
        };
        let va = page + gen.rng.below(512) * 8;
        let write = gen.rng.chance(40).then(|| gen.rng.next());
        Op::Touch { va, write }
    }

    fn map_expected(&self, va: u64, pa: u64, len: u64) -> Result<(), Error> {
        check_range::<A>(va, len)?;
        check_phys::<A>(pa, len)?;
        let (s, e) = pages(va, len);
        match self.model.first_mapped(s, e) {
            Some(p) => Err(Error::AlreadyMapped(VirtAddr(p << 12))),
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
            ..
        } = *op
        else {
            unreachable!()
        };
        let opts = map_options(kind, barrier_per_entry);
        oracle::map_need::<A>(&self.space, va, len, pa, opts, MAP_BUDGET)
    }

    fn split_need(&self, op: &Op) -> u64 {
        match *op {
            Op::Unmap { va, len, .. } => {
                oracle::split_need::<A>(&self.space, va, len, &|_, _| true)
            }
            Op::Protect { va, len, prot, .. } => {
                oracle::split_need::<A>(&self.space, va, len, &|raw, h| {
                    A::leaf_prot(raw, h) != prot
                })
            }
            _ => unreachable!(),
        }
    }

    /// Runs `f` with the operation's allocation failure injected; on error
    /// checks that nothing changed. Returns the result and the tables the
    /// operation allocated.
    fn exec(
        &mut self,
        op: &Op,
        k: Option<u64>,
        may_fail: bool,
        f: impl FnOnce(&mut Space<A>) -> Result<(), Error>,
    ) -> Result<(Result<(), Error>, u64), Failure> {
        let before = (may_fail || k.is_some()).then(|| oracle::snapshot::<A>(&self.space));
        let allocated = self.space.stats().tables_allocated();
        self.machine.fail_after(k);
        let r = panic::catch_unwind(AssertUnwindSafe(|| f(&mut self.space)));
        self.machine.fail_after(None);
        let r = match r {
            Ok(r) => r,
            Err(p) => {
                let msg = panic_msg(&p);
                if !QUIET.with(|q| q.get()) {
                    let _ = writeln!(std::io::stderr().lock(), "{op} panicked");
                }
                return fail("panic", format!("{op} panicked: {msg}"));
            }
        };
        let allocated = self.space.stats().tables_allocated() - allocated;
        if r.is_err() {
            match before {
                Some(before) => {
                    if let Some(d) = oracle::diff(&before, &oracle::snapshot::<A>(&self.space)) {
                        return fail("unchanged", format!("{op} returned {r:?} but changed {d}"));
                    }
                }
                None => {
                    return fail(
                        "result",
                        format!("{op} returned {r:?}, the model expects Ok(())"),
                    )
                }
            }
        }
        Ok((r, allocated))
    }

    /// Applies one step and checks it.
    pub(super) fn step(&mut self, op: &Op, tally: &mut Tally) -> Result<(), Failure> {
        tally.ops += u64::from(!matches!(op, Op::Touch { .. }));
        match *op {
            Op::Touch { va, write } => self.touch(va, write, tally),
            Op::Map {
                va,
                pa,
                len,
                prot,
                kind,
                barrier_per_entry,
                fail: k,
            } => {
                let mut want = self.map_expected(va, pa, len);
                let need = want.is_ok().then(|| self.map_need(op));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n.tables {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let opts = map_options(kind, barrier_per_entry);
                let f = |s: &mut Space<A>| s.map(VirtAddr(va), PhysAddr(pa), len, prot, opts);
                let got = self.run_checked(
                    op,
                    k,
                    tally,
                    Expected {
                        name: "map",
                        want,
                        need: need.map(|n| n.tables),
                    },
                    f,
                )?;
                if got {
                    let (s, _) = pages(va, len);
                    self.model.insert(
                        s,
                        Run {
                            pages: len >> 12,
                            ppn: pa >> 12,
                            prot,
                        },
                    );
                }
                self.after(&[(va, len)], got)
            }
            Op::Unmap { va, len, fail: k } => {
                let mut want = check_range::<A>(va, len);
                let need = want.is_ok().then(|| self.split_need(op));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let f = |s: &mut Space<A>| s.unmap(VirtAddr(va), len);
                let got = self.run_checked(
                    op,
                    k,
                    tally,
                    Expected {
                        name: "unmap",
                        want,
                        need,
                    },
                    f,
                )?;
                if got {
                    let (s, e) = pages(va, len);
                    self.model.take(s, e);
                    self.model.take_swp(s, e);
                }
                self.after(&[(va, len)], got)
            }
            Op::Protect {
                va,
                len,
                prot,
                fail: k,
            } => {
                let mut want = check_range::<A>(va, len);
                let need = want.is_ok().then(|| self.split_need(op));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let f = |s: &mut Space<A>| s.change_protection(VirtAddr(va), len, prot);
                let got = self.run_checked(
                    op,
                    k,
                    tally,
                    Expected {
                        name: "protect",
                        want,
                        need,
                    },
                    f,
                )?;
                if got {
                    let (s, e) = pages(va, len);
                    self.model.protect(s, e, prot);
                }
                self.after(&[(va, len)], got)
            }
            Op::Move {
                old,
                new,
                len,
                kind,
                fail: k,
            } => {
                let want = self.move_expected(old, new, len, kind);
                let opts = kind.options();
                let f = |s: &mut Space<A>| {
                    s.move_page_tables_with(VirtAddr(old), VirtAddr(new), len, opts)
                };
                let got = self.run_checked(
                    op,
                    k,
                    tally,
                    Expected {
                        name: "move",
                        want,
                        need: None,
                    },
                    f,
                )?;
                if got {
                    let (so, eo) = pages(old, len);
                    let (sn, _) = pages(new, len);
                    for (vpn, run) in self.model.take(so, eo) {
                        self.model.insert(vpn - so + sn, run);
                    }
                    for (vpn, v) in self.model.take_swp(so, eo) {
                        self.model.set_swp(vpn - so + sn, v);
                    }
                }
                self.after(&[(old, len), (new, len)], got)
            }
            Op::Swap { va, value, fail: k } => {
                let mut want = self.swap_expected(va, value);
                let need = want.is_ok().then(|| self.swap_need(va));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let f = |s: &mut Space<A>| s.set_swap_entry(VirtAddr(va), value);
                let got = self.run_checked(
                    op,
                    k,
                    tally,
                    Expected {
                        name: "swap",
                        want,
                        need,
                    },
                    f,
                )?;
                if got {
                    self.model.set_swp(va >> 12, value);
                }
                self.after(&[(va & !0xfff, 4096)], got)
            }
            Op::SwapIn { va, pa, prot } => {
                let want = check_range::<A>(va, 4096)
                    .and(check_phys::<A>(pa, 4096))
                    .and_then(|()| {
                        self.model
                            .swp(va >> 12)
                            .ok_or(Error::NoSwapEntry(VirtAddr(va)))
                    });
                let value = want.ok();
                // The value returned is checked here (a mismatch panics,
                // which the episode reports as a failure).
                let f = |s: &mut Space<A>| {
                    s.swap_in(VirtAddr(va), PhysAddr(pa), prot).map(|v| {
                        assert_eq!(Some(v), value, "swap_in returned another value");
                    })
                };
                let got = self.run_checked(
                    op,
                    None,
                    tally,
                    Expected {
                        name: "swap_in",
                        want: want.map(|_| ()),
                        need: Some(0),
                    },
                    f,
                )?;
                if got {
                    self.model.take_swp(va >> 12, (va >> 12) + 1);
                    self.model.insert(
                        va >> 12,
                        Run {
                            pages: 1,
                            ppn: pa >> 12,
                            prot,
                        },
                    );
                }
                self.after(&[(va & !0xfff, 4096)], got)
            }
        }
    }

    /// Runs an operation expected to behave as `exp` says (`k`: the
    /// injected allocation failure, if any). Returns whether it succeeded.
    fn run_checked(
        &mut self,
        op: &Op,
        k: Option<u64>,
        tally: &mut Tally,
        exp: Expected,
        f: impl Fn(&mut Space<A>) -> Result<(), Error>,
    ) -> Result<bool, Failure> {
        let Expected { name, want, need } = exp;
        // Out of memory is the one error the model cannot always predict
        // (moves): then any result is checked against the retry below.
        let oom_possible = k.is_some() && need.is_none() && want.is_ok();
        let (got, allocated) = self.exec(op, k, want.is_err() || oom_possible, &f)?;
        tally.add(name, &got);
        if got == want || (oom_possible && got == Err(Error::OutOfMemory)) {
        } else {
            return fail(
                "result",
                format!("{op} returned {got:?}, the model expects {want:?}"),
            );
        }
        let allocated = if got == Err(Error::OutOfMemory) {
            self.leak_check(op)?;
            // Nothing changed: the same operation with memory must succeed
            // and take more tables than were granted.
            let (again, allocated) = self.exec(op, None, false, &f)?;
            if again.is_err() {
                return fail(
                    "result",
                    format!("{op} without the allocation failure returned {again:?}"),
                );
            }
            let granted = k.expect("only injected failures");
            if allocated <= granted {
                return fail(
                    "allocation",
                    format!(
                        "{op} ran out of memory with {granted} tables granted but takes {allocated}"
                    ),
                );
            }
            allocated
        } else if got.is_ok() {
            if let Some(granted) = k {
                if allocated > granted {
                    return fail(
                        "allocation",
                        format!("{op} took {allocated} tables with {granted} granted"),
                    );
                }
            }
            allocated
        } else {
            return Ok(false);
        };
        if let Some(n) = need {
            if allocated != n {
                return fail(
                    "allocation",
                    format!("{op} allocated {allocated} tables, the tables before it needed {n}"),
                );
            }
        }
        Ok(true)
    }

    pub(super) fn move_expected(
        &self,
        old: u64,
        new: u64,
        len: u64,
        kind: MoveKind,
    ) -> Result<(), Error> {
        check_range::<A>(old, len)?;
        check_range::<A>(new, len)?;
        let (so, eo) = pages(old, len);
        let (sn, en) = pages(new, len);
        if so < en && sn < eo {
            return Err(Error::Overlap);
        }
        if let Some(p) = self.model.first_mapped(sn, en) {
            return Err(Error::AlreadyMapped(VirtAddr(p << 12)));
        }
        if kind == MoveKind::FreeBelow {
            // The claim is checked where the mutual-alignment rule would
            // use it: both starts at the same offset in a PMD, the range
            // reaching the next PMD boundary, the widened ranges disjoint.
            let pmd = 512u64;
            let off = so % pmd;
            let fast_pmd = A::HAVE_MOVE_PMD && cfg!(feature = "move-pmd");
            if fast_pmd && off != 0 && off == sn % pmd && eo - so >= pmd - off {
                let (ao, an) = (so - off, sn - off);
                let widened_overlap = ao < en && an < eo;
                if !widened_overlap {
                    let hit = self
                        .model
                        .first_mapped(ao, so)
                        .or_else(|| self.model.first_mapped(an, sn));
                    if let Some(p) = hit {
                        return Err(Error::AlreadyMapped(VirtAddr(p << 12)));
                    }
                }
            }
        }
        Ok(())
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
            ..
        } => Op::Map {
            va,
            pa,
            len,
            prot,
            kind,
            barrier_per_entry,
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
        t @ (Op::Touch { .. } | Op::SwapIn { .. }) => t,
    }
}

fn map_options(kind: MapKind, barrier_per_entry: bool) -> MapOptions {
    let o = match kind {
        MapKind::Pages => MapOptions::PAGES,
        MapKind::PmdBlocks => MapOptions::PMD_BLOCKS,
        MapKind::Blocks => MapOptions::BLOCKS,
    };
    if barrier_per_entry {
        variants::barrier_per_entry(o)
    } else {
        o
    }
}
