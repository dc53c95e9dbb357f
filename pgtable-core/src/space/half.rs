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

    /// Whether `va` lies in the range for format `F`.
    #[inline]
    pub fn contains<F: Format>(self, va: u64) -> bool {
        match self {
            VaRange::Both => F::va_ok(va),
            _ => {
                let (first, last) = self.bounds::<F>();
                first <= va && va <= last
            }
        }
    }

    /// The root-table indices whose entries translate this range for
    /// format `F` (`first..=last`): all 512 for [`VaRange::Both`] and for
    /// a half of a [`Format::SEPARATE_HALVES`] format, 0–255 or 256–511
    /// for a half of a format with one root for both.
    #[inline]
    pub const fn root_indices<F: Format>(self) -> (usize, usize) {
        match self {
            VaRange::Lower if !F::SEPARATE_HALVES => (0, 255),
            VaRange::Upper if !F::SEPARATE_HALVES => (256, 511),
            _ => (0, 511),
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
}
