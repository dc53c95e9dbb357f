//! The sizes the model and the generator work in, all taken from the
//! format ([`Format::PAGE_SHIFT`], [`Format::LEVELS`]): a page, the block
//! one table above it ("PMD") and the one two above it ("PUD"; the top
//! level's entry when the format has only two levels).

use pgtable_core::contract::{level, Format};

/// Bytes of a page.
pub fn page<A: Format>() -> u64 {
    level::page_size::<A>()
}

/// Bytes one entry of the table above the last level maps.
pub fn pmd<A: Format>() -> u64 {
    level::size::<A>(1)
}

/// Bytes one entry two levels above the last maps (the top level's entry
/// for a two-level format).
pub fn pud<A: Format>() -> u64 {
    level::size::<A>(2.min(A::LEVELS - 1))
}

/// Page numbers of the whole 64-bit space: `2^(64 - PAGE_SHIFT)`.
pub fn top_vpn<A: Format>() -> u64 {
    1 << (64 - A::PAGE_SHIFT)
}

/// A short name of a leaf size for the statistics.
pub fn size_name(bytes: u64) -> &'static str {
    match bytes.trailing_zeros() {
        12 => "4K",
        14 => "16K",
        16 => "64K",
        21 => "2M",
        25 => "32M",
        29 => "512M",
        30 => "1G",
        36 => "64G",
        39 => "512G",
        42 => "4T",
        _ => "other",
    }
}
