//! The x86-64 entry format: [`Format`] and [`Arch`] for 4-level and 5-level
//! paging.
//!
//! # Layouts
//!
//! | type | levels | VA bits | PGD | P4D | PUD | PMD | PTE |
//! |---|---|---|---|---|---|---|---|
//! | [`X86_64`] | 4 | 48 | PML4 | folded | PDPT | PD | PT |
//! | [`X86_64La57`] | 5 | 57 | PML5 | PML4 | PDPT | PD | PT |
//!
//! Both are [`X86Paging`] with another `LEVELS`, so one build can test both.
//! The second parameter is MAXPHYADDR (default 52, the architectural
//! maximum, §4.1.4): bits 51:MAXPHYADDR of every entry are reserved, and a
//! physical range reaching `1 << MAXPHYADDR` is rejected by the algorithms
//! with [`pgtable_core::Error::PhysOutOfRange`]. A kernel that knows its
//! CPU's MAXPHYADDR (`CPUID.80000008H:EAX[7:0]`) can name it in the type,
//! e.g. `X86Paging<4, 46>`.
//!
//! Virtual addresses must be canonical: bits 63:47 (4-level) or 63:56
//! (5-level) all equal (SDM Vol. 1 §3.3.7.1, Vol. 3A §4.5). That is what
//! [`VaRange::Both`](pgtable_core::VaRange::Both) accepts with `VA_BITS` =
//! 48 / 57.
//!
//! # What the processor is assumed to run with
//!
//! CR0.PG = CR0.WP = 1, CR4.PAE = 1, IA32_EFER.LME = IA32_EFER.NXE = 1,
//! CR4.LA57 matching the type, CR4.PGE = 1 for [`Prot::GLOBAL`] to mean
//! anything, 1-GByte pages supported (`CPUID.80000001H:EDX[26]`; on a CPU
//! without them map with `MapOptions::PMD_BLOCKS`), and the PAT MSR at its
//! power-up value (below). SMEP, SMAP, protection keys and CET are not
//! modelled by [`Format::hw_access`]: a supervisor access to a user page is
//! allowed, as it is with CR4.SMEP = CR4.SMAP = 0.
//!
//! # Memory types
//!
//! A leaf selects one of the eight PAT entries with its PAT, PCD and PWT
//! bits (index `PAT:PCD:PWT`, §4.9.2). With the PAT MSR at its power-up
//! value (SDM Vol. 3A, PAT section, table "Memory Type Setting of PAT
//! Entries Following a Power-up or Reset": PA0..PA7 = WB, WT, UC-, UC, WB,
//! WT, UC-, UC) this crate encodes:
//!
//! | [`MemType`] | PAT index | bits set | memory type |
//! |---|---|---|---|
//! | `Normal` | 0 | none | WB |
//! | `NormalNonCacheable` | 2 | PCD | UC- |
//! | `Device` | 3 | PCD, PWT | UC |
//!
//! The PAT bit is never set by this crate, so the encoding does not depend
//! on whether the PAT bit of a level is bit 7 (PTE) or bit 12 (PDE/PDPTE).
//! When decoding, indices 4..8 read like 0..4 and WT (1, 5) reads as
//! `Normal` (it is cacheable). [`Format::modify_prot`] keeps an entry's
//! PAT/PCD/PWT bits when the requested memory type is the one they already
//! decode to, so a protection change never rewrites a foreign memory type.
//!
//! # Accessed and dirty state
//!
//! New *kernel* leaves (no [`Prot::USER`]) are created with A set, and D set
//! too when writable, like Linux's `__PAGE_KERNEL`: the processor then never
//! writes them (no locked A/D update on first use, and they are settled, so
//! moves and protection changes may copy them with plain stores). New *user*
//! leaves are created with A and D clear, so an OS can use the hardware's
//! accessed/dirty tracking (reclaim, write-back) from the first access. Table
//! entries are created `P | RW | US | A`: fully permissive (access rights
//! are the AND / OR of every level, §4.6, so the leaf alone decides) and
//! already accessed, so the processor never writes a table entry either.
//!
//! # Software entries
//!
//! With P = 0 the processor ignores every other bit of an entry at any
//! level (SDM Vol. 3A §4.5, the "not present" rows of Tables 4-14..4-20)
//! and never sets A or D in it. This crate's software entries
//! ([`Format::swp_entry`], Linux's swap and migration entries) are:
//!
//! | bits | software entry |
//! |---|---|
//! | 0 (P) | 0 |
//! | 1 | 1 (tag) |
//! | 11:2 | 0 (bit 8 stays clear: Linux marks `PROT_NONE` entries with it) |
//! | 57:12 | the value, inverted (46 bits) |
//! | 63:58 | 0 |
//!
//! # `PROT_NONE` leaves
//!
//! A [`Prot::NONE`] leaf is the kernel read-only leaf of its memory type
//! (PS and the PAT bits where a leaf at that height has them) with P
//! clear and bit 8 ([`bits::PROTNONE`], Linux
//! `_PAGE_PROTNONE`, the G position) set: not present to the processor,
//! a leaf with its frame to software. Software entries keep bit 8 clear,
//! as Linux's do, so the two never meet.
//!
//! The value is stored inverted for the reason Linux gives in
//! "x86/speculation/l1tf: Protect swap entries against L1TF": on CPUs
//! affected by L1 Terminal Fault a not-present entry's address bits can be
//! used speculatively, and inverted small values point at the top of the
//! physical address space, where no cacheable memory is.

use crate::bits::LEVEL_BITS;
use bit_field::BitField;
use pgtable_core::contract::{
    generic, Access, AccessFault, Arch, Decoded, Format, Mmu, Slot, TableAttrs, PAGE_SHIFT,
    PAGE_SIZE,
};
use pgtable_core::{MemType, PhysAddr, Prot, VirtAddr};

use crate::bits::{
    self, A, ADDR_MASK, D, G, P, PAT_4K, PAT_HUGE, PROTNONE, PS, RW, SWP_TAG, SWP_VALUE_SHIFT, US,
    XD,
};
use crate::error::{EntryError, ReservedBits};

/// The x86-64 paging format with `LEVELS` levels (4, or 5 with LA57) and a
/// MAXPHYADDR of `MAXPHYADDR` bits (32..=52).
///
/// Use the aliases [`X86_64`] and [`X86_64La57`]. The type is a marker: it
/// has no fields and is only used through its traits and associated
/// functions.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct X86Paging<const LEVELS: u32, const MAXPHYADDR: u32 = 52>;

/// 4-level paging (PML4 = PGD, PDPT = PUD, PD = PMD, PT = PTE, P4D folded):
/// 48-bit canonical virtual addresses (SDM Vol. 3A §4.5), MAXPHYADDR 52
/// (`X86Paging<4, M>` for another).
pub type X86_64 = X86Paging<4>;

/// 5-level paging, CR4.LA57 = 1 (PML5 = PGD, PML4 = P4D): 57-bit canonical
/// virtual addresses (SDM Vol. 3A §4.5), MAXPHYADDR 52 (`X86Paging<5, M>`
/// for another).
pub type X86_64La57 = X86Paging<5>;

/// Bytes an entry at `height` maps.
#[inline]
const fn size(height: u32) -> u64 {
    1 << (PAGE_SHIFT + LEVEL_BITS * height)
}

/// The PAT index this crate uses for `mem` (see the module docs).
#[inline]
pub const fn pat_index_of(mem: MemType) -> u8 {
    match mem {
        MemType::Normal => 0,
        MemType::NormalNonCacheable => 2,
        MemType::Device => 3,
    }
}

/// The memory type PAT entry `index` has with the power-up PAT MSR
/// (WB, WT, UC-, UC, WB, WT, UC-, UC), as a [`MemType`] (WT reads as
/// `Normal`).
#[inline]
pub const fn mem_type_of_pat_index(index: u8) -> MemType {
    match index & 3 {
        0 | 1 => MemType::Normal,
        2 => MemType::NormalNonCacheable,
        _ => MemType::Device,
    }
}

/// R/W, U/S, XD and G for `prot` (leaf flags besides P, PS, A, D and the
/// memory type).
#[inline]
const fn access_bits(prot: Prot) -> u64 {
    (if prot.writable() { RW } else { 0 })
        | (if prot.user() { US } else { 0 })
        | (if prot.executable() { 0 } else { XD })
        | (if prot.global() { G } else { 0 })
}

impl<const L: u32, const M: u32> X86Paging<L, M> {
    /// Compile-time check of the parameters (evaluated through
    /// [`Format::LEVELS`], which every user of the format reads).
    const CHECK: () = assert!(
        (L == 4 || L == 5) && M >= 32 && M <= bits::MAX_PHYS_BITS,
        "x86 paging has 4 or 5 levels and a MAXPHYADDR of 32..=52"
    );

    /// Bits 51:MAXPHYADDR, reserved in every entry (Tables 4-14..4-20).
    pub const RESERVED_HIGH: u64 = bits::reserved_high(M);

    /// The reserved bits that are set in the present entry `raw` at
    /// `height` (0 if none; not-present entries have none, §4.5.4: all
    /// their other bits are ignored).
    ///
    /// - every level: bits 51:MAXPHYADDR (Tables 4-14..4-20);
    /// - PML5E and PML4E (height ≥ 3): bit 7, PS (Tables 4-14, 4-15);
    /// - PDPTE with PS = 1: bits 29:13 (Table 4-16);
    /// - PDE with PS = 1: bits 20:13 (Table 4-18);
    /// - bit 63 (XD) would be reserved with IA32_EFER.NXE = 0; this crate
    ///   requires NXE = 1, so it is not counted.
    #[inline]
    pub const fn reserved_bits(raw: u64, height: u32) -> u64 {
        if raw & P == 0 {
            return 0;
        }
        let mut r = raw & Self::RESERVED_HIGH;
        if height > 0 && raw & PS != 0 {
            r |= raw
                & match height {
                    1 => bits::RSVD_2M,
                    2 => bits::RSVD_1G,
                    _ => PS,
                };
        }
        r
    }

    /// Checks that the entry `raw` at `height` has no reserved bit set, as
    /// the processor does on every walk (a violation is a page fault with
    /// PFEC.RSVD = 1, §4.7). [`Format::decode`] reports such an entry as
    /// [`Decoded::Invalid`].
    #[inline]
    pub const fn validate(raw: u64, height: u32) -> Result<(), ReservedBits> {
        let bits = Self::reserved_bits(raw, height);
        if bits == 0 {
            Ok(())
        } else {
            Err(ReservedBits { raw, height, bits })
        }
    }

    /// Builds a leaf like [`Format::leaf`], checking the input: the height
    /// allows a leaf, `pa` is aligned to the size mapped and below
    /// `1 << MAXPHYADDR`.
    pub fn try_leaf(pa: PhysAddr, prot: Prot, height: u32) -> Result<u64, EntryError> {
        if height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        if !Self::leaf_allowed(height) {
            return Err(EntryError::LeafNotAllowed(height));
        }
        Self::check_pa(pa, size(height))?;
        Ok(Self::leaf(pa, prot, height))
    }

    /// Builds a table entry like [`Format::table_entry`], checking that
    /// `pa` is 4 KiB aligned and below `1 << MAXPHYADDR` and that a table
    /// entry may sit at `height` (not the PTE level).
    pub fn try_table_entry(pa: PhysAddr, height: u32) -> Result<u64, EntryError> {
        if height == 0 || height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        Self::check_pa(pa, PAGE_SIZE)?;
        Ok(Self::table_entry(pa, height))
    }

    fn check_pa(pa: PhysAddr, align: u64) -> Result<(), EntryError> {
        if !pa.is_aligned(align) {
            return Err(EntryError::MisalignedPhys(pa));
        }
        if pa.0 >> M != 0 {
            return Err(EntryError::PhysOutOfRange(pa));
        }
        Ok(())
    }

    /// The protection key of a leaf: bits 62:59 (Tables 4-16, 4-18, 4-20).
    #[inline]
    pub fn pkey(raw: u64) -> u8 {
        raw.get_bits(bits::PKEY_SHIFT as usize..63) as u8
    }

    /// The present leaf `raw` at `height` with protection key `key`
    /// (0..16). Keys exist only in leaves (in table entries bits 62:59 are
    /// ignored), so anything else is [`EntryError::NotALeaf`].
    pub fn with_pkey(raw: u64, height: u32, key: u8) -> Result<u64, EntryError> {
        if key >= 16 {
            return Err(EntryError::BadPkey(key));
        }
        if height >= Self::LEVELS {
            return Err(EntryError::BadHeight(height));
        }
        Self::validate(raw, height)?;
        if !matches!(Self::decode(raw, height), Decoded::Leaf(_)) {
            return Err(EntryError::NotALeaf);
        }
        let mut out = raw;
        out.set_bits(bits::PKEY_SHIFT as usize..63, u64::from(key));
        Ok(out)
    }

    /// The 3-bit PAT index (`PAT:PCD:PWT`) of the leaf `raw` at `height`.
    #[inline]
    pub const fn pat_index(raw: u64, height: u32) -> u8 {
        bits::pat_index(raw, height)
    }
}

// SAFETY: above height 0 an entry decodes as a table exactly when P is
// set, PS is clear and no reserved bit is set, and to its bits 12-51
// (`ADDR_MASK`); `table_entry` of a 4 KiB-aligned address below
// `1 << PA_BITS` (= `M`, so no bit of `RESERVED_HIGH`) is such an entry
// and decodes back to that address, and so is `table_entry_attrs`, which
// only clears US or RW or sets XD (not reserved with NXE) on top of the
// same address. Leaves above height 0 always have PS:
// `leaf_template` sets it, `modify_prot` clears only RW, US, XD, G and the
// memory-type bits (PAT is bit 12 in a huge leaf), `split_leaf` clears it
// only for height-0 children, and `hw_access` and the `mk*` methods only
// set or clear A and D. Height 0 never decodes as a table. Software
// entries have P clear and bit 8 clear, so they decode as invalid at every
// height; a PROT_NONE leaf (P clear, bit 8 set) decodes as a leaf or
// invalid, never as a table. Every method is pure.
unsafe impl<const L: u32, const M: u32> Format for X86Paging<L, M> {
    const NAME: &'static str = if L == 5 {
        "x86_64-5level-la57"
    } else {
        "x86_64-4level"
    };
    const LEVELS: u32 = {
        let () = Self::CHECK;
        L
    };
    const PA_BITS: u32 = M;

    /// PTEs map 4-KByte pages, PDEs 2-MByte pages and PDPTEs 1-GByte pages
    /// (PS = 1); PML4Es and PML5Es only reference tables (§4.5).
    #[inline]
    fn leaf_allowed(height: u32) -> bool {
        height <= 2
    }

    #[inline]
    fn decode(raw: u64, height: u32) -> Decoded {
        if raw == 0 {
            Decoded::None
        } else if raw & P == 0 {
            // A PROT_NONE leaf: what its present twin decodes to, if a leaf.
            match Self::decode(raw | P, height) {
                Decoded::Leaf(pa) if raw & PROTNONE != 0 => Decoded::Leaf(pa),
                _ => Decoded::Invalid,
            }
        } else if Self::reserved_bits(raw, height) != 0 {
            // Not present (§4.5.4), or a reserved-bit fault (§4.7).
            Decoded::Invalid
        } else if height == 0 || raw & PS != 0 {
            // A PTE, or a PDPTE/PDE with PS = 1 (PS at height >= 3 is
            // reserved and was rejected above). The address field of a huge
            // leaf starts at bit 30 / 21; bit 12 is its PAT bit.
            Decoded::Leaf(PhysAddr(raw & ADDR_MASK & !(size(height) - 1)))
        } else {
            Decoded::Table(PhysAddr(raw & ADDR_MASK))
        }
    }

    #[inline]
    fn table_entry(pa: PhysAddr, _height: u32) -> u64 {
        pa.0 | P | RW | US | A
    }

    #[inline]
    fn leaf_template(prot: Prot, height: u32) -> u64 {
        let ad = if prot.user() {
            0
        } else if prot.writable() {
            A | D
        } else {
            A
        };
        let v = P
            | access_bits(prot)
            | ad
            | if height > 0 { PS } else { 0 }
            | bits::pat_bits(pat_index_of(prot.mem()), height);
        // PROT_NONE: the kernel read-only twin built above (`Prot`'s
        // accessors say no to every right, so G is clear), not present.
        if prot.protnone() {
            v & !P | PROTNONE
        } else {
            v
        }
    }

    #[inline]
    fn leaf_prot(raw: u64, height: u32) -> Prot {
        if raw & P == 0 {
            return Prot::NONE.with_mem(mem_type_of_pat_index(bits::pat_index(raw, height)));
        }
        let mut b = Prot::empty();
        if raw & RW != 0 {
            b |= Prot::WRITE;
        }
        if raw & US != 0 {
            b |= Prot::USER;
        }
        if raw & XD == 0 {
            b |= Prot::EXEC;
        }
        if raw & G != 0 {
            b |= Prot::GLOBAL;
        }
        b.with_mem(mem_type_of_pat_index(bits::pat_index(raw, height)))
    }

    #[inline]
    fn modify_prot(raw: u64, prot: Prot, height: u32) -> u64 {
        let keep_mem = mem_type_of_pat_index(bits::pat_index(raw, height)) == prot.mem();
        let (clear, set_mem) = if keep_mem {
            (0, 0)
        } else {
            (
                bits::mem_bits(height),
                bits::pat_bits(pat_index_of(prot.mem()), height),
            )
        };
        // P and G (the PROT_NONE marker where P is clear) come from the
        // template, so a change to or from `Prot::NONE` is one rewrite.
        let rights = P | RW | US | XD | G;
        (raw & !(rights | clear)) | (Self::leaf_template(prot, height) & rights) | set_mem
    }

    /// P clear (a [`Prot::NONE`] leaf; see the module docs).
    #[inline]
    fn is_protnone(raw: u64, _height: u32) -> bool {
        raw & P == 0
    }

    #[inline]
    fn split_leaf(raw: u64, height: u32) -> u64 {
        if height == 1 {
            // 2-MByte page -> 4-KByte pages: PS goes, and the PAT bit moves
            // from bit 12 (Table 4-18) to bit 7 (Table 4-20).
            let pat = if raw & PAT_HUGE != 0 { PAT_4K } else { 0 };
            (raw & !(PS | PAT_HUGE)) | pat
        } else {
            // 1-GByte page -> 2-MByte pages: same layout (Tables 4-16, 4-18).
            raw
        }
    }

    #[inline]
    fn is_young(raw: u64) -> bool {
        raw & A != 0
    }

    #[inline]
    fn is_dirty(raw: u64) -> bool {
        raw & D != 0
    }

    /// The processor writes a leaf only to set A, or D on a write (§4.8);
    /// with A set and D set or R/W clear (a write faults, §4.6) there is
    /// nothing left for it to set.
    ///
    /// One caveat from §4.8: a CPU still holding a *writable, clean* TLB
    /// entry for a leaf that software has since made read-only may set D in
    /// it. The algorithms only ask about entries whose last change was
    /// followed by its TLB flush, so no such TLB entry exists then.
    #[inline]
    fn is_settled(raw: u64, _height: u32) -> bool {
        raw & A != 0 && (raw & D != 0 || raw & RW == 0)
    }

    /// Access rights per §4.6 with CR0.WP = 1 and IA32_EFER.NXE = 1, SMEP,
    /// SMAP and protection keys off (supervisor accesses to user pages are
    /// allowed), table entries fully permissive (as this crate creates
    /// them), then the accessed/dirty update of §4.8: A is set on any
    /// access, D on a write, both only in the leaf (table entries are
    /// created with A set). A faulting access changes nothing.
    fn hw_access(raw: u64, _height: u32, access: Access) -> Result<u64, AccessFault> {
        if access.user && raw & US == 0 {
            return Err(AccessFault::Privilege);
        }
        if access.write && raw & RW == 0 {
            return Err(AccessFault::Write);
        }
        if access.exec && raw & XD != 0 {
            return Err(AccessFault::Exec);
        }
        Ok(raw | A | if access.write { D } else { 0 })
    }

    /// 46 bits (bits 57:12 of a not-present entry, inverted; see the module
    /// docs).
    const SWP_VALUE_BITS: u32 = 46;

    #[inline]
    fn swp_entry(value: u64) -> Option<u64> {
        let mask = (1u64 << Self::SWP_VALUE_BITS) - 1;
        (value & !mask == 0).then_some((!value & mask) << SWP_VALUE_SHIFT | SWP_TAG)
    }

    #[inline]
    fn swp_value(raw: u64) -> Option<u64> {
        let mask = (1u64 << Self::SWP_VALUE_BITS) - 1;
        let high = raw >> (SWP_VALUE_SHIFT + Self::SWP_VALUE_BITS);
        (raw & 0xfff == SWP_TAG && high == 0).then_some(!(raw >> SWP_VALUE_SHIFT) & mask)
    }

    /// A paging-structure entry that restricts the rights of everything
    /// below it (Intel SDM Vol. 3A 4.6.1: a user-mode access needs U/S = 1,
    /// a write R/W = 1, and an instruction fetch XD = 0, in *every* entry
    /// of the walk): U/S clear for [`TableAttrs::NO_USER`] (Linux
    /// `_KERNPG_TABLE`), R/W clear for [`TableAttrs::READ_ONLY`], XD when
    /// both [`TableAttrs::UXN`] and [`TableAttrs::PXN`] are asked (x86 has
    /// no per-privilege execute-never; supervisor fetches from user pages
    /// are stopped by CR4.SMEP instead).
    #[inline]
    fn table_entry_attrs(pa: PhysAddr, _height: u32, attrs: TableAttrs) -> u64 {
        let mut v = pa.0 | P | A;
        if !attrs.no_user() {
            v |= US;
        }
        if !attrs.read_only() {
            v |= RW;
        }
        if attrs.uxn() && attrs.pxn() {
            v |= XD;
        }
        v
    }

    #[inline]
    fn table_limits(raw: u64, _height: u32) -> TableAttrs {
        let mut b = 0;
        if raw & US == 0 {
            b |= TableAttrs::NO_USER;
        }
        if raw & RW == 0 {
            b |= TableAttrs::READ_ONLY;
        }
        if raw & XD != 0 {
            b |= TableAttrs::UXN | TableAttrs::PXN;
        }
        TableAttrs::new(b)
    }

    /// Linux x86 `pte_mkold`: A (bit 5, the same in every leaf) clear.
    #[inline]
    fn mkold(raw: u64, _height: u32) -> u64 {
        raw & !A
    }

    /// Linux x86 `pte_mkyoung`: A set.
    #[inline]
    fn mkyoung(raw: u64, _height: u32) -> u64 {
        raw | A
    }

    /// Linux x86 `pte_mkclean`: D (bit 6 of every leaf) clear; R/W is
    /// kept, since the processor sets D on the next write (SDM Vol. 3A
    /// §4.8).
    #[inline]
    fn mkclean(raw: u64, _height: u32) -> u64 {
        raw & !D
    }

    /// Linux x86 `pte_mkdirty`: D set.
    #[inline]
    fn mkdirty(raw: u64, _height: u32) -> u64 {
        raw | D
    }
}

// SAFETY: `pmdp_modify_prot_start` is the generic deferred one (an atomic
// swap with 0 that returns the old value); every other entry operation is
// the generic fallback.
unsafe impl<const L: u32, const M: u32> Arch for X86Paging<L, M> {
    const HAVE_MOVE_PMD: bool = true;
    const HAVE_MOVE_PUD: bool = true;
    /// Linux's `tlb_single_page_flush_ceiling` default.
    const TLB_FLUSH_CEILING: u64 = 33;
    /// x86 has no walker barrier and needs none: there is no instruction
    /// that orders the page walker, and none is required to publish a new
    /// entry. A not-present entry is never cached (SDM Vol. 3A §4.10.4.3:
    /// a change of P from 0 to 1 needs no invalidation), so the worst a
    /// walk racing the store can do is read the old not-present entry and
    /// raise a page fault, which a retry resolves; processors in practice
    /// make walks coherent with the CPU's own earlier stores. Linux's x86
    /// `set_pte` is likewise a plain store.
    const NEEDS_WALKER_BARRIER: bool = false;
    /// x86 needs no break-before-make: a live entry may be rewritten in
    /// place as long as the TLB is flushed afterwards. Splitting a block
    /// keeps its frame and attributes, which §4.10.4.2 allows without
    /// first clearing P (only a change of page size together with frame or
    /// attributes calls for the clear-invalidate-set sequence); the core
    /// then flushes the block's translation before it changes an entry
    /// below it (§4.10.2.3: translations of both sizes may be cached, and
    /// must not differ). Processors with AMD Family 10h erratum 383, for
    /// which Linux splits user huge pages with `pmdp_invalidate` instead,
    /// are not supported.
    const BREAK_BEFORE_MAKE: bool = false;

    // The generic entry operations are already what x86 needs: with
    // `NEEDS_WALKER_BARRIER = false` the `set_p*_at` setters are a single
    // 64-bit store (Linux x86 `native_set_pte`), and `ptep_get_and_clear` is
    // an atomic exchange with 0 (`xchg`). The processor sets A and D with
    // locked read-modify-writes (SDM Vol. 3A "Automatic Locking": "when
    // updating page-directory and page-table entries"), so a load followed
    // by a store could lose an update made between them.

    /// The deferred form: an atomic exchange that makes the block not
    /// present, and no flush of its own; the operation's single gathered
    /// flush at the end removes the old translation.
    ///
    /// Why that is enough on x86: the processor sets A or D only with a
    /// locked update of an entry it uses for a translation (§4.8), and a
    /// not-present entry is never used nor cached (§4.10.4.3), so once the
    /// exchange has returned the old
    /// value no accessed/dirty update can be lost; a stale TLB entry can
    /// only let accesses with the *old* rights through until the flush,
    /// which the caller's operation has not yet returned from. Linux x86
    /// reaches the same conclusion in its `pmdp_invalidate_ad` override
    /// ("no flush is necessary"), which differs only in leaving a
    /// not-present marker instead of 0; processors with the Knights Landing
    /// stray-A/D erratum (`X86_BUG_PTE_LEAK`) are not supported.
    #[inline]
    fn pmdp_modify_prot_start<Mm: Mmu>(mmu: &Mm, va: VirtAddr, slot: &Slot, height: u32) -> u64 {
        generic::pmdp_modify_prot_start_deferred::<Self, Mm>(mmu, va, slot, height)
    }
}
