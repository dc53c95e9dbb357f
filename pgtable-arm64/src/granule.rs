//! Translation granules (4, 16 and 64 KiB), the geometries Linux builds
//! with them, and the CPU features each one needs (pure, host-testable).
//!
//! - [`Granule`]: page size, bits per level, the block sizes and
//!   contiguous-run lengths the architecture allows at each lookup level,
//!   and the TCR_EL1 / TLBI encodings of the granule.
//! - [`Geometry`]: a granule with a virtual address size Linux offers for
//!   it (its `ARM64_VA_BITS_*` choices), and the levels that takes.
//! - [`MmuFeatures`] and [`check_geometry`]: what ID_AA64MMFR0_EL1 and
//!   ID_AA64MMFR2_EL1 say about the granules, 52-bit virtual addresses and
//!   the physical address size, and a typed [`GeometryUnsupported`] saying
//!   which of them a CPU lacks for a geometry.
//!
//! Lookup levels are numbered as the Arm ARM numbers them: level 3 holds
//! the page descriptors, level 2 the tables above it, and so on up to
//! level -1, which only the 4 KiB granule with 52-bit addresses
//! (TCR_EL1.DS = 1) has.
//!
//! Sources: Arm ARM D8.2.8 "VMSAv8-64 translation using the 4KB granule",
//! D8.2.9 (16KB granule), D8.2.10 (64KB granule), D8.1.8 "Supported
//! virtual address ranges", D8.7.1 "The Contiguous bit" (Table D8-104),
//! D24.2 "ID_AA64MMFR0_EL1" and "ID_AA64MMFR2_EL1"; Linux
//! `ARM64_HW_PGTABLE_LEVELS` and `ARM64_HW_PGTABLE_LEVEL_SHIFT`
//! (`asm/pgtable-hwdef.h`), `CONFIG_ARM64_CONT_PTE_SHIFT` /
//! `CONFIG_ARM64_CONT_PMD_SHIFT` and the `ARM64_VA_BITS_*` choices
//! (`arch/arm64/Kconfig`).

use core::fmt;

/// A VMSAv8-64 translation granule: the page size, and with it the size of
/// every translation table (one page of 8-byte descriptors).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Granule {
    /// 4 KiB pages, 512 entries per table.
    K4,
    /// 16 KiB pages, 2048 entries per table.
    K16,
    /// 64 KiB pages, 8192 entries per table.
    K64,
}

impl Granule {
    /// Every granule, smallest first.
    pub const ALL: [Granule; 3] = [Granule::K4, Granule::K16, Granule::K64];

    /// log2 of the page size: 12, 14 or 16 (Linux `PAGE_SHIFT`).
    pub const fn page_shift(self) -> u32 {
        match self {
            Granule::K4 => 12,
            Granule::K16 => 14,
            Granule::K64 => 16,
        }
    }

    /// The page size in bytes.
    pub const fn page_size(self) -> u64 {
        1 << self.page_shift()
    }

    /// Virtual address bits one table level resolves: `page_shift - 3`
    /// (a table is one page of 8-byte descriptors; Linux
    /// `PTDESC_TABLE_SHIFT`, formerly `PAGE_SHIFT - 3`).
    pub const fn bits_per_level(self) -> u32 {
        self.page_shift() - 3
    }

    /// Entries in a full table: `2^bits_per_level` (Linux `PTRS_PER_PTE`).
    pub const fn entries_per_table(self) -> u64 {
        1 << self.bits_per_level()
    }

    /// The number of table levels that translate `va_bits` of virtual
    /// address: Linux `ARM64_HW_PGTABLE_LEVELS(va_bits)` =
    /// `(va_bits - 4) / (page_shift - 3)`, which is
    /// `ceil((va_bits - page_shift) / (page_shift - 3))`. Zero when
    /// `va_bits` does not exceed the page offset.
    pub const fn levels(self, va_bits: u32) -> u32 {
        if va_bits <= self.page_shift() {
            return 0;
        }
        (va_bits - 4) / self.bits_per_level()
    }

    /// log2 of the address range one entry at Arm lookup `level` maps:
    /// Linux `ARM64_HW_PGTABLE_LEVEL_SHIFT(level)` =
    /// `(page_shift - 3) * (4 - level) + 3`. Level 3 maps a page, level 2
    /// a PMD-sized block, and so on. `None` outside -1..=3.
    pub const fn level_shift(self, level: i8) -> Option<u32> {
        if level < -1 || level > 3 {
            return None;
        }
        Some(self.bits_per_level() * (4 - level) as u32 + 3)
    }

    /// Whether a Block descriptor is allowed at Arm lookup `level`, and
    /// the log2 of its size if so (Arm ARM Tables D8-17, D8-27, D8-36,
    /// "granule block descriptor properties at each lookup level"):
    ///
    /// | granule | level 0 | level 1 | level 2 |
    /// |---|---|---|---|
    /// | 4 KiB | 512 GiB, only with `oa52` | 1 GiB | 2 MiB |
    /// | 16 KiB | — | 64 GiB, only with `oa52` | 32 MiB |
    /// | 64 KiB | — | 4 TiB, only with `oa52` | 512 MiB |
    ///
    /// `oa52` is the condition the Arm ARM gives for the large blocks:
    /// TCR_EL1.DS = 1 (FEAT_LPA2) for the 4 and 16 KiB granules, FEAT_LPA
    /// (52-bit physical addresses) for the 64 KiB granule. Level 3 holds
    /// pages, not blocks: `None`. Linux maps blocks at the PMD level
    /// (level 2) with every granule and at the PUD level (level 1) only
    /// with 4 KiB pages (`pud_sect_supported()`).
    pub const fn block_shift(self, level: i8, oa52: bool) -> Option<u32> {
        let large = match self {
            Granule::K4 => 0,
            Granule::K16 | Granule::K64 => 1,
        };
        let allowed = match level {
            2 => true,
            1 if matches!(self, Granule::K4) => true,
            _ => level == large && oa52,
        };
        if allowed {
            self.level_shift(level)
        } else {
            None
        }
    }

    /// How many adjacent entries at Arm lookup `level` the Contiguous bit
    /// groups (Arm ARM Table D8-104, VMSAv8-64):
    ///
    /// | granule | level 1 | level 2 | level 3 |
    /// |---|---|---|---|
    /// | 4 KiB | 16 (16 GiB) | 16 (32 MiB) | 16 (64 KiB) |
    /// | 16 KiB | — | 32 (1 GiB) | 128 (2 MiB) |
    /// | 64 KiB | — | 32 (16 GiB) | 32 (2 MiB) |
    ///
    /// `None` where the bit has no effect. Linux uses levels 3 and 2 only
    /// ([`cont_ptes`](Self::cont_ptes), [`cont_pmds`](Self::cont_pmds)).
    pub const fn contiguous_entries(self, level: i8) -> Option<u64> {
        match (self, level) {
            (Granule::K4, 1..=3) => Some(16),
            (Granule::K16, 2) => Some(32),
            (Granule::K16, 3) => Some(128),
            (Granule::K64, 2 | 3) => Some(32),
            _ => None,
        }
    }

    /// Linux `CONT_PTES`: page entries in one contiguous run,
    /// `2^CONFIG_ARM64_CONT_PTE_SHIFT` (16, 128, 32).
    pub const fn cont_ptes(self) -> u64 {
        match self {
            Granule::K4 => 16,
            Granule::K16 => 128,
            Granule::K64 => 32,
        }
    }

    /// Linux `CONT_PMDS`: level 2 block entries in one contiguous run,
    /// `2^CONFIG_ARM64_CONT_PMD_SHIFT` (16, 32, 32).
    pub const fn cont_pmds(self) -> u64 {
        match self {
            Granule::K4 => 16,
            Granule::K16 | Granule::K64 => 32,
        }
    }

    /// The TCR_EL1.TG0 encoding, bits \[15:14\]: 4 KiB = 0b00,
    /// 64 KiB = 0b01, 16 KiB = 0b10 (Arm ARM D24.2 "TCR_EL1"; Linux
    /// `TCR_TG0_4K` / `TCR_TG0_64K` / `TCR_TG0_16K`).
    pub const fn tcr_tg0(self) -> u64 {
        match self {
            Granule::K4 => 0b00,
            Granule::K64 => 0b01,
            Granule::K16 => 0b10,
        }
    }

    /// The TCR_EL1.TG1 encoding, bits \[31:30\], which differs from TG0:
    /// 16 KiB = 0b01, 4 KiB = 0b10, 64 KiB = 0b11 (Linux `TCR_TG1_16K` /
    /// `TCR_TG1_4K` / `TCR_TG1_64K`).
    pub const fn tcr_tg1(self) -> u64 {
        match self {
            Granule::K16 => 0b01,
            Granule::K4 => 0b10,
            Granule::K64 => 0b11,
        }
    }

    /// The granule as TLBI operands encode it: the range operand's TG
    /// field and the by-VA operand's TTL\[3:2\]: 4 KiB = 0b01,
    /// 16 KiB = 0b10, 64 KiB = 0b11 (Arm ARM C5.5 "TLBI RVAE1IS" and
    /// "TLBI VAE1IS"; Linux `TLBI_TTL_TG_4K` / `_16K` / `_64K`).
    pub const fn tlbi_tg(self) -> u64 {
        match self {
            Granule::K4 => 0b01,
            Granule::K16 => 0b10,
            Granule::K64 => 0b11,
        }
    }

    /// The virtual address sizes Linux offers for this granule
    /// (`ARM64_VA_BITS_*` in `arch/arm64/Kconfig`): 4 KiB: 39, 48, 52;
    /// 16 KiB: 36, 47, 48, 52; 64 KiB: 42, 48, 52. 52 bits needs FEAT_LPA2
    /// and TCR_EL1.DS = 1 with 4 and 16 KiB, FEAT_LVA with 64 KiB.
    pub const fn va_bits_choices(self) -> &'static [u32] {
        match self {
            Granule::K4 => &[39, 48, 52],
            Granule::K16 => &[36, 47, 48, 52],
            Granule::K64 => &[42, 48, 52],
        }
    }

    /// Whether TCR_EL1.DS exists for this granule: it is RES0 with 64 KiB
    /// (Arm ARM D24.2 "TCR_EL1", DS).
    pub const fn has_ds(self) -> bool {
        !matches!(self, Granule::K64)
    }
}

impl fmt::Display for Granule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kib = match self {
            Granule::K4 => 4,
            Granule::K16 => 16,
            Granule::K64 => 64,
        };
        write!(f, "{kib} KiB granule")
    }
}

/// A configuration that is not a valid geometry, whatever the CPU.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GeometryError {
    /// `va_bits` is not one of [`Granule::va_bits_choices`].
    VaBits {
        /// The granule.
        granule: Granule,
        /// The virtual address size asked for.
        va_bits: u32,
    },
    /// `pa_bits` is not a size ID_AA64MMFR0_EL1.PARange / TCR_EL1.IPS
    /// encode (32, 36, 40, 42, 44, 48, 52).
    PaBits {
        /// The physical address size asked for.
        pa_bits: u32,
    },
    /// TCR_EL1.DS = 1 with the 64 KiB granule, where DS is RES0.
    DsWith64K,
    /// More than 48 bits of virtual or physical address with the 4 or
    /// 16 KiB granule and TCR_EL1.DS = 0: those granules describe 52-bit
    /// addresses only with DS = 1.
    NeedsDs {
        /// The granule.
        granule: Granule,
        /// The virtual address size.
        va_bits: u32,
        /// The physical address size.
        pa_bits: u32,
    },
    /// One root cannot serve both halves (TTBR1_EL1 at its second half,
    /// T0SZ = T1SZ = 65 - VA): a half of `va_bits - 1` bits takes fewer
    /// levels than the root's (16 KiB with 48 bits, whose root has 2
    /// entries). Give each half its own root instead.
    NoSharedRoot {
        /// The granule.
        granule: Granule,
        /// The virtual address size.
        va_bits: u32,
    },
}

impl fmt::Display for GeometryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GeometryError::VaBits { granule, va_bits } => write!(
                f,
                "{va_bits}-bit virtual addresses are not a geometry of the {granule} (one of {:?})",
                granule.va_bits_choices()
            ),
            GeometryError::PaBits { pa_bits } => write!(
                f,
                "{pa_bits}-bit physical addresses are not an encodable size \
                 (32, 36, 40, 42, 44, 48 or 52)"
            ),
            GeometryError::DsWith64K => {
                write!(f, "TCR_EL1.DS is RES0 with the 64 KiB granule")
            }
            GeometryError::NeedsDs {
                granule,
                va_bits,
                pa_bits,
            } => write!(
                f,
                "{va_bits}-bit VA / {pa_bits}-bit PA with the {granule} needs TCR_EL1.DS = 1 \
                 (52-bit addresses, FEAT_LPA2)"
            ),
            GeometryError::NoSharedRoot { granule, va_bits } => write!(
                f,
                "one {va_bits}-bit root of the {granule} cannot serve both halves: \
                 a half takes fewer levels; use separate roots"
            ),
        }
    }
}

impl core::error::Error for GeometryError {}

/// A granule and a virtual address size that Linux builds page tables for
/// ([`Granule::va_bits_choices`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Geometry {
    granule: Granule,
    va_bits: u32,
}

impl Geometry {
    /// `granule` with `va_bits` of virtual address, if that is one of the
    /// granule's [choices](Granule::va_bits_choices).
    pub const fn new(granule: Granule, va_bits: u32) -> Result<Geometry, GeometryError> {
        let choices = granule.va_bits_choices();
        let mut i = 0;
        while i < choices.len() {
            if choices[i] == va_bits {
                return Ok(Geometry { granule, va_bits });
            }
            i += 1;
        }
        Err(GeometryError::VaBits { granule, va_bits })
    }

    /// The granule.
    pub const fn granule(self) -> Granule {
        self.granule
    }

    /// The virtual address size.
    pub const fn va_bits(self) -> u32 {
        self.va_bits
    }

    /// The number of table levels ([`Granule::levels`]): 4 KiB: 3, 4, 5;
    /// 16 KiB: 2, 3, 4, 4; 64 KiB: 2, 3, 3.
    pub const fn levels(self) -> u32 {
        self.granule.levels(self.va_bits)
    }

    /// The Arm lookup level of the root table: `4 - levels` (-1 for
    /// 4 KiB pages with 52 bits).
    pub const fn start_level(self) -> i8 {
        4 - self.levels() as i8
    }

    /// Entries the root table uses: `2^(va_bits - shift of a root entry)`,
    /// at most a full table (e.g. 16 for 4 KiB with 52 bits, 2 for 16 KiB
    /// with 48 bits, 64 for 64 KiB with 48 bits).
    pub const fn root_entries(self) -> u64 {
        // An entry of the root, at lookup level `4 - levels`, maps
        // 2^(bits_per_level * levels + 3) bytes (`level_shift`).
        let root_shift = self.granule.bits_per_level() * self.levels() + 3;
        1 << (self.va_bits - root_shift)
    }

    /// Whether this size needs 52-bit virtual addressing: FEAT_LPA2 with
    /// TCR_EL1.DS = 1 for 4 and 16 KiB, FEAT_LVA for 64 KiB.
    pub const fn is_52bit(self) -> bool {
        self.va_bits > 48
    }
}

/// What ID_AA64MMFR0_EL1.TGran4 / TGran16 / TGran64 say about one granule.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GranuleSupport {
    /// The granule is not implemented.
    None,
    /// The granule is implemented, with 48-bit addresses.
    Supported,
    /// The granule is implemented and, with TCR_EL1.DS = 1, takes 52-bit
    /// input and output addresses (FEAT_LPA2; 4 and 16 KiB only).
    Lpa2,
}

/// The memory-model features that decide which geometries a CPU can run,
/// decoded from its ID registers (Arm ARM D24.2 "ID_AA64MMFR0_EL1",
/// "ID_AA64MMFR2_EL1").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MmuFeatures {
    /// ID_AA64MMFR0_EL1.TGran4, bits \[31:28\].
    pub tgran4: u8,
    /// ID_AA64MMFR0_EL1.TGran16, bits \[23:20\].
    pub tgran16: u8,
    /// ID_AA64MMFR0_EL1.TGran64, bits \[27:24\].
    pub tgran64: u8,
    /// ID_AA64MMFR0_EL1.PARange, bits \[3:0\].
    pub pa_range: u8,
    /// ID_AA64MMFR2_EL1.VARange, bits \[19:16\].
    pub va_range: u8,
}

impl MmuFeatures {
    /// The fields of an ID_AA64MMFR0_EL1 and an ID_AA64MMFR2_EL1 value.
    pub const fn from_id_regs(mmfr0: u64, mmfr2: u64) -> MmuFeatures {
        MmuFeatures {
            tgran4: ((mmfr0 >> 28) & 0xf) as u8,
            tgran16: ((mmfr0 >> 20) & 0xf) as u8,
            tgran64: ((mmfr0 >> 24) & 0xf) as u8,
            pa_range: (mmfr0 & 0xf) as u8,
            va_range: ((mmfr2 >> 16) & 0xf) as u8,
        }
    }

    /// What the ID field of `granule` says. The fields follow the ID
    /// scheme as Linux reads them (`ID_AA64MMFR0_EL1_TGRAN*_SUPPORTED_MIN`
    /// / `_MAX`): TGran4 and TGran64 are signed, 0b0000..=0b0111 meaning
    /// implemented and 0b1111 not; TGran16 is unsigned, 0b0000 meaning not
    /// implemented. TGran4 ≥ 0b0001 and TGran16 ≥ 0b0010 add FEAT_LPA2.
    pub const fn granule(self, granule: Granule) -> GranuleSupport {
        match granule {
            Granule::K4 => match self.tgran4 {
                0 => GranuleSupport::Supported,
                1..=7 => GranuleSupport::Lpa2,
                _ => GranuleSupport::None,
            },
            Granule::K16 => match self.tgran16 {
                0 => GranuleSupport::None,
                1 => GranuleSupport::Supported,
                _ => GranuleSupport::Lpa2,
            },
            Granule::K64 => match self.tgran64 {
                0..=7 => GranuleSupport::Supported,
                _ => GranuleSupport::None,
            },
        }
    }

    /// The physical address size PARange reports, in bits (0b0110 = 52;
    /// 0b0111, 56 bits, is reported as 56). `None` for reserved values.
    pub const fn pa_bits(self) -> Option<u32> {
        pa_bits_of_range(self.pa_range as u64)
    }

    /// FEAT_LVA: 52-bit virtual addresses with the 64 KiB granule
    /// (VARange ≥ 0b0001).
    pub const fn has_lva(self) -> bool {
        self.va_range >= 1
    }
}

/// The physical address size of an ID_AA64MMFR0_EL1.PARange (or
/// TCR_EL1.IPS) encoding: 0b0000 = 32, 0b0001 = 36, 0b0010 = 40,
/// 0b0011 = 42, 0b0100 = 44, 0b0101 = 48, 0b0110 = 52, 0b0111 = 56
/// (FEAT_D128). `None` for reserved values.
pub const fn pa_bits_of_range(pa_range: u64) -> Option<u32> {
    match pa_range {
        0 => Some(32),
        1 => Some(36),
        2 => Some(40),
        3 => Some(42),
        4 => Some(44),
        5 => Some(48),
        6 => Some(52),
        7 => Some(56),
        _ => None,
    }
}

/// The PARange / TCR_EL1.IPS encoding of `pa_bits` (the inverse of
/// [`pa_bits_of_range`]), for the sizes VMSAv8-64 describes (32 to 52).
pub const fn pa_range_of_bits(pa_bits: u32) -> Result<u64, GeometryError> {
    match pa_bits {
        32 => Ok(0),
        36 => Ok(1),
        40 => Ok(2),
        42 => Ok(3),
        44 => Ok(4),
        48 => Ok(5),
        52 => Ok(6),
        _ => Err(GeometryError::PaBits { pa_bits }),
    }
}

/// What a CPU lacks for a geometry, or why the geometry is not one
/// ([`check_geometry`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GeometryUnsupported {
    /// The configuration is not valid on any CPU.
    Invalid(GeometryError),
    /// The CPU does not implement the granule (TGran4 = 0b1111,
    /// TGran16 = 0b0000 or TGran64 = 0b1111).
    NoGranule {
        /// The granule.
        granule: Granule,
        /// The ID_AA64MMFR0_EL1 field the CPU reports.
        field: u8,
    },
    /// 52-bit addresses with the 4 or 16 KiB granule need FEAT_LPA2
    /// (TGran4 = 0b0001, TGran16 = 0b0010), which the CPU lacks.
    NoLpa2 {
        /// The granule.
        granule: Granule,
        /// The ID_AA64MMFR0_EL1 field the CPU reports.
        field: u8,
        /// The virtual address size asked for.
        va_bits: u32,
        /// The physical address size asked for.
        pa_bits: u32,
    },
    /// 52-bit virtual addresses with the 64 KiB granule need FEAT_LVA
    /// (ID_AA64MMFR2_EL1.VARange = 0b0001), which the CPU lacks.
    NoLva {
        /// ID_AA64MMFR2_EL1.VARange as the CPU reports it.
        va_range: u8,
    },
    /// The CPU's physical address range (ID_AA64MMFR0_EL1.PARange) is
    /// smaller than asked for (52 bits also means FEAT_LPA).
    PaRange {
        /// The physical address size asked for.
        pa_bits: u32,
        /// ID_AA64MMFR0_EL1.PARange as the CPU reports it.
        pa_range: u8,
    },
}

impl fmt::Display for GeometryUnsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GeometryUnsupported::Invalid(e) => e.fmt(f),
            GeometryUnsupported::NoGranule { granule, field } => {
                let name = match granule {
                    Granule::K4 => "TGran4",
                    Granule::K16 => "TGran16",
                    Granule::K64 => "TGran64",
                };
                write!(
                    f,
                    "the CPU does not implement the {granule} \
                     (ID_AA64MMFR0_EL1.{name} = {field:#06b})"
                )
            }
            GeometryUnsupported::NoLpa2 {
                granule,
                field,
                va_bits,
                pa_bits,
            } => {
                let (name, want) = match granule {
                    Granule::K16 => ("TGran16", 0b0010),
                    _ => ("TGran4", 0b0001),
                };
                write!(
                    f,
                    "{va_bits}-bit VA / {pa_bits}-bit PA with the {granule} needs FEAT_LPA2 \
                     (ID_AA64MMFR0_EL1.{name} = {want:#06b}); the CPU reports {field:#06b}"
                )
            }
            GeometryUnsupported::NoLva { va_range } => write!(
                f,
                "52-bit virtual addresses with the 64 KiB granule need FEAT_LVA \
                 (ID_AA64MMFR2_EL1.VARange = 0b0001); the CPU reports {va_range:#06b}"
            ),
            GeometryUnsupported::PaRange { pa_bits, pa_range } => {
                write!(
                    f,
                    "{pa_bits}-bit physical addresses need ID_AA64MMFR0_EL1.PARange \
                     for {pa_bits} bits; the CPU reports {pa_range:#06b}"
                )?;
                match pa_bits_of_range(pa_range as u64) {
                    Some(bits) => write!(f, " ({bits} bits)"),
                    None => write!(f, " (reserved)"),
                }
            }
        }
    }
}

impl core::error::Error for GeometryUnsupported {}

impl From<GeometryError> for GeometryUnsupported {
    fn from(e: GeometryError) -> GeometryUnsupported {
        GeometryUnsupported::Invalid(e)
    }
}

/// Whether a geometry with `pa_bits` of physical address needs
/// TCR_EL1.DS = 1: the 4 and 16 KiB granules describe more than 48 bits of
/// virtual or physical address only with DS = 1 (Arm ARM D8.2.8, D8.2.9).
/// The 64 KiB granule has no DS.
pub const fn needs_ds(geometry: Geometry, pa_bits: u32) -> bool {
    geometry.granule.has_ds() && (geometry.va_bits > 48 || pa_bits > 48)
}

/// Whether a CPU with these ID register values can translate
/// `va_bits`-bit virtual addresses to `pa_bits`-bit physical addresses
/// with `granule`, checking, in order:
///
/// 1. the pair is a [`Geometry`] and `pa_bits` an encodable size;
/// 2. ID_AA64MMFR0_EL1.TGran4 \[31:28\] / TGran16 \[23:20\] / TGran64
///    \[27:24\] implement the granule;
/// 3. 52-bit addresses: FEAT_LPA2 (TGran4 = 0b0001, TGran16 = 0b0010) for
///    4 and 16 KiB, for a 52-bit VA or PA alike; FEAT_LVA
///    (ID_AA64MMFR2_EL1.VARange \[19:16\] = 0b0001) for a 52-bit VA with
///    64 KiB;
/// 4. ID_AA64MMFR0_EL1.PARange \[3:0\] covers `pa_bits` (0b0110 = 52, which
///    is FEAT_LPA).
pub const fn check_geometry(
    granule: Granule,
    va_bits: u32,
    pa_bits: u32,
    mmfr0: u64,
    mmfr2: u64,
) -> Result<(), GeometryUnsupported> {
    let geometry = match Geometry::new(granule, va_bits) {
        Ok(g) => g,
        Err(e) => return Err(GeometryUnsupported::Invalid(e)),
    };
    if let Err(e) = pa_range_of_bits(pa_bits) {
        return Err(GeometryUnsupported::Invalid(e));
    }
    let cpu = MmuFeatures::from_id_regs(mmfr0, mmfr2);
    let field = match granule {
        Granule::K4 => cpu.tgran4,
        Granule::K16 => cpu.tgran16,
        Granule::K64 => cpu.tgran64,
    };
    let support = cpu.granule(granule);
    if matches!(support, GranuleSupport::None) {
        return Err(GeometryUnsupported::NoGranule { granule, field });
    }
    if needs_ds(geometry, pa_bits) && !matches!(support, GranuleSupport::Lpa2) {
        return Err(GeometryUnsupported::NoLpa2 {
            granule,
            field,
            va_bits,
            pa_bits,
        });
    }
    if matches!(granule, Granule::K64) && geometry.is_52bit() && !cpu.has_lva() {
        return Err(GeometryUnsupported::NoLva {
            va_range: cpu.va_range,
        });
    }
    let enough = match cpu.pa_bits() {
        Some(bits) => bits >= pa_bits,
        None => false,
    };
    if !enough {
        return Err(GeometryUnsupported::PaRange {
            pa_bits,
            pa_range: cpu.pa_range,
        });
    }
    Ok(())
}
