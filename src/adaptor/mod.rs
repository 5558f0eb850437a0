//! Behaviour adaptors: generic structs over an upstream resource, each with a `Layer`
//! configuration so that `resource_stack!` can build it. They watch, cap or reshape requests and
//! forward them; the memory stays the upstream's. The suballocators, which carve memory of their
//! own, are in [`suballoc`](crate::suballoc) and re-exported here under their former paths.

mod aligned;
mod graph_pools;
mod limiting;
mod logging;
mod prefetch;
mod retry;
mod statistics;
mod thread_cache;
mod tracking;

/// The header line `Logging` writes first: `replay::rmm_log::HEADER`, which reads it.
pub use aligned::{Aligned, AlignedConfig};
pub use graph_pools::{CapturedGraph, GraphPools, GraphPoolsConfig};
pub use limiting::{Limiting, LimitingConfig};
pub use logging::{LogWriter, Logging, LoggingConfig};
pub use prefetch::{Prefetch, PrefetchConfig};
pub use retry::{Retry, RetryCallback, RetryConfig};
pub use statistics::{Counter, Statistics, StatisticsConfig, Stats};
pub use thread_cache::{ThreadCache, ThreadCacheConfig};
pub use tracking::{Allocation, BadFree, BadFreeKind, Tracking, TrackingConfig};
