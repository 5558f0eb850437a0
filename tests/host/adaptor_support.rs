//! What the adaptor tests share: simulated streams, counters, an upstream that refuses large
//! alignments, random operation sequences, byte fills and checks, handing a block to another
//! thread, and the macros that write the items a test double only passes through.

use mrstack::adaptor::Counter;
use mrstack::prelude::*;
use mrstack::resource::check_request;
use mrstack::resource::AllocErrorKind;
use proptest::prelude::*;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Mutex;
use typenum::{B0, B1, U256};

pub(crate) const S: StreamRef = StreamRef::DEFAULT;

pub(crate) fn stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

pub(crate) fn counter(current: i128, peak: i128, total: i128) -> Counter {
    Counter {
        current,
        peak,
        total,
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Alloc(usize),
    Free(usize),
}

pub(crate) fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            (0usize..5000).prop_map(Op::Alloc),
            (0usize..64).prop_map(Op::Free)
        ],
        0..120,
    )
}

/// Host memory that, like the CUDA leaves, guarantees 256 bytes and refuses any larger alignment
/// with `Unsupported`; counts its live blocks so a test can check that everything came back.
#[derive(Default)]
pub(crate) struct Refusing {
    pub(crate) live: Mutex<HashMap<usize, usize>>,
}

// SAFETY: memory from System at alignment 256, freed with the same size; larger alignments refused.
unsafe impl MemoryResource for Refusing {
    claims! { Host = B1, Device = B0, Migratable = B0, Pageable = B0, Alignment = U256 }

    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if let Some(p) = check_request::<Self>(size, align, "Refusing")? {
            return Ok(p);
        }
        if align > 256 {
            return Err(AllocError::new(
                AllocErrorKind::Unsupported("alignment above 256"),
                size,
                align,
                "Refusing",
            ));
        }
        let p = System.allocate(size, 256, s)?;
        self.live.lock().unwrap().insert(p.as_ptr() as usize, size);
        Ok(p)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, _: usize, s: StreamRef) {
        if size == 0 {
            return;
        }
        let was = self.live.lock().unwrap().remove(&(ptr.as_ptr() as usize));
        assert_eq!(was, Some(size), "Refusing: bad deallocate");
        // SAFETY: allocated above from System with this size and alignment 256.
        unsafe { System.deallocate(ptr, size, 256, s) };
    }

    streams!(none);
}

/// Fills `len` bytes at `p` with `tag`.
pub(crate) fn fill(p: NonNull<u8>, len: usize, tag: u8) {
    // SAFETY: callers pass a live host allocation of at least `len` bytes.
    unsafe { p.as_ptr().write_bytes(tag, len) };
}

/// True when the `len` bytes at `p` all hold `tag`.
pub(crate) fn holds(p: NonNull<u8>, len: usize, tag: u8) -> bool {
    // SAFETY: callers pass a live host allocation of at least `len` bytes, filled by `fill`.
    unsafe { std::slice::from_raw_parts(p.as_ptr(), len) }
        .iter()
        .all(|&b| b == tag)
}

/// Blocks one thread allocates and another frees: each thread's shard counts up or down without
/// end, and wraps. Hands `rounds` blocks of `size` from this thread to another, one at a time.
pub(crate) fn hand_over<R: MemoryResource + Sync>(mr: &R, size: usize, rounds: usize) {
    let (to_other, blocks) = std::sync::mpsc::channel::<usize>();
    let (freed, wait) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            for addr in blocks {
                let p = NonNull::new(addr as *mut u8).unwrap();
                // SAFETY: p came from mr with this size and alignment, and is freed once.
                unsafe { mr.deallocate(p, size, 256, S) };
                freed.send(()).unwrap();
            }
        });
        for _ in 0..rounds {
            let p = mr.allocate(size, 256, S).unwrap();
            to_other.send(p.as_ptr() as usize).unwrap();
            wait.recv().unwrap();
        }
        drop(to_other);
    });
}

/// The property items of a test double's `unsafe impl MemoryResource`, in one line: what it
/// claims, which its `// SAFETY:` argues.
macro_rules! claims {
    (Host = $h:ty, Device = $d:ty, Migratable = $m:ty, Pageable = $p:ty, Alignment = $a:ty) => {
        type Host = $h;
        type Device = $d;
        type Migratable = $m;
        type Pageable = $p;
        type Alignment = $a;
    };
    // A double whose memory is resource `U`'s claims what `U` claims.
    (as $U:ty) => {
        type Host = <$U as mrstack::resource::MemoryResource>::Host;
        type Device = <$U as mrstack::resource::MemoryResource>::Device;
        type Migratable = <$U as mrstack::resource::MemoryResource>::Migratable;
        type Pageable = <$U as mrstack::resource::MemoryResource>::Pageable;
        type Alignment = <$U as mrstack::resource::MemoryResource>::Alignment;
    };
}
pub(crate) use claims;

/// `synchronize` and `order_after` of a test double: sent on unchanged to `self.$inner`
/// (`streams!(to inner)`), or, for a double that queues no work, `Ok(())` (`streams!(none)`).
macro_rules! streams {
    (to $inner:tt) => {
        fn synchronize(&self, s: mrstack::stream::StreamRef) -> mrstack::resource::Result<()> {
            self.$inner.synchronize(s)
        }
        fn order_after(
            &self,
            s: mrstack::stream::StreamRef,
            after: mrstack::stream::StreamRef,
        ) -> mrstack::resource::Result<()> {
            self.$inner.order_after(s, after)
        }
    };
    (none) => {
        fn synchronize(&self, _: mrstack::stream::StreamRef) -> mrstack::resource::Result<()> {
            Ok(())
        }
        fn order_after(
            &self,
            _: mrstack::stream::StreamRef,
            _: mrstack::stream::StreamRef,
        ) -> mrstack::resource::Result<()> {
            Ok(())
        }
    };
}
pub(crate) use streams;

/// A test double's `deallocate` that passes the block on to `self.$inner` unchanged.
macro_rules! deallocate_to {
    ($inner:tt) => {
        unsafe fn deallocate(
            &self,
            p: std::ptr::NonNull<u8>,
            size: usize,
            align: usize,
            s: mrstack::stream::StreamRef,
        ) {
            // SAFETY: forwarded from the caller.
            unsafe { self.$inner.deallocate(p, size, align, s) }
        }
    };
}
pub(crate) use deallocate_to;
