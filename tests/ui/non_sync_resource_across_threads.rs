// A resource with unsynchronized state (here a Cell) is !Sync: sharing it with another thread is
// refused at compile time, with no run-time flag to forget.
use mrstack::prelude::*;
use mrstack::resource::AllocError;
use std::cell::Cell;
use std::ptr::NonNull;

struct Counting {
    inner: System,
    count: Cell<usize>,
}

// SAFETY: forwards to System.
unsafe impl MemoryResource for Counting {
    type Host = <System as MemoryResource>::Host;
    type Device = <System as MemoryResource>::Device;
    type Managed = <System as MemoryResource>::Managed;
    type Pageable = <System as MemoryResource>::Pageable;
    type Alignment = <System as MemoryResource>::Alignment;
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        self.count.set(self.count.get() + 1);
        self.inner.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        unsafe { self.inner.deallocate(p, size, align, s) }
    }
    fn synchronize(&self, s: StreamRef) -> Result<(), AllocError> {
        self.inner.synchronize(s)
    }
    fn order_after(&self, s: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        self.inner.order_after(s, after)
    }
}

fn main() {
    let r = Counting { inner: System::new(), count: Cell::new(0) };
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = r.allocate_sync(64, 8);
        });
    });
}
