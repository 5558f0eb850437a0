//! A stack seen whole: what it is ([`MemoryResource::describe`]) and how to reach one of its
//! layers by type ([`Reach`] at compile time, [`AnyLayer::find`] at run time, through erased
//! layers too).
//!
//! # Descriptions
//!
//! `mr.describe()` shows a stack in the syntax of text configurations (`mrstack::config`), leaf
//! first, each layer with the configuration it was built with:
//!
//! ```
//! use mrstack::prelude::*;
//!
//! let mr = resource_stack![
//!     Simulated::new(1 << 30),
//!     Pool { initial: 64 MiB, max: 512 MiB },
//!     Binning { min: 256 B, max: 1 MiB },
//!     Statistics,
//! ];
//! assert_eq!(
//!     mr.describe().to_string(),
//!     "simulated(capacity=1 GiB) > pool(initial=64 MiB, max=512 MiB) > binning(min=256 B, max=1 MiB) > statistics"
//! );
//! ```
//!
//! Sizes are written exactly ([`ExactBytes`]), so a stack built from
//! text describes itself as text that `config::build` builds into the same
//! stack again. A macro stack does too when each of its layers has a text form (everything but
//! `Retry`, `Callback`, and a `Logging` over a writer it did not open). Erased layers
//! ([`AnyResource`](crate::erased::AnyResource), [`ResourceRef`](crate::erased::ResourceRef)) and pointers (`&R`,
//! `Arc<R>`) do not show: they are the resource they hold.
//!
//! Describing allocates nothing and takes no lock; it is never on an allocation's path. A
//! resource of your own is described by its [`name`](MemoryResource::name) unless it overrides
//! [`describe_to`](MemoryResource::describe_to); an adaptor does so with [`ItemWriter`], so that
//! the stack below it shows too.
//!
//! # Reaching a layer
//!
//! At compile time, [`Reach::reach`] finds a layer by its type, with the type below it left to the
//! compiler: no `.upstream().upstream()`, no type to spell out in full.
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::{adaptor::{Statistics, Tracking}, stack::Reach};
//!
//! let mr = resource_stack![Simulated::new(1 << 30), Pool, Tracking, Statistics, Limiting { limit: 1 GiB }];
//! let p = mr.allocate(4096, 256, StreamRef::DEFAULT).unwrap();
//! let stats: &Statistics<_> = mr.reach();
//! assert_eq!(stats.stats().bytes.current, 4096);
//! let tracking: &Tracking<_> = mr.reach();
//! assert_eq!(tracking.outstanding_count(), 1);
//! let sim: &Simulated = mr.reach();
//! assert_eq!(sim.live(), 1); // the pool's one chunk
//! # unsafe { mr.deallocate(p, 4096, 256, StreamRef::DEFAULT) };
//! ```
//!
//! A layer type that is not in the stack does not compile, and one that is there twice needs
//! its full type. `reach` goes through every adaptor and suballocator of this crate and through
//! `&R` and `Arc<R>` ([`HasUpstream`]); it stops at erased layers, whose type below is known only
//! at run time.
//!
//! At run time, [`AnyLayer::find`] walks the stack from the top, erased layers included, and
//! returns the first layer of the type asked: how to reach into a stack built from text, whose
//! layers have the types listed in `config`'s docs ("The types of a text stack's layers").
//! It needs `'static` types (it compares [`TypeId`](std::any::TypeId)s), and stops at `&R`,
//! `Arc<R>` (which it finds as themselves: `find::<Arc<Cuda>>()`) and
//! [`ResourceRef`](crate::erased::ResourceRef) layers.
//!
//! ```
//! use mrstack::prelude::*;
//! use mrstack::{erased::AnyResource, stack::Reach};
//! use mrstack::suballoc::Pool;
//!
//! let mr = mrstack::config::build::<()>("simulated(capacity=1GiB) > pool(max=64MiB) > statistics").unwrap();
//! let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
//! assert_eq!(mr.statistics().unwrap().stats().bytes.current, 1000);
//! let pool = mr.find::<Pool<AnyResource<()>>>().unwrap();
//! assert_eq!(pool.max_size(), 64 << 20);
//! assert_eq!(mr.find::<Simulated>().unwrap().capacity(), 1 << 30);
//! # unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
//! ```

use crate::resource::MemoryResource;
use crate::units::ExactBytes;
use std::any::Any;
use std::fmt;

/// A resource stack shown as text, leaf first: what [`MemoryResource::describe`] returns. Its
/// `Display` writes [`describe_to`](MemoryResource::describe_to); `to_string()` gives the text.
pub struct Description<'a, R: ?Sized>(pub(crate) &'a R);

impl<R: MemoryResource + ?Sized> fmt::Display for Description<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.describe_to(f)
    }
}

impl<R: MemoryResource + ?Sized> fmt::Debug for Description<'_, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Description(")?;
        self.0.describe_to(f)?;
        f.write_str(")")
    }
}

/// Writes one item of a description, `name(field=value, …)`, after the description of the stack
/// below it: what an adaptor's [`describe_to`](MemoryResource::describe_to) is made of.
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::stack::ItemWriter;
/// use std::fmt;
///
/// /// An adaptor of your own, with one setting.
/// struct Quota<U> { upstream: U, bytes: usize }
/// # // SAFETY: every call goes to `upstream` unchanged.
/// # unsafe impl<U: MemoryResource> MemoryResource for Quota<U> {
/// #     type Host = U::Host; type Device = U::Device; type Migratable = U::Migratable; type Pageable = U::Pageable;
/// #     type Alignment = U::Alignment;
/// #     fn allocate(&self, s: usize, a: usize, st: StreamRef) -> mrstack::resource::Result<std::ptr::NonNull<u8>> { self.upstream.allocate(s, a, st) }
/// #     unsafe fn deallocate(&self, p: std::ptr::NonNull<u8>, s: usize, a: usize, st: StreamRef) { unsafe { self.upstream.deallocate(p, s, a, st) } }
/// #     fn synchronize(&self, s: StreamRef) -> mrstack::resource::Result<()> { self.upstream.synchronize(s) }
/// #     fn order_after(&self, s: StreamRef, a: StreamRef) -> mrstack::resource::Result<()> { self.upstream.order_after(s, a) }
/// // In its `unsafe impl MemoryResource`:
/// fn describe_to(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
///     ItemWriter::over(f, &self.upstream, "quota").size("bytes", self.bytes).finish()
/// }
/// # }
///
/// let mr = Quota { upstream: System::new(), bytes: 3 << 20 };
/// assert_eq!(mr.describe().to_string(), "system > quota(bytes=3 MiB)");
/// ```
pub struct ItemWriter<'a, 'b> {
    f: &'a mut fmt::Formatter<'b>,
    fields: usize,
    result: fmt::Result,
}

impl<'a, 'b> ItemWriter<'a, 'b> {
    /// Starts the item `name` of a leaf.
    pub fn leaf(f: &'a mut fmt::Formatter<'b>, name: &str) -> Self {
        let result = f.write_str(name);
        ItemWriter {
            f,
            fields: 0,
            result,
        }
    }

    /// Writes the description of `upstream`, then starts the item `name` over it.
    pub fn over<U: MemoryResource + ?Sized>(
        f: &'a mut fmt::Formatter<'b>,
        upstream: &U,
        name: &str,
    ) -> Self {
        let result = upstream
            .describe_to(f)
            .and_then(|()| f.write_str(" > "))
            .and_then(|()| f.write_str(name));
        ItemWriter {
            f,
            fields: 0,
            result,
        }
    }

    fn field(
        mut self,
        name: &str,
        value: impl FnOnce(&mut fmt::Formatter<'_>) -> fmt::Result,
    ) -> Self {
        if self.result.is_ok() {
            let open = if self.fields == 0 { "(" } else { ", " };
            self.result = self
                .f
                .write_str(open)
                .and_then(|()| self.f.write_str(name))
                .and_then(|()| self.f.write_str("="))
                .and_then(|()| value(self.f));
            self.fields += 1;
        }
        self
    }

    /// A size in bytes, written exactly (`1 GiB`, `1000 B`), as the size fields of text
    /// configurations read it.
    pub fn size(self, name: &str, bytes: usize) -> Self {
        self.field(name, |f| write!(f, "{}", ExactBytes::from(bytes)))
    }

    /// A whole number (`device=0`, `alignment=4096`).
    pub fn number(self, name: &str, n: usize) -> Self {
        self.field(name, |f| write!(f, "{n}"))
    }

    /// `true` or `false`.
    pub fn flag(self, name: &str, value: bool) -> Self {
        self.field(name, |f| write!(f, "{value}"))
    }

    /// Text, quoted when the parser would not read it back plain (`path="a, b.csv"`).
    pub fn text(self, name: &str, value: &str) -> Self {
        self.field(name, |f| write_value(f, value))
    }

    /// Closes the item; the first write error, if any.
    pub fn finish(self) -> fmt::Result {
        self.result?;
        if self.fields > 0 {
            self.f.write_str(")")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ItemWriter<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ItemWriter")
            .field("fields", &self.fields)
            .finish_non_exhaustive()
    }
}

/// Writes `value` as the parser reads it back: plain, or quoted with `\"` and `\\` escaped when
/// it is empty, holds a character that ends a plain value, or starts or ends with white space.
/// Allocates nothing: descriptions of stacks write their paths through it, and text
/// configurations their values.
pub(crate) fn write_value(f: &mut fmt::Formatter<'_>, value: &str) -> fmt::Result {
    let plain = !value.is_empty()
        && !value.contains(ends_raw_value)
        && !value.starts_with(char::is_whitespace)
        && !value.ends_with(char::is_whitespace);
    if plain {
        return f.write_str(value);
    }
    f.write_str("\"")?;
    for c in value.chars() {
        if matches!(c, '"' | '\\') {
            f.write_str("\\")?;
        }
        fmt::Write::write_char(f, c)?;
    }
    f.write_str("\"")
}

/// Characters that end an unquoted value, in descriptions and in the text that reads them.
pub(crate) fn ends_raw_value(c: char) -> bool {
    matches!(c, ',' | '(' | ')' | '>' | '=' | '"')
}

/// One layer of a stack seen at run time: itself as [`Any`] and the layer below, which
/// [`find`](Self::find) walks. Every `MemoryResource + 'static` is one; an adaptor says what is
/// below it through [`MemoryResource::upstream_layer`].
pub trait AnyLayer {
    /// This layer, for a downcast.
    fn as_any(&self) -> &dyn Any;

    /// The layer below: an adaptor's upstream, the resource an [`AnyResource`](crate::erased::AnyResource)
    /// holds; `None` for a leaf, a pointer (`&R`, `Arc<R>`) and a
    /// [`ResourceRef`](crate::erased::ResourceRef).
    fn below(&self) -> Option<&dyn AnyLayer>;

    /// The Rust type of this layer (`std::any::type_name`), for diagnostics.
    fn type_name(&self) -> &'static str;

    /// The first layer of type `T` from this one down (this one included).
    fn find<T: Any>(&self) -> Option<&T>
    where
        Self: Sized,
    {
        find_from(self)
    }

    /// This layer and every one below it, top first.
    fn layers(&self) -> Layers<'_>
    where
        Self: Sized,
    {
        Layers { next: Some(self) }
    }
}

impl<R: MemoryResource + 'static> AnyLayer for R {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn below(&self) -> Option<&dyn AnyLayer> {
        self.upstream_layer()
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<R>()
    }
}

impl dyn AnyLayer + '_ {
    /// The first layer of type `T` from this one down (this one included).
    pub fn find<T: Any>(&self) -> Option<&T> {
        find_from(self)
    }

    /// This layer and every one below it, top first.
    pub fn layers(&self) -> Layers<'_> {
        Layers { next: Some(self) }
    }
}

impl fmt::Debug for dyn AnyLayer + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_name())
    }
}

fn find_from<T: Any>(top: &dyn AnyLayer) -> Option<&T> {
    let mut layers = Layers { next: Some(top) };
    layers.find_map(|layer| layer.as_any().downcast_ref())
}

/// The layers of a stack, top first: [`AnyLayer::layers`].
#[derive(Debug, Clone)]
pub struct Layers<'a> {
    next: Option<&'a dyn AnyLayer>,
}

impl<'a> Iterator for Layers<'a> {
    type Item = &'a dyn AnyLayer;

    fn next(&mut self) -> Option<&'a dyn AnyLayer> {
        let layer = self.next?;
        self.next = layer.below();
        Some(layer)
    }
}

/// A resource that wraps another one, statically: the adaptors and suballocators of this crate,
/// `&R` and `Arc<R>`. What [`Reach`] walks; implement it for an adaptor of your own to let
/// `reach` through it.
pub trait HasUpstream {
    /// The resource below.
    type Upstream: ?Sized;

    /// The resource below.
    fn upstream(&self) -> &Self::Upstream;
}

impl<R: ?Sized> HasUpstream for &R {
    type Upstream = R;
    fn upstream(&self) -> &R {
        self
    }
}

impl<R: ?Sized> HasUpstream for std::sync::Arc<R> {
    type Upstream = R;
    fn upstream(&self) -> &R {
        self
    }
}

/// [`HasLayer`]'s index for the layer itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Here;

/// [`HasLayer`]'s index for a layer below the upstream's layer `I`.
#[derive(Debug, Clone, Copy, Default)]
pub struct There<I>(std::marker::PhantomData<I>);

/// `S: HasLayer<T, I>`: stack `S` has a layer of type `T`, `I` layers down ([`Here`],
/// `There<Here>`, …). The compiler finds `I` when `T` is there once: [`Reach::reach`] is how to
/// call it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no layer of type `{T}`",
    label = "no `{T}` in this stack",
    note = "`reach` goes down through the crate's adaptors, suballocators, `&R` and `Arc<R>`; below an erased layer (AnyResource) use `find::<T>()`"
)]
pub trait HasLayer<T: ?Sized, I> {
    /// The layer of type `T`.
    fn layer_ref(&self) -> &T;
}

impl<T: ?Sized> HasLayer<T, Here> for T {
    fn layer_ref(&self) -> &T {
        self
    }
}

// `do_not_recommend`: a missing layer is reported at the stack asked, not at its leaf.
#[diagnostic::do_not_recommend]
impl<S, T, I> HasLayer<T, There<I>> for S
where
    S: HasUpstream + ?Sized,
    S::Upstream: HasLayer<T, I>,
    T: ?Sized,
{
    fn layer_ref(&self) -> &T {
        self.upstream().layer_ref()
    }
}

/// A layer of a stack by its type, found at compile time: `mr.reach::<Statistics<_>, _>()`, or
/// `let stats: &Statistics<_> = mr.reach();`. See the [module documentation](self#reaching-a-layer).
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::{stack::Reach, suballoc::Pool};
///
/// let sim = Simulated::new(1 << 30);
/// let mr = resource_stack![&sim, Pool, Statistics];
/// let pool: &Pool<_> = mr.reach();
/// assert_eq!(pool.usage().held, 0);
/// assert_eq!(mr.reach::<Simulated, _>().capacity(), 1 << 30); // through the `&sim` layer
/// ```
///
/// A type the stack lacks is a compile error:
///
/// ```compile_fail,E0277
/// use mrstack::prelude::*;
/// use mrstack::{adaptor::Tracking, stack::Reach};
/// let mr = resource_stack![Simulated::new(1 << 30), Pool, Statistics];
/// let t: &Tracking<_> = mr.reach();
/// ```
pub trait Reach {
    /// The layer of type `T` (`_` for `I`: the compiler finds how deep it lies).
    fn reach<T: ?Sized, I>(&self) -> &T
    where
        Self: HasLayer<T, I>,
    {
        self.layer_ref()
    }
}

impl<S: MemoryResource + ?Sized> Reach for S {}

/// Implements [`HasUpstream`] for an adaptor whose field `upstream` holds its resource `U`:
/// `has_upstream!(impl<U> for Limiting<U>)`; or, `through` a field whose `upstream()` method
/// gives it, `has_upstream!(impl<U> for Pool<U>, through shell, where U: MemoryResource)`.
macro_rules! has_upstream {
    (impl<$($p:ident),+> for $T:ty, through $field:ident $(, where $($bound:tt)+)?) => {
        impl<$($p),+> $crate::stack::HasUpstream for $T $(where $($bound)+)? {
            type Upstream = U;
            fn upstream(&self) -> &U {
                self.$field.upstream()
            }
        }
    };
    (impl<$($p:ident),+> for $T:ty $(where $($bound:tt)+)?) => {
        impl<$($p),+> $crate::stack::HasUpstream for $T $(where $($bound)+)? {
            type Upstream = U;
            fn upstream(&self) -> &U {
                &self.upstream
            }
        }
    };
}
pub(crate) use has_upstream;
