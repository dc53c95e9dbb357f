//! Address newtypes.

use core::fmt;

/// log2 of the 4 KiB page: the only page of x86-64 and RISC-V and the
/// smallest of arm64. Code generic over the format uses its own page size,
/// [`level::page_size`](crate::contract::level::page_size).
pub const PAGE_SHIFT: u32 = 12;
/// The 4 KiB page in bytes (see [`PAGE_SHIFT`]).
pub const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;

/// A virtual address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct VirtAddr(pub u64);

/// A physical (output) address.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct PhysAddr(pub u64);

macro_rules! addr_common {
    ($t:ident, $name:literal) => {
        impl $t {
            /// The raw address.
            #[inline]
            pub const fn as_u64(self) -> u64 {
                self.0
            }

            /// Whether the address is a multiple of `align` (a power of two).
            #[inline]
            pub const fn is_aligned(self, align: u64) -> bool {
                self.0 & (align - 1) == 0
            }

            /// The address rounded down to `align` (a power of two).
            #[inline]
            pub const fn align_down(self, align: u64) -> Self {
                Self(self.0 & !(align - 1))
            }

            /// The address plus `off`, wrapping.
            #[inline]
            pub const fn add(self, off: u64) -> Self {
                Self(self.0.wrapping_add(off))
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($name, "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

addr_common!(VirtAddr, "VirtAddr");
addr_common!(PhysAddr, "PhysAddr");
