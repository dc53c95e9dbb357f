//! The pure half of an architecture: how entries are encoded.
//!
//! A [`Format`] has no side effects and executes no instructions, so it is
//! fully testable on the host. The algorithms of this crate and the simulated
//! MMU use nothing but these methods to read and build entries, which is what
//! lets a host test exercise the exact bits the hardware walker will see.
//! The per-entry loops build one leaf template per table and OR the address
//! in, which is why [`Format`] requires leaves to be linear in the address.

use core::fmt;

use crate::addr::PhysAddr;
use crate::TableAttrs;

/// What an entry is, as the hardware walker would see it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Decoded {
    /// The empty entry (`0`).
    None,
    /// Points at a next-level table.
    Table(PhysAddr),
    /// Maps a page (height 0) or a block (height > 0) at this address.
    ///
    /// A [`Prot::NONE`] leaf decodes as a leaf too (Linux `pte_present`
    /// is true for it), although the hardware walker treats it as invalid
    /// ([`Format::is_protnone`]).
    Leaf(PhysAddr),
    /// Not zero, but not valid for the walker (a software-only encoding).
    Invalid,
}

/// Memory type of a mapping.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Hash)]
pub enum MemType {
    /// Normal memory, write-back cacheable.
    #[default]
    Normal,
    /// Normal memory, non-cacheable (arm64 Normal-NC, x86 UC- via PCD).
    NormalNonCacheable,
    /// Device memory (arm64 Device-nGnRE, x86 UC).
    Device,
}

bitflags::bitflags! {
    /// An architecture-neutral protection: what accesses a mapping allows,
    /// and its memory type.
    ///
    /// Every mapping is readable by the kernel; the flags add rights on top,
    /// so the empty set ([`Prot::READ_ONLY`]) is kernel read-only,
    /// non-executable, write-back memory, and user read-only is
    /// [`Prot::USER`] alone. The one exception is [`Prot::NONE`], which
    /// takes every right away (Linux `PROT_NONE`; it is *not* the empty
    /// set):
    ///
    /// ```
    /// use pgtable_core::{MemType, Prot};
    ///
    /// let user_data = Prot::WRITE | Prot::USER;
    /// assert!(user_data.writable() && user_data.user() && !user_data.executable());
    /// let mmio = Prot::READ_WRITE.with_mem(MemType::Device);
    /// assert_eq!(mmio.mem(), MemType::Device);
    /// assert!(mmio.contains(Prot::WRITE));
    /// // PROT_NONE takes every right away, and is not the empty set.
    /// let closed = Prot::NONE | Prot::WRITE | Prot::USER;
    /// assert!(closed.protnone() && !closed.writable() && !closed.user());
    /// assert_eq!(closed.normalized(), Prot::NONE);
    /// assert_ne!(Prot::NONE, Prot::READ_ONLY);
    /// ```
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Prot: u8 {
        /// Writes allowed.
        const WRITE = 1 << 0;
        /// Instruction fetches allowed (at the privilege that can access it).
        const EXEC = 1 << 1;
        /// Accessible from user mode (arm64 EL0, x86 CPL 3).
        const USER = 1 << 2;
        /// Global: not tagged with an address-space identifier.
        const GLOBAL = 1 << 3;
        /// Memory type bit: normal memory, non-cacheable
        /// ([`MemType::NormalNonCacheable`]). Prefer [`Prot::with_mem`].
        const NON_CACHEABLE = 1 << 4;
        /// Memory type bit: device memory ([`MemType::Device`]); wins over
        /// [`Prot::NON_CACHEABLE`]. Prefer [`Prot::with_mem`].
        const DEVICE = 1 << 5;
        /// Present but inaccessible (Linux `PROT_NONE`, as `mprotect` and
        /// NUMA hinting use it): the entry keeps its frame and the
        /// operations treat it as a mapping (walks and
        /// [`ptep_get`](crate::AddressSpace::ptep_get) report it,
        /// `change_protection` turns it back into an accessible one), but
        /// the hardware sees an invalid entry, so every access faults and
        /// no TLB caches it. It wins over every right: a `NONE` mapping
        /// reports only `NONE` and its memory type ([`Prot::WRITE`],
        /// [`Prot::EXEC`], [`Prot::USER`] and [`Prot::GLOBAL`] are dropped:
        /// x86 `_PAGE_PROTNONE` and RISC-V `_PAGE_PROT_NONE` reuse the
        /// global bit). Encodings: arm64 valid clear with Linux's
        /// `PTE_PROT_NONE` bit 58, x86 P clear with bit 8, RISC-V V clear
        /// with G (see each format's docs).
        const NONE = 1 << 6;
    }
}

impl Prot {
    /// Kernel read-only, not executable.
    pub const READ_ONLY: Prot = Prot::empty();
    /// Kernel read-write, not executable.
    pub const READ_WRITE: Prot = Prot::WRITE;
    /// Kernel read-only, executable.
    pub const READ_EXEC: Prot = Prot::EXEC;

    const MEM_BITS: u8 = Prot::NON_CACHEABLE.bits() | Prot::DEVICE.bits();

    /// What a mapping with this protection reports: itself, or for a
    /// [`Prot::NONE`] one only `NONE` and the memory type (what
    /// [`Format::leaf_prot`] of a `NONE` leaf must return).
    pub const fn normalized(self) -> Prot {
        if self.protnone() {
            Prot::from_bits_retain(Prot::NONE.bits() | (self.bits() & Prot::MEM_BITS))
        } else {
            self
        }
    }

    /// The accessible protection a format encodes a [`Prot::NONE`]
    /// mapping from before it makes the entry invalid for the hardware:
    /// kernel read-only, not global, with the memory type. Other
    /// protections are returned unchanged.
    pub const fn without_none(self) -> Prot {
        if self.protnone() {
            Prot::from_bits_retain(self.bits() & Prot::MEM_BITS)
        } else {
            self
        }
    }

    /// Whether it is [`Prot::NONE`] (Linux `pte_protnone`): no access at
    /// all, whatever else is set.
    pub const fn protnone(self) -> bool {
        self.contains(Prot::NONE)
    }

    /// The same protection with another memory type.
    pub const fn with_mem(self, mem: MemType) -> Prot {
        let mem_bits = match mem {
            MemType::Normal => 0,
            MemType::NormalNonCacheable => Prot::NON_CACHEABLE.bits(),
            MemType::Device => Prot::DEVICE.bits(),
        };
        Prot::from_bits_retain((self.bits() & !Prot::MEM_BITS) | mem_bits)
    }

    /// The memory type.
    pub const fn mem(self) -> MemType {
        if self.contains(Prot::DEVICE) {
            MemType::Device
        } else if self.contains(Prot::NON_CACHEABLE) {
            MemType::NormalNonCacheable
        } else {
            MemType::Normal
        }
    }

    /// Whether writes are allowed (never with [`Prot::NONE`]).
    pub const fn writable(self) -> bool {
        self.contains(Prot::WRITE) && !self.protnone()
    }

    /// Whether instruction fetches are allowed (never with [`Prot::NONE`]).
    pub const fn executable(self) -> bool {
        self.contains(Prot::EXEC) && !self.protnone()
    }

    /// Whether user mode may access it (never with [`Prot::NONE`]).
    pub const fn user(self) -> bool {
        self.contains(Prot::USER) && !self.protnone()
    }

    /// Whether it is global (never with [`Prot::NONE`]).
    pub const fn global(self) -> bool {
        self.contains(Prot::GLOBAL) && !self.protnone()
    }
}

impl fmt::Debug for Prot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.protnone() {
            return write!(f, "Prot(none {:?})", self.mem());
        }
        write!(
            f,
            "Prot(r{}{}{}{} {:?})",
            if self.writable() { "w" } else { "-" },
            if self.executable() { "x" } else { "-" },
            if self.user() { " user" } else { "" },
            if self.global() { " global" } else { "" },
            self.mem()
        )
    }
}

/// One memory access, as the simulated hardware performs it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Access {
    /// A store (sets the dirty state) rather than a load.
    pub write: bool,
    /// An instruction fetch.
    pub exec: bool,
    /// Performed at user privilege.
    pub user: bool,
}

impl Access {
    /// A kernel data load.
    pub const READ: Access = Access {
        write: false,
        exec: false,
        user: false,
    };
    /// A kernel data store.
    pub const WRITE: Access = Access {
        write: true,
        exec: false,
        user: false,
    };
    /// A kernel instruction fetch.
    pub const EXEC: Access = Access {
        write: false,
        exec: true,
        user: false,
    };
}

/// Why the hardware refused an access to a present leaf.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AccessFault {
    /// A store to a read-only mapping.
    Write,
    /// An instruction fetch from an execute-never mapping.
    Exec,
    /// A user access to a kernel-only mapping.
    Privilege,
    /// The access flag is clear and the hardware does not set it (arm64 without FEAT_HAFDBS).
    AccessFlag,
}

/// The descriptor encoding of one architecture (pure data, no side effects).
///
/// # Rules for implementations
///
/// - The *none* entry is `0`, and any value whose low 12 bits are clear is
///   not valid (the algorithms link free tables through their first word).
/// - A leaf is linear in its output address: `leaf(pa, p, h) ==
///   leaf_template(p, h) | oa_field(pa)` for every `pa` aligned to the
///   leaf size ([`oa_field`](Format::oa_field) is `pa.0 >> OA_SHIFT`
///   unless the format overrides it; [`OA_SHIFT`](Format::OA_SHIFT) is 0
///   unless the format stores page numbers lower than the address bits,
///   as RISC-V does). Within one leaf's size the field is additive:
///   `oa_field(pa + o) == oa_field(pa) + (o >> OA_SHIFT)` for `pa`
///   aligned to the leaf size and `o` below it (the algorithms advance a
///   split block's first child by adding offsets).
/// - If a leaf is allowed at height `h > 1` it is allowed at `h - 1` too.
/// - A leaf built from a [`Prot::NONE`] protection decodes as a
///   [`Decoded::Leaf`] with its address, [`is_protnone`](Format::is_protnone)
///   says so, [`leaf_prot`](Format::leaf_prot) reports
///   [`Prot::normalized`] of what it was built from, and
///   [`swp_value`](Format::swp_value) is `None` for it (Linux keeps
///   `PROT_NONE` entries and swap entries apart by the same marker bit).
/// - Software entries ([`swp_entry`](Format::swp_entry)) round-trip:
///   `swp_value(swp_entry(v)?) == Some(v)`; `swp_entry(v)` is `Some`
///   exactly for `v < 1 << SWP_VALUE_BITS` (never, when `SWP_VALUE_BITS` is
///   0) and never `0`; `swp_value` is `None` for every value `swp_entry`
///   does not return (`0`, tables, leaves).
/// - [`leaf_prot`](Format::leaf_prot), [`is_settled`](Format::is_settled)
///   and the bits [`modify_prot`](Format::modify_prot) changes
///   (`modify_prot(raw) ^ raw`) depend only on the leaf's attribute word
///   (`raw` without its output address), so the loops decide them once per
///   distinct attribute word.
///
/// # Safety
///
/// The algorithms follow every entry that [`decode`](Format::decode) calls
/// a table, dereference the frame it names and hand that frame back to the
/// allocator in the end; a wrong answer makes them read, write and free
/// memory that is not a table. So for every height `h` below `LEVELS` an
/// implementation must guarantee:
///
/// - `decode(table_entry(pa, h), h) == Decoded::Table(pa)` and
///   `decode(table_entry_attrs(pa, h, a), h) == Decoded::Table(pa)` for
///   `h > 0`, every [`TableAttrs`] `a` and every page-aligned `pa` below
///   `1 << PA_BITS` (the algorithms link only such frames);
/// - `decode(raw, h)` returns `Decoded::Table` for no other value that the
///   algorithms or the hardware put into an entry: never at height 0, never
///   for `0`, and never for a leaf the format builds ([`leaf`](Format::leaf),
///   [`leaf_template`](Format::leaf_template)` | pa`,
///   [`modify_prot`](Format::modify_prot) of a leaf,
///   [`mk_cont`](Format::mk_cont), [`clear_cont`](Format::clear_cont) or
///   [`clear_cont_at`](Format::clear_cont_at) of a leaf,
///   [`split_leaf`](Format::split_leaf) of a leaf with its address
///   advanced) or that the hardware makes of one
///   ([`hw_access`](Format::hw_access), which must describe every change
///   the hardware makes to an entry), nor for a leaf changed by
///   [`mkold`](Format::mkold), [`mkyoung`](Format::mkyoung),
///   [`mkclean`](Format::mkclean) or [`mkdirty`](Format::mkdirty);
/// - every value [`swp_entry`](Format::swp_entry) returns decodes as
///   [`Decoded::Invalid`] at every height: never as a table (the
///   algorithms copy software entries into tables of any height, e.g. a
///   fork copies them into another address space) and never as a leaf (the
///   hardware would map whatever physical memory its bits name);
/// - the methods are pure: the same arguments always give the same result.
///
/// The rules above this section keep the algorithms correct; these keep
/// them memory-safe.
pub unsafe trait Format: Sized + 'static {
    /// Short human name, e.g. `"arm64-4K-48bit"`.
    const NAME: &'static str;
    /// Number of translation levels (2 to 5).
    const LEVELS: u32;
    /// Output-address bits the format can encode.
    const PA_BITS: u32;

    /// How far right of its address bits an entry holds an output address:
    /// the entry field is `pa >> OA_SHIFT` (0, the default, for arm64 and
    /// x86, whose address fields sit at the address bits; 2 for RISC-V,
    /// whose PPN starts at bit 10 for address bit 12). The algorithms OR
    /// and add addresses into entries through it, so it must keep a leaf
    /// linear in its address (see the rules above).
    const OA_SHIFT: u32 = 0;

    /// log2 of the page size, which is also the size of a table frame:
    /// 12 (4 KiB, the default and the only size of x86-64 and RISC-V), 14
    /// (16 KiB) or 16 (64 KiB), arm64's granules. Every level below the top
    /// translates `PAGE_SHIFT - 3` bits; see [`level`](crate::contract::level).
    const PAGE_SHIFT: u32 = 12;

    /// Bits of virtual address one half translates (per TTBR on arm64):
    /// by default as many as full tables translate, `PAGE_SHIFT +
    /// (PAGE_SHIFT - 3) * LEVELS`. Fewer leave the root partly used (Linux
    /// `PTRS_PER_PGD`: arm64 16 KiB pages with 48 bits have a root of 2
    /// entries).
    const VA_BITS: u32 = Self::PAGE_SHIFT + (Self::PAGE_SHIFT - 3) * Self::LEVELS;

    /// Whether a leaf (block or page) may sit at `height`. Height 0 always can.
    fn leaf_allowed(height: u32) -> bool;

    /// Decodes `raw` as an entry of a table at `height`.
    fn decode(raw: u64, height: u32) -> Decoded;

    /// An entry at `height` pointing at the next-level table at `pa`.
    fn table_entry(pa: PhysAddr, height: u32) -> u64;

    /// A leaf at `height` with protection `prot` and output address 0.
    fn leaf_template(prot: Prot, height: u32) -> u64;

    /// A leaf at `height` mapping `pa` with `prot`.
    #[inline]
    fn leaf(pa: PhysAddr, prot: Prot, height: u32) -> u64 {
        Self::leaf_template(prot, height) | Self::oa_field(pa)
    }

    /// The bits of a leaf that hold the output address `pa` (page or
    /// block aligned): `pa.0 >> OA_SHIFT`, the default, for formats whose
    /// address field is the address itself or a shifted copy of it. A
    /// format that stores the top of a wide address elsewhere overrides it
    /// (arm64 with 52-bit addresses: OA\[51:50\] in descriptor bits
    /// \[9:8\] with FEAT_LPA2, OA\[51:48\] in bits \[15:12\] with 64 KiB
    /// pages and FEAT_LPA; Linux `__phys_to_pte_val`). The algorithms
    /// build leaves as `leaf_template | oa_field(pa)` and take a leaf's
    /// attribute word as `raw ^ oa_field(pa)` of its decoded address.
    #[inline]
    fn oa_field(pa: PhysAddr) -> u64 {
        pa.0 >> Self::OA_SHIFT
    }

    /// The protection a leaf at `height` grants.
    fn leaf_prot(raw: u64, height: u32) -> Prot;

    /// Linux `pte_modify`: `raw` (a leaf at `height`) with its protection
    /// replaced by `prot`, keeping the output address and the
    /// accessed/dirty state.
    fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64;

    /// The leaf at `height - 1` that maps the first part of the block `raw`
    /// at `height`, with the same attributes and accessed/dirty state. The
    /// other children are this value with the address advanced.
    fn split_leaf(raw: u64, height: u32) -> u64;

    /// Whether the accessed (young) state is set.
    fn is_young(raw: u64) -> bool;

    /// Whether the dirty state is set (hardware or software dirty).
    fn is_dirty(raw: u64) -> bool;

    /// Whether the hardware will never write this leaf again: accessed is
    /// set and it is dirty or cannot become dirty. Settled entries may be
    /// copied with a plain load and store. The default says "never", which
    /// is always safe.
    #[inline]
    fn is_settled(_raw: u64, _height: u32) -> bool {
        false
    }

    /// What the hardware does when it performs `access` through the leaf
    /// `raw` at `height`: the entry after its accessed/dirty update (equal to
    /// `raw` if nothing changes), or the fault it raises. Used by the
    /// simulated MMU, so it must follow the architecture manual.
    fn hw_access(raw: u64, height: u32, access: Access) -> Result<u64, AccessFault>;

    /// Whether the leaf `raw` at `height` (one [`decode`](Format::decode)
    /// calls a [`Decoded::Leaf`]) is invalid for the hardware walker: a
    /// [`Prot::NONE`] leaf (Linux `pte_protnone`), which keeps its output
    /// address for software but raises a translation fault on every access
    /// and is never cached in a TLB. The simulated walker asks this, not
    /// [`leaf_prot`](Format::leaf_prot), so it must say what the hardware
    /// does with the entry's bits (arm64 and RISC-V: the valid bit, x86:
    /// P). [`hw_access`](Format::hw_access) is only asked about leaves for
    /// which it is `false`. The default, `false`, is right for a format
    /// that cannot encode [`Prot::NONE`]; such a format must never build a
    /// leaf from a `Prot` with `NONE` that the hardware would use.
    #[inline]
    fn is_protnone(_raw: u64, _height: u32) -> bool {
        false
    }

    /// Bits of OS data a *software entry* carries: a non-present leaf the
    /// hardware walker ignores but the OS reads back, like Linux's swap and
    /// migration entries (`swp_entry_t`, `__swp_entry`). `0` (the default):
    /// the format has no software entries and
    /// [`swp_entry`](Format::swp_entry) always says `None`.
    const SWP_VALUE_BITS: u32 = 0;

    /// The software entry carrying `value` (Linux
    /// `swp_entry_to_pte(__swp_entry(type, offset))`, with type and offset
    /// packed into one value by the caller), or `None` when `value` does not
    /// fit in [`SWP_VALUE_BITS`](Format::SWP_VALUE_BITS). It is never `0` and
    /// decodes as [`Decoded::Invalid`] at every height: the walker faults on
    /// it (a translation fault), and the algorithms treat it as an occupied
    /// entry (a move carries it, `change_protection` leaves it, `unmap`
    /// clears it).
    #[inline]
    fn swp_entry(_value: u64) -> Option<u64> {
        None
    }

    /// The value of the software entry `raw` (Linux `is_swap_pte` and
    /// `pte_to_swp_entry`), or `None` when `raw` is not one (`0`, a table,
    /// a leaf, any other invalid value).
    #[inline]
    fn swp_value(_raw: u64) -> Option<u64> {
        None
    }

    /// Whether the lower and upper halves are translated through separate
    /// roots that each translate `VA_BITS` bits (arm64 TTBR0_EL1 and
    /// TTBR1_EL1 with T0SZ = T1SZ = `64 - VA_BITS`, as Linux configures
    /// them), rather than through the two halves of one root (x86 CR3).
    /// It decides what [`VaRange::Lower`] and [`VaRange::Upper`] hold (see
    /// [`VaRange::bounds`]). The default is `false`.
    ///
    /// [`VaRange::Lower`]: crate::VaRange::Lower
    /// [`VaRange::Upper`]: crate::VaRange::Upper
    /// [`VaRange::bounds`]: crate::VaRange::bounds
    const SEPARATE_HALVES: bool = false;

    /// An entry at `height` pointing at the next-level table at `pa` that
    /// applies `attrs` to everything below it, as far as the format can
    /// encode them (see [`TableAttrs`]). The default ignores `attrs` and
    /// returns [`table_entry`](Format::table_entry).
    ///
    /// Safety rule: [`decode`](Format::decode) must return
    /// `Decoded::Table(pa)` for the result, whatever `attrs` are (see the
    /// trait's `# Safety`).
    #[inline]
    fn table_entry_attrs(pa: PhysAddr, height: u32, attrs: TableAttrs) -> u64 {
        let _ = attrs;
        Self::table_entry(pa, height)
    }

    /// The restrictions the table entry `raw` at `height` applies to every
    /// later level of a walk (the simulated walker combines them over the
    /// walk: Arm ARM D8.4.2, Intel SDM 4.6.1). The default is none, for
    /// formats whose table entries carry no attributes.
    #[inline]
    fn table_limits(raw: u64, height: u32) -> TableAttrs {
        let _ = (raw, height);
        TableAttrs::NONE
    }

    /// How many adjacent entries at `height` one contiguous-hint run holds
    /// (Arm ARM D8.6.1 "Contiguous bit": with the 4 KiB granule, 16 pages
    /// = 64 KiB, or 16 level-2 blocks = 32 MiB), or `0` when the format has
    /// no such hint at that height (the default, and x86). A run is aligned
    /// to its size in both the input and the output address; its entries
    /// must map contiguous output addresses with the same attributes.
    ///
    /// The algorithms keep runs *folded* (every entry of the run with the
    /// hint) only where this rule holds: [`map`] sets the hint on the runs a
    /// call covers whole, and every change to part of a run first
    /// *unfolds* it with break-before-make (Linux `arch/arm64/mm/contpte.c`:
    /// `contpte_set_ptes`, `contpte_try_unfold`).
    ///
    /// [`map`]: crate::AddressSpace::map
    #[inline]
    fn cont_entries(_height: u32) -> u32 {
        0
    }

    /// The entry of a folded run for the leaf `raw` at `height` (Linux
    /// `pte_mkcont`): `raw` maps its own page of the run, with its address;
    /// the result is what the algorithms store for that page. Only called
    /// where [`cont_entries`](Format::cont_entries) is not 0; it must leave
    /// a leaf a leaf (never a table, see `# Safety`). The default returns
    /// `raw`.
    ///
    /// On arm64 it sets the Contiguous bit and keeps the address. A format
    /// whose run entries all hold the run's base instead (RISC-V Svnapot:
    /// N set, PPN\[0\]\[3:0\] = `0b1000`) replaces the address by that
    /// encoding, and then overrides [`cont_pa`](Format::cont_pa) and
    /// [`clear_cont_at`](Format::clear_cont_at) to undo it.
    #[inline]
    fn mk_cont(raw: u64, _height: u32) -> u64 {
        raw
    }

    /// The leaf `raw` at `height` with the contiguous hint clear (Linux
    /// `pte_mknoncont`), for formats whose run entries each keep their own
    /// output address (arm64). The algorithms call it only through
    /// [`clear_cont_at`](Format::clear_cont_at).
    #[inline]
    fn clear_cont(raw: u64, _height: u32) -> u64 {
        raw
    }

    /// The plain leaf for entry `index` (of its table) of the folded run
    /// holding `raw` at `height`: the hint cleared and, for a format whose
    /// run entries do not name their own page, that page's address
    /// restored. The default is [`clear_cont`](Format::clear_cont), which
    /// is right where every entry keeps its own address (arm64). Like
    /// `clear_cont`, it must leave a leaf a leaf.
    #[inline]
    fn clear_cont_at(raw: u64, height: u32, index: usize) -> u64 {
        let _ = index;
        Self::clear_cont(raw, height)
    }

    /// The output address of the page the leaf `raw` maps when it sits at
    /// entry `index` of a table at `height`, where
    /// [`decode`](Format::decode) gave `pa`. The default is `pa`: each
    /// entry names its own page (arm64, x86). A RISC-V NAPOT PTE names the
    /// run's base, and the walker puts VPN\[0\]\[3:0\] in its place,
    /// so Svnapot formats add the index within the run.
    #[inline]
    fn cont_pa(raw: u64, pa: PhysAddr, height: u32, index: usize) -> PhysAddr {
        let _ = (raw, height, index);
        pa
    }

    /// Whether the leaf `raw` at `height` has the contiguous hint (Linux
    /// `pte_cont`). Always `false` where the format has none.
    #[inline]
    fn is_cont(_raw: u64, _height: u32) -> bool {
        false
    }

    /// Linux `pte_mkold`: the leaf `raw` at `height` with its accessed
    /// (young) state clear, everything else kept. Harvesting
    /// ([`AddressSpace::clear_refs`]) stores it with a compare-exchange.
    ///
    /// The default returns `raw` unchanged, which is right only for a
    /// format without an accessed state; every format whose
    /// [`is_young`](Format::is_young) can be true must override it.
    ///
    /// [`AddressSpace::clear_refs`]: crate::AddressSpace::clear_refs
    #[inline]
    fn mkold(raw: u64, _height: u32) -> u64 {
        raw
    }

    /// Linux `pte_mkyoung`: the leaf with its accessed state set (what a
    /// fault handler does where the hardware does not set it). Default:
    /// `raw` (see [`mkold`](Format::mkold)).
    #[inline]
    fn mkyoung(raw: u64, _height: u32) -> u64 {
        raw
    }

    /// Linux `pte_mkclean`: the leaf with its dirty state clear. Where the
    /// hardware manages the dirty state the leaf stays writable, so the
    /// next store marks it dirty again without a fault (arm64: AP\[2\]
    /// set with DBM kept, the software dirty bit cleared; x86: D clear).
    /// Default: `raw` (see [`mkold`](Format::mkold)).
    #[inline]
    fn mkclean(raw: u64, _height: u32) -> u64 {
        raw
    }

    /// Linux `pte_mkdirty`: the leaf with its dirty state set (arm64: the
    /// software dirty bit, and AP\[2\] cleared if DBM says it is
    /// writable). It never makes a read-only leaf writable. Default: `raw`
    /// (see [`mkold`](Format::mkold)).
    #[inline]
    fn mkdirty(raw: u64, _height: u32) -> u64 {
        raw
    }
}
