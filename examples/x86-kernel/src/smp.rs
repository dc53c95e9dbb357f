//! Every CPU: bring-up of the application processors, per-CPU state and
//! the IPIs (the shootdown itself is [`crate::shootdown`]).
//!
//! **How many CPUs.** QEMU's fw_cfg device (I/O ports 0x510/0x511) tells
//! the number of CPUs (`FW_CFG_NB_CPUS`, key 0x05); QEMU numbers their
//! APIC IDs 0..N-1 (one socket, N cores, one thread each for `-smp N`),
//! which every AP confirms by reporting its own ID from its APIC. The ACPI
//! MADT is not parsed.
//!
//! **Bring-up** ([`init`]), one AP at a time: the BSP maps its local APIC
//! ([`crate::apic`]), builds a transient *boot root* (the kernel's
//! mappings plus the trampoline page identity-mapped), copies the
//! real-mode trampoline ([`crate::trampoline`]) to 0x8000, and for each AP
//! sets the stack and index it will take, sends INIT-SIPI-SIPI and waits
//! for the AP to report in. The AP goes 16 → 32 → 64-bit on the boot root,
//! jumps to `ap_entry64` in the upper half, switches to the kernel's root
//! and its stack, then in [`ap_main`] loads its own GDT and TSS, the
//! shared IDT, enables its APIC and reports in (its bit in the online
//! mask, its APIC ID). CR0 (PG, WP), CR4 (PAE, PGE, SMEP, LA57) and EFER
//! (LME, NXE) come from the BSP's values through the trampoline. When all
//! are in, the BSP drops the boot root.
//!
//! **The APs' life.** Idle in `sti; hlt`, woken by an IPI; a command
//! block in [`crate::smp_cases`] gives them work (hammering loops), which
//! they run with interrupts on so that a shootdown reaches them at any
//! instruction.
//!
//! **IPIs.** [`FLUSH_VECTOR`]: the stub calls
//! [`crate::shootdown::handle_flush_ipi`] and EOIs; [`send_flush_ipis`]
//! sends it to a CPU mask. [`KICK_VECTOR`] only wakes an idle AP.

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;
use core::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering::*};

use pgtable_core::contract::{Arch, PAGE_SIZE};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_x86::X86Mmu;
use x86_64::instructions::port::Port;
use x86_64::instructions::segmentation::{Segment, CS, DS, ES, SS};
use x86_64::instructions::tables::load_tss;
use x86_64::registers::control::{Cr0, Cr4, Cr4Flags};
use x86_64::registers::model_specific::Efer;
use x86_64::structures::gdt::{Descriptor, GlobalDescriptorTable, SegmentSelector};
use x86_64::structures::tss::TaskStateSegment;

use crate::mem::{Frames, RamMap};
use crate::trampoline::{self, TRAMPOLINE_PA};
use crate::{apic, gdt, println, shootdown, trap, tsc};

/// The most CPUs this kernel brings up.
pub const MAX_CPUS: usize = 8;
/// The IPI vector of a TLB shootdown.
pub const FLUSH_VECTOR: u8 = 0xf0;
/// The IPI vector that only wakes an idle AP (a new command).
pub const KICK_VECTOR: u8 = 0xf1;

/// An AP's kernel stack.
const AP_STACK_SIZE: usize = 64 << 10;
/// An AP's RSP0 and #DF stacks.
const AP_TRAP_STACK_SIZE: usize = 16 << 10;

#[repr(C, align(16))]
struct Stack<const N: usize>([u8; N]);

/// The APs' stacks (entry 0, the BSP's, is unused: it runs on
/// `BOOT_STACK`).
static mut AP_STACKS: [Stack<AP_STACK_SIZE>; MAX_CPUS] =
    [const { Stack([0; AP_STACK_SIZE]) }; MAX_CPUS];
static mut AP_RING0_STACKS: [Stack<AP_TRAP_STACK_SIZE>; MAX_CPUS] =
    [const { Stack([0; AP_TRAP_STACK_SIZE]) }; MAX_CPUS];
static mut AP_DF_STACKS: [Stack<AP_TRAP_STACK_SIZE>; MAX_CPUS] =
    [const { Stack([0; AP_TRAP_STACK_SIZE]) }; MAX_CPUS];

/// A per-CPU cell written once by its own CPU before the processor uses it.
struct PerCpu<T>(UnsafeCell<T>);

// SAFETY: entry `i` is written only by CPU `i`, once, in `ap_main`, before
// that CPU loads it; afterwards only the processor touches it (the TSS
// busy bit).
unsafe impl<T> Sync for PerCpu<T> {}

static GDTS: [PerCpu<GlobalDescriptorTable>; MAX_CPUS] =
    [const { PerCpu(UnsafeCell::new(GlobalDescriptorTable::new())) }; MAX_CPUS];
static TSSS: [PerCpu<TaskStateSegment>; MAX_CPUS] =
    [const { PerCpu(UnsafeCell::new(TaskStateSegment::new())) }; MAX_CPUS];

/// What the next AP takes at its 64-bit entry: the kernel's root and its
/// stack top (read by `ap_entry64`), and its index. The BSP writes them
/// before the INIT IPI, which orders them for the AP (the ICR write is a
/// serializing MMIO store after them), and starts one AP at a time.
#[no_mangle]
static AP_BOOT_CR3: AtomicU64 = AtomicU64::new(0);
#[no_mangle]
static AP_BOOT_RSP: AtomicU64 = AtomicU64::new(0);
static AP_BOOT_INDEX: AtomicUsize = AtomicUsize::new(0);

/// CPUs online (bit i: CPU index i; the BSP is 0).
static ONLINE: AtomicU64 = AtomicU64::new(1);
/// Number of CPUs online.
static NCPUS: AtomicUsize = AtomicUsize::new(1);
/// The control registers each AP reported: CR0, CR4, EFER.
static AP_REGS: [[AtomicU64; 3]; MAX_CPUS] = [const { [const { AtomicU64::new(0) }; 3] }; MAX_CPUS];

/// The bits every CPU must have as CPU 0 has them: CR0 PG, WP, PE;
/// CR4 PAE, PGE, SMEP, LA57; EFER LME, LMA, NXE.
const REG_BITS: [u64; 3] = [
    (1 << 31) | (1 << 16) | 1,
    (1 << 5) | (1 << 7) | (1 << 20) | (1 << 12),
    (1 << 8) | (1 << 10) | (1 << 11),
];

/// CR0, CR4 and EFER of the executing CPU.
fn control_regs() -> [u64; 3] {
    [Cr0::read_raw(), Cr4::read_raw(), Efer::read_raw()]
}

/// APIC ID of each CPU index.
static APIC_IDS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

global_asm!(
    r#"
    .section .text.ap_entry, "ax"
    .global ap_entry64
ap_entry64:
    /* From the trampoline, on the boot root: the kernel's root, then the
       stack the BSP chose; the index is in AP_BOOT_INDEX. */
    mov rax, qword ptr [rip + AP_BOOT_CR3]
    mov cr3, rax
    mov rsp, qword ptr [rip + AP_BOOT_RSP]
    xor ebp, ebp
    call {ap_main}
1:
    cli
    hlt
    jmp 1b

    /* The IPI vectors: save the caller-saved registers (the CPU's 40-byte
       frame plus these 72 bytes keep RSP 16-byte aligned), call the
       handler, which EOIs, restore, return. */
    .section .text.ipi, "ax"
    .global ipi_flush_entry, ipi_kick_entry
ipi_flush_entry:
    push rax
    lea rax, [rip + {flush}]
    jmp ipi_common
ipi_kick_entry:
    push rax
    lea rax, [rip + {kick}]
ipi_common:
    push rcx
    push rdx
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    cld
    call rax
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rax
    iretq
"#,
    ap_main = sym ap_main,
    flush = sym flush_ipi,
    kick = sym kick_ipi,
);

extern "C" {
    fn ap_entry64();
    fn ipi_flush_entry();
    fn ipi_kick_entry();
}

/// The index of the executing CPU, from its stack pointer: an AP runs on
/// its own `AP_STACKS` entry, the BSP on `BOOT_STACK`. Cheap and needs no
/// hardware register, so the trap handler can use it.
#[inline]
pub fn this_cpu() -> usize {
    let rsp: u64;
    // SAFETY: reads RSP only.
    unsafe { asm!("mov {}, rsp", out(reg) rsp, options(nomem, nostack, preserves_flags)) };
    let lo = (&raw const AP_STACKS) as u64;
    let hi = lo + (MAX_CPUS * AP_STACK_SIZE) as u64;
    if (lo..hi).contains(&rsp) {
        ((rsp - lo) / AP_STACK_SIZE as u64) as usize
    } else {
        0
    }
}

/// The TSC frequency (set by [`init`]), for timeouts.
static TSC_HZ: AtomicU64 = AtomicU64::new(1_000_000_000);

/// The TSC frequency in Hz.
pub fn tsc_hz() -> u64 {
    TSC_HZ.load(Relaxed)
}

/// The kernel's root (what an AP loads at its 64-bit entry).
pub fn kernel_root() -> u64 {
    AP_BOOT_CR3.load(Relaxed)
}

/// Physical ranges of boot data (PVH start info, command line, memory
/// map) the trampoline must not overwrite.
static BOOT_DATA: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Records the boot data ranges `(start, end)` (called once by `kmain`).
pub fn set_boot_data(r: [(u64, u64); 3]) {
    for (i, (s, e)) in r.into_iter().enumerate() {
        BOOT_DATA[2 * i].store(s, Relaxed);
        BOOT_DATA[2 * i + 1].store(e, Relaxed);
    }
}

/// The number of CPUs online.
pub fn ncpus() -> usize {
    NCPUS.load(Acquire)
}

/// The mask of CPUs online.
pub fn online() -> u64 {
    ONLINE.load(Acquire)
}

/// The number of CPUs QEMU was started with (fw_cfg `FW_CFG_NB_CPUS`).
fn fw_cfg_cpus() -> usize {
    // SAFETY: QEMU's fw_cfg selector and data ports (x86: 0x510, 0x511);
    // selecting a key and reading its bytes has no effect on memory.
    let n = unsafe {
        Port::<u16>::new(0x510).write(0x05);
        let mut d = Port::<u8>::new(0x511);
        u16::from(d.read()) | u16::from(d.read()) << 8
    };
    usize::from(n).clamp(1, MAX_CPUS)
}

/// Builds an AP's GDT and TSS (the same selectors as [`crate::gdt`]) and
/// loads them.
///
/// # Safety
///
/// Once per AP, on that AP, with interrupts off.
unsafe fn load_gdt(cpu: usize) {
    // SAFETY: entry `cpu` is this CPU's, written once here before use.
    let tss = unsafe { &mut *TSSS[cpu].0.get() };
    let top = |p: *const u8, n: usize| x86_64::VirtAddr::from_ptr(p) + n as u64;
    // SAFETY: only addresses are taken.
    unsafe {
        tss.privilege_stack_table[0] =
            top((&raw const AP_RING0_STACKS[cpu]).cast(), AP_TRAP_STACK_SIZE);
        tss.interrupt_stack_table[gdt::DOUBLE_FAULT_IST as usize] =
            top((&raw const AP_DF_STACKS[cpu]).cast(), AP_TRAP_STACK_SIZE);
    }
    // SAFETY: complete now, never written again by software.
    let tss: &'static TaskStateSegment = unsafe { &*TSSS[cpu].0.get() };
    // SAFETY: as for the TSS.
    let g = unsafe { &mut *GDTS[cpu].0.get() };
    g.append(Descriptor::kernel_code_segment());
    g.append(Descriptor::kernel_data_segment());
    g.append(Descriptor::user_data_segment());
    g.append(Descriptor::user_code_segment());
    let ts = g.append(Descriptor::tss_segment(tss));
    // SAFETY: complete now, never written again by software.
    let g: &'static GlobalDescriptorTable = unsafe { &*GDTS[cpu].0.get() };
    g.load();
    // SAFETY: the selectors name the segments just loaded (same layout as
    // the BSP's GDT), then this CPU's TSS.
    unsafe {
        CS::set_reg(SegmentSelector(gdt::KERNEL_CS));
        SS::set_reg(SegmentSelector(gdt::KERNEL_DS));
        DS::set_reg(SegmentSelector(gdt::KERNEL_DS));
        ES::set_reg(SegmentSelector(gdt::KERNEL_DS));
        load_tss(ts);
    }
}

/// The AP's first Rust code, on its own stack and the kernel's root.
extern "C" fn ap_main() -> ! {
    let cpu = AP_BOOT_INDEX.load(Acquire);
    // SAFETY: once, on this AP, interrupts off (the trampoline's cli).
    unsafe { load_gdt(cpu) };
    trap::load_idt();
    apic::enable();
    APIC_IDS[cpu].store(u64::from(apic::id()), Relaxed);
    for (slot, v) in AP_REGS[cpu].iter().zip(control_regs()) {
        slot.store(v, Relaxed);
    }
    shootdown::set_online();
    // Release: the BSP's Acquire load of the mask sees the APIC ID and
    // everything this AP set up.
    ONLINE.fetch_or(1 << cpu, Release);
    crate::smp_cases::ap_loop(cpu)
}

/// Why bring-up failed.
pub struct BringUpError(pub &'static str, pub u64);

/// Brings up every CPU QEMU has; returns how many are online. `space` is
/// the kernel's address space, installed on the BSP.
pub fn init<A: Arch>(
    space: &mut AddressSpace<A, X86Mmu, Frames>,
    ram: &RamMap,
    tsc_hz: u64,
) -> Result<usize, BringUpError> {
    TSC_HZ.store(tsc_hz, Relaxed);
    apic::map(space).map_err(|_| BringUpError("map the local APIC", 0))?;
    apic::enable();
    APIC_IDS[0].store(u64::from(apic::id()), Relaxed);
    shootdown::set_online();
    // SAFETY: the IDT is live but the gates for these two vectors are not
    // used yet: no IPI is sent before the APs are up, and the BSP has
    // interrupts off.
    unsafe {
        trap::set_gate(FLUSH_VECTOR, ipi_flush_entry as *const () as u64);
        trap::set_gate(KICK_VECTOR, ipi_kick_entry as *const () as u64);
    }
    let want = fw_cfg_cpus();
    if want == 1 {
        return Ok(1);
    }
    let tpage = (TRAMPOLINE_PA, TRAMPOLINE_PA + PAGE_SIZE);
    for i in 0..3 {
        let (s, e) = (
            BOOT_DATA[2 * i].load(Relaxed),
            BOOT_DATA[2 * i + 1].load(Relaxed),
        );
        if s < tpage.1 && tpage.0 < e {
            return Err(BringUpError("the trampoline page overlaps boot data at", s));
        }
    }
    // The boot root: the kernel's mappings and the trampoline page at its
    // physical address, read-execute (the trampoline writes nothing).
    let mut boot =
        crate::kernel_space::<A>(ram).map_err(|_| BringUpError("build the boot root", 0))?;
    boot.map(
        VirtAddr(TRAMPOLINE_PA),
        PhysAddr(TRAMPOLINE_PA),
        PAGE_SIZE,
        Prot::EXEC,
        MapOptions::PAGES,
    )
    .map_err(|_| BringUpError("map the trampoline", TRAMPOLINE_PA))?;
    if boot.root().0 >= 1 << 32 {
        return Err(BringUpError("boot root above 4 GiB", boot.root().0));
    }
    let efer = Efer::read_raw() & ((1 << 8) | (1 << 11) | 1); // LME, NXE, SCE
    let params = trampoline::Params {
        cr3: boot.root().0 as u32,
        cr4: (Cr4::read() - Cr4Flags::PCID).bits() as u32,
        efer: efer as u32,
        cr0: Cr0::read().bits() as u32,
        entry: ap_entry64 as *const () as u64,
    };
    // SAFETY: the page is RAM below 640 KiB that is not boot data
    // (checked against `reserved`) and that nothing else uses.
    unsafe { trampoline::install(params) };
    AP_BOOT_CR3.store(space.root().0, Relaxed);
    for cpu in 1..want {
        AP_BOOT_INDEX.store(cpu, Relaxed);
        // SAFETY: only the address is taken.
        let top = unsafe { (&raw const AP_STACKS[cpu]) as u64 } + AP_STACK_SIZE as u64;
        AP_BOOT_RSP.store(top, Relaxed);
        // SeqCst fence: the stores above complete before the INIT IPI.
        fence(SeqCst);
        apic::start_ap(cpu as u32, (TRAMPOLINE_PA >> 12) as u8, tsc_hz);
        let deadline = tsc::now() + tsc_hz; // 1 s
        while ONLINE.load(Acquire) & (1 << cpu) == 0 {
            if tsc::now() > deadline {
                return Err(BringUpError("no report from AP", cpu as u64));
            }
            core::hint::spin_loop();
        }
        let id = APIC_IDS[cpu].load(Relaxed);
        if id != cpu as u64 {
            return Err(BringUpError("AP reported an unexpected APIC ID", id));
        }
        let mine = control_regs();
        for (i, what) in ["AP's CR0 differs", "AP's CR4 differs", "AP's EFER differs"]
            .into_iter()
            .enumerate()
        {
            let its = AP_REGS[cpu][i].load(Relaxed);
            if (its ^ mine[i]) & REG_BITS[i] != 0 {
                return Err(BringUpError(what, its));
            }
        }
        NCPUS.store(cpu + 1, Release);
    }
    // Every AP left the boot root for the kernel's (its MOV to CR3 dropped
    // the boot root's non-global translations and paging-structure
    // caches): drop it.
    drop(boot);
    Ok(ncpus())
}

/// Wakes the CPUs of `mask` (a new command).
pub fn kick(mask: u64) {
    for cpu in cpus(mask) {
        apic::send_ipi(APIC_IDS[cpu].load(Relaxed) as u32, KICK_VECTOR);
    }
}

/// The CPU indices set in `mask`.
pub fn cpus(mask: u64) -> impl Iterator<Item = usize> {
    (0..MAX_CPUS).filter(move |c| mask & (1 << c) != 0)
}

extern "C" fn kick_ipi() {
    apic::eoi();
}

/// Flush IPIs taken per CPU (counted by the vector's stub).
pub static FLUSH_IPIS_TAKEN: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

extern "C" fn flush_ipi() {
    let cpu = this_cpu();
    FLUSH_IPIS_TAKEN[cpu].fetch_add(1, Relaxed);
    shootdown::handle_flush_ipi(cpu);
    apic::eoi();
}

/// Sends the flush IPI to each CPU of `mask` (the kernel's `IpiSender`).
pub fn send_flush_ipis(mask: u64) {
    for cpu in cpus(mask) {
        apic::send_ipi(APIC_IDS[cpu].load(Relaxed) as u32, FLUSH_VECTOR);
    }
}

/// Switches this CPU back to the kernel's root.
pub fn switch_to_kernel() {
    // SAFETY: the kernel's root maps everything and lives forever; its
    // CPU set is a static.
    unsafe { shootdown::switch_to(kernel_root(), &shootdown::KERNEL_MM) };
}

/// Reports the bring-up.
pub fn print_online(n: usize) {
    let mut ids = [0u64; MAX_CPUS];
    for (i, id) in ids.iter_mut().enumerate().take(n) {
        *id = APIC_IDS[i].load(Relaxed);
    }
    let x2apic = core::arch::x86_64::__cpuid(1).ecx & (1 << 21) != 0;
    println!(
        "smp: APIC IDs {:?} (count from fw_cfg FW_CFG_NB_CPUS, IDs 0..N-1 as QEMU numbers them, each confirmed by its AP); xAPIC MMIO (x2APIC, CPUID.01H:ECX[21], {})",
        &ids[..n],
        if x2apic { "present, not used" } else { "absent" }
    );
    let r = control_regs();
    println!(
        "smp: every AP has CPU 0's CR0 {:#x}, CR4 {:#x}, EFER {:#x} in PG WP PE / PAE PGE SMEP LA57 / LME LMA NXE",
        r[0] & REG_BITS[0],
        r[1] & REG_BITS[1],
        r[2] & REG_BITS[2]
    );
    println!("smp: {n} CPUs online");
}
