//! The configurations `resource_stack!` builds adaptors from, under the names the macro's lines use
//! (`Pool { max: 8 GiB }` is `layer::Pool { max: 8 << 30, ..Default::default() }`). Each implements
//! [`Layer`](crate::resource::Layer) over any suitable upstream.

pub use crate::adaptor::AlignedConfig as Aligned;
pub use crate::adaptor::ArenaConfig as Arena;
pub use crate::adaptor::BinningConfig as Binning;
pub use crate::adaptor::FixedSizeConfig as FixedSize;
pub use crate::adaptor::GraphPoolsConfig as GraphPools;
pub use crate::adaptor::LimitingConfig as Limiting;
pub use crate::adaptor::LoggingConfig as Logging;
pub use crate::adaptor::PoolConfig as Pool;
pub use crate::adaptor::PrefetchConfig as Prefetch;
pub use crate::adaptor::RetryConfig as Retry;
pub use crate::adaptor::StatisticsConfig as Statistics;
pub use crate::adaptor::ThreadCacheConfig as ThreadCache;
pub use crate::adaptor::ThreadHeapsConfig as ThreadHeaps;
pub use crate::adaptor::TlsfConfig as Tlsf;
pub use crate::adaptor::TrackingConfig as Tracking;
