//! GPU test of `SamHeadroom`: refused where the device cannot reach pageable host memory (with the
//! reason), and where it can, system memory that kernels write and the host reads in place,
//! placed on the GPU only within the device's free memory minus the headroom.

use crate::support::{assert_filled, fill_and_check, gpu};
use cudarc::driver::sys;
use mrstack::leaf::SamHeadroom;
use mrstack::prelude::*;
use mrstack::resource::AllocErrorKind;

/// The preferred location the driver reports for `[ptr, ptr + len)`: a device ordinal, -1 for
/// the CPU, -2 where the range is mixed; `None` where the driver does not answer.
fn preferred(ptr: u64, len: usize) -> Option<i32> {
    let mut location: i32 = -3;
    // SAFETY: a 4-byte place for this attribute's value, over a live allocation.
    unsafe {
        sys::cuMemRangeGetAttribute(
            (&mut location as *mut i32).cast(),
            4,
            sys::CUmem_range_attribute::CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
            ptr,
            len,
        )
    }
    .result()
    .ok()
    .map(|()| location)
}

#[test]
fn sam_headroom_serves_kernels_where_the_platform_allows_and_says_why_not_elsewhere() {
    let Some(ctx) = gpu() else { return };
    let supported = SamHeadroom::supported(&ctx).unwrap();
    println!("CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS on this device: {supported}");
    let sam = match SamHeadroom::new(&ctx, 1 << 30) {
        Err(e) => {
            assert!(!supported, "refused on a supported device: {e}");
            assert!(matches!(e.kind, AllocErrorKind::Unsupported(_)), "{e}");
            assert!(e.to_string().contains("PAGEABLE_MEMORY_ACCESS"), "{e}");
            let built = mrstack::config::build::<DeviceAccessible>("sam_headroom(headroom=1 GiB)");
            assert!(built.is_err(), "the text config is refused too");
            println!("SamHeadroom refused here, as it must be: {e}");
            return;
        }
        Ok(sam) => sam,
    };
    assert!(supported);
    assert_eq!(
        sam.describe().to_string(),
        "sam_headroom(device=0, headroom=1 GiB)"
    );
    let stream = ctx.new_stream().unwrap();
    let n = 1 << 20;
    let mut v = DeviceVec::<u32, _>::zeroed(n, &sam, &stream).unwrap();
    fill_and_check(&ctx, &mut v, 3);
    assert_filled(v.as_host_slice().unwrap(), n, 3);
    let on_device = preferred(v.device_address(), n * 4);
    println!("preferred location with 1 GiB headroom: {on_device:?}");
    if let Some(at) = on_device {
        assert_eq!(at, 0, "within the free memory: preferred on the GPU");
    }
    // A headroom of everything: no byte may prefer the GPU.
    let none = SamHeadroom::new(&ctx, usize::MAX).unwrap();
    let mut w = DeviceVec::<u32, _>::zeroed(n, &none, &stream).unwrap();
    fill_and_check(&ctx, &mut w, 5);
    let on_host = preferred(w.device_address(), n * 4);
    println!("preferred location with all memory as headroom: {on_host:?}");
    if let Some(at) = on_host {
        assert_eq!(at, -1, "beyond the headroom: preferred on the CPU");
    }
}
