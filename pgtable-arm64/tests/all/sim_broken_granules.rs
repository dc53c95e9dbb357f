//! Broken variants of the arm64 geometries, each caught, with the correct
//! variant beside it passing: the three bug classes a simulator that takes
//! its answers from the library could not see.
//!
//! - **TLBI operands.** The simulator's own [`SimMmu`] flushes by the
//!   library's [`TlbRange`], so a wrong translation granule (TG) or wrong
//!   units in the TLBI operands an [`Arm64Mmu`](pgtable_arm64::Arm64Mmu)
//!   would issue never reach it. [`TlbiMmu`] turns every range flush into
//!   those operands (the pure functions of `pgtable_arm64::flush`, as
//!   `Arm64Mmu::flush_tlb_range` calls them), decodes each one as the
//!   hardware does, by the Arm ARM's field layouts written out here ("TLBI
//!   VAE1IS", "TLBI RVAE1IS"), and flushes from the simulated TLB only what
//!   the decoded operands cover. A range TLBI whose TG is not the granule
//!   of the translations invalidates nothing (the architecture "does not
//!   require that the instruction invalidates any entries"), and with
//!   TCR_EL1.DS = 1 its BaseADDR is in 64 KiB units; operands made for
//!   another geometry then leave stale translations the simulator's check
//!   reports.
//! - **Output-address split.** The simulated walker decodes entries with
//!   the format's own `decode`, so a format whose encoding and decoding
//!   agree on putting OA\[51:48\] (or OA\[51:50\]) in the wrong descriptor
//!   bits passes unseen there. [`arm_decode`] is a decoder written from the
//!   Arm ARM (D8.3 "Translation table descriptor formats") that knows of
//!   the format only its page shift, VA bits and PA bits (what TCR_EL1 is
//!   programmed from); given to the simulator
//!   (`SimMachine::set_hw_decoder`) it makes the check name the first entry
//!   the hardware reads at another address than the format means, and
//!   [`hw_walk`], a whole walk of the tables with it, sees the mapping
//!   there too.
//! - **Level count.** `Arm64Format::LEVELS` is computed from the page shift
//!   and VA bits, and `level::check` refuses, at compile time, any format
//!   whose level count disagrees with them, so a format with one level too
//!   few cannot be built into an address space. What is tested instead: the
//!   simulator walks, on every geometry, the number of levels the hardware
//!   derives from (page shift, VA bits) alone, and the constant check says
//!   no to a format with one level fewer.

use std::cell::RefCell;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use pgtable_arm64::flush::{
    flush_plan_for, tlbi_range_operand_for, tlbi_range_ops_for, tlbi_va_operand_for, FlushPlan,
    RangeOperand, TlbiOp,
};
use pgtable_arm64::granule::Granule;
use pgtable_arm64::{
    Arm64, Arm64Geometry, Arm64K16, Arm64K16Lpa2, Arm64K16Va36, Arm64K16Va47, Arm64K64,
    Arm64K64Va42, Arm64K64Va52, Arm64Lpa2, Arm64Va39,
};
use pgtable_core::contract::{
    generic, level, Access, AccessFault, Arch, Decoded, Format, Mmu, Slot, Table, TableAlloc,
    TableAttrs, TlbRange,
};
use pgtable_core::sim::{CheckError, Installed, SimAlloc, SimFaultKind, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, MapOptions, MoveOptions, PhysAddr, Prot, VaRange, VirtAddr};

// ----- the hardware's side of TLB maintenance -----

/// How an MMU encodes its TLBIs: the granule and TCR_EL1.DS it was built
/// for (`Arm64Mmu::for_format`), and whether the CPU has FEAT_TLBIRANGE.
#[derive(Clone, Copy, Debug)]
struct Encoding {
    granule: Granule,
    ds: bool,
    has_range: bool,
}

impl Encoding {
    /// What `Arm64Mmu::new().for_format::<F>()` encodes with.
    fn of<F: Arm64Geometry>(has_range: bool) -> Encoding {
        Encoding {
            granule: F::GRANULE,
            ds: F::DS,
            has_range,
        }
    }
}

/// The translation regime the hardware runs a format's tables with, from
/// the format's page shift, VA bits and PA bits alone (what TCR_EL1.TG0,
/// T0SZ, DS and IPS are programmed from), never from its encodings.
#[derive(Clone, Copy, Debug)]
struct Regime {
    page_shift: u32,
    va_bits: u32,
    /// TCR_EL1.DS = 1: FEAT_LPA2, 52-bit output addresses with 4 or 16 KiB.
    ds: bool,
    /// FEAT_LPA with 64 KiB pages: 52-bit output addresses, DS RES0.
    lpa_64k: bool,
}

impl Regime {
    fn of<A: Format>() -> Regime {
        let oa52 = A::PA_BITS == 52;
        Regime {
            page_shift: A::PAGE_SHIFT,
            va_bits: A::VA_BITS,
            ds: oa52 && A::PAGE_SHIFT != 16,
            lpa_64k: oa52 && A::PAGE_SHIFT == 16,
        }
    }

    /// TG\[47:46\] of a range TLBI for this granule ("TLBI RVAE1IS", TG):
    /// 0b01 4 KiB, 0b10 16 KiB, 0b11 64 KiB.
    fn tg(self) -> u64 {
        match self.page_shift {
            12 => 0b01,
            14 => 0b10,
            _ => 0b11,
        }
    }

    /// Lookup levels: each level resolves `page_shift - 3` bits above the
    /// page offset, the initial one what is left (Arm ARM D8.2, the initial
    /// lookup level from TnSZ and the granule).
    fn levels(self) -> u32 {
        (self.va_bits - self.page_shift).div_ceil(self.page_shift - 3)
    }

    /// log2 of the bytes an entry at Arm lookup `level` maps.
    fn level_shift(self, level: i32) -> u32 {
        self.page_shift + (self.page_shift - 3) * (3 - level) as u32
    }

    /// Whether a block descriptor is allowed at `level` (Arm ARM D8.3.1:
    /// 4 KiB level 1 and 2, level 0 with DS; 16 KiB level 2, level 1 with
    /// DS; 64 KiB level 2, level 1 with 52-bit output addresses).
    fn block_allowed(self, level: i32) -> bool {
        match self.page_shift {
            12 => level == 1 || level == 2 || (level == 0 && self.ds),
            14 => level == 2 || (level == 1 && self.ds),
            _ => level == 2 || (level == 1 && self.lpa_64k),
        }
    }

    /// The address a descriptor holds, the field starting at bit `low`:
    /// bits \[47:low\] in place; with DS bits \[49:low\] in place and
    /// OA\[51:50\] in bits \[9:8\]; with 64 KiB and FEAT_LPA OA\[51:48\] in
    /// bits \[15:12\] (Arm ARM D8.3.1, "Output address", and the
    /// next-level table address of a table descriptor alike).
    fn address(self, d: u64, low: u32) -> u64 {
        let field = |top: u32| d & (((1u64 << (top + 1)) - 1) & !((1u64 << low) - 1));
        if self.ds {
            field(49) | ((d >> 8) & 0b11) << 50
        } else if self.lpa_64k {
            field(47) | ((d >> 12) & 0xf) << 48
        } else {
            field(47)
        }
    }
}

/// What the hardware makes of the descriptor `raw` in a table at `height`
/// (Arm lookup level `3 - height`) of `A`'s regime (Arm ARM D8.3.1): bit 0
/// clear is invalid; at level 3 bit 1 set is a page, clear reserved
/// (invalid); above it bit 1 set is a table, clear a block where the
/// granule allows one, else invalid. The simulator's
/// [`HwDecoder`](pgtable_core::sim::HwDecoder) for `A`.
fn arm_decode<A: Format>(raw: u64, height: u32) -> Decoded {
    let r = Regime::of::<A>();
    let level = 3 - height as i32;
    if raw & 1 == 0 {
        return if raw == 0 {
            Decoded::None
        } else {
            Decoded::Invalid
        };
    }
    let table_or_page = raw & 0b10 != 0;
    if level == 3 {
        return if table_or_page {
            Decoded::Leaf(PhysAddr(r.address(raw, r.page_shift)))
        } else {
            Decoded::Invalid
        };
    }
    if table_or_page {
        Decoded::Table(PhysAddr(r.address(raw, r.page_shift)))
    } else if r.block_allowed(level) {
        Decoded::Leaf(PhysAddr(r.address(raw, r.level_shift(level))))
    } else {
        Decoded::Invalid
    }
}

/// Sign-extends `v` from bit `top`.
fn sext(v: u64, top: u32) -> u64 {
    let s = 63 - top;
    (((v << s) as i64) >> s) as u64
}

/// An [`Mmu`] for the simulated machine that issues the TLBIs an
/// `Arm64Mmu` with `enc` would, and lets the simulated TLB lose only what
/// the hardware, decoding those operands for `regime`, would invalidate.
struct TlbiMmu<A: Arch> {
    sim: SimMmu<A>,
    enc: Encoding,
    regime: Regime,
    /// Operands the hardware model refuses (RES0 bits set, a hint it does
    /// not model), and range TLBIs that invalidated nothing (TG mismatch).
    notes: RefCell<Vec<String>>,
}

impl<A: Arch> TlbiMmu<A> {
    fn new(sim: SimMmu<A>, enc: Encoding) -> TlbiMmu<A> {
        TlbiMmu {
            sim,
            enc,
            regime: Regime::of::<A>(),
            notes: RefCell::new(Vec::new()),
        }
    }

    fn note(&self, s: String) {
        self.notes.borrow_mut().push(s);
    }

    /// The ASID the operands name.
    fn asid16(&self) -> u16 {
        self.sim.asid().unwrap_or(0)
    }

    /// Drops from the simulated TLB what a TLBI of `asid` over
    /// `[start, end)` reaches.
    fn invalidate(&self, asid: u16, start: u64, end: u64, last_level: bool) {
        let range = TlbRange {
            start: VirtAddr(start),
            end: VirtAddr(end),
            stride_shift: self.regime.page_shift,
            last_level,
        };
        if asid == self.asid16() {
            self.sim.flush_tlb_range(range);
        } else {
            let other = self.sim.clone();
            other.set_asid(asid);
            other.flush_tlb_range(range);
        }
    }

    /// `TLBI VAE1IS` / `VALE1IS` with `x`: ASID\[63:48\], TTL\[47:44\],
    /// VA\[55:12\] in bits \[43:0\], whose bits below the page are RES0
    /// (bits \[1:0\] with 16 KiB, \[3:0\] with 64 KiB). It invalidates the
    /// entries that translate that VA, whatever their size.
    fn tlbi_va(&self, x: u64, last_level: bool) {
        let asid = (x >> 48) as u16;
        let ttl = (x >> 44) & 0xf;
        let field = x & ((1 << 44) - 1);
        let res0 = (1u64 << (self.regime.page_shift - 12)) - 1;
        if ttl != 0 {
            self.note(format!(
                "TLBI VAE1IS {x:#x}: TTL hint {ttl:#x} (not modelled)"
            ));
        }
        if field & res0 != 0 {
            self.note(format!(
                "TLBI VAE1IS {x:#x}: RES0 bits below the {} KiB page set",
                1u64 << (self.regime.page_shift - 10)
            ));
        }
        let va = sext(field << 12, 55) & !((1u64 << self.regime.page_shift) - 1);
        self.invalidate(asid, va, va + 1, last_level);
    }

    /// `TLBI RVAE1IS` / `RVALE1IS` with `x`: ASID\[63:48\], TG\[47:46\],
    /// SCALE\[45:44\], NUM\[43:39\], TTL\[38:37\], BaseADDR\[36:0\], the
    /// start in pages of the granule, or with DS = 1 in 64 KiB units, its
    /// bit 36 selecting the half; `(NUM + 1) * 2^(5 * SCALE + 1)` pages.
    fn tlbi_range(&self, x: u64, last_level: bool) {
        let asid = (x >> 48) as u16;
        let tg = (x >> 46) & 0b11;
        let scale = ((x >> 44) & 0b11) as u32;
        let num = (x >> 39) & 0x1f;
        let ttl = (x >> 37) & 0b11;
        let base = x & ((1 << 37) - 1);
        if ttl != 0 {
            self.note(format!(
                "TLBI RVAE1IS {x:#x}: TTL hint {ttl:#x} (not modelled)"
            ));
        }
        if tg != self.regime.tg() {
            // Translations of another granule than TG names need not be
            // invalidated: the strictest hardware invalidates none.
            self.note(format!(
                "TLBI RVAE1IS {x:#x}: TG {tg:#b} for a {} KiB granule, nothing invalidated",
                1u64 << (self.regime.page_shift - 10)
            ));
            return;
        }
        let unit = if self.regime.ds {
            16
        } else {
            self.regime.page_shift
        };
        let start = sext(base, 36) << unit;
        let len = (num + 1) << (5 * scale + 1 + self.regime.page_shift);
        self.invalidate(asid, start, start.wrapping_add(len), last_level);
    }
}

// SAFETY: on the simulator only; every flush ends in the simulated MMU's
// flushes, which reach every simulated CPU (it issues fewer or other ones
// than asked on purpose, to show the consequences).
unsafe impl<A: Arch> Mmu for TlbiMmu<A> {
    const OBSERVES_WRITES: bool = true;

    fn walker_barrier(&self) {
        self.sim.walker_barrier();
    }

    fn publish_barrier(&self) {
        self.sim.publish_barrier();
    }

    /// As `Arm64Mmu::flush_tlb_range`: the plan, then one TLBI per
    /// stride, or the range split into range and single-page TLBIs.
    fn flush_tlb_range(&self, range: TlbRange) {
        let e = self.enc;
        let asid = self.asid16();
        match flush_plan_for(e.granule, range, e.has_range) {
            FlushPlan::All => self.sim.flush_tlb_all(),
            FlushPlan::PerStride {
                start,
                stride_shift,
                count,
                last_level,
            } => {
                for i in 0..count {
                    let va = start.0.wrapping_add(i << stride_shift);
                    self.tlbi_va(tlbi_va_operand_for(e.granule, va, asid, 0), last_level);
                }
            }
            FlushPlan::Range {
                start_page,
                pages,
                last_level,
            } => {
                for op in tlbi_range_ops_for(e.granule, e.ds, start_page, pages) {
                    match op {
                        TlbiOp::Page { page } => {
                            let va = page << e.granule.page_shift();
                            self.tlbi_va(tlbi_va_operand_for(e.granule, va, asid, 0), last_level);
                        }
                        TlbiOp::Range { scale, num, base } => {
                            let op = RangeOperand {
                                base_page: base,
                                scale,
                                num,
                                asid,
                                ttl: 0,
                            };
                            let x = tlbi_range_operand_for(e.granule, e.ds, op);
                            self.tlbi_range(x, last_level);
                        }
                    }
                }
            }
        }
    }

    fn flush_tlb_all(&self) {
        self.sim.flush_tlb_all();
    }

    fn flush_tlb_mm(&self) {
        self.sim.flush_tlb_mm();
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // SAFETY: forwarded to the simulated MMU; no hardware walks it.
        unsafe { self.sim.install_root(root) }
    }

    fn installs_into(&self) -> Option<VaRange> {
        self.sim.installs_into()
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.sim.entry_written(slot, old);
    }
}

type TlbiSpace<A> = Installed<A, TlbiMmu<A>, SimAlloc>;

fn tlbi_space<A: Arch>(enc: Encoding) -> (SimMachine<A>, TlbiSpace<A>) {
    let m = SimMachine::<A>::new();
    m.set_hw_decoder(Some(arm_decode::<A>));
    let mmu = TlbiMmu::new(m.mmu_installing_into(VaRange::Lower), enc);
    let s = AddressSpace::<A, _, _>::new_in(VaRange::Lower, mmu, m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

/// The simulator's check, as a message.
fn checked<A: Arch>(m: &SimMachine<A>, step: &str) -> Result<(), String> {
    m.check()
        .map_err(|e: CheckError| format!("after {step}: {e}"))
}

/// Loads from every page of `[va, va + len)`, so the TLB holds them.
fn touch<A: Arch>(m: &SimMachine<A>, va: VirtAddr, len: u64) -> Result<(), String> {
    let page = level::page_size::<A>();
    (0..len / page)
        .try_for_each(|i| m.read_u64(va.add(i * page)).map(drop))
        .map_err(|f| format!("touch: {f}"))
}

/// Write-protect, split, move and unmap, with the TLB filled before each
/// operation, probed after it (a store through a write-protected page, a
/// load through an unmapped one must fault) and checked. `Err` says what
/// went wrong first.
/// [`tlbi_steps`] with an MMU that encodes with `enc`.
fn tlbi_sequence<A: Arch>(enc: Encoding) -> Result<(), String> {
    tlbi_run(enc, tlbi_steps::<A>)
}

/// Runs `steps` on a fresh space whose MMU encodes with `enc`; the hardware
/// model's notes are appended to an `Err`, and are an `Err` of their own
/// after steps that passed.
fn tlbi_run<A: Arch>(
    enc: Encoding,
    steps: fn(&SimMachine<A>, &mut TlbiSpace<A>) -> Result<(), String>,
) -> Result<(), String> {
    let (m, mut s) = tlbi_space::<A>(enc);
    let r = steps(&m, &mut s);
    let notes = s.mmu().notes.borrow();
    match r {
        Err(e) => Err(format!("{e}; the hardware model noted {notes:?}")),
        Ok(()) if !notes.is_empty() => Err(format!("the hardware model noted {notes:?}")),
        Ok(()) => Ok(()),
    }
}

fn tlbi_steps<A: Arch>(m: &SimMachine<A>, s: &mut TlbiSpace<A>) -> Result<(), String> {
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    let blocks = VirtAddr(4 * pmd);
    let pa = PhysAddr(0x4000_0000);
    // Pages at the top of the lower half (above 2^48 for 52-bit VAs).
    let top = VirtAddr((1u64 << A::VA_BITS) - 2 * pmd);
    let top_pa = PhysAddr(0x8000_0000);
    let n = 40;
    s.map(
        blocks,
        pa,
        2 * pmd,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .map_err(|e| format!("map blocks: {e:?}"))?;
    s.map(top, top_pa, n * page, Prot::READ_WRITE, MapOptions::PAGES)
        .map_err(|e| format!("map pages: {e:?}"))?;
    m.write_u64(blocks.add(pmd + page), 0x1616).unwrap();
    m.write_u64(top.add(5 * page), 0x6464).unwrap();
    touch(m, top, n * page)?;
    checked(m, "map")?;

    // Write-protect a run of pages (a range of pages) and one page of the
    // second block (which splits it).
    let ro = blocks.add(pmd + page);
    m.write_u64(ro, 0x1616).unwrap();
    s.change_protection(top.add(page), (n - 2) * page, Prot::READ_ONLY)
        .map_err(|e| format!("protect pages: {e:?}"))?;
    checked(m, "write-protecting pages")?;
    if m.write_u64(top.add(5 * page), 1).is_ok() {
        return Err(format!(
            "a store at {} went through after write-protect",
            top.add(5 * page)
        ));
    }
    s.change_protection(ro, page, Prot::READ_ONLY)
        .map_err(|e| format!("protect in a block: {e:?}"))?;
    checked(m, "write-protecting a page of a block")?;
    if m.write_u64(ro, 1).is_ok() {
        return Err(format!("a store at {ro} went through after write-protect"));
    }

    // Move the first block's PMD entry away.
    touch(m, blocks, 4 * page)?;
    let to = VirtAddr(blocks.0 + 8 * pmd);
    s.move_page_tables(blocks, to, pmd, MoveOptions::default())
        .map_err(|e| format!("move: {e:?}"))?;
    checked(m, "move")?;
    if m.read_u64(blocks).is_ok() {
        return Err(format!("a load at {blocks} went through after the move"));
    }

    // Unmap the pages, then everything.
    touch(m, top, n * page)?;
    s.unmap(top, n * page)
        .map_err(|e| format!("unmap pages: {e:?}"))?;
    checked(m, "unmapping pages")?;
    if m.read_u64(top.add(5 * page)).is_ok() {
        return Err(format!(
            "a load at {} went through after unmap",
            top.add(5 * page)
        ));
    }
    touch(m, to, 2 * page)?;
    s.unmap(to, pmd).map_err(|e| format!("unmap: {e:?}"))?;
    s.unmap(blocks.add(pmd), pmd)
        .map_err(|e| format!("unmap: {e:?}"))?;
    checked(m, "unmapping blocks")
}

/// Only an unmap: pages mapped, loaded through (so the TLB holds them)
/// and unmapped; the load after it must fault and the check pass.
fn tlbi_unmap<A: Arch>(enc: Encoding) -> Result<(), String> {
    tlbi_run(enc, unmap_steps::<A>)
}

fn unmap_steps<A: Arch>(m: &SimMachine<A>, s: &mut TlbiSpace<A>) -> Result<(), String> {
    let page = level::page_size::<A>();
    let va = VirtAddr(level::size::<A>(1));
    s.map(
        va,
        PhysAddr(0x8000_0000),
        6 * page,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    touch(m, va, 6 * page)?;
    s.unmap(va, 6 * page).unwrap();
    checked(m, "unmap")?;
    match m.read_u64(va.add(3 * page)) {
        Ok(_) => Err(format!(
            "a load at {} went through after unmap",
            va.add(3 * page)
        )),
        Err(_) => Ok(()),
    }
}

#[test]
fn the_tlbi_operands_of_each_granule_keep_the_simulated_tlb_coherent() {
    fn both<F: Arm64Geometry>() {
        for has_range in [true, false] {
            let e = Encoding::of::<F>(has_range);
            assert_eq!(tlbi_sequence::<F>(e), Ok(()), "{} {e:?}", F::NAME);
            assert_eq!(tlbi_unmap::<F>(e), Ok(()), "{} {e:?}", F::NAME);
        }
    }
    both::<Arm64>();
    both::<Arm64Lpa2>();
    both::<Arm64K16>();
    both::<Arm64K16Lpa2>();
    both::<Arm64K64>();
    both::<Arm64K64Va52>();
}

/// The 4 KiB encoding (what `Arm64Mmu::new()` has before `for_format`),
/// with FEAT_TLBIRANGE.
const K4_RANGE: Encoding = Encoding {
    granule: Granule::K4,
    ds: false,
    has_range: true,
};

/// `r` failed on a translation a flush should have removed, as the
/// simulator's check reported it: a stale TLB entry, or (when the entry
/// was then rewritten, e.g. a contiguous run folded by `map` being
/// unfolded) a break-before-make violation against it.
fn stale(r: Result<(), String>) -> String {
    let e = r.unwrap_err();
    assert!(
        e.contains("stale TLB entry") || e.contains("break-before-make violated"),
        "{e}"
    );
    e
}

#[test]
fn range_tlbis_with_the_4k_tg_on_a_16k_space_are_caught() {
    for e in [
        stale(tlbi_sequence::<Arm64K16>(K4_RANGE)),
        stale(tlbi_unmap::<Arm64K16>(K4_RANGE)),
    ] {
        assert!(e.contains("TG 0b1 for a 16 KiB granule"), "{e}");
    }
}

#[test]
fn range_tlbis_with_the_4k_tg_on_a_64k_space_are_caught() {
    for e in [
        stale(tlbi_sequence::<Arm64K64>(K4_RANGE)),
        stale(tlbi_unmap::<Arm64K64>(K4_RANGE)),
    ] {
        assert!(e.contains("TG 0b1 for a 64 KiB granule"), "{e}");
    }
}

#[test]
fn range_tlbis_in_page_units_with_ds_are_caught() {
    // TG is right, but BaseADDR counts pages of the granule (the 48-bit
    // format's encoding) while the hardware with TCR_EL1.DS = 1 reads it
    // in 64 KiB units: the operands decode, and miss.
    let k16 = Encoding::of::<Arm64K16>(true);
    let k4 = Encoding::of::<Arm64>(true);
    for e in [
        stale(tlbi_sequence::<Arm64K16Lpa2>(k16)),
        stale(tlbi_unmap::<Arm64K16Lpa2>(k16)),
        stale(tlbi_sequence::<Arm64Lpa2>(k4)),
        stale(tlbi_unmap::<Arm64Lpa2>(k4)),
    ] {
        assert!(e.ends_with("noted []"), "{e}");
    }
}

#[test]
fn by_va_tlbis_carry_no_granule_so_4k_operands_still_flush_a_16k_space() {
    // Without FEAT_TLBIRANGE the 4 KiB encoding flushes per stride (the
    // library's strides are pages of the space or larger), and a TLBI by
    // VA drops whatever entry translates its address: no stale entry, as
    // on hardware. A decoder that took the operand for a page of its own
    // size, or an encoding that set the RES0 bits, would fail here.
    let k4 = Encoding {
        has_range: false,
        ..K4_RANGE
    };
    assert_eq!(tlbi_sequence::<Arm64K16>(k4), Ok(()));
    assert_eq!(tlbi_sequence::<Arm64K64>(k4), Ok(()));
    assert_eq!(tlbi_unmap::<Arm64K64>(k4), Ok(()));
}

// ----- the hardware's side of the descriptors -----

/// A [`SimAlloc`] that remembers its live table frames, so that [`hw_walk`]
/// reads only frames that are tables.
struct Frames {
    inner: SimAlloc,
    live: Arc<Mutex<HashSet<u64>>>,
}

// SAFETY: every call is forwarded to the machine's allocator; the set only
// records what it hands out.
unsafe impl TableAlloc for Frames {
    fn frame_shift(&self) -> u32 {
        self.inner.frame_shift()
    }

    fn alloc_table(&mut self) -> Option<PhysAddr> {
        let pa = self.inner.alloc_table()?;
        self.live.lock().unwrap().insert(pa.0);
        Some(pa)
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        self.live.lock().unwrap().remove(&pa.0);
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.free_table(pa) }
    }

    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { self.inner.phys_to_virt(pa) }
    }
}

/// What the hardware walker found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum HwWalk {
    /// The output address, and the Arm lookup level of the leaf.
    Mapped { pa: u64, level: i32 },
    /// A translation fault at this level.
    Fault { level: i32 },
    /// A table descriptor pointing at a frame that is no table.
    NotATable { level: i32, pa: u64 },
}

/// The walk the hardware makes for `va` from `root` in `A`'s regime,
/// reading the entries of the live frames of `frames` and decoding them
/// with [`arm_decode`] (Arm ARM D8.2 "Translation table walk"): the levels,
/// the initial one's index width and the output address all from the page
/// shift, VA bits and PA bits alone.
fn hw_walk<A: Format>(frames: &Frames, root: PhysAddr, va: u64) -> HwWalk {
    let regime = Regime::of::<A>();
    let levels = regime.levels();
    let mut table = root.0;
    for i in 0..levels {
        let level = 4 - levels as i32 + i as i32;
        let shift = regime.level_shift(level);
        let bits = if i == 0 {
            regime.va_bits - shift
        } else {
            regime.page_shift - 3
        };
        let index = (va >> shift) & ((1 << bits) - 1);
        if !frames.live.lock().unwrap().contains(&table) {
            return HwWalk::NotATable { level, pa: table };
        }
        // SAFETY: `table` is a live frame of the allocator (checked
        // above), of `2^(page_shift - 3)` entries; entries are atomics.
        let d = unsafe {
            let t = frames.phys_to_virt(PhysAddr(table)).cast::<Slot>();
            (*t.as_ptr().add(index as usize)).load(Relaxed)
        };
        match arm_decode::<A>(d, (3 - level) as u32) {
            Decoded::Table(next) => table = next.0,
            Decoded::Leaf(pa) => {
                return HwWalk::Mapped {
                    pa: pa.0 | (va & ((1 << shift) - 1)),
                    level,
                }
            }
            Decoded::None | Decoded::Invalid => return HwWalk::Fault { level },
        }
    }
    unreachable!("the last level holds no table")
}

type HwSpace<A> = Installed<A, SimMmu<A>, Frames>;

/// A lower-half space of `A` on a fresh machine, with the simulator's
/// hardware decoder set to [`arm_decode`] if `hook`.
fn hw_space<A: Arch>(hook: bool) -> (SimMachine<A>, HwSpace<A>) {
    let m = SimMachine::<A>::new();
    if hook {
        m.set_hw_decoder(Some(arm_decode::<A>));
    }
    let frames = Frames {
        inner: m.alloc(),
        live: Arc::default(),
    };
    let s = AddressSpace::<A, _, _>::new_in(
        VaRange::Lower,
        m.mmu_installing_into(VaRange::Lower),
        frames,
    )
    .unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

/// Compares, at `va`, what the simulator translates (always `want`, the
/// address the test mapped there: it walks with the format), what its
/// check then says (with the hardware decoder set, the first entry the
/// format encodes wrongly), and what [`hw_walk`] sees. `Ok`: the level of
/// the leaf.
fn hw_sees<A: Arch>(
    m: &SimMachine<A>,
    s: &HwSpace<A>,
    va: VirtAddr,
    want: u64,
) -> Result<i32, String> {
    let sim = m.translate(va).map_err(|f| format!("simulator: {f}"))?;
    assert_eq!(
        sim.0,
        want,
        "{}: the simulator translates {va} by the format",
        A::NAME
    );
    m.check()
        .map_err(|e| format!("{}: the simulator's check: {e}", A::NAME))?;
    match hw_walk::<A>(s.alloc(), s.root(), va.0) {
        HwWalk::Mapped { pa, level } if pa == want => Ok(level),
        other => Err(format!(
            "{}: the hardware walker sees {other:x?} at {va}, {want:#x} was mapped",
            A::NAME
        )),
    }
}

/// Pages and PMD blocks mapped at output addresses above 2^48 with each of
/// the high bits set alone (so a swap of any two shows), read back by the
/// simulator (with its hardware decoder set to [`arm_decode`] if `hook`)
/// and by [`hw_walk`]. `Err` names the first disagreement.
fn high_oa<A: Arch>(hook: bool) -> Result<(), String> {
    let (m, mut s) = hw_space::<A>(hook);
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    for (i, high) in [48u32, 49, 50, 51].into_iter().enumerate() {
        let i = i as u64;
        let pa = (1u64 << high) | 0x4000_0000;
        let va = VirtAddr((8 + 2 * i) * pmd);
        s.map(
            va,
            PhysAddr(pa),
            page * 4,
            Prot::READ_WRITE,
            MapOptions::PAGES,
        )
        .unwrap();
        hw_sees(&m, &s, va.add(3 * page + 8), pa + 3 * page + 8)?;
        let bva = VirtAddr((9 + 2 * i) * pmd);
        s.map(
            bva,
            PhysAddr(pa),
            pmd,
            Prot::READ_ONLY,
            MapOptions::PMD_BLOCKS,
        )
        .unwrap();
        let level = hw_sees(&m, &s, bva.add(pmd - 8), pa + pmd - 8)?;
        assert_eq!(level, 2, "{}: a PMD block is a level-2 block", A::NAME);
    }
    m.check().unwrap();
    Ok(())
}

/// A format that is `F` with every entry's bits rearranged by `T` (an
/// involution on the bits, so encoding and decoding agree), and possibly
/// fewer levels: a self-consistent format the simulator's own walker, which
/// decodes with the format, cannot tell from `F`.
struct Twisted<F, T>(PhantomData<(F, T)>);

/// How [`Twisted`] changes its format.
trait Twist: 'static {
    /// Levels fewer than the format's.
    const FEWER_LEVELS: u32 = 0;
    /// The rearrangement, its own inverse.
    fn twist(raw: u64) -> u64 {
        raw
    }
}

/// Swaps descriptor bits `a` and `b`.
fn swap_bits(raw: u64, a: u32, b: u32) -> u64 {
    let x = ((raw >> a) ^ (raw >> b)) & 1;
    raw ^ (x << a) ^ (x << b)
}

/// 64 KiB FEAT_LPA's OA\[51:48\] in bits \[15:12\] in reverse order
/// (OA\[48\] in bit 15, …, OA\[51\] in bit 12). Only the high address
/// bits move.
struct ReversedLpa64k;

impl Twist for ReversedLpa64k {
    fn twist(raw: u64) -> u64 {
        swap_bits(swap_bits(raw, 12, 15), 13, 14)
    }
}

/// One level fewer than the page shift and VA bits need.
struct OneLevelFewer;

impl Twist for OneLevelFewer {
    const FEWER_LEVELS: u32 = 1;
}

/// FEAT_LPA2's OA\[51:50\] in bits \[9:8\] the other way round: OA\[50\]
/// in bit 9, OA\[51\] in bit 8.
struct SwappedLpa2;

impl Twist for SwappedLpa2 {
    fn twist(raw: u64) -> u64 {
        swap_bits(raw, 8, 9)
    }
}

// SAFETY: every method is `F`'s conjugated by `T::twist`, an involution on
// the bits: `decode(table_entry(pa))` is `F::decode(F::table_entry(pa))`,
// and so on for every rule of the trait, which `F` keeps.
unsafe impl<F: Format, T: Twist> Format for Twisted<F, T> {
    const NAME: &'static str = F::NAME;
    const LEVELS: u32 = F::LEVELS - T::FEWER_LEVELS;
    const PA_BITS: u32 = F::PA_BITS;
    const OA_SHIFT: u32 = F::OA_SHIFT;
    const PAGE_SHIFT: u32 = F::PAGE_SHIFT;
    const VA_BITS: u32 = F::VA_BITS;
    const SWP_VALUE_BITS: u32 = F::SWP_VALUE_BITS;
    const SEPARATE_HALVES: bool = F::SEPARATE_HALVES;

    fn leaf_allowed(height: u32) -> bool {
        F::leaf_allowed(height)
    }
    fn decode(raw: u64, height: u32) -> Decoded {
        F::decode(T::twist(raw), height)
    }
    fn table_entry(pa: PhysAddr, height: u32) -> u64 {
        T::twist(F::table_entry(pa, height))
    }
    fn leaf_template(prot: Prot, height: u32) -> u64 {
        T::twist(F::leaf_template(prot, height))
    }
    fn oa_field(pa: PhysAddr) -> u64 {
        T::twist(F::oa_field(pa))
    }
    fn leaf_prot(raw: u64, height: u32) -> Prot {
        F::leaf_prot(T::twist(raw), height)
    }
    fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64 {
        T::twist(F::modify_prot(T::twist(raw), prot, height))
    }
    fn split_leaf(raw: u64, height: u32) -> u64 {
        T::twist(F::split_leaf(T::twist(raw), height))
    }
    fn is_young(raw: u64) -> bool {
        F::is_young(T::twist(raw))
    }
    fn is_dirty(raw: u64) -> bool {
        F::is_dirty(T::twist(raw))
    }
    fn is_settled(raw: u64, height: u32) -> bool {
        F::is_settled(T::twist(raw), height)
    }
    fn hw_access(raw: u64, height: u32, access: Access) -> Result<u64, AccessFault> {
        F::hw_access(T::twist(raw), height, access).map(T::twist)
    }
    fn is_protnone(raw: u64, height: u32) -> bool {
        F::is_protnone(T::twist(raw), height)
    }
    fn swp_entry(value: u64) -> Option<u64> {
        F::swp_entry(value).map(T::twist)
    }
    fn swp_value(raw: u64) -> Option<u64> {
        F::swp_value(T::twist(raw))
    }
    fn table_entry_attrs(pa: PhysAddr, height: u32, attrs: TableAttrs) -> u64 {
        T::twist(F::table_entry_attrs(pa, height, attrs))
    }
    fn table_limits(raw: u64, height: u32) -> TableAttrs {
        F::table_limits(T::twist(raw), height)
    }
    fn cont_entries(height: u32) -> u32 {
        F::cont_entries(height)
    }
    fn mk_cont(raw: u64, height: u32) -> u64 {
        T::twist(F::mk_cont(T::twist(raw), height))
    }
    fn clear_cont(raw: u64, height: u32) -> u64 {
        T::twist(F::clear_cont(T::twist(raw), height))
    }
    fn clear_cont_at(raw: u64, height: u32, index: usize) -> u64 {
        T::twist(F::clear_cont_at(T::twist(raw), height, index))
    }
    fn cont_pa(raw: u64, pa: PhysAddr, height: u32, index: usize) -> PhysAddr {
        F::cont_pa(T::twist(raw), pa, height, index)
    }
    fn is_cont(raw: u64, height: u32) -> bool {
        F::is_cont(T::twist(raw), height)
    }
    fn mkold(raw: u64, height: u32) -> u64 {
        T::twist(F::mkold(T::twist(raw), height))
    }
    fn mkyoung(raw: u64, height: u32) -> u64 {
        T::twist(F::mkyoung(T::twist(raw), height))
    }
    fn mkclean(raw: u64, height: u32) -> u64 {
        T::twist(F::mkclean(T::twist(raw), height))
    }
    fn mkdirty(raw: u64, height: u32) -> u64 {
        T::twist(F::mkdirty(T::twist(raw), height))
    }
}

// SAFETY: the setters store the value they are given through `F`'s (which
// look only at the valid bit, which no twist moves); the rest is `F`'s
// answer on the untwisted values or the generic fallback.
unsafe impl<F: Arch, T: Twist> Arch for Twisted<F, T> {
    const HAVE_MOVE_PMD: bool = F::HAVE_MOVE_PMD;
    const HAVE_MOVE_PUD: bool = F::HAVE_MOVE_PUD;
    const TLB_FLUSH_CEILING: u64 = F::TLB_FLUSH_CEILING;
    const NEEDS_WALKER_BARRIER: bool = F::NEEDS_WALKER_BARRIER;
    const BREAK_BEFORE_MAKE: bool = F::BREAK_BEFORE_MAKE;

    fn set_pte_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pte: u64) {
        F::set_pte_at(mmu, va, slot, pte)
    }
    fn set_pmd_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pmd: u64) {
        F::set_pmd_at(mmu, va, slot, pmd)
    }
    fn set_pud_at<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, pud: u64) {
        F::set_pud_at(mmu, va, slot, pud)
    }
    fn pmdp_modify_prot_start<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, height: u32) -> u64 {
        generic::pmdp_modify_prot_start_deferred::<Self, M>(mmu, va, slot, height)
    }
    fn change_is_safe(old: u64, new: u64, height: u32) -> bool {
        F::change_is_safe(T::twist(old), T::twist(new), height)
    }
}

#[test]
fn the_hardware_walker_sees_every_52_bit_output_address_where_it_was_mapped() {
    for hook in [true, false] {
        high_oa::<Arm64Lpa2>(hook).unwrap();
        high_oa::<Arm64K16Lpa2>(hook).unwrap();
        high_oa::<Arm64K64Va52>(hook).unwrap();
    }
}

#[test]
fn a_52_bit_format_with_its_high_output_address_bits_swapped_is_caught() {
    // With the hardware decoder set, the simulator's check names the first
    // entry the format encodes where the hardware does not read it.
    for e in [
        high_oa::<Twisted<Arm64Lpa2, SwappedLpa2>>(true),
        high_oa::<Twisted<Arm64K16Lpa2, SwappedLpa2>>(true),
        high_oa::<Twisted<Arm64K64Va52, ReversedLpa64k>>(true),
    ] {
        let e = e.unwrap_err();
        assert!(e.contains("the simulator's check: entry"), "{e}");
        assert!(e.contains("the hardware decoder Leaf"), "{e}");
    }
    // Without it the simulator, decoding with the format, agrees with the
    // twisted format (`hw_sees` asserts it); the test's own walker does
    // not.
    for e in [
        high_oa::<Twisted<Arm64Lpa2, SwappedLpa2>>(false),
        high_oa::<Twisted<Arm64K16Lpa2, SwappedLpa2>>(false),
        high_oa::<Twisted<Arm64K64Va52, ReversedLpa64k>>(false),
    ] {
        let e = e.unwrap_err();
        assert!(e.contains("the hardware walker sees"), "{e}");
    }
    // The same twist on a 48-bit format moves no address bit (bits
    // [15:12] of its descriptors are RES0): nothing to catch.
    high_oa_48::<Twisted<Arm64K64, ReversedLpa64k>>().unwrap();
}

/// [`high_oa`] below 2^48, for 48-bit formats.
fn high_oa_48<A: Arch>() -> Result<(), String> {
    let (m, mut s) = hw_space::<A>(true);
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    let pa = 0xf000_4000_0000;
    s.map(
        VirtAddr(8 * pmd),
        PhysAddr(pa),
        page,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    hw_sees(&m, &s, VirtAddr(8 * pmd + 8), pa + 8)?;
    m.check().unwrap();
    Ok(())
}

// ----- levels -----

/// Every geometry: the levels the hardware walks (from the page shift and
/// VA bits: Arm ARM D8.2, written out here per geometry), the simulator's
/// first fault height in an empty space (its walk starts at the hardware's
/// initial level), and pages and a block at the bottom and the top of the
/// lower half translated alike by the simulator and the hardware walker.
fn walks_like_the_hardware<A: Arch>(levels: u32) {
    let regime = Regime::of::<A>();
    assert_eq!(regime.levels(), levels, "{}", A::NAME);
    let (m, mut s) = hw_space::<A>(true);
    let page = level::page_size::<A>();
    let pmd = level::size::<A>(1);
    let hi = 1u64 << A::VA_BITS;
    // An empty root: the walk ends at its first lookup, the initial level.
    assert_eq!(
        m.read_u64(VirtAddr(hi - page)).unwrap_err().kind,
        SimFaultKind::Translation { height: levels - 1 },
        "{}",
        A::NAME
    );
    assert_eq!(
        hw_walk::<A>(s.alloc(), s.root(), hi - page),
        HwWalk::Fault {
            level: 4 - levels as i32
        }
    );
    let top = VirtAddr(hi - 2 * page);
    s.map(
        top,
        PhysAddr(0x8000_0000),
        2 * page,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    s.map(
        VirtAddr(pmd),
        PhysAddr(0x4000_0000),
        pmd,
        Prot::READ_WRITE,
        MapOptions::PMD_BLOCKS,
    )
    .unwrap();
    s.map(
        VirtAddr(3 * pmd),
        PhysAddr(0x1000_0000),
        page,
        Prot::READ_WRITE,
        MapOptions::PAGES,
    )
    .unwrap();
    assert_eq!(
        hw_sees(&m, &s, top.add(page + 16), 0x8000_0000 + page + 16),
        Ok(3)
    );
    assert_eq!(
        hw_sees(&m, &s, VirtAddr(2 * pmd - 8), 0x4000_0000 + pmd - 8),
        Ok(2)
    );
    assert_eq!(hw_sees(&m, &s, VirtAddr(3 * pmd), 0x1000_0000), Ok(3));
    m.check().unwrap();
}

#[test]
fn the_simulator_walks_the_levels_the_hardware_derives_from_page_shift_and_va_bits() {
    walks_like_the_hardware::<Arm64Va39>(3);
    walks_like_the_hardware::<Arm64>(4);
    walks_like_the_hardware::<Arm64Lpa2>(5);
    walks_like_the_hardware::<Arm64K16Va36>(2);
    walks_like_the_hardware::<Arm64K16Va47>(3);
    walks_like_the_hardware::<Arm64K16>(4);
    walks_like_the_hardware::<Arm64K16Lpa2>(4);
    walks_like_the_hardware::<Arm64K64Va42>(2);
    walks_like_the_hardware::<Arm64K64>(3);
    walks_like_the_hardware::<Arm64K64Va52>(3);
}

#[test]
fn a_format_with_one_level_fewer_than_its_geometry_needs_is_refused_at_compile_time() {
    // `AddressSpace::new_in` asserts `level::check` in a `const` block, so
    // such a format cannot be built into an address space at all (the
    // simulator never meets one); here the check itself, called at run
    // time, refuses every one of them and accepts the geometries.
    fn refused<F: Arch>() {
        assert!(level::check::<F>(), "{}", F::NAME);
        assert!(!level::check::<Twisted<F, OneLevelFewer>>(), "{}", F::NAME);
    }
    refused::<Arm64Va39>();
    refused::<Arm64>();
    refused::<Arm64Lpa2>();
    refused::<Arm64K16Va36>();
    refused::<Arm64K16Va47>();
    refused::<Arm64K16>();
    refused::<Arm64K16Lpa2>();
    refused::<Arm64K64Va42>();
    refused::<Arm64K64>();
    refused::<Arm64K64Va52>();
}
