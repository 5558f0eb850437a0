//! # mrstack's C ABI
//!
//! `libmrstack_c.so` / `libmrstack_c.a` and `include/mrstack.h`: mrstack stacks, built from text
//! configs, for programs outside Rust. A generic API ([`api`]: create, allocate, free, describe,
//! statistics as JSON, destroy) and the exact entry points each client's foreign-allocator door
//! calls: PyTorch ([`torch`]), CuPy ([`cupy`]), CV-CUDA ([`cvcuda`]) and TensorRT ([`tensorrt`],
//! with a header-only C++ adapter in `include/mrstack_tensorrt.hpp`).
//!
//! Errors return null or -1 and leave a thread-local message (`mrstack_last_error`). No panic
//! crosses the boundary: every entry point catches them. Handles are looked up, never
//! dereferenced, and never handed out twice, so a destroyed or forged handle is an error; every
//! free is checked against the blocks the stack handed out, so a foreign pointer or a double free
//! is an error too, until the stack hands the same address out again (a free that gives the size
//! also catches a second free of a block of another size there; CuPy's and TensorRT's frees give
//! none).

pub mod api;
pub mod cupy;
pub mod cvcuda;
pub mod env;
pub mod error;
pub mod stack;
pub mod tensorrt;
pub mod throwing;
pub mod torch;
