//! The shootdown benchmark.

use pgtable_core::contract::{Arch, Mmu, TlbRange, PAGE_SIZE};
use pgtable_core::{MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::MmCpus;

use super::{count, drop_space, new_space, since, switch, Data, BASE};
use crate::{println, smp, tsc};

/// The shootdown benchmark: a one-page protection change (one flush) on a
/// space live on 1, 2 and 4 CPUs, mean TSC ticks per operation, and the
/// bare IPI round.
pub fn bench<A: Arch>(kernel: PhysAddr, pool: u64) -> bool {
    const ITERS: u64 = 20;
    let n = smp::ncpus();
    println!();
    println!("== shootdown cost ({n} CPUs; TSC ticks per operation, mean of {ITERS}) ==");
    println!(
        "  {:<8} {:>12} {:>12} {:>8} {:>8}",
        "CPUs", "protect 1p", "IPI round", "rounds", "IPIs"
    );
    let data = Data { pa: pool };
    data.fill();
    for cpus in [1usize, 2, 4] {
        if cpus > n {
            continue;
        }
        let live: u64 = ((1u64 << (cpus - 1)) - 1) << 1;
        let mm = MmCpus::new();
        let Ok(mut s) = new_space::<A>(kernel, &mm) else {
            return false;
        };
        if s.map(
            VirtAddr(BASE),
            PhysAddr(data.pa),
            PAGE_SIZE,
            Prot::WRITE,
            MapOptions::PAGES,
        )
        .is_err()
        {
            return false;
        }
        switch(live, &s, true);
        let c = count();
        let t0 = tsc::now();
        for i in 0..ITERS {
            let p = if i % 2 == 0 {
                Prot::READ_ONLY
            } else {
                Prot::WRITE
            };
            let _ = s.change_protection(VirtAddr(BASE), PAGE_SIZE, p);
        }
        let prot = (tsc::now() - t0) / ITERS;
        let t0 = tsc::now();
        for _ in 0..ITERS {
            // One page's flush through the space's MMU: the local
            // INVLPG and one IPI round to the CPUs it is live on.
            s.mmu().flush_tlb_range(TlbRange {
                start: VirtAddr(BASE),
                end: VirtAddr(BASE + PAGE_SIZE),
                stride_shift: 12,
                last_level: true,
            });
        }
        let round = (tsc::now() - t0) / ITERS;
        let d = since(c);
        println!(
            "  {:<8} {:>12} {:>12} {:>8} {:>8}",
            cpus, prot, round, d.rounds, d.ipis
        );
        switch(live, &s, false);
        let _ = s.unmap(VirtAddr(BASE), PAGE_SIZE);
        drop_space(s);
    }
    true
}
