// A resource with unsynchronized state (here a Callback whose context is a Cell) is !Sync:
// sharing it with another thread is refused at compile time, with no run-time flag to forget.
use mrstack::leaf::Callback;
use mrstack::prelude::*;
use std::cell::Cell;
use std::ptr::NonNull;

fn counted(calls: &Cell<usize>, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
    calls.set(calls.get() + 1);
    System.allocate(size, align, s)
}

unsafe fn free(_: &Cell<usize>, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
    unsafe { System.deallocate(p, size, align, s) }
}

fn main() {
    // SAFETY: System's memory is host memory, aligned to at least the alignment asked.
    let r = unsafe { Callback::<Cell<usize>, HostAccessible>::new(Cell::new(0), counted, free) };
    std::thread::scope(|s| {
        s.spawn(|| {
            let _ = r.allocate_sync(64, 8);
        });
    });
}
