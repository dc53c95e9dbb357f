//! `AddressSpace::ptdump` on the x86 formats: kernel leaves created
//! accessed (and dirty when writable, as Linux's `_PAGE_KERNEL`), user
//! leaves neither until the processor sets them, G, PAT memory types, the
//! upper half of 4- and 5-level paging, 1 GiB pages and software entries.

use pgtable_core::contract::NewPte;
use pgtable_core::contract::{Arch, Arena, NoopMmu};
use pgtable_core::sim::{Installed, SimMachine};
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VaRange, VirtAddr};
use pgtable_x86::{X86_64La57, X86_64};

const K4: u64 = 4096;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

fn space<A: Arch>(range: VaRange) -> AddressSpace<A, NoopMmu, Arena> {
    AddressSpace::new_in(range, NoopMmu, Arena::new()).expect("root")
}

#[test]
fn ptdump_x86_kernel_half_like_linux_kernel_map() {
    let mut k = space::<X86_64>(VaRange::Upper);
    let text = Prot::EXEC | Prot::GLOBAL;
    let data = Prot::WRITE | Prot::GLOBAL;
    let o = MapOptions::BLOCKS;
    // The direct map: a 1 GiB page and two 2 MiB pages, contiguous.
    let direct = 0xffff_8880_0000_0000;
    k.map(VirtAddr(direct), PhysAddr(0), G1 + 2 * M2, data, o)
        .expect("direct map");
    // The image at -2 GiB: text then data, contiguous.
    let img = 0xffff_ffff_8000_0000;
    k.map(VirtAddr(img), PhysAddr(0x100_0000), 2 * M2, text, o)
        .expect("text");
    k.map(
        VirtAddr(img + 2 * M2),
        PhysAddr(0x140_0000),
        3 * K4,
        data,
        o,
    )
    .expect("data");
    let mmio = data.with_mem(MemType::Device);
    let wc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    k.map(
        VirtAddr(0xffff_c900_0000_0000),
        PhysAddr(0xfee0_0000),
        K4,
        mmio,
        o,
    )
    .expect("apic");
    k.map(
        VirtAddr(0xffff_c900_0000_1000),
        PhysAddr(0xfd00_0000),
        K4,
        wc,
        o,
    )
    .expect("nc");
    assert_eq!(
        k.ptdump().to_string().lines().collect::<Vec<_>>(),
        [
            "0xffff888000000000-0xffff888040000000     1G      1 x PUD 1G    RW NX K  G A D WB",
            "0xffff888040000000-0xffff888040400000     4M      2 x PMD 2M    RW NX K  G A D WB",
            "0xffffc90000000000-0xffffc90000001000     4K      1 x PTE 4K    RW NX K  G A D DEV",
            "0xffffc90000001000-0xffffc90000002000     4K      1 x PTE 4K    RW NX K nG A D NC",
            "0xffffffff80000000-0xffffffff80400000     4M      2 x PMD 2M    ro x  K  G A   WB",
            "0xffffffff80400000-0xffffffff80403000    12K      3 x PTE 4K    RW NX K  G A D WB",
        ]
    );
}

#[test]
fn ptdump_x86_user_pages_get_accessed_and_dirty_from_the_processor() {
    let m = SimMachine::<X86_64>::new();
    let s = AddressSpace::<X86_64, _, _>::new(m.mmu(), m.alloc()).expect("root");
    // SAFETY: a `SimMmu`: only the simulated walker uses these tables.
    let mut s = unsafe { Installed::new(s) };
    let va = 0x40_0000;
    let rw = Prot::WRITE | Prot::USER;
    s.map(
        VirtAddr(va),
        PhysAddr(0x8000_0000),
        4 * K4,
        rw,
        MapOptions::PAGES,
    )
    .expect("map");
    m.hw_touch(VirtAddr(va), false).expect("load");
    m.hw_touch(VirtAddr(va + K4), true).expect("store");
    let before = s.inspect().entry(VirtAddr(va), 0);
    assert_eq!(
        s.ptdump().to_string().lines().collect::<Vec<_>>(),
        [
            "0x0000000000400000-0x0000000000401000     4K      1 x PTE 4K    RW NX U nG A   WB",
            "0x0000000000401000-0x0000000000402000     4K      1 x PTE 4K    RW NX U nG A D WB",
            "0x0000000000402000-0x0000000000404000     8K      2 x PTE 4K    RW NX U nG     WB",
        ]
    );
    // Reading cleared no accessed bit.
    assert_eq!(s.inspect().entry(VirtAddr(va), 0), before);
}

#[test]
fn ptdump_x86_la57_upper_half_and_software_entries() {
    let mut s = space::<X86_64La57>(VaRange::Both);
    // The 5-level upper half starts at -2^56.
    let base = 0xff00_0000_0000_0000;
    s.map(
        VirtAddr(base),
        PhysAddr(0),
        M2,
        Prot::READ_ONLY,
        MapOptions::BLOCKS,
    )
    .expect("map");
    for (i, v) in (0u64..).zip([0x100, 0x101]) {
        s.install_pte(VirtAddr(base + M2 + i * K4), NewPte::Swap(v))
            .expect("swap entry");
    }
    assert_eq!(
        s.ptdump().to_string(),
        "0xff00000000000000-0xff00000000200000     2M      1 x PMD 2M    ro NX K nG A   WB\n\
         0xff00000000200000-0xff00000000202000     8K      2 x PTE 4K    swap 0x100-0x101\n"
    );
}
