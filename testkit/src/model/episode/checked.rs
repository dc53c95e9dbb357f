//! Running one operation against what the model expects: the allocation
//! failure injected, the result, the tables taken, and on error the
//! tables byte for byte as before.

use pgtable_core::contract::level;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};

use pgtable_core::contract::Arch;
use pgtable_core::sim::SimMachine;
use pgtable_core::{Error, VirtAddr};

use super::{Episode, Expected};
use crate::model::gen::{MoveKind, Op};
use crate::model::oracle::{self, Space};
use crate::model::reference::pages;
use crate::model::{fail, panic_msg, Failure, Tally, QUIET};

impl<A: Arch> Episode<A> {
    /// Runs `f` with the operation's allocation failure injected; on error
    /// checks that nothing changed. Returns the result and the tables the
    /// operation allocated.
    fn exec(
        &mut self,
        op: &Op,
        k: Option<u64>,
        may_fail: bool,
        cheap: bool,
        f: impl FnOnce(&mut Space<A>, &mut Space<A>) -> Result<(), Error>,
    ) -> Result<(Result<(), Error>, u64), Failure> {
        let both = matches!(op, Op::Copy { .. });
        // An error of the argument checks is checked by what the machine
        // saw (no entry written, no barrier, no flush, no table taken):
        // snapshots of every table cost more than the operations.
        let cheap = cheap && k.is_none();
        let before = (!cheap && (may_fail || k.is_some())).then(|| self.snapshots(both));
        let work = |m: &SimMachine<A>| {
            let s = m.stats();
            (s.entries_written, s.barriers, s.flush_range, s.flush_all)
        };
        let work0 = work(&self.machine);
        let allocated = self.allocated();
        self.machine.fail_after(k);
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            f(&mut self.cur.space, &mut self.other.space)
        }));
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
        let allocated = self.allocated() - allocated;
        if r.is_err() {
            match before {
                Some(before) => {
                    let after = self.snapshots(both);
                    for (which, (b, a)) in ["", "the other space: "]
                        .iter()
                        .zip(before.iter().zip(&after))
                    {
                        if let Some(d) = oracle::diff(b, a) {
                            return fail(
                                "unchanged",
                                format!("{op} returned {r:?} but changed {which}{d}"),
                            );
                        }
                    }
                }
                None if cheap => {
                    if work(&self.machine) != work0 || allocated != 0 {
                        return fail(
                            "unchanged",
                            format!("{op} returned {r:?} but wrote, flushed or allocated"),
                        );
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

    /// Tables allocated by both spaces so far.
    fn allocated(&self) -> u64 {
        self.cur.space.stats().tables_allocated() + self.other.space.stats().tables_allocated()
    }

    /// The current space's tables, and the other's if `both` (an x86
    /// user root reaches the kernel's shared tables too).
    fn snapshots(&self, both: bool) -> Vec<oracle::Snapshot> {
        let mut v = vec![oracle::snapshot::<A>(&self.cur.space)];
        if both {
            v.push(oracle::snapshot::<A>(&self.other.space));
        }
        v
    }

    /// Runs an operation expected to behave as `exp` says (`k`: the
    /// injected allocation failure, if any). Returns whether it succeeded.
    pub(in crate::model) fn run_checked(
        &mut self,
        op: &Op,
        k: Option<u64>,
        tally: &mut Tally,
        exp: Expected,
        f: impl Fn(&mut Space<A>, &mut Space<A>) -> Result<(), Error>,
    ) -> Result<bool, Failure> {
        let Expected { name, want, need } = exp;
        // Out of memory is the one error the model cannot always predict
        // (moves): then any result is checked against the retry below.
        let oom_possible = k.is_some() && need.is_none() && want.is_ok();
        let cheap = matches!(
            want,
            Err(Error::ZeroLength
                | Error::MisalignedVirt(_)
                | Error::MisalignedPhys(_)
                | Error::MisalignedLength(_)
                | Error::OutOfRange(_)
                | Error::PhysOutOfRange(_)
                | Error::SwapValueTooWide(_))
        );
        let (got, allocated) = self.exec(op, k, want.is_err() || oom_possible, cheap, &f)?;
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
            let (again, allocated) = self.exec(op, None, false, false, &f)?;
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

    pub(in crate::model) fn move_expected(
        &self,
        old: u64,
        new: u64,
        len: u64,
        kind: MoveKind,
    ) -> Result<(), Error> {
        self.check(old, len)?;
        self.check(new, len)?;
        let (so, eo) = pages::<A>(old, len);
        let (sn, en) = pages::<A>(new, len);
        if so < en && sn < eo {
            return Err(Error::Overlap);
        }
        if let Some(p) = self.cur.model.first_mapped(sn, en) {
            return Err(Error::AlreadyMapped(VirtAddr(p << A::PAGE_SHIFT)));
        }
        if kind == MoveKind::FreeBelow {
            // The claim is checked where the mutual-alignment rule would
            // use it: both starts at the same offset in a PMD, the range
            // reaching the next PMD boundary, the widened ranges disjoint.
            let pmd = level::entries::<A>() as u64;
            let off = so % pmd;
            let fast_pmd = A::HAVE_MOVE_PMD && pgtable_core::MoveOptions::PMD_BUILT;
            if fast_pmd && off != 0 && off == sn % pmd && eo - so >= pmd - off {
                let (ao, an) = (so - off, sn - off);
                let widened_overlap = ao < en && an < eo;
                if !widened_overlap {
                    let hit = self
                        .cur
                        .model
                        .first_mapped(ao, so)
                        .or_else(|| self.cur.model.first_mapped(an, sn));
                    if let Some(p) = hit {
                        return Err(Error::AlreadyMapped(VirtAddr(p << A::PAGE_SHIFT)));
                    }
                }
            }
        }
        Ok(())
    }
}
