//! Switching among address spaces: the kernel's own (untagged, PCID 0)
//! and user spaces that share its kernel half
//! ([`AddressSpace::new_user`]).
//!
//! With PCIDs (CPUID.01H:ECX.PCID\[bit 17\], turned on at boot by
//! [`init`]), each user space's MMU handle starts unassigned
//! ([`X86Mmu::unassigned`]: no PCID until its first switch, and no flush
//! before it) and every switch is `Pcid12Allocator::switch_mm` (Linux
//! `switch_mm_irqs_off` and `choose_new_asid`; here the arm64 generation
//! algorithm of `pgtable_core::asid`): a roll-over makes this CPU
//! invalidate every PCID first ([`X86Mmu::flush_all_pcids`]), then the
//! root is loaded with the PCID and the no-flush bit, unless the PCID owes
//! a flush ([`PcidCpu::take_stale`], a flush of the space deferred while
//! it was not current). A space exits with `pgtable_core::asid::exit_mm`.
//! Without PCIDs the same handles and `switch_mm` run, and the handles
//! install and flush untagged (CR4.PCIDE = 0): every switch is a plain
//! MOV to CR3, which drops every non-global translation; the allocator's
//! numbers are kept by the handles but not loaded.
//!
//! [`COUNTS`] keeps what the switches did, for [`print_counts`].

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use pgtable_core::asid::{exit_mm, AsidContext, Pcid12Allocator};
use pgtable_core::contract::{Arch, TaggedMmu};
use pgtable_core::AddressSpace;
use pgtable_x86::{cpu_has_pcid, enable_pcids, Pcid, PcidCpu, X86Mmu};

use super::Why;
use crate::mem::Frames;
use crate::println;

/// Whether CR4.PCIDE is on (set once by [`init`]).
static PCIDS: AtomicBool = AtomicBool::new(false);

/// The PCIDs that owe a flush on each CPU. One CPU runs the cases; an SMP
/// kernel gives each CPU its own entry and [`this_cpu`] picks it.
static PCID_CPUS: [PcidCpu; 1] = [PcidCpu::new()];

/// The executing CPU's [`PcidCpu`].
pub fn this_cpu() -> &'static PcidCpu {
    &PCID_CPUS[0]
}

/// Turns PCIDs on if the CPU has them and says what switches use.
///
/// # Safety
///
/// CR3\[11:0\] is 0 (the current root was installed by an untagged
/// handle), as [`enable_pcids`] requires.
pub unsafe fn init() -> bool {
    // SAFETY: CR3[11:0] = 0 (our caller's promise); x86-64 runs in IA-32e
    // mode.
    let on = unsafe { enable_pcids() };
    PCIDS.store(on, Relaxed);
    if on {
        println!(
            "pcid: on (CR4.PCIDE = 1): user spaces switch with tagged CR3 writes (no-flush bit unless a flush is owed)"
        );
    } else {
        println!(
            "pcid: absent (CPUID.01H:ECX[17] = {}): every address-space switch is a plain MOV to CR3",
            u32::from(cpu_has_pcid())
        );
    }
    on
}

/// Whether PCIDs are on.
pub fn pcids() -> bool {
    PCIDS.load(Relaxed)
}

/// What the switches and flushes of the `space_` cases did.
pub struct Counts {
    /// Switches to a user space with its PCID and the no-flush bit.
    pub tagged_keep: AtomicU64,
    /// Switches to a user space with its PCID that flushed it (a deferred
    /// flush was owed).
    pub tagged_flush: AtomicU64,
    /// Switches to a user space by a plain MOV to CR3 (no PCIDs).
    pub plain: AtomicU64,
    /// Switches back to the kernel's space (PCID 0, flushing it).
    pub kernel: AtomicU64,
    /// Allocator roll-overs.
    pub rollovers: AtomicU64,
    /// Local flushes of every PCID a roll-over asked for.
    pub local_flushes: AtomicU64,
    /// Range TLB flushes the library issued for the user spaces.
    pub flush_range: AtomicU64,
    /// Full TLB flushes the library issued for the user spaces.
    pub flush_all: AtomicU64,
}

/// The one set of counts (one CPU; Relaxed: plain counters).
pub static COUNTS: Counts = Counts {
    tagged_keep: AtomicU64::new(0),
    tagged_flush: AtomicU64::new(0),
    plain: AtomicU64::new(0),
    kernel: AtomicU64::new(0),
    rollovers: AtomicU64::new(0),
    local_flushes: AtomicU64::new(0),
    flush_range: AtomicU64::new(0),
    flush_all: AtomicU64::new(0),
};

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

/// Prints [`COUNTS`] as a small table.
pub fn print_counts() {
    let c = &COUNTS;
    let g = |a: &AtomicU64| a.load(Relaxed);
    println!(
        "  address-space switches of the space_ cases ({}):",
        if pcids() {
            "PCIDs on"
        } else {
            "no PCID: plain CR3 writes"
        }
    );
    println!(
        "    {:<52}{:>8}",
        "to a user space, PCID kept (no-flush bit)",
        g(&c.tagged_keep)
    );
    println!(
        "    {:<52}{:>8}",
        "to a user space, PCID flushed (owed a flush)",
        g(&c.tagged_flush)
    );
    println!(
        "    {:<52}{:>8}",
        "to a user space, plain CR3 (flushes)",
        g(&c.plain)
    );
    println!(
        "    {:<52}{:>8}",
        "to the kernel's space (PCID 0, flushes)",
        g(&c.kernel)
    );
    println!(
        "    {:<52}{:>8}",
        "PCID allocator roll-overs",
        g(&c.rollovers)
    );
    println!(
        "    {:<52}{:>8}",
        "local flushes of every PCID (roll-overs)",
        g(&c.local_flushes)
    );
    println!(
        "    {:<52}{:>8}",
        "library range TLB flushes (user spaces)",
        g(&c.flush_range)
    );
    println!(
        "    {:<52}{:>8}",
        "library full TLB flushes (user spaces)",
        g(&c.flush_all)
    );
}

/// A user address space that shares the kernel half, with its PCID
/// context.
pub struct User<A: Arch> {
    /// The space.
    pub space: AddressSpace<A, X86Mmu, Frames>,
    /// Its PCID and generation.
    ctx: AsidContext,
}

impl<A: Arch> User<A> {
    /// A new user space sharing `kernel`'s kernel half; its handle is
    /// unassigned until its first switch gives it a PCID (its flushes
    /// before that do nothing: it never ran).
    pub fn new(kernel: &AddressSpace<A, X86Mmu, Frames>) -> Result<User<A>, Why> {
        // SAFETY: `this_cpu` returns the only CPU's state; CR4.PCIDE was
        // set (or not) by `init`, before any user space existed. Without
        // PCIDs the handle installs and flushes untagged.
        let mmu = unsafe { X86Mmu::unassigned(this_cpu) };
        // SAFETY: the kernel's space lives until the machine exits
        // (`run_on` never drops it); every user space is retired before.
        match unsafe { AddressSpace::new_user(kernel, mmu, Frames) } {
            Ok(space) => Ok(User {
                space,
                ctx: AsidContext::NEW,
            }),
            Err(e) => Err(Why::new(format_args!("new_user: {e}"))),
        }
    }

    /// The PCID the space runs under (`None`: not switched to yet, or
    /// PCIDs off, when the handle's PCID is not loaded into CR3).
    pub fn pcid(&self) -> Option<Pcid> {
        self.space.mmu().pcid().filter(|_| pcids())
    }

    /// Frees the space. The kernel's space must be installed (not this
    /// one).
    pub fn retire(mut self) {
        let st = self.space.stats();
        add(&COUNTS.flush_range, st.flush_range());
        add(&COUNTS.flush_all, st.flush_all());
        // SAFETY: the only CPU runs on the kernel's root (our caller's
        // promise). `exit_mm` flushes the space's PCID (INVPCID type 1,
        // or, without INVPCID, a flush owed at that PCID's next load,
        // which no CPU can use before) before its tables may be freed;
        // without PCIDs the space ran under PCID 0, which the kernel
        // root's MOV to CR3 flushed.
        unsafe { exit_mm(&mut self.space) };
    }
}

/// Switches the one CPU among the kernel's space and user spaces.
pub struct Switcher {
    pcids: Pcid12Allocator<1>,
    /// The allocator's roll-overs already added to [`COUNTS`].
    seen_rollovers: u64,
}

impl Switcher {
    /// A switcher whose allocator hands out `bits`-bit PCIDs (a small
    /// width forces roll-overs).
    ///
    /// A new allocator starts a new numbering: PCIDs a previous one gave
    /// out may still tag cached entries, so every PCID is flushed here
    /// first.
    pub fn new(bits: u32) -> Result<Switcher, Why> {
        let alloc = match Pcid12Allocator::<1>::new(bits) {
            Ok(a) => a,
            Err(e) => return Err(Why::new(format_args!("PCID allocator: {e}"))),
        };
        if pcids() {
            X86Mmu::new().flush_all_pcids();
            this_cpu().clear();
        }
        Ok(Switcher {
            pcids: alloc,
            seen_rollovers: 0,
        })
    }

    /// The allocator's roll-overs so far.
    pub fn rollovers(&self) -> u64 {
        self.pcids.rollovers()
    }

    /// Installs `u` (Linux `switch_mm`): with PCIDs, its PCID from the
    /// allocator, after the local flush a roll-over asks for.
    pub fn switch_user<A: Arch>(&mut self, u: &mut User<A>) -> Result<(), Why> {
        // The install flushes the PCID if it owes a flush: known for a
        // space that keeps its PCID (a new PCID owes none: the roll-over
        // flush forgot every owed flush). For the counts only.
        let kept = self
            .pcids
            .is_current(u.ctx)
            .then(|| self.pcids.asid_of(u.ctx));
        let owed = kept
            .and_then(|p| Pcid::new(p).ok())
            .is_some_and(|p| this_cpu().is_stale(p));
        // SAFETY: `u` maps the kernel half (shared) and its own pages, and
        // the kernel runs only in the upper half; CPU 0 is the only CPU;
        // `u.ctx` is `u`'s and only this allocator sees it, and the TLB
        // holds no other allocator's PCIDs (`new` flushed them all).
        let sw = match unsafe { self.pcids.switch_mm(0, &mut u.ctx, &mut u.space) } {
            Ok(sw) => sw,
            Err(e) => return Err(Why::new(format_args!("switch_mm: {e}"))),
        };
        self.count_rollovers();
        if sw.flush_local {
            add(&COUNTS.local_flushes, 1);
        }
        ensure!(
            u.space.mmu().tag() == Some(sw.asid),
            "switch_mm left the space's handle at PCID {:?}, not {}",
            u.space.mmu().tag(),
            sw.asid
        );
        let count = if !pcids() {
            // No PCIDs: the handle took the number, but the install was a
            // plain MOV to CR3, which drops every non-global translation.
            &COUNTS.plain
        } else if owed {
            &COUNTS.tagged_flush
        } else {
            &COUNTS.tagged_keep
        };
        add(count, 1);
        Ok(())
    }

    /// Adds the allocator's new roll-overs to [`COUNTS`].
    fn count_rollovers(&mut self) {
        let r = self.pcids.rollovers();
        add(&COUNTS.rollovers, r - self.seen_rollovers);
        self.seen_rollovers = r;
    }

    /// Installs the kernel's own space (untagged: PCID 0, flushing it).
    pub fn switch_kernel<A: Arch>(&mut self, k: &mut AddressSpace<A, X86Mmu, Frames>) {
        to_kernel(k);
    }
}

/// Installs the kernel's own space (untagged: PCID 0, flushing it).
pub fn to_kernel<A: Arch>(k: &mut AddressSpace<A, X86Mmu, Frames>) {
    add(&COUNTS.kernel, 1);
    // SAFETY: the kernel's space maps everything the kernel uses.
    unsafe { k.install() };
}

/// Runs `body` with `N` new user spaces that share `kernel`'s half; then
/// installs the kernel's space again and retires them, whatever `body`
/// returned.
pub fn with_users<A: Arch, const N: usize>(
    kernel: &mut AddressSpace<A, X86Mmu, Frames>,
    body: impl FnOnce(&mut AddressSpace<A, X86Mmu, Frames>, &mut [User<A>; N]) -> Result<(), Why>,
) -> Result<(), Why> {
    let made: [Result<User<A>, Why>; N] = core::array::from_fn(|_| User::new(kernel));
    if let Some(i) = made.iter().position(Result::is_err) {
        let mut first = None;
        for (j, r) in made.into_iter().enumerate() {
            match r {
                Ok(u) => u.retire(),
                Err(e) if j == i => first = Some(e),
                Err(_) => {}
            }
        }
        return Err(first.unwrap_or_else(|| Why::new(format_args!("user space {i}"))));
    }
    let mut users = made.map(|r| match r {
        Ok(u) => u,
        // Checked above: every one is Ok.
        Err(_) => unreachable!(),
    });
    let r = body(kernel, &mut users);
    to_kernel(kernel);
    for u in users {
        u.retire();
    }
    r
}
