//! `AddressSpace::ptdump` on the arm64 formats: the attributes as the
//! VMSAv8-64 descriptors hold them (AF set on every leaf, kernel writable
//! leaves created dirty, user writable leaves clean until a store, nG,
//! MAIR memory types), the kernel half through TTBR1_EL1, the 39-bit
//! format's root blocks and software entries.

use pgtable_arm64::{Arm64, Arm64Va39};
use pgtable_core::contract::NewPte;
use pgtable_core::contract::{Arch, Arena, NoopMmu};
use pgtable_core::sim::{Installed, SimMachine};
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VaRange, VirtAddr};

const K4: u64 = 4096;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

fn space<A: Arch>(range: VaRange) -> AddressSpace<A, NoopMmu, Arena> {
    AddressSpace::new_in(range, NoopMmu, Arena::new()).expect("root")
}

#[test]
fn ptdump_arm64_kernel_half_like_linux_kernel_map() {
    let mut k = space::<Arm64>(VaRange::Upper);
    let text = Prot::EXEC | Prot::GLOBAL;
    let rodata = Prot::GLOBAL;
    let data = Prot::WRITE | Prot::GLOBAL;
    let device = data.with_mem(MemType::Device);
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    // The linear map at the bottom of TTBR1's range: a 1 GiB block and
    // two 2 MiB blocks, physically contiguous.
    let linear = 0xffff_0000_0000_0000;
    let o = MapOptions::BLOCKS;
    k.map(
        VirtAddr(linear),
        PhysAddr(0x4000_0000),
        G1 + 2 * M2,
        data,
        o,
    )
    .expect("linear");
    // An image: text, rodata, data pages, physically contiguous.
    let img = 0xffff_8000_1000_0000;
    let mut pa = 0x4100_0000;
    for (pages, prot) in [(3, text), (2, rodata), (4, data)] {
        k.map(
            VirtAddr(img + (pa - 0x4100_0000)),
            PhysAddr(pa),
            pages * K4,
            prot,
            MapOptions::PAGES,
        )
        .expect("image");
        pa += pages * K4;
    }
    k.map(
        VirtAddr(0xffff_fe00_0000_0000),
        PhysAddr(0x0900_0000),
        K4,
        device,
        o,
    )
    .expect("uart");
    k.map(
        VirtAddr(0xffff_fe00_0000_1000),
        PhysAddr(0x1000_0000),
        K4,
        nc,
        o,
    )
    .expect("nc");
    let markers = [
        (VirtAddr(linear), "linear map"),
        (VirtAddr(img), "kernel image"),
    ];
    assert_eq!(
        k.ptdump()
            .markers(&markers)
            .to_string()
            .lines()
            .collect::<Vec<_>>(),
        [
            "---[ linear map ]---",
            "0xffff000000000000-0xffff000040000000     1G      1 x PUD 1G    RW NX K  G A D WB",
            "0xffff000040000000-0xffff000040400000     4M      2 x PMD 2M    RW NX K  G A D WB",
            "---[ kernel image ]---",
            "0xffff800010000000-0xffff800010003000    12K      3 x PTE 4K    ro x  K  G A   WB",
            "0xffff800010003000-0xffff800010005000     8K      2 x PTE 4K    ro NX K  G A   WB",
            "0xffff800010005000-0xffff800010009000    16K      4 x PTE 4K    RW NX K  G A D WB",
            "0xfffffe0000000000-0xfffffe0000001000     4K      1 x PTE 4K    RW NX K  G A D DEV",
            "0xfffffe0000001000-0xfffffe0000002000     4K      1 x PTE 4K    RW NX K nG A D NC",
        ]
    );
}

#[test]
fn ptdump_arm64_user_pages_are_clean_until_a_store() {
    let m = SimMachine::<Arm64>::new();
    let mmu = m.mmu_installing_into(VaRange::Lower);
    let s = AddressSpace::<Arm64, _, _>::new_in(VaRange::Lower, mmu, m.alloc()).expect("root");
    // SAFETY: a `SimMmu`: only the simulated walker uses these tables.
    let mut s = unsafe { Installed::new(s) };
    let va = 0x40_0000;
    let rw = Prot::WRITE | Prot::USER;
    let rx = Prot::EXEC | Prot::USER;
    s.map(
        VirtAddr(va),
        PhysAddr(0x8000_0000),
        4 * K4,
        rw,
        MapOptions::PAGES,
    )
    .expect("map");
    s.map(
        VirtAddr(va + 4 * K4),
        PhysAddr(0x8000_4000),
        K4,
        rx,
        MapOptions::PAGES,
    )
    .expect("map");
    m.hw_touch(VirtAddr(va + K4), true).expect("store");
    let before = s.inspect().entry(VirtAddr(va + K4), 0);
    assert_eq!(
        s.ptdump().to_string().lines().collect::<Vec<_>>(),
        [
            "0x0000000000400000-0x0000000000401000     4K      1 x PTE 4K    RW NX U nG A   WB",
            "0x0000000000401000-0x0000000000402000     4K      1 x PTE 4K    RW NX U nG A D WB",
            "0x0000000000402000-0x0000000000404000     8K      2 x PTE 4K    RW NX U nG A   WB",
            "0x0000000000404000-0x0000000000405000     4K      1 x PTE 4K    ro x  U nG A   WB",
        ]
    );
    assert_eq!(
        s.inspect().entry(VirtAddr(va + K4), 0),
        before,
        "the dump wrote an entry"
    );
}

#[test]
fn ptdump_arm64_va39_root_blocks_and_software_entries() {
    let mut s = space::<Arm64Va39>(VaRange::Lower);
    // With 39-bit VAs the root is the L1 table: its 1 GiB blocks are PGD entries.
    s.map(
        VirtAddr(G1),
        PhysAddr(G1),
        2 * G1,
        Prot::READ_WRITE,
        MapOptions::BLOCKS,
    )
    .expect("map");
    for (i, v) in (0u64..).zip([5, 6, 7]) {
        s.install_pte(VirtAddr(3 * G1 + i * K4), NewPte::Swap(v))
            .expect("swap entry");
    }
    assert_eq!(
        s.ptdump().to_string(),
        "0x0000000040000000-0x00000000c0000000     2G      2 x PGD 1G    RW NX K nG A D WB\n\
         0x00000000c0000000-0x00000000c0003000    12K      3 x PTE 4K    swap 0x5-0x7\n"
    );
}
