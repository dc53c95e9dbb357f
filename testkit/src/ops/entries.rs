//! `Inspector::entries`: the walk that reports software entries too.

use pgtable_core::contract::{Arch, NewPte};
use pgtable_core::{Error, LeafEntry, MapOptions, PhysAddr, VirtAddr};

use super::{map, rec, setup, Rec, G1, K4, KRW, M2, PA, URW, VA};

/// Pages, software entries among them, a 2 MiB block and a 1 GiB block
/// where the format has them: `entries` reports each once in address
/// order (the software entries with their values), `walk` the present
/// ones only, and both agree on those; a bad range reports nothing.
pub fn entries_report_leaves_and_software_entries<A: Arch>() {
    let (_m, mut s) = setup::<A>();
    let mut want = Vec::new();
    for i in 0..40u64 {
        let va = VA + i * K4;
        if i % 3 == 0 {
            s.install_pte(VirtAddr(va), NewPte::Swap(1000 + i)).unwrap();
            want.push((va, K4, None, Some(1000 + i)));
        } else if i % 3 == 1 {
            let pa = PhysAddr(PA + i * K4);
            s.install_pte(VirtAddr(va), NewPte::Page { pa, prot: URW })
                .unwrap();
            want.push((va, K4, Some(pa.0), None));
        }
    }
    map(&mut s, 3 * M2, M2, URW, MapOptions::BLOCKS);
    want.push((VA + 3 * M2, M2, Some(PA + 3 * M2), None));
    let len = if A::leaf_allowed(2) {
        map(&mut s, G1, G1, KRW, MapOptions::BLOCKS);
        want.push((VA + G1, G1, Some(PA + G1), None));
        2 * G1
    } else {
        G1
    };
    let mut got: Vec<LeafEntry<A>> = Vec::new();
    s.inspect()
        .entries(VirtAddr(VA), len, |e| got.push(e))
        .unwrap();
    let seen: Vec<_> = got
        .iter()
        .map(|e| (e.va().0, e.size(), e.pa().map(|p| p.0), e.swap_value()))
        .collect();
    assert_eq!(seen, want);
    // The present ones are what walk reports, raw entries included.
    let mut walked = Vec::new();
    s.walk(VirtAddr(VA), len, |m| {
        walked.push((m.va, m.pa, m.size, m.entry))
    })
    .unwrap();
    let present: Vec<_> = got
        .iter()
        .filter(|e| e.is_present())
        .map(|e| (e.va(), e.pa().unwrap(), e.size(), e.raw()))
        .collect();
    assert_eq!(present, walked);
    // A range in the middle of a block reports the block; of a page, that
    // page only.
    let mut part: Vec<Rec> = Vec::new();
    s.inspect()
        .entries(VirtAddr(VA + 3 * M2 + 5 * K4), K4, |e| part.push(rec(e)))
        .unwrap();
    assert_eq!(part.len(), 1);
    assert_eq!((part[0].va, part[0].size), (VA + 3 * M2, M2));
    // Errors: nothing reported.
    let mut n = 0;
    let r = s.inspect().entries(VirtAddr(VA + 1), K4, |_| n += 1);
    assert_eq!(r, Err(Error::MisalignedVirt(VirtAddr(VA + 1))));
    assert_eq!(
        s.inspect().entries(VirtAddr(VA), 0, |_| n += 1),
        Err(Error::ZeroLength)
    );
    assert_eq!(n, 0);
}
