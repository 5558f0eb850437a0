//! Erased resources that keep the checks: [`AnyResource`] (owned) and [`ResourceRef`] (borrowed).

use crate::adaptor::{Statistics, Tracking};
use crate::property::{Accessible, DeviceAccessible, HostAccessible, Migratable};
pub(crate) use crate::property::{Properties, PropertySet};
use crate::resource::{check_request, properties, AllocError, MemoryResource, Result};
use crate::stack::AnyLayer;
use crate::stream::StreamRef;
use std::any::Any;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use typenum::U16;

/// The alignment erased resources guarantee: what they raise every request to.
const ERASED_ALIGN: usize = 16;

/// What both erased types do with a request: a zero-size or malformed one is answered here (with
/// `E`'s alignment), the alignment is raised to [`ERASED_ALIGN`], and the rest is one virtual call.
#[inline]
fn erased_allocate<E: MemoryResource, D: DynResource + ?Sized>(
    inner: &D,
    size: usize,
    align: usize,
    stream: StreamRef,
    name: &'static str,
) -> Result<NonNull<u8>, AllocError> {
    if let Some(empty) = check_request::<E>(size, align, name)? {
        return Ok(empty);
    }
    inner.allocate(size, align.max(ERASED_ALIGN), stream)
}

/// The other half of [`erased_allocate`]: zero-size pointers stay here, the rest goes to `inner`
/// with the alignment raised as it was for the allocation.
///
/// # Safety
///
/// `ptr` came from [`erased_allocate`] over `inner` with this size and align.
#[inline]
unsafe fn erased_deallocate<D: DynResource + ?Sized>(
    inner: &D,
    ptr: NonNull<u8>,
    size: usize,
    align: usize,
    stream: StreamRef,
) {
    if size == 0 {
        return;
    }
    // SAFETY: every non-zero request of erased_allocate went to `inner`, with this alignment.
    unsafe { inner.deallocate(ptr, size, align.max(ERASED_ALIGN), stream) }
}

/// The object-safe face of a [`MemoryResource`]: what the vtable of an erased resource holds.
pub(crate) trait DynResource {
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>>;
    /// # Safety
    /// As for [`MemoryResource::deallocate`].
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef);
    fn synchronize(&self, stream: StreamRef) -> Result<()>;
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()>;
    fn name(&self) -> &'static str;
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result;
    fn properties(&self) -> Properties;
}

impl<R: MemoryResource> DynResource for R {
    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        MemoryResource::allocate(self, size, align, stream)
    }
    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        // SAFETY: forwarded from the caller.
        unsafe { MemoryResource::deallocate(self, ptr, size, align, stream) }
    }
    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        MemoryResource::synchronize(self, stream)
    }
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        MemoryResource::order_after(self, stream, after)
    }
    fn name(&self) -> &'static str {
        MemoryResource::name(self)
    }
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        MemoryResource::describe_to(self, f)
    }
    fn properties(&self) -> Properties {
        Properties::of::<R>()
    }
}

/// What an [`AnyResource`] holds: a resource that is also `Any`, for downcasts, a layer of a stack
/// for [`AnyLayer::find`] to walk into, and that can lend itself as a plain `DynResource` for a
/// [`ResourceRef`] (trait upcasting needs Rust 1.86).
trait DynOwned: DynResource + Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn as_layer(&self) -> &dyn AnyLayer;
    fn as_dyn(&self) -> &(dyn DynResource + Sync);
}

impl<R: MemoryResource + Send + Sync + 'static> DynOwned for R {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_layer(&self) -> &dyn AnyLayer {
        self
    }
    fn as_dyn(&self) -> &(dyn DynResource + Sync) {
        self
    }
}

/// An owned resource stack of any type, with properties `P` still checked at compile time.
///
/// `P` names the properties the caller may rely on (`AnyResource<DeviceAccessible>`,
/// `AnyResource<(HostAccessible, DeviceAccessible)>`), so containers and adaptors still check them
/// at compile time. Cloning an `AnyResource` clones the `Arc`: clones share one resource, as RMM's
/// `any_resource` copies share their state. [`try_cast`](Self::try_cast) and
/// [`forget`](Self::forget) change the properties promised, [`downcast_ref`](Self::downcast_ref)
/// recovers the concrete resource, and [`as_resource_ref`](Self::as_resource_ref) lends it as a
/// [`ResourceRef`].
///
/// # Cost
///
/// One virtual call per operation (`allocate`, `deallocate`, `synchronize`, `order_after`),
/// through an `Arc<dyn …>`; the concrete resource's body is inlined behind it. Zero-size and
/// malformed requests are answered before the virtual call. Two words; a clone is one `Arc` clone.
///
/// # Streams
///
/// Every call goes to the erased resource with its stream unchanged; `synchronize` and
/// `order_after` are forwarded to it. The handle keeps no stream alive of its own.
///
/// # Upstream
///
/// The erased resource must be `MemoryResource + Accessible<P> + Send + Sync + 'static` (a compile
/// error naming the missing property otherwise; [`try_new`](Self::try_new) checks the same at run
/// time for code that picks stacks from text). `AnyResource<P>` gives exactly the properties of
/// `P`, whatever more the resource gives.
///
/// Erasure forgets the resource's alignment type, so both erased types claim `U16` at the type
/// level and keep that promise by asking the erased resource for at least 16 bytes of alignment
/// (every resource honours or refuses an alignment, never ignores it), which lets containers of
/// ordinary element types (up to 16-byte alignment: `f64`, `u128`, `[f32; 4]`) sit on an erased
/// stack. The erased resource's real guarantee is reported at run time through
/// [`properties`](Self::properties). Claiming more (say `U256`, what CUDA leaves give) would cost
/// every host allocation through a `System` below.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::erased::AnyResource;
///
/// // Chosen at run time, one type either way:
/// fn pick(real_bytes: bool) -> AnyResource<HostAccessible> {
///     if real_bytes { AnyResource::new(System::new()) } else { AnyResource::new(&SYSTEM) }
/// }
/// static SYSTEM: System = System::new();
///
/// let mr = pick(true);
/// let p = mr.allocate(64, 8, StreamRef::DEFAULT).unwrap();
/// // SAFETY: host-accessible memory of 64 bytes.
/// unsafe { p.as_ptr().write_bytes(7, 64) };
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate(p, 64, 8, StreamRef::DEFAULT) };
/// assert_eq!(mr.properties().alignment, 16);
/// ```
///
/// A stack that lacks a property does not compile:
///
/// ```compile_fail,E0277
/// use mrstack::prelude::*;
/// use mrstack::erased::AnyResource;
/// // error: `System` does not give DeviceAccessible memory
/// let mr = AnyResource::<DeviceAccessible>::new(System::new());
/// ```
pub struct AnyResource<P: PropertySet> {
    inner: Arc<dyn DynOwned>,
    _props: PhantomData<fn() -> P>,
}

impl<P: PropertySet> AnyResource<P> {
    /// Erases `resource`, which must give every property of `P`.
    pub fn new<R>(resource: R) -> Self
    where
        R: MemoryResource + Accessible<P> + Send + Sync + 'static,
    {
        Self::from_arc(Arc::new(resource))
    }

    /// Erases a shared resource, without a second `Arc`.
    pub fn from_arc<R>(resource: Arc<R>) -> Self
    where
        R: MemoryResource + Accessible<P> + Send + Sync + 'static,
    {
        AnyResource {
            inner: resource,
            _props: PhantomData,
        }
    }

    /// Erases `resource` if it gives every property of `P`, checked at run time; gives it back
    /// otherwise. For generic code (a stack built from text) where the compiler cannot see the
    /// properties; [`new`](Self::new) checks the same at compile time.
    pub fn try_new<R>(resource: R) -> Result<Self, R>
    where
        R: MemoryResource + Send + Sync + 'static,
    {
        if Properties::of::<R>().includes(&Properties::of_set::<P>()) {
            Ok(AnyResource {
                inner: Arc::new(resource),
                _props: PhantomData,
            })
        } else {
            Err(resource)
        }
    }

    /// The same resource seen with properties `Q`, if the erased resource really gives them
    /// (checked at run time against its own type's properties, not against `P`); `self` otherwise.
    /// Lets a stack built as `AnyResource<DeviceAccessible>` from `managed` go under an adaptor that
    /// needs `Migratable`.
    pub fn try_cast<Q: PropertySet>(self) -> Result<AnyResource<Q>, Self> {
        if self.inner.properties().includes(&Properties::of_set::<Q>()) {
            Ok(AnyResource {
                inner: self.inner,
                _props: PhantomData,
            })
        } else {
            Err(self)
        }
    }

    /// The same resource with fewer properties promised, checked at compile time:
    /// `AnyResource<(HostAccessible, DeviceAccessible)>` → `AnyResource<DeviceAccessible>`.
    pub fn forget<Q: PropertySet>(self) -> AnyResource<Q>
    where
        Self: Accessible<Q>,
    {
        AnyResource {
            inner: self.inner,
            _props: PhantomData,
        }
    }

    /// What the erased resource really gives (its own type's properties and alignment), which may
    /// be more than `P`.
    pub fn properties(&self) -> Properties {
        self.inner.properties()
    }

    /// The erased resource, if it is an `R` (the top layer only; [`find`](Self::find) looks
    /// through the whole stack).
    pub fn downcast_ref<R: 'static>(&self) -> Option<&R> {
        self.inner.as_any().downcast_ref()
    }

    /// The first layer of type `T` from the top of the stack down, through every erased layer:
    /// [`AnyLayer::find`]. The layers of a stack built from text have the types
    /// `config`'s docs list ("The types of a text stack's layers").
    ///
    /// ```
    /// use mrstack::prelude::*;
    /// use mrstack::{erased::AnyResource, stack::Reach};
    /// use mrstack::suballoc::Binning;
    ///
    /// let mr = mrstack::config::build::<()>("simulated(capacity=1GiB) > binning(max=64KiB) > tracking").unwrap();
    /// let binning = mr.find::<Binning<AnyResource<()>>>().unwrap();
    /// assert_eq!(binning.bin_sizes().last(), Some(&(64 << 10)));
    /// assert!(mr.find::<System>().is_none());
    /// ```
    pub fn find<T: Any>(&self) -> Option<&T> {
        AnyLayer::find(self)
    }

    /// The topmost [`Statistics`] layer of the stack, as a stack built from text has it (a
    /// `statistics` item): its counters without naming erased types.
    ///
    /// ```
    /// use mrstack::prelude::*;
    ///
    /// let mr = mrstack::config::build::<()>("simulated(capacity=1GiB) > pool > statistics").unwrap();
    /// let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
    /// let stats = mr.statistics().unwrap().stats();
    /// assert_eq!((stats.bytes.current, stats.allocations.current), (1000, 1));
    /// # unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
    /// ```
    pub fn statistics(&self) -> Option<&Statistics<AnyResource<P>>> {
        self.find()
    }

    /// The topmost [`Tracking`] layer of the stack, as a stack built from text has it (a
    /// `tracking` item): its live allocations and leak report.
    pub fn tracking(&self) -> Option<&Tracking<AnyResource<P>>> {
        self.find()
    }

    /// A borrowed handle on the same resource.
    pub fn as_resource_ref(&self) -> ResourceRef<'_, P> {
        ResourceRef {
            inner: self.inner.as_dyn(),
            _props: PhantomData,
        }
    }

    /// True when both handles share one resource.
    pub fn ptr_eq(&self, other: &Self) -> bool {
        // Compare data addresses only: vtable pointers of one type may differ between codegen units.
        std::ptr::addr_eq(Arc::as_ptr(&self.inner), Arc::as_ptr(&other.inner))
    }
}

impl<P: PropertySet> Clone for AnyResource<P> {
    /// Another handle on the same resource (the `Arc` is cloned, not the resource).
    fn clone(&self) -> Self {
        AnyResource {
            inner: self.inner.clone(),
            _props: PhantomData,
        }
    }
}

impl<P: PropertySet> std::fmt::Debug for AnyResource<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnyResource")
            .field("resource", &self.inner.name())
            .field("properties", &self.inner.properties())
            .finish()
    }
}

// SAFETY: built only from resources that give every property of P (checked by the `Accessible<P>`
// bound or at run time against the resource type's bits); every call goes to that resource with
// the alignment raised to at least 16, so its promises hold, and the alignment claimed (16) too.
unsafe impl<P: PropertySet> MemoryResource for AnyResource<P> {
    properties! { Host = P::Host, Device = P::Device, Migratable = P::Migratable, Pageable = P::Pageable, Alignment = U16 }

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        erased_allocate::<Self, _>(&*self.inner, size, align, stream, "AnyResource")
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        // SAFETY: forwarded from the caller.
        unsafe { erased_deallocate(&*self.inner, ptr, size, align, stream) }
    }

    crate::resource::forward_upstream!(streams to inner);

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    // Erasure does not show: the stack is the resource it holds.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.describe_to(f)
    }

    fn upstream_layer(&self) -> Option<&dyn AnyLayer>
    where
        Self: 'static,
    {
        Some(self.inner.as_layer())
    }
}

/// A borrowed resource of any type with properties `P`: `Copy`, two words, and it cannot outlive
/// the resource it borrows.
///
/// `P` names the properties the caller may rely on, as for [`AnyResource`], so containers and
/// adaptors still check them at compile time; a library can take a `ResourceRef` instead of being
/// generic over the resource. [`forget`](Self::forget) promises fewer properties;
/// [`AnyResource::as_resource_ref`] borrows an owned erased stack.
///
/// # Cost
///
/// One virtual call per operation (`allocate`, `deallocate`, `synchronize`, `order_after`),
/// through a `&dyn …`; the concrete resource's body is inlined behind it. Zero-size and malformed
/// requests are answered before the virtual call. Two words, copied freely.
///
/// # Streams
///
/// Every call goes to the borrowed resource with its stream unchanged; `synchronize` and
/// `order_after` are forwarded to it. It keeps no stream alive of its own.
///
/// # Upstream
///
/// The borrowed resource must be `MemoryResource + Accessible<P> + Sync` (a compile error naming
/// the missing property otherwise). `ResourceRef<P>` gives exactly the properties of `P`, whatever
/// more the resource gives.
///
/// Erasure forgets the resource's alignment type, so both erased types claim `U16` at the type
/// level and keep that promise by asking the erased resource for at least 16 bytes of alignment
/// (every resource honours or refuses an alignment, never ignores it), which lets containers of
/// ordinary element types (up to 16-byte alignment: `f64`, `u128`, `[f32; 4]`) sit on an erased
/// stack. The erased resource's real guarantee is reported at run time through
/// [`properties`](Self::properties). Claiming more (say `U256`, what CUDA leaves give) would cost
/// every host allocation through a `System` below.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::erased::ResourceRef;
///
/// fn library_call(mr: ResourceRef<'_, HostAccessible>) -> usize {
///     let p = mr.allocate(32, 8, StreamRef::DEFAULT).unwrap();
///     // SAFETY: p came from mr with this size and alignment.
///     unsafe { mr.deallocate(p, 32, 8, StreamRef::DEFAULT) };
///     32
/// }
/// let system = System::new();
/// assert_eq!(library_call(ResourceRef::new(&system)), 32);
/// ```
pub struct ResourceRef<'a, P: PropertySet> {
    inner: &'a (dyn DynResource + Sync + 'a),
    _props: PhantomData<fn() -> P>,
}

impl<'a, P: PropertySet> ResourceRef<'a, P> {
    /// Borrows `resource`, which must give every property of `P`.
    pub fn new<R>(resource: &'a R) -> Self
    where
        R: MemoryResource + Accessible<P> + Sync + 'a,
    {
        ResourceRef {
            inner: resource,
            _props: PhantomData,
        }
    }

    /// The same borrow with fewer properties promised, checked at compile time.
    pub fn forget<Q: PropertySet>(self) -> ResourceRef<'a, Q>
    where
        Self: Accessible<Q>,
    {
        ResourceRef {
            inner: self.inner,
            _props: PhantomData,
        }
    }

    /// What the borrowed resource really gives.
    pub fn properties(&self) -> Properties {
        self.inner.properties()
    }
}

impl<P: PropertySet> Clone for ResourceRef<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: PropertySet> Copy for ResourceRef<'_, P> {}

impl<P: PropertySet> std::fmt::Debug for ResourceRef<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceRef")
            .field("resource", &self.inner.name())
            .field("properties", &self.inner.properties())
            .finish()
    }
}

// SAFETY: as for AnyResource: built only from resources with P's properties, every call forwarded
// with the alignment raised to at least 16.
unsafe impl<P: PropertySet> MemoryResource for ResourceRef<'_, P> {
    properties! { Host = P::Host, Device = P::Device, Migratable = P::Migratable, Pageable = P::Pageable, Alignment = U16 }

    #[inline]
    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        erased_allocate::<Self, _>(self.inner, size, align, stream, "ResourceRef")
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        // SAFETY: forwarded from the caller.
        unsafe { erased_deallocate(self.inner, ptr, size, align, stream) }
    }

    crate::resource::forward_upstream!(streams to inner);

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    // The borrowed resource's stack. Its layers are not walked (`upstream_layer` stays `None`):
    // the borrow need not be `'static`, which `Any` needs.
    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.describe_to(f)
    }
}

static_assertions::assert_impl_all!(AnyResource<DeviceAccessible>: Send, Sync, Clone, Accessible<DeviceAccessible>);
static_assertions::assert_impl_all!(
    AnyResource<(HostAccessible, DeviceAccessible)>: Accessible<(HostAccessible, DeviceAccessible)>,
    Accessible<HostAccessible>
);
static_assertions::assert_impl_all!(AnyResource<(HostAccessible, DeviceAccessible, Migratable)>: Accessible<Migratable>);
static_assertions::assert_not_impl_any!(AnyResource<DeviceAccessible>: Accessible<HostAccessible>);
static_assertions::assert_not_impl_any!(AnyResource<()>: Accessible<HostAccessible>, Accessible<DeviceAccessible>);
static_assertions::assert_impl_all!(ResourceRef<'static, HostAccessible>: Send, Sync, Copy, Accessible<HostAccessible>);
static_assertions::assert_eq_size!(AnyResource<DeviceAccessible>, [usize; 2]);
static_assertions::assert_eq_size!(ResourceRef<'static, DeviceAccessible>, [usize; 2]);
static_assertions::assert_eq_size!(Option<AnyResource<DeviceAccessible>>, [usize; 2]);
