//! The conformance suite's [`Machine`] on the simulator.

use std::fmt;
use std::string::String;
use std::time::Instant;
use std::vec::Vec;

use super::{CheckError, SimMachine};
use crate::contract::level;
use crate::suite::{Fault, Inconsistency, Machine};
use crate::{Arch, PhysAddr, VirtAddr};

/// Runs [`crate::suite`] on a [`SimMachine`]: accesses go through the
/// simulated TLB and walker, and after every page-table operation the suite
/// calls [`SimMachine::check`] (stale TLB entries, writes the walker cannot
/// see).
///
/// Defaults, from the format's geometry: RAM `0x4000_0000 + 4 GiB`, or
/// where a PUD entry maps more than 1 GiB (64 GiB with 16 KiB pages, 4 TiB
/// with 64 KiB pages) one PUD entry's worth at a PUD-aligned address, so
/// the PUD block cases run (the RAM is sparse: it costs only what is
/// written); a window at `1 << (VA_BITS - 3)` (inside the lower half of
/// every format, below the middle of the half) of 16 GiB or 16 PUD entries,
/// whichever is more, but at most `1 << (VA_BITS - 3)` bytes (8 PUD entries
/// with 64 KiB pages and 48 bits); execution tested, output collected in
/// [`lines`](Self::lines) and echoed to stdout (which the test harness
/// shows for failing tests).
pub struct SimSuiteMachine<A: Arch> {
    machine: SimMachine<A>,
    ram: (PhysAddr, u64),
    window: (VirtAddr, u64),
    lines: Vec<String>,
    echo: bool,
    start: Instant,
}

impl<A: Arch> SimSuiteMachine<A> {
    /// The suite's machine on `machine` (whose MMU must have the suite's
    /// address space installed).
    pub fn new(machine: SimMachine<A>) -> Self {
        let pud = level::size::<A>(2);
        let ram = if A::LEVELS >= 3 && pud > 1 << 30 {
            (PhysAddr(pud), pud.max(4 << 30))
        } else {
            (PhysAddr(0x4000_0000), 4 << 30)
        };
        let base = 1u64 << (A::VA_BITS - 3);
        let window = (VirtAddr(base), (16u64 << 30).max(16 * pud).min(base));
        SimSuiteMachine {
            machine,
            ram,
            window,
            lines: Vec::new(),
            echo: true,
            start: Instant::now(),
        }
    }

    /// Uses another RAM pool.
    pub fn with_ram(mut self, base: PhysAddr, len: u64) -> Self {
        self.ram = (base, len);
        self
    }

    /// Uses another window.
    pub fn with_window(mut self, base: VirtAddr, len: u64) -> Self {
        self.window = (base, len);
        self
    }

    /// Whether printed lines also go to stdout.
    pub fn with_echo(mut self, echo: bool) -> Self {
        self.echo = echo;
        self
    }

    /// Every line the suite printed.
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The lines that report a failed case.
    pub fn failures(&self) -> impl Iterator<Item = &str> {
        self.lines
            .iter()
            .map(|l| l.as_str())
            .filter(|l| l.starts_with("FAIL"))
    }

    /// The simulated machine.
    pub fn machine(&self) -> &SimMachine<A> {
        &self.machine
    }
}

impl<A: Arch> Machine for SimSuiteMachine<A> {
    fn read_u64(&mut self, va: VirtAddr) -> Result<u64, Fault> {
        self.machine.read_u64(va).map_err(|f| Fault {
            va: f.va,
            write: false,
        })
    }

    fn write_u64(&mut self, va: VirtAddr, val: u64) -> Result<(), Fault> {
        self.machine.write_u64(va, val).map_err(|f| Fault {
            va: f.va,
            write: true,
        })
    }

    fn exec_faults(&mut self, va: VirtAddr) -> Option<bool> {
        Some(self.machine.exec(va).is_err())
    }

    fn cycles(&mut self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn cycle_hz(&self) -> Option<u64> {
        Some(1_000_000_000)
    }

    fn emulated(&self) -> bool {
        true
    }

    fn print(&mut self, args: fmt::Arguments) {
        let line = std::format!("{args}");
        if self.echo {
            std::println!("{line}");
        }
        self.lines.push(line);
    }

    fn ram(&self) -> (PhysAddr, u64) {
        self.ram
    }

    fn window(&self) -> (VirtAddr, u64) {
        self.window
    }

    fn check_consistency(&mut self) -> Result<(), Inconsistency> {
        match self.machine.check() {
            Ok(()) => Ok(()),
            Err(CheckError::Stale(s)) => Err(Inconsistency {
                va: s.va,
                what: if s.leaf {
                    "stale TLB entry (missing TLB flush)"
                } else {
                    "stale walk-cache entry (missing non-last-level TLB flush)"
                },
            }),
            Err(CheckError::Pending(p)) => Err(Inconsistency {
                va: VirtAddr(p.slot),
                what: "missing barrier: a table write is not visible to the walker; entry at host address",
            }),
            Err(CheckError::Conflict(c)) => Err(Inconsistency {
                va: c.va,
                what: "break-before-make violated: a live entry replaced while its old translation was cached",
            }),
            Err(CheckError::MixedSizes(m)) => Err(Inconsistency {
                va: m.va,
                what: "mixed page sizes: an entry under a split block changed before the block's translation was flushed",
            }),
            Err(CheckError::Contiguous(c)) => Err(Inconsistency {
                va: c.va,
                what: "contiguous run misprogrammed: its entries disagree while the hint is set",
            }),
            Err(CheckError::UnknownTable(u)) => Err(Inconsistency {
                va: VirtAddr(u.pa.0),
                what: "a table frame no allocator of the simulated machine handed out; physical address",
            }),
            Err(CheckError::Unordered(u)) => Err(Inconsistency {
                va: VirtAddr(u.slot),
                what: "table linked before its contents were published; entry at host address",
            }),
            Err(CheckError::HwDecode(d)) => Err(Inconsistency {
                va: d.va,
                what: "an entry the format encodes differently from what the hardware decoder reads",
            }),
        }
    }
}
