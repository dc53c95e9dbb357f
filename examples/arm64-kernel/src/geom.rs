//! The geometry every address space of this build uses: the arm64 format
//! chosen by the Cargo features (`granule-16k`, `granule-64k`, `va-52`;
//! none: the 4 KiB granule with 48-bit VAs, as Linux's default arm64
//! configuration), and the sizes the cases derive from it.
//!
//! | features | format | levels | page | PMD | PUD |
//! |---|---|---|---|---|---|
//! | (none) | 4K/48 | 4 | 4 KiB | 2 MiB | 1 GiB |
//! | `va-52` | 4K/52 (FEAT_LPA2) | 5 | 4 KiB | 2 MiB | 1 GiB |
//! | `granule-16k` | 16K/48 | 4 | 16 KiB | 32 MiB | 64 GiB |
//! | `granule-16k va-52` | 16K/52 (FEAT_LPA2) | 4 | 16 KiB | 32 MiB | 64 GiB |
//! | `granule-64k` | 64K/48 | 3 | 64 KiB | 512 MiB | 4 TiB |
//! | `granule-64k va-52` | 64K/52 (FEAT_LVA, FEAT_LPA) | 3 | 64 KiB | 512 MiB | 4 TiB |
//!
//! Both halves keep 48-bit kernel regions (memory.rs): with 52 bits the
//! upper half starts lower, at `0xfff0_0000_0000_0000`, and still holds
//! them; the cases that reach above 2^48 do so in the lower half.

use pgtable_arm64::granule::Granule;
use pgtable_arm64::Arm64Geometry;
use pgtable_core::contract::level;

#[cfg(all(feature = "granule-16k", feature = "granule-64k"))]
compile_error!("the features granule-16k and granule-64k exclude each other");

/// The format of every address space (the kernel's, the test space, user
/// spaces).
#[cfg(not(any(feature = "granule-16k", feature = "granule-64k", feature = "va-52")))]
pub type Arm64 = pgtable_arm64::Arm64;
/// The format of every address space.
#[cfg(all(
    not(any(feature = "granule-16k", feature = "granule-64k")),
    feature = "va-52"
))]
pub type Arm64 = pgtable_arm64::Arm64Lpa2;
/// The format of every address space.
#[cfg(all(feature = "granule-16k", not(feature = "va-52")))]
pub type Arm64 = pgtable_arm64::Arm64K16;
/// The format of every address space.
#[cfg(all(feature = "granule-16k", feature = "va-52"))]
pub type Arm64 = pgtable_arm64::Arm64K16Lpa2;
/// The format of every address space.
#[cfg(all(feature = "granule-64k", not(feature = "va-52")))]
pub type Arm64 = pgtable_arm64::Arm64K64;
/// The format of every address space.
#[cfg(all(feature = "granule-64k", feature = "va-52"))]
pub type Arm64 = pgtable_arm64::Arm64K64Va52;

/// The granule.
pub const GRANULE: Granule = <Arm64 as Arm64Geometry>::GRANULE;
/// VA bits of each half.
pub const VA_BITS: u32 = <Arm64 as pgtable_core::contract::Format>::VA_BITS;
/// log2 of the page size.
pub const PAGE_SHIFT: u32 = level::page_shift::<Arm64>();
/// Bytes of a page.
pub const PAGE: u64 = level::page_size::<Arm64>();
/// Bytes one PTE table maps (a level-2 block where the granule has them).
pub const PMD_SIZE: u64 = level::size::<Arm64>(1);
/// Entries of a table below the root.
pub const ENTRIES: u64 = level::entries::<Arm64>() as u64;
/// Whether TCR_EL1.DS is set: 52-bit addresses with 4 or 16 KiB pages.
pub const DS: bool = VA_BITS == 52 && GRANULE.has_ds();
/// The largest page any geometry uses: the image's sections, the guard
/// pages and the stacks are aligned to it in every build (link.ld).
pub const MAX_PAGE: u64 = 64 << 10;

/// The geometry's name in the form of xtask's summary lines (`16K/48`).
pub const NAME: &str = match (PAGE_SHIFT, VA_BITS) {
    (12, 48) => "4K/48",
    (12, 52) => "4K/52",
    (14, 48) => "16K/48",
    (14, 52) => "16K/52",
    (16, 48) => "64K/48",
    _ => "64K/52",
};

const _: () = assert!(PAGE <= MAX_PAGE && MAX_PAGE % PAGE == 0);
