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
//! [`SmpMmu`] is the [`Mmu`] contract for a space live on several harts,
//! the same contract pgtable-x86's `SmpMmu` meets with IPI rounds: a
//! flush returns only once no hart on which the space may be live can use
//! the old translation. Where the space may be live is an [`MmHarts`]
//! (Linux `mm_cpumask`): a hart's bit is set before it switches to the
//! space and is never cleared (a fence for a hart that left is only
//! wasted).

use core::arch::asm;
use core::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use pgtable_core::contract::{Mmu, TlbRange};
use pgtable_core::PhysAddr;
use pgtable_riscv::RiscvMmu;

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
    ONLINE.fetch_or(1 << hart, Release);
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
                ONLINE.fetch_and(!(1 << hart), Relaxed);
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
    ONLINE.fetch_or(1 << me, Relaxed);
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

/// Where an address space may be live (Linux `mm_cpumask`), and a switch
/// to turn the remote fences off (to show that a case needs them).
pub struct MmHarts {
    harts: AtomicU64,
    remote: AtomicBool,
}

impl MmHarts {
    /// No hart yet, remote fences on.
    pub const fn new() -> MmHarts {
        MmHarts {
            harts: AtomicU64::new(0),
            remote: AtomicBool::new(true),
        }
    }

    /// Marks `hart` as one the space may be live on; call before the hart
    /// switches to it.
    pub fn add(&self, hart: usize) {
        // Relaxed: the switch request that follows is a Release store.
        self.harts.fetch_or(1 << hart, Relaxed);
    }

    /// Turns the remote fences on or off.
    pub fn set_remote(&self, on: bool) {
        self.remote.store(on, Relaxed);
    }

    /// The harts other than this one the space may be live on, if remote
    /// fences are on.
    fn targets(&self) -> u64 {
        if !self.remote.load(Relaxed) || NO_SHOOTDOWN.load(Relaxed) {
            return 0;
        }
        // Relaxed: a hart added later switches after this flush began, so
        // it cannot hold a translation from before it.
        self.harts.load(Relaxed) & !(1 << this_hart())
    }
}

/// The [`Mmu`] of a space live on several harts: `local` (a
/// [`RiscvMmu`], which fences the executing hart) plus
/// `sbi_remote_sfence_vma_asid` (or `sbi_remote_sfence_vma` untagged) to
/// the other harts of its [`MmHarts`].
pub struct SmpMmu<'a> {
    local: RiscvMmu,
    mm: &'a MmHarts,
}

impl<'a> SmpMmu<'a> {
    /// The MMU of the space whose harts are `mm`.
    pub const fn new(local: RiscvMmu, mm: &'a MmHarts) -> SmpMmu<'a> {
        SmpMmu { local, mm }
    }

    /// The remote half of a flush of `[start, start + size)` (`size`
    /// `u64::MAX`: everything of the ASID, or everything).
    fn remote(&self, start: u64, size: u64) {
        let mask = self.mm.targets();
        if mask == 0 {
            return;
        }
        let r = match self.local.asid() {
            Some(a) => sbi::remote_sfence_vma_asid(mask, start, size, a.get()),
            None => sbi::remote_sfence_vma(mask, start, size),
        };
        if let Err(e) = r {
            // The contract cannot be met: stop rather than run on stale
            // translations.
            crate::println!("FAIL smp: SBI RFENCE to harts {mask:#x} returned {e:?}");
            crate::println!("0 passed, 1 failed");
            sbi::shutdown(false)
        }
    }
}

// SAFETY: the barriers and the install are `local`'s (a RiscvMmu), which
// meets the contract on the executing hart; every flush also runs on the
// other harts the space may be live on through SBI RFENCE, which returns
// after they executed the fence. Range flushes of leaves name the range
// (per 4 KiB page or everything, as OpenSBI decides); flushes of tables,
// `flush_tlb_mm` and `flush_tlb_all` name everything (`size` all ones).
// Untagged, remote fences use `sbi_remote_sfence_vma`, which reaches
// global entries too; tagged spaces hold no global leaf that changes.
unsafe impl Mmu for SmpMmu<'_> {
    fn walker_barrier(&self) {
        self.local.walker_barrier();
    }

    fn publish_barrier(&self) {
        self.local.publish_barrier();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.local.flush_tlb_range(range);
        let len = range.end.0.wrapping_sub(range.start.0);
        if range.last_level && len != 0 {
            self.remote(range.start.0, len);
        } else {
            self.remote(0, u64::MAX);
        }
    }

    fn flush_tlb_all(&self) {
        self.local.flush_tlb_all();
        let mask = self.mm.targets();
        if mask != 0 && sbi::remote_sfence_vma(mask, 0, u64::MAX).is_err() {
            crate::println!("FAIL smp: SBI RFENCE failed");
            sbi::shutdown(false)
        }
    }

    fn flush_tlb_mm(&self) {
        self.local.flush_tlb_mm();
        self.remote(0, u64::MAX);
    }

    /// Marks the executing hart in the space's harts, then `local`'s
    /// install.
    unsafe fn install_root(&self, root: PhysAddr) {
        self.mm.add(this_hart());
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.local.install_root(root) };
    }
}
