//! The `space_` cases: what the split into a kernel space (upper half,
//! TTBR1_EL1) and lower-half spaces (TTBR0_EL1) must guarantee, judged by
//! the MMU through the probes and real EL0 runs.
//!
//! - No identity map is left once the kernel runs on its own tables.
//! - W^X for the kernel: a store to text or rodata faults, a fetch from
//!   rodata, data, the stack or the linear map faults, the linear alias of
//!   the text is read-only, the stack's guard page is unmapped. Controls:
//!   text executes, data takes stores (so a probe that always faulted
//!   would fail the cases).
//! - EL0: a user program runs and comes back through `SVC` with its
//!   result; its loads from kernel memory, its stores to its own code and
//!   its fetches from its data fault; the kernel cannot execute user
//!   memory (pgtable sets PXN on every user leaf); dropping the user
//!   space gives all its tables back.
//!
//! Each case prints `ok <name>` or `FAIL <name>: <reason>`, like the
//! suite's cases.

// A failed case carries its message inline (no allocation), so the error
// side of a case's `Result` is a few hundred bytes; failures are rare and
// nothing here is measured.
#![allow(clippy::result_large_err)]

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::geom::PAGE;
use crate::kmap::{Image, KernelSpace};
use crate::memory::{self, kimage_to_phys, phys_to_virt};
use crate::probe::{
    self, esr_class, is_permission_fault, is_translation_fault, Fault, EC_DABT_CUR, EC_DABT_LOWER,
    EC_IABT_CUR, EC_IABT_LOWER, EC_SVC64, RET,
};
use crate::user::{enter_user, UserExit, UserSpace, SVC_IMM, USER_CODE, USER_DATA};
use crate::{console, println};

/// A failure message (no allocation; longer text is cut).
pub(crate) struct Why {
    b: [u8; 240],
    n: usize,
}

impl Write for Why {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let take = s.len().min(self.b.len() - self.n);
        self.b[self.n..self.n + take].copy_from_slice(&s.as_bytes()[..take]);
        self.n += take;
        Ok(())
    }
}

impl Why {
    pub(crate) fn new(args: fmt::Arguments) -> Why {
        let mut w = Why { b: [0; 240], n: 0 };
        let _ = w.write_fmt(args);
        w
    }

    pub(crate) fn as_str(&self) -> &str {
        match core::str::from_utf8(&self.b[..self.n]) {
            Ok(s) => s,
            Err(e) => core::str::from_utf8(&self.b[..e.valid_up_to()]).unwrap_or(""),
        }
    }
}

pub(crate) type R = Result<(), Why>;

macro_rules! fail {
    ($($t:tt)*) => {
        return Err($crate::space::Why::new(format_args!($($t)*)))
    };
}

macro_rules! ensure {
    ($cond:expr, $($t:tt)*) => {
        if !$cond {
            fail!($($t)*);
        }
    };
}

pub(crate) use {ensure, fail};

/// Passed and failed counts.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Cases that passed.
    pub passed: u32,
    /// Cases that failed.
    pub failed: u32,
}

impl Tally {
    pub(crate) fn case(&mut self, name: &str, f: impl FnOnce() -> R) {
        match f() {
            Ok(()) => {
                println!("ok {name}");
                self.passed += 1;
            }
            Err(why) => {
                println!("FAIL {name}: {}", why.as_str());
                self.failed += 1;
            }
        }
    }
}

/// A rodata word (immutable static: `.rodata`).
static RODATA_WORD: u64 = 0x726f_6461_7461_2121;
/// A `RET` in rodata.
static RODATA_RET: u32 = RET;
/// A `RET` in data (interior mutability: `.data`).
static DATA_RET: AtomicU32 = AtomicU32::new(RET);
/// A data word the store control writes.
static DATA_WORD: AtomicU64 = AtomicU64::new(7);

extern "C" {
    /// A `ret` in the kernel text (the load probe's fixup).
    static pgk_probe_load_fixup: u8;
}

/// The address of a `ret` instruction in the kernel text.
fn text_ret() -> u64 {
    &raw const pgk_probe_load_fixup as u64
}

fn within(va: u64, r: (u64, u64)) -> bool {
    va >= r.0 && va < r.1
}

/// Expects `r` to be a permission fault of class `class` at `va`, a
/// store when `write`.
pub(crate) fn expect_permission(
    what: &str,
    r: Result<(), Fault>,
    class: u64,
    va: u64,
    write: bool,
) -> R {
    match r {
        Ok(()) => fail!("{what} at {va:#x} did not fault"),
        Err(f) => {
            ensure!(
                f.class() == class && f.is_permission() && f.far == va,
                "{what} at {va:#x}: ESR {:#x} (EC {:#x}) FAR {:#x}, expected a permission fault (EC {class:#x})",
                f.esr,
                f.class(),
                f.far
            );
            ensure!(
                class != EC_DABT_CUR || f.is_write() == write,
                "{what} at {va:#x}: ESR.WnR is {}",
                f.is_write()
            );
            Ok(())
        }
    }
}

/// An EL1 load from `va` that must return `want`.
pub(crate) fn load_is(what: &str, va: u64, want: u64) -> R {
    match probe::read_u64(va) {
        Ok(v) => ensure!(
            v == want,
            "{what}: {va:#x} reads {v:#x}, expected {want:#x}"
        ),
        Err(f) => fail!("{what}: a load from {va:#x} faulted: ESR {:#x}", f.esr),
    }
    Ok(())
}

/// An EL1 load from `va` that must take a translation fault.
pub(crate) fn load_faults(what: &str, va: u64) -> R {
    match probe::read_u64(va) {
        Ok(v) => fail!("{what}: {va:#x} still translates (reads {v:#x})"),
        Err(f) => ensure!(
            f.class() == EC_DABT_CUR && is_translation_fault(f.esr) && f.far == va,
            "{what}: a load from {va:#x}: ESR {:#x} FAR {:#x}, expected a translation fault",
            f.esr,
            f.far
        ),
    }
    Ok(())
}

/// A store of the word already there (so nothing changes if the MMU
/// wrongly allows it) must fault with a permission fault.
pub(crate) fn store_faults(what: &str, va: u64) -> R {
    let old = match probe::read_u64(va) {
        Ok(v) => v,
        Err(f) => fail!("{what} at {va:#x} is not readable: ESR {:#x}", f.esr),
    };
    // SAFETY: the store writes back the value just read, so even if it
    // went through, no memory would change.
    let r = unsafe { probe::write_u64(va, old) };
    expect_permission(what, r, EC_DABT_CUR, va, true)
}

/// An EL1 fetch of the `RET` at `va` must fault with a permission fault.
fn fetch_faults(what: &str, va: u64) -> R {
    // SAFETY: every caller passes the address of a RET instruction.
    let r = unsafe { probe::call_ret(va) };
    expect_permission(what, r, EC_IABT_CUR, va, false)
}

/// The cases on the kernel's own map (installed in TTBR1_EL1, with the
/// test space in TTBR0_EL1).
pub fn kernel_cases(t: &mut Tally, img: &Image) {
    t.case("space_no_identity_map", || {
        // The image's physical address was identity-mapped during boot.
        for pa in [img.start_pa, kimage_to_phys(img.text.0), console::UART_BASE] {
            match probe::read_u64(pa) {
                Ok(_) => fail!("a load from {pa:#x} still translates"),
                Err(f) => ensure!(
                    f.class() == EC_DABT_CUR && is_translation_fault(f.esr) && f.far == pa,
                    "a load from {pa:#x}: ESR {:#x}, expected a translation fault",
                    f.esr
                ),
            }
        }
        Ok(())
    });
    t.case("space_kernel_text_executes_and_data_takes_stores", || {
        // Controls for the cases below: the probes can succeed.
        let va = text_ret();
        ensure!(within(va, img.text), "{va:#x} is not in the text");
        // SAFETY: `va` is the `ret` of pgk_probe_load_fixup.
        if let Err(f) = unsafe { probe::call_ret(va) } {
            fail!("executing the text at {va:#x}: ESR {:#x}", f.esr);
        }
        let w = &raw const DATA_WORD as u64;
        ensure!(within(w, img.data), "{w:#x} is not in the data");
        // SAFETY: DATA_WORD is an atomic only the probe stores to here.
        if let Err(f) = unsafe { probe::write_u64(w, 0x5eed) } {
            fail!("a store to the data at {w:#x}: ESR {:#x}", f.esr);
        }
        ensure!(DATA_WORD.load(Relaxed) == 0x5eed, "the data store was lost");
        Ok(())
    });
    t.case("space_kernel_text_write_faults", || {
        let va = text_ret() & !7;
        ensure!(within(va, img.text), "{va:#x} is not in the text");
        store_faults("a store to the kernel text", va)
    });
    t.case("space_kernel_rodata_write_faults", || {
        let va = &raw const RODATA_WORD as u64;
        ensure!(within(va, img.rodata), "{va:#x} is not in the rodata");
        store_faults("a store to the kernel rodata", va)
    });
    t.case("space_kernel_rodata_exec_faults", || {
        let va = &raw const RODATA_RET as u64;
        ensure!(within(va, img.rodata), "{va:#x} is not in the rodata");
        fetch_faults("a fetch from the kernel rodata", va)
    });
    t.case("space_kernel_data_exec_faults", || {
        let va = DATA_RET.as_ptr() as u64;
        ensure!(within(va, img.data), "{va:#x} is not in the data");
        probe::sync_icache(va);
        fetch_faults("a fetch from the kernel data", va)
    });
    t.case("space_kernel_stack_exec_faults", || {
        let code = core::hint::black_box([RET, RET]);
        let va = code.as_ptr() as u64;
        ensure!(within(va, img.stack), "{va:#x} is not in the stack");
        probe::sync_icache(va);
        let r = fetch_faults("a fetch from the kernel stack", va);
        core::hint::black_box(&code);
        r
    });
    t.case("space_linear_map_exec_faults", || {
        // The linear aliases of a RET in the data and of one in the text.
        let data = phys_to_virt(kimage_to_phys(DATA_RET.as_ptr() as u64));
        fetch_faults("a fetch from the linear map (data)", data)?;
        let text = phys_to_virt(kimage_to_phys(text_ret()));
        fetch_faults("a fetch from the linear map (text)", text)
    });
    t.case("space_linear_alias_of_text_write_faults", || {
        let va = phys_to_virt(kimage_to_phys(text_ret() & !7));
        store_faults("a store to the linear alias of the text", va)
    });
    t.case("space_kernel_stack_guard_faults", || {
        let va = img.guard.0;
        match probe::read_u64(va) {
            Ok(_) => fail!("a load from the guard page {va:#x} did not fault"),
            Err(f) => ensure!(
                is_translation_fault(f.esr) && f.far == va,
                "a load from the guard page {va:#x}: ESR {:#x}, expected a translation fault",
                f.esr
            ),
        }
        Ok(())
    });
}

/// Checks that an EL0 run ended with an abort of `class` at `far`.
pub(crate) fn expect_user_abort(what: &str, e: UserExit, class: u64, far: u64) -> R {
    ensure!(
        esr_class(e.esr) == class && is_permission_fault(e.esr) && e.far == far,
        "{what}: ESR {:#x} (EC {:#x}) FAR {:#x} ELR {:#x}, expected a permission fault (EC {class:#x}) at {far:#x}",
        e.esr,
        esr_class(e.esr),
        e.far,
        e.elr
    );
    Ok(())
}

/// The EL0 cases. `test` is the suite's test space, installed in
/// TTBR0_EL1; a user space takes its place while they run and it is
/// installed again at the end. `frames` are two free pool frames.
pub fn user_cases(t: &mut Tally, kernel: &KernelSpace, test: &mut KernelSpace, frames: u64) {
    let (live_before, _) = memory::tables_live();
    let mut us = match UserSpace::new(kernel, frames) {
        Ok(us) => us,
        Err(e) => {
            t.case("space_user_roundtrip", || {
                fail!("building the user space: {e}")
            });
            return;
        }
    };
    // SAFETY: the user space maps only its two frames in the lower half;
    // the kernel runs on TTBR1_EL1, which this does not touch.
    unsafe { us.space.install() };
    let sp = USER_DATA + PAGE;

    t.case("space_user_roundtrip", || {
        us.set_data_word(0, 41);
        us.set_data_word(1, 0);
        // SAFETY: the user space is installed and maps the program.
        let e = unsafe { enter_user(USER_CODE, sp, USER_DATA, 0) };
        ensure!(
            esr_class(e.esr) == EC_SVC64 && e.esr & 0xffff == SVC_IMM,
            "EL0 came back with ESR {:#x} (EC {:#x}) FAR {:#x} ELR {:#x}, not its SVC #{SVC_IMM:#x}",
            e.esr,
            esr_class(e.esr),
            e.far,
            e.elr
        );
        ensure!(
            e.elr == USER_CODE + us.layout.after_svc,
            "SVC from {:#x}, expected {:#x}",
            e.elr,
            USER_CODE + us.layout.after_svc
        );
        ensure!(e.x0 == 42, "EL0 returned {}, expected 42", e.x0);
        ensure!(
            us.data_word(1) == 42,
            "EL0 stored {} in its data page, expected 42",
            us.data_word(1)
        );
        Ok(())
    });

    t.case("space_user_access_to_kernel_faults", || {
        let targets = [
            ("text", text_ret() & !7),
            ("rodata", &raw const RODATA_WORD as u64),
            ("data", &raw const DATA_WORD as u64),
            ("linear map", phys_to_virt(us.data_pa)),
            ("UART", console::UART_VA),
        ];
        for (what, va) in targets {
            // SAFETY: as above.
            let e = unsafe { enter_user(USER_CODE, sp, USER_DATA, va) };
            expect_user_abort(what, e, EC_DABT_LOWER, va)?;
            ensure!(
                e.elr == USER_CODE + us.layout.load,
                "{what}: the fault came from {:#x}, not the program's load",
                e.elr
            );
        }
        Ok(())
    });

    t.case("space_user_code_write_faults", || {
        // x0 = the code page: the program's load reads its own first
        // instruction, its store to [x0 + 8] must fault.
        // SAFETY: as above.
        let e = unsafe { enter_user(USER_CODE, sp, USER_CODE, 0) };
        expect_user_abort("a store to the user code", e, EC_DABT_LOWER, USER_CODE + 8)?;
        ensure!(e.esr & (1 << 6) != 0, "ESR.WnR is clear for the store");
        Ok(())
    });

    t.case("space_user_data_exec_faults", || {
        // SAFETY: as above; the data page is user execute-never.
        let e = unsafe { enter_user(USER_DATA, sp, 0, 0) };
        expect_user_abort(
            "an EL0 fetch from the user data",
            e,
            EC_IABT_LOWER,
            USER_DATA,
        )
    });

    t.case("space_kernel_cannot_execute_user_memory", || {
        // Words past the program and below the stack, so both stay intact.
        for (what, va) in [
            ("an EL1 fetch from user code", USER_CODE + PAGE - 8),
            ("an EL1 fetch from user data", USER_DATA + PAGE / 2),
        ] {
            // SAFETY: the user pages hold no Rust object; the probe puts
            // the old word back.
            match unsafe { probe::exec_faults(va) } {
                None => fail!("{what}: {va:#x} does not translate for EL1"),
                Some(r) => expect_permission(what, r, EC_IABT_CUR, va, false)?,
            }
        }
        Ok(())
    });

    // SAFETY: the test space maps nothing the kernel uses (the kernel runs
    // on TTBR1_EL1); installing it replaces the user space everywhere.
    unsafe { test.install() };
    // SAFETY: TTBR0_EL1 holds the test space again and its installation
    // ended with a full TLB flush (ASID 0, untagged), so nothing made from
    // the user tables is cached.
    unsafe { us.space.deactivate() };
    drop(us);
    t.case("space_user_space_frees_its_tables", || {
        let (live, _) = memory::tables_live();
        ensure!(
            live == live_before,
            "{live_before} table frames live before the user space, {live} after it was dropped"
        );
        Ok(())
    });
}
