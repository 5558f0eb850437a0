//! GPU tests of the leaves over driver memory pools that mrstack does not create:
//! `CudaAsyncView` (the device's default pool, a pool another library made) and
//! `CudaAsyncManaged` (the device's default managed pool). Kernels write every value, the host
//! checks every value, and the driver says which pool each pointer came from.

use crate::support::{assert_filled, fill_and_check, gpu};
use cudarc::driver::{result, sys, CudaContext, PushKernelArg};
use mrstack::leaf::{CudaAsyncManaged, CudaAsyncView};
use mrstack::prelude::*;
use mrstack::{leaf::CudaAsyncOptions, resource::AllocErrorKind};
use std::sync::Arc;

/// A pointer attribute the driver reports as one `T` (a pool handle, a flag).
fn attribute<T: Default>(ptr: u64, attribute: sys::CUpointer_attribute) -> T {
    let mut value = T::default();
    // SAFETY: `value` is a valid place of the attribute's type (the callers pass the right T).
    unsafe { sys::cuPointerGetAttribute((&mut value as *mut T).cast(), attribute, ptr) }
        .result()
        .unwrap();
    value
}

fn pool_of(ptr: u64) -> sys::CUmemoryPool {
    attribute::<usize>(
        ptr,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    ) as sys::CUmemoryPool
}

#[test]
fn a_view_of_the_default_pool_allocates_from_it_and_destroys_nothing() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let mut default: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid place for the handle, the context's device.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut default, ctx.cu_device()) }
        .result()
        .unwrap();
    for round in 0..2u32 {
        // A second view after the first dropped: the pool is still there.
        let view = CudaAsyncView::default_pool(&ctx).unwrap();
        assert_eq!(view.pool_handle(), default);
        assert_eq!(view.describe().to_string(), "cuda_async_view(device=0)");
        let mut v = DeviceVec::<u32, _>::zeroed(1 << 20, &view, &stream).unwrap();
        assert_eq!(
            pool_of(v.device_address()),
            default,
            "allocated from the default pool"
        );
        fill_and_check(&ctx, &mut v, 3 + round);
    }
    // The text config names the same pool.
    let mr = mrstack::config::build::<DeviceAccessible>("cuda_async_view(device=0)").unwrap();
    let v = DeviceVec::<u32, _>::from_slice(&[7, 8, 9], &mr, &stream).unwrap();
    assert_eq!(pool_of(v.device_address()), default);
    assert_eq!(v.to_vec().unwrap(), [7, 8, 9]);
}

/// A pool of device memory on `ctx`'s device, as another library would make one.
fn foreign_pool(ctx: &Arc<CudaContext>) -> sys::CUmemoryPool {
    ctx.bind_to_thread().unwrap();
    // SAFETY: all-zero CUmemPoolProps is its "no options" value; the fields set make it a
    // device pool on the context's device.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = ctx.cu_device();
    // SAFETY: props is initialized.
    unsafe { result::mem_pool::create(&props) }.unwrap()
}

#[test]
fn a_view_of_a_pool_another_library_made_leaves_it_to_its_owner() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let pool = foreign_pool(&ctx);
    {
        // SAFETY: a live device pool of this device, destroyed below after the view and its
        // memory are gone.
        let view = unsafe { CudaAsyncView::from_handle(&ctx, pool) };
        assert_eq!(
            view.describe().to_string(),
            "cuda_async_view(device=0, pool=foreign)"
        );
        let mut a = DeviceVec::<u32, _>::zeroed(300_000, &view, &stream).unwrap();
        let mut b = DeviceVec::<u32, _>::zeroed(1000, &view, &stream).unwrap();
        assert_eq!(pool_of(a.device_address()), pool);
        fill_and_check(&ctx, &mut a, 5);
        fill_and_check(&ctx, &mut b, 6);
    }
    stream.synchronize().unwrap();
    // The owner's pool still serves its owner.
    ctx.bind_to_thread().unwrap();
    // SAFETY: the pool is live; the memory is freed on the same stream, then the pool destroyed
    // once the stream is done.
    unsafe {
        let p = result::mem_pool::alloc_async(pool, 4096, stream.cu_stream()).unwrap();
        result::memset_d8_async(p, 1, 4096, stream.cu_stream()).unwrap();
        result::free_async(p, stream.cu_stream()).unwrap();
        stream.synchronize().unwrap();
        result::mem_pool::destroy(pool).unwrap();
    }
}

#[test]
fn the_managed_pool_gives_memory_kernels_and_the_host_both_use() {
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let mr = match CudaAsyncManaged::new(&ctx) {
        Ok(mr) => mr,
        Err(e) => panic!("the GPU has managed pools (CUDA 13): {e}"),
    };
    assert_eq!(mr.describe().to_string(), "cuda_async_managed(device=0)");
    let n = 100_000;
    let mut v = DeviceVec::<u32, _>::zeroed(n, &mr, &stream).unwrap();
    assert_eq!(pool_of(v.device_address()), mr.pool_handle());
    let managed: u32 = attribute(
        v.device_address(),
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    );
    assert_eq!(managed, 1, "managed memory");
    // A kernel writes; the host reads in place (the vector waits for the kernel first).
    crate::slow_fill!(&ctx, &stream, &mut v, n, 9);
    assert_filled(v.as_host_slice().unwrap(), n, 9);
    // The host writes in place; a copy on the device reads it back.
    for (i, c) in v.as_host_cells().unwrap().iter().enumerate() {
        c.set(i as u32 ^ 0xA5A5);
    }
    let want: Vec<u32> = (0..n as u32).map(|i| i ^ 0xA5A5).collect();
    assert_eq!(v.to_vec().unwrap(), want);
    fill_and_check(&ctx, &mut v, 4);
    // From text, with the properties of managed memory.
    let built = mrstack::config::build::<(HostAccessible, DeviceAccessible, Migratable)>(
        "cuda_async_managed(device=0)",
    )
    .unwrap();
    let w = DeviceVec::<u32, _>::from_slice(&[1, 2, 3], &built, &stream).unwrap();
    assert_eq!(w.as_host_slice().unwrap(), [1, 2, 3]);
}

/// Set in the child process of the IPC test (see [`run_ipc_child`]).
const IPC_CHILD: &str = "MRSTACK_IPC_CHILD";

/// What an IPC test's child process gets from its parent ([`run_ipc_child`]): two descriptors of
/// one exported pool, the allocation's length, and the bytes that name it.
pub(crate) struct IpcShare {
    pub(crate) fds: (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    pub(crate) len: usize,
    pub(crate) pointer: mrstack::leaf::IpcPointer,
}

/// The parent's side of an IPC test: exports the allocation at `ptr` (`len` bytes) of `mr` and
/// two descriptors of its pool, runs test `test` of this binary in a child process with `var` set
/// to them (`fd,fd,len,hex of the 64 bytes`: [`ipc_share`] reads it), checks that the child
/// succeeded, and returns what it printed.
///
/// # Safety
///
/// As [`CudaAsync::export_pointer`]: the allocation is complete (synchronized), its values are
/// valid for any bytes, and it stays allocated until this returns.
pub(crate) unsafe fn run_ipc_child(
    mr: &CudaAsync,
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    test: &str,
    var: &str,
) -> String {
    use std::os::fd::AsRawFd;
    // SAFETY: forwarded from the caller.
    let exported = unsafe { mr.export_pointer(ptr) }.unwrap();
    let fds = [mr.export_pool().unwrap(), mr.export_pool().unwrap()];
    for fd in &fds {
        // SAFETY: clears close-on-exec on a descriptor this test owns, so the child inherits it.
        assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) }, 0);
    }
    let hex: String = exported
        .to_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let (a, b) = (fds[0].as_raw_fd(), fds[1].as_raw_fd());
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, format!("{a},{b},{len},{hex}"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed:\n{text}");
    text
}

/// The child's side of [`run_ipc_child`]: what the parent sent in `spec`.
pub(crate) fn ipc_share(spec: &str) -> IpcShare {
    use std::os::fd::{FromRawFd, OwnedFd};
    let parts: Vec<&str> = spec.split(',').collect();
    let fd = |i: usize| {
        let raw: i32 = parts[i].parse().unwrap();
        // SAFETY: the parent left this descriptor open across exec for this process, which owns
        // it, and names each once.
        unsafe { OwnedFd::from_raw_fd(raw) }
    };
    let mut bytes = [0u8; 64];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&parts[3][2 * i..2 * i + 2], 16).unwrap();
    }
    IpcShare {
        fds: (fd(0), fd(1)),
        len: parts[2].parse().unwrap(),
        pointer: mrstack::leaf::IpcPointer::from_bytes(bytes),
    }
}

fn first_half(n: usize) -> Vec<u8> {
    (0..n / 2).map(|i| (i * 7 + 1) as u8).collect()
}

fn second_half(n: usize) -> Vec<u8> {
    (0..n / 2).map(|i| (i * 13 + 5) as u8).collect()
}

/// The child's side: import the pool and the allocation, check the first half the parent wrote,
/// write the second half.
fn ipc_child(spec: &str) {
    use mrstack::leaf::ImportedPool;
    let IpcShare {
        fds: (fd, fd2),
        len: n,
        pointer,
    } = ipc_share(spec);
    let ctx = mrstack::cuda_context(0).unwrap();
    let pool = ImportedPool::from_fd(&ctx, fd).unwrap();
    assert!(pool.is_accessible_from(&ctx).unwrap(), "its own device");
    pool.grant_access(&ctx).unwrap(); // its own device: nothing to do
    let mut mem = pool.import(&pointer).unwrap();
    assert!(mem.len() >= n, "{} < {n}", mem.len());
    assert!(
        pool.import(&pointer).is_err(),
        "a second import of one allocation is refused"
    );
    // A second import of the same pool (the driver may give it the same handle): its drop, and
    // that of anything imported through it, leave the first import's mapping readable.
    let second = ImportedPool::from_fd(&ctx, fd2).unwrap();
    match second.import(&pointer) {
        Err(e) => assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}"),
        Ok(again) => assert!(again.len() >= n),
    }
    let handle = |p: &ImportedPool| format!("{p:?}").rsplit("pool: ").next().map(str::to_owned);
    println!(
        "ipc child: two imports of one pool, one handle: {}",
        handle(&pool) == handle(&second)
    );
    drop(second);
    let mut first = vec![0u8; n / 2];
    mem.copy_to_host(0, &mut first).unwrap();
    assert_eq!(
        first,
        first_half(n),
        "the child reads what the parent wrote"
    );
    mem.copy_from_host(n / 2, &second_half(n)).unwrap();
    assert!(
        mem.copy_from_host(mem.len() - 1, &[0, 0]).is_err(),
        "past the end"
    );
    println!("ipc child: read {} bytes, wrote {}", n / 2, n / 2);
}

#[test]
fn an_exported_pool_shares_an_allocation_with_another_process() {
    if let Ok(spec) = std::env::var(IPC_CHILD) {
        return ipc_child(&spec);
    }
    let Some(ctx) = gpu() else { return };
    let stream = ctx.new_stream().unwrap();
    let options = CudaAsyncOptions {
        exportable: true,
        ..Default::default()
    };
    let mr = CudaAsync::with_options(&ctx, options).unwrap();
    assert_eq!(
        mr.describe().to_string(),
        "cuda_async(device=0, exportable=true)"
    );
    let n = 4 << 20;
    let mut host = first_half(n);
    host.resize(n, 0);
    let v = DeviceVec::<u8, _>::from_slice(&host, &mr, &stream).unwrap();
    // The allocation and the copy are done before another process may touch it.
    v.synchronize().unwrap();
    let ptr = std::ptr::NonNull::new(v.device_address() as *mut u8).unwrap();
    let test = "driver_pools::an_exported_pool_shares_an_allocation_with_another_process";
    // SAFETY: u8 values, valid for any bytes, exported after the copy completed; `v` lives until
    // the child is done.
    let text = unsafe { run_ipc_child(&mr, ptr, n, test, IPC_CHILD) };
    assert!(text.contains("ipc child: read"), "the child ran:\n{text}");
    for line in text.lines().filter(|l| l.contains("ipc child: ")) {
        println!("{line}");
    }
    let back = v.to_vec().unwrap();
    assert_eq!(&back[..n / 2], &first_half(n)[..]);
    assert_eq!(
        &back[n / 2..],
        &second_half(n)[..],
        "the parent reads what the child wrote"
    );

    // This process's own pool, imported here: refused where the driver hands back the pool's
    // own handle (dropping that import would destroy the pool under `mr`); either way `mr`
    // still serves.
    match mrstack::leaf::ImportedPool::from_fd(&ctx, mr.export_pool().unwrap()) {
        Err(e) => println!("an import of this process's own pool: {e}"),
        Ok(own) => {
            println!("an import of this process's own pool: {own:?}");
            drop(own);
        }
    }
    let again = DeviceVec::<u8, _>::from_slice(&host, &mr, &stream).unwrap();
    assert_eq!(
        again.to_vec().unwrap(),
        host,
        "the exported pool still serves"
    );

    // Not a pointer of the pool; a pool that was not made exportable.
    let other = Cuda::new(&ctx).unwrap();
    let w = DeviceVec::<u8, _>::zeroed(256, &other, &stream).unwrap();
    let wptr = std::ptr::NonNull::new(w.device_address() as *mut u8).unwrap();
    // SAFETY: refused before anything is shared.
    assert!(unsafe { mr.export_pointer(wptr) }.is_err());
    let plain = CudaAsync::new(&ctx).unwrap();
    let e = plain.export_pool().unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::Unsupported(_)), "{e}");
}
