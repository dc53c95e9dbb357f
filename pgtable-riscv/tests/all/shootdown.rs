//! `pgtable_riscv::shootdown` on the simulator: a fake SBI whose remote
//! fences execute `SFENCE.VMA` on the simulated target harts (as OpenSBI
//! makes each target do), the space live on two of four harts; without
//! the remote fences, or with the other hart missing from the space's
//! harts, the other hart keeps a stale translation. Hart masks for large
//! hart IDs.

use std::sync::Mutex;

use pgtable_core::sim::{CheckError, SimMachine};
use pgtable_core::{MapOptions, PhysAddr, Prot, VirtAddr};
use pgtable_riscv::shootdown::{HartMask, MmHarts, RemoteFence, SmpMmu};
use pgtable_riscv::{Asid, Sv48};

use crate::harts::{asid, install, mmu, Bug};

/// One remote fence: the harts, start, size and ASID.
type Call = (HartMask, u64, u64, Option<u16>);

/// The fake SBI RFENCE: `sbi_remote_sfence_vma(_asid)` as fences on the
/// target harts of the simulated machine, or nothing (`working: false`).
struct FakeSbi {
    m: SimMachine<Sv48>,
    working: bool,
    calls: Mutex<Vec<Call>>,
}

// SAFETY: with `working`, every target hart executes the fences before
// the call returns (the broken fake runs on the simulator only).
unsafe impl RemoteFence for FakeSbi {
    fn this_hart(&self) -> usize {
        0
    }

    fn remote_sfence_vma(&self, harts: HartMask, start: u64, size: u64, asid: Option<Asid>) {
        let a = asid.map(Asid::get);
        self.calls.lock().unwrap().push((harts, start, size, a));
        if !self.working {
            return;
        }
        for cpu in (0..self.m.cpus()).filter(|&c| harts.contains(c)) {
            let h = self.m.cpu(cpu).hart();
            // OpenSBI: per 4 KiB page up to a limit, else everything.
            if size == u64::MAX || size > 64 << 12 {
                h.sfence_vma(None, a);
            } else {
                for off in (0..size).step_by(0x1000) {
                    h.sfence_vma(Some(VirtAddr(start + off)), a);
                }
            }
        }
    }
}

const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);

/// Maps a page from hart 0, lets hart 1 use it, makes it read-only from
/// hart 0: the check afterwards, and the fake's calls.
fn change_seen_by_hart_1(
    working: bool,
    add_hart_1: bool,
    tag: Option<u16>,
) -> (Result<(), CheckError>, Vec<Call>) {
    let m = SimMachine::<Sv48>::with_cpus(4);
    let sbi = FakeSbi {
        m: m.clone(),
        working,
        calls: Mutex::new(Vec::new()),
    };
    let mm = MmHarts::<1>::new();
    let local = match tag {
        Some(a) => mmu(&m, 0, Bug::None).with_asid(asid(a)),
        None => mmu(&m, 0, Bug::None),
    };
    let mut s = install(&m, SmpMmu::new(local, &sbi, &mm));
    assert!(mm.contains(0), "installing did not mark the executing hart");
    s.map(VA, PA, 0x1000, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    // Hart 1 switches to the space and uses the page.
    if add_hart_1 {
        mm.add(1);
    }
    let root = m.root().unwrap();
    // SAFETY: the space's root, a table of this machine.
    unsafe { m.cpu(1).hart().write_satp(Some(root), tag.unwrap_or(0)) };
    m.cpu(1).write_u64(VA, 7).unwrap();
    m.check().unwrap();
    s.change_protection(VA, 0x1000, Prot::READ_ONLY).unwrap();
    let r = m.check();
    let calls = sbi.calls.lock().unwrap().clone();
    // Hart 1 leaves the space before it is dropped.
    // SAFETY: Bare.
    unsafe { m.cpu(1).hart().write_satp(None, 0) };
    drop(s);
    (r, calls)
}

#[test]
fn a_change_reaches_the_other_hart_through_the_remote_fence() {
    let (r, calls) = change_seen_by_hart_1(true, true, None);
    r.unwrap();
    let one = HartMask {
        mask: 0b10,
        base: 0,
    };
    assert!(calls.contains(&(one, VA.0, 0x1000, None)), "{calls:?}");
    let (r, calls) = change_seen_by_hart_1(true, true, Some(9));
    r.unwrap();
    assert!(calls.contains(&(one, VA.0, 0x1000, Some(9))), "{calls:?}");
}

#[test]
fn without_the_remote_fence_the_other_hart_keeps_the_old_translation() {
    let (r, calls) = change_seen_by_hart_1(false, true, Some(9));
    match r {
        Err(CheckError::Stale(s)) => assert_eq!((s.cpu, s.va), (1, VA)),
        r => panic!("{r:?}"),
    }
    assert!(!calls.is_empty());
}

#[test]
fn a_hart_missing_from_the_space_s_harts_keeps_the_old_translation() {
    let (r, calls) = change_seen_by_hart_1(true, false, None);
    match r {
        Err(CheckError::Stale(s)) => assert_eq!(s.cpu, 1),
        r => panic!("{r:?}"),
    }
    assert!(calls.is_empty(), "{calls:?}");
}

#[test]
fn hart_masks_cover_large_hart_ids_without_overflow() {
    let mm = MmHarts::<2>::new();
    for h in [0, 63, 64, 127] {
        mm.add(h);
    }
    let w: Vec<HartMask> = mm.targets(63).collect();
    assert_eq!(
        w,
        [
            HartMask { mask: 1, base: 0 },
            HartMask {
                mask: 1 | 1 << 63,
                base: 64
            }
        ]
    );
    assert!(mm.contains(127) && !mm.contains(65));
    // An ID past the bitmap: every hart, in one window.
    mm.add(5000);
    assert_eq!(mm.targets(0).collect::<Vec<_>>(), [HartMask::ALL]);
    assert!(mm.contains(4999));
    // Off: no window at all.
    mm.set_remote(false);
    assert_eq!(mm.targets(0).count(), 0);

    let far = HartMask::single(usize::MAX);
    assert_eq!(far.base % 64, 0);
    assert!(far.contains(usize::MAX) && !far.contains(usize::MAX - 64));
    assert_eq!(
        HartMask::single(130),
        HartMask {
            mask: 1 << 2,
            base: 128
        }
    );
    assert!(!HartMask::single(130).contains(2));
    assert!(HartMask::ALL.contains(123_456));
}
