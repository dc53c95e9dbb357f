//! The ASID allocator: generations, roll-over, reserved ASIDs, and the
//! safety property a kernel relies on (a CPU never runs an address space
//! under an ASID its TLB may still hold entries of another space for),
//! checked against a per-CPU TLB model on seeded random switch sequences.

use pgtable_core::asid::{
    Asid16Allocator, Asid8Allocator, AsidAllocator, AsidContext, AsidError, Pcid12Allocator,
};
use pgtable_testkit::miri_scaled;

/// xorshift64*: a small seeded generator, so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn bad_widths_and_cpu_numbers_are_typed_errors() {
    assert_eq!(
        AsidAllocator::<1, 1>::new(0).unwrap_err(),
        AsidError::Bits(0)
    );
    assert_eq!(
        AsidAllocator::<1024, 1>::new(17).unwrap_err(),
        AsidError::Bits(17)
    );
    // 7 bits need two words.
    assert_eq!(
        AsidAllocator::<1, 1>::new(7).unwrap_err(),
        AsidError::Bits(7)
    );
    assert!(AsidAllocator::<2, 1>::new(7).is_ok());
    // 2 bits: ASIDs 1..=3; three CPUs could reserve them all.
    assert_eq!(
        AsidAllocator::<1, 3>::new(2).unwrap_err(),
        AsidError::TooFewAsids { bits: 2, cpus: 3 }
    );
    assert!(AsidAllocator::<1, 2>::new(2).is_ok());
    let mut a = Asid8Allocator::<2>::new(8).unwrap();
    let mut ctx = AsidContext::NEW;
    assert_eq!(a.switch_to(2, &mut ctx).unwrap_err(), AsidError::Cpu(2));
    assert_eq!(ctx, AsidContext::NEW, "an error changes nothing");
    assert_eq!(a.active(0), None);
}

#[test]
fn asids_are_handed_out_once_per_generation_and_asid_0_never() {
    let mut a = Asid8Allocator::<1>::new(8).unwrap();
    let gen = a.generation();
    assert_eq!(gen, 256);
    let mut ctxs = [AsidContext::NEW; 255];
    let mut seen = [false; 256];
    for ctx in &mut ctxs {
        let sw = a.switch_to(0, ctx).unwrap();
        assert!(sw.changed && !sw.flush_local);
        assert!(sw.asid != 0 && !seen[sw.asid as usize], "{sw:?}");
        seen[sw.asid as usize] = true;
        assert_eq!(ctx.id(), gen | u64::from(sw.asid));
        assert!(a.is_current(*ctx));
    }
    // Switching back keeps the ASID, no flush.
    let before = ctxs[7];
    let a7 = a.asid_of(ctxs[7]);
    assert_eq!(a7, 8, "handed out in order from 1");
    let sw = a.switch_to(0, &mut ctxs[7]).unwrap();
    assert_eq!((sw.asid, sw.changed, sw.flush_local), (a7, false, false));
    assert_eq!(ctxs[7], before);
    assert_eq!(a.rollovers(), 0);

    // The 256th space rolls over: new generation, a local flush.
    let mut extra = AsidContext::NEW;
    let sw = a.switch_to(0, &mut extra).unwrap();
    assert_eq!(a.rollovers(), 1);
    assert_eq!(a.generation(), 512);
    assert!(sw.flush_local && sw.asid != 0);
    // The ASID active on CPU 0 at the roll-over was re-reserved.
    assert_ne!(sw.asid, a7);
    // Old contexts are no longer current.
    assert!(!a.is_current(ctxs[0]));
    // The space that was running keeps its ASID in the new generation…
    let sw7 = a.switch_to(0, &mut ctxs[7]).unwrap();
    assert_eq!((sw7.asid, sw7.changed, sw7.flush_local), (a7, false, false));
    assert_eq!(ctxs[7].id(), 512 | u64::from(a7));
    // …and others get their old number back while it is free.
    let old3 = a.asid_of(ctxs[3]);
    let sw3 = a.switch_to(0, &mut ctxs[3]).unwrap();
    if old3 != sw.asid {
        assert_eq!((sw3.asid, sw3.changed), (old3, false));
    }
}

#[test]
fn every_cpus_running_asid_survives_a_rollover() {
    let mut a = AsidAllocator::<1, 3>::new(4).unwrap();
    let mut running = [AsidContext::NEW; 3];
    for (cpu, ctx) in running.iter_mut().enumerate() {
        let sw = a.switch_to(cpu, ctx).unwrap();
        assert!(sw.changed && !sw.flush_local);
    }
    let asids = running.map(|c| a.asid_of(c));
    // CPU 0 churns through new spaces until two roll-overs happened.
    let mut churn = Vec::new();
    while a.rollovers() < 2 {
        let mut ctx = AsidContext::NEW;
        let sw = a.switch_to(0, &mut ctx).unwrap();
        // CPUs 1 and 2 still run their spaces: their ASIDs are never
        // handed to another space.
        assert!(sw.asid != asids[1] && sw.asid != asids[2], "{sw:?}");
        churn.push(ctx);
    }
    // CPUs 1 and 2 ran nothing else across both roll-overs: they keep
    // their ASIDs, and flush once (the pending local flush).
    for cpu in 1..3 {
        let sw = a.switch_to(cpu, &mut running[cpu]).unwrap();
        assert_eq!(
            (sw.asid, sw.changed, sw.flush_local),
            (asids[cpu], false, true)
        );
        assert!(a.is_current(running[cpu]));
        let again = a.switch_to(cpu, &mut running[cpu]).unwrap();
        assert!(!again.flush_local, "one flush per roll-over");
    }
}

/// Runs `switches` random switches of `spaces` address spaces over the CPUs
/// against a model of each CPU's TLB: which address space each ASID's
/// cached entries belong to. Returns (roll-overs, local flushes).
fn run_model<const W: usize, const C: usize>(
    bits: u32,
    spaces: usize,
    switches: usize,
    seed: u64,
    honour_flushes: bool,
) -> Result<(u64, u64), String> {
    let mut a = AsidAllocator::<W, C>::new(bits).unwrap();
    let mut ctxs = vec![AsidContext::NEW; spaces];
    let n = 1usize << bits;
    // tlb[cpu][asid]: the space whose entries the CPU may hold for it.
    let mut tlb = vec![vec![None::<usize>; n]; C];
    let mut running = vec![None::<usize>; C];
    let mut rng = Rng(seed);
    let mut flushes = 0;
    for step in 0..switches {
        let cpu = rng.below(C);
        let s = rng.below(spaces);
        let sw = a.switch_to(cpu, &mut ctxs[s]).unwrap();
        if sw.flush_local {
            flushes += 1;
            if honour_flushes {
                tlb[cpu].iter_mut().for_each(|e| *e = None);
            }
        }
        let slot = &mut tlb[cpu][sw.asid as usize];
        match *slot {
            Some(other) if other != s => {
                return Err(format!(
                    "step {step}: CPU {cpu} runs space {s} under ASID {} that still \
                     tags space {other}'s entries",
                    sw.asid
                ))
            }
            _ => *slot = Some(s),
        }
        running[cpu] = Some(s);
        // No two spaces share an ASID within the current generation.
        let mut owner = vec![None::<usize>; n];
        for (i, c) in ctxs.iter().enumerate() {
            if a.is_current(*c) {
                let asid = a.asid_of(*c) as usize;
                if let Some(j) = owner[asid] {
                    return Err(format!("step {step}: spaces {i} and {j} share ASID {asid}"));
                }
                owner[asid] = Some(i);
            }
        }
    }
    Ok((a.rollovers(), flushes))
}

#[test]
fn random_switches_never_reuse_an_asid_a_cpu_still_caches() {
    // Under Miri a tenth of the seeds and of the switches (`miri_scaled`).
    let switches = miri_scaled(2000) as usize;
    for seed in 1..=miri_scaled(20) {
        let (rollovers, flushes) = run_model::<1, 4>(4, 40, switches, seed, true).unwrap();
        assert!(
            rollovers > miri_scaled(10),
            "seed {seed}: {rollovers} roll-overs"
        );
        // Each roll-over costs each CPU at most one flush.
        assert!(flushes <= 4 * rollovers, "seed {seed}");
        assert!(
            flushes < switches as u64 / 2,
            "seed {seed}: {flushes} flushes"
        );
    }
    // 8-bit and 12-bit widths.
    run_model::<4, 8>(8, 600, miri_scaled(5000) as usize, 7, true).unwrap();
    // Each step checks every one of the 5000 spaces: a hundredth of the
    // switches under Miri.
    let switches = miri_scaled(miri_scaled(10_000)) as usize;
    run_model::<64, 2>(12, 5000, switches, 9, true).unwrap();
}

#[test]
fn the_model_catches_a_cpu_that_skips_the_rollover_flush() {
    // The check of the test above fails when the flush is not honoured.
    let err = run_model::<1, 4>(4, 40, miri_scaled(2000) as usize, 1, false).unwrap_err();
    assert!(err.contains("still tags space"), "{err}");
}

#[test]
fn sixteen_bit_asids_roll_over_after_65535_spaces() {
    let mut a = Asid16Allocator::<1>::new(16).unwrap();
    let mut ctx = AsidContext::NEW;
    for i in 1..=65535u32 {
        ctx = AsidContext::NEW;
        let sw = a.switch_to(0, &mut ctx).unwrap();
        assert_eq!(u32::from(sw.asid), i);
    }
    assert_eq!(a.rollovers(), 0);
    let running = a.asid_of(ctx);
    let mut next = AsidContext::NEW;
    let sw = a.switch_to(0, &mut next).unwrap();
    assert_eq!(a.rollovers(), 1);
    assert!(sw.flush_local && sw.asid != running && sw.asid != 0);
    // The same type serves CPUs with 8-bit ASIDs.
    let mut b = Asid16Allocator::<1>::new(8).unwrap();
    assert_eq!(b.bits(), 8);
    let mut first = AsidContext::NEW;
    let sw = b.switch_to(0, &mut first).unwrap();
    assert_eq!(sw.asid, 1);
    // 12-bit PCIDs.
    assert!(Pcid12Allocator::<64>::new(12).is_ok());
    assert_eq!(
        Pcid12Allocator::<1>::new(13).unwrap_err(),
        AsidError::Bits(13)
    );
}
