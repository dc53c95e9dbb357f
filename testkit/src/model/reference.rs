//! The reference model: what is mapped, kept as runs of pages, and the
//! results the documentation promises for bad input.
//!
//! Addresses are kept as page numbers (`va >> PAGE_SHIFT` of the format),
//! so the end of a run at the very top of the 64-bit space (2^52 pages of
//! 4 KiB) needs no wrapping.

use std::collections::BTreeMap;

use pgtable_core::contract::{level, Format};
use pgtable_core::{Error, PhysAddr, Prot, VaRange, VirtAddr};

use super::gen::Rng;

/// Consecutive virtual pages mapped to consecutive physical pages with one
/// protection and one accessed/dirty state.
///
/// The accessed (`young`) and dirty state of a page is the state of the
/// translation covering it as the documented readers report it: the
/// leaf's own for a page or a block, the OR over the run for a page of a
/// folded contiguous run (Linux `contpte_ptep_get`). A load or store sets
/// it on the whole translation (the leaf, or the folded run), a split or
/// an unfold hands it to every piece.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Run {
    /// Number of pages.
    pub pages: u64,
    /// Physical page number of the first page.
    pub ppn: u64,
    /// The protection every page grants.
    pub prot: Prot,
    /// Accessed since last cleared.
    pub young: bool,
    /// Written since last cleaned.
    pub dirty: bool,
}

impl Run {
    /// Whether `next`, starting right after this run, continues it.
    fn continued_by(&self, next: &Run) -> bool {
        self.ppn + self.pages == next.ppn
            && self.prot == next.prot
            && (self.young, self.dirty) == (next.young, next.dirty)
    }
}

/// The mapped pages: first virtual page number of each run to the run.
/// Runs never overlap; adjacent runs that continue each other are merged,
/// so equal mappings have equal models.
#[derive(Clone, Default, Debug)]
pub struct Model {
    runs: BTreeMap<u64, Run>,
    /// Software entries: virtual page number to value. A page is either
    /// in a run or here, never both.
    swp: BTreeMap<u64, u64>,
}

impl Model {
    /// Whether nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The physical page and protection of the virtual page `vpn`.
    pub fn lookup(&self, vpn: u64) -> Option<(u64, Prot)> {
        let (&start, run) = self.runs.range(..=vpn).next_back()?;
        (vpn < start + run.pages).then(|| (run.ppn + (vpn - start), run.prot))
    }

    /// The first page in `[s, e)` that is mapped or holds a software
    /// entry (what the operations report as occupied).
    pub fn first_mapped(&self, s: u64, e: u64) -> Option<u64> {
        let swp = self.swp.range(s..e).next().map(|(&p, _)| p);
        let run = self.first_run(s, e);
        match (run, swp) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first page in `[s, e)` that is mapped.
    fn first_run(&self, s: u64, e: u64) -> Option<u64> {
        if let Some((&start, run)) = self.runs.range(..=s).next_back() {
            if s < start + run.pages {
                return Some(s);
            }
        }
        self.runs.range(s..e).next().map(|(&start, _)| start)
    }

    /// The software entry of page `vpn`.
    pub fn swp(&self, vpn: u64) -> Option<u64> {
        self.swp.get(&vpn).copied()
    }

    /// Puts a software entry at the unmapped page `vpn`.
    pub fn set_swp(&mut self, vpn: u64, value: u64) {
        debug_assert!(self.lookup(vpn).is_none());
        self.swp.insert(vpn, value);
    }

    /// Removes the software entries in `[s, e)` and returns them.
    pub fn take_swp(&mut self, s: u64, e: u64) -> Vec<(u64, u64)> {
        let keys: Vec<u64> = self.swp.range(s..e).map(|(&k, _)| k).collect();
        keys.into_iter()
            .map(|k| (k, self.swp.remove(&k).expect("listed")))
            .collect()
    }

    /// One of the pages with a software entry, chosen by `r`.
    pub fn some_swp(&self, r: u64) -> Option<u64> {
        let n = self.swp.len() as u64;
        (n > 0).then(|| *self.swp.keys().nth((r % n) as usize).expect("in range"))
    }

    /// The software entries in `[s, e)`.
    pub fn swp_in(&self, s: u64, e: u64) -> Vec<(u64, u64)> {
        self.swp.range(s..e).map(|(&k, &v)| (k, v)).collect()
    }

    /// Makes `vpn` the first page of a run if it lies inside one.
    fn cut(&mut self, vpn: u64) {
        let Some((&start, &run)) = self.runs.range(..vpn).next_back() else {
            return;
        };
        if vpn < start + run.pages {
            let head = vpn - start;
            self.runs.insert(start, Run { pages: head, ..run });
            self.runs.insert(
                vpn,
                Run {
                    pages: run.pages - head,
                    ppn: run.ppn + head,
                    ..run
                },
            );
        }
    }

    /// Removes `[s, e)` and returns what was mapped there.
    pub fn take(&mut self, s: u64, e: u64) -> Vec<(u64, Run)> {
        self.cut(s);
        self.cut(e);
        let keys: Vec<u64> = self.runs.range(s..e).map(|(&k, _)| k).collect();
        keys.into_iter()
            .map(|k| (k, self.runs.remove(&k).expect("listed")))
            .collect()
    }

    /// Maps the free pages `[vpn, vpn + run.pages)`.
    pub fn insert(&mut self, vpn: u64, run: Run) {
        debug_assert!(self.first_mapped(vpn, vpn + run.pages).is_none());
        self.runs.insert(vpn, run);
        self.merge_at(vpn + run.pages);
        self.merge_at(vpn);
    }

    /// Merges the run starting at `vpn` into the one before it, if it
    /// continues it.
    fn merge_at(&mut self, vpn: u64) {
        let Some(&next) = self.runs.get(&vpn) else {
            return;
        };
        let Some((&start, &prev)) = self.runs.range(..vpn).next_back() else {
            return;
        };
        if start + prev.pages == vpn && prev.continued_by(&next) {
            self.runs.remove(&vpn);
            self.runs.insert(
                start,
                Run {
                    pages: prev.pages + next.pages,
                    ..prev
                },
            );
        }
    }

    /// Gives every mapped page in `[s, e)` the protection `prot`; where
    /// it changes, the accessed and dirty state become `ad` of the run
    /// (the format's `modify_prot`: arm64 makes writable kernel leaves
    /// dirty).
    pub fn protect(&mut self, s: u64, e: u64, prot: Prot, ad: &dyn Fn(&Run) -> (bool, bool)) {
        // What a mapping of `prot` reports (`Prot::NONE` drops the rest).
        let prot = prot.normalized();
        self.update(s, e, |r| {
            if r.prot == prot {
                return r;
            }
            let (young, dirty) = ad(&r);
            Run {
                prot,
                young,
                dirty,
                ..r
            }
        });
    }

    /// Replaces every mapped run in `[s, e)` (clipped) by `f` of it.
    pub fn update(&mut self, s: u64, e: u64, f: impl Fn(Run) -> Run) {
        for (vpn, run) in self.take(s, e) {
            self.insert(vpn, f(run));
        }
    }

    /// The run holding page `vpn`, clipped to that one page.
    pub fn page(&self, vpn: u64) -> Option<Run> {
        let (&start, run) = self.runs.range(..=vpn).next_back()?;
        (vpn < start + run.pages).then(|| Run {
            pages: 1,
            ppn: run.ppn + (vpn - start),
            ..*run
        })
    }

    /// The runs inside `[s, e)`, clipped to it.
    pub fn runs_in(&self, s: u64, e: u64) -> Vec<(u64, Run)> {
        let mut out = Vec::new();
        let first = self
            .runs
            .range(..=s)
            .next_back()
            .filter(|(&start, run)| s < start + run.pages)
            .map(|(&start, _)| start)
            .unwrap_or(s);
        for (&start, &run) in self.runs.range(first..e) {
            let lo = start.max(s);
            let hi = (start + run.pages).min(e);
            push_run(
                &mut out,
                lo,
                Run {
                    pages: hi - lo,
                    ppn: run.ppn + (lo - start),
                    ..run
                },
            );
        }
        out
    }

    /// A mapped page, chosen at random near `hint` (the first run at or
    /// after it, else the last run).
    pub fn random_page(&self, rng: &mut Rng, hint: u64) -> Option<u64> {
        let (&start, run) = self
            .runs
            .range(hint..)
            .next()
            .or_else(|| self.runs.iter().next_back())?;
        Some(start + rng.below(run.pages))
    }
}

/// Appends a run to a list in address order, merging it into the last one
/// when it continues it.
pub fn push_run(out: &mut Vec<(u64, Run)>, vpn: u64, run: Run) {
    if let Some((start, last)) = out.last_mut() {
        if *start + last.pages == vpn && last.continued_by(&run) {
            last.pages += run.pages;
            return;
        }
    }
    out.push((vpn, run));
}

/// Whether `va` is canonical for `A` (bits 63..VA_BITS-1 all equal): what
/// every format in this workspace accepts, checked against `VaRange::Both`
/// by the driver.
pub fn canonical<A: Format>(va: u64) -> bool {
    let top = (va as i64) >> (A::VA_BITS - 1);
    top == 0 || top == -1
}

/// What the operations must return for the virtual range `[va, va + len)`,
/// checked in the order the operations document their errors: zero length,
/// misaligned start, misaligned length, then the range.
///
/// [`Error::OutOfRange`] carries the first address of the range that is
/// not valid: `va` itself when it is not canonical, the start of the
/// non-canonical hole when a lower-half range runs into it (whatever the
/// length, so also when `va + len` would pass 2^64), and `va` when an
/// upper-half range runs past the top of the 64-bit space (the first
/// invalid address, 2^64, has no 64-bit value; the start names the range).
///
/// In a space of one half ([`VaRange::Lower`] / [`VaRange::Upper`]) the
/// range must lie in [`VaRange::bounds`]: `va` itself when it is outside,
/// else the first address past the half's end (and `va` when that end is
/// the top of the 64-bit space, as above).
pub fn check_range_in<A: Format>(range: VaRange, va: u64, len: u64) -> Result<(), Error> {
    if range == VaRange::Both {
        return check_range::<A>(va, len);
    }
    check_shape::<A>(va, len)?;
    let (first, last) = range.bounds::<A>();
    if va < first || va > last {
        return Err(Error::OutOfRange(VirtAddr(va)));
    }
    if u128::from(va) + u128::from(len) > u128::from(last) + 1 {
        if last == u64::MAX {
            return Err(Error::OutOfRange(VirtAddr(va)));
        }
        return Err(Error::OutOfRange(VirtAddr(last + 1)));
    }
    Ok(())
}

/// Zero length, misaligned start, misaligned length.
fn check_shape<A: Format>(va: u64, len: u64) -> Result<(), Error> {
    if len == 0 {
        return Err(Error::ZeroLength);
    }
    if va % level::page_size::<A>() != 0 {
        return Err(Error::MisalignedVirt(VirtAddr(va)));
    }
    if len % level::page_size::<A>() != 0 {
        return Err(Error::MisalignedLength(len));
    }
    Ok(())
}

/// [`check_range_in`] for a space of both halves.
pub fn check_range<A: Format>(va: u64, len: u64) -> Result<(), Error> {
    check_shape::<A>(va, len)?;
    if !canonical::<A>(va) {
        return Err(Error::OutOfRange(VirtAddr(va)));
    }
    let hole = 1u128 << (A::VA_BITS - 1);
    let end = u128::from(va) + u128::from(len);
    if u128::from(va) < hole {
        if end > hole {
            return Err(Error::OutOfRange(VirtAddr(hole as u64)));
        }
    } else if end > 1u128 << 64 {
        return Err(Error::OutOfRange(VirtAddr(va)));
    }
    Ok(())
}

/// What `map` must return for the physical range `[pa, pa + len)`:
/// misaligned, or not encodable in `PA_BITS` (reported with its start).
pub fn check_phys<A: Format>(pa: u64, len: u64) -> Result<(), Error> {
    if pa % level::page_size::<A>() != 0 {
        return Err(Error::MisalignedPhys(PhysAddr(pa)));
    }
    if u128::from(pa) + u128::from(len) > 1u128 << A::PA_BITS {
        return Err(Error::PhysOutOfRange(PhysAddr(pa)));
    }
    Ok(())
}

/// Page number of `va`.
pub fn vpn<A: Format>(va: u64) -> u64 {
    va >> A::PAGE_SHIFT
}

/// `[first page, end page)` of a range that [`check_range`] accepted.
pub fn pages<A: Format>(va: u64, len: u64) -> (u64, u64) {
    (vpn::<A>(va), vpn::<A>(va) + len / level::page_size::<A>())
}
