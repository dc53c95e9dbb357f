//! Each operation as the Rust call that replays it, for failure reports.

use std::fmt;

use pgtable_core::{MemType, Prot};

use super::{Fault, MapKind, MoveKind, Op};

/// Rust source for a protection.
pub struct ProtSrc(pub Prot);

impl fmt::Display for ProtSrc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Prot::from_bits_retain({:#06b})", self.0.bits())?;
        if self.0.mem() != MemType::Normal {
            write!(f, ".with_mem(MemType::{:?})", self.0.mem())?;
        }
        Ok(())
    }
}

/// Each operation as the Rust call that replays it (`space`, `machine`).
impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(k) = self.fail() {
            write!(f, "machine.fail_after(Some({k})); ")?;
        }
        match *self {
            Op::Map {
                va,
                pa,
                len,
                prot,
                kind,
                barrier_per_entry,
                no_cont,
                ..
            } => {
                let opts = match (kind, no_cont) {
                    (MapKind::Pages, false) => "PAGES",
                    (MapKind::PmdBlocks, false) => "PMD_BLOCKS",
                    (MapKind::Blocks, false) => "BLOCKS",
                    (MapKind::Pages, true) => "PAGES.no_contiguous()",
                    (MapKind::PmdBlocks, true) => "PMD_BLOCKS.no_contiguous()",
                    (MapKind::Blocks, true) => "BLOCKS.no_contiguous()",
                };
                let opts = if barrier_per_entry {
                    format!("variants::barrier_per_entry(MapOptions::{opts})")
                } else {
                    format!("MapOptions::{opts}")
                };
                write!(
                    f,
                    "space.map(VirtAddr({va:#x}), PhysAddr({pa:#x}), {len:#x}, {}, {opts})",
                    ProtSrc(prot)
                )
            }
            Op::Unmap { va, len, .. } => write!(f, "space.unmap(VirtAddr({va:#x}), {len:#x})"),
            Op::Protect { va, len, prot, .. } => write!(
                f,
                "space.change_protection(VirtAddr({va:#x}), {len:#x}, {})",
                ProtSrc(prot)
            ),
            Op::Move {
                old,
                new,
                len,
                kind,
                ..
            } => {
                let opts = match kind {
                    MoveKind::Default => "MoveOptions::DEFAULT",
                    MoveKind::PtesOnly => "variants::PTES_ONLY",
                    MoveKind::PmdOnly => "variants::PMD_ONLY",
                    MoveKind::FreeBelow => "MoveOptions::DEFAULT.free_below()",
                };
                write!(
                    f,
                    "space.move_page_tables(VirtAddr({old:#x}), VirtAddr({new:#x}), {len:#x}, {opts})"
                )
            }
            Op::Swap { va, value, .. } => {
                write!(f, "space.install_pte(VirtAddr({va:#x}), NewPte::Swap({value:#x}))")
            }
            Op::Replace {
                va, swap: Some(v), ..
            } => write!(f, "space.replace_pte(VirtAddr({va:#x}), NewPte::Swap({v:#x}))"),
            Op::Replace {
                va,
                pa,
                prot,
                swap: None,
            } => write!(
                f,
                "space.replace_pte(VirtAddr({va:#x}), NewPte::Page {{ pa: PhysAddr({pa:#x}), prot: {} }})",
                ProtSrc(prot)
            ),
            Op::Touch { va, write: None } => write!(f, "machine.read_u64(VirtAddr({va:#x}))"),
            Op::Touch { va, write: Some(v) } => {
                write!(f, "machine.write_u64(VirtAddr({va:#x}), {v:#x})")
            }
            Op::Switch => write!(f, "std::mem::swap(&mut space, &mut other)"),
            Op::UnmapWith { va, len, .. } => {
                write!(
                    f,
                    "space.unmap_with(VirtAddr({va:#x}), {len:#x}, |r| reports.push(r))"
                )
            }
            Op::ClearRefs { va, len, what } => write!(
                f,
                "space.clear_refs(VirtAddr({va:#x}), {len:#x}, {}, |r| reports.push(r))",
                what.src()
            ),
            Op::Young { va } => write!(f, "space.test_and_clear_young(VirtAddr({va:#x}))"),
            Op::Get { va } => write!(f, "space.ptep_get(VirtAddr({va:#x}))"),
            Op::Fault { va, flags } => write!(
                f,
                "space.ptep_set_access_flags(VirtAddr({va:#x}), FaultFlags::{})",
                match flags {
                    Fault::Access => "ACCESS",
                    Fault::Dirty => "DIRTY",
                    Fault::Write => "WRITE",
                }
            ),
            Op::Install { va, pa, prot, .. } => write!(
                f,
                "space.install_pte(VirtAddr({va:#x}), NewPte::Page {{ pa: PhysAddr({pa:#x}), prot: {} }})",
                ProtSrc(prot)
            ),
            Op::Copy { va, len, cow, .. } => write!(
                f,
                "space.copy_page_range(&mut other, VirtAddr({va:#x}), {len:#x}, CopyMode::{}, |_| {{}})",
                if cow { "Cow" } else { "Shared" }
            ),
            Op::Live {
                va, len, prot, bbm, ..
            } => write!(
                f,
                "space.change_protection_live(VirtAddr({va:#x}), {len:#x}, {}, LiveOptions::{})",
                ProtSrc(prot),
                if bbm { "ALLOW_BBM" } else { "IN_PLACE" }
            ),
            Op::Gather { steps, n } => {
                write!(f, "let mut g = space.tlb_gather_mmu(); ")?;
                for s in &steps[..usize::from(n)] {
                    write!(f, "{s}; ")?;
                }
                write!(f, "g.finish()")
            }
        }?;
        if self.fail().is_some() {
            write!(f, "; machine.fail_after(None)")?;
        }
        Ok(())
    }
}
