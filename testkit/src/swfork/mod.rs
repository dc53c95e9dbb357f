//! Software entries and `copy_page_range` on the simulated machine, generic
//! over the format: the tests of pgtable-core (the test formats) and of
//! each arch crate run every case for their formats.

#![allow(dead_code)]

use pgtable_core::contract::{Arch, Decoded, NewPte, PAGE_SIZE};
use pgtable_core::sim::{Installed, SimAlloc, SimFaultKind, SimMachine, SimMmu};
use pgtable_core::{
    variants, AddressSpace, Error, MapOptions, Mapping, MoveOptions, PhysAddr, Prot, VirtAddr,
};

mod fork;

pub use fork::*;

/// An installed address space on the simulated machine.
pub type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

const K4: u64 = PAGE_SIZE;
const M2: u64 = 2 << 20;
const G1: u64 = 1 << 30;
const PA: u64 = 0x40_0000_0000;

/// A user read-write protection: created clean on every format, so the
/// hardware sets the dirty state on the first store.
pub const RW: Prot = Prot::WRITE.union(Prot::USER);
/// A user read-only protection.
pub const RO: Prot = Prot::USER;

/// A machine with an installed, empty address space.
pub fn machine<A: Arch>() -> (SimMachine<A>, Space<A>) {
    let m = SimMachine::<A>::new();
    let s = AddressSpace::new(m.mmu(), m.alloc()).expect("root");
    // SAFETY: a `SimMmu`: only the simulated walker uses these tables.
    (m.clone(), unsafe { Installed::new(s) })
}

fn flushes<A: Arch>(m: &SimMachine<A>) -> u64 {
    let s = m.stats();
    s.flush_range + s.flush_all
}

fn listing<A: Arch>(s: &Space<A>, va: u64, len: u64) -> Vec<Mapping> {
    let mut v = Vec::new();
    s.walk(VirtAddr(va), len, |m| v.push(m)).expect("walk");
    v
}

fn no_leak<A: Arch>(m: &SimMachine<A>, s: &Space<A>) {
    assert_eq!(
        m.live_tables(),
        s.inspect().count_tables(),
        "leaked or lost tables"
    );
    m.check().expect("machine check");
}

/// Everything observable about `[va, va + len)`: the leaves (raw entries
/// included), the software entries at `probes`, the table count.
fn snapshot<A: Arch>(s: &Space<A>, va: u64, len: u64, probes: &[u64]) -> String {
    let swp: Vec<_> = probes
        .iter()
        .map(|&p| s.ptep_get(VirtAddr(p)).and_then(|e| e.swap_value()))
        .collect();
    format!(
        "{:x?} {:x?} {}",
        listing(s, va, len),
        swp,
        s.inspect().count_tables()
    )
}

// ----- the format methods -----

/// Software entries round-trip, are never 0, decode as invalid at every
/// height, and are told apart from none, tables and leaves.
pub fn encoding<A: Arch>() {
    let bits = A::SWP_VALUE_BITS;
    assert!(bits > 0 && bits < 64, "{}: no software entries", A::NAME);
    let max = (1u64 << bits) - 1;
    for v in [0, 1, 2, 0x1234_5678, max >> 1, max - 1, max] {
        let e = A::swp_entry(v).expect("fits");
        assert_ne!(e, 0, "value {v:#x}");
        for h in 0..A::LEVELS {
            assert_eq!(A::decode(e, h), Decoded::Invalid, "value {v:#x} height {h}");
        }
        assert_eq!(A::swp_value(e), Some(v));
    }
    for v in [max + 1, 1 << 63, u64::MAX] {
        assert_eq!(A::swp_entry(v), None, "value {v:#x}");
    }
    assert_eq!(A::swp_value(0), None);
    for h in 0..A::LEVELS {
        if A::leaf_allowed(h) {
            for p in [RW, RO, Prot::READ_WRITE, Prot::READ_EXEC] {
                let leaf = A::leaf(PhysAddr(0x1234_5000 & !((1 << (12 + 9 * h)) - 1)), p, h);
                assert_eq!(A::swp_value(leaf), None);
            }
        }
        if h > 0 {
            assert_eq!(A::swp_value(A::table_entry(PhysAddr(0x5000), h)), None);
        }
    }
}

// ----- installing, reading, swapping in -----

/// `install_pte` of software entries, `ptep_get` and swap-in (`replace_pte` of a software
/// entry) of software entries.
pub fn install_read_and_swap_in<A: Arch>() {
    let (m, mut s) = machine::<A>();
    let va = VirtAddr(3 * G1 + 5 * M2 + 7 * K4);
    // The whole path is missing: LEVELS - 1 tables, taken all or none.
    let need = A::LEVELS as u64 - 1;
    for k in 0..need {
        m.fail_after(Some(k));
        assert_eq!(
            s.install_pte(va, NewPte::Swap(0x77)),
            Err(Error::OutOfMemory)
        );
        m.fail_after(None);
        assert_eq!(s.inspect().count_tables(), 1, "k = {k}");
        no_leak(&m, &s);
    }
    s.install_pte(va, NewPte::Swap(0x77)).unwrap();
    assert_eq!(s.inspect().count_tables() as u64, 1 + need);
    assert_eq!(s.ptep_get(va).and_then(|e| e.swap_value()), Some(0x77));
    assert_eq!(s.ptep_get(va.add(K4)).and_then(|e| e.swap_value()), None);
    // Not a mapping, for the software walk and for the hardware.
    assert_eq!(s.translate(va), None);
    assert!(listing(&s, va.0 & !(G1 - 1), G1).is_empty());
    let f = m.read_u64(va).unwrap_err();
    assert!(
        matches!(f.kind, SimFaultKind::Translation { height: 0 }),
        "{f}"
    );
    // Occupied for map.
    assert_eq!(
        s.map(va, PhysAddr(PA), K4, RW, MapOptions::PAGES),
        Err(Error::AlreadyMapped(va))
    );
    // Occupied for install_pte too (replace_pte replaces it, returning
    // the old value); too wide a value is refused.
    assert_eq!(
        s.install_pte(va, NewPte::Swap(0x78)),
        Err(Error::AlreadyMapped(va))
    );
    assert_eq!(s.ptep_get(va).and_then(|e| e.swap_value()), Some(0x77));
    let old = s.replace_pte(va, NewPte::Swap(0x78)).unwrap();
    assert_eq!(old.swap_value(), Some(0x77));
    assert_eq!(s.ptep_get(va).and_then(|e| e.swap_value()), Some(0x78));
    let wide = 1u64 << A::SWP_VALUE_BITS;
    assert_eq!(
        s.install_pte(va, NewPte::Swap(wide)),
        Err(Error::SwapValueTooWide(wide))
    );
    assert_eq!(s.ptep_get(va).and_then(|e| e.swap_value()), Some(0x78));
    // Something present is never replaced.
    let page = va.add(K4);
    s.map(page, PhysAddr(PA), K4, RW, MapOptions::PAGES)
        .unwrap();
    assert_eq!(
        s.install_pte(page, NewPte::Swap(1)),
        Err(Error::AlreadyMapped(page))
    );
    let block = VirtAddr(5 * G1);
    s.map(block, PhysAddr(PA), M2, RW, MapOptions::BLOCKS)
        .unwrap();
    let inside = block.add(9 * K4);
    assert_eq!(
        s.install_pte(inside, NewPte::Swap(1)),
        Err(Error::AlreadyMapped(inside))
    );
    assert_eq!(s.translate(inside).unwrap().pa, PhysAddr(PA + 9 * K4));
    // Swap-in: not present -> present, no flush. Nothing to replace in an
    // empty PTE; a block is no PTE.
    let empty = va.add(2 * K4);
    let page_in = |pa| NewPte::Page { pa, prot: RW };
    assert_eq!(
        s.replace_pte(empty, page_in(PhysAddr(PA))),
        Err(Error::NotMapped(empty))
    );
    assert_eq!(
        s.replace_pte(inside, page_in(PhysAddr(PA))),
        Err(Error::BlockMapped(inside))
    );
    assert_eq!(s.translate(inside).unwrap().pa, PhysAddr(PA + 9 * K4));
    let before = flushes(&m);
    let pa = PhysAddr(PA + 0x10_0000);
    m.phys_write_u64(pa, 0xfeed);
    let old = s.replace_pte(va, page_in(pa)).unwrap();
    assert_eq!((old.swap_value(), old.is_present()), (Some(0x78), false));
    assert_eq!(flushes(&m), before, "swap-in flushed");
    assert_eq!(s.ptep_get(va).and_then(|e| e.swap_value()), None);
    assert_eq!(s.translate(va).unwrap().pa, pa);
    assert_eq!(m.read_u64(va), Ok(0xfeed));
    m.write_u64(va, 1).unwrap();
    no_leak(&m, &s);
}

// ----- the other operations keep them -----

/// Pages around software entries in `[base, base + len)`: every page `i`
/// with `i % 7 == 3` (and the first four, where a deferred PTE table keeps
/// its record) is a software entry with value `i + 1`, every other fifth
/// page is mapped.
fn populate<A: Arch>(s: &mut Space<A>, base: u64, len: u64) -> Vec<(u64, u64)> {
    let mut swp = Vec::new();
    for i in 0..len / K4 {
        let va = VirtAddr(base + i * K4);
        if i % 7 == 3 || i < 4 {
            s.install_pte(va, NewPte::Swap(i + 1)).unwrap();
            swp.push((i * K4, i + 1));
        } else if i % 5 == 0 {
            s.map(va, PhysAddr(PA + i * K4), K4, RW, MapOptions::PAGES)
                .unwrap();
        }
    }
    swp
}

fn expect_swp<A: Arch>(s: &Space<A>, base: u64, swp: &[(u64, u64)]) {
    for &(off, v) in swp {
        assert_eq!(
            s.ptep_get(VirtAddr(base + off))
                .and_then(|e| e.swap_value()),
            Some(v),
            "at {:#x}",
            base + off
        );
    }
}

fn expect_no_swp<A: Arch>(s: &Space<A>, base: u64, swp: &[(u64, u64)]) {
    for &(off, _) in swp {
        assert_eq!(
            s.ptep_get(VirtAddr(base + off))
                .and_then(|e| e.swap_value()),
            None,
            "at {:#x}",
            base + off
        );
    }
}

/// Moves keep software entries: PTE-level moves, whole PTE tables (one PMD
/// entry, or unlinked and copied after the flush), whole PMD tables (one PUD
/// entry), misaligned destinations, and tables holding nothing else.
pub fn moves_keep_them<A: Arch>() {
    let cases: &[(u64, u64, u64, MoveOptions, &str)] = &[
        // (source, destination, length, options, what)
        (
            G1 + 64 * K4,
            3 * G1 + 100 * K4,
            40 * K4,
            MoveOptions::DEFAULT,
            "PTE level",
        ),
        (
            G1,
            3 * G1 + 4 * M2,
            2 * M2,
            MoveOptions::DEFAULT,
            "whole PTE tables",
        ),
        (
            G1,
            3 * G1 + 4 * M2,
            2 * M2,
            variants::PTES_ONLY,
            "deferred PTE tables",
        ),
        (
            G1,
            3 * G1 + 4 * M2 + 9 * K4,
            3 * M2,
            variants::PTES_ONLY,
            "misaligned",
        ),
        (
            G1,
            3 * G1 + 4 * M2 + 9 * K4,
            3 * M2,
            MoveOptions::DEFAULT,
            "misaligned, fast on",
        ),
        (G1, 3 * G1, G1, MoveOptions::DEFAULT, "whole PMD table"),
        (
            G1,
            3 * G1 + M2,
            G1,
            MoveOptions::DEFAULT,
            "PMD-aligned, not PUD-aligned",
        ),
    ];
    for &(old, new, len, opts, what) in cases {
        let (m, mut s) = machine::<A>();
        // Only software entries in the first 2 MiB (a table with nothing
        // else), a mix after it.
        let mut swp = Vec::new();
        for i in 0..len.min(M2) / K4 {
            if i % 3 == 0 {
                s.install_pte(VirtAddr(old + i * K4), NewPte::Swap(0x1000 + i))
                    .unwrap();
                swp.push((i * K4, 0x1000 + i));
            }
        }
        if len > M2 {
            let more = populate(&mut s, old + M2, (len - M2).min(2 * M2));
            swp.extend(more.into_iter().map(|(o, v)| (o + M2, v)));
        }
        let pages = listing(&s, old, len);
        s.move_page_tables(VirtAddr(old), VirtAddr(new), len, opts)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        expect_swp(&s, new, &swp);
        expect_no_swp(&s, old, &swp);
        let moved: Vec<_> = listing(&s, new, len)
            .into_iter()
            .map(|m| (m.va.0 - new, m.pa, m.entry))
            .collect();
        let was: Vec<_> = pages
            .into_iter()
            .map(|m| (m.va.0 - old, m.pa, m.entry))
            .collect();
        assert_eq!(moved, was, "{what}");
        no_leak(&m, &s);
        // And back, so the source tables (freed or kept) are sound.
        s.move_page_tables(VirtAddr(new), VirtAddr(old), len, opts)
            .unwrap();
        expect_swp(&s, old, &swp);
        s.unmap(VirtAddr(old), len).unwrap();
        assert_eq!(
            s.inspect().count_tables(),
            1,
            "{what}: tables left after unmap"
        );
        no_leak(&m, &s);
    }
}

/// `change_protection` leaves them exactly as they were.
pub fn protect_keeps_them<A: Arch>() {
    let (m, mut s) = machine::<A>();
    let base = G1;
    let swp = populate(&mut s, base, M2 + 64 * K4);
    let raw: Vec<_> = swp
        .iter()
        .map(|&(o, _)| s.inspect().entry(VirtAddr(base + o), 0))
        .collect();
    s.change_protection(VirtAddr(base), M2 + 64 * K4, RO)
        .unwrap();
    let after: Vec<_> = swp
        .iter()
        .map(|&(o, _)| s.inspect().entry(VirtAddr(base + o), 0))
        .collect();
    assert_eq!(after, raw);
    assert!(listing(&s, base, M2 + 64 * K4)
        .iter()
        .all(|m| !m.prot.writable()));
    no_leak(&m, &s);
}

/// `unmap` clears them and frees their tables.
pub fn unmap_clears_them<A: Arch>() {
    let (m, mut s) = machine::<A>();
    let base = G1 + M2;
    let swp = populate(&mut s, base, 40 * K4);
    s.unmap(VirtAddr(base + 10 * K4), 10 * K4).unwrap();
    for &(o, v) in &swp {
        let want = (!(10 * K4..20 * K4).contains(&o)).then_some(v);
        assert_eq!(
            s.ptep_get(VirtAddr(base + o)).and_then(|e| e.swap_value()),
            want
        );
    }
    s.unmap(VirtAddr(base), 40 * K4).unwrap();
    expect_no_swp(&s, base, &swp);
    assert_eq!(s.inspect().count_tables(), 1);
    no_leak(&m, &s);
}
