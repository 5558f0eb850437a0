//! The macros that write the pass-through items of a `MemoryResource` impl: an adaptor's
//! forwarding to its upstream, a leaf's property claim, and a resource with no stream work.

/// Writes the items of a `MemoryResource` impl that only pass through to the resource below:
/// its property bits (`properties of U`), and `synchronize` / `order_after` sent on unchanged
/// (`streams to field`, or `streams to *self` for a pointer), which is right whenever the memory
/// handed out is the one below's. `U, field` writes both and `U`'s alignment;
/// `U, field, Alignment = A` both and alignment `A`. `layer over field` writes an adaptor's `name`
/// (its `NAME`, or `layer over field, name = N`) and `upstream_layer`; `deallocate to field` a `deallocate` that only passes the
/// block on; `grow_in_place to *self` a pointer's `GrowInPlace`.
macro_rules! forward_upstream {
    // Through `Selects`, so that in generic code a bound `U: Accessible<P>` carries over.
    (properties of $U:ty) => {
        type Host = <$U as $crate::property::sealed::Selects<$crate::property::HostAccessible>>::Bit;
        type Device = <$U as $crate::property::sealed::Selects<$crate::property::DeviceAccessible>>::Bit;
        type Migratable = <$U as $crate::property::sealed::Selects<$crate::property::Migratable>>::Bit;
        type Pageable = <$U as $crate::property::sealed::Selects<$crate::property::Pageable>>::Bit;
    };
    // A pointer to a resource `R` is that resource: every item goes through.
    (everything to *self as $R:ty) => {
        $crate::resource::forward_upstream!(properties of $R);
        type Alignment = <$R as $crate::resource::MemoryResource>::Alignment;
        #[inline]
        fn allocate(
            &self,
            size: usize,
            align: usize,
            stream: $crate::stream::StreamRef<'_>,
        ) -> $crate::resource::Result<::core::ptr::NonNull<u8>> {
            $crate::resource::MemoryResource::allocate(&**self, size, align, stream)
        }
        #[inline]
        unsafe fn deallocate(
            &self,
            ptr: ::core::ptr::NonNull<u8>,
            size: usize,
            align: usize,
            stream: $crate::stream::StreamRef<'_>,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe { $crate::resource::MemoryResource::deallocate(&**self, ptr, size, align, stream) }
        }
        $crate::resource::forward_upstream!(streams to *self);
        fn name(&self) -> &'static str {
            $crate::resource::MemoryResource::name(&**self)
        }
    };
    (grow_in_place to *self) => {
        unsafe fn grow_in_place(
            &self,
            ptr: ::core::ptr::NonNull<u8>,
            size: usize,
            align: usize,
            new_size: usize,
            stream: $crate::stream::StreamRef<'_>,
        ) -> $crate::resource::Result<bool> {
            // SAFETY: the caller's promise, passed on unchanged.
            unsafe { (**self).grow_in_place(ptr, size, align, new_size, stream) }
        }
    };
    (streams to *self) => {
        fn synchronize(
            &self,
            stream: $crate::stream::StreamRef<'_>,
        ) -> ::core::result::Result<(), $crate::resource::AllocError> {
            $crate::resource::MemoryResource::synchronize(&**self, stream)
        }
        fn order_after(
            &self,
            stream: $crate::stream::StreamRef<'_>,
            after: $crate::stream::StreamRef<'_>,
        ) -> ::core::result::Result<(), $crate::resource::AllocError> {
            $crate::resource::MemoryResource::order_after(&**self, stream, after)
        }
    };
    (streams to $field:ident) => {
        fn synchronize(
            &self,
            stream: $crate::stream::StreamRef<'_>,
        ) -> ::core::result::Result<(), $crate::resource::AllocError> {
            self.$field.synchronize(stream)
        }
        fn order_after(
            &self,
            stream: $crate::stream::StreamRef<'_>,
            after: $crate::stream::StreamRef<'_>,
        ) -> ::core::result::Result<(), $crate::resource::AllocError> {
            self.$field.order_after(stream, after)
        }
    };
    // An adaptor's `name` (its `NAME`, or the one given) and its `upstream_layer`, the layer in
    // `field`.
    (layer over $field:ident) => {
        $crate::resource::forward_upstream!(layer over $field, name = Self::NAME);
    };
    (layer over $field:ident, name = $name:expr) => {
        fn name(&self) -> &'static str {
            $name
        }

        fn upstream_layer(&self) -> Option<&dyn $crate::stack::AnyLayer>
        where
            Self: 'static,
        {
            Some(&self.$field)
        }
    };
    // A `deallocate` that hands the block back to `field` unchanged (a zero-size block is the
    // adaptor's own dangling pointer, never the upstream's).
    (deallocate to $field:ident) => {
        #[inline]
        unsafe fn deallocate(
            &self,
            ptr: ::core::ptr::NonNull<u8>,
            size: usize,
            align: usize,
            stream: $crate::stream::StreamRef<'_>,
        ) {
            if size == 0 {
                return;
            }
            // SAFETY: forwarded from the caller.
            unsafe { self.$field.deallocate(ptr, size, align, stream) }
        }
    };
    ($U:ty, $field:ident) => {
        $crate::resource::forward_upstream!($U, $field, Alignment = <$U as $crate::resource::MemoryResource>::Alignment);
    };
    ($U:ty, $field:ident, Alignment = $A:ty) => {
        $crate::resource::forward_upstream!(properties of $U);
        type Alignment = $A;
        $crate::resource::forward_upstream!(streams to $field);
    };
}
pub(crate) use forward_upstream;

/// Writes the property bits and alignment a leaf claims, in one line:
/// `properties! { Host = B1, Device = B0, Migratable = B0, Pageable = B1, Alignment = U16 }`. The claim
/// is the `unsafe impl`'s, whose `// SAFETY:` argues it.
macro_rules! properties {
    (Host = $h:ty, Device = $d:ty, Migratable = $m:ty, Pageable = $p:ty, Alignment = $a:ty) => {
        type Host = $h;
        type Device = $d;
        type Migratable = $m;
        type Pageable = $p;
        type Alignment = $a;
    };
}
pub(crate) use properties;

/// Writes `synchronize` and `order_after` for a resource that queues no work on any stream (host
/// memory, a simulation): there is nothing to wait for or to order, so both return `Ok(())`.
/// `no_stream_work!(name = EXPR)` writes `name` too.
macro_rules! no_stream_work {
    () => {
        fn synchronize(&self, _: $crate::stream::StreamRef<'_>) -> $crate::resource::Result<()> {
            Ok(())
        }

        fn order_after(
            &self,
            _: $crate::stream::StreamRef<'_>,
            _: $crate::stream::StreamRef<'_>,
        ) -> $crate::resource::Result<()> {
            Ok(())
        }
    };
    (name = $name:expr) => {
        $crate::resource::no_stream_work!();

        fn name(&self) -> &'static str {
            $name
        }
    };
}
pub(crate) use no_stream_work;

/// Writes `synchronize` and `order_after` for a resource whose blocks all come through one
/// resource it holds (`streams_through!(self.field.field)`: `self` named by the caller, as a
/// macro's own would be another), which hears both, and `name`, the calling module's `NAME`.
macro_rules! streams_through {
    ($s:ident $(. $f:ident)+) => {
        fn synchronize(&$s, stream: $crate::stream::StreamRef<'_>) -> $crate::resource::Result<()> {
            $s$(.$f)+.synchronize(stream)
        }

        fn order_after(
            &$s,
            stream: $crate::stream::StreamRef<'_>,
            after: $crate::stream::StreamRef<'_>,
        ) -> $crate::resource::Result<()> {
            $s$(.$f)+.order_after(stream, after)
        }

        fn name(&$s) -> &'static str {
            NAME
        }
    };
}
pub(crate) use streams_through;
