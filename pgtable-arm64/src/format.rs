//! The VMSAv8-64 stage 1 format for every granule and virtual address
//! size Linux builds ([`Arm64Format`]): [`Arm64`] and [`Arm64Va39`] (4 KiB),
//! [`Arm64K16`], [`Arm64K16Va47`], [`Arm64K16Va36`] (16 KiB),
//! [`Arm64K64`], [`Arm64K64Va42`] (64 KiB), and the 52-bit ones
//! [`Arm64Lpa2`], [`Arm64K16Lpa2`], [`Arm64K64Va52`].
//!
//! Every bit it sets or reads is named in [`bits`](crate::bits), with its
//! place in the Arm Architecture Reference Manual for A-profile (DDI 0487,
//! D8.3 "Translation table descriptor formats").
//!
//! # Writable and dirty (FEAT_HAFDBS, as Linux does it)
//!
//! A leaf is *writable* when DBM is set (or, for entries this crate never
//! creates, when AP\[2\] is clear without DBM). A writable leaf is *hardware
//! dirty* when AP\[2\] (read-only) is clear: with TCR_EL1.HD set, the first
//! store through a writable, clean leaf (DBM = 1, AP\[2\] = 1) makes the
//! hardware clear AP\[2\] instead of raising a permission fault. A software
//! dirty bit (bit 55) keeps the dirty state of a leaf that is made read-only.
//!
//! # What this crate creates
//!
//! Every new leaf has AF set (so it works on CPUs without hardware access
//! flag management), SH = inner shareable and nG unless [`Prot::GLOBAL`].
//! - Kernel (no [`Prot::USER`]) writable leaves are created like Linux's
//!   `PAGE_KERNEL`: DBM set and AP\[2\] clear, i.e. writable and already
//!   dirty, so a kernel store never needs hardware dirty-state management.
//!   Kernel leaves are UXN; PXN unless [`Prot::EXEC`].
//! - User leaves have AP\[1\] (EL0 access) and PXN (the kernel never runs
//!   user code); UXN unless [`Prot::EXEC`]. Writable user leaves are created
//!   clean (DBM and AP\[2\] set): the first store marks them dirty, which
//!   needs FEAT_HAFDBS with TCR_EL1.HD (or a fault handler that does it).
//!
//! A leaf is *settled* (the hardware will never write it again) when AF is
//! set and it is not writable-but-clean.
//!
//! # Software entries
//!
//! A descriptor with bit 0 clear is invalid at every level, and the
//! hardware ignores its other bits (Arm ARM D8.3.1 "Invalid descriptors":
//! bits\[63:1\] are available to software); FEAT_HAFDBS never updates an
//! invalid descriptor (D8.5), and no TLB caches it. This crate's software
//! entries ([`Format::swp_entry`], Linux's swap and migration entries) use
//! the layout of [`bits`](crate::bits#software-entries).

use bit_field::BitField;
use pgtable_core::contract::{
    generic, Access, AccessFault, Arch, Decoded, Format, Mmu, Slot, TableAttrs,
};
use pgtable_core::{MemType, PhysAddr, Prot, VirtAddr};
use static_assertions::{assert_eq_align, assert_eq_size};

use crate::granule::Granule;

use crate::bits::{
    AF, AP_EL0, AP_RDONLY, AP_TABLE_NO_EL0, AP_TABLE_RDONLY, ATTR_INDX_MASK, ATTR_INDX_SHIFT, CONT,
    DBM, MAIR_IDX_DEVICE_NGNRE, MAIR_IDX_NORMAL, MAIR_IDX_NORMAL_NC, NG, OA_HIGH_LPA2,
    OA_HIGH_LPA_64K, PROT_NONE, PXN, PXN_TABLE, SH_INNER, SWP_TAG, SWP_VALUE_SHIFT, SW_DIRTY,
    SW_MASK, TABLE_OR_PAGE, UXN, UXN_TABLE, VALID,
};

/// Memory-type attribute index (AttrIndx) this crate uses for `mem`.
#[inline]
pub const fn attr_index(mem: MemType) -> u64 {
    match mem {
        MemType::Normal => MAIR_IDX_NORMAL,
        MemType::NormalNonCacheable => MAIR_IDX_NORMAL_NC,
        MemType::Device => MAIR_IDX_DEVICE_NGNRE,
    }
}

/// The memory type of an AttrIndx under [`MAIR_VALUE`](crate::regs::MAIR_VALUE).
#[inline]
pub const fn mem_type(index: u64) -> MemType {
    match index {
        MAIR_IDX_NORMAL => MemType::Normal,
        MAIR_IDX_NORMAL_NC => MemType::NormalNonCacheable,
        _ => MemType::Device,
    }
}

/// A raw descriptor with named field accessors (for inspection, tests and
/// callers building unusual entries), in the layout of the 4 KiB granule
/// with 48-bit addresses ([`Arm64`], [`Arm64Va39`]): its address field is
/// bits \[47:12\] and bits \[9:8\] are SH. For the other formats use
/// [`Arm64Format::address_of`] / [`Arm64Format::oa_bits`]. The format
/// methods work on `u64`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Descriptor(pub u64);

assert_eq_size!(Descriptor, u64);
assert_eq_align!(Descriptor, u64);

impl Descriptor {
    /// Bit \[0\].
    pub fn valid(self) -> bool {
        self.0.get_bit(0)
    }
    /// Bit \[1\]: table (L0–L2) or page (L3).
    pub fn table_or_page(self) -> bool {
        self.0.get_bit(1)
    }
    /// AttrIndx, bits \[4:2\].
    pub fn attr_index(self) -> u64 {
        self.0.get_bits(2..5)
    }
    /// AP\[2:1\], bits \[7:6\] (bit 0 of the result is AP\[1\]).
    pub fn ap(self) -> u64 {
        self.0.get_bits(6..8)
    }
    /// SH, bits \[9:8\].
    pub fn sh(self) -> u64 {
        self.0.get_bits(8..10)
    }
    /// AF, bit \[10\].
    pub fn af(self) -> bool {
        self.0.get_bit(10)
    }
    /// nG, bit \[11\].
    pub fn ng(self) -> bool {
        self.0.get_bit(11)
    }
    /// The address field, bits \[47:12\], as an address.
    pub fn address(self) -> PhysAddr {
        PhysAddr(self.0.get_bits(12..48) << 12)
    }
    /// DBM, bit \[51\].
    pub fn dbm(self) -> bool {
        self.0.get_bit(51)
    }
    /// Contiguous, bit \[52\].
    pub fn contiguous(self) -> bool {
        self.0.get_bit(52)
    }
    /// PXN, bit \[53\].
    pub fn pxn(self) -> bool {
        self.0.get_bit(53)
    }
    /// UXN, bit \[54\].
    pub fn uxn(self) -> bool {
        self.0.get_bit(54)
    }
    /// Software bits \[58:55\].
    pub fn software(self) -> u64 {
        self.0.get_bits(55..59)
    }
    /// The same descriptor with AttrIndx replaced.
    pub fn with_attr_index(mut self, index: u64) -> Descriptor {
        self.0.set_bits(2..5, index);
        self
    }
    /// The same descriptor with SH replaced.
    pub fn with_sh(mut self, sh: u64) -> Descriptor {
        self.0.set_bits(8..10, sh);
        self
    }
    /// The same descriptor with the address field replaced.
    pub fn with_address(mut self, pa: PhysAddr) -> Descriptor {
        self.0.set_bits(12..48, pa.0 >> 12);
        self
    }
    /// The same descriptor with the contiguous hint set or cleared.
    pub fn with_contiguous(mut self, on: bool) -> Descriptor {
        self.0.set_bit(52, on);
        self
    }
}

impl core::fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "Descriptor({:#018x}: v{} t{} attr{} ap{:02b} sh{:02b} af{} ng{} oa={:#x} dbm{} cont{} pxn{} uxn{} sw{:04b})",
            self.0,
            self.valid() as u8,
            self.table_or_page() as u8,
            self.attr_index(),
            self.ap(),
            self.sh(),
            self.af() as u8,
            self.ng() as u8,
            self.address().0,
            self.dbm() as u8,
            self.contiguous() as u8,
            self.pxn() as u8,
            self.uxn() as u8,
            self.software()
        )
    }
}

/// Which hardware management of the access flag and dirty state
/// (FEAT_HAFDBS) the CPU has and TCR_EL1 enables.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HwFeatures {
    /// TCR_EL1.HA: the hardware sets AF instead of raising an Access flag fault.
    pub access_flag: bool,
    /// TCR_EL1.HD: a store through a DBM leaf clears AP\[2\] instead of
    /// raising a Permission fault.
    pub dirty: bool,
}

impl HwFeatures {
    /// FEAT_HAFDBS with TCR_EL1.HA and TCR_EL1.HD set (what
    /// [`Format::hw_access`] models).
    pub const HAFDBS: HwFeatures = HwFeatures {
        access_flag: true,
        dirty: true,
    };
    /// No hardware updates: software handles Access flag and Permission faults.
    pub const NONE: HwFeatures = HwFeatures {
        access_flag: false,
        dirty: false,
    };
}

/// The arm64 stage 1 format with pages of `2^PAGE_SHIFT` bytes (the
/// translation granule: 12 = 4 KiB, 14 = 16 KiB, 16 = 64 KiB) and
/// `VA_BITS` bits of virtual address per half, as Linux builds it
/// (`CONFIG_ARM64_PAGE_SHIFT`, `CONFIG_ARM64_VA_BITS`):
///
/// | granule | `VA_BITS` | levels | root entries | alias |
/// |---|---|---|---|---|
/// | 4 KiB | 39 | 3 | 512 | [`Arm64Va39`] |
/// | 4 KiB | 48 | 4 | 512 | [`Arm64`] |
/// | 4 KiB | 52 (FEAT_LPA2) | 5 | 16 | [`Arm64Lpa2`] |
/// | 16 KiB | 36 | 2 | 2048 | [`Arm64K16Va36`] |
/// | 16 KiB | 47 | 3 | 2048 | [`Arm64K16Va47`] |
/// | 16 KiB | 48 | 4 | 2 | [`Arm64K16`] |
/// | 16 KiB | 52 (FEAT_LPA2) | 4 | 32 | [`Arm64K16Lpa2`] |
/// | 64 KiB | 42 | 2 | 8192 | [`Arm64K64Va42`] |
/// | 64 KiB | 48 | 3 | 64 | [`Arm64K64`] |
/// | 64 KiB | 52 (FEAT_LVA, FEAT_LPA) | 3 | 1024 | [`Arm64K64Va52`] |
///
/// The levels are Linux's `ARM64_HW_PGTABLE_LEVELS(VA_BITS)` =
/// `(VA_BITS - 4) / (PAGE_SHIFT - 3)`; any other pair does not compile:
///
/// ```compile_fail
/// use pgtable_arm64::Arm64Format;
/// use pgtable_core::contract::Format;
/// // 16 KiB pages with 39 bits is not one of Linux's geometries.
/// let levels = <Arm64Format<14, 39> as Format>::LEVELS;
/// ```
///
/// ```
/// use pgtable_arm64::Arm64Format;
/// use pgtable_core::contract::Format;
/// assert_eq!(<Arm64Format<14, 47> as Format>::LEVELS, 3);
/// ```
///
/// **Blocks** (Arm ARM D8.3.1, block descriptors per granule): every block
/// the architecture allows with the format's output address size:
/// 4 KiB: 2 MiB (L2) and 1 GiB (L1), plus 512 GiB (L0) with 52 bits;
/// 16 KiB: 32 MiB (L2), plus 64 GiB (L1) with 52 bits; 64 KiB: 512 MiB
/// (L2), plus 4 TiB (L1) with 52 bits. Linux maps only PMD blocks with
/// 16 and 64 KiB pages and no L0 blocks (`pud_sect_supported`); the
/// algorithms map the larger blocks only when asked to.
///
/// **Contiguous runs** ([`Format::cont_entries`]): Linux's `CONT_PTES` and
/// `CONT_PMDS` ([`Granule::cont_ptes`], [`Granule::cont_pmds`]): 16 / 16
/// (4 KiB), 128 / 32 (16 KiB), 32 / 32 (64 KiB).
///
/// **Output addresses** ([`Format::PA_BITS`] 48, or 52 for the 52-bit
/// formats): OA\[47:page shift\] in place. With FEAT_LPA2 (4 and 16 KiB,
/// `VA_BITS` 52, TCR_EL1.DS = 1) OA\[49:page shift\] in place and
/// OA\[51:50\] in bits \[9:8\] ([`OA_HIGH_LPA2`]): the descriptor has no SH
/// field then, shareability is TCR_EL1.SH0 / SH1 (inner shareable, as
/// [`tcr_value_for`](crate::tcr_value_for) sets). With 64 KiB and 52 bits
/// (FEAT_LPA) OA\[51:48\] in bits \[15:12\] ([`OA_HIGH_LPA_64K`]). Table
/// descriptors hold the next-level table address the same way (Linux
/// `__phys_to_pte_val` / `__pte_to_phys`).
///
/// Valid input addresses are canonical: `[0, 2^(VA-1))` (TTBR0_EL1) and
/// `[2^64 - 2^(VA-1), 2^64)` (TTBR1_EL1). One root serves both halves when
/// TTBR1_EL1 points at its second half and T0SZ = T1SZ = 65 - VA, which is
/// what [`tcr_value`](crate::tcr_value) computes: with [`Arm64`] root
/// entries 0–255 then translate the low half and 256–511 the high half,
/// exactly as the software walk indexes them ([`VaRange::Both`]). That
/// needs a half to take as many levels as the whole
/// ([`Arm64Format::SHARED_ROOT`]), which every geometry but 16 KiB with
/// 48 bits (a root of 2 entries) has.
///
/// As Linux does, an OS can instead give each register a whole `VA_BITS`
/// half ([`Format::SEPARATE_HALVES`]): a
/// [`VaRange::Lower`] address space for TTBR0_EL1 (`[0, 2^VA)`) and a
/// [`VaRange::Upper`] one for TTBR1_EL1 (`[2^64 - 2^VA, 2^64)`), each
/// using all entries of its root, with T0SZ = T1SZ = 64 - VA
/// ([`tcr_value_separate_halves`](crate::tcr_value_separate_halves)).
///
/// [`VaRange::Both`]: pgtable_core::VaRange::Both
/// [`VaRange::Lower`]: pgtable_core::VaRange::Lower
/// [`VaRange::Upper`]: pgtable_core::VaRange::Upper
#[derive(Clone, Copy, Debug, Default)]
pub struct Arm64Format<const PAGE_SHIFT: u32, const VA_BITS: u32>;

/// 4 KiB granule, 48-bit VA, 4 levels (L0 = PGD, L1 = PUD, L2 = PMD, L3 = PTE).
pub type Arm64 = Arm64Format<12, 48>;
/// 4 KiB granule, 39-bit VA, 3 levels (L1 = PGD with the PUD folded in,
/// L2 = PMD, L3 = PTE). L1 blocks (1 GiB) sit in the root.
pub type Arm64Va39 = Arm64Format<12, 39>;
/// 4 KiB granule, 52-bit VA and PA (FEAT_LPA2, TCR_EL1.DS = 1), 5 levels
/// from L-1 (a root of 16 entries).
pub type Arm64Lpa2 = Arm64Format<12, 52>;
/// 16 KiB granule, 48-bit VA, 4 levels; the L0 root has 2 entries.
pub type Arm64K16 = Arm64Format<14, 48>;
/// 16 KiB granule, 47-bit VA, 3 levels from a full L1 root.
pub type Arm64K16Va47 = Arm64Format<14, 47>;
/// 16 KiB granule, 36-bit VA, 2 levels from a full L2 root.
pub type Arm64K16Va36 = Arm64Format<14, 36>;
/// 16 KiB granule, 52-bit VA and PA (FEAT_LPA2, TCR_EL1.DS = 1), 4 levels
/// from an L0 root of 32 entries.
pub type Arm64K16Lpa2 = Arm64Format<14, 52>;
/// 64 KiB granule, 48-bit VA, 3 levels; the L1 root has 64 entries.
pub type Arm64K64 = Arm64Format<16, 48>;
/// 64 KiB granule, 42-bit VA, 2 levels from a full L2 root.
pub type Arm64K64Va42 = Arm64Format<16, 42>;
/// 64 KiB granule, 52-bit VA (FEAT_LVA) and PA (FEAT_LPA), 3 levels from an
/// L1 root of 1024 entries.
pub type Arm64K64Va52 = Arm64Format<16, 52>;

impl<const P: u32, const V: u32> Arm64Format<P, V> {
    /// The pair is one of Linux's geometries ([`Granule::va_bits_choices`]).
    const CHECK: () = assert!(
        matches!(
            (P, V),
            (12, 39 | 48 | 52) | (14, 36 | 47 | 48 | 52) | (16, 42 | 48 | 52)
        ),
        "arm64: PAGE_SHIFT 12 (VA_BITS 39, 48, 52), 14 (36, 47, 48, 52) or 16 (42, 48, 52)"
    );

    /// The translation granule.
    pub const GRANULE: Granule = {
        let () = Self::CHECK;
        match P {
            12 => Granule::K4,
            14 => Granule::K16,
            _ => Granule::K64,
        }
    };

    /// 52-bit output addresses: FEAT_LPA2 with 4 and 16 KiB, FEAT_LPA with
    /// 64 KiB (the 52-bit formats).
    pub const OA52: bool = V == 52;

    /// TCR_EL1.DS = 1 (FEAT_LPA2): the 52-bit formats of the 4 and 16 KiB
    /// granules.
    pub const DS: bool = Self::OA52 && P != 16;

    /// The descriptor bits of OA\[..:page shift\] that sit at their address
    /// bits: up to bit 47, or 49 with FEAT_LPA2.
    pub const OA_LOW_MASK: u64 = {
        let top = if Self::DS { 50 } else { 48 };
        ((1u64 << top) - 1) & !((1u64 << P) - 1)
    };

    /// The descriptor bits holding the top of a 52-bit address:
    /// [`OA_HIGH_LPA2`] (bits \[9:8\], OA\[51:50\]) with FEAT_LPA2,
    /// [`OA_HIGH_LPA_64K`] (bits \[15:12\], OA\[51:48\]) with 64 KiB
    /// and FEAT_LPA; none otherwise.
    pub const OA_HIGH_MASK: u64 = if Self::DS {
        OA_HIGH_LPA2
    } else if Self::OA52 {
        OA_HIGH_LPA_64K
    } else {
        0
    };

    /// Every descriptor bit that holds part of an output (or next-level
    /// table) address.
    pub const OA_FIELD_MASK: u64 = Self::OA_LOW_MASK | Self::OA_HIGH_MASK;

    /// Whether one root can serve both halves ([`VaRange::Both`]: TTBR1_EL1
    /// at the root's second half, T0SZ = T1SZ = 65 - VA): a half of
    /// `VA_BITS - 1` bits takes as many levels as `VA_BITS`. False only for
    /// 16 KiB with 48 bits, whose root has 2 entries.
    ///
    /// [`VaRange::Both`]: pgtable_core::VaRange::Both
    pub const SHARED_ROOT: bool = Self::GRANULE.levels(V - 1) == Self::GRANULE.levels(V);

    /// The address bits of an entry for the page- (or block-) aligned
    /// `pa` below `2^PA_BITS` (Linux `__phys_to_pte_val`).
    #[inline]
    pub const fn oa_bits(pa: u64) -> u64 {
        if !Self::OA52 {
            // A page-aligned address below 2^48 is its own field: no mask
            // (the store loops of `map` build every leaf through here).
            return pa;
        }
        let high = if Self::DS {
            ((pa >> 50) & 0b11) << 8
        } else if Self::OA52 {
            ((pa >> 48) & 0xf) << 12
        } else {
            0
        };
        (pa & Self::OA_LOW_MASK) | high
    }

    /// The address an entry holds (Linux `__pte_to_phys`): a table
    /// descriptor's next-level table, or a page's output address.
    #[inline]
    pub const fn address_of(raw: u64) -> u64 {
        let high = if Self::DS {
            ((raw >> 8) & 0b11) << 50
        } else if Self::OA52 {
            ((raw >> 12) & 0xf) << 48
        } else {
            0
        };
        (raw & Self::OA_LOW_MASK) | high
    }

    /// The output address of a leaf at `height`, with the bits below the
    /// leaf size cleared (they are RES0 or other fields, e.g. nT at bit 16
    /// of a block).
    #[inline]
    pub const fn leaf_address(raw: u64, height: u32) -> u64 {
        Self::address_of(raw & Self::leaf_oa_mask(height))
    }

    /// The descriptor bits that hold the output address of a leaf at
    /// `height`.
    #[inline]
    pub const fn leaf_oa_mask(height: u32) -> u64 {
        let size_mask = (1u64 << (P + (P - 3) * height)) - 1;
        (Self::OA_LOW_MASK & !size_mask) | Self::OA_HIGH_MASK
    }

    /// The Arm lookup level of `height` (3 for pages, 2 for PMDs, …;
    /// -1 for the root of [`Arm64Lpa2`]). Heights past the root give
    /// levels below -1, where nothing is allowed.
    const fn arm_level(height: u32) -> i8 {
        let h = if height > 5 { 5 } else { height };
        3 - h as i8
    }
}

/// Whether `raw` is a leaf that is writable (DBM, or AP\[2\] clear).
#[inline]
pub const fn is_writable(raw: u64) -> bool {
    raw & DBM != 0 || raw & AP_RDONLY == 0
}

/// Linux `pte_hw_dirty`: writable through DBM and AP\[2\] clear.
#[inline]
pub const fn is_hw_dirty(raw: u64) -> bool {
    raw & DBM != 0 && raw & AP_RDONLY == 0
}

/// Whether the contiguous hint is set.
#[inline]
pub const fn is_contiguous(raw: u64) -> bool {
    raw & CONT != 0
}

/// The leaf with the contiguous hint set (Linux `pte_mkcont`). The caller
/// must write 16 aligned adjacent entries with contiguous output addresses
/// and identical attributes (Arm ARM D8.6.1) before relying on it.
///
/// [`AddressSpace::map`](pgtable_core::AddressSpace::map) does this
/// itself ([`Format::cont_entries`] is 16 for pages and level-2 blocks):
/// every aligned run of 16 pages (64 KiB) or 16 2 MiB blocks (32 MiB) that
/// one call maps whole, with a physical address congruent to the virtual
/// one modulo the run size, is written *folded* (all 16 entries with the
/// hint), unless the caller opts out with
/// [`MapOptions::no_contiguous`](pgtable_core::MapOptions::no_contiguous).
/// Every operation that changes part of a run first unfolds the whole run
/// with break-before-make (clear the 16 entries, one TLB flush, rewrite
/// them without the hint, keeping the accessed/dirty state hardware set on
/// any of them), as Linux's `contpte_try_unfold` does; whole-run changes
/// keep the run folded, and reads OR the accessed/dirty state over the run
/// (Linux `contpte_ptep_get`).
#[inline]
pub const fn mk_contiguous(raw: u64) -> u64 {
    raw | CONT
}

/// What the hardware does on `access` through the leaf `raw` at `height`,
/// with the hardware updates `hw` enables (Arm ARM D8.4 "Memory access
/// control" and D8.5 "Hardware updates of the translation table").
///
/// Checks, in the order the Arm ARM prioritises the faults (Access flag
/// before Permission): AF clear without `hw.access_flag` is an Access flag
/// fault; an EL0 access without AP\[1\] is a Permission fault
/// ([`AccessFault::Privilege`]); an instruction fetch is refused by UXN
/// (EL0) or PXN (EL1; also implied for EL1 fetches from EL0-writable
/// memory); a store with AP\[2\] set is refused unless DBM is set and
/// `hw.dirty`, in which case the hardware clears AP\[2\] (marks it dirty).
/// A successful access sets AF (with `hw.access_flag`). A faulting access
/// leaves the entry unchanged in this model (the architecture allows but
/// does not require an AF update for it). PAN and WXN are not modelled
/// (both off).
pub fn hw_access_with(
    raw: u64,
    _height: u32,
    access: Access,
    hw: HwFeatures,
) -> Result<u64, AccessFault> {
    let mut new = raw;
    if raw & AF == 0 {
        if !hw.access_flag {
            return Err(AccessFault::AccessFlag);
        }
        new |= AF;
    }
    if access.user && raw & AP_EL0 == 0 {
        return Err(AccessFault::Privilege);
    }
    if access.exec {
        let el0_writable = raw & AP_EL0 != 0 && raw & AP_RDONLY == 0;
        let xn = if access.user {
            raw & UXN != 0
        } else {
            raw & PXN != 0 || el0_writable
        };
        if xn {
            return Err(AccessFault::Exec);
        }
    }
    if access.write && raw & AP_RDONLY != 0 {
        if raw & DBM != 0 && hw.dirty {
            new &= !AP_RDONLY;
        } else {
            return Err(AccessFault::Write);
        }
    }
    Ok(new)
}

// SAFETY: above height 0 an entry decodes as a table exactly when VALID
// and bit 1 are both set, and to the address its `OA_FIELD_MASK` bits
// hold (`address_of`), which `table_entry` builds from the address with
// `oa_bits`, its inverse for page-aligned addresses below 2^PA_BITS (bits
// [47:page shift], or [49:page shift] and [9:8] with FEAT_LPA2, or
// [47:16] and [15:12] with 64 KiB and FEAT_LPA; `table_entry_attrs` adds
// only bits 59-62, outside all of them). Leaves above height 0
// never have bit 1: `leaf_template` sets it at height 0 only,
// `modify_prot` rebuilds from the template and keeps only the address,
// AF, CONT and software bits (55-58), `mk_cont`/`clear_cont` change bit
// 52 only, `split_leaf` sets it only for
// height-0 children, `hw_access` sets AF and clears AP[2] (bits 10
// and 7), and the `mk*` methods change only AF, AP[2] and the software
// dirty bit (55). Height 0 never decodes as a table. Software entries have
// VALID clear and bit 58 clear, so they decode as invalid at every height;
// a PROT_NONE leaf (VALID clear, bit 58 set) decodes as a leaf or invalid,
// never as a table. Every method is pure.
unsafe impl<const P: u32, const V: u32> Format for Arm64Format<P, V> {
    const NAME: &'static str = match (P, V) {
        (12, 39) => "arm64-4K-39bit",
        (12, 48) => "arm64-4K-48bit",
        (12, 52) => "arm64-4K-52bit",
        (14, 36) => "arm64-16K-36bit",
        (14, 47) => "arm64-16K-47bit",
        (14, 48) => "arm64-16K-48bit",
        (14, 52) => "arm64-16K-52bit",
        (16, 42) => "arm64-64K-42bit",
        (16, 48) => "arm64-64K-48bit",
        _ => "arm64-64K-52bit",
    };
    /// Linux `ARM64_HW_PGTABLE_LEVELS(VA_BITS)`.
    const LEVELS: u32 = {
        let () = Self::CHECK;
        (V - 4) / (P - 3)
    };
    const PA_BITS: u32 = if Self::OA52 { 52 } else { 48 };
    const PAGE_SHIFT: u32 = P;
    const VA_BITS: u32 = V;

    /// Pages at L3; blocks where the granule allows them (the table of
    /// [`Arm64Format`]; [`Granule::block_shift`]).
    #[inline]
    fn leaf_allowed(height: u32) -> bool {
        height == 0
            || Self::GRANULE
                .block_shift(Self::arm_level(height), Self::OA52)
                .is_some()
    }

    #[inline]
    fn decode(raw: u64, height: u32) -> Decoded {
        if raw == 0 {
            return Decoded::None;
        }
        if raw & VALID == 0 {
            // A PROT_NONE leaf: what its valid twin decodes to, if a leaf.
            return match Self::decode(raw | VALID, height) {
                Decoded::Leaf(pa) if raw & PROT_NONE != 0 => Decoded::Leaf(pa),
                _ => Decoded::Invalid,
            };
        }
        let table_or_page = raw & TABLE_OR_PAGE != 0;
        match height {
            0 if table_or_page => Decoded::Leaf(PhysAddr(Self::leaf_address(raw, 0))),
            // L3 with bit 1 clear is reserved: treated as invalid.
            0 => Decoded::Invalid,
            _ if table_or_page => Decoded::Table(PhysAddr(Self::leaf_address(raw, 0))),
            _ if Self::leaf_allowed(height) => {
                Decoded::Leaf(PhysAddr(Self::leaf_address(raw, height)))
            }
            // A block where the granule has none is invalid.
            _ => Decoded::Invalid,
        }
    }

    #[inline]
    fn table_entry(pa: PhysAddr, _height: u32) -> u64 {
        debug_assert_eq!(Self::address_of(Self::oa_bits(pa.0)), pa.0);
        Self::oa_bits(pa.0) | TABLE_OR_PAGE | VALID
    }

    /// [`Arm64Format::oa_bits`]: the address in place, and with 52 bits
    /// its top in bits \[9:8\] (FEAT_LPA2) or \[15:12\] (64 KiB, FEAT_LPA).
    #[inline]
    fn oa_field(pa: PhysAddr) -> u64 {
        Self::oa_bits(pa.0)
    }

    #[inline]
    fn leaf_template(prot: Prot, height: u32) -> u64 {
        // With FEAT_LPA2 bits [9:8] are OA[51:50]; shareability is TCR_EL1's.
        let sh = if Self::DS { 0 } else { SH_INNER };
        let mut v = VALID | sh | AF | (attr_index(prot.mem()) << ATTR_INDX_SHIFT);
        if height == 0 {
            v |= TABLE_OR_PAGE;
        }
        if !prot.global() {
            v |= NG;
        }
        if prot.user() {
            // EL0 access; never executable at EL1.
            v |= AP_EL0 | PXN;
            if !prot.executable() {
                v |= UXN;
            }
            // Writable user leaves start clean: DBM | RDONLY.
            v |= AP_RDONLY;
            if prot.writable() {
                v |= DBM;
            }
        } else {
            // Kernel: never executable at EL0.
            v |= UXN;
            if !prot.executable() {
                v |= PXN;
            }
            // PAGE_KERNEL style: writable = DBM with RDONLY clear (dirty).
            if prot.writable() {
                v |= DBM;
            } else {
                v |= AP_RDONLY;
            }
        }
        // PROT_NONE: the kernel read-only twin built above (`Prot`'s
        // accessors say no to every right), invalid for the hardware.
        if prot.protnone() {
            v = v & !VALID | PROT_NONE;
        }
        v
    }

    #[inline]
    fn leaf_prot(raw: u64, _height: u32) -> Prot {
        if raw & VALID == 0 {
            let mem = mem_type((raw & ATTR_INDX_MASK) >> ATTR_INDX_SHIFT);
            return Prot::NONE.with_mem(mem);
        }
        let user = raw & AP_EL0 != 0;
        let mut bits = Prot::empty();
        if is_writable(raw) {
            bits |= Prot::WRITE;
        }
        if user {
            bits |= Prot::USER;
        }
        let xn = if user { raw & UXN } else { raw & PXN };
        if xn == 0 {
            bits |= Prot::EXEC;
        }
        if raw & NG == 0 {
            bits |= Prot::GLOBAL;
        }
        bits.with_mem(mem_type((raw & ATTR_INDX_MASK) >> ATTR_INDX_SHIFT))
    }

    #[inline]
    fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64 {
        // Keep the address, the access flag, the contiguous hint and the
        // software bits (the hint is right to keep: the algorithms change
        // a folded run whole, or unfold it first, so all 16 entries get
        // the same new protection); carry the dirty state across (Linux `pte_modify`:
        // hardware dirty becomes software dirty, and a writable result of a
        // dirty leaf is made hardware dirty again).
        let dirty = Self::is_dirty(raw);
        // The PROT_NONE marker comes from the template, like VALID.
        let keep = raw & (Self::leaf_oa_mask(height) | AF | CONT | (SW_MASK & !PROT_NONE));
        let mut new = (Self::leaf_template(prot, height) & !AF) | keep;
        if dirty {
            new |= SW_DIRTY;
            if new & DBM != 0 {
                new &= !AP_RDONLY;
            }
        }
        new
    }

    #[inline]
    fn split_leaf(raw: u64, height: u32) -> u64 {
        // The contiguous hint describes 16 entries of the parent's size; it
        // does not carry over to the children (and the algorithms unfold
        // the block's run, its 15 siblings included, before a split).
        let child = raw & !CONT;
        if height == 1 {
            child | TABLE_OR_PAGE
        } else {
            child
        }
    }

    #[inline]
    fn is_young(raw: u64) -> bool {
        raw & AF != 0
    }

    #[inline]
    fn is_dirty(raw: u64) -> bool {
        is_hw_dirty(raw) || raw & SW_DIRTY != 0
    }

    /// AF set, and not writable-but-clean (DBM with AP\[2\] set): the only
    /// hardware updates (FEAT_HAFDBS) set AF and clear AP\[2\] of a DBM leaf.
    #[inline]
    fn is_settled(raw: u64, _height: u32) -> bool {
        raw & AF != 0 && raw & (DBM | AP_RDONLY) != (DBM | AP_RDONLY)
    }

    /// Models FEAT_HAFDBS with TCR_EL1.HA and TCR_EL1.HD set
    /// ([`hw_access_with`] with [`HwFeatures::HAFDBS`]).
    #[inline]
    fn hw_access(raw: u64, height: u32, access: Access) -> Result<u64, AccessFault> {
        hw_access_with(raw, height, access, HwFeatures::HAFDBS)
    }

    /// Valid clear (a [`Prot::NONE`] leaf; see [`PROT_NONE`]).
    #[inline]
    fn is_protnone(raw: u64, _height: u32) -> bool {
        raw & VALID == 0
    }

    /// 46 bits (bits 57:12 of an invalid descriptor; see the module docs).
    const SWP_VALUE_BITS: u32 = 46;

    #[inline]
    fn swp_entry(value: u64) -> Option<u64> {
        (value >> Self::SWP_VALUE_BITS == 0).then_some(value << SWP_VALUE_SHIFT | SWP_TAG)
    }

    #[inline]
    fn swp_value(raw: u64) -> Option<u64> {
        let high = raw >> (SWP_VALUE_SHIFT + Self::SWP_VALUE_BITS);
        (raw & 0xfff == SWP_TAG && high == 0).then_some(raw >> SWP_VALUE_SHIFT)
    }

    /// TTBR0_EL1 and TTBR1_EL1 each translate a whole `VA_BITS` half with
    /// [`tcr_value_separate_halves`](crate::tcr_value_separate_halves).
    const SEPARATE_HALVES: bool = true;

    /// A table descriptor with the hierarchical attributes of Arm ARM
    /// D8.3.1 (table descriptor bits \[63:59\]) and D8.4.2: `APTable[0]`
    /// (bit 61) for [`TableAttrs::NO_USER`], `APTable[1]` (bit 62) for
    /// [`TableAttrs::READ_ONLY`], `UXNTable` (bit 60) and `PXNTable`
    /// (bit 59). Linux uses `PXNTable` on user tables (`PMD_TABLE_PXN`,
    /// `PUD_TABLE_PXN`, `P4D_TABLE_PXN`).
    #[inline]
    fn table_entry_attrs(pa: PhysAddr, height: u32, attrs: TableAttrs) -> u64 {
        let mut v = Self::table_entry(pa, height);
        if attrs.no_user() {
            v |= AP_TABLE_NO_EL0;
        }
        if attrs.read_only() {
            v |= AP_TABLE_RDONLY;
        }
        if attrs.uxn() {
            v |= UXN_TABLE;
        }
        if attrs.pxn() {
            v |= PXN_TABLE;
        }
        v
    }

    #[inline]
    fn table_limits(raw: u64, _height: u32) -> TableAttrs {
        let mut b = 0;
        if raw & AP_TABLE_NO_EL0 != 0 {
            b |= TableAttrs::NO_USER;
        }
        if raw & AP_TABLE_RDONLY != 0 {
            b |= TableAttrs::READ_ONLY;
        }
        if raw & UXN_TABLE != 0 {
            b |= TableAttrs::UXN;
        }
        if raw & PXN_TABLE != 0 {
            b |= TableAttrs::PXN;
        }
        TableAttrs::new(b)
    }

    /// Linux `CONT_PTES` pages and `CONT_PMDS` level-2 blocks (Arm ARM
    /// D8.7.1, Table D8-104): 16 and 16 with 4 KiB (64 KiB, 32 MiB), 128
    /// and 32 with 16 KiB (2 MiB, 1 GiB), 32 and 32 with 64 KiB (2 MiB,
    /// 16 GiB). Linux uses no level-1 runs, nor does this crate.
    #[inline]
    fn cont_entries(height: u32) -> u32 {
        match height {
            0 => Self::GRANULE.cont_ptes() as u32,
            1 => Self::GRANULE.cont_pmds() as u32,
            _ => 0,
        }
    }

    #[inline]
    fn mk_cont(raw: u64, _height: u32) -> u64 {
        raw | CONT
    }

    #[inline]
    fn clear_cont(raw: u64, _height: u32) -> u64 {
        raw & !CONT
    }

    #[inline]
    fn is_cont(raw: u64, _height: u32) -> bool {
        raw & CONT != 0
    }

    /// Linux arm64 `pte_mkold`: AF clear. With FEAT_HAFDBS the next access
    /// sets it again; without, it raises an Access flag fault.
    #[inline]
    fn mkold(raw: u64, _height: u32) -> u64 {
        raw & !AF
    }

    /// Linux arm64 `pte_mkyoung`: AF set.
    #[inline]
    fn mkyoung(raw: u64, _height: u32) -> u64 {
        raw | AF
    }

    /// Linux arm64 `pte_mkclean`: the software dirty bit clear and AP\[2\]
    /// (read-only) set. A writable leaf keeps DBM, so it stays writable:
    /// the next store clears AP\[2\] again in hardware (FEAT_HAFDBS,
    /// TCR_EL1.HD; Arm ARM D8.5 "Hardware updates of the translation
    /// table"), or faults where that is off and the fault handler marks it
    /// dirty ([`mkdirty`](Format::mkdirty)).
    #[inline]
    fn mkclean(raw: u64, _height: u32) -> u64 {
        (raw & !SW_DIRTY) | AP_RDONLY
    }

    /// Linux arm64 `pte_mkdirty`: the software dirty bit set, and AP\[2\]
    /// cleared if the leaf is writable (DBM set). A read-only leaf stays
    /// read-only.
    #[inline]
    fn mkdirty(raw: u64, _height: u32) -> u64 {
        let d = raw | SW_DIRTY;
        if d & DBM != 0 {
            d & !AP_RDONLY
        } else {
            d
        }
    }
}

/// Stores `val` and, when it is valid, issues the walker barrier (Linux
/// arm64 `__set_pte` / `set_pmd` / `set_pud`: `dsb ishst; isb` so the walker
/// sees the entry before the next instruction can use it). Linux skips the
/// barrier for user PTEs and relies on spurious-fault handling; a kernel
/// built on this crate may have no such handler, so every valid entry gets it.
#[inline]
fn set_valid_at<M: Mmu>(mmu: &M, slot: &Slot, val: u64) {
    generic::set_entry_nosync(mmu, slot, val);
    if val & VALID != 0 {
        mmu.walker_barrier();
    }
}

// SAFETY: the overridden setters store the value they are given (then
// maybe issue a barrier); `pmdp_modify_prot_start` is the generic deferred
// one (an atomic swap with 0 that returns the old value); every other
// entry operation is the generic fallback.
unsafe impl<const P: u32, const V: u32> Arch for Arm64Format<P, V> {
    const HAVE_MOVE_PMD: bool = true;
    const HAVE_MOVE_PUD: bool = true;
    /// Linux `MAX_DVM_OPS` = `PTRS_PER_PTE` ([`max_tlbi_ops_for`](crate::flush::max_tlbi_ops_for)).
    const TLB_FLUSH_CEILING: u64 = crate::flush::max_tlbi_ops_for(Self::GRANULE);
    const NEEDS_WALKER_BARRIER: bool = true;
    const BREAK_BEFORE_MAKE: bool = true;

    #[inline]
    fn set_pte_at<M: Mmu>(mmu: &M, _va: VirtAddr, slot: &Slot, pte: u64) {
        set_valid_at(mmu, slot, pte)
    }

    #[inline]
    fn set_pmd_at<M: Mmu>(mmu: &M, _va: VirtAddr, slot: &Slot, pmd: u64) {
        set_valid_at(mmu, slot, pmd)
    }

    #[inline]
    fn set_pud_at<M: Mmu>(mmu: &M, _va: VirtAddr, slot: &Slot, pud: u64) {
        set_valid_at(mmu, slot, pud)
    }

    // The generic `set_pte_nosync` (store only; the `dsb ishst; isb` comes
    // once at the end of the table or of the lazy-MMU scope, as in
    // Linux "arm64: mm: Batch dsb and isb when populating pgtables") and
    // the generic get-and-clear (an atomic swap with 0: an `ldxr`/`stxr`
    // loop, or `swp` with LSE, so an AF or dirty update by the walker racing
    // the clear is returned) are already what arm64 needs.

    /// Linux "arm64: mm: rework the pmd protect changing flow": the atomic get-and-clear alone
    /// makes the hardware's
    /// accessed/dirty updates safe (an invalid entry is never cached nor
    /// updated), so the immediate flush of the generic `pmdp_invalidate`
    /// is dropped; the operation's one gathered flush removes the old block.
    #[inline]
    fn pmdp_modify_prot_start<M: Mmu>(mmu: &M, va: VirtAddr, slot: &Slot, height: u32) -> u64 {
        generic::pmdp_modify_prot_start_deferred::<Self, M>(mmu, va, slot, height)
    }

    #[inline]
    fn change_is_safe(old: u64, new: u64, height: u32) -> bool {
        crate::bbm::pgattr_change_is_safe(old, new, height)
    }
}

mod sealed {
    /// Only [`Arm64Format`](super::Arm64Format) is an arm64 geometry.
    pub trait Sealed {}
}

/// What the arm64 code outside the format (checked entries,
/// break-before-make, the MMU's TLB maintenance and TCR_EL1 setup) needs to
/// know about an [`Arm64Format`]: implemented by every `Arm64Format` and
/// nothing else.
pub trait Arm64Geometry: Arch + sealed::Sealed {
    /// [`Arm64Format::GRANULE`].
    const GRANULE: Granule;
    /// [`Arm64Format::DS`]: TCR_EL1.DS = 1 (FEAT_LPA2).
    const DS: bool;
    /// [`Arm64Format::OA52`]: 52-bit output addresses.
    const OA52: bool;
    /// [`Arm64Format::OA_FIELD_MASK`].
    const OA_FIELD_MASK: u64;
    /// [`Arm64Format::SHARED_ROOT`].
    const SHARED_ROOT: bool;
}

impl<const P: u32, const V: u32> sealed::Sealed for Arm64Format<P, V> {}

impl<const P: u32, const V: u32> Arm64Geometry for Arm64Format<P, V> {
    const GRANULE: Granule = Arm64Format::<P, V>::GRANULE;
    const DS: bool = Arm64Format::<P, V>::DS;
    const OA52: bool = Arm64Format::<P, V>::OA52;
    const OA_FIELD_MASK: u64 = Arm64Format::<P, V>::OA_FIELD_MASK;
    const SHARED_ROOT: bool = Arm64Format::<P, V>::SHARED_ROOT;
}
