//! A kernel half shared by several user spaces, on the simulator: the
//! same checks for every format, run by the tests of pgtable-core
//! and of each arch crate.

use pgtable_core::contract::{Access, AccessFault, Arch, TableAttrs};
use pgtable_core::{
    sim::{Installed, SimAlloc, SimMachine, SimMmu},
    MoveOptions,
};
use pgtable_core::{AddressSpace, Error, MapOptions, PhysAddr, Prot, VaRange, VirtAddr};

const PAGE: u64 = 4096;
const USER_VA: VirtAddr = VirtAddr(0x40_0000);

type Space<A> = Installed<A, SimMmu<A>, SimAlloc>;

/// Bytes one root entry maps.
fn top_size<A: Arch>() -> u64 {
    1 << (A::VA_BITS - 9)
}

/// An address 2 MiB into the `k`-th root entry of the upper half.
fn kernel_va<A: Arch>(k: u64) -> VirtAddr {
    let (first, _) = VaRange::Upper.bounds::<A>();
    VirtAddr(first + k * top_size::<A>() + 0x20_0000)
}

fn kernel_prot() -> Prot {
    // Kernel mappings are global (one TLB entry for every process).
    Prot::WRITE | Prot::GLOBAL
}

fn user_prot() -> Prot {
    Prot::WRITE | Prot::USER
}

fn new_kernel<A: Arch>(m: &SimMachine<A>) -> Space<A> {
    let k = AddressSpace::<A, _, _>::new_kernel(m.mmu_installing_into(VaRange::Upper), m.alloc())
        .unwrap();
    // SAFETY: a simulated MMU.
    unsafe { Installed::new(k) }
}

fn new_user<A: Arch>(m: &SimMachine<A>, kernel: &Space<A>) -> Space<A> {
    // SAFETY: every user space is dropped before the kernel space in these
    // tests.
    let u = unsafe {
        AddressSpace::<A, _, _>::new_user(kernel, m.mmu_installing_into(VaRange::Lower), m.alloc())
    }
    .unwrap();
    // SAFETY: a simulated MMU.
    unsafe { Installed::new(u) }
}

/// Makes `u` the running user space (x86: its root in CR3; arm64: its root
/// in TTBR0 next to the kernel's in TTBR1).
fn switch_to<A: Arch>(u: &mut Space<A>) {
    // SAFETY: a simulated MMU.
    unsafe { u.install() };
}

/// Three user spaces and a kernel space: kernel mappings made before and
/// after the user spaces exist are visible through every user root; user
/// unmap, move and drop leave the kernel tables alone; the kernel never
/// frees its shared tables, even when a whole root entry's range is
/// unmapped; and every table is freed exactly once in the end.
pub fn three_user_spaces_share_the_kernel_half<A: Arch>() {
    let m = SimMachine::<A>::new();
    let mut kernel = new_kernel(&m);
    let shared = if A::SEPARATE_HALVES { 0 } else { 256 };
    assert_eq!(kernel.inspect().count_tables(), 1 + shared);
    assert_eq!(m.live_tables(), 1 + shared);
    let (kva0, kva1) = (kernel_va::<A>(3), kernel_va::<A>(44));
    let (kpa0, kpa1) = (PhysAddr(0x7000_0000), PhysAddr(0x7100_0000));
    kernel
        .map(kva0, kpa0, PAGE, kernel_prot(), MapOptions::PAGES)
        .unwrap();
    m.phys_write_u64(kpa0, 0xaaaa);

    let mut users: Vec<Space<A>> = (0..3u64)
        .map(|i| {
            let mut u = new_user(&m, &kernel);
            assert_eq!(u.va_range(), VaRange::Lower);
            assert_eq!(u.inspect().table_attrs(), TableAttrs::USER);
            let pa = PhysAddr(0x1000_0000 + i * 0x10_0000);
            u.map(USER_VA, pa, PAGE, user_prot(), MapOptions::PAGES)
                .unwrap();
            m.phys_write_u64(pa, i);
            u
        })
        .collect();
    let user_tables: usize = users.iter().map(|u| u.inspect().count_tables()).sum();

    // A kernel mapping added after the user spaces exist, under a root
    // entry no kernel mapping used before.
    kernel
        .map(kva1, kpa1, PAGE, kernel_prot(), MapOptions::PAGES)
        .unwrap();
    m.phys_write_u64(kpa1, 0xfeed);
    let user_access = Access {
        user: true,
        ..Access::READ
    };
    for (i, u) in users.iter_mut().enumerate() {
        switch_to(u);
        assert_eq!(m.read_u64(USER_VA), Ok(i as u64), "user space {i}");
        assert_eq!(m.read_u64(kva0), Ok(0xaaaa), "user space {i}");
        assert_eq!(m.read_u64(kva1), Ok(0xfeed), "user space {i}");
        m.write_u64(kva1, 0xfeed).unwrap();
        // User mode cannot touch the kernel half.
        assert!(m.access(kva1, user_access).is_err(), "user space {i}");
        assert!(m.access(USER_VA, user_access).is_ok(), "user space {i}");
        m.check().unwrap();
    }

    // User spaces cannot reach the kernel half ...
    let lower_end = VaRange::Lower.bounds::<A>().1 + 1;
    for u in users.iter_mut() {
        assert_eq!(u.unmap(kva1, PAGE), Err(Error::OutOfRange(kva1)));
        assert_eq!(
            u.map(kva1, PhysAddr(0), PAGE, user_prot(), MapOptions::PAGES),
            Err(Error::OutOfRange(kva1))
        );
        assert!(u.translate(kva1).is_none());
    }
    // ... and their unmap, move and drop leave it alone.
    let kernel_tables = kernel.inspect().count_tables();
    let top = A::LEVELS - 1;
    let kentry = kernel.inspect().entry(kva1, top);
    let u0_tables = users[0].inspect().count_tables();
    {
        let u = &mut users[0];
        switch_to(u);
        u.move_page_tables(USER_VA, VirtAddr(1 << 30), PAGE, MoveOptions::DEFAULT)
            .unwrap();
        assert_eq!(m.read_u64(VirtAddr(1 << 30)), Ok(0));
        u.unmap(VirtAddr(0), lower_end).unwrap();
        assert_eq!(u.inspect().count_tables(), 1);
        assert_eq!(m.read_u64(kva1), Ok(0xfeed));
        m.check().unwrap();
    }
    assert_eq!(kernel.inspect().count_tables(), kernel_tables);
    let dropped = users.remove(1).inspect().count_tables();
    assert_eq!(
        m.live_tables(),
        // User 0 kept only its root.
        kernel_tables + user_tables - dropped - (u0_tables - 1)
    );
    assert_eq!(kernel.inspect().entry(kva1, top), kentry);
    for u in users.iter_mut() {
        switch_to(u);
        assert_eq!(m.read_u64(kva1), Ok(0xfeed));
        m.check().unwrap();
    }

    // The kernel unmaps a whole root entry's range: its shared table stays
    // linked (emptied), so the user roots' copies stay valid, and a new
    // mapping there is visible to every user space at once.
    let entry_start = VirtAddr(kva1.0 & !(top_size::<A>() - 1));
    kernel.unmap(entry_start, top_size::<A>()).unwrap();
    if A::SEPARATE_HALVES {
        assert!(kernel.inspect().entry(kva1, top).unwrap() == 0);
    } else {
        assert_eq!(
            kernel.inspect().entry(kva1, top),
            kentry,
            "the shared table stays"
        );
        // The root, the shared tables and those below them on kva0's path.
        let below = (A::LEVELS - 2) as usize;
        assert_eq!(kernel.inspect().count_tables(), 1 + 256 + below);
    }
    for u in users.iter_mut() {
        switch_to(u);
        assert!(m.read_u64(kva1).is_err());
    }
    kernel
        .map(kva1, kpa1, PAGE, kernel_prot(), MapOptions::PAGES)
        .unwrap();
    for u in users.iter_mut() {
        switch_to(u);
        assert_eq!(m.read_u64(kva1), Ok(0xfeed));
        m.check().unwrap();
    }
    // Moving the whole kernel range away does not free the shared table
    // either.
    let elsewhere = VirtAddr(kernel_va::<A>(45).0 & !(top_size::<A>() - 1));
    kernel
        .move_page_tables(
            entry_start,
            elsewhere,
            top_size::<A>(),
            MoveOptions::DEFAULT,
        )
        .unwrap();
    if !A::SEPARATE_HALVES {
        assert_eq!(
            kernel.inspect().entry(kva1, top),
            kentry,
            "the shared table stays"
        );
    }
    for u in users.iter_mut() {
        switch_to(u);
        assert_eq!(
            m.read_u64(VirtAddr(elsewhere.0 + (kva1.0 - entry_start.0))),
            Ok(0xfeed)
        );
        m.check().unwrap();
    }

    // Every table is freed once: the users' own, then the kernel's.
    drop(users);
    assert_eq!(m.live_tables(), kernel.inspect().count_tables());
    drop(kernel);
    assert_eq!(m.live_tables(), 0);
}

/// A space that does not share a kernel half cannot give one, and only a
/// space that translates the upper half can share it.
pub fn a_kernel_half_needs_the_upper_half<A: Arch>() {
    let m = SimMachine::<A>::new();
    let plain = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    // SAFETY: nothing is created.
    let r = unsafe { AddressSpace::<A, _, _>::new_user(&plain, m.mmu(), m.alloc()) };
    assert_eq!(r.err(), Some(Error::KernelHalf));
    let lower_mmu = m.mmu_installing_into(VaRange::Lower);
    let mut lower = AddressSpace::<A, _, _>::new_in(VaRange::Lower, lower_mmu, m.alloc()).unwrap();
    assert_eq!(lower.share_kernel_half(), Err(Error::KernelHalf));
    let mut both = AddressSpace::<A, _, _>::new(m.mmu(), m.alloc()).unwrap();
    let r = both.share_kernel_half();
    if A::SEPARATE_HALVES {
        // One root for both halves cannot stay in TTBR1 while user roots
        // come and go in TTBR0.
        assert_eq!(r, Err(Error::KernelHalf));
    } else {
        assert_eq!(r, Ok(()));
        assert_eq!(both.inspect().count_tables(), 257);
        // The kernel's upper-half tables are kernel-only.
        let top = A::LEVELS - 1;
        let raw = both.inspect().entry(kernel_va::<A>(0), top).unwrap();
        assert!(A::table_limits(raw, top).no_user());
    }
    drop((plain, lower, both));
    assert_eq!(m.live_tables(), 0);
    // Out of memory half way through the preallocation: nothing leaks.
    m.fail_after(Some(10));
    let r = AddressSpace::<A, _, _>::new_kernel(m.mmu_installing_into(VaRange::Upper), m.alloc());
    m.fail_after(None);
    if A::SEPARATE_HALVES {
        // Nothing to preallocate.
        assert_eq!(r.map(|k| k.inspect().count_tables()).ok(), Some(1));
    } else {
        assert_eq!(r.err(), Some(Error::OutOfMemory));
    }
    assert_eq!(m.live_tables(), 0);
}

/// A kernel mapping that user mode may access at the leaf is still out of
/// reach through the kernel half's tables, and a kernel fetch from user
/// memory is stopped by the user tables where the format can say so
/// (arm64 `PXNTable`).
pub fn table_attributes_guard_the_halves<A: Arch>() {
    let m = SimMachine::<A>::new();
    let mut kernel = new_kernel(&m);
    let kva = kernel_va::<A>(7);
    let leaf_user = Prot::USER | Prot::WRITE | Prot::GLOBAL;
    kernel
        .map(
            kva,
            PhysAddr(0x7000_0000),
            PAGE,
            leaf_user,
            MapOptions::PAGES,
        )
        .unwrap();
    let mut u = new_user(&m, &kernel);
    // A kernel-executable leaf in the user half (a bug the tables catch).
    u.map(
        USER_VA,
        PhysAddr(0x1000_0000),
        PAGE,
        Prot::READ_EXEC,
        MapOptions::PAGES,
    )
    .unwrap();
    switch_to(&mut u);
    let user = Access {
        user: true,
        ..Access::READ
    };
    assert_eq!(
        m.access(kva, user).unwrap_err().kind,
        pgtable_core::sim::SimFaultKind::Permission(AccessFault::Privilege)
    );
    assert!(m.access(kva, Access::READ).is_ok());
    let top = A::LEVELS - 1;
    let urw = u.inspect().entry(USER_VA, top).unwrap();
    if A::table_limits(urw, top).pxn() {
        assert_eq!(
            m.exec(USER_VA).unwrap_err().kind,
            pgtable_core::sim::SimFaultKind::Permission(AccessFault::Exec)
        );
    }
    m.check().unwrap();
}

/// Every table attribute combination still decodes as the table it links
/// (the `Format` safety rule the walks rely on), the walker reads back no
/// more than was asked, and user access and write restrictions exactly
/// as asked; a plain table entry restricts nothing.
pub fn table_attributes_keep_the_table_decodable<A: Arch>() {
    use pgtable_core::contract::Decoded;
    let pas = [
        0x1000u64,
        0x4000_0000,
        (1u64 << A::PA_BITS.min(48)) - 0x1000,
    ];
    for h in 1..A::LEVELS {
        for &pa in &pas {
            let pa = PhysAddr(pa);
            assert_eq!(A::table_limits(A::table_entry(pa, h), h), TableAttrs::NONE);
            for bits in 0..16u8 {
                let a = TableAttrs::new(bits);
                let e = A::table_entry_attrs(pa, h, a);
                assert_eq!(A::decode(e, h), Decoded::Table(pa), "{a:?} at {h}");
                let l = A::table_limits(e, h);
                assert_eq!(l.bits() & !a.bits(), 0, "{a:?} read back as {l:?}");
                assert_eq!((l.no_user(), l.read_only()), (a.no_user(), a.read_only()));
            }
        }
    }
}

/// An MMU must install roots into the half its space translates, where
/// the format has a root per half (arm64): `new_kernel` and `new_user`
/// refuse one of another half at once, allocating nothing, rather than
/// letting the first access fault. The defaults agree with
/// `Arm64Mmu`'s: an untagged MMU installs into both halves, a tagged one
/// into the lower half (a user space's). With one root (x86, RISC-V, the
/// test formats) any MMU serves any space. Either way a kernel space and
/// a user space tagged with an ASID then serve kernel and user accesses.
pub fn a_space_refuses_an_mmu_of_another_half<A: Arch>() {
    use pgtable_core::contract::Mmu;
    let m = SimMachine::<A>::new();
    let half = |h: VaRange| A::SEPARATE_HALVES.then_some(h);
    assert_eq!(m.mmu().installs_into(), half(VaRange::Both));
    assert_eq!(m.mmu_with_asid(1).installs_into(), half(VaRange::Lower));
    let upper = m.mmu_installing_into(VaRange::Upper);
    assert_eq!(upper.installs_into(), half(VaRange::Upper));

    let wrong = |space, mmu| A::SEPARATE_HALVES.then_some(Error::MmuHalf { space, mmu });
    // A space of one half, with an MMU of the other or of both.
    for (range, mmu) in [
        (VaRange::Upper, m.mmu()),
        (VaRange::Lower, m.mmu_installing_into(VaRange::Upper)),
        (VaRange::Upper, m.mmu_with_asid(1)),
    ] {
        let got = mmu.installs_into().unwrap_or(VaRange::Both);
        let r = AddressSpace::<A, _, _>::new_in(range, mmu, m.alloc());
        assert_eq!(r.err(), wrong(range, got));
        assert_eq!(m.live_tables(), 0, "nothing allocated, nothing leaked");
    }
    // A space of both halves may switch TTBR0_EL1 only.
    AddressSpace::<A, _, _>::new(m.mmu_with_asid(1), m.alloc()).unwrap();
    if !A::SEPARATE_HALVES && A::LEVELS < 4 {
        // One root of 3 levels: no kernel half to share (see
        // `a_kernel_half_needs_the_upper_half`).
        return;
    }
    for mmu in [m.mmu(), m.mmu_with_asid(1)] {
        let got = mmu.installs_into().unwrap_or(VaRange::Both);
        let r = AddressSpace::<A, _, _>::new_kernel(mmu, m.alloc());
        assert_eq!(r.err(), wrong(VaRange::Upper, got));
        assert_eq!(m.live_tables(), 0, "nothing allocated, nothing leaked");
    }
    let kernel = new_kernel(&m);
    let live = m.live_tables();
    for mmu in [m.mmu(), m.mmu_installing_into(VaRange::Upper)] {
        let got = mmu.installs_into().unwrap_or(VaRange::Both);
        // SAFETY: dropped before `kernel`.
        let r = unsafe { AddressSpace::<A, _, _>::new_user(&kernel, mmu, m.alloc()) };
        assert_eq!(r.err(), wrong(VaRange::Lower, got));
        assert_eq!(m.live_tables(), live);
    }

    // The kernel in its half, a process tagged with ASID 3 in the other.
    let mut kernel = kernel;
    let kva = kernel_va::<A>(1);
    kernel
        .map(
            kva,
            PhysAddr(0x7000_0000),
            PAGE,
            kernel_prot(),
            MapOptions::PAGES,
        )
        .unwrap();
    // SAFETY: dropped before `kernel`.
    let u = unsafe { AddressSpace::<A, _, _>::new_user(&kernel, m.mmu_with_asid(3), m.alloc()) };
    // SAFETY: a simulated MMU.
    let mut u = unsafe { Installed::new(u.unwrap()) };
    u.map(
        USER_VA,
        PhysAddr(0x1000_0000),
        PAGE,
        user_prot(),
        MapOptions::PAGES,
    )
    .unwrap();
    m.write_u64(kva, 0x4b).unwrap();
    m.user_write_u64(USER_VA, 0x55).unwrap();
    assert_eq!(m.read_u64(kva), Ok(0x4b));
    assert_eq!(m.user_read_u64(USER_VA), Ok(0x55));
    assert!(m.user_read_u64(kva).is_err());
    assert_eq!(m.asid(), 3);
    m.check().unwrap();
}
