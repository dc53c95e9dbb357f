//! The drop check is unwind-safe: an installed address space, dropped
//! while a panic unwinds through the caller, does not panic a second time
//! (which would abort the process instead of letting the first panic be
//! caught or reported). The same check of an unflushed TLB gather is a
//! unit test of `gather.rs`.
#![cfg(feature = "std")]

use std::panic::{catch_unwind, AssertUnwindSafe};

use pgtable_core::contract::{Arena, NoopMmu};
use pgtable_core::test_format::TestFormat;
use pgtable_core::AddressSpace;

#[test]
fn installed_address_space_dropped_while_unwinding_does_not_abort() {
    let mut s = AddressSpace::<TestFormat, _, _>::new(NoopMmu, Arena::new()).unwrap();
    let r = catch_unwind(AssertUnwindSafe(move || {
        // SAFETY: `NoopMmu` installs nothing; no CPU walks the tables.
        unsafe { s.install() };
        assert!(s.inspect().is_active());
        panic!("a caller fails while its address space is installed");
    }));
    assert!(r.is_err());
}
