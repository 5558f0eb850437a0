//! `Recorder`: the upstream that records what reaches it, for the battery and for tests.

use crate::resource::{forward_upstream, MemoryResource, Result};
use crate::stream::{StreamId, StreamRef};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

/// An upstream that forwards to `inner` and records what reaches it in a [`Record`]: bytes and
/// allocations live, zero-size calls, deallocations that match no live allocation, and the
/// `synchronize` and `order_after` calls. Put it under the resource you test.
#[derive(Debug)]
pub struct Recorder<U> {
    inner: U,
    record: Record,
}

impl<U> Recorder<U> {
    /// Records what reaches `inner`.
    pub fn new(inner: U) -> Self {
        Recorder {
            inner,
            record: Record::default(),
        }
    }

    /// The resource it forwards to.
    pub fn inner(&self) -> &U {
        &self.inner
    }

    /// What has reached it so far.
    pub fn record(&self) -> &Record {
        &self.record
    }
}

/// What reached a [`Recorder`]. Every method takes a snapshot.
#[derive(Debug, Default)]
pub struct Record {
    state: Mutex<RecordState>,
}

#[derive(Debug, Default)]
struct RecordState {
    /// Live allocations: address → (size, alignment).
    live: HashMap<usize, (usize, usize)>,
    in_use: usize,
    allocations: usize,
    deallocations: usize,
    zero_size_calls: usize,
    bad_frees: usize,
    synchronized: Vec<StreamId>,
    ordered: Vec<(StreamId, StreamId)>,
}

impl Record {
    fn lock(&self) -> MutexGuard<'_, RecordState> {
        // Every update is a few plain stores: a poisoned lock still holds a consistent record.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes allocated and not yet deallocated.
    pub fn in_use(&self) -> usize {
        self.lock().in_use
    }

    /// Allocations not yet deallocated.
    pub fn live(&self) -> usize {
        self.lock().live.len()
    }

    /// Successful allocations of a non-zero size.
    pub fn allocations(&self) -> usize {
        self.lock().allocations
    }

    /// Deallocations of a live allocation, with its size and alignment.
    pub fn deallocations(&self) -> usize {
        self.lock().deallocations
    }

    /// `allocate` and `deallocate` calls of size zero: a resource above should answer those
    /// itself.
    pub fn zero_size_calls(&self) -> usize {
        self.lock().zero_size_calls
    }

    /// Deallocations of a pointer that is not live, or with another size or alignment than it was
    /// allocated with. They are not forwarded (the memory, if any, leaks).
    pub fn bad_frees(&self) -> usize {
        self.lock().bad_frees
    }

    /// The streams `synchronize` was called with, in order.
    pub fn synchronized(&self) -> Vec<StreamId> {
        self.lock().synchronized.clone()
    }

    /// The `(stream, after)` pairs `order_after` was called with, in order.
    pub fn ordered(&self) -> Vec<(StreamId, StreamId)> {
        self.lock().ordered.clone()
    }

    /// Forgets the `synchronize` and `order_after` calls recorded so far.
    pub fn clear_streams(&self) {
        let mut st = self.lock();
        st.synchronized.clear();
        st.ordered.clear();
    }
}

// SAFETY: every allocation is `inner`'s, unchanged, and goes back to it with the arguments it was
// allocated with; a deallocation that matches no live allocation is not forwarded (leaking is
// safe). The stream calls are forwarded after they are recorded.
unsafe impl<U: MemoryResource> MemoryResource for Recorder<U> {
    forward_upstream!(properties of U);
    type Alignment = U::Alignment;

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if size == 0 {
            self.record.lock().zero_size_calls += 1;
            return self.inner.allocate(size, align, stream);
        }
        let ptr = self.inner.allocate(size, align, stream)?;
        let mut st = self.record.lock();
        st.live.insert(ptr.as_ptr() as usize, (size, align));
        st.in_use += size;
        st.allocations += 1;
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        {
            let mut st = self.record.lock();
            if size == 0 {
                st.zero_size_calls += 1;
            } else {
                let addr = ptr.as_ptr() as usize;
                if st.live.get(&addr) != Some(&(size, align)) {
                    st.bad_frees += 1;
                    return;
                }
                st.live.remove(&addr);
                st.in_use -= size;
                st.deallocations += 1;
            }
        }
        // SAFETY: the pointer is live here with this size and alignment (checked above), so it
        // came from `inner.allocate` with them; it left the live table, so it is freed once. A
        // zero-size deallocation is forwarded as the caller made it.
        unsafe { self.inner.deallocate(ptr, size, align, stream) }
    }

    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        self.record.lock().synchronized.push(stream.id());
        self.inner.synchronize(stream)
    }

    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        self.record.lock().ordered.push((stream.id(), after.id()));
        self.inner.order_after(stream, after)
    }

    fn name(&self) -> &'static str {
        "Recorder"
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::stack::ItemWriter::over(f, &self.inner, "recorder").finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&self.inner)
    }
}

impl<U> crate::stack::HasUpstream for Recorder<U> {
    type Upstream = U;
    fn upstream(&self) -> &U {
        &self.inner
    }
}
