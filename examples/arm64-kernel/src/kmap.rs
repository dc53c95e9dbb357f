//! The kernel's own address space: an identity map of RAM and the UART,
//! built with pgtable through the batched-barrier path (one lazy-MMU scope:
//! the walker barrier is issued once at the end, as in Linux "arm64: mm: Batch dsb and isb when
//! populating pgtables"), blocks
//! wherever alignment allows.

use pgtable_core::{AddressSpace, Error, MapOptions, MemType, PhysAddr, Prot, VirtAddr};

use crate::console::UART_BASE;
use crate::memory::{KernelTables, Layout};
use crate::platform::{new_mmu, Arm64, Mmu};
use crate::println;

/// The kernel's address space type.
pub type KernelSpace = AddressSpace<Arm64, Mmu, KernelTables>;

/// Kernel data: read-write, never executable, global (no ASID).
const DATA: Prot = Prot::new(Prot::WRITE | Prot::GLOBAL);
/// The kernel image: code, data and stack share its 2 MiB blocks.
const IMAGE: Prot = Prot::new(Prot::WRITE | Prot::EXEC | Prot::GLOBAL);
/// The PL011 registers.
const DEVICE: Prot = Prot::new(Prot::WRITE | Prot::GLOBAL).with_mem(MemType::Device);

fn ident(space: &mut KernelSpace, from: u64, to: u64, prot: Prot) -> Result<(), Error> {
    if to > from {
        space.map(
            VirtAddr(from),
            PhysAddr(from),
            to - from,
            prot,
            MapOptions::BLOCKS,
        )?;
    }
    Ok(())
}

/// Builds the identity map and prints what it cost.
pub fn build(l: &Layout) -> Result<KernelSpace, Error> {
    let mut space = KernelSpace::new(new_mmu(), KernelTables)?;
    space.lazy_mmu(|s| {
        s.map(
            VirtAddr(UART_BASE),
            PhysAddr(UART_BASE),
            4096,
            DEVICE,
            MapOptions::PAGES,
        )?;
        ident(s, l.ram.0, l.kernel.0, DATA)?;
        ident(s, l.kernel.0, l.kernel.1, IMAGE)?;
        ident(s, l.kernel.1, l.ram.1, DATA)
    })?;
    let st = space.stats();
    let mut blocks = [0u64; 3];
    space.walk(VirtAddr(0), 1 << 47, |m| blocks[m.height as usize] += 1)?;
    println!(
        "kernel map: {} MiB of RAM + UART: {} entries written, {} walker barriers, {} tables; leaves: {} x 1 GiB, {} x 2 MiB, {} x 4 KiB",
        (l.ram.1 - l.ram.0) >> 20,
        st.entries_written(),
        st.barriers(),
        st.tables_allocated(),
        blocks[2],
        blocks[1],
        blocks[0]
    );
    Ok(space)
}
