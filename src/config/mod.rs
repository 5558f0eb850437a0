//! Resource stacks from text, for tools and configuration files:
//! `"cuda > pool(initial=1GiB, max=8GiB) > binning(min=256KiB, max=4MiB) > statistics"` builds the
//! stack `resource_stack!` would, erased into an [`AnyResource<P>`].
//!
//! The text is a list of items separated by `>`, read bottom-up like the macro's lines: the first
//! is a leaf resource, each next one an adaptor wrapping the one before. An item is a name,
//! optionally followed by `(field=value, …)`. Values are sizes (`4096`, `64 KiB`, `512MB`,
//! `1.5GiB`, read by the macro's convention: `MB` = `MiB` = 2^20 bytes and decimals truncated to
//! whole bytes, as the [`mrstack_units`] crate docs write once; a bare number is bytes here, where
//! the macro asks a number literal for its unit),
//! whole numbers, or text; text with `,` `(` `)` `>` `=` or `"` in it goes in double quotes
//! (`logging(path="a,b.csv")`, with `\"` and `\\` as escapes).
//!
//! Leaves: `cuda(device=0)`, `cuda_async(device=0, initial=…, release_threshold=…)`,
//! `managed(device=0)`, `pinned(device=0)`, `system`, `simulated(capacity=…)`,
//! `vmm(device=0, max=…, cache=…, reservation=…, page=…, peak_slack=…)` ([`VirtualMemory`](crate::leaf::VirtualMemory)
//! over the device's pages; `vmm(simulated=64 MiB, …)` over a `Simulated` of that capacity,
//! for tests), `paged(device=0, cache=…, peak_slack=…, page=…)` ([`PagedHeaps`](crate::leaf::PagedHeaps),
//! over the same page sources). Adaptors: those
//! registered on the [`StackBuilder`] (the crate's own, and any the caller adds with
//! [`StackBuilder::with_adaptor`]).
//!
//! A stack has at most [`MAX_ITEMS`] items (the leaf included). The suballocators are built with
//! their fallible constructors (`Pool::try_new`, …), so an initial reservation the upstream
//! refuses is an error, not a pool that starts empty.
//!
//! Every malformed input is an `Err` naming the column and the item: an unknown name, a bad size,
//! a missing or unknown field, fields that contradict each other (`pool(initial=2MiB, max=1MiB)`,
//! `binning(min=4MiB, max=256KiB)`), too many items, a leaf whose memory lacks a property of `P`,
//! a resource that cannot be built. Nothing panics on any text. Cost: parsing is linear in the
//! text; the built stack costs one virtual call per operation at its top (each adaptor layer over
//! an `AnyResource` adds one more).
//!
//! A built stack describes itself in this syntax ([`describe`](crate::resource::MemoryResource::describe)),
//! with every size exact, so that the description builds the same stack again.
//!
//! # The types of a text stack's layers
//!
//! Each item is erased on its own: a stack `P` built from text is an [`AnyResource<P>`] holding
//! the top item's resource, whose upstream is an `AnyResource<P>` holding the item below, and so
//! on down to the leaf. So the layers have these types, which [`AnyResource::find`] takes (and
//! [`AnyResource::statistics`] and [`AnyResource::tracking`] name for you):
//!
//! | item | layer |
//! |---|---|
//! | `cuda`, `cuda_async`, `managed`, `pinned`, `system`, `simulated` | [`Cuda`](crate::leaf::Cuda), [`CudaAsync`](crate::leaf::CudaAsync), [`Managed`](crate::leaf::Managed), [`Pinned`](crate::leaf::Pinned), [`System`](crate::leaf::System), [`Simulated`](crate::leaf::Simulated) |
//! | `vmm(device=…)`, `vmm(simulated=…)` | `VirtualMemory<DevicePages>`, `VirtualMemory<Simulated>` ([`leaf`](crate::leaf)) |
//! | `paged(device=…)`, `paged(simulated=…)` | `PagedHeaps<DevicePages>`, `PagedHeaps<Arc<Simulated>>` ([`leaf`](crate::leaf)) |
//! | `pool`, `tlsf`, `binning`, `fixed_size`, `arena`, `thread_heaps` | `Pool<AnyResource<P>>`, `Tlsf<…>`, `Binning<…>`, `FixedSize<…>`, `Arena<…>`, `ThreadHeaps<…>` ([`suballoc`](crate::suballoc)) |
//! | `statistics`, `tracking`, `limiting`, `thread_cache`, `graph_pools` | `Statistics<AnyResource<P>>`, `Tracking<…>`, `Limiting<…>`, `ThreadCache<…>`, `GraphPools<…>` ([`adaptor`](crate::adaptor)) |
//! | `logging` | `Logging<AnyResource<P>>` (its writer is the boxed [`LogWriter`](crate::adaptor::LogWriter)) |
//! | `aligned(alignment=4096)` | `Aligned<U4096, AnyResource<P>>` (`U256`, `U512`, `U1024`, `U4096`) |
//! | `prefetch` | `Prefetch<AnyResource<(HostAccessible, DeviceAccessible, Migratable)>>` (what is below, cast to managed memory) |
//!
//! An adaptor registered by [`StackBuilder::with_layer::<C>`](StackBuilder::with_layer) is
//! `C::Resource` over `AnyResource<P>`.
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::{erased::AnyResource, stack::Reach};
//! use mrstack::suballoc::Pool;
//!
//! let text = "simulated(capacity=1GiB) > pool(initial=1MiB) > tracking";
//! let mr = mrstack::config::build::<()>(text).unwrap();
//! assert_eq!(mr.describe().to_string(), "simulated(capacity=1 GiB) > pool(initial=1 MiB) > tracking");
//! assert_eq!(mr.find::<Pool<AnyResource<()>>>().unwrap().usage().held, 1 << 20);
//! assert_eq!(mr.tracking().unwrap().outstanding_count(), 0);
//! ```
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::config;
//!
//! let mr = config::build::<()>("simulated(capacity = 1 GiB)").unwrap();
//! let p = mr.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap();
//! // SAFETY: p came from mr with this size and alignment.
//! unsafe { mr.deallocate(p, 1 << 20, 256, StreamRef::DEFAULT) };
//!
//! let err = config::build::<DeviceAccessible>("system").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "column 1: `system` gives HostAccessible + Pageable memory, but the stack must give DeviceAccessible"
//! );
//! ```

mod adaptors;
mod error;
mod leaves;
mod parser;
mod spec;

pub use error::{ConfigError, ConfigErrorKind};
pub use spec::{FieldSpec, ItemSpec, StackSpec};

use crate::erased::{AnyResource, PropertySet};
use crate::resource::{AllocError, Layer, MemoryResource};
use leaves::{leaf, LEAVES};
use std::fmt;

/// The most items a text stack may have, the leaf included: far more than a real stack uses
/// (a leaf, a suballocator or two and a few adaptors), and few enough that the nested calls of
/// one allocation through every layer stay far from the bottom of a thread's stack. Item
/// `MAX_ITEMS + 1` is a [`ConfigErrorKind::TooDeep`] error at its column.
pub const MAX_ITEMS: usize = 64;

/// A [`Layer`] configuration that text can describe: it reads its own fields from an item such as
/// `pool(initial=1GiB, max=8GiB)` with [`ItemSpec`]'s readers, and refuses fields it does not
/// take. [`StackBuilder::with_layer`] registers it under a name.
///
/// ```
/// use mrstack::config::{ConfigError, FromItem, ItemSpec, StackBuilder};
/// use mrstack::prelude::*;
/// use mrstack::adaptor::Limiting;
///
/// /// A caller's own configuration, with one field.
/// struct Cap { bytes: usize }
/// impl FromItem for Cap {
///     fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
///         item.check_fields(&["bytes"])?;
///         Ok(Cap { bytes: item.required_size("bytes")? })
///     }
/// }
/// impl<U: MemoryResource> Layer<U> for Cap {
///     type Resource = Limiting<U>;
///     fn layer(self, upstream: U) -> Limiting<U> {
///         Limiting::new(upstream, self.bytes)
///     }
/// }
///
/// let builder = StackBuilder::<()>::new().with_layer::<Cap>("cap");
/// let mr = builder.build("simulated(capacity=1GiB) > cap(bytes=1MiB)").unwrap();
/// assert!(mr.allocate(2 << 20, 256, StreamRef::DEFAULT).is_err());
/// let err = builder.build("simulated(capacity=1GiB) > cap(bites=1)").unwrap_err();
/// assert_eq!(err.to_string(), "column 32: `cap` has no field `bites`; it takes bytes");
/// ```
pub trait FromItem: Sized {
    /// The configuration `item` describes; `Err` naming the field for a bad or unknown one.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError>;
}

type AdaptorFn<P> =
    dyn Fn(&ItemSpec, AnyResource<P>) -> Result<AnyResource<P>, ConfigError> + Send + Sync;
type LeafFn<P> = dyn Fn(AnyResource<P>) -> AnyResource<P> + Send + Sync;

/// Builds stacks from text: the leaves above and the adaptors registered by name.
///
/// ```
/// use mrstack::config::StackBuilder;
/// use mrstack::prelude::*;
///
/// // A caller's own adaptor, taking one field.
/// struct Tag(&'static str);
/// let builder = StackBuilder::<()>::new().with_adaptor("tagged", |item, below| {
///     item.check_fields(&["label"])?;
///     item.text("label").ok_or_else(|| item.missing("label"))?;
///     Ok(below) // a real adaptor would wrap `below`, e.g. with `item.layer(config, below)`
/// });
/// assert!(builder.build("simulated(capacity=1MiB) > tagged(label=\"a, b\")").is_ok());
/// let err = builder.build("simulated(capacity=1MiB) > tagged").unwrap_err();
/// assert_eq!(err.to_string(), "column 28: `tagged` needs the field `label`");
/// ```
pub struct StackBuilder<P: PropertySet> {
    adaptors: Vec<(String, Box<AdaptorFn<P>>)>,
    /// Wraps the leaf before the first item above it takes it.
    around_leaf: Option<Box<LeafFn<P>>>,
    /// The device of a CUDA leaf whose text names none.
    device: usize,
}

impl<P: PropertySet> StackBuilder<P> {
    /// A builder that knows the leaves and this crate's adaptors.
    pub fn new() -> Self {
        Self::without_adaptors().with_crate_adaptors()
    }

    /// A builder that knows the leaves only.
    pub fn without_adaptors() -> Self {
        StackBuilder {
            adaptors: Vec::new(),
            around_leaf: None,
            device: 0,
        }
    }

    /// Builds CUDA leaves that name no `device` on device `device` (0 unless set): one text
    /// config for every device of a host, as the C library's per-device stacks use it.
    pub fn on_device(mut self, device: usize) -> Self {
        self.device = device;
        self
    }

    /// Registers this crate's adaptors under their text names; `new` calls it. Each is one
    /// `with_adaptor(name, |item, below| …)` that checks the item's fields, builds the adaptor's
    /// `Layer` configuration from them and ends with [`ItemSpec::layer`]; an adaptor that needs a
    /// property of its upstream (`prefetch`: `Migratable`) first takes it with
    /// [`AnyResource::try_cast`]. The suballocators are built with their `try_new`, so that an
    /// initial reservation the upstream refuses is an error. A name not registered here is an
    /// unknown adaptor.
    fn with_crate_adaptors(self) -> Self {
        use crate::__private::layer;
        use crate::suballoc::{Arena, FixedSize, Pool, Tlsf};
        self.with_suballocator("pool", Pool::try_new)
            .with_suballocator("tlsf", Tlsf::try_new)
            // Its `bins` are stacks of their own, built here too.
            .with_adaptor("binning", adaptors::binning_from_item)
            .with_suballocator("fixed_size", FixedSize::try_new)
            .with_suballocator("arena", Arena::try_new)
            .with_layer::<layer::Statistics>("statistics")
            .with_layer::<layer::Tracking>("tracking")
            .with_layer::<layer::Limiting>("limiting")
            .with_layer::<layer::GraphPools>("graph_pools")
            .with_layer::<layer::ThreadCache>("thread_cache")
            .with_layer::<layer::ThreadHeaps>("thread_heaps")
            // Logging keeps its file's path, which its configuration has no room for.
            .with_adaptor("logging", adaptors::logging_from_item)
            // The alignment is a type parameter and prefetch needs a property of what is below:
            // each picks its resource type from the text at run time.
            .with_adaptor("aligned", adaptors::aligned_from_item)
            .with_adaptor("prefetch", adaptors::prefetch_from_item)
    }

    /// Registers the adaptor that configuration `C` builds under `name`; `C` reads its own fields
    /// from the item ([`FromItem`]). The crate's adaptors are registered this way.
    pub fn with_layer<C>(self, name: &str) -> Self
    where
        C: FromItem + Layer<AnyResource<P>> + 'static,
        C::Resource: Send + Sync + 'static,
    {
        self.with_adaptor(name, |item, below| item.layer(C::from_item(item)?, below))
    }

    /// Registers the suballocator `try_new` builds from configuration `C` under `name`: its `Err`
    /// (an initial reservation refused) is a [`ConfigErrorKind::Resource`] error at the item.
    fn with_suballocator<C, R>(
        self,
        name: &str,
        try_new: fn(AnyResource<P>, C) -> Result<R, AllocError>,
    ) -> Self
    where
        C: FromItem + 'static,
        R: MemoryResource + Send + Sync + 'static,
    {
        self.with_adaptor(name, move |item, below| {
            let config = C::from_item(item)?;
            item.erase(try_new(below, config).map_err(|e| item.resource_error(e))?)
        })
    }

    /// Registers an adaptor under `name` (replacing one of that name): `build(item, below)` checks
    /// `item`'s fields and wraps `below`.
    pub fn with_adaptor(
        mut self,
        name: &str,
        build: impl Fn(&ItemSpec, AnyResource<P>) -> Result<AnyResource<P>, ConfigError>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.adaptors.retain(|(n, _)| n != name);
        self.adaptors.push((name.to_string(), Box::new(build)));
        self
    }

    /// Wraps every stack's leaf in `wrap` before the first item above it takes it: a layer of the
    /// caller's that no text names, such as a meter of what the leaf hands out.
    pub fn around_leaf(
        mut self,
        wrap: impl Fn(AnyResource<P>) -> AnyResource<P> + Send + Sync + 'static,
    ) -> Self {
        self.around_leaf = Some(Box::new(wrap));
        self
    }

    /// The names of the leaves and registered adaptors.
    pub fn names(&self) -> Vec<&str> {
        LEAVES
            .iter()
            .copied()
            .chain(self.adaptors.iter().map(|(n, _)| n.as_str()))
            .collect()
    }

    fn adaptor(&self, name: &str) -> Option<&AdaptorFn<P>> {
        self.adaptors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, f)| &**f)
    }

    fn unknown(&self, item: &ItemSpec) -> ConfigError {
        item.error(ConfigErrorKind::Unknown {
            name: item.name.clone(),
            known: self.names().join(", "),
        })
    }

    /// Parses `text` and builds the stack it describes.
    pub fn build(&self, text: &str) -> Result<AnyResource<P>, ConfigError> {
        self.build_spec(&text.parse()?)
    }

    /// Builds the stack `spec` describes; at most [`MAX_ITEMS`] items.
    pub fn build_spec(&self, spec: &StackSpec) -> Result<AnyResource<P>, ConfigError> {
        if let Some(item) = spec.items.get(MAX_ITEMS) {
            return Err(item.error(ConfigErrorKind::TooDeep { limit: MAX_ITEMS }));
        }
        let (first, rest) = spec
            .items
            .split_first()
            .ok_or(ConfigError::new(ConfigErrorKind::Empty, 0))?;
        let mut stack = match leaf::<P>(first, self.device)? {
            Some(built) => built,
            None if self.adaptor(&first.name).is_some() => {
                return Err(first.error(ConfigErrorKind::AdaptorFirst {
                    name: first.name.clone(),
                }))
            }
            None => return Err(self.unknown(first)),
        };
        if let Some(wrap) = &self.around_leaf {
            stack = wrap(stack);
        }
        for item in rest {
            if LEAVES.contains(&item.name.as_str()) {
                return Err(item.error(ConfigErrorKind::LeafNotFirst {
                    name: item.name.clone(),
                }));
            }
            let build = self.adaptor(&item.name).ok_or_else(|| self.unknown(item))?;
            stack = build(item, stack)?;
        }
        Ok(stack)
    }
}

impl<P: PropertySet> Default for StackBuilder<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: PropertySet> fmt::Debug for StackBuilder<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackBuilder")
            .field("names", &self.names())
            .field("device", &self.device)
            .finish()
    }
}

/// Builds the stack `text` describes with the leaves and this crate's adaptors.
pub fn build<P: PropertySet>(text: &str) -> Result<AnyResource<P>, ConfigError> {
    StackBuilder::new().build(text)
}
