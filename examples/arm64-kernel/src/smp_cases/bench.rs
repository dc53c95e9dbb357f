//! The shootdown benchmark: cost per operation against the CPUs running.

use pgtable_core::{MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};

use super::hammer::ANY;
use super::{Cases, Space, MOVED, PAGE, R, WINDOW};
use crate::{println, timer};

fn median<const N: usize>(mut xs: [u64; N]) -> u64 {
    xs.sort_unstable();
    xs[N / 2]
}

/// The shootdown cost per operation against the CPUs running: 4 (3
/// hammering), 2 (1 hammering), 1 (the others off), each operation
/// [`REPS`] times on 16 pages.
///
/// Under QEMU TCG with one thread per CPU, a broadcast TLBI is carried
/// out on every CPU before the issuing one goes on (QEMU's
/// `tlb_flush_*_all_cpus_synced`), so the cost grows with the CPUs
/// running, and with how the host schedules their threads: the ticks are
/// EMULATED and noisy, the counts exact.
pub(super) fn bench(k: &mut Cases, a: &mut Space) -> Result<(), &'static str> {
    const PAGES: u64 = 16;
    const COUNTS: [usize; 3] = [4, 2, 1];
    println!();
    println!(
        "smp shootdown cost: {REPS} operations on 16 pages each, the other CPUs loading from the range, EMULATED ticks"
    );
    println!(
        "{:<14} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>14}",
        "operation", "CPUs", "hammering", "median", "min", "TLBI/op", "strides", "median/1 CPU"
    );
    // [op][column] = (median ticks, min ticks, flushes, strides)
    let mut table = [[(0u64, 0u64, 0u64, 0u64); 3]; 3];
    let names = ["unmap", "protect RO/RW", "move"];
    for (col, ncpus) in COUNTS.into_iter().enumerate() {
        k.smp.park_from(ncpus)?;
        if k.smp.online != ncpus {
            return Err("fewer CPUs online than the benchmark needs");
        }
        let mask = k.smp.mask_first(ncpus - 1);
        for (op, row) in table.iter_mut().enumerate() {
            let mut ticks = [0u64; REPS];
            let (mut flushes, mut strides) = (0, 0);
            k.map_marked(a, WINDOW, 0, PAGES, Prot::READ_WRITE)?;
            let mut at = WINDOW;
            for (i, t) in ticks.iter_mut().enumerate() {
                a.stats().reset();
                let mut run = || -> R {
                    match op {
                        0 => a
                            .unmap(VirtAddr(WINDOW), PAGES * PAGE)
                            .map_err(|_| "unmap failed"),
                        1 => {
                            let p = if i % 2 == 0 {
                                Prot::READ_ONLY
                            } else {
                                Prot::READ_WRITE
                            };
                            a.change_protection(VirtAddr(WINDOW), PAGES * PAGE, p)
                                .map_err(|_| "protect failed")
                        }
                        _ => {
                            let to = if at == WINDOW { MOVED } else { WINDOW };
                            let r = a
                                .move_page_tables(
                                    VirtAddr(at),
                                    VirtAddr(to),
                                    PAGES * PAGE,
                                    MoveOptions::DEFAULT,
                                )
                                .map_err(|_| "move failed");
                            at = to;
                            r
                        }
                    }
                };
                *t = if mask == 0 {
                    let t0 = timer::ticks();
                    run()?;
                    timer::ticks() - t0
                } else {
                    k.round(mask, [ANY, WINDOW, 0, PAGES], run)?
                };
                flushes = a.stats().flushes();
                strides = a.stats().flush_range_pages();
                if op == 0 {
                    a.map(
                        VirtAddr(WINDOW),
                        PhysAddr(k.frame(0)),
                        PAGES * PAGE,
                        Prot::READ_WRITE,
                        MapOptions::PAGES,
                    )
                    .map_err(|_| "map failed")?;
                }
            }
            a.unmap(VirtAddr(at), PAGES * PAGE)
                .map_err(|_| "unmap failed")?;
            let min = ticks.iter().copied().min().unwrap_or(0);
            row[col] = (median(ticks), min, flushes, strides);
        }
    }
    for (op, row) in table.iter().enumerate() {
        for (col, ncpus) in COUNTS.into_iter().enumerate() {
            let (med, min, f, st) = row[col];
            let centi = med * 100 / row[2].0.max(1);
            println!(
                "{:<14} {:>5} {:>10} {:>10} {:>10} {:>8} {:>8} {:>11}.{:02}x",
                names[op],
                ncpus,
                ncpus - 1,
                med,
                min,
                f,
                st,
                centi / 100,
                centi % 100
            );
        }
    }
    Ok(())
}

/// Operations per row of the benchmark.
const REPS: usize = 10;
