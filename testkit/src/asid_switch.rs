//! More address spaces than ASIDs on the simulator, for any format: 40
//! spaces map the same virtual address to different frames and share one
//! global kernel page; a 4-bit ASID allocator (15 ASIDs) serves them in a
//! seeded random order, with address spaces that are not current remapping
//! their page now and then. After every switch every access must translate
//! to the current space's frame (no translation of another space survives)
//! and the simulator's check must be clean. Run by the tests of pgtable-core
//! and of the arch crates with ASIDs.

use pgtable_core::asid::{AsidAllocator, AsidContext};
use pgtable_core::contract::{Arch, Mmu};
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

/// Runs `switches` switches of [`SPACES`] address spaces of format `A` on
/// 4-bit ASIDs; `honour_flush: false` skips the local flush a roll-over
/// asks for (the bug the run must catch).
pub fn run<A: Arch>(seed: u64, switches: u64, honour_flush: bool) -> Result<Counts, String> {
    let m = SimMachine::<A>::new();
    let mut asids = AsidAllocator::<1, 1>::new(4).map_err(|e| e.to_string())?;
    let mut spaces: Vec<(Space<A>, AsidContext, u64)> = (0..SPACES)
        .map(|i| {
            let mut s = Space::new(m.mmu_with_asid(0), m.alloc()).unwrap();
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
            let sw = asids.switch_to(0, ctx).map_err(|e| e.to_string())?;
            if sw.flush_local {
                c.local_flushes += 1;
                if honour_flush {
                    // The local flush of every ASID (arm64 `tlbi vmalle1`).
                    s.mmu().flush_tlb_all();
                }
            }
            s.mmu().set_asid(sw.asid);
            // SAFETY: simulated.
            unsafe { s.install() };
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
    m.mmu().flush_tlb_all();
    for (mut s, _, _) in spaces {
        // SAFETY: simulated, and nothing is cached any more.
        unsafe { s.deactivate() };
    }
    result.map(|()| c)
}
