//! Random operation sequences against a reference model, on the simulated
//! machine: one engine for every format, run by the `tests/model.rs` of
//! pgtable-core (the test formats) and of each arch crate (theirs).
//!
//! Each *episode* builds a fresh [`SimMachine`](pgtable_core::sim::SimMachine) and two address spaces
//! (by the episode seed: a space of both halves, of the lower or of the
//! upper half, each with an empty fork child; or a kernel space from
//! `new_kernel` and a user space from `new_user` sharing its kernel half,
//! both installed), and applies [`EPISODE_OPS`] random operations to one
//! of them (`Op::Switch` changes which): `map` (folded contiguous runs
//! and `no_contiguous()` maps), `unmap`, `unmap_with`, `change_protection`,
//! `change_protection_live`, `move_page_tables`, `install_pte` (pages and software entries),
//! `replace_pte`, `install_pte`, `ptep_set_access_flags`, `ptep_get`,
//! `test_and_clear_young`, `clear_refs`, `copy_page_range` into the other
//! space, and gathers of several `unmap` / `unmap_with` /
//! `change_protection` / `clear_refs` finished once (`gathered.rs`, the
//! one place that calls the gather API), some with a table allocation
//! failure injected, interleaved with loads and stores through the
//! simulated MMU, so the TLB holds entries the operations must flush and
//! the hardware sets accessed/dirty state the model predicts (on the whole
//! translation: a leaf, or the OR over a folded run). After every step it
//! checks:
//!
//! - the exact `Result` against the model (the documented error and its
//!   payload, the space's half included; out of memory exactly when the
//!   operation needs more tables than the allocator grants), and the
//!   value an operation returns (`replace_pte`, `test_and_clear_young`,
//!   `ptep_set_access_flags`, `ptep_get`) and every entry it reports
//!   (`ops.rs`);
//! - on error: the tables byte for byte as before (both spaces for a
//!   copy), no table frame leaked, nothing reported;
//! - on success: the tables the operation allocated, the translations of
//!   the changed ranges (a walk of the tables against the model's runs,
//!   and `translate` of the pages at the edges);
//! - every reachable table accounted for (`live_tables` against
//!   `count_tables`) and [`SimMachine::check`](pgtable_core::sim::SimMachine::check) clean (no stale TLB entry,
//!   no write the walker cannot see);
//! - every [`FULL_EVERY`] steps and at the end of the episode: every half
//!   both spaces translate against their models (accessed/dirty state
//!   included), `translate` of every page the episode touched, and no
//!   empty table left linked (but the pinned tables of a shared kernel
//!   half).
//!
//! # Why a seeded generator and not proptest
//!
//! The soak run (`cargo xtask soak`, a million operations per format)
//! needs raw speed and a replay handle that is one number: an episode is a
//! pure function of its seed, printed on failure. Generated operations
//! depend on the model (they aim at mapped pages, occupied destinations,
//! blocks covered in part), which proptest strategies express poorly.
//! Shrinking is done here on the operation list (greedy removal of chunks,
//! then of single operations, while the same kind of failure remains),
//! which is the shrink that matters for a sequence; values are already
//! drawn from a few boundary-shaped classes. No dependency is added to the
//! three crates.
//!
//! # Replaying
//!
//! - `PGTABLE_SOAK_OPS`: operations per format (default [`CI_OPS`], under
//!   Miri [`MIRI_OPS`]);
//! - `PGTABLE_SOAK_SEED`: the run's seed (decimal or `0x` hex). Episode 0
//!   of a run uses the seed itself, so the episode seed a failure prints
//!   replays that episode first. Without it the CI run uses a fixed seed
//!   per format and a soak run (`PGTABLE_SOAK_OPS` set) a fresh one.
//!
//! A failure report names the format, the seeds, the failing step and a
//! shrunk operation list written as the Rust calls that replay it.

mod checks;
mod episode;
mod gathered;
mod gen;
mod geometry;
mod ops;
mod oracle;
mod reference;

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;
use std::time::Instant;

use pgtable_core::contract::Arch;
use pgtable_core::{Error, PhysAddr, VaRange};

use episode::{Episode, Kind};
use gen::{episode_seed, Gen, Op};
use reference::{canonical, Model};

/// Operations per format in a plain `cargo test` run.
pub const CI_OPS: u64 = 4000;
/// Operations per format under Miri (`cargo xtask miri`), where every step
/// costs hundreds of times more: one episode of three [`FULL_EVERY`]
/// intervals. Every check of a step still runs, but the operations are too
/// few to reach every documented outcome, so that coverage check is left
/// to the native run.
pub const MIRI_OPS: u64 = 3 * FULL_EVERY;
/// Operations per episode (one fresh machine each).
pub const EPISODE_OPS: u64 = 150;
/// Steps between full checks of the whole address space.
pub const FULL_EVERY: u64 = 16;
/// Most leaf entries one generated map may write (keeps steps cheap).
const MAP_BUDGET: u64 = 4096;
/// Most pages whose translation is rechecked at full checks.
const TOUCHED_MAX: usize = 2048;

/// What to exercise for one format.
pub struct Config {
    /// Name printed in reports, e.g. `"arm64-4K-48bit"`.
    pub label: &'static str,
    /// Package of the test target, for the replay command.
    pub package: &'static str,
}

/// What went wrong at one step.
#[derive(Clone, Debug)]
pub struct Failure {
    /// A short class (`"result"`, `"unchanged"`, `"leak"`, `"tlb"`,
    /// `"tables"`, `"translate"`, `"touch"`, `"allocation"`, `"panic"`),
    /// kept while shrinking.
    pub kind: &'static str,
    /// The details.
    pub msg: String,
}

fn fail<T>(kind: &'static str, msg: String) -> Result<T, Failure> {
    Err(Failure { kind, msg })
}

/// Counts of outcomes, to show what a run exercised.
#[derive(Default, Debug)]
pub struct Tally {
    /// (operation, outcome) to count.
    pub outcomes: HashMap<(&'static str, String), u64>,
    /// Operations applied.
    pub ops: u64,
}

impl Tally {
    fn add(&mut self, op: &'static str, r: &Result<(), Error>) {
        let outcome = match r {
            Ok(()) => "Ok".to_string(),
            Err(e) => format!("{e:?}")
                .split('(')
                .next()
                .unwrap_or_default()
                .to_string(),
        };
        *self.outcomes.entry((op, outcome)).or_default() += 1;
    }

    fn note(&mut self, op: &'static str, outcome: &str) {
        *self.outcomes.entry((op, outcome.to_string())).or_default() += 1;
    }

    fn count(&self, outcome: &str) -> u64 {
        self.outcomes
            .iter()
            .filter(|((_, o), _)| o == outcome)
            .map(|(_, n)| n)
            .sum()
    }

    fn summary(&self) -> String {
        let mut v: Vec<_> = self.outcomes.iter().collect();
        v.sort();
        v.iter()
            .map(|((op, o), n)| format!("{op} {o} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

thread_local! {
    /// The episode running on this thread, for the panic hook: a panic
    /// inside an operation may abort the process (a second panic while
    /// unwinding), so the hook prints the replay information first.
    static TRACE: RefCell<Option<(String, Vec<Op>)>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

fn install_hook() {
    HOOK.call_once(|| {
        let prev = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(|q| q.get()) {
                // Shrinking: the failure is reported when it ends.
                return;
            }
            let printed = TRACE.with(|t| {
                let Ok(t) = t.try_borrow() else {
                    return false;
                };
                let Some((header, ops)) = t.as_ref() else {
                    return false;
                };
                // Straight to the process's stderr: the test harness's
                // capture is lost if the process aborts.
                let mut e = std::io::stderr().lock();
                let _ = writeln!(e, "{info}\n{header}, {} operations:", ops.len());
                for op in ops {
                    let _ = writeln!(e, "    {op};");
                }
                true
            });
            if !printed {
                prev(info);
            }
        }));
    });
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => v.replace('_', "").parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={v}: {e}")))
}

/// [`run`] for the format `A`, named `label`, whose test is in `package`
/// (the caller's `env!("CARGO_PKG_NAME")`, for the replay command).
pub fn run_format<A: Arch>(label: &'static str, package: &'static str) {
    run::<A>(&Config { label, package });
}

/// One model test a format: `name: Format = "label";` is a `#[test] fn
/// name` that calls [`run_format`] for `Format` with `label` and the
/// calling package (`env!("CARGO_PKG_NAME")` of the crate whose
/// `tests/model.rs` holds the list).
#[macro_export]
macro_rules! model_tests {
    ($($name:ident: $f:ty = $label:literal;)*) => {$(
        #[test]
        fn $name() {
            $crate::model::run_format::<$f>($label, env!("CARGO_PKG_NAME"));
        }
    )*};
}

/// Runs the model test for `A`: `PGTABLE_SOAK_OPS` operations (default
/// [`CI_OPS`]) from `PGTABLE_SOAK_SEED`, printing the seed, the count and
/// the time; panics with a replayable report on the first divergence.
pub fn run<A: Arch>(cfg: &Config) {
    install_hook();
    format_sanity::<A>();
    let soak = env_u64("PGTABLE_SOAK_OPS");
    let ops = soak.unwrap_or(if cfg!(miri) { MIRI_OPS } else { CI_OPS });
    let seed = env_u64("PGTABLE_SOAK_SEED").unwrap_or_else(|| {
        if soak.is_some() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            gen::Rng::new(t ^ fnv(cfg.label)).next()
        } else {
            fnv(cfg.label)
        }
    });
    let t0 = Instant::now();
    let mut tally = Tally::default();
    let mut episode = 0;
    while tally.ops < ops {
        let n = EPISODE_OPS.min(ops - tally.ops);
        let es = episode_seed(seed, episode);
        if let Err((log, at, f)) = run_episode::<A>(cfg, es, n, &mut tally) {
            report::<A>(cfg, seed, episode, es, &log, at, &f);
        }
        episode += 1;
    }
    println!(
        "model {}: seed {seed:#x}, {} operations in {:.2?} ({} episodes)\n    {}",
        cfg.label,
        tally.ops,
        t0.elapsed(),
        episode,
        tally.summary()
    );
    if soak.is_none() && !cfg!(miri) {
        // The CI run must have reached every documented outcome.
        for outcome in [
            "Ok",
            "ZeroLength",
            "MisalignedVirt",
            "MisalignedPhys",
            "MisalignedLength",
            "OutOfRange",
            "PhysOutOfRange",
            "AlreadyMapped",
            "Overlap",
            "OutOfMemory",
            "NotMapped",
            "BreakBeforeMake",
        ] {
            if outcome == "BreakBeforeMake" && !A::BREAK_BEFORE_MAKE {
                continue;
            }
            assert!(
                tally.count(outcome) > 0,
                "model {}: no operation returned {outcome} in {} operations (seed {seed:#x})",
                cfg.label,
                tally.ops
            );
        }
    }
}

/// FNV-1a of a label: a fixed seed per format.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

type EpisodeError = (Vec<Op>, usize, Failure);

/// One episode: generates and applies `n` operations (plus touches).
fn run_episode<A: Arch>(
    cfg: &Config,
    seed: u64,
    n: u64,
    tally: &mut Tally,
) -> Result<(), EpisodeError> {
    let mut gen = Gen::new::<A>(seed);
    let kind = Kind::of(seed);
    let mut ep = Episode::<A>::new(kind);
    TRACE.with(|t| {
        *t.borrow_mut() = Some((
            format!(
                "model {}: episode seed {seed:#x} ({kind:?} spaces; replay: PGTABLE_SOAK_SEED={seed:#x} PGTABLE_SOAK_OPS={EPISODE_OPS}), panicked at the last",
                cfg.label
            ),
            Vec::new(),
        ))
    });
    let mut log = Vec::new();
    let mut i = 0;
    let r = loop {
        if i == n {
            break ep.full_check(tally, true);
        }
        let swapped = ep.cur.model.some_swp(gen.rng.next());
        gen.range = ep.cur.range;
        let Some(op) = ep.refine(gen.op(&ep.cur.model, swapped), &mut gen) else {
            continue;
        };
        i += 1;
        let mut batch = vec![op];
        // Loads and stores, mostly of what the operation worked on.
        for _ in 0..gen.rng.below(3) {
            batch.push(ep.touch_op(&op, &mut gen));
        }
        let r = batch.into_iter().try_for_each(|op| {
            log.push(op);
            TRACE.with(|t| {
                if let Some((_, ops)) = t.borrow_mut().as_mut() {
                    ops.push(op);
                }
            });
            ep.step(&op, tally)
        });
        let r = r.and_then(|()| {
            if i % FULL_EVERY == 0 {
                ep.full_check(tally, false)
            } else {
                Ok(())
            }
        });
        if r.is_err() {
            break r;
        }
    };
    TRACE.with(|t| *t.borrow_mut() = None);
    let r = r.and_then(|()| ep.drop_check());
    r.map_err(|f| {
        let at = log.len().saturating_sub(1);
        (log, at, f)
    })
}

/// Prints the failure, shrinks the sequence and panics with the report.
fn report<A: Arch>(
    cfg: &Config,
    seed: u64,
    episode: u64,
    es: u64,
    log: &[Op],
    at: usize,
    f: &Failure,
) -> ! {
    let kind = Kind::of(es);
    let head = format!(
        "model {}: {}: {}\n  run seed {seed:#x}, episode {episode}, episode seed {es:#x} ({kind:?} spaces), step {at}\n  \
         replay: PGTABLE_SOAK_SEED={es:#x} PGTABLE_SOAK_OPS={EPISODE_OPS} cargo test -p {} --all-features --test model",
        cfg.label, f.kind, f.msg, cfg.package
    );
    // Before shrinking, which replays candidates and could abort on a
    // second panic.
    let _ = writeln!(std::io::stderr().lock(), "{head}");
    let ops = shrink::<A>(kind, &log[..=at], f.kind);
    let last = replay::<A>(kind, &ops).map_or_else(|| "?".to_string(), |f| f.msg);
    let list: String = ops.iter().map(|op| format!("    {op};\n")).collect();
    panic!(
        "{head}\n  shrunk to {} operations, failing with: {last}\n{list}",
        ops.len()
    );
}

/// Replays `ops` on a fresh machine: the first failure, if any.
fn replay<A: Arch>(kind: Kind, ops: &[Op]) -> Option<Failure> {
    QUIET.with(|q| q.set(true));
    let r = panic::catch_unwind(AssertUnwindSafe(|| {
        let mut ep = Episode::<A>::new(kind);
        let mut tally = Tally::default();
        for op in ops {
            ep.step(op, &mut tally)?;
        }
        ep.full_check(&mut tally, true)
    }));
    QUIET.with(|q| q.set(false));
    match r {
        Ok(r) => r.err(),
        Err(p) => Some(Failure {
            kind: "panic",
            msg: panic_msg(&p),
        }),
    }
}

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn panic_msg(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Greedy shrinking: drop chunks of halving size, then single operations,
/// while a failure of the same kind remains.
fn shrink<A: Arch>(spaces: Kind, ops: &[Op], kind: &str) -> Vec<Op> {
    let mut cur = ops.to_vec();
    let mut chunk = cur.len() / 2;
    let mut tries = 0;
    while chunk >= 1 && tries < 3000 {
        let mut i = 0;
        while i < cur.len() && tries < 3000 {
            let mut cand = cur.clone();
            cand.drain(i..(i + chunk).min(cur.len()));
            tries += 1;
            match replay::<A>(spaces, &cand) {
                Some(f) if f.kind == kind => cur = cand,
                _ => i += chunk,
            }
        }
        chunk /= 2;
    }
    cur
}

/// Checks that the format's protections round-trip and that
/// `VaRange::Both` is the canonical rule the model uses; called once per format.
fn format_sanity<A: Arch>() {
    let mut g = Gen::new::<A>(1);
    for _ in 0..256 {
        let p = g.prot();
        for h in 0..=2 {
            if A::leaf_allowed(h) {
                let raw = A::leaf(PhysAddr(0), p, h);
                assert_eq!(A::leaf_prot(raw, h), p, "{}: {p:?} at height {h}", A::NAME);
            }
        }
        let va = g.va(&Model::default(), 0);
        assert_eq!(
            VaRange::Both.contains::<A>(va),
            canonical::<A>(va),
            "{}: VaRange::Both.contains({va:#x})",
            A::NAME
        );
    }
}
