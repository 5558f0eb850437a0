//! Memory properties: what a resource's memory may be touched by.
//!
//! A [`MemoryResource`] states its properties as [typenum] bits (`type Host`, `type Device`,
//! `type Managed`) and its guaranteed alignment as a typenum unsigned (`type Alignment`), so that
//! adaptors compute theirs from their upstream's at compile time. Users and containers speak in
//! marker types instead: [`HostAccessible`], [`DeviceAccessible`], [`Migratable`], and the bound
//! [`Accessible<P>`], which every resource with the matching bit set implements.
//!
//! When the bound does not hold, the compiler says which resource lacks which property:
//!
//! ```text
//! error[E0277]: `System` does not give DeviceAccessible memory
//!    = note: kernels dereference only DeviceAccessible memory: DeviceBox and DeviceVec need it ...
//! ```

use crate::resource::MemoryResource;
use typenum::B1;

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
/// properties when each holds (`Accessible<(HostAccessible, DeviceAccessible)>`). Do not implement
/// it yourself: set the bits on your resource instead.
///
/// ```
/// use mrstack::prelude::*;
/// fn needs_device<R: Accessible<DeviceAccessible>>() {}
/// needs_device::<Cuda>();
/// needs_device::<std::sync::Arc<Managed>>(); // references and Arcs forward their resource's
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` does not give {P} memory",
    label = "this resource's memory is not {P}",
    note = "kernels dereference only DeviceAccessible memory: DeviceBox and DeviceVec need it; PinnedVec and host access (as_host_slice, Deref) need HostAccessible too; Prefetch needs Migratable (managed) memory",
    note = "pick a resource that has the property (Cuda, CudaAsync, Pinned, Managed for DeviceAccessible; System, Pinned, Managed for HostAccessible; Managed for Migratable), or an adaptor stack over one"
)]
pub trait Accessible<P> {}

/// The check behind [`Accessible`]: implemented only for the bit `B1`. An implementation detail,
/// public because the blanket impls name it.
#[doc(hidden)]
pub trait Gives<P, R: ?Sized> {}

impl<P, R: ?Sized> Gives<P, R> for B1 {}

// `do_not_recommend` makes a failure read as "`System` does not give DeviceAccessible memory"
// rather than as a trait-solver trail through typenum bits.
#[diagnostic::do_not_recommend]
impl<R: MemoryResource + ?Sized> Accessible<HostAccessible> for R where
    R::Host: Gives<HostAccessible, R>
{
}

#[diagnostic::do_not_recommend]
impl<R: MemoryResource + ?Sized> Accessible<DeviceAccessible> for R where
    R::Device: Gives<DeviceAccessible, R>
{
}

#[diagnostic::do_not_recommend]
impl<R: MemoryResource + ?Sized> Accessible<Migratable> for R where R::Managed: Gives<Migratable, R> {}

impl<R: ?Sized, A, B> Accessible<(A, B)> for R where R: Accessible<A> + Accessible<B> {}

impl<R: ?Sized, A, B, C> Accessible<(A, B, C)> for R where
    R: Accessible<A> + Accessible<B> + Accessible<C>
{
}

/// The alignment a resource guarantees, as a number: `alignment_of::<Cuda>() == 256`.
pub const fn alignment_of<R: MemoryResource + ?Sized>() -> usize {
    <R::Alignment as typenum::Unsigned>::USIZE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prelude::*;

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
}
