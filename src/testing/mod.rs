//! A conformance battery for [`MemoryResource`](crate::resource::MemoryResource) implementations, as RMM runs over every resource:
//! [`conformance`] checks a resource against the trait's rules, and [`Recorder`] is the upstream
//! that lets it see what reaches the layer below. Behind the cargo feature `testing` (off by
//! default), so that you can run the same battery over your own adaptors.
//!
//! [`DeviceStandIn`] is `DeviceAccessible` by its type and runs anywhere: code that needs device
//! memory (`R: Accessible<DeviceAccessible>`) can be unit-tested on a host-only CI. Its addresses
//! lie in a region of the process reserved with no access, so that the claim stays sound: see its
//! documentation.
//!
//! The battery checks, panicking with the resource's name and what broke:
//!
//! * **Bad requests are errors:** an alignment that is zero or not a power of two, and a size that
//!   overflows once aligned (up to `usize::MAX`), return `Err` with
//!   [`AllocErrorKind::InvalidArgument`](crate::resource::AllocErrorKind::InvalidArgument), and take nothing from the upstream.
//! * **Zero size:** `allocate(0, align)` returns a non-null pointer aligned to
//!   `max(align, R::Alignment)` and deallocating it is a no-op; neither reaches the upstream.
//! * **Alignment:** every pointer is aligned to `R::Alignment` and to the alignment asked, for
//!   every power of two up to [`Options::max_align`]; an alignment above `R::Alignment` may instead
//!   be refused with [`AllocErrorKind::Unsupported`](crate::resource::AllocErrorKind::Unsupported), never ignored.
//! * **No overlap under threads:** [`Options::threads`] threads allocate and free random sizes and
//!   alignments on the [`Options::streams`]; every allocation's range is checked disjoint from
//!   every live one, and a pattern written into it (host-accessible memory, or through
//!   [`Options::access`]) must survive until it is freed.
//! * **Stream order reaches the upstream:** `synchronize(b)` and `order_after(a, b)` return `Ok`,
//!   and with an [`Options::upstream`] record, the upstream saw `synchronize(b)` and
//!   `order_after(a, b)` (or a `synchronize(b)` in its place), as the trait's contract asks of
//!   every resource that has an upstream.
//! * **Everything goes back:** once every block is freed and the resource dropped, the upstream
//!   record has no byte in use, every upstream allocation was deallocated once with the size and
//!   alignment it was allocated with, and no zero-size request reached it.
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::suballoc::Pool;
//! use mrstack::testing::{conformance, Options, Recorder};
//!
//! // A pool over a recording upstream over a fake 1 GiB address space.
//! let upstream = Recorder::new(Simulated::new(1 << 30));
//! let pool = Pool::new(&upstream, Default::default());
//! let options = Options { upstream: Some(upstream.record()), ..Options::default() };
//! let report = conformance(pool, &options);
//! assert!(report.allocations > 0);
//! assert_eq!(upstream.inner().in_use(), 0);
//! ```

mod battery;
mod recorder;
mod stand_in;

pub use battery::{conformance, MemoryAccess, Options, Report};
pub use recorder::{Record, Recorder};
pub use stand_in::DeviceStandIn;
