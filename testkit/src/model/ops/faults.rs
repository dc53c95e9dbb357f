//! `ptep_set_access_flags` and `install_pte`: the fault-time operations.

use pgtable_core::contract::level;
use pgtable_core::contract::level::page_size;
use pgtable_core::contract::NewPte;
use std::cell::Cell;

use pgtable_core::contract::Arch;
use pgtable_core::{Error, PhysAddr, Prot, VirtAddr};

use super::unit_at;
use crate::model::episode::{Episode, Expected};
use crate::model::gen::{Fault, Op};
use crate::model::oracle::Space;
use crate::model::reference::Run;
use crate::model::{fail, Failure, Tally};

impl<A: Arch> Episode<A> {
    pub(super) fn fault(
        &mut self,
        op: &Op,
        va: u64,
        flags: Fault,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let vpn = va >> A::PAGE_SHIFT;
        // The result, and the pages and the change the model makes.
        let mut change = None;
        let want = if !self.contains(va) {
            Err(Error::OutOfRange(VirtAddr(va)))
        } else if self.cur.model.page(vpn).is_some_and(|r| r.prot.protnone()) {
            // Not an access-flag fault (Linux `do_numa_page`).
            Err(Error::ProtNone(VirtAddr(va)))
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
                let why = super::copy_live::bbm_reason_of::<A>(raw, change_of(raw), h);
                Err(Error::BreakBeforeMake(VirtAddr(va), why))
            } else {
                // A change of the write permission is made to the one leaf
                // (a folded run is unfolded first, Linux
                // `contpte_ptep_set_access_flags`); accessed/dirty state
                // to the whole translation.
                let size = level::size::<A>(h);
                let span = if mkwrite {
                    let s = (va & !(size - 1)) >> A::PAGE_SHIFT;
                    (s, s + (size >> A::PAGE_SHIFT))
                } else {
                    unit_at::<A>(va, h, raw)
                };
                change = Some((span, mkwrite));
                // Whether an entry of the span changes.
                let changed = (span.0..span.1)
                    .step_by((size >> A::PAGE_SHIFT) as usize)
                    .any(|p| {
                        let raw = self
                            .cur
                            .space
                            .inspect()
                            .entry(VirtAddr(p << A::PAGE_SHIFT), h)
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
        self.after(&[(va & !(page_size::<A>() - 1), page_size::<A>())], got)
    }

    pub(super) fn install(
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
        let f = |s: &mut Space<A>, _: &mut Space<A>| {
            s.install_pte(
                VirtAddr(va),
                NewPte::Page {
                    pa: PhysAddr(pa),
                    prot,
                },
            )
        };
        let exp = Expected {
            name: "install_pte",
            want,
            need,
        };
        let got = self.run_checked(op, k, tally, exp, f)?;
        if got {
            self.cur.model.insert(
                va >> A::PAGE_SHIFT,
                crate::model::episode::new_run::<A>(1, pa, prot),
            );
        }
        self.after(&[(va & !(page_size::<A>() - 1), page_size::<A>())], got)
    }
}
