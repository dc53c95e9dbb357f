//! AMD INVLPGB and TLBSYNC: broadcast TLB invalidation without IPIs.
//!
//! AMD64 Architecture Programmer's Manual, Volume 3, "INVLPGB —
//! Broadcast TLB Invalidation" and "TLBSYNC — Synchronize TLB
//! Invalidations": INVLPGB invalidates the selected translations in the
//! TLBs (and, unless told otherwise, the page-walk caches) of *every*
//! processor in the system, the executing one included; the invalidations
//! it starts are not ordered, and TLBSYNC on the same processor waits
//! until every INVLPGB that processor issued has completed on all of them.
//! Support: `CPUID Fn8000_0008 EBX[3]` (INVLPGB), and `EDX[15:0]` is the
//! largest extra page count one INVLPGB accepts (`InvlpgbCountMax`).
//!
//! Operands (the instruction has no ModRM; registers are implicit):
//!
//! - `rAX[63:12]`: the virtual address; `rAX[0]` the address is valid,
//!   `rAX[1]` the PCID is valid, `rAX[2]` the ASID is valid, `rAX[3]`
//!   include global translations, `rAX[4]` final translation only (keep
//!   the page-walk caches);
//! - `ECX[15:0]`: number of pages *beyond* the first; `ECX[31]`: step by
//!   2 MiB instead of 4 KiB;
//! - `EDX[31:16]`: the PCID, `EDX[15:0]`: the ASID (0 for the host). The
//!   ASID-valid bit is always set here, so a host's invalidations never
//!   reach guest translations (Linux commit "x86/mm: Always set the ASID
//!   valid bit for the INVLPGB instruction").
//!
//! [`invlpgb_ops`] turns a flush into these operands (pure, host-tested);
//! the bare-metal half executes them.

use pgtable_core::contract::TlbRange;

use crate::flush::{strides, FlushKind};
use crate::Pcid;

/// `rAX[0]`: the virtual address is valid.
pub const VA_VALID: u64 = 1 << 0;
/// `rAX[1]`: the PCID in `EDX[31:16]` is valid.
pub const PCID_VALID: u64 = 1 << 1;
/// `rAX[2]`: the ASID in `EDX[15:0]` is valid.
pub const ASID_VALID: u64 = 1 << 2;
/// `rAX[3]`: global translations are invalidated too.
pub const INCLUDE_GLOBAL: u64 = 1 << 3;
/// `rAX[4]`: only final (leaf) translations; page-walk caches stay.
pub const FINAL_ONLY: u64 = 1 << 4;
/// `ECX[31]`: the extra pages are 2 MiB apart.
pub const STRIDE_2M: u32 = 1 << 31;

/// What CPUID reports about INVLPGB.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Invlpgb {
    /// The largest `ECX[15:0]` one INVLPGB accepts
    /// (`CPUID Fn8000_0008 EDX[15:0]`).
    pub max_extra: u16,
}

impl Invlpgb {
    /// INVLPGB support from the registers of `CPUID Fn8000_0008`: `None`
    /// when `EBX[3]` is clear.
    pub const fn from_cpuid(ebx: u32, edx: u32) -> Option<Invlpgb> {
        if ebx & (1 << 3) == 0 {
            return None;
        }
        Some(Invlpgb {
            max_extra: (edx & 0xffff) as u16,
        })
    }
}

/// The operands of one INVLPGB.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct InvlpgbOp {
    /// `rAX`: address and flags.
    pub rax: u64,
    /// `ECX`: extra page count and stride.
    pub ecx: u32,
    /// `EDX`: PCID and ASID.
    pub edx: u32,
}

/// The INVLPGBs of one flush, in order; a TLBSYNC follows the last.
#[derive(Clone, Debug)]
pub struct InvlpgbOps {
    /// The next operation (by address) or the only one.
    next: InvlpgbOp,
    /// Strides still to cover (0: one operation without an address).
    left: u64,
    /// log2 of the distance between two strides.
    shift: u32,
    /// Strides one operation covers at most.
    per_op: u64,
    /// Operations still to return.
    ops: u64,
}

impl Iterator for InvlpgbOps {
    type Item = InvlpgbOp;

    fn next(&mut self) -> Option<InvlpgbOp> {
        if self.ops == 0 {
            return None;
        }
        self.ops -= 1;
        let mut op = self.next;
        if self.left > 0 {
            let n = self.left.min(self.per_op);
            op.ecx |= (n - 1) as u32;
            self.left -= n;
            self.next.rax = self.next.rax.wrapping_add(n << self.shift);
        }
        Some(op)
    }
}

/// The INVLPGBs that flush `kind` on every processor for the address
/// space tagged `pcid` (`None`: every PCID), with the same ceiling rule as
/// [`flush_plan`](crate::flush_plan): more than `ceiling` strides become
/// one invalidation of the whole address space (and of global
/// translations when the range may hold them).
///
/// A range is flushed per stride: 4 KiB strides with the 4 KiB step, 2 MiB
/// strides with the 2 MiB step (`ECX[31]`), larger strides one operation
/// per stride (a 4 KiB-step invalidation at an address invalidates the
/// translation of any size that contains it). A range that keeps
/// `last_level` sets "final translation only"; otherwise the page-walk
/// caches go too, which a freed table needs.
pub fn invlpgb_ops(kind: FlushKind, pcid: Option<Pcid>, info: Invlpgb, ceiling: u64) -> InvlpgbOps {
    let (pcid_bit, edx) = match pcid {
        Some(p) => (PCID_VALID, u32::from(p.get()) << 16),
        None => (0, 0),
    };
    // ASID 0 (the host) is always named: see the module docs.
    let whole = |global: bool| InvlpgbOps {
        next: InvlpgbOp {
            rax: ASID_VALID | pcid_bit | if global { INCLUDE_GLOBAL } else { 0 },
            ecx: 0,
            edx,
        },
        left: 0,
        shift: 12,
        per_op: 1,
        ops: 1,
    };
    match kind {
        // Every translation of every PCID, global ones included.
        FlushKind::All => InvlpgbOps {
            next: InvlpgbOp {
                rax: ASID_VALID | INCLUDE_GLOBAL,
                ecx: 0,
                edx: 0,
            },
            left: 0,
            shift: 12,
            per_op: 1,
            ops: 1,
        },
        FlushKind::Mm => whole(false),
        FlushKind::Range(r) => match strides(r) {
            Some(n) if n <= ceiling => range_ops(r, n, pcid_bit, edx, info),
            // Past the ceiling: the range may hold global translations.
            _ => whole(true),
        },
    }
}

fn range_ops(r: TlbRange, n: u64, pcid_bit: u64, edx: u32, info: Invlpgb) -> InvlpgbOps {
    let shift = r.stride_shift;
    let (ecx, per_op) = match shift {
        12 => (0, u64::from(info.max_extra) + 1),
        21 => (STRIDE_2M, u64::from(info.max_extra) + 1),
        _ => (0, 1),
    };
    let start = r.start.0 & !((1u64 << shift) - 1);
    let flags = VA_VALID
        | ASID_VALID
        | pcid_bit
        | INCLUDE_GLOBAL
        | if r.last_level { FINAL_ONLY } else { 0 };
    InvlpgbOps {
        next: InvlpgbOp {
            rax: (start & !0xfff) | flags,
            ecx,
            edx,
        },
        left: n,
        shift,
        per_op,
        ops: n.div_ceil(per_op),
    }
}

/// INVLPGB support of the executing CPU: `CPUID Fn8000_0008`, when the
/// extended leaf exists.
#[cfg(any(
    all(target_arch = "x86_64", target_os = "none"),
    all(doc, target_arch = "x86_64")
))]
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub fn detect() -> Option<Invlpgb> {
    #[allow(unused_unsafe)]
    // SAFETY: CPUID exists on every x86-64 processor.
    let max = unsafe { core::arch::x86_64::__cpuid(0x8000_0000) }.eax;
    if max < 0x8000_0008 {
        return None;
    }
    #[allow(unused_unsafe)]
    // SAFETY: as above; the leaf exists (checked).
    let r = unsafe { core::arch::x86_64::__cpuid(0x8000_0008) };
    Invlpgb::from_cpuid(r.ebx, r.edx)
}

/// Executes `ops` and waits for them on every processor (TLBSYNC).
///
/// # Safety
///
/// The CPU implements INVLPGB ([`detect`]), and the caller does not
/// migrate to another CPU between the first INVLPGB and the TLBSYNC
/// (TLBSYNC waits only for the executing processor's INVLPGBs).
#[cfg(any(
    all(target_arch = "x86_64", target_os = "none"),
    all(doc, target_arch = "x86_64")
))]
#[cfg_attr(docsrs, doc(cfg(all(target_arch = "x86_64", target_os = "none"))))]
pub unsafe fn execute(ops: InvlpgbOps) {
    use core::arch::asm;
    for op in ops {
        // SAFETY: INVLPGB only invalidates translations; the CPU has it
        // (our caller's promise). No `nomem`: the entry stores before it
        // stay before it in program order.
        unsafe {
            asm!(".byte 0x0f, 0x01, 0xfe", in("rax") op.rax, in("ecx") op.ecx,
                 in("edx") op.edx, options(nostack, preserves_flags))
        };
    }
    // SAFETY: TLBSYNC waits for this processor's INVLPGBs; it exists
    // where INVLPGB does (APM Vol. 3, TLBSYNC).
    unsafe { asm!(".byte 0x0f, 0x01, 0xff", options(nostack, preserves_flags)) };
}
