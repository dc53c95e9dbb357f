//! System register values and instruction operands (pure, host-testable):
//! CR3 with its PCID and no-flush bit, the CR4 bits paging uses, the CPUID
//! bits that announce PCIDs and INVPCID, and INVPCID's types and
//! descriptor. `X86Mmu` (bare metal only) loads and executes them.
//!
//! References are to the Intel 64 and IA-32 Architectures Software
//! Developer's Manual: Vol. 3A §2.5 "Control Registers", §4.10.1
//! "Process-Context Identifiers", §4.10.4.1 "Operations that Invalidate
//! TLBs and Paging-Structure Caches", and Vol. 2A "INVPCID".

use core::fmt;

/// A process-context identifier: 12 bits, CR3\[11:0\] with CR4.PCIDE = 1.
/// A value above 4095 is an error ([`Pcid::new`]), never truncated (a
/// truncated PCID would tag one address space's entries as another's).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct Pcid(pub(crate) u16);

impl Pcid {
    /// PCID 0: what CR3 holds with CR4.PCIDE = 0, and untagged roots.
    pub const ZERO: Pcid = Pcid(0);

    /// `pcid`, if below 4096.
    pub const fn new(pcid: u16) -> Result<Pcid, PcidTooWide> {
        if pcid < 4096 {
            Ok(Pcid(pcid))
        } else {
            Err(PcidTooWide { pcid })
        }
    }

    /// The value.
    pub const fn get(self) -> u16 {
        self.0
    }
}

/// A PCID above 4095.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PcidTooWide {
    /// The value that did not fit.
    pub pcid: u16,
}

impl fmt::Display for PcidTooWide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PCID {:#x} does not fit 12 bits", self.pcid)
    }
}

impl core::error::Error for PcidTooWide {}

/// CR3 bits 51:12: the physical address of the root table (SDM Vol. 3A
/// §4.5, Table 4-13; bits above MAXPHYADDR must be 0).
pub const CR3_ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;

/// CR3 bits 11:0 with CR4.PCIDE = 1: the current PCID (§4.10.1).
pub const CR3_PCID_MASK: u64 = 0xfff;

/// CR3 bit 63 on a MOV to CR3 with CR4.PCIDE = 1: keep the new PCID's
/// cached entries (SDM Vol. 3A §4.10.4.1).
pub const CR3_NOFLUSH: u64 = 1 << 63;

/// The CR3 value that switches to `root` with `pcid`: the root's frame,
/// the PCID in bits \[11:0\], and [`CR3_NOFLUSH`] unless `flush` (then the
/// PCID's non-global entries are invalidated by the write).
#[inline]
pub const fn cr3_value(root: u64, pcid: Pcid, flush: bool) -> u64 {
    let v = (root & CR3_ADDR_MASK) | pcid.0 as u64;
    if flush {
        v
    } else {
        v | CR3_NOFLUSH
    }
}

/// CR4.PGE, bit 7: global pages enabled; any change of it invalidates
/// every TLB entry, global ones included (SDM Vol. 3A §4.10.4.1).
pub const CR4_PGE: u64 = 1 << 7;

/// CR4.LA57, bit 12: 5-level paging (57-bit linear addresses).
pub const CR4_LA57: u64 = 1 << 12;

/// CR4.PCIDE, bit 17: process-context identifiers enabled (§4.10.1).
pub const CR4_PCIDE: u64 = 1 << 17;

/// `CPUID.01H:ECX` bit 17: the processor supports PCIDs.
pub const CPUID_01_ECX_PCID: u32 = 1 << 17;

/// `CPUID.(EAX=07H,ECX=0):EBX` bit 10: the processor supports INVPCID.
pub const CPUID_07_EBX_INVPCID: u32 = 1 << 10;

/// INVPCID type 0, individual-address invalidation: the non-global
/// translations of one linear address for one PCID (SDM Vol. 2A
/// "INVPCID").
pub const INVPCID_ADDRESS: u64 = 0;

/// INVPCID type 1, single-context invalidation: every non-global
/// translation of one PCID.
pub const INVPCID_SINGLE_CONTEXT: u64 = 1;

/// INVPCID type 2, all-context invalidation including global translations.
pub const INVPCID_ALL_INCLUDING_GLOBAL: u64 = 2;

/// INVPCID type 3, all-context invalidation: every non-global translation
/// of every PCID.
pub const INVPCID_ALL_NON_GLOBAL: u64 = 3;

/// The 16-byte INVPCID descriptor for `pcid` and linear address `va`:
/// the PCID in bits 11:0 of the first quadword (bits 63:12 reserved, 0),
/// the address in the second (used by type 0 only, which raises #GP for a
/// non-canonical address).
#[inline]
pub const fn invpcid_descriptor(pcid: Pcid, va: u64) -> [u64; 2] {
    [pcid.0 as u64, va]
}
