//! The built-in *random* workload: [`random`] draws it as a [`RandomConfig`] says.

use super::{Op, Workload};
use rand::{RngExt, SeedableRng};

/// The parameters of the *random* workload; [`Default`] gives the benchmark's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomConfig {
    /// Allocations to make (10,000).
    pub allocations: usize,
    /// Largest allocation: sizes are uniform in `[1, max_size]` (1 MiB).
    pub max_size: usize,
    /// Chance in percent that a step allocates rather than frees (73, as RMM's benchmark).
    pub alloc_percent: u32,
    /// Live bytes never exceed this (8 GiB): a step that would frees instead.
    pub max_live: usize,
    /// Seed of the generator (xoshiro256++, reproducible across platforms).
    pub seed: u64,
}

impl Default for RandomConfig {
    fn default() -> Self {
        RandomConfig {
            allocations: 10_000,
            max_size: 1 << 20,
            alloc_percent: 73,
            max_live: 8 << 30,
            seed: 0x6d72_7374_6163_6b00,
        }
    }
}

/// The *random* workload: `config.allocations` allocations with sizes uniform in
/// `[1, config.max_size]`, on stream 0. At each step a size is drawn, then the step allocates with
/// probability `alloc_percent`% while fewer than `allocations` were made and the block fits under
/// `max_live`, and otherwise frees a live block picked uniformly (it always allocates when nothing is
/// live). The blocks live at the end are freed in the order they are held. The same config always
/// gives the same ops.
///
/// Sizes are capped at `max_live` so that every step can make progress.
pub fn random(config: &RandomConfig) -> Workload {
    let mut rng = rand::rngs::Xoshiro256PlusPlus::seed_from_u64(config.seed);
    let max_size = config.max_size.min(config.max_live).max(1);
    let percent = config.alloc_percent.min(100);
    // Reserved up to a point: memory grows with the ops made, not with the number asked.
    let mut ops = Vec::with_capacity(config.allocations.min(1 << 20) * 2);
    let mut live: Vec<(usize, usize)> = Vec::new();
    let (mut live_bytes, mut made) = (0usize, 0usize);
    while made < config.allocations {
        let size = rng.random_range(1..=max_size);
        let allocate = live.is_empty()
            || (rng.random_ratio(percent, 100)
                && live_bytes
                    .checked_add(size)
                    .is_some_and(|n| n <= config.max_live));
        if allocate {
            ops.push(Op::Alloc {
                id: made,
                size,
                stream: 0,
            });
            live.push((made, size));
            live_bytes += size;
            made += 1;
        } else {
            let (id, size) = live.swap_remove(rng.random_range(0..live.len()));
            ops.push(Op::Free { id });
            live_bytes -= size;
        }
    }
    ops.extend(live.iter().map(|&(id, _)| Op::Free { id }));
    // The generator upholds every rule `Workload::new` checks, which also computes the peak.
    Workload::new("random", ops).expect("the random generator makes a valid op list")
}
