//! The kernel-facing single-entry and batched operations on the simulated
//! machine, written once for any format: caller-owned flush batching
//! (`MmuGather`), `unmap_with` reports, `exit_mmap`, `Inspector::entries`, accessed/dirty harvesting, the
//! fault-time operations, `replace_pte` and `zap_page_range`, and
//! `Prot::NONE` mappings. The integration tests of pgtable-core
//! and of each arch crate instantiate every case per format with
//! [`ops_tests!`](crate::ops_tests). After every operation the machine is checked: no stale
//! TLB entry, no write the walker may not see, no break-before-make
//! conflict.
#![allow(dead_code)]

use pgtable_core::contract::Arch;
use pgtable_core::sim::{Installed, SimAlloc, SimMachine, SimMmu};
use pgtable_core::{AddressSpace, LeafEntry, MapOptions, PhysAddr, Prot, VirtAddr};

mod entries;
mod exit;
mod faults;
mod gather;
mod harvest;
mod protnone;
mod replace;
mod unmap_with;

pub use entries::*;
pub use exit::*;
pub use faults::*;
pub use gather::*;
pub use harvest::*;
pub use protnone::*;
pub use replace::*;
pub use unmap_with::*;

/// A 4 KiB page.
pub const K4: u64 = 4 << 10;
/// A 2 MiB block.
pub const M2: u64 = 2 << 20;
/// A 1 GiB block.
pub const G1: u64 = 1 << 30;
/// Where every test maps: 1 GiB, so 2 MiB and 1 GiB blocks are aligned.
pub const VA: u64 = G1;
/// Physical address of `VA`.
pub const PA: u64 = 0x8000_0000;
/// A non-present, non-zero entry on every format here (bit 0 clear: not
/// valid / not present): what a swap entry looks like to the algorithms.
pub const SWAP: u64 = 0x0000_0012_3400_0002;

/// An installed address space on the simulated machine.
pub type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

/// Kernel read-write.
pub const KRW: Prot = Prot::READ_WRITE;
/// User read-write: created with the accessed/dirty state clean on x86 and
/// the test format (and writable-clean, DBM with `AP[2]`, on arm64), so the
/// hardware still writes these entries.
pub const URW: Prot = Prot::WRITE.union(Prot::USER);

/// A machine with an installed, empty address space.
pub fn setup<A: Arch>() -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    (m, unsafe { Installed::new(s) })
}

/// Maps `len` bytes at `VA + off` to `PA + off`.
pub fn map<A: Arch>(s: &mut Space<A>, off: u64, len: u64, prot: Prot, opts: MapOptions) {
    s.map(VirtAddr(VA + off), PhysAddr(PA + off), len, prot, opts)
        .unwrap();
}

/// Every entry of every table reachable from the root, as (height, index
/// path, raw): a snapshot to prove that a failed operation changed nothing.
pub fn snapshot<A: Arch>(
    s: &AddressSpace<A, SimMmu<A>, SimAlloc>,
    va: u64,
    len: u64,
) -> Vec<(u64, u32, u64)> {
    let mut v = Vec::new();
    let mut a = va;
    while a < va + len {
        for h in 0..A::LEVELS {
            // The entry at height `h` on the path of `a` is the one of every
            // page of its aligned `4 KiB << 9h` span (the path above it is
            // shared too): read it at the first page of the range and at
            // the start of each span only. The same information as reading
            // it at every page, with a walk per entry instead of per page
            // and height (which under Miri took most of the error tests).
            if a != va && a % (K4 << (9 * h)) != 0 {
                continue;
            }
            if let Some(raw) = s.inspect().entry(VirtAddr(a), h) {
                v.push((a, h, raw));
            }
        }
        a += K4;
    }
    v
}

/// A user-visible record of one report.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
pub struct Rec {
    /// First virtual address.
    pub va: u64,
    /// Bytes.
    pub size: u64,
    /// Physical address, for a present entry.
    pub pa: Option<u64>,
    /// A valid entry (not a software one).
    pub present: bool,
    /// The hardware or software dirty state.
    pub dirty: bool,
}

/// The record of one report.
pub fn rec<A: Arch>(r: LeafEntry<A>) -> Rec {
    Rec {
        va: r.va().0,
        size: r.size(),
        pa: r.pa().map(|p| p.0),
        present: r.is_present(),
        dirty: r.dirty(),
    }
}

/// Spins for about `us` microseconds.
pub fn busy(us: u64) {
    let t = std::time::Instant::now();
    while t.elapsed().as_micros() < u128::from(us) {
        std::hint::spin_loop();
    }
}

/// Instantiates every case of this module for one format.
#[macro_export]
macro_rules! ops_tests {
    ($m:ident, $a:ident) => {
        mod $m {
            type A = super::$a;

            #[test]
            fn exit_mmap_reports_everything_and_frees_every_table() {
                $crate::ops::exit_mmap_reports_everything_and_frees_every_table::<A>();
            }
            #[test]
            fn entries_report_leaves_and_software_entries() {
                $crate::ops::entries_report_leaves_and_software_entries::<A>();
            }
            #[test]
            fn exit_mmap_of_an_empty_space() {
                $crate::ops::exit_mmap_of_an_empty_space::<A>();
            }
            #[test]
            fn exit_mmap_of_a_user_space_leaves_the_kernel_half() {
                $crate::ops::exit_mmap_of_a_user_space_leaves_the_kernel_half::<A>();
            }
            #[test]
            fn unmap_with_reports_each_removed_entry() {
                $crate::ops::unmap_with_reports_each_removed_entry::<A>();
            }
            #[test]
            fn unmap_with_reports_leaves_of_whole_tables() {
                $crate::ops::unmap_with_reports_leaves_of_whole_tables::<A>();
            }
            #[test]
            fn unmap_with_error_changes_nothing() {
                $crate::ops::unmap_with_error_changes_nothing::<A>();
            }
            #[test]
            fn unmap_with_loses_no_dirty_state_under_the_agent() {
                $crate::ops::unmap_with_loses_no_dirty_state_under_the_agent::<A>(1000);
            }
            #[test]
            fn gather_batches_one_flush_and_defers_frees() {
                $crate::ops::gather_batches_one_flush_and_defers_frees::<A>();
            }
            #[test]
            fn gather_errors_change_nothing() {
                $crate::ops::gather_errors_change_nothing::<A>();
            }
            #[test]
            fn dropping_an_unfinished_gather_finishes_it() {
                $crate::ops::dropping_an_unfinished_gather_finishes_it::<A>();
            }
            #[test]
            fn a_gather_dropped_while_unwinding_still_flushes() {
                $crate::ops::a_gather_dropped_while_unwinding_still_flushes::<A>();
            }
            #[test]
            fn test_and_clear_young_round_trip() {
                $crate::ops::test_and_clear_young_round_trip::<A>();
            }
            #[test]
            fn clear_refs_cleans_and_the_next_store_redirties() {
                $crate::ops::clear_refs_cleans_and_the_next_store_redirties::<A>();
            }
            #[test]
            fn clear_refs_errors_change_nothing() {
                $crate::ops::clear_refs_errors_change_nothing::<A>();
            }
            #[test]
            fn clear_refs_harvests_blocks_whole() {
                $crate::ops::clear_refs_harvests_blocks_whole::<A>();
            }
            #[test]
            fn clear_refs_loses_no_update_under_the_agent() {
                $crate::ops::clear_refs_loses_no_update_under_the_agent::<A>(200);
            }
            #[test]
            fn install_pte_allocates_only_missing_tables() {
                $crate::ops::install_pte_allocates_only_missing_tables::<A>();
            }
            #[test]
            fn install_pte_errors_change_nothing() {
                $crate::ops::install_pte_errors_change_nothing::<A>();
            }
            #[test]
            fn set_access_flags_relaxes_in_place() {
                $crate::ops::set_access_flags_relaxes_in_place::<A>();
            }
            #[test]
            fn replace_pte_reclaims_a_full_table_without_allocating() {
                $crate::ops::replace_pte_reclaims_a_full_table_without_allocating::<A>();
            }
            #[test]
            fn replace_pte_cow_moves_the_page_to_its_copy() {
                $crate::ops::replace_pte_cow_moves_the_page_to_its_copy::<A>();
            }
            #[test]
            fn replace_pte_errors_change_nothing() {
                $crate::ops::replace_pte_errors_change_nothing::<A>();
            }
            #[test]
            fn gathered_replace_pte_defers_only_the_swap_out_flush() {
                $crate::ops::gathered_replace_pte_defers_only_the_swap_out_flush::<A>();
            }
            #[test]
            fn replace_without_the_flush_is_caught() {
                $crate::ops::replace_without_the_flush_is_caught::<A>();
            }
            #[test]
            fn zap_page_range_keeps_the_tables_for_a_refill() {
                $crate::ops::zap_page_range_keeps_the_tables_for_a_refill::<A>();
            }
            #[test]
            fn prot_none_faults_every_access_and_keeps_its_frame() {
                $crate::ops::prot_none_faults_every_access_and_keeps_its_frame::<A>();
            }
            #[test]
            fn map_prot_none_then_open_part_then_unmap() {
                $crate::ops::map_prot_none_then_open_part_then_unmap::<A>();
            }
            #[test]
            fn live_change_to_prot_none_and_back() {
                $crate::ops::live_change_to_prot_none_and_back::<A>();
            }
            #[test]
            fn prot_none_encoding_is_a_leaf_and_never_a_software_entry() {
                $crate::ops::prot_none_encoding_is_a_leaf_and_never_a_software_entry::<A>();
            }
            #[test]
            fn prot_none_survives_fork_and_move() {
                $crate::ops::prot_none_survives_fork_and_move::<A>();
            }
            #[test]
            fn map_prot_none_over_a_mapping_is_refused() {
                $crate::ops::map_prot_none_over_a_mapping_is_refused::<A>();
            }
        }
    };
}
