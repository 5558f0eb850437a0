//! [`cudarc_interop`], which implements cudarc's slice, pointer and kernel-argument traits for
//! each container.

/// Implements cudarc's `DeviceSlice`, `DevicePtr`, `DevicePtrMut` and `PushKernelArg` (for `&` and
/// `&mut`) for a container whose `RawBuf<T, R>` is at the given field path, with `touched(&self)`
/// (device work that reads the memory is queued) and `touched_mut(&mut self)` (work that may
/// write it). Copies go through [`order_read_of`](super::order_read_of)/
/// [`order_write_of`](super::order_write_of) (see the [`container`](super) module docs); kernel
/// arguments through cudarc's own implementations for the buffer's `CudaSlice`, a `&mut` one after
/// [`before_kernel_write`](super::before_kernel_write). A `&` kernel argument is read-only to the
/// kernel, as for cudarc's own `&CudaSlice`. A macro because these are foreign traits on three
/// distinct types: no single generic impl covers them.
macro_rules! cudarc_interop {
    ($container:ident, $($buf:ident).+ where R: $($bound:tt)+) => {
        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DeviceSlice<T>
            for $container<T, R>
        {
            fn len(&self) -> usize {
                self.$($buf).+.len()
            }
            fn stream(&self) -> &std::sync::Arc<cudarc::driver::CudaStream> {
                self.$($buf).+.stream()
            }
        }

        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DevicePtr<T>
            for $container<T, R>
        {
            fn device_ptr<'a>(
                &'a self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, cudarc::driver::SyncOnDrop<'a>) {
                self.touched();
                self.$($buf).+.order_read(stream, $crate::container::ReadBy::Cudarc)
            }
        }

        impl<T: cudarc::driver::DeviceRepr, R: $($bound)+> cudarc::driver::DevicePtrMut<T>
            for $container<T, R>
        {
            fn device_ptr_mut<'a>(
                &'a mut self,
                stream: &'a cudarc::driver::CudaStream,
            ) -> (cudarc::driver::sys::CUdeviceptr, cudarc::driver::SyncOnDrop<'a>) {
                self.touched_mut();
                self.$($buf).+.order_write(stream)
            }
        }

        // SAFETY: cudarc's own implementation for `&CudaSlice`, on the container's slice, which
        // lives as long as the borrow 'b of the container, itself outliving the builder 'a.
        unsafe impl<'a, 'b: 'a, T: cudarc::driver::DeviceRepr, R: $($bound)+>
            cudarc::driver::PushKernelArg<&'b $container<T, R>> for cudarc::driver::LaunchArgs<'a>
        {
            fn arg(&mut self, arg: &'b $container<T, R>) -> &mut Self {
                arg.touched();
                let (slice, readers) = arg.$($buf).+.parts();
                $crate::container::before_kernel_read(slice.stream(), readers);
                self.arg(slice)
            }
        }

        // SAFETY: as for `&`; the `&mut` borrow makes the kernel the only writer while it is held,
        // and the container's stream first waits for the reads recorded outside cudarc's events.
        unsafe impl<'a, 'b: 'a, T: cudarc::driver::DeviceRepr, R: $($bound)+>
            cudarc::driver::PushKernelArg<&'b mut $container<T, R>>
            for cudarc::driver::LaunchArgs<'a>
        {
            fn arg(&mut self, arg: &'b mut $container<T, R>) -> &mut Self {
                arg.touched_mut();
                arg.$($buf).+.before_kernel_write();
                self.arg(arg.$($buf).+.parts_mut().0)
            }
        }
    };
}
pub(crate) use cudarc_interop;
