//! `AddressSpace::ptdump` on the RISC-V formats: kernel leaves created
//! accessed (and dirty when writable, as Linux's `PAGE_KERNEL`), user
//! writable leaves clean until the hart sets D, G, Svpbmt memory types, a
//! gigapage in the Sv39 root, the upper half and software entries.

use pgtable_core::contract::NewPte;
use pgtable_core::contract::{Arch, Arena, NoopMmu};
use pgtable_core::sim::{Installed, SimMachine};
use pgtable_core::{AddressSpace, MapOptions, MemType, PhysAddr, Prot, VaRange, VirtAddr};
use pgtable_riscv::{RiscvPaging, Sv57, SVPBMT};

type Sv39P = RiscvPaging<3, SVPBMT>;

const K4: u64 = 4096;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;

fn space<A: Arch>(range: VaRange) -> AddressSpace<A, NoopMmu, Arena> {
    AddressSpace::new_in(range, NoopMmu, Arena::new()).expect("root")
}

fn lines<A: Arch>(s: &AddressSpace<A, NoopMmu, Arena>) -> Vec<String> {
    s.ptdump().to_string().lines().map(String::from).collect()
}

#[test]
fn ptdump_sv39_kernel_half_with_a_gigapage_and_memory_types() {
    let mut k = space::<Sv39P>(VaRange::Upper);
    let data = Prot::WRITE | Prot::GLOBAL;
    let o = MapOptions::BLOCKS;
    // The Sv39 upper half starts at -2^38; a 1 GiB gigapage sits in the
    // root, then two 2 MiB megapages.
    let base = 0xffff_ffc0_0000_0000;
    k.map(VirtAddr(base), PhysAddr(0x8000_0000), G1 + 2 * M2, data, o)
        .expect("linear map");
    let mmio = data.with_mem(MemType::Device);
    let nc = Prot::READ_WRITE.with_mem(MemType::NormalNonCacheable);
    k.map(VirtAddr(base + 2 * G1), PhysAddr(0x1000_0000), K4, mmio, o)
        .expect("uart");
    k.map(
        VirtAddr(base + 2 * G1 + K4),
        PhysAddr(0x2000_0000),
        K4,
        nc,
        o,
    )
    .expect("nc");
    let got = lines(&k);
    assert_eq!(got.len(), 4, "{got:#?}");
    assert!(got[0].starts_with("0xffffffc000000000-0xffffffc040000000     1G      1 x "));
    assert!(got[1].starts_with("0xffffffc040000000-0xffffffc040400000     4M      2 x "));
    assert!(got[2].starts_with("0xffffffc080000000-0xffffffc080001000     4K      1 x "));
    assert!(got[3].starts_with("0xffffffc080001000-0xffffffc080002000     4K      1 x "));
    for l in &got[..2] {
        assert!(l.contains(" G A D "), "{l}");
    }
    assert!(got[2].contains(" G A D DEV"), "{}", got[2]);
    assert!(got[3].contains(" nG A D NC"), "{}", got[3]);
}

#[test]
fn ptdump_user_pages_get_accessed_and_dirty_from_the_hart() {
    let m = SimMachine::<Sv39P>::new();
    let s = AddressSpace::<Sv39P, _, _>::new(m.mmu(), m.alloc()).expect("root");
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
    m.hw_touch(VirtAddr(va + K4), true).expect("store");
    let got: Vec<String> = s.ptdump().to_string().lines().map(String::from).collect();
    // New user leaves are accessed and clean; the store made one dirty.
    assert_eq!(got.len(), 3, "{got:#?}");
    assert!(got[0].contains(" U nG A   WB"), "{}", got[0]);
    assert!(got[1].contains(" U nG A D WB"), "{}", got[1]);
    assert!(got[2].starts_with("0x0000000000402000-0x0000000000404000     8K      2 x "));
    assert!(got[2].contains(" U nG A   WB"), "{}", got[2]);
}

#[test]
fn ptdump_sv57_upper_half_and_software_entries() {
    let mut s = space::<Sv57>(VaRange::Both);
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
    let got = lines(&s);
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(got[0].starts_with("0xff00000000000000-0xff00000000200000     2M      1 x PMD 2M"));
    assert_eq!(
        got[1],
        "0xff00000000200000-0xff00000000202000     8K      2 x PTE 4K    swap 0x100-0x101"
    );
}
