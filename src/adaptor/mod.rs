//! Adaptors: generic structs over an upstream resource, each with a `Layer` configuration so that
//! `resource_stack!` can build it. Suballocators carve the upstream's memory; behaviour adaptors
//! watch, cap or reshape requests and forward them.

mod arena;
pub use arena::{Arena, ArenaConfig};
