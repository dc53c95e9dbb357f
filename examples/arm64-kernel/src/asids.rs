//! Switching user address spaces in TTBR0_EL1 by ASID (Linux arm64
//! `check_and_switch_context` followed by `cpu_switch_mm`).
//!
//! Each user space ([`Proc`]) carries an [`AsidContext`] and an MMU handle
//! that starts unassigned; a switch is `AsidAllocator::switch_mm`: it asks
//! the allocator for the space's ASID, issues the local TLB flush it asks
//! for after a roll-over (and no other), tags the space's MMU handle with
//! the ASID and installs its root: one TTBR0_EL1 write with root and
//! ASID, without a flush. The kernel's own space stays in TTBR1_EL1 with
//! global mappings.
//!
//! With the `sabotage-no-asid` feature every switch installs the root
//! under ASID 0 without any flush, which is wrong (the TLB keeps the
//! previous space's translations under that ASID): a build to show that
//! the `space_` cases catch it. Never enable it otherwise.

// As in space.rs: errors carry their message inline (no allocation).
#![allow(clippy::result_large_err)]

use pgtable_arm64::{Asid, AsidBits};
use pgtable_core::asid::{AsidAllocator, AsidContext};

use crate::kmap::KernelSpace;
use crate::platform::local_flush;
use crate::space::Why;

/// Whether this is the sabotaged build (see the module docs).
const SABOTAGE: bool = cfg!(feature = "sabotage-no-asid");

/// A user address space and its ASID context.
pub struct Proc {
    /// The space: lower half, TTBR0_EL1, built by `new_user`.
    pub space: KernelSpace,
    /// Its ASID and generation.
    pub ctx: AsidContext,
}

/// An ASID allocator for one CPU with `64 * WORDS` ASIDs at most, and the
/// number of switches made through it.
pub struct Switcher<const WORDS: usize> {
    asids: AsidAllocator<WORDS, 1>,
    width: AsidBits,
    /// Switches made.
    pub switches: u64,
}

impl<const WORDS: usize> Switcher<WORDS> {
    /// An allocator of `bits`-bit ASIDs for a CPU whose ASIDs are `width`
    /// wide (`bits` at most `width.bits()`).
    pub fn new(bits: u32, width: AsidBits) -> Result<Self, Why> {
        if bits > width.bits() {
            return Err(Why::new(format_args!(
                "{bits}-bit ASIDs on a CPU with {} bits",
                width.bits()
            )));
        }
        let asids =
            AsidAllocator::new(bits).map_err(|e| Why::new(format_args!("ASID allocator: {e}")))?;
        Ok(Switcher {
            asids,
            width,
            switches: 0,
        })
    }

    /// The allocator's ASID width.
    pub fn bits(&self) -> u32 {
        self.asids.bits()
    }

    /// Roll-overs so far.
    pub fn rollovers(&self) -> u64 {
        self.asids.rollovers()
    }

    /// Makes `p` the space of TTBR0_EL1 and returns its ASID.
    ///
    /// # Safety
    ///
    /// `p`'s space maps only user memory (the kernel uses nothing in the
    /// lower half). Every space switched through this allocator since the
    /// TLB last held entries of another allocator's ASIDs was switched
    /// through this one (two allocators hand out the same numbers: switch
    /// from one to the other only across a full flush).
    pub unsafe fn switch(&mut self, p: &mut Proc) -> Result<u16, Why> {
        self.switches += 1;
        if !SABOTAGE {
            // SAFETY: the space maps only user memory (our caller's
            // promise) and the kernel runs on TTBR1_EL1; CPU 0 is the only
            // CPU that switches user spaces; `p.ctx` is `p`'s own and only
            // this allocator sees it, and no other allocator's ASIDs are in
            // the TLB (our caller's promise).
            let sw = unsafe { self.asids.switch_mm(0, &mut p.ctx, &mut p.space) }
                .map_err(|e| Why::new(format_args!("switch_mm: {e}")))?;
            return Ok(sw.asid);
        }
        let sw = self
            .asids
            .switch_to(0, &mut p.ctx)
            .map_err(|e| Why::new(format_args!("ASID switch: {e}")))?;
        if sw.flush_local && !SABOTAGE {
            local_flush();
        }
        let asid = if SABOTAGE {
            Asid::from_u8(0)
        } else {
            Asid::new(sw.asid, self.width)
                .map_err(|e| Why::new(format_args!("ASID {}: {e}", sw.asid)))?
        };
        p.space.mmu().set_asid(asid);
        // SAFETY: the space maps only user memory (our caller's promise)
        // and the kernel runs on TTBR1_EL1; the allocator gave `asid` to
        // this space alone in its generation, and a roll-over's local
        // flush (above) removed the previous generation's entries, so the
        // TLB holds no other space's translations under it.
        unsafe { p.space.install() };
        Ok(sw.asid)
    }
}
