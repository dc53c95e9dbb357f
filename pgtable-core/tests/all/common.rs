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

#[cfg(all(feature = "sim", feature = "suite"))]
pub(crate) use probes::ProbesOnly;

#[cfg(all(feature = "sim", feature = "suite"))]
mod probes {
    use pgtable_core::contract::Arch;
    use pgtable_core::sim::SimSuiteMachine;
    use pgtable_core::suite::{Fault, Machine};
    use pgtable_core::{PhysAddr, VirtAddr};

    /// A suite machine that leaves every judgement to its accesses: the
    /// simulator's loads and stores ([`SimSuiteMachine`]), without its
    /// stale-TLB check (`check_consistency`) or execute probes; a
    /// forgetful one drops its stores (the translation is checked,
    /// nothing is stored).
    pub(crate) struct ProbesOnly<A: Arch> {
        /// The simulator's suite machine, for its printed lines.
        pub(crate) sim: SimSuiteMachine<A>,
        forget_stores: bool,
    }

    impl<A: Arch> ProbesOnly<A> {
        /// Every access through `sim`.
        pub(crate) fn new(sim: SimSuiteMachine<A>) -> Self {
            Self {
                sim,
                forget_stores: false,
            }
        }

        /// Stores are translated (and fault as stores) but dropped.
        pub(crate) fn forgetful(sim: SimSuiteMachine<A>) -> Self {
            Self {
                sim,
                forget_stores: true,
            }
        }
    }

    impl<A: Arch> Machine for ProbesOnly<A> {
        fn read_u64(&mut self, va: VirtAddr) -> Result<u64, Fault> {
            self.sim.read_u64(va)
        }
        fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault> {
            if !self.forget_stores {
                return self.sim.write_u64(va, val);
            }
            self.sim.read_u64(va).map(|_| ()).map_err(|f| Fault {
                va: f.va,
                write: true,
            })
        }
        fn cycles(&mut self) -> u64 {
            self.sim.cycles()
        }
        fn cycle_hz(&self) -> Option<u64> {
            self.sim.cycle_hz()
        }
        fn emulated(&self) -> bool {
            true
        }
        fn print(&mut self, args: std::fmt::Arguments) {
            self.sim.print(args)
        }
        fn ram(&self) -> (PhysAddr, u64) {
            self.sim.ram()
        }
        fn window(&self) -> (VirtAddr, u64) {
            self.sim.window()
        }
    }
}
