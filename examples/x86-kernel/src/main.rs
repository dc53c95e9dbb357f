//! The x86_64 tiny kernel of pgtable.
//!
//! QEMU boots it through the PVH ELF note ([`boot`]): a 32-bit entry
//! linked at its physical address sets up temporary tables, long mode and
//! jumps to the image, which is linked in the upper half (the top 2 GiB,
//! [`mem`] has the layout). There the kernel prints on COM1 ([`serial`]),
//! loads its GDT and TSS ([`gdt`]) and IDT ([`trap`], which also turns page
//! faults at known probe instructions into results and brings ring 3
//! back), builds its real address space with pgtable-x86 (`kernel_space`:
//! a linear map of all RAM and the image with W^X rights, all global and
//! supervisor-only in the upper half; table frames from [`mem`]) and runs
//! on it, with no low identity map left. It then runs its own `space_`
//! cases ([`space`]: W^X on the MMU, ring 3 in a user address space that
//! shares the kernel half), the conformance suite ([`machine`], in the
//! lower half of the kernel's root) and the benchmarks ([`bench`]), and
//! leaves through `isa-debug-exit`: 0x10 when everything passed (QEMU
//! exits with 33), 0x11 otherwise (35).
//!
//! Command line (`-append`): `[la57] [seed=N] [threshold_mb=M] [nobench]
//! [nobench=move,mprotect,linear] [nobig] [only=prefix,..] [skip=prefix,..]
//! [verbose] [accel=kvm|kvm-pvm|tcg] [noshootdown]` (`noshootdown`: the other
//! CPUs acknowledge flush IPIs without flushing, to see the `smp_` cases
//! fail).
#![no_std]
#![no_main]

mod apic;
mod bench;
mod boot;
mod gdt;
mod machine;
mod mem;
mod serial;
mod shootdown;
mod smp;
mod smp_cases;
mod space;
mod trampoline;
mod trap;
mod tsc;

use core::arch::x86_64::{__cpuid, __cpuid_count};
use core::cell::UnsafeCell;

use pgtable_core::contract::{Arch, TableAttrs};
use pgtable_core::suite::{self, Config};
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};
use pgtable_x86::{X86Mmu, X86_64La57, X86_64};

use crate::machine::KernelMachine;
use crate::mem::{image_phys, phys_to_virt, Frames, RamMap, LINEAR_BASE};
use crate::tsc::Tsc;

use x86_64::instructions::port::Port;
use x86_64::registers::control::{Cr0, Cr0Flags};
use x86_64::registers::model_specific::{Efer, EferFlags};

/// The isa-debug-exit port (QEMU `-device isa-debug-exit,iobase=0xf4,iosize=0x04`).
const DEBUG_EXIT_PORT: u16 = 0xf4;
/// Written on success: QEMU exits with `(0x10 << 1) | 1 = 33`.
const EXIT_SUCCESS: u32 = 0x10;
/// Written on failure: QEMU exits with 35.
const EXIT_FAILURE: u32 = 0x11;

/// Ends the run through isa-debug-exit.
pub fn exit(success: bool) -> ! {
    let code = if success { EXIT_SUCCESS } else { EXIT_FAILURE };
    // SAFETY: the port belongs to QEMU's debug-exit device; writing it stops
    // the virtual machine.
    unsafe { Port::<u32>::new(DEBUG_EXIT_PORT).write(code) };
    loop {
        x86_64::instructions::hlt();
    }
}

/// Moves the 8259 PICs' vectors above the exceptions and masks them, and
/// stops PIT channel 0, which the firmware leaves ticking at 18.2 Hz: the
/// kernel uses no device interrupt and runs with interrupts off.
fn quiet_interrupt_sources() {
    // SAFETY: the PICs and the PIT belong to this kernel, which uses no
    // device interrupts; these writes only mask or stop them.
    unsafe {
        // Remap the PICs to vectors 0x20..0x30 (ICW1..ICW4), away from
        // the exceptions the firmware's base 0x08 overlaps, then mask all.
        let out = |port: u16, v: u8| Port::<u8>::new(port).write(v);
        out(0x20, 0x11);
        out(0xa0, 0x11);
        out(0x21, 0x20);
        out(0xa1, 0x28);
        out(0x21, 0x04);
        out(0xa1, 0x02);
        out(0x21, 0x01);
        out(0xa1, 0x01);
        out(0x21, 0xff); // master PIC: mask all
        out(0xa1, 0xff); // slave PIC: mask all
        out(0x43, 0b0011_0000); // PIT ch0: mode 0 (one-shot), lo/hi
        out(0x40, 0x00);
        out(0x40, 0x00);
    }
    // Take (and drop) whatever was left pending, then run with interrupts
    // off again.
    x86_64::instructions::interrupts::enable();
    for _ in 0..1000 {
        core::hint::spin_loop();
    }
    x86_64::instructions::interrupts::disable();
}

/// Options from the command line.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Seed of the suite's pseudo-random fill.
    pub seed: u64,
    /// MiB of each moved range the suite validates.
    pub threshold_mb: u64,
    /// 5-level paging was asked for.
    pub la57: bool,
    /// Skip the benchmarks.
    pub nobench: bool,
    /// The accelerator QEMU was started with (`accel=kvm|kvm-pvm|tcg`), if
    /// said.
    pub accel: Option<&'static str>,
    /// Suite case-name prefixes to run (`only=a,b`; empty: all).
    pub only: &'static [&'static str],
    /// Suite case-name prefixes to skip (`skip=a,b`).
    pub skip: &'static [&'static str],
    /// Benchmarks to skip (`nobench=move,mprotect,linear`).
    pub nobench_list: &'static str,
    /// Print the suite's detail lines (`verbose`).
    pub verbose: bool,
    /// Leave out the suite's 1 GiB and 2 GiB moves (`nobig`).
    pub nobig: bool,
}

/// Storage for the `only=` and `skip=` lists (the command line is parsed
/// once, before anything reads them).
struct Lists {
    only: [&'static str; 8],
    skip: [&'static str; 8],
}

struct ListsCell(UnsafeCell<Lists>);

// SAFETY: one CPU; written once while the command line is parsed, only
// read afterwards.
unsafe impl Sync for ListsCell {}

static LISTS: ListsCell = ListsCell(UnsafeCell::new(Lists {
    only: [""; 8],
    skip: [""; 8],
}));

/// Splits `v` at commas into `dst`; returns how many were stored.
fn split_list(v: &'static str, dst: &mut [&'static str; 8]) -> usize {
    let mut n = 0;
    for p in v.split(',').filter(|p| !p.is_empty()) {
        if n < dst.len() {
            dst[n] = p;
            n += 1;
        }
    }
    n
}

/// The options of the kernel command line.
///
/// # Safety
///
/// Call once: the `only=` / `skip=` lists it returns live in a static that
/// it fills.
unsafe fn parse_cmdline(cmdline: &'static str) -> Options {
    let mut o = Options {
        seed: 0x5eed_1234,
        threshold_mb: 4,
        la57: false,
        nobench: false,
        accel: None,
        only: &[],
        skip: &[],
        nobench_list: "",
        verbose: false,
        nobig: false,
    };
    let (mut only_arg, mut skip_arg) = ("", "");
    for word in cmdline.split_ascii_whitespace() {
        match word.split_once('=') {
            Some(("seed", v)) => o.seed = parse_u64(v).unwrap_or(o.seed),
            Some(("threshold_mb", v)) => o.threshold_mb = parse_u64(v).unwrap_or(o.threshold_mb),
            Some(("accel", v)) => o.accel = Some(v),
            Some(("only", v)) => only_arg = v,
            Some(("skip", v)) => skip_arg = v,
            Some(("nobench", v)) => o.nobench_list = v,
            None if word == "la57" => o.la57 = true,
            None if word == "nobench" => o.nobench = true,
            None if word == "verbose" => o.verbose = true,
            None if word == "nobig" => o.nobig = true,
            None if word == "noshootdown" => shootdown::disable_shootdown(),
            _ => println!("ignoring unknown option {word}"),
        }
    }
    // SAFETY: called once (our caller's promise) on the only CPU; nothing
    // else refers to `LISTS` yet, and afterwards it is only read (through
    // `o`).
    let Lists { only, skip } = unsafe { &mut *LISTS.0.get() };
    let n = split_list(only_arg, only);
    o.only = &only[..n];
    let n = split_list(skip_arg, skip);
    o.skip = &skip[..n];
    o
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The command line of the PVH start info (empty if there is none).
///
/// # Safety
///
/// `info` is the start info the loader passed: a non-zero `cmdline_paddr`
/// is a NUL-terminated string in RAM (reached through the linear map,
/// which the boot tables and the kernel's tables both hold) that is never
/// written while the kernel runs.
unsafe fn cmdline(info: &boot::StartInfo) -> &'static str {
    if info.cmdline_paddr == 0 {
        return "";
    }
    let p = phys_to_virt(info.cmdline_paddr) as *const u8;
    let mut n = 0;
    // SAFETY: a NUL-terminated string in linearly mapped RAM (our caller's
    // promise); we bound the scan.
    while n < 4096 && unsafe { p.add(n).read() } != 0 {
        n += 1;
    }
    // SAFETY: `n` bytes starting at `p` were just read; the memory is
    // never written while the kernel runs.
    let bytes = unsafe { core::slice::from_raw_parts(p, n) };
    core::str::from_utf8(bytes).unwrap_or("")
}

/// The Rust entry, called by `boot` in 64-bit mode, in the upper half, on
/// the boot tables, with the physical address of the PVH start info.
#[no_mangle]
extern "C" fn kmain(start_info: u64) -> ! {
    serial::init();
    // SAFETY: once, at boot, with interrupts off (PVH entry state), before
    // anything enters ring 3; the boot GDT is not used again.
    unsafe { gdt::init() };
    // SAFETY: once, at boot, with interrupts off (PVH entry state).
    unsafe { trap::init() };
    quiet_interrupt_sources();
    println!("x86-kernel: booted (PVH)");
    println!(
        "image: running at {:#x} (physical {:#x}), linear map at {LINEAR_BASE:#x}",
        kmain as *const () as u64,
        image_phys(kmain as *const () as u64)
    );
    // SAFETY: the boot loader passes the physical address of its start
    // info in ebx; it lies in low RAM, which the boot tables map linearly.
    let info = unsafe { (phys_to_virt(start_info) as *const boot::StartInfo).read() };
    if info.magic != boot::START_INFO_MAGIC {
        println!("bad hvm_start_info magic {:#x}", info.magic);
        exit(false);
    }
    // SAFETY: the loader's start info (magic checked).
    let line = unsafe { cmdline(&info) };
    smp::set_boot_data([
        (
            start_info,
            start_info + core::mem::size_of::<boot::StartInfo>() as u64,
        ),
        (
            info.cmdline_paddr,
            info.cmdline_paddr + line.len() as u64 + 1,
        ),
        (
            info.memmap_paddr,
            info.memmap_paddr
                + u64::from(info.memmap_entries) * core::mem::size_of::<boot::MemmapEntry>() as u64,
        ),
    ]);
    // SAFETY: the only call.
    let opts = unsafe { parse_cmdline(line) };
    println!("cmdline: \"{line}\" -> {opts:?}");
    // SAFETY: the loader's start info (magic checked).
    let ram = unsafe { RamMap::from_start_info(&info, 2 << 30) };
    let ok = run(&ram, &opts);
    exit(ok)
}

/// Whether we run under hardware-assisted KVM (native timings): the
/// `accel=` option from xtask (`kvm`; `kvm-pvm` and `tcg` are emulated),
/// otherwise the hypervisor signature (CPUID 0x40000000: "KVMKVMKVM\0\0\0").
fn under_kvm(opts: &Options) -> bool {
    if let Some(a) = opts.accel {
        return a == "kvm";
    }
    if !tsc::under_hypervisor() {
        return false;
    }
    let l = __cpuid(0x4000_0000);
    (l.ebx, l.ecx, l.edx) == (0x4b4d_564b, 0x564b_4d56, 0x4d)
}

/// Whether the CPU maps 1 GiB pages (CPUID.80000001H:EDX[26]).
fn has_1g_pages() -> bool {
    __cpuid(0x8000_0001).edx & (1 << 26) != 0
}

/// Whether the CPU has execute-disable (CPUID.80000001H:EDX[20]).
fn has_nx() -> bool {
    __cpuid(0x8000_0001).edx & (1 << 20) != 0
}

fn run(ram: &RamMap, opts: &Options) -> bool {
    for r in ram.iter() {
        println!(
            "ram: {:#x}..{:#x} ({} MiB)",
            r.start,
            r.end,
            (r.end - r.start) >> 20
        );
    }
    let kvm = under_kvm(opts);
    let tsc = Tsc::detect();
    println!(
        "accelerator: {}; TSC {} kHz from {}",
        match (kvm, opts.accel) {
            (true, _) => "KVM (native TSC timings)",
            (false, Some("kvm-pvm")) =>
                "KVM through kvm_pvm (no hardware virtualisation: the hypervisor emulates this kernel; timings are EMULATED, not hardware figures)",
            _ => "TCG (timings are EMULATED, not hardware figures)",
        },
        tsc.hz / 1000,
        match tsc.source {
            tsc::Source::Cpuid15 => "CPUID leaf 0x15",
            tsc::Source::Hypervisor => "hypervisor leaf 0x40000010",
            tsc::Source::Pit => "PIT calibration (no CPUID frequency leaf)",
        }
    );
    println!(
        "cpuid: 1G pages {}, INVPCID {}, PCID {}, LA57 {}, NX {}",
        has_1g_pages(),
        __cpuid_count(7, 0).ebx & (1 << 10) != 0,
        __cpuid(1).ecx & (1 << 17) != 0,
        __cpuid_count(7, 0).ecx & (1 << 16) != 0,
        has_nx()
    );
    // The boot code set EFER.NXE if the CPU has execute-disable; the
    // format's non-executable entries carry bit 63 (XD), reserved without
    // it, so nothing can run correctly otherwise.
    if !Efer::read().contains(EferFlags::NO_EXECUTE_ENABLE) {
        println!(
            "FAIL setup: IA32_EFER.NXE is off (execute-disable, CPUID.80000001H:EDX[20], is {}): pgtable-x86 sets bit 63 (XD) in non-executable entries, a reserved bit without NXE",
            if has_nx() { "present" } else { "absent" }
        );
        println!("0 passed, 1 failed");
        return false;
    }
    // The boot code set CR0.WP: supervisor stores to read-only pages fault
    // (Intel SDM vol. 3A §4.6.1), which the kernel's W^X relies on.
    if !Cr0::read().contains(Cr0Flags::WRITE_PROTECT) {
        println!("FAIL setup: CR0.WP is off");
        println!("0 passed, 1 failed");
        return false;
    }
    let smep = space::enable_smep();
    println!(
        "protection: EFER.NXE on, CR0.WP on, CR4.SMEP {}",
        if smep {
            "on"
        } else {
            "absent (CPUID.(EAX=7,ECX=0):EBX[7] = 0)"
        }
    );
    let la57 = X86Mmu::la57_enabled();
    if opts.la57 && !la57 {
        println!("la57: skipped: the CPU lacks 5-level paging (CPUID.(EAX=7,ECX=0):ECX[16] = 0); running 4-level");
    }
    if la57 {
        println!("paging: 5-level (CR4.LA57 = 1)");
        run_on::<X86_64La57>(ram, tsc, kvm, smep, opts)
    } else {
        println!("paging: 4-level");
        run_on::<X86_64>(ram, tsc, kvm, smep, opts)
    }
}

/// The image's parts and their rights: `(first byte, one past the last,
/// protection)`, each 4 KiB aligned (`linker.ld`).
fn image_sections() -> [(u64, u64, Prot); 3] {
    extern "C" {
        static __text_start: u8;
        static __text_end: u8;
        static __rodata_start: u8;
        static __rodata_end: u8;
        static __data_start: u8;
        static __kernel_end: u8;
    }
    let a = |p: *const u8| p as u64;
    [
        (
            a(&raw const __text_start),
            a(&raw const __text_end),
            Prot::EXEC | Prot::GLOBAL,
        ),
        (
            a(&raw const __rodata_start),
            a(&raw const __rodata_end),
            Prot::GLOBAL,
        ),
        (
            a(&raw const __data_start),
            a(&raw const __kernel_end),
            Prot::WRITE | Prot::GLOBAL,
        ),
    ]
}

/// A new address space in format `A` with the kernel's mappings, all in
/// the upper half, global and supervisor-only (not installed), whose upper
/// half is shared with user spaces (its 256 root entries link pinned
/// tables, U/S clear in every table entry of the half):
///
/// - the linear map: every GiB that holds RAM at [`LINEAR_BASE`] + its
///   physical address, read-write and not executable, with the largest
///   blocks the CPU has; the alias of the image's text and rodata is
///   read-only (Linux keeps the direct map's alias of rodata read-only
///   too);
/// - the image at its link address: text read-execute, rodata read-only,
///   data and bss (the stacks) read-write, the last two not executable.
pub fn kernel_space<A: Arch>(ram: &RamMap) -> Result<AddressSpace<A, X86Mmu, Frames>, Error> {
    const G: u64 = 1 << 30;
    // Both halves: the suite and the benchmarks map in the lower half of
    // the kernel's own root. The upper half is the kernel half user spaces
    // share (`AddressSpace::new_user`): its tables are preallocated and
    // pinned, and every table of it is linked supervisor-only. User spaces
    // may cache it under their PCIDs: its flushes reach every PCID.
    let mmu = X86Mmu::new().for_kernel_half();
    let mut space = AddressSpace::<A, X86Mmu, Frames>::new_in(VaRange::Both, mmu, Frames)?;
    space.set_table_attrs(TableAttrs::KERNEL);
    space.share_kernel_half()?;
    let end = ram.iter().map(|r| r.end).max().unwrap_or(0);
    let opts = if has_1g_pages() {
        MapOptions::BLOCKS
    } else {
        MapOptions::PMD_BLOCKS
    };
    let rw = Prot::WRITE | Prot::GLOBAL;
    let ro = Prot::GLOBAL;
    let image = image_sections();
    // The physical range of text and rodata: read-only in the linear map.
    let (ro_lo, ro_hi) = (image_phys(image[0].0), image_phys(image[1].1));
    let mut g = 0;
    while g < end {
        if ram.iter().any(|r| r.start < g + G && r.end > g) {
            let pieces = [
                (g, ro_lo.clamp(g, g + G), rw),
                (ro_lo.clamp(g, g + G), ro_hi.clamp(g, g + G), ro),
                (ro_hi.clamp(g, g + G), g + G, rw),
            ];
            for (lo, hi, prot) in pieces {
                if lo < hi {
                    space.map(
                        VirtAddr(phys_to_virt(lo)),
                        PhysAddr(lo),
                        hi - lo,
                        prot,
                        opts,
                    )?;
                }
            }
        }
        g += G;
    }
    for (lo, hi, prot) in image {
        space.map(
            VirtAddr(lo),
            PhysAddr(image_phys(lo)),
            hi - lo,
            prot,
            MapOptions::PAGES,
        )?;
    }
    Ok(space)
}

/// Builds the kernel's address space in format `A`, switches to it, runs
/// the `space_` cases, the suite and the benchmarks on it.
fn run_on<A: Arch>(ram: &RamMap, tsc: Tsc, kvm: bool, smep: bool, opts: &Options) -> bool {
    let mut space = match kernel_space::<A>(ram) {
        Ok(s) => s,
        Err(e) => {
            println!("cannot build the kernel's tables: {e}");
            return false;
        }
    };
    // SAFETY: the new tables map the image at its link address (code,
    // data, stack, GDT, IDT, TSS) and all RAM linearly (start info,
    // command line, table frames): everything the kernel touches from now
    // on. The space lives until `run_on` returns, and before that we never
    // return to code that needs the boot tables (`kmain` exits).
    unsafe { space.install() };
    // SAFETY: the kernel's root was just installed by an untagged handle:
    // CR3[11:0] = 0.
    let pcids = unsafe { space::switch::init() };
    println!(
        "running on pgtable tables: format {}, root {:#x}, {} tables, INVPCID {}",
        A::NAME,
        space.root().0,
        space.inspect().count_tables(),
        if space.mmu().has_invpcid() {
            "used"
        } else {
            "absent"
        }
    );
    // The kernel half as Linux's /sys/kernel/debug/kernel_page_tables shows it.
    let (half, va) = (1u64 << (A::VA_BITS - 1), VirtAddr);
    let regions = [
        (va(half.wrapping_neg()), "Kernel Space"),
        (va(LINEAR_BASE), "Low Kernel Mapping"),
        (va(mem::KERNEL_VMA), "High Kernel Mapping"),
    ];
    match space.ptdump().range(va(half.wrapping_neg()), half) {
        Ok(d) => print!("ptdump of the kernel half:\n{}", d.markers(&regions)),
        Err(e) => println!("ptdump: {e}"),
    }
    // Every CPU, before any case runs.
    match smp::init(&mut space, ram, tsc.hz) {
        Ok(n) => smp::print_online(n),
        Err(smp::BringUpError(what, v)) => {
            println!("FAIL smp bring-up: {what} {v:#x}");
            println!("0 passed, 1 failed");
            return false;
        }
    }
    let mut pool = ram
        .pool()
        .max_by_key(|r| r.end - r.start)
        .unwrap_or_default();
    pool.end = pool.end.min(pool.start + (4 << 30));
    if !has_1g_pages() {
        // The suite maps 1 GiB blocks when the pool holds an aligned GiB;
        // this CPU cannot (the PS bit of a PDPTE is reserved), so offer a
        // pool without one: the suite then uses 2 MiB blocks at most.
        const G: u64 = 1 << 30;
        if pool.start % G == 0 {
            pool.start += 2 << 20;
        }
        if pool.end % G == 0 {
            pool.end -= 2 << 20;
        }
        println!(
            "no 1 GiB pages (CPUID.80000001H:EDX[26] = 0): RAM pool {:#x}..{:#x} holds no aligned GiB, so 1 GiB blocks are not used",
            pool.start, pool.end
        );
    }
    let mut mach = KernelMachine {
        tsc,
        emulated: !kvm,
        ram: (PhysAddr(pool.start), pool.end - pool.start),
        exec_page: None,
    };
    // Struct update on purpose: fields the suite adds later keep their
    // defaults (the suite's documented way to build a Config).
    #[allow(clippy::needless_update)]
    let cfg = Config {
        seed: opts.seed,
        threshold_bytes: opts.threshold_mb << 20,
        big_moves: !opts.nobig,
        verbose: opts.verbose,
        only: opts.only,
        skip: opts.skip,
        ..Config::DEFAULT
    };
    let own = space::run(&mut space, smep, pcids);
    println!();
    let smp_t = smp_cases::run::<A>(space.root(), pool.start);
    println!();
    let sum = suite::run(&mut space, &mut mach, &cfg);
    let suite_ok = sum.failed == 0 && sum.passed > 0 && own.failed == 0 && smp_t.failed == 0;
    let bench_ok = opts.nobench
        || (bench::run(&mut space, &mach, ram, kvm, opts.nobench_list)
            && smp_cases::bench::<A>(space.root(), pool.start));
    // No table frame may leak: every frame still allocated must belong to
    // the kernel's own tables.
    let live = Frames.live();
    let held = space.inspect().count_tables() as u64;
    let frames_ok = live == held;
    println!(
        "table frames: {live} allocated, {held} in the kernel's tables, peak {}{}",
        Frames.peak(),
        if frames_ok { "" } else { " -- LEAKED FRAMES" }
    );
    // The xtask judges the last `N passed, N failed` line: the suite's
    // and the `space_` cases' counts after the benchmarks, counting a
    // failed benchmark run and a leak as one more failure each.
    println!();
    println!(
        "{} passed, {} failed",
        sum.passed + own.passed + smp_t.passed,
        sum.failed + own.failed + smp_t.failed + u32::from(!bench_ok) + u32::from(!frames_ok)
    );
    // The live space is never torn down: the CPU walks its tables until the
    // machine exits, right after this. `into_parts` keeps them allocated.
    let _kept = space.into_parts();
    suite_ok && bench_ok && frames_ok
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    println!("PANIC: {info}");
    exit(false)
}
