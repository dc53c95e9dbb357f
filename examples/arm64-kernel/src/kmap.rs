//! The kernel's own address space, in the upper half (TTBR1_EL1), built
//! with pgtable through the batched-barrier path (one lazy-MMU scope: the
//! walker barrier is issued once at the end, as in Linux "arm64: mm: Batch
//! dsb and isb when populating pgtables"), blocks wherever alignment
//! allows, and aligned runs of 16 pages or 16 blocks folded with the
//! contiguous hint (except the image's rodata and data; see [`UNFOLDED`]).
//!
//! W^X, as Linux maps its image (`map_kernel_segment`) and its linear map:
//!
//! | region | virtual | permissions |
//! |---|---|---|
//! | text | image `[__text_start, __text_end)` | read, execute (EL1 only) |
//! | rodata | image `[__rodata_start, __rodata_end)` | read, execute-never |
//! | data, bss | image `[__data_start, __stack_guard)` | read-write, execute-never |
//! | guard | 64 KiB below the stack | unmapped |
//! | stack | image `[__stack_bottom, __stack_top)` | read-write, execute-never |
//! | linear map | `PAGE_OFFSET + pa` for all RAM | read-write, execute-never |
//! | linear alias of the boot code, text and rodata | | read-only, execute-never (Linux `mark_linear_text_alias_ro`) |
//! | UART | `DEVICE_OFFSET + 0x0900_0000` | Device-nGnRE, read-write, execute-never |
//!
//! Every mapping is global and inaccessible from EL0 (no `Prot::USER`);
//! pgtable sets UXN on every kernel leaf and PXN on every one without
//! `Prot::EXEC`.

use pgtable_core::contract::level;
use pgtable_core::{AddressSpace, Error, MapOptions, MemType, PhysAddr, Prot, VirtAddr};

use crate::boot;
use crate::console::{UART_BASE, UART_VA};
use crate::geom::{self, PAGE, PMD_SIZE};
use crate::memory::{
    kimage_to_phys, phys_to_virt, KernelTables, Layout, KERNEL_VA_END, PAGE_OFFSET,
};
use crate::platform::{kernel_mmu, Arm64, Mmu};
use crate::println;

/// The kernel's address space type (and of the lower-half spaces, which
/// use the same format, MMU type and allocator).
pub type KernelSpace = AddressSpace<Arm64, Mmu, KernelTables>;

/// Kernel text: read and execute, global.
const TEXT: Prot = Prot::EXEC.union(Prot::GLOBAL);
/// Kernel rodata (and the linear alias of the image's code): read-only.
pub(crate) const RODATA: Prot = Prot::GLOBAL;
/// Kernel data, bss, stack, the linear map: read-write, never executable.
pub(crate) const DATA: Prot = Prot::WRITE.union(Prot::GLOBAL);
/// The PL011 registers.
const DEVICE: Prot = Prot::WRITE.union(Prot::GLOBAL).with_mem(MemType::Device);

extern "C" {
    static __text_start: u8;
    static __text_end: u8;
    static __rodata_start: u8;
    static __rodata_end: u8;
    static __data_start: u8;
    static __stack_guard: u8;
    static __stack_bottom: u8;
    static __stack_top: u8;
}

/// The image's sections (virtual addresses, 64 KiB aligned by link.ld).
#[derive(Clone, Copy, Debug)]
pub struct Image {
    /// `.text`.
    pub text: (u64, u64),
    /// `.rodata`.
    pub rodata: (u64, u64),
    /// `.data` and `.bss`.
    pub data: (u64, u64),
    /// The guard below the stack (unmapped, 64 KiB).
    pub guard: (u64, u64),
    /// The boot stack.
    pub stack: (u64, u64),
    /// Physical start of the image (the boot code).
    pub start_pa: u64,
}

impl Image {
    /// The image as the linker laid it out.
    pub fn get() -> Image {
        // Linker-defined symbols: only their addresses are taken.
        let a = |s: *const u8| s as u64;
        Image {
            text: (a(&raw const __text_start), a(&raw const __text_end)),
            rodata: (a(&raw const __rodata_start), a(&raw const __rodata_end)),
            data: (a(&raw const __data_start), a(&raw const __stack_guard)),
            guard: (a(&raw const __stack_guard), a(&raw const __stack_bottom)),
            stack: (a(&raw const __stack_bottom), a(&raw const __stack_top)),
            start_pa: boot::image_start_pa(),
        }
    }

    /// Physical end of the image (of its stack).
    pub fn end_pa(&self) -> u64 {
        kimage_to_phys(self.stack.1)
    }
}

/// The image's rodata and data are mapped without the contiguous hint
/// (as Linux maps its rodata with `NO_CONT_MAPPINGS`): the kernel changes
/// single pages of them in place (`change_protection_live`, which never
/// goes through an invalid entry, so it cannot unfold a run), and unmaps
/// the secondaries' stack guard pages. Everything else, the linear map
/// included, is folded into 64 KiB runs of pages and 32 MiB runs of
/// 2 MiB blocks wherever a run is aligned and whole.
const UNFOLDED: MapOptions = MapOptions::BLOCKS.no_contiguous();

/// Maps `[from, to)` of physical memory at its linear-map address.
fn linear(space: &mut KernelSpace, from: u64, to: u64, prot: Prot) -> Result<(), Error> {
    if to > from {
        space.map(
            VirtAddr(phys_to_virt(from)),
            PhysAddr(from),
            to - from,
            prot,
            MapOptions::BLOCKS,
        )?;
    }
    Ok(())
}

/// Maps the image section `[va.0, va.1)` at its load address.
fn section(
    space: &mut KernelSpace,
    va: (u64, u64),
    prot: Prot,
    opts: MapOptions,
) -> Result<(), Error> {
    if va.1 > va.0 {
        space.map(
            VirtAddr(va.0),
            PhysAddr(kimage_to_phys(va.0)),
            va.1 - va.0,
            prot,
            opts,
        )?;
    }
    Ok(())
}

/// Builds the kernel's address space (not yet installed) and prints what
/// it holds and what it cost.
pub fn build(l: &Layout, img: &Image) -> Result<KernelSpace, Error> {
    let mut space = KernelSpace::new_kernel(kernel_mmu(), KernelTables)?;
    // The linear alias of the boot code, text and rodata is read-only.
    let ro_alias = (img.start_pa, kimage_to_phys(img.rodata.1));
    space.lazy_mmu(|s| {
        s.map(
            VirtAddr(UART_VA),
            PhysAddr(UART_BASE),
            PAGE,
            DEVICE,
            MapOptions::PAGES,
        )?;
        linear(s, l.ram.0, ro_alias.0, DATA)?;
        linear(s, ro_alias.0, ro_alias.1, RODATA)?;
        linear(s, ro_alias.1, l.ram.1, DATA)?;
        section(s, img.text, TEXT, MapOptions::BLOCKS)?;
        section(s, img.rodata, RODATA, UNFOLDED)?;
        section(s, img.data, DATA, UNFOLDED)?;
        section(s, img.stack, DATA, MapOptions::BLOCKS)
    })?;
    let st = space.stats();
    let mut blocks = [0u64; 3];
    space.walk(VirtAddr(PAGE_OFFSET), KERNEL_VA_END - PAGE_OFFSET, |m| {
        if let Some(n) = blocks.get_mut(m.height as usize) {
            *n += 1
        }
    })?;
    println!(
        "kernel map (TTBR1, {}): {} MiB of RAM + image + UART: {} entries written, {} walker barriers, {} tables; leaves: {} x {}, {} x {}, {} x {}",
        geom::NAME,
        (l.ram.1 - l.ram.0) >> 20,
        st.entries_written(),
        st.barriers(),
        st.tables_allocated(),
        blocks[2],
        Size(level::size::<Arm64>(2)),
        blocks[1],
        Size(PMD_SIZE),
        blocks[0],
        Size(PAGE)
    );
    let row = |what: &str, va: (u64, u64), pa: u64, prot: &str| {
        println!("  {what:<12} {:#x}..{:#x} -> {pa:#x}  {prot}", va.0, va.1)
    };
    row(
        "text",
        img.text,
        kimage_to_phys(img.text.0),
        "r-x EL1, global",
    );
    row(
        "rodata",
        img.rodata,
        kimage_to_phys(img.rodata.0),
        "r-- XN, global",
    );
    row(
        "data+bss",
        img.data,
        kimage_to_phys(img.data.0),
        "rw- XN, global",
    );
    row("guard", img.guard, kimage_to_phys(img.guard.0), "unmapped");
    row(
        "stack",
        img.stack,
        kimage_to_phys(img.stack.0),
        "rw- XN, global",
    );
    row(
        "linear",
        (phys_to_virt(l.ram.0), phys_to_virt(l.ram.1)),
        l.ram.0,
        "rw- XN, global",
    );
    row(
        "linear ro",
        (phys_to_virt(ro_alias.0), phys_to_virt(ro_alias.1)),
        ro_alias.0,
        "r-- XN, global (alias of boot code, text, rodata)",
    );
    row(
        "uart",
        (UART_VA, UART_VA + PAGE),
        UART_BASE,
        "rw- XN, Device-nGnRE, global",
    );
    Ok(space)
}

/// A size in bytes, printed as `4 KiB`, `32 MiB`, `64 GiB`, `4 TiB`.
#[derive(Clone, Copy)]
pub struct Size(pub u64);

impl core::fmt::Display for Size {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let units = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        for (shift, unit) in units {
            if self.0 >= 1 << shift && self.0 % (1 << shift) == 0 {
                return write!(f, "{} {unit}", self.0 >> shift);
            }
        }
        write!(f, "{} B", self.0)
    }
}
