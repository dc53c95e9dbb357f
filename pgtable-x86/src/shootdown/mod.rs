//! TLB shootdown for SMP x86: the [`Mmu`] rule "a flush returns only once
//! no CPU can use the old translation" on hardware whose invalidation
//! instructions (`INVLPG`, MOV to CR3, INVPCID) reach the executing CPU
//! only (Intel SDM Vol. 3A §4.10.5, "Propagation of Paging-Structure
//! Changes to Multiple Processors": software must tell the other
//! processors, usually with an IPI).
//!
//! The shape follows Linux's `flush_tlb_mm_range` → `flush_tlb_multi` →
//! `flush_tlb_func` (arch/x86/mm/tlb.c):
//!
//! - **Where an address space may be live.** Every address space has an
//!   [`MmCpus`]: the CPUs that switched to it (an atomic bitmap, Linux
//!   `mm_cpumask`, set on switch-in and cleared lazily: a CPU that gets a
//!   flush for a space it no longer runs drops its bit) and a flush
//!   generation (Linux `mm->context.tlb_gen`) with, per CPU, the
//!   generation that CPU has caught up with.
//! - **Lazy CPUs.** A CPU that runs only kernel code while keeping the
//!   last user space loaded ([`Shootdown::enter_lazy`], Linux
//!   `enter_lazy_tlb` / `cpu_tlbstate_shared.is_lazy`) gets no IPI for a
//!   flush that frees no table; its generation falls behind, and its next
//!   [`switch_mm`](Shootdown::switch_mm) to the space says to flush it
//!   fully. A flush that frees tables (a [`TlbRange`] that is not
//!   `last_level`, or a whole-space flush) reaches lazy CPUs too, since
//!   their walkers may still walk the old tables speculatively (Linux
//!   `flush_tlb_mm_range` with `freed_tables`).
//! - **One IPI round per flush.** The initiator bumps the generation,
//!   flushes locally, writes one request (the range, or a whole flush past
//!   the ceiling: the receiving CPU's local MMU decides) into its per-CPU
//!   slot, marks each target, sends *one* IPI to the set
//!   ([`IpiSender::send_flush_ipi`], Linux `native_flush_tlb_multi`) and
//!   waits until every target acknowledged; while it waits it serves
//!   requests addressed to itself, so two CPUs that shoot each other down
//!   with interrupts disabled do not deadlock.
//! - **The receiving side.** [`Shootdown::handle_flush_ipi`], called from
//!   the kernel's IPI vector: for each request, the local flush it
//!   describes if this CPU runs the space and has not caught up with the
//!   request's generation (a range if it is exactly one generation
//!   behind, otherwise a full flush, as Linux's `flush_tlb_func`), then
//!   the acknowledgement.
//! - **INVLPGB.** On AMD processors with INVLPGB ([`invlpgb`]), one
//!   broadcast invalidation plus TLBSYNC replaces the IPI round
//!   (`Shootdown::use_invlpgb`, bare metal only).
//!
//! # For kernel authors
//!
//! ```
//! use pgtable_core::{AddressSpace, Arena, MapOptions, NoopMmu, PhysAddr, Prot, VirtAddr};
//! use pgtable_x86::{CpuMask, IpiSender, MmCpus, Shootdown, SmpMmu, X86_64};
//!
//! // The kernel's part: the CPU number and the IPI (x2APIC ICR writes).
//! struct Ipi;
//! impl IpiSender for Ipi {
//!     fn this_cpu(&self) -> usize { 0 }
//!     fn send_flush_ipi(&self, _cpus: CpuMask) { /* write the ICR */ }
//! }
//! static SHOOTDOWN: Shootdown<Ipi> = Shootdown::new(Ipi);
//! static CPUS: MmCpus = MmCpus::new(); // one per address space
//!
//! SHOOTDOWN.set_online(0); // at boot, on each CPU
//! // `NoopMmu` stands for `X86Mmu::new()` (bare metal) here.
//! let mmu = SmpMmu::new(NoopMmu, &SHOOTDOWN, &CPUS);
//! let mut space = AddressSpace::<X86_64, _, _>::new(mmu, Arena::new()).unwrap();
//! // A context switch to the space on this CPU (interrupts disabled):
//! // `switch_mm`, the CR3 load, and the catch-up flush if one is due.
//! unsafe { space.mmu().switch_to(space.root()) };
//! space.map(VirtAddr(0x40_0000), PhysAddr(0x20_0000), 0x1000, Prot::READ_WRITE,
//!           MapOptions::PAGES).unwrap();
//! space.unmap(VirtAddr(0x40_0000), 0x1000).unwrap(); // live on CPU 0 only: no IPI
//! assert_eq!(SHOOTDOWN.stats().ipi_rounds, 0);
//! // A kernel thread keeps the space loaded: `SHOOTDOWN.enter_lazy(cpu)`.
//! // The flush IPI vector: `SHOOTDOWN.handle_flush_ipi(cpu, &LOCAL_X86MMU)`, then EOI.
//! # unsafe { space.deactivate() };
//! ```
//!
//! The kernel's own address space (the upper half every CPU maps) uses
//! [`MmCpus::kernel`]: its flushes go to every online CPU, lazy or not.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};

use pgtable_core::{Mmu, PhysAddr, Slot, TlbRange, VirtAddr};

use crate::flush::FlushKind;
use crate::Pcid;

pub mod invlpgb;

/// The most CPUs a [`Shootdown`] serves (one bit each in a [`CpuMask`]).
pub const MAX_CPUS: usize = 64;

/// A set of CPUs, one bit per CPU number below [`MAX_CPUS`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CpuMask(pub u64);

impl CpuMask {
    /// No CPU.
    pub const EMPTY: CpuMask = CpuMask(0);

    /// CPU `cpu` alone (empty for a number past [`MAX_CPUS`]).
    pub const fn of(cpu: usize) -> CpuMask {
        if cpu < MAX_CPUS {
            CpuMask(1 << cpu)
        } else {
            CpuMask(0)
        }
    }

    /// Whether `cpu` is in the set.
    pub const fn contains(self, cpu: usize) -> bool {
        self.0 & CpuMask::of(cpu).0 != 0
    }

    /// Number of CPUs in the set.
    pub const fn count(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The CPUs of the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut m = self.0;
        core::iter::from_fn(move || {
            if m == 0 {
                return None;
            }
            let c = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(c)
        })
    }
}

/// What the kernel provides: the executing CPU's number and a way to send
/// the flush IPI vector.
pub trait IpiSender {
    /// The executing CPU's number, below [`MAX_CPUS`] (its APIC ID mapped
    /// to a dense number, or a per-CPU variable).
    fn this_cpu(&self) -> usize;

    /// Sends the flush vector to every CPU in `cpus` (never the executing
    /// one): x2APIC ICR writes, or one "all excluding self" shorthand when
    /// `cpus` is every other online CPU. The targets' handlers call
    /// [`Shootdown::handle_flush_ipi`].
    fn send_flush_ipi(&self, cpus: CpuMask);

    /// Called while waiting for acknowledgements (default: a spin-loop
    /// hint, `pause`).
    fn relax(&self) {
        core::hint::spin_loop();
    }
}

/// Where an address space may be live, and how far each CPU has caught
/// up with its flushes (Linux `mm_cpumask` and `context.tlb_gen`). One per
/// address space; it must outlive every CPU's use of the space: switch
/// every CPU away from a space (and let lazy ones switch too) before its
/// `MmCpus` goes, as Linux does before it frees an mm (the CPUs compare
/// its address).
#[derive(Debug)]
pub struct MmCpus {
    /// CPUs that switched to the space and have not dropped their bit.
    cpus: AtomicU64,
    /// The generation of the latest flush.
    tlb_gen: AtomicU64,
    /// Per CPU: the generation its TLB has caught up with.
    cpu_gen: [AtomicU64; MAX_CPUS],
    /// The kernel's own space: live on every online CPU.
    kernel: bool,
    /// The PCID the space runs under (for INVLPGB), or `u32::MAX`.
    pcid: AtomicU32,
}

impl Default for MmCpus {
    fn default() -> Self {
        Self::new()
    }
}

impl MmCpus {
    /// A user address space, live nowhere yet.
    pub const fn new() -> MmCpus {
        MmCpus {
            cpus: AtomicU64::new(0),
            tlb_gen: AtomicU64::new(0),
            cpu_gen: [const { AtomicU64::new(0) }; MAX_CPUS],
            kernel: false,
            pcid: AtomicU32::new(u32::MAX),
        }
    }

    /// The kernel's address space: live on every online CPU, lazy or not
    /// (Linux `flush_tlb_kernel_range` → `on_each_cpu`).
    pub const fn kernel() -> MmCpus {
        let mut m = MmCpus::new();
        m.kernel = true;
        m
    }

    /// The CPUs that may hold the space's translations now.
    pub fn cpus(&self) -> CpuMask {
        // Relaxed: a snapshot for reporting; the flush path reads it with
        // SeqCst (see `Shootdown::flush_start`).
        CpuMask(self.cpus.load(Relaxed))
    }

    /// The generation of the latest flush.
    pub fn tlb_gen(&self) -> u64 {
        // Relaxed: a snapshot for reporting.
        self.tlb_gen.load(Relaxed)
    }

    /// Names the PCID the space runs under, for INVLPGB's PCID operand
    /// (without it, INVLPGB invalidates the addresses in every PCID).
    pub fn set_pcid(&self, pcid: Option<Pcid>) {
        // Relaxed: read by the flush on the CPU that set it, or after the
        // allocator's lock that chose it.
        self.pcid
            .store(pcid.map_or(u32::MAX, |p| u32::from(p.get())), Relaxed);
    }

    fn pcid(&self) -> Option<Pcid> {
        // Relaxed: see `set_pcid`.
        Pcid::new(u16::try_from(self.pcid.load(Relaxed)).ok()?).ok()
    }

    fn id(&self) -> usize {
        self as *const MmCpus as usize
    }
}

/// What [`Shootdown::switch_mm`] asks of the switching CPU.
#[must_use = "a CPU that fell behind must flush before running the space"]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SwitchAction {
    /// Flush the space's translations on this CPU (MOV to CR3 without the
    /// no-flush bit, or [`Mmu::flush_tlb_mm`] after installing): flushes
    /// went by while this CPU was lazy or away.
    pub flush: bool,
}

/// Counters a kernel can print.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ShootdownStats {
    /// Flushes requested through [`SmpMmu`] (or
    /// [`Shootdown::flush_start`]).
    pub flushes: u64,
    /// IPI rounds sent (at most one per flush).
    pub ipi_rounds: u64,
    /// CPUs reached by those rounds, summed.
    pub cpus_reached: u64,
    /// Targets skipped because they were lazy.
    pub lazy_skipped: u64,
    /// Requests handled by receiving CPUs.
    pub ipis_handled: u64,
    /// Requests a receiving CPU found already done (or for a space it no
    /// longer runs).
    pub ipis_ignored: u64,
    /// Local flushes carried out (initiator and receivers).
    pub local_flushes: u64,
    /// Flushes done by INVLPGB + TLBSYNC instead of IPIs.
    pub broadcast_flushes: u64,
}

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
            ceiling: AtomicU64::new(<crate::X86_64 as pgtable_core::Arch>::TLB_FLUSH_CEILING),
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
    #[cfg(all(target_arch = "x86_64", target_os = "none"))]
    pub unsafe fn use_invlpgb(&self, info: invlpgb::Invlpgb) {
        // Relaxed: set at boot before other CPUs flush.
        self.invlpgb.store(u32::from(info.max_extra), Relaxed);
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
    /// this CPU if the answer says so. [`SmpMmu::switch_to`] does all
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
            match kind {
                FlushKind::Range(r) => local.flush_tlb_range(r),
                _ => local.flush_tlb_all(),
            }
            bump();
            return true;
        }
        // Relaxed: written by this CPU only.
        if self.cpu(cpu).loaded.load(Relaxed) != mm.id() {
            // Not running the space: drop the bit (Linux clears it
            // lazily); the next switch to it catches up by generation.
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
    /// or its drop). [`SmpMmu`] calls this and waits at once.
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
                    Counters::bump(&c.lazy_skipped, 1);
                }
            }
        }
        // The local part: this CPU's flush if it runs the space.
        self.flush_local(cpu, mm, kind, gen, local);
        if targets == 0 {
            return done;
        }
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
        Counters::bump(&c.ipi_rounds, 1);
        Counters::bump(&c.cpus_reached, u64::from(targets.count_ones()));
        PendingFlush {
            waiting: true,
            ..done
        }
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

/// An [`Mmu`] for SMP x86: `local`'s barriers and installs, and flushes
/// that reach every CPU on which the space may be live (the local flush,
/// then one IPI round and the wait, or INVLPGB).
pub struct SmpMmu<'a, M: Mmu, I: IpiSender> {
    local: M,
    sd: &'a Shootdown<I>,
    mm: &'a MmCpus,
}

impl<'a, M: Mmu, I: IpiSender> SmpMmu<'a, M, I> {
    /// The MMU of the address space whose CPU set is `mm`, flushing
    /// locally with `local` (an `X86Mmu`, tagged or not, which acts on
    /// the executing CPU) and remotely through `sd`.
    pub fn new(local: M, sd: &'a Shootdown<I>, mm: &'a MmCpus) -> Self {
        SmpMmu { local, sd, mm }
    }

    /// The local MMU.
    pub fn local(&self) -> &M {
        &self.local
    }

    /// The space's CPU set.
    pub fn mm(&self) -> &'a MmCpus {
        self.mm
    }

    /// The shootdown state.
    pub fn shootdown(&self) -> &'a Shootdown<I> {
        self.sd
    }

    /// Flushes `kind` on every CPU the space may be live on and waits.
    fn flush(&self, kind: FlushKind) {
        // SAFETY: waited for at once.
        unsafe { self.sd.flush_start(self.mm, kind, &self.local) }.wait();
    }

    /// Switches the executing CPU to this space: [`Shootdown::switch_mm`],
    /// the install, and the flush it asks for. What a context switch
    /// calls (interrupts disabled), with the space's root.
    ///
    /// # Safety
    ///
    /// As [`Mmu::install_root`].
    pub unsafe fn switch_to(&self, root: PhysAddr) {
        let act = self.sd.switch_mm(self.sd.sender.this_cpu(), self.mm);
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.local.install_root(root) };
        if act.flush {
            self.local.flush_tlb_mm();
        }
    }
}

// SAFETY: a flush returns only after the local flush and the
// acknowledgement of every CPU the space may be live on that is not lazy
// (lazy ones catch up at their next switch before using the space, and
// flushes that free tables reach them too), or after INVLPGB + TLBSYNC,
// which complete on every processor; `local` upholds the rest (barriers,
// installs, global entries).
unsafe impl<M: Mmu, I: IpiSender> Mmu for SmpMmu<'_, M, I> {
    const OBSERVES_WRITES: bool = M::OBSERVES_WRITES;

    fn walker_barrier(&self) {
        self.local.walker_barrier();
    }

    fn publish_barrier(&self) {
        self.local.publish_barrier();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        self.flush(FlushKind::Range(range));
    }

    fn flush_tlb_all(&self) {
        self.flush(FlushKind::All);
    }

    fn flush_tlb_mm(&self) {
        self.flush(FlushKind::Mm);
    }

    /// [`switch_to`](SmpMmu::switch_to).
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.switch_to(root) }
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.local.entry_written(slot, old);
    }
}
