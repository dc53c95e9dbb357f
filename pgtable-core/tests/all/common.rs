//! Helpers shared by the integration tests of this binary.

/// Defines `$name`, a unit struct whose [`Format`](pgtable_core::contract::Format) is
/// `TestFormat<4>`'s, entry for entry, under the name `$label` (and, if
/// given, with fewer output-address bits); the test then writes the `Arch`
/// impl that differs (the variant under test). `is_settled`, `leaf`
/// and `table_entry_attrs` keep the trait's default bodies (so a
/// variant drops table attributes); `table_limits`, what the hardware
/// reads from a table entry, is `TestFormat<4>`'s.
macro_rules! test_format_variant {
    ($(#[$m:meta])* $name:ident, $label:literal) => {
        test_format_variant!($(#[$m])* $name, $label, pa_bits = 48);
    };
    ($(#[$m:meta])* $name:ident, $label:literal, pa_bits = $pa_bits:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default)]
        struct $name;

        // SAFETY: every method is `TestFormat<4>`'s, which upholds the
        // contract; with fewer address bits it promises less.
        unsafe impl pgtable_core::contract::Format for $name {
            const NAME: &'static str = $label;
            const LEVELS: u32 = 4;
            const PA_BITS: u32 = $pa_bits;
            fn leaf_allowed(h: u32) -> bool {
                T4::leaf_allowed(h)
            }
            fn decode(raw: u64, h: u32) -> pgtable_core::contract::Decoded {
                T4::decode(raw, h)
            }
            fn table_entry(pa: pgtable_core::PhysAddr, h: u32) -> u64 {
                T4::table_entry(pa, h)
            }
            fn leaf_template(p: pgtable_core::Prot, h: u32) -> u64 {
                T4::leaf_template(p, h)
            }
            fn leaf_prot(raw: u64, h: u32) -> pgtable_core::Prot {
                T4::leaf_prot(raw, h)
            }
            fn modify_prot(raw: u64, p: pgtable_core::Prot, h: u32) -> u64 {
                T4::modify_prot(raw, p, h)
            }
            fn split_leaf(raw: u64, h: u32) -> u64 {
                T4::split_leaf(raw, h)
            }
            fn is_young(raw: u64) -> bool {
                T4::is_young(raw)
            }
            fn is_dirty(raw: u64) -> bool {
                T4::is_dirty(raw)
            }
            fn hw_access(
                raw: u64,
                h: u32,
                a: pgtable_core::contract::Access,
            ) -> Result<u64, pgtable_core::contract::AccessFault> {
                T4::hw_access(raw, h, a)
            }
            fn table_limits(raw: u64, h: u32) -> pgtable_core::contract::TableAttrs {
                T4::table_limits(raw, h)
            }
        }
    };
}

pub(crate) use test_format_variant;
