//! `copy_page_range` into the other space, and live permission changes.

use pgtable_core::contract::{Arch, BbmReason, Decoded};
use pgtable_core::{CopyMode, Error, LiveOptions, Prot, VirtAddr};

use super::unit_at;
use crate::model::episode::{reprotect, Episode, Expected};
use crate::model::gen::Op;
use crate::model::oracle::Space;
use crate::model::reference::{check_range_in, pages, Run};
use crate::model::{Failure, Tally};

impl<A: Arch> Episode<A> {
    pub(super) fn copy(
        &mut self,
        op: &Op,
        (va, len, cow): (u64, u64, bool),
        k: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let want = self.check(va, len).and_then(|()| {
            check_range_in::<A>(self.other.range, va, len)?;
            let (s, e) = pages::<A>(va, len);
            match self.other.model.first_mapped(s, e) {
                Some(p) => Err(Error::AlreadyMapped(VirtAddr(p << A::PAGE_SHIFT))),
                None => Ok(()),
            }
        });
        let mode = if cow { CopyMode::Cow } else { CopyMode::Shared };
        let f = |s: &mut Space<A>, d: &mut Space<A>| {
            s.copy_page_range(d, VirtAddr(va), len, mode, |_| {})
        };
        let exp = Expected {
            name: "copy",
            want,
            need: None,
        };
        let got = self.run_checked(op, k, tally, exp, f)?;
        if got {
            let (s, e) = pages::<A>(va, len);
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
    /// Without break-before-make rules (RISC-V) only the folded run
    /// covered in part: its unfold clears the whole run.
    pub(super) fn live_refusal(&self, va: u64, len: u64, prot: Prot) -> Option<(u64, BbmReason)> {
        let end = u128::from(va) + u128::from(len);
        let mut hit = None;
        let _ = self.cur.space.walk(VirtAddr(va), len, |m| {
            if hit.is_some() || m.prot == prot.normalized() {
                return;
            }
            let h = m.height;
            let ls = u128::from(m.va.0);
            let whole = ls >= u128::from(va) && ls + u128::from(m.size) <= end;
            let (rs, re) = unit_at::<A>(m.va.0, h, m.entry);
            let (rs, re) = (
                u128::from(rs) << A::PAGE_SHIFT,
                u128::from(re) << A::PAGE_SHIFT,
            );
            // (For a leaf outside a run, the unit is the leaf: covered in
            // part means `!whole`.)
            let run_part = A::is_cont(m.entry, h) && (rs < u128::from(va) || re > end);
            let new = A::modify_prot(m.entry, prot, h);
            let unsafe_change = !A::change_is_safe(m.entry, new, h);
            let why = if run_part {
                BbmReason::ContiguousRun
            } else if !whole {
                BbmReason::BlockSplit
            } else {
                bbm_reason_of::<A>(m.entry, new, h)
            };
            // A `Prot::NONE` block is invalid for the hardware: split in
            // place (nothing can be cached from it).
            let split = !whole && !A::is_protnone(m.entry, h);
            if run_part || (A::BREAK_BEFORE_MAKE && (split || unsafe_change)) {
                hit = Some((m.va.0.max(va), why));
            }
        });
        hit
    }

    pub(super) fn live(
        &mut self,
        op: &Op,
        (va, len, prot, bbm): (u64, u64, Prot, bool),
        k: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let mut want = self.check(va, len);
        let has_runs = (0..A::LEVELS).any(|h| A::cont_entries(h) != 0);
        if want.is_ok() && (A::BREAK_BEFORE_MAKE || has_runs) && !bbm {
            if let Some((at, why)) = self.live_refusal(va, len, prot) {
                want = Err(Error::BreakBeforeMake(VirtAddr(at), why));
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
            let (s, e) = pages::<A>(va, len);
            self.cur
                .model
                .protect(s, e, prot, &|r| reprotect::<A>(r, prot));
        }
        self.after(&[(va, len)], got)
    }
}

/// The model's reason for a change of the leaf `old` to `new` at `height`
/// that needs break-before-make: a change of the contiguous hint, of the
/// output address, of the memory type, or non-global to global (the
/// rules `BbmReason` names, in that order).
pub(super) fn bbm_reason_of<A: Arch>(old: u64, new: u64, height: u32) -> BbmReason {
    let (p, q) = (A::leaf_prot(old, height), A::leaf_prot(new, height));
    let (a, b) = (A::decode(old, height), A::decode(new, height));
    if !matches!((a, b), (Decoded::Leaf(_), Decoded::Leaf(_))) {
        BbmReason::BlockSplit
    } else if A::is_cont(old, height) != A::is_cont(new, height) {
        BbmReason::ContiguousRun
    } else if a != b {
        BbmReason::OutputAddress
    } else if p.mem() == q.mem() && !p.global() && q.global() {
        BbmReason::NonGlobalToGlobal
    } else {
        BbmReason::MemoryType
    }
}
