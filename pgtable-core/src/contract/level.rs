//! Page-table levels and their geometry.
//!
//! Both supported architectures use a 4 KiB granule: every table holds 512
//! eight-byte entries and every level translates 9 bits of the address. A
//! level is therefore identified by its *height* above the leaf level
//! (PTE = 0, PMD = 1, PUD = 2, P4D = 3), and the top table is the PGD at
//! height `LEVELS - 1`. Folding follows Linux: with 4 levels the P4D is
//! folded into the PGD (x86 PML4, arm64 L0), with 3 levels the PUD is folded
//! into the PGD (arm64 39-bit VA: the L1 table is the root).

use crate::addr::PAGE_SHIFT;

/// Address bits translated by one level (512 entries per table).
pub const LEVEL_BITS: u32 = 9;
/// Entries in one table.
pub const ENTRIES_PER_TABLE: usize = 1 << LEVEL_BITS;

/// A page-table level, named as Linux names it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum Level {
    /// Last level: 4 KiB pages (arm64 L3, x86 PT).
    Pte,
    /// 2 MiB per entry (arm64 L2, x86 PD).
    Pmd,
    /// 1 GiB per entry (arm64 L1, x86 PDPT).
    Pud,
    /// 512 GiB per entry; present only with 5 levels (x86 LA57 PML4).
    P4d,
    /// The root table (arm64 L0 with 4 levels, x86 PML4 or PML5).
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

/// log2 of the bytes one entry at `height` maps.
#[inline]
pub const fn shift(height: u32) -> u32 {
    PAGE_SHIFT + LEVEL_BITS * height
}

/// Bytes one entry at `height` maps.
#[inline]
pub const fn size(height: u32) -> u64 {
    1 << shift(height)
}

/// Index of `va` in the table at `height`.
#[inline]
pub const fn index(va: u64, height: u32) -> usize {
    ((va >> shift(height)) as usize) & (ENTRIES_PER_TABLE - 1)
}

/// The end of the entry at `height` that contains `va`, clamped to `end`.
#[inline]
pub const fn entry_end(va: u64, height: u32, end: u64) -> u64 {
    let boundary = (va | (size(height) - 1)).wrapping_add(1);
    if boundary.wrapping_sub(1) < end.wrapping_sub(1) {
        boundary
    } else {
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(entry_end(0x1000, 1, u64::MAX), 0x20_0000);
        assert_eq!(entry_end(0x1000, 1, 0x5000), 0x5000);
        // The last entry of the address space ends at 0 (wrapped).
        assert_eq!(entry_end(u64::MAX - 0xfff, 0, 0), 0);
        assert_eq!(index(0x20_1000, 0), 1);
        assert_eq!(index(0x20_1000, 1), 1);
    }
}
