//! The checks an episode runs after its steps: the machine, the table
//! count, translations against the model, loads and stores through the
//! MMU.

use crate::model::geometry;
use crate::model::geometry::top_vpn;
use pgtable_core::contract::level;
use pgtable_core::contract::level::page_size;
use pgtable_core::contract::{AccessFault, Arch};
use pgtable_core::sim::{SimFault, SimFaultKind};
use pgtable_core::{VaRange, VirtAddr};

use super::episode::{Episode, Slot};
use super::gen::Op;
use super::ops::unit_of;
use super::oracle;
use super::reference::{pages, push_run, vpn, Run};
use super::{fail, Failure, Tally, TOUCHED_MAX};

impl<A: Arch> Episode<A> {
    /// Tables reachable from both spaces.
    fn reachable(&self) -> usize {
        let other = self.other_tables.get().unwrap_or_else(|| {
            let n = self.other.space.inspect().count_tables();
            self.other_tables.set(Some(n));
            n
        });
        self.cur.space.inspect().count_tables() + other
    }

    pub(super) fn leak_check(&self, op: &Op) -> Result<(), Failure> {
        let (live, reachable) = (self.machine.live_tables(), self.reachable());
        if live != reachable {
            return fail(
                "leak",
                format!("after {op}: {live} table frames live, {reachable} reachable"),
            );
        }
        Ok(())
    }

    /// Checks after an operation on `ranges`: the machine, the table
    /// count and, when it succeeded, the ranges' translations.
    pub(super) fn after(&mut self, ranges: &[(u64, u64)], changed: bool) -> Result<(), Failure> {
        if let Err(e) = self.machine.check() {
            return fail("tlb", format!("machine check: {e}"));
        }
        let (live, reachable) = (self.machine.live_tables(), self.reachable());
        if live != reachable {
            return fail(
                "leak",
                format!("{live} table frames live, {reachable} reachable"),
            );
        }
        for &(va, len) in ranges {
            if self.check(va, len).is_err() {
                continue;
            }
            let (s, e) = pages::<A>(va, len);
            for p in [s.wrapping_sub(1), s, e - 1, e] {
                if self.cur.touched.len() < TOUCHED_MAX {
                    self.cur.touched.insert(p);
                }
                translate_check(&self.cur, p)?;
            }
            if changed {
                // Whole PUD entries around the range: splits change the
                // blocks the range covers in part.
                let g = geometry::pud::<A>() / page_size::<A>();
                let (ws, we) = (s & !(g - 1), e.div_ceil(g) * g);
                let (ws, we) = clip::<A>(self.cur.range, ws, we);
                window_check(&self.cur, ws, we)?;
                swap_check(&self.cur, ws, we)?;
            }
        }
        Ok(())
    }
}

/// Pages `[s, e)` clipped to what a space of `range` translates (the
/// walks check the range).
fn clip<A: Arch>(range: VaRange, s: u64, e: u64) -> (u64, u64) {
    let (first, last) = match range {
        VaRange::Both => {
            // The half of `s`.
            let half = 1u64 << (A::VA_BITS - 1 - A::PAGE_SHIFT);
            if s < half {
                (0, half - 1)
            } else {
                (top_vpn::<A>() - half, top_vpn::<A>() - 1)
            }
        }
        r => {
            let (f, l) = r.bounds::<A>();
            (f >> A::PAGE_SHIFT, l >> A::PAGE_SHIFT)
        }
    };
    (s.max(first), e.min(last + 1).max(s.max(first)))
}

/// The pages of each half `slot` translates.
fn halves<A: Arch>(range: VaRange) -> Vec<(u64, u64)> {
    match range {
        VaRange::Both => {
            let half = 1u64 << (A::VA_BITS - 1 - A::PAGE_SHIFT);
            vec![(0, half), (top_vpn::<A>() - half, top_vpn::<A>())]
        }
        r => {
            let (f, l) = r.bounds::<A>();
            vec![(f >> A::PAGE_SHIFT, (l >> A::PAGE_SHIFT) + 1)]
        }
    }
}

/// `translate` of page `p` (at an odd offset) against the model.
fn translate_check<A: Arch>(slot: &Slot<A>, p: u64) -> Result<(), Failure> {
    let va = (p << A::PAGE_SHIFT).wrapping_add(0x9a8);
    if p >= top_vpn::<A>() {
        return Ok(());
    }
    let got = slot.space.translate(VirtAddr(va)).map(|t| (t.pa.0, t.prot));
    let want = if slot.range.contains::<A>(va) {
        slot.model.lookup(p)
    } else {
        None
    };
    let want = want.map(|(ppn, prot)| ((ppn << A::PAGE_SHIFT) + 0x9a8, prot));
    if got != want {
        return fail(
            "translate",
            format!("translate({va:#x}) = {got:x?}, the model says {want:x?}"),
        );
    }
    Ok(())
}

/// The software entries in pages `[s, e)` (one canonical half)
/// against the model, through the tables and through `ptep_get` (`LeafEntry::swap_value`).
fn swap_check<A: Arch>(slot: &Slot<A>, s: u64, e: u64) -> Result<(), Failure> {
    if s >= e {
        return Ok(());
    }
    let got = oracle::swap_entries::<A>(&slot.space, s, e);
    let want = slot.model.swp_in(s, e);
    if got != want {
        let i = got.iter().zip(&want).position(|(a, b)| a != b);
        let i = i.unwrap_or(got.len().min(want.len()));
        return fail(
                "swap",
                format!(
                    "the tables in [{:#x}, {:#x}) hold the software entries {:x?}, the model says {:x?}",
                    s << A::PAGE_SHIFT,
                    e << A::PAGE_SHIFT,
                    got.get(i),
                    want.get(i)
                ),
            );
    }
    for (p, v) in want {
        let got = slot
            .space
            .ptep_get(VirtAddr(p << A::PAGE_SHIFT))
            .and_then(|e| e.swap_value());
        if got != Some(v) {
            return fail(
                "swap",
                format!(
                    "swap_entry({:#x}) = {got:x?}, the model says {v:#x}",
                    p << A::PAGE_SHIFT
                ),
            );
        }
    }
    Ok(())
}

/// The leaves in pages `[s, e)` (one canonical half) against the
/// model, accessed/dirty state included.
fn window_check<A: Arch>(slot: &Slot<A>, s: u64, e: u64) -> Result<(), Failure> {
    if s >= e {
        return Ok(());
    }
    let mut got = Vec::new();
    let r = slot.space.walk(
        VirtAddr(s << A::PAGE_SHIFT),
        (e - s) << A::PAGE_SHIFT,
        |m| {
            let (lo, hi) = (
                vpn::<A>(m.va.0).max(s),
                (vpn::<A>(m.va.0) + m.size / page_size::<A>()).min(e),
            );
            let run = Run {
                pages: hi - lo,
                ppn: vpn::<A>(m.pa.0) + (lo - vpn::<A>(m.va.0)),
                prot: m.prot,
                young: A::is_young(m.entry),
                dirty: A::is_dirty(m.entry),
            };
            push_run(&mut got, lo, run);
        },
    );
    if let Err(err) = r {
        return fail(
            "translate",
            format!(
                "walk({:#x}, {:#x}) failed: {err:?}",
                s << A::PAGE_SHIFT,
                (e - s) << A::PAGE_SHIFT
            ),
        );
    }
    let want = slot.model.runs_in(s, e);
    if got != want {
        let i = got
            .iter()
            .zip(&want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        let show = |v: &[(u64, Run)]| {
            v.get(i).map(|(p, r)| {
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
        };
        return fail(
            "translate",
            format!(
                "the tables in [{:#x}, {:#x}) map {:?}, the model says {:?}",
                s << A::PAGE_SHIFT,
                e << A::PAGE_SHIFT,
                show(&got),
                show(&want)
            ),
        );
    }
    Ok(())
}

impl<A: Arch> Episode<A> {
    /// Both spaces against their models (the other one only if `all` or
    /// it changed since the last check): every half they translate, every
    /// touched page, no empty table. Counts the leaves by size in `tally`.
    pub(super) fn full_check(&self, tally: &mut Tally, all: bool) -> Result<(), Failure> {
        let other = all || self.other_changed.replace(false);
        for slot in [&self.cur, &self.other]
            .into_iter()
            .take(1 + usize::from(other))
        {
            for (s, e) in halves::<A>(slot.range) {
                window_check(slot, s, e)?;
                swap_check(slot, s, e)?;
                let _ = slot.space.walk(
                    VirtAddr(s << A::PAGE_SHIFT),
                    (e - s) << A::PAGE_SHIFT,
                    |m| {
                        tally.note("leaves", geometry::size_name(level::size::<A>(m.height)));
                    },
                );
            }
            for &p in &slot.touched {
                translate_check(slot, p)?;
            }
            if let Some((va, h)) = oracle::empty_table::<A>(&slot.space) {
                return fail(
                    "tables",
                    format!("an empty table at height {h} (translating {va:#x}) is still linked"),
                );
            }
        }
        Ok(())
    }

    /// Dropping the spaces (a user space before its kernel) frees every
    /// table.
    pub(super) fn drop_check(self) -> Result<(), Failure> {
        let Episode {
            machine,
            cur,
            other,
            ..
        } = self;
        let (first, second) = if cur.kernel {
            (other, cur)
        } else {
            (cur, other)
        };
        drop(first);
        drop(second);
        let live = machine.live_tables();
        if live != 0 {
            return fail(
                "leak",
                format!("{live} table frames live after dropping the spaces"),
            );
        }
        Ok(())
    }

    /// A load or store through the MMU against the model.
    pub(super) fn touch(
        &mut self,
        va: u64,
        write: Option<u64>,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let op = Op::Touch { va, write };
        // The space translating `va` on the machine, if any.
        let other = [&self.cur, &self.other]
            .iter()
            .position(|s| s.installed && s.range.contains::<A>(va))
            .map(|i| i == 1);
        let slot = other.map(|o| if o { &self.other } else { &self.cur });
        let m = slot.and_then(|s| s.model.lookup(vpn::<A>(va)));
        let pa = m.map(|(ppn, _)| (ppn << A::PAGE_SHIFT) | (va & (page_size::<A>() - 1)));
        let got = match write {
            None => self.machine.read_u64(VirtAddr(va)),
            Some(v) => self.machine.write_u64(VirtAddr(va), v).map(|()| v),
        };
        tally.note(
            "touch",
            match (write, &got) {
                (_, Err(_)) => "fault",
                (None, Ok(_)) => "load",
                (Some(_), Ok(_)) => "store",
            },
        );
        // A `Prot::NONE` mapping faults as if nothing were mapped (the
        // entry is not valid for the hardware).
        let m = m.filter(|(_, prot)| !prot.protnone());
        let ok = match (m, write, got) {
            (
                None,
                _,
                Err(SimFault {
                    kind: SimFaultKind::Translation { .. } | SimFaultKind::NoRoot,
                    ..
                }),
            ) => true,
            (Some(_), None, Ok(v)) => v == *self.phys.get(&pa.unwrap()).unwrap_or(&0),
            (Some((_, prot)), Some(v), Ok(_)) if prot.writable() => {
                self.phys.insert(pa.unwrap(), v);
                true
            }
            (
                Some((_, prot)),
                Some(_),
                Err(SimFault {
                    kind: SimFaultKind::Permission(AccessFault::Write),
                    ..
                }),
            ) => !prot.writable(),
            _ => false,
        };
        if !ok {
            let want = match m {
                None => "a translation fault".to_string(),
                Some((ppn, prot)) => format!(
                    "pa {:#x} {prot:?} holding {:#x}",
                    (ppn << A::PAGE_SHIFT) | (va & (page_size::<A>() - 1)),
                    self.phys.get(&pa.unwrap()).unwrap_or(&0)
                ),
            };
            return fail(
                "touch",
                format!("{op} gave {got:x?}, the model says {want}"),
            );
        }
        if let (Some(o), Ok(_)) = (other, got) {
            // The access marked the translation accessed (and dirty).
            if o {
                std::mem::swap(&mut self.cur, &mut self.other);
                self.other_changed.set(true);
            }
            if let Some(unit) = unit_of::<A>(&self.cur.space, vpn::<A>(va)) {
                self.mark(unit, true, write.is_some());
            }
            if o {
                std::mem::swap(&mut self.cur, &mut self.other);
            }
        }
        Ok(())
    }
}
