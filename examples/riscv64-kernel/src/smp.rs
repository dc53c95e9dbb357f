//! The other harts: brought up through SBI HSM, driven through one
//! mailbox each, and the SMP [`Mmu`] whose flushes reach them through SBI
//! RFENCE.
//!
//! # Bring-up
//!
//! [`bring_up`] starts every hart but the boot one with `sbi_hart_start`
//! at `_secondary` (trap.rs) with its stack; each runs
//! [`secondary_main`] with `satp` Bare (the kernel's addresses are
//! physical), marks itself online and serves its [`Mailbox`] until told
//! to stop (`sbi_hart_stop`).
//!
//! # Shootdown
//!
//! `SFENCE.VMA` acts on the executing hart only (privileged spec,
//! "Supervisor Memory-Management Fence Instruction"); the other harts are
//! reached through the SBI RFENCE extension, which makes each target hart
//! execute the fence and, in OpenSBI, returns only once all of them have.
//! [`SmpMmu`] is pgtable-riscv's `shootdown::SmpMmu` (the same contract
//! pgtable-x86's `SmpMmu` meets with IPI rounds: a flush returns only once
//! no hart on which the space may be live can use the old translation)
//! with [`SbiFence`], this kernel's SBI calls. Where the space may be live
//! is an [`MmHarts`] (Linux `mm_cpumask`): a hart's bit is set before it
//! switches to the space and is never cleared.

use core::arch::asm;
use core::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

pub use pgtable_riscv::shootdown::MmHarts;
use pgtable_riscv::shootdown::{self, HartMask, RemoteFence};
use pgtable_riscv::{Asid, LocalHart};

use crate::machine::now;
use crate::{sbi, trap};

/// Hart IDs 0..HARTS (QEMU `-smp 4`).
pub const HARTS: usize = 4;

/// The executing hart's ID (kept in `tp` by trap.rs).
pub fn this_hart() -> usize {
    let tp: usize;
    // SAFETY: reads `tp`, which the entry code set and nothing else writes.
    unsafe { asm!("mv {0}, tp", out(reg) tp, options(nomem, nostack)) };
    tp
}

/// How long the boot hart waits for another hart, in `time` ticks: 10 s.
/// The `time` CSR follows the host's clock, and under TCG on a loaded
/// host a vCPU thread may not run for a long while.
pub const PATIENCE: u64 = 10 * crate::machine::TIMEBASE_HZ;

/// Hart `hart`'s bit in [`ONLINE`] (none for an ID past 63: such a hart
/// is not started here, `HARTS` is 4).
fn hart_bit(hart: usize) -> u64 {
    u32::try_from(hart)
        .ok()
        .and_then(|h| 1u64.checked_shl(h))
        .unwrap_or(0)
}

/// Harts that came up (bit i = hart i).
static ONLINE: AtomicU64 = AtomicU64::new(0);

/// A request to one hart and its answer.
pub struct Mailbox {
    /// The request ([`Cmd`] as u64; 0 = none / done).
    cmd: AtomicU64,
    a: AtomicU64,
    b: AtomicU64,
    value: AtomicU64,
    cause: AtomicU64,
}

/// What a secondary hart can be asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Cmd {
    /// `csrw satp, a` then `SFENCE.VMA x0, x0` (a = 0: translation off).
    Satp = 1,
    /// Load the u64 at `a`.
    Read = 2,
    /// Store `b` at `a`.
    Write = 3,
    /// `sbi_hart_stop`.
    Stop = 4,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Mailbox = Mailbox {
    cmd: AtomicU64::new(0),
    a: AtomicU64::new(0),
    b: AtomicU64::new(0),
    value: AtomicU64::new(0),
    cause: AtomicU64::new(0),
};

static MAILBOXES: [Mailbox; HARTS] = [EMPTY; HARTS];

/// A hart that did not answer.
#[derive(Clone, Copy, Debug)]
pub struct NoAnswer(pub usize);

/// Asks `hart` to do `cmd` with `a` and `b` and waits ([`PATIENCE`] at
/// most) for the answer: `Ok(value)` or `Err(scause)` of the fault the
/// access took, inside `Ok`.
pub fn ask(hart: usize, cmd: Cmd, a: u64, b: u64) -> Result<Result<u64, u64>, NoAnswer> {
    let m = &MAILBOXES[hart];
    // A hart that never answered its last request gets no new one (its
    // arguments would change under it).
    if m.cmd.load(Acquire) != 0 {
        return Err(NoAnswer(hart));
    }
    m.a.store(a, Relaxed);
    m.b.store(b, Relaxed);
    // Release: the arguments (and every earlier table write) before the
    // request the hart acquires.
    m.cmd.store(cmd as u64, Release);
    let start = now();
    // Acquire: the answer's fields after the hart's release of `cmd`.
    while m.cmd.load(Acquire) != 0 {
        if now() - start > PATIENCE {
            return Err(NoAnswer(hart));
        }
        core::hint::spin_loop();
    }
    Ok(match m.cause.load(Relaxed) {
        0 => Ok(m.value.load(Relaxed)),
        c => Err(c),
    })
}

/// The secondary harts' Rust entry (trap.rs `_secondary`).
#[no_mangle]
extern "C" fn secondary_main(hart: usize) -> ! {
    // Release: pairs with the boot hart's Acquire in `bring_up`.
    ONLINE.fetch_or(hart_bit(hart), Release);
    let m = &MAILBOXES[hart];
    loop {
        // Acquire: the request's arguments after the boot hart's release.
        let cmd = m.cmd.load(Acquire);
        if cmd == 0 {
            core::hint::spin_loop();
            continue;
        }
        let (a, b) = (m.a.load(Relaxed), m.b.load(Relaxed));
        const SATP: u64 = Cmd::Satp as u64;
        const READ: u64 = Cmd::Read as u64;
        const WRITE: u64 = Cmd::Write as u64;
        let r = match cmd {
            SATP => {
                // SAFETY: the boot hart names the kernel's identity map
                // (every space the cases build maps all RAM identically),
                // or 0 (Bare, also identity).
                unsafe { asm!("csrw satp, {0}", "sfence.vma x0, x0", in(reg) a, options(nostack)) };
                Ok(0)
            }
            READ => trap::read_u64(a),
            // SAFETY: the boot hart asks for stores only into pages the
            // cases mapped over their own frames.
            WRITE => unsafe { trap::write_u64(a, b) }.map(|()| 0),
            _ => {
                m.cause.store(0, Relaxed);
                // Release: the answer before the hart stops.
                m.cmd.store(0, Release);
                ONLINE.fetch_and(!hart_bit(hart), Relaxed);
                let _ = sbi::hart_stop();
                loop {
                    core::hint::spin_loop();
                }
            }
        };
        match r {
            Ok(v) => {
                m.value.store(v, Relaxed);
                m.cause.store(0, Relaxed);
            }
            Err(c) => m.cause.store(c, Relaxed),
        }
        // Release: the answer before the boot hart's acquire of `cmd`.
        m.cmd.store(0, Release);
    }
}

/// Starts every other hart; returns the online mask.
pub fn bring_up() -> Result<u64, (usize, sbi::SbiError)> {
    extern "C" {
        fn _secondary();
        static __stacks_start: u8;
    }
    let me = this_hart();
    ONLINE.fetch_or(hart_bit(me), Relaxed);
    let stacks = &raw const __stacks_start as u64;
    for hart in (0..HARTS).filter(|&h| h != me) {
        let top = stacks + ((hart as u64 + 1) << 16);
        sbi::hart_start(hart as u64, _secondary as *const () as u64, top).map_err(|e| (hart, e))?;
    }
    let start = now();
    let all = (1u64 << HARTS) - 1;
    // Acquire: pairs with each secondary's Release.
    while ONLINE.load(Acquire) != all && now() - start < PATIENCE {
        core::hint::spin_loop();
    }
    Ok(ONLINE.load(Acquire))
}

/// The harts online now.
pub fn online() -> u64 {
    ONLINE.load(Acquire)
}

/// Remote fences switched off for every space (`noshootdown` on the
/// command line): flushes then reach the executing hart only, which is
/// wrong with several harts; for seeing the `smp_` cases fail.
static NO_SHOOTDOWN: AtomicBool = AtomicBool::new(false);

/// Switches the remote fences off (see [`NO_SHOOTDOWN`]).
pub fn disable_shootdown() {
    NO_SHOOTDOWN.store(true, Relaxed);
}

/// The kernel's [`RemoteFence`]: the SBI RFENCE calls, or nothing with
/// `noshootdown` (see [`NO_SHOOTDOWN`]).
pub struct SbiFence;

/// The one [`SbiFence`] every space's [`SmpMmu`] uses.
pub static SBI_FENCE: SbiFence = SbiFence;

// SAFETY: OpenSBI returns from RFENCE once every target hart executed the
// fence; a failed call shuts the machine down instead of returning. With
// `noshootdown` the contract is broken on purpose, to show the `smp_`
// cases fail without remote fences.
unsafe impl RemoteFence for SbiFence {
    fn this_hart(&self) -> usize {
        this_hart()
    }

    fn remote_sfence_vma(&self, harts: HartMask, start: u64, size: u64, asid: Option<Asid>) {
        // Relaxed: a boot-time switch.
        if NO_SHOOTDOWN.load(Relaxed) {
            return;
        }
        let r = match asid {
            Some(a) => sbi::remote_sfence_vma_asid(harts.mask, harts.base, start, size, a.get()),
            None => sbi::remote_sfence_vma(harts.mask, harts.base, start, size),
        };
        if let Err(e) = r {
            // The contract cannot be met: stop rather than run on stale
            // translations.
            crate::println!(
                "FAIL smp: SBI RFENCE to harts {:#x} (base {}) returned {e:?}",
                harts.mask,
                harts.base
            );
            crate::println!("0 passed, 1 failed");
            sbi::shutdown(false)
        }
    }
}

/// The [`Mmu`](pgtable_core::contract::Mmu) of a space live on several
/// harts: pgtable-riscv's `SmpMmu` with the local fences of a
/// `RiscvMmu` and the SBI remote fences.
pub type SmpMmu<'a> = shootdown::SmpMmu<'a, LocalHart, SbiFence>;
