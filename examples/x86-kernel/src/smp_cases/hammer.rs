//! The APs' side of the `smp_` cases: the command block, the idle loop
//! and the hammering probes, and CPU 0's calls that drive them.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

use pgtable_core::contract::PAGE_SIZE;
use pgtable_x86::MmCpus;

use crate::smp::{self, MAX_CPUS};
use crate::{shootdown, trap, tsc};

/// Pages in a hammered range.
pub(super) const PAGES: u64 = 16;
/// The word at offset 0 of page `i` (the readers' pattern; writers use the
/// word at `cpu * 8`, so CPU 0's slot is the pattern's).
pub(super) fn pattern(i: u64) -> u64 {
    0x5a5a_0000_0000_0000 | i
}

/// Commands.
pub(super) const OP_SWITCH: u64 = 1;
pub(super) const OP_READ: u64 = 2;
pub(super) const OP_WRITE: u64 = 3;

/// The command block.
struct Cmd {
    seq: AtomicU64,
    op: AtomicU64,
    a: AtomicU64,
    b: AtomicU64,
    c: AtomicU64,
    /// The epoch from which the new state must be seen.
    target: AtomicU64,
}

static CMD: Cmd = Cmd {
    seq: AtomicU64::new(0),
    op: AtomicU64::new(0),
    a: AtomicU64::new(0),
    b: AtomicU64::new(0),
    c: AtomicU64::new(0),
    target: AtomicU64::new(u64::MAX),
};
static STOP: AtomicBool = AtomicBool::new(false);
pub(super) static EPOCH: AtomicU64 = AtomicU64::new(0);

/// What each AP saw.
pub(super) struct Res {
    pub(super) done: AtomicU64,
    pub(super) passes: AtomicU64,
    /// Probes that began after the operation returned and saw the old
    /// state (an access that should have faulted succeeded, or one that
    /// should have succeeded faulted).
    pub(super) stale: AtomicU64,
    /// Loads that returned a wrong value.
    pub(super) bad: AtomicU64,
    /// Faults seen after the operation returned.
    pub(super) faults_after: AtomicU64,
    /// Pages with at least one successful write (bit per page).
    pub(super) pages_written: AtomicU64,
    /// The last value this CPU wrote successfully into each page.
    pub(super) last: [AtomicU64; PAGES as usize],
}

pub(super) static RES: [Res; MAX_CPUS] = [const {
    Res {
        done: AtomicU64::new(0),
        passes: AtomicU64::new(0),
        stale: AtomicU64::new(0),
        bad: AtomicU64::new(0),
        faults_after: AtomicU64::new(0),
        pages_written: AtomicU64::new(0),
        last: [const { AtomicU64::new(0) }; PAGES as usize],
    }
}; MAX_CPUS];

/// The APs' loop: idle in `sti; hlt` until a new command, run it, ack.
pub fn ap_loop(cpu: usize) -> ! {
    let mut last = 0;
    loop {
        x86_64::instructions::interrupts::disable();
        // Acquire: pairs with `post`'s Release; the arguments are visible.
        let seq = CMD.seq.load(Acquire);
        if seq == last {
            // `sti; hlt`: an IPI that arrives after the check wakes the hlt.
            x86_64::instructions::interrupts::enable_and_hlt();
            continue;
        }
        x86_64::instructions::interrupts::enable();
        last = seq;
        run_command(cpu);
        // Release: the results are visible to CPU 0 once it sees the ack.
        RES[cpu].done.store(seq, Release);
    }
}

fn run_command(cpu: usize) {
    let (a, b, c) = (
        CMD.a.load(Relaxed),
        CMD.b.load(Relaxed),
        CMD.c.load(Relaxed),
    );
    match CMD.op.load(Relaxed) {
        OP_SWITCH => {
            if a != 0 {
                // a: the test space's root, b: its CPU set.
                // SAFETY: CPU 0 passes the root and the `MmCpus` of a
                // space that shares the kernel half and outlives this
                // CPU's use of it (CPU 0 switches every AP back first).
                unsafe { shootdown::switch_to(a, &*(b as *const MmCpus)) };
            } else {
                smp::switch_to_kernel();
            }
        }
        OP_READ | OP_WRITE => hammer(cpu, CMD.op.load(Relaxed) == OP_WRITE, a, c),
        _ => {}
    }
}

/// Probes the `PAGES` pages at `va` until told to stop: loads of the
/// pattern, or stores into this CPU's slot. With `alt != 0` (a move), an
/// access that faults at `va` is retried at `alt`; after the epoch `va`
/// must fault and `alt` must not. With `alt == 0`, after the epoch the
/// access must fault.
fn hammer(cpu: usize, write: bool, va: u64, alt: u64) {
    let r = &RES[cpu];
    let target = CMD.target.load(Relaxed);
    let mut seq = 0u64;
    while !STOP.load(Relaxed) {
        for i in 0..PAGES {
            // Acquire: pairs with CPU 0's Release bump after the operation
            // returned: a probe after this load began after the return.
            let after = EPOCH.load(Acquire) >= target;
            let off = i * PAGE_SIZE + if write { cpu as u64 * 8 } else { 0 };
            seq += 1;
            let value = (cpu as u64) << 56 | seq;
            let access = |at: u64| -> Result<u64, trap::PageFault> {
                if write {
                    // SAFETY: the test space maps only frames of the
                    // suite's RAM pool at these addresses (or nothing).
                    unsafe { trap::write_u64(at + off, value) }.map(|()| value)
                } else {
                    trap::read_u64(at + off)
                }
            };
            let first = access(va);
            let (ok, stale) = match (first, alt) {
                (Ok(v), _) => (Some(v), after),
                (Err(_), 0) => (None, false),
                (Err(_), alt) => match access(alt) {
                    Ok(v) => (Some(v), false),
                    Err(_) => (None, after),
                },
            };
            if stale {
                r.stale.fetch_add(1, Relaxed);
            }
            match ok {
                Some(v) => {
                    if write {
                        r.last[i as usize].store(v, Relaxed);
                        r.pages_written.fetch_or(1 << i, Relaxed);
                    } else if v != pattern(i) {
                        r.bad.fetch_add(1, Relaxed);
                    }
                }
                None if after => {
                    r.faults_after.fetch_add(1, Relaxed);
                }
                None => {}
            }
        }
        r.passes.fetch_add(1, Release);
    }
}

/// Posts a command to the CPUs of `mask` and wakes them.
pub(super) fn post(mask: u64, op: u64, a: u64, b: u64, c: u64) -> u64 {
    // A switch keeps the results of the hammering before it.
    for cpu in smp::cpus(if op == OP_SWITCH { 0 } else { mask }) {
        let r = &RES[cpu];
        r.passes.store(0, Relaxed);
        r.stale.store(0, Relaxed);
        r.bad.store(0, Relaxed);
        r.faults_after.store(0, Relaxed);
        r.pages_written.store(0, Relaxed);
        for l in &r.last {
            l.store(0, Relaxed);
        }
    }
    STOP.store(false, Relaxed);
    CMD.op.store(op, Relaxed);
    CMD.a.store(a, Relaxed);
    CMD.b.store(b, Relaxed);
    CMD.c.store(c, Relaxed);
    CMD.target.store(EPOCH.load(Relaxed) + 1, Relaxed);
    // Release: the arguments and the reset results before the new seq.
    let seq = CMD.seq.fetch_add(1, Release) + 1;
    smp::kick(mask);
    seq
}

/// Waits for every CPU of `mask` to finish command `seq` (after `stop`).
pub(super) fn wait_done(mask: u64, seq: u64) {
    for cpu in smp::cpus(mask) {
        let deadline = Deadline::new();
        // Acquire: pairs with the AP's Release of its ack.
        while RES[cpu].done.load(Acquire) != seq {
            deadline.check(cpu, "to finish its command");
            core::hint::spin_loop();
        }
    }
}

/// How long CPU 0 waits for an AP before it ends the run: 60 s of TSC
/// (real time, also under emulation), far beyond any case's needs.
struct Deadline(u64);

impl Deadline {
    fn new() -> Deadline {
        Deadline(tsc::now() + 60 * smp::tsc_hz())
    }

    /// Ends the run as failed once the deadline has passed: an AP that
    /// stopped answering leaves no state a later case could trust.
    fn check(&self, cpu: usize, what: &str) {
        if tsc::now() > self.0 {
            crate::println!("FAIL smp: CPU {cpu} did not answer within 60 s ({what})");
            crate::println!("0 passed, 1 failed");
            crate::exit(false);
        }
    }
}

/// Waits until every CPU of `mask` has completed `n` more passes.
pub(super) fn wait_passes(mask: u64, n: u64) {
    for cpu in smp::cpus(mask) {
        let start = RES[cpu].passes.load(Acquire);
        let deadline = Deadline::new();
        while RES[cpu].passes.load(Acquire) < start + n {
            deadline.check(cpu, "to complete its probe passes");
            core::hint::spin_loop();
        }
    }
}

/// Stops the hammering command `seq`.
pub(super) fn stop(mask: u64, seq: u64) {
    STOP.store(true, Relaxed);
    wait_done(mask, seq);
}
