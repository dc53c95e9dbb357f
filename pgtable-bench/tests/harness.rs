//! The fairness rules the benchmarks rely on, checked on the subjects
//! themselves: table frames come zeroed, and each subject frees (or keeps)
//! the tables an unmap empties as its label says.

use pgtable_bench::harness::{Pgtable, Subject, ZeroOnAlloc, G1, M2, PA, PAGE, VA};
use pgtable_core::contract::TableAlloc;
use pgtable_core::PhysAddr;
use pgtable_x86::X86_64;

#[test]
fn zero_on_alloc_hands_out_zeroed_frames_again() {
    let mut a = ZeroOnAlloc::default();
    let pa = a.alloc_table().unwrap();
    // SAFETY: a frame of ours, not freed.
    let t = unsafe { a.phys_to_virt(pa) };
    // SAFETY: the frame is ours and nothing else uses it.
    unsafe { t.as_ptr().cast::<u8>().write_bytes(0xa5, 4096) };
    assert_eq!(a.live(), 1);
    // SAFETY: ours, allocated, unreachable by any walker.
    unsafe { a.free_table(pa) };
    assert_eq!(a.live(), 0);
    let again = a.alloc_table().unwrap();
    assert_eq!(again, pa, "the warm free list is reused");
    // SAFETY: as above.
    let t = unsafe { a.phys_to_virt(again) };
    // SAFETY: a whole 4 KiB frame of ours.
    let bytes = unsafe { std::slice::from_raw_parts(t.as_ptr().cast::<u8>(), 4096) };
    assert!(bytes.iter().all(|&b| b == 0), "a reused frame is zeroed");
    assert_ne!(again, PhysAddr(0));
}

/// Tables held below the root with 1 GiB of pages mapped, and after the
/// unmap.
fn held(s: &mut dyn Subject) -> (usize, usize) {
    s.reset();
    let base = s.tables_held();
    s.map_pages(VA, G1);
    assert_eq!(s.translate(VA + G1 - 1), Some((PA + G1 - 1, true, PAGE)));
    let mapped = s.tables_held() - base;
    s.unmap_pages(VA, G1);
    assert_eq!(s.translate(VA), None);
    let after = s.tables_held() - base;
    s.reset();
    (mapped, after)
}

#[test]
fn table_freeing_matches_the_labels() {
    // A PUD table, a PMD table and 512 PTE tables.
    let all = 2 + 512;
    let mut p = Pgtable::<X86_64>::new(false);
    assert_eq!(held(&mut p), (all, 0), "pgtable frees");
    let mut x = pgtable_bench::x86::X86_64Crate::new(false);
    assert_eq!(held(&mut x), (all, all), "x86_64 keeps");
    let mut xc = pgtable_bench::x86::X86_64Crate::new(true);
    assert_eq!(held(&mut xc), (all, 0), "x86_64+clean_up frees");
    drop((x, xc));
    // aarch64-paging frees the subtables the range covers whole; the
    // level 1 table (512 GiB) stays.
    let mut a = pgtable_bench::arm64::Aarch64Paging::default();
    assert_eq!(held(&mut a), (all, 1), "aarch64-paging frees");
    let mut m = pgtable_bench::arm64::ptm::subject();
    assert_eq!(held(&mut m), (all, all), "page_table_multiarch keeps");
}

#[test]
fn riscv_subjects_map_and_free_as_labelled() {
    // Sv48 as x86 (a PUD table, a PMD table, 512 PTE tables); Sv39's root
    // is the PUD level, so one table fewer.
    let all = 2 + 512;
    let mut p = Pgtable::<pgtable_riscv::Sv48>::new(false);
    assert_eq!(held(&mut p), (all, 0), "pgtable Sv48 frees");
    let mut p = Pgtable::<pgtable_riscv::Sv39>::new(false);
    assert_eq!(held(&mut p), (all - 1, 0), "pgtable Sv39 frees");
    drop(p);
    let mut m = pgtable_bench::riscv::subject_sv48();
    assert_eq!(held(&mut m), (all, all), "page_table_multiarch Sv48 keeps");
    drop(m);
    let mut m = pgtable_bench::riscv::subject_sv39();
    assert_eq!(
        held(&mut m),
        (all - 1, all - 1),
        "page_table_multiarch Sv39 keeps"
    );
    // Both encode the same leaf: the peer's entries carry pgtable's bits.
    m.map_pages(VA, PAGE);
    assert_eq!(m.translate(VA + 5), Some((PA + 5, true, PAGE)));
    m.protect(VA, PAGE, false);
    assert_eq!(m.translate(VA), Some((PA, false, PAGE)));
    m.map_blocks(VA + G1, G1);
    assert_eq!(m.translate(VA + G1 + M2 + 1), Some((PA + M2 + 1, true, M2)));
}

#[test]
fn blocks_map_where_the_pa_is_not_1g_aligned() {
    let mut p = Pgtable::<X86_64>::new(false);
    p.map_blocks(VA, G1);
    assert_eq!(p.translate(VA + G1 - 1), Some((PA + G1 - 1, true, M2)));
    p.unmap_blocks(VA, G1);
    assert_eq!(p.translate(VA), None);
}
