//! Stream order when an upstream cannot order or wait, or panics: an upstream over `Simulated`
//! whose `order_after` and `synchronize` fail or panic on command, and a vector-clock model of
//! stream order fed by every ordering it grants. A block freed on stream S may go to another stream
//! T only once T is ordered after S (or the host waited for S); where neither can be done, the
//! memory is leaked. Arena's paths first, then the drops of the pools and bins.

use crate::adaptor_support::{claims, deallocate_to};
use mrstack::prelude::*;
use mrstack::resource::{AllocError, AllocErrorKind};
use mrstack::suballoc::Arena;
use mrstack::suballoc::ArenaConfig;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;
use typenum::{B0, U256};

fn s(n: u32) -> StreamRef<'static> {
    StreamRef::simulated(n)
}
fn sid(s: StreamRef) -> u32 {
    (s.id().get() & u64::from(u32::MAX)) as u32
}

/// Vector clocks: per stream a clock vector; the host's clock (what synchronize made it see).
#[derive(Default)]
pub(crate) struct Model {
    vc: HashMap<u32, HashMap<u32, u64>>,
    host: HashMap<u32, u64>,
    /// Freed ranges: (start, end, stream, clock of the free).
    freed: Vec<(usize, usize, u32, u64)>,
    pub(crate) violations: Vec<String>,
}

impl Model {
    fn tick(&mut self, st: u32) -> u64 {
        let c = self.vc.entry(st).or_default().entry(st).or_insert(0);
        *c += 1;
        *c
    }
    fn order(&mut self, t: u32, a: u32) {
        let va = self.vc.get(&a).cloned().unwrap_or_default();
        let vt = self.vc.entry(t).or_default();
        for (k, v) in va {
            let e = vt.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
    }
    fn sync(&mut self, a: u32) {
        let va = self.vc.get(&a).cloned().unwrap_or_default();
        for (k, v) in va {
            let e = self.host.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
    }
    pub(crate) fn free(&mut self, p: usize, size: usize, st: u32) {
        let c = self.tick(st);
        self.freed.push((p, p + size, st, c));
    }
    pub(crate) fn alloc(&mut self, p: usize, size: usize, t: u32) {
        let (lo, hi) = (p, p + size);
        let vt = self.vc.get(&t).cloned().unwrap_or_default();
        for &(a, b, st, c) in &self.freed {
            if a < hi && lo < b && st != t {
                let seen = vt
                    .get(&st)
                    .copied()
                    .unwrap_or(0)
                    .max(self.host.get(&st).copied().unwrap_or(0));
                if seen < c {
                    self.violations.push(format!(
                        "block {lo:#x}+{size} handed to stream {t} overlaps [{a:#x},{b:#x}) freed on stream {st} (free clock {c}, stream {t} has seen {seen})"
                    ));
                }
            }
        }
        // Reuse supersedes the older frees of these bytes.
        self.freed.retain(|&(a, b, _, _)| !(a < hi && lo < b));
    }
}

/// `Simulated` with knobs: fail/panic `order_after` and `synchronize`, callbacks, and the model.
pub(crate) struct Hostile {
    pub(crate) sim: Simulated,
    pub(crate) fail_order: AtomicBool,
    pub(crate) fail_sync: AtomicBool,
    pub(crate) panic_order: AtomicBool,
    /// Panics in the next `order_after` only.
    pub(crate) panic_order_once: AtomicBool,
    pub(crate) panic_sync: AtomicBool,
    pub(crate) model: Mutex<Model>,
}

impl Hostile {
    pub(crate) fn new(cap: usize) -> Self {
        Hostile {
            sim: Simulated::new(cap),
            fail_order: AtomicBool::new(false),
            fail_sync: AtomicBool::new(false),
            panic_order: AtomicBool::new(false),
            panic_order_once: AtomicBool::new(false),
            panic_sync: AtomicBool::new(false),
            model: Mutex::new(Model::default()),
        }
    }
}

fn err() -> AllocError {
    AllocError::new(AllocErrorKind::Unsupported("hostile"), 0, 0, "Hostile")
}

// SAFETY: memory is Simulated's, unchanged.
unsafe impl MemoryResource for Hostile {
    claims! { Host = B0, Device = B0, Migratable = B0, Pageable = B0, Alignment = U256 }
    fn allocate(
        &self,
        size: usize,
        align: usize,
        st: StreamRef,
    ) -> Result<NonNull<u8>, AllocError> {
        self.sim.allocate(size, align, st)
    }
    deallocate_to!(sim);
    fn synchronize(&self, st: StreamRef) -> Result<(), AllocError> {
        if self.panic_sync.load(SeqCst) {
            panic!("hostile synchronize");
        }
        if self.fail_sync.load(SeqCst) {
            return Err(err());
        }
        self.model.lock().unwrap().sync(sid(st));
        Ok(())
    }
    fn order_after(&self, st: StreamRef, after: StreamRef) -> Result<(), AllocError> {
        if self.panic_order.load(SeqCst) || self.panic_order_once.swap(false, SeqCst) {
            panic!("hostile order_after");
        }
        if self.fail_order.load(SeqCst) {
            return Err(err());
        }
        self.model.lock().unwrap().order(sid(st), sid(after));
        Ok(())
    }
}

fn arena(h: &Hostile, size: usize, sb: usize) -> Arena<&Hostile> {
    Arena::new(
        h,
        ArenaConfig {
            size,
            superblock: sb,
        },
    )
}

/// Allocates through `a` on `st` and checks the model.
fn alloc<R: MemoryResource>(h: &Hostile, a: &R, size: usize, st: StreamRef) -> usize {
    let p = a.allocate(size, 256, st).unwrap().as_ptr() as usize;
    h.model.lock().unwrap().alloc(p, size, sid(st));
    p
}
fn free<R: MemoryResource>(h: &Hostile, a: &R, p: usize, size: usize, st: StreamRef) {
    h.model.lock().unwrap().free(p, size, sid(st));
    let ptr = NonNull::new(std::ptr::with_exposed_provenance_mut(p)).unwrap();
    // SAFETY: allocated from `a` with this size and alignment 256.
    unsafe { a.deallocate(ptr, size, 256, st) };
}

/// A free on another stream that the upstream can neither order nor wait for: the block is
/// leaked (and with it, at the drop, the chunks), not handed to the arena's stream.
#[test]
fn a_free_that_can_be_neither_ordered_nor_waited_for_is_not_reused() {
    let h = Hostile::new(1 << 30);
    let a = arena(&h, 64 << 20, 64 << 10);
    let p = alloc(&h, &a, 1024, s(1));
    h.fail_order.store(true, SeqCst);
    h.fail_sync.store(true, SeqCst);
    free(&h, &a, p, 1024, s(2)); // freed on stream 2 into stream 1's arena: ordering fails
    h.fail_order.store(false, SeqCst);
    h.fail_sync.store(false, SeqCst);
    let q = alloc(&h, &a, 1024, s(1));
    let v = std::mem::take(&mut h.model.lock().unwrap().violations);
    assert!(v.is_empty(), "{v:#?}");
    assert_ne!(p, q, "the block freed unordered was handed out again");
    free(&h, &a, q, 1024, s(1));
}

/// Free ranges merged past what their tags hold are waited for; where that fails, the merged
/// range is leaked, not handed to any stream.
#[test]
fn a_merged_range_whose_streams_cannot_be_waited_for_is_not_handed_out() {
    let h = Hostile::new(1 << 30);
    let a = arena(&h, 64 << 20, 64 << 10);
    let mb = 1 << 20;
    let ps: Vec<usize> = (0..5).map(|_| alloc(&h, &a, mb, s(0))).collect();
    // Five streams free neighbouring blocks: the merged range names more streams than its tags
    // hold, so they are waited for, and that fails (order_after works).
    h.fail_sync.store(true, SeqCst);
    for (i, &p) in ps.iter().enumerate().rev() {
        free(&h, &a, p, mb, s(i as u32 + 1));
    }
    h.fail_sync.store(false, SeqCst);
    let q = alloc(&h, &a, mb, s(6));
    let v = std::mem::take(&mut h.model.lock().unwrap().violations);
    assert!(v.is_empty(), "{v:#?}");
    free(&h, &a, q, mb, s(6));
}

/// `allocate_sync` (how the arena takes its chunks) gives the block back when the wait panics.
#[test]
fn a_chunk_whose_wait_panics_goes_back_to_the_upstream() {
    let h = Hostile::new(1 << 30);
    {
        let a = arena(&h, 64 << 20, 64 << 10);
        h.panic_sync.store(true, SeqCst);
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.allocate(1024, 256, s(0))));
        h.panic_sync.store(false, SeqCst);
        assert!(r.is_err());
    }
    assert_eq!(
        h.sim.in_use(),
        0,
        "allocate_sync kept the chunk its wait panicked for"
    );
}

/// An upstream whose `order_after` panics while a large block carved from a free range is being
/// ordered: the block goes back to the free ranges, and the drop gives every chunk back (a block
/// recorded nowhere would make the drop leak everything).
#[test]
fn a_panicking_ordering_of_a_large_block_gives_the_block_back() {
    let h = Hostile::new(1 << 30);
    {
        let a = arena(&h, 64 << 20, 64 << 10);
        let p = alloc(&h, &a, 1 << 20, s(1));
        free(&h, &a, p, 1 << 20, s(1));
        h.panic_order.store(true, SeqCst);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.allocate(1 << 20, 256, s(2))
        }));
        h.panic_order.store(false, SeqCst);
        assert!(r.is_err());
        assert_eq!(a.usage().allocated, 0);
    }
    assert_eq!(h.sim.in_use(), 0, "the arena's chunks were not given back");
}

/// The same while superblocks that other streams' arenas gave back are being ordered for a new
/// stream's arena: they go back to the spare list.
#[test]
fn a_panicking_ordering_of_superblocks_gives_them_back() {
    let h = Hostile::new(1 << 30);
    {
        let a = arena(&h, 64 << 20, 64 << 10);
        // Six streams' arenas: the oldest idle ones give their superblocks back, tagged.
        for n in 1..=6 {
            let p = alloc(&h, &a, 1024, s(n));
            free(&h, &a, p, 1024, s(n));
        }
        h.panic_order.store(true, SeqCst);
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.allocate(1024, 256, s(7))));
        h.panic_order.store(false, SeqCst);
        assert!(r.is_err());
        assert_eq!(a.usage().allocated, 0);
        let p = alloc(&h, &a, 1024, s(7));
        free(&h, &a, p, 1024, s(7));
        let v = std::mem::take(&mut h.model.lock().unwrap().violations);
        assert!(v.is_empty(), "{v:#?}");
    }
    assert_eq!(h.sim.in_use(), 0, "the arena's chunks were not given back");
}

/// Frees a block of `mr` (allocated on stream 1) on stream 2, then drops `mr` while the upstream
/// can neither order nor wait: true when the upstream got everything back anyway.
fn given_back_unordered<R: MemoryResource>(h: &Hostile, mr: R, size: usize) -> bool {
    let p = mr.allocate(size, 256, s(1)).unwrap();
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, size, 256, s(2)) };
    h.fail_order.store(true, SeqCst);
    h.fail_sync.store(true, SeqCst);
    drop(mr);
    h.fail_order.store(false, SeqCst);
    h.fail_sync.store(false, SeqCst);
    h.sim.in_use() == 0
}

/// A bin's chunk whose blocks were freed on another stream, at a drop where that stream can be
/// neither ordered after nor waited for: the chunk is leaked, not given back on its own stream
/// unordered (in FixedSize and in Binning alike).
#[test]
fn a_bin_chunk_that_cannot_be_ordered_at_the_drop_is_leaked() {
    let h = Hostile::new(1 << 30);
    let fixed = resource_stack![&h, FixedSize { block_size: 4 KiB, blocks_to_preallocate: 1 }];
    assert!(!given_back_unordered(&h, fixed, 4096), "FixedSize");
    let h = Hostile::new(1 << 30);
    let bins = resource_stack![&h, Binning { min: 256 B, max: 4 KiB }];
    assert!(!given_back_unordered(&h, bins, 256), "Binning");
    // Pool and Tlsf did already.
    let h = Hostile::new(1 << 30);
    let pool = resource_stack![&h, Pool { initial: 0, max: 64 MiB }];
    assert!(!given_back_unordered(&h, pool, 4096), "Pool");
}

/// Two chunks, each with a block freed on another stream, and a drop whose first ordering
/// panics: the bytes the upstream held before the drop, and after it.
fn drop_with_one_panicking_ordering<R: MemoryResource>(h: &Hostile, mr: R) -> (usize, usize) {
    let a = mr.allocate(1 << 20, 256, s(1)).unwrap(); // the initial chunk
    let b = mr.allocate(4 << 20, 256, s(3)).unwrap(); // a chunk grown for it
                                                      // SAFETY: both came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(a, 1 << 20, 256, s(2));
        mr.deallocate(b, 4 << 20, 256, s(4));
    }
    let held = h.sim.in_use();
    h.panic_order_once.store(true, SeqCst);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(mr)));
    assert!(
        dropped.is_err(),
        "the upstream's panic goes on after the drop"
    );
    (held, h.sim.in_use())
}

/// A pool's drop whose upstream panics ordering one chunk gives the other chunks back, and the
/// panic goes on after them: the ordering runs inside the drop's catch, or the first panic would
/// lose every later chunk, and during an unwind abort the process.
#[test]
fn a_pool_drop_whose_ordering_panics_gives_the_other_chunks_back() {
    let h = Hostile::new(1 << 30);
    let pool = resource_stack![&h, Pool { initial: 1 MiB, max: 64 MiB }];
    let (held, left) = drop_with_one_panicking_ordering(&h, pool);
    assert!(0 < left && left < held, "Pool: {left} of {held} bytes kept");
    let h = Hostile::new(1 << 30);
    let tlsf = resource_stack![&h, Tlsf { initial: 1 MiB, max: 64 MiB }];
    let (held, left) = drop_with_one_panicking_ordering(&h, tlsf);
    assert!(0 < left && left < held, "Tlsf: {left} of {held} bytes kept");
}
