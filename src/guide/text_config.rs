//! Stacks at run time: text configs, describing a stack, reaching a layer, erased stacks, and the
//! size literals that `resource_stack!`, text configs and reports share.
//!
//! # Text configs
//!
//! [`config::build::<P>(text)`](crate::config::build) builds from text the stack
//! `resource_stack!` would, erased into an [`AnyResource<P>`](crate::erased::AnyResource):
//!
//! ```text
//! cuda > pool(initial=1GiB, max=8GiB) > binning(min=256KiB, max=4MiB) > statistics
//! ```
//!
//! * The text is a list of items separated by `>`, read bottom-up like the macro's lines: the
//!   first is a leaf resource, each next one an adaptor wrapping the one before. An item is a
//!   name, optionally followed by `(field=value, …)`; spaces around names, fields and values are
//!   free.
//! * Values are sizes (`4096`, `64 KiB`, `512MB`, `1.5GiB`, [below](#size-literals); a bare number
//!   is bytes here), whole numbers, booleans, or text; text with `,` `(` `)` `>` `=` or `"` in it
//!   goes in double quotes (`logging(path="a,b.csv")`, with `\"` and `\\` as escapes).
//! * Leaves: `cuda(device=0)`, `cuda_async(device=0, initial=…, release_threshold=…,
//!   exportable=…)`, `cuda_async_view`, `cuda_async_managed`, `managed(device=0)`,
//!   `pinned(device=0)`, `sam_headroom(headroom=…)`, `system`, `simulated(capacity=…)`,
//!   `vmm(device=0, max=…, cache=…, reservation=…, page=…, peak_slack=…)` (`VirtualMemory`
//!   over the device's pages; `vmm(simulated=64 MiB, …)` over a `Simulated` of that capacity,
//!   anywhere), `paged(device=0, cache=…, peak_slack=…, page=…)` (`PagedHeaps`, the same page
//!   sources).
//! * Suballocators: `pool(initial, max)`, `tlsf(initial, max)`, `binning(min, max, bins)`,
//!   `fixed_size(block_size)`, `arena(size, superblock)`, `thread_heaps(max)`. In `binning`,
//!   `bins="64 KiB = cuda_async; 1 MiB = cuda > fixed_size(block_size=1 MiB)"` gives bins
//!   resources of their own, each a stack of its own (one level deep), which the description
//!   writes back; a repeated bin size is an error.
//! * Adaptors: `statistics`, `tracking`, `logging(path)`, `limiting(limit)`,
//!   `thread_cache(bytes, max_block)`, `aligned(alignment)`, `prefetch`, `graph_pools`, and any
//!   the caller registers on a [`StackBuilder`](crate::config::StackBuilder).
//! * A stack has at most [`MAX_ITEMS`](crate::config::MAX_ITEMS) items. Every malformed input is
//!   an `Err` naming the column and the item: an unknown name, a bad size, a missing or unknown
//!   field, fields that contradict each other (`pool(initial=2MiB, max=1MiB)`), too many items, a
//!   leaf whose memory lacks a property of `P`, a resource that cannot be built. Nothing panics on
//!   any text.
//! * Cost: parsing is linear in the text; the built stack costs one virtual call per operation at
//!   its top, and each layer over an `AnyResource` one more.
//!
//! The [`config`](crate::config) module docs give the grammar in full and the type of each layer
//! of a text stack (`Pool<AnyResource<P>>`, …). The C library's `MRSTACK_STACK` is such a text
//! ([C library](super::c_library)).
//!
//! ```
//! use mrstack::prelude::*;
//!
//! let mr = mrstack::config::build::<()>("simulated(capacity=1GiB) > pool > statistics").unwrap();
//! let p = mr.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap();
//! assert_eq!(mr.statistics().unwrap().stats().bytes.current, 1 << 20);
//! // SAFETY: p came from mr with this size and alignment.
//! unsafe { mr.deallocate(p, 1 << 20, 256, StreamRef::DEFAULT) };
//!
//! let err = mrstack::config::build::<DeviceAccessible>("system").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "column 1: `system` gives HostAccessible + Pageable memory, but the stack must give DeviceAccessible"
//! );
//! assert!(mrstack::config::build::<()>("simulated(capacity=1GiB) > pool(initial=2MiB, max=1MiB)").is_err());
//! ```
//!
//! # Describing a stack, reaching a layer
//!
//! Every stack, built by `resource_stack!` or from text, erased or not, prints itself in the text
//! syntax, leaf first, with exact sizes. A text stack's description builds the same stack again:
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::{adaptor::Tracking, stack::Reach};
//!
//! let mr = resource_stack![Simulated::new(1 << 30), Pool { initial: 64 MiB }, Binning, Tracking, Statistics];
//! assert_eq!(
//!     mr.describe().to_string(),
//!     "simulated(capacity=1 GiB) > pool(initial=64 MiB) > binning(min=256 B, max=1 MiB) > tracking > statistics"
//! );
//!
//! // A layer by its type, the types below left to the compiler (no `.upstream().upstream()`):
//! let tracking: &Tracking<_> = mr.reach();
//! assert_eq!(tracking.outstanding_count(), 0);
//!
//! // Through erased layers at run time: a stack from text.
//! let text = mrstack::config::build::<()>("simulated(capacity=1GiB) > pool > statistics").unwrap();
//! assert_eq!(text.statistics().unwrap().stats().bytes.current, 0);
//! assert!(text.find::<Simulated>().is_some());
//! let again = mrstack::config::build::<()>(&text.describe().to_string()).unwrap();
//! assert_eq!(again.describe().to_string(), text.describe().to_string());
//! ```
//!
//! `mr.reach()` ([`Reach`](crate::stack::Reach)) goes through the crate's adaptors,
//! suballocators, `&R` and `Arc<R>`, and a layer that is not there is a compile error naming it.
//! `find::<T>()` ([`AnyLayer`](crate::stack::AnyLayer)) walks any `'static` stack at run time,
//! through `AnyResource`; `statistics()` and `tracking()` name the two most wanted. An adaptor of
//! your own describes itself with [`ItemWriter`](crate::stack::ItemWriter).
//!
//! # Choosing at run time
//!
//! * [`AnyResource<P>`](crate::erased::AnyResource) holds any stack whose properties include `P`, for
//!   example `AnyResource<DeviceAccessible>` or `AnyResource<(HostAccessible, DeviceAccessible)>`.
//!   The check happens at compile time, and each operation costs one virtual call.
//!   [`ResourceRef<'a, P>`](crate::erased::ResourceRef) is the borrowed form.
//! * A per-device current resource works like RMM's ([`registry`](crate::registry)):
//!   `set_current_device_resource`, `current_device_resource`, and
//!   `DeviceVec::zeroed_in_current(len, &stream)`.
//! * [`Callback`](crate::leaf::Callback) wraps a foreign allocator. You provide the functions and a
//!   context, and you state the properties at the type level.
//! * [`HostAllocator<R>`](crate::container::HostAllocator) implements `allocator_api2::alloc::Allocator` over
//!   pageable host memory (`R: Accessible<Pageable>`: `System`, every adaptor and suballocator over
//!   it, and `AnyResource<Pageable>`), so `allocator_api2::vec::Vec<T, HostAllocator<&Pool<System>>>`
//!   works ([soundness](super::soundness) says why not over pinned or managed memory).
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::erased::AnyResource;
//!
//! fn pick(small: bool) -> AnyResource<()> {
//!     if small {
//!         AnyResource::new(resource_stack![Simulated::new(1 << 20), Tlsf { initial: 1 MiB }])
//!     } else {
//!         AnyResource::new(resource_stack![Simulated::new(1 << 30), Pool, Binning])
//!     }
//! }
//!
//! let mr = pick(true);
//! assert!(mr.allocate(2 << 20, 256, StreamRef::DEFAULT).is_err()); // past its 1 MiB
//! ```
//!
//! # Size literals
//!
//! Sizes follow one convention, written once in the crate docs of `mrstack-units`
//! (`units/src/lib.rs`) and shared by `resource_stack!`, text configs and reports:
//! `KB`/`MB`/`GB`/`TB` and `KiB`/`MiB`/`GiB`/`TiB` are both powers of 1024, as Holoscan reads
//! `"512MB"` and PyTorch its `_mb` settings, and decimals are truncated to whole bytes (`"1.5GB"`
//! is 1.5 · 2^30 bytes).
//!
//! `resource_stack!` checks sizes at compile time. A size field (`Pool`'s `initial` and `max`,
//! `Binning`'s `min` and `max`, `Arena`'s `size` and `superblock`, `FixedSize`'s `block_size`,
//! `Limiting`'s `limit`) takes a number literal and its unit, with or without a space (`512 MiB`,
//! `1.5 GiB`, `64KB`, `4096 B`), a string (`"512MB"`, `"1.5GB"`), or any other `usize`
//! expression, taken as bytes (`1 << 30`, `n * 1024`, `my_bytes`). A number literal without a
//! unit (`initial: 64`) is an error, not 64 bytes: write `64 B`. A unit follows a number literal
//! only: `n GiB` and `64 * 1024 MiB` are errors that show the expression to write (`n << 30`). A
//! bad unit, a size that overflows, or `Pool`'s `initial` above its `max` (`Binning`'s `min` above
//! its `max`) when both are literal sizes, is a compile error on that line. The macro's docs
//! ([`resource_stack!`](crate::resource_stack)) state its whole grammar. In text configs
//! (`pool(initial=1.5GB)`) the same contradictions are errors at the column of the field.
//!
//! ```
//! use mrstack::prelude::*;
//!
//! let bytes: usize = 2 << 20;
//! let mr = resource_stack![
//!     Simulated::new(4 << 30),
//!     Pool { initial: 1.5 GiB, max: "2GB" },
//!     Binning { min: 256 B, max: bytes },
//! ];
//! assert_eq!(
//!     mr.describe().to_string(),
//!     "simulated(capacity=4 GiB) > pool(initial=1536 MiB, max=2 GiB) > binning(min=256 B, max=2 MiB)"
//! );
//! ```
//!
//! ```compile_fail
//! # use mrstack::prelude::*;
//! let mr = resource_stack![System::new(), Pool { initial: 64 }]; // error: write `64 B` or `64 MiB`
//! ```
