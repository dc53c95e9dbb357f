//! The x86 MMU operations: TLB maintenance and CR3, on bare metal.
//!
//! Compiled only for `target_arch = "x86_64"`, `target_os = "none"`; the
//! host uses the simulated MMU of `pgtable-core` instead. Registers and
//! INVPCID come from the `x86_64` crate; INVLPG is issued here directly,
//! because that crate's linear addresses are 48-bit (see
//! [`X86Mmu::flush_page`]).
//!
//! These operations act on the executing CPU only. An SMP kernel wraps
//! them in its own shootdown (IPIs to the CPUs that use the address space)
//! to meet the "every CPU" rule of [`Mmu`].

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering::Relaxed};

use pgtable_core::{Arch, Mmu, PhysAddr, TlbRange, VirtAddr};
use x86_64::instructions::tlb::{self, InvPcidCommand, Pcid};
use x86_64::registers::control::{Cr3, Cr4, Cr4Flags};
use x86_64::structures::paging::PhysFrame;

use crate::flush::{flush_plan, full_flush_plan, FlushPlan};

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
/// kernel must wrap them in a shootdown to meet [`Mmu`]'s contract.
#[derive(Debug)]
pub struct X86Mmu {
    ceiling: AtomicU64,
    has_invpcid: bool,
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
            FlushPlan::Invlpg {
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
                // SAFETY: clearing and restoring PGE changes no mapping; any
                // change of CR4.PGE invalidates all TLB entries (SDM Vol. 3A
                // §4.10.4.1). Interrupts between the two writes only run
                // without global translations cached, which is harmless.
                unsafe {
                    Cr4::write(cr4 - Cr4Flags::PAGE_GLOBAL);
                    Cr4::write(cr4);
                }
                if !cr4.contains(Cr4Flags::PAGE_GLOBAL) {
                    // PGE was off: no global entries exist, but the writes
                    // above changed nothing, so reload CR3 for the rest.
                    self.execute(FlushPlan::ReloadCr3);
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

/// The PCID of the current address space: CR3[11:0] with CR4.PCIDE = 1,
/// otherwise 0 (§4.10.1).
fn current_pcid() -> Pcid {
    if Cr4::read().contains(Cr4Flags::PCID) {
        Cr3::read_pcid().1
    } else {
        // 0 is always below 4096.
        match Pcid::new(0) {
            Ok(p) => p,
            Err(_) => unreachable!(),
        }
    }
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
    ebx & (1 << 10) != 0
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
        self.execute(self.plan(range));
    }

    fn flush_tlb_all(&self) {
        self.execute(full_flush_plan(self.has_invpcid, true));
    }

    fn flush_tlb_mm(&self) {
        self.execute(full_flush_plan(self.has_invpcid, false));
    }

    /// MOV to CR3 with the root and PCID 0 / PWT = PCD = 0: flushes the
    /// non-global entries of PCID 0.
    unsafe fn install_root(&self, root: PhysAddr) {
        let frame = PhysFrame::containing_address(x86_64::PhysAddr::new_truncate(root.0));
        // SAFETY: the caller guarantees `root` is a complete hierarchy of
        // the active paging mode that maps what the CPU uses next.
        unsafe { Cr3::write_raw(frame, 0) };
    }
}
