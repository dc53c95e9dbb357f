//! Where an address space may be live: a hart set in SBI hart-mask
//! windows.

use core::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// Harts as the SBI calls name them: bit `i` of `mask` is hart
/// `base + i`; `base` `u64::MAX` (-1) means every hart, `mask` ignored
/// (SBI specification, "Hart List Parameter").
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct HartMask {
    /// `hart_mask`.
    pub mask: u64,
    /// `hart_mask_base`.
    pub base: u64,
}

impl HartMask {
    /// Every hart (`hart_mask_base = -1`).
    pub const ALL: HartMask = HartMask {
        mask: 0,
        base: u64::MAX,
    };

    /// The window of hart `hart` alone.
    pub const fn single(hart: usize) -> HartMask {
        let hart = hart as u64;
        HartMask {
            mask: 1 << (hart % 64),
            base: hart - hart % 64,
        }
    }

    /// Whether `hart` is in the set.
    pub const fn contains(self, hart: usize) -> bool {
        let hart = hart as u64;
        if self.base == u64::MAX {
            return true;
        }
        match hart.checked_sub(self.base) {
            Some(i) if i < 64 => self.mask & (1 << i) != 0,
            _ => false,
        }
    }
}

/// The harts an address space may be live on (Linux `mm_cpumask`): hart
/// IDs `0..64 * WORDS` as bits, any other ID as "every hart" (a hart
/// whose ID does not fit is not lost: the flushes then go to every hart).
///
/// A hart's bit is set ([`add`](MmHarts::add)) before it switches to the
/// space and is never cleared: a fence for a hart that left is only
/// wasted.
pub struct MmHarts<const WORDS: usize = 1> {
    words: [AtomicU64; WORDS],
    /// A hart beyond the bitmap uses the space.
    beyond: AtomicBool,
    /// Remote fences on.
    remote: AtomicBool,
}

impl<const WORDS: usize> Default for MmHarts<WORDS> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const WORDS: usize> core::fmt::Debug for MmHarts<WORDS> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("MmHarts")
            .field("beyond", &self.beyond.load(Relaxed))
            .finish_non_exhaustive()
    }
}

impl<const WORDS: usize> MmHarts<WORDS> {
    /// Hart IDs tracked one by one.
    pub const HARTS: usize = 64 * WORDS;

    /// No hart yet, remote fences on.
    pub const fn new() -> MmHarts<WORDS> {
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        MmHarts {
            words: [ZERO; WORDS],
            beyond: AtomicBool::new(false),
            remote: AtomicBool::new(true),
        }
    }

    /// Marks `hart` as one the space may be live on; call before the hart
    /// switches to it.
    pub fn add(&self, hart: usize) {
        match self.words.get(hart / 64) {
            // Release: pairs with the Acquire of a flush that reads the
            // set after the hart's switch request (which follows this).
            Some(w) => {
                w.fetch_or(1 << (hart % 64), Release);
            }
            // Release: as above.
            None => self.beyond.store(true, Release),
        }
    }

    /// Whether `hart` may use the space.
    pub fn contains(&self, hart: usize) -> bool {
        // Acquire: see `add`.
        self.beyond.load(Acquire)
            || self
                .words
                .get(hart / 64)
                .is_some_and(|w| w.load(Acquire) & (1 << (hart % 64)) != 0)
    }

    /// Turns the remote fences on or off. Off, flushes reach the executing
    /// hart only, which breaks the contract on several harts: for a test
    /// that shows a case needs them.
    pub fn set_remote(&self, on: bool) {
        // Relaxed: a test switch, read by the flushes of the same hart.
        self.remote.store(on, Relaxed);
    }

    /// The windows of the harts other than `me` the space may be live on
    /// (none when remote fences are off; one [`HartMask::ALL`] when a hart
    /// beyond the bitmap uses the space).
    pub fn targets(&self, me: usize) -> Targets<'_, WORDS> {
        // Relaxed: a test switch (see `set_remote`).
        let on = self.remote.load(Relaxed);
        Targets {
            mm: self,
            me,
            next: if on { 0 } else { WORDS },
        }
    }
}

/// The iterator of [`MmHarts::targets`].
#[derive(Debug)]
pub struct Targets<'a, const WORDS: usize> {
    mm: &'a MmHarts<WORDS>,
    me: usize,
    /// The next word (`WORDS`: done).
    next: usize,
}

impl<const WORDS: usize> Iterator for Targets<'_, WORDS> {
    type Item = HartMask;

    fn next(&mut self) -> Option<HartMask> {
        // Acquire: see `MmHarts::add`.
        if self.next == 0 && self.mm.beyond.load(Acquire) {
            // Every hart (the executing one too, a wasted fence): the only
            // window that reaches an ID beyond the bitmap.
            self.next = WORDS;
            return Some(HartMask::ALL);
        }
        while self.next < WORDS {
            let w = self.next;
            self.next += 1;
            // Acquire: see `MmHarts::add`.
            let mut mask = self.mm.words[w].load(Acquire);
            if self.me / 64 == w {
                mask &= !(1 << (self.me % 64));
            }
            if mask != 0 {
                return Some(HartMask {
                    mask,
                    base: 64 * w as u64,
                });
            }
        }
        None
    }
}
