//! The drop checks are unwind-safe: a gather that still holds work and an
//! installed address space, dropped while a panic unwinds through the
//! caller, do not panic a second time (which would abort the process
//! instead of letting the first panic be caught or reported).
#![cfg(feature = "std")]

use std::panic::{catch_unwind, AssertUnwindSafe};

use pgtable_core::test_format::TestFormat;
use pgtable_core::{AddressSpace, Arena, NoopMmu, TlbGather, VirtAddr};

#[test]
fn unflushed_tlb_gather_dropped_while_unwinding_does_not_abort() {
    let r = catch_unwind(|| {
        let mut gather = TlbGather::new();
        gather.add_leaf(VirtAddr(0x1000), 0);
        assert!(!gather.is_empty());
        panic!("an operation fails while its gather holds work");
    });
    assert!(r.is_err());
}

#[test]
fn installed_address_space_dropped_while_unwinding_does_not_abort() {
    let mut s = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    let r = catch_unwind(AssertUnwindSafe(move || {
        // SAFETY: `NoopMmu` installs nothing; no CPU walks the tables.
        unsafe { s.install() };
        assert!(s.is_active());
        panic!("a caller fails while its address space is installed");
    }));
    assert!(r.is_err());
}
