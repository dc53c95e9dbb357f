//! Translation regimes: which part of the 64-bit virtual address space an
//! address space translates.

use crate::Format;

/// The part of the virtual address space an [`AddressSpace`] translates.
///
/// The two architectures split the address space differently:
///
/// - **arm64** has two translation table base registers (Arm ARM D8.2.2
///   "The VA space"): TTBR0_EL1 translates addresses whose top bits are 0
///   and TTBR1_EL1 those whose top bits are 1, each with its own size
///   (TCR_EL1.T0SZ and T1SZ). Linux gives each register a whole `VA_BITS`
///   half: user space `[0, 2^48)` through TTBR0 and the kernel
///   `[2^64 - 2^48, 2^64)` through TTBR1, each using all 512 entries of its
///   own root ([`Format::SEPARATE_HALVES`] is `true`).
/// - **x86-64** has one root (CR3) for both canonical halves (Intel SDM
///   Vol. 3A 4.5 "4-level paging and 5-level paging"): PML4 (or PML5)
///   entries 0–255 translate the lower half `[0, 2^47)` and 256–511 the
///   upper half `[2^64 - 2^47, 2^64)` (`2^56` with LA57).
///
/// [`VaRange::Both`] is every canonical address of the format, through one
/// root: what [`AddressSpace::new`](crate::AddressSpace::new) builds. On
/// arm64 that root serves both registers with T0SZ = T1SZ = `65 - VA_BITS`
/// (TTBR1 pointing at its second half, see the arm64 crate's `regs`).
///
/// [`AddressSpace`]: crate::AddressSpace
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum VaRange {
    /// The lower half: user space (arm64 TTBR0_EL1; x86 entries 0–255 of
    /// the root).
    Lower,
    /// The upper half: the kernel (arm64 TTBR1_EL1; x86 entries 256–511 of
    /// the root).
    Upper,
    /// Every canonical address, through one root (entries 0–255 the lower
    /// half, 256–511 the upper one).
    #[default]
    Both,
}

impl VaRange {
    /// The first and the last address the range holds for format `F`.
    ///
    /// With [`Format::SEPARATE_HALVES`] each half is `2^VA_BITS` bytes;
    /// otherwise (and for [`VaRange::Both`]) each half is `2^(VA_BITS - 1)`.
    #[inline]
    pub const fn bounds<F: Format>(self) -> (u64, u64) {
        let half_bits = match self {
            VaRange::Both => F::VA_BITS - 1,
            _ if F::SEPARATE_HALVES => F::VA_BITS,
            _ => F::VA_BITS - 1,
        };
        let size = 1u64 << half_bits;
        match self {
            VaRange::Lower => (0, size - 1),
            VaRange::Upper => (size.wrapping_neg(), u64::MAX),
            VaRange::Both => (0, u64::MAX),
        }
    }

    /// Whether `va` lies in the range for format `F`. For
    /// [`VaRange::Both`] that is every canonical address: the bits above
    /// `VA_BITS - 1` all equal bit `VA_BITS - 1` (Intel SDM Vol. 1 3.3.7.1
    /// "Canonical Addressing"; Arm ARM D8.2.2, with T0SZ = T1SZ).
    #[inline]
    pub fn contains<F: Format>(self, va: u64) -> bool {
        VaWindow::of::<F>(self).contains(va)
    }

    /// The root-table indices whose entries translate this range for
    /// format `F` (`first..=last`), out of the root's
    /// [`top_entries`](crate::contract::level::top_entries) (Linux
    /// `PTRS_PER_PGD`; 512 with 4 KiB pages and a full root): all of them
    /// for [`VaRange::Both`] and for a half of a
    /// [`Format::SEPARATE_HALVES`] format, the lower or the upper half of
    /// them (0–255 or 256–511 of 512) for a half of a format with one
    /// root for both.
    #[inline]
    pub const fn root_indices<F: Format>(self) -> (usize, usize) {
        let n = crate::contract::level::top_entries::<F>();
        match self {
            VaRange::Lower if !F::SEPARATE_HALVES => (0, n / 2 - 1),
            VaRange::Upper if !F::SEPARATE_HALVES => (n / 2, n - 1),
            _ => (0, n - 1),
        }
    }

    /// The half `va` belongs to (its top bit), for a format with two roots.
    #[inline]
    pub const fn of(va: u64) -> VaRange {
        if va >> 63 == 0 {
            VaRange::Lower
        } else {
            VaRange::Upper
        }
    }
}

/// A [`VaRange`] of one format as a single test, kept by each address
/// space so that its one-address check (the fault path's first step) is an
/// add and a mask, with no branch on the kind of range.
///
/// Every range is a power-of-two-sized interval of the 64-bit space,
/// naturally aligned once shifted by its size modulo `2^64` (`Both` wraps
/// around 0): `va` lies in it exactly when `va + offset` has no bit of
/// `mask` set.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct VaWindow {
    /// Minus the range's first address: moves the range to `[0, size)`.
    offset: u64,
    /// `!(size - 1)`: the bits an address of `[0, size)` has clear.
    mask: u64,
}

impl VaWindow {
    /// The window of `range` for format `F`.
    #[inline]
    pub(crate) const fn of<F: Format>(range: VaRange) -> Self {
        let (first, last) = match range {
            // The canonical addresses: `2^(VA_BITS - 1)` on each side of 0.
            VaRange::Both => {
                let half = 1u64 << (F::VA_BITS - 1);
                (half.wrapping_neg(), half - 1)
            }
            half => half.bounds::<F>(),
        };
        VaWindow {
            offset: first.wrapping_neg(),
            mask: !last.wrapping_sub(first),
        }
    }

    /// Whether `va` lies in the window.
    #[inline]
    pub(crate) const fn contains(self, va: u64) -> bool {
        va.wrapping_add(self.offset) & self.mask == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_format::TestFormat;

    #[test]
    fn halves_of_a_one_root_format_are_the_canonical_halves() {
        type F = TestFormat<4>;
        assert_eq!(VaRange::Lower.bounds::<F>(), (0, (1 << 47) - 1));
        assert_eq!(
            VaRange::Upper.bounds::<F>(),
            (0xffff_8000_0000_0000, u64::MAX)
        );
        assert!(VaRange::Both.contains::<F>(0xffff_8000_0000_0000));
        assert!(!VaRange::Both.contains::<F>(1 << 47));
        assert!(!VaRange::Lower.contains::<F>(1 << 47));
        assert!(!VaRange::Upper.contains::<F>((1 << 47) - 1));
        assert_eq!(VaRange::Upper.root_indices::<F>(), (256, 511));
        assert_eq!(VaRange::of(u64::MAX), VaRange::Upper);
    }

    /// A partly used root (16 KiB pages, 48-bit VA: 2 root entries; 4 KiB
    /// pages, 52-bit VA with 5 levels: 16) splits its own entries between
    /// the halves, not 512.
    #[test]
    fn root_indices_of_a_partly_used_root() {
        type K16 = TestFormat<4, 14, 48>;
        assert_eq!(VaRange::Lower.root_indices::<K16>(), (0, 0));
        assert_eq!(VaRange::Upper.root_indices::<K16>(), (1, 1));
        assert_eq!(VaRange::Both.root_indices::<K16>(), (0, 1));
        type Va52 = TestFormat<5, 12, 52>;
        assert_eq!(VaRange::Upper.root_indices::<Va52>(), (8, 15));
        assert_eq!(VaRange::Both.root_indices::<Va52>(), (0, 15));
        type K64 = TestFormat<2, 16, 0>;
        assert_eq!(VaRange::Both.root_indices::<K64>(), (0, 8191));
    }

    /// The window agrees with the range's definition on every edge: the
    /// bounds of each half, and for `Both` the canonical rule, over
    /// addresses around every power of two.
    fn window_is_the_range<F: Format>() {
        let canonical = |va: u64| {
            let top = (va as i64) >> (F::VA_BITS - 1);
            top == 0 || top == -1
        };
        for range in [VaRange::Lower, VaRange::Upper, VaRange::Both] {
            let w = VaWindow::of::<F>(range);
            let defined = |va: u64| match range {
                VaRange::Both => canonical(va),
                half => {
                    let (first, last) = half.bounds::<F>();
                    first <= va && va <= last
                }
            };
            for k in 0..64 {
                for p in [1u64 << k, (1u64 << k).wrapping_neg()] {
                    for va in [p.wrapping_sub(1), p, p.wrapping_add(1)] {
                        assert_eq!(w.contains(va), defined(va), "{range:?} {va:#x}");
                    }
                }
            }
            for va in [0, u64::MAX, 0x1234_5678_9000] {
                assert_eq!(w.contains(va), defined(va), "{range:?} {va:#x}");
            }
        }
    }

    #[test]
    fn a_space_s_window_is_its_range_for_4_and_5_levels() {
        window_is_the_range::<TestFormat<4>>();
        window_is_the_range::<TestFormat<5>>();
        assert!(!VaWindow::of::<TestFormat<4>>(VaRange::Both).contains(1 << 47));
        assert!(VaWindow::of::<TestFormat<5>>(VaRange::Both).contains(1 << 47));
    }
}
