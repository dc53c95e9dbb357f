//! The simulated MMU (feature `sim`, host only): page-table bugs that
//! normally show only on hardware fail an ordinary `cargo test`.
//!
//! A [`SimMachine`] models one machine: sparse physical memory for data,
//! the table frames, a table walker that decodes entries with the *real*
//! format it is given ([`Format::decode`], [`Format::hw_access`]), a TLB
//! with a walk cache, and the arm64 rule that a table write is not visible
//! to the walker before a barrier. It hands out cheap, `Send + Sync`
//! handles sharing that state:
//!
//! - [`SimMmu`] implements [`Mmu`] (barriers, TLB flushes, installing a
//!   root) and observes every entry write the algorithms make;
//! - [`SimAlloc`] implements [`TableAlloc`] (with live counts and failure
//!   injection);
//!
//! so a test builds an `AddressSpace<A, SimMmu<A>, SimAlloc>`, installs it,
//! and then loads, stores and fetches through virtual addresses with
//! [`SimMachine::read_u64`], [`write_u64`](SimMachine::write_u64),
//! [`read_u8`](SimMachine::read_u8), [`write_u8`](SimMachine::write_u8) and
//! [`exec`](SimMachine::exec) (kernel privilege), and
//! [`user_read_u64`](SimMachine::user_read_u64) and
//! [`user_write_u64`](SimMachine::user_write_u64) (user privilege; any
//! other access with [`SimMachine::access`]). Faults are values
//! ([`SimFault`]), never panics.
//!
//! A kernel's own table allocator runs on the machine through
//! [`SimMachine::alloc_from`], which makes the frames it hands out known
//! to the walker; tables from an allocator the machine does not know fail
//! the walk ([`SimFaultKind::NotATable`]) and the check
//! ([`CheckError::UnknownTable`]).
//!
//! # The model
//!
//! - **Walker.** Starts at the installed root, or below the deepest
//!   walk-cache entry covering the address; reads each entry atomically;
//!   follows [`Decoded::Table`], stops at a [`Decoded::Leaf`] at a height
//!   the format allows, faults on anything else, a
//!   [`Prot::NONE`](crate::Prot::NONE) leaf included
//!   ([`Format::is_protnone`](crate::Format::is_protnone): invalid for the
//!   hardware, so a translation fault and no TLB entry). A table pointer to a frame
//!   that is not a table frame of this machine, or to a freed one, faults
//!   too ([`SimFaultKind::NotATable`], [`SimFaultKind::FreedTable`]) — the
//!   classic use-after-free of a table that was freed before the TLB flush.
//! - **Hardware decoder** (optional). The walker decodes with the format
//!   itself, so a format whose encoding and decoding agree on a wrong
//!   layout (an output-address field in the wrong bits) walks as if it
//!   were right. [`SimMachine::set_hw_decoder`] gives the machine a second
//!   decoder, written from the architecture manual without the format's
//!   help ([`HwDecoder`]); every entry a walk reads is then decoded both
//!   ways, and the first one the two read differently (as the walker would
//!   use it: a table, a leaf where the format allows one, or a fault) is a
//!   [`CheckError::HwDecode`].
//! - **Halves.** On a format with
//!   [`SEPARATE_HALVES`](crate::Format::SEPARATE_HALVES) (arm64), an MMU
//!   handle made with [`SimMachine::mmu_installing_into`] installs into
//!   TTBR0_EL1 or TTBR1_EL1, and the walker picks the root by the
//!   address's half, each translating `VA_BITS` bits; an address between
//!   the halves or in a half without a root faults. Otherwise one root
//!   serves every canonical address. The defaults are `Arm64Mmu`'s:
//!   [`SimMachine::mmu`] installs into both halves,
//!   [`SimMachine::mmu_with_asid`] into the lower one; a kernel space
//!   (`new_kernel`) needs `mmu_installing_into(VaRange::Upper)`, and
//!   `AddressSpace::new_in` refuses an MMU of another half than the
//!   space's at once ([`Error::MmuHalf`](crate::Error::MmuHalf)).
//! - **Hierarchical permissions.** The walker combines the restrictions
//!   of every table entry on the walk ([`Format::table_limits`]: arm64
//!   `APTable`, `UXNTable`, `PXNTable`, Arm ARM D8.4.2; x86 U/S, R/W and XD
//!   of every level, Intel SDM 4.6.1) with the leaf's rights; cached
//!   entries keep them.
//! - **Accessed/dirty.** The permission check and the A/D update are the
//!   format's [`hw_access`](crate::Format::hw_access). The update is written back
//!   with a compare-exchange, as hardware does, and the walk is retried if
//!   the entry changed in between. A software read-modify-write that is not
//!   atomic can therefore lose a dirty bit the simulated hardware set, as
//!   on a real machine ([`SimMachine::hw_touch`] and
//!   [`SimMachine::spawn_agent`] let another thread play the hardware).
//! - **TLB.** Every successful walk caches the leaf (with its height, so a
//!   block is one entry) and the table entries it passed through (the walk
//!   cache). A hit serves the access without reading memory; if the access
//!   needs an A/D update the cached entry lacks (a store through a clean
//!   entry), the walker walks again and updates memory. Cached entries stay
//!   until a flush removes them: [`Mmu::flush_tlb_range`] drops the leaves
//!   overlapping the range, and the walk-cache entries too unless the range
//!   is `last_level`; [`Mmu::flush_tlb_all`] and installing an untagged
//!   root drop everything. The TLB holds [`SimMachine::set_tlb_capacity`] entries
//!   (default 1024) and evicts the oldest entry first (deterministic).
//! - **Walker visibility** (only when [`Arch::NEEDS_WALKER_BARRIER`]: arm64,
//!   RISC-V): every entry write reported through [`Mmu::entry_written`] is
//!   pending, and the walker keeps seeing the slot's value from before the
//!   first pending write, until [`Mmu::walker_barrier`] or any TLB flush
//!   (a flush orders the writes before it; see the rules in [`Mmu`]). A
//!   walk through a pending slot does not write A/D state back.
//!
//! - **RISC-V harts** ([`SimHart`], [`SimMachine::hart`]): the machine's
//!   CPUs as RISC-V harts executing `SFENCE.VMA` (with the privileged
//!   spec's reach: by address and ASID, by ASID without global entries,
//!   by address for every ASID, everything), the Svinval sequence and
//!   `satp` writes, a PTE store reaching the walker only through a fence
//!   that covers it, Svvptc ([`SimMachine::set_svvptc`]) and software
//!   accessed/dirty management ([`SimMachine::set_software_ad`]); see
//!   [`SimHart`] for the rules.
//!
//! # Checking
//!
//! The TLB may legitimately hold an old translation *during* an operation
//! (between clearing an entry and the flush), so the checks run between
//! operations: call [`SimMachine::check`] after each one. It fails with
//!
//! - [`CheckError::Stale`] ([`check_tlb`](SimMachine::check_tlb)): a cached
//!   leaf or walk-cache entry disagrees with a fresh walk of memory
//!   (different output address, size, protection, unmapped now, or cached
//!   dirty while memory says clean) — a missing or too narrow TLB flush;
//! - [`CheckError::Pending`] ([`check_visible`](SimMachine::check_visible)):
//!   an entry write the walker cannot see yet — a missing barrier.
//!
//! The conformance suite's simulated machine ([`SimSuiteMachine`], feature
//! `suite`) runs [`check`](SimMachine::check) after every operation of
//! every case.
//!
//! - **ASIDs and global entries.** Every cached entry is tagged with the
//!   ASID it was filled under ([`SimMachine::mmu_with_asid`]; untagged
//!   MMUs share ASID 0), or as global when its leaf is global
//!   ([`Prot::global`](crate::Prot::global) of the format's
//!   [`leaf_prot`](crate::Format::leaf_prot)). Lookups match the current
//!   ASID and global entries; a range flush drops the range's entries of
//!   the flushing MMU's ASID and its global ones; [`Mmu::flush_tlb_mm`]
//!   drops the ASID's entries and keeps global ones;
//!   [`Mmu::flush_tlb_all`] drops everything. These are exactly what
//!   arm64 `tlbi vae1is`/`vale1is` with an ASID operand, `tlbi aside1is`
//!   and `tlbi vmalle1is` do (Arm ARM D8.14 "TLB maintenance"), and what
//!   x86 INVPCID types 0, 1 and 2 do for a PCID (Intel SDM Vol. 3A
//!   §4.10.4.1); x86 `invlpg` and MOV to CR3 act on the *current* PCID, so
//!   an x86 MMU must not use them for an address space that is not current
//!   (a test shows the simulator catching that). Installing a tagged root
//!   switches the ASID without a flush; [`SimMmu::set_asid`] gives a
//!   handle a new ASID (an allocator's roll-over). A cached entry of the
//!   current ASID is checked against a fresh walk from the *current* root
//!   (an ASID reused for another address space without a flush is reported
//!   stale), any other against a fresh walk from the root it was filled
//!   from, so a global entry that survives the unmap of its leaf, or a
//!   dormant ASID's entry that survives a flush, is reported stale too.
//!   Installing a tagged root checks the new ASID's entries at once: from
//!   that moment the hardware may use them, so a stale one is reported
//!   even if a flush removes it right after.
//! - **Break-before-make** (only when [`Arch::BREAK_BEFORE_MAKE`]): an
//!   entry write that replaces a cached translation by a value the arch
//!   does not allow to coexist with it ([`Arch::change_is_safe`]) is a
//!   [`CheckError::Conflict`], reported by the next check.
//! - **Mixed page sizes** (every arch; what x86 relies on instead of
//!   break-before-make): a block replaced in place by a table while a TLB
//!   still holds the block's translation must not get, until that
//!   translation is flushed, an entry below it that maps the same address
//!   to another frame or with other attributes (Intel SDM Vol. 3A
//!   4.10.2.3): the table's entries when it is linked, and every later
//!   write under it, are compared with the cached block; a difference is
//!   a [`CheckError::MixedSizes`].
//! - **Publication order.** Writes to a table (its zeroing by the
//!   allocator included) may reach the walker in any order until a publish
//!   point ([`Mmu::publish_barrier`], [`Mmu::walker_barrier`] or a flush);
//!   an entry write that links a table written since the last publish
//!   point is a [`CheckError::Unordered`].
//!
//! # Several CPUs
//!
//! [`SimMachine::with_cpus`] builds a machine with several CPUs sharing
//! memory and the tables; each has its own TLB and walk cache, its own
//! root registers and current ASID, fills them from the shared tables and
//! keeps them until a flush that *reaches it* removes them. Everything
//! else (walker visibility, publication order, break-before-make, which
//! looks at every CPU's cached entries) is machine-wide.
//!
//! - **Which CPU.** [`SimMachine::new`] has one CPU, and every handle runs
//!   on CPU 0 unless made otherwise, so a single-CPU test never names a
//!   CPU. [`SimMachine::cpu`] gives the machine as seen from another CPU
//!   (its loads, stores, agents, TLB queries and MMU handles);
//!   [`SimMmu::on_cpu`] moves an MMU handle, and [`SimMmu::on_thread_cpu`]
//!   makes it follow the calling thread's [`set_thread_cpu`], for tests
//!   whose threads play CPUs.
//! - **Reach of a flush.** A [`SimMmu`] is *broadcast* by default: its
//!   flushes reach every CPU, as arm64 `tlbi …is` followed by `dsb ish`
//!   (Arm ARM D8.14, "broadcast" TLB maintenance to the Inner Shareable
//!   domain). [`SimMmu::local_only`] makes them reach the executing CPU
//!   only, as x86 `invlpg`, MOV to CR3 and INVPCID (Intel SDM Vol. 3A
//!   §4.10.5, "Propagation of Paging-Structure Changes to Multiple
//!   Processors") and arm64 `tlbi` without `is` do; on its own that breaks
//!   the [`Mmu`] shootdown rule, and an IPI layer on top must make up for
//!   it (Linux `flush_tlb_multi`). Installing a root writes the executing
//!   CPU's root register; an untagged install flushes that CPU only.
//! - **Checks.** [`check`](SimMachine::check) and
//!   [`check_tlb`](SimMachine::check_tlb) look at every CPU and name the
//!   CPU of the stale entry ([`StaleTlb::cpu`]);
//!   [`check_cpu`](SimMachine::check_cpu) looks at one.
//!
//! The machine is one lock: CPUs interleave at the granularity of one
//! access or one maintenance operation, which is enough to show a stale
//! translation on one CPU being used after another CPU's operation
//! returned (CVE-2018-18281, a TLB flush after mremap's page-table lock
//! was dropped: `tests/sim_broken.rs` races a writer CPU against a move).
//!
//! Not modelled: memory attributes, x86's invalidation of a faulting
//! translation, the hardware setting accessed bits in table (non-leaf)
//! entries, and speculative TLB fills (a CPU fills its TLB only by its own
//! accesses).
//!
//! # For OS authors: your arch port on the simulator
//!
//! Nothing here is specific to the test format. Give [`SimMachine`] your
//! own [`Arch`] type and every host test of your port runs against the
//! exact bits your `Format` produces, with your `Arch` overrides (your
//! `set_pte_at`, your `ptep_modify_prot_start`, …) doing the writes:
//!
//! 1. build `SimMachine::<MyArch>::new()` and an
//!    `AddressSpace::<MyArch, _, _>::new(machine.mmu(), machine.alloc())`
//!    (or `machine.alloc_from(my_tables)` for your kernel's own
//!    [`TableAlloc`]),
//!    and install it with [`Installed::new`], which also deactivates it
//!    when it is dropped, so its tables are freed (an installed address
//!    space that is dropped leaks them);
//! 2. drive your code, touching memory with `read_u64` / `write_u64` /
//!    `exec` (from other threads too: the handles are `Send + Sync`);
//! 3. call [`SimMachine::check`] after each operation;
//! 4. run the conformance suite with [`SimSuiteMachine`] (see
//!    [`crate::suite`]) — the same suite your kernel runs on hardware.
//!
//! Your [`Format::hw_access`] decides what the simulated hardware does
//! (rights, accessed flag faults, dirty-bit management such as arm64 DBM),
//! so it must follow the architecture manual; your
//! [`Arch::NEEDS_WALKER_BARRIER`] decides whether the visibility model is
//! on.
//!
//! To show that a check catches what it should, wrap [`SimMmu`] in an
//! [`Mmu`] that drops flushes or barriers (see `tests/sim_broken.rs` in
//! this crate), or override an [`Arch`] entry operation with a broken one.
//!
//! # Example: a stale TLB entry is caught
//!
//! ```
//! use pgtable_core::sim::SimMachine;
//! use pgtable_core::test_format::TestFormat;
//! use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
//!
//! let machine = SimMachine::<TestFormat<4>>::new();
//! let mut space = AddressSpace::<TestFormat<4>, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
//! // SAFETY (simulated): nothing runs on these tables but the simulator.
//! unsafe { space.install() };
//!
//! let va = VirtAddr(0x4000_0000);
//! space.map(va, PhysAddr(0x8000_0000), 0x1000, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
//! machine.write_u64(va, 42).unwrap();
//! assert_eq!(machine.read_u64(va).unwrap(), 42);
//! assert_eq!(machine.phys_read_u64(PhysAddr(0x8000_0000)), 42);
//! machine.check().unwrap();
//!
//! space.unmap(va, 0x1000).unwrap();
//! assert!(machine.read_u64(va).is_err()); // unmapped and flushed
//! machine.check().unwrap();
//!
//! // Clear the entry behind the MMU's back (no flush): the TLB is stale.
//! space.map(va, PhysAddr(0x8000_0000), 0x1000, Prot::READ_WRITE, MapOptions::PAGES).unwrap();
//! machine.read_u64(va).unwrap();
//! // SAFETY: 0 may be stored in any leaf; the missing TLB flush is the bug
//! // this example shows, on a machine where nothing but the check uses it.
//! let slot = unsafe { space.inspect().slot(va, 0) }.unwrap();
//! slot.store(0, core::sync::atomic::Ordering::Relaxed);
//! let stale = machine.check_tlb().unwrap_err();
//! assert_eq!(stale.va, va);
//!
//! // SAFETY (simulated): the simulated walker checks that a table frame is
//! // still allocated before it reads it, so the tables may be freed.
//! unsafe { space.deactivate() };
//! ```
//!
//! [`Format::decode`]: crate::Format::decode
//! [`Format::hw_access`]: crate::Format::hw_access
//! [`Format::table_limits`]: crate::Format::table_limits
//! [`Format`]: crate::Format
//! [`Decoded::Table`]: crate::Decoded::Table
//! [`Decoded::Leaf`]: crate::Decoded::Leaf

use crate::contract::level::page_size;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use crate::contract::TaggedMmu;
use crate::{
    Access, AccessFault, AddressSpace, Arch, Decoded, Mmu, PhysAddr, Slot, Table, TableAlloc,
    TlbRange, VaRange, VirtAddr,
};

mod foreign;
mod riscv;
mod state;
#[cfg(feature = "suite")]
mod suite_machine;

pub use foreign::SimAllocFrom;
pub use riscv::SimHart;
use state::State;
#[cfg(feature = "suite")]
#[cfg_attr(docsrs, doc(cfg(feature = "suite")))]
pub use suite_machine::SimSuiteMachine;

/// Why a simulated access faulted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SimFaultKind {
    /// No valid entry: the walk ended at this height (the format's
    /// `LEVELS` for an address outside the translated range).
    Translation {
        /// Height of the table whose entry was not valid.
        height: u32,
    },
    /// The leaf refused the access.
    Permission(AccessFault),
    /// A table entry points at a frame that is not a table frame of this
    /// machine: none of its allocators ([`SimMachine::alloc`],
    /// [`SimMachine::alloc_from`]) handed it out. [`SimMachine::check`]
    /// reports it too ([`CheckError::UnknownTable`]).
    NotATable(PhysAddr),
    /// A table entry (or a cached walk) points at a freed table frame.
    FreedTable(PhysAddr),
    /// A `u64` access that is not 8-byte aligned.
    Unaligned,
    /// No root is installed.
    NoRoot,
}

/// A simulated access fault.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SimFault {
    /// The faulting address.
    pub va: VirtAddr,
    /// Whether it was a store.
    pub write: bool,
    /// Why.
    pub kind: SimFaultKind,
}

impl fmt::Display for SimFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.write { "store" } else { "load/fetch" };
        write!(f, "{op} at {} faulted: {:?}", self.va, self.kind)
    }
}

impl std::error::Error for SimFault {}

/// A cached translation that disagrees with the tables in memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct StaleTlb {
    /// The CPU whose TLB holds it (0 on a machine with one CPU).
    pub cpu: usize,
    /// First address of the region the cached entry covers.
    pub va: VirtAddr,
    /// Height of the cached entry.
    pub height: u32,
    /// A leaf (TLB) or a table entry (walk cache).
    pub leaf: bool,
    /// The cached entry.
    pub cached: u64,
    /// What a fresh walk finds (`None`: nothing valid).
    pub fresh: Option<u64>,
}

impl fmt::Display for StaleTlb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CPU {}: stale {} at {} (height {}): cached {:#x}, tables say {:x?}",
            self.cpu,
            if self.leaf {
                "TLB entry"
            } else {
                "walk-cache entry"
            },
            self.va,
            self.height,
            self.cached,
            self.fresh
        )
    }
}

/// A table write the walker cannot see yet (no barrier or flush since).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PendingWrite {
    /// Host address of the entry.
    pub slot: u64,
    /// The value the walker still sees.
    pub old: u64,
    /// The value written.
    pub new: u64,
}

/// A break-before-make violation: an entry was replaced while the TLB held
/// a translation from it that the architecture does not allow to coexist
/// with the new one ([`Arch::change_is_safe`]), without an invalid entry
/// and a TLB invalidation in between.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BbmConflict {
    /// The CPU whose TLB held the translation.
    pub cpu: usize,
    /// First address of the region the cached entry covers.
    pub va: VirtAddr,
    /// Height of the entry.
    pub height: u32,
    /// The cached entry.
    pub cached: u64,
    /// The value written while it was cached.
    pub new: u64,
}

/// Two translations of different sizes for one address that differ in
/// page frame or attributes (permissions included) could be cached at
/// once: a block was split in place while a TLB still held its
/// translation, and an entry under it was then written (or the new table
/// filled) with a value that disagrees with the block's. The Intel SDM
/// (Vol. 3A 4.10.2.3 "Details of TLB Use") leaves processor behaviour
/// undefined then, and the processor may fill the small translation at
/// any moment, so the write itself is reported. Linux `__split_large_page`
/// splits with the block's own attributes and flushes before it changes a
/// small entry. (On a break-before-make arch the in-place split is already
/// a [`BbmConflict`].)
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MixedSizes {
    /// The CPU whose TLB held the block.
    pub cpu: usize,
    /// The address the two translations disagree on (the first of the
    /// written entry's region).
    pub va: VirtAddr,
    /// Height of the written entry.
    pub height: u32,
    /// The value written.
    pub new: u64,
    /// Height of the cached block.
    pub block_height: u32,
    /// The cached block.
    pub cached: u64,
}

/// A misprogrammed contiguous run (Arm ARM D8.6.1 "Contiguous bit"): an
/// entry with the hint whose run does not map one aligned, contiguous
/// physical range with one memory type, or whose entries are not all valid
/// leaves with the hint.
///
/// It is reported where the hardware could meet it:
/// - at a TLB fill through the run (the TLB may then return any of the
///   run's translations);
/// - at the write that makes the entries of a run disagree while some
///   CPU's TLB holds the run (`cached_on`): a valid entry without the hint
///   (rule RNGLXZ: a TLB conflict abort, even with FEAT_BBM level 1 or 2),
///   or with another output address or memory type (rule RJQQTC: a lookup
///   may return any one entry's address and attributes). Permissions may
///   differ while the run is cached (RJQQTC: each lookup returns one
///   entry's, as a stale TLB entry would; Linux `contpte_wrprotect_ptes`
///   changes a whole run entry by entry), and entries the walker cannot use
///   (`0`, cleared to be flushed, or made `Prot::NONE`) are tolerated;
/// - by [`SimMachine::check`] after the operation, which also reports a
///   run whose entries still disagree in permissions, or hold a `0`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ContConflict {
    /// First address of the run.
    pub va: VirtAddr,
    /// Height of its entries.
    pub height: u32,
    /// Index in the run of the first entry that disagrees.
    pub index: u32,
    /// That entry.
    pub raw: u64,
    /// Found by a TLB fill (`true`) or by the check after an operation.
    pub at_fill: bool,
    /// Found at the write that made the entries disagree, while this
    /// CPU's TLB held the run.
    pub cached_on: Option<usize>,
}

/// A table linked before its contents were published: the link store was
/// not ordered after the table's zeroing or entry writes by a publish
/// point ([`Mmu::publish_barrier`], a walker barrier or a TLB flush), so a
/// walker on another CPU could follow the link into stale contents.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UnorderedLink {
    /// Host address of the linking entry.
    pub slot: u64,
    /// The table it links.
    pub table: PhysAddr,
}

/// A table frame the machine cannot walk, because none of its allocators
/// handed it out: an address space built on a [`TableAlloc`] of its own
/// (a kernel's frame allocator) rather than on [`SimMachine::alloc`] or
/// [`SimMachine::alloc_from`], or a forged table entry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct UnknownTable {
    /// The frame's physical address.
    pub pa: PhysAddr,
    /// Where the machine met it.
    pub kind: UnknownTableKind,
}

/// Where a [`SimMachine`] met a table frame it does not know.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UnknownTableKind {
    /// It is an installed root.
    Root,
    /// A walk followed a table entry to it (the access faulted with
    /// [`SimFaultKind::NotATable`]).
    Entry,
    /// Two allocators of the machine handed out a frame at this physical
    /// address (the second allocation failed).
    Clash,
}

/// A decoder of a format's entries as the hardware reads them, written
/// from the architecture manual independently of the format's own
/// [`Format::decode`](crate::Format::decode): what the entry `raw` of a
/// table at `height` is for the hardware walker ([`Decoded::Invalid`] for
/// anything it faults on). See [`SimMachine::set_hw_decoder`].
pub type HwDecoder = fn(raw: u64, height: u32) -> Decoded;

/// An entry a walk read that the format and the [`HwDecoder`] read
/// differently: the format's encoding of it is not what the hardware
/// makes of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DecodeMismatch {
    /// The address being translated.
    pub va: VirtAddr,
    /// Height of the entry's table.
    pub height: u32,
    /// The entry.
    pub raw: u64,
    /// What the format decodes it to, as the walker uses it.
    pub format: Decoded,
    /// What the hardware decoder decodes it to.
    pub hardware: Decoded,
}

/// What [`SimMachine::check`] found.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CheckError {
    /// A table frame no allocator of the machine handed out (the tables
    /// were not built with [`SimMachine::alloc`] or
    /// [`SimMachine::alloc_from`]).
    UnknownTable(UnknownTable),
    /// A stale TLB or walk-cache entry (missing or too narrow flush).
    Stale(StaleTlb),
    /// A write not visible to the walker (missing barrier).
    Pending(PendingWrite),
    /// A live entry replaced without the break-before-make the arch needs.
    Conflict(BbmConflict),
    /// A split block's translation still cached while an entry under it
    /// disagrees with it.
    MixedSizes(MixedSizes),
    /// A table linked before its contents were published.
    Unordered(UnorderedLink),
    /// A contiguous run whose entries disagree.
    Contiguous(ContConflict),
    /// An entry the format and the hardware decoder read differently
    /// ([`SimMachine::set_hw_decoder`]).
    HwDecode(DecodeMismatch),
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::UnknownTable(u) => {
                let what = match u.kind {
                    UnknownTableKind::Root => "installed as a root",
                    UnknownTableKind::Entry => "reached by a table walk",
                    UnknownTableKind::Clash => "handed out by two allocators",
                };
                write!(
                    f,
                    "table frame {} {what} is not a frame of this machine's allocators \
                     (build the address space with SimMachine::alloc or alloc_from)",
                    u.pa
                )
            }
            CheckError::Stale(s) => s.fmt(f),
            CheckError::Pending(p) => write!(
                f,
                "entry at host {:#x} written ({:#x} -> {:#x}) but not visible to the walker",
                p.slot, p.old, p.new
            ),
            CheckError::Conflict(c) => write!(
                f,
                "break-before-make violated at {} (height {}): {:#x} written while CPU {} cached {:#x}",
                c.va, c.height, c.new, c.cpu, c.cached
            ),
            CheckError::MixedSizes(c) => write!(
                f,
                "mixed page sizes at {}: {:#x} written at height {} while CPU {} cached the height-{} block {:#x}",
                c.va, c.new, c.height, c.cpu, c.block_height, c.cached
            ),
            CheckError::Contiguous(c) => {
                write!(
                    f,
                    "contiguous run at {} (height {}) misprogrammed",
                    c.va, c.height
                )?;
                if c.at_fill {
                    f.write_str(" at a TLB fill")?;
                }
                if let Some(cpu) = c.cached_on {
                    write!(f, " by a write while CPU {cpu} cached it")?;
                }
                write!(f, ": entry {} is {:#x}", c.index, c.raw)
            }
            CheckError::Unordered(u) => write!(
                f,
                "table {} linked at host {:#x} before its contents were published",
                u.table, u.slot
            ),
            CheckError::HwDecode(d) => write!(
                f,
                "entry {:#x} (height {}) on the walk of {}: the format decodes {:x?}, \
                 the hardware decoder {:x?}",
                d.raw, d.height, d.va, d.format, d.hardware
            ),
        }
    }
}

impl std::error::Error for CheckError {}

/// The accessed/dirty state an access set in its leaf.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AdUpdate {
    /// The access set the accessed state.
    pub accessed: bool,
    /// The access set the dirty state.
    pub dirty: bool,
}

/// The simulator's own counters (the address space's [`Stats`] count the
/// algorithms' requests; these count what the machine did).
///
/// [`Stats`]: crate::Stats
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct SimStats {
    /// Accesses served by a cached leaf.
    pub tlb_hits: u64,
    /// Accesses that walked the tables.
    pub tlb_misses: u64,
    /// Walks (including retries).
    pub walks: u64,
    /// Walks that started from the walk cache.
    pub walk_cache_hits: u64,
    /// Entries dropped by flushes.
    pub tlb_entries_flushed: u64,
    /// Entries evicted for capacity.
    pub tlb_evictions: u64,
    /// Range flushes.
    pub flush_range: u64,
    /// Full flushes.
    pub flush_all: u64,
    /// Walker barriers.
    pub barriers: u64,
    /// Entry writes reported by the algorithms.
    pub entries_written: u64,
    /// Walker reads that saw an older value than memory held.
    pub stale_walker_reads: u64,
    /// Accessed states set by the walker.
    pub accessed_set: u64,
    /// Dirty states set by the walker.
    pub dirty_set: u64,
    /// A/D write-backs retried because the entry changed under the walker.
    pub ad_retries: u64,
    /// Leaves cached by walks (TLB fills); a folded contiguous run is one
    /// fill for the whole run.
    pub tlb_fills: u64,
}

/// What an agent thread did (see [`SimMachine::spawn_agent`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct AgentReport {
    /// Accesses made.
    pub touches: u64,
    /// Accesses that faulted.
    pub faults: u64,
    /// Accessed states it set.
    pub accessed_set: u64,
    /// Dirty states it set.
    pub dirty_set: u64,
}

struct Shared {
    state: Mutex<State>,
}

/// A simulated machine for the arch `A`; cheap to clone (all clones share
/// one machine).
pub struct SimMachine<A: Arch> {
    shared: Arc<Shared>,
    /// The CPU this handle's accesses run on.
    cpu: usize,
    _arch: PhantomData<fn() -> A>,
}

impl<A: Arch> Clone for SimMachine<A> {
    fn clone(&self) -> Self {
        SimMachine {
            shared: self.shared.clone(),
            cpu: self.cpu,
            _arch: PhantomData,
        }
    }
}

impl<A: Arch> Default for SimMachine<A> {
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Arch> fmt::Debug for SimMachine<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimMachine")
            .field("arch", &A::NAME)
            .finish_non_exhaustive()
    }
}

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panicking test thread must not hide the state from the others.
    shared.state.lock().unwrap_or_else(|e| e.into_inner())
}

impl<A: Arch> SimMachine<A> {
    /// A machine with one CPU, empty memory, no root and an empty TLB.
    pub fn new() -> Self {
        Self::with_cpus(1)
    }

    /// A machine with `n` CPUs (at least 1), each with its own TLB, walk
    /// cache, root registers and current ASID, sharing memory and the
    /// tables (see the [module docs](self#several-cpus)). This handle,
    /// like every handle made from it, runs on CPU 0; [`cpu`](Self::cpu)
    /// gives handles for the others.
    pub fn with_cpus(n: usize) -> Self {
        SimMachine {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new::<A>(n)),
            }),
            cpu: 0,
            _arch: PhantomData,
        }
    }

    /// Number of CPUs.
    pub fn cpus(&self) -> usize {
        lock(&self.shared).cpus()
    }

    /// The same machine seen from CPU `i`: its accesses
    /// ([`read_u64`](Self::read_u64), [`access`](Self::access),
    /// [`hw_touch`](Self::hw_touch), [`spawn_agent`](Self::spawn_agent),
    /// …) go through CPU `i`'s TLB, [`root`](Self::root),
    /// [`asid`](Self::asid), [`tlb_len`](Self::tlb_len) and
    /// [`tlb_holds`](Self::tlb_holds) describe CPU `i`, and the MMU
    /// handles it makes execute on CPU `i`. The checks cover every CPU
    /// from any handle.
    ///
    /// # Panics
    ///
    /// If `i` is not below [`cpus`](Self::cpus) (like a slice index).
    pub fn cpu(&self, i: usize) -> Self {
        let n = self.cpus();
        assert!(i < n, "CPU {i} of a machine with {n} CPUs");
        SimMachine {
            shared: self.shared.clone(),
            cpu: i,
            _arch: PhantomData,
        }
    }

    /// The CPU this handle runs on.
    pub fn cpu_id(&self) -> usize {
        self.cpu
    }

    /// The machine's state, with this handle's CPU selected.
    fn state(&self) -> MutexGuard<'_, State> {
        let mut s = lock(&self.shared);
        s.select(self.cpu);
        s
    }

    /// The MMU handle (for `AddressSpace::new`) of an untagged address
    /// space: installing it drops every cached translation, and its
    /// [`flush_tlb_mm`](Mmu::flush_tlb_mm) keeps global ones (as x86 MOV
    /// to CR3 does). It installs one root for both halves, as
    /// `Arm64Mmu::new` does ([`SimMmu::installing_into`] for one half).
    pub fn mmu(&self) -> SimMmu<A> {
        SimMmu {
            shared: self.shared.clone(),
            asid: AtomicU32::new(UNTAGGED),
            half: VaRange::Both,
            cpu: Some(self.cpu),
            broadcast: true,
            _arch: PhantomData,
        }
    }

    /// The MMU handle of an address space that translates one half
    /// ([`AddressSpace::new_in`]): [`SimMmu::installing_into`] of
    /// [`mmu`](Self::mmu).
    pub fn mmu_installing_into(&self, half: VaRange) -> SimMmu<A> {
        self.mmu().installing_into(half)
    }

    /// The MMU handle of an address space tagged with `asid`: installing
    /// it switches the current ASID without dropping cached translations
    /// (other ASIDs' entries stay, as on hardware), flushes by address
    /// reach its ASID and global entries, and
    /// [`flush_tlb_mm`](Mmu::flush_tlb_mm) drops its ASID's entries only.
    /// The ASID can be changed later with [`SimMmu::set_asid`] (as an ASID
    /// allocator does at a roll-over).
    ///
    /// It installs into the lower half, as `Arm64Mmu::with_asid16` does
    /// (on arm64 the ASID goes with the TTBR0_EL1 root: a user space's);
    /// on a format with one root, one root for both halves.
    /// [`SimMmu::installing_into`] changes it.
    pub fn mmu_with_asid(&self, asid: u16) -> SimMmu<A> {
        SimMmu {
            shared: self.shared.clone(),
            asid: AtomicU32::new(u32::from(asid)),
            half: VaRange::Lower,
            cpu: Some(self.cpu),
            broadcast: true,
            _arch: PhantomData,
        }
    }

    /// The MMU handle of an address space that has not run yet and will be
    /// switched to by [`AsidAllocator::switch_mm`](crate::asid::AsidAllocator::switch_mm):
    /// no ASID yet ([`TaggedMmu::tag`] is `None`), so its flushes do
    /// nothing (see [`TaggedMmu`] for why that is right); `switch_mm`
    /// gives it one. Installing it directly makes it untagged. Otherwise
    /// as [`mmu_with_asid`](Self::mmu_with_asid) (lower half).
    pub fn mmu_unassigned(&self) -> SimMmu<A> {
        let m = self.mmu_with_asid(0);
        m.asid.store(UNASSIGNED, Ordering::Relaxed);
        m
    }

    /// The ASID of the installed root (0 after installing an untagged
    /// MMU's root).
    pub fn asid(&self) -> u16 {
        self.state().cpu.asid as u16
    }

    /// The table allocator handle (for `AddressSpace::new`).
    pub fn alloc(&self) -> SimAlloc {
        SimAlloc {
            shared: self.shared.clone(),
        }
    }

    /// The table allocator `tables` (a kernel's own frame allocator), made
    /// known to this machine: every frame it hands out through the
    /// returned handle is a table frame the simulated walker reads (through
    /// `tables`' [`phys_to_virt`](TableAlloc::phys_to_virt)) until the
    /// handle frees it. Give it to `AddressSpace::new` in place of
    /// [`alloc`](Self::alloc) to run the kernel's allocator on the
    /// simulator; an address space built on `tables` directly has tables
    /// the machine cannot walk ([`CheckError::UnknownTable`]).
    ///
    /// `tables`' physical addresses name table frames only: data loads
    /// and stores ([`phys_read_u64`](Self::phys_read_u64), a leaf's output
    /// address) go to the machine's memory, as before. A frame at the
    /// physical address of a live frame of another allocator of the
    /// machine is refused (the allocation fails and the check reports
    /// [`UnknownTableKind::Clash`]).
    ///
    /// ```
    /// # use core::ptr::NonNull;
    /// use pgtable_core::contract::{Arena, Table, TableAlloc};
    /// use pgtable_core::sim::SimMachine;
    /// use pgtable_core::test_format::TestFormat;
    /// use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};
    ///
    /// let machine = SimMachine::<TestFormat>::new();
    /// // Any `TableAlloc`: a kernel's frame allocator; here a host arena.
    /// let tables = machine.alloc_from(Arena::new());
    /// let mut space = AddressSpace::<TestFormat, _, _>::new(machine.mmu(), tables)?;
    /// // SAFETY (simulated): nothing runs on these tables but the simulator.
    /// unsafe { space.install() };
    /// let va = VirtAddr(0x40_0000);
    /// space.map(va, PhysAddr(0x8000_0000), 4096, Prot::READ_WRITE, MapOptions::PAGES)?;
    /// machine.write_u64(va, 7).unwrap();
    /// assert_eq!(machine.phys_read_u64(PhysAddr(0x8000_0000)), 7);
    /// machine.check().unwrap();
    /// assert_eq!(space.alloc().inner().live(), space.inspect().count_tables());
    /// // SAFETY (simulated): the walker never reads a freed frame.
    /// unsafe { space.deactivate() };
    /// # Ok::<(), pgtable_core::Error>(())
    /// ```
    pub fn alloc_from<T: TableAlloc>(&self, tables: T) -> SimAllocFrom<T> {
        SimAllocFrom::new(self.shared.clone(), tables)
    }

    /// The installed root.
    pub fn root(&self) -> Option<PhysAddr> {
        self.state().cpu.root
    }

    /// Performs `access` at `va` like the hardware: the physical address of
    /// the byte and the A/D update made, or the fault.
    pub fn access(&self, va: VirtAddr, access: Access) -> Result<(PhysAddr, AdUpdate), SimFault> {
        let (pa, upd) = self.state().access::<A>(va.0, access)?;
        Ok((PhysAddr(pa), upd))
    }

    /// The physical address a kernel load at `va` uses (through the TLB,
    /// setting A/D state like any access).
    pub fn translate(&self, va: VirtAddr) -> Result<PhysAddr, SimFault> {
        self.access(va, Access::READ).map(|r| r.0)
    }

    fn aligned(va: VirtAddr, write: bool) -> Result<(), SimFault> {
        if va.is_aligned(8) {
            Ok(())
        } else {
            Err(SimFault {
                va,
                write,
                kind: SimFaultKind::Unaligned,
            })
        }
    }

    /// A kernel load of the `u64` at `va` (8-byte aligned).
    pub fn read_u64(&self, va: VirtAddr) -> Result<u64, SimFault> {
        self.load_u64(va, Access::READ)
    }

    /// A kernel store of the `u64` at `va` (8-byte aligned).
    pub fn write_u64(&self, va: VirtAddr, val: u64) -> Result<(), SimFault> {
        self.store_u64(va, val, Access::WRITE)
    }

    /// A user-mode load of the `u64` at `va` (8-byte aligned): as
    /// [`read_u64`](Self::read_u64), at user privilege (arm64 EL0, x86
    /// CPL 3, RISC-V U-mode), so it faults
    /// ([`SimFaultKind::Permission`]) on a page without
    /// [`Prot::USER`](crate::Prot::USER) or under a table entry that
    /// denies user access.
    pub fn user_read_u64(&self, va: VirtAddr) -> Result<u64, SimFault> {
        self.load_u64(va, USER_READ)
    }

    /// A user-mode store of the `u64` at `va` (8-byte aligned): as
    /// [`write_u64`](Self::write_u64), at user privilege (see
    /// [`user_read_u64`](Self::user_read_u64)).
    pub fn user_write_u64(&self, va: VirtAddr, val: u64) -> Result<(), SimFault> {
        self.store_u64(va, val, USER_WRITE)
    }

    fn load_u64(&self, va: VirtAddr, access: Access) -> Result<u64, SimFault> {
        Self::aligned(va, false)?;
        let mut s = self.state();
        let (pa, _) = s.access::<A>(va.0, access)?;
        let mut b = [0; 8];
        s.mem_read(pa, &mut b);
        Ok(u64::from_le_bytes(b))
    }

    fn store_u64(&self, va: VirtAddr, val: u64, access: Access) -> Result<(), SimFault> {
        Self::aligned(va, true)?;
        let mut s = self.state();
        let (pa, _) = s.access::<A>(va.0, access)?;
        s.mem_write(pa, &val.to_le_bytes());
        Ok(())
    }

    /// A kernel load of the byte at `va`.
    pub fn read_u8(&self, va: VirtAddr) -> Result<u8, SimFault> {
        let mut s = self.state();
        let (pa, _) = s.access::<A>(va.0, Access::READ)?;
        let mut b = [0; 1];
        s.mem_read(pa, &mut b);
        Ok(b[0])
    }

    /// A kernel store of the byte at `va`.
    pub fn write_u8(&self, va: VirtAddr, val: u8) -> Result<(), SimFault> {
        let mut s = self.state();
        let (pa, _) = s.access::<A>(va.0, Access::WRITE)?;
        s.mem_write(pa, &[val]);
        Ok(())
    }

    /// A kernel instruction fetch at `va`: `Ok` if it would execute.
    pub fn exec(&self, va: VirtAddr) -> Result<(), SimFault> {
        self.access(va, Access::EXEC).map(|_| ())
    }

    /// The hardware agent's access: what a CPU (or a device) touching `va`
    /// does to the tables, from any thread. Returns the A/D update made.
    pub fn hw_touch(&self, va: VirtAddr, write: bool) -> Result<AdUpdate, SimFault> {
        let a = if write { Access::WRITE } else { Access::READ };
        self.access(va, a).map(|r| r.1)
    }

    /// Starts a thread that plays the hardware on `[va, va + len)` until
    /// `stop` is set: it touches every page in turn, alternating loads and
    /// stores, and flushes its own TLB entries for the page after each
    /// touch so that every touch walks the tables and races with software
    /// updates of the entries (the worst case for lost A/D updates).
    pub fn spawn_agent(
        &self,
        va: VirtAddr,
        len: u64,
        stop: Arc<AtomicBool>,
    ) -> JoinHandle<AgentReport>
    where
        A: Send,
    {
        let m = self.clone();
        std::thread::spawn(move || {
            let mut r = AgentReport::default();
            let pages = (len / page_size::<A>()).max(1);
            let mut i = 0u64;
            // Relaxed: a stop request needs no ordering with the touches.
            while !stop.load(Ordering::Relaxed) {
                let page = VirtAddr(va.0 + (i % pages) * page_size::<A>());
                // Each page alternates load and store from one round to
                // the next.
                match m.hw_touch(page, (i + i / pages) % 2 == 1) {
                    Ok(u) => {
                        r.accessed_set += u64::from(u.accessed);
                        r.dirty_set += u64::from(u.dirty);
                    }
                    Err(_) => r.faults += 1,
                }
                r.touches += 1;
                m.drop_cached(page);
                i += 1;
            }
            r
        })
    }

    /// Drops the cached leaves covering `va` without counting a flush (the
    /// agent's way to force its next touch to walk).
    fn drop_cached(&self, va: VirtAddr) {
        let mut s = self.state();
        s.drop_where(|&(base, h, leaf, _)| leaf && (va.0 & !(state::key_span::<A>(h) - 1)) == base);
    }

    /// Reads a `u64` of physical memory directly (no translation).
    pub fn phys_read_u64(&self, pa: PhysAddr) -> u64 {
        let mut b = [0; 8];
        self.state().mem_read(pa.0, &mut b);
        u64::from_le_bytes(b)
    }

    /// Writes a `u64` of physical memory directly (no translation).
    pub fn phys_write_u64(&self, pa: PhysAddr, val: u64) {
        self.state().mem_write(pa.0, &val.to_le_bytes());
    }

    /// Checks that no cached translation disagrees with a fresh walk of the
    /// tables (see the [module docs](self#checking)).
    pub fn check_tlb(&self) -> Result<(), StaleTlb> {
        self.state().check_tlb::<A>()
    }

    /// Checks that every reported entry write is visible to the walker.
    pub fn check_visible(&self) -> Result<(), PendingWrite> {
        self.state().check_visible()
    }

    /// Checks CPU `i`'s cached translations only (as
    /// [`check_tlb`](Self::check_tlb) does for every CPU).
    ///
    /// # Panics
    ///
    /// If `i` is not below [`cpus`](Self::cpus).
    pub fn check_cpu(&self, i: usize) -> Result<(), StaleTlb> {
        let s = lock(&self.shared);
        assert!(i < s.cpus(), "CPU {i} of a machine with {} CPUs", s.cpus());
        s.check_cpu::<A>(i)
    }

    /// [`check_tlb`](Self::check_tlb) and
    /// [`check_visible`](Self::check_visible): call it after every
    /// operation.
    pub fn check(&self) -> Result<(), CheckError> {
        self.state().check::<A>()
    }

    /// Number of cached entries (leaves and walk-cache entries).
    pub fn tlb_len(&self) -> usize {
        self.state().cpu.tlb.len()
    }

    /// Whether a leaf covering `va` is cached (one for the page, or one
    /// for its folded contiguous run).
    pub fn tlb_holds(&self, va: VirtAddr) -> bool {
        let s = self.state();
        state::leaf_keys::<A>().any(|h| {
            let base = va.0 & !(state::key_span::<A>(h) - 1);
            [s.cpu.asid, state::GLOBAL]
                .iter()
                .any(|&tag| s.cpu.tlb.contains_key(&(base, h, true, tag)))
        })
    }

    /// Whether the TLB holds one entry for the whole folded contiguous run
    /// holding `va`.
    pub fn tlb_holds_run(&self, va: VirtAddr) -> bool {
        let s = self.state();
        (0..A::LEVELS).any(|h| {
            if A::cont_entries(h) == 0 {
                return false;
            }
            let k = h | state::CONT_KEY;
            let base = va.0 & !(state::key_span::<A>(k) - 1);
            [s.cpu.asid, state::GLOBAL]
                .iter()
                .any(|&tag| s.cpu.tlb.contains_key(&(base, k, true, tag)))
        })
    }

    /// Checks every folded contiguous run reachable from the installed
    /// roots of every CPU: all entries valid leaves with the hint, one
    /// aligned contiguous physical range, equal permissions and memory
    /// type (see [`ContConflict`]); also reports a conflict an earlier TLB
    /// fill met. [`check`](Self::check) includes it.
    pub fn check_contiguous(&self) -> Result<(), ContConflict> {
        self.state().check_contiguous::<A>()
    }

    /// Makes the hardware record the accessed/dirty update of a leaf in a
    /// folded contiguous run in the run's first entry rather than in the
    /// entry it walked (off by default). The hardware may record it in any
    /// entry of the run, which is why Linux `contpte_ptep_get` ORs the
    /// run's states: with this on, software that reads one entry's own
    /// state (a report, a harvest) misses a store the run took.
    pub fn set_run_ad_on_first_entry(&self, on: bool) {
        self.state().run_ad_first = on;
    }

    /// Decodes every entry a walk reads with `decoder` too (`None`: no
    /// more), and records the first one it reads differently from the
    /// format for [`check`](Self::check) ([`CheckError::HwDecode`]). The
    /// walk itself goes on as the format decodes. Give it a decoder
    /// written from the architecture manual, knowing of the format only
    /// what the hardware is configured with (page size, address sizes).
    pub fn set_hw_decoder(&self, decoder: Option<HwDecoder>) {
        self.state().hw_decoder = decoder;
    }

    /// Sets how many entries the TLB holds (at least 1).
    pub fn set_tlb_capacity(&self, n: usize) {
        let mut s = self.state();
        s.tlb_capacity = n.max(1);
        let cap = s.tlb_capacity;
        for i in 0..s.cpus() {
            s.select(i);
            s.shrink_to(cap);
        }
    }

    /// The machine's counters.
    pub fn stats(&self) -> SimStats {
        self.state().stats
    }

    /// Table frames allocated and not freed.
    pub fn live_tables(&self) -> usize {
        self.state().live.len()
    }

    /// Lets the next `n` table allocations succeed and every later one fail
    /// (`None`: never fail), for every [`SimAlloc`] of this machine: the
    /// budget is the machine's [`Arena::fail_after`](crate::Arena::fail_after),
    /// which [`SimAlloc::fail_after`] sets too. A [`SimAllocFrom`] fails
    /// when the allocator it wraps does.
    pub fn fail_after(&self, n: Option<u64>) {
        self.state().arena.fail_after(n);
    }
}

std::thread_local! {
    /// The CPU the calling thread plays (see [`set_thread_cpu`]).
    static THREAD_CPU: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Makes the calling thread play CPU `i` for the MMU handles made with
/// [`SimMmu::on_thread_cpu`] (every thread plays CPU 0 until it calls
/// this). In a test where threads stand for CPUs, each thread calls it
/// once at its start, and an address space whose MMU executes on the
/// thread's CPU can be changed from any of them.
pub fn set_thread_cpu(i: usize) {
    THREAD_CPU.with(|c| c.set(i));
}

/// The CPU the calling thread plays ([`set_thread_cpu`]).
pub fn thread_cpu() -> usize {
    THREAD_CPU.with(|c| c.get())
}

/// A user-mode data load.
const USER_READ: Access = Access {
    user: true,
    ..Access::READ
};

/// A user-mode data store.
const USER_WRITE: Access = Access {
    user: true,
    ..Access::WRITE
};

/// The `asid` of an untagged [`SimMmu`].
const UNTAGGED: u32 = u32::MAX;
/// The `asid` of an unassigned [`SimMmu`] ([`SimMachine::mmu_unassigned`]).
const UNASSIGNED: u32 = u32::MAX - 1;

/// The [`Mmu`] of a [`SimMachine`].
pub struct SimMmu<A: Arch> {
    shared: Arc<Shared>,
    /// The ASID, or [`UNTAGGED`].
    asid: AtomicU32,
    /// The half whose root register installing writes ([`VaRange::Both`]:
    /// one root for both halves).
    half: VaRange,
    /// The CPU that executes this MMU's instructions (`None`: the calling
    /// thread's, [`set_thread_cpu`]).
    cpu: Option<usize>,
    /// Flushes reach every CPU (`true`) or the executing one only.
    broadcast: bool,
    _arch: PhantomData<fn() -> A>,
}

impl<A: Arch> Clone for SimMmu<A> {
    /// A handle with the same machine and the same ASID (now; later
    /// [`set_asid`](SimMmu::set_asid) calls are per handle).
    fn clone(&self) -> Self {
        SimMmu {
            shared: self.shared.clone(),
            // Relaxed: the handle's own value; the machine's lock orders
            // everything else.
            asid: AtomicU32::new(self.asid.load(Ordering::Relaxed)),
            half: self.half,
            cpu: self.cpu,
            broadcast: self.broadcast,
            _arch: PhantomData,
        }
    }
}

impl<A: Arch> fmt::Debug for SimMmu<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SimMmu")
    }
}

impl<A: Arch> SimMmu<A> {
    /// The same MMU, but [`install_root`](Mmu::install_root) writes the
    /// root register of `half` only, as an OS with split halves does.
    ///
    /// On a format with [`SEPARATE_HALVES`](crate::Format::SEPARATE_HALVES)
    /// (arm64) the machine then translates each half through its own root
    /// of `VA_BITS` bits: [`VaRange::Lower`] writes TTBR0_EL1 (addresses
    /// `[0, 2^VA_BITS)`) and [`VaRange::Upper`] TTBR1_EL1 (addresses
    /// `[2^64 - 2^VA_BITS, 2^64)`); an address in neither, or in a half
    /// whose root is not installed, faults. Installing an upper root keeps
    /// the current ASID (arm64 takes it from TTBR0_EL1, TCR_EL1.A1 = 0).
    /// [`VaRange::Both`], and any half on a format with one root (x86
    /// CR3), installs the one root for both halves.
    ///
    /// The defaults are those of `pgtable_arm64::Arm64Mmu`:
    /// [`SimMachine::mmu`] installs into both halves,
    /// [`SimMachine::mmu_with_asid`] into the lower half (TTBR0_EL1, which
    /// holds the ASID). [`Mmu::installs_into`] reports the half, so
    /// [`AddressSpace::new_kernel`] and [`AddressSpace::new_user`] refuse
    /// an MMU of the wrong half ([`Error::MmuHalf`](crate::Error::MmuHalf)).
    pub fn installing_into(mut self, half: VaRange) -> Self {
        self.half = half;
        self
    }

    /// The machine this MMU belongs to.
    pub fn machine(&self) -> SimMachine<A> {
        SimMachine {
            shared: self.shared.clone(),
            cpu: self.exec_cpu(),
            _arch: PhantomData,
        }
    }

    /// The same MMU, executing on CPU `i`: [`install_root`](Mmu::install_root)
    /// writes CPU `i`'s root registers, and a
    /// [`local_only`](Self::local_only) flush reaches CPU `i`. Its
    /// operations panic if `i` is not below the machine's
    /// [`cpus`](SimMachine::cpus).
    pub fn on_cpu(mut self, i: usize) -> Self {
        self.cpu = Some(i);
        self
    }

    /// The same MMU, executing on whichever CPU the calling thread plays
    /// ([`set_thread_cpu`]; CPU 0 unless set): for a test in which
    /// threads stand for CPUs and an operation may start on any of them.
    ///
    /// Its operations panic if that CPU is not below the machine's
    /// [`cpus`](SimMachine::cpus) (a test set-up error, like a bad slice
    /// index).
    pub fn on_thread_cpu(mut self) -> Self {
        self.cpu = None;
        self
    }

    /// The same MMU, but its flushes reach only the CPU that executes
    /// them, as arm64 `tlbi` without the Inner Shareable form, x86
    /// `invlpg`, MOV to CR3 and INVPCID do. On a machine with several
    /// CPUs such an MMU breaks the [`Mmu`] shootdown rule unless
    /// something else (an IPI to every other CPU: Linux
    /// `flush_tlb_multi`) reaches the others; `pgtable_x86::shootdown`
    /// builds that on a local MMU. The default is a broadcast MMU (arm64
    /// `tlbi …is` with `dsb ish`), whose flushes reach every CPU.
    pub fn local_only(mut self) -> Self {
        self.broadcast = false;
        self
    }

    /// Whether this MMU's flushes reach every CPU.
    pub fn is_broadcast(&self) -> bool {
        self.broadcast
    }

    /// The CPU that executes this MMU's instructions now.
    pub fn exec_cpu(&self) -> usize {
        self.cpu.unwrap_or_else(thread_cpu)
    }

    /// The machine's state with the executing CPU selected.
    fn state(&self) -> MutexGuard<'_, State> {
        let cpu = self.exec_cpu();
        let mut s = lock(&self.shared);
        let n = s.cpus();
        assert!(
            cpu < n,
            "MMU executing on CPU {cpu} of a machine with {n} CPUs"
        );
        s.select(cpu);
        s
    }
}

impl<A: Arch> SimMmu<A> {
    /// The ASID this handle flushes by and installs with (`None`:
    /// untagged).
    pub fn asid(&self) -> Option<u16> {
        // Relaxed: see `Clone`.
        match self.asid.load(Ordering::Relaxed) {
            UNTAGGED | UNASSIGNED => None,
            a => Some(a as u16),
        }
    }

    /// Gives this handle the ASID `asid` (tagging it if it was not): its
    /// flushes name `asid` from now on, and its next
    /// [`install_root`](Mmu::install_root) switches to it without a flush.
    /// An ASID allocator's new ASID for the address space goes here
    /// ([`crate::asid::Switch::asid`]).
    pub fn set_asid(&self, asid: u16) {
        // Relaxed: see `Clone`.
        self.asid.store(u32::from(asid), Ordering::Relaxed);
    }

    /// Defers this handle's flush to its next install, as an x86 MMU
    /// without INVPCID must for a PCID that is not current (it cannot name
    /// the PCID, and `invlpg` reaches only the current one; see
    /// `pgtable_x86::PcidCpu`): the ASID's entries are exempt from the
    /// check until a [`flush_tlb_mm`](Mmu::flush_tlb_mm) of the ASID or a
    /// [`flush_tlb_all`](Mmu::flush_tlb_all). Installing the ASID without
    /// that flush ends the exemption, so its stale entries are reported. A
    /// deferral for the ASID installed now is ignored: its entries are in
    /// use.
    ///
    /// On several CPUs the deferral applies to the CPUs this MMU's flushes
    /// reach (every CPU for a broadcast MMU), each by its own current
    /// ASID.
    pub fn defer_flush(&self) {
        let tag = self.tag();
        let mut s = self.state();
        let me = s.sel;
        let reach = if self.broadcast {
            0..s.cpus()
        } else {
            me..me + 1
        };
        for i in reach {
            s.select(i);
            if s.cpu.asid != tag || s.cpu.root.is_none() {
                s.cpu.owed.insert(tag);
            }
        }
    }

    /// The tag of this MMU's TLB entries (untagged spaces share 0).
    fn tag(&self) -> u32 {
        self.asid().map_or(0, u32::from)
    }

    /// Whether this handle is unassigned (made by
    /// [`SimMachine::mmu_unassigned`], never tagged nor installed).
    fn unassigned(&self) -> bool {
        // Relaxed: see `Clone`.
        self.asid.load(Ordering::Relaxed) == UNASSIGNED
    }
}

// SAFETY: `set_tag` is `set_asid`, after which flushes and installs use the
// ASID; `local_flush_all` empties the executing CPU's TLB (and its deferred
// flushes); an unassigned handle's flushes are skipped only while it was
// never installed (`install_root` makes it untagged).
unsafe impl<A: Arch> TaggedMmu for SimMmu<A> {
    fn tag(&self) -> Option<u16> {
        self.asid()
    }

    /// Any 16-bit ASID: the simulator has no width limit.
    fn set_tag(&self, tag: u16) -> Result<(), crate::asid::AsidError> {
        self.set_asid(tag);
        Ok(())
    }

    fn local_flush_all(&self) {
        let mut s = self.state();
        let me = s.sel;
        s.flush_all(me, false);
    }
}

// SAFETY: a broadcast handle's flushes act on every simulated CPU's TLB at
// once, as the contract asks; a `local_only` handle breaks the shootdown
// rule on purpose on a machine with several CPUs (documented there; it is
// a model of a local flush for tests and for shootdown layers to build on).
unsafe impl<A: Arch> Mmu for SimMmu<A> {
    const OBSERVES_WRITES: bool = true;

    fn walker_barrier(&self) {
        lock(&self.shared).barrier();
    }

    fn publish_barrier(&self) {
        lock(&self.shared).publish();
    }

    fn flush_tlb_range(&self, range: TlbRange) {
        if self.unassigned() {
            return;
        }
        let mut s = self.state();
        let me = s.sel;
        s.flush_range::<A>(range, self.tag(), me, self.broadcast);
    }

    fn flush_tlb_all(&self) {
        let mut s = self.state();
        let me = s.sel;
        s.flush_all(me, self.broadcast);
    }

    fn flush_tlb_mm(&self) {
        if self.unassigned() {
            return;
        }
        let mut s = self.state();
        let me = s.sel;
        s.flush_mm(self.tag(), me, self.broadcast);
    }

    unsafe fn install_root(&self, root: PhysAddr) {
        // An unassigned handle installed directly becomes untagged, so its
        // flushes stop being no-ops before any entry of it exists.
        // Relaxed: see `Clone`.
        let _ =
            self.asid
                .compare_exchange(UNASSIGNED, UNTAGGED, Ordering::Relaxed, Ordering::Relaxed);
        let mut s = self.state();
        let me = s.sel;
        match self.half {
            VaRange::Upper if A::SEPARATE_HALVES => {
                s.cpu.upper_root = Some(root);
                if !s.cpu.split {
                    s.cpu.root = None;
                }
                s.cpu.split = true;
                // TTBR1_EL1 holds no ASID (TCR_EL1.A1 = 0): keep it.
                s.barrier();
                // Writing a root register flushes only this CPU.
                if self.asid().is_none() {
                    s.flush_all(me, false);
                }
                return;
            }
            VaRange::Lower if A::SEPARATE_HALVES => {
                if !s.cpu.split {
                    s.cpu.upper_root = None;
                }
                s.cpu.split = true;
                s.cpu.root = Some(root);
            }
            _ => {
                s.cpu.split = false;
                s.cpu.upper_root = None;
                s.cpu.root = Some(root);
            }
        }
        let tag = self.tag();
        s.cpu.asid = tag;
        // A deferred flush not carried out by now is a bug the check sees.
        s.cpu.owed.remove(&tag);
        match self.asid() {
            // Untagged: a new root starts with an empty TLB. Installing
            // also orders earlier table writes (as a TTBR/CR3 write does
            // with its barriers).
            None => s.flush_all(me, false),
            // Tagged: other ASIDs' entries stay; only ordering. The ASID's
            // own entries are usable from now on: a stale one is a bug even
            // if a flush follows at once.
            Some(_) => {
                s.barrier();
                s.check_switch::<A>();
            }
        }
    }

    /// The half set by [`installing_into`](SimMmu::installing_into) on a
    /// format with [`SEPARATE_HALVES`](crate::Format::SEPARATE_HALVES);
    /// `None` (one root) on the others.
    fn installs_into(&self) -> Option<VaRange> {
        A::SEPARATE_HALVES.then_some(self.half)
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        lock(&self.shared).entry_written::<A>(slot, old);
    }
}

/// The [`TableAlloc`] of a [`SimMachine`]: table frames the simulated
/// walker can read.
#[derive(Clone)]
pub struct SimAlloc {
    shared: Arc<Shared>,
}

impl fmt::Debug for SimAlloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SimAlloc")
    }
}

impl SimAlloc {
    /// Table frames allocated and not freed.
    pub fn live(&self) -> usize {
        lock(&self.shared).live.len()
    }

    /// Lets the next `n` table allocations succeed and every later one fail
    /// (`None`: never fail); the same budget as the machine's
    /// [`SimMachine::fail_after`].
    pub fn fail_after(&self, n: Option<u64>) {
        lock(&self.shared).arena.fail_after(n);
    }
}

// SAFETY: frames come from the machine's `Arena` (which upholds the
// contract, leaking frames still allocated when the machine goes) and are
// tracked, not altered, by the machine; `phys_to_virt` is the arena's.
unsafe impl TableAlloc for SimAlloc {
    fn frame_shift(&self) -> u32 {
        lock(&self.shared).arena.frame_shift()
    }

    fn alloc_table(&mut self) -> Option<PhysAddr> {
        lock(&self.shared).alloc_table()
    }

    unsafe fn free_table(&mut self, pa: PhysAddr) {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { lock(&self.shared).free_table(pa) }
    }

    unsafe fn phys_to_virt(&self, pa: PhysAddr) -> NonNull<Table> {
        // SAFETY: forwarded; the caller upholds the contract.
        unsafe { lock(&self.shared).phys_to_virt(pa) }
    }
}

// SAFETY: a frame's lock is created unlocked the first time it is asked
// for and boxed, so it stays at one address, for every CPU, until
// `free_table` drops it with the frame; distinct frames have distinct
// boxes.
unsafe impl crate::contract::TableLocks for SimAlloc {
    unsafe fn table_lock(&self, pa: PhysAddr) -> &crate::contract::TableLock {
        let mut s = lock(&self.shared);
        let l: *const crate::contract::TableLock = &**s.locks.entry(pa.0).or_default();
        // SAFETY: the box lives until the frame is freed, which the caller
        // promises comes after the last use of the reference.
        unsafe { &*l }
    }
}

/// An address space installed on a simulated machine, that
/// [deactivates](AddressSpace::deactivate) it when it goes out of scope, so
/// that dropping it frees its tables (also when a test fails and unwinds).
/// It dereferences to the address space.
///
/// Freeing the tables of a root the simulated machine still has is safe:
/// the simulated walker checks that a table frame is allocated before it
/// reads it, and faults ([`SimFaultKind::FreedTable`]) otherwise.
pub struct Installed<A: Arch, M: Mmu, T: TableAlloc> {
    space: AddressSpace<A, M, T>,
}

impl<A: Arch, M: Mmu, T: TableAlloc> Installed<A, M, T> {
    /// Installs `space` and takes it over.
    ///
    /// # Safety
    ///
    /// `M` is a simulated MMU: a [`SimMmu`], or a wrapper whose
    /// `install_root` does nothing but forward to one, so that no real CPU
    /// ever walks these tables.
    pub unsafe fn new(mut space: AddressSpace<A, M, T>) -> Self {
        // SAFETY: only the simulated walker uses the root (our caller's
        // promise), and it walks whatever it is given.
        unsafe { space.install() };
        Installed { space }
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> Deref for Installed<A, M, T> {
    type Target = AddressSpace<A, M, T>;

    fn deref(&self) -> &Self::Target {
        &self.space
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> DerefMut for Installed<A, M, T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.space
    }
}

impl<A: Arch, M: Mmu, T: TableAlloc> Drop for Installed<A, M, T> {
    fn drop(&mut self) {
        // SAFETY: only the simulated walker uses the tables (promised to
        // `new`), and it never reads a freed frame.
        unsafe { self.space.deactivate() };
    }
}
