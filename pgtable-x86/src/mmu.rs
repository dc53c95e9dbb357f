//! The x86 MMU operations: TLB maintenance and CR3, on bare metal.
//!
//! Compiled only for `target_arch = "x86_64"`, `target_os = "none"` (and
//! documented by `cargo doc` on x86-64 hosts, as on docs.rs); the host
//! uses the simulated MMU of `pgtable-core` instead. Registers and
//! INVPCID come from the `x86_64` crate; INVLPG is issued here directly,
//! because that crate's linear addresses are 48-bit (see
//! [`X86Mmu::flush_page`]).
//!
//! These operations act on the executing CPU only. An SMP kernel wraps
//! them in a shootdown (IPIs to the CPUs that use the address space) to
//! meet the "every CPU" rule of [`Mmu`]: [`SmpMmu`](crate::SmpMmu) of
//! [`crate::shootdown`] is one, with the IPI vector left to the kernel.
//!
//! # PCIDs
//!
//! An MMU handle made with [`X86Mmu::with_pcid`] tags its address space
//! with a [`Pcid`]: installing its root loads CR3 with the
//! PCID and the no-flush bit, so other address spaces' entries survive the
//! switch (SDM Vol. 3A §4.10.1). Since `INVLPG` and MOV to CR3 reach only
//! the current PCID, its flushes follow [`pcid_flush_plan`]: INVPCID for
//! its PCID when it is not current on this CPU, or, without INVPCID, a
//! mark in this CPU's [`PcidCpu`] that makes the next install flush (CR3
//! without the no-flush bit). In an SMP kernel, every CPU that may hold
//! the address space's entries runs the flush (its shootdown handler calls
//! the same method), so each CPU flushes or defers for itself. The
//! kernel's address space, whose half every user space links, takes
//! [`X86Mmu::for_kernel_half`]: its flushes reach every PCID.

use core::arch::asm;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use pgtable_core::contract::{Arch, Mmu, TlbRange};
use pgtable_core::{PhysAddr, VirtAddr};
use x86_64::instructions::tlb::{self, InvPcidCommand};
use x86_64::registers::control::{Cr3, Cr4, Cr4Flags};
use x86_64::structures::paging::PhysFrame;

use crate::flush::{
    flush_plan, full_flush_plan, kernel_flush_plan, pcid_flush_plan, FlushKind, FlushPlan,
    OtherPcid, PcidCpu, PcidFlush,
};
use crate::regs::{
    invpcid_descriptor, Pcid, CPUID_01_ECX_PCID, CPUID_07_EBX_INVPCID, CR4_LA57, CR4_PCIDE,
    CR4_PGE, INVPCID_ADDRESS,
};

// The `x86_64` crate's CR4 flags are the bits `regs` names.
const _: () = assert!(
    Cr4Flags::PAGE_GLOBAL.bits() == CR4_PGE
        && Cr4Flags::L5_PAGING.bits() == CR4_LA57
        && Cr4Flags::PCID.bits() == CR4_PCIDE
);

/// `pcid` of an untagged [`X86Mmu`].
const UNTAGGED: u32 = u32::MAX;
/// `pcid` of an unassigned [`X86Mmu`] ([`X86Mmu::unassigned`]).
const UNASSIGNED: u32 = u32::MAX - 1;

/// The MMU of the executing x86-64 CPU.
///
/// Range flushes use `INVLPG` up to a page ceiling (33 by default, like
/// Linux; changeable at run time with
/// [`set_flush_ceiling`](X86Mmu::set_flush_ceiling)), then one full flush:
/// MOV to CR3 or INVPCID type 1 for the address space
/// ([`Mmu::flush_tlb_mm`]), INVPCID type 2 or a CR4.PGE toggle when global
/// translations must go too ([`Mmu::flush_tlb_all`], and a range flush past
/// the ceiling, which must drop the range's global entries; see
/// [`crate::flush`]).
///
/// These act on the executing CPU only: with more than one CPU, the
/// kernel must wrap them in a shootdown to meet [`Mmu`]'s contract
/// ([`SmpMmu`](crate::SmpMmu)`::new(X86Mmu::new(), &SHOOTDOWN, cpus)`), and
/// its flush IPI handler passes an untagged `X86Mmu` to
/// [`Shootdown::handle_flush_ipi`](crate::Shootdown::handle_flush_ipi).
///
/// A handle is untagged ([`new`](X86Mmu::new): PCID 0, every install
/// flushes the non-global entries) or tagged with a PCID
/// ([`with_pcid`](X86Mmu::with_pcid): installs keep the other PCIDs'
/// entries; flushes of a space that is not current use INVPCID for its
/// PCID or, without INVPCID, are deferred to its next install through the
/// executing CPU's [`PcidCpu`]; see [`pcid_flush_plan`]). With
/// more address spaces than PCIDs, pair it with
/// `pgtable_core::asid::Pcid12Allocator`:
///
/// make each user space's handle with [`X86Mmu::unassigned`] and switch
/// with `AsidAllocator::switch_mm` (`TaggedMmu`: `set_tag` is
/// [`set_pcid`](X86Mmu::set_pcid), `local_flush_all`
/// [`flush_all_pcids`](X86Mmu::flush_all_pcids)):
///
/// ```text
/// // under the allocator's lock, interrupts off:
/// let sw = unsafe { pcids.switch_mm(cpu, &mut ctx, &mut space) }?;
/// ```
#[derive(Debug)]
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub struct X86Mmu {
    ceiling: AtomicU64,
    has_invpcid: bool,
    /// The PCID, or [`UNTAGGED`].
    pcid: AtomicU32,
    /// The executing CPU's PCID state (tagged handles only).
    this_cpu: Option<fn() -> &'static PcidCpu>,
    /// The kernel's address space, shared by every PCID
    /// ([`for_kernel_half`](X86Mmu::for_kernel_half)).
    kernel: bool,
}

impl X86Mmu {
    /// Linux's default `tlb_single_page_flush_ceiling`: the format's
    /// [`Arch::TLB_FLUSH_CEILING`].
    pub const DEFAULT_CEILING: u64 = <crate::X86_64 as Arch>::TLB_FLUSH_CEILING;

    /// An MMU handle with INVPCID used when CPUID reports it.
    pub fn new() -> X86Mmu {
        // SAFETY: `has_invpcid` is what CPUID reports.
        unsafe { X86Mmu::with_features(cpu_has_invpcid()) }
    }

    /// An MMU handle with explicit features.
    ///
    /// # Safety
    ///
    /// `has_invpcid` is true only if the CPU implements INVPCID
    /// (`CPUID.(EAX=07H,ECX=0):EBX[10]` is 1): the flushes then execute it.
    pub const unsafe fn with_features(has_invpcid: bool) -> X86Mmu {
        X86Mmu {
            ceiling: AtomicU64::new(Self::DEFAULT_CEILING),
            has_invpcid,
            pcid: AtomicU32::new(UNTAGGED),
            this_cpu: None,
            kernel: false,
        }
    }

    /// This handle as the MMU of the kernel's address space, whose upper
    /// half user spaces link ([`AddressSpace::new_user`]): with CR4.PCIDE
    /// = 1 its flushes reach every PCID ([`kernel_flush_plan`]: `INVLPG`
    /// for the range's global entries, then INVPCID type 3, or a CR4.PGE
    /// toggle without INVPCID), since `INVLPG` and MOV to CR3 leave other
    /// PCIDs' non-global and paging-structure-cache entries of the kernel
    /// half in place. With PCIDE = 0 nothing changes.
    ///
    /// [`AddressSpace::new_user`]: pgtable_core::AddressSpace::new_user
    pub fn for_kernel_half(mut self) -> X86Mmu {
        self.kernel = true;
        self
    }

    /// An MMU handle for the address space tagged with `pcid`; INVPCID is
    /// used when CPUID reports it. `this_cpu` returns the executing CPU's
    /// [`PcidCpu`] (one per CPU, for the deferred flushes).
    ///
    /// On a CPU with CR4.PCIDE = 0 (no [`enable_pcids`], or a CPU without
    /// PCIDs) the handle installs and flushes as an untagged one: PCIDE is
    /// read at every install and flush, since with PCIDE = 0 the PCID bits
    /// of CR3 would mean PWT/PCD and its no-flush bit is reserved (#GP).
    ///
    /// # Safety
    ///
    /// `this_cpu` returns the executing CPU's state, always the same one
    /// for a CPU (a flush deferred into another CPU's state would be lost).
    /// CR4.PCIDE is not turned on on a CPU while this handle's root is
    /// installed there (the entries cached under PCID 0 would then escape
    /// its flushes; [`enable_pcids`] runs before any tagged install).
    pub unsafe fn with_pcid(pcid: Pcid, this_cpu: fn() -> &'static PcidCpu) -> X86Mmu {
        // SAFETY: `has_invpcid` is what CPUID reports.
        let mut m = unsafe { X86Mmu::with_features(cpu_has_invpcid()) };
        m.pcid = AtomicU32::new(u32::from(pcid.get()));
        m.this_cpu = Some(this_cpu);
        m
    }

    /// A handle for a user address space that has no PCID yet and gets
    /// one at its first `AsidAllocator::switch_mm` (`TaggedMmu`): its
    /// flushes do nothing until then, since no TLB entry can come from
    /// tables that were never installed; installing it directly makes it
    /// untagged (PCID 0, flushing). Otherwise as
    /// [`with_pcid`](Self::with_pcid).
    ///
    /// # Safety
    ///
    /// As for [`with_pcid`](Self::with_pcid).
    pub unsafe fn unassigned(this_cpu: fn() -> &'static PcidCpu) -> X86Mmu {
        // SAFETY: our caller's promise, which is `with_pcid`'s.
        let m = unsafe { X86Mmu::with_pcid(Pcid::ZERO, this_cpu) };
        m.pcid.store(UNASSIGNED, Relaxed);
        m
    }

    /// The PCID the hardware uses for this handle now: its PCID if
    /// CR4.PCIDE = 1 on this CPU, otherwise none (untagged).
    fn live_pcid(&self) -> Option<Pcid> {
        self.pcid().filter(|_| Cr4::read().contains(Cr4Flags::PCID))
    }

    /// Whether the handle is unassigned ([`X86Mmu::unassigned`], not yet
    /// tagged nor installed): its flushes do nothing.
    pub fn is_unassigned(&self) -> bool {
        // Relaxed: see `pcid`.
        self.pcid.load(Relaxed) == UNASSIGNED
    }

    /// The PCID, for a tagged handle.
    pub fn pcid(&self) -> Option<Pcid> {
        // Relaxed: the handle's own value; a switch that changes it is
        // serialised by the caller's allocator lock.
        match self.pcid.load(Relaxed) {
            UNTAGGED | UNASSIGNED => None,
            p => Pcid::new(p as u16).ok(),
        }
    }

    /// Gives a tagged handle the PCID an allocator chose: later flushes
    /// name it and the next install loads it. Call it before installing,
    /// while no CPU runs the address space under its old PCID (an
    /// allocator changes a PCID only after a roll-over). Does nothing on
    /// an untagged handle (it has no per-CPU state to defer flushes in).
    pub fn set_pcid(&self, pcid: Pcid) {
        if self.this_cpu.is_some() {
            // Relaxed: see `pcid`.
            self.pcid.store(u32::from(pcid.get()), Relaxed);
        }
    }

    /// Invalidates the non-global entries of every PCID on this CPU
    /// (INVPCID type 3; without INVPCID a CR4.PGE toggle, which drops the
    /// global ones too) and forgets this CPU's deferred flushes: the local
    /// flush an allocator's roll-over asks for
    /// (`pgtable_core::asid::Switch::flush_local`). Not a shootdown.
    pub fn flush_all_pcids(&self) {
        if self.has_invpcid {
            // SAFETY: INVPCID is supported (the contract of
            // `with_features`); type 3 invalidates TLB entries only.
            unsafe { tlb::flush_pcid(InvPcidCommand::AllExceptGlobal) };
        } else {
            self.execute(FlushPlan::ToggleCr4Pge);
        }
        if let Some(cpu) = self.this_cpu {
            cpu().clear();
        }
    }

    /// A flush of a tagged address space: [`pcid_flush_plan`] for the PCID
    /// current on this CPU.
    fn flush_tagged(&self, kind: FlushKind) {
        self.run(pcid_flush_plan(
            kind,
            self.pcid(),
            current(),
            self.flush_ceiling(),
            self.has_invpcid,
        ));
    }

    /// A flush of the kernel's space: [`kernel_flush_plan`].
    fn flush_kernel(&self, kind: FlushKind) {
        let pcids = Cr4::read().contains(Cr4Flags::PCID);
        self.run(kernel_flush_plan(
            kind,
            self.flush_ceiling(),
            self.has_invpcid,
            pcids,
        ));
    }

    /// Carries out a PCID plan on this CPU.
    fn run(&self, plan: PcidFlush) {
        if let Some(local) = plan.local {
            self.execute(local);
        }
        match plan.other {
            None => {}
            Some(OtherPcid::InvpcidAddress {
                pcid,
                start,
                stride_shift,
                count,
            }) => {
                let mut va = start.0;
                for _ in 0..count {
                    // SAFETY: the plan names INVPCID only when
                    // `has_invpcid`, which `with_features` vouches for.
                    unsafe { invpcid_address(pcid, va) };
                    va = va.wrapping_add(1 << stride_shift);
                }
            }
            Some(OtherPcid::InvpcidSingleContext(pcid)) => {
                // SAFETY: as above.
                unsafe { tlb::flush_pcid(InvPcidCommand::Single(x86_pcid(pcid))) };
            }
            Some(OtherPcid::Defer(pcid)) => {
                if let Some(cpu) = self.this_cpu {
                    cpu().mark_stale(pcid);
                }
            }
            Some(OtherPcid::AllNonGlobal) => self.flush_all_pcids(),
        }
    }

    /// Sets the number of pages past which a range flush becomes a full
    /// flush.
    pub fn set_flush_ceiling(&self, pages: u64) {
        // Relaxed: a tuning knob; no other memory depends on it.
        self.ceiling.store(pages, Relaxed);
    }

    /// The current range-flush ceiling in pages.
    pub fn flush_ceiling(&self) -> u64 {
        // Relaxed: see `set_flush_ceiling`.
        self.ceiling.load(Relaxed)
    }

    /// Whether INVPCID is used.
    pub const fn has_invpcid(&self) -> bool {
        self.has_invpcid
    }

    /// The plan a range flush of `range` follows now.
    pub fn plan(&self, range: TlbRange) -> FlushPlan {
        // The range may hold global entries: past the ceiling the full
        // flush must drop them too.
        flush_plan(range, self.flush_ceiling(), self.has_invpcid, true)
    }

    /// `INVLPG` of the page containing `va` (global entries included).
    ///
    /// `va` is the operand exactly as given: a canonical address of the
    /// active paging mode, 57-bit with CR4.LA57 = 1 (bits 63:56 equal),
    /// 48-bit otherwise (bits 63:47 equal), as every address of an
    /// [`AddressSpace`](pgtable_core::AddressSpace) in the matching format
    /// is. INVLPG of a non-canonical address is a no-op (SDM Vol. 2A,
    /// INVLPG). The `x86_64` crate's `VirtAddr` is not used here: it
    /// canonicalises from bit 47 only, which under 5-level paging would
    /// turn 0x0000_8000_0000_0000 into 0xffff_8000_0000_0000 and leave the
    /// stale translation in place.
    #[inline]
    pub fn flush_page(&self, va: VirtAddr) {
        // SAFETY: INVLPG only invalidates TLB and paging-structure-cache
        // entries; it reads no memory through its operand and never faults
        // in 64-bit mode at CPL 0. No `nomem`: the compiler keeps the entry
        // stores before it (see `flush_tlb_range`).
        unsafe { asm!("invlpg [{}]", in(reg) va.0, options(nostack, preserves_flags)) };
    }

    /// Whether 5-level paging is on (CR4.LA57): use `X86_64La57` then.
    pub fn la57_enabled() -> bool {
        Cr4::read().contains(Cr4Flags::L5_PAGING)
    }

    /// Carries out `plan` on this CPU. An INVPCID plan on an MMU that does
    /// not use INVPCID is carried out without it (a CR3 reload, or a
    /// CR4.PGE toggle for all contexts).
    pub fn execute(&self, plan: FlushPlan) {
        match plan {
            FlushPlan::InvpcidSingleContext if !self.has_invpcid => {
                self.execute(FlushPlan::ReloadCr3)
            }
            FlushPlan::InvpcidAllContexts if !self.has_invpcid => {
                self.execute(FlushPlan::ToggleCr4Pge)
            }
            FlushPlan::PerStride {
                start,
                stride_shift,
                count,
            } => {
                let mut va = start.0;
                for _ in 0..count {
                    self.flush_page(VirtAddr(va));
                    va = va.wrapping_add(1 << stride_shift);
                }
            }
            FlushPlan::ReloadCr3 => {
                // Keep the PCID / PWT / PCD bits: read_raw/write_raw carry
                // the low 12 bits unchanged (bit 63, "no flush", stays 0).
                let (frame, low) = Cr3::read_raw();
                // SAFETY: writes back the root that is already installed.
                unsafe { Cr3::write_raw(frame, low) };
            }
            FlushPlan::InvpcidSingleContext => {
                let pcid = current_pcid();
                // SAFETY: `has_invpcid` is true (checked above), which the
                // contract of `with_features` allows only when the CPU has
                // INVPCID; the PCID is the current one, valid whatever
                // CR4.PCIDE is.
                unsafe { tlb::flush_pcid(InvPcidCommand::Single(pcid)) };
            }
            FlushPlan::InvpcidAllContexts => {
                // SAFETY: as above, INVPCID is supported.
                unsafe { tlb::flush_pcid(InvPcidCommand::All) };
            }
            FlushPlan::ToggleCr4Pge => {
                let cr4 = Cr4::read();
                // SAFETY: flipping PGE and restoring it changes no mapping;
                // each write changes CR4.PGE, and any change of it
                // invalidates all TLB entries of every PCID, global ones
                // included (SDM Vol. 3A §4.10.4.1); with PGE off, setting it
                // first is what makes the pair a change (a CR3 reload would
                // reach the current PCID only). Interrupts between the two
                // writes run with PGE flipped, which changes no translation.
                unsafe {
                    Cr4::write(cr4 ^ Cr4Flags::PAGE_GLOBAL);
                    Cr4::write(cr4);
                }
            }
        }
    }
}

impl Default for X86Mmu {
    fn default() -> Self {
        X86Mmu::new()
    }
}

/// The PCID of the current address space: CR3\[11:0\] with CR4.PCIDE =
/// 1, otherwise 0 (§4.10.1).
fn current_pcid() -> tlb::Pcid {
    if Cr4::read().contains(Cr4Flags::PCID) {
        Cr3::read_pcid().1
    } else {
        x86_pcid(Pcid::ZERO)
    }
}

/// The `x86_64` crate's PCID for `p`.
fn x86_pcid(p: Pcid) -> tlb::Pcid {
    // A `Pcid` is below 4096, which is all `tlb::Pcid::new` checks.
    tlb::Pcid::new(p.get()).unwrap_or_else(|_| unreachable!("a Pcid fits 12 bits"))
}

/// Our PCID of the current address space.
fn current() -> Pcid {
    Pcid::new(current_pcid().value()).unwrap_or(Pcid::ZERO)
}

/// INVPCID type 0 (individual address, non-global) for `pcid` at `va`, with
/// the full 64-bit address (the `x86_64` crate's `VirtAddr` would
/// canonicalise 57-bit addresses from bit 47, see
/// [`X86Mmu::flush_page`]).
///
/// # Safety
///
/// The CPU implements INVPCID.
unsafe fn invpcid_address(pcid: Pcid, va: u64) {
    let desc = invpcid_descriptor(pcid, va);
    // SAFETY: INVPCID only invalidates TLB and paging-structure-cache
    // entries; it reads the 16-byte descriptor, which lives on our stack;
    // the CPU has INVPCID (our caller's promise). Type 0 raises #GP for a
    // non-canonical address; the addresses come from an address space of
    // the active paging mode, which are canonical.
    unsafe {
        asm!("invpcid {0}, [{1}]", in(reg) INVPCID_ADDRESS, in(reg) desc.as_ptr(),
             options(nostack, preserves_flags, readonly))
    };
}

/// Whether the CPU supports PCIDs: `CPUID.01H:ECX.PCID[bit 17]`.
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub fn cpu_has_pcid() -> bool {
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 processor; leaf 1 always.
    let ecx = unsafe { core::arch::x86_64::__cpuid(1) }.ecx;
    ecx & CPUID_01_ECX_PCID != 0
}

/// Sets CR4.PCIDE on this CPU if it supports PCIDs; returns whether
/// PCIDs are on. Run it on every CPU before installing a root of an
/// [`X86Mmu::with_pcid`] handle.
///
/// # Safety
///
/// CR3\[11:0\] is 0 (the root was installed by an untagged handle, or
/// before PCIDs were used); setting PCIDE otherwise raises #GP (SDM Vol.
/// 3A §4.10.1). The CPU is in IA-32e mode (always so for this crate).
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub unsafe fn enable_pcids() -> bool {
    if !cpu_has_pcid() {
        return false;
    }
    let cr4 = Cr4::read();
    if !cr4.contains(Cr4Flags::PCID) {
        // SAFETY: the CPU supports PCIDs (checked), CR3[11:0] = 0 (our
        // caller's promise); PCIDE changes no translation of PCID 0.
        unsafe { Cr4::write(cr4 | Cr4Flags::PCID) };
    }
    true
}

/// `CPUID.(EAX=07H,ECX=0):EBX[10]` (INVPCID), when leaf 7 exists.
fn cpu_has_invpcid() -> bool {
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 processor.
    let max = unsafe { core::arch::x86_64::__cpuid(0) }.eax;
    if max < 7 {
        return false;
    }
    #[allow(unused_unsafe)]
    // SAFETY: as above; leaf 7 exists (checked).
    let ebx = unsafe { core::arch::x86_64::__cpuid_count(7, 0) }.ebx;
    ebx & CPUID_07_EBX_INVPCID != 0
}

// SAFETY: x86 walkers see entry stores in program order (no barrier
// needed); INVLPG, INVPCID and MOV to CR3/CR4 are serializing and complete
// before the next instruction; `flush_tlb_all` and the range fallback drop
// global entries. They reach the executing CPU only, which meets the
// contract on one CPU; an SMP kernel wraps them in its shootdown (type
// docs).
unsafe impl Mmu for X86Mmu {
    /// Nothing to do: x86 has no walker barrier instruction, and a walk
    /// that races a new entry can only see the old not-present one (never
    /// cached, SDM Vol. 3A §4.10.4.3) and fault. See
    /// `Arch::NEEDS_WALKER_BARRIER` of the x86 format.
    #[inline]
    fn walker_barrier(&self) {}

    /// `INVLPG` per stride up to the ceiling, otherwise a full flush.
    /// INVLPG, INVPCID and MOV to CR3/CR4 are serializing instructions
    /// (SDM Vol. 3A "Serializing Instructions"): the entry stores before
    /// them have completed when they execute. Their `asm!` blocks have no
    /// `nomem`, so the compiler does not move stores across them either.
    fn flush_tlb_range(&self, range: TlbRange) {
        if self.is_unassigned() {
            // Never installed: nothing cached (see `TaggedMmu`).
            return;
        }
        if self.kernel {
            return self.flush_kernel(FlushKind::Range(range));
        }
        match self.live_pcid() {
            None => self.execute(self.plan(range)),
            Some(_) => self.flush_tagged(FlushKind::Range(range)),
        }
    }

    fn flush_tlb_all(&self) {
        self.execute(full_flush_plan(self.has_invpcid, true));
    }

    fn flush_tlb_mm(&self) {
        if self.is_unassigned() {
            return;
        }
        if self.kernel {
            return self.flush_kernel(FlushKind::Mm);
        }
        match self.live_pcid() {
            None => self.execute(full_flush_plan(self.has_invpcid, false)),
            Some(_) => self.flush_tagged(FlushKind::Mm),
        }
    }

    /// Untagged (or CR4.PCIDE = 0): MOV to CR3 with the root and PCID 0 / PWT = PCD = 0,
    /// which flushes the non-global entries of PCID 0. Tagged: MOV to CR3
    /// with the root, the PCID and the no-flush bit, unless this CPU owes
    /// the PCID a flush ([`PcidCpu::take_stale`]), then without it.
    unsafe fn install_root(&self, root: PhysAddr) {
        // An unassigned handle installed directly becomes untagged, before
        // any entry of it can exist. Relaxed: see `pcid`.
        let _ = self
            .pcid
            .compare_exchange(UNASSIGNED, UNTAGGED, Relaxed, Relaxed);
        let frame = PhysFrame::containing_address(x86_64::PhysAddr::new_truncate(root.0));
        match (self.live_pcid(), self.this_cpu) {
            (Some(p), Some(cpu)) => {
                if cpu().take_stale(p) {
                    // SAFETY: as below; CR4.PCIDE = 1 (`live_pcid` read
                    // it). The write flushes the PCID's entries.
                    unsafe { Cr3::write_pcid(frame, x86_pcid(p)) };
                } else {
                    // SAFETY: as below; CR4.PCIDE = 1. The PCID's cached
                    // entries are this address space's: every flush of it
                    // on this CPU was carried out or deferred to here.
                    unsafe { Cr3::write_pcid_no_flush(frame, x86_pcid(p)) };
                }
            }
            // SAFETY: the caller guarantees `root` is a complete hierarchy
            // of the active paging mode that maps what the CPU uses next.
            _ => unsafe { Cr3::write_raw(frame, 0) },
        }
    }
}

// SAFETY: `set_tag` stores the PCID that every later flush plans with and
// `install_root` loads into CR3 (on a handle with per-CPU state; with
// CR4.PCIDE = 0 both act untagged, flushing PCID 0 at every install, which
// is as strong); `local_flush_all` is
// `flush_all_pcids` (INVPCID type 3 or a CR4.PGE toggle, serializing, and
// it forgets the deferred flushes it covers); an unassigned handle skips
// its flushes only while it was never installed.
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
unsafe impl pgtable_core::contract::TaggedMmu for X86Mmu {
    fn tag(&self) -> Option<u16> {
        self.pcid().map(Pcid::get)
    }

    /// Refuses a value above 4095 and an untagged handle
    /// ([`X86Mmu::new`]), which has no per-CPU state for deferred flushes.
    fn set_tag(&self, tag: u16) -> Result<(), pgtable_core::asid::AsidError> {
        let bad = pgtable_core::asid::AsidError::Tag(tag);
        let pcid = Pcid::new(tag).map_err(|_| bad)?;
        if self.this_cpu.is_none() {
            return Err(bad);
        }
        self.set_pcid(pcid);
        Ok(())
    }

    /// [`X86Mmu::flush_all_pcids`].
    fn local_flush_all(&self) {
        self.flush_all_pcids()
    }
}
