//! The count of the kernel linear map's folded runs, and the check that
//! every run that can fold is folded (see the parent module's docs).

// As in space.rs: failures carry their message inline.
#![allow(clippy::result_large_err)]

use super::*;

/// Attributes that must agree over a run for it to fold: the entry
/// without its output address, the hint itself and the accessed/dirty
/// state (which the hardware updates on any one entry of a run).
fn fold_attrs(raw: u64) -> u64 {
    let mut a = raw & !(OA_MASK | AF | CONT | SW_DIRTY);
    if raw & DBM != 0 {
        a &= !AP_RDONLY;
    }
    a
}

/// Runs of the linear map at one level.
#[derive(Clone, Copy, Default, Debug)]
pub(super) struct RunCount {
    /// Runs with the hint on all their entries.
    pub(super) folded: u64,
    /// Runs that may be folded: a run's leaves mapping one aligned, contiguous
    /// physical range with the same attributes.
    pub(super) foldable: u64,
}

/// Counts the folded runs of the kernel's linear map (pages and level-2
/// blocks), and checks that every run that could be folded is, and that
/// no run has the hint on only some of its entries.
pub(super) fn linear_map_runs(k: &KernelSpace) -> Result<[RunCount; 2], Why> {
    let mut counts = [RunCount::default(); 2];
    // The leaves of one run being gathered, per height: its start, the
    // entries seen so far.
    let mut cur = [(u64::MAX, [0u64; MAX_RUN], 0 as Mask); 2];
    let mut bad: Option<(u64, Mask, bool)> = None;
    let mut finish = |h: usize, start: u64, raw: &[u64; MAX_RUN], seen: Mask| {
        let size = if h == 0 { PAGE } else { BLOCK };
        let n = run_len(h as u32);
        let e = RunEntries {
            raw: *raw,
            len: n as usize,
        };
        let m = cont_mask(&e);
        let first = e.raw[0] & OA_MASK;
        let foldable = seen == full(n)
            && first & (n * size - 1) == 0
            && e.entries().iter().enumerate().all(|(i, &r)| {
                r & OA_MASK == first + i as u64 * size && fold_attrs(r) == fold_attrs(e.raw[0])
            });
        counts[h].foldable += u64::from(foldable);
        counts[h].folded += u64::from(foldable && m == full(n));
        if (foldable && m != full(n)) || (!foldable && m != 0) {
            bad.get_or_insert((start, m, foldable));
        }
    };
    k.walk(VirtAddr(PAGE_OFFSET), KERNEL_VA_END - PAGE_OFFSET, |m| {
        let h = m.height as usize;
        if h > 1 || m.va.0 >= PAGE_OFFSET + (1 << 39) {
            return; // 1 GiB blocks, or not the linear map
        }
        let size = m.size;
        let start = m.va.0 & !(run_len(h as u32) * size - 1);
        let (s, e, seen) = &mut cur[h];
        if *s != start {
            if *s != u64::MAX {
                let (s0, e0, seen0) = (*s, *e, *seen);
                finish(h, s0, &e0, seen0);
            }
            *s = start;
            *e = [0; MAX_RUN];
            *seen = 0;
        }
        let i = ((m.va.0 - start) / size) as usize;
        e[i] = m.entry;
        *seen |= 1 << i;
    })
    .map_err(|e| Why::new(format_args!("walking the linear map: {e}")))?;
    for (h, &(s, e, seen)) in cur.iter().enumerate() {
        if s != u64::MAX {
            finish(h, s, &e, seen);
        }
    }
    if let Some((start, m, foldable)) = bad {
        fail!(
            "the linear map's run at {start:#x} is {}foldable but has the hint on entries {m:#06x}",
            if foldable { "" } else { "not " },
        );
    }
    Ok(counts)
}
