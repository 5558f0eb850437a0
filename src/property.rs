//! Memory properties: what a resource's memory may be touched by.
//!
//! A [`MemoryResource`] states its properties as [typenum] bits (`type Host`, `type Device`,
//! `type Migratable`, `type Pageable`) and its guaranteed alignment as a typenum unsigned (`type
//! Alignment`), so that adaptors compute theirs from their upstream's at compile time. Users and
//! containers speak in marker types instead: [`HostAccessible`], [`DeviceAccessible`],
//! [`Migratable`], [`Pageable`], and the bound [`Accessible<P>`], which every resource with the
//! matching bit set implements.
//!
//! When the bound does not hold, the compiler says which resource lacks which property:
//!
//! ```text
//! error[E0277]: `System` does not give DeviceAccessible memory
//!    = note: kernels dereference only DeviceAccessible memory: DeviceBox and DeviceVec need it ...
//! ```

use crate::resource::MemoryResource;
use std::ops::BitOr;
use typenum::{Bit, Or, Unsigned, B0, B1};

/// The CPU may dereference the memory (host `malloc`, pinned, managed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct HostAccessible;

/// Kernels may dereference the memory (`cuMemAlloc`, pools over it, pinned, managed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DeviceAccessible;

/// The memory is managed (unified) memory that the driver migrates between host and device,
/// so it can be prefetched and advised (`cuMemAllocManaged`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Migratable;

/// `R: Accessible<P>` holds when resource `R` gives memory with property `P`.
///
/// It is implemented for every [`MemoryResource`] from its typenum bits, and for a tuple of
/// properties when each holds (`Accessible<(HostAccessible, DeviceAccessible)>`). It is sealed:
/// the only way to give a resource a property is to set its bit in the `unsafe impl
/// MemoryResource`, whose `# Safety` section is the promise. An `impl Accessible<…>` of your own
/// does not compile.
///
/// ```
/// use mrstack::prelude::*;
/// fn needs_device<R: Accessible<DeviceAccessible>>() {}
/// needs_device::<Cuda>();
/// needs_device::<std::sync::Arc<Managed>>(); // references and Arcs forward their resource's
/// ```
///
/// # In generic code
///
/// A bound on a type parameter carries to every pointer and adaptor over it: with `R:
/// MemoryResource + Accessible<DeviceAccessible>`, the compiler knows that `&R`, `Arc<R>`,
/// `Statistics<&R>` or `Pool<Arc<R>>` give device memory too, so a library function can hand
/// `&R` to a [`DeviceVec`](crate::container::DeviceVec). Write one bound per property (`Accessible<HostAccessible> +
/// Accessible<DeviceAccessible>`, as [`PinnedVec`](crate::container::PinnedVec) asks): a tuple bound
/// (`Accessible<(HostAccessible, DeviceAccessible)>`) holds for the same concrete resources but
/// does not carry to `&R` in generic code.
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::adaptor::Statistics;
/// fn needs_device<R: Accessible<DeviceAccessible>>() {}
/// fn library<R: MemoryResource + Accessible<DeviceAccessible>>() {
///     needs_device::<&R>();
///     needs_device::<Statistics<std::sync::Arc<R>>>();
/// }
/// library::<Cuda>();
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give {P} memory",
    label = "this resource's memory is not {P}",
    note = "kernels dereference only DeviceAccessible memory: DeviceBox and DeviceVec need it; PinnedVec and host access (as_host_slice, Deref) need HostAccessible too; Prefetch needs Migratable (managed) memory; HostAllocator needs Pageable memory (a Vec in pinned or managed memory could be freed while cudarc's DMA still writes it)",
    note = "pick a resource that has the property (Cuda, CudaAsync, Pinned, Managed for DeviceAccessible; System, Pinned, Managed for HostAccessible; Managed for Migratable; System for Pageable), or an adaptor stack over one",
    note = "in generic code, bound the type parameter: `R: MemoryResource + Accessible<{P}>`; `&R`, `Arc<R>` and adaptors over `R` then give {P} memory too"
)]
pub trait Accessible<P>: sealed::Claimed<P> + sealed::Selects<P, Bit: IsSet> {}

/// The seal. Its traits are public (the blanket impls name them) in a private module: no code
/// outside this crate can name, hence implement, them.
pub(crate) mod sealed {
    /// The typenum bit `B1`: what a property bit must be for the property to hold.
    pub trait IsSet {}
    impl IsSet for typenum::B1 {}

    /// The bit of property set `P` in a resource: `R::Device` for [`DeviceAccessible`], and so
    /// on. `Accessible<P>` has `Selects<P, Bit: IsSet>` as a supertrait, so a bound `R:
    /// Accessible<P>` tells the compiler that bit is set, and a pointer or adaptor whose bits are
    /// written as `<R as Selects<P>>::Bit` (as `&R`, `Arc<R>` and every adaptor's are) has the
    /// property too, in generic code where `R` is a type parameter.
    ///
    /// [`DeviceAccessible`]: super::DeviceAccessible
    #[diagnostic::on_unimplemented(
        message = "`{Self}` has no {P} property: properties come only from the bits of a resource's `unsafe impl MemoryResource`",
        label = "not a memory resource, or {P} is not one of mrstack's properties",
        note = "properties are HostAccessible, DeviceAccessible, Migratable, Pageable and tuples of them, claimed by setting `type Host`/`Device`/`Migratable`/`Pageable = B1` in an `unsafe impl MemoryResource` (whose # Safety section is the promise); Accessible cannot be implemented by hand"
    )]
    pub trait Selects<P> {
        /// `B1` where the resource gives the property.
        type Bit: typenum::Bit;
    }

    /// `R: Claimed<P>` holds exactly where this crate implements `Accessible<P>` for `R`: the
    /// supertrait that stops an `impl Accessible<P> for MyType` outside the crate.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` cannot be declared {P} by hand: properties come only from the bits of its `unsafe impl MemoryResource`",
        label = "no `impl Accessible<{P}>` outside mrstack",
        note = "Accessible is sealed: set `type Host`/`Device`/`Migratable`/`Pageable = B1` in your resource's `unsafe impl MemoryResource` (whose # Safety section is the promise), and the property follows"
    )]
    pub trait Claimed<P> {}

    /// `B: SameBits<U>` holds exactly where `B`'s four property bits are `U`'s: the supertrait
    /// that stops an `impl SameProperties<U> for MyType` outside the crate.
    pub trait SameBits<U: ?Sized> {}

    /// Property sets are this crate's markers and their tuples only.
    #[diagnostic::on_unimplemented(
        message = "`{Self}` is not a property set of mrstack",
        label = "not HostAccessible, DeviceAccessible, Migratable, Pageable, (), or a tuple of them",
        note = "PropertySet is sealed: properties are the crate's markers, claimed through `unsafe impl MemoryResource`"
    )]
    pub trait Set {}
}

use sealed::{Claimed, IsSet, Selects};

impl<R: MemoryResource + ?Sized> Selects<HostAccessible> for R {
    type Bit = R::Host;
}
impl<R: MemoryResource + ?Sized> Selects<DeviceAccessible> for R {
    type Bit = R::Device;
}
impl<R: MemoryResource + ?Sized> Selects<Migratable> for R {
    type Bit = R::Migratable;
}
// The empty set asks for nothing, so every resource gives it: `AnyResource<()>` can hold a
// `Simulated` stack.
impl<R: ?Sized> Selects<()> for R {
    type Bit = B1;
}

/// `Selects` for pairs and triples of markers: set where each marker is. Written in terms of
/// `Accessible` of each marker, so that in generic code `R: Accessible<HostAccessible> +
/// Accessible<DeviceAccessible>` gives `&R: Accessible<(HostAccessible, DeviceAccessible)>`. Each
/// written out: one generic tuple impl would send the inference of an unknown set
/// (`AnyResource::new(…)` before its type is known) into unbounded recursion.
macro_rules! tuple_selects {
    (@pair $a:ty; $($b:ty),*) => {$(
        impl<R: ?Sized + Accessible<$a> + Accessible<$b>> Selects<($a, $b)> for R {
            type Bit = B1;
        }
        tuple_selects!(@triple $a, $b; HostAccessible, DeviceAccessible, Migratable, Pageable);
    )*};
    (@triple $a:ty, $b:ty; $($c:ty),*) => {$(
        impl<R: ?Sized + Accessible<$a> + Accessible<$b> + Accessible<$c>> Selects<($a, $b, $c)>
            for R
        {
            type Bit = B1;
        }
    )*};
    ($($a:ty),*) => {$(
        tuple_selects!(@pair $a; HostAccessible, DeviceAccessible, Migratable, Pageable);
    )*};
}
tuple_selects!(HostAccessible, DeviceAccessible, Migratable, Pageable);

// `do_not_recommend` makes a failure read as "`System` does not give DeviceAccessible memory"
// rather than as a trait-solver trail through typenum bits.
#[diagnostic::do_not_recommend]
impl<R: ?Sized + Selects<P>, P> Accessible<P> for R where <R as Selects<P>>::Bit: IsSet {}
#[diagnostic::do_not_recommend]
impl<R: ?Sized + Selects<P>, P> Claimed<P> for R where <R as Selects<P>>::Bit: IsSet {}

/// Pageable host memory: host-accessible like [`HostAccessible`], and memory that the CUDA
/// driver knows neither as pinned (page-locked, registered) nor as managed, such as
/// [`System`](crate::leaf::System)'s. A resource claims it with `type Pageable = B1` in its `unsafe impl
/// MemoryResource`; adaptors and suballocators carry their upstream's claim, and a composite whose
/// blocks come from several resources claims it only where every one of them does.
///
/// [`HostAllocator`](crate::container::HostAllocator) needs it (`R: Accessible<Pageable>`). Its collections
/// hand out plain `&mut [T]`, and cudarc copies into a plain slice asynchronously when the memory
/// is pinned or managed (it assumes a Rust slice is pageable, whose copies the driver completes
/// before returning): a `Vec` in pinned memory could be dropped, and its block reused, while a DMA
/// still writes into it. For host memory the device shares, use
/// [`PinnedVec`](crate::container::PinnedVec), which tracks the copies.
///
/// `Device = B0` is not enough: it says only that the type does not promise device access
/// (`AnyResource<HostAccessible>` may hold `Pinned`), so this is a claim of its own. Run-time
/// checks (`AnyResource::try_new`, `try_cast`) grant it only from the bit of the resource's type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Pageable;

impl<R: MemoryResource + ?Sized> Selects<Pageable> for R {
    type Bit = R::Pageable;
}

/// `B: SameProperties<U>`: resource `B` claims exactly the property bits of resource `U`
/// (host, device, migratable, pageable). What a composite asks of a second resource whose blocks it
/// hands out under the claims it makes from `U`, such as a bin of
/// [`Binning::with_bin`](crate::suballoc::Binning::with_bin). Implemented for every such pair;
/// it cannot be implemented by hand.
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not claim the same memory properties as `{U}`",
    label = "its host, device, migratable or pageable claim differs from `{U}`'s",
    note = "a composite hands this resource's blocks out under the properties it claims from `{U}`: a bin of pinned or managed memory under a binning over System would put a Vec where the driver may DMA",
    note = "give it a resource of the same kind of memory as the upstream, or erase both to the same `AnyResource<P>`"
)]
pub trait SameProperties<U: ?Sized>: MemoryResource + sealed::SameBits<U> {}

#[diagnostic::do_not_recommend]
impl<B, U> SameProperties<U> for B where B: MemoryResource + sealed::SameBits<U> + ?Sized {}

// The seal: an impl of `SameProperties` of a user's own, for a resource whose bits differ, would
// need this trait too, which no code outside the crate can name.
#[diagnostic::do_not_recommend]
impl<B, U> sealed::SameBits<U> for B
where
    B: MemoryResource<
            Host = U::Host,
            Device = U::Device,
            Migratable = U::Migratable,
            Pageable = U::Pageable,
        > + ?Sized,
    U: MemoryResource + ?Sized,
{
}

/// A set of properties as a type: a marker ([`HostAccessible`], [`DeviceAccessible`],
/// [`Migratable`]), a tuple of them, or `()` for none (what [`Simulated`](crate::leaf::Simulated) gives).
///
/// It maps the markers to the typenum bits a [`MemoryResource`] states, so that
/// `AnyResource<(HostAccessible, DeviceAccessible)>` is a resource with `Host = B1, Device = B1`.
/// Sealed: the sets are this crate's markers and their tuples, and their run-time
/// [`Properties`] ([`Properties::of_set`]) are derived from these bits.
pub trait PropertySet: sealed::Set + 'static {
    /// `B1` when the set includes [`HostAccessible`].
    type Host: Bit;
    /// `B1` when the set includes [`DeviceAccessible`].
    type Device: Bit;
    /// `B1` when the set includes [`Migratable`].
    type Migratable: Bit;
    /// `B1` when the set includes [`Pageable`].
    type Pageable: Bit;
}

/// The marker sets: each its own bits.
macro_rules! marker_sets {
    ($($set:ty => $host:ty, $device:ty, $migratable:ty, $pageable:ty;)+) => {$(
        impl sealed::Set for $set {}
        impl PropertySet for $set {
            type Host = $host;
            type Device = $device;
            type Migratable = $migratable;
            type Pageable = $pageable;
        }
    )+};
}

marker_sets! {
    () => B0, B0, B0, B0;
    HostAccessible => B1, B0, B0, B0;
    Pageable => B1, B0, B0, B1;
    DeviceAccessible => B0, B1, B0, B0;
    Migratable => B0, B0, B1, B0;
}

impl<A: PropertySet, B: PropertySet> sealed::Set for (A, B) {}
impl<A: PropertySet, B: PropertySet> PropertySet for (A, B)
where
    A::Host: BitOr<B::Host, Output: Bit>,
    A::Device: BitOr<B::Device, Output: Bit>,
    A::Migratable: BitOr<B::Migratable, Output: Bit>,
    A::Pageable: BitOr<B::Pageable, Output: Bit>,
{
    type Host = Or<A::Host, B::Host>;
    type Device = Or<A::Device, B::Device>;
    type Migratable = Or<A::Migratable, B::Migratable>;
    type Pageable = Or<A::Pageable, B::Pageable>;
}

impl<A: PropertySet, B: PropertySet, C: PropertySet> sealed::Set for (A, B, C) {}
impl<A: PropertySet, B: PropertySet, C: PropertySet> PropertySet for (A, B, C)
where
    (A, B): PropertySet,
    <(A, B) as PropertySet>::Host: BitOr<C::Host, Output: Bit>,
    <(A, B) as PropertySet>::Device: BitOr<C::Device, Output: Bit>,
    <(A, B) as PropertySet>::Migratable: BitOr<C::Migratable, Output: Bit>,
    <(A, B) as PropertySet>::Pageable: BitOr<C::Pageable, Output: Bit>,
{
    type Host = Or<<(A, B) as PropertySet>::Host, C::Host>;
    type Device = Or<<(A, B) as PropertySet>::Device, C::Device>;
    type Migratable = Or<<(A, B) as PropertySet>::Migratable, C::Migratable>;
    type Pageable = Or<<(A, B) as PropertySet>::Pageable, C::Pageable>;
}

/// What a resource gives, known at run time: its property bits and its alignment. Always derived
/// from type-level bits ([`Properties::of`], [`Properties::of_set`]), never stated by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Properties {
    /// The CPU may dereference the memory.
    pub host: bool,
    /// Kernels may dereference the memory.
    pub device: bool,
    /// The memory is managed (migratable) memory.
    pub migratable: bool,
    /// Every pointer is aligned to this many bytes.
    pub alignment: usize,
    /// The memory is pageable host memory ([`Pageable`]).
    pub pageable: bool,
}

impl Properties {
    /// The properties resource type `R` states.
    pub fn of<R: MemoryResource + ?Sized>() -> Self {
        Properties {
            host: R::Host::BOOL,
            device: R::Device::BOOL,
            migratable: R::Migratable::BOOL,
            alignment: <R::Alignment as Unsigned>::USIZE,
            pageable: R::Pageable::BOOL,
        }
    }

    /// The properties of set `P`, alignment 1.
    pub fn of_set<P: PropertySet>() -> Self {
        Properties {
            host: P::Host::BOOL,
            device: P::Device::BOOL,
            migratable: P::Migratable::BOOL,
            alignment: 1,
            pageable: P::Pageable::BOOL,
        }
    }

    /// True when every property of `wanted` is in `self` (alignment aside).
    pub fn includes(&self, wanted: &Properties) -> bool {
        (self.host || !wanted.host)
            && (self.device || !wanted.device)
            && (self.migratable || !wanted.migratable)
            && (self.pageable || !wanted.pageable)
    }
}

impl std::fmt::Display for Properties {
    /// `HostAccessible + DeviceAccessible`, or `no access property` for none.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = [
            (self.host, "HostAccessible"),
            (self.device, "DeviceAccessible"),
            (self.migratable, "Migratable"),
            (self.pageable, "Pageable"),
        ];
        let mut first = true;
        for (_, name) in names.iter().filter(|(set, _)| *set) {
            if !first {
                f.write_str(" + ")?;
            }
            f.write_str(name)?;
            first = false;
        }
        if first {
            f.write_str("no access property")?;
        }
        Ok(())
    }
}

/// The alignment a resource guarantees, as a number: `alignment_of::<Cuda>() == 256`.
pub const fn alignment_of<R: MemoryResource + ?Sized>() -> usize {
    <R::Alignment as typenum::Unsigned>::USIZE
}

/// Asserts at compile time what an adaptor `A<U>` keeps of its upstream `U`: over `System`,
/// host-accessible pageable memory that no device reaches; over `Cuda`, device memory that is
/// neither host-accessible nor pageable; `Send` and `Sync` over both.
macro_rules! assert_keeps_properties {
    ($A:ident) => {
        static_assertions::assert_impl_all!(
            $A<crate::leaf::System>: Send,
            Sync,
            crate::property::Accessible<(crate::property::HostAccessible, crate::property::Pageable)>
        );
        static_assertions::assert_not_impl_any!(
            $A<crate::leaf::System>: crate::property::Accessible<crate::property::DeviceAccessible>
        );
        static_assertions::assert_impl_all!(
            $A<crate::leaf::Cuda>: Send,
            Sync,
            crate::property::Accessible<crate::property::DeviceAccessible>
        );
        static_assertions::assert_not_impl_any!(
            $A<crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>,
            crate::property::Accessible<crate::property::Pageable>
        );
    };
}
pub(crate) use assert_keeps_properties;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;
    use crate::{
        adaptor::{Limiting, Statistics, Tracking},
        suballoc::{Binning, Pool},
    };

    fn device<R: Accessible<DeviceAccessible>>() {}
    fn host<R: Accessible<HostAccessible>>() {}
    fn both<R: Accessible<(HostAccessible, DeviceAccessible)>>() {}
    fn managed<R: Accessible<Migratable>>() {}

    #[test]
    fn leaf_properties() {
        device::<Cuda>();
        device::<CudaAsync>();
        both::<Pinned>();
        both::<Managed>();
        managed::<Managed>();
        host::<System>();
        assert_eq!(alignment_of::<Cuda>(), 256);
        assert_eq!(alignment_of::<System>(), 16);
    }

    /// What a bound on a type parameter gives to the pointers and adaptors over it: checked by
    /// compiling, in code where `R` is generic (what a library function over any resource
    /// writes).
    fn carried<R>()
    where
        R: MemoryResource + Accessible<DeviceAccessible> + Accessible<HostAccessible>,
    {
        device::<&R>();
        device::<std::sync::Arc<R>>();
        device::<Statistics<&R>>();
        device::<Pool<std::sync::Arc<R>>>();
        device::<Limiting<Binning<&&R>>>();
        host::<Tracking<&R>>();
        both::<&R>();
        both::<Statistics<&R>>();
    }

    fn carried_migratable<R: MemoryResource + Accessible<Migratable>>() {
        managed::<&R>();
        managed::<Statistics<std::sync::Arc<R>>>();
    }

    #[test]
    fn generic_bounds_carry_to_pointers_and_adaptors() {
        carried::<Managed>();
        carried::<Pinned>();
        carried_migratable::<Managed>();
    }
}
