//! The steps of the operations that report, harvest, fault, fork, change
//! live mappings and gather, with the results their documentation
//! promises.
//!
//! Reports (`unmap_with`, `clear_refs`) are checked against the model as
//! it was before the operation, without assuming a layout: every report
//! is a page, a block or a software entry the model has, with its
//! physical address, protection and accessed/dirty state (the state of
//! the whole folded run for an entry of one); reports do not overlap; and
//! together they cover every mapped page and software entry of the range
//! (for `unmap_with` exactly the range; `clear_refs` reports a block or
//! run entry the range covers in part whole, with its own address).

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};

use pgtable_core::contract::Arch;
use pgtable_core::{CopyMode, Error, LeafEntry, LiveOptions, PhysAddr, Prot, VirtAddr};

use super::episode::{reprotect, Episode, Expected};
use super::gen::{Fault, GStep, Harvest, Op};
use super::oracle::Space;
use super::reference::{check_range_in, pages, Model, Run};
use super::{fail, gathered, panic_msg, Failure, Tally};

/// The pages `[s, e)` of the translation covering page `vpn` in `space`
/// (the leaf, or the whole folded run it is in): what one load or store
/// marks accessed or dirty.
pub fn unit_of<A: Arch>(space: &Space<A>, vpn: u64) -> Option<(u64, u64)> {
    let t = space.translate(VirtAddr(vpn << 12))?;
    Some(unit_at::<A>(vpn << 12, t.height, t.entry))
}

/// The pages of the translation of the leaf `raw` at height `h` covering
/// `va`.
fn unit_at<A: Arch>(va: u64, h: u32, raw: u64) -> (u64, u64) {
    let size = 1u64 << (12 + 9 * h);
    let span = if A::is_cont(raw, h) {
        u64::from(A::cont_entries(h)) * size
    } else {
        size
    };
    let s = (va & !(span - 1)) >> 12;
    (s, s + (span >> 12))
}

fn show(runs: &[(u64, Run)]) -> String {
    let v: Vec<String> = runs
        .iter()
        .take(3)
        .map(|(p, r)| {
            format!(
                "{:#x}: {} pages at {:#x} {:?} young {} dirty {}",
                p << 12,
                r.pages,
                r.ppn << 12,
                r.prot,
                r.young,
                r.dirty
            )
        })
        .collect();
    format!("[{}]", v.join(", "))
}

/// Checks reports against the model `m` before the operation, for the
/// pages `[s, e)` (module docs). `exact`: every report lies inside.
pub fn check_reports<A: Arch>(
    m: &Model,
    s: u64,
    e: u64,
    reps: &[LeafEntry<A>],
    exact: bool,
) -> Result<(), String> {
    let mut spans: Vec<(u64, u64, LeafEntry<A>)> = reps
        .iter()
        .map(|r| (r.va().0 >> 12, r.size() >> 12, *r))
        .collect();
    spans.sort_by_key(|x| x.0);
    let mut prev: Option<u64> = None;
    for &(p, n, r) in &spans {
        if prev.is_some_and(|end| p < end) {
            return Err(format!("{r:?} overlaps the report before it"));
        }
        prev = Some(p + n);
        let inside = if exact {
            p >= s && p + n <= e
        } else {
            p < e && p + n > s
        };
        if !inside {
            return Err(format!("{r:?} ({n} pages) lies outside the range"));
        }
        if r.is_present() {
            let (Some(pa), Some(prot)) = (r.pa(), r.prot()) else {
                return Err(format!("{r:?} is present without an address"));
            };
            let want = Run {
                pages: n,
                ppn: pa.0 >> 12,
                prot,
                young: r.young(),
                dirty: r.dirty(),
            };
            let runs = m.runs_in(p, p + n);
            if runs != [(p, want)] {
                return Err(format!(
                    "a report says {}, the model has {}",
                    show(&[(p, want)]),
                    show(&runs)
                ));
            }
        } else {
            let v = A::swp_value(r.raw());
            if n != 1 || v.is_none() || m.swp(p) != v {
                return Err(format!(
                    "{r:?} reports the software entry {v:x?}, the model has {:x?}",
                    m.swp(p)
                ));
            }
        }
    }
    let mut need: Vec<(u64, u64)> = m
        .runs_in(s, e)
        .iter()
        .map(|(p, r)| (*p, p + r.pages))
        .collect();
    if exact {
        // `unmap_with` reports software entries; `clear_refs` skips them.
        need.extend(m.swp_in(s, e).iter().map(|(p, _)| (*p, p + 1)));
    }
    for (a, b) in need {
        // The first page of `[a, b)` no report covers.
        let mut x = a;
        let i = spans.partition_point(|sp| sp.0 + sp.1 <= x);
        for sp in &spans[i..] {
            if sp.0 > x || x >= b {
                break;
            }
            x = sp.0 + sp.1;
        }
        if x < b {
            return Err(format!(
                "{} reports; the page {:#x} the model maps in the range is not reported",
                spans.len(),
                x << 12
            ));
        }
    }
    Ok(())
}

impl<A: Arch> Episode<A> {
    /// The steps of the operations this file covers.
    pub(super) fn step_more(&mut self, op: &Op, tally: &mut Tally) -> Result<(), Failure> {
        match *op {
            Op::Switch => {
                std::mem::swap(&mut self.cur, &mut self.other);
                self.other_tables.set(None);
                self.other_changed.set(true);
                Ok(())
            }
            Op::UnmapWith { va, len, fail: k } => self.unmap_with(op, va, len, k, tally),
            Op::ClearRefs { va, len, what } => self.clear_refs(op, va, len, what, tally),
            Op::Young { va } => self.young(op, va, tally),
            Op::Get { va } => self.get(op, va, tally),
            Op::Fault { va, flags } => self.fault(op, va, flags, tally),
            Op::Install {
                va,
                pa,
                prot,
                fail: k,
            } => self.install(op, (va, pa, prot), k, tally),
            Op::Copy {
                va,
                len,
                cow,
                fail: k,
            } => self.copy(op, (va, len, cow), k, tally),
            Op::Live {
                va,
                len,
                prot,
                bbm,
                fail: k,
            } => self.live(op, (va, len, prot, bbm), k, tally),
            Op::Gather { steps, n } => self.gather(op, &steps[..usize::from(n)], tally),
            _ => unreachable!("{op} is a step of episode.rs"),
        }
    }

    /// Marks the pages `[s, e)` (one translation) accessed (`young`) and
    /// dirty (`dirty`) in the current space's model.
    pub(super) fn mark(&mut self, (s, e): (u64, u64), young: bool, dirty: bool) {
        self.cur.model.update(s, e, |r| Run {
            young: r.young || young,
            dirty: r.dirty || dirty,
            ..r
        });
    }

    fn unmap_with(
        &mut self,
        op: &Op,
        va: u64,
        len: u64,
        k: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let mut want = self.check(va, len);
        let need = want.is_ok().then(|| self.split_need(op));
        if let (Some(n), Some(k)) = (need, k) {
            if k < n {
                want = Err(Error::OutOfMemory);
            }
        }
        let before = self.cur.model.clone();
        let reports = RefCell::new(Vec::new());
        let f = |s: &mut Space<A>, _: &mut Space<A>| {
            reports.borrow_mut().clear();
            s.unmap_with(VirtAddr(va), len, |r| reports.borrow_mut().push(r))
        };
        let exp = Expected {
            name: "unmap_with",
            want,
            need,
        };
        let got = self.run_checked(op, k, tally, exp, f)?;
        let reports = reports.into_inner();
        if got {
            let (s, e) = pages(va, len);
            if let Err(m) = check_reports::<A>(&before, s, e, &reports, true) {
                return fail("report", format!("{op}: {m}"));
            }
            self.cur.model.take(s, e);
            self.cur.model.take_swp(s, e);
        } else if !reports.is_empty() {
            return fail("report", format!("{op} failed but reported {reports:?}"));
        }
        self.after(&[(va, len)], got)
    }

    /// The model after `clear_refs` of `what` reported `reports`: each
    /// reported translation (a leaf, or its whole folded run) cleared.
    fn harvested(&mut self, reports: &[LeafEntry<A>], what: Harvest) {
        let what = what.what();
        for r in reports.iter().filter(|r| r.is_present()) {
            let (s, e) = unit_at::<A>(r.va().0, r.height(), r.raw());
            self.cur.model.update(s, e, |x| Run {
                young: x.young && !what.young(),
                dirty: x.dirty && !what.dirty(),
                ..x
            });
        }
    }

    fn clear_refs(
        &mut self,
        op: &Op,
        va: u64,
        len: u64,
        what: Harvest,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let want = self.check(va, len);
        let before = self.cur.model.clone();
        let reports = RefCell::new(Vec::new());
        let f = |s: &mut Space<A>, _: &mut Space<A>| {
            reports.borrow_mut().clear();
            s.clear_refs(VirtAddr(va), len, what.what(), |r| {
                reports.borrow_mut().push(r)
            })
        };
        let exp = Expected {
            name: "clear_refs",
            want,
            need: Some(0),
        };
        let got = self.run_checked(op, None, tally, exp, f)?;
        let reports = reports.into_inner();
        if got {
            let (s, e) = pages(va, len);
            if let Err(m) = check_reports::<A>(&before, s, e, &reports, false) {
                return fail("report", format!("{op}: {m}"));
            }
            self.harvested(&reports, what);
        } else if !reports.is_empty() {
            return fail("report", format!("{op} failed but reported {reports:?}"));
        }
        self.after(&[(va, len)], got)
    }

    fn young(&mut self, op: &Op, va: u64, tally: &mut Tally) -> Result<(), Failure> {
        let vpn = va >> 12;
        let want = if self.contains(va) {
            Ok(self.cur.model.page(vpn).is_some_and(|r| r.young))
        } else {
            Err(Error::OutOfRange(VirtAddr(va)))
        };
        let unit = want
            .is_ok()
            .then(|| unit_of::<A>(&self.cur.space, vpn))
            .flatten();
        let out = Cell::new(None);
        let f = |s: &mut Space<A>, _: &mut Space<A>| {
            s.test_and_clear_young(VirtAddr(va))
                .map(|y| out.set(Some(y)))
        };
        let exp = Expected {
            name: "young",
            want: want.map(|_| ()),
            need: Some(0),
        };
        let got = self.run_checked(op, None, tally, exp, f)?;
        if got {
            if out.get() != want.ok() {
                return fail(
                    "result",
                    format!(
                        "{op} returned Ok({:?}), the model expects Ok({:?})",
                        out.get().unwrap_or_default(),
                        want.unwrap_or_default()
                    ),
                );
            }
            if let Some((s, e)) = unit {
                self.cur.model.update(s, e, |r| Run { young: false, ..r });
            }
        }
        self.after(&[(va & !0xfff, 4096)], got)
    }

    fn get(&mut self, op: &Op, va: u64, tally: &mut Tally) -> Result<(), Failure> {
        let got = panic::catch_unwind(AssertUnwindSafe(|| self.cur.space.ptep_get(VirtAddr(va))));
        let got = match got {
            Ok(g) => g,
            Err(p) => return fail("panic", format!("{op} panicked: {}", panic_msg(&p))),
        };
        tally.note("ptep_get", if got.is_some() { "Some" } else { "None" });
        let vpn = va >> 12;
        let m = &self.cur.model;
        let ok = match (self.contains(va), m.swp(vpn), m.page(vpn), got) {
            (false, _, _, None) => true,
            (true, Some(v), _, Some(e)) => {
                !e.is_present() && A::swp_value(e.raw()) == Some(v) && e.va().0 == va & !0xfff
            }
            (true, None, Some(_), Some(e)) => {
                let p = e.va().0 >> 12;
                let n = e.size() >> 12;
                let want = e.pa().zip(e.prot()).map(|(pa, prot)| Run {
                    pages: n,
                    ppn: pa.0 >> 12,
                    prot,
                    young: e.young(),
                    dirty: e.dirty(),
                });
                p <= vpn && vpn < p + n && want.is_some_and(|w| m.runs_in(p, p + n) == [(p, w)])
            }
            (true, None, None, None) => true,
            _ => false,
        };
        if !ok {
            let around = m.runs_in(vpn.saturating_sub(1), vpn + 1);
            return fail(
                "result",
                format!(
                    "{op} = {got:x?} ({:?}), the model has {} and the software entry {:x?}",
                    got.map(|e| (e.pa(), e.prot(), e.young(), e.dirty())),
                    show(&around),
                    m.swp(vpn)
                ),
            );
        }
        Ok(())
    }

    fn fault(&mut self, op: &Op, va: u64, flags: Fault, tally: &mut Tally) -> Result<(), Failure> {
        let vpn = va >> 12;
        // The result, and the pages and the change the model makes.
        let mut change = None;
        let want = if !self.contains(va) {
            Err(Error::OutOfRange(VirtAddr(va)))
        } else if let Some(r) = self.cur.model.page(vpn) {
            let Some(t) = self.cur.space.translate(VirtAddr(va)) else {
                return fail(
                    "translate",
                    format!("translate({va:#x}) = None, the model maps it"),
                );
            };
            let (raw, h) = (t.entry, t.height);
            let mkwrite = flags.write() && !r.prot.writable();
            let change_of = |raw: u64| {
                let mut new = A::mkyoung(raw, h);
                if mkwrite {
                    new = A::modify_prot(new, r.prot | Prot::WRITE, h);
                }
                if flags.dirty() {
                    new = A::mkdirty(new, h);
                }
                new
            };
            if A::BREAK_BEFORE_MAKE && !A::change_is_safe(raw, change_of(raw), h) {
                Err(Error::BreakBeforeMake(VirtAddr(va)))
            } else {
                // A change of the write permission is made to the one leaf
                // (a folded run is unfolded first, Linux
                // `contpte_ptep_set_access_flags`); accessed/dirty state
                // to the whole translation.
                let size = 1u64 << (12 + 9 * h);
                let span = if mkwrite {
                    let s = (va & !(size - 1)) >> 12;
                    (s, s + (size >> 12))
                } else {
                    unit_at::<A>(va, h, raw)
                };
                change = Some((span, mkwrite));
                // Whether an entry of the span changes.
                let changed = (span.0..span.1).step_by((size >> 12) as usize).any(|p| {
                    let raw = self
                        .cur
                        .space
                        .inspect()
                        .entry(VirtAddr(p << 12), h)
                        .unwrap_or(0);
                    change_of(raw) != raw
                });
                Ok(changed)
            }
        } else {
            Err(Error::NotMapped(VirtAddr(va)))
        };
        let out = Cell::new(None);
        let f = |s: &mut Space<A>, _: &mut Space<A>| {
            s.ptep_set_access_flags(VirtAddr(va), flags.flags())
                .map(|c| out.set(Some(c)))
        };
        let exp = Expected {
            name: "fault",
            want: want.map(|_| ()),
            need: Some(0),
        };
        let got = self.run_checked(op, None, tally, exp, f)?;
        if got {
            if out.get() != want.ok() {
                return fail(
                    "result",
                    format!(
                        "{op} returned Ok({:?}), the model expects Ok({:?})",
                        out.get().unwrap_or_default(),
                        want.unwrap_or_default()
                    ),
                );
            }
            if let Some(((s, e), mkwrite)) = change {
                if mkwrite {
                    self.cur.model.update(s, e, |r| Run {
                        prot: r.prot | Prot::WRITE,
                        young: true,
                        dirty: true,
                        ..r
                    });
                } else {
                    self.mark((s, e), true, flags.dirty());
                }
            }
        }
        self.after(&[(va & !0xfff, 4096)], got)
    }

    fn install(
        &mut self,
        op: &Op,
        (va, pa, prot): (u64, u64, Prot),
        k: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let mut want = self.install_expected(va, pa);
        let need = want.is_ok().then(|| self.swap_need(va));
        if let (Some(n), Some(k)) = (need, k) {
            if k < n {
                want = Err(Error::OutOfMemory);
            }
        }
        let f =
            |s: &mut Space<A>, _: &mut Space<A>| s.install_pte(VirtAddr(va), PhysAddr(pa), prot);
        let exp = Expected {
            name: "install_pte",
            want,
            need,
        };
        let got = self.run_checked(op, k, tally, exp, f)?;
        if got {
            self.cur
                .model
                .insert(va >> 12, super::episode::new_run::<A>(1, pa, prot));
        }
        self.after(&[(va & !0xfff, 4096)], got)
    }

    fn copy(
        &mut self,
        op: &Op,
        (va, len, cow): (u64, u64, bool),
        k: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let want = self.check(va, len).and_then(|()| {
            check_range_in::<A>(self.other.range, va, len)?;
            let (s, e) = pages(va, len);
            match self.other.model.first_mapped(s, e) {
                Some(p) => Err(Error::AlreadyMapped(VirtAddr(p << 12))),
                None => Ok(()),
            }
        });
        let mode = if cow { CopyMode::Cow } else { CopyMode::Shared };
        let f = |s: &mut Space<A>, d: &mut Space<A>| s.copy_page_range(d, VirtAddr(va), len, mode);
        let exp = Expected {
            name: "copy",
            want,
            need: None,
        };
        let got = self.run_checked(op, k, tally, exp, f)?;
        if got {
            let (s, e) = pages(va, len);
            for (p, r) in self.cur.model.runs_in(s, e) {
                let prot = if cow {
                    r.prot.difference(Prot::WRITE)
                } else {
                    r.prot
                };
                // The child's leaves are old, and clean when shared.
                let child = Run {
                    prot,
                    young: false,
                    dirty: cow && r.dirty,
                    ..r
                };
                self.other.model.insert(p, child);
            }
            for (p, v) in self.cur.model.swp_in(s, e) {
                self.other.model.set_swp(p, v);
            }
            if cow {
                self.cur.model.update(s, e, |r| Run {
                    prot: r.prot.difference(Prot::WRITE),
                    ..r
                });
            }
        }
        self.other_tables.set(None);
        self.other_changed.set(true);
        self.after(&[(va, len)], got)?;
        std::mem::swap(&mut self.cur, &mut self.other);
        self.other_tables.set(None);
        let r = self.after(&[(va, len)], got);
        std::mem::swap(&mut self.cur, &mut self.other);
        self.other_tables.set(None);
        r
    }

    /// The first address of `[va, va + len)` whose change to `prot` cannot
    /// be made in place: a leaf whose protection changes and that is a
    /// block covered in part, an entry of a folded run covered in part,
    /// or one the arch cannot change in place ([`Arch::change_is_safe`]).
    fn live_refusal(&self, va: u64, len: u64, prot: Prot) -> Option<u64> {
        let end = u128::from(va) + u128::from(len);
        let mut hit = None;
        let _ = self.cur.space.walk(VirtAddr(va), len, |m| {
            if hit.is_some() || m.prot == prot {
                return;
            }
            let h = m.height;
            let ls = u128::from(m.va.0);
            let whole = ls >= u128::from(va) && ls + u128::from(m.size) <= end;
            let (rs, re) = unit_at::<A>(m.va.0, h, m.entry);
            let (rs, re) = (u128::from(rs) << 12, u128::from(re) << 12);
            let run_part = rs < u128::from(va) || re > end;
            let unsafe_change = !A::change_is_safe(m.entry, A::modify_prot(m.entry, prot, h), h);
            if !whole || run_part || unsafe_change {
                hit = Some(m.va.0.max(va));
            }
        });
        hit
    }

    fn live(
        &mut self,
        op: &Op,
        (va, len, prot, bbm): (u64, u64, Prot, bool),
        k: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let mut want = self.check(va, len);
        if want.is_ok() && A::BREAK_BEFORE_MAKE && !bbm {
            if let Some(at) = self.live_refusal(va, len, prot) {
                want = Err(Error::BreakBeforeMake(VirtAddr(at)));
            }
        }
        let need = want.is_ok().then(|| self.split_need(op));
        if let (Some(n), Some(k)) = (need, k) {
            if k < n {
                want = Err(Error::OutOfMemory);
            }
        }
        let opts = if bbm {
            LiveOptions::ALLOW_BBM
        } else {
            LiveOptions::IN_PLACE
        };
        let f = |s: &mut Space<A>, _: &mut Space<A>| {
            s.change_protection_live(VirtAddr(va), len, prot, opts)
        };
        let exp = Expected {
            name: "live",
            want,
            need,
        };
        let got = self.run_checked(op, k, tally, exp, f)?;
        if got {
            let (s, e) = pages(va, len);
            self.cur
                .model
                .protect(s, e, prot, &|r| reprotect::<A>(r, prot));
        }
        self.after(&[(va, len)], got)
    }

    /// The steps into one gather, finished once: each step's result, its
    /// reports, no table freed before the finish, then the tables and
    /// the TLB against the model.
    fn gather(&mut self, op: &Op, steps: &[GStep], tally: &mut Tally) -> Result<(), Failure> {
        let mut reports: Vec<Vec<LeafEntry<A>>> = vec![Vec::new(); steps.len()];
        let mut freed_early = None;
        let r = {
            let Episode { machine, cur, .. } = &mut *self;
            let mut live = machine.live_tables();
            panic::catch_unwind(AssertUnwindSafe(|| {
                gathered::run::<A>(
                    &mut cur.space,
                    steps,
                    &mut |i, e| reports[i].push(e),
                    &mut |i, _| {
                        let now = machine.live_tables();
                        if now < live && freed_early.is_none() {
                            freed_early = Some(i);
                        }
                        live = now;
                    },
                )
            }))
        };
        let results = match r {
            Ok(Ok(v)) => v,
            Ok(Err(m)) => return fail("result", format!("{op}: {m}")),
            Err(p) => return fail("panic", format!("{op} panicked: {}", panic_msg(&p))),
        };
        if let Some(i) = freed_early {
            return fail(
                "gather",
                format!("{op}: step {i} freed a table before the gather was finished"),
            );
        }
        let mut ranges = Vec::new();
        for (i, (st, got)) in steps.iter().zip(results).enumerate() {
            let (va, len) = st.range();
            let want = self.check(va, len);
            let name = match st {
                GStep::Unmap { .. } => "gathered unmap",
                GStep::UnmapWith { .. } => "gathered unmap_with",
                GStep::Protect { .. } => "gathered protect",
                GStep::ClearRefs { .. } => "gathered clear_refs",
            };
            tally.add(name, &got);
            if got != want {
                return fail(
                    "result",
                    format!("{op}: step {i} ({st}) returned {got:?}, the model expects {want:?}"),
                );
            }
            if got.is_err() {
                if !reports[i].is_empty() {
                    return fail("report", format!("{op}: step {i} failed but reported"));
                }
                continue;
            }
            ranges.push((va, len));
            let (s, e) = pages(va, len);
            match *st {
                GStep::Unmap { .. } | GStep::UnmapWith { .. } => {
                    if matches!(st, GStep::UnmapWith { .. }) {
                        if let Err(m) = check_reports::<A>(&self.cur.model, s, e, &reports[i], true)
                        {
                            return fail("report", format!("{op}: step {i}: {m}"));
                        }
                    }
                    self.cur.model.take(s, e);
                    self.cur.model.take_swp(s, e);
                }
                GStep::Protect { prot, .. } => self
                    .cur
                    .model
                    .protect(s, e, prot, &|r| reprotect::<A>(r, prot)),
                GStep::ClearRefs { what, .. } => {
                    if let Err(m) = check_reports::<A>(&self.cur.model, s, e, &reports[i], false) {
                        return fail("report", format!("{op}: step {i}: {m}"));
                    }
                    self.harvested(&reports[i], what);
                }
            }
        }
        self.after(&ranges, true)
    }
}
