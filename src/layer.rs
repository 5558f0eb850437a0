//! The configurations `resource_stack!` builds adaptors from, under the names the macro's lines use
//! (`Pool { max: 8 GiB }` is `layer::Pool { max: 8 << 30, ..Default::default() }`). Each implements
//! [`Layer`](crate::resource::Layer) over any suitable upstream.

pub use crate::adaptor::AlignedConfig as Aligned;
pub use crate::adaptor::GraphPoolsConfig as GraphPools;
pub use crate::adaptor::LimitingConfig as Limiting;
pub use crate::adaptor::LoggingConfig as Logging;
pub use crate::adaptor::PrefetchConfig as Prefetch;
pub use crate::adaptor::RetryConfig as Retry;
pub use crate::adaptor::StatisticsConfig as Statistics;
pub use crate::adaptor::ThreadCacheConfig as ThreadCache;
pub use crate::adaptor::TrackingConfig as Tracking;
pub use crate::suballoc::ArenaConfig as Arena;
pub use crate::suballoc::BinningConfig as Binning;
pub use crate::suballoc::FixedSizeConfig as FixedSize;
pub use crate::suballoc::PoolConfig as Pool;
pub use crate::suballoc::ThreadHeapsConfig as ThreadHeaps;
pub use crate::suballoc::TlsfConfig as Tlsf;
