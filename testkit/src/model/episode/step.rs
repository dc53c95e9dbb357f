//! One step of an episode: the operation applied to the current space,
//! with the result, the tables and the translations the model expects.

use pgtable_core::contract::level::page_size;
use pgtable_core::contract::{Arch, NewPte};
use pgtable_core::{Error, PhysAddr, VirtAddr};

use super::{map_options, new_run, reprotect, Episode, Expected};
use crate::model::gen::Op;
use crate::model::oracle::Space;
use crate::model::reference::{check_phys, pages};
use crate::model::{Failure, Tally};

impl<A: Arch> Episode<A> {
    /// Applies one step and checks it.
    pub(in crate::model) fn step(&mut self, op: &Op, tally: &mut Tally) -> Result<(), Failure> {
        tally.ops += u64::from(!matches!(op, Op::Touch { .. } | Op::Switch));
        match *op {
            Op::Touch { va, write } => self.touch(va, write, tally),
            Op::Map {
                va,
                pa,
                len,
                prot,
                kind,
                barrier_per_entry,
                no_cont,
                fail: k,
            } => {
                let mut want = self.map_expected(va, pa, len);
                let need = want.is_ok().then(|| self.map_need(op));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n.tables {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let opts = map_options(kind, barrier_per_entry, no_cont);
                let f = |s: &mut Space<A>, _: &mut Space<A>| {
                    s.map(VirtAddr(va), PhysAddr(pa), len, prot, opts)
                };
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
                    let (s, _) = pages::<A>(va, len);
                    self.cur
                        .model
                        .insert(s, new_run::<A>(len >> A::PAGE_SHIFT, pa, prot));
                }
                self.after(&[(va, len)], got)
            }
            Op::Unmap { va, len, fail: k } => {
                let mut want = self.check(va, len);
                let need = want.is_ok().then(|| self.split_need(op));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let f = |s: &mut Space<A>, _: &mut Space<A>| s.unmap(VirtAddr(va), len);
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
                    let (s, e) = pages::<A>(va, len);
                    self.cur.model.take(s, e);
                    self.cur.model.take_swp(s, e);
                }
                self.after(&[(va, len)], got)
            }
            Op::Protect {
                va,
                len,
                prot,
                fail: k,
            } => {
                let mut want = self.check(va, len);
                let need = want.is_ok().then(|| self.split_need(op));
                if let (Some(n), Some(k)) = (need, k) {
                    if k < n {
                        want = Err(Error::OutOfMemory);
                    }
                }
                let f = |s: &mut Space<A>, _: &mut Space<A>| {
                    s.change_protection(VirtAddr(va), len, prot)
                };
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
                    let (s, e) = pages::<A>(va, len);
                    self.cur
                        .model
                        .protect(s, e, prot, &|r| reprotect::<A>(r, prot));
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
                let f = |s: &mut Space<A>, _: &mut Space<A>| {
                    s.move_page_tables(VirtAddr(old), VirtAddr(new), len, opts)
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
                    let (so, eo) = pages::<A>(old, len);
                    let (sn, _) = pages::<A>(new, len);
                    for (vpn, run) in self.cur.model.take(so, eo) {
                        self.cur.model.insert(vpn - so + sn, run);
                    }
                    for (vpn, v) in self.cur.model.take_swp(so, eo) {
                        self.cur.model.set_swp(vpn - so + sn, v);
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
                let f = |s: &mut Space<A>, _: &mut Space<A>| {
                    s.install_pte(VirtAddr(va), NewPte::Swap(value))
                };
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
                    self.cur.model.set_swp(va >> A::PAGE_SHIFT, value);
                }
                self.after(&[(va & !(page_size::<A>() - 1), page_size::<A>())], got)
            }
            Op::Replace { va, pa, prot, swap } => {
                // What `replace_pte` replaces: a software entry (its value
                // comes back), a page (its frame and accessed/dirty state;
                // whether the model's page is a PTE or part of a block is
                // the tables' business), or nothing.
                let vpn = va >> A::PAGE_SHIFT;
                let leaf_height = self
                    .cur
                    .space
                    .ptep_get(VirtAddr(va & !(page_size::<A>() - 1)))
                    .map(|e| e.height());
                let page = self.cur.model.page(vpn);
                let encodes = match swap {
                    Some(v) if A::swp_entry(v).is_none() => Err(Error::SwapValueTooWide(v)),
                    Some(_) => Ok(()),
                    None => check_phys::<A>(pa, page_size::<A>()),
                };
                let want = self
                    .check(va, page_size::<A>())
                    .and(encodes)
                    .and_then(|()| match (self.cur.model.swp(vpn), page) {
                        (Some(v), _) => Ok(Some(v)),
                        (None, Some(_)) if leaf_height == Some(0) => Ok(None),
                        (None, Some(_)) => Err(Error::BlockMapped(VirtAddr(va))),
                        (None, None) => Err(Error::NotMapped(VirtAddr(va))),
                    });
                let value = want.ok();
                // The entry returned is checked here (a mismatch panics,
                // which the episode reports as a failure).
                let f = |s: &mut Space<A>, _: &mut Space<A>| {
                    let new = match swap {
                        Some(v) => NewPte::Swap(v),
                        None => NewPte::Page {
                            pa: PhysAddr(pa),
                            prot,
                        },
                    };
                    s.replace_pte(VirtAddr(va), new).map(|old| {
                        let got = match old.swap_value() {
                            Some(v) => (Some(v), None),
                            None => (
                                None,
                                old.pa()
                                    .map(|p| (p.0 >> A::PAGE_SHIFT, old.young(), old.dirty())),
                            ),
                        };
                        let want = match (value, page) {
                            (Some(Some(v)), _) => (Some(v), None),
                            (_, Some(r)) => (None, Some((r.ppn, r.young, r.dirty))),
                            _ => (None, None),
                        };
                        assert_eq!(got, want, "replace_pte returned another entry");
                    })
                };
                let got = self.run_checked(
                    op,
                    None,
                    tally,
                    Expected {
                        name: "replace_pte",
                        want: want.map(|_| ()),
                        need: Some(0),
                    },
                    f,
                )?;
                if got {
                    self.cur.model.take_swp(vpn, vpn + 1);
                    self.cur.model.take(vpn, vpn + 1);
                    match swap {
                        Some(v) => self.cur.model.set_swp(vpn, v),
                        None => self.cur.model.insert(vpn, new_run::<A>(1, pa, prot)),
                    }
                }
                self.after(&[(va & !(page_size::<A>() - 1), page_size::<A>())], got)
            }
            _ => self.step_more(op, tally),
        }
    }
}
