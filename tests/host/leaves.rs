//! Host tests of the leaves and the rules every resource follows: request validation and
//! zero-size requests on `System`, `Simulated`, `&R` and `Arc<R>`, out of memory and what errors
//! say, `Simulated`'s address space starting over, and the CUDA constructors without a driver.

use mrstack::prelude::*;
use mrstack::resource::dangling;
use mrstack::resource::AllocErrorKind;
use std::sync::Arc;

const S: StreamRef = StreamRef::DEFAULT;

/// Every rule of `MemoryResource` about bad input, checked on one resource.
fn rejects_bad_input<R: MemoryResource>(r: &R) {
    let name = r.name();
    let e = r.allocate(64, 3, S).unwrap_err();
    assert!(
        matches!(e.kind, AllocErrorKind::InvalidArgument(_)),
        "{name}: {e}"
    );
    assert_eq!((e.size, e.align, e.resource), (64, 3, name));
    assert!(e.to_string().contains("power of two"), "{e}");

    let e = r.allocate(64, 0, S).unwrap_err();
    assert!(
        matches!(e.kind, AllocErrorKind::InvalidArgument(_)),
        "{name}: {e}"
    );

    let e = r.allocate(usize::MAX, 1, S).unwrap_err();
    assert!(
        matches!(e.kind, AllocErrorKind::InvalidArgument(_)),
        "{name}: {e}"
    );
    assert!(e.to_string().contains("overflows"), "{e}");

    let e = r.allocate(isize::MAX as usize, 1, S).unwrap_err();
    assert!(
        matches!(e.kind, AllocErrorKind::InvalidArgument(_)),
        "{name}: {e}"
    );
}

/// Size 0: a dangling pointer aligned to max(align, R::Alignment), no upstream call, free is a no-op.
pub(crate) fn zero_size_is_dangling<R: MemoryResource>(r: &R) {
    for align in [1usize, 8, 256, 4096] {
        let p = r.allocate(0, align, S).unwrap();
        let expect = align.max(mrstack::property::alignment_of::<R>());
        assert_eq!(p, dangling(expect), "{} align {align}", r.name());
        // SAFETY: p came from allocate(0, align).
        unsafe { r.deallocate(p, 0, align, S) };
    }
}

#[test]
fn system_validates_requests() {
    rejects_bad_input(&System::new());
    zero_size_is_dangling(&System::new());
}

#[test]
fn simulated_validates_requests() {
    let sim = Simulated::new(1 << 20);
    rejects_bad_input(&sim);
    zero_size_is_dangling(&sim);
    assert_eq!(
        sim.allocation_count(),
        0,
        "zero-size requests must not reach the address space"
    );
}

#[test]
fn references_and_arcs_are_resources() {
    let sim = Arc::new(Simulated::new(1 << 20));
    rejects_bad_input(&sim);
    rejects_bad_input(&&*sim);
    let p = sim.allocate(100, 512, S).unwrap();
    assert_eq!(p.as_ptr() as usize % 512, 0);
    let by_ref: &Simulated = &sim;
    assert_eq!(MemoryResource::name(&by_ref), "Simulated");
    // SAFETY: p came from sim (through the Arc) with this size and align.
    unsafe { MemoryResource::deallocate(&by_ref, p, 100, 512, S) };
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn simulated_out_of_memory_is_an_error_and_recoverable() {
    let sim = Simulated::new(4096);
    let a = sim.allocate(4096, 1, S).unwrap();
    let e = sim.allocate(1, 1, S).unwrap_err();
    assert_eq!(e.kind, AllocErrorKind::OutOfMemory);
    assert!(e.is_out_of_memory());
    assert_eq!(
        e.to_string(),
        "Simulated: out of memory (requested 1 bytes, alignment 1)"
    );
    // SAFETY: a came from sim with this size.
    unsafe { sim.deallocate(a, 4096, 1, S) };
    crate::support::serve_one(&sim, 4096, 1, S);
}

#[test]
fn errors_say_what_failed() {
    let e = AllocError::new(
        AllocErrorKind::LimitExceeded {
            limit: 100,
            in_use: 90,
        },
        20,
        8,
        "Limiting",
    );
    assert_eq!(
        e.to_string(),
        "Limiting: limit of 100 bytes exceeded (90 bytes already allocated) (requested 20 bytes, alignment 8)"
    );
    assert_eq!(
        format!("{e:?}"),
        format!("{e} [AllocErrorKind::LimitExceeded {{ limit: 100, in_use: 90 }}]")
    );
    // `{:#?}` is every field, for a developer.
    assert_eq!(
        format!("{e:#?}"),
        "AllocError {\n    kind: LimitExceeded {\n        limit: 100,\n        in_use: 90,\n    },\n    size: 20,\n    align: 8,\n    resource: \"Limiting\",\n}"
    );
    // Inside another value's `{:?}`, as `unwrap` on an `Err` prints it.
    assert_eq!(
        format!(
            "{:?}",
            Err::<(), _>(AllocError::out_of_memory(64, 8, "Pool"))
        ),
        "Err(Pool: out of memory (requested 64 bytes, alignment 8) [AllocErrorKind::OutOfMemory])"
    );
    assert!(e.is_out_of_memory());
    let oom = AllocError::cuda(
        cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY),
        1,
        1,
        "Cuda",
    );
    assert_eq!(oom.kind, AllocErrorKind::OutOfMemory);
    let other = AllocError::cuda(
        cudarc::driver::DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE),
        1,
        1,
        "Cuda",
    );
    assert!(
        other.to_string().contains("CUDA_ERROR_INVALID_VALUE"),
        "{other}"
    );
}

#[test]
fn simulated_starts_over_once_its_address_space_is_spent_and_nothing_is_live() {
    let sim = Simulated::new(usize::MAX);
    let d = StreamRef::DEFAULT;
    let huge = 1usize << 62;
    for pass in 0..8 {
        let p = sim
            .allocate(huge, 256, d)
            .unwrap_or_else(|e| panic!("pass {pass}: {e}"));
        // SAFETY: p came from sim with this size.
        unsafe { sim.deallocate(p, huge, 256, d) };
    }
    // With a block live, the address space is not reused: a second huge block that does not fit
    // after it is out of memory, not an overlap.
    let a = sim.allocate(huge, 256, d).unwrap();
    let b = sim.allocate(huge, 256, d);
    if let Ok(b) = b {
        assert!(
            b.as_ptr() as usize >= a.as_ptr() as usize + huge,
            "ranges overlap"
        );
        // SAFETY: b came from sim with this size.
        unsafe { sim.deallocate(b, huge, 256, d) };
    }
    // SAFETY: a came from sim with this size.
    unsafe { sim.deallocate(a, huge, 256, d) };
    assert_eq!(sim.in_use(), 0);
}

#[test]
fn cuda_constructors_fail_cleanly_without_a_driver() {
    if crate::support::driver_loaded(
        "a CUDA driver is present here; the GPU suite covers this machine",
    ) {
        return;
    }
    crate::support::assert_no_driver(mrstack::cuda_context(0).unwrap_err());
    crate::support::assert_no_driver(Cuda::on_device(0).unwrap_err());
    crate::support::assert_no_driver(CudaAsync::on_device(0).unwrap_err());
    crate::support::assert_no_driver(Managed::on_device(0).unwrap_err());
    crate::support::assert_no_driver(Pinned::on_device(0).unwrap_err());
    assert_eq!(mrstack::device_count(), 0);
    let msg = Cuda::on_device(0).unwrap_err().to_string();
    assert!(msg.contains("no CUDA driver"), "{msg}");
    // What `main` prints for `?`: what happened, not a 0-byte request, then the kind to match.
    let debug = format!("{:?}", Cuda::on_device(0).unwrap_err());
    assert_eq!(
        debug,
        "CudaContext: no CUDA driver: libcuda could not be loaded on this machine [AllocErrorKind::NoDriver]"
    );
}

#[test]
fn a_device_number_past_i32_is_refused_not_wrapped_to_another_device() {
    // cudarc takes the ordinal as an i32: 2^32 would open device 0.
    let invalid =
        AllocErrorKind::Cuda(mrstack::cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_DEVICE);
    for ordinal in [1usize << 31, 1 << 32, usize::MAX] {
        let e = mrstack::cuda_context(ordinal).unwrap_err();
        assert_eq!(e.kind, invalid, "{e}");
        let e = Cuda::on_device(ordinal).unwrap_err();
        assert_eq!(e.kind, invalid, "{e}");
    }
    let e = mrstack::config::build::<DeviceAccessible>("cuda(device=4294967296)").unwrap_err();
    assert!(e.to_string().contains("CUDA_ERROR_INVALID_DEVICE"), "{e}");
}
