//! The kernel's TLB shootdown, until pgtable-x86's own lands: one request
//! block, one IPI per target CPU on [`crate::smp::FLUSH_VECTOR`], each target flushes
//! its own TLB ([`handle_flush_ipi`]), acknowledges and EOIs; the
//! initiator flushes locally and waits for every acknowledgement (Linux
//! `native_flush_tlb_multi` with `flush_tlb_func`). [`SmpMmu`] is the
//! pgtable [`Mmu`] that uses it.
//!
//! It is shaped as the library's interface: the kernel's part is sending
//! the IPIs ([`crate::smp::send_flush_ipis`], an `IpiSender`) and calling
//! [`handle_flush_ipi`] from its interrupt stub; swapping in the library
//! replaces this file.

use core::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};

use pgtable_core::{Mmu, PhysAddr, TlbRange, PAGE_SIZE};
use pgtable_x86::X86Mmu;
use x86_64::registers::control::{Cr4, Cr4Flags};

use crate::smp::{online, this_cpu, MAX_CPUS};

/// What a shootdown asks each target to flush.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushReq {
    /// The pages of a range (INVLPG per page; a full non-global flush past
    /// [`FLUSH_CEILING`] pages).
    Range { start: u64, end: u64 },
    /// Every non-global translation (MOV to CR3).
    Mm,
    /// Everything, global translations too (CR4.PGE toggle).
    All,
}

/// Pages past which a range flush is a full flush (Linux
/// `tlb_single_page_flush_ceiling`, 33).
pub const FLUSH_CEILING: u64 = 33;

/// The request the targets of the current shootdown read.
static REQ_KIND: AtomicU64 = AtomicU64::new(0);
static REQ_START: AtomicU64 = AtomicU64::new(0);
static REQ_END: AtomicU64 = AtomicU64::new(0);
/// Targets that have not acknowledged yet.
static PENDING: AtomicU64 = AtomicU64::new(0);
/// Serialises initiators (the kernel's cases initiate from CPU 0 only,
/// but nothing else stops an AP).
static INITIATOR: AtomicBool = AtomicBool::new(false);

/// Shootdown counters: rounds (one per operation's flush), IPIs sent.
pub static ROUNDS: AtomicU64 = AtomicU64::new(0);
/// IPIs sent by shootdowns.
pub static IPIS: AtomicU64 = AtomicU64::new(0);
/// Flushes handled per CPU (the IPI handler counts them).
pub static HANDLED: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// Flushes this CPU's TLB as `req` says.
pub fn flush_local(req: FlushReq) {
    match req {
        FlushReq::Range { start, end } if (end - start) / PAGE_SIZE <= FLUSH_CEILING => {
            let mut va = start;
            while va < end {
                x86_64::instructions::tlb::flush(x86_64::VirtAddr::new_truncate(va));
                va += PAGE_SIZE;
            }
        }
        FlushReq::Range { .. } | FlushReq::Mm => x86_64::instructions::tlb::flush_all(),
        FlushReq::All => {
            let cr4 = Cr4::read();
            // SAFETY: clearing and restoring CR4.PGE flushes every
            // translation, global ones included (SDM vol. 3A §4.10.4.1);
            // it changes no mapping.
            unsafe {
                Cr4::write(cr4 - Cr4Flags::PAGE_GLOBAL);
                Cr4::write(cr4);
            }
        }
    }
}

/// The flush IPI's handler: this CPU's part of the current shootdown.
pub fn handle_flush_ipi(cpu: usize) {
    // Acquire: pairs with the initiator's Release store of the request.
    let kind = REQ_KIND.load(Acquire);
    let req = match kind {
        1 => FlushReq::Range {
            start: REQ_START.load(Relaxed),
            end: REQ_END.load(Relaxed),
        },
        2 => FlushReq::Mm,
        _ => FlushReq::All,
    };
    flush_local(req);
    HANDLED[cpu].fetch_add(1, Relaxed);
    // Release: the flush is done before the initiator sees the ack (and
    // frees what the flushed translations pointed at).
    PENDING.fetch_and(!(1 << cpu), Release);
}

/// Shootdowns switched off (`noshootdown` on the command line): flushes
/// reach the executing CPU only, which is wrong with several CPUs; for
/// seeing the `smp_` cases fail.
static NO_SHOOTDOWN: AtomicBool = AtomicBool::new(false);

/// Switches shootdowns off (see [`NO_SHOOTDOWN`]).
pub fn disable_shootdown() {
    NO_SHOOTDOWN.store(true, Relaxed);
}

/// Flushes `req` on the CPUs of `mask` other than this one, one IPI each,
/// and waits for all of them. This is the kernel-side stand-in for the
/// library's `IpiSender`-driven shootdown.
pub fn shootdown(mask: u64, req: FlushReq) {
    let me = 1u64 << this_cpu();
    let targets = mask & !me & online();
    if targets == 0 || NO_SHOOTDOWN.load(Relaxed) {
        return;
    }
    while INITIATOR
        .compare_exchange(false, true, Acquire, Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    let (kind, s, e) = match req {
        FlushReq::Range { start, end } => (1, start, end),
        FlushReq::Mm => (2, 0, 0),
        FlushReq::All => (3, 0, 0),
    };
    REQ_START.store(s, Relaxed);
    REQ_END.store(e, Relaxed);
    PENDING.store(targets, Relaxed);
    // Release: the request (and the entry writes before this flush) are
    // visible to a target that reads REQ_KIND in its handler.
    REQ_KIND.store(kind, Release);
    ROUNDS.fetch_add(1, Relaxed);
    IPIS.fetch_add(u64::from(targets.count_ones()), Relaxed);
    crate::smp::send_flush_ipis(targets);
    // Acquire: pairs with each handler's Release; its flush is done.
    while PENDING.load(Acquire) != 0 {
        core::hint::spin_loop();
    }
    INITIATOR.store(false, Release);
}

/// An [`Mmu`] for address spaces that may be live on several CPUs: the
/// local flush of [`X86Mmu`], then a shootdown of the CPUs in its mask
/// (those that have the space installed, Linux `mm_cpumask`).
pub struct SmpMmu {
    /// The local MMU.
    pub local: X86Mmu,
    /// CPUs on which the space is installed. A CPU sets its bit before it
    /// loads the root and clears it after it left it.
    pub cpus: AtomicU64,
}

impl SmpMmu {
    /// A new MMU whose space is live nowhere yet.
    pub fn new() -> SmpMmu {
        SmpMmu {
            local: X86Mmu::new(),
            cpus: AtomicU64::new(0),
        }
    }

    /// The mask of CPUs a flush must reach (SeqCst: the entry writes before
    /// this flush are ordered before the mask is read, against a CPU that
    /// sets its bit and then loads the root, Linux's
    /// `switch_mm_irqs_off` / `flush_tlb_mm_range` pairing).
    fn targets(&self) -> u64 {
        fence(SeqCst);
        self.cpus.load(SeqCst)
    }
}

// SAFETY: every flush flushes this CPU (X86Mmu, which upholds the
// contract locally) and then, through `shootdown`, every other CPU on
// which the space is installed, and waits for all of them; other methods
// forward to X86Mmu.
unsafe impl Mmu for SmpMmu {
    fn walker_barrier(&self) {}

    fn flush_tlb_range(&self, range: TlbRange) {
        self.local.flush_tlb_range(range);
        shootdown(
            self.targets(),
            FlushReq::Range {
                start: range.start.0,
                end: range.end.0,
            },
        );
    }

    fn flush_tlb_all(&self) {
        self.local.flush_tlb_all();
        shootdown(online(), FlushReq::All);
    }

    fn flush_tlb_mm(&self) {
        self.local.flush_tlb_mm();
        shootdown(self.targets(), FlushReq::Mm);
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        self.cpus.fetch_or(1 << this_cpu(), SeqCst);
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.local.install_root(root) }
    }
}
