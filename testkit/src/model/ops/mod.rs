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
//!
//! `reports.rs` has the reporting and harvesting steps, `faults.rs` the
//! fault-time ones, `copy_live.rs` fork and live changes; the gather is
//! here.

mod copy_live;
mod faults;
mod reports;

use pgtable_core::contract::level;
use std::panic::{self, AssertUnwindSafe};

use pgtable_core::contract::Arch;
use pgtable_core::{LeafEntry, VirtAddr};

use super::episode::{reprotect, Episode};
use super::gen::{GStep, Op};
use super::oracle::Space;
use super::reference::{pages, Model, Run};
use super::{fail, gathered, panic_msg, Failure, Tally};

/// The pages `[s, e)` of the translation covering page `vpn` in `space`
/// (the leaf, or the whole folded run it is in): what one load or store
/// marks accessed or dirty.
pub fn unit_of<A: Arch>(space: &Space<A>, vpn: u64) -> Option<(u64, u64)> {
    let t = space.translate(VirtAddr(vpn << A::PAGE_SHIFT))?;
    Some(unit_at::<A>(vpn << A::PAGE_SHIFT, t.height, t.entry))
}

/// The pages of the translation of the leaf `raw` at height `h` covering
/// `va`.
fn unit_at<A: Arch>(va: u64, h: u32, raw: u64) -> (u64, u64) {
    let size = level::size::<A>(h);
    let span = if A::is_cont(raw, h) {
        u64::from(A::cont_entries(h)) * size
    } else {
        size
    };
    let s = (va & !(span - 1)) >> A::PAGE_SHIFT;
    (s, s + (span >> A::PAGE_SHIFT))
}

fn show<A: Arch>(runs: &[(u64, Run)]) -> String {
    let v: Vec<String> = runs
        .iter()
        .take(3)
        .map(|(p, r)| {
            format!(
                "{:#x}: {} pages at {:#x} {:?} young {} dirty {}",
                p << A::PAGE_SHIFT,
                r.pages,
                r.ppn << A::PAGE_SHIFT,
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
        .map(|r| (r.va().0 >> A::PAGE_SHIFT, r.size() >> A::PAGE_SHIFT, *r))
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
                ppn: pa.0 >> A::PAGE_SHIFT,
                prot,
                young: r.young(),
                dirty: r.dirty(),
            };
            let runs = m.runs_in(p, p + n);
            if runs != [(p, want)] {
                return Err(format!(
                    "a report says {}, the model has {}",
                    show::<A>(&[(p, want)]),
                    show::<A>(&runs)
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
                x << A::PAGE_SHIFT
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
            let (s, e) = pages::<A>(va, len);
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
