//! Page-table levels and their geometry.
//!
//! A level is identified by its *height* above the leaf level (PTE = 0,
//! PMD = 1, PUD = 2, P4D = 3), and the top table is the PGD at height
//! `LEVELS - 1`. Folding follows Linux: with 4 levels the P4D is folded into
//! the PGD (x86 PML4, arm64 L0), with 3 levels the PUD is folded into the
//! PGD (arm64 39-bit VA: the L1 table is the root).
//!
//! The geometry is a property of the format: a table is one page (the
//! *granule*: 4 KiB, 16 KiB or 64 KiB, [`Format::PAGE_SHIFT`]) of 8-byte
//! entries, so every level below the top translates `PAGE_SHIFT - 3` bits
//! (9, 11 or 13) and the top one what is left of [`Format::VA_BITS`]. As in
//! Linux (`ARM64_HW_PGTABLE_LEVELS`, `PTRS_PER_PGD`), the root table may be
//! partly used: arm64 with 16 KiB pages and 48-bit addresses has a root of
//! 2 entries, with 64 KiB pages and 48-bit addresses one of 64. The
//! functions here take the format as a type parameter and fold to
//! constants in every monomorphised walk; [`check`] states, at compile
//! time, which geometries exist.

use crate::contract::format::Format;

/// log2 of a page (and of a table frame) of `F`.
#[inline]
pub const fn page_shift<F: Format>() -> u32 {
    F::PAGE_SHIFT
}

/// Bytes of a page (and of a table frame) of `F`: 4 KiB, 16 KiB or 64 KiB.
#[inline]
pub const fn page_size<F: Format>() -> u64 {
    1 << F::PAGE_SHIFT
}

/// Address bits one level below the top translates: `PAGE_SHIFT - 3`.
#[inline]
pub const fn level_bits<F: Format>() -> u32 {
    F::PAGE_SHIFT - 3
}

/// Entries in one table frame (512, 2048 or 8192); the root uses only
/// [`top_entries`] of them.
#[inline]
pub const fn entries<F: Format>() -> usize {
    1 << level_bits::<F>()
}

/// Entries of the root table that [`Format::VA_BITS`] reaches (Linux
/// `PTRS_PER_PGD`).
#[inline]
pub const fn top_entries<F: Format>() -> usize {
    1 << (F::VA_BITS - shift::<F>(F::LEVELS - 1))
}

/// log2 of the bytes one entry at `height` maps.
#[inline]
pub const fn shift<F: Format>(height: u32) -> u32 {
    F::PAGE_SHIFT + level_bits::<F>() * height
}

/// Bytes one entry at `height` maps.
#[inline]
pub const fn size<F: Format>(height: u32) -> u64 {
    1 << shift::<F>(height)
}

/// Index of `va` in the table at `height` (Linux `pte_index` ...
/// `pgd_index`: the root's index is masked to its [`top_entries`]).
#[inline]
pub const fn index<F: Format>(va: u64, height: u32) -> usize {
    let mask = if height + 1 == F::LEVELS {
        top_entries::<F>() - 1
    } else {
        entries::<F>() - 1
    };
    ((va >> shift::<F>(height)) as usize) & mask
}

/// The end of the entry at `height` that contains `va`, clamped to `end`
/// (Linux `p?d_addr_end`).
#[inline]
pub const fn entry_end<F: Format>(va: u64, height: u32, end: u64) -> u64 {
    let boundary = (va | (size::<F>(height) - 1)).wrapping_add(1);
    if boundary.wrapping_sub(1) < end.wrapping_sub(1) {
        boundary
    } else {
        end
    }
}

/// The geometries the algorithms support, checked when an address space of
/// `F` is built (a `const` assertion: a format outside them does not
/// compile): 4 KiB, 16 KiB or 64 KiB pages; 2 to 5 levels; a top level
/// that translates between 1 bit and a full table; at most 57 VA bits
/// (x86 LA57, RISC-V Sv57).
pub const fn check<F: Format>() -> bool {
    let page = matches!(F::PAGE_SHIFT, 12 | 14 | 16);
    let levels = F::LEVELS >= 2 && F::LEVELS <= 5;
    page && levels && {
        let below_top = shift::<F>(F::LEVELS - 1);
        F::VA_BITS > below_top && F::VA_BITS <= below_top + level_bits::<F>() && F::VA_BITS <= 57
    }
}

/// A page-table level, named as Linux names it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Level {
    /// Last level: pages (arm64 L3, x86 PT).
    Pte,
    /// One level up: 2 MiB per entry with 4 KiB pages, 32 MiB with 16 KiB,
    /// 512 MiB with 64 KiB (arm64 L2, x86 PD).
    Pmd,
    /// Two levels up: 1 GiB per entry with 4 KiB pages (arm64 L1, x86 PDPT).
    Pud,
    /// Three levels up; present only with 5 levels (x86 LA57 PML4, arm64
    /// LPA2 L0).
    P4d,
    /// The root table (arm64 L0 with 4 levels or L-1 with 5, x86 PML4 or
    /// PML5).
    Pgd,
}

impl Level {
    /// The level at `height` in a hierarchy of `levels` levels.
    #[inline]
    pub const fn at_height(height: u32, levels: u32) -> Level {
        if height + 1 == levels {
            Level::Pgd
        } else {
            match height {
                0 => Level::Pte,
                1 => Level::Pmd,
                2 => Level::Pud,
                _ => Level::P4d,
            }
        }
    }

    /// The height above the PTE level, in a hierarchy of `levels` levels.
    #[inline]
    pub const fn height(self, levels: u32) -> u32 {
        match self {
            Level::Pte => 0,
            Level::Pmd => 1,
            Level::Pud => 2,
            Level::P4d => 3,
            Level::Pgd => levels - 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_format::TestFormat;

    type K4 = TestFormat<4>;
    /// 16 KiB pages, 48-bit: 4 levels, a root of 2 entries.
    type K16 = TestFormat<4, 14, 48>;
    /// 64 KiB pages, 48-bit: 3 levels, a root of 64 entries.
    type K64 = TestFormat<3, 16, 48>;
    /// 4 KiB pages, 52-bit (arm64 LPA2): 5 levels, a root of 16 entries.
    type Lpa2 = TestFormat<5, 12, 52>;

    #[test]
    fn folding_names_levels_like_linux() {
        assert_eq!(Level::at_height(3, 4), Level::Pgd);
        assert_eq!(Level::at_height(3, 5), Level::P4d);
        assert_eq!(Level::at_height(2, 3), Level::Pgd);
        assert_eq!(Level::at_height(2, 4), Level::Pud);
        assert_eq!(Level::Pgd.height(5), 4);
    }

    #[test]
    fn entry_end_clamps_and_handles_top_of_space() {
        assert_eq!(entry_end::<K4>(0x1000, 1, u64::MAX), 0x20_0000);
        assert_eq!(entry_end::<K4>(0x1000, 1, 0x5000), 0x5000);
        // The last entry of the address space ends at 0 (wrapped).
        assert_eq!(entry_end::<K4>(u64::MAX - 0xfff, 0, 0), 0);
        assert_eq!(index::<K4>(0x20_1000, 0), 1);
        assert_eq!(index::<K4>(0x20_1000, 1), 1);
        assert_eq!(entry_end::<K16>(0x4000, 1, u64::MAX), 32 << 20);
        assert_eq!(entry_end::<K64>(0x1_0000, 1, u64::MAX), 512 << 20);
    }

    #[test]
    fn geometry_follows_the_page_size_like_linux() {
        // Linux: PMD_SIZE 2 MiB / 32 MiB / 512 MiB, PTRS_PER_PTE 512 / 2048 / 8192.
        assert_eq!(
            (size::<K4>(1), entries::<K4>(), top_entries::<K4>()),
            (2 << 20, 512, 512)
        );
        assert_eq!(
            (size::<K16>(1), entries::<K16>(), top_entries::<K16>()),
            (32 << 20, 2048, 2)
        );
        assert_eq!(
            (size::<K64>(1), entries::<K64>(), top_entries::<K64>()),
            (512 << 20, 8192, 64)
        );
        assert_eq!((size::<Lpa2>(4), top_entries::<Lpa2>()), (1 << 48, 16));
        assert_eq!(page_size::<K16>(), 16 << 10);
        assert_eq!(page_size::<K64>(), 64 << 10);
        assert!(check::<K4>() && check::<K16>() && check::<K64>() && check::<Lpa2>());
    }

    #[test]
    fn the_root_index_is_masked_to_the_entries_the_va_bits_reach() {
        // An upper-half address (TTBR1): the root index is its top VA bit
        // alone with a 2-entry root, its top six bits with a 64-entry one.
        let high = 0xffff_8000_0000_0000;
        assert_eq!(index::<K16>(high, 3), 1);
        assert_eq!(index::<K16>(high | (5 << 36), 2), 5);
        assert_eq!(index::<K64>(high, 2), 32);
        assert_eq!(index::<Lpa2>(0xfff8_0000_0000_0000, 4), 8);
        // Below the root, every index uses the whole table.
        assert_eq!(index::<K16>(high | (2047 << 14), 0), 2047);
        assert_eq!(index::<K64>(high | (8191 << 16), 0), 8191);
    }

    #[test]
    fn the_check_rejects_what_no_hardware_walks() {
        // An 8 KiB page; a top level with no bit to translate; one with
        // more bits than a table holds; a single level.
        assert!(!check::<TestFormat<4, 13, 0>>());
        assert!(!check::<TestFormat<4, 12, 39>>());
        assert!(!check::<TestFormat<3, 12, 48>>());
        assert!(!check::<TestFormat<1, 12, 0>>());
    }
}
