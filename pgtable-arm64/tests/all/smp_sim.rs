//! The arm64 flush semantics on a simulated machine with several CPUs.
//! `Arm64Mmu` invalidates with the Inner Shareable broadcast TLBIs
//! (`tlbi vae1is`, `vale1is`, `aside1is`, `vmalle1is`, completed by
//! `dsb ish`), which reach every CPU: the simulator's broadcast MMU. Its
//! opt-in `local_only` form (`tlbi vae1` … with `dsb nsh`) reaches the
//! executing CPU alone: the simulator's `local_only` MMU, correct for a
//! space live on one CPU and caught as soon as another CPU cached one of
//! its translations.

use pgtable_arm64::Arm64;
use pgtable_core::contract::Mmu;
use pgtable_core::{
    sim::{CheckError, Installed, SimAlloc, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{AddressSpace, MapOptions, PhysAddr, Prot, VirtAddr};

const K4: u64 = 0x1000;
const VA: VirtAddr = VirtAddr(0x4000_0000);
const PA: PhysAddr = PhysAddr(0x8000_0000);

type Space = Installed<Arm64, SimMmu<Arm64>, SimAlloc>;

/// A machine with `n` CPUs and a space installed on the CPUs in `on`,
/// with `VA` mapped and cached by each of them.
fn machine(n: usize, broadcast: bool, on: &[usize]) -> (SimMachine<Arm64>, Space) {
    let m = SimMachine::<Arm64>::with_cpus(n);
    let mmu = if broadcast {
        m.mmu()
    } else {
        m.mmu().local_only()
    };
    let s = AddressSpace::new(mmu, m.alloc()).unwrap();
    // SAFETY: a simulated MMU.
    let mut s = unsafe { Installed::new(s) };
    for &c in on.iter().filter(|&&c| c != 0) {
        // SAFETY: simulated CPU `c` installs a complete hierarchy.
        unsafe { m.cpu(c).mmu().install_root(s.root()) };
    }
    s.map(VA, PA, 2 * K4, Prot::READ_WRITE, MapOptions::PAGES)
        .unwrap();
    for &c in on {
        m.cpu(c).write_u64(VA, c as u64).unwrap();
    }
    m.check().unwrap();
    (m, s)
}

fn change(s: &mut Space, op: &str) {
    match op {
        "unmap" => s.unmap(VA, K4).unwrap(),
        "protect" => s.change_protection(VA, K4, Prot::READ_ONLY).unwrap(),
        "remap" => {
            // A new output address: break-before-make on arm64.
            s.unmap(VA, K4).unwrap();
            s.map(
                VA,
                PhysAddr(0x9000_0000),
                K4,
                Prot::READ_WRITE,
                MapOptions::PAGES,
            )
            .unwrap();
        }
        _ => s
            .move_page_tables(VA, VirtAddr(0x8000_0000), 2 * K4, MoveOptions::DEFAULT)
            .unwrap(),
    }
}

const OPS: [&str; 4] = ["unmap", "protect", "remap", "move"];

#[test]
fn broadcast_tlbis_leave_no_stale_entry_on_any_of_four_cpus() {
    for op in OPS {
        let (m, mut s) = machine(4, true, &[0, 1, 2, 3]);
        change(&mut s, op);
        m.check().unwrap_or_else(|e| panic!("{op}: {e}"));
        for c in 0..4 {
            assert!(m.cpu(c).write_u64(VA, 9).is_err() || op == "remap", "{op}");
        }
    }
}

#[test]
fn local_only_tlbis_are_caught_when_another_cpu_cached_the_translation() {
    for op in OPS {
        let (m, mut s) = machine(4, false, &[0, 3]);
        change(&mut s, op);
        match m.check() {
            Err(CheckError::Stale(stale)) => {
                assert_eq!((stale.cpu, stale.va), (3, VA), "{op}")
            }
            // The new entry was written while CPU 3 still cached the old
            // one: break-before-make broken on CPU 3.
            Err(CheckError::Conflict(c)) if op == "remap" => assert_eq!((c.cpu, c.va), (3, VA)),
            other => panic!("{op}: not caught: {other:?}"),
        }
        // CPU 3 still reaches the old frame.
        assert_eq!(m.cpu(3).read_u64(VA), Ok(3), "{op}");
    }
}

#[test]
fn local_only_tlbis_suffice_for_a_space_live_on_one_cpu() {
    for op in OPS {
        // Installed on CPU 0 alone; the other CPUs run something else.
        let (m, mut s) = machine(4, false, &[0]);
        change(&mut s, op);
        m.check().unwrap_or_else(|e| panic!("{op}: {e}"));
    }
}
