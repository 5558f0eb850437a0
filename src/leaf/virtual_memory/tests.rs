//! The ordering of synchronizations, maps, enables and unmaps, seen through a page source
//! that records them (the trait is sealed, so only the crate can write one).
use super::*;
use crate::leaf::pages::sealed::Sealed;
use crate::leaf::Simulated;
use crate::stream::StreamId;
use cache::WAIT_FOR_BATCH;
use heaps::{PagedHeaps, PagedHeapsConfig};
use std::sync::PoisonError;

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Sync(StreamId),
    Map(usize),
    Enable(usize, usize),
    Unmap(usize),
}

#[derive(Debug)]
struct Recording {
    sim: Simulated,
    log: Mutex<Vec<Ev>>,
    /// While set, marks are not reached: the marked work is still running.
    busy: std::sync::atomic::AtomicBool,
    /// While set, streams cannot be marked (they capture a graph), and marks made before
    /// cannot be queried or waited for.
    capturing: std::sync::atomic::AtomicBool,
    /// Microseconds each unmap takes.
    unmap_us: std::sync::atomic::AtomicU64,
    /// Microseconds each access grant takes.
    enable_us: std::sync::atomic::AtomicU64,
    /// Pages whose memory moved to another page.
    remaps: std::sync::atomic::AtomicUsize,
    /// Marks made.
    marks: std::sync::atomic::AtomicUsize,
    /// Marks queried.
    queries: std::sync::atomic::AtomicUsize,
    /// While set, a remap panics once it has unmapped its page (a source that breaks down
    /// halfway).
    panic_in_remap: std::sync::atomic::AtomicBool,
}

impl Recording {
    fn new(capacity: usize) -> Self {
        Recording {
            sim: Simulated::with_page_size(capacity, P),
            log: Mutex::new(Vec::new()),
            busy: std::sync::atomic::AtomicBool::new(false),
            capturing: std::sync::atomic::AtomicBool::new(false),
            unmap_us: std::sync::atomic::AtomicU64::new(0),
            enable_us: std::sync::atomic::AtomicU64::new(0),
            remaps: std::sync::atomic::AtomicUsize::new(0),
            marks: std::sync::atomic::AtomicUsize::new(0),
            queries: std::sync::atomic::AtomicUsize::new(0),
            panic_in_remap: std::sync::atomic::AtomicBool::new(false),
        }
    }
    fn set_capturing(&self, capturing: bool) {
        self.capturing
            .store(capturing, std::sync::atomic::Ordering::Relaxed);
    }
    fn refuse(&self) -> Result<()> {
        if self.capturing.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(AllocError::new(
                crate::resource::AllocErrorKind::Unsupported("the stream captures a graph"),
                0,
                0,
                "Recording",
            ));
        }
        Ok(())
    }
    fn set_busy(&self, busy: bool) {
        self.busy.store(busy, std::sync::atomic::Ordering::Relaxed);
    }
    fn push(&self, e: Ev) {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
    }
    fn log(&self) -> Vec<Ev> {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Sealed for Recording {}

// SAFETY: every call goes to `Simulated`, whose promises hold; recording touches no memory.
unsafe impl PhysicalPages for Recording {
    type Host = typenum::B0;
    type Device = typenum::B0;
    type Migratable = typenum::B0;
    type Page = ();
    /// The marked stream: reaching its mark is logged as the stream's synchronization.
    type Mark = StreamId;
    crate::leaf::pages::forward_reservations!(self.sim);
    unsafe fn map(&self, addr: usize, size: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.map(addr, size) }?;
        self.push(Ev::Map(addr));
        Ok(())
    }
    unsafe fn enable(&self, addr: usize, size: usize) -> Result<()> {
        self.push(Ev::Enable(addr, size));
        let us = self.enable_us.load(std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_micros(us));
        Ok(())
    }
    unsafe fn unmap(&self, addr: usize, size: usize, page: ()) {
        self.push(Ev::Unmap(addr));
        let us = self.unmap_us.load(std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_micros(us));
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.unmap(addr, size, page) }
    }
    /// Logged as the unmap and the map it stands for, and counted.
    unsafe fn remap(&self, from: usize, to: usize, size: usize, page: ()) -> Result<()> {
        self.remaps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: forwarded from the caller.
        unsafe { self.unmap(from, size, page) };
        assert!(
            !self
                .panic_in_remap
                .load(std::sync::atomic::Ordering::Relaxed),
            "the source breaks down halfway through a remap"
        );
        // SAFETY: forwarded from the caller.
        unsafe { self.map(to, size) }
    }
    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        self.push(Ev::Sync(stream.id()));
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<()> {
        Ok(())
    }
    fn mark(&self, stream: StreamRef) -> Result<Option<StreamId>> {
        self.refuse()?;
        self.marks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Some(stream.id()))
    }
    fn reached(&self, mark: &StreamId) -> Result<bool> {
        self.queries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.refuse()?;
        if self.busy.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(false);
        }
        self.push(Ev::Sync(*mark));
        Ok(true)
    }
    fn wait(&self, mark: &StreamId) -> Result<()> {
        self.refuse()?;
        self.push(Ev::Sync(*mark));
        Ok(())
    }
    fn name(&self) -> &'static str {
        "Recording"
    }
    fn describe_fields<'a, 'b>(&self, item: ItemWriter<'a, 'b>) -> ItemWriter<'a, 'b> {
        item.flag("recording", true)
    }
}

const P: usize = 64 << 10;

/// True when every unmap of `page` in `log` comes after a synchronization of `stream`.
fn synced_before_unmap(log: &[Ev], page: usize, stream: StreamRef) -> bool {
    let unmap = log.iter().position(|e| *e == Ev::Unmap(page));
    let sync = log.iter().position(|e| *e == Ev::Sync(stream.id()));
    unmap.is_none_or(|u| sync.is_some_and(|s| s < u))
}

/// A resource of `pages` pages at most whose first `kept + 1` pages hold blocks on the default
/// stream, the next one a block U on simulated stream 1; then U and the first block are freed,
/// U's work on its stream possibly still running. Returns the resource, the first page's address
/// and the live blocks after the first.
fn with_u_freed_on_s(
    rec: &Recording,
    pages: usize,
    kept: usize,
) -> (VirtualMemory<&Recording>, usize, Vec<NonNull<u8>>) {
    let config = VirtualMemoryConfig {
        reservation: (pages + 2) * P,
        max: pages * P,
        cache: 1 << 40,
        ..Default::default()
    };
    let vm = VirtualMemory::new(rec, config).unwrap();
    let (d, s) = (StreamRef::DEFAULT, StreamRef::simulated(1));
    let d0 = vm.allocate(P, 256, d).unwrap();
    let live: Vec<NonNull<u8>> = (0..kept).map(|_| vm.allocate(P, 256, d).unwrap()).collect();
    let u = vm.allocate(P, 256, s).unwrap();
    let base = d0.as_ptr() as usize;
    assert_eq!(u.as_ptr() as usize, base + (kept + 1) * P);
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(u, P, 256, s);
        vm.deallocate(d0, P, 256, d);
    }
    (vm, base, live)
}

/// Releases `vm` and checks that U's page, at `page`, was unmapped only after stream 1 (which
/// freed U) was waited for.
fn released_after_waiting(rec: &Recording, vm: VirtualMemory<&Recording>, page: usize) {
    vm.release();
    let log = rec.log();
    assert!(
        synced_before_unmap(&log, page, StreamRef::simulated(1)),
        "{log:?}"
    );
}

#[test]
fn a_failed_allocation_keeps_the_stream_to_wait_for() {
    // U is freed on S while S's work may still use it; a failed request on S takes S's
    // blocks (its slot goes) and gives them back: S must still be waited for before U's page
    // is unmapped.
    let rec = Recording::new(1 << 30);
    let (vm, base, _live) = with_u_freed_on_s(&rec, 3, 1);
    let s = StreamRef::simulated(1);
    assert!(vm.allocate(3 * P, 256, s).unwrap_err().is_out_of_memory());
    released_after_waiting(&rec, vm, base + 2 * P);
}

#[test]
fn a_failed_growth_keeps_the_stream_to_wait_for() {
    let rec = Recording::new(1 << 30);
    let (vm, base, live) = with_u_freed_on_s(&rec, 4, 2);
    let s = StreamRef::simulated(1);
    let grown = {
        // SAFETY: `live[1]` is live, owned here, freed on `s`.
        unsafe { crate::resource::GrowInPlace::grow_in_place(&vm, live[1], P, 256, 4 * P, s) }
    };
    assert!(grown.is_err());
    released_after_waiting(&rec, vm, base + 3 * P);
}

#[test]
fn a_map_that_fails_midway_leaves_no_page_unenabled() {
    let rec = Recording::new(3 * P);
    let config = VirtualMemoryConfig {
        reservation: 16 * P,
        ..Default::default()
    };
    let vm = VirtualMemory::new(&rec, config).unwrap();
    let d = StreamRef::DEFAULT;
    // Someone else holds a page of the memory: the third page of the block cannot be mapped.
    let other = MemoryResource::allocate(&rec.sim, P, 256, d).unwrap();
    assert!(vm.allocate(3 * P, 256, d).is_err());
    // SAFETY: live with this size.
    unsafe { MemoryResource::deallocate(&rec.sim, other, P, 256, d) };
    let a = vm.allocate(2 * P, 256, d).unwrap();
    let log = rec.log();
    let base = a.as_ptr() as usize;
    for page in [base, base + P] {
        let last_map = log.iter().rposition(|e| *e == Ev::Map(page)).unwrap();
        let enabled = log[last_map..]
            .iter()
            .any(|e| matches!(*e, Ev::Enable(x, n) if x <= page && page < x + n));
        assert!(
            enabled,
            "page {page:#x} of a live block was never enabled: {log:?}"
        );
    }
}

#[test]
fn a_huge_alignment_is_refused_before_any_table_grows() {
    let sim = Simulated::new(64 << 20);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    for shift in [30, 40, 56, 62] {
        let e = vm.allocate(1, 1 << shift, StreamRef::DEFAULT).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
    }
    let p = vm.allocate(1, 1 << 20, StreamRef::DEFAULT).unwrap();
    assert_eq!(p.as_ptr() as usize % (1 << 20), 0);
    // SAFETY: live with this size and alignment.
    unsafe { vm.deallocate(p, 1, 1 << 20, StreamRef::DEFAULT) };
}

/// A resource with no cache over `rec`: every page left with no live block goes.
fn no_cache(rec: &Recording) -> VirtualMemory<&Recording> {
    let config = VirtualMemoryConfig {
        reservation: 16 * P,
        cache: 0,
        ..Default::default()
    };
    VirtualMemory::new(rec, config).unwrap()
}

/// Enough calls for a pending batch to be queried at least once.
fn calls(vm: &VirtualMemory<&Recording>, s: StreamRef) {
    let call = || {
        let b = vm.allocate(256, 256, s).unwrap();
        // SAFETY: live with this size.
        unsafe { vm.deallocate(b, 256, 256, s) };
    };
    // Past the interval between two rounds of work on events, so that the tick does its round;
    // and a last call past it again, whose free marks what the calls freed.
    std::thread::sleep(cache::EVENT_INTERVAL);
    (0..TICKS).for_each(|_| call());
    std::thread::sleep(cache::EVENT_INTERVAL);
    call();
}

/// A resource with no cache over `rec` and a block of `pages` pages made and freed on simulated
/// stream 1 while its work still runs (`rec` busy, left so): the block's pages are pending, not
/// unmapped. Returns the resource, the stream and the block.
fn freed_while_busy(
    rec: &Recording,
    pages: usize,
) -> (VirtualMemory<&Recording>, StreamRef<'static>, NonNull<u8>) {
    let vm = no_cache(rec);
    let s = StreamRef::simulated(1);
    rec.set_busy(true);
    let a = vm.allocate(pages * P, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, pages * P, 256, s) };
    (vm, s, a)
}

fn unmaps(log: &[Ev]) -> usize {
    log.iter().filter(|e| matches!(e, Ev::Unmap(_))).count()
}

#[test]
fn a_cache_over_its_bound_never_waits_and_unmaps_once_the_marks_are_reached() {
    let rec = Recording::new(1 << 30);
    let (vm, s, a) = freed_while_busy(&rec, 2);
    // The work on `s` may still use the pages: marked, not waited for, not unmapped.
    assert_eq!(vm.usage().mapped, 2 * P);
    assert!(!rec.log().iter().any(|e| matches!(e, Ev::Sync(_))));
    rec.set_busy(false);
    // A few calls later the marks are queried again, reached, and the pages go.
    calls(&vm, s);
    let log = rec.log();
    assert!(synced_before_unmap(&log, a.as_ptr() as usize, s), "{log:?}");
    assert!(
        synced_before_unmap(&log, a.as_ptr() as usize + P, s),
        "{log:?}"
    );
    assert!(unmaps(&log) >= 2, "{log:?}");
}

/// Calls enough for a pending batch to be queried at least once.
const TICKS: usize = 40;

#[test]
fn a_pending_page_that_goes_live_again_stays_mapped() {
    let rec = Recording::new(1 << 30);
    let (vm, s, a) = freed_while_busy(&rec, 1);
    // Reused at once on the same stream: the pending page is live again, with no map.
    let b = vm.allocate(P, 256, s).unwrap();
    assert_eq!(a, b);
    let maps = rec.log().iter().filter(|e| matches!(e, Ev::Map(_))).count();
    assert_eq!(maps, 1);
    rec.set_busy(false);
    calls(&vm, s);
    assert!(
        !rec.log().contains(&Ev::Unmap(b.as_ptr() as usize)),
        "{:?}",
        rec.log()
    );
    assert!(vm.usage().mapped >= P);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(b, P, 256, s) };
}

#[test]
fn release_waits_for_a_pending_batch() {
    let rec = Recording::new(1 << 30);
    let (vm, s, a) = freed_while_busy(&rec, 3);
    assert_eq!(vm.usage().mapped, 3 * P);
    assert_eq!(vm.release(), 3 * P);
    assert_eq!(vm.usage().mapped, 0);
    let log = rec.log();
    for k in 0..3 {
        assert!(
            synced_before_unmap(&log, a.as_ptr() as usize + k * P, s),
            "{log:?}"
        );
    }
}

#[test]
fn peak_slack_keeps_the_pages_mapped_within_the_peak_of_live_pages() {
    // A is freed, and C, too large for A's hole, lands on new pages: with no slack (a page at
    // least) three of A's pages go before C's are mapped, so what is mapped never exceeds what
    // is live at the peak (B and C) and a page; without the bound they stay.
    for (slack, mapped) in [(0, 11 * P), (usize::MAX, 14 * P)] {
        let sim = Simulated::with_page_size(1 << 30, P);
        let config = VirtualMemoryConfig {
            reservation: 64 * P,
            peak_slack: slack,
            ..Default::default()
        };
        let vm = VirtualMemory::new(&sim, config).unwrap();
        let d = StreamRef::DEFAULT;
        let a = vm.allocate(4 * P, 256, d).unwrap();
        let b = vm.allocate(4 * P, 256, d).unwrap();
        // SAFETY: live with this size.
        unsafe { vm.deallocate(a, 4 * P, 256, d) };
        let c = vm.allocate(6 * P, 256, d).unwrap();
        assert_eq!(vm.usage().mapped, mapped, "peak_slack {slack}");
        assert_eq!(vm.usage().peak_mapped, mapped, "peak_slack {slack}");
        assert_eq!(sim.mapped(), mapped);
        // SAFETY: live with these sizes.
        unsafe {
            vm.deallocate(b, 4 * P, 256, d);
            vm.deallocate(c, 6 * P, 256, d);
        }
    }
}

#[test]
fn a_stream_that_cannot_be_marked_keeps_its_pages_until_it_can() {
    let rec = Recording::new(1 << 30);
    let vm = no_cache(&rec);
    let s = StreamRef::simulated(1);
    let a = vm.allocate(4 * P, 256, s).unwrap();
    rec.set_capturing(true);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 4 * P, 256, s) };
    // Not marked, not unmapped: the stream stays listed.
    assert_eq!(vm.usage().mapped, 4 * P);
    assert_eq!(unmaps(&rec.log()), 0);
    rec.set_capturing(false);
    // The next trim marks the stream, finds the mark reached, and the pages go.
    let b = vm.allocate(P, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(b, P, 256, s) };
    calls(&vm, s);
    assert_eq!(vm.usage().mapped, 0);
    let log = rec.log();
    assert!(synced_before_unmap(&log, a.as_ptr() as usize, s), "{log:?}");
}

#[test]
fn a_mark_that_cannot_be_queried_gives_its_batch_up_and_nothing_is_lost() {
    let rec = Recording::new(1 << 30);
    let (vm, s, a) = freed_while_busy(&rec, 4);
    // Marked; then every query fails: the batch is given up, its pages stay cached.
    rec.set_capturing(true);
    calls(&vm, s);
    assert_eq!(vm.usage().mapped, 4 * P);
    assert_eq!(unmaps(&rec.log()), 0);
    rec.set_capturing(false);
    rec.set_busy(false);
    // Its stream was listed again: release synchronizes it and gives every page back.
    assert_eq!(vm.release(), 4 * P);
    let log = rec.log();
    assert!(synced_before_unmap(&log, a.as_ptr() as usize, s), "{log:?}");
    drop(vm);
    assert_eq!((rec.sim.in_use(), rec.sim.reservations()), (0, 0));
}

#[test]
fn an_impossible_request_leaves_the_other_heaps_alone() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    let a = heaps.allocate(8 * P, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(a, 8 * P, 256, s) };
    let before = heaps.usage().cached;
    assert!(heaps
        .allocate(1 << 40, 256, s)
        .unwrap_err()
        .is_out_of_memory());
    assert_eq!(heaps.usage().cached, before);
}

/// Frees each of `blocks` of `size` bytes on `s`.
///
/// # Safety
///
/// Each block is live in `heaps`, allocated with `size` bytes and an alignment of 256 at most.
unsafe fn free_all<R: MemoryResource>(
    heaps: &R,
    blocks: impl IntoIterator<Item = NonNull<u8>>,
    size: usize,
    s: StreamRef,
) {
    for p in blocks {
        // SAFETY: as the caller promises.
        unsafe { heaps.deallocate(p, size, 256, s) };
    }
}

/// Allocates `size` bytes on `s` while `s`'s heap is held, as another thread would hold it
/// (`try_lock` fails for every thread, this one too), and crowded, as if as many other threads
/// as share a heap had found it held: this thread goes elsewhere rather than wait.
fn allocate_while_held(heaps: &PagedHeaps<&Simulated>, size: usize, s: StreamRef) -> NonNull<u8> {
    heaps.crowd(s);
    let stream_heap = heaps.heap(heaps.stream_heap(s)).unwrap();
    let _held = stream_heap
        .state
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    heaps.allocate(size, 256, s).unwrap()
}

#[test]
fn an_allocation_that_finds_its_streams_heap_held_by_a_crowd_goes_to_its_threads_heap() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    let stream_heap = heaps.heap(heaps.stream_heap(s)).unwrap();
    let a = allocate_while_held(&heaps, P, s);
    assert!(stream_heap
        .ranges()
        .iter()
        .all(|&(base, size)| { !(base..base + size).contains(&(a.as_ptr() as usize)) }));
    assert_eq!(stream_heap.usage().allocated, 0);
    assert_eq!((heaps.usage().busy, heaps.usage().allocated), (1, P));
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(a, P, 256, s) };
    assert_eq!((heaps.usage().busy, heaps.usage().allocated), (1, 0));
    // One meeting leaves the stream's heap shared: the next allocation, finding it free, is
    // served there.
    let b = heaps.allocate(P, 256, s).unwrap();
    assert_eq!(stream_heap.usage().allocated, P);
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(b, P, 256, s) };
    assert_eq!(heaps.usage().busy, 1);
}

#[test]
fn four_threads_that_meet_on_a_streams_heap_wait_for_it_and_a_fifth_goes_to_its_own() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    let stream_heap = heaps.heap(heaps.stream_heap(s)).unwrap();
    let busy = || heaps.busy.load(std::sync::atomic::Ordering::Relaxed);
    let allocate = || heaps.allocate(P, 256, s).unwrap().as_ptr() as usize;
    let in_stream_heap = |a: usize| {
        stream_heap
            .ranges()
            .iter()
            .any(|&(base, size)| (base..base + size).contains(&a))
    };
    let (waited, fifth) = std::thread::scope(|scope| {
        // The heap is held while five threads come, one after another.
        let held = stream_heap.state.lock().unwrap();
        let mut waiting = Vec::new();
        for met in 1..=super::heaps::SHARERS as u64 {
            waiting.push(scope.spawn(allocate));
            while busy() < met {
                std::thread::yield_now();
            }
        }
        // The fifth to find it held goes to its own heap at once (the lock goes after a while
        // regardless, so that a wrong wait fails the test rather than hangs it).
        let fifth = scope.spawn(allocate);
        let start = std::time::Instant::now();
        while !fifth.is_finished() && start.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::yield_now();
        }
        drop(held);
        let fifth = fifth.join().unwrap();
        let waited: Vec<usize> = waiting.into_iter().map(|t| t.join().unwrap()).collect();
        (waited, fifth)
    });
    assert!(waited.iter().all(|&a| in_stream_heap(a)));
    assert!(!in_stream_heap(fifth));
    assert_eq!((busy(), heaps.left(heaps.stream_heap(s))), (5, false));
    let blocks = waited.into_iter().chain([fifth]);
    let blocks = blocks.map(|a| NonNull::new(std::ptr::with_exposed_provenance_mut(a)).unwrap());
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, blocks, P, s) };
    assert_eq!(heaps.usage().allocated, 0);
}

#[test]
fn a_crowded_streams_heap_found_held_sixteen_times_at_once_is_left_to_the_threads_heaps() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    let stream_heap = heaps.heap(heaps.stream_heap(s)).unwrap();
    let mut blocks: Vec<_> = (0..15)
        .map(|_| allocate_while_held(&heaps, 256, s))
        .collect();
    // Fifteen meetings: still shared.
    blocks.push(heaps.allocate(256, 256, s).unwrap());
    assert_eq!(stream_heap.usage().allocated, 256);
    blocks.push(allocate_while_held(&heaps, 256, s));
    assert!(heaps.left(heaps.stream_heap(s)));
    // From the sixteenth on, every allocation on the stream goes to this thread's heap, without
    // trying the stream's: no more meetings count.
    blocks.extend((0..100).map(|_| heaps.allocate(256, 256, s).unwrap()));
    assert_eq!(stream_heap.usage().allocated, 256);
    assert_eq!(heaps.usage().busy, 16);
    // The stream's blocks still go back to the stream's heap.
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, blocks, 256, s) };
    assert_eq!(heaps.usage().allocated, 0);
    // Another stream keeps its own heap.
    let other = StreamRef::simulated(4);
    let p = heaps.allocate(256, 256, other).unwrap();
    assert_eq!(
        heaps
            .heap(heaps.stream_heap(other))
            .unwrap()
            .usage()
            .allocated,
        256
    );
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(p, 256, 256, other) };
}

/// Eight live blocks of `size` bytes in `s`'s heap, then sixteen of 256 bytes allocated while
/// it is held by a crowd, which leave it to the threads' heaps: both sets.
fn fill_and_leave(
    heaps: &PagedHeaps<&Simulated>,
    s: StreamRef,
    size: usize,
) -> (Vec<NonNull<u8>>, Vec<NonNull<u8>>) {
    let big = (0..8).map(|_| heaps.allocate(size, 256, s).unwrap());
    let big = big.collect();
    let small = (0..16)
        .map(|_| allocate_while_held(heaps, 256, s))
        .collect();
    (big, small)
}

#[test]
fn a_left_streams_heap_lends_its_free_mapped_pages_before_a_threads_heap_maps_more() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    let stream_heap = heaps.heap(heaps.stream_heap(s)).unwrap();
    // Sixteen pages live in the stream's heap; threads meet there: it is left, and this
    // thread's heap maps a page for their blocks.
    let (big, small) = fill_and_leave(&heaps, s, 2 * P);
    assert!(heaps.left(heaps.stream_heap(s)));
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, big, 2 * P, s) };
    // All heaps map 17 pages, the peak of their live pages, so this thread's heap, with no
    // room, would map beyond it and the slack (a page): the stream's heap takes the blocks.
    assert_eq!(sim.mapped(), 17 * P);
    let lent: Vec<_> = (0..8)
        .map(|_| heaps.allocate(2 * P, 256, s).unwrap())
        .collect();
    assert_eq!(sim.mapped(), 17 * P);
    assert_eq!(heaps.usage().borrowed, 8);
    assert_eq!(stream_heap.usage().allocated, 16 * P);
    // Beyond what it holds, this thread's heap maps.
    let more = heaps.allocate(2 * P, 256, s).unwrap();
    assert_eq!((sim.mapped(), heaps.usage().borrowed), (19 * P, 8));
    // Each block goes back to the heap that holds it, and every page back to the source.
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, lent.into_iter().chain([more]), 2 * P, s) };
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, small, 256, s) };
    assert_eq!(
        (stream_heap.usage().allocated, heaps.usage().allocated),
        (0, 0)
    );
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn threads_on_a_left_streams_heap_borrow_its_pages_and_free_each_others_blocks() {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    let sim = Simulated::with_page_size(1 << 30, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    // Pages in the stream's heap, freed, and the heap left to the threads' heaps.
    let (big, meetings) = fill_and_leave(&heaps, s, 8 * P);
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, big, 8 * P, s) };
    // SAFETY: each is live in `heaps` with this size.
    unsafe { free_all(&heaps, meetings, 256, s) };
    // Every live block: start -> end, to find overlaps.
    let live: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
    // Blocks one thread leaves for another to free.
    let handed: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let place = |p: usize, size: usize| {
        let mut l = live.lock().unwrap();
        let before = l.range(..=p).next_back().is_some_and(|(_, &end)| end > p);
        let after = l.range(p..).next().is_some_and(|(&b, _)| p + size > b);
        assert!(!before && !after, "{p:#x}+{size} overlaps a live block");
        l.insert(p, p + size);
    };
    let free = |p: usize, size: usize| {
        live.lock().unwrap().remove(&p);
        let p = NonNull::new(std::ptr::with_exposed_provenance_mut(p)).unwrap();
        // SAFETY: live, from `heaps`, with this size.
        unsafe { heaps.deallocate(p, size, 256, s) };
    };
    std::thread::scope(|scope| {
        for t in 0..6u64 {
            let (heaps, handed, place, free) = (&heaps, &handed, &place, &free);
            scope.spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                let mut own: Vec<(usize, usize)> = Vec::new();
                for _ in 0..2000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let size = 256 + (x as usize % (3 * P));
                    let p = heaps.allocate(size, 256, s).unwrap().as_ptr() as usize;
                    place(p, size);
                    if x % 3 == 0 {
                        let other = handed.lock().unwrap().pop();
                        handed.lock().unwrap().push((p, size));
                        if let Some((q, n)) = other {
                            free(q, n);
                        }
                    } else {
                        own.push((p, size));
                    }
                    if own.len() > 24 {
                        let (q, n) = own.swap_remove(x as usize % own.len());
                        free(q, n);
                    }
                }
                for (q, n) in own {
                    free(q, n);
                }
            });
        }
    });
    for (q, n) in handed.into_inner().unwrap() {
        free(q, n);
    }
    assert!(heaps.usage().borrowed > 0);
    assert_eq!(heaps.usage().allocated, 0);
    assert_eq!(heaps.usage().mapped, sim.mapped());
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn meetings_spread_over_more_than_the_window_leave_a_streams_heap_shared() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let s = StreamRef::simulated(3);
    let stream_heap = heaps.heap(heaps.stream_heap(s)).unwrap();
    for round in 0..2 {
        let blocks: Vec<_> = (0..10)
            .map(|_| allocate_while_held(&heaps, 256, s))
            .collect();
        // SAFETY: each is live in `heaps` with this size.
        unsafe { free_all(&heaps, blocks, 256, s) };
        if round == 0 {
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
    }
    // Twenty meetings, but ten in each window: still shared.
    assert!(!heaps.left(heaps.stream_heap(s)));
    let p = heaps.allocate(256, 256, s).unwrap();
    assert_eq!(stream_heap.usage().allocated, 256);
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(p, 256, 256, s) };
    assert_eq!(heaps.usage().busy, 20);
}

#[test]
fn a_heap_gives_the_pages_it_no_longer_needs_to_another_that_maps() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let (s1, s2) = (StreamRef::simulated(1), StreamRef::simulated(2));
    let round = |s: StreamRef<'static>, pages: usize| {
        let blocks: Vec<_> = (0..pages)
            .map(|_| heaps.allocate(P, 256, s).unwrap())
            .collect();
        // SAFETY: each is live in `heaps` with this size.
        unsafe { free_all(&heaps, blocks, P, s) };
    };
    let first = heaps.heap(heaps.stream_heap(s1)).unwrap();
    // Eight pages on stream 1's heap, freed: they stay mapped there, within its peak.
    round(s1, 8);
    assert_eq!(sim.mapped(), 8 * P);
    // Stream 2's heap maps eight more: stream 1's heap needed its pages lately, and keeps them.
    round(s2, 8);
    assert_eq!(sim.mapped(), 16 * P);
    // Still within what it needed in the window before.
    std::thread::sleep(RECENT + std::time::Duration::from_millis(10));
    round(s2, 9);
    assert_eq!(first.usage().mapped, 8 * P);
    // Two windows with nothing live on stream 1: its pages go to the heap that maps, but a page
    // of slack, so that the heaps together hold the peak of ten pages and that page.
    std::thread::sleep(RECENT + std::time::Duration::from_millis(10));
    round(s2, 10);
    assert_eq!(first.usage().mapped, P);
    assert_eq!(sim.mapped(), 11 * P);
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn pages_a_heap_keeps_for_the_bound_across_heaps_are_asked_of_the_next() {
    let sim = Simulated::with_page_size(64 * P, P);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let [b, a, c] = [1, 2, 3].map(StreamRef::simulated);
    let round = |s: StreamRef<'static>, pages: usize| {
        let blocks: Vec<_> = (0..pages)
            .map(|_| heaps.allocate(P, 256, s).unwrap())
            .collect();
        // SAFETY: each is live in `heaps` with this size.
        unsafe { free_all(&heaps, blocks, P, s) };
    };
    let mapped = |s: StreamRef<'static>| {
        let heap = heaps.heap(heaps.stream_heap(s)).unwrap();
        heap.usage().mapped / P
    };
    // B's heap comes first in the heaps' order, then A's, then C's. A's heap maps 16 pages.
    round(b, 1);
    round(a, 16);
    round(c, 1);
    std::thread::sleep(RECENT + std::time::Duration::from_millis(10));
    // B's heap peaks at 8 pages a window later; A's peak is a window old.
    round(b, 8);
    std::thread::sleep(RECENT + std::time::Duration::from_millis(10));
    // C's heap maps 9 more pages, 17 beyond the peak of 16 live pages and a page of slack.
    // B's heap keeps its 8, needed in the window before; A's heap, asked for the rest, gives
    // all but a page of slack.
    round(c, 10);
    assert_eq!((mapped(b), mapped(a), mapped(c)), (8, 1, 10));
    assert_eq!(sim.mapped(), 19 * P);
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

/// A resource whose mapped pages follow the peak of live pages and one page (`peak_slack` 0)
/// over `rec`, with a range of 64 pages.
fn following(rec: &Recording) -> VirtualMemory<&Recording> {
    let config = VirtualMemoryConfig {
        reservation: 64 * P,
        peak_slack: 0,
        ..Default::default()
    };
    VirtualMemory::new(rec, config).unwrap()
}

/// Over [`following`] `rec`, on simulated stream 1: A and B of four pages each, A freed, then C
/// of six pages, too large for A's hole, on new pages. Returns the resource, the stream, A
/// (freed), B and C (live).
fn c_beyond_a_hole(
    rec: &Recording,
) -> (
    VirtualMemory<&Recording>,
    StreamRef<'static>,
    [NonNull<u8>; 3],
) {
    let vm = following(rec);
    let s = StreamRef::simulated(1);
    let a = vm.allocate(4 * P, 256, s).unwrap();
    let b = vm.allocate(4 * P, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 4 * P, 256, s) };
    let c = vm.allocate(6 * P, 256, s).unwrap();
    (vm, s, [a, b, c])
}

#[test]
fn pages_whose_work_still_runs_are_not_taken_for_new_ones_until_their_marks_are_reached() {
    let rec = Recording::new(1 << 30);
    rec.set_busy(true);
    // C needs 6 new pages; A's 4 free pages may still be used by the work on `s`: mapped over
    // the bound rather than wait.
    let (vm, s, [a, b, c]) = c_beyond_a_hole(&rec);
    assert_eq!(vm.usage().mapped, 14 * P);
    assert!(!rec
        .log()
        .iter()
        .any(|e| matches!(e, Ev::Sync(_) | Ev::Unmap(_))));
    // Once the marks are reached, A's pages beyond the bound go: B, C, the page the calls'
    // small blocks live on (A's first, which raises the peak by a page) and a page stay.
    rec.set_busy(false);
    calls(&vm, s);
    assert_eq!(vm.usage().mapped, 12 * P);
    let log = rec.log();
    for k in 0..4 {
        assert!(
            synced_before_unmap(&log, a.as_ptr() as usize + k * P, s),
            "{log:?}"
        );
    }
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 4 * P, 256, s);
        vm.deallocate(c, 6 * P, 256, s);
    }
}

#[test]
fn a_settled_page_used_and_freed_again_waits_for_its_new_work() {
    let rec = Recording::new(1 << 30);
    // C takes the place of three of A's settled pages; A's first page stays, settled.
    let (vm, s, [a, b, c]) = c_beyond_a_hole(&rec);
    assert_eq!(vm.usage().mapped, 11 * P);
    let first = a.as_ptr() as usize;
    assert!(!rec.log().contains(&Ev::Unmap(first)));
    // D lives on that page and the next (mapped again), and is freed while its work runs.
    rec.set_busy(true);
    let d = vm.allocate(2 * P, 256, s).unwrap();
    assert_eq!(d.as_ptr() as usize, first);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(d, 2 * P, 256, s) };
    let before = rec.log().len();
    // E, too large for A's hole, needs new pages a page beyond the bound: D's pages are not
    // settled any more, so both stay.
    let e = vm.allocate(5 * P, 256, s).unwrap();
    let of_d = |x: &Ev| *x == Ev::Unmap(first) || *x == Ev::Unmap(first + P);
    assert!(!rec.log()[before..].iter().any(of_d), "{:?}", rec.log());
    // Once D's work is done, F's new pages take the place of one of them.
    rec.set_busy(false);
    let f = vm.allocate(5 * P, 256, s).unwrap();
    let log = rec.log();
    let unmapped = log[before..].iter().position(of_d);
    let synced = log[before..].iter().position(|x| *x == Ev::Sync(s.id()));
    assert!(
        unmapped.is_some_and(|u| synced.is_some_and(|y| y < u)),
        "{log:?}"
    );
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 4 * P, 256, s);
        vm.deallocate(c, 6 * P, 256, s);
        vm.deallocate(e, 5 * P, 256, s);
        vm.deallocate(f, 5 * P, 256, s);
    }
}

#[test]
fn swaps_that_take_much_of_the_time_widen_the_slack() {
    let rec = Recording::new(1 << 30);
    let vm = following(&rec);
    let s = StreamRef::simulated(1);
    // Each round frees A and maps C beyond the bound: a swap of three pages, each unmap 2 ms,
    // nearly all of the round's time.
    rec.unmap_us
        .store(2000, std::sync::atomic::Ordering::Relaxed);
    let rounds = swap_until_doubled(&vm, &vm.pace, s);
    let doublings = vm.pace.doublings();
    assert!(doublings > 0, "{rounds} rounds, {:?}", vm.usage());
    // The wider slack keeps more pages: the rounds swap less, or not at all.
    assert!(vm.usage().mapped > 11 * P, "{:?}", vm.usage());
}

/// A round over `res` on `s` that swaps pages for the bound when the slack is a page: A and B of
/// four pages each, A freed, C of six pages (a peak of ten live pages), all freed.
fn swap_round(res: &impl MemoryResource, s: StreamRef) {
    let a = res.allocate(4 * P, 256, s).unwrap();
    let b = res.allocate(4 * P, 256, s).unwrap();
    // SAFETY: live with these sizes.
    unsafe { res.deallocate(a, 4 * P, 256, s) };
    let c = res.allocate(6 * P, 256, s).unwrap();
    // SAFETY: live with these sizes.
    unsafe {
        res.deallocate(b, 4 * P, 256, s);
        res.deallocate(c, 6 * P, 256, s);
    }
}

/// Swap rounds over `res` until `pace` doubles the slack, 400 ms at most; returns how many.
fn swap_until_doubled(res: &impl MemoryResource, pace: &region::Pace, s: StreamRef) -> usize {
    let start = std::time::Instant::now();
    let mut rounds = 0;
    while pace.doublings() == 0 && start.elapsed() < std::time::Duration::from_millis(400) {
        swap_round(res, s);
        rounds += 1;
    }
    rounds
}

#[test]
fn a_swap_counts_the_access_grant_to_its_new_page() {
    // Moving a page's memory costs nothing here; granting access to the new page, 2 ms.
    let rec = Recording::new(1 << 30);
    rec.enable_us
        .store(2000, std::sync::atomic::Ordering::Relaxed);
    let vm = following(&rec);
    let rounds = swap_until_doubled(&vm, &vm.pace, StreamRef::simulated(1));
    assert!(vm.pace.doublings() > 0, "{rounds} rounds, {:?}", vm.usage());
    assert!(rec.remaps.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[test]
fn a_pace_doubles_once_swaps_take_half_of_20_ms() {
    let start = std::time::Instant::now();
    let pace = region::Pace::new();
    std::thread::sleep(std::time::Duration::from_millis(25));
    // Under a twentieth of the time: no rule is broken, however long the sleep overran.
    pace.spent(std::time::Duration::from_micros(500), 20);
    assert_eq!(pace.doublings(), 0);
    // Three quarters of the window at least: over half.
    pace.spent(start.elapsed() * 3 / 4, 20);
    assert_eq!(pace.doublings(), 1);
}

#[test]
fn a_few_slow_swaps_are_not_a_program_that_swaps() {
    let start = std::time::Instant::now();
    let pace = region::Pace::new();
    std::thread::sleep(std::time::Duration::from_millis(25));
    // Nearly all of the window, but in 15 swaps (a thread preempted while it swapped).
    pace.spent(start.elapsed(), 15);
    assert_eq!(pace.doublings(), 0);
    // One more makes it a program that swaps.
    pace.spent(std::time::Duration::from_millis(1), 1);
    assert_eq!(pace.doublings(), 1);
}

#[test]
fn the_heaps_of_one_paged_heaps_widen_their_slack_together() {
    let rec = Recording::new(1 << 30);
    let config = PagedHeapsConfig {
        peak_slack: 0,
        ..PagedHeapsConfig::default()
    };
    let heaps = PagedHeaps::new(&rec, config);
    let alone = PagedHeaps::new(&rec, config);
    let (busy, quiet) = (StreamRef::simulated(1), StreamRef::simulated(2));
    // One round on a heap of its own maps 11 pages: a peak of ten live, a page of slack.
    swap_round(&alone, quiet);
    assert_eq!(alone.usage().mapped, 11 * P);
    // One stream's heap swaps slowly until the slack doubles...
    rec.unmap_us
        .store(2000, std::sync::atomic::Ordering::Relaxed);
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(150) {
        swap_round(&heaps, busy);
    }
    rec.unmap_us.store(0, std::sync::atomic::Ordering::Relaxed);
    // ...and another stream's heap, made now, keeps the wider slack at once (the first heap
    // may give up some of its pages meanwhile: the bound across heaps).
    swap_round(&heaps, quiet);
    let quiet_heap = heaps.heap(heaps.stream_heap(quiet)).unwrap();
    assert!(
        quiet_heap.usage().mapped > 11 * P,
        "{:?}",
        quiet_heap.usage()
    );
}

#[test]
fn a_map_beyond_the_bound_waits_for_a_batch_marked_earlier_rather_than_add_pages() {
    let rec = Recording::new(1 << 30);
    rec.set_busy(true);
    // C maps beyond the bound (A's pages are marked now, not waited for).
    let (vm, s, [_, b, c]) = c_beyond_a_hole(&rec);
    assert_eq!(vm.usage().mapped, 14 * P);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(c, 6 * P, 256, s) };
    let before = rec.log().len();
    // D needs two pages more: the batch marked at C is waited for (the device reaches its marks
    // 20 ms later), and A's pages go first.
    let d = std::thread::scope(|t| {
        t.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            rec.set_busy(false);
        });
        vm.allocate(8 * P, 256, s).unwrap()
    });
    assert_eq!(vm.usage().mapped, 13 * P);
    assert_eq!(vm.usage().peak_mapped, 14 * P);
    let log = &rec.log()[before..];
    let synced = log.iter().position(|e| *e == Ev::Sync(s.id())).unwrap();
    let first_unmap = log.iter().position(|e| matches!(e, Ev::Unmap(_))).unwrap();
    let first_map = log.iter().position(|e| matches!(e, Ev::Map(_))).unwrap();
    assert!(synced < first_unmap && first_unmap < first_map, "{log:?}");
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 4 * P, 256, s);
        vm.deallocate(d, 8 * P, 256, s);
    }
}

#[test]
fn a_request_that_waits_for_a_batch_unmaps_nothing_before_and_takes_the_settled_pages_after() {
    let rec = Recording::new(1 << 30);
    let vm = following(&rec);
    let s = StreamRef::simulated(1);
    let settled = || -> usize { vm.lock().regions.iter().map(|r| r.pages.settled()).sum() };
    // S, L, Q and M side by side; S freed while its work runs, and X, too large for its hole,
    // maps beyond the bound.
    rec.set_busy(true);
    let blocks: Vec<NonNull<u8>> = [6, 1, 6, 1]
        .iter()
        .map(|&n| vm.allocate(n * P, 256, s).unwrap())
        .collect();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(blocks[0], 6 * P, 256, s) };
    let x = vm.allocate(7 * P, 256, s).unwrap();
    // S's work completes: its pages settle, those beyond the bound go, and some stay.
    rec.set_busy(false);
    calls(&vm, s);
    // Q is freed while its work runs, and the calls' ticks mark it: a batch pending.
    rec.set_busy(true);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(blocks[2], 6 * P, 256, s) };
    calls(&vm, s);
    let kept = settled();
    assert!(kept > 0 && vm.lock().batch.is_some(), "{:?}", vm.usage());
    // D fits in neither hole and needs more pages than are settled: it waits for the batch
    // (reached 20 ms later), and only then do pages go, their memory moving to it.
    let remaps = || rec.remaps.load(std::sync::atomic::Ordering::Relaxed);
    let (before, moved) = (rec.log().len(), remaps());
    let d = std::thread::scope(|t| {
        t.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            rec.set_busy(false);
        });
        vm.allocate(8 * P, 256, s).unwrap()
    });
    let log = &rec.log()[before..];
    let synced = log.iter().position(|e| *e == Ev::Sync(s.id()));
    let first_unmap = log.iter().position(|e| matches!(e, Ev::Unmap(_)));
    assert!(
        synced.is_some_and(|s| first_unmap.is_some_and(|u| s < u)),
        "{log:?}"
    );
    // The settled pages and Q's moved to D rather than go back.
    assert!(remaps() - moved > kept, "{log:?}");
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(blocks[1], P, 256, s);
        vm.deallocate(blocks[3], P, 256, s);
        vm.deallocate(x, 7 * P, 256, s);
        vm.deallocate(d, 8 * P, 256, s);
    }
}

#[test]
fn threads_that_wait_for_batches_unlocked_keep_their_blocks_apart_and_give_every_page_back() {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let rec = Recording::new(1 << 30);
    let config = VirtualMemoryConfig {
        reservation: 256 * P,
        peak_slack: 0,
        cache: 8 * P,
        ..Default::default()
    };
    let vm = VirtualMemory::new(&rec, config).unwrap();
    let (stop, live) = (
        AtomicBool::new(false),
        Mutex::new(BTreeMap::<usize, usize>::new()),
    );
    std::thread::scope(|t| {
        // The device: marks reached, then not, by turns of half a millisecond.
        t.spawn(|| {
            while !stop.load(Relaxed) {
                rec.set_busy(!rec.busy.load(Relaxed));
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            rec.set_busy(false);
        });
        let workers: Vec<_> = (0..4u32)
            .map(|w| {
                let (vm, live) = (&vm, &live);
                t.spawn(move || {
                    let s = StreamRef::simulated(w + 1);
                    let (mut mine, mut x) = (Vec::new(), u64::from(w) * 7919 + 1);
                    let free = |mine: &mut Vec<(NonNull<u8>, usize)>, i: usize| {
                        let (p, len) = mine.swap_remove(i);
                        live.lock().unwrap().remove(&(p.as_ptr() as usize));
                        // SAFETY: live with this size, freed once.
                        unsafe { vm.deallocate(p, len, 256, s) };
                    };
                    for _ in 0..1500 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        if !mine.is_empty() && (mine.len() >= 6 || x % 3 == 0) {
                            let i = x as usize % mine.len();
                            free(&mut mine, i);
                            continue;
                        }
                        let len = (1 + x as usize % 5) * P - 256 * (x as usize / 5 % 3);
                        let p = vm.allocate(len, 256, s).unwrap();
                        let a = p.as_ptr() as usize;
                        let mut l = live.lock().unwrap();
                        let below = l.range(..a).next_back().map(|(&b, &n)| b + n);
                        let above = l.range(a..).next().map(|(&b, _)| b);
                        assert!(below.is_none_or(|end| end <= a), "{a:#x} overlaps below");
                        assert!(above.is_none_or(|b| a + len <= b), "{a:#x} overlaps above");
                        l.insert(a, len);
                        drop(l);
                        mine.push((p, len));
                    }
                    while !mine.is_empty() {
                        free(&mut mine, 0);
                    }
                })
            })
            .collect();
        // Stops the device's thread however the workers end, so that a failing worker fails the
        // test rather than hang it.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stop = Stop(&stop);
        for w in workers {
            w.join().unwrap();
        }
    });
    let u = vm.usage();
    assert_eq!(u.allocated, 0, "{u:?}");
    assert!(
        u.waited > std::time::Duration::ZERO,
        "no request waited: {u:?}"
    );
    vm.release();
    assert_eq!(vm.usage().mapped, 0);
}

#[test]
fn a_batch_whose_marks_are_never_reached_is_waited_for_a_bounded_time() {
    let rec = Recording::new(1 << 30);
    // The marked work never completes (it might wait for this very thread).
    rec.set_busy(true);
    let (vm, s, [_, b, c]) = c_beyond_a_hole(&rec);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(c, 6 * P, 256, s) };
    let start = std::time::Instant::now();
    let d = vm.allocate(8 * P, 256, s).unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= WAIT_FOR_BATCH && waited < 10 * WAIT_FOR_BATCH,
        "{waited:?}"
    );
    // The statistics count the wait, and no more than the request took.
    let counted = vm.usage().waited;
    assert!(
        counted >= WAIT_FOR_BATCH && counted <= waited,
        "{counted:?} of {waited:?}"
    );
    // Mapped beyond the bound, nothing unmapped: A's work may still run.
    assert_eq!(vm.usage().mapped, 16 * P);
    assert!(!rec.log().iter().any(|e| matches!(e, Ev::Unmap(_))));
    rec.set_busy(false);
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 4 * P, 256, s);
        vm.deallocate(d, 8 * P, 256, s);
    }
}

/// Over [`c_beyond_a_hole`] with its batch never reached: `wait` (given C, which it may grow,
/// and returning a block to free with its size) waits for that batch on another thread, while
/// this one frees B; returns how long the free took and the wait counted.
fn free_while_waiting_for_a_batch(
    wait: impl FnOnce(&VirtualMemory<&Recording>, NonNull<u8>, StreamRef) -> (usize, usize) + Send,
) -> (std::time::Duration, std::time::Duration) {
    let rec = Recording::new(1 << 30);
    rec.set_busy(true);
    let (vm, s, [_, b, c]) = c_beyond_a_hole(&rec);
    let queried = || rec.queries.load(std::sync::atomic::Ordering::Relaxed);
    let before = queried();
    let c = c.as_ptr() as usize;
    let ((block, size), took) = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| wait(&vm, NonNull::new(c as *mut u8).unwrap(), s));
        // Once the call queries the marks a second time it waits unlocked (the first query is
        // the one under the lock that found the batch pending).
        let start = std::time::Instant::now();
        while queried() < before + 3 && start.elapsed() < 10 * WAIT_FOR_BATCH {
            std::thread::yield_now();
        }
        let freeing = std::time::Instant::now();
        // SAFETY: live with this size.
        unsafe { vm.deallocate(b, 4 * P, 256, s) };
        let took = freeing.elapsed();
        (waiting.join().unwrap(), took)
    });
    let waited = vm.usage().waited;
    rec.set_busy(false);
    // SAFETY: live with this size, as `wait` returned it.
    unsafe { vm.deallocate(NonNull::new(block as *mut u8).unwrap(), size, 256, s) };
    assert_eq!(vm.usage().allocated, 0);
    (took, waited)
}

#[test]
fn a_free_on_another_thread_goes_on_while_an_allocation_waits_for_a_batch() {
    let (took, waited) = free_while_waiting_for_a_batch(|vm, c, s| {
        // SAFETY: live with this size.
        unsafe { vm.deallocate(c, 6 * P, 256, s) };
        (vm.allocate(8 * P, 256, s).unwrap().as_ptr() as usize, 8 * P)
    });
    // Holding the lock, the allocation would keep the free waiting out its wait.
    assert!(took < WAIT_FOR_BATCH / 2, "the free took {took:?}");
    assert!(waited >= WAIT_FOR_BATCH, "{waited:?}");
}

#[test]
fn a_free_on_another_thread_goes_on_while_a_growth_in_place_waits_for_a_batch() {
    let (took, waited) = free_while_waiting_for_a_batch(|vm, c, s| {
        // SAFETY: C is live with this size.
        let grown =
            unsafe { crate::resource::GrowInPlace::grow_in_place(vm, c, 6 * P, 256, 8 * P, s) };
        assert!(grown.unwrap(), "C grows into the range after it");
        (c.as_ptr() as usize, 8 * P)
    });
    assert!(took < WAIT_FOR_BATCH / 2, "the free took {took:?}");
    assert!(waited >= WAIT_FOR_BATCH, "{waited:?}");
}

#[test]
fn the_page_table_follows_live_blocks_and_mapped_pages_not_the_reservation() {
    let chunk = std::mem::size_of::<table::Chunk<<Simulated as PhysicalPages>::Page>>();
    let pointers = |vm: &VirtualMemory<&Simulated>| vm.usage().page_table_bytes % chunk;
    // 64 MiB pages of 1 TiB: a reservation of 2 TiB, 32,768 pages, 128 chunks of the table.
    let sim = Simulated::with_page_size(1 << 40, 64 << 20);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    let s = StreamRef::DEFAULT;
    assert_eq!(vm.usage().page_table_bytes, 0);
    // A block below a large one, which goes: only the small block's chunk stays.
    let big = vm.allocate(600 << 30, 256, s).unwrap();
    let small = vm.allocate(256, 256, s).unwrap();
    let held = vm.usage().page_table_bytes;
    assert!(held / chunk >= 38, "{held} bytes for 600 GiB of pages");
    // SAFETY: live with this size.
    unsafe { vm.deallocate(big, 600 << 30, 256, s) };
    vm.release();
    let u = vm.usage();
    assert_eq!(u.mapped, 64 << 20, "{u:?}");
    assert_eq!(u.page_table_bytes / chunk, 1, "{u:?}");
    // A pointer a chunk of the reservation up to the small block, at most twice over.
    assert!(pointers(&vm) <= 2 * 8 * 40, "{u:?}");
    // SAFETY: live with this size.
    unsafe { vm.deallocate(small, 256, 256, s) };
    vm.release();
    assert_eq!(vm.usage().page_table_bytes, 0);
}

#[test]
fn pages_swapped_for_the_bound_move_their_memory_to_the_new_pages() {
    let rec = Recording::new(1 << 30);
    // C needs 6 new pages and A's 4 free pages settle at once: the bound (the peak of 10 live
    // pages, B and C, and a page) takes 3 of them, whose memory moves under C.
    let (vm, s, [a, b, c]) = c_beyond_a_hole(&rec);
    let moved = rec.remaps.load(std::sync::atomic::Ordering::Relaxed);
    let u = vm.usage();
    assert_eq!(u.mapped, 11 * P, "{u:?}");
    assert_eq!(moved, 3, "{:?}", rec.log());
    assert_eq!((u.maps - 14, u.unmaps), (0, 3), "{u:?}");
    // The moved pages are A's highest, and each was unmapped after its stream's work.
    let log = rec.log();
    for k in 1..4 {
        let page = a.as_ptr() as usize + k * P;
        assert!(log.contains(&Ev::Unmap(page)), "{log:?}");
        assert!(synced_before_unmap(&log, page, s), "{log:?}");
    }
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 4 * P, 256, s);
        vm.deallocate(c, 6 * P, 256, s);
    }
}

#[test]
fn a_chunk_emptied_while_a_block_maps_its_pages_is_made_again() {
    // F covers pages 0..254 and A 254..258; A is freed, and C's 6 new pages (258..264) take
    // the memory of A's pages 255..258, the only mapped pages of the table's second chunk,
    // which C's covered pages then need again.
    let sim = Simulated::with_page_size(1 << 30, P);
    let config = VirtualMemoryConfig {
        reservation: 1024 * P,
        peak_slack: 0,
        ..Default::default()
    };
    let vm = VirtualMemory::new(&sim, config).unwrap();
    let (d, s) = (StreamRef::DEFAULT, StreamRef::simulated(1));
    let f = vm.allocate(254 * P, 256, d).unwrap();
    let a = vm.allocate(4 * P, 256, d).unwrap();
    let base = f.as_ptr() as usize;
    assert_eq!(a.as_ptr() as usize, base + 254 * P);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 4 * P, 256, s) };
    let c = vm.allocate(6 * P, 256, d).unwrap();
    assert_eq!(c.as_ptr() as usize, base + 258 * P);
    assert_eq!(vm.usage().mapped, sim.mapped());
    // SAFETY: live with this size.
    unsafe { vm.deallocate(c, 6 * P, 256, d) };
    vm.release();
    assert_eq!(vm.usage().mapped, 254 * P, "{:?}", vm.usage());
    assert_eq!(sim.mapped(), 254 * P);
    // C's pages can be mapped again.
    let c = vm.allocate(6 * P, 256, d).unwrap();
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(c, 6 * P, 256, d);
        vm.deallocate(f, 254 * P, 256, d);
    }
    vm.release();
    assert_eq!((vm.usage().mapped, vm.usage().page_table_bytes), (0, 0));
}

#[test]
fn pages_moved_by_a_swap_count_against_max_once() {
    // `max` of 10 pages: A and B of 4, A freed on a stream, C of 6. The swap moves A's pages
    // beyond the bound to C; the cap then asks for the last cached page too.
    let sim = Simulated::with_page_size(1 << 30, P);
    let config = VirtualMemoryConfig {
        reservation: 64 * P,
        max: 10 * P,
        peak_slack: 0,
        ..Default::default()
    };
    let vm = VirtualMemory::new(&sim, config).unwrap();
    let s = StreamRef::simulated(1);
    let a = vm.allocate(4 * P, 256, s).unwrap();
    let b = vm.allocate(4 * P, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 4 * P, 256, s) };
    let c = vm.allocate(6 * P, 256, s).unwrap();
    assert!(vm.usage().mapped <= 10 * P, "{:?}", vm.usage());
    assert_eq!(sim.mapped(), vm.usage().mapped);
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 4 * P, 256, s);
        vm.deallocate(c, 6 * P, 256, s);
    }
}

#[test]
fn a_program_that_does_little_but_allocate_marks_its_streams_once_an_interval_at_most() {
    let rec = Recording::new(1 << 30);
    // At the bound (the peak of 10 live pages and a page), B's pages cached, one of which every
    // call's small block revives and frees again: every tick finds an unsettled page near the
    // bound.
    let (vm, s, [_, b, c]) = c_beyond_a_hole(&rec);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(b, 4 * P, 256, s) };
    assert_eq!(vm.usage().mapped, 11 * P);
    let before = rec.marks.load(std::sync::atomic::Ordering::Relaxed);
    let start = std::time::Instant::now();
    for _ in 0..20_000 {
        let x = vm.allocate(256, 256, s).unwrap();
        // SAFETY: live with this size.
        unsafe { vm.deallocate(x, 256, 256, s) };
    }
    let rounds = start.elapsed().as_micros() / cache::EVENT_INTERVAL.as_micros() + 2;
    let marks = rec.marks.load(std::sync::atomic::Ordering::Relaxed) - before;
    assert!(marks >= 1, "the cached page never settles");
    assert!(
        marks as u128 <= rounds,
        "{marks} marks in {:?}",
        start.elapsed()
    );
    // SAFETY: live with this size.
    unsafe { vm.deallocate(c, 6 * P, 256, s) };
}

#[test]
fn pages_kept_for_a_mapping_a_panic_cut_short_go_back_with_the_next_call() {
    let rec = Recording::new(1 << 30);
    let vm = following(&rec);
    let s = StreamRef::simulated(1);
    let a = vm.allocate(4 * P, 256, s).unwrap();
    let b = vm.allocate(4 * P, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 4 * P, 256, s) };
    // C takes three of A's pages' memory; the first move breaks down, two pages still kept.
    rec.panic_in_remap
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| vm.allocate(6 * P, 256, s)));
    assert!(cut.is_err());
    rec.panic_in_remap
        .store(false, std::sync::atomic::Ordering::Relaxed);
    // The next call finds the lock poisoned: the kept pages go back to the source.
    assert_eq!(vm.usage().mapped, rec.sim.mapped());
    // SAFETY: live with this size.
    unsafe { vm.deallocate(b, 4 * P, 256, s) };
    drop(vm);
    assert_eq!(rec.sim.mapped(), 0);
}

#[test]
fn blocks_that_share_a_page_count_on_it_and_the_last_one_out_caches_it() {
    let sim = Simulated::with_page_size(64 * P, P);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    let s = StreamRef::DEFAULT;
    let live = |vm: &VirtualMemory<&Simulated>| {
        let u = vm.usage();
        (u.mapped - u.cached, u.cached)
    };
    let a = vm.allocate(1024, 256, s).unwrap();
    let b = vm.allocate(1024, 256, s).unwrap();
    let page = |p: NonNull<u8>| p.as_ptr() as usize / P;
    assert_eq!(page(a), page(b));
    assert_eq!(live(&vm), (P, 0));
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 1024, 256, s) };
    // B still lives on the page: it stays live, out of the cache.
    assert_eq!(live(&vm), (P, 0));
    let c = vm.allocate(1024, 256, s).unwrap();
    assert_eq!(page(c), page(b));
    assert_eq!((live(&vm), sim.mapped()), ((P, 0), P));
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, 1024, 256, s);
        vm.deallocate(c, 1024, 256, s);
    }
    // The last block out leaves the page free: cached, still mapped.
    assert_eq!((live(&vm), sim.mapped()), ((0, P), P));
    assert_eq!(vm.release(), P);
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn blocks_on_the_last_page_of_a_table_chunk_and_across_it_count_on_each_page() {
    // F covers pages 0..255; A, B and C share page 255, the last of the table's first chunk; C
    // runs on into page 256, the first of the second, which D shares.
    const LAST: usize = table::CHUNK_PAGES - 1;
    let sim = Simulated::with_page_size(1024 * P, P);
    let config = VirtualMemoryConfig {
        reservation: 1024 * P,
        ..Default::default()
    };
    let vm = VirtualMemory::new(&sim, config).unwrap();
    let s = StreamRef::DEFAULT;
    let f = vm.allocate(LAST * P, 256, s).unwrap();
    let base = f.as_ptr() as usize;
    let sizes = [P / 2, P / 4, P, P / 4];
    let [a, b, c, d] = sizes.map(|n| vm.allocate(n, 256, s).unwrap());
    let at = |p: NonNull<u8>| p.as_ptr() as usize - base;
    assert_eq!(
        [at(a), at(b), at(c), at(d)],
        [
            LAST * P,
            LAST * P + P / 2,
            LAST * P + 3 * P / 4,
            (LAST + 1) * P + 3 * P / 4
        ]
    );
    let pages = |vm: &VirtualMemory<&Simulated>| {
        let u = vm.usage();
        ((u.mapped - u.cached) / P, u.cached / P)
    };
    assert_eq!((pages(&vm), sim.mapped()), ((LAST + 2, 0), (LAST + 2) * P));
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(b, P / 4, 256, s);
        vm.deallocate(a, P / 2, 256, s);
    }
    // C still lives on both pages.
    assert_eq!(pages(&vm), (LAST + 2, 0));
    // SAFETY: live with this size.
    unsafe { vm.deallocate(c, P, 256, s) };
    // Page 255 has no block left; D keeps page 256.
    assert_eq!(pages(&vm), (LAST + 1, 1));
    // SAFETY: live with this size.
    unsafe { vm.deallocate(d, P / 4, 256, s) };
    assert_eq!((pages(&vm), sim.mapped()), ((LAST, 2), (LAST + 2) * P));
    // SAFETY: live with this size.
    unsafe { vm.deallocate(f, LAST * P, 256, s) };
    assert_eq!(vm.release(), (LAST + 2) * P);
    assert_eq!((sim.mapped(), vm.usage().page_table_bytes), (0, 0));
}

/// A device in a model: each stream's work is a count of units queued and a count done, and a
/// mark is a stream with the count queued when it was made, reached once that many are done.
/// `order_after(s, t)` queues a unit on `s` that waits for the units queued on `t` so far, so
/// `s` gets past it only once they are done. A query finishes the marked stream's work now and
/// then (`progress` in 256ths), as a device catches up. It records an error wherever a page is
/// unmapped, or its memory moved, while work queued before a block on it was freed is not done.
#[derive(Debug)]
struct Device {
    sim: Simulated,
    state: Mutex<DeviceState>,
}

#[derive(Debug, Default)]
struct DeviceState {
    queued: std::collections::HashMap<StreamId, u64>,
    done: std::collections::HashMap<StreamId, u64>,
    /// For each page, by address: the work that may use blocks freed on it since it was mapped,
    /// as (stream, units queued on it at the free).
    freed: std::collections::HashMap<usize, Vec<(StreamId, u64)>>,
    /// Waits queued by `order_after`: (stream, its unit, the stream waited for, units of it).
    waits: Vec<(StreamId, u64, StreamId, u64)>,
    progress: u32,
    rng: u64,
    errors: Vec<String>,
}

impl Device {
    fn new(capacity: usize, seed: u64) -> Self {
        Device {
            sim: Simulated::with_page_size(capacity, P),
            state: Mutex::new(DeviceState {
                progress: 32,
                rng: seed | 1,
                ..DeviceState::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DeviceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a unit of work on `stream`, one that uses a block allocated there.
    fn queue(&self, stream: StreamRef) {
        *self.state().queued.entry(stream.id()).or_default() += 1;
    }

    /// The block `[addr, addr + len)` is freed on `stream`: its pages may be used until the work
    /// queued there so far is done.
    fn freed(&self, addr: usize, len: usize, stream: StreamRef) {
        let mut st = self.state();
        let at = st.queued.get(&stream.id()).copied().unwrap_or(0);
        // The block's granules, which its pages are counted by.
        for page in (addr / P)..=((addr + len.next_multiple_of(256) - 1) / P) {
            st.freed
                .entry(page * P)
                .or_default()
                .push((stream.id(), at));
        }
    }

    /// The device finishes every unit queued on `stream`.
    fn finish(&self, stream: StreamId) {
        let mut st = self.state();
        let queued = st.queued.get(&stream).copied().unwrap_or(0);
        st.complete(stream, queued);
    }

    /// Checks, and forgets, the work on the pages of `[addr, addr + size)`, which go now.
    fn unmapping(&self, addr: usize, size: usize) {
        let mut st = self.state();
        for page in (addr..addr + size).step_by(P) {
            for (stream, at) in st.freed.remove(&page).unwrap_or_default() {
                let done = st.done.get(&stream).copied().unwrap_or(0);
                if done < at {
                    st.errors.push(format!(
                        "page {page:#x} went with {stream:?} at {done} of {at}"
                    ));
                }
            }
        }
    }
}

impl DeviceState {
    /// Units `..upto` of `stream` are done, and so the work each of its waits waited for.
    fn complete(&mut self, stream: StreamId, upto: u64) {
        let done = self.done.entry(stream).or_default();
        if *done >= upto {
            return;
        }
        *done = upto;
        let waited: Vec<(StreamId, u64)> = (self.waits.iter())
            .filter(|&&(s, unit, _, _)| s == stream && unit < upto)
            .map(|&(_, _, t, at)| (t, at))
            .collect();
        for (t, at) in waited {
            self.complete(t, at);
        }
    }
}

impl Sealed for Device {}

// SAFETY: every call goes to `Simulated`, whose promises hold; the model touches no memory.
unsafe impl PhysicalPages for Device {
    type Host = typenum::B0;
    type Device = typenum::B0;
    type Migratable = typenum::B0;
    type Page = ();
    type Mark = (StreamId, u64);
    crate::leaf::pages::forward_reservations!(self.sim);
    unsafe fn map(&self, addr: usize, size: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.map(addr, size) }
    }
    unsafe fn enable(&self, _: usize, _: usize) -> Result<()> {
        Ok(())
    }
    unsafe fn unmap(&self, addr: usize, size: usize, page: ()) {
        self.unmapping(addr, size);
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.unmap(addr, size, page) }
    }
    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        self.finish(stream.id());
        Ok(())
    }
    fn order_after(&self, stream: StreamRef, after: StreamRef) -> Result<()> {
        let mut st = self.state();
        let at = st.queued.get(&after.id()).copied().unwrap_or(0);
        let unit = st.queued.entry(stream.id()).or_default();
        *unit += 1;
        let unit = *unit - 1;
        st.waits.push((stream.id(), unit, after.id(), at));
        Ok(())
    }
    fn mark(&self, stream: StreamRef) -> Result<Option<(StreamId, u64)>> {
        let st = self.state();
        Ok(Some((
            stream.id(),
            st.queued.get(&stream.id()).copied().unwrap_or(0),
        )))
    }
    fn reached(&self, &(stream, at): &(StreamId, u64)) -> Result<bool> {
        let catch_up = {
            let mut st = self.state();
            st.rng ^= st.rng << 13;
            st.rng ^= st.rng >> 7;
            st.rng ^= st.rng << 17;
            (st.rng % 256) < u64::from(st.progress)
        };
        if catch_up {
            self.finish(stream);
        }
        Ok(self.state().done.get(&stream).copied().unwrap_or(0) >= at)
    }
    fn wait(&self, &(stream, at): &(StreamId, u64)) -> Result<()> {
        self.state().complete(stream, at);
        Ok(())
    }
    fn name(&self) -> &'static str {
        "Device"
    }
    fn describe_fields<'a, 'b>(&self, item: ItemWriter<'a, 'b>) -> ItemWriter<'a, 'b> {
        item.flag("device", true)
    }
}

mod device_model {
    //! `VirtualMemory` over a device whose work completes as it will: batches marked, queried
    //! and waited for, requests that wait for a batch without the lock, swaps. Against a model
    //! of live blocks, and no page gone while work that used a block on it may still run.
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc { size: usize, stream: u32 },
        Free { pick: prop::sample::Index },
        Finish { stream: u32 },
        Progress { rate: u32 },
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let size = prop_oneof![2 => 1..=4096usize, 3 => 1..=3 * P, 1 => 1..=12 * P];
        let op = prop_oneof![
            4 => (size, 0..3u32).prop_map(|(size, stream)| Op::Alloc { size, stream }),
            3 => any::<prop::sample::Index>().prop_map(|pick| Op::Free { pick }),
            1 => (0..3u32).prop_map(|stream| Op::Finish { stream }),
            1 => (8..=256u32).prop_map(|rate| Op::Progress { rate }),
        ];
        prop::collection::vec(op, 1..60)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 1_024, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn pages_go_only_after_the_work_that_used_them(
            capacity_pages in 16usize..64,
            slack_pages in 0usize..3,
            seed in any::<u64>(),
            ops in ops(),
        ) {
            let dev = Device::new(capacity_pages * P, seed);
            let config = VirtualMemoryConfig { peak_slack: slack_pages * P, ..Default::default() };
            let vm = VirtualMemory::new(&dev, config).unwrap();
            let mut live: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
            let mut order: Vec<usize> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { size, stream } => {
                        let on = StreamRef::simulated(stream);
                        match vm.allocate(size, 256, on) {
                            Ok(p) => {
                                let a = p.as_ptr() as usize;
                                if let Some((&b, &(n, _))) = live.range(..=a).next_back() {
                                    prop_assert!(b + n <= a, "overlap");
                                }
                                if let Some((&b, _)) = live.range(a..).next() {
                                    prop_assert!(a + size <= b, "overlap");
                                }
                                dev.queue(on);
                                live.insert(a, (size, stream));
                                order.push(a);
                            }
                            Err(e) => prop_assert!(e.is_out_of_memory(), "{e}"),
                        }
                    }
                    Op::Free { pick } => {
                        if !order.is_empty() {
                            let a = order.swap_remove(pick.index(order.len()));
                            let (size, stream) = live.remove(&a).unwrap();
                            let on = StreamRef::simulated(stream);
                            dev.freed(a, size, on);
                            // SAFETY: live, from `vm`, with this size, freed on the stream its
                            // work was queued on.
                            unsafe { vm.deallocate(NonNull::new(a as *mut u8).unwrap(), size, 256, on) };
                        }
                    }
                    Op::Finish { stream } => dev.finish(StreamRef::simulated(stream).id()),
                    Op::Progress { rate } => dev.state().progress = rate,
                }
                let u = vm.usage();
                let touched: std::collections::BTreeSet<usize> = live
                    .iter()
                    .flat_map(|(&a, &(n, _))| (a / P)..=((a + n.next_multiple_of(256) - 1) / P))
                    .collect();
                prop_assert_eq!(u.mapped, dev.sim.mapped());
                prop_assert_eq!(u.mapped, touched.len() * P + u.cached);
                let errors = std::mem::take(&mut dev.state().errors);
                prop_assert!(errors.is_empty(), "{:?}", errors);
            }
            for (a, (size, stream)) in std::mem::take(&mut live) {
                let on = StreamRef::simulated(stream);
                dev.freed(a, size, on);
                // SAFETY: as above.
                unsafe { vm.deallocate(NonNull::new(a as *mut u8).unwrap(), size, 256, on) };
            }
            vm.release();
            prop_assert_eq!(dev.sim.mapped(), 0);
            let errors = std::mem::take(&mut dev.state().errors);
            prop_assert!(errors.is_empty(), "{:?}", errors);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// `PagedHeaps` over the same device, threads allocating on three streams and freeing
        /// each other's blocks on the streams their work was queued on: across heaps (the bound
        /// across heaps, pages given up), no page goes while work that used it may still run.
        #[test]
        fn paged_heaps_give_pages_back_only_after_the_work_that_used_them(
            threads in 2usize..5,
            slack_pages in 0usize..3,
            seed in any::<u64>(),
            plans in prop::collection::vec(prop::collection::vec((1usize..=4 * P, 0..3u32, any::<bool>(), 8..=256u32), 1..50), 4),
        ) {
            let dev = Device::new(256 * P, seed);
            let config = PagedHeapsConfig { cache: usize::MAX, peak_slack: slack_pages * P };
            let heaps = PagedHeaps::new(&dev, config);
            // Blocks left by one thread for the next to free: (address, size, stream).
            let handed: Mutex<Vec<(usize, usize, u32)>> = Mutex::new(Vec::new());
            let free = |a: usize, size: usize, stream: u32| {
                let on = StreamRef::simulated(stream);
                dev.freed(a, size, on);
                // SAFETY: live, from `heaps`, with this size, freed on the stream its work was
                // queued on, by the one thread that took it.
                unsafe { heaps.deallocate(NonNull::new(a as *mut u8).unwrap(), size, 256, on) };
            };
            std::thread::scope(|scope| {
                for plan in plans.iter().take(threads) {
                    let (heaps, dev, handed, free) = (&heaps, &dev, &handed, &free);
                    scope.spawn(move || {
                        let mut own = Vec::new();
                        for &(size, stream, hand, rate) in plan {
                            dev.state().progress = rate;
                            let on = StreamRef::simulated(stream);
                            let Ok(p) = heaps.allocate(size, 256, on) else { continue };
                            dev.queue(on);
                            let block = (p.as_ptr() as usize, size, stream);
                            if hand {
                                let other = handed.lock().unwrap().pop();
                                handed.lock().unwrap().push(block);
                                if let Some((a, n, s)) = other {
                                    free(a, n, s);
                                }
                            } else {
                                own.push(block);
                            }
                            if own.len() > 6 {
                                let (a, n, s) = own.remove(0);
                                free(a, n, s);
                            }
                        }
                        for (a, n, s) in own {
                            free(a, n, s);
                        }
                    });
                }
            });
            for (a, n, s) in handed.into_inner().unwrap() {
                free(a, n, s);
            }
            prop_assert_eq!(heaps.usage().allocated, 0);
            prop_assert_eq!(heaps.usage().mapped, dev.sim.mapped());
            heaps.release();
            prop_assert_eq!(dev.sim.mapped(), 0);
            let errors = std::mem::take(&mut dev.state().errors);
            prop_assert!(errors.is_empty(), "{:?}", errors);
        }
    }
}
