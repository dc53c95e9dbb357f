//! Svnapot on the simulated machine: what the algorithms do with a
//! format whose harts have Svnapot. A 64 KiB NAPOT run holds 16 identical
//! PTEs (the walker substitutes the low four bits of the page number), so
//! no entry of a run names its own page, while pgtable-core's contiguous
//! runs need each entry to: the format declares no runs, `map` never
//! writes N, and every page still translates to its own frame.

use pgtable_core::contract::{Decoded, Format};
use pgtable_core::sim::{Installed, SimMachine};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::bits::N;
use pgtable_riscv::{RiscvPaging, SVNAPOT, SVPBMT};

type Full48 = RiscvPaging<4, { SVPBMT | SVNAPOT }>;

#[test]
fn map_of_aligned_64k_runs_writes_no_napot_pte() {
    let m = SimMachine::<Full48>::new();
    let s = AddressSpace::<Full48, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    let va = VirtAddr(0x4000_0000);
    s.map(
        va,
        PhysAddr(0x8000_0000),
        0x4_0000,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    for j in 0..64u64 {
        let page = VirtAddr(va.0 + j * 0x1000);
        let raw = s.inspect().entry(page, 0).unwrap();
        assert_eq!(raw & N, 0, "page {j}");
        assert_eq!(
            Full48::decode(raw, 0),
            Decoded::Leaf(PhysAddr(0x8000_0000 + j * 0x1000))
        );
        assert_eq!(
            m.translate(VirtAddr(page.0 + 8)).unwrap(),
            PhysAddr(0x8000_0000 + j * 0x1000 + 8)
        );
    }
    s.unmap(va, 0x4_0000).unwrap();
    m.check().unwrap();
}

#[test]
fn a_napot_run_maps_each_address_to_its_own_page() {
    let base = PhysAddr(0x8000_0000);
    let pte = Full48::try_napot_64k(base, Prot::READ_WRITE).unwrap();
    // The 16 entries of the run all hold `pte`.
    let run = [pte; 16];
    for (j, e) in run.iter().enumerate() {
        let va = VirtAddr(0x4000_0000 + j as u64 * 0x1000);
        assert_eq!(
            Full48::napot_page(*e, 0, va),
            Some(PhysAddr(base.0 + j as u64 * 0x1000))
        );
        // A/D are per entry, as the hardware updates the one it walked.
        assert!(Full48::is_young(*e));
        assert!(!Full48::is_dirty(Full48::mkclean(*e, 0)));
    }
    // Without Svnapot N is reserved.
    assert_eq!(RiscvPaging::<4>::decode(pte, 0), Decoded::Invalid);
}
