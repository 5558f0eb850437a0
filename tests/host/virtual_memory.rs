//! `VirtualMemory` over `Simulated`'s page model: blocks map exactly the pages they touch, free
//! pages stay mapped only up to the cache bound, a hole's pages serve any later request, and
//! everything (mappings and reservations) goes back.

use mrstack::leaf::VmUsage;
use mrstack::prelude::*;
use mrstack::resource::align_up;
use mrstack::{
    leaf::{VirtualMemory, VirtualMemoryConfig},
    resource::GrowInPlace,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::NonNull;

const PAGE: usize = 64 << 10;

/// Grows `p` (live in `vm`, of `size` bytes, aligned to 256) to `new` bytes in place.
///
/// # Safety
///
/// The caller owns `p` and, once grown, frees it on `stream` (simulated streams have no work,
/// but the contract is kept anyway).
unsafe fn grow(
    vm: &VirtualMemory<&Simulated>,
    p: NonNull<u8>,
    size: usize,
    new: usize,
    stream: StreamRef,
) -> Result<bool, AllocError> {
    // SAFETY: the caller's promise.
    unsafe { GrowInPlace::grow_in_place(vm, p, size, 256, new, stream) }
}

fn vm(sim: &Simulated, cache: usize) -> VirtualMemory<&Simulated> {
    vm_following(sim, cache, usize::MAX)
}

fn vm_following(sim: &Simulated, cache: usize, peak_slack: usize) -> VirtualMemory<&Simulated> {
    VirtualMemory::new(
        sim,
        VirtualMemoryConfig {
            cache,
            peak_slack,
            ..Default::default()
        },
    )
    .unwrap()
}

/// Gives every free page of `r` (over `sim`) back, checks that none stays mapped, drops `r`, and
/// checks that every byte and every reservation went back to `sim`.
fn all_back<R>(sim: &Simulated, r: R, release: impl FnOnce(&R) -> usize) {
    release(&r);
    assert_eq!(sim.mapped(), 0);
    drop(r);
    assert_eq!((sim.in_use(), sim.reservations()), (0, 0));
}

/// The pages that live blocks `[addr, addr + size)` touch.
fn pages_of(live: &BTreeMap<usize, (usize, usize)>) -> BTreeSet<usize> {
    live.iter()
        .filter(|(_, &(size, _))| size > 0)
        .flat_map(|(&a, &(size, _))| {
            let size = align_up(size, 256).unwrap();
            (a / PAGE)..=((a + size - 1) / PAGE)
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align: usize,
        stream: u32,
    },
    Free {
        pick: prop::sample::Index,
        stream: u32,
    },
    Grow {
        pick: prop::sample::Index,
        by: usize,
        stream: u32,
    },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![
        3 => 0..=4096usize,
        3 => 1..=PAGE * 2,
        1 => 1..=PAGE * 16,
    ];
    let op = prop_oneof![
        3 => (size, 0..=14u32, 0..3u32).prop_map(|(size, a, stream)| Op::Alloc { size, align: 1 << a, stream }),
        2 => (any::<prop::sample::Index>(), 0..3u32).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => (any::<prop::sample::Index>(), 1..=PAGE * 4, 0..3u32).prop_map(|(pick, by, stream)| Op::Grow { pick, by, stream }),
    ];
    prop::collection::vec(op, 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Against a model of live blocks: no overlap, alignment, exact accounting; the mapped
    /// pages are exactly those live blocks touch plus cached free pages, never more cached
    /// bytes than the bound; a failure is out of memory only, and never with nothing live when
    /// the request's pages fit the capacity; everything goes back.
    #[test]
    fn virtual_memory_model(
        capacity_pages in 4usize..64,
        cache_pages in 0usize..8,
        slack in prop_oneof![Just(usize::MAX), (0usize..4).prop_map(|p| p * PAGE)],
        ops in ops(),
    ) {
        let sim = Simulated::with_page_size(capacity_pages * PAGE, PAGE);
        let cache = if slack == usize::MAX { cache_pages * PAGE } else { usize::MAX };
        let vm = vm_following(&sim, cache, slack);
        // The most pages live blocks have touched at once.
        let mut live_peak = 0;
        let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        let mut order: Vec<usize> = Vec::new();
        // The stream each grown block grew on, which frees it.
        let mut grown_on: BTreeMap<usize, u32> = BTreeMap::new();
        let mut empty = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, align, stream } => {
                    match vm.allocate(size, align, StreamRef::simulated(stream)) {
                        Ok(p) => {
                            let a = p.as_ptr() as usize;
                            prop_assert_eq!(a % align.max(256), 0);
                            if size == 0 {
                                empty.push((p, align));
                                continue;
                            }
                            if let Some((&b, &(n, _))) = live.range(..=a).next_back() {
                                prop_assert!(b + n <= a, "overlap");
                            }
                            if let Some((&b, _)) = live.range(a..).next() {
                                prop_assert!(a + size <= b, "overlap");
                            }
                            live.insert(a, (size, align));
                            order.push(a);
                        }
                        Err(e) => {
                            prop_assert!(e.is_out_of_memory(), "{e}");
                            // With nothing live, the block's own pages fit wherever they are
                            // free: a block short of a page it straddles goes to a page boundary.
                            let pages = align_up(size, 256).unwrap().div_ceil(PAGE);
                            prop_assert!(!(live.is_empty() && pages <= capacity_pages), "{e} with nothing live");
                        }
                    }
                }
                Op::Grow { pick, by, stream } => {
                    if !order.is_empty() {
                        let a = order[pick.index(order.len())];
                        let (size, align) = live[&a];
                        let p = NonNull::new(a as *mut u8).unwrap();
                        let on = grown_on.get(&a).copied().unwrap_or(stream);
                        // SAFETY: live, owned by this test, freed on `on` (the stream of its
                        // first growth: every growth of it uses that stream).
                        let grown = unsafe { grow(&vm, p, size, size + by, StreamRef::simulated(on)) };
                        match grown {
                            Ok(true) => {
                                grown_on.insert(a, on);
                                if let Some((&b, _)) = live.range(a + 1..).next() {
                                    prop_assert!(a + size + by <= b, "grew over a live block");
                                }
                                live.insert(a, (size + by, align));
                            }
                            Ok(false) => {}
                            Err(e) => prop_assert!(e.is_out_of_memory(), "{e}"),
                        }
                    }
                }
                Op::Free { pick, stream } => {
                    if !order.is_empty() {
                        let a = order.swap_remove(pick.index(order.len()));
                        let (size, align) = live.remove(&a).unwrap();
                        let p = NonNull::new(a as *mut u8).unwrap();
                        let stream = grown_on.remove(&a).unwrap_or(stream);
                        // SAFETY: live, from vm, with this size and alignment; a grown block on
                        // the stream it grew on.
                        unsafe { vm.deallocate(p, size, align, StreamRef::simulated(stream)) };
                    }
                }
            }
            let u: VmUsage = vm.usage();
            let touched = pages_of(&live).len() * PAGE;
            live_peak = live_peak.max(touched);
            prop_assert_eq!(u.mapped, sim.mapped());
            prop_assert_eq!(u.mapped, touched + u.cached, "mapped = pages of live blocks + cache");
            prop_assert!(u.cached <= cache, "{} cached over the bound {}", u.cached, cache);
            if slack != usize::MAX {
                // Mapped pages stay within the peak of live pages and the slack (a page at
                // least, a 64th of the peak at most).
                // Doubled where swaps took too much of the time (a loaded machine's preemption
                // counts as swap time).
                let slack = slack.min(live_peak >> 6).max(PAGE) << u.slack_doublings;
                prop_assert!(
                    u.mapped <= live_peak + slack,
                    "{} mapped over the live peak {} + slack {}", u.mapped, live_peak, slack
                );
            }
            let allocated: usize = live.values().map(|&(n, _)| align_up(n, 256).unwrap()).sum();
            prop_assert_eq!(u.allocated, allocated);
            prop_assert!(u.mapped <= capacity_pages * PAGE);
        }
        for (a, (size, align)) in std::mem::take(&mut live) {
            // SAFETY: live, from vm, with this size and alignment.
            unsafe { vm.deallocate(NonNull::new(a as *mut u8).unwrap(), size, align, StreamRef::DEFAULT) };
        }
        for (p, align) in empty {
            // SAFETY: a zero-size allocation of vm.
            unsafe { vm.deallocate(p, 0, align, StreamRef::DEFAULT) };
        }
        let u = vm.usage();
        prop_assert_eq!((u.allocated, u.mapped), (0, u.cached));
        vm.release();
        // With no page mapped and no block live, the page table keeps nothing.
        let u = vm.usage();
        prop_assert_eq!(u.page_table_bytes, 0, "{:?}", u);
        all_back(&sim, vm, VirtualMemory::release);
    }
}

#[test]
fn a_hole_between_live_blocks_serves_a_larger_request() {
    // Physical memory for 8 pages. Live blocks at both ends of a 6-page hole: a pool would need a
    // contiguous 7 pages for the next request; here the hole's pages went back and the request
    // maps fresh pages wherever its virtual range lies.
    let sim = Simulated::with_page_size(8 * PAGE, PAGE);
    let vm = vm(&sim, 0);
    let s = StreamRef::DEFAULT;
    let a = vm.allocate(PAGE, 256, s).unwrap();
    let hole = vm.allocate(6 * PAGE, 256, s).unwrap();
    let b = vm.allocate(PAGE, 256, s).unwrap();
    assert_eq!(sim.mapped(), 8 * PAGE);
    // SAFETY: live with this size.
    unsafe { vm.deallocate(hole, 6 * PAGE, 256, s) };
    assert_eq!(sim.mapped(), 2 * PAGE, "the hole's pages went back");
    let big = vm.allocate(6 * PAGE, 256, s).unwrap();
    assert_eq!(sim.mapped(), 8 * PAGE);
    assert!(vm.allocate(PAGE, 256, s).unwrap_err().is_out_of_memory());
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(big, 6 * PAGE, 256, s);
        vm.deallocate(a, PAGE, 256, s);
        vm.deallocate(b, PAGE, 256, s);
    }
    all_back(&sim, vm, VirtualMemory::release);
}

#[test]
fn cached_pages_are_reused_and_given_up_under_pressure() {
    let sim = Simulated::with_page_size(8 * PAGE, PAGE);
    let vm = vm(&sim, 8 * PAGE);
    let s = StreamRef::DEFAULT;
    let a = vm.allocate(4 * PAGE, 256, s).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(a, 4 * PAGE, 256, s) };
    assert_eq!(vm.usage().cached, 4 * PAGE, "kept mapped");
    let b = vm.allocate(4 * PAGE, 256, s).unwrap();
    assert_eq!(
        (b, vm.usage().cached),
        (a, 0),
        "the same range, nothing mapped anew"
    );
    // SAFETY: live with this size.
    unsafe { vm.deallocate(b, 4 * PAGE, 256, s) };
    // A request in another range that needs all 8 pages: the 4 cached ones are unmapped first.
    let p = vm.allocate(PAGE, 256, StreamRef::simulated(1)).unwrap();
    let q = vm.allocate(7 * PAGE, 256, StreamRef::simulated(2)).unwrap();
    assert_eq!(sim.mapped(), 8 * PAGE);
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(p, PAGE, 256, StreamRef::simulated(1));
        vm.deallocate(q, 7 * PAGE, 256, StreamRef::simulated(2));
    }
    assert_eq!(vm.release(), 8 * PAGE);
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn the_physical_cap_counts_mapped_pages() {
    let sim = Simulated::with_page_size(64 * PAGE, PAGE);
    let vm = VirtualMemory::new(
        &sim,
        VirtualMemoryConfig {
            max: 3 * PAGE,
            cache: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let s = StreamRef::DEFAULT;
    // Three one-page blocks: three pages mapped, the cap reached.
    let blocks: Vec<_> = (0..3).map(|_| vm.allocate(PAGE, 256, s).unwrap()).collect();
    let err = vm.allocate(256, 256, s).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    for p in blocks {
        // SAFETY: live with this size.
        unsafe { vm.deallocate(p, PAGE, 256, s) };
    }
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn grows_in_place_while_the_range_after_is_free() {
    let sim = Simulated::with_page_size(16 * PAGE, PAGE);
    let vm = vm(&sim, 0);
    let s = StreamRef::DEFAULT;
    let a = vm.allocate(PAGE / 2, 256, s).unwrap();
    assert_eq!(sim.mapped(), PAGE);
    let g = |p, size, new, stream| {
        // SAFETY: the callers below pass live blocks of this test, freed on `s` at the end (a
        // growth on stream 7 is refused).
        unsafe { grow(&vm, p, size, new, stream) }
    };
    assert!(
        !g(a, PAGE / 2, PAGE / 2 - 1, s).unwrap(),
        "a smaller size is no growth, even within the same block"
    );
    assert!(g(a, PAGE / 2, 3 * PAGE, s).unwrap());
    assert_eq!(sim.mapped(), 3 * PAGE, "the new pages are mapped");
    let b = vm.allocate(PAGE, 256, s).unwrap();
    assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + 3 * PAGE);
    assert!(!g(a, 3 * PAGE, 4 * PAGE, s).unwrap(), "b is in the way");
    assert!(
        !g(b, PAGE, 2 * PAGE, StreamRef::simulated(7)).unwrap(),
        "another stream's range"
    );
    assert!(
        !g(b, PAGE, 20 * PAGE, s).unwrap(),
        "more than the capacity is refused at once"
    );
    let err = g(b, PAGE, 14 * PAGE, s).unwrap_err();
    assert!(err.is_out_of_memory(), "no physical memory for it: {err}");
    assert_eq!(sim.mapped(), 4 * PAGE, "the failed growth mapped nothing");
    // SAFETY: live with these sizes (a grew to 3 pages).
    unsafe {
        vm.deallocate(a, 3 * PAGE, 256, s);
        vm.deallocate(b, PAGE, 256, s);
    }
    assert_eq!(vm.usage().allocated, 0);
    all_back(&sim, vm, VirtualMemory::release);
}

#[test]
fn a_leaked_block_keeps_its_pages_and_range() {
    let sim = Simulated::with_page_size(16 * PAGE, PAGE);
    let vm = vm(&sim, 0);
    let _leaked = vm.allocate(PAGE, 256, StreamRef::DEFAULT).unwrap();
    let freed = vm.allocate(PAGE, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: live with this size.
    unsafe { vm.deallocate(freed, PAGE, 256, StreamRef::DEFAULT) };
    drop(vm);
    // The leaked block's page stays mapped (device work may still use it), the rest went.
    assert_eq!((sim.mapped(), sim.reservations()), (PAGE, 1));
}

#[test]
fn a_virtual_memory_over_a_source_of_no_capacity_builds_and_refuses_requests() {
    // A replay of a log of zero-size requests sizes its simulated source at 0 bytes.
    let sim = Simulated::new(0);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    let e = vm.allocate(256, 256, StreamRef::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!((vm.usage().mapped, sim.mapped()), (0, 0));
}

mod paged_heaps {
    //! `PagedHeaps` under threads against a model: no two live blocks overlap, whichever
    //! thread made them; alignment; blocks freed by other threads; every page mapped is under a
    //! live block or cached within each heap's bound; every byte and range back.
    use super::*;
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    use std::sync::Mutex;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn paged_heaps_model_under_threads(
            threads in 2usize..6,
            slack_pages in 0usize..4,
            plans in prop::collection::vec(prop::collection::vec((1usize..=PAGE * 6, 0..=12u32, any::<bool>(), 0..4u32), 1..60), 6),
        ) {
            let sim = Simulated::with_page_size(1 << 30, PAGE);
            let slack = slack_pages * PAGE;
            let heaps = PagedHeaps::new(&sim, PagedHeapsConfig { cache: usize::MAX, peak_slack: slack });
            // Every live block of every thread: start -> end.
            let live: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
            // Blocks a thread leaves for the next one to free.
            let handed: Mutex<Vec<(usize, usize, usize, StreamRef)>> = Mutex::new(Vec::new());
            let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
            std::thread::scope(|scope| {
                for plan in plans.iter().take(threads) {
                    let (heaps, live, handed, failures) = (&heaps, &live, &handed, &failures);
                    scope.spawn(move || {
                        let mut own = Vec::new();
                        let fail = |m: String| failures.lock().unwrap().push(m);
                        for &(size, a, keep, stream) in plan {
                            let align = 1usize << a;
                            // Streams spread blocks over the stream heaps; each is freed on its own.
                            let stream = StreamRef::simulated(stream);
                            let p = match heaps.allocate(size, align, stream) {
                                Ok(p) => p.as_ptr() as usize,
                                Err(e) => { fail(format!("{e}")); continue; }
                            };
                            if p % align.max(256) != 0 { fail(format!("{p:#x} not aligned to {align}")); }
                            {
                                let mut l = live.lock().unwrap();
                                if let Some((_, &end)) = l.range(..=p).next_back() {
                                    if end > p { fail(format!("{p:#x} overlaps a live block")); }
                                }
                                if let Some((&b, _)) = l.range(p..).next() {
                                    if p + size > b { fail(format!("{p:#x}+{size} overlaps a live block")); }
                                }
                                l.insert(p, p + size);
                            }
                            if keep { own.push((p, size, align, stream)); } else {
                                // Freed by whichever thread takes it next.
                                let other = handed.lock().unwrap().pop();
                                handed.lock().unwrap().push((p, size, align, stream));
                                if let Some((q, n, al, on)) = other {
                                    live.lock().unwrap().remove(&q);
                                    // SAFETY: live, from `heaps`, with this size and alignment,
                                    // handed over by the thread that made it.
                                    unsafe { heaps.deallocate(NonNull::new(q as *mut u8).unwrap(), n, al, on) };
                                }
                            }
                            if own.len() > 8 {
                                let (q, n, al, on) = own.remove(0);
                                live.lock().unwrap().remove(&q);
                                // SAFETY: live, from `heaps`, with this size and alignment.
                                unsafe { heaps.deallocate(NonNull::new(q as *mut u8).unwrap(), n, al, on) };
                            }
                        }
                        for (q, n, al, on) in own {
                            live.lock().unwrap().remove(&q);
                            // SAFETY: as above.
                            unsafe { heaps.deallocate(NonNull::new(q as *mut u8).unwrap(), n, al, on) };
                        }
                    });
                }
            });
            let failures = failures.into_inner().unwrap();
            prop_assert!(failures.is_empty(), "{:?}", failures);
            // Quiet: what is mapped is the handed blocks' pages and each heap's cache.
            let handed = handed.into_inner().unwrap();
            let model: BTreeMap<usize, (usize, usize)> = handed.iter().map(|&(p, n, a, _)| (p, (n, a))).collect();
            let u = heaps.usage();
            prop_assert_eq!(u.mapped, sim.mapped());
            prop_assert_eq!(u.mapped, pages_of(&model).len() * PAGE + u.cached);
            let allocated: usize = handed.iter().map(|&(_, n, _, _)| align_up(n, 256).unwrap()).sum();
            prop_assert_eq!(u.allocated, allocated);
            for (p, n, a, on) in handed {
                // SAFETY: live, from `heaps`, with this size and alignment.
                unsafe { heaps.deallocate(NonNull::new(p as *mut u8).unwrap(), n, a, on) };
            }
            prop_assert_eq!(heaps.usage().allocated, 0);
            heaps.release();
            // Nothing live, nothing mapped: no heap keeps any of its page table.
            prop_assert_eq!(heaps.usage().page_table_bytes, 0);
            all_back(&sim, heaps, PagedHeaps::release);
        }
    }
}

#[test]
fn paged_heaps_give_every_heaps_free_pages_back_before_a_request_fails() {
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    // 8 pages in all. A thread of its own takes 6 and frees them: they stay mapped in its heap.
    // Then this thread asks for 6: only the other heap's free pages can make room.
    let sim = Simulated::with_page_size(8 * PAGE, PAGE);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    std::thread::scope(|s| {
        s.spawn(|| {
            // A stream of its own, so that this thread's blocks land in a heap apart from the
            // default stream's.
            let own = StreamRef::simulated(7);
            let p = heaps.allocate(6 * PAGE, 256, own).unwrap();
            // SAFETY: live with this size.
            unsafe { heaps.deallocate(p, 6 * PAGE, 256, own) };
        });
    });
    assert_eq!(sim.mapped(), 6 * PAGE, "the free pages stayed mapped");
    let p = heaps.allocate(6 * PAGE, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(sim.mapped(), 6 * PAGE);
    assert_eq!(heaps.usage().allocated, 6 * PAGE);
    // SAFETY: live with this size.
    unsafe { heaps.deallocate(p, 6 * PAGE, 256, StreamRef::DEFAULT) };
    // More than the device has fails.
    let e = heaps
        .allocate(9 * PAGE, 256, StreamRef::DEFAULT)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let mapped = sim.mapped();
    assert_eq!(heaps.release(), mapped);
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn paged_heaps_give_each_of_the_first_streams_a_heap_of_its_own() {
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    let sim = Simulated::with_page_size(64 * PAGE, PAGE);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let mut live = Vec::new();
    for n in 0..16 {
        let on = StreamRef::simulated(100 + n);
        live.push((heaps.allocate(PAGE, 256, on).unwrap(), on));
        assert_eq!(
            heaps.heaps(),
            n as usize + 1,
            "stream {n} got a heap of its own"
        );
    }
    // A 17th stream shares one of them.
    let on = StreamRef::simulated(200);
    live.push((heaps.allocate(PAGE, 256, on).unwrap(), on));
    assert_eq!(heaps.heaps(), 16);
    for (p, on) in live {
        // SAFETY: live with this size, freed on the stream that allocated it.
        unsafe { heaps.deallocate(p, PAGE, 256, on) };
    }
    assert_eq!(heaps.usage().allocated, 0);
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn paged_heaps_map_nothing_more_when_threads_on_their_own_streams_repeat_their_work() {
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    let sim = Simulated::with_page_size(1024 * PAGE, PAGE);
    // No bound on the pages kept: under the default one, what stays mapped depends on the pace
    // (a slack doubled where swaps took much of the time, which preemption on a loaded machine
    // can make them do). Routing alone decides what is mapped here.
    let heaps = PagedHeaps::new(
        &sim,
        PagedHeapsConfig {
            peak_slack: usize::MAX,
            ..PagedHeapsConfig::default()
        },
    );
    let barrier = std::sync::Barrier::new(8);
    let mut mapped = Vec::new();
    for _pass in 0..3 {
        std::thread::scope(|s| {
            for t in 0..8u32 {
                let (heaps, barrier) = (&heaps, &barrier);
                s.spawn(move || {
                    let on = StreamRef::simulated(t);
                    let mut x = 0x9E37_79B9u32.wrapping_mul(t + 1);
                    let mut live = Vec::new();
                    barrier.wait();
                    for _ in 0..2000 {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        if live.len() < 40 && x % 4 != 0 {
                            let n = 256 + (x as usize % (3 * PAGE));
                            live.push((heaps.allocate(n, 256, on).unwrap(), n));
                        } else if !live.is_empty() {
                            let (p, n) = live.swap_remove(x as usize % live.len());
                            // SAFETY: live with this size, on this stream.
                            unsafe { heaps.deallocate(p, n, 256, on) };
                        }
                    }
                    for (p, n) in live {
                        // SAFETY: as above.
                        unsafe { heaps.deallocate(p, n, 256, on) };
                    }
                });
            }
        });
        mapped.push(sim.mapped());
    }
    // Each stream's blocks stay in its heap, whose free pages stay mapped for its next pass:
    // the same work maps no more.
    assert_eq!(heaps.heaps(), 8, "one heap per stream, none taken in turns");
    assert_eq!(mapped[1], mapped[0], "{mapped:?}");
    assert_eq!(mapped[2], mapped[0], "{mapped:?}");
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn paged_heaps_take_back_blocks_freed_on_other_streams_past_the_stream_heaps() {
    use mrstack::leaf::{PagedHeaps, PagedHeapsConfig};
    // 40 streams, more than there are stream heaps; each block freed on another stream and by
    // another thread than the one that allocated it.
    let sim = Simulated::with_page_size(256 * PAGE, PAGE);
    let heaps = PagedHeaps::new(&sim, PagedHeapsConfig::default());
    let blocks: Vec<(usize, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let heaps = &heaps;
                s.spawn(move || {
                    (0..10u32)
                        .map(|i| {
                            let on = StreamRef::simulated(t * 10 + i);
                            let p = heaps.allocate(PAGE / 2 + 256 * i as usize, 256, on);
                            (p.unwrap().as_ptr() as usize, t * 10 + i)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    // 16 stream heaps, shared by the other streams; a thread that found one busy used its own.
    assert!(heaps.heaps() >= 16, "{}", heaps.heaps());
    std::thread::scope(|s| {
        for chunk in blocks.chunks(10) {
            let heaps = &heaps;
            s.spawn(move || {
                for &(p, n) in chunk {
                    let size = PAGE / 2 + 256 * (n % 10) as usize;
                    let other = StreamRef::simulated((n + 1) % 40);
                    // SAFETY: live with this size; a free on another stream is allowed.
                    unsafe {
                        heaps.deallocate(NonNull::new(p as *mut u8).unwrap(), size, 256, other)
                    };
                }
            });
        }
    });
    assert_eq!(heaps.usage().allocated, 0, "every block came back");
    heaps.release();
    assert_eq!(sim.mapped(), 0);
}

#[test]
fn a_request_of_the_whole_capacity_fits_once_nothing_is_live() {
    const PAGE: usize = 64 << 10;
    let sim = Simulated::with_page_size(4 * PAGE, PAGE);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    let (s1, s2) = (StreamRef::simulated(1), StreamRef::simulated(2));
    let a = vm.allocate(256, 256, s1).unwrap();
    // SAFETY: live, from `vm`, this size; freed on another stream, so the free ranges of `s1`
    // start 256 bytes into a page.
    unsafe { vm.deallocate(a, 256, 256, s2) };
    vm.release();
    assert_eq!((vm.usage().allocated, sim.mapped()), (0, 0));
    let p = vm.allocate(4 * PAGE, 256, s1).unwrap();
    assert_eq!(p.as_ptr() as usize % PAGE, 0, "placed at a page boundary");
    // SAFETY: live, from `vm`, this size.
    unsafe { vm.deallocate(p, 4 * PAGE, 256, s1) };
    all_back(&sim, vm, VirtualMemory::release);
}

#[test]
fn the_error_of_a_request_that_runs_short_names_the_request() {
    const PAGE: usize = 64 << 10;
    let sim = Simulated::with_page_size(4 * PAGE, PAGE);
    let vm = VirtualMemory::new(&sim, VirtualMemoryConfig::default()).unwrap();
    let live = vm.allocate(3 * PAGE, 256, StreamRef::DEFAULT).unwrap();
    let e = vm.allocate(2 * PAGE, 512, StreamRef::DEFAULT).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("requested {} bytes", 2 * PAGE)),
        "{e}"
    );
    // SAFETY: live, from `vm`, this size.
    unsafe { vm.deallocate(live, 3 * PAGE, 256, StreamRef::DEFAULT) };
}

#[test]
fn ranges_reserved_for_single_requests_go_back_on_release() {
    let cap = 1usize << 40;
    let sim = Simulated::new(cap);
    let heaps = mrstack::leaf::PagedHeaps::new(&sim, mrstack::leaf::PagedHeapsConfig::default());
    let s = StreamRef::simulated(1);
    // Each block's alignment asks for a range of its own, until the address space runs out.
    let mut live = Vec::new();
    while let Ok(p) = heaps.allocate(256, 2 * cap, s) {
        live.push(p);
        assert!(live.len() < 10_000, "address space without end");
    }
    assert!(live.len() > 1);
    for p in live.drain(..) {
        // SAFETY: live, from `heaps`, this size and alignment.
        unsafe { heaps.deallocate(p, 256, 2 * cap, s) };
    }
    heaps.release();
    assert_eq!((heaps.usage().allocated, sim.mapped()), (0, 0));
    // Each heap keeps one range; `Simulated` hands out addresses once only, so the address
    // space given back is not handed out again here, as the driver's is.
    assert_eq!(sim.reservations(), heaps.heaps(), "one range a heap");
    let p = heaps.allocate(256, 256, s).unwrap();
    // SAFETY: live, from `heaps`, this size.
    unsafe { heaps.deallocate(p, 256, 256, s) };
}

#[test]
fn a_stream_heap_that_cannot_be_made_leaves_the_request_to_the_threads_heap() {
    let (cap, page) = (1usize << 40, 1usize << 30);
    let sim = Simulated::with_page_size(cap, page);
    let heaps = mrstack::leaf::PagedHeaps::new(&sim, mrstack::leaf::PagedHeapsConfig::default());
    let s = StreamRef::simulated(1);
    // The whole device in stream 1's heap: the next request goes to this thread's heap.
    let x = heaps.allocate(cap, 256, s).unwrap();
    let y = heaps.allocate(256, 2 * cap, s);
    // Then the address space runs out, held by blocks of stream 1's and this thread's heaps.
    let mut live = Vec::new();
    while let Ok(p) = heaps.allocate(256, 2 * cap, s) {
        live.push(p);
        assert!(live.len() < 10_000, "address space without end");
    }
    // SAFETY: live, from `heaps`, this size.
    unsafe { heaps.deallocate(x, cap, 256, s) };
    // A new stream's heap cannot reserve its range; this thread's heap serves the request.
    let p = heaps.allocate(256, 256, StreamRef::simulated(2)).unwrap();
    // SAFETY: live, from `heaps`, this size.
    unsafe { heaps.deallocate(p, 256, 256, StreamRef::simulated(2)) };
    for p in live.drain(..).chain(y.ok()) {
        // SAFETY: live, from `heaps`, this size and alignment.
        unsafe { heaps.deallocate(p, 256, 2 * cap, s) };
    }
    heaps.release();
    assert_eq!((heaps.usage().allocated, sim.mapped()), (0, 0));
}
