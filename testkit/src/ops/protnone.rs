//! `Prot::NONE` (Linux `PROT_NONE`): present for software, invalid for the
//! hardware. Every access faults and nothing is cached, while `ptep_get`,
//! `translate` and `walk` still report the frame, and `change_protection`
//! turns it back into an accessible mapping of the same frame.

use pgtable_core::contract::{level, Access, Arch, Decoded};
use pgtable_core::sim::{SimFaultKind, SimMachine};
use pgtable_core::{
    AddressSpace, CopyMode, Error, LiveOptions, MapOptions, MemType, MoveOptions, PhysAddr, Prot,
    VirtAddr,
};

use super::{map, setup, Space, K4, KRW, M2, PA, URW, VA};

/// Every kind of access: kernel and user loads, stores and fetches.
const ACCESSES: [Access; 6] = [
    Access::READ,
    Access::WRITE,
    Access::EXEC,
    Access {
        write: false,
        exec: false,
        user: true,
    },
    Access {
        write: true,
        exec: false,
        user: true,
    },
    Access {
        write: false,
        exec: true,
        user: true,
    },
];

/// Every access to `va` is a translation fault and leaves no TLB entry;
/// `ptep_get`, `translate` and `walk` report the leaf with frame `pa` and
/// protection `Prot::NONE`.
fn assert_prot_none<A: Arch>(m: &SimMachine<A>, s: &Space<A>, va: u64, pa: u64) {
    let v = VirtAddr(va);
    for acc in ACCESSES {
        let f = m.access(v, acc).unwrap_err();
        assert!(
            matches!(f.kind, SimFaultKind::Translation { .. }),
            "{acc:?} at {v}: {f:?}"
        );
    }
    assert!(!m.tlb_holds(v), "a PROT_NONE entry was cached");
    let e = s.ptep_get(v).unwrap();
    assert!(e.is_present());
    assert_eq!(e.prot(), Some(Prot::NONE));
    assert_eq!(e.swap_value(), None);
    let base = e.va().0;
    assert_eq!(e.pa(), Some(PhysAddr(pa - (va - base))));
    let t = s.translate(v).unwrap();
    assert_eq!((t.pa, t.prot), (PhysAddr(pa), Prot::NONE));
    let mut seen = Vec::new();
    s.walk(v, K4, |mp| seen.push((mp.pa.0 + (va - mp.va.0), mp.prot)))
        .unwrap();
    assert_eq!(seen, [(pa, Prot::NONE)]);
}

/// `mprotect(PROT_NONE)` of pages and of one page of a 2 MiB block, then
/// back: the old translations are flushed (the simulator finds no stale
/// entry), every access faults, the entries keep their frames, and the
/// change back reaches the same data.
pub fn prot_none_faults_every_access_and_keeps_its_frame<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, URW, MapOptions::PAGES);
    let block = A::leaf_allowed(1);
    if block {
        map(&mut s, 2 * M2, M2, URW, MapOptions::PMD_BLOCKS);
    }
    let pages = [VA + K4, VA + 3 * K4];
    let in_block = VA + 2 * M2 + 5 * K4;
    for (i, &va) in pages.iter().enumerate() {
        m.write_u64(VirtAddr(va), 0x100 + i as u64).unwrap();
    }
    if block {
        m.write_u64(VirtAddr(in_block), 0x200).unwrap();
    }
    s.change_protection(VirtAddr(VA), 4 * K4, Prot::NONE)
        .unwrap();
    if block {
        s.change_protection(VirtAddr(in_block), K4, Prot::NONE)
            .unwrap();
    }
    m.check().unwrap();
    for va in pages {
        assert_prot_none(&m, &s, va, PA + (va - VA));
    }
    if block {
        assert_prot_none(&m, &s, in_block, PA + (in_block - VA));
        // The rest of the block is split off with its rights.
        assert_eq!(m.read_u64(VirtAddr(in_block + K4)).unwrap(), 0);
        m.write_u64(VirtAddr(in_block - K4), 7).unwrap();
    }
    // Back: the same frames, the same data.
    s.change_protection(VirtAddr(VA), 4 * K4, URW).unwrap();
    if block {
        s.change_protection(VirtAddr(in_block), K4, URW).unwrap();
        assert_eq!(m.read_u64(VirtAddr(in_block)).unwrap(), 0x200);
    }
    for (i, &va) in pages.iter().enumerate() {
        assert_eq!(m.read_u64(VirtAddr(va)).unwrap(), 0x100 + i as u64);
        assert_eq!(s.ptep_get(VirtAddr(va)).unwrap().prot(), Some(URW));
    }
    m.check().unwrap();
}

/// A mapping made `Prot::NONE` from the start (folded into contiguous runs
/// where the format has them) faults until a change makes part of it
/// accessible; unmap clears it like any leaf.
pub fn map_prot_none_then_open_part_then_unmap<A: Arch>() {
    let (m, mut s) = setup::<A>();
    let len = 32 * K4;
    map(&mut s, 0, len, Prot::NONE, MapOptions::PAGES);
    m.check().unwrap();
    for i in [0, 5, 16, 31] {
        assert_prot_none(&m, &s, VA + i * K4, PA + i * K4);
    }
    // One page open: a partial change of a run unfolds it.
    s.change_protection(VirtAddr(VA + 5 * K4), K4, KRW).unwrap();
    m.check().unwrap();
    m.write_u64(VirtAddr(VA + 5 * K4), 9).unwrap();
    assert_eq!(m.phys_read_u64(PhysAddr(PA + 5 * K4)), 9);
    for i in [4, 6, 20] {
        assert_prot_none(&m, &s, VA + i * K4, PA + i * K4);
    }
    // All open.
    s.change_protection(VirtAddr(VA), len, KRW).unwrap();
    m.check().unwrap();
    for i in 0..32 {
        m.write_u64(VirtAddr(VA + i * K4), i).unwrap();
    }
    // And all closed again: nothing stale after the flush.
    s.change_protection(VirtAddr(VA), len, Prot::NONE).unwrap();
    m.check().unwrap();
    assert_prot_none(&m, &s, VA + 7 * K4, PA + 7 * K4);
    s.unmap(VirtAddr(VA), len).unwrap();
    m.check().unwrap();
    assert!(s.ptep_get(VirtAddr(VA + 7 * K4)).is_none());
    assert!(s.translate(VirtAddr(VA + 7 * K4)).is_none());
}

/// `change_protection_live` closes kernel pages to `Prot::NONE` and opens
/// them again: no break-before-make is asked for (the entry becomes
/// invalid for the hardware, or was), and nothing stays cached.
pub fn live_change_to_prot_none_and_back<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 4 * K4, KRW, MapOptions::PAGES);
    m.write_u64(VirtAddr(VA + 2 * K4), 5).unwrap();
    s.change_protection_live(VirtAddr(VA), 4 * K4, Prot::NONE, LiveOptions::IN_PLACE)
        .unwrap();
    m.check().unwrap();
    assert_prot_none(&m, &s, VA + 2 * K4, PA + 2 * K4);
    s.change_protection_live(VirtAddr(VA), 4 * K4, KRW, LiveOptions::IN_PLACE)
        .unwrap();
    m.check().unwrap();
    assert_eq!(m.read_u64(VirtAddr(VA + 2 * K4)).unwrap(), 5);
}

/// The encoding at every leaf height: a `Prot::NONE` leaf decodes as a
/// leaf with its address, is invalid for the hardware, reports
/// `Prot::NONE` whatever rights it was built with, is never a software
/// entry, and software entries are never `Prot::NONE` leaves;
/// `modify_prot` goes to `NONE` and back keeping the address.
pub fn prot_none_encoding_is_a_leaf_and_never_a_software_entry<A: Arch>() {
    for h in (0..A::LEVELS).filter(|&h| A::leaf_allowed(h)) {
        let pa = PhysAddr(level::size::<A>(h));
        for p in [Prot::NONE, Prot::NONE | URW | Prot::EXEC | Prot::GLOBAL] {
            let raw = A::leaf(pa, p, h);
            assert_eq!(A::decode(raw, h), Decoded::Leaf(pa), "{p:?} h{h} {raw:#x}");
            assert!(A::is_protnone(raw, h));
            assert_eq!(A::leaf_prot(raw, h), Prot::NONE);
            assert_eq!(A::swp_value(raw), None);
        }
        let dev = A::leaf(pa, Prot::NONE.with_mem(MemType::Device), h);
        assert!(A::leaf_prot(dev, h).protnone());
        let open = A::leaf(pa, URW, h);
        assert!(!A::is_protnone(open, h));
        let closed = A::modify_prot(open, Prot::NONE, h);
        assert_eq!(A::decode(closed, h), Decoded::Leaf(pa));
        assert!(A::is_protnone(closed, h));
        let back = A::modify_prot(closed, KRW, h);
        assert_eq!(A::decode(back, h), Decoded::Leaf(pa));
        assert!(!A::is_protnone(back, h));
        assert_eq!(A::leaf_prot(back, h), KRW);
    }
    if A::SWP_VALUE_BITS == 0 {
        return;
    }
    let top = (1u64 << A::SWP_VALUE_BITS) - 1;
    for v in [0, 1, 0x1234, top >> 1, top] {
        let e = A::swp_entry(v).unwrap();
        for h in 0..A::LEVELS {
            assert_eq!(A::decode(e, h), Decoded::Invalid, "swap {v:#x} h{h}");
        }
    }
}

/// Mapping `Prot::NONE` over an existing mapping is refused like any map.
pub fn map_prot_none_over_a_mapping_is_refused<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, K4, Prot::NONE, MapOptions::PAGES);
    assert_eq!(
        s.map(VirtAddr(VA), PhysAddr(PA), K4, KRW, MapOptions::PAGES),
        Err(Error::AlreadyMapped(VirtAddr(VA)))
    );
    assert_prot_none(&m, &s, VA, PA);
}

/// A `Prot::NONE` page is a mapping for fork and mremap too: the child of
/// a copy-on-write fork gets it with its frame (still `NONE`), and a move
/// carries it to the new address, where it still faults; opening the
/// moved page reaches the same data.
pub fn prot_none_survives_fork_and_move<A: Arch>() {
    let (m, mut s) = setup::<A>();
    map(&mut s, 0, 2 * K4, URW, MapOptions::PAGES);
    m.write_u64(VirtAddr(VA + K4), 0x77).unwrap();
    s.change_protection(VirtAddr(VA), 2 * K4, Prot::NONE)
        .unwrap();
    let mut child = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    s.copy_page_range(&mut child, VirtAddr(VA), 2 * K4, CopyMode::Cow, |_| {})
        .unwrap();
    let e = child.ptep_get(VirtAddr(VA + K4)).unwrap();
    assert_eq!(
        (e.prot(), e.pa()),
        (Some(Prot::NONE), Some(PhysAddr(PA + K4)))
    );
    assert_prot_none(&m, &s, VA + K4, PA + K4);
    let new = VA + 3 * M2;
    s.move_page_tables(VirtAddr(VA), VirtAddr(new), 2 * K4, MoveOptions::DEFAULT)
        .unwrap();
    m.check().unwrap();
    assert!(s.ptep_get(VirtAddr(VA + K4)).is_none());
    assert_prot_none(&m, &s, new + K4, PA + K4);
    s.change_protection(VirtAddr(new), 2 * K4, URW).unwrap();
    assert_eq!(m.read_u64(VirtAddr(new + K4)).unwrap(), 0x77);
    m.check().unwrap();
}
