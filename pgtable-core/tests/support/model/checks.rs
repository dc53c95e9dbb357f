//! The checks an episode runs after its steps: the machine, the table
//! count, translations against the model, loads and stores through the
//! MMU.

use pgtable_core::sim::{SimFault, SimFaultKind};
use pgtable_core::{AccessFault, Arch, VirtAddr};

use super::episode::Episode;
use super::gen::Op;
use super::oracle;
use super::reference::{canonical, check_range, pages, push_run, vpn, Run};
use super::{fail, Failure, Tally, TOUCHED_MAX};

impl<A: Arch> Episode<A> {
    pub(super) fn leak_check(&self, op: &Op) -> Result<(), Failure> {
        let (live, reachable) = (self.machine.live_tables(), self.space.count_tables());
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
        let (live, reachable) = (self.machine.live_tables(), self.space.count_tables());
        if live != reachable {
            return fail(
                "leak",
                format!("{live} table frames live, {reachable} reachable"),
            );
        }
        for &(va, len) in ranges {
            if check_range::<A>(va, len).is_err() {
                continue;
            }
            let (s, e) = pages(va, len);
            for p in [s.wrapping_sub(1), s, e - 1, e] {
                if self.touched.len() < TOUCHED_MAX {
                    self.touched.insert(p);
                }
                self.translate_check(p)?;
            }
            if changed {
                // Whole PUD entries around the range: splits change the
                // blocks the range covers in part.
                let g = 1 << 18;
                self.window_check(s & !(g - 1), e.div_ceil(g) * g)?;
                self.swap_check(s & !(g - 1), e.div_ceil(g) * g)?;
            }
        }
        Ok(())
    }

    /// `translate` of page `p` (at an odd offset) against the model.
    fn translate_check(&self, p: u64) -> Result<(), Failure> {
        let va = (p << 12).wrapping_add(0x9a8);
        if p >= 1 << 52 || !canonical::<A>(va) {
            return Ok(());
        }
        let got = self.space.translate(VirtAddr(va)).map(|t| (t.pa.0, t.prot));
        let want = self
            .model
            .lookup(p)
            .map(|(ppn, prot)| ((ppn << 12) + 0x9a8, prot));
        if got != want {
            return fail(
                "translate",
                format!("translate({va:#x}) = {got:x?}, the model says {want:x?}"),
            );
        }
        Ok(())
    }

    /// The software entries in pages `[s, e)` (one canonical half)
    /// against the model, through the tables and through `swap_entry`.
    fn swap_check(&self, s: u64, e: u64) -> Result<(), Failure> {
        let got = oracle::swap_entries::<A>(&self.space, s, e);
        let want = self.model.swp_in(s, e);
        if got != want {
            let i = got.iter().zip(&want).position(|(a, b)| a != b);
            let i = i.unwrap_or(got.len().min(want.len()));
            return fail(
                "swap",
                format!(
                    "the tables in [{:#x}, {:#x}) hold the software entries {:x?}, the model says {:x?}",
                    s << 12,
                    e << 12,
                    got.get(i),
                    want.get(i)
                ),
            );
        }
        for (p, v) in want {
            let got = self.space.swap_entry(VirtAddr(p << 12));
            if got != Some(v) {
                return fail(
                    "swap",
                    format!(
                        "swap_entry({:#x}) = {got:x?}, the model says {v:#x}",
                        p << 12
                    ),
                );
            }
        }
        Ok(())
    }

    /// The leaves in pages `[s, e)` (one canonical half) against the model.
    fn window_check(&self, s: u64, e: u64) -> Result<(), Failure> {
        let mut got = Vec::new();
        let r = self.space.walk(VirtAddr(s << 12), (e - s) << 12, |m| {
            let (lo, hi) = (vpn(m.va.0).max(s), (vpn(m.va.0) + m.size / 4096).min(e));
            let run = Run {
                pages: hi - lo,
                ppn: vpn(m.pa.0) + (lo - vpn(m.va.0)),
                prot: m.prot,
            };
            push_run(&mut got, lo, run);
        });
        if let Err(err) = r {
            return fail(
                "translate",
                format!("walk({:#x}, {:#x}) failed: {err:?}", s << 12, (e - s) << 12),
            );
        }
        let want = self.model.runs_in(s, e);
        if got != want {
            let i = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            let show = |v: &[(u64, Run)]| {
                v.get(i).map(|(p, r)| {
                    format!(
                        "{:#x}: {} pages at {:#x} {:?}",
                        p << 12,
                        r.pages,
                        r.ppn << 12,
                        r.prot
                    )
                })
            };
            return fail(
                "translate",
                format!(
                    "the tables in [{:#x}, {:#x}) map {:?}, the model says {:?}",
                    s << 12,
                    e << 12,
                    show(&got),
                    show(&want)
                ),
            );
        }
        Ok(())
    }

    /// Both halves against the model, every touched page, no empty table.
    /// Counts the leaves by size in `tally`.
    pub(super) fn full_check(&self, tally: &mut Tally) -> Result<(), Failure> {
        let half = 1u64 << (A::VA_BITS - 1 - 12);
        for (s, e) in [(0, half), ((1 << 52) - half, 1 << 52)] {
            self.window_check(s, e)?;
            self.swap_check(s, e)?;
            let _ = self.space.walk(VirtAddr(s << 12), (e - s) << 12, |m| {
                tally.note("leaves", ["4K", "2M", "1G"][m.height as usize]);
            });
        }
        for &p in &self.touched {
            self.translate_check(p)?;
        }
        if let Some((va, h)) = oracle::empty_table::<A>(&self.space) {
            return fail(
                "tables",
                format!("an empty table at height {h} (translating {va:#x}) is still linked"),
            );
        }
        Ok(())
    }

    /// Dropping the space frees every table.
    pub(super) fn drop_check(self) -> Result<(), Failure> {
        let Episode { machine, space, .. } = self;
        drop(space);
        let live = machine.live_tables();
        if live != 0 {
            return fail(
                "leak",
                format!("{live} table frames live after dropping the space"),
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
        let m = if canonical::<A>(va) {
            self.model.lookup(vpn(va))
        } else {
            None
        };
        let pa = m.map(|(ppn, _)| (ppn << 12) | (va & 0xfff));
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
        let ok = match (m, write, got) {
            (
                None,
                _,
                Err(SimFault {
                    kind: SimFaultKind::Translation { .. },
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
                    (ppn << 12) | (va & 0xfff),
                    self.phys.get(&pa.unwrap()).unwrap_or(&0)
                ),
            };
            return fail(
                "touch",
                format!("{op} gave {got:x?}, the model says {want}"),
            );
        }
        Ok(())
    }
}
