//! Suballocators: resources that own memory taken from their upstream in chunks and carve it into
//! blocks, with free lists per stream. Each has a `Layer` configuration for `resource_stack!`,
//! gives its upstream's properties, guarantees 256-byte alignment, and returns every chunk to
//! the upstream when dropped.
//!
//! * [`Pool`]: coalescing best fit, the tightest.
//! * [`Tlsf`]: coalescing good fit in O(1) (two-level segregated fit), nearly as tight as `Pool`
//!   at a fraction of its cost.
//! * [`FixedSize`]: blocks of one size on a free list.
//! * [`Binning`]: power-of-two bins of fixed-size blocks over an upstream that serves the rest,
//!   the fastest.
//! * [`Arena`]: per-thread and per-stream arenas over a global one, for many threads.
//! * [`ThreadHeaps`]: a `Tlsf` per thread, for threads that free what they allocate.

/// `impl Layer<U> for Config` that builds `Resource::new(upstream, config)`: every suballocator's
/// configuration wraps its upstream that way.
macro_rules! layer_by_new {
    ($Config:ty => $Resource:ident) => {
        impl<U: $crate::resource::MemoryResource> $crate::resource::Layer<U> for $Config {
            type Resource = $Resource<U>;
            fn layer(self, upstream: U) -> $Resource<U> {
                $Resource::new(upstream, self)
            }
        }
    };
}

mod arena;
mod binning;
mod chunk_pool;
mod fixed_size;
mod free_list;
pub(crate) mod growth;
mod host_device_pair;
mod pool;
mod pool_state;
mod thread_heaps;
mod tlsf;
pub(crate) mod tlsf_index;
mod usage;

pub use arena::{Arena, ArenaConfig};
pub use binning::{Binning, BinningConfig};
pub use fixed_size::{FixedSize, FixedSizeConfig};
pub use host_device_pair::{HostDevicePair, HostDevicePairConfig, Storage};
pub use pool::{Pool, PoolConfig};
pub use thread_heaps::{ThreadHeaps, ThreadHeapsConfig};
pub use tlsf::{Tlsf, TlsfConfig};
pub use usage::Usage;
