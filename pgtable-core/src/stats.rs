//! Optional counters (feature `stats`).
//!
//! Without the feature every counter reads 0 and counting compiles away.

use core::cell::Cell;

/// Counters of what the operations did to the tables and the machine.
#[derive(Clone, Default, Debug)]
pub struct Stats {
    inner: Counters,
}

/// Defines the counter cells, a getter and a crate-internal adder for each,
/// and [`Stats::reset`].
macro_rules! counters {
    ($($(#[$m:meta])* $get:ident, $add:ident;)*) => {
        #[derive(Clone, Default, Debug)]
        struct Counters {
            $($get: Cell<u64>,)*
        }

        impl Stats {
            $(
                $(#[$m])*
                #[inline]
                pub fn $get(&self) -> u64 {
                    self.inner.$get.get()
                }

                #[inline]
                #[allow(unused_variables)]
                pub(crate) fn $add(&self, n: u64) {
                    #[cfg(feature = "stats")]
                    self.inner.$get.set(self.inner.$get.get() + n);
                }
            )*

            /// Sets every counter back to zero.
            pub fn reset(&self) {
                $(self.inner.$get.set(0);)*
            }
        }
    };
}

counters! {
    /// Walker barriers issued.
    barriers, add_barriers;
    /// Range TLB flushes issued.
    flush_range, add_flush_range;
    /// Strides covered by range flushes.
    flush_range_pages, add_flush_range_pages;
    /// Full TLB flushes issued (of the address space, or of everything).
    flush_all, add_flush_all;
    /// Table entries written (stores, swaps and clears).
    entries_written, add_entries_written;
    /// Table frames allocated.
    tables_allocated, add_tables_allocated;
    /// Table frames freed.
    tables_freed, add_tables_freed;
}

impl Stats {
    /// Whether counting is compiled in (feature `stats`).
    pub const ENABLED: bool = cfg!(feature = "stats");

    /// All TLB flushes of either kind.
    pub fn flushes(&self) -> u64 {
        self.flush_range() + self.flush_all()
    }
}
