//! Adaptors: generic structs over an upstream resource, each with a `Layer` configuration so that
//! `resource_stack!` can build it. Suballocators carve the upstream's memory; behaviour adaptors
//! watch, cap or reshape requests and forward them.

mod aligned;
mod arena;
mod binning;
mod fixed_size;
mod limiting;
mod logging;
mod pool;
mod prefetch;
mod retry;
mod statistics;
mod tracking;

pub use aligned::{Aligned, AlignedConfig};
pub use arena::{Arena, ArenaConfig};
pub use binning::{Binning, BinningConfig};
pub use fixed_size::{FixedSize, FixedSizeConfig};
pub use limiting::{Limiting, LimitingConfig};
pub use logging::{LogWriter, Logging, LoggingConfig, LOG_HEADER};
pub use pool::{Pool, PoolConfig, PoolStats};
pub use prefetch::{Prefetch, PrefetchConfig};
pub use retry::{Retry, RetryCallback, RetryConfig};
pub use statistics::{Counter, Statistics, StatisticsConfig, Stats};
pub use tracking::{Allocation, BadFree, BadFreeKind, Tracking, TrackingConfig};
