//! Just enough of a flattened device tree (devicetree spec v0.4, ch. 5)
//! to find the RAM: the first `reg` of the `/memory` node.
//!
//! QEMU `virt` places the tree at the base of RAM for an ELF kernel (it
//! does not pass its address in `x0` for non-Linux images).

/// FDT header magic (big-endian 0xd00dfeed).
const MAGIC: u32 = 0xd00d_feed;
const BEGIN_NODE: u32 = 1;
const END_NODE: u32 = 2;
const PROP: u32 = 3;
const NOP: u32 = 4;
const END: u32 = 9;

/// A device tree in memory.
pub struct Fdt {
    bytes: &'static [u8],
}

impl Fdt {
    /// The tree at `addr`, if a valid header is there.
    ///
    /// # Safety
    ///
    /// `addr` must be readable for 40 bytes and, if they hold the FDT
    /// magic, for the `totalsize` the header gives, and stay unchanged.
    pub unsafe fn at(addr: u64) -> Option<Fdt> {
        let p = addr as *const u8;
        // SAFETY: the caller guarantees 40 readable bytes.
        let header = unsafe { core::slice::from_raw_parts(p, 40) };
        if be32(header, 0)? != MAGIC {
            return None;
        }
        let size = be32(header, 4)? as usize;
        // SAFETY: the caller guarantees `totalsize` readable bytes.
        let bytes = unsafe { core::slice::from_raw_parts(p, size) };
        Some(Fdt { bytes })
    }

    /// The whole tree, for other parsers (`psci.rs`).
    pub fn raw(&self) -> &'static [u8] {
        self.bytes
    }

    /// `(base, size)` of the first range of the first `memory` node under
    /// the root, using the root's `#address-cells` / `#size-cells`.
    pub fn memory(&self) -> Option<(u64, u64)> {
        let b = self.bytes;
        let structs = be32(b, 8)? as usize;
        let strings = be32(b, 12)? as usize;
        let mut off = structs;
        let mut depth = 0u32;
        let (mut acells, mut scells) = (2usize, 1usize);
        let mut in_memory = false;
        loop {
            let token = be32(b, off)?;
            off += 4;
            match token {
                BEGIN_NODE => {
                    let name_len = b.get(off..)?.iter().position(|&c| c == 0)?;
                    let name = &b[off..off + name_len];
                    depth += 1;
                    in_memory = depth == 2 && (name == b"memory" || name.starts_with(b"memory@"));
                    off = align4(off + name_len + 1);
                }
                END_NODE => {
                    depth = depth.checked_sub(1)?;
                    in_memory = false;
                }
                PROP => {
                    let len = be32(b, off)? as usize;
                    let name_off = be32(b, off + 4)? as usize;
                    let value = b.get(off + 8..off + 8 + len)?;
                    let name = cstr(b.get(strings + name_off..)?)?;
                    if depth == 1 && name == b"#address-cells" {
                        acells = be32(value, 0)? as usize;
                    } else if depth == 1 && name == b"#size-cells" {
                        scells = be32(value, 0)? as usize;
                    } else if in_memory && name == b"reg" {
                        let base = cells(value, 0, acells)?;
                        let size = cells(value, acells, scells)?;
                        return Some((base, size));
                    }
                    off = align4(off + 8 + len);
                }
                NOP => {}
                END => return None,
                _ => return None,
            }
        }
    }
}

fn align4(x: usize) -> usize {
    (x + 3) & !3
}

fn be32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

fn cells(b: &[u8], first: usize, n: usize) -> Option<u64> {
    (0..n).try_fold(0u64, |acc, i| {
        Some(acc << 32 | u64::from(be32(b, (first + i) * 4)?))
    })
}

fn cstr(b: &[u8]) -> Option<&[u8]> {
    Some(&b[..b.iter().position(|&c| c == 0)?])
}
