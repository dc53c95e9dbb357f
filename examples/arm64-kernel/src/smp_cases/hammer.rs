//! The secondaries' side of a round: the access loop.

use core::sync::atomic::Ordering::{Acquire, Relaxed};

use super::PAGE;
use crate::probe;
use crate::smp::{PerCpu, CMD, FAULT, OK, SLOTS, WRONG};

/// Loop mode: loads from A.
pub const READ: u64 = 0;
/// Loop mode: loads from A and from B.
pub const PAIR: u64 = 1;
/// Loop mode: a writer racing a move from A to B.
pub const WRITE_RACE: u64 = 2;
/// Loop mode: stores to every page of A.
pub const WRITE_PAGES: u64 = 3;
/// Loop mode: loads from A, any outcome.
pub const ANY: u64 = 4;

/// The access loop of a secondary (see the module docs), until the next
/// command. `a` = [mode, A, B, pages, marker, epoch].
pub fn hammer(cpu: usize, me: &PerCpu, seq: u64, a: [u64; 6]) {
    let [mode, va_a, va_b, pages, mark, target] = a;
    let pages = pages.max(1);
    let c = cpu as u64;
    let mut counts = [0u64; SLOTS];
    let mut iters = [0u64; 2];
    let mut it = 0u64;
    let mut post_esr = 0;
    let mut written = 0u64;
    // Relaxed: a new command is seen a few iterations late at worst.
    while CMD.seq.load(Relaxed) == seq {
        // Acquire: pairs with CPU 0's release store after the operation
        // returned, so accesses after this load come after it.
        let post = CMD.epoch.load(Acquire) >= target;
        let p = it % pages;
        let mut note = |side: usize, outcome: usize, esr: u64| {
            counts[crate::smp::slot(side, post, outcome)] += 1;
            if post && outcome == FAULT && post_esr == 0 {
                post_esr = esr;
            }
        };
        match mode {
            READ | PAIR | ANY => {
                let sides: &[u64] = if mode == PAIR { &[va_a, va_b] } else { &[va_a] };
                for (side, &base) in sides.iter().enumerate() {
                    match probe::read_u64(base + p * PAGE) {
                        Ok(v) if mode == ANY || v == mark ^ p => note(side, OK, 0),
                        Ok(_) => note(side, WRONG, 0),
                        Err(f) => note(side, FAULT, f.esr),
                    }
                }
            }
            WRITE_RACE => {
                let off = ((c - 1) % pages) * PAGE + c * 8;
                let v = c << 56 | (it + 1);
                // SAFETY: the case maps only pool frames at A and B (or
                // nothing): a store that succeeds lands in a pool frame.
                let at_a = unsafe { probe::write_u64(va_a + off, v) }.is_ok();
                let at_b = !at_a && {
                    // SAFETY: as above.
                    unsafe { probe::write_u64(va_b + off, v) }.is_ok()
                };
                if at_a || at_b {
                    note(usize::from(at_b), OK, 0);
                    // Relaxed: published by the acknowledgement.
                    me.last_write.store(v, Relaxed);
                } else {
                    note(1, FAULT, 0);
                }
            }
            WRITE_PAGES => {
                let v = c << 56 | (it + 1);
                // SAFETY: as above.
                match unsafe { probe::write_u64(va_a + p * PAGE + c * 8, v) } {
                    Ok(()) => {
                        note(0, OK, 0);
                        written |= 1 << (p % 64);
                    }
                    Err(f) => note(0, FAULT, f.esr),
                }
            }
            _ => return,
        }
        iters[post as usize] += 1;
        // Relaxed: progress for CPU 0's waits; the results are published
        // by the acknowledgement (release) after the loop.
        me.iters[post as usize].store(iters[post as usize], Relaxed);
        it += 1;
    }
    for (slot, n) in me.counts.iter().zip(counts) {
        // Relaxed: published by the acknowledgement.
        slot.store(n, Relaxed);
    }
    // Relaxed: as above.
    me.pages_written.store(written, Relaxed);
    me.post_esr.store(post_esr, Relaxed);
}
