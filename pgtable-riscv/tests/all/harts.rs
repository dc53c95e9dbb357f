//! The simulated hart as a `pgtable_riscv::Hart`, optionally broken: the
//! adapter every simulator test of `HartMmu` and `SmpMmu` runs on.

use pgtable_core::contract::{Arch, Slot};
use pgtable_core::sim::{Installed, SimAlloc, SimHart, SimMachine};
use pgtable_core::{AddressSpace, VirtAddr};
use pgtable_riscv::{Asid, Hart, HartMmu, RiscvPaging, Satp, SatpMode};

/// What the hart gets wrong (the broken variants of `sim_broken.rs`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Bug {
    /// Nothing.
    None,
    /// Every `SFENCE.VMA` is left out.
    NoSfence,
    /// Every `SFENCE.VMA` naming an address is left out.
    NoSfenceByAddress,
    /// Fences with an ASID name the next ASID instead.
    WrongAsid,
    /// `SFENCE.W.INVAL` is left out of the Svinval sequence.
    NoWInval,
    /// `SFENCE.INVAL.IR` is left out of the Svinval sequence.
    NoInvalIr,
    /// `SFENCE.VMA x0, x0` is executed as `SFENCE.VMA x0, asid` of ASID 0
    /// (which keeps global entries).
    AllByAsid,
}

/// A [`SimHart`] executing `pgtable_riscv`'s [`Hart`] instructions.
pub struct SimFences<A: Arch> {
    pub hart: SimHart<A>,
    pub bug: Bug,
}

impl<A: Arch> SimFences<A> {
    fn asid(&self, asid: Option<Asid>) -> Option<u16> {
        let a = asid.map(Asid::get);
        if self.bug == Bug::WrongAsid {
            a.map(|a| a.wrapping_add(1))
        } else {
            a
        }
    }
}

// SAFETY: every method executes the instruction's effect on the
// simulated hart (the broken variants run on the simulator only).
unsafe impl<A: Arch> Hart for SimFences<A> {
    const OBSERVES_WRITES: bool = true;

    fn sfence_vma(&self, va: Option<VirtAddr>, asid: Option<Asid>) {
        match self.bug {
            Bug::NoSfence => {}
            Bug::NoSfenceByAddress if va.is_some() => {}
            Bug::AllByAsid if va.is_none() && asid.is_none() => {
                self.hart.sfence_vma(None, Some(0));
            }
            _ => self.hart.sfence_vma(va, self.asid(asid)),
        }
    }

    fn sfence_w_inval(&self) {
        if self.bug != Bug::NoWInval {
            self.hart.sfence_w_inval();
        }
    }

    fn sinval_vma(&self, va: Option<VirtAddr>, asid: Option<Asid>) {
        self.hart.sinval_vma(va, self.asid(asid));
    }

    fn sfence_inval_ir(&self) {
        if self.bug != Bug::NoInvalIr {
            self.hart.sfence_inval_ir();
        }
    }

    fn fence_w_w(&self) {
        self.hart.fence_w_w();
    }

    unsafe fn write_satp(&self, value: u64) {
        let satp = Satp::from_bits(value);
        let root = match satp.mode() {
            Some(SatpMode::Bare) | None => None,
            Some(_) => Some(satp.root()),
        };
        // SAFETY: the roots `HartMmu` installs are the space's, allocated
        // by this machine's allocator.
        unsafe { self.hart.write_satp(root, satp.asid()) };
    }

    fn entry_written(&self, slot: &Slot, old: u64) {
        self.hart.entry_written(slot, old);
    }
}

/// The MMU of a space on CPU `cpu` of `m` for `RiscvPaging<L>`, with
/// `bug`.
pub fn mmu<const L: u32>(
    m: &SimMachine<RiscvPaging<L>>,
    cpu: usize,
    bug: Bug,
) -> HartMmu<SimFences<RiscvPaging<L>>> {
    HartMmu::on::<L, 0>(SimFences {
        hart: m.cpu(cpu).hart(),
        bug,
    })
}

pub type Space<const L: u32, M> = Installed<RiscvPaging<L>, M, SimAlloc>;

/// An installed space on `m` with `mmu`.
pub fn install<const L: u32, M: pgtable_core::contract::Mmu>(
    m: &SimMachine<RiscvPaging<L>>,
    mmu: M,
) -> Space<L, M> {
    let s = AddressSpace::new(mmu, m.alloc()).unwrap();
    // SAFETY: the MMU installs into a simulated hart.
    unsafe { Installed::new(s) }
}

/// An ASID of a 16-bit ASIDLEN.
pub fn asid(a: u16) -> Asid {
    Asid::new(a, 16).unwrap()
}
