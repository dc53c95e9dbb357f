//! The arm64 MMU operations: barriers, TLB maintenance, installing roots.
//!
//! Compiled only for `target_arch = "aarch64"` (and documented by
//! `cargo doc` on every host, as on docs.rs); host tests use the
//! simulator or a recording [`Mmu`] with the same format. The decisions
//! (which TLBIs for a range) are the pure functions of [`crate::flush`], so
//! the host tests cover them; this module only executes them.
//!
//! Barrier sequences (Arm ARM D8.2 "Translation table walks" ordering and
//! D8.14 "TLB maintenance"; Linux arm64 `tlbflush.h` does the same):
//! - after table writes: `dsb ishst` (the stores reach the inner-shareable
//!   domain, where every walker reads) then `isb` (this CPU's later
//!   instructions are fetched and translated after it);
//! - around TLBIs: `dsb ishst` before (the table writes are visible before
//!   the invalidation, so no walker refills the old entry), `dsb ish` after
//!   (the broadcast invalidation completed on every CPU), `isb` (this CPU
//!   does not use a translation fetched before the completion).

use core::arch::asm;
use core::sync::atomic::{AtomicU32, AtomicU8, Ordering::Relaxed};

use aarch64_cpu::asm::barrier::{dmb, dsb, isb, ISH, ISHST, NSH, NSHST, SY};
use aarch64_cpu::registers::{
    ID_AA64ISAR0_EL1, ID_AA64MMFR0_EL1, ID_AA64MMFR1_EL1, MAIR_EL1, SCTLR_EL1, TCR_EL1, TTBR0_EL1,
    TTBR1_EL1,
};
use pgtable_core::contract::{Mmu, TlbRange};
use pgtable_core::{PhysAddr, VaRange};
use tock_registers::interfaces::{Readable, Writeable};

use crate::flush::{
    flush_plan_for, tlbi_asid_operand, tlbi_range_operand_for, tlbi_range_ops_for,
    tlbi_va_operand_for, FlushPlan, RangeOperand, TlbiOp,
};
use crate::format::Arm64Geometry;
use crate::granule::{pa_range_of_bits, GeometryError, Granule};
use crate::regs::{
    tcr_value, tcr_value_for, tcr_value_for_separate_halves, ttbr0_value, ttbr0_value_52,
    ttbr1_base, Asid, AsidBits, TcrConfig, TcrGeometry, SCTLR_MMU_BITS, SCTLR_MMU_CLEAR,
};
use crate::{Arm64, MAIR_VALUE};

/// 0: not read yet, 1: no FEAT_TLBIRANGE, 2: present.
static TLB_RANGE: AtomicU8 = AtomicU8::new(0);

/// Whether the CPU implements FEAT_TLBIRANGE (ID_AA64ISAR0_EL1.TLB,
/// bits \[59:56\], is 0b0010). Read once and cached.
pub fn has_tlb_range() -> bool {
    // Relaxed: the cached value is the same whoever computes it.
    match TLB_RANGE.load(Relaxed) {
        0 => {
            let tlb = (ID_AA64ISAR0_EL1.get() >> 56) & 0xf;
            let yes = tlb >= 0b0010;
            // Relaxed: see above.
            TLB_RANGE.store(if yes { 2 } else { 1 }, Relaxed);
            yes
        }
        v => v == 2,
    }
}

/// The ASID width this CPU translates with: 16 bits when TCR_EL1.AS is 1
/// (which [`enable_mmu_for`] sets when ID_AA64MMFR0_EL1.ASIDBits reports
/// 16-bit ASIDs), otherwise 8. Size an ASID allocator with
/// [`AsidBits::bits`] of it and check its ASIDs with [`Asid::new`].
pub fn asid_bits() -> AsidBits {
    if TCR_EL1.get() & (1 << 36) != 0 {
        AsidBits::Bits16
    } else {
        AsidBits::Bits8
    }
}

/// Invalidates every stage 1 EL1&0 translation of *this CPU only*, all
/// ASIDs and global ones (`tlbi vmalle1`), and waits for it (`dsb nsh;
/// isb`): the local flush an ASID allocator asks for after a roll-over
/// (`pgtable_core::asid::Switch::flush_local`; Linux
/// `local_flush_tlb_all`). Not a shootdown.
pub fn local_flush_tlb_all() {
    // Earlier table writes are visible to this CPU's walker first.
    dsb(NSHST);
    // SAFETY: TLB invalidation has no memory effects Rust can see.
    unsafe { asm!("tlbi vmalle1", options(nostack, preserves_flags)) };
    // The local invalidation completed…
    dsb(NSH);
    // …before this CPU translates anything else.
    isb(SY);
}

/// `asid` of an untagged [`Arm64Mmu`].
const UNTAGGED: u32 = u32::MAX;
/// `asid` of an unassigned [`Arm64Mmu`] ([`Arm64Mmu::unassigned`]).
const UNASSIGNED: u32 = u32::MAX - 1;

/// The arm64 [`Mmu`]: real barriers and inner-shareable TLB maintenance.
///
/// A *tagged* handle carries its address space's ASID (Arm ARM D8 "The
/// AArch64 Virtual Memory System Architecture", "Address Space
/// Identifiers"; its non-global leaves must be nG): its range flushes are
/// `tlbi vae1is` / `vale1is` / `rvae1is` / `rvale1is` with the ASID in
/// operand bits \[63:48\] (they also drop global entries of the range),
/// [`Mmu::flush_tlb_mm`] is `tlbi aside1is` (that ASID's non-global
/// entries), [`Mmu::flush_tlb_all`] `tlbi vmalle1is`, and
/// [`Mmu::install_root`] writes TTBR0_EL1 with the ASID
/// ([`ttbr0_value`]) and **does not flush**: other address spaces' entries
/// stay tagged with their ASIDs. An *untagged* handle ([`Arm64Mmu::new`])
/// uses ASID 0 for everything and flushes the whole TLB when it installs
/// a root.
///
/// With more address spaces than ASIDs, make each user space's handle
/// with [`Arm64Mmu::unassigned`], give the space a
/// `pgtable_core::asid::AsidContext` and switch with
/// `AsidAllocator::switch_mm` of an allocator sized by [`asid_bits`]
/// (`TaggedMmu`: `set_tag` checks the ASID against [`asid_bits`],
/// `local_flush_all` is [`local_flush_tlb_all`]):
///
/// ```text
/// // under the allocator's lock, interrupts off:
/// let sw = unsafe { asids.switch_mm(cpu, &mut ctx, &mut space) }?;
/// ```
#[derive(Debug)]
pub struct Arm64Mmu {
    /// The ASID, or [`UNTAGGED`].
    asid: AtomicU32,
    /// The half whose TTBR [`Mmu::install_root`] writes.
    half: VaRange,
    /// Flushes use the non-broadcast TLBIs ([`Arm64Mmu::local_only`]).
    local: bool,
    /// The geometry the flushes and TTBR writes are for
    /// ([`Arm64Mmu::for_format`]).
    geo: MmuGeometry,
}

/// What an [`Arm64Mmu`] knows of its format: the granule of its TLBI
/// operands, TCR_EL1.DS for range operands, the TTBR layout of 52-bit
/// roots and the offset of a shared root's high half.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct MmuGeometry {
    granule: Granule,
    ds: bool,
    oa52: bool,
    /// Bytes from a root to the first entry of its high half.
    high_half: u64,
}

impl MmuGeometry {
    /// [`Arm64`](crate::Arm64): 4 KiB pages, DS = 0, 48-bit roots.
    const K4: MmuGeometry = MmuGeometry {
        granule: Granule::K4,
        ds: false,
        oa52: false,
        high_half: 256 * 8,
    };

    const fn of<F: Arm64Geometry>() -> MmuGeometry {
        MmuGeometry {
            granule: F::GRANULE,
            ds: F::DS,
            oa52: F::OA52,
            high_half: (pgtable_core::contract::level::top_entries::<F>() as u64 / 2) * 8,
        }
    }

    /// The TTBR0_EL1 value for `root` and `asid`: the 52-bit BADDR layout
    /// for 52-bit formats ([`ttbr0_value_52`]), else [`ttbr0_value`].
    fn ttbr(self, root: u64, asid: Asid) -> u64 {
        if self.oa52 {
            // A root of the allocator is page aligned and below 2^52; the
            // 48-bit layout is the fallback for anything else.
            ttbr0_value_52(root, asid).unwrap_or(ttbr0_value(root, asid))
        } else {
            ttbr0_value(root, asid)
        }
    }
}

impl Clone for Arm64Mmu {
    /// A handle with the same ASID (now) and half.
    fn clone(&self) -> Self {
        Arm64Mmu {
            // Relaxed: the handle's own value; the switch that sets it is
            // serialised by the caller's ASID lock.
            asid: AtomicU32::new(self.asid.load(Relaxed)),
            half: self.half,
            local: self.local,
            geo: self.geo,
        }
    }
}

impl Arm64Mmu {
    /// An MMU for an address space of global mappings (or ASID 0): full
    /// flushes are `TLBI VMALLE1IS`; roots go to both TTBRs
    /// ([`VaRange::Both`]; [`installing_into`](Self::installing_into) for
    /// one half).
    pub const fn new() -> Arm64Mmu {
        Arm64Mmu {
            asid: AtomicU32::new(UNTAGGED),
            half: VaRange::Both,
            local: false,
            geo: MmuGeometry::K4,
        }
    }

    /// An MMU for a user address space that has no ASID yet and gets one
    /// at its first `AsidAllocator::switch_mm` (`TaggedMmu`): its flushes
    /// do nothing until then, since no TLB entry can come from tables that
    /// were never installed; installing it directly makes it untagged.
    /// Otherwise as [`with_asid16`](Self::with_asid16) (TTBR0_EL1).
    pub const fn unassigned() -> Arm64Mmu {
        Arm64Mmu {
            asid: AtomicU32::new(UNASSIGNED),
            half: VaRange::Lower,
            local: false,
            geo: MmuGeometry::K4,
        }
    }

    /// An MMU for the address space tagged with the 8-bit `asid` (fits
    /// every CPU): see [`with_asid16`](Self::with_asid16).
    pub const fn with_asid(asid: u8) -> Arm64Mmu {
        Arm64Mmu::with_asid16(Asid::from_u8(asid))
    }

    /// An MMU for the address space tagged with `asid` (checked against
    /// the CPU's width by [`Asid::new`]): full flushes are `TLBI
    /// ASIDE1IS`; the root goes to TTBR0_EL1 with the ASID in bits
    /// \[63:48\], without a flush ([`VaRange::Lower`]: a user space's).
    pub const fn with_asid16(asid: Asid) -> Arm64Mmu {
        Arm64Mmu {
            asid: AtomicU32::new(asid.get() as u32),
            half: VaRange::Lower,
            local: false,
            geo: MmuGeometry::K4,
        }
    }

    /// The same MMU, installing roots into the TTBR of `half`:
    ///
    /// - [`VaRange::Lower`]: TTBR0_EL1 only (with the ASID), for a
    ///   [`VaRange::Lower`] space (a user space from `new_user`);
    /// - [`VaRange::Upper`]: TTBR1_EL1 only, at the root itself, for a
    ///   [`VaRange::Upper`] space (the kernel's, from `new_kernel`), which
    ///   translates the whole `[2^64 - 2^VA_BITS, 2^64)` through its 512
    ///   entries (TCR_EL1 from [`tcr_value_separate_halves`](crate::tcr_value_separate_halves), as
    ///   [`enable_mmu_separate_halves`] sets);
    /// - [`VaRange::Both`]: TTBR0_EL1 at the root and TTBR1_EL1 at its
    ///   high half ([`ttbr1_base`]), one root for
    ///   both halves (TCR_EL1 from [`tcr_value`], as [`enable_mmu_for`]
    ///   sets).
    ///
    /// [`Mmu::installs_into`] reports it, and `AddressSpace::new_in`
    /// (`new_kernel`, `new_user`) refuses an MMU of another half than the
    /// space's.
    pub const fn installing_into(self, half: VaRange) -> Arm64Mmu {
        Arm64Mmu { half, ..self }
    }

    /// The same MMU, flushing the executing CPU only: the TLBIs without
    /// the Inner Shareable `is` suffix (`tlbi vae1`, `vale1`, `aside1`,
    /// `vmalle1`), framed by `dsb nshst` / `dsb nsh` instead of the `ish`
    /// barriers, as Linux `local_flush_tlb_all` does. Range TLBIs
    /// (FEAT_TLBIRANGE) are not used: a range is flushed per stride up to
    /// the ceiling, then fully.
    ///
    /// Opt-in, for an address space known to be live on this CPU alone
    /// (one never installed elsewhere: a per-CPU space, early boot before
    /// the secondary CPUs start). Anywhere else it breaks the [`Mmu`]
    /// rule that a flush reaches every CPU (Arm ARM D8.14: only the
    /// broadcast forms affect other PEs of the Inner Shareable domain),
    /// and a translation another CPU cached stays usable after the
    /// operation returns. The barriers after table writes stay `ish`:
    /// the walkers of other CPUs still read the tables.
    pub const fn local_only(self) -> Arm64Mmu {
        Arm64Mmu {
            local: true,
            ..self
        }
    }

    /// The same MMU for address spaces of the arm64 format `F`: its TLBIs
    /// use `F`'s granule (by-VA operands with the bits below the page
    /// clear, range operands with TG of the granule and, with FEAT_LPA2,
    /// BaseADDR in 64 KiB units: [`tlbi_va_operand_for`],
    /// [`tlbi_range_operand_for`], [`tlbi_range_ops_for`]), its range
    /// flushes are planned with [`flush_plan_for`] (the per-stride ceiling
    /// is one table's entries, Linux `MAX_DVM_OPS`), TTBRs get the 52-bit
    /// BADDR layout for 52-bit formats ([`ttbr0_value_52`]), and a shared
    /// root's high half ([`VaRange::Both`]) is half of `F`'s root entries
    /// on. Every constructor starts with [`Arm64`].
    ///
    /// [`VaRange::Both`] needs [`Arm64Format::SHARED_ROOT`](crate::Arm64Format::SHARED_ROOT)
    /// (not 16 KiB with 48 bits); use separate halves otherwise.
    ///
    /// The handle does not carry its format in its type: an MMU built for
    /// one geometry and used with an address space of another flushes the
    /// wrong operands (too few pages, or none of the granule's), so build
    /// each space's MMU with its own format.
    pub const fn for_format<F: Arm64Geometry>(self) -> Arm64Mmu {
        Arm64Mmu {
            geo: MmuGeometry::of::<F>(),
            ..self
        }
    }

    /// The granule the TLBIs are issued for.
    pub const fn granule(&self) -> Granule {
        self.geo.granule
    }

    /// Whether flushes reach the executing CPU only.
    pub const fn is_local_only(&self) -> bool {
        self.local
    }

    /// Before a TLBI: the entry writes are visible to the walkers the
    /// TLBI reaches (every CPU, or this one).
    fn pre_tlbi(&self) {
        if self.local {
            dsb(NSHST);
        } else {
            dsb(ISHST);
        }
    }

    /// After the TLBIs: they completed where they reach, and this CPU uses
    /// no translation fetched before.
    fn post_tlbi(&self) {
        if self.local {
            dsb(NSH);
        } else {
            dsb(ISH);
        }
        isb(SY);
    }

    /// `tlbi vmalle1is`, or `vmalle1` when local.
    fn tlbi_all(&self) {
        if self.local {
            // SAFETY: TLB invalidation has no memory effects Rust can see.
            unsafe { asm!("tlbi vmalle1", options(nostack, preserves_flags)) };
        } else {
            // SAFETY: as above.
            unsafe { asm!("tlbi vmalle1is", options(nostack, preserves_flags)) };
        }
    }

    /// The ASID the flushes name (`None`: untagged, ASID 0 and full
    /// flushes).
    pub fn asid(&self) -> Option<Asid> {
        // Relaxed: see `Clone`.
        match self.asid.load(Relaxed) {
            UNTAGGED | UNASSIGNED => None,
            // Stored from an `Asid`: any 16-bit value is one.
            a => Asid::new(a as u16, AsidBits::Bits16).ok(),
        }
    }

    /// Gives the handle the ASID an allocator chose (tagging it if it was
    /// not): later flushes name it and the next install writes it. Call it
    /// before [`Mmu::install_root`], on the CPU that switches, while no
    /// other CPU runs the address space under its old ASID (an allocator
    /// changes an ASID only after a roll-over, when no CPU does).
    pub fn set_asid(&self, asid: Asid) {
        // Relaxed: see `Clone`.
        self.asid.store(u32::from(asid.get()), Relaxed);
    }

    /// Whether the handle is unassigned ([`Arm64Mmu::unassigned`], not yet
    /// tagged nor installed): its flushes do nothing.
    pub fn is_unassigned(&self) -> bool {
        // Relaxed: see `Clone`.
        self.asid.load(Relaxed) == UNASSIGNED
    }

    /// The ASID operand value (0 for an untagged handle).
    fn asid16(&self) -> u16 {
        self.asid().map_or(0, Asid::get)
    }

    fn tlbi_page(&self, va: u64, last_level: bool) {
        let x = tlbi_va_operand_for(self.geo.granule, va, self.asid16(), 0);
        if self.local {
            if last_level {
                // SAFETY: TLB invalidation has no memory effects Rust can see.
                unsafe { asm!("tlbi vale1, {}", in(reg) x, options(nostack, preserves_flags)) };
            } else {
                // SAFETY: as above.
                unsafe { asm!("tlbi vae1, {}", in(reg) x, options(nostack, preserves_flags)) };
            }
        } else if last_level {
            // SAFETY: TLB invalidation has no memory effects Rust can see.
            unsafe { asm!("tlbi vale1is, {}", in(reg) x, options(nostack, preserves_flags)) };
        } else {
            // SAFETY: as above.
            unsafe { asm!("tlbi vae1is, {}", in(reg) x, options(nostack, preserves_flags)) };
        }
    }

    fn tlbi_range(&self, op: TlbiOp, last_level: bool) {
        match op {
            TlbiOp::Page { page } => {
                self.tlbi_page(page << self.geo.granule.page_shift(), last_level)
            }
            TlbiOp::Range { scale, num, base } => {
                let geo = self.geo;
                let x = tlbi_range_operand_for(
                    geo.granule,
                    geo.ds,
                    RangeOperand {
                        base_page: base,
                        scale,
                        num,
                        asid: self.asid16(),
                        ttl: 0,
                    },
                );
                // `sys` encodings (op1 = 0, CRn = c8, CRm = c2) so no
                // assembler support for FEAT_TLBIRANGE is needed:
                // op2 = 5 is TLBI RVALE1IS, op2 = 1 is TLBI RVAE1IS.
                if last_level {
                    // SAFETY: as above; only issued when the CPU has it.
                    unsafe {
                        asm!("sys #0, c8, c2, #5, {}", in(reg) x, options(nostack, preserves_flags))
                    };
                } else {
                    // SAFETY: as above.
                    unsafe {
                        asm!("sys #0, c8, c2, #1, {}", in(reg) x, options(nostack, preserves_flags))
                    };
                }
            }
        }
    }

    /// Invalidates this address space's entries: its ASID's (global ones
    /// stay), or everything for an untagged space.
    fn tlbi_mm(&self) {
        match self.asid() {
            Some(asid) if self.local => {
                let x = tlbi_asid_operand(asid.get());
                // SAFETY: as above.
                unsafe { asm!("tlbi aside1, {}", in(reg) x, options(nostack, preserves_flags)) };
            }
            Some(asid) => {
                let x = tlbi_asid_operand(asid.get());
                // SAFETY: as above.
                unsafe { asm!("tlbi aside1is, {}", in(reg) x, options(nostack, preserves_flags)) };
            }
            None => self.tlbi_all(),
        }
    }
}

// SAFETY: `set_tag` stores the ASID that every later flush names and
// `install_root` writes to TTBR0_EL1; `local_flush_all` is `tlbi vmalle1`
// waited for with `dsb nsh; isb`; an unassigned handle skips its flushes
// only while it was never installed (`install_root` makes it untagged).
unsafe impl pgtable_core::contract::TaggedMmu for Arm64Mmu {
    fn tag(&self) -> Option<u16> {
        self.asid().map(Asid::get)
    }

    /// Refuses an ASID wider than [`asid_bits`] (TCR_EL1.AS): the CPU
    /// would drop its upper bits and two spaces would share an ASID.
    fn set_tag(&self, tag: u16) -> Result<(), pgtable_core::asid::AsidError> {
        let asid =
            Asid::new(tag, asid_bits()).map_err(|_| pgtable_core::asid::AsidError::Tag(tag))?;
        self.set_asid(asid);
        Ok(())
    }

    /// [`local_flush_tlb_all`].
    fn local_flush_all(&self) {
        local_flush_tlb_all()
    }
}

impl Default for Arm64Mmu {
    fn default() -> Self {
        Arm64Mmu::new()
    }
}

// SAFETY: barriers are `dsb ishst; isb`; every invalidation is the
// inner-shareable broadcast form (`…is`) completed by `dsb ish`, so it has
// reached every CPU of the inner-shareable domain when the flush returns;
// `flush_tlb_all` is `vmalle1is` (global entries included). A `local_only`
// handle reaches the executing CPU only, which meets the contract for the
// spaces it is documented for (live on that CPU alone).
unsafe impl Mmu for Arm64Mmu {
    #[inline]
    fn walker_barrier(&self) {
        // Table stores complete in the inner-shareable domain (all walkers)…
        dsb(ISHST);
        // …before this CPU executes anything that could walk them.
        isb(SY);
    }

    #[inline]
    fn publish_barrier(&self) {
        // Linux `smp_wmb()` before `pmd_populate`: the new table's zeroing
        // and entries are observed by every walker in the inner-shareable
        // domain before the store that links it.
        dmb(ISHST);
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        if self.is_unassigned() {
            // Never installed: nothing cached (see `TaggedMmu`).
            return;
        }
        // Local handles have no non-broadcast range TLBIs here.
        let plan = flush_plan_for(self.geo.granule, range, has_tlb_range() && !self.local);
        // Entry writes reach every walker the TLBIs reach before them.
        self.pre_tlbi();
        match plan {
            // A range flush must drop global entries in the range too, so
            // its full-flush fallback is the one that includes them.
            FlushPlan::All => self.tlbi_all(),
            FlushPlan::PerStride {
                start,
                count,
                stride_shift,
                last_level,
            } => {
                for i in 0..count {
                    self.tlbi_page(start.0.wrapping_add(i << stride_shift), last_level);
                }
            }
            FlushPlan::Range {
                start_page,
                pages,
                last_level,
            } => {
                for op in tlbi_range_ops_for(self.geo.granule, self.geo.ds, start_page, pages) {
                    self.tlbi_range(op, last_level);
                }
            }
        }
        // The invalidation completed on every CPU it reaches (all of them
        // for the broadcast form), and this CPU uses no translation
        // fetched before that.
        self.post_tlbi();
    }

    fn flush_tlb_all(&self) {
        // As in `flush_tlb_range`.
        self.pre_tlbi();
        self.tlbi_all();
        self.post_tlbi();
    }

    fn flush_tlb_mm(&self) {
        if self.is_unassigned() {
            return;
        }
        // As in `flush_tlb_range`.
        self.pre_tlbi();
        self.tlbi_mm();
        self.post_tlbi();
    }

    /// Writes the TTBRs. Tagged: TTBR0_EL1 gets the root and the ASID in
    /// one write, no flush (the ASID's entries are this address space's:
    /// an allocator hands an ASID to another space only after a roll-over
    /// and the local flush it reports). Untagged: the whole TLB is
    /// flushed, since every root shares ASID 0.
    unsafe fn install_root(&self, root: PhysAddr) {
        // An unassigned handle installed directly becomes untagged, before
        // any entry of it can exist. Relaxed: see `Clone`.
        let _ = self
            .asid
            .compare_exchange(UNASSIGNED, UNTAGGED, Relaxed, Relaxed);
        // The tables are complete in memory before a walk can start there.
        dsb(ISHST);
        let asid = self.asid();
        let geo = self.geo;
        let ttbr0 = geo.ttbr(root.0, asid.unwrap_or(Asid::from_u8(0)));
        let untagged = |root: u64| geo.ttbr(root, Asid::from_u8(0));
        match self.half {
            VaRange::Lower => TTBR0_EL1.set(ttbr0),
            VaRange::Upper => TTBR1_EL1.set(untagged(root.0)),
            VaRange::Both => {
                TTBR0_EL1.set(ttbr0);
                TTBR1_EL1.set(untagged(root.0 + geo.high_half));
            }
        }
        // The new base takes effect for the following instructions.
        isb(SY);
        if asid.is_none() {
            // Translations cached for an earlier root under ASID 0 go.
            self.flush_tlb_all();
        }
    }

    /// The half set by [`Arm64Mmu::installing_into`] (or the
    /// constructor's: both for [`Arm64Mmu::new`], the lower one for
    /// [`Arm64Mmu::with_asid16`]).
    #[inline]
    fn installs_into(&self) -> Option<VaRange> {
        Some(self.half)
    }
}

/// Installs the register values the format assumes and turns the MMU on,
/// for the arm64 format `F` (any [`Arm64Format`](crate::Arm64Format)
/// whose root can serve both halves), with `root` in TTBR0_EL1 and its
/// high half in TTBR1_EL1.
///
/// MAIR_EL1 = [`MAIR_VALUE`]; TCR_EL1 = [`tcr_value_for`] with `F`'s
/// granule (TG0 / TG1), TCR_EL1.DS for the FEAT_LPA2 formats, the CPU's
/// PARange (at most the format's [`Format::PA_BITS`](pgtable_core::contract::Format::PA_BITS)), HA/HD set when
/// ID_AA64MMFR1_EL1.HAFDBS reports access-flag (0b0001) / dirty-state
/// (0b0010) management, and AS (16-bit ASIDs) when
/// ID_AA64MMFR0_EL1.ASIDBits reports them; TTBRs in the 52-bit BADDR
/// layout for 52-bit formats; the local TLB is invalidated; SCTLR_EL1 gets
/// M, C and I and loses A and WXN. Returns the TCR value written; for
/// [`Arm64`] and [`Arm64Va39`](crate::Arm64Va39) it is [`tcr_value`]'s.
/// The caller checks first that the CPU has the granule and 52-bit
/// support ([`check_geometry`](crate::check_geometry)).
///
/// # Errors
///
/// [`GeometryError::NoSharedRoot`] for 16 KiB with 48 bits (use
/// [`enable_mmu_separate_halves`]), before any register is written.
///
/// # Safety
///
/// Must run at EL1 with the MMU off. `root` must be a complete table
/// hierarchy in format `F` that maps (identity, or as the caller arranges)
/// the code executing this function and everything the CPU touches next,
/// and must stay alive while installed.
pub unsafe fn enable_mmu_for<F: Arm64Geometry>(root: PhysAddr) -> Result<u64, GeometryError> {
    if !F::SHARED_ROOT {
        return Err(GeometryError::NoSharedRoot {
            granule: F::GRANULE,
            va_bits: F::VA_BITS,
        });
    }
    let tcr = tcr_value_for(this_cpu_tcr_geometry::<F>())?;
    let geo = MmuGeometry::of::<F>();
    let (ttbr0, ttbr1) = (
        geo.ttbr(root.0, Asid::from_u8(0)),
        geo.ttbr(root.0 + geo.high_half, Asid::from_u8(0)),
    );
    // SAFETY: our caller's contract; TTBR1_EL1 walks the root's high half.
    unsafe { turn_mmu_on(tcr, ttbr0, ttbr1) };
    Ok(tcr)
}

/// The TCR settings for format `F` on this CPU: its granule and DS, its
/// PARange capped at `F::PA_BITS`, HA/HD per ID_AA64MMFR1_EL1.HAFDBS and
/// 16-bit ASIDs per ID_AA64MMFR0_EL1.ASIDBits.
fn this_cpu_tcr_geometry<F: Arm64Geometry>() -> TcrGeometry {
    let mmfr0 = ID_AA64MMFR0_EL1.get();
    let hafdbs = ID_AA64MMFR1_EL1.get() & 0xf;
    let max = pa_range_of_bits(F::PA_BITS).unwrap_or(crate::regs::PARANGE_48);
    TcrGeometry {
        cfg: TcrConfig {
            va_bits: F::VA_BITS,
            ttbr1: true,
            pa_range: (mmfr0 & 0xf).min(max),
            hw_access_flag: hafdbs >= 1,
            hw_dirty: hafdbs >= 2,
            asid16: AsidBits::from_mmfr0(mmfr0) == AsidBits::Bits16,
        },
        granule: F::GRANULE,
        ds: F::DS,
    }
}

/// Writes MAIR_EL1, TCR_EL1 = `tcr` and both TTBRs, invalidates the
/// local TLB and sets SCTLR_EL1.M (with C and I; A and WXN clear).
///
/// # Safety
///
/// As [`enable_mmu_for`], for the TTBR values `ttbr0` and `ttbr1`.
unsafe fn turn_mmu_on(tcr: u64, ttbr0: u64, ttbr1: u64) {
    MAIR_EL1.set(MAIR_VALUE);
    TCR_EL1.set(tcr);
    TTBR0_EL1.set(ttbr0);
    TTBR1_EL1.set(ttbr1);
    // Table writes and the register writes are complete before the TLB
    // invalidation and the enable.
    dsb(ISH);
    isb(SY);
    // SAFETY: local TLB invalidation; stale entries from before are gone.
    unsafe { asm!("tlbi vmalle1", options(nostack, preserves_flags)) };
    // The local invalidation completed before the enable.
    dsb(NSH);
    isb(SY);
    let sctlr = (SCTLR_EL1.get() | SCTLR_MMU_BITS) & !SCTLR_MMU_CLEAR;
    SCTLR_EL1.set(sctlr);
    // Instructions after this one are translated.
    isb(SY);
}

/// [`enable_mmu_for`] with the 48-bit [`Arm64`] format: TCR_EL1 =
/// [`tcr_value`] (which [`tcr_value_for`] gives for it, bit for bit).
///
/// # Safety
///
/// As [`enable_mmu_for`].
pub unsafe fn enable_mmu(root: PhysAddr) -> u64 {
    let tcr = tcr_value(this_cpu_tcr_geometry::<Arm64>().cfg);
    // SAFETY: the caller upholds the contract of `enable_mmu_for`;
    // TTBR1_EL1 walks the root's high half.
    unsafe { turn_mmu_on(tcr, root.0, ttbr1_base(root.0)) };
    tcr
}

/// Turns the MMU on with separate roots for the two halves, as Linux runs
/// arm64: `lower` (a [`VaRange::Lower`]
/// space) in TTBR0_EL1 for `[0, 2^VA_BITS)` and `upper` (a
/// [`VaRange::Upper`] space, e.g. from
/// `AddressSpace::new_kernel`) in TTBR1_EL1 for `[2^64 - 2^VA_BITS, 2^64)`,
/// each through all entries of its root, for any arm64 format `F`.
///
/// Everything else is as in [`enable_mmu_for`], except TCR_EL1 =
/// [`tcr_value_for_separate_halves`] (T0SZ = T1SZ = 64 - VA_BITS). Returns
/// the TCR value written. Switch user spaces afterwards with an MMU
/// installing into [`VaRange::Lower`], and the kernel's with
/// [`VaRange::Upper`] ([`Arm64Mmu::installing_into`], with
/// [`Arm64Mmu::for_format`]).
///
/// # Errors
///
/// None for the formats of this crate (their geometries are all valid);
/// a [`GeometryError`] from [`tcr_value_for_separate_halves`] otherwise,
/// before any register is written.
///
/// # Safety
///
/// As [`enable_mmu_for`], for both roots: together they must map the code
/// executing this function and everything the CPU touches next, and both
/// must stay alive while installed.
pub unsafe fn enable_mmu_separate_halves<F: Arm64Geometry>(
    lower: PhysAddr,
    upper: PhysAddr,
) -> Result<u64, GeometryError> {
    let tcr = tcr_value_for_separate_halves(this_cpu_tcr_geometry::<F>())?;
    let geo = MmuGeometry::of::<F>();
    let (ttbr0, ttbr1) = (
        geo.ttbr(lower.0, Asid::from_u8(0)),
        geo.ttbr(upper.0, Asid::from_u8(0)),
    );
    // SAFETY: our caller's contract.
    unsafe { turn_mmu_on(tcr, ttbr0, ttbr1) };
    Ok(tcr)
}
