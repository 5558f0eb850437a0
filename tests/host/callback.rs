//! Host tests of `Callback`: user functions over a context value, with the properties stated in
//! the type. The functions here wrap `std::alloc`, so the bytes are real.

use mrstack::prelude::*;
use mrstack::property::Pageable;
use mrstack::{
    container::HostAllocator, erased::AnyResource, leaf::Callback, resource::AllocErrorKind,
};
use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use typenum::U16;

const S: StreamRef = StreamRef::DEFAULT;

fn fake_stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

/// The number a test stream was made from (0 for the default stream).
fn sid(s: StreamRef) -> usize {
    (s.id().get() & u64::from(u32::MAX)) as usize
}

/// The foreign allocator's state: its live blocks, as a foreign allocator would track them.
#[derive(Default, Debug)]
pub(crate) struct Heap {
    pub(crate) live: Mutex<HashMap<usize, Layout>>,
    pub(crate) calls: AtomicUsize,
    pub(crate) frees: AtomicUsize,
}

fn heap_alloc(
    h: &Heap,
    size: usize,
    align: usize,
    _: StreamRef,
) -> Result<NonNull<u8>, AllocError> {
    h.calls.fetch_add(1, Ordering::Relaxed);
    let layout = Layout::from_size_align(size, align.max(16))
        .map_err(|_| AllocError::out_of_memory(size, align, "heap"))?;
    // SAFETY: size > 0: Callback never passes a zero size.
    let p = NonNull::new(unsafe { alloc(layout) })
        .ok_or(AllocError::out_of_memory(size, align, "heap"))?;
    h.live.lock().unwrap().insert(p.as_ptr() as usize, layout);
    Ok(p)
}

/// # Safety
/// `p` came from `heap_alloc` on `h` and was not freed since.
unsafe fn heap_free(h: &Heap, p: NonNull<u8>, size: usize, align: usize, _: StreamRef) {
    h.frees.fetch_add(1, Ordering::Relaxed);
    let layout = h
        .live
        .lock()
        .unwrap()
        .remove(&(p.as_ptr() as usize))
        .expect("a live block");
    assert_eq!((layout.size(), layout.align()), (size, align.max(16)));
    // SAFETY: allocated by heap_alloc with this layout (checked just above).
    unsafe { dealloc(p.as_ptr(), layout) }
}

pub(crate) fn heap() -> Callback<Heap, Pageable, U16> {
    // SAFETY: heap_alloc returns pageable host memory of `size` bytes aligned to max(align, 16)
    // from std::alloc, valid until heap_free gives it back with the same layout; no stream work.
    unsafe { Callback::new(Heap::default(), heap_alloc, heap_free) }.with_name("heap")
}

#[test]
fn memory_is_real_and_every_block_goes_back() {
    let mr = heap();
    let mut blocks = Vec::new();
    for i in 0..100usize {
        let (size, align) = (1 + i * 13, 1 << (i % 9));
        let p = mr.allocate(size, align, S).unwrap();
        assert_eq!(p.as_ptr() as usize % align.max(16), 0);
        // SAFETY: host memory of `size` bytes, just allocated.
        unsafe { p.as_ptr().write_bytes(i as u8, size) };
        blocks.push((p, size, align, i as u8));
    }
    for (p, size, align, tag) in blocks {
        // SAFETY: live host memory written above.
        assert!(unsafe { std::slice::from_raw_parts(p.as_ptr(), size) }
            .iter()
            .all(|&b| b == tag));
        // SAFETY: p came from mr with this size and align.
        unsafe { mr.deallocate(p, size, align, S) };
    }
    assert!(mr.context().live.lock().unwrap().is_empty());
    assert_eq!(mr.context().calls.load(Ordering::Relaxed), 100);
    assert_eq!(mr.context().frees.load(Ordering::Relaxed), 100);
}

#[test]
fn bad_and_empty_requests_never_reach_the_functions() {
    let mr = heap();
    let p = mr.allocate(0, 32, S).unwrap();
    assert_eq!(p.as_ptr() as usize % 32, 0);
    // SAFETY: a zero-size block of mr; a no-op.
    unsafe { mr.deallocate(p, 0, 32, S) };
    assert!(matches!(
        mr.allocate(8, 12, S).unwrap_err().kind,
        AllocErrorKind::InvalidArgument(_)
    ));
    let e = mr.allocate(usize::MAX, 1, S).unwrap_err();
    assert_eq!(e.resource, "heap");
    assert_eq!(mr.context().calls.load(Ordering::Relaxed), 0);
    assert_eq!(mr.context().frees.load(Ordering::Relaxed), 0);
}

#[test]
fn errors_of_the_function_pass_through() {
    // SAFETY: the allocate function never returns memory, so there is nothing to promise about it.
    let mr = unsafe {
        Callback::<(), HostAccessible>::new(
            (),
            |_, size, align, _| Err(AllocError::out_of_memory(size, align, "exhausted")),
            |_, _, _, _, _| unreachable!("nothing was allocated"),
        )
    };
    let e = mr.allocate(64, 8, S).unwrap_err();
    assert!(e.is_out_of_memory());
    assert_eq!(e.resource, "exhausted");
    assert_eq!(mr.name(), "Callback");
}

/// A foreign allocator that hands out pointers one byte past an aligned slot: a bug Callback
/// must catch rather than pass on.
struct OffByOne {
    slot: Box<[u128; 64]>,
    freed: AtomicUsize,
}

#[test]
fn a_misaligned_pointer_is_given_back_and_reported() {
    let ctx = OffByOne {
        slot: Box::new([0; 64]),
        freed: AtomicUsize::new(0),
    };
    // SAFETY: the pointer is into `slot`, host memory of 1024 bytes owned by the context, and is
    // used at most once at a time below (a one-slot allocator); the misalignment is the point.
    let mr = unsafe {
        Callback::<OffByOne, HostAccessible, U16>::new(
            ctx,
            |c, _, _, _| Ok(NonNull::from(&c.slot[0]).cast::<u8>().add(1)),
            |c, _, _, _, _| {
                c.freed.fetch_add(1, Ordering::Relaxed);
            },
        )
    };
    let e = mr.allocate(100, 4, S).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::Unsupported(_)), "{e}");
    assert_eq!(
        mr.context().freed.load(Ordering::Relaxed),
        1,
        "the bad pointer went back"
    );
}

static SYNCS: AtomicUsize = AtomicUsize::new(0);
static ORDERS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

#[test]
fn stream_functions_can_be_supplied() {
    // SAFETY: the replacements count and return Ok; the heap's memory has no stream work.
    let mr = unsafe {
        heap()
            .with_synchronize(|_, _| {
                SYNCS.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .with_order_after(|_, s, a| {
                ORDERS.lock().unwrap().push((sid(s), sid(a)));
                Ok(())
            })
    };
    let p = mr.allocate_sync(10, 1).unwrap();
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate_sync(p, 10, 1) };
    assert_eq!(SYNCS.load(Ordering::Relaxed), 2);
    let (s1, s2) = (fake_stream(1), fake_stream(2));
    mr.order_after(s1, s2).unwrap();
    assert_eq!(*ORDERS.lock().unwrap(), [(1, 2)]);
}

#[test]
fn default_stream_functions_have_nothing_to_wait_for_without_a_driver() {
    if crate::support::driver_loaded(
        "a driver is loaded, so the defaults call it (the GPU suite tests them)",
    ) {
        return;
    }
    let mr = heap();
    mr.synchronize(S).unwrap();
    let other = fake_stream(9);
    mr.order_after(other, S).unwrap();
    mr.order_after(S, S).unwrap();
}

#[test]
fn a_callback_is_a_resource_like_any_other() {
    let mr = heap();
    let any = AnyResource::<HostAccessible>::new(heap());
    let alloc = HostAllocator::new(&mr);
    let mut v = allocator_api2::vec::Vec::new_in(alloc);
    v.extend(0..1000u32);
    assert_eq!(v.iter().sum::<u32>(), 499_500);
    drop(v);
    assert!(mr.context().live.lock().unwrap().is_empty());
    crate::support::serve_one(&any, 64, 64, S);
    assert_eq!(any.name(), "heap");
    assert_eq!(any.properties().alignment, 16);
}
