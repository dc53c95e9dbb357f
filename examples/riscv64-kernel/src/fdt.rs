//! Just enough of a flattened device tree (devicetree specification
//! v0.4, chapter 5, "Flattened Devicetree (DTB) Format") to find the RAM
//! (the first `reg` of the `/memory` node, two address and two size
//! cells as on QEMU virt), the command line (`/chosen/bootargs`, what
//! QEMU's `-append` sets) and the first hart's ISA string (`riscv,isa` of
//! the first `/cpus/cpu@N`, e.g. `rv64imafdch_svinval_…`; QEMU lists the
//! multi-letter extensions it was given with `-cpu rv64,svinval=on`).

/// FDT header magic (big-endian 0xd00dfeed).
const MAGIC: u32 = 0xd00d_feed;
const BEGIN_NODE: u32 = 1;
const END_NODE: u32 = 2;
const PROP: u32 = 3;
const NOP: u32 = 4;

/// What the kernel takes from the tree.
#[derive(Clone, Copy, Debug, Default)]
pub struct BootInfo {
    /// First byte of RAM and its length.
    pub ram: (u64, u64),
    /// The command line (empty without one).
    pub bootargs: &'static str,
    /// The first hart's `riscv,isa` (empty without one).
    pub isa: &'static str,
}

impl BootInfo {
    /// Whether the ISA string names the multi-letter extension `ext`
    /// (lower case, e.g. `"svinval"`).
    pub fn has_extension(&self, ext: &str) -> bool {
        self.isa.split('_').skip(1).any(|e| e == ext)
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The NUL-terminated string at `at`.
fn cstr(b: &[u8], at: usize) -> Option<&[u8]> {
    let rest = b.get(at..)?;
    Some(&rest[..rest.iter().position(|&c| c == 0)?])
}

/// Reads the tree at `addr`; `None` without a valid header.
///
/// # Safety
///
/// `addr` is readable for 40 bytes and, when they hold the magic, for the
/// header's `totalsize`, and stays unchanged while the result is used
/// (`bootargs` and `isa` point into it: copy or use them before the
/// memory is reused).
pub unsafe fn read(addr: u64) -> Option<BootInfo> {
    let p = addr as *const u8;
    // SAFETY: 40 readable bytes (our caller's promise).
    let header = unsafe { core::slice::from_raw_parts(p, 40) };
    if be32(header, 0)? != MAGIC {
        return None;
    }
    let size = be32(header, 4)? as usize;
    // SAFETY: `totalsize` readable bytes (our caller's promise).
    let b: &'static [u8] = unsafe { core::slice::from_raw_parts(p, size) };
    let structs = be32(b, 8)? as usize;
    let strings = be32(b, 12)? as usize;
    let mut info = BootInfo::default();
    let (mut at, mut depth) = (structs, 0u32);
    // Which depth-1 node we are in: 1 `/memory`, 2 `/chosen`.
    let mut node = 0;
    loop {
        let token = be32(b, at)?;
        at += 4;
        match token {
            BEGIN_NODE => {
                let name = cstr(b, at)?;
                at = (at + name.len() + 1).next_multiple_of(4);
                depth += 1;
                if depth == 2 {
                    node = if name.starts_with(b"memory") {
                        1
                    } else if name == b"chosen" {
                        2
                    } else {
                        0
                    };
                }
            }
            END_NODE => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(info);
                }
            }
            PROP => {
                let len = be32(b, at)? as usize;
                let name = cstr(b, strings + be32(b, at + 4)? as usize)?;
                let value = at + 8;
                at = (value + len).next_multiple_of(4);
                if name == b"riscv,isa" && info.isa.is_empty() {
                    let s = cstr(b, value)?;
                    info.isa = core::str::from_utf8(s).unwrap_or("");
                }
                if depth != 2 {
                    continue;
                }
                if node == 1 && name == b"reg" && info.ram.1 == 0 && len >= 16 {
                    info.ram = (be64(b, value)?, be64(b, value + 8)?);
                } else if node == 2 && name == b"bootargs" {
                    let s = cstr(b, value)?;
                    info.bootargs = core::str::from_utf8(s).unwrap_or("");
                }
            }
            NOP => {}
            _ => return Some(info),
        }
    }
}
