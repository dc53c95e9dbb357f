//! The RISC-V Sv39, Sv48 and Sv57 entry formats: [`Format`] and [`Arch`].
//!
//! # Layouts
//!
//! | type | levels | VA bits | PGD | P4D | PUD | PMD | PTE | largest leaf |
//! |---|---|---|---|---|---|---|---|---|
//! | [`Sv39`] | 3 | 39 | level 2 | folded | (in PGD) | level 1 | level 0 | 1 GiB |
//! | [`Sv48`] | 4 | 48 | level 3 | folded | level 2 | level 1 | level 0 | 512 GiB |
//! | [`Sv57`] | 5 | 57 | level 4 | level 3 | level 2 | level 1 | level 0 | 256 TiB |
//!
//! The spec's level `i` is this crate's height `i`. Every level may hold a
//! leaf (a PTE with R, W or X set; "any level of PTE may be a leaf PTE"),
//! so a kernel can map 2 MiB megapages, 1 GiB gigapages, 512 GiB terapages
//! (Sv48, Sv57) and 256 TiB petapages (Sv57). A superpage whose PPN is not
//! aligned to its size is a misaligned superpage, which the walker faults
//! on, so [`Format::decode`] reports it as [`Decoded::Invalid`].
//!
//! Virtual addresses must be canonical: bits 63:39 (Sv39), 63:48 (Sv48) or
//! 63:57 (Sv57) all equal to the highest translated bit, else the access
//! raises a page fault: what
//! [`VaRange::Both`](pgtable_core::VaRange::Both) accepts. One root serves
//! both halves (entries 0–255 the lower, 256–511 the upper half), as on
//! x86.
//!
//! # Extensions
//!
//! The second parameter of [`RiscvPaging`] says which of the optional
//! extensions the harts implement, as a bit set of [`SVPBMT`] and
//! [`SVNAPOT`] (`RiscvPaging<4, { SVPBMT | SVNAPOT }>`). Without an
//! extension its bits are reserved: the walker faults on them, so a format
//! without it never writes them and decodes an entry with them as
//! [`Decoded::Invalid`].
//!
//! A [`Format`] is a type and its methods cannot fail, so the hart's
//! extensions must be known at compile time. A kernel that learns them at
//! boot (from the device tree's `riscv,isa-extensions`) instantiates its
//! code for both variants or picks the base format.
//!
//! # Memory types (Svpbmt)
//!
//! | [`MemType`] | PBMT |
//! |---|---|
//! | `Normal` | 0, PMA (the physical memory attributes decide) |
//! | `NormalNonCacheable` | 1, NC |
//! | `Device` | 2, IO |
//!
//! Without [`SVPBMT`] every leaf has PBMT = 0: a mapping then takes the
//! memory type of the physical memory attributes of its address (on most
//! platforms MMIO regions are I/O by their PMAs already), and
//! [`Format::leaf_prot`] reads `Normal`. The checked constructors refuse a
//! non-`Normal` memory type there with [`EntryError::NoSvpbmt`]; a kernel
//! should check a [`Prot`] with [`RiscvPaging::check_prot`] before it
//! hands it to [`AddressSpace::map`](pgtable_core::AddressSpace::map),
//! which cannot refuse it.
//!
//! # Accessed and dirty state
//!
//! Every new leaf has A set, and kernel writable leaves D as well, like
//! Linux's `_PAGE_BASE` and `PAGE_KERNEL` (so they work on harts that do
//! not update A/D in hardware, Svade, and the kernel's own pages never
//! fault for A/D); writable user leaves start clean, so the first store
//! marks them dirty: the hart sets D itself with Svadu (and QEMU does), or
//! raises a store page fault that the OS answers with
//! [`ptep_set_access_flags`](pgtable_core::AddressSpace::ptep_set_access_flags).
//! [`Format::hw_access`] models the hardware update; [`hw_access_with`]
//! with [`AdUpdates::Software`] the Svade behaviour.
//!
//! # Software entries
//!
//! With V = 0 "all other bits in the PTE are don't-cares and may be used
//! freely by software", at any level, and the hardware never updates such
//! an entry. This crate's software entries ([`Format::swp_entry`], Linux's
//! swap and migration entries) use RSW:
//!
//! | bits | software entry |
//! |---|---|
//! | 0 (V) | 0 |
//! | 7:1 | 0 |
//! | 8 (RSW\[0\]) | 1 (tag) |
//! | 9 | 0 |
//! | 63:10 | the value (54 bits) |
//!
//! # `PROT_NONE` leaves
//!
//! A [`Prot::NONE`] leaf is the kernel read-only leaf of its memory type
//! (R and A set) with V clear and G set
//! ([`bits::PROT_NONE`], Linux `_PAGE_PROT_NONE`): the
//! hart faults on it and caches nothing, software reads its PPN. Software
//! entries keep bits 7:1 clear, G included, as Linux's do, so the two
//! never meet.
//!
//! # Svnapot
//!
//! A 64 KiB NAPOT PTE has N set and PPN\[0\]\[3:0\] = `0b1000`, and all 16
//! entries of its run hold that same PPN: the walker substitutes the low
//! four bits of the virtual page number ("implicit reads of a NAPOT PTE
//! return a copy of pte in which pte.ppn\[i\]\[pte.napot_bits−1:0\] is
//! replaced by vpn\[i\]\[pte.napot_bits−1:0\]"). An entry of a run therefore
//! does not name its own page: [`Format::decode`] (which has no virtual
//! address) reports the run's first page, as Linux's `pte_pfn` does, and
//! [`Format::cont_pa`] (given the entry's index) or
//! [`napot_page`](RiscvPaging::napot_page) (given an address) the page the
//! walker maps.
//!
//! With [`SVNAPOT`] the format declares 64 KiB runs of 16 PTEs to
//! pgtable-core's contiguous-run machinery ([`Format::cont_entries`] is 16
//! at height 0, 0 above: Svnapot defines no other size), as arm64 does with
//! its Contiguous bit: [`AddressSpace::map`](pgtable_core::AddressSpace::map)
//! writes a NAPOT run wherever it covers an aligned 64 KiB with a 64 KiB
//! aligned physical address ([`Format::mk_cont`] turns a page's PTE into
//! the run's), a change to part of a run first unfolds it into 16 plain
//! PTEs ([`Format::clear_cont_at`] gives each its own PPN back), and
//! accessed/dirty state is read and cleared over the whole run (the hart
//! may set A/D in any one of its 16 PTEs).
//! [`MapOptions::no_contiguous`](pgtable_core::MapOptions::no_contiguous)
//! maps with plain PTEs. Without [`SVNAPOT`] (the hart lacks it: N is
//! reserved) nothing is folded and every map writes plain PTEs; the checked
//! constructor [`RiscvPaging::try_napot_64k`] refuses with
//! [`EntryError::NoSvnapot`].
//!
//! A hart's translation cache may hold a copy of any one PTE of a run for
//! all 16 pages (the Svnapot chapter: implicit reads "may create
//! address-translation cache entries mapping a + j·PTESIZE" for every `j`
//! of the region). The 16 PTEs must therefore agree in N and PPN at all
//! times; while one is cached they may differ in permissions or PBMT only
//! as an old and a new value do before the `SFENCE.VMA` (there is no
//! break-before-make rule), which is how a whole-run change goes, entry by
//! entry.

use crate::bits::LEVEL_BITS;
use pgtable_core::contract::{
    generic, Access, AccessFault, Arch, Decoded, Format, Mmu, Slot, PAGE_SHIFT,
};
use pgtable_core::{MemType, PhysAddr, Prot, VirtAddr};

use crate::bits::{
    self, A, D, G, N, NAPOT_64K_MASK, NAPOT_64K_PAGES, NAPOT_64K_PPN, PBMT_IO, PBMT_MASK, PBMT_NC,
    PBMT_RESERVED, PPN_MASK, PROT_NONE, R, RESERVED, RWX, SWP_TAG, SWP_VALUE_SHIFT, U, V, W, X,
};
use crate::entry::EntryError;

/// The Svpbmt extension (page-based memory types) in the extension set of
/// [`RiscvPaging`].
pub const SVPBMT: u32 = 1 << 0;
/// The Svnapot extension (64 KiB NAPOT pages) in the extension set of
/// [`RiscvPaging`].
pub const SVNAPOT: u32 = 1 << 1;

/// The RISC-V paging format with `LEVELS` levels (3: Sv39, 4: Sv48, 5:
/// Sv57) on harts with the extensions `EXT` (a bit set of [`SVPBMT`] and
/// [`SVNAPOT`]; none by default).
///
/// Use the aliases [`Sv39`], [`Sv48`] and [`Sv57`] for harts without the
/// extensions. The type is a marker used only through its traits and
/// associated functions.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct RiscvPaging<const LEVELS: u32, const EXT: u32 = 0>;

/// Sv39: 3 levels, 39-bit virtual addresses, no optional extension.
pub type Sv39 = RiscvPaging<3>;
/// Sv48: 4 levels, 48-bit virtual addresses, no optional extension.
pub type Sv48 = RiscvPaging<4>;
/// Sv57: 5 levels, 57-bit virtual addresses, no optional extension.
pub type Sv57 = RiscvPaging<5>;

/// Who maintains the A and D bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum AdUpdates {
    /// The hart sets A on an access and D on a store, atomically with the
    /// walk (Svadu with menvcfg.ADUE = 1; what QEMU does).
    Hardware,
    /// The hart raises a page fault when A is clear, or D on a store
    /// (Svade): software sets them.
    Software,
}

/// Bytes an entry at `height` maps.
#[inline]
const fn size(height: u32) -> u64 {
    1 << (PAGE_SHIFT + LEVEL_BITS * height)
}

/// The PBMT bits for `mem` on a hart with Svpbmt.
#[inline]
pub const fn pbmt_of(mem: MemType) -> u64 {
    match mem {
        MemType::Normal => bits::PBMT_PMA,
        MemType::NormalNonCacheable => PBMT_NC,
        MemType::Device => PBMT_IO,
    }
}

/// The memory type of the PBMT bits of `raw` (PMA and the reserved value
/// read as `Normal`).
#[inline]
pub const fn mem_of(raw: u64) -> MemType {
    match raw & PBMT_MASK {
        PBMT_NC => MemType::NormalNonCacheable,
        PBMT_IO => MemType::Device,
        _ => MemType::Normal,
    }
}

/// What the hart does on `access` through the leaf `raw` at `height`
/// (privileged spec, "Virtual Address Translation Process", steps 5–7):
///
/// - a U-mode access needs U = 1; an S-mode access to a U = 1 page is
///   allowed for loads and stores (sstatus.SUM = 1 is assumed, as a kernel
///   running the suite sets it) and never for instruction fetches;
/// - a fetch needs X, a store W, a load R (sstatus.MXR = 0; an
///   execute-only leaf refuses a load as [`AccessFault::Privilege`]);
/// - then, with A clear or a store with D clear: [`AdUpdates::Hardware`]
///   sets them (in the same atomic step as the walk), [`AdUpdates::Software`]
///   raises a page fault ([`AccessFault::AccessFlag`]).
///
/// A faulting access changes nothing.
pub fn hw_access_with(
    raw: u64,
    _height: u32,
    access: Access,
    ad: AdUpdates,
) -> Result<u64, AccessFault> {
    if access.user {
        if raw & U == 0 {
            return Err(AccessFault::Privilege);
        }
    } else if access.exec && raw & U != 0 {
        return Err(AccessFault::Privilege);
    }
    if access.exec && raw & X == 0 {
        return Err(AccessFault::Exec);
    }
    if access.write && raw & W == 0 {
        return Err(AccessFault::Write);
    }
    if !access.exec && !access.write && raw & R == 0 {
        // An execute-only leaf (this crate never builds one): the model
        // has no "read" fault kind and reports it as a privilege fault.
        return Err(AccessFault::Privilege);
    }
    let new = raw | A | if access.write { D } else { 0 };
    if new != raw && ad == AdUpdates::Software {
        return Err(AccessFault::AccessFlag);
    }
    Ok(new)
}

impl<const L: u32, const E: u32> RiscvPaging<L, E> {
    /// Compile-time check of the parameters (evaluated through
    /// [`Format::LEVELS`], which every user of the format reads).
    const CHECK: () = assert!(
        (L == 3 || L == 4 || L == 5) && E & !(SVPBMT | SVNAPOT) == 0,
        "RISC-V paging has 3, 4 or 5 levels and the extensions SVPBMT and SVNAPOT"
    );

    /// Whether the harts have Svpbmt.
    pub const HAS_SVPBMT: bool = E & SVPBMT != 0;
    /// Whether the harts have Svnapot.
    pub const HAS_SVNAPOT: bool = E & SVNAPOT != 0;

    /// The `satp.MODE` value of this format: 8 (Sv39), 9 (Sv48), 10 (Sv57).
    pub const SATP_MODE: u64 = 5 + L as u64;

    /// The bits reserved in every PTE of this format: 60:54, plus PBMT
    /// without Svpbmt and N without Svnapot.
    pub const RESERVED_BITS: u64 = RESERVED
        | if Self::HAS_SVPBMT { 0 } else { PBMT_MASK }
        | if Self::HAS_SVNAPOT { 0 } else { N };

    /// Whether the valid entry `raw` at `height` has a reserved bit or
    /// encoding set, so the walker raises a page fault on it: a bit of
    /// [`RESERVED_BITS`](Self::RESERVED_BITS), PBMT = 3, W without R, in
    /// a non-leaf PTE U, A, D, PBMT or N, a non-leaf PTE at height 0, a
    /// misaligned superpage, or N other than in a 64 KiB NAPOT PTE at
    /// height 0.
    pub const fn is_reserved(raw: u64, height: u32) -> bool {
        if raw & Self::RESERVED_BITS != 0 || raw & PBMT_MASK == PBMT_RESERVED {
            return true;
        }
        if raw & (R | W) == W {
            return true;
        }
        if raw & RWX == 0 {
            return height == 0 || raw & (U | A | D | PBMT_MASK | N) != 0;
        }
        let low = (size(height) - 1) >> (12 - bits::PPN_SHIFT) & PPN_MASK;
        if raw & N != 0 {
            return height != 0 || raw & NAPOT_64K_MASK != NAPOT_64K_PPN;
        }
        raw & low != 0
    }

    /// Whether `prot` can be encoded: a memory type other than `Normal`
    /// needs Svpbmt.
    ///
    /// # Errors
    ///
    /// [`EntryError::NoSvpbmt`] when it cannot.
    pub const fn check_prot(prot: Prot) -> Result<(), EntryError> {
        if !Self::HAS_SVPBMT && !matches!(prot.mem(), MemType::Normal) {
            return Err(EntryError::NoSvpbmt(prot.mem()));
        }
        Ok(())
    }

    /// The page the NAPOT (or any) leaf `raw` at `height` maps `va` to,
    /// as the walker computes it, or `None` if `raw` is not a valid leaf.
    pub fn napot_page(raw: u64, height: u32, va: VirtAddr) -> Option<PhysAddr> {
        let Decoded::Leaf(pa) = Self::decode(raw, height) else {
            return None;
        };
        let i = (va.0 >> PAGE_SHIFT) as usize % (1 << LEVEL_BITS);
        Some(Self::cont_pa(raw, pa, height, i))
    }
}

// SAFETY: `decode` returns `Table` only for a valid PTE with R = W = X = 0
// above height 0 without reserved bits; `table_entry` builds exactly that
// (V and the PPN of `pa`, which is below 2^56 and 4 KiB aligned, so it
// fits bits 53:10), and `table_entry_attrs` is the default. Every leaf the
// format builds has R set (`leaf_template`), and no method clears R:
// `modify_prot` rebuilds R, W, X, U, G and PBMT and keeps R set,
// `split_leaf` returns its input, `hw_access` and the `mk*` methods change
// only A and D. Software entries have V clear and G clear, so they decode
// as `Invalid` at every height (a nonzero entry with V clear); a PROT_NONE
// leaf (V clear, G set) decodes as a leaf or invalid, never as a table.
// Every method is pure.
unsafe impl<const L: u32, const E: u32> Format for RiscvPaging<L, E> {
    const NAME: &'static str = match L {
        3 => "riscv-sv39",
        4 => "riscv-sv48",
        _ => "riscv-sv57",
    };
    const LEVELS: u32 = {
        let () = Self::CHECK;
        L
    };
    const PA_BITS: u32 = bits::PA_BITS;
    /// The PPN of address bit 12 is entry bit 10.
    const OA_SHIFT: u32 = 12 - bits::PPN_SHIFT;

    /// Every level: "any level of PTE may be a leaf PTE".
    #[inline]
    fn leaf_allowed(_height: u32) -> bool {
        true
    }

    #[inline]
    fn decode(raw: u64, height: u32) -> Decoded {
        if raw == 0 {
            return Decoded::None;
        }
        if raw & V == 0 {
            // A PROT_NONE leaf: what its valid twin decodes to, if a leaf.
            return match Self::decode(raw | V, height) {
                Decoded::Leaf(pa) if raw & PROT_NONE != 0 => Decoded::Leaf(pa),
                _ => Decoded::Invalid,
            };
        }
        if Self::is_reserved(raw, height) {
            return Decoded::Invalid;
        }
        let pa = bits::pa_of(raw);
        if raw & RWX == 0 {
            Decoded::Table(PhysAddr(pa))
        } else if raw & N != 0 {
            // A 64 KiB NAPOT PTE: the run's first page (see the module
            // docs).
            Decoded::Leaf(PhysAddr(pa & !0xffff))
        } else {
            Decoded::Leaf(PhysAddr(pa))
        }
    }

    /// V and the PPN; R = W = X = 0 and U, A, D clear (reserved in a
    /// non-leaf PTE). A non-leaf PTE has no permission bits, so table
    /// attributes are not encoded (the default
    /// [`table_entry_attrs`](Format::table_entry_attrs)).
    #[inline]
    fn table_entry(pa: PhysAddr, _height: u32) -> u64 {
        bits::ppn_bits(pa.0) | V
    }

    #[inline]
    fn leaf_template(prot: Prot, _height: u32) -> u64 {
        let mut v = V | R | A;
        if prot.writable() {
            v |= W;
            if !prot.user() {
                v |= D;
            }
        }
        if prot.executable() {
            v |= X;
        }
        if prot.user() {
            v |= U;
        }
        if prot.global() {
            v |= G;
        }
        if Self::HAS_SVPBMT {
            v |= pbmt_of(prot.mem());
        }
        // PROT_NONE: the kernel read-only twin built above (`Prot`'s
        // accessors say no to every right, so G is clear), V clear.
        if prot.protnone() {
            v = v & !V | PROT_NONE;
        }
        v
    }

    #[inline]
    fn leaf_prot(raw: u64, _height: u32) -> Prot {
        if raw & V == 0 {
            let mem = if Self::HAS_SVPBMT {
                mem_of(raw)
            } else {
                MemType::Normal
            };
            return Prot::NONE.with_mem(mem);
        }
        let mut p = Prot::empty();
        if raw & W != 0 {
            p |= Prot::WRITE;
        }
        if raw & X != 0 {
            p |= Prot::EXEC;
        }
        if raw & U != 0 {
            p |= Prot::USER;
        }
        if raw & G != 0 {
            p |= Prot::GLOBAL;
        }
        if Self::HAS_SVPBMT {
            p = p.with_mem(mem_of(raw));
        }
        p
    }

    /// V, R, W, X, U, G and (with Svpbmt) PBMT from `prot` (V and G
    /// make the change to or from [`Prot::NONE`]); the PPN, A, D, N and
    /// RSW are kept (making a leaf writable does not dirty it).
    #[inline]
    fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64 {
        let set = V | RWX | U | G | Self::mem_field();
        (raw & !set) | (Self::leaf_template(prot, height) & set)
    }

    /// V clear (a [`Prot::NONE`] leaf; see the module docs).
    #[inline]
    fn is_protnone(raw: u64, _height: u32) -> bool {
        raw & V == 0
    }

    /// Every level has the same leaf layout.
    #[inline]
    fn split_leaf(raw: u64, _height: u32) -> u64 {
        raw
    }

    #[inline]
    fn is_young(raw: u64) -> bool {
        raw & A != 0
    }

    #[inline]
    fn is_dirty(raw: u64) -> bool {
        raw & D != 0
    }

    /// The hart writes a leaf only to set A, or D on a store; with A set
    /// and D set or W clear there is nothing left to set.
    #[inline]
    fn is_settled(raw: u64, _height: u32) -> bool {
        raw & A != 0 && (raw & D != 0 || raw & W == 0)
    }

    /// [`hw_access_with`] with [`AdUpdates::Hardware`].
    #[inline]
    fn hw_access(raw: u64, height: u32, access: Access) -> Result<u64, AccessFault> {
        hw_access_with(raw, height, access, AdUpdates::Hardware)
    }

    /// 54 bits (bits 63:10 of an entry with V = 0; see the module docs).
    const SWP_VALUE_BITS: u32 = 64 - SWP_VALUE_SHIFT;

    #[inline]
    fn swp_entry(value: u64) -> Option<u64> {
        (value >> Self::SWP_VALUE_BITS == 0).then_some(value << SWP_VALUE_SHIFT | SWP_TAG)
    }

    #[inline]
    fn swp_value(raw: u64) -> Option<u64> {
        (raw & ((1 << SWP_VALUE_SHIFT) - 1) == SWP_TAG).then_some(raw >> SWP_VALUE_SHIFT)
    }

    /// 16 PTEs (64 KiB) at height 0 with Svnapot, none otherwise.
    #[inline]
    fn cont_entries(height: u32) -> u32 {
        if Self::HAS_SVNAPOT && height == 0 {
            NAPOT_64K_PAGES
        } else {
            0
        }
    }

    /// Linux riscv `pte_mknapot`: N set and PPN\[0\]\[3:0\] replaced by
    /// `0b1000`, so the PTE of any page of the run becomes the run's PTE.
    #[inline]
    fn mk_cont(raw: u64, _height: u32) -> u64 {
        (raw & !NAPOT_64K_MASK) | NAPOT_64K_PPN | N
    }

    /// N clear and PPN\[0\]\[3:0\] = the page's index in the run (its
    /// VPN\[0\]\[3:0\]), as the walker would substitute it. A PTE
    /// without N is returned as it is.
    #[inline]
    fn clear_cont_at(raw: u64, _height: u32, index: usize) -> u64 {
        if raw & N == 0 {
            return raw;
        }
        let page = (index as u64 % u64::from(NAPOT_64K_PAGES)) << bits::PPN_SHIFT;
        (raw & !(N | NAPOT_64K_MASK)) | page
    }

    /// For a NAPOT PTE, the run's base plus the entry's page in the run;
    /// otherwise `pa`.
    #[inline]
    fn cont_pa(raw: u64, pa: PhysAddr, _height: u32, index: usize) -> PhysAddr {
        if raw & N == 0 {
            return pa;
        }
        PhysAddr(pa.0 | (index as u64 % u64::from(NAPOT_64K_PAGES)) << PAGE_SHIFT)
    }

    /// N set (a software entry's value may set bit 63 too; the algorithms
    /// also check that the entry is a leaf).
    #[inline]
    fn is_cont(raw: u64, _height: u32) -> bool {
        raw & N != 0
    }

    /// Linux riscv `pte_mkold`: A clear.
    #[inline]
    fn mkold(raw: u64, _height: u32) -> u64 {
        raw & !A
    }

    /// Linux riscv `pte_mkyoung`: A set.
    #[inline]
    fn mkyoung(raw: u64, _height: u32) -> u64 {
        raw | A
    }

    /// Linux riscv `pte_mkclean`: D clear, W kept (the next store sets D
    /// again, by hardware or through a fault).
    #[inline]
    fn mkclean(raw: u64, _height: u32) -> u64 {
        raw & !D
    }

    /// Linux riscv `pte_mkdirty`: D set (W is not changed).
    #[inline]
    fn mkdirty(raw: u64, _height: u32) -> u64 {
        raw | D
    }
}

impl<const L: u32, const E: u32> RiscvPaging<L, E> {
    /// The PBMT bits this format writes (all of them with Svpbmt, none
    /// without).
    const fn mem_field() -> u64 {
        if Self::HAS_SVPBMT {
            PBMT_MASK
        } else {
            0
        }
    }
}

// SAFETY: no entry operation is overridden except `pmdp_modify_prot_start`,
// which is the generic deferred one (an atomic swap with 0 that returns the
// old value).
unsafe impl<const L: u32, const E: u32> Arch for RiscvPaging<L, E> {
    const HAVE_MOVE_PMD: bool = true;
    const HAVE_MOVE_PUD: bool = true;
    const TLB_FLUSH_CEILING: u64 = crate::flush::TLB_FLUSH_CEILING;
    /// A store to a PTE is guaranteed visible to the implicit walker only
    /// after an `SFENCE.VMA` ("Supervisor Memory-Management Fence
    /// Instruction"): the walker barrier is one (see `RiscvMmu`).
    const NEEDS_WALKER_BARRIER: bool = true;
    /// The privileged spec has no break-before-make rule: until the
    /// `SFENCE.VMA` after a PTE store, a hart may use the old or the new
    /// PTE, never a mix and never a conflict fault, so a live entry may be
    /// rewritten in place (a superpage split keeps frame and attributes).
    const BREAK_BEFORE_MAKE: bool = false;

    /// The deferred form: an atomic exchange makes the entry invalid and
    /// the operation's one gathered flush removes the old translation. A
    /// hart updates A or D only atomically with checking that the PTE is
    /// still valid and grants the access (privileged spec, the A/D update
    /// of the translation process), so no update is lost once the exchange
    /// returned; until the flush a stale TLB entry lets only accesses with
    /// the old rights through.
    #[inline]
    fn pmdp_modify_prot_start<Mm: Mmu>(mmu: &Mm, va: VirtAddr, slot: &Slot, height: u32) -> u64 {
        generic::pmdp_modify_prot_start_deferred::<Self, Mm>(mmu, va, slot, height)
    }
}
