//! Host tests of `testing::DeviceStandIn`, the device memory of host-only tests: its addresses lie
//! where nothing can access them and never overlap, it refuses the streams on which real CUDA work
//! could be queued, and misuse is loud.

use mrstack::prelude::*;
use mrstack::testing::DeviceStandIn;
use mrstack::{erased::AnyResource, resource::AllocErrorKind};
use std::ptr::NonNull;

const S: StreamRef = StreamRef::DEFAULT;

/// Allocates `sizes` from `mr`, returning each block with its size.
fn take(mr: &DeviceStandIn, sizes: &[usize]) -> Vec<(NonNull<u8>, usize)> {
    sizes
        .iter()
        .map(|&n| (mr.allocate(n, 256, S).unwrap(), n))
        .collect()
}

fn give(mr: &DeviceStandIn, blocks: Vec<(NonNull<u8>, usize)>) {
    for (p, n) in blocks {
        // SAFETY: p came from mr with this size and alignment.
        unsafe { mr.deallocate(p, n, 256, S) };
    }
}

#[cfg(target_os = "linux")]
#[test]
fn every_address_lies_in_a_mapping_nothing_may_access() {
    let mr = DeviceStandIn::new();
    let blocks = take(&mr, &[1, 1000, 1 << 20, 64 << 20]);
    let (start, len) = DeviceStandIn::region().unwrap();
    assert!(len >= 1 << 30);
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for &(p, n) in &blocks {
        let addr = p.as_ptr() as usize;
        assert!(start <= addr && addr + n <= start + len);
        // The mapping that holds the block: `lo-hi perms …`.
        let perms = maps
            .lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let (lo, hi) = range.split_once('-')?;
                let lo = usize::from_str_radix(lo, 16).ok()?;
                let hi = usize::from_str_radix(hi, 16).ok()?;
                (lo <= addr && addr + n <= hi).then(|| rest[..4].to_string())
            })
            .unwrap_or_else(|| panic!("{addr:#x} is in no mapping"));
        assert_eq!(perms, "---p", "{addr:#x}");
    }
    // Host allocations never land there: the region is reserved for the life of the process.
    let host: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1 << (i % 20)]).collect();
    for v in &host {
        let a = v.as_ptr() as usize;
        assert!(a + v.len() <= start || a >= start + len);
    }
    give(&mr, blocks);
}

#[test]
fn stand_ins_on_many_threads_never_overlap() {
    let a = DeviceStandIn::new();
    let b = DeviceStandIn::with_capacity(1 << 30);
    let ranges = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let mr = if t % 2 == 0 { &a } else { &b };
                scope.spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..200usize {
                        let n = 1 + (i * 7919 + t * 104_729) % (256 << 10);
                        let p = mr
                            .allocate(n, 256 << (i % 4), StreamRef::simulated(t as u32))
                            .unwrap();
                        assert_eq!(p.as_ptr() as usize % (256 << (i % 4)), 0);
                        live.push((p, n));
                        if i % 3 == 0 {
                            let (p, n) = live.swap_remove(i % live.len());
                            // SAFETY: p came from mr with this size; the alignment is not
                            // checked by deallocate.
                            unsafe { mr.deallocate(p, n, 256, S) };
                        }
                    }
                    live.into_iter()
                        .map(|(p, n)| (mr as *const DeviceStandIn as usize, p.as_ptr() as usize, n))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    let mut sorted: Vec<(usize, usize)> = ranges.iter().map(|&(_, p, n)| (p, n)).collect();
    sorted.sort();
    for w in sorted.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "{:#x?} overlaps {:#x?}",
            w[0],
            w[1]
        );
    }
    assert_eq!(a.live() + b.live(), ranges.len());
    for (owner, p, n) in ranges {
        let mr = if owner == &a as *const _ as usize {
            &a
        } else {
            &b
        };
        let p = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(p)).unwrap();
        // SAFETY: p came from mr with this size.
        unsafe { mr.deallocate(p, n, 256, S) };
    }
    assert_eq!((a.in_use(), b.in_use()), (0, 0));
}

#[test]
fn streams_that_may_carry_cuda_work_are_refused() {
    let mr = DeviceStandIn::new();
    // SAFETY: the per-thread handle is a special handle, which from_raw accepts.
    let per_thread = unsafe { StreamRef::from_raw(2 as cudarc::driver::sys::CUstream) };
    let err = mr.allocate(4096, 256, per_thread).unwrap_err();
    assert!(matches!(err.kind, AllocErrorKind::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("not a CUDA stream"), "{err}");
    assert_eq!(mr.live(), 0);
    // The streams of host-only tests are served, and any stream may give a block back.
    let p = mr.allocate(4096, 256, StreamRef::simulated(3)).unwrap();
    let q = mr.allocate(4096, 256, S).unwrap();
    assert_eq!(mr.live(), 2);
    // SAFETY: p and q came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(p, 4096, 256, per_thread);
        mr.deallocate(q, 4096, 256, StreamRef::simulated(9));
    }
    assert_eq!(mr.live(), 0);
    // Nothing to wait for or to order, whatever the stream.
    assert!(mr.synchronize(per_thread).is_ok());
    assert!(mr.order_after(S, per_thread).is_ok());
}

#[test]
fn capacity_alignment_and_bad_requests() {
    let mr = DeviceStandIn::with_capacity(1 << 20);
    assert_eq!(mr.capacity(), 1 << 20);
    let big = mr.allocate(1 << 20, 1 << 20, S).unwrap();
    assert_eq!(big.as_ptr() as usize % (1 << 20), 0);
    assert!(mr.allocate(1, 1, S).unwrap_err().is_out_of_memory());
    // SAFETY: big came from mr with this size and alignment.
    unsafe { mr.deallocate(big, 1 << 20, 1 << 20, S) };
    assert_eq!(
        (mr.in_use(), mr.peak(), mr.allocation_count()),
        (0, 1 << 20, 1)
    );

    let unbounded = DeviceStandIn::new();
    // More than the region holds: out of memory, not a panic.
    assert!(unbounded
        .allocate(1 << 45, 256, S)
        .unwrap_err()
        .is_out_of_memory());
    assert!(matches!(
        unbounded.allocate(8, 3, S).unwrap_err().kind,
        AllocErrorKind::InvalidArgument(_)
    ));
    assert!(unbounded.allocate(usize::MAX, 1, S).is_err());
    let empty = unbounded.allocate(0, 4096, S).unwrap();
    assert_eq!(empty.as_ptr() as usize % 4096, 0);
    assert_eq!(unbounded.live(), 0);
}

#[test]
#[should_panic(expected = "is not a live allocation")]
fn a_double_free_is_caught() {
    let mr = DeviceStandIn::new();
    let p = mr.allocate(64, 1, S).unwrap();
    // SAFETY: p is live with this size.
    unsafe { mr.deallocate(p, 64, 1, S) };
    // SAFETY: deliberately broken (a double free): the stand-in must catch it.
    unsafe { mr.deallocate(p, 64, 1, S) };
}

#[test]
#[should_panic(expected = "was allocated with 64 bytes, freed with 65")]
fn a_wrong_size_is_caught() {
    let mr = DeviceStandIn::new();
    let p = mr.allocate(64, 1, S).unwrap();
    // SAFETY: deliberately broken (another size): the stand-in must catch it.
    unsafe { mr.deallocate(p, 65, 1, S) };
}

/// What a library generic over device memory looks like; its logic (sizes, alignment, cleanup on
/// failure) is what a host-only unit test can check.
fn double_buffer<R: MemoryResource + Accessible<DeviceAccessible>>(
    mr: &R,
    bytes: usize,
) -> Result<[NonNull<u8>; 2], AllocError> {
    let front = mr.allocate(bytes, 4096, S)?;
    match mr.allocate(bytes, 4096, S) {
        Ok(back) => Ok([front, back]),
        Err(e) => {
            // SAFETY: front came from mr with this size and alignment, unused.
            unsafe { mr.deallocate(front, bytes, 4096, S) };
            Err(e)
        }
    }
}

#[test]
fn a_device_library_is_unit_tested_on_the_host() {
    let mr = DeviceStandIn::with_capacity(3 << 20);
    let [front, back] = double_buffer(&mr, 1 << 20).unwrap();
    assert_eq!(front.as_ptr() as usize % 4096, 0);
    assert!(
        front.as_ptr() as usize + (1 << 20) <= back.as_ptr() as usize
            || back.as_ptr() as usize + (1 << 20) <= front.as_ptr() as usize
    );
    // The second pair does not fit: the library gives back the half it took.
    assert!(double_buffer(&mr, 1 << 20).unwrap_err().is_out_of_memory());
    assert_eq!((mr.live(), mr.in_use()), (2, 2 << 20));
    // Erased and behind a stack, as a library's caller would hand it over.
    let stack = AnyResource::<DeviceAccessible>::new(resource_stack![mr, Statistics]);
    let [x, y] = double_buffer(&stack, 4096).unwrap();
    let stats = stack
        .find::<mrstack::adaptor::Statistics<DeviceStandIn>>()
        .unwrap();
    assert_eq!(stats.stats().bytes.current, 8192);
    // SAFETY: every block came from its resource with this size and alignment.
    unsafe {
        stack.deallocate(x, 4096, 4096, S);
        stack.deallocate(y, 4096, 4096, S);
    }
    let mr = stack.find::<DeviceStandIn>().unwrap();
    assert_eq!(mr.live(), 2);
    // SAFETY: as above.
    unsafe {
        mr.deallocate(front, 1 << 20, 4096, S);
        mr.deallocate(back, 1 << 20, 4096, S);
    }
    assert_eq!(mr.in_use(), 0);
}
