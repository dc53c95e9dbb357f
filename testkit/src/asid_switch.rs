//! More address spaces than ASIDs on the simulator, for any format: 40
//! spaces map the same virtual address to different frames and share one
//! global kernel page; a 4-bit ASID allocator (15 ASIDs) serves them in a
//! seeded random order, with address spaces that are not current remapping
//! their page now and then. After every switch every access must translate
//! to the current space's frame (no translation of another space survives)
//! and the simulator's check must be clean. Run by the tests of pgtable-core
//! and of the arch crates with ASIDs.
//!
//! The spaces start with unassigned MMU handles and are switched by
//! `AsidAllocator::switch_mm` ([`Glue::SwitchMm`]); the other [`Glue`]s
//! are the hand-written sequences `switch_mm` replaces, each with one step
//! wrong, that the run must catch.

use pgtable_core::asid::{exit_mm, AsidAllocator, AsidContext};
use pgtable_core::contract::{Arch, TaggedMmu};
use pgtable_core::sim::{SimAlloc, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

type Space<A> = AddressSpace<A, SimMmu<A>, SimAlloc>;

const K4: u64 = 4 << 10;
/// The user page every space maps (to its own frame).
const VA: VirtAddr = VirtAddr(0x40_0000);
/// The kernel page every space maps, global, to one frame.
const KVA: VirtAddr = VirtAddr(0x20_0000_0000);
const KPA: PhysAddr = PhysAddr(0x1_0000_0000);
/// How many address spaces take turns (more than the 15 ASIDs).
pub const SPACES: usize = 40;

/// xorshift64*: seeded, so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

/// The two frames space `i` alternates between.
fn frame(i: usize, version: u64) -> PhysAddr {
    PhysAddr(0x8000_0000 + (i as u64 * 2 + version % 2) * K4)
}

#[derive(Debug, Default)]
/// What one run did.
pub struct Counts {
    /// Address-space switches.
    pub switches: u64,
    /// ASID generation roll-overs.
    pub rollovers: u64,
    /// Whole-TLB flushes the allocator asked for.
    pub local_flushes: u64,
    /// Remaps of a page by a space that was not current.
    pub remaps: u64,
    /// Whole-TLB flushes the simulated machine saw.
    pub machine_full_flushes: u64,
}

/// How a switch is made.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Glue {
    /// `AsidAllocator::switch_mm`.
    SwitchMm,
    /// By hand, without the local flush a roll-over asks for.
    SkipRolloverFlush,
    /// By hand, installing the root before the handle takes its new ASID
    /// (so the root runs under the ASID the space had before the
    /// roll-over, which another space may own now).
    InstallBeforeTag,
}

/// One switch of `s` on CPU 0 made as `glue` says.
fn switch<A: Arch>(
    asids: &mut AsidAllocator<1, 1>,
    ctx: &mut AsidContext,
    s: &mut Space<A>,
    glue: Glue,
) -> Result<pgtable_core::asid::Switch, String> {
    if glue == Glue::SwitchMm {
        // SAFETY: simulated; CPU 0 is the only CPU and `ctx` is the space's.
        return unsafe { asids.switch_mm(0, ctx, s) }.map_err(|e| e.to_string());
    }
    let sw = asids.switch_to(0, ctx).map_err(|e| e.to_string())?;
    if sw.flush_local && glue != Glue::SkipRolloverFlush {
        s.mmu().local_flush_all();
    }
    if glue == Glue::InstallBeforeTag {
        // SAFETY: simulated.
        unsafe { s.install() };
    }
    s.mmu().set_tag(sw.asid).map_err(|e| e.to_string())?;
    if glue != Glue::InstallBeforeTag {
        // SAFETY: simulated.
        unsafe { s.install() };
    }
    Ok(sw)
}

/// Runs `switches` switches of [`SPACES`] address spaces of format `A` on
/// 4-bit ASIDs, made as `glue` says (every [`Glue`] but
/// [`Glue::SwitchMm`] is a bug the run must catch).
pub fn run<A: Arch>(seed: u64, switches: u64, glue: Glue) -> Result<Counts, String> {
    let m = SimMachine::<A>::new();
    let mut asids = AsidAllocator::<1, 1>::new(4).map_err(|e| e.to_string())?;
    let mut spaces: Vec<(Space<A>, AsidContext, u64)> = (0..SPACES)
        .map(|i| {
            let mut s = Space::new(m.mmu_unassigned(), m.alloc()).unwrap();
            s.map(VA, frame(i, 0), K4, Prot::READ_WRITE, MapOptions::PAGES)
                .unwrap();
            let global = Prot::WRITE | Prot::GLOBAL;
            s.map(KVA, KPA, K4, global, MapOptions::PAGES).unwrap();
            m.phys_write_u64(frame(i, 0), (i as u64) << 8);
            (s, AsidContext::NEW, 0)
        })
        .collect();
    m.phys_write_u64(KPA, 0xcafe);
    let mut rng = Rng(seed);
    let mut c = Counts::default();
    let mut current = None;
    let result = (|| {
        for step in 0..switches {
            let i = rng.below(SPACES);
            let (s, ctx, version) = &mut spaces[i];
            let sw = switch(&mut asids, ctx, s, glue)?;
            if sw.flush_local {
                c.local_flushes += 1;
            }
            current = Some(i);
            c.switches += 1;
            let want = ((i as u64) << 8) | *version;
            let got = m.read_u64(VA).map_err(|e| format!("step {step}: {e}"))?;
            if got != want {
                return Err(format!(
                    "step {step}: space {i} (ASID {}) reads {got:#x}, expected {want:#x}",
                    sw.asid
                ));
            }
            if m.read_u64(KVA) != Ok(0xcafe) {
                return Err(format!("step {step}: the global page is wrong"));
            }
            m.check().map_err(|e| format!("step {step}: {e}"))?;
            // Now and then a space that is not current remaps its page (its
            // unmap flushes by its ASID, possibly an old generation's).
            if rng.below(4) == 0 {
                let t = rng.below(SPACES);
                if Some(t) != current {
                    let (s, _, version) = &mut spaces[t];
                    *version += 1;
                    s.unmap(VA, K4).unwrap();
                    let pa = frame(t, *version);
                    s.map(VA, pa, K4, Prot::READ_WRITE, MapOptions::PAGES)
                        .unwrap();
                    m.phys_write_u64(pa, ((t as u64) << 8) | *version);
                    m.check().map_err(|e| format!("step {step}, remap: {e}"))?;
                    c.remaps += 1;
                }
            }
        }
        Ok(())
    })();
    c.rollovers = asids.rollovers();
    c.machine_full_flushes = m.stats().flush_all;
    // Switch away from the last space (to an untagged empty root), then
    // let every space exit.
    let mut idle = Space::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: simulated.
    unsafe { idle.install() };
    for (mut s, _, _) in spaces {
        // SAFETY: simulated, and no CPU runs `s` any more.
        unsafe { exit_mm(&mut s) };
    }
    // SAFETY: simulated; nothing else will be installed.
    unsafe { idle.deactivate() };
    let stale = m.check().map_err(|e| format!("after exit_mm: {e}"));
    result.and(stale).map(|()| c)
}

/// An address space that never ran, on an unassigned handle: mapping,
/// remapping and unmapping flush nothing, and the first `switch_mm` sees
/// only its own translation. Returns the flushes the machine saw before the
/// switch (0 expected) or the first discrepancy.
pub fn unassigned_space<A: Arch>() -> Result<u64, String> {
    let m = SimMachine::<A>::new();
    let mut asids = AsidAllocator::<1, 1>::new(4).map_err(|e| e.to_string())?;
    let mut s = Space::<A>::new(m.mmu_unassigned(), m.alloc()).map_err(|e| e.to_string())?;
    if s.mmu().tag().is_some() {
        return Err("a new handle has a tag".into());
    }
    let e = |e: pgtable_core::Error| e.to_string();
    for v in 0..3 {
        s.map(VA, frame(0, v), K4, Prot::READ_WRITE, MapOptions::PAGES)
            .map_err(e)?;
        m.phys_write_u64(frame(0, v), 0x100 | v);
        s.unmap(VA, K4).map_err(e)?;
    }
    s.map(VA, frame(0, 1), K4, Prot::READ_WRITE, MapOptions::PAGES)
        .map_err(e)?;
    let before = m.stats().flush_range + m.stats().flush_all;
    let mut ctx = AsidContext::NEW;
    // SAFETY: simulated; CPU 0 is the only CPU.
    let sw = unsafe { asids.switch_mm(0, &mut ctx, &mut s) }.map_err(|e| e.to_string())?;
    if s.mmu().tag() != Some(sw.asid) || m.asid() != sw.asid {
        return Err(format!("switch_mm did not tag the space with {}", sw.asid));
    }
    match m.read_u64(VA) {
        Ok(0x101) => {}
        got => return Err(format!("the space reads {got:?}")),
    }
    m.check().map_err(|e| e.to_string())?;
    let mut idle = Space::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: simulated.
    unsafe { idle.install() };
    // SAFETY: simulated; `s` is not installed any more.
    unsafe { exit_mm(&mut s) };
    // SAFETY: simulated.
    unsafe { idle.deactivate() };
    m.check().map_err(|e| e.to_string())?;
    Ok(before)
}

/// Everything above for format `A`, as one check: runs of
/// [`Glue::SwitchMm`] for `seeds` with `switches` switches each must be
/// clean, roll over at least 10 times, flush once per roll-over and far
/// less often than they switch; both broken glues must be caught; a space
/// that never ran must flush nothing. Returns the first failure.
pub fn check_format<A: Arch>(seeds: &[u64], switches: u64) -> Result<(), String> {
    for &seed in seeds {
        let c = run::<A>(seed, switches, Glue::SwitchMm)?;
        let ok = c.rollovers >= 10.min(switches / 100)
            && c.local_flushes == c.rollovers
            && c.machine_full_flushes == c.local_flushes
            && c.local_flushes * 5 < c.switches;
        if !ok {
            return Err(format!("seed {seed}: {c:?}"));
        }
    }
    for glue in [Glue::SkipRolloverFlush, Glue::InstallBeforeTag] {
        match run::<A>(1, switches, glue) {
            Err(e) if e.contains("reads") || e.contains("stale") => {}
            other => return Err(format!("{glue:?} not caught: {other:?}")),
        }
    }
    match unassigned_space::<A>()? {
        0 => Ok(()),
        n => Err(format!("a space that never ran flushed {n} times")),
    }
}
