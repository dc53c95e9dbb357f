//! ASID / PCID allocation with generation roll-over (Linux arm64
//! `arch/arm64/mm/context.c`).
//!
//! An ASID (arm64, Arm ARM D8.x "Address space identifiers") or PCID (x86,
//! Intel SDM Vol. 3A §4.10.1 "Process-Context Identifiers") tags the TLB
//! entries of one address space, so that switching address spaces does not
//! have to flush the TLB. The hardware has few of them (arm64: 256 or
//! 65 536; x86: 4096), a kernel has more address spaces, so they are
//! recycled:
//!
//! - every address space carries an [`AsidContext`]: the ASID it was last
//!   given and the *generation* it was given in (Linux `mm->context.id`,
//!   generation in the bits above the ASID);
//! - [`AsidAllocator::switch_to`] (Linux `check_and_switch_context`) runs on
//!   every switch: a context of the current generation keeps its ASID;
//!   an older one gets a new ASID (preferably the same number, if it is
//!   still free in the new generation);
//! - when every ASID of a generation is taken, the allocator *rolls over*:
//!   it starts a new generation with an empty map, keeps (re-reserves) the
//!   ASID each CPU is running now, since those CPUs keep using them, and
//!   marks every CPU as owing a full local TLB flush, which it reports
//!   ([`Switch::flush_local`]) on that CPU's next switch, before any ASID of
//!   the new generation runs there.
//!
//! So an ASID of one generation names at most one address space, and a
//! CPU flushes its TLB once per roll-over, not once per switch.
//!
//! ASID 0 is never handed out: it is the ASID of the kernel's own tables
//! and of untagged MMU handles.
//!
//! # Locking
//!
//! The allocator is one value shared by all CPUs, with a `&mut self` API:
//! the caller serialises calls with its own lock (Linux `cpu_asid_lock`;
//! a spinlock taken with interrupts off). The lock need not be held while
//! the root is installed: a roll-over by another CPU after
//! [`switch_to`](AsidAllocator::switch_to) returned re-reserves the ASID
//! this CPU was given, and sets this CPU's pending flush for its next
//! switch.
//!
//! # What the caller does on a switch
//!
//! With an MMU handle that implements
//! [`TaggedMmu`], all of it:
//! [`AsidAllocator::switch_mm`] (and [`exit_mm`] when a space exits). By
//! hand, with the allocator alone:
//!
//! ```
//! use pgtable_core::asid::{AsidAllocator, AsidContext};
//!
//! // 4-bit ASIDs (15 usable), one CPU.
//! let mut asids = AsidAllocator::<1, 1>::new(4).unwrap();
//! let mut spaces = [AsidContext::NEW; 40];
//! let mut flushes = 0;
//! for round in 0..3 {
//!     for ctx in &mut spaces {
//!         let sw = asids.switch_to(0, ctx).unwrap();
//!         if sw.flush_local {
//!             flushes += 1; // arm64 `tlbi vmalle1`; x86 INVPCID type 3
//!         }
//!         // Install the space's root with ASID `sw.asid`, without a flush.
//!         assert!(sw.asid != 0);
//!     }
//! }
//! assert_eq!(asids.rollovers(), flushes);
//! assert!(flushes >= 7 && flushes < 120);
//! ```

use core::fmt;

use crate::contract::{Arch, TableAlloc, TaggedMmu};
use crate::AddressSpace;

/// An address space's ASID and the generation it belongs to (Linux
/// `mm->context.id`): `generation | asid`, the generation counted in units
/// of `1 << bits`. [`AsidContext::NEW`] (0) has no ASID yet.
///
/// Keep one per address space, start it at [`AsidContext::NEW`] and hand it
/// to [`AsidAllocator::switch_to`] on every switch to that space, always to
/// the same allocator.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub struct AsidContext(u64);

impl AsidContext {
    /// A context that has no ASID yet.
    pub const NEW: AsidContext = AsidContext(0);

    /// The raw context id: generation and ASID.
    pub const fn id(self) -> u64 {
        self.0
    }
}

/// What [`AsidAllocator::switch_to`] decided.
#[must_use = "the ASID must be installed, and a pending local flush issued"]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Switch {
    /// The ASID to install with the address space's root (never 0).
    pub asid: u16,
    /// This CPU must invalidate every non-global entry of its own TLB (all
    /// ASIDs; arm64 `tlbi vmalle1`, x86 INVPCID type 3 or a CR4.PGE toggle)
    /// before it installs the root: a roll-over happened since its last
    /// switch, so its TLB may hold entries of the previous generation under
    /// ASIDs that now name other address spaces.
    pub flush_local: bool,
    /// The address space was given an ASID different from the one it had
    /// (or its first): a TLB flush of its old ASID is not needed (the
    /// roll-over flushes cover it), but MMU handles that hold the old ASID
    /// must be told the new one.
    pub changed: bool,
}

/// A bad allocator configuration or argument.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum AsidError {
    /// The ASID width is 0, above 16, or larger than the bitmap of the
    /// allocator's type (`1 << bits` must be at most `64 * WORDS`).
    Bits(u32),
    /// Fewer usable ASIDs (`(1 << bits) - 1`, ASID 0 being reserved) than
    /// CPUs plus one: a roll-over re-reserves one ASID per CPU and must
    /// have one left to hand out (Linux warns on the same condition).
    TooFewAsids {
        /// The ASID width.
        bits: u32,
        /// The number of CPUs.
        cpus: usize,
    },
    /// The CPU number is not below the allocator's CPU count.
    Cpu(usize),
    /// The MMU handle cannot take this ASID ([`TaggedMmu::set_tag`]): it
    /// is wider than the hardware's ASIDs or PCIDs (an allocator wider
    /// than the CPU), or the handle cannot be tagged at all.
    Tag(u16),
}

impl fmt::Display for AsidError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AsidError::Bits(b) => write!(f, "unsupported ASID width: {b} bits"),
            AsidError::TooFewAsids { bits, cpus } => {
                write!(f, "{bits}-bit ASIDs are too few for {cpus} CPUs")
            }
            AsidError::Cpu(c) => write!(f, "CPU {c} is out of range"),
            AsidError::Tag(t) => write!(f, "the MMU handle cannot take ASID {t}"),
        }
    }
}

impl core::error::Error for AsidError {}

/// The exit of an address space switched by
/// [`AsidAllocator::switch_mm`] (Linux `exit_mmap`'s `flush_tlb_mm`, then
/// `deactivate_mm`): invalidates its tag's entries on every CPU
/// ([`Mmu::flush_tlb_mm`](crate::contract::Mmu::flush_tlb_mm)), then
/// marks it no longer installed
/// ([`AddressSpace::deactivate`]), so that dropping it frees its tables.
///
/// The order matters: a CPU that ran the space keeps its translations under
/// the tag after switching away (that is the point of tags), and they point
/// into its tables and pages; only once they are gone may the tables be
/// freed. The space's ASID itself is not released: it stays taken until
/// the next roll-over (as in Linux), whose local flushes drop whatever is
/// left. A space that never ran (unassigned handle) flushes nothing.
///
/// # Safety
///
/// No CPU runs the space any more: every CPU that installed it has since
/// installed another root.
pub unsafe fn exit_mm<A: Arch, M: TaggedMmu, T: TableAlloc>(space: &mut AddressSpace<A, M, T>) {
    space.mmu().flush_tlb_mm();
    // SAFETY: no CPU runs the space (our caller's promise) and the flush
    // above removed every TLB entry made from its tables under its tag.
    unsafe { space.deactivate() };
}

/// A global ASID allocator for `CPUS` CPUs with a bitmap of `WORDS` 64-bit
/// words (at most `64 * WORDS` ASIDs): Linux arm64's algorithm (see the
/// [module docs](self)). No allocation; `&mut self` (the caller locks).
///
/// Useful sizes: [`Asid8Allocator`] (256 ASIDs), [`Pcid12Allocator`]
/// (4096 PCIDs), [`Asid16Allocator`] (65 536 ASIDs, 8 KiB of bitmap; also
/// serves 8-bit CPUs, with the width chosen at run time).
#[derive(Clone, Debug)]
pub struct AsidAllocator<const WORDS: usize, const CPUS: usize> {
    bits: u32,
    /// The current generation: a multiple of `1 << bits`, never 0.
    generation: u64,
    /// ASIDs taken in the current generation (bit 0 always set).
    map: [u64; WORDS],
    /// Where the search for a free ASID continues (Linux `cur_idx`).
    next: usize,
    /// The context each CPU runs, 0 after a roll-over until it switches.
    active: [u64; CPUS],
    /// The context each CPU ran at the last roll-over (kept while it runs
    /// nothing else).
    reserved: [u64; CPUS],
    /// CPUs owing a local flush since the last roll-over.
    flush_pending: [bool; CPUS],
    rollovers: u64,
}

/// An allocator of 8-bit ASIDs (arm64 with `ID_AA64MMFR0_EL1.ASIDBits` =
/// 0b0000, or `TCR_EL1.AS` = 0).
pub type Asid8Allocator<const CPUS: usize> = AsidAllocator<4, CPUS>;
/// An allocator of x86 PCIDs (12 bits).
pub type Pcid12Allocator<const CPUS: usize> = AsidAllocator<64, CPUS>;
/// An allocator of up to 16-bit ASIDs (arm64 with ASIDBits = 0b0010 and
/// `TCR_EL1.AS` = 1); construct it with the width the CPU has.
pub type Asid16Allocator<const CPUS: usize> = AsidAllocator<1024, CPUS>;

impl<const WORDS: usize, const CPUS: usize> AsidAllocator<WORDS, CPUS> {
    /// An allocator of `bits`-bit ASIDs (1..=16, `1 << bits` at most
    /// `64 * WORDS`), for `CPUS` CPUs numbered from 0.
    pub const fn new(bits: u32) -> Result<Self, AsidError> {
        if bits == 0 || bits > 16 || (1usize << bits) > 64 * WORDS {
            return Err(AsidError::Bits(bits));
        }
        if (1usize << bits) - 1 <= CPUS {
            return Err(AsidError::TooFewAsids { bits, cpus: CPUS });
        }
        let mut map = [0u64; WORDS];
        map[0] = 1; // ASID 0 is never handed out.
        Ok(AsidAllocator {
            bits,
            generation: 1 << bits,
            map,
            next: 1,
            active: [0; CPUS],
            reserved: [0; CPUS],
            flush_pending: [false; CPUS],
            rollovers: 0,
        })
    }

    /// The ASID width.
    pub const fn bits(&self) -> u32 {
        self.bits
    }

    /// The current generation (a multiple of `1 << bits`).
    pub const fn generation(&self) -> u64 {
        self.generation
    }

    /// How many roll-overs happened.
    pub const fn rollovers(&self) -> u64 {
        self.rollovers
    }

    /// The ASID of `ctx` (0 for [`AsidContext::NEW`]); it is current only
    /// if [`is_current`](Self::is_current).
    pub const fn asid_of(&self, ctx: AsidContext) -> u16 {
        (ctx.0 & self.mask()) as u16
    }

    /// Whether `ctx` holds an ASID of the current generation (a switch to
    /// it keeps its ASID and needs no allocation).
    pub const fn is_current(&self, ctx: AsidContext) -> bool {
        ctx.0 != 0 && (ctx.0 ^ self.generation) >> self.bits == 0
    }

    /// The context `cpu` runs (what its last switch returned), if any
    /// since the last roll-over.
    pub fn active(&self, cpu: usize) -> Option<AsidContext> {
        match self.active.get(cpu) {
            Some(&id) if id != 0 => Some(AsidContext(id)),
            _ => None,
        }
    }

    const fn mask(&self) -> u64 {
        (1 << self.bits) - 1
    }

    /// Switches `cpu` to the address space whose context is `ctx` (Linux
    /// `check_and_switch_context`): gives it an ASID of the current
    /// generation if it has none, rolling over when every ASID is taken,
    /// and records it as the CPU's active ASID. The caller then installs
    /// the root with [`Switch::asid`], after a local flush if
    /// [`Switch::flush_local`] says so, and without one otherwise.
    pub fn switch_to(&mut self, cpu: usize, ctx: &mut AsidContext) -> Result<Switch, AsidError> {
        if cpu >= CPUS {
            return Err(AsidError::Cpu(cpu));
        }
        let old = ctx.0;
        if !self.is_current(*ctx) {
            ctx.0 = self.new_context(old);
        }
        let flush_local = core::mem::take(&mut self.flush_pending[cpu]);
        self.active[cpu] = ctx.0;
        Ok(Switch {
            asid: self.asid_of(*ctx),
            flush_local,
            changed: old & self.mask() != ctx.0 & self.mask(),
        })
    }

    /// Switches `cpu`, the executing CPU, to `space` (Linux `switch_mm`:
    /// arm64 `check_and_switch_context` + `cpu_switch_mm`, x86
    /// `switch_mm_irqs_off`), `ctx` being the space's context:
    ///
    /// 1. [`switch_to`](Self::switch_to) picks the space's ASID;
    /// 2. if a roll-over happened since this CPU's last switch, the local
    ///    flush of every ASID ([`TaggedMmu::local_flush_all`]) runs now,
    ///    *before* the new tag is loaded: from the moment the root register
    ///    holds the new ASID (arm64 TTBR0_EL1 write + `isb`; x86 MOV to CR3
    ///    with the no-flush bit) the CPU may use, even speculatively, any
    ///    entry of that ASID left from the previous generation, which
    ///    belonged to another space. It also runs before anything can fail,
    ///    so an error never loses it;
    /// 3. the space's MMU handle takes the ASID ([`TaggedMmu::set_tag`]) if
    ///    it does not hold it already (its first switch, or its first since
    ///    a roll-over gave it another number);
    /// 4. the root is installed with the tag and without a flush
    ///    ([`AddressSpace::install`]).
    ///
    /// A space that is switched to only through here has an unassigned
    /// handle until its first switch (see [`TaggedMmu`]). When it exits:
    /// switch every CPU that ran it to another space, then
    /// [`exit_mm`].
    ///
    /// # Errors
    ///
    /// [`AsidError::Cpu`] (nothing changed) or [`AsidError::Tag`] (the
    /// allocator is wider than the MMU: the flush of step 2 has been done,
    /// the space is not installed).
    ///
    /// # Safety
    ///
    /// As for [`AddressSpace::install`]: the tables map what the CPU uses
    /// next. And: `cpu` is the executing CPU's number; `ctx` is this
    /// space's own context, only ever handed to this allocator; every
    /// space tagged on this CPU since its TLB last held another
    /// allocator's ASIDs was switched through this allocator.
    pub unsafe fn switch_mm<A: Arch, M: TaggedMmu, T: TableAlloc>(
        &mut self,
        cpu: usize,
        ctx: &mut AsidContext,
        space: &mut AddressSpace<A, M, T>,
    ) -> Result<Switch, AsidError> {
        let sw = self.switch_to(cpu, ctx)?;
        if sw.flush_local {
            space.mmu().local_flush_all();
        }
        if space.mmu().tag() != Some(sw.asid) {
            space.mmu().set_tag(sw.asid)?;
        }
        // SAFETY: the tables map what the CPU needs (our caller's
        // promise); the allocator gave `sw.asid` to this space alone in
        // its generation, and entries of earlier generations were flushed
        // from this CPU above (or at an earlier switch, when the roll-over
        // came before it), so the TLB holds no other space's translations
        // under the tag.
        unsafe { space.install() };
        Ok(sw)
    }

    /// A context of the current generation for a space whose context was
    /// `old` (Linux `new_context`).
    fn new_context(&mut self, old: u64) -> u64 {
        let gen = self.generation;
        if old != 0 {
            let asid = old & self.mask();
            let renewed = gen | asid;
            // Running on some CPU at the last roll-over: its ASID was
            // re-reserved for it.
            let mut hit = false;
            for r in &mut self.reserved {
                if *r == old {
                    *r = renewed;
                    hit = true;
                }
            }
            if hit {
                return renewed;
            }
            // Its old number is still free in this generation: keep it.
            if !self.test_and_set(asid as usize) {
                return renewed;
            }
        }
        let asid = match self.find_free(self.next) {
            Some(a) => a,
            None => {
                self.rollover();
                // After a roll-over at most ASID 0 and one ASID per CPU are
                // taken, and `new` checked that more ASIDs exist: the
                // search cannot fail (0 would be a wrong answer, not a
                // crash, were it to).
                self.find_free(1).unwrap_or(0)
            }
        };
        self.test_and_set(asid);
        self.next = asid;
        self.generation | asid as u64
    }

    /// Starts a new generation (Linux `flush_context`).
    fn rollover(&mut self) {
        self.rollovers += 1;
        self.generation = self.generation.wrapping_add(1 << self.bits);
        if self.generation == 0 {
            // After 2^(64 - bits) roll-overs: 0 means "no context".
            self.generation = 1 << self.bits;
        }
        self.map = [0; WORDS];
        self.map[0] = 1;
        for cpu in 0..CPUS {
            // A CPU that ran nothing new since the previous roll-over still
            // runs its reserved context.
            let mut id = core::mem::take(&mut self.active[cpu]);
            if id == 0 {
                id = self.reserved[cpu];
            }
            self.test_and_set((id & self.mask()) as usize);
            self.reserved[cpu] = id;
        }
        self.flush_pending = [true; CPUS];
        self.next = 1;
    }

    /// Sets bit `asid`; returns whether it was set already.
    fn test_and_set(&mut self, asid: usize) -> bool {
        let (w, b) = (asid / 64, asid % 64);
        let was = self.map[w] & (1 << b) != 0;
        self.map[w] |= 1 << b;
        was
    }

    /// The first free ASID at or after `from`.
    fn find_free(&self, from: usize) -> Option<usize> {
        let n = 1usize << self.bits;
        let mut i = from;
        while i < n {
            let (w, b) = (i / 64, i % 64);
            let free = !self.map[w] >> b;
            if free != 0 {
                let a = i + free.trailing_zeros() as usize;
                return (a < n).then_some(a);
            }
            i = (w + 1) * 64;
        }
        None
    }
}
