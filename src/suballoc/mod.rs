//! Suballocators: resources that own memory taken from their upstream in chunks and carve it into
//! blocks, with free lists per stream. Each has a `Layer` configuration for `resource_stack!`,
//! gives its upstream's properties, guarantees 256-byte alignment, and returns every chunk to
//! the upstream when dropped.
//!
//! * [`Pool`]: coalescing best fit, the tightest.
//! * [`FixedSize`]: blocks of one size on a free list.
//! * [`Binning`]: power-of-two bins of fixed-size blocks over an upstream that serves the rest,
//!   the fastest.
//! * [`Arena`]: per-thread and per-stream arenas over a global one, for many threads.

mod arena;
mod binning;
mod fixed_size;
mod free_list;
mod pool;
mod usage;

pub use arena::{Arena, ArenaConfig};
pub use binning::{Binning, BinningConfig};
pub use fixed_size::{FixedSize, FixedSizeConfig};
pub use pool::{Pool, PoolConfig};
pub use usage::Usage;
