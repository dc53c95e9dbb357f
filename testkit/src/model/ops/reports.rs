//! `unmap_with`, `clear_refs`, `test_and_clear_young` and `ptep_get`:
//! their reports and values against the model.

use pgtable_core::contract::level::page_size;
use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};

use pgtable_core::contract::Arch;
use pgtable_core::{Error, LeafEntry, VirtAddr};

use super::{check_reports, show, unit_at, unit_of};
use crate::model::episode::{Episode, Expected};
use crate::model::gen::{Harvest, Op};
use crate::model::oracle::Space;
use crate::model::reference::{pages, Run};
use crate::model::{fail, panic_msg, Failure, Tally};

impl<A: Arch> Episode<A> {
    pub(super) fn unmap_with(
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
            let (s, e) = pages::<A>(va, len);
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
    pub(super) fn harvested(&mut self, reports: &[LeafEntry<A>], what: Harvest) {
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

    pub(super) fn clear_refs(
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
            let (s, e) = pages::<A>(va, len);
            if let Err(m) = check_reports::<A>(&before, s, e, &reports, false) {
                return fail("report", format!("{op}: {m}"));
            }
            self.harvested(&reports, what);
        } else if !reports.is_empty() {
            return fail("report", format!("{op} failed but reported {reports:?}"));
        }
        self.after(&[(va, len)], got)
    }

    pub(super) fn young(&mut self, op: &Op, va: u64, tally: &mut Tally) -> Result<(), Failure> {
        let vpn = va >> A::PAGE_SHIFT;
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
        self.after(&[(va & !(page_size::<A>() - 1), page_size::<A>())], got)
    }

    pub(super) fn get(&mut self, op: &Op, va: u64, tally: &mut Tally) -> Result<(), Failure> {
        let got = panic::catch_unwind(AssertUnwindSafe(|| self.cur.space.ptep_get(VirtAddr(va))));
        let got = match got {
            Ok(g) => g,
            Err(p) => return fail("panic", format!("{op} panicked: {}", panic_msg(&p))),
        };
        tally.note("ptep_get", if got.is_some() { "Some" } else { "None" });
        let vpn = va >> A::PAGE_SHIFT;
        let m = &self.cur.model;
        let ok = match (self.contains(va), m.swp(vpn), m.page(vpn), got) {
            (false, _, _, None) => true,
            (true, Some(v), _, Some(e)) => {
                !e.is_present()
                    && A::swp_value(e.raw()) == Some(v)
                    && e.va().0 == va & !(page_size::<A>() - 1)
            }
            (true, None, Some(_), Some(e)) => {
                let p = e.va().0 >> A::PAGE_SHIFT;
                let n = e.size() >> A::PAGE_SHIFT;
                let want = e.pa().zip(e.prot()).map(|(pa, prot)| Run {
                    pages: n,
                    ppn: pa.0 >> A::PAGE_SHIFT,
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
                    show::<A>(&around),
                    m.swp(vpn)
                ),
            );
        }
        Ok(())
    }
}
