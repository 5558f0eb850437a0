//! # mrstack: CUDA memory resources composed at compile time
//!
//! RAPIDS RMM's allocator stack — pools, binning, arenas, statistics, limits, logging — for Rust
//! hosts of GPU kernels (with [`cudarc`]), with the compiler checking what C++ leaves to comments:
//!
//! * every resource states in its type what memory it gives ([`HostAccessible`],
//!   [`DeviceAccessible`], [`Migratable`]) and the alignment it guarantees;
//! * adaptors are zero-cost generics (`Statistics<Binning<Pool<Cuda>>>`) and compute their
//!   properties from their upstream's;
//! * containers ([`DeviceBox`], [`DeviceVec`], [`PinnedVec`]) accept only resources whose
//!   properties fit, and, holding `&R`, cannot outlive the resource.
//!
//! ## A tour
//!
//! The trait is [`MemoryResource`]. Leaves call a driver ([`Cuda`], [`CudaAsync`], [`Managed`],
//! [`Pinned`]) or not ([`System`], [`Simulated`]); [`VirtualMemory`] maps physical pages of a
//! page source only under live blocks. [`resource_stack!`] builds a stack from a list, each line
//! wrapping the one above. Without a GPU, `Simulated` stands in for device memory:
//!
//! ```
//! use mrstack::prelude::*;
//!
//! # fn main() -> Result<(), AllocError> {
//! // A fake 1 GiB address space: exact accounting, no memory.
//! let gpu = Simulated::new(1 << 30);
//! let mr = resource_stack![&gpu];
//! let p = mr.allocate(1000, 256, StreamRef::DEFAULT)?;
//! assert_eq!(p.as_ptr() as usize % 256, 0);
//! assert_eq!(gpu.in_use(), 1000);
//! // SAFETY: p came from mr with this size and alignment.
//! unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
//! assert_eq!(gpu.in_use(), 0);
//!
//! // Bad requests are errors, never panics.
//! assert!(mr.allocate(8, 3, StreamRef::DEFAULT).is_err());
//! assert!(mr.allocate(usize::MAX, 1, StreamRef::DEFAULT).is_err());
//! # Ok(()) }
//! ```
//!
//! With a GPU, the same stack sits on `Cuda`, and containers take it by reference:
//!
//! ```no_run
//! use mrstack::prelude::*;
//!
//! # fn main() -> Result<(), AllocError> {
//! let ctx = mrstack::cuda_context(0)?; // Err(NoDriver) on a machine without CUDA
//! let stream = ctx.default_stream();
//! let mr = resource_stack![Cuda::new(&ctx)?];
//! let v = DeviceVec::from_slice(&[1u32, 2, 3], &mr, &stream)?;
//! assert_eq!(v.to_vec()?, [1, 2, 3]);
//! # Ok(()) }
//! ```
//!
//! The stack to start with on a GPU is [`PagedHeaps`] (`PagedHeaps::for_context(&ctx)?`, also
//! the C library's default): it maps physical pages only under live blocks, within the peak of
//! what is live and a 64th, and gives each stream a heap of its own, and each thread one where
//! more than four threads allocate on one stream at once.
//! [`guide::choosing`] says when another stack fits better.
//!
//! The compiler refuses what would be a bug at run time:
//!
//! ```compile_fail,E0277
//! use mrstack::prelude::*;
//! # fn f(stream: &std::sync::Arc<cudarc::driver::CudaStream>) {
//! // error: `System` does not give DeviceAccessible memory
//! let v = DeviceVec::<f32, _>::zeroed(10, System::new(), stream);
//! # }
//! ```
//!
//! ## Anatomy of an allocation
//!
//! One `DeviceVec::<f32, _>::zeroed(1000, &mr, &stream)` on
//! `mr: Statistics<Binning<Pool<Cuda>>>`, from the top down. Each step is a plain generic call:
//! the compiler sees the whole path and inlines it.
//!
//! 1. **The container** ([`container`]) checks at compile time that `mr` gives
//!    [`DeviceAccessible`] memory aligned enough for `f32`, computes the bytes (4000, an overflow is
//!    an `Err`), refuses cudarc's per-thread stream, and calls
//!    `mr.allocate(4000, 4, StreamRef::from(&stream))` ([`MemoryResource::allocate`]).
//! 2. **[`Statistics`](adaptor::Statistics)** checks the request (a bad alignment or a size near
//!    `usize::MAX` is an `Err` naming it; size 0 never reaches the upstream), passes it down
//!    unchanged, and on success adds to two atomic counters.
//! 3. **[`Binning`](suballoc::Binning)** checks again, picks the bin of 4096-byte blocks with one
//!    bit scan, locks that bin and pops a block from the free list of this stream
//!    (`suballoc/free_list.rs`). On an empty list it takes the blocks another stream freed, after
//!    `order_after(stream, other)` (an event, no host wait), or refills the bin from its upstream
//!    with one chunk of twice the blocks it holds.
//! 4. **[`Pool`](suballoc::Pool)** serves that refill, if it comes: under its lock, a best fit from
//!    this stream's free blocks, coalescing on free; with nothing that fits, blocks freed on another
//!    stream (again after `order_after`), else a new chunk from its own upstream, doubling.
//! 5. **[`Cuda`]** serves a pool's growth: makes its context current and calls `cuMemAlloc`
//!    (`leaf/driver.rs`), the only driver call on the path; it returns 256-byte aligned device
//!    memory.
//! 6. **Back in the container**, `cuMemsetD8Async` zeroes the 4000 bytes on `stream`, and the
//!    `DeviceVec` holds the pointer, its length, `&mr` and the stream.
//!
//! Dropping the vector calls `mr.deallocate(ptr, 4000, 4, stream)`: `Statistics` subtracts,
//! `Binning` pushes the block on this stream's list for immediate reuse by later work on the same
//! stream — no driver call, no wait. Memory reaches the driver again only when the `Binning` and
//! then the `Pool` are dropped (or [`Pool::release`](suballoc::Pool::release) is called): each
//! gives every chunk back to the resource it came from, on the stream it was taken on, after that
//! stream is ordered behind every stream that freed a block inside it.
//!
//! ## Modules
//!
//! * [`property`]: the property markers and [`Accessible`](property::Accessible).
//! * [`resource`]: [`MemoryResource`], [`Layer`], [`AllocError`]. [`stack`]: a stack described
//!   as text (`mr.describe()`) and a layer reached by type (`mr.reach()`, `mr.find::<T>()`).
//! * [`leaf`]: leaf resources. [`suballoc`]: the suballocators and their
//!   [`Usage`](suballoc::Usage) report. [`adaptor`]: behaviour adaptors. Each is configured by its
//!   `…Config` type beside it, which `resource_stack!`'s lines name without the suffix; [`units`]
//!   reads and shows byte sizes.
//! * `replay` (cargo feature `replay`, on by default): workloads (built, random, or RMM logs read
//!   by `replay::rmm_log`) replayed through stacks to time them and to find the smallest capacity
//!   they complete with.
//! * [`container`]: typed containers with cudarc interop, and [`HostAllocator`] for
//!   `allocator-api2` collections in host-accessible memory.
//! * [`erased`]: [`AnyResource`] and [`ResourceRef`], stacks chosen at run time with their
//!   properties still checked; [`registry`]: the per-device current resource; `config` (cargo
//!   feature `config`, on by default, and with `replay`): stacks built from text such as
//!   `"cuda > pool(initial=1GiB)"`.
//! * `testing` (cargo feature `testing`, off by default): the conformance battery every resource
//!   here passes, `testing::conformance`, and the recording upstream it reads, to run over your
//!   own resources.
//! * The `mrstack replay` command is the `mrstack-cli` package (`cli/` in the repository): the
//!   library carries none of its dependencies.
//!
//! [`AllocError`]: resource::AllocError
//! [`AnyResource`]: erased::AnyResource
//! [`Cuda`]: leaf::Cuda
//! [`CudaAsync`]: leaf::CudaAsync
//! [`DeviceAccessible`]: property::DeviceAccessible
//! [`DeviceBox`]: container::DeviceBox
//! [`DeviceVec`]: container::DeviceVec
//! [`HostAccessible`]: property::HostAccessible
//! [`HostAllocator`]: container::HostAllocator
//! [`Layer`]: resource::Layer
//! [`Managed`]: leaf::Managed
//! [`MemoryResource`]: resource::MemoryResource
//! [`MemoryResource::allocate`]: resource::MemoryResource::allocate
//! [`Migratable`]: property::Migratable
//! [`PagedHeaps`]: leaf::PagedHeaps
//! [`Pinned`]: leaf::Pinned
//! [`PinnedVec`]: container::PinnedVec
//! [`ResourceRef`]: erased::ResourceRef
//! [`Simulated`]: leaf::Simulated
//! [`System`]: leaf::System
//! [`VirtualMemory`]: leaf::VirtualMemory

#![cfg_attr(docsrs, feature(doc_cfg))]

extern crate self as mrstack;

#[doc(hidden)]
#[path = "macro_support.rs"]
pub mod __private;
pub mod adaptor;
#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub mod config;
pub mod container;
pub mod erased;
/// The guide: choosing a stack, streams, soundness, text configs, the C library, performance and
/// the architecture, as chapters of documentation.
pub mod guide;
mod hash;
pub mod leaf;
// The log format `Logging` writes, public through the replay's log reader: without it, the
// names `Logging` does not write are unused and unreachable.
#[cfg_attr(not(feature = "replay"), allow(dead_code, unreachable_pub))]
mod log_format;
pub mod property;
pub mod registry;
#[cfg(feature = "replay")]
#[cfg_attr(docsrs, doc(cfg(feature = "replay")))]
pub mod replay;
pub mod resource;
mod shard;
pub mod stack;
pub mod stream;
pub mod suballoc;
#[cfg(feature = "testing")]
pub mod testing;
pub mod units;
pub use leaf::driver::{cuda_context, device_count, driver_available, enable_peer_access};

/// The cudarc crate mrstack is built on, re-exported so that a program names the same version
/// (`mrstack::cudarc::driver::CudaStream`). Which CUDA version cudarc binds is the program's
/// choice: see the README's "CUDA versions" section.
pub use cudarc;

/// The `allocator-api2` crate [`HostAllocator`](container::HostAllocator) implements, re-exported so that its `Vec` and
/// `Box` match the version mrstack uses.
pub use allocator_api2;

/// Builds a resource stack from a list: the first item is a leaf resource (any expression of a
/// resource type), each following line wraps the one above through its [`Layer`](resource::Layer) configuration.
///
/// ```
/// use mrstack::prelude::*;
/// let sim = Simulated::new(1 << 30);
/// let bytes: usize = 64 << 20;
/// let mr = resource_stack![
///     &sim,
///     Pool { initial: 1.5 GiB, max: "2GB" }, // sizes: a number and its unit, or a string
///     Binning { min: 256 B, max: bytes },    // or any usize expression, taken as bytes
///     Statistics,
/// ];
/// # let _ = mr;
/// ```
///
/// A line is `Name`, `Name<Args>` or `Name { field: value, … }` (the configuration `NameConfig`
/// of mrstack's adaptor or suballocator `Name`, such as
/// [`suballoc::PoolConfig`], other fields defaulted), or any other
/// expression implementing `Layer`: write a configuration of your own as an expression
/// (`(MyLayer)`, `my_layer`, `MyLayer::new()`), since a bare capitalized name is taken for one of
/// mrstack's.
///
/// Sizes follow the convention of [`mrstack::units`](crate::units) (`KB` and `KiB` both 1024
/// bytes, decimals truncated to whole bytes) and are checked at compile time, as is
/// `Pool { initial: 2 GiB, max: 1 GiB }` (and `Binning`'s `min` above its `max`) when both sizes
/// are literals. A number literal in a size field needs its unit, so that `64` is never 64 bytes
/// by accident:
///
/// ```compile_fail
/// # use mrstack::prelude::*;
/// let mr = resource_stack![System::new(), Pool { initial: 64 }]; // error: write `64 B` or `64 MiB`
/// ```
///
/// A leaf constructor that returns a `Result` needs its `?`; without it, the one error is at the
/// leaf and says so:
///
/// ```compile_fail,E0277
/// # use mrstack::prelude::*;
/// # fn f() -> Result<(), AllocError> {
/// let ctx = mrstack::cuda_context(0)?;
/// let mr = resource_stack![Cuda::new(&ctx), Pool]; // error: add `?`
/// # Ok(()) }
/// ```
///
/// The grammar in full, and every rule for sizes:
pub use mrstack_macros::resource_stack;

/// The type-level numbers properties are made of (`typenum::U4096` for `Aligned<U4096>`).
pub use typenum;

/// The names a user of mrstack needs, in one `use`.
pub mod prelude {
    pub use crate::container::{DeviceBox, DeviceVec, PinnedVec};
    pub use crate::leaf::{Cuda, CudaAsync, Managed, PagedHeaps, Pinned, Simulated, System};
    pub use crate::property::{Accessible, DeviceAccessible, HostAccessible, Migratable, Pageable};
    pub use crate::resource::{AllocError, Layer, MemoryResource};
    pub use crate::stream::StreamRef;
    pub use mrstack_macros::resource_stack;
}

/// The README's examples, compiled as doctests so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
