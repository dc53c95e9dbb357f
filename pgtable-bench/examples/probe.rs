//! An instruction-count probe: one pgtable operation of the peer benches,
//! run three times on 1 GiB, for counting under callgrind (exact and
//! independent of the machine's load, unlike criterion's times):
//!
//! ```text
//! cargo build --profile bench -p pgtable-bench --example probe
//! valgrind --tool=callgrind --collect-atstart=no --toggle-collect='probe::measured' \
//!     target/release/examples/probe x86|arm64 OP
//! ```
//!
//! OP is one of `map4k`, `map2m`, `protect`, `protectuser`, `unmap`,
//! `unmapreport`, `unmapreportuser`, `forkcow`, `forkshared`, `fault`,
//! `movepud`, `movepte`; the probe prints the number of entries the counted
//! calls handled, so the instructions per entry are callgrind's total over
//! that number. The two moves (`move_page_tables` of 1 GiB of 4 KiB pages
//! there and back, with the options of the `move-1G` bench's `pud` and
//! `pte` subjects) count one entry per call: their figure is per call.
use pgtable_arm64::Arm64;
use pgtable_bench::harness::{Pgtable, Subject, G1, PA, PAGE, VA, VA2};
use pgtable_core::contract::NewPte;
use pgtable_core::{variants, CopyMode, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86_64;
use std::hint::black_box;

const REPS: u64 = 3;

#[inline(never)]
fn measured(f: &mut dyn FnMut()) {
    f()
}

fn ops<A: pgtable_core::contract::Arch + 'static>(op: &str) -> u64 {
    const PAGES: u64 = G1 / PAGE;
    let user = Prot::WRITE | Prot::USER;
    match op {
        "map4k" => {
            let mut p = Pgtable::<A>::new(false);
            for _ in 0..REPS {
                measured(&mut || p.map_pages(VA, G1));
                p.unmap_pages(VA, G1);
            }
            PAGES
        }
        "map2m" => {
            let mut p = Pgtable::<A>::new(false);
            for _ in 0..REPS {
                measured(&mut || p.map_blocks(VA, G1));
                p.unmap_blocks(VA, G1);
            }
            512
        }
        "protect" | "protectuser" => {
            let mut p = Pgtable::<A>::new(op == "protectuser");
            p.map_pages(VA, G1);
            for i in 0..REPS {
                measured(&mut || p.protect(VA, G1, i % 2 == 1));
            }
            PAGES
        }
        "unmap" => {
            let mut p = Pgtable::<A>::new(false);
            for _ in 0..REPS {
                p.map_pages(VA, G1);
                measured(&mut || p.unmap_pages(VA, G1));
            }
            PAGES
        }
        "unmapreport" | "unmapreportuser" => {
            let prot = if op == "unmapreport" {
                Prot::READ_WRITE
            } else {
                user
            };
            let mut p = Pgtable::<A>::new(op != "unmapreport");
            for _ in 0..REPS {
                p.s.map(VirtAddr(VA), PhysAddr(PA), G1, prot, MapOptions::PAGES)
                    .unwrap();
                measured(&mut || {
                    let mut acc = 0u64;
                    p.s.unmap_with(VirtAddr(VA), G1, |r| {
                        acc = acc
                            .wrapping_add(r.pa().map_or(0, |p| p.0))
                            .wrapping_add(u64::from(r.dirty()));
                    })
                    .unwrap();
                    black_box(acc);
                });
            }
            PAGES
        }
        "forkcow" | "forkshared" => {
            let mode = if op == "forkcow" {
                CopyMode::Cow
            } else {
                CopyMode::Shared
            };
            let mut parent = Pgtable::<A>::new(true);
            let mut child = Pgtable::<A>::new(true);
            parent
                .s
                .map(VirtAddr(VA), PhysAddr(PA), G1, user, MapOptions::PAGES)
                .unwrap();
            for _ in 0..REPS {
                parent.s.change_protection(VirtAddr(VA), G1, user).unwrap();
                measured(&mut || {
                    parent
                        .s
                        .copy_page_range(&mut child.s, VirtAddr(VA), G1, mode, |_| {})
                        .unwrap();
                });
                child.s.unmap(VirtAddr(VA), G1).unwrap();
            }
            PAGES
        }
        "fault" => {
            const N: u64 = 511;
            const M2: u64 = 2 << 20;
            let mut p = Pgtable::<A>::new(false);
            let regions: Vec<u64> = (0..64).map(|k| VA + k * M2).collect();
            for &r in &regions {
                p.s.map(
                    VirtAddr(r),
                    PhysAddr(PA),
                    PAGE,
                    Prot::READ_WRITE,
                    MapOptions::PAGES,
                )
                .unwrap();
            }
            for _ in 0..REPS {
                measured(&mut || {
                    for &r in &regions {
                        for i in 1..N + 1 {
                            p.s.install_pte(
                                VirtAddr(r + i * PAGE),
                                NewPte::Page {
                                    pa: PhysAddr(PA + i * PAGE),
                                    prot: Prot::READ_WRITE,
                                },
                            )
                            .unwrap();
                        }
                    }
                });
                for &r in &regions {
                    p.s.unmap(VirtAddr(r + PAGE), N * PAGE).unwrap();
                }
            }
            N * 64
        }
        "movepud" | "movepte" => {
            let opts = if op == "movepud" {
                MoveOptions::DEFAULT
            } else {
                variants::PTES_ONLY
            };
            let mut p = Pgtable::<A>::new(false);
            p.map_pages(VA, G1);
            // Warm the allocator for the destination tables: one round trip.
            let round = |p: &mut Pgtable<A>| {
                p.s.move_page_tables(VirtAddr(VA), VirtAddr(VA2), G1, opts)
                    .unwrap();
                p.s.move_page_tables(VirtAddr(VA2), VirtAddr(VA), G1, opts)
                    .unwrap();
            };
            round(&mut p);
            for _ in 0..REPS {
                measured(&mut || round(&mut p));
            }
            let t = p.s.translate(VirtAddr(VA + G1 - 1)).unwrap();
            assert_eq!(t.pa.0, PA + G1 - 1);
            2
        }
        _ => panic!("unknown operation {op}"),
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let n = if a[1] == "x86" {
        ops::<X86_64>(&a[2])
    } else {
        ops::<Arm64>(&a[2])
    };
    println!("entries {}", n * REPS);
}
