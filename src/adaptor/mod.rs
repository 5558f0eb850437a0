//! Adaptors: generic structs over an upstream resource, each with a `Layer` configuration so that
//! `resource_stack!` can build it. Suballocators carve the upstream's memory; behaviour adaptors
//! watch, cap or reshape requests and forward them.

mod arena;
mod binning;
mod fixed_size;
mod pool;
pub use arena::{Arena, ArenaConfig};
pub use binning::{Binning, BinningConfig};
pub use fixed_size::{FixedSize, FixedSizeConfig};
pub use pool::{Pool, PoolConfig, PoolStats};
