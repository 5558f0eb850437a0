//! Replaying allocation workloads through resource stacks, to time them ([`measure`]) and to find the smallest capacity they complete with ([`min_capacity`]).

mod measure;
mod metered;
mod presets;
mod random;
mod replayer;
pub mod rmm_log;
pub mod snapshot;
mod threaded;
mod workload;

pub use measure::{
    measure, measure_threads, min_capacity, Capacity, Timing, MAX_CAPACITY_FACTOR,
    MIN_CAPACITY_LIMIT,
};
pub use metered::{Metered, MeteredPages};
pub use presets::{simulated_streams, stack, stacks, timing_capacity, Paged, StackFactory};
pub use random::{random, RandomConfig};
pub use replayer::{Replay, ReplayError, Replayer, ALIGN};
pub use threaded::ThreadedReplayer;
pub use workload::{Op, Workload, WorkloadError, MAX_REPLAY_THREADS};
