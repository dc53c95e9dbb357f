//! What the kernel's own cases share: the counts and the one-line report
//! per case (`ok NAME` / `FAIL NAME: why`, the suite's format).

/// Why a case failed: a sentence and the value that broke it.
#[derive(Clone, Copy, Debug)]
pub struct Why(pub &'static str, pub u64);

/// A case's result.
pub type R = Result<(), Why>;

/// Fails with `what` and `v` unless `ok`.
pub fn ensure(ok: bool, what: &'static str, v: u64) -> R {
    if ok {
        Ok(())
    } else {
        Err(Why(what, v))
    }
}

/// Passed and failed cases.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    /// Cases that passed.
    pub passed: u32,
    /// Cases that failed.
    pub failed: u32,
}

impl Counts {
    /// Runs `f` as case `name` and reports it.
    pub fn case(&mut self, name: &str, f: impl FnOnce() -> R) {
        match f() {
            Ok(()) => {
                self.passed += 1;
                crate::println!("ok {name}");
            }
            Err(Why(what, v)) => {
                self.failed += 1;
                crate::println!("FAIL {name}: {what} ({v:#x})");
            }
        }
    }

    /// Both counts added.
    pub fn add(self, o: Counts) -> Counts {
        Counts {
            passed: self.passed + o.passed,
            failed: self.failed + o.failed,
        }
    }
}

/// Fills frame `pa` (identity-mapped) with `v` in its first word.
pub fn fill(pa: u64, v: u64) {
    // SAFETY: `pa` is one of the cases' frames (mem::CASE_FRAMES), RAM
    // nothing else uses, reached at its physical address.
    unsafe { (pa as *mut u64).write_volatile(v) };
}
