//! The x86 shootdown ([`pgtable_x86::shootdown`]) on the simulator with
//! several CPUs, whose x86 flushes reach only the executing CPU: after
//! every operation no CPU holds a stale translation; lazy CPUs are
//! skipped and catch up when they switch back; one IPI round per flush.
//! Broken variants (not waiting for the acknowledgements, ignoring the
//! switch's catch-up flush) are caught.
//!
//! Two harnesses: a deterministic one, in which the initiator's wait
//! loop delivers the IPIs (each simulated CPU runs its handler at once),
//! and one with a real thread per CPU polling for its IPI.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use pgtable_core::contract::{Mmu, TlbRange};
use pgtable_core::{
    sim::{set_thread_cpu, thread_cpu, CheckError, SimAlloc, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::flush::FlushKind;
use pgtable_x86::{CpuMask, IpiSender, MmCpus, Shootdown, SmpMmu, X86_64};

type Sim = SimMmu<X86_64>;

const K4: u64 = 0x1000;
const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);

fn user_rw() -> Prot {
    Prot::USER | Prot::WRITE
}

/// The local MMU of the calling thread's CPU for a space under one PCID
/// (tag 0): installs switch without a flush (CR3 bit 63 set).
fn pcid_local(m: &SimMachine<X86_64>) -> Sim {
    m.mmu_with_asid(0).local_only().on_thread_cpu()
}

/// The local MMU of simulated CPU `cpu`: x86 flushes reach that CPU only.
fn local(m: &SimMachine<X86_64>, cpu: usize) -> Sim {
    m.mmu().local_only().on_cpu(cpu)
}

// ----- deterministic harness -----

/// IPIs are recorded; the initiator's wait loop (`relax`) delivers them,
/// running each target's handler with that CPU's local MMU.
struct Det {
    m: SimMachine<X86_64>,
    pending: Mutex<u64>,
    sd: OnceLock<&'static Shootdown<Det>>,
    /// IPIs sent, per target CPU.
    sent: Mutex<Vec<CpuMask>>,
}

impl IpiSender for Det {
    fn this_cpu(&self) -> usize {
        thread_cpu()
    }

    fn send_flush_ipi(&self, cpus: CpuMask) {
        assert!(!cpus.contains(thread_cpu()), "an IPI to the sender");
        *self.pending.lock().unwrap() |= cpus.0;
        self.sent.lock().unwrap().push(cpus);
    }

    fn relax(&self) {
        self.deliver();
    }
}

impl Det {
    /// Every pending IPI runs its handler on its CPU.
    fn deliver(&self) {
        let cpus = std::mem::take(&mut *self.pending.lock().unwrap());
        let sd = self.sd.get().unwrap();
        for c in CpuMask(cpus).iter() {
            sd.handle_flush_ipi(c, &local(&self.m, c));
        }
    }
}

type DetSpace = AddressSpace<X86_64, SmpMmu<'static, Sim, Det>, SimAlloc>;

/// A machine with `n` CPUs, a shootdown over it, and an address space
/// switched to on every CPU, with `VA` mapped and cached by every CPU.
fn det(n: usize) -> (SimMachine<X86_64>, &'static Shootdown<Det>, DetSpace) {
    let m = SimMachine::<X86_64>::with_cpus(n);
    let sd: &'static Shootdown<Det> = Box::leak(Box::new(Shootdown::new(Det {
        m: m.clone(),
        pending: Mutex::new(0),
        sd: OnceLock::new(),
        sent: Mutex::new(Vec::new()),
    })));
    sd.sender().sd.set(sd).ok().unwrap();
    let mm: &'static MmCpus = Box::leak(Box::new(MmCpus::new()));
    // Tagged (one PCID for the space): a switch keeps the CPU's cached
    // entries, so only the shootdown's catch-up flush removes stale ones.
    let mmu = SmpMmu::new(pcid_local(&m), sd, mm);
    let mut s = AddressSpace::new(mmu, m.alloc()).unwrap();
    for c in 0..n {
        sd.set_online(c);
        switch(&s, c);
    }
    s.map(VA, PA, 4 * K4, user_rw(), MapOptions::PAGES).unwrap();
    for c in 0..n {
        m.cpu(c).write_u64(VA, c as u64).unwrap();
        assert!(m.cpu(c).tlb_holds(VA));
    }
    m.check().unwrap();
    (m, sd, s)
}

/// CPU `c` switches to `s` (its context switch).
fn switch(s: &DetSpace, c: usize) {
    set_thread_cpu(c);
    // SAFETY: the simulated CPU `c` installs a complete hierarchy.
    unsafe { s.mmu().switch_to(s.root()) };
    set_thread_cpu(0);
}

/// Releases the space's tables (no CPU may walk them afterwards; the
/// simulated walker checks).
fn release(mut s: DetSpace) {
    // SAFETY: simulated; the walker never reads a freed frame.
    unsafe { s.deactivate() };
}

#[test]
fn unmap_protect_and_move_leave_no_stale_entry_on_any_cpu() {
    for op in ["unmap", "protect", "move"] {
        let (m, sd, mut s) = det(4);
        let before = sd.stats();
        let sent = sd.sender().sent.lock().unwrap().len();
        match op {
            "unmap" => s.unmap(VA, K4).unwrap(),
            "protect" => s.change_protection(VA, K4, Prot::USER).unwrap(),
            _ => s
                .move_page_tables(VA, VirtAddr(0x8000_0000), 4 * K4, MoveOptions::DEFAULT)
                .unwrap(),
        }
        m.check().unwrap_or_else(|e| panic!("{op}: {e}"));
        for c in 0..4 {
            assert!(m.cpu(c).write_u64(VA, 9).is_err(), "{op}: CPU {c}");
        }
        let st = sd.stats();
        let rounds = st.ipi_rounds - before.ipi_rounds;
        let flushes = st.flushes - before.flushes;
        assert_eq!(rounds, flushes, "{op}: one IPI round per flush");
        let sends = sd.sender().sent.lock().unwrap()[sent..].to_vec();
        assert_eq!(sends.len() as u64, rounds, "{op}");
        assert!(
            sends.iter().all(|&t| t == CpuMask(0b1110)),
            "{op}: {sends:?}"
        );
        assert!(rounds >= 1, "{op}");
        assert_eq!(st.cpus_reached - before.cpus_reached, 3 * rounds, "{op}");
        release(s);
    }
}

#[test]
fn a_lazy_cpu_is_skipped_and_flushes_when_it_switches_back() {
    let (m, sd, mut s) = det(3);
    sd.enter_lazy(2);
    let before = sd.stats();
    s.change_protection(VA, K4, Prot::USER).unwrap();
    let st = sd.stats();
    assert_eq!(st.lazy_skipped - before.lazy_skipped, 1);
    assert_eq!(st.cpus_reached - before.cpus_reached, 1, "only CPU 1");
    // CPUs 0 and 1 are clean; the lazy CPU 2 still caches the old
    // translation, which it cannot use while it runs kernel code only.
    m.check_cpu(0).unwrap();
    m.check_cpu(1).unwrap();
    assert_eq!(m.check_tlb().unwrap_err().cpu, 2);
    // Switching back catches up with a full flush.
    switch(&s, 2);
    m.check().unwrap();
    assert!(m.cpu(2).write_u64(VA, 1).is_err());
    release(s);
}

#[test]
fn a_flush_that_frees_tables_reaches_lazy_cpus_too() {
    let (m, sd, mut s) = det(3);
    sd.enter_lazy(2);
    let before = sd.stats();
    // Unmapping the whole 2 MiB region frees its page table.
    s.unmap(VirtAddr(0x4000_0000), 0x20_0000).unwrap();
    let st = sd.stats();
    assert_eq!(st.lazy_skipped, before.lazy_skipped);
    assert_eq!(st.cpus_reached - before.cpus_reached, 2);
    m.check().unwrap();
    release(s);
}

#[test]
fn a_cpu_that_switched_away_drops_its_bit_and_catches_up_on_return() {
    let (m, sd, mut s) = det(2);
    // CPU 1 switches to another space.
    let other: &'static MmCpus = Box::leak(Box::new(MmCpus::new()));
    let o = AddressSpace::<X86_64, _, _>::new(
        SmpMmu::new(m.mmu().local_only().on_thread_cpu(), sd, other),
        m.alloc(),
    )
    .unwrap();
    set_thread_cpu(1);
    // SAFETY: a simulated CPU installs a complete hierarchy.
    unsafe { o.mmu().switch_to(o.root()) };
    set_thread_cpu(0);
    assert!(s.mmu().mm().cpus().contains(1), "cleared lazily");
    let before = sd.stats();
    s.unmap(VA, K4).unwrap();
    // The IPI reached CPU 1, which does not run the space: it dropped its
    // bit instead of flushing.
    assert!(!s.mmu().mm().cpus().contains(1));
    let st = sd.stats();
    assert_eq!(st.ipis_ignored - before.ipis_ignored, 1);
    assert_eq!(st.cpus_reached - before.cpus_reached, 1);
    s.change_protection(VA.add(K4), K4, Prot::USER).unwrap();
    assert_eq!(
        sd.stats().cpus_reached,
        st.cpus_reached,
        "no IPI to CPU 1 any more"
    );
    switch(&s, 1);
    m.check().unwrap();
    release(s);
    let mut o = o;
    // SAFETY: simulated.
    unsafe { o.deactivate() };
}

/// CPU 1 ran the space under PCID 0, then switched to another space under
/// PCID 1 without a flush (its PCID-0 entries stay cached); a flush of the
/// space reached it while it did not run it, so it only dropped its bit.
/// Switching back must flush PCID 0 before CR3 makes those entries usable
/// again; `install_first` is the broken order (install with the no-flush
/// bit, then flush).
fn switch_back_after_a_missed_flush(install_first: bool) -> Result<(), CheckError> {
    let (m, sd, mut s) = det(2);
    let other: &'static MmCpus = Box::leak(Box::new(MmCpus::new()));
    let pcid1 = m.mmu_with_asid(1).local_only().on_thread_cpu();
    let mut o =
        AddressSpace::<X86_64, _, _>::new(SmpMmu::new(pcid1, sd, other), m.alloc()).unwrap();
    set_thread_cpu(1);
    // SAFETY: a simulated CPU installs a complete hierarchy.
    unsafe { o.mmu().switch_to(o.root()) };
    set_thread_cpu(0);
    let before = sd.stats();
    s.unmap(VA, K4).unwrap();
    assert_eq!(sd.stats().ipis_ignored - before.ipis_ignored, 1);
    m.check_cpu(0).unwrap();
    // PCID 0's old translation, unusable while CPU 1 runs PCID 1.
    assert_eq!(m.check_cpu(1).unwrap_err().va, VA);
    set_thread_cpu(1);
    if install_first {
        let act = sd.switch_mm(1, s.mmu().mm());
        assert!(act.flush);
        // SAFETY: as above.
        unsafe { s.mmu().local().install_root(s.root()) };
        s.mmu().local().flush_tlb_mm();
    } else {
        // SAFETY: as above.
        unsafe { s.mmu().switch_to(s.root()) };
    }
    set_thread_cpu(0);
    let checked = m.check();
    release(s);
    // SAFETY: simulated.
    unsafe { o.deactivate() };
    checked
}

#[test]
fn a_switch_back_to_a_pcid_that_missed_a_flush_flushes_before_loading_cr3() {
    assert_eq!(switch_back_after_a_missed_flush(false), Ok(()));
}

#[test]
fn a_switch_that_loads_cr3_before_the_owed_flush_is_caught() {
    let Err(CheckError::Stale(stale)) = switch_back_after_a_missed_flush(true) else {
        panic!("not caught");
    };
    assert_eq!((stale.cpu, stale.va), (1, VA));
}

/// Two CPUs each run a user space under its own PCID (1, 2) that shares
/// the kernel half, and read a non-global kernel page through it; the
/// kernel's space then write-protects the page from CPU 0. Its flush must
/// reach both PCIDs (`set_user_pcids`); an `INVLPG` on each CPU reaches
/// only the PCID that is current there, or none of them.
fn kernel_change_under_user_pcids(user_pcids: bool) -> Result<(), CheckError> {
    let m = SimMachine::<X86_64>::with_cpus(2);
    let sd: &'static Shootdown<Det> = Box::leak(Box::new(Shootdown::new(Det {
        m: m.clone(),
        pending: Mutex::new(0),
        sd: OnceLock::new(),
        sent: Mutex::new(Vec::new()),
    })));
    sd.sender().sd.set(sd).ok().unwrap();
    sd.set_online(0);
    sd.set_online(1);
    sd.set_user_pcids(user_pcids);
    let kmm: &'static MmCpus = Box::leak(Box::new(MmCpus::kernel()));
    let kmmu = SmpMmu::new(m.mmu().local_only().on_thread_cpu(), sd, kmm);
    let mut k = DetSpace::new_kernel(kmmu, m.alloc()).unwrap();
    let kva = VirtAddr(0xffff_8000_4000_0000);
    k.map(kva, PA, K4, Prot::WRITE, MapOptions::PAGES).unwrap();
    let users: Vec<DetSpace> = (0..2)
        .map(|c| {
            let mm: &'static MmCpus = Box::leak(Box::new(MmCpus::new()));
            let local = m.mmu_with_asid(c as u16 + 1).local_only().on_thread_cpu();
            // SAFETY: the kernel's space outlives the user spaces (dropped
            // first, below).
            let u = unsafe { DetSpace::new_user(&k, SmpMmu::new(local, sd, mm), m.alloc()) };
            let u = u.unwrap();
            switch(&u, c);
            m.cpu(c).read_u64(kva).unwrap();
            u
        })
        .collect();
    k.change_protection(kva, K4, Prot::READ_ONLY).unwrap();
    let checked = m.check();
    m.mmu().flush_tlb_all();
    for u in users {
        release(u);
    }
    drop(k);
    checked
}

#[test]
fn a_kernel_half_flush_reaches_every_pcid_on_every_cpu() {
    assert_eq!(kernel_change_under_user_pcids(true), Ok(()));
}

#[test]
fn a_kernel_half_flush_by_invlpg_under_user_pcids_is_caught() {
    let Err(CheckError::Stale(stale)) = kernel_change_under_user_pcids(false) else {
        panic!("not caught");
    };
    assert_eq!(stale.va, VirtAddr(0xffff_8000_4000_0000));
}

#[test]
fn flush_all_reaches_every_online_cpu() {
    let (m, sd, s) = det(3);
    let before = sd.stats();
    s.mmu().flush_tlb_all();
    assert_eq!(sd.stats().cpus_reached - before.cpus_reached, 2);
    for c in 0..3 {
        assert_eq!(m.cpu(c).tlb_len(), 0, "CPU {c}");
    }
    release(s);
}

/// A broken SMP MMU: starts the shootdown but does not wait for the
/// acknowledgements.
struct NoWait(SmpMmu<'static, Sim, Det>);

// SAFETY: deliberately broken, on the simulator only.
unsafe impl Mmu for NoWait {
    const OBSERVES_WRITES: bool = true;
    fn walker_barrier(&self) {
        self.0.walker_barrier()
    }
    fn publish_barrier(&self) {
        self.0.publish_barrier()
    }
    fn flush_tlb_range(&self, range: TlbRange) {
        // SAFETY: deliberately broken: the pending flush is forgotten;
        // the `MmCpus` is leaked, so the targets' reads stay valid.
        let p = unsafe {
            self.0
                .shootdown()
                .flush_start(self.0.mm(), FlushKind::Range(range), self.0.local())
        };
        std::mem::forget(p);
    }
    fn flush_tlb_all(&self) {
        self.0.flush_tlb_all()
    }
    fn flush_tlb_mm(&self) {
        self.0.flush_tlb_mm()
    }
    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded.
        unsafe { self.0.install_root(root) }
    }
    fn entry_written(&self, slot: &pgtable_core::contract::Slot, old: u64) {
        self.0.entry_written(slot, old)
    }
}

#[test]
fn not_waiting_for_acknowledgements_is_caught() {
    let (m, sd, s) = det(2);
    // Another space under the broken MMU.
    let mm: &'static MmCpus = Box::leak(Box::new(MmCpus::new()));
    let mut b = AddressSpace::<X86_64, _, _>::new(
        NoWait(SmpMmu::new(m.mmu().local_only().on_thread_cpu(), sd, mm)),
        m.alloc(),
    )
    .unwrap();
    b.map(VA, PA, K4, user_rw(), MapOptions::PAGES).unwrap();
    // SAFETY: simulated; CPU 0 and 1 switch to the broken space's root.
    unsafe { b.mmu().install_root(b.root()) };
    set_thread_cpu(1);
    // SAFETY: as above.
    unsafe { b.mmu().install_root(b.root()) };
    set_thread_cpu(0);
    m.cpu(1).write_u64(VA, 1).unwrap();
    let before = sd.stats();
    b.unmap(VA, K4).unwrap();
    assert_eq!(sd.stats().ipi_rounds - before.ipi_rounds, 1);
    // The IPI is still in flight: CPU 1 uses the old translation.
    let Err(CheckError::Stale(stale)) = m.check() else {
        panic!("not caught");
    };
    assert_eq!((stale.cpu, stale.va), (1, VA));
    assert!(m.cpu(1).write_u64(VA, 2).is_ok());
    // Once it is delivered, the CPU is clean.
    sd.sender().deliver();
    m.check().unwrap();
    // SAFETY: simulated.
    unsafe { b.deactivate() };
    release(s);
}

#[test]
fn a_switch_back_that_ignores_the_catch_up_flush_is_caught() {
    let (m, sd, mut s) = det(2);
    sd.enter_lazy(1);
    s.change_protection(VA, K4, Prot::USER).unwrap();
    // The bug: CPU 1 switches back without the flush it is told to do.
    let act = sd.switch_mm(1, s.mmu().mm());
    assert!(act.flush);
    // SAFETY: simulated CPU 1 installs a complete hierarchy, keeping its
    // cached entries (MOV to CR3 with the no-flush bit under a PCID).
    unsafe {
        m.mmu_with_asid(0)
            .local_only()
            .on_cpu(1)
            .install_root(s.root())
    };
    assert_eq!(m.check_tlb().unwrap_err().cpu, 1);
    assert!(
        m.cpu(1).write_u64(VA, 3).is_ok(),
        "stores through a read-only page"
    );
    release(s);
}

// ----- one thread per CPU -----

/// Each CPU thread polls its flag and runs its handler.
struct Threads {
    flags: Vec<AtomicBool>,
}

impl IpiSender for Threads {
    fn this_cpu(&self) -> usize {
        thread_cpu()
    }
    fn send_flush_ipi(&self, cpus: CpuMask) {
        for c in cpus.iter() {
            // Release: nothing rides on the flag (the request is published
            // by the shootdown itself); the handler rereads its mailbox.
            self.flags[c].store(true, Ordering::Release);
        }
    }
    fn relax(&self) {
        std::thread::yield_now();
    }
}

#[test]
fn cpu_threads_touching_memory_see_no_stale_entry_after_any_operation() {
    const N: usize = 4;
    let m = SimMachine::<X86_64>::with_cpus(N);
    let sd: &'static Shootdown<Threads> = Box::leak(Box::new(Shootdown::new(Threads {
        flags: (0..N).map(|_| AtomicBool::new(false)).collect(),
    })));
    let mm: &'static MmCpus = Box::leak(Box::new(MmCpus::new()));
    let mut s = AddressSpace::<X86_64, _, _>::new(
        SmpMmu::new(m.mmu().local_only().on_thread_cpu(), sd, mm),
        m.alloc(),
    )
    .unwrap();
    let root = s.root();
    for c in 0..N {
        sd.set_online(c);
    }
    set_thread_cpu(0);
    // SAFETY: simulated CPU 0.
    unsafe { s.install() };
    let pages = 16u64;
    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (1..N)
        .map(|c| {
            let (m, stop, started) = (m.clone(), stop.clone(), started.clone());
            std::thread::spawn(move || {
                set_thread_cpu(c);
                let me = local(&m, c);
                let act = sd.switch_mm(c, mm);
                if act.flush {
                    me.flush_tlb_mm();
                }
                // SAFETY: simulated CPU `c` installs a complete hierarchy.
                unsafe { me.install_root(root) };
                started.fetch_add(1, Ordering::Relaxed);
                let mut i = 0u64;
                // Relaxed: a stop request needs no ordering.
                while !stop.load(Ordering::Relaxed) {
                    // Acquire: see `send_flush_ipi`.
                    if sd.sender().flags[c].swap(false, Ordering::Acquire) {
                        sd.handle_flush_ipi(c, &me);
                    }
                    let va = VA.add((i % pages) * K4);
                    let _ = m.cpu(c).write_u64(va, i);
                    i += 1;
                }
                // Serve what is still addressed to this CPU.
                sd.handle_flush_ipi(c, &me);
            })
        })
        .collect();
    while started.load(Ordering::Relaxed) < (N - 1) as u64 {
        std::thread::yield_now();
    }
    // Two rounds under Miri.
    for round in 0..pgtable_testkit::miri_scaled(20) {
        s.map(VA, PA, pages * K4, user_rw(), MapOptions::PAGES)
            .unwrap();
        m.check()
            .unwrap_or_else(|e| panic!("round {round} map: {e}"));
        s.change_protection(VA, pages * K4, Prot::USER).unwrap();
        m.check()
            .unwrap_or_else(|e| panic!("round {round} protect: {e}"));
        let to = VirtAddr(0x1_0000_0000);
        s.move_page_tables(VA, to, pages * K4, MoveOptions::DEFAULT)
            .unwrap();
        m.check()
            .unwrap_or_else(|e| panic!("round {round} move: {e}"));
        s.unmap(to, pages * K4).unwrap();
        m.check()
            .unwrap_or_else(|e| panic!("round {round} unmap: {e}"));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let st = sd.stats();
    assert!(st.ipi_rounds <= st.flushes && st.ipi_rounds > 0, "{st:?}");
    assert_eq!(st.ipis_handled, st.cpus_reached, "{st:?}");
    // SAFETY: simulated.
    unsafe { s.deactivate() };
}

// ----- INVLPGB (pure plan) -----

mod invlpgb {
    use super::*;
    use pgtable_x86::shootdown::invlpgb::{
        invlpgb_ops, Invlpgb, InvlpgbOp, ASID_VALID, FINAL_ONLY, INCLUDE_GLOBAL, PCID_VALID,
        STRIDE_2M, VA_VALID,
    };
    use pgtable_x86::Pcid;

    #[test]
    fn cpuid_bit_3_of_ebx_and_the_count_in_edx() {
        assert_eq!(Invlpgb::from_cpuid(0, 7), None);
        assert_eq!(
            Invlpgb::from_cpuid(1 << 3, 0xabcd_0007),
            Some(Invlpgb { max_extra: 7 })
        );
    }

    fn range(start: u64, pages: u64, shift: u32, last_level: bool) -> FlushKind {
        FlushKind::Range(TlbRange {
            start: VirtAddr(start),
            end: VirtAddr(start + (pages << shift)),
            stride_shift: shift,
            last_level,
        })
    }

    #[test]
    fn a_range_is_split_into_operations_of_at_most_max_extra_plus_one_pages() {
        let info = Invlpgb { max_extra: 7 };
        let ops: Vec<_> = invlpgb_ops(range(0x40_0000, 20, 12, true), None, info, 33).collect();
        let flags = VA_VALID | ASID_VALID | INCLUDE_GLOBAL | FINAL_ONLY;
        assert_eq!(
            ops,
            [
                InvlpgbOp {
                    rax: 0x40_0000 | flags,
                    ecx: 7,
                    edx: 0
                },
                InvlpgbOp {
                    rax: 0x40_8000 | flags,
                    ecx: 7,
                    edx: 0
                },
                InvlpgbOp {
                    rax: 0x41_0000 | flags,
                    ecx: 3,
                    edx: 0
                },
            ]
        );
    }

    #[test]
    fn two_mib_strides_use_the_2m_step_and_a_pcid_is_named() {
        let info = Invlpgb { max_extra: 15 };
        let p = Pcid::new(5).unwrap();
        let ops: Vec<_> =
            invlpgb_ops(range(0x4000_0000, 3, 21, false), Some(p), info, 33).collect();
        let flags = VA_VALID | ASID_VALID | PCID_VALID | INCLUDE_GLOBAL;
        assert_eq!(
            ops,
            [InvlpgbOp {
                rax: 0x4000_0000 | flags,
                ecx: STRIDE_2M | 2,
                edx: 5 << 16
            }]
        );
    }

    #[test]
    fn past_the_ceiling_and_whole_flushes_invalidate_the_space() {
        let info = Invlpgb { max_extra: 7 };
        let p = Some(Pcid::new(9).unwrap());
        let past: Vec<_> = invlpgb_ops(range(0, 34, 12, true), p, info, 33).collect();
        assert_eq!(
            past,
            [InvlpgbOp {
                rax: ASID_VALID | PCID_VALID | INCLUDE_GLOBAL,
                ecx: 0,
                edx: 9 << 16
            }]
        );
        let mm: Vec<_> = invlpgb_ops(FlushKind::Mm, p, info, 33).collect();
        assert_eq!(
            mm,
            [InvlpgbOp {
                rax: ASID_VALID | PCID_VALID,
                ecx: 0,
                edx: 9 << 16
            }]
        );
        let all: Vec<_> = invlpgb_ops(FlushKind::All, p, info, 33).collect();
        assert_eq!(
            all,
            [InvlpgbOp {
                rax: ASID_VALID | INCLUDE_GLOBAL,
                ecx: 0,
                edx: 0
            }]
        );
    }

    #[test]
    fn cpu_masks_iterate_lowest_first() {
        let m = CpuMask(0b1010_0001);
        assert_eq!(m.iter().collect::<Vec<_>>(), [0, 5, 7]);
        assert_eq!((m.count(), m.contains(5), m.contains(6)), (3, true, false));
        assert!(CpuMask::of(64).is_empty());
    }
}
