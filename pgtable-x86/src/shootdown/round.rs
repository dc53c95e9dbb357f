//! The shootdown rounds: switches, the initiator's side (one IPI round
//! per flush, the wait for acknowledgements) and the receiver's handler.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};

use pgtable_core::contract::{Mmu, TlbRange};
use pgtable_core::VirtAddr;

use super::{invlpgb, CpuMask, IpiSender, MmCpus, ShootdownStats, SwitchAction, MAX_CPUS};
use crate::flush::FlushKind;

/// `Request::kind` values.
const RANGE: u8 = 0;
const MM: u8 = 1;
const ALL: u8 = 2;

/// The range field of a whole-space request (not read by the receiver).
const WHOLE: TlbRange = TlbRange {
    start: VirtAddr(0),
    end: VirtAddr(0),
    stride_shift: 12,
    last_level: false,
};

/// One CPU's outgoing request (Linux `flush_tlb_info`), written before the
/// targets' `incoming` bits are set, read by the targets after.
#[derive(Debug)]
struct Request {
    kind: AtomicU8,
    start: AtomicU64,
    end: AtomicU64,
    stride_shift: AtomicU32,
    last_level: AtomicBool,
    /// `MmCpus::id` of the space.
    mm: AtomicUsize,
    /// The generation this request brings its targets to.
    gen: AtomicU64,
    /// Targets that have not acknowledged yet.
    pending: AtomicU64,
}

/// Per-CPU state (Linux `cpu_tlbstate` and `cpu_tlbstate_shared`).
#[derive(Debug)]
struct PerCpu {
    /// Source CPUs whose request this CPU has to handle.
    incoming: AtomicU64,
    /// `MmCpus::id` of the space loaded (0: none).
    loaded: AtomicUsize,
    /// Runs kernel code only, with `loaded` still in CR3.
    lazy: AtomicBool,
    out: Request,
}

impl PerCpu {
    const fn new() -> PerCpu {
        PerCpu {
            incoming: AtomicU64::new(0),
            loaded: AtomicUsize::new(0),
            lazy: AtomicBool::new(false),
            out: Request {
                kind: AtomicU8::new(RANGE),
                start: AtomicU64::new(0),
                end: AtomicU64::new(0),
                stride_shift: AtomicU32::new(12),
                last_level: AtomicBool::new(true),
                mm: AtomicUsize::new(0),
                gen: AtomicU64::new(0),
                pending: AtomicU64::new(0),
            },
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    flushes: AtomicU64,
    ipi_rounds: AtomicU64,
    cpus_reached: AtomicU64,
    lazy_skipped: AtomicU64,
    ipis_handled: AtomicU64,
    ipis_ignored: AtomicU64,
    local_flushes: AtomicU64,
    broadcast_flushes: AtomicU64,
}

impl Counters {
    const fn new() -> Counters {
        Counters {
            flushes: AtomicU64::new(0),
            ipi_rounds: AtomicU64::new(0),
            cpus_reached: AtomicU64::new(0),
            lazy_skipped: AtomicU64::new(0),
            ipis_handled: AtomicU64::new(0),
            ipis_ignored: AtomicU64::new(0),
            local_flushes: AtomicU64::new(0),
            broadcast_flushes: AtomicU64::new(0),
        }
    }

    fn bump(c: &AtomicU64, n: u64) {
        // Relaxed: statistics only.
        c.fetch_add(n, Relaxed);
    }
}

/// The machine-wide shootdown state: one per kernel (a `static`).
#[derive(Debug)]
pub struct Shootdown<I> {
    sender: I,
    cpus: [PerCpu; MAX_CPUS],
    online: AtomicU64,
    /// INVLPGB in use (`u32::MAX`: not; else its `max_extra`).
    invlpgb: AtomicU32,
    /// User spaces run under PCIDs ([`Shootdown::set_user_pcids`]).
    user_pcids: AtomicBool,
    ceiling: AtomicU64,
    counters: Counters,
}

impl<I: IpiSender> Shootdown<I> {
    /// The state for a kernel whose IPIs go through `sender`; no CPU is
    /// online yet.
    pub const fn new(sender: I) -> Shootdown<I> {
        Shootdown {
            sender,
            cpus: [const { PerCpu::new() }; MAX_CPUS],
            online: AtomicU64::new(0),
            invlpgb: AtomicU32::new(u32::MAX),
            user_pcids: AtomicBool::new(false),
            ceiling: AtomicU64::new(
                <crate::X86_64 as pgtable_core::contract::Arch>::TLB_FLUSH_CEILING,
            ),
            counters: Counters::new(),
        }
    }

    /// The IPI sender.
    pub fn sender(&self) -> &I {
        &self.sender
    }

    /// Marks `cpu` online: full flushes and the kernel space's flushes
    /// reach it from now on. Call it on each CPU before it runs anything
    /// mapped by a space of this shootdown.
    pub fn set_online(&self, cpu: usize) {
        // SeqCst: a flush that starts after this sees the CPU.
        self.online.fetch_or(CpuMask::of(cpu).0, SeqCst);
    }

    /// The online CPUs.
    pub fn online(&self) -> CpuMask {
        // Relaxed: a snapshot for reporting.
        CpuMask(self.online.load(Relaxed))
    }

    /// Number of strides past which an INVLPGB flush invalidates the
    /// whole space (default: Linux's `tlb_single_page_flush_ceiling`, 33).
    /// IPI flushes leave that choice to the receiving CPU's local MMU.
    pub fn set_flush_ceiling(&self, pages: u64) {
        // Relaxed: a tuning knob.
        self.ceiling.store(pages, Relaxed);
    }

    /// Uses INVLPGB + TLBSYNC instead of IPIs for every flush from now on.
    ///
    /// # Safety
    ///
    /// Every CPU of the machine implements INVLPGB as `info` says
    /// ([`invlpgb::detect`] on each), and the kernel does not migrate a
    /// thread between CPUs inside a flush (TLBSYNC waits for the executing
    /// CPU's INVLPGBs only).
    #[cfg(any(
        all(target_arch = "x86_64", target_os = "none"),
        all(doc, target_arch = "x86_64")
    ))]
    #[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
    pub unsafe fn use_invlpgb(&self, info: invlpgb::Invlpgb) {
        // Relaxed: set at boot before other CPUs flush.
        self.invlpgb.store(u32::from(info.max_extra), Relaxed);
    }

    /// Says whether user spaces run under PCIDs (CR4.PCIDE = 1 on every
    /// CPU). They all link the kernel half, so its translations and
    /// paging-structure-cache entries may then be cached under every PCID,
    /// and `INVLPG` and MOV to CR3 reach only the current PCID's
    /// non-global and paging-structure-cache entries (Intel SDM Vol. 3A
    /// §4.10.4.1). With it on, every flush of the kernel's space
    /// ([`MmCpus::kernel`]) runs as [`Mmu::flush_tlb_all`] of each CPU's
    /// local MMU (INVPCID type 2 or a CR4.PGE toggle: every PCID), as
    /// Linux `flush_tlb_kernel_range` past its ceiling does. Set it at
    /// boot, before a user space runs under a PCID.
    pub fn set_user_pcids(&self, on: bool) {
        // Relaxed: set at boot before other CPUs flush.
        self.user_pcids.store(on, Relaxed);
    }

    /// The counters so far.
    pub fn stats(&self) -> ShootdownStats {
        let c = &self.counters;
        // Relaxed: statistics only.
        let r = |a: &AtomicU64| a.load(Relaxed);
        ShootdownStats {
            flushes: r(&c.flushes),
            ipi_rounds: r(&c.ipi_rounds),
            cpus_reached: r(&c.cpus_reached),
            lazy_skipped: r(&c.lazy_skipped),
            ipis_handled: r(&c.ipis_handled),
            ipis_ignored: r(&c.ipis_ignored),
            local_flushes: r(&c.local_flushes),
            broadcast_flushes: r(&c.broadcast_flushes),
        }
    }

    fn cpu(&self, cpu: usize) -> &PerCpu {
        &self.cpus[cpu % MAX_CPUS]
    }

    /// `cpu` switches to `next` (Linux `switch_mm_irqs_off`): call it
    /// with interrupts disabled, before loading CR3, and flush `next` on
    /// this CPU if the answer says so. [`SmpMmu::switch_to`](super::SmpMmu::switch_to) does all
    /// of that.
    pub fn switch_mm(&self, cpu: usize, next: &MmCpus) -> SwitchAction {
        let me = self.cpu(cpu);
        // SeqCst (these three and the generation load): a flush of `next`
        // bumps the generation and then reads the bitmap and the lazy
        // flags, all SeqCst, so either it sees this CPU live and sends it
        // an IPI, or this load sees its generation and we flush here.
        me.lazy.store(false, SeqCst);
        next.cpus.fetch_or(CpuMask::of(cpu).0, SeqCst);
        me.loaded.store(next.id(), SeqCst);
        let gen = next.tlb_gen.load(SeqCst);
        // Relaxed: only this CPU writes its slot (switches and its own
        // flush handling, serialised by disabled interrupts).
        let done = next.cpu_gen[cpu % MAX_CPUS].fetch_max(gen, Relaxed);
        SwitchAction { flush: done < gen }
    }

    /// `cpu` runs kernel code only from now on, keeping its current space
    /// loaded (Linux `enter_lazy_tlb`): flushes that free no table skip
    /// it, and its next [`switch_mm`](Self::switch_mm) catches up.
    pub fn enter_lazy(&self, cpu: usize) {
        // SeqCst: pairs with the flush path's lazy-flag load (see
        // `switch_mm`).
        self.cpu(cpu).lazy.store(true, SeqCst);
    }

    /// Whether `cpu` is lazy.
    pub fn is_lazy(&self, cpu: usize) -> bool {
        // Relaxed: a snapshot for reporting.
        self.cpu(cpu).lazy.load(Relaxed)
    }

    /// The flush IPI's handler: run it on `cpu` (interrupts disabled, as
    /// in an interrupt handler) with the CPU's local MMU, whose flushes
    /// act on this CPU's current address space: an untagged `X86Mmu`
    /// (`X86Mmu::new()`, kept in a static), whose `INVLPG` and CR3 reload
    /// act on the current PCID, which is the space's when the request is
    /// carried out. Handles every request addressed to `cpu` and
    /// acknowledges each. Calling it with nothing pending does nothing.
    pub fn handle_flush_ipi<M: Mmu>(&self, cpu: usize, local: &M) {
        let me = self.cpu(cpu);
        // Acquire: the requests' fields were written before their bits.
        let from = CpuMask(me.incoming.swap(0, Acquire));
        for src in from.iter() {
            let req = &self.cpu(src).out;
            // Relaxed: ordered by the Acquire above.
            let kind = match req.kind.load(Relaxed) {
                RANGE => FlushKind::Range(TlbRange {
                    start: VirtAddr(req.start.load(Relaxed)),
                    end: VirtAddr(req.end.load(Relaxed)),
                    stride_shift: req.stride_shift.load(Relaxed),
                    last_level: req.last_level.load(Relaxed),
                }),
                MM => FlushKind::Mm,
                _ => FlushKind::All,
            };
            let mm = req.mm.load(Relaxed);
            let gen = req.gen.load(Relaxed);
            // SAFETY: the initiator does not return (and so does not end
            // the life of the space's `MmCpus`) before our acknowledgement
            // below, and `mm` is the address of its `MmCpus`.
            let mm = unsafe { &*(mm as *const MmCpus) };
            let did = self.flush_local(cpu, mm, kind, gen, local);
            Counters::bump(&self.counters.ipis_handled, 1);
            if !did {
                Counters::bump(&self.counters.ipis_ignored, 1);
            }
            // Release: our flush happens before the initiator returns.
            req.pending.fetch_and(!CpuMask::of(cpu).0, Release);
        }
    }

    /// The local part of a flush on `cpu`: what Linux's `flush_tlb_func`
    /// does. Returns whether it flushed.
    fn flush_local<M: Mmu>(
        &self,
        cpu: usize,
        mm: &MmCpus,
        kind: FlushKind,
        gen: u64,
        local: &M,
    ) -> bool {
        let bump = || Counters::bump(&self.counters.local_flushes, 1);
        if let FlushKind::All = kind {
            local.flush_tlb_all();
            bump();
            return true;
        }
        if mm.kernel {
            // Relaxed: see `set_user_pcids`.
            match kind {
                FlushKind::Range(r) if !self.user_pcids.load(Relaxed) => local.flush_tlb_range(r),
                _ => local.flush_tlb_all(),
            }
            bump();
            return true;
        }
        // Relaxed: written by this CPU only.
        if self.cpu(cpu).loaded.load(Relaxed) != mm.id() {
            // Not running the space: drop the bit (Linux clears it
            // lazily). Its entries may stay cached under its PCID; the
            // generation this CPU has not caught up with is their stale
            // mark: the next `switch_mm` to the space asks for the flush,
            // which `SmpMmu::switch_to` makes before CR3 is loaded.
            // SeqCst: pairs with `switch_mm`'s fetch_or on this CPU.
            mm.cpus.fetch_and(!CpuMask::of(cpu).0, SeqCst);
            return false;
        }
        let slot = &mm.cpu_gen[cpu % MAX_CPUS];
        // Relaxed: written by this CPU only.
        let done = slot.load(Relaxed);
        if done >= gen {
            return false;
        }
        match kind {
            // Exactly one flush behind: the range is all that changed.
            FlushKind::Range(r) if gen == done + 1 => local.flush_tlb_range(r),
            // Further behind: other requests' ranges are unknown here; a
            // full flush covers them (global entries included, which a
            // range flush must drop).
            FlushKind::Range(_) => local.flush_tlb_all(),
            _ => local.flush_tlb_mm(),
        }
        // Relaxed: written by this CPU only.
        slot.store(gen, Relaxed);
        bump();
        true
    }

    /// Starts a flush of `kind` in `mm` from the executing CPU: the local
    /// flush with `local`, then the one IPI round (or INVLPGB). The
    /// returned [`PendingFlush`] waits for the acknowledgements; the
    /// [`Mmu`] contract is met only once it has ([`PendingFlush::wait`],
    /// or its drop). [`SmpMmu`](super::SmpMmu) calls this and waits at once.
    ///
    /// # Safety
    ///
    /// The [`PendingFlush`] is waited for or dropped, never forgotten
    /// (`mem::forget`), while `mm` is alive: the targets read `mm` until
    /// they acknowledge.
    pub unsafe fn flush_start<'s, M: Mmu>(
        &'s self,
        mm: &MmCpus,
        kind: FlushKind,
        local: &'s M,
    ) -> PendingFlush<'s, I, M> {
        let cpu = self.sender.this_cpu();
        let c = &self.counters;
        Counters::bump(&c.flushes, 1);
        let done = PendingFlush {
            sd: self,
            cpu,
            local,
            waiting: false,
        };
        // The previous request from this CPU must be complete before its
        // slot is reused (it always is after a wait).
        let out = &self.cpu(cpu).out;
        // Acquire: the targets' flushes happened before.
        while out.pending.load(Acquire) != 0 {
            self.handle_flush_ipi(cpu, local);
            self.sender.relax();
        }
        // Relaxed: set at boot.
        let max_extra = self.invlpgb.load(Relaxed);
        if max_extra != u32::MAX {
            self.broadcast(mm, kind, max_extra);
            return done;
        }
        // SeqCst: orders the entry writes before, and pairs with
        // `switch_mm` (see there).
        let gen = mm.tlb_gen.fetch_add(1, SeqCst) + 1;
        let targets = self.targets(cpu, mm, kind);
        // The local part: this CPU's flush if it runs the space.
        self.flush_local(cpu, mm, kind, gen, local);
        if targets == 0 {
            return done;
        }
        self.post(cpu, mm, kind, gen, targets);
        Counters::bump(&c.ipi_rounds, 1);
        Counters::bump(&c.cpus_reached, u64::from(targets.count_ones()));
        PendingFlush {
            waiting: true,
            ..done
        }
    }

    /// The CPUs other than `cpu` that a flush of `kind` in `mm` must
    /// reach: every online CPU for a kernel space or a full flush, else
    /// the CPUs that run `mm` (Linux's `mm_cpumask`), less the lazy ones
    /// ([`enter_lazy`](Self::enter_lazy)) when the flush frees no table.
    fn targets(&self, cpu: usize, mm: &MmCpus, kind: FlushKind) -> u64 {
        let everyone = matches!(kind, FlushKind::All) || mm.kernel;
        let mut targets = if everyone {
            self.online.load(SeqCst)
        } else {
            mm.cpus.load(SeqCst)
        };
        targets &= !CpuMask::of(cpu).0;
        // A flush that may free tables reaches lazy CPUs too.
        let frees = !matches!(kind, FlushKind::Range(r) if r.last_level);
        if !everyone && !frees {
            for t in CpuMask(targets).iter() {
                // SeqCst: see `switch_mm`.
                if self.cpu(t).lazy.load(SeqCst) {
                    targets &= !CpuMask::of(t).0;
                    Counters::bump(&self.counters.lazy_skipped, 1);
                }
            }
        }
        targets
    }

    /// Posts the request `kind` of generation `gen` in `mm` from `cpu` to
    /// `targets` (its outgoing slot, then each target's incoming bit) and
    /// sends the IPI.
    fn post(&self, cpu: usize, mm: &MmCpus, kind: FlushKind, gen: u64, targets: u64) {
        let out = &self.cpu(cpu).out;
        let (k, r) = match kind {
            FlushKind::Range(r) => (RANGE, r),
            FlushKind::Mm => (MM, WHOLE),
            FlushKind::All => (ALL, WHOLE),
        };
        // Relaxed: published by the Release on the targets' bits.
        out.kind.store(k, Relaxed);
        out.start.store(r.start.0, Relaxed);
        out.end.store(r.end.0, Relaxed);
        out.stride_shift.store(r.stride_shift, Relaxed);
        out.last_level.store(r.last_level, Relaxed);
        out.mm.store(mm.id(), Relaxed);
        out.gen.store(gen, Relaxed);
        out.pending.store(targets, Relaxed);
        for t in CpuMask(targets).iter() {
            // Release: the request's fields before the bit.
            self.cpu(t).incoming.fetch_or(CpuMask::of(cpu).0, Release);
        }
        self.sender.send_flush_ipi(CpuMask(targets));
    }

    /// The INVLPGB path (bare metal only; never enabled on the host).
    fn broadcast(&self, mm: &MmCpus, kind: FlushKind, max_extra: u32) {
        let info = invlpgb::Invlpgb {
            max_extra: max_extra as u16,
        };
        // Relaxed: a tuning knob.
        let ceiling = self.ceiling.load(Relaxed);
        let ops = invlpgb::invlpgb_ops(kind, mm.pcid(), info, ceiling);
        #[cfg(all(target_arch = "x86_64", target_os = "none"))]
        // SAFETY: `use_invlpgb`'s contract: INVLPGB exists and no
        // migration happens inside a flush.
        unsafe {
            invlpgb::execute(ops)
        };
        #[cfg(not(all(target_arch = "x86_64", target_os = "none")))]
        let _ = ops;
        Counters::bump(&self.counters.broadcast_flushes, 1);
    }
}

/// A flush whose IPI round may still be in flight: [`wait`](Self::wait)
/// for it (dropping it waits too). Until then other CPUs may still use
/// the old translations.
#[must_use = "the flush is complete only once every CPU acknowledged"]
pub struct PendingFlush<'s, I: IpiSender, M: Mmu> {
    sd: &'s Shootdown<I>,
    cpu: usize,
    local: &'s M,
    waiting: bool,
}

impl<I: IpiSender, M: Mmu> PendingFlush<'_, I, M> {
    /// Waits until every target acknowledged, serving requests addressed
    /// to this CPU meanwhile.
    pub fn wait(mut self) {
        self.wait_now();
    }

    fn wait_now(&mut self) {
        if !self.waiting {
            return;
        }
        let out = &self.sd.cpu(self.cpu).out;
        // Acquire: the targets' flushes happened before their
        // acknowledgements.
        while out.pending.load(Acquire) != 0 {
            self.sd.handle_flush_ipi(self.cpu, self.local);
            self.sd.sender.relax();
        }
        self.waiting = false;
    }
}

impl<I: IpiSender, M: Mmu> Drop for PendingFlush<'_, I, M> {
    fn drop(&mut self) {
        self.wait_now();
    }
}
