//! The random source: seeded, so a seed alone replays an episode.

/// SplitMix64: one `u64` of state, so a seed alone replays a sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    /// One of `xs`.
    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// The seed of episode `i` of a run with `seed`: episode 0 uses the seed
/// itself, so a printed episode seed replays that episode first.
pub fn episode_seed(seed: u64, i: u64) -> u64 {
    if i == 0 {
        seed
    } else {
        Rng::new(seed ^ i.wrapping_mul(0xd1b5_4a32_d192_ed03)).next()
    }
}
