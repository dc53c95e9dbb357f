//! Every public operation of `AddressSpace` that takes an address checks
//! it against the space's range, the same way: a table of operations ×
//! addresses (outside the space's half, the other half's alias, the
//! kernel half seen from a user space, the last page of each half), run
//! on the simulator for any format. An address the space does not
//! translate gets the documented answer (`Error::OutOfRange(va)`, or
//! `None` from a read) and leaves every table of every space byte for
//! byte as it was; the last page of each half is found and changed.
//! Run by the kernel-half tests of pgtable-core and of each arch crate.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use pgtable_core::contract::{level, Arch, Decoded, NewPte, Slot, TableAlloc};
use pgtable_core::{
    sim::{SimAlloc, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{
    AddressSpace, ClearRefs, CopyMode, Error, FaultFlags, LiveOptions, MapOptions, PhysAddr, Prot,
    VaRange, VirtAddr,
};

const PAGE: u64 = 4096;
/// Where the fixture's pages and the operations' new pages point.
const PA: PhysAddr = PhysAddr(0x5000_0000);
/// The value of the fixture's software entries.
const SWAP_VALUE: u64 = 0x123;

type Space<A> = AddressSpace<A, SimMmu<A>, SimAlloc>;

/// The kind of space an operation runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// `new_kernel`: the upper half, shared with user spaces.
    Kernel,
    /// `new_user` of the kernel space: the lower half.
    User,
    /// `new`: both halves.
    Both,
}

/// What the fixture puts at every page it knows (in every space), so an
/// operation that walks to the wrong one finds something to change.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fill {
    /// A read-only page, young.
    Page,
    /// A software entry.
    Swap,
    /// Nothing (for the operations that create an entry).
    Empty,
}

/// What an operation answered, normalised.
#[derive(PartialEq, Eq, Debug)]
enum Got {
    /// `Ok` (with something done or reported).
    Done,
    /// `Some`.
    Found,
    /// `None`, or `Ok` with nothing found.
    Nothing,
    Failed(Error),
}

fn done<T>(r: Result<T, Error>) -> Got {
    match r {
        Ok(_) => Got::Done,
        Err(e) => Got::Failed(e),
    }
}

fn found<T>(o: Option<T>) -> Got {
    match o {
        Some(_) => Got::Found,
        None => Got::Nothing,
    }
}

/// `Ok` with `n` things reported or changed.
fn counted(r: Result<(), Error>, n: usize) -> Got {
    match r {
        Ok(()) if n > 0 => Got::Done,
        Ok(()) => Got::Nothing,
        Err(e) => Got::Failed(e),
    }
}

/// `Ok(true)`: changed; `Ok(false)`: nothing to do.
fn changed(r: Result<bool, Error>) -> Got {
    match r {
        Ok(true) => Got::Done,
        Ok(false) => Got::Nothing,
        Err(e) => Got::Failed(e),
    }
}

/// The spaces an operation may use besides its subject.
struct Extra<A: Arch> {
    /// An empty space of the subject's kind (`copy_page_range` into it).
    twin: Space<A>,
    /// A space with a page at the operation's address wherever it holds
    /// that address (`copy_page_range` from it into the subject).
    source: Space<A>,
    /// An empty page in the subject's half (a move's destination).
    free: VirtAddr,
    /// A mapped page in the subject's half (a move's source).
    mapped: VirtAddr,
}

type Run<A> = fn(&mut Space<A>, &mut Extra<A>, VirtAddr) -> Got;

/// One public operation: its name, what the fixture puts at its
/// addresses, whether it only reads (and answers `None` outside the
/// range), and the call.
struct Op<A: Arch> {
    name: &'static str,
    fill: Fill,
    read: bool,
    run: Run<A>,
}

const fn op<A: Arch>(name: &'static str, fill: Fill, read: bool, run: Run<A>) -> Op<A> {
    Op {
        name,
        fill,
        read,
        run,
    }
}

/// Every public operation that takes an address (`grep -n "pub fn"
/// pgtable-core/src`), each on one page.
fn ops<A: Arch>() -> Vec<Op<A>> {
    use Fill::{Empty, Page, Swap};
    vec![
        op("map", Empty, false, |s, _, va| {
            done(s.map(va, PA, PAGE, Prot::READ_ONLY, MapOptions::PAGES))
        }),
        op("unmap", Page, false, |s, _, va| done(s.unmap(va, PAGE))),
        op("unmap_with", Page, false, |s, _, va| {
            let mut n = 0;
            let r = s.unmap_with(va, PAGE, |_| n += 1);
            counted(r, n)
        }),
        op("MmuGather::unmap", Page, false, |s, _, va| {
            let mut tlb = s.tlb_gather_mmu();
            let r = tlb.unmap(va, PAGE);
            tlb.finish();
            done(r)
        }),
        op("MmuGather::unmap_with", Page, false, |s, _, va| {
            let mut n = 0;
            let mut tlb = s.tlb_gather_mmu();
            let r = tlb.unmap_with(va, PAGE, |_| n += 1);
            tlb.finish();
            counted(r, n)
        }),
        op("MmuGather::change_protection", Page, false, |s, _, va| {
            let mut tlb = s.tlb_gather_mmu();
            let r = tlb.change_protection(va, PAGE, Prot::READ_WRITE);
            tlb.finish();
            done(r)
        }),
        op("MmuGather::clear_refs", Page, false, |s, _, va| {
            let mut n = 0;
            let mut tlb = s.tlb_gather_mmu();
            let r = tlb.clear_refs(va, PAGE, ClearRefs::ALL, |_| n += 1);
            tlb.finish();
            counted(r, n)
        }),
        op("change_protection", Page, false, |s, _, va| {
            done(s.change_protection(va, PAGE, Prot::READ_WRITE))
        }),
        op("change_protection_live", Page, false, |s, _, va| {
            let opts = LiveOptions::ALLOW_BBM;
            done(s.change_protection_live(va, PAGE, Prot::READ_WRITE, opts))
        }),
        op("move_page_tables (source)", Page, false, |s, x, va| {
            done(s.move_page_tables(va, x.free, PAGE, MoveOptions::DEFAULT))
        }),
        op(
            "move_page_tables (destination)",
            Empty,
            false,
            |s, x, va| done(s.move_page_tables(x.mapped, va, PAGE, MoveOptions::DEFAULT)),
        ),
        op("copy_page_range (source)", Page, false, |s, x, va| {
            done(s.copy_page_range(&mut x.twin, va, PAGE, CopyMode::Cow, |_| {}))
        }),
        op("copy_page_range (destination)", Empty, false, |s, x, va| {
            done(x.source.copy_page_range(s, va, PAGE, CopyMode::Cow, |_| {}))
        }),
        op("install_pte (software entry)", Empty, false, |s, _, va| {
            done(s.install_pte(va, NewPte::Swap(SWAP_VALUE)))
        }),
        op("swap_entry", Swap, true, |s, _, va| {
            found(s.ptep_get(va).and_then(|e| e.swap_value()))
        }),
        op("replace_pte (swap-in)", Swap, false, |s, _, va| {
            let new = NewPte::Page {
                pa: PA,
                prot: Prot::READ_ONLY,
            };
            done(s.replace_pte(va, new))
        }),
        op("replace_pte (swap-out)", Page, false, |s, _, va| {
            done(s.replace_pte(va, NewPte::Swap(SWAP_VALUE)))
        }),
        op("install_pte", Empty, false, |s, _, va| {
            done(s.install_pte(
                va,
                NewPte::Page {
                    pa: PA,
                    prot: Prot::READ_ONLY,
                },
            ))
        }),
        op("ptep_get", Page, true, |s, _, va| found(s.ptep_get(va))),
        op("test_and_clear_young", Page, false, |s, _, va| {
            changed(s.test_and_clear_young(va))
        }),
        op("ptep_set_access_flags", Page, false, |s, _, va| {
            changed(s.ptep_set_access_flags(va, FaultFlags::WRITE))
        }),
        op("clear_refs", Page, false, |s, _, va| {
            let mut n = 0;
            let r = s.clear_refs(va, PAGE, ClearRefs::ALL, |_| n += 1);
            counted(r, n)
        }),
        op("translate", Page, true, |s, _, va| found(s.translate(va))),
        op("entry (PTE)", Page, true, |s, _, va| {
            found(s.inspect().entry(va, 0))
        }),
        op("entry (root)", Page, true, |s, _, va| {
            found(s.inspect().entry(va, A::LEVELS - 1))
        }),
        op("slot", Page, true, |s, _, va| {
            // SAFETY: the slot is only looked at, never written.
            found(unsafe { s.inspect().slot(va, 0) })
        }),
        op("walk", Page, false, |s, _, va| {
            let mut n = 0;
            let r = s.walk(va, PAGE, |_| n += 1);
            counted(r, n)
        }),
        op("ptdump_range", Page, false, |s, _, va| {
            match s.ptdump().range(va, PAGE) {
                Ok(d) => counted(Ok(()), d.to_string().len()),
                Err(e) => Got::Failed(e),
            }
        }),
    ]
}

/// The first address of the half of a space of `kind` that holds `va`
/// (a `Both` space has halves of `2^(VA_BITS - 1)` on every format).
fn half_first<A: Arch>(kind: Kind, va: u64) -> u64 {
    match kind {
        Kind::Kernel => VaRange::Upper.bounds::<A>().0,
        Kind::User => 0,
        Kind::Both if va >> 63 == 0 => 0,
        Kind::Both => (1u64 << (A::VA_BITS - 1)).wrapping_neg(),
    }
}

/// The pages the fixture fills, per space.
fn pages<A: Arch>(kind: Kind) -> Vec<u64> {
    let (upper_first, _) = VaRange::Upper.bounds::<A>();
    let (_, lower_last) = VaRange::Lower.bounds::<A>();
    let both_half = 1u64 << (A::VA_BITS - 1);
    match kind {
        Kind::Kernel => vec![upper_first + 0x20_0000, u64::MAX - PAGE + 1],
        Kind::User => vec![0x40_0000, lower_last - PAGE + 1],
        Kind::Both => vec![both_half - PAGE, u64::MAX - PAGE + 1],
    }
}

/// The cases: (space, what the address is, the address, valid).
fn cases<A: Arch>() -> Vec<(Kind, &'static str, u64, bool)> {
    let (upper_first, _) = VaRange::Upper.bounds::<A>();
    let (_, lower_last) = VaRange::Lower.bounds::<A>();
    let both_half = 1u64 << (A::VA_BITS - 1);
    let top = u64::MAX - PAGE + 1;
    vec![
        (Kind::Kernel, "the last page of the upper half", top, true),
        (
            Kind::Kernel,
            "the page below the upper half",
            upper_first - PAGE,
            false,
        ),
        (
            Kind::Kernel,
            "the lower alias of the first kernel page",
            (upper_first + 0x20_0000) & lower_last,
            false,
        ),
        (
            Kind::Kernel,
            "the lower alias of the last kernel page",
            top & lower_last,
            false,
        ),
        (
            Kind::User,
            "the last page of the lower half",
            lower_last - PAGE + 1,
            true,
        ),
        (
            Kind::User,
            "the page past the lower half",
            lower_last + 1,
            false,
        ),
        (
            Kind::User,
            "the upper alias of the last user page",
            (lower_last - PAGE + 1) | !lower_last,
            false,
        ),
        (
            Kind::User,
            "a kernel page, from a user space",
            upper_first + 0x20_0000,
            false,
        ),
        (
            Kind::Both,
            "the last page of the lower half",
            both_half - PAGE,
            true,
        ),
        (Kind::Both, "the last page of the upper half", top, true),
        (Kind::Both, "the first non-canonical page", both_half, false),
        (
            Kind::Both,
            "the last non-canonical page",
            both_half.wrapping_neg() - PAGE,
            false,
        ),
    ]
}

/// A fingerprint of every table reachable from the roots of `spaces`
/// (all 512 root entries: an x86 user root's kernel half included), one
/// hash of its entries per table frame, each frame once.
fn fingerprint<A: Arch>(spaces: &[&Space<A>]) -> Vec<(u64, u64)> {
    fn visit<A: Arch>(s: &Space<A>, pa: PhysAddr, h: u32, out: &mut BTreeMap<u64, u64>) {
        if out.contains_key(&pa.0) {
            return;
        }
        // SAFETY: the root or a table reached from it: a live frame of
        // the space's allocator of `entries::<A>()` entries, and the shared
        // borrow keeps every operation away while the slice lives.
        let t = unsafe {
            let first = s.alloc().phys_to_virt(pa).cast::<Slot>();
            std::slice::from_raw_parts(first.as_ptr(), level::entries::<A>())
        };
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        let mut tables = Vec::new();
        for (i, e) in t.iter().enumerate() {
            // Relaxed: no operation runs, and nothing walks the tables.
            let raw = e.load(Relaxed);
            hash = (hash ^ raw ^ i as u64).wrapping_mul(0x0100_0000_01b3);
            if h > 0 {
                if let Decoded::Table(c) = A::decode(raw, h) {
                    tables.push(c);
                }
            }
        }
        out.insert(pa.0, hash);
        for c in tables {
            visit::<A>(s, c, h - 1, out);
        }
    }
    let mut out = BTreeMap::new();
    for s in spaces {
        visit::<A>(s, s.root(), A::LEVELS - 1, &mut out);
    }
    out.into_iter().collect()
}

/// Puts `fill` at `va` in `s`, if `s` translates `va`.
fn put<A: Arch>(s: &mut Space<A>, va: u64, fill: Fill) {
    let va = VirtAddr(va);
    match fill {
        Fill::Page => {
            let prot = if s.va_range() == VaRange::Lower {
                Prot::READ_ONLY | Prot::USER
            } else {
                Prot::READ_ONLY | Prot::GLOBAL
            };
            if s.map(va, PA, PAGE, prot, MapOptions::PAGES).is_ok() {
                // Young, as the hardware would make it.
                // SAFETY: only the accessed state changes, as the
                // hardware may change it.
                let slot = unsafe { s.inspect().slot(va, 0) }.unwrap();
                slot.store(A::mkyoung(slot.load(Relaxed), 0), Relaxed);
            }
        }
        Fill::Swap => {
            let _ = s.install_pte(va, NewPte::Swap(SWAP_VALUE));
        }
        Fill::Empty => {}
    }
}

/// A new space of `kind`; a user space shares `kernel`'s half.
fn new_space<A: Arch>(m: &SimMachine<A>, kind: Kind, kernel: Option<&Space<A>>) -> Space<A> {
    match (kind, kernel) {
        (Kind::User, Some(k)) => {
            let mmu = m.mmu_installing_into(VaRange::Lower);
            // SAFETY: every user space is dropped before the kernel space
            // (see the end of `run`).
            unsafe { AddressSpace::new_user(k, mmu, m.alloc()) }.unwrap()
        }
        (Kind::Kernel, _) => {
            AddressSpace::new_kernel(m.mmu_installing_into(VaRange::Upper), m.alloc()).unwrap()
        }
        _ => AddressSpace::new(m.mmu(), m.alloc()).unwrap(),
    }
}

/// The spaces of one case: the subject is one of `kernel`, `user`,
/// `both`.
struct Fixture<A: Arch> {
    user: Space<A>,
    both: Space<A>,
    x: Extra<A>,
    kernel: Space<A>,
    m: SimMachine<A>,
}

impl<A: Arch> Drop for Fixture<A> {
    fn drop(&mut self) {
        // The tables go with the machine, unfreed: freeing a one-root
        // kernel half (256 preallocated tables) costs more than a case.
        for s in [
            &mut self.user,
            &mut self.both,
            &mut self.x.twin,
            &mut self.x.source,
            &mut self.kernel,
        ] {
            let empty = new_space(&self.m, Kind::Both, None);
            let _ = std::mem::replace(s, empty).into_parts();
        }
    }
}

impl<A: Arch> Fixture<A> {
    /// Every space, with `fill` at each of their pages, a mapped page in
    /// the subject's half for a move, and (if `copies`) the spaces a copy
    /// needs (otherwise two empty `Both` spaces: the kernel spaces of a
    /// one-root format preallocate 256 tables each).
    fn new(kind: Kind, va: u64, fill: Fill, copies: bool) -> Self {
        let m = SimMachine::<A>::new();
        let mut kernel = new_space(&m, Kind::Kernel, None);
        let mut user = new_space(&m, Kind::User, Some(&kernel));
        let mut both = new_space(&m, Kind::Both, None);
        for (s, k) in [
            (&mut kernel, Kind::Kernel),
            (&mut user, Kind::User),
            (&mut both, Kind::Both),
        ] {
            for p in pages::<A>(k) {
                put(s, p, fill);
            }
        }
        let half = half_first::<A>(kind, va);
        let (free, mapped) = (VirtAddr(half + 0x4000_0000), VirtAddr(half + 0x8000_0000));
        let twin_kind = if copies { kind } else { Kind::Both };
        let twin = new_space(&m, twin_kind, Some(&kernel));
        // The source of a copy into the subject: a space that holds `va`
        // where one does, so the subject's own check is what refuses it.
        let mut source = if !copies || (kind != Kind::Both && VaRange::Both.contains::<A>(va)) {
            new_space(&m, Kind::Both, None)
        } else {
            new_space(&m, kind, Some(&kernel))
        };
        put(&mut source, va, Fill::Page);
        let mut f = Fixture {
            user,
            both,
            x: Extra {
                twin,
                source,
                free,
                mapped,
            },
            kernel,
            m,
        };
        put(f.subject(kind).0, mapped.0, Fill::Page);
        f
    }

    fn subject(&mut self, kind: Kind) -> (&mut Space<A>, &mut Extra<A>) {
        let s = match kind {
            Kind::Kernel => &mut self.kernel,
            Kind::User => &mut self.user,
            Kind::Both => &mut self.both,
        };
        (s, &mut self.x)
    }

    /// The fingerprint of every table of every space, and the number of
    /// live table frames.
    fn state(&self) -> (Vec<(u64, u64)>, usize) {
        let all = [
            &self.kernel,
            &self.user,
            &self.both,
            &self.x.twin,
            &self.x.source,
        ];
        (fingerprint::<A>(&all), self.m.live_tables())
    }
}

/// Every operation × every case: the documented answer; for an address
/// the space does not translate, nothing changed in any space.
pub fn every_operation_checks_the_space_s_range<A: Arch>() {
    let ops = ops::<A>();
    let mut wrong = Vec::new();
    // Under Miri a sample of the (case, operation) and (case, fill) runs.
    let mut run_no = 0;
    let mut sampled = || {
        run_no += 1;
        crate::miri_sample(run_no - 1)
    };
    for (kind, what, va, valid) in cases::<A>() {
        let want = |op: &Op<A>| match (valid, op.read) {
            (true, true) => Got::Found,
            (true, false) => Got::Done,
            (false, true) => Got::Nothing,
            (false, false) => Got::Failed(Error::OutOfRange(VirtAddr(va))),
        };
        let case = format!("{kind:?} space, {what} ({va:#x})");
        if valid {
            // Each operation on a fresh fixture: it changes it.
            for op in &ops {
                if !sampled() {
                    continue;
                }
                let copies = op.name.starts_with("copy_page_range");
                let mut f = Fixture::<A>::new(kind, va, op.fill, copies);
                let (s, x) = f.subject(kind);
                let got = (op.run)(s, x, VirtAddr(va));
                if got != want(op) {
                    wrong.push(format!("{case}: {} gave {got:?}", op.name));
                }
                f.m.check().unwrap();
            }
            continue;
        }
        // Nothing may change: one fixture per fill serves every operation
        // (made again after an operation that changed it).
        for fill in [Fill::Page, Fill::Swap, Fill::Empty] {
            if !sampled() {
                continue;
            }
            let mut f = Fixture::<A>::new(kind, va, fill, true);
            let mut before = f.state();
            for op in ops.iter().filter(|op| op.fill == fill) {
                let (s, x) = f.subject(kind);
                let got = (op.run)(s, x, VirtAddr(va));
                if got != want(op) {
                    wrong.push(format!("{case}: {} gave {got:?}", op.name));
                }
                f.m.check().unwrap();
                if f.state() != before {
                    wrong.push(format!("{case}: {} changed the tables", op.name));
                    f = Fixture::<A>::new(kind, va, fill, true);
                    before = f.state();
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{}:\n{}",
        std::any::type_name::<A>(),
        wrong.join("\n")
    );
}
