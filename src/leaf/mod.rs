//! Leaf resources: the bottom of every stack, each backed by one kind of memory.
//!
//! The CUDA ones (`Cuda`, `CudaAsync`, `CudaAsyncView`, `CudaAsyncManaged`, `Managed`, `Pinned`,
//! `VirtualMemory` over `DevicePages`) call the driver through cudarc's
//! dynamically loaded bindings, so the crate builds and runs with no CUDA toolkit: on a machine with
//! no driver their constructors return [`AllocErrorKind::NoDriver`](crate::resource::AllocErrorKind::NoDriver) instead of panicking.
//! `System` is host memory, `Simulated` hands out address ranges and no memory, for tests and replay;
//! `Callback` wraps a foreign allocator given as functions.

mod callback;
mod cuda;
mod cuda_async;
mod cuda_async_managed;
mod cuda_async_view;
pub(crate) mod driver;
mod imported_pool;
mod managed;
pub(crate) mod pages;
mod pinned;
mod sam_headroom;
mod simulated;
mod system;
mod virtual_memory;

pub use callback::{AllocateFn, Callback, DeallocateFn, OrderAfterFn, SynchronizeFn};
pub use cuda::Cuda;
pub(crate) use cuda_async::{pool_allocate, pool_free};
pub use cuda_async::{CudaAsync, CudaAsyncOptions};
pub use cuda_async_managed::CudaAsyncManaged;
pub use cuda_async_view::CudaAsyncView;
pub use imported_pool::{ImportedMemory, ImportedPool, IpcPointer};
pub use managed::Managed;
pub use pages::{DevicePages, PhysicalPages};
pub use pinned::Pinned;
pub use sam_headroom::SamHeadroom;
#[cfg(feature = "testing")]
pub(crate) use simulated::usage_accessors;
pub use simulated::Simulated;
pub use system::System;
pub use virtual_memory::{
    PagedHeaps, PagedHeapsConfig, VirtualMemory, VirtualMemoryConfig, VmUsage,
};

pub(crate) use driver::{
    context_leaf, cuda_context, driver_allocate, driver_available, driver_free, driver_order_after,
    driver_symbol, driver_synchronize, make_current, make_current_or_record, park_error, record,
    stream_in, synchronize_context,
};
