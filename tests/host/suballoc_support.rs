//! What the suballocator tests share: simulated streams, live-block overlap checks, random
//! operation sequences, the `Coalescing` view of `Pool`, `Tlsf` and `ThreadHeaps`, the 16-thread
//! hammer, byte-pattern checks, the cross-stream reuse check and an upstream that panics once, jobs
//! run on worker threads, and the free blocks per bin of a `Binning`.

use crate::adaptor_support::{claims, streams};
use mrstack::prelude::*;
use mrstack::suballoc::{Binning, Pool, ThreadHeaps, Tlsf};
use mrstack::testing::Recorder;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ptr::NonNull;

/// A simulated stream (0 is the default stream).
pub(crate) fn stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

/// Live blocks by address, for overlap checks: `[addr, addr + len)`.
#[derive(Default)]
pub(crate) struct Live(BTreeMap<usize, usize>);

impl Live {
    /// Records a block, panicking if it overlaps a live one.
    pub(crate) fn insert(&mut self, addr: usize, len: usize) {
        if let Some((&a, &l)) = self.0.range(..=addr).next_back() {
            assert!(a + l <= addr, "block {addr:#x}+{len} overlaps {a:#x}+{l}");
        }
        if let Some((&a, &l)) = self.0.range(addr..).next() {
            assert!(addr + len <= a, "block {addr:#x}+{len} overlaps {a:#x}+{l}");
        }
        self.0.insert(addr, len);
    }
    pub(crate) fn remove(&mut self, addr: usize) {
        self.0
            .remove(&addr)
            .expect("freeing a block that is not live");
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Alloc {
        size: usize,
        align: usize,
        stream: usize,
    },
    Free {
        pick: prop::sample::Index,
        stream: usize,
    },
}

/// Up to 64 operations, sizes mostly small, some large, alignments 1 to 4096, three streams.
pub(crate) fn ops(max_size: usize) -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![
        2 => 0..=1024usize,
        3 => 1..=max_size / 8,
        1 => 1..=max_size,
    ];
    let op = prop_oneof![
        3 => (size, 0..=12u32, 0..3usize).prop_map(|(size, a, stream)| Op::Alloc {
            size,
            align: 1 << a,
            stream
        }),
        2 => (any::<prop::sample::Index>(), 0..3usize)
            .prop_map(|(pick, stream)| Op::Free { pick, stream }),
    ];
    prop::collection::vec(op, 1..64)
}

pub(crate) fn cases(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

pub(crate) fn nn(addr: usize) -> NonNull<u8> {
    NonNull::new(addr as *mut u8).unwrap()
}

/// A live allocation in a model test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    pub(crate) addr: usize,
    pub(crate) size: usize,
    pub(crate) align: usize,
}

/// What the model tests read of the two coalescing pools, `Pool` and `Tlsf`.
pub(crate) trait Coalescing: MemoryResource {
    fn usage(&self) -> mrstack::suballoc::Usage;
    fn max_size(&self) -> usize;
    fn release(&self) -> usize;
}

// Each forwards to its own inherent methods of the same names.
macro_rules! coalescing {
    ($($T:ident),*) => {$(
        impl<U: MemoryResource> Coalescing for $T<U> {
            fn usage(&self) -> mrstack::suballoc::Usage {
                $T::usage(self)
            }
            fn max_size(&self) -> usize {
                $T::max_size(self)
            }
            fn release(&self) -> usize {
                $T::release(self)
            }
        }
    )*};
}
coalescing!(Pool, Tlsf, ThreadHeaps);

impl<P: Coalescing> Coalescing for &P {
    fn usage(&self) -> mrstack::suballoc::Usage {
        (**self).usage()
    }
    fn max_size(&self) -> usize {
        (**self).max_size()
    }
    fn release(&self) -> usize {
        (**self).release()
    }
}

/// 16 threads allocate, fill, check and free random blocks through `mr`, half on the default
/// stream and half on their own: a block whose bytes changed while it was live proves an overlap.
/// `pick` draws a request's size and alignment from a random number.
pub(crate) fn hammer<R: MemoryResource + Sync>(
    mr: &R,
    seed: u64,
    pick: impl Fn(&mut dyn FnMut() -> u64) -> (usize, usize) + Sync,
) {
    std::thread::scope(|scope| {
        for t in 0..16usize {
            let pick = &pick;
            scope.spawn(move || {
                let s = if t % 2 == 0 {
                    StreamRef::DEFAULT
                } else {
                    stream(t)
                };
                let mut rng = seed ^ (t as u64 + 1);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut live: Vec<(NonNull<u8>, usize, usize, u8)> = Vec::new();
                for i in 0..1500usize {
                    if live.len() < 24 && next() % 8 < 5 {
                        let (size, align) = pick(&mut next);
                        let p = mr
                            .allocate(size, align, s)
                            .expect("room for 16 x 24 blocks");
                        assert_eq!(p.as_ptr() as usize % align.max(256), 0);
                        let tag = (t * 16 + i % 16) as u8;
                        // SAFETY: p is a live host block of at least `size` bytes.
                        unsafe { p.as_ptr().write_bytes(tag, size) };
                        live.push((p, size, align, tag));
                    } else if !live.is_empty() {
                        let (p, size, align, tag) = live.swap_remove(next() as usize % live.len());
                        check_pattern(p.as_ptr() as usize, size, tag);
                        // SAFETY: p is live, from `mr`, with this size and alignment.
                        unsafe { mr.deallocate(p, size, align, s) };
                    }
                }
                for (p, size, align, tag) in live {
                    check_pattern(p.as_ptr() as usize, size, tag);
                    // SAFETY: as above.
                    unsafe { mr.deallocate(p, size, align, s) };
                }
            });
        }
    });
}

/// 16 threads through a coalescing pool over host memory (`hammer`), then every chunk comes back
/// whole.
pub(crate) fn sixteen_threads<P: Coalescing + Sync>(pool: P, rec: &Recorder<System>, seed: u64) {
    hammer(&pool, seed, |next| {
        let size = match next() % 16 {
            0 => (next() % (1 << 20)) as usize + 1,
            _ => (next() % 8192) as usize + 1,
        };
        (size, 1 << (next() % 13))
    });
    assert_eq!(pool.usage().allocated, 0);
    let size = pool.usage().held;
    assert_eq!(pool.release(), size, "every chunk came back whole");
    drop(pool);
    assert_eq!(rec.record().in_use(), 0);
}

/// Panics unless the `size` bytes at `addr` all hold `tag`.
pub(crate) fn check_pattern(addr: usize, size: usize, tag: u8) {
    if size == 0 {
        return;
    }
    // SAFETY: the caller passes a live host block of `size` bytes that it filled.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, size) };
    assert!(
        bytes == vec![tag; size].as_slice(),
        "block {addr:#x}+{size} was overwritten"
    );
}

/// Blocks `mr` frees on `s` are reused at once on `s`, and on `t` only after `order_after(t, s)`
/// reached the upstream, `rec`.
pub(crate) fn check_cross_stream_reuse<R: MemoryResource>(
    mr: R,
    rec: &Recorder<Simulated>,
    size: usize,
) {
    let (s, t) = (stream(1), stream(2));
    let a = mr.allocate(size, 256, s).unwrap();
    // SAFETY: each call frees `a`, live with this size, after the allocation before it.
    let free = |on| unsafe { mr.deallocate(a, size, 256, on) };
    free(s);
    assert_eq!(
        mr.allocate(size, 256, s).unwrap(),
        a,
        "same stream: reused at once"
    );
    assert!(rec.record().ordered().is_empty());
    free(s);
    assert_eq!(mr.allocate(size, 256, t).unwrap(), a);
    assert_eq!(rec.record().ordered(), [(t.id(), s.id())]);
    free(t);
    assert_eq!(mr.allocate(size, 256, t).unwrap(), a);
    assert_eq!(
        rec.record().ordered().len(),
        1,
        "t's own free block needs no order"
    );
    free(t);
    drop(mr);
    assert_eq!(rec.record().in_use(), 0);
}

/// An upstream that panics once on its next `allocate` or `deallocate` when armed for it, before
/// reaching the `Simulated` inside (safe code: a panic, no lie; the memory stays its own).
pub(crate) struct PanicsOnce {
    pub(crate) inner: Recorder<Simulated>,
    pub(crate) on_allocate: std::sync::atomic::AtomicBool,
    pub(crate) on_deallocate: std::sync::atomic::AtomicBool,
}

impl PanicsOnce {
    pub(crate) fn new() -> Self {
        PanicsOnce {
            inner: Recorder::new(Simulated::new(1 << 30)),
            on_allocate: Default::default(),
            on_deallocate: Default::default(),
        }
    }
}

// SAFETY: forwards everything unchanged, or panics before reaching the inner resource.
unsafe impl MemoryResource for PanicsOnce {
    claims! { as Simulated }
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        if self
            .on_allocate
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            panic!("the upstream's allocate panics (expected by the test)");
        }
        self.inner.allocate(size, align, s)
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
        if self
            .on_deallocate
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            panic!("the upstream's deallocate panics (expected by the test)");
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.inner.deallocate(p, size, align, s) }
    }
    streams!(to inner);
}

/// What a model op asks of the resource: an allocation (size, alignment, stream) or a free
/// (address, size, alignment, stream).
pub(crate) enum Job {
    Alloc(usize, usize, StreamRef<'static>),
    Free(usize, usize, usize, StreamRef<'static>),
}

impl Job {
    /// Runs the job on `mr`: the address allocated (0 for a free).
    pub(crate) fn run<R: MemoryResource>(self, mr: &R) -> Result<usize, AllocError> {
        match self {
            Job::Alloc(size, align, s) => mr.allocate(size, align, s).map(|p| p.as_ptr() as usize),
            Job::Free(addr, size, align, s) => {
                // SAFETY: the model frees only live blocks of `mr`, with their size and
                // alignment.
                unsafe { mr.deallocate(nn(addr), size, align, s) };
                Ok(0)
            }
        }
    }
}

/// Runs `body` with a function that has worker thread `t` (of `n`) run a job on `mr` and
/// returns the address it allocated (0 for a failure or a free).
pub(crate) fn on_workers<R: MemoryResource + Sync>(
    mr: &R,
    n: usize,
    body: impl FnOnce(&dyn Fn(usize, Job) -> Result<usize, AllocError>),
) {
    use std::sync::mpsc;
    std::thread::scope(|s| {
        let mut senders = Vec::new();
        for _ in 0..n {
            let (tx, rx) = mpsc::channel::<(Job, mpsc::Sender<Result<usize, AllocError>>)>();
            senders.push(tx);
            s.spawn(move || {
                for (job, answer) in rx {
                    answer.send(job.run(mr)).unwrap();
                }
            });
        }
        let run = |t: usize, job: Job| {
            let (tx, rx) = mpsc::channel();
            senders[t].send((job, tx)).unwrap();
            rx.recv().unwrap()
        };
        body(&run);
        drop(senders);
    });
}

/// Free blocks in each bin of `mr`, smallest bin first.
pub(crate) fn free_per_bin<U: MemoryResource>(mr: &Binning<U>) -> Vec<usize> {
    mr.bin_usage().iter().map(|u| u.free_blocks).collect()
}
