//! Every gathered call of the model test, in one place: a sequence of
//! operations into one caller-owned gather (Linux `tlb_gather_mmu`), then
//! one `finish`, which flushes and frees.

use pgtable_core::contract::Arch;
use pgtable_core::{Error, LeafEntry, VirtAddr};

use super::gen::GStep;
use super::oracle::Space;

/// Runs `steps` into one gather of `space` and finishes it once.
/// `report(i, entry)` receives what step `i` reports; `between(i, result)`
/// runs after step `i` (before the finish), without the space. Returns
/// each step's result.
pub fn run<A: Arch>(
    space: &mut Space<A>,
    steps: &[GStep],
    report: &mut dyn FnMut(usize, LeafEntry<A>),
    between: &mut dyn FnMut(usize, &Result<(), Error>),
) -> Result<Vec<Result<(), Error>>, String> {
    let mut tlb = space.tlb_gather_mmu();
    let mut out = Vec::new();
    for (i, st) in steps.iter().enumerate() {
        let r = match *st {
            GStep::Unmap { va, len } => tlb.unmap(VirtAddr(va), len),
            GStep::UnmapWith { va, len } => tlb.unmap_with(VirtAddr(va), len, |e| report(i, e)),
            GStep::Protect { va, len, prot } => tlb.change_protection(VirtAddr(va), len, prot),
            GStep::ClearRefs { va, len, what } => {
                tlb.clear_refs(VirtAddr(va), len, what.what(), |e| report(i, e))
            }
        };
        between(i, &r);
        out.push(r);
    }
    tlb.finish();
    Ok(out)
}
