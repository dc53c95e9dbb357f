//! The `smp_` cases: every CPU sees the change.
//!
//! Each case builds a test address space whose MMU is [`SmpMmu`] (local
//! flush plus shootdown of the CPUs the space is live on), with the
//! kernel half shared, switches the APs onto it and lets them hammer a
//! range with fault-tolerant probes ([`crate::trap`]) while CPU 0 changes
//! the range through pgtable. When the operation returns, CPU 0 bumps an
//! *epoch*; an AP reads the epoch before each probe, so a probe that
//! began after the operation returned is judged against the new state:
//! an access that should fault and did not is a violation.
//!
//! The APs are driven by one command block ([`Cmd`]): CPU 0 writes the
//! command, bumps its sequence number and wakes them with an IPI; each AP
//! runs it until told to stop and acknowledges the sequence number.

// A failure carries its message (200 bytes, no allocator here); only the
// failing path moves it.
#![allow(clippy::result_large_err)]

mod bench;
mod hammer;

pub use bench::bench;
pub use hammer::ap_loop;

use core::sync::atomic::{AtomicU64, Ordering::*};

use pgtable_core::contract::{Arch, PAGE_SIZE};
use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VirtAddr};

use crate::mem::{phys_to_virt, Frames};
use crate::shootdown::{self, SmpMmu};
use crate::smp::{self, MAX_CPUS};
use crate::{println, trap, tsc};
use hammer::{
    pattern, post, stop, wait_done, wait_passes, EPOCH, OP_READ, OP_SWITCH, OP_WRITE, PAGES, RES,
};
use pgtable_x86::MmCpus;

/// Where the cases map (lower half, 192 GiB: clear of the suite's window
/// and of the ring-3 pages).
const BASE: u64 = 0x30_0000_0000;
/// Where moves go (another PMD table, so the move may take the PMD path).
const MOVED: u64 = BASE + (1 << 30);
/// A test space.
type Space<'a, A> = AddressSpace<A, SmpMmu<'a>, Frames>;

/// A test space whose CPU set is `mm`: the kernel half shared with
/// `kernel`'s root.
fn new_space<A: Arch>(kernel: PhysAddr, mm: &MmCpus) -> Result<Space<'_, A>, Why> {
    let s = Space::<A>::new(shootdown::smp_mmu(mm), Frames).map_err(|e| why("new space", e))?;
    let (k, u) = (root_entries(kernel), root_entries(s.root()));
    for i in 256..512 {
        u[i].store(k[i].load(Relaxed), Relaxed);
    }
    Ok(s)
}

/// Drops a test space that no CPU has installed: its upper-half root
/// entries (the kernel's tables) are cleared first.
fn drop_space<A: Arch>(s: Space<A>) {
    for e in &root_entries(s.root())[256..] {
        e.store(0, Relaxed);
    }
    drop(s);
}

fn root_entries(root: PhysAddr) -> &'static [AtomicU64; 512] {
    // SAFETY: a root table frame, linearly mapped; its entries are only
    // accessed atomically.
    unsafe { &*(phys_to_virt(root.0) as *const [AtomicU64; 512]) }
}

/// Switches the CPUs of `mask` onto `s` (or back to the kernel root).
fn switch<A: Arch>(mask: u64, s: &Space<A>, on: bool) {
    let root = if on { s.root().0 } else { 0 };
    let mm: *const MmCpus = s.mmu().mm();
    let seq = post(mask, OP_SWITCH, root, mm as u64, 0);
    wait_done(mask, seq);
}

/// Why a case failed: up to 200 bytes of text (no allocator here).
pub struct Why {
    buf: [u8; 200],
    len: usize,
}

impl Why {
    fn new(args: core::fmt::Arguments) -> Why {
        let mut m = Why {
            buf: [0; 200],
            len: 0,
        };
        let _ = core::fmt::write(&mut m, args);
        m
    }
}

impl core::fmt::Write for Why {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

impl core::fmt::Display for Why {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(core::str::from_utf8(&self.buf[..self.len]).unwrap_or("?"))
    }
}

fn why(what: &str, e: impl core::fmt::Display) -> Why {
    Why::new(format_args!("{what}: {e}"))
}

macro_rules! fail {
    ($($t:tt)*) => { return Err(Why::new(format_args!($($t)*))) };
}

/// Frames for the data pages: the first of the RAM pool, `PAGES` for the
/// range plus `PAGES` of scratch.
struct Data {
    pa: u64,
}

impl Data {
    fn fill(&self) {
        for i in 0..2 * PAGES {
            let p = phys_to_virt(self.pa + i * PAGE_SIZE) as *mut u64;
            // SAFETY: pool frames, nothing else uses them now (the suite
            // runs later); linearly mapped.
            unsafe {
                p.write_bytes(0, (PAGE_SIZE / 8) as usize);
                if i < PAGES {
                    p.write_volatile(pattern(i));
                }
            }
        }
    }

    fn word(&self, page: u64, slot: u64) -> u64 {
        // SAFETY: as in `fill`.
        unsafe {
            (phys_to_virt(self.pa + page * PAGE_SIZE + slot * 8) as *const u64).read_volatile()
        }
    }
}

/// Shootdown counters around an operation.
#[derive(Clone, Copy)]
struct Count {
    rounds: u64,
    ipis: u64,
}

fn count() -> Count {
    Count {
        rounds: shootdown::stats().ipi_rounds,
        ipis: shootdown::stats().cpus_reached,
    }
}

fn since(c: Count) -> Count {
    let n = count();
    Count {
        rounds: n.rounds - c.rounds,
        ipis: n.ipis - c.ipis,
    }
}

/// What one hammering case runs on the test space.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Unmap,
    Move,
    Protect,
}

/// One hammered operation: maps the range in a fresh space, puts the APs
/// of `live` on it (and CPU 0 if `bsp`, which then probes the old and new addresses itself), lets them hammer (`write`:
/// stores, else loads), runs `op`, bumps the epoch, lets every AP do two
/// more passes, stops them and checks what they saw.
fn hammered<A: Arch>(
    kernel: PhysAddr,
    data: &Data,
    live: u64,
    write: bool,
    op: Op,
    bsp: bool,
) -> Result<Count, Why> {
    data.fill();
    let mm = MmCpus::new();
    let mut s = new_space::<A>(kernel, &mm)?;
    let r = (|| -> Result<Count, Why> {
        s.map(
            VirtAddr(BASE),
            PhysAddr(data.pa),
            PAGES * PAGE_SIZE,
            Prot::WRITE,
            MapOptions::PAGES,
        )
        .map_err(|e| why("map", e))?;
        // From here to the switch back nothing returns early: the APs run
        // on `s`.
        switch(live, &s, true);
        let mut bsp_err = None;
        if bsp {
            // SAFETY: `s` shares the kernel half and outlives the switch
            // back below.
            unsafe { shootdown::switch_to(s.root().0, s.mmu().mm()) };
            // A load caches the translation on CPU 0 too.
            if trap::read_u64(BASE) != Ok(pattern(0)) {
                bsp_err = Some(Why::new(format_args!(
                    "CPU 0: load before the operation failed"
                )));
            }
        }
        let alt = if op == Op::Move { MOVED } else { 0 };
        let seq = post(live, if write { OP_WRITE } else { OP_READ }, BASE, 0, alt);
        wait_passes(live, 2);
        let before = count();
        let res = match op {
            Op::Unmap => s.unmap(VirtAddr(BASE), PAGES * PAGE_SIZE),
            Op::Move => s.move_page_tables(
                VirtAddr(BASE),
                VirtAddr(MOVED),
                PAGES * PAGE_SIZE,
                MoveOptions::DEFAULT,
            ),
            Op::Protect => s.change_protection(VirtAddr(BASE), PAGES * PAGE_SIZE, Prot::READ_ONLY),
        };
        // Release: everything the operation did happens before an AP
        // that reads the new epoch starts its next probe.
        EPOCH.fetch_add(1, Release);
        let n = since(before);
        if bsp {
            // CPU 0 sees the change too: the old address faults (a load,
            // or for a protection change a store of the value there), the
            // moved data is at the new one.
            let old = match op {
                // SAFETY: a pool frame of the test space (or nothing):
                // the store writes back the pattern word it holds.
                Op::Protect => unsafe { trap::write_u64(BASE, pattern(0)) }.map(|()| 0),
                _ => trap::read_u64(BASE),
            };
            if old.is_ok() {
                bsp_err.get_or_insert(Why::new(format_args!(
                    "CPU 0: the old address still works after the operation"
                )));
            }
            if op == Op::Move && trap::read_u64(MOVED) != Ok(pattern(0)) {
                bsp_err.get_or_insert(Why::new(format_args!(
                    "CPU 0: the new address does not hold the data"
                )));
            }
        }
        let scratch = if op == Op::Move && write {
            // Reuse what the move freed (the old PTE table) while the
            // writers run: map scratch pages, zeroed, elsewhere.
            Some(s.map(
                VirtAddr(BASE + (2 << 30)),
                PhysAddr(data.pa + PAGES * PAGE_SIZE),
                PAGES * PAGE_SIZE,
                Prot::WRITE,
                MapOptions::PAGES,
            ))
        } else {
            None
        };
        wait_passes(live, 2);
        stop(live, seq);
        switch(live, &s, false);
        if bsp {
            // SAFETY: the kernel's root maps everything.
            smp::switch_to_kernel();
        }
        res.map_err(|e| why("operation", e))?;
        if let Some(e) = bsp_err {
            return Err(e);
        }
        let scratch_ok = match scratch {
            Some(r) => {
                r.map_err(|e| why("map scratch", e))?;
                true
            }
            None => false,
        };
        for cpu in smp::cpus(live) {
            let r = &RES[cpu];
            let (stale, bad, fa) = (
                r.stale.load(Acquire),
                r.bad.load(Relaxed),
                r.faults_after.load(Relaxed),
            );
            if stale != 0 || bad != 0 {
                fail!("CPU {cpu}: {stale} probes saw the old state after the operation returned, {bad} wrong values");
            }
            if op != Op::Move && fa == 0 {
                fail!("CPU {cpu}: no fault after the operation returned");
            }
        }
        if op == Op::Move {
            // The tables show the move.
            if s.translate(VirtAddr(BASE)).is_some() || s.translate(VirtAddr(MOVED)).is_none() {
                fail!("the tables do not show the move");
            }
        }
        if write {
            // No write lost: each slot holds the last value its CPU
            // stored successfully (stores that faulted did not land).
            for cpu in smp::cpus(live) {
                for i in 0..PAGES {
                    let want = RES[cpu].last[i as usize].load(Relaxed);
                    let got = data.word(i, cpu as u64);
                    if want != got {
                        fail!("CPU {cpu} page {i}: last store {want:#x}, memory holds {got:#x}");
                    }
                }
            }
        }
        if scratch_ok {
            for i in PAGES..2 * PAGES {
                for slot in 0..MAX_CPUS as u64 {
                    if data.word(i, slot) != 0 {
                        fail!(
                            "a store landed in scratch page {} (reused after the move)",
                            i - PAGES
                        );
                    }
                }
            }
        }
        if op == Op::Protect && write {
            // Every page a CPU wrote is dirty: no D bit the hardware set
            // during the change was lost.
            let written = smp::cpus(live).fold(0, |m, c| m | RES[c].pages_written.load(Relaxed));
            for i in 0..PAGES {
                let e = s
                    .inspect()
                    .entry(VirtAddr(BASE + i * PAGE_SIZE), 0)
                    .unwrap_or(0);
                if written & (1 << i) != 0 && e & (1 << 6) == 0 {
                    fail!("page {i} was written but its PTE {e:#x} has no D bit");
                }
                if e & 2 != 0 {
                    fail!("page {i} still writable: {e:#x}");
                }
            }
        }
        Ok(n)
    })();
    // Every AP is back on the kernel's root (or never left it when an
    // early step failed before `switch`).
    let _ = s.unmap(VirtAddr(BASE), 4 << 30);
    drop_space(s);
    r
}

/// Counts the cases.
#[derive(Default)]
pub struct Tally {
    /// Cases that printed `ok`.
    pub passed: u32,
    /// Cases that printed `FAIL`.
    pub failed: u32,
}

impl Tally {
    fn case(&mut self, name: &str, r: Result<(), Why>) {
        match r {
            Ok(()) => {
                println!("ok {name}");
                self.passed += 1;
            }
            Err(w) => {
                println!("FAIL {name}: {w}");
                self.failed += 1;
            }
        }
    }
}

fn one_round(n: Count, live: u64) -> Result<(), Why> {
    let others = (live & !1).count_ones() as u64;
    if n.rounds != 1 || n.ipis != others {
        fail!("{} IPI rounds and {} IPIs for one operation on a space live on {} other CPUs (want 1 and {others})", n.rounds, n.ipis, others);
    }
    Ok(())
}

/// Runs the `smp_` cases. `kernel` is the kernel's root; `pool` the first
/// frame of the RAM pool (32 frames are used).
pub fn run<A: Arch>(kernel: PhysAddr, pool: u64) -> Tally {
    let mut t = Tally::default();
    let n = smp::ncpus();
    println!("== every CPU sees the change ({n} CPUs) ==");
    if n < 2 {
        t.case(
            "smp_bring_up",
            Err(Why::new(format_args!("only one CPU online"))),
        );
        return t;
    }
    let aps = smp::online() & !1;
    let data = Data { pa: pool };
    t.case(
        "smp_unmap_faults_everywhere",
        hammered::<A>(kernel, &data, aps, false, Op::Unmap, true).and_then(|c| one_round(c, aps)),
    );
    t.case(
        "smp_move_readers_follow",
        hammered::<A>(kernel, &data, aps, false, Op::Move, true).and_then(|c| one_round(c, aps)),
    );
    t.case(
        "smp_writer_races_move",
        hammered::<A>(kernel, &data, aps, true, Op::Move, false).map(|_| ()),
    );
    t.case(
        "smp_protect_readonly_everywhere",
        hammered::<A>(kernel, &data, aps, true, Op::Protect, true).and_then(|c| one_round(c, aps)),
    );
    t.case(
        "smp_space_live_elsewhere",
        live_elsewhere::<A>(kernel, &data, aps),
    );
    t.case("smp_shootdown_counted", counted::<A>(kernel, &data));
    t
}

/// A space live on the APs only (CPU 0 stays on the kernel's root, so it
/// is not in the space's mask): changed from CPU 0, still flushed there.
fn live_elsewhere<A: Arch>(kernel: PhysAddr, data: &Data, aps: u64) -> Result<(), Why> {
    let before: [u64; MAX_CPUS] = core::array::from_fn(|c| smp::FLUSH_IPIS_TAKEN[c].load(Relaxed));
    let c = hammered::<A>(kernel, data, aps, false, Op::Unmap, false)?;
    one_round(c, aps)?;
    for cpu in smp::cpus(aps) {
        if smp::FLUSH_IPIS_TAKEN[cpu].load(Relaxed) == before[cpu] {
            fail!("CPU {cpu} handled no flush");
        }
    }
    if smp::FLUSH_IPIS_TAKEN[0].load(Relaxed) != before[0] {
        fail!("CPU 0 handled a flush IPI");
    }
    Ok(())
}

/// One IPI round per flushing operation, reaching exactly the CPUs the
/// space is live on; a table of operation × live CPUs.
fn counted<A: Arch>(kernel: PhysAddr, data: &Data) -> Result<(), Why> {
    println!(
        "  {:<10} {:<10} {:>6} {:>5} {:>8}",
        "operation", "live on", "rounds", "IPIs", "ticks"
    );
    let n = smp::ncpus();
    let mut err = None;
    for k in [1usize, 2, n - 1] {
        let live: u64 = ((1u64 << k) - 1) << 1;
        data.fill();
        let mm = MmCpus::new();
        let mut s = new_space::<A>(kernel, &mm)?;
        switch(live, &s, true);
        let va = VirtAddr(BASE);
        let len = PAGES * PAGE_SIZE;
        let ops: [(&str, bool); 4] = [
            ("map", false),
            ("protect", true),
            ("move", true),
            ("unmap", true),
        ];
        for (name, flushes) in ops {
            let c = count();
            let t0 = tsc::now();
            let r = match name {
                "map" => s.map(va, PhysAddr(data.pa), len, Prot::WRITE, MapOptions::PAGES),
                "protect" => s.change_protection(va, len, Prot::READ_ONLY),
                "move" => s.move_page_tables(va, VirtAddr(MOVED), len, MoveOptions::DEFAULT),
                _ => s.unmap(VirtAddr(MOVED), len),
            };
            let dt = tsc::now() - t0;
            let d = since(c);
            println!(
                "  {:<10} CPUs 1-{:<4} {:>6} {:>5} {:>8}",
                name, k, d.rounds, d.ipis, dt
            );
            if let Err(e) = r {
                err.get_or_insert(why(name, e));
            } else if (flushes && (d.rounds != 1 || d.ipis != k as u64))
                || (!flushes && d.rounds != 0)
            {
                err.get_or_insert(Why::new(format_args!(
                    "{name} on CPUs 1-{k}: {} rounds, {} IPIs",
                    d.rounds, d.ipis
                )));
            }
        }
        switch(live, &s, false);
        let _ = s.unmap(VirtAddr(BASE), 4 << 30);
        drop_space(s);
    }
    match err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
