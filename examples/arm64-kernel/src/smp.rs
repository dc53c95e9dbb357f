//! Secondary CPUs: bring-up through PSCI, a per-CPU record, and a small
//! command loop that the `smp_` cases drive (see `smp_cases/`).
//!
//! # Bring-up
//!
//! 1. CPU 0 reads the PSCI conduit and the CPUs' MPIDR affinities from the
//!    device tree (`psci.rs`).
//! 2. It builds an identity map of the page(s) holding
//!    `pgk_secondary_entry` (in `.text.boot`, linked at its physical
//!    address) with pgtable, and fills each secondary's [`BootParams`]:
//!    its own MAIR_EL1, TCR_EL1 (with the hardware access-flag and
//!    dirty-state bits it runs with), SCTLR_EL1 and TTBR1_EL1 (the kernel
//!    map), the identity map for TTBR0_EL1, and the CPU's stack top. The
//!    block is cleaned to the point of coherency: the secondary reads it
//!    with the MMU off (non-cacheable).
//! 3. `CPU_ON` (target = the MPIDR affinity, entry = the physical address
//!    of `pgk_secondary_entry`, context id = the block's physical address).
//! 4. `pgk_secondary_entry` (MMU off, EL1): FP on, the registers from the
//!    block, local TLB invalidation, MMU on, jump to the upper half.
//! 5. `pgk_secondary_high`: its own stack (TPIDR_EL1 also holds the stack
//!    top, so an unexpected exception reports on this CPU's stack), the
//!    kernel's vectors in VBAR_EL1, then [`secondary_main`], which leaves
//!    the identity map for an empty lower-half space, fills the per-CPU
//!    record and counts itself online.
//!
//! Each secondary stack has an unmapped guard page below it
//! ([`unmap_stack_guards`], before the kernel map is installed).
//!
//! # Commands
//!
//! CPU 0 writes a command (operation, CPU mask, arguments) and then bumps
//! `seq` with a release store; every secondary polls `seq` with acquire
//! loads, runs the command if its bit is in the mask, and acknowledges by
//! storing `seq` to its record (release), which CPU 0 reads with acquire.
//! Secondaries never call pgtable and never print: only CPU 0 changes
//! tables (the table allocator is single-CPU).

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;
use core::mem::ManuallyDrop;
use core::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

use crate::geom::{MAX_PAGE, PAGE};
use crate::platform::Arm64;
use aarch64_cpu::registers::{
    CurrentEL, ID_AA64MMFR1_EL1, MAIR_EL1, MPIDR_EL1, SCTLR_EL1, TCR_EL1, TTBR1_EL1, VBAR_EL1,
};
use pgtable_arm64::mmu::Arm64Mmu;
use pgtable_core::contract::Mmu;
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};
use tock_registers::interfaces::Readable;

use crate::memory::{kimage_to_phys, KernelTables};
use crate::psci::{self, Conduit, Cpus};
use crate::timer;

/// The lower-half spaces of the SMP code: pgtable's own MMU handle
/// (broadcast TLBIs), roots written to TTBR0_EL1.
pub type SmpSpace = AddressSpace<Arm64, Arm64Mmu, KernelTables>;

/// An untagged handle installing into TTBR0_EL1.
pub const fn ttbr0_mmu() -> Arm64Mmu {
    Arm64Mmu::new()
        .for_format::<Arm64>()
        .installing_into(VaRange::Lower)
}

/// CPUs this kernel runs at most (CPU 0 and three secondaries).
pub const MAX_CPUS: usize = 4;
/// Bytes of each secondary's stack.
const STACK_SIZE: usize = 32 << 10;

/// Bytes of the unmapped guard below each secondary stack: a page of any
/// geometry (the alignment below must match).
const GUARD: usize = MAX_PAGE as usize;

/// A secondary's stack with its guard below it, aligned to the largest
/// page so the guard is whole pages in every geometry.
#[repr(C, align(65536))]
struct CpuStack {
    guard: [u8; GUARD],
    stack: [u8; STACK_SIZE],
}

/// The secondaries' stacks, in `.bss` (zero-initialised).
struct Stacks(UnsafeCell<[CpuStack; MAX_CPUS - 1]>);

// SAFETY: each stack is used only by its own CPU, through its stack
// pointer; Rust code never forms a reference into them.
unsafe impl Sync for Stacks {}

static STACKS: Stacks = Stacks(UnsafeCell::new(
    [const {
        CpuStack {
            guard: [0; GUARD],
            stack: [0; STACK_SIZE],
        }
    }; MAX_CPUS - 1],
));

/// The registers a secondary starts with, read by `pgk_secondary_entry`
/// with the MMU off (offsets fixed by the assembly).
#[repr(C, align(64))]
struct BootParams {
    mair: u64,
    tcr: u64,
    ttbr0: u64,
    ttbr1: u64,
    sctlr: u64,
    stack_top: u64,
    cpu: u64,
}

struct ParamBlocks(UnsafeCell<[BootParams; MAX_CPUS]>);

// SAFETY: CPU 0 writes a block before it starts the CPU that reads it
// (the PSCI call orders them) and never again.
unsafe impl Sync for ParamBlocks {}

static PARAMS: ParamBlocks = ParamBlocks(UnsafeCell::new(
    [const {
        BootParams {
            mair: 0,
            tcr: 0,
            ttbr0: 0,
            ttbr1: 0,
            sctlr: 0,
            stack_top: 0,
            cpu: 0,
        }
    }; MAX_CPUS],
));

global_asm!(
    r#"
// The secondary entry: physical, MMU off, EL1 (PSCI starts the CPU at the
// caller's level), x0 = the physical address of its BootParams.
.section .text.boot, "ax"
.global pgk_secondary_entry
pgk_secondary_entry:
    mrs     x1, CurrentEL
    cmp     x1, #(1 << 2)
    b.ne    9f
    // CPACR_EL1.FPEN = 0b11, as on the boot CPU.
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    isb
    ldp     x1, x2, [x0]
    msr     mair_el1, x1
    msr     tcr_el1, x2
    ldp     x1, x2, [x0, #16]
    msr     ttbr0_el1, x1
    msr     ttbr1_el1, x2
    ldp     x19, x20, [x0, #40]
    ldr     x1, [x0, #32]
    // The register writes take effect, then nothing stale is left in the
    // TLB before translation starts.
    isb
    tlbi    vmalle1
    dsb     nsh
    isb
    msr     sctlr_el1, x1
    // Instructions after this isb are translated (through the identity
    // map in TTBR0_EL1 until the jump).
    isb
    ldr     x1, =pgk_secondary_high
    br      x1
9:  wfe
    b       9b
.ltorg

.section .text.smp, "ax"
pgk_secondary_high:
    mov     sp, x19
    msr     tpidr_el1, x19
    ldr     x1, =pgk_vectors
    msr     vbar_el1, x1
    // Exceptions after this isb use the kernel's vectors.
    isb
    mov     x0, x20
    bl      secondary_main
1:  wfe
    b       1b

// The entry's physical address, as data (the upper half cannot reach the
// boot part PC-relative).
.section .rodata.smp_symbols, "a"
.balign 8
.global pgk_secondary_entry_pa
pgk_secondary_entry_pa:
    .quad   pgk_secondary_entry
"#
);

extern "C" {
    static pgk_secondary_entry_pa: u64;
}

/// The command block CPU 0 writes and the secondaries poll.
pub struct Command {
    /// Bumped (release) after the other fields are written.
    pub seq: AtomicU64,
    /// [`Op`] as a number.
    pub op: AtomicU64,
    /// Bit `i`: CPU `i` runs the command (the others only acknowledge).
    pub mask: AtomicU64,
    /// The operation's arguments.
    pub args: [AtomicU64; 6],
    /// Bumped (release) by CPU 0 when the operation under test returned.
    pub epoch: AtomicU64,
}

/// Commands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u64)]
pub enum Op {
    /// Nothing (ends a hammer loop).
    Idle = 0,
    /// `TTBR0_EL1 = args[0]`, then a local TLB flush.
    Ttbr0 = 1,
    /// The access loop of [`crate::smp_cases`] (arguments there).
    Hammer = 2,
    /// PSCI `CPU_OFF`.
    Off = 3,
}

/// The counters of one secondary in a hammer loop, indexed by
/// [`slot`]: side (0: address A, 1: address B) × phase (0: before the
/// epoch, 1: after it) × outcome (ok, fault, wrong value).
pub const SLOTS: usize = 12;

/// Index of a counter.
pub const fn slot(side: usize, post: bool, outcome: usize) -> usize {
    side * 6 + (post as usize) * 3 + outcome
}

/// Outcome indices for [`slot`].
pub const OK: usize = 0;
/// A fault.
pub const FAULT: usize = 1;
/// A load that returned a value other than the expected one.
pub const WRONG: usize = 2;

/// What one CPU recorded.
#[repr(C, align(64))]
pub struct PerCpu {
    /// 1 once the CPU runs its command loop.
    pub online: AtomicU64,
    /// MPIDR_EL1 affinity as read on the CPU.
    pub mpidr: AtomicU64,
    /// Its stack pointer at entry to Rust.
    pub sp: AtomicU64,
    /// Its VBAR_EL1.
    pub vbar: AtomicU64,
    /// Its TCR_EL1.
    pub tcr: AtomicU64,
    /// Its exception level (CurrentEL).
    pub el: AtomicU64,
    /// The last command it finished.
    pub ack: AtomicU64,
    /// Loop iterations before / after the epoch in the current hammer.
    pub iters: [AtomicU64; 2],
    /// Counters of the current hammer loop (see [`slot`]).
    pub counts: [AtomicU64; SLOTS],
    /// Writers: the last value a store reported as done.
    pub last_write: AtomicU64,
    /// Writers: pages a store succeeded on (bit per page).
    pub pages_written: AtomicU64,
    /// ESR_EL1 of the first fault after the epoch.
    pub post_esr: AtomicU64,
}

impl PerCpu {
    const fn new() -> PerCpu {
        PerCpu {
            online: AtomicU64::new(0),
            mpidr: AtomicU64::new(0),
            sp: AtomicU64::new(0),
            vbar: AtomicU64::new(0),
            tcr: AtomicU64::new(0),
            el: AtomicU64::new(0),
            ack: AtomicU64::new(0),
            iters: [const { AtomicU64::new(0) }; 2],
            counts: [const { AtomicU64::new(0) }; SLOTS],
            last_write: AtomicU64::new(0),
            pages_written: AtomicU64::new(0),
            post_esr: AtomicU64::new(0),
        }
    }

    /// Clears the hammer results (CPU 0, while the CPU is idle).
    pub fn reset(&self) {
        // Relaxed: published to the secondary by the next command's
        // release of `seq`.
        for c in self.iters.iter().chain(&self.counts) {
            c.store(0, Relaxed);
        }
        self.last_write.store(0, Relaxed);
        self.pages_written.store(0, Relaxed);
        self.post_esr.store(0, Relaxed);
    }

    /// A counter.
    pub fn count(&self, side: usize, post: bool, outcome: usize) -> u64 {
        // Relaxed: read after the acknowledgement (acquire).
        self.counts[slot(side, post, outcome)].load(Relaxed)
    }
}

/// The command block.
pub static CMD: Command = Command {
    seq: AtomicU64::new(0),
    op: AtomicU64::new(0),
    mask: AtomicU64::new(0),
    args: [const { AtomicU64::new(0) }; 6],
    epoch: AtomicU64::new(0),
};

/// The per-CPU records (index 0 is CPU 0's, unused by the loop).
pub static CPUS: [PerCpu; MAX_CPUS] = [const { PerCpu::new() }; MAX_CPUS];

/// The lower-half root secondaries install when they leave the identity
/// map, set by [`bring_up`].
static IDLE_TTBR0: AtomicU64 = AtomicU64::new(0);

/// The running system: how to reach PSCI, which CPUs are online.
pub struct Smp {
    /// The PSCI conduit.
    pub conduit: Conduit,
    /// MPIDR affinity of CPU `i` (CPU 0 is the boot CPU).
    pub mpidr: [u64; MAX_CPUS],
    /// CPUs online (CPU 0 included).
    pub online: usize,
    /// The empty lower-half space the secondaries idle on (freed when
    /// they are all off, see `Drop`).
    idle: ManuallyDrop<SmpSpace>,
}

/// The MPIDR_EL1 affinity fields (Aff3, Aff2..Aff0).
fn affinity() -> u64 {
    MPIDR_EL1.get() & 0xff_00ff_ffff
}

/// Unmaps the guard page below each secondary stack in the kernel map
/// (before it is installed), so an overflow faults.
pub fn unmap_stack_guards<M: Mmu>(
    kspace: &mut AddressSpace<Arm64, M, KernelTables>,
) -> Result<(), pgtable_core::Error> {
    let base = STACKS.0.get() as u64;
    for i in 0..MAX_CPUS - 1 {
        let guard = base + (i * core::mem::size_of::<CpuStack>()) as u64;
        kspace.unmap(VirtAddr(guard), GUARD as u64)?;
    }
    Ok(())
}

/// The guard page and stack range of secondary `cpu` (1..).
pub fn stack_of(cpu: usize) -> (u64, u64, u64) {
    let base = STACKS.0.get() as u64 + ((cpu - 1) * core::mem::size_of::<CpuStack>()) as u64;
    let guard = GUARD as u64;
    (base, base + guard, base + guard + STACK_SIZE as u64)
}

/// Cleans `[va, va + len)` to the point of coherency (`dc cvac` per
/// cache line, then `dsb sy`): a CPU with its MMU off reads memory
/// non-cacheable.
fn clean_to_poc(va: u64, len: u64) {
    let mut a = va & !63;
    while a < va + len {
        // SAFETY: cache maintenance of mapped memory; no memory effects
        // Rust can see.
        unsafe { asm!("dc cvac, {}", in(reg) a, options(nostack, preserves_flags)) };
        a += 64;
    }
    // SAFETY: a barrier only.
    unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
}

/// Waits until `f` holds or `secs` seconds of counter time passed.
pub fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = timer::ticks() + secs * timer::frequency();
    while !f() {
        if timer::ticks() > end {
            return false;
        }
        core::hint::spin_loop();
    }
    true
}

/// Starts every CPU the device tree lists (up to [`MAX_CPUS`]) and waits
/// for each to report in. Call on CPU 0 with the kernel map in TTBR1_EL1
/// and its final TCR_EL1. Returns the running system, or why not.
pub fn bring_up(cpus: &Cpus) -> Result<Smp, &'static str> {
    let conduit = cpus.conduit.ok_or("no /psci method in the device tree")?;
    let me = affinity();
    let mut mpidr = [u64::MAX; MAX_CPUS];
    mpidr[0] = me;
    let mut n = 1;
    for &m in &cpus.mpidr[..cpus.count] {
        if m != me && n < MAX_CPUS {
            mpidr[n] = m;
            n += 1;
        }
    }
    let idle =
        SmpSpace::new(ttbr0_mmu(), KernelTables).map_err(|_| "no table for the idle space")?;
    // The identity map of the secondary entry: the page holding it and
    // the next (the code may cross a page boundary).
    // SAFETY: a word of `.rodata` the linker filled in.
    let entry = unsafe { pgk_secondary_entry_pa };
    let page = entry & !(PAGE - 1);
    let mut idmap =
        SmpSpace::new(ttbr0_mmu(), KernelTables).map_err(|_| "no table for the identity map")?;
    idmap
        .map(
            VirtAddr(page),
            PhysAddr(page),
            2 * PAGE,
            Prot::EXEC,
            MapOptions::PAGES,
        )
        .map_err(|_| "mapping the secondary entry")?;
    IDLE_TTBR0.store(idle.root().0, Release);
    let params = PARAMS.0.get();
    for (cpu, &target) in mpidr.iter().enumerate().take(n).skip(1) {
        let (_, _, top) = stack_of(cpu);
        // SAFETY: CPU `cpu` is off: nothing else reads or writes its block.
        let p = unsafe { &mut (*params)[cpu] };
        *p = BootParams {
            mair: MAIR_EL1.get(),
            tcr: TCR_EL1.get(),
            ttbr0: idmap.root().0,
            ttbr1: TTBR1_EL1.get(),
            sctlr: SCTLR_EL1.get(),
            stack_top: top,
            cpu: cpu as u64,
        };
        let va = p as *const BootParams as u64;
        clean_to_poc(va, core::mem::size_of::<BootParams>() as u64);
        let r = psci::cpu_on(conduit, target, entry, kimage_to_phys(va));
        // Acquire: the record the CPU wrote before going online.
        if r != 0 || !wait_for(10, || CPUS[cpu].online.load(Acquire) == 1) {
            // A CPU may be running on (or booting into) these tables:
            // they are never freed.
            core::mem::forget(idmap);
            core::mem::forget(idle);
            if r != 0 {
                crate::println!("smp: CPU_ON of MPIDR {target:#x} returned {r}");
                return Err("CPU_ON failed");
            }
            return Err("a secondary CPU did not report in");
        }
        // Relaxed: published by the CPU's release of `online`, read above
        // with acquire.
        if CPUS[cpu].mpidr.load(Relaxed) != target {
            core::mem::forget(idmap);
            core::mem::forget(idle);
            return Err("a secondary CPU reported in with another MPIDR than the one started");
        }
    }
    // Every secondary left the identity map (and flushed its own TLB)
    // before it reported in, and CPU 0 never installed it (the space was
    // never active): its tables can go.
    drop(idmap);
    Ok(Smp {
        conduit,
        mpidr,
        online: n,
        idle: ManuallyDrop::new(idle),
    })
}

impl Drop for Smp {
    /// Turns the secondaries off, then frees the idle space; if a
    /// secondary does not turn off, the idle space is never freed.
    fn drop(&mut self) {
        if self.park_from(1).is_ok() {
            // SAFETY: no CPU runs on the idle space any more (every
            // secondary is off; CPU 0 never installed it), and it is not
            // used after this.
            unsafe { ManuallyDrop::drop(&mut self.idle) };
        }
    }
}

impl Smp {
    /// Issues `op` with `args` to the CPUs in `mask` (all secondaries
    /// acknowledge) and, if `wait`, waits for every acknowledgement.
    pub fn command(
        &self,
        op: Op,
        mask: u64,
        args: &[u64],
        wait: bool,
    ) -> Result<u64, &'static str> {
        // Relaxed: published by the release store of `seq` below.
        CMD.op.store(op as u64, Relaxed);
        CMD.mask.store(mask, Relaxed);
        for (slot, a) in CMD
            .args
            .iter()
            .zip(args.iter().chain(core::iter::repeat(&0)))
        {
            slot.store(*a, Relaxed);
        }
        // Relaxed: only CPU 0 writes `seq`.
        let seq = CMD.seq.load(Relaxed) + 1;
        // Release: the command's fields before its number.
        CMD.seq.store(seq, Release);
        if wait {
            self.wait_acks(seq)?;
        }
        Ok(seq)
    }

    /// Waits until every secondary finished command `seq`.
    pub fn wait_acks(&self, seq: u64) -> Result<(), &'static str> {
        for c in &CPUS[1..self.online] {
            // Acquire: the CPU's results before its acknowledgement.
            if !wait_for(10, || c.ack.load(Acquire) >= seq) {
                return Err("a secondary CPU did not acknowledge a command");
            }
        }
        Ok(())
    }

    /// The mask of secondaries `1..=k`.
    pub fn mask_first(&self, k: usize) -> u64 {
        ((1u64 << (k.min(self.online - 1) + 1)) - 1) & !1
    }

    /// Turns secondaries `from..online` off (PSCI `CPU_OFF` on each,
    /// checked with `AFFINITY_INFO`); `online` becomes `from`.
    pub fn park_from(&mut self, from: usize) -> Result<(), &'static str> {
        let from = from.max(1);
        if from >= self.online {
            return Ok(());
        }
        let mask = ((1u64 << self.online) - 1) & !((1u64 << from) - 1);
        let conduit = u64::from(self.conduit == Conduit::Smc);
        let seq = self.command(Op::Off, mask, &[conduit], false)?;
        for (rec, &target) in CPUS.iter().zip(&self.mpidr).take(self.online).skip(from) {
            let off = wait_for(10, || {
                // Acquire: as in `wait_acks`.
                rec.ack.load(Acquire) >= seq
                    && psci::affinity_info(self.conduit, target) == psci::AFFINITY_OFF
            });
            if !off {
                return Err("a secondary CPU did not turn off");
            }
        }
        self.wait_acks_below(from, seq)?;
        self.online = from;
        Ok(())
    }

    fn wait_acks_below(&self, below: usize, seq: u64) -> Result<(), &'static str> {
        for c in &CPUS[1..below] {
            // Acquire: as in `wait_acks`.
            if !wait_for(10, || c.ack.load(Acquire) >= seq) {
                return Err("a secondary CPU did not acknowledge a command");
            }
        }
        Ok(())
    }
}

/// Installs `ttbr0` in TTBR0_EL1 of this CPU and drops every cached
/// translation of this CPU (local: the other CPUs keep theirs).
fn set_ttbr0(ttbr0: u64) {
    // SAFETY: the lower half holds no code, stack or data the kernel uses
    // (it runs in the upper half); CPU 0 keeps the tables alive while any
    // CPU has them installed.
    unsafe {
        asm!(
            "dsb ishst",
            "msr ttbr0_el1, {}",
            "isb",
            "tlbi vmalle1",
            "dsb nsh",
            "isb",
            in(reg) ttbr0,
            options(nostack, preserves_flags),
        );
    }
}

/// The Rust entry of a secondary CPU (`pgk_secondary_high`), on its own
/// stack, in the upper half, with the identity map still in TTBR0_EL1.
#[no_mangle]
extern "C" fn secondary_main(cpu: u64) -> ! {
    let cpu = cpu as usize;
    let me = &CPUS[cpu];
    // Acquire: pairs with the release store of `bring_up`.
    set_ttbr0(IDLE_TTBR0.load(Acquire));
    // PSTATE.PAN (FEAT_PAN, ID_AA64MMFR1_EL1.PAN bits 23:20) clear: the
    // writers store to user pages from EL1, as the boot CPU can.
    if (ID_AA64MMFR1_EL1.get() >> 20) & 0xf != 0 {
        // SAFETY: `MSR PAN, #0` (encoded: the assembler may lack the
        // feature); only changes EL1's access to EL0 pages.
        unsafe { asm!(".inst 0xd500409f", options(nostack, preserves_flags)) };
    }
    let sp: u64;
    // SAFETY: reads the stack pointer.
    unsafe { asm!("mov {}, sp", out(reg) sp, options(nomem, nostack, preserves_flags)) };
    // Relaxed: published by the release store of `online`.
    me.mpidr.store(affinity(), Relaxed);
    me.sp.store(sp, Relaxed);
    me.vbar.store(VBAR_EL1.get(), Relaxed);
    me.tcr.store(TCR_EL1.get(), Relaxed);
    me.el.store(CurrentEL.get() >> 2, Relaxed);
    // Release: the record before the CPU counts as online.
    me.online.store(1, Release);
    let mut done = 0;
    loop {
        // Acquire: the command's fields after its number.
        let seq = CMD.seq.load(Acquire);
        if seq == done {
            core::hint::spin_loop();
            continue;
        }
        // Relaxed: ordered after the acquire of `seq`.
        let mask = CMD.mask.load(Relaxed);
        let op = CMD.op.load(Relaxed);
        let arg = |i: usize| CMD.args[i].load(Relaxed);
        if mask & (1 << cpu) != 0 {
            if op == Op::Ttbr0 as u64 {
                set_ttbr0(arg(0));
            } else if op == Op::Hammer as u64 {
                crate::smp_cases::hammer(
                    cpu,
                    me,
                    seq,
                    [arg(0), arg(1), arg(2), arg(3), arg(4), arg(5)],
                );
            } else if op == Op::Off as u64 {
                // Release: acknowledged before the CPU is gone.
                me.ack.store(seq, Release);
                let conduit = if CMD.args[0].load(Relaxed) == 1 {
                    Conduit::Smc
                } else {
                    Conduit::Hvc
                };
                psci::cpu_off(conduit);
            }
        }
        done = seq;
        // Release: the results before the acknowledgement.
        me.ack.store(seq, Release);
    }
}
