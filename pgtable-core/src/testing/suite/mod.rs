//! The conformance suite (feature `suite`): one set of behavioural cases
//! that runs unchanged on the simulated MMU (host tests) and inside a kernel
//! on real or emulated hardware.
//!
//! The suite is `no_std` and allocates nothing. It talks to the machine
//! through the small [`Machine`] trait (load and store through the MMU with
//! faults as values, a cycle counter, a line printer, a pool of RAM and a
//! virtual window to map into) and to the page tables through the live,
//! installed [`AddressSpace`] whose translations the machine's accesses use.
//! So every case is judged by the MMU itself, not by a software walk.
//!
//! # What it checks
//!
//! Every size is the format's: a *page* is
//! [`page_size`](crate::contract::level::page_size) (4, 16 or 64 KiB), a
//! *PMD* entry maps [`size(1)`](crate::contract::level::size) bytes (2 MiB,
//! 32 MiB or 512 MiB) and a *PUD* entry `size(2)` (1 GiB, 64 GiB or 4 TiB).
//! The case names carry the sizes: `map_4k_pages`, `map_2m_block` and
//! `move_5m_align_1m_pages` with 4 KiB pages are `map_16k_pages`,
//! `map_32m_block` and `move_80m_align_16m_pages` with 16 KiB pages.
//!
//! - **map / unmap** at every leaf size (pages, PMD and PUD blocks where
//!   the format and the RAM allow), pages straddling table
//!   boundaries, aliases (a store through one virtual address is seen
//!   through another mapping of the same physical page), partial unmaps that
//!   split a block (the rest stays accessible, the hole faults), mapping
//!   over a mapping and malformed input (typed [`Error`], tables
//!   unchanged), and mappings made inside a lazy-MMU scope (usable once the
//!   scope's one deferred barrier ran).
//! - **change_protection**: a store to a page made read-only faults, the
//!   data stays readable, making it writable again accepts stores; blocks
//!   too; holes in the range stay holes; execute-never where
//!   [`Machine::exec_faults`] can tell.
//! - **move_page_tables**, modelled on Linux's
//!   `tools/testing/selftests/mm/mremap_test.c`: sizes 2 pages, 1 PMD, 2
//!   PMDs, 2 PMDs and a half (8 KiB, 2, 4 and 5 MiB with 4 KiB pages), and
//!   with [`Config::big_moves`] 1 and 2 PUDs (1 and 2 GiB), times source
//!   and destination alignment to a page, half a PMD (1 MiB), a PMD, a PUD
//!   and "mutually aligned" (the same offset inside a PMD, moved with
//!   [`MoveOptions::free_below`]), each with pages and with blocks where
//!   possible. Formats with two levels have no PUD: the PUD-aligned and
//!   PUD-sized moves skip. A range that would be mapped with more than
//!   2^19 pages (4 MiB of last-level tables, as the 2 GiB move of 4 KiB
//!   pages needs) skips too: with 16 and 64 KiB pages the PUD-sized moves
//!   of pages, and of blocks moved to another offset inside a PMD (which
//!   become pages). The source is filled with a pseudo-random pattern (a
//!   splitmix64 stream seeded by [`Config::seed`], printed at the start),
//!   the first [`Config::threshold_bytes`] bytes are validated through the
//!   new range, sample words elsewhere must read the same before and after,
//!   and the old range must fault. Overlapping, misaligned and occupied
//!   moves must fail with the right [`Error`] and change nothing; a moved
//!   read-only page stays read-only.
//! - **the last entries of each half**: change_protection, move and unmap
//!   of the last pages below the top of the lower half
//!   (`2^(Format::VA_BITS - 1)`) and of the upper half (`2^64`), where
//!   every table index on the path is the last one, with moves to the
//!   pages below the middle of the half. The addresses follow the format:
//!   with 5-level x86 paging they lie far above 2^47. A root that
//!   `VA_BITS` fills only in part counts as its half's entries: with
//!   16 KiB pages and 48 bits each half is one root entry, so the pages
//!   below its middle share the root entry and differ one level down. Each operation comes
//!   after accesses that cached the old translation, and the access after
//!   it must see the new state (a wrong or truncated flush address leaves
//!   the old one in use).
//!
//! Every case leaves the window empty: after it the suite walks the window
//! (no leaf may remain), counts the tables (no more than before the first
//! case) and asks the machine for its own consistency check
//! ([`Machine::check_consistency`]; the simulator checks for stale TLB
//! entries and for table writes the walker cannot see yet).
//!
//! ## Ranges larger than RAM
//!
//! A move of 1 or 2 PUDs (1 or 2 GiB with 4 KiB pages) needs that much
//! source mapping, which a small machine may not have in RAM. The suite then maps the source onto the
//! RAM pool repeatedly (aliases): the mapping is still a real mapping of
//! the full size, with the same table structure, but only the first
//! `threshold_bytes` (clamped to the usable RAM) map distinct bytes, so only
//! those carry the pattern. Sample words at the middle and the end of the
//! range are read before and after the move and must agree.
//!
//! The physical address of the source is chosen congruent to the virtual
//! address modulo the largest block size the RAM pool allows, so the block
//! variants really get blocks.
//!
//! # Output
//!
//! One line per case, `ok <name>`, `FAIL <name>: <reason>`,
//! `skip <name>: <reason>` or, under Miri, `unsampled <name>` (see
//! [`Summary::unsampled`]), and a final line that is exactly
//! `N passed, N failed`.
//!
//! # For OS authors: running it on your port
//!
//! Implement [`Machine`] for your kernel (or use the simulator's
//! `pgtable_core::sim::SimSuiteMachine` on the host), hand [`run`] your live
//! address space and check [`Summary::failed`]. What your kernel must
//! provide:
//!
//! - loads and stores that return a [`Fault`] instead of crashing (a data
//!   abort / page-fault handler that records the fault and skips the
//!   instruction, or a fault-fixup table);
//! - a RAM pool nothing else uses (a few PMDs suffice; a pool holding an
//!   aligned PUD (1 GiB with 4 KiB pages) enables the PUD block cases, one
//!   holding an aligned PMD the PMD block cases, otherwise they print
//!   `skip`);
//! - a window aligned to a PUD and at least 8 PUDs long (1 GiB and 8 GiB
//!   with 4 KiB pages, 64 GiB and 512 GiB with 16 KiB pages, 4 TiB and
//!   32 TiB with 64 KiB pages; with two levels a PMD and 16 PMDs), unmapped
//!   in the address space you pass, and table frames from your
//!   [`TableAlloc`]: with [`Config::big_moves`] a 2 GiB move of 4 KiB pages
//!   needs about 8 MiB of tables at its peak (source and destination),
//!   without it well under 1 MiB;
//! - the last four pages of each half of the address space and the three
//!   pages below the middle of each half unmapped too (the
//!   `last_entries_of_the_*` cases map them; where your kernel maps them,
//!   those cases print `skip` and touch nothing).
//!
//! Use [`Config::only`] / [`Config::skip`] (name prefixes) to run a subset
//! while bringing a port up, and [`Config::verbose`] for per-move cycle
//! counts. On the host:
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use pgtable_core::sim::{SimMachine, SimSuiteMachine};
//! use pgtable_core::suite::{self, Config};
//! use pgtable_core::test_format::TestFormat;
//! use pgtable_core::AddressSpace;
//!
//! let machine = SimMachine::<TestFormat<4>>::new();
//! let mut space = AddressSpace::<TestFormat<4>, _, _>::new(machine.mmu(), machine.alloc()).unwrap();
//! // SAFETY (simulated): the simulator walks whatever root is installed.
//! unsafe { space.install() };
//! let mut mach = SimSuiteMachine::new(machine.clone());
//! let cfg = Config { only: &["map"], ..Config::DEFAULT };
//! let sum = suite::run(&mut space, &mut mach, &cfg);
//! assert_eq!(sum.failed, 0);
//! assert!(sum.passed > 0);
//! // SAFETY (simulated): the simulated walker checks that a table frame is
//! // still allocated before it reads it, so the tables may be freed.
//! unsafe { space.deactivate() };
//! # }
//! ```
//!
//! [`MoveOptions::free_below`]: crate::MoveOptions::free_below

// A failed case carries its message inline (no allocation), so the error
// side of a case's `Result` is a couple of hundred bytes; failures are rare
// and off the measured paths.
#![allow(clippy::result_large_err)]

use core::fmt::{self, Write};

use crate::contract::level::{page_size, size};
use crate::{AddressSpace, Arch, Error, Mmu, PhysAddr, TableAlloc, VirtAddr};

mod cases;
mod halves;
mod moves;

/// What the suite needs from the machine it runs on.
///
/// All accesses go through the MMU with the translations of the live
/// address space handed to [`run`].
pub trait Machine {
    /// Loads a `u64` through the MMU at `va` (8-byte aligned). `Err` if the
    /// access faults; the machine must recover and return.
    fn read_u64(&mut self, va: VirtAddr) -> Result<u64, Fault>;

    /// Stores a `u64` through the MMU at `va` (8-byte aligned). `Err` if the
    /// access faults (nothing is stored then).
    fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault>;

    /// Whether an instruction fetch at `va` would fault; `None` when the
    /// machine cannot test execution (the suite then skips those checks).
    ///
    /// The suite only asks for pages it mapped over its RAM pool; their
    /// contents are whatever the suite last stored, so an implementation
    /// that really executes must place its own code there first (through
    /// another mapping) or test the fetch permission without executing.
    fn exec_faults(&mut self, va: VirtAddr) -> Option<bool> {
        let _ = va;
        None
    }

    /// A monotonically increasing cycle or tick counter.
    fn cycles(&mut self) -> u64;

    /// The frequency of [`cycles`](Machine::cycles) in Hz, if known.
    fn cycle_hz(&self) -> Option<u64>;

    /// Whether timings are emulated (TCG, the simulator): they are then
    /// labelled so and must not be quoted as hardware figures.
    fn emulated(&self) -> bool;

    /// Prints one line (`args` holds no newline).
    fn print(&mut self, args: fmt::Arguments);

    /// Physical RAM the suite may map and overwrite freely: `(base, len)`.
    /// Nothing else may use it while the suite runs.
    fn ram(&self) -> (PhysAddr, u64);

    /// A virtual window the suite may map into, unmapped when [`run`]
    /// starts: `(base, len)`. It must be aligned to a PUD entry's size and
    /// at least 8 of them long (1 GiB and 8 GiB with 4 KiB pages: the 2 GiB
    /// moves at PUD alignment need two halves of 4 GiB); with two levels,
    /// aligned to a PMD entry's size and at least 16 of them long.
    ///
    /// Outside it the suite maps only the few pages at the end and below
    /// the middle of each half of the address space, and only when they
    /// are unmapped (see "For OS authors" in the [module docs](self)).
    fn window(&self) -> (VirtAddr, u64);

    /// Called after every page-table operation of the suite: the machine's
    /// own check that its translation caches agree with the tables (the
    /// simulator looks for stale TLB entries and for writes the walker
    /// cannot see yet). Real hardware has nothing to check: the default
    /// says all is well.
    fn check_consistency(&mut self) -> Result<(), Inconsistency> {
        Ok(())
    }
}

/// An access that faulted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Fault {
    /// The faulting address.
    pub va: VirtAddr,
    /// Whether the access was a store.
    pub write: bool,
}

/// A disagreement between the machine's translation caches and the tables
/// (see [`Machine::check_consistency`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Inconsistency {
    /// The virtual address concerned.
    pub va: VirtAddr,
    /// What is wrong, e.g. `"stale TLB entry"`.
    pub what: &'static str,
}

/// How the suite runs.
///
/// Build one from [`Config::DEFAULT`] with struct update syntax, so new
/// fields do not break you: `Config { seed: 7, ..Config::DEFAULT }`.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Seed of the pseudo-random fill pattern (printed at the start).
    pub seed: u64,
    /// Bytes at the start of each moved range that are filled and validated
    /// (clamped to the range and to the usable RAM).
    pub threshold_bytes: u64,
    /// Also run the moves of 1 and 2 PUD entries (1 and 2 GiB with 4 KiB
    /// pages).
    pub big_moves: bool,
    /// Print a detail line per step (timings of the moves, mapping sizes).
    pub verbose: bool,
    /// Run only the cases whose name starts with one of these (empty: all).
    pub only: &'static [&'static str],
    /// Skip the cases whose name starts with one of these.
    pub skip: &'static [&'static str],
}

impl Config {
    /// Seed 1, 4 MiB threshold, no big moves, quiet, every case.
    pub const DEFAULT: Config = Config {
        seed: 1,
        threshold_bytes: 4 << 20,
        big_moves: false,
        verbose: false,
        only: &[],
        skip: &[],
    };

    fn selected(&self, name: &str) -> bool {
        (self.only.is_empty() || self.only.iter().any(|p| name.starts_with(p)))
            && !self.skip.iter().any(|p| name.starts_with(p))
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::DEFAULT
    }
}

/// The result of a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Summary {
    /// Cases that passed.
    pub passed: u32,
    /// Cases that failed.
    pub failed: u32,
    /// Cases skipped because the machine or the format cannot run them
    /// (printed with the reason; not counted as passed).
    pub skipped: u32,
    /// Cases left out of a run of every case in a build interpreted by
    /// Miri (`cfg(miri)`), where each simulated access costs hundreds of
    /// times more: such a run keeps every fourth case and one case of the
    /// `move_page_tables` matrix, from offsets that follow the format, the
    /// seed and the machine, so runs with different formats cover
    /// different cases. Printed as `unsampled <name>`. Always 0 in other
    /// builds and in runs restricted by [`Config::only`].
    pub unsampled: u32,
}

/// Runs every selected case on `space` (live and installed: `mach`'s
/// accesses translate through it) and prints one line per case and the
/// final `N passed, N failed` line.
///
/// The window of [`Machine::window`] must be unmapped in `space` when the
/// run starts; it is unmapped again when the run ends (also after a failed
/// case, best effort).
pub fn run<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    space: &mut AddressSpace<A, M, T>,
    mach: &mut H,
    cfg: &Config,
) -> Summary {
    let (win, win_len) = mach.window();
    let (rb, rl) = mach.ram();
    let geo = Geo::of::<A>();
    let ram = Ram::new(rb.0, rl, &geo);
    let tables = space.inspect().count_tables();
    let mut cx = Ctx {
        space,
        mach,
        cfg,
        win: win.0,
        win_len,
        ram,
        geo,
        tables,
        sum: Summary::default(),
        case_no: 0,
        miri_offsets: None,
        group_no: [0; 2],
    };
    cx.miri_offsets = miri_offsets(&cx);
    let hz = cx.mach.cycle_hz();
    let emulated = cx.mach.emulated();
    cx.mach.print(format_args!(
        "pgtable suite: format {} ({} levels, {} pages, {}-bit VA), seed {:#x}, threshold {} KiB, window {:#x}+{:#x}, ram {:#x}+{:#x} (usable {:#x}+{:#x}, granule {:#x}), cycles {} Hz{}",
        A::NAME,
        A::LEVELS,
        Human(geo.page),
        A::VA_BITS,
        cfg.seed,
        cfg.threshold_bytes >> 10,
        win.0,
        win_len,
        rb.0,
        rl,
        ram.base,
        ram.len,
        ram.gran,
        hz.unwrap_or(0),
        if emulated { " (emulated timings)" } else { "" }
    ));
    if !win.is_aligned(geo.unit) || win_len < geo.min_window {
        cx.mach.print(format_args!(
            "FAIL setup: the window must be {} aligned and at least {} long",
            Human(geo.unit),
            Human(geo.min_window)
        ));
        cx.sum.failed += 1;
    } else if ram.len == 0 {
        cx.mach
            .print(format_args!("FAIL setup: the RAM pool holds no whole page"));
        cx.sum.failed += 1;
    } else if cx.window_used() {
        cx.mach.print(format_args!(
            "FAIL setup: the window is not empty at the start"
        ));
        cx.sum.failed += 1;
    } else {
        cases::all(&mut cx);
        moves::all(&mut cx);
        halves::all(&mut cx);
    }
    let s = cx.sum;
    cx.mach
        .print(format_args!("{} passed, {} failed", s.passed, s.failed));
    s
}

// ----- machinery shared by the cases -----

/// The sizes the cases are written in, from the format's geometry: with
/// 4 KiB pages a page is 4 KiB, a PMD entry maps 2 MiB and a PUD entry
/// 1 GiB; with 16 KiB pages 16 KiB, 32 MiB and 64 GiB; with 64 KiB pages
/// 64 KiB, 512 MiB and 4 TiB.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geo {
    /// Bytes of a page (height 0).
    pub(crate) page: u64,
    /// Bytes a PMD entry maps (height 1).
    pub(crate) pmd: u64,
    /// Bytes a PUD entry maps (height 2), also where the format has only
    /// two levels and no PUD (see [`Geo::has_pud`]).
    pub(crate) pud: u64,
    /// The boundary the window is aligned to and laid out in: a PUD entry,
    /// or a PMD entry with two levels (their root entry).
    pub(crate) unit: u64,
    /// The least window length: 8 units and at least 16 PMD entries.
    pub(crate) min_window: u64,
}

impl Geo {
    pub(crate) fn of<A: Arch>() -> Geo {
        let page = page_size::<A>();
        let pmd = size::<A>(1);
        let pud = size::<A>(2);
        let unit = if A::LEVELS >= 3 { pud } else { pmd };
        Geo {
            page,
            pmd,
            pud,
            unit,
            min_window: (8 * unit).max(16 * pmd),
        }
    }

    /// Whether the format has a PUD level (height 2): three levels or more.
    pub(crate) fn has_pud<A: Arch>() -> bool {
        A::LEVELS >= 3
    }
}

/// A size in a case name: `4k`, `2m`, `1g`, `4t` (the largest unit that
/// divides it), or bytes.
#[derive(Clone, Copy)]
pub(crate) struct Short(pub(crate) u64);

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, unit) in [(40, "t"), (30, "g"), (20, "m"), (10, "k")] {
            let u = 1u64 << shift;
            if self.0 >= u && self.0 % u == 0 {
                return write!(f, "{}{unit}", self.0 >> shift);
            }
        }
        write!(f, "{}", self.0)
    }
}

/// A size for people: `4 KiB`, `2 MiB`, `1 GiB`, `4 TiB` (the largest unit
/// that divides it), or bytes.
#[derive(Clone, Copy)]
pub(crate) struct Human(pub(crate) u64);

impl fmt::Display for Human {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
            let u = 1u64 << shift;
            if self.0 >= u && self.0 % u == 0 {
                return write!(f, "{} {unit}", self.0 >> shift);
            }
        }
        write!(f, "{} bytes", self.0)
    }
}

/// A fixed-size text buffer (no allocation); longer text is truncated.
pub(crate) struct Buf<const N: usize> {
    b: [u8; N],
    n: usize,
}

impl<const N: usize> Buf<N> {
    pub(crate) const fn new() -> Self {
        Buf { b: [0; N], n: 0 }
    }

    pub(crate) fn from_args(args: fmt::Arguments) -> Self {
        let mut b = Self::new();
        let _ = b.write_fmt(args);
        b
    }

    pub(crate) fn as_str(&self) -> &str {
        match core::str::from_utf8(&self.b[..self.n]) {
            Ok(s) => s,
            // Truncated inside a character: drop the partial character.
            Err(e) => core::str::from_utf8(&self.b[..e.valid_up_to()]).unwrap_or(""),
        }
    }
}

impl<const N: usize> Write for Buf<N> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let take = s.len().min(N - self.n);
        self.b[self.n..self.n + take].copy_from_slice(&s.as_bytes()[..take]);
        self.n += take;
        Ok(())
    }
}

/// Why a case stopped early.
pub(crate) enum Stop {
    Fail(Buf<200>),
    Skip(Buf<200>),
}

impl Stop {
    pub(crate) fn fail(args: fmt::Arguments) -> Stop {
        Stop::Fail(Buf::from_args(args))
    }
}

pub(crate) type R<T = ()> = Result<T, Stop>;

/// Returns a failure from the enclosing case.
macro_rules! fail {
    ($($t:tt)*) => {
        return Err($crate::suite::Stop::fail(format_args!($($t)*)))
    };
}
pub(crate) use fail;

/// Fails the enclosing case unless `cond`.
macro_rules! ensure {
    ($cond:expr, $($t:tt)*) => {
        if !$cond {
            $crate::suite::fail!($($t)*);
        }
    };
}
pub(crate) use ensure;

/// Skips the enclosing case with a reason.
macro_rules! skip {
    ($($t:tt)*) => {
        return Err($crate::suite::Stop::Skip($crate::suite::Buf::from_args(format_args!($($t)*))))
    };
}
pub(crate) use skip;

/// The RAM pool, trimmed to the largest block granule it can hold.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ram {
    /// First usable byte, aligned to `gran`.
    pub(crate) base: u64,
    /// Usable bytes, a multiple of `gran` (0 if not even a page).
    pub(crate) len: u64,
    /// A PUD entry, a PMD entry or a page of the format (1 GiB, 2 MiB or
    /// 4 KiB with 4 KiB pages).
    pub(crate) gran: u64,
}

impl Ram {
    fn new(base: u64, len: u64, geo: &Geo) -> Ram {
        let end = base.saturating_add(len);
        for gran in [geo.pud, geo.pmd, geo.page] {
            let b = base.saturating_add(gran - 1) & !(gran - 1);
            let e = end & !(gran - 1);
            if e > b {
                return Ram {
                    base: b,
                    len: e - b,
                    gran,
                };
            }
        }
        Ram {
            base,
            len: 0,
            gran: geo.page,
        }
    }

    /// A physical address of the pool congruent to `va` modulo the granule,
    /// `off` bytes (wrapping around the pool) into it.
    pub(crate) fn pa_for(&self, va: u64, off: u64) -> u64 {
        self.base + ((va % self.gran) + off) % self.len
    }
}

/// splitmix64: the fill pattern (small, fast, good enough to catch a page
/// landing in the wrong place).
#[inline]
pub(crate) fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The pattern word `i` of the case seeded `seed`.
#[inline]
pub(crate) fn pattern(seed: u64, i: u64) -> u64 {
    splitmix(seed ^ i.wrapping_mul(0xd6e8_feb8_6659_fd93))
}

/// Translations of a few addresses plus the table count: a cheap picture of
/// the tables for "nothing changed" checks.
#[derive(PartialEq, Eq, Debug)]
pub(crate) struct Snap {
    entries: [Option<(u64, u64)>; 8],
    tables: usize,
}

/// The state of one run.
pub(crate) struct Ctx<'a, A: Arch, M: Mmu, T: TableAlloc, H: Machine> {
    pub(crate) space: &'a mut AddressSpace<A, M, T>,
    pub(crate) mach: &'a mut H,
    pub(crate) cfg: &'a Config,
    pub(crate) win: u64,
    pub(crate) win_len: u64,
    pub(crate) ram: Ram,
    /// The format's page, PMD and PUD sizes.
    pub(crate) geo: Geo,
    /// Tables before the first case (no case may leave more).
    tables: usize,
    sum: Summary,
    case_no: u64,
    /// Under Miri in a run of every case: the offsets of the cases kept,
    /// per group ([`Group`]).
    miri_offsets: Option<[u64; 2]>,
    /// Cases met so far, per group.
    group_no: [u64; 2],
}

/// The groups of cases a Miri run samples separately.
#[derive(Clone, Copy)]
enum Group {
    /// Every case outside the move matrix.
    Other = 0,
    /// The `move_page_tables` matrix, whose cases cost the most.
    Matrix = 1,
}

/// Under Miri a run of every case keeps every `MIRI_STRIDES[g]`-th case of
/// group `g`: every fourth case and one of the 35 of the move matrix
/// (without the big moves).
const MIRI_STRIDES: [u64; 2] = [4, 35];

/// The offsets of the cases a Miri run keeps, `None` when every case runs
/// (not under Miri, or a run restricted by [`Config::only`]).
fn miri_offsets<A: Arch, M: Mmu, T: TableAlloc, H: Machine>(
    cx: &Ctx<'_, A, M, T, H>,
) -> Option<[u64; 2]> {
    if !cfg!(miri) || !cx.cfg.only.is_empty() {
        return None;
    }
    // FNV-1a over what tells the runs apart.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = A::NAME.bytes().chain(A::LEVELS.to_le_bytes());
    let words = [cx.cfg.seed, cx.ram.base, cx.ram.len, cx.win];
    for b in bytes.chain(words.iter().flat_map(|w| w.to_le_bytes())) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Some([(h >> 32) % MIRI_STRIDES[0], h % MIRI_STRIDES[1]])
}

impl<A: Arch, M: Mmu, T: TableAlloc, H: Machine> Ctx<'_, A, M, T, H> {
    /// Runs one case if selected, checks that it left the window empty,
    /// and prints its line.
    pub(crate) fn case(&mut self, name: fmt::Arguments, f: impl FnOnce(&mut Self) -> R) {
        self.case_in(Group::Other, name, f);
    }

    /// [`case`](Self::case) for a case of the move matrix.
    pub(crate) fn matrix_case(&mut self, name: fmt::Arguments, f: impl FnOnce(&mut Self) -> R) {
        self.case_in(Group::Matrix, name, f);
    }

    fn case_in(&mut self, g: Group, name: fmt::Arguments, f: impl FnOnce(&mut Self) -> R) {
        let name: Buf<64> = Buf::from_args(name);
        let name = name.as_str();
        self.case_no += 1;
        let i = self.group_no[g as usize];
        self.group_no[g as usize] += 1;
        if !self.cfg.selected(name) {
            return;
        }
        if let Some(off) = self.miri_offsets {
            let g = g as usize;
            if (i + off[g]) % MIRI_STRIDES[g] != 0 {
                self.sum.unsampled += 1;
                self.mach.print(format_args!("unsampled {name}"));
                return;
            }
        }
        let r = f(self).and_then(|()| self.leak_check());
        match r {
            Ok(()) => {
                self.sum.passed += 1;
                self.mach.print(format_args!("ok {name}"));
            }
            Err(Stop::Skip(why)) => {
                self.sum.skipped += 1;
                self.mach
                    .print(format_args!("skip {name}: {}", why.as_str()));
                self.cleanup();
            }
            Err(Stop::Fail(why)) => {
                self.sum.failed += 1;
                self.mach
                    .print(format_args!("FAIL {name}: {}", why.as_str()));
                self.cleanup();
            }
        }
    }

    /// The per-case seed of the fill pattern.
    pub(crate) fn seed(&self) -> u64 {
        splitmix(self.cfg.seed ^ self.case_no.wrapping_mul(0x1000_0000_01b3))
    }

    /// After a failed case: unmap the window so later cases start clean.
    fn cleanup(&mut self) {
        let _ = self.space.unmap(VirtAddr(self.win), self.win_len);
        if self.cfg.verbose && self.window_used() {
            self.mach
                .print(format_args!("  note: the window could not be emptied"));
        }
    }

    pub(crate) fn window_used(&self) -> bool {
        let mut used = false;
        let _ = self
            .space
            .walk(VirtAddr(self.win), self.win_len, |_| used = true);
        used
    }

    fn leak_check(&mut self) -> R {
        let mut first = None;
        self.space
            .walk(VirtAddr(self.win), self.win_len, |m| {
                first.get_or_insert(m.va.0);
            })
            .map_err(|e| Stop::fail(format_args!("walk of the window: {e}")))?;
        if let Some(va) = first {
            fail!("the case left a mapping at {va:#x}");
        }
        let n = self.space.inspect().count_tables();
        ensure!(
            n <= self.tables,
            "{} table(s) leaked ({} now, {} before)",
            n - self.tables,
            n,
            self.tables
        );
        self.tables = n;
        self.consistent("the case")
    }

    /// The machine's consistency check, after `what`.
    pub(crate) fn consistent(&mut self, what: &str) -> R {
        if let Err(i) = self.mach.check_consistency() {
            fail!("after {what}: {} at {}", i.what, i.va);
        }
        Ok(())
    }

    pub(crate) fn note(&mut self, args: fmt::Arguments) {
        if self.cfg.verbose {
            self.mach.print(format_args!("  {args}"));
        }
    }

    // ----- page-table operations that fail the case on error -----

    pub(crate) fn map(
        &mut self,
        va: u64,
        pa: u64,
        len: u64,
        prot: crate::Prot,
        opts: crate::MapOptions,
    ) -> R {
        if let Err(e) = self.space.map(VirtAddr(va), PhysAddr(pa), len, prot, opts) {
            fail!("map {va:#x}+{len:#x} -> {pa:#x}: {e}");
        }
        self.consistent("map")
    }

    pub(crate) fn unmap(&mut self, va: u64, len: u64) -> R {
        if let Err(e) = self.space.unmap(VirtAddr(va), len) {
            fail!("unmap {va:#x}+{len:#x}: {e}");
        }
        self.consistent("unmap")
    }

    pub(crate) fn protect(&mut self, va: u64, len: u64, prot: crate::Prot) -> R {
        if let Err(e) = self.space.change_protection(VirtAddr(va), len, prot) {
            fail!("change_protection {va:#x}+{len:#x} to {prot:?}: {e}");
        }
        self.consistent("change_protection")
    }

    /// The leaf height mapping `va`, failing if unmapped.
    pub(crate) fn height(&self, va: u64) -> R<u32> {
        match self.space.translate(VirtAddr(va)) {
            Some(t) => Ok(t.height),
            None => fail!("{va:#x} does not translate"),
        }
    }

    pub(crate) fn pa(&self, va: u64) -> Option<u64> {
        self.space.translate(VirtAddr(va)).map(|t| t.pa.0)
    }

    // ----- accesses through the machine -----

    pub(crate) fn read(&mut self, va: u64) -> R<u64> {
        match self.mach.read_u64(VirtAddr(va)) {
            Ok(v) => Ok(v),
            Err(_) => fail!("load from {va:#x} faulted"),
        }
    }

    pub(crate) fn write(&mut self, va: u64, v: u64) -> R {
        match self.mach.write_u64(VirtAddr(va), v) {
            Ok(()) => Ok(()),
            Err(_) => fail!("store to {va:#x} faulted"),
        }
    }

    pub(crate) fn expect(&mut self, va: u64, want: u64) -> R {
        let got = self.read(va)?;
        ensure!(
            got == want,
            "load from {va:#x} read {got:#x}, expected {want:#x}"
        );
        Ok(())
    }

    pub(crate) fn read_faults(&mut self, va: u64) -> R {
        match self.mach.read_u64(VirtAddr(va)) {
            Ok(v) => fail!("load from {va:#x} should fault but read {v:#x}"),
            Err(_) => Ok(()),
        }
    }

    pub(crate) fn write_faults(&mut self, va: u64) -> R {
        match self.mach.write_u64(VirtAddr(va), 0x5a5a_5a5a_5a5a_5a5a) {
            Ok(()) => fail!("store to {va:#x} should fault but succeeded"),
            Err(_) => Ok(()),
        }
    }

    /// A picture of the tables at up to 8 addresses.
    pub(crate) fn snap(&self, vas: &[u64]) -> Snap {
        let mut entries = [None; 8];
        for (e, &va) in entries.iter_mut().zip(vas) {
            *e = self
                .space
                .translate(VirtAddr(va))
                .map(|t| (t.pa.0, t.entry));
        }
        Snap {
            entries,
            tables: self.space.inspect().count_tables(),
        }
    }

    /// Fails unless `r` is exactly the error `want` and the tables are as
    /// in `before`.
    pub(crate) fn expect_error(
        &mut self,
        what: &str,
        r: Result<(), Error>,
        want: Error,
        vas: &[u64],
        before: &Snap,
    ) -> R {
        match r {
            Ok(()) => fail!("{what} succeeded, expected {want:?}"),
            Err(e) if e != want => fail!("{what} failed with {e:?}, expected {want:?}"),
            Err(_) => {}
        }
        ensure!(
            self.snap(vas) == *before,
            "{what} failed but changed the tables"
        );
        self.consistent(what)
    }
}
