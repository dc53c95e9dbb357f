//! The size sweep and the table-memory census behind `cargo xtask bench`'s
//! report; prints CSV on stdout (`--quick`: fewer sizes and samples).
//!
//! Built with the workspace's `[profile.bench]` (fat LTO, one codegen unit)
//! by `cargo run -p pgtable-bench --profile bench --bin sweep`.
//!
//! - `sweep,<op>,<bytes>,<ns>,<unit>`: pgtable on the x86_64 format
//!   (`AddressSpace<X86_64, NoopMmu, ZeroOnAlloc>`, no TLB work), the
//!   median over samples of the cost per `unit` (`page` or `GiB`) of one
//!   ranged call of `bytes`. Each timed sample is a batch of calls covering
//!   at least 1 GiB between one pair of clock reads (the clock is
//!   amortised), the untimed setup and teardown around it. Ops: `map-4K`,
//!   `unmap-4K` (frees the emptied tables), `protect-4K` (RW -> RO of fresh kernel
//!   pages, every entry changes: plain stores), `move-pte` (`variants::PTES_ONLY`, per page),
//!   `move-pmd` (`PMD_ONLY`, per GiB) and `move` (the default: whole PUD
//!   entries where the range covers them, PMD entries below 1 GiB; per
//!   GiB). The moves go between two 1 GiB-aligned ranges. `floor` is not
//!   pgtable: one relaxed 8-byte atomic store per page into a buffer as
//!   large as the PTE tables of the range, the host's floor for any code
//!   that writes one entry per page.
//! - `memory,<arch>,<subject>,<state>,<bytes>`: table memory, in bytes per
//!   GiB, that each subject holds below its root with 1 GiB mapped
//!   (`mapped-4K`, `mapped-2M`) and after unmapping it (`unmapped-4K`,
//!   `unmapped-2M`), counted by each subject's frame allocator.
// Reached only by `cargo xtask bench`; `missing_docs` is for libraries.
#![allow(missing_docs)]

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use pgtable_arm64::Arm64;
use pgtable_bench::harness::{clock, Pgtable, Subject, G1, M2, PAGE, VA};
use pgtable_core::{variants, MoveOptions, VirtAddr};
use pgtable_x86::X86_64;

/// Where the moves start and end (1 GiB aligned, far from `VA`).
const FROM: u64 = 1 << 40;
const TO: u64 = 2 << 40;

/// Times `op` over a batch of ranges of `size` bytes starting at `base`
/// (at least 1 GiB in all), `samples` times; returns the median of the
/// batch times divided by the batch's count of `unit` bytes.
fn sweep_one(
    s: &mut Pgtable<X86_64>,
    size: u64,
    samples: usize,
    unit: u64,
    before: &mut dyn FnMut(&mut Pgtable<X86_64>, u64),
    op: &mut dyn FnMut(&mut Pgtable<X86_64>, u64),
    after: &mut dyn FnMut(&mut Pgtable<X86_64>, u64),
) -> f64 {
    let n = (G1 / size).max(1);
    let ranges: Vec<u64> = (0..n).map(|k| k * size).collect();
    let mut t: Vec<Duration> = Vec::with_capacity(samples);
    // One warm-up batch, not kept: the allocator's free list fills up.
    for i in 0..=samples {
        for &off in &ranges {
            before(s, off);
        }
        let t0 = clock::now();
        for &off in &ranges {
            op(s, off);
        }
        let dt = clock::now() - t0;
        for &off in &ranges {
            after(s, off);
        }
        if i > 0 {
            t.push(dt);
        }
    }
    t.sort();
    let median = t[t.len() / 2].as_nanos() as f64;
    median / (n * size / unit) as f64
}

/// The host floor (see the module docs): ns per page.
fn floor(size: u64, samples: usize) -> f64 {
    let pages = (G1.max(size) / PAGE) as usize;
    let buf: Vec<AtomicU64> = (0..pages).map(|_| AtomicU64::new(0)).collect();
    let mut t: Vec<Duration> = Vec::with_capacity(samples);
    for i in 0..=samples {
        let t0 = clock::now();
        for (k, e) in buf.iter().enumerate() {
            // Relaxed: nobody else reads the buffer; the store is the work.
            e.store(k as u64 | 1, Relaxed);
        }
        let dt = clock::now() - t0;
        black_box(&buf);
        if i > 0 {
            t.push(dt);
        }
    }
    t.sort();
    t[t.len() / 2].as_nanos() as f64 / pages as f64
}

fn sweep(sizes: &[u64], samples: usize) {
    let mut s = Pgtable::<X86_64>::new(false);
    for &size in sizes {
        println!("sweep,floor,{size},{:.4},page", floor(size, samples));
        let (page, gib) = (PAGE, G1);
        let ns = sweep_one(
            &mut s,
            size,
            samples,
            page,
            &mut |_, _| {},
            &mut |s, off| s.map_pages(VA + off, size),
            &mut |s, off| s.unmap_pages(VA + off, size),
        );
        println!("sweep,map-4K,{size},{ns:.4},page");
        let ns = sweep_one(
            &mut s,
            size,
            samples,
            page,
            &mut |s, off| s.map_pages(VA + off, size),
            &mut |s, off| s.unmap_pages(VA + off, size),
            &mut |_, _| {},
        );
        println!("sweep,unmap-4K,{size},{ns:.4},page");
        let ns = sweep_one(
            &mut s,
            size,
            samples,
            page,
            &mut |s, off| s.map_pages(VA + off, size),
            &mut |s, off| s.protect(VA + off, size, false),
            &mut |s, off| s.unmap_pages(VA + off, size),
        );
        println!("sweep,protect-4K,{size},{ns:.4},page");
        for (name, opts, unit) in [
            ("move-pte", variants::PTES_ONLY, page),
            ("move-pmd", variants::PMD_ONLY, gib),
            ("move", MoveOptions::DEFAULT, gib),
        ] {
            let ns = sweep_one(
                &mut s,
                size,
                samples,
                unit,
                &mut |s, off| s.map_pages(FROM + off, size),
                &mut |s, off| {
                    s.s.move_page_tables(VirtAddr(FROM + off), VirtAddr(TO + off), size, opts)
                        .unwrap()
                },
                &mut |s, off| {
                    // The moved pages are where they should be, then go.
                    let t = s.translate(TO + off + size - 1);
                    assert_eq!(t.map(|t| t.2), Some(PAGE), "{name} of {size:#x}");
                    assert_eq!(s.translate(FROM + off), None, "{name} of {size:#x}");
                    s.unmap_pages(TO + off, size);
                },
            );
            println!(
                "sweep,{name},{size},{ns:.4},{}",
                if unit == gib { "GiB" } else { "page" }
            );
        }
    }
}

/// Table memory held with 1 GiB mapped and after unmapping it.
fn census(arch: &str, name: &str, s: &mut dyn Subject) {
    for (kind, map, unmap) in [
        (
            "4K",
            &(|s: &mut dyn Subject| s.map_pages(VA, G1)) as &dyn Fn(&mut dyn Subject),
            &(|s: &mut dyn Subject| s.unmap_pages(VA, G1)) as &dyn Fn(&mut dyn Subject),
        ),
        (
            "2M",
            &|s: &mut dyn Subject| s.map_blocks(VA, G1),
            &|s: &mut dyn Subject| s.unmap_blocks(VA, G1),
        ),
    ] {
        s.reset();
        let base = s.tables_held();
        map(s);
        let size = if kind == "4K" { PAGE } else { M2 };
        assert_eq!(s.translate(VA + G1 - 1).map(|t| t.2), Some(size), "{name}");
        let mapped = s.tables_held() - base;
        unmap(s);
        assert_eq!(s.translate(VA), None, "{name}");
        let unmapped = s.tables_held() - base;
        println!(
            "memory,{arch},{name},mapped-{kind},{}",
            mapped as u64 * PAGE
        );
        println!(
            "memory,{arch},{name},unmapped-{kind},{}",
            unmapped as u64 * PAGE
        );
        s.reset();
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    const M: u64 = 1 << 20;
    let (sizes, samples): (&[u64], usize) = if quick {
        (&[2 * M, 32 * M, 512 * M, 4 * G1, 64 * G1], 3)
    } else {
        (
            &[
                2 * M,
                8 * M,
                32 * M,
                128 * M,
                512 * M,
                G1,
                4 * G1,
                16 * G1,
                64 * G1,
            ],
            9,
        )
    };
    census("x86", "pgtable", &mut Pgtable::<X86_64>::new(false));
    census(
        "x86",
        "x86_64",
        &mut pgtable_bench::x86::X86_64Crate::new(false),
    );
    census(
        "x86",
        "x86_64+clean_up",
        &mut pgtable_bench::x86::X86_64Crate::new(true),
    );
    #[cfg(target_arch = "x86_64")]
    census(
        "x86",
        "page_table_multiarch",
        &mut pgtable_bench::x86::ptm_subject(),
    );
    census("arm64", "pgtable", &mut Pgtable::<Arm64>::new(false));
    census(
        "arm64",
        "aarch64-paging",
        &mut pgtable_bench::arm64::Aarch64Paging::default(),
    );
    census(
        "arm64",
        "page_table_multiarch",
        &mut pgtable_bench::arm64::ptm::subject(),
    );
    sweep(sizes, samples);
}
