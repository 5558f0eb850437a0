//! Host tests of type erasure: `AnyResource<P>` and `ResourceRef<'a, P>` over `System` (real bytes)
//! and `Simulated` (exact accounting), against a model in property tests.

use crate::adaptor_support::{claims, streams};
use mrstack::prelude::*;
use mrstack::property::Properties;
use mrstack::testing::Recorder;
use mrstack::{
    erased::{AnyResource, ResourceRef},
    resource::AllocErrorKind,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Arc;

const S: StreamRef = StreamRef::DEFAULT;

fn fake_stream(n: usize) -> StreamRef<'static> {
    StreamRef::simulated(n as u32)
}

/// The number a test stream was made from (0 for the default stream).
fn needs_host<R: Accessible<HostAccessible>>(_: &R) {}

#[test]
fn any_resource_over_system_gives_real_disjoint_memory() {
    let mr = AnyResource::<HostAccessible>::new(System::new());
    needs_host(&mr);
    let mut blocks = Vec::new();
    for i in 0..200usize {
        let size = 1 + (i * 37) % 3000;
        let align = 1 << (i % 10);
        let p = mr.allocate(size, align, S).unwrap();
        assert_eq!(p.as_ptr() as usize % align, 0);
        // SAFETY: host memory of `size` bytes, just allocated.
        unsafe { p.as_ptr().write_bytes(i as u8, size) };
        blocks.push((p, size, align, i as u8));
    }
    for &(p, size, align, tag) in &blocks {
        // SAFETY: live host memory of `size` bytes written above.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
        assert!(
            bytes.iter().all(|&b| b == tag),
            "block {tag} was overwritten"
        );
        // SAFETY: p came from mr with this size and align.
        unsafe { mr.deallocate(p, size, align, S) };
    }
}

#[test]
fn any_resource_over_simulated_gives_everything_back() {
    let sim = Arc::new(Simulated::new(1 << 30));
    let mr = AnyResource::<()>::from_arc(sim.clone());
    let a = mr.allocate(1000, 256, S).unwrap();
    let b = mr.allocate(5000, 4096, fake_stream(7)).unwrap();
    assert_eq!(b.as_ptr() as usize % 4096, 0);
    assert_eq!((sim.in_use(), sim.live()), (6000, 2));
    // SAFETY: a and b came from mr with these sizes, aligns and streams.
    unsafe {
        mr.deallocate(a, 1000, 256, S);
        mr.deallocate(b, 5000, 4096, fake_stream(7));
    }
    assert_eq!((sim.in_use(), sim.live(), sim.peak()), (0, 0, 6000));
    assert_eq!(mr.name(), "Simulated");
}

#[test]
fn requests_are_checked_before_the_resource_sees_them() {
    let sim = Arc::new(Simulated::new(1 << 20));
    let mr = AnyResource::<()>::from_arc(sim.clone());
    let empty = mr.allocate(0, 64, S).unwrap();
    assert_eq!(empty.as_ptr() as usize % 64, 0);
    // SAFETY: a zero-size allocation from mr; freeing it is a no-op.
    unsafe { mr.deallocate(empty, 0, 64, S) };
    assert_eq!(
        sim.allocation_count(),
        0,
        "zero-size requests never reach the resource"
    );
    assert!(matches!(
        mr.allocate(8, 3, S).unwrap_err().kind,
        AllocErrorKind::InvalidArgument(_)
    ));
    assert!(matches!(
        mr.allocate(usize::MAX - 8, 8, S).unwrap_err().kind,
        AllocErrorKind::InvalidArgument(_)
    ));
    let oom = mr.allocate(2 << 20, 8, S).unwrap_err();
    assert!(oom.is_out_of_memory());
    assert_eq!(oom.resource, "Simulated", "errors name the erased resource");
}

#[test]
fn properties_are_the_erased_resources_own() {
    let host = AnyResource::<()>::new(System::new());
    assert_eq!(
        host.properties(),
        Properties {
            host: true,
            device: false,
            migratable: false,
            alignment: 16,
            pageable: true
        }
    );
    assert_eq!(host.properties().to_string(), "HostAccessible + Pageable");
    let sim = AnyResource::<()>::new(Simulated::new(1));
    assert_eq!(sim.properties().to_string(), "no access property");
    assert_eq!(sim.properties().alignment, 256);
    assert_eq!(
        mrstack::property::alignment_of::<AnyResource<HostAccessible>>(),
        16,
        "erasure claims 16 bytes (it asks for them); properties() keeps the real value"
    );
}

#[test]
fn try_new_and_try_cast_check_at_run_time() {
    // System lacks DeviceAccessible: the resource comes back.
    let back: System = AnyResource::<DeviceAccessible>::try_new(System::new()).unwrap_err();
    assert_eq!(back, System::new());
    let any = AnyResource::<()>::try_new(System::new()).unwrap();

    // Casting checks what the erased resource gives, not what `()` promised.
    let host: AnyResource<HostAccessible> = any.clone().try_cast().unwrap();
    needs_host(&host);
    let still = any.clone().try_cast::<DeviceAccessible>().unwrap_err();
    assert!(
        still.ptr_eq(&any),
        "a failed cast gives the same handle back"
    );
    assert!(host.try_cast::<(HostAccessible, Migratable)>().is_err());
}

#[test]
fn forget_drops_properties_at_compile_time() {
    let both = AnyResource::<HostAccessible>::new(System::new());
    let none: AnyResource<()> = both.clone().forget();
    assert!(none.ptr_eq(&both.clone().forget()));
    let r: ResourceRef<'_, ()> = both.as_resource_ref().forget();
    assert_eq!(r.name(), "System");
}

#[test]
fn clones_share_one_resource() {
    let sim = Arc::new(Simulated::new(1 << 20));
    let a = AnyResource::<()>::from_arc(sim.clone());
    let b = a.clone();
    assert!(a.ptr_eq(&b));
    assert!(!a.ptr_eq(&AnyResource::<()>::new(Simulated::new(1))));
    let p = a.allocate(512, 8, S).unwrap();
    // SAFETY: b is the same resource as a, which gave p with this size and align.
    unsafe { b.deallocate(p, 512, 8, S) };
    assert_eq!(sim.in_use(), 0);
    drop(a);
    drop(b);
    assert_eq!(
        Arc::strong_count(&sim),
        1,
        "the last handle drops the resource"
    );
}

#[test]
fn downcast_reaches_the_concrete_resource() {
    let any = AnyResource::<()>::new(Simulated::new(4096));
    let p = any.allocate(100, 1, S).unwrap();
    let sim: &Simulated = any.downcast_ref().unwrap();
    assert_eq!(sim.in_use(), 100);
    assert!(any.downcast_ref::<System>().is_none());
    // SAFETY: p came from any with this size and align.
    unsafe { any.deallocate(p, 100, 1, S) };
    assert!(format!("{any:?}").contains("Simulated"));
}

#[test]
fn every_call_is_forwarded() {
    let rec = Arc::new(Recorder::new(System::new()));
    let any = AnyResource::<HostAccessible>::from_arc(rec.clone());
    let r = ResourceRef::<HostAccessible>::new(&*rec);
    any.synchronize(fake_stream(3)).unwrap();
    r.synchronize(fake_stream(3)).unwrap();
    any.order_after(fake_stream(1), fake_stream(2)).unwrap();
    let last_order = || rec.record().ordered().last().copied();
    assert_eq!(
        last_order(),
        Some((fake_stream(1).id(), fake_stream(2).id()))
    );
    r.order_after(fake_stream(4), fake_stream(5)).unwrap();
    assert_eq!(
        last_order(),
        Some((fake_stream(4).id(), fake_stream(5).id()))
    );
    let p = any.allocate_sync(64, 8).unwrap();
    // SAFETY: p came from any with this size and align.
    unsafe { any.deallocate_sync(p, 64, 8) };
    assert_eq!(rec.record().synchronized().len(), 4);
    assert_eq!(rec.record().ordered().len(), 2);
    assert_eq!((any.name(), r.name()), ("Recorder", "Recorder"));
}

#[test]
fn resource_ref_is_copy_and_crosses_threads() {
    let system = System::new();
    let r = ResourceRef::<HostAccessible>::new(&system);
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            scope.spawn(move || {
                for i in 0..100usize {
                    let size = 8 + i;
                    let p = r.allocate(size, 8, S).unwrap();
                    // SAFETY: host memory of `size` bytes, just allocated.
                    unsafe { p.as_ptr().write_bytes(t, size) };
                    // SAFETY: as above; read back what this thread wrote.
                    assert!(unsafe { std::slice::from_raw_parts(p.as_ptr(), size) }
                        .iter()
                        .all(|&b| b == t));
                    // SAFETY: p came from r with this size and align.
                    unsafe { r.deallocate(p, size, 8, S) };
                }
            });
        }
    });
    assert_eq!(r.properties().alignment, 16);
}

#[test]
fn an_any_resource_can_sit_under_another_and_in_containers() {
    // An erased stack is a resource like any other: erase it again, borrow it, name container
    // types over it.
    let inner = AnyResource::<HostAccessible>::new(System::new());
    let outer = AnyResource::<HostAccessible>::new(inner.clone());
    crate::support::serve_one(&outer, 32, 8, S);
    fn device_vec_type<R: MemoryResource + Accessible<DeviceAccessible>>() -> &'static str {
        std::any::type_name::<DeviceVec<u32, R>>()
    }
    assert!(device_vec_type::<AnyResource<DeviceAccessible>>().contains("AnyResource"));
    assert!(device_vec_type::<ResourceRef<'static, DeviceAccessible>>().contains("ResourceRef"));
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, align_log2: u32 },
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..10_000, 0u32..13).prop_map(|(size, align_log2)| Op::Alloc { size, align_log2 }),
        any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Through erasure, live blocks never overlap, meet their alignment, and the bytes in use are
    /// exactly the model's; everything goes back.
    #[test]
    fn erased_simulated_matches_a_model(ops in proptest::collection::vec(op(), 1..200)) {
        let sim = Arc::new(Simulated::new(1 << 20));
        let mr = AnyResource::<()>::from_arc(sim.clone());
        let r = mr.as_resource_ref();
        let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Alloc { size, align_log2 } => {
                    let align = 1usize << align_log2;
                    let in_use: usize = live.values().map(|&(s, _)| s).sum();
                    match r.allocate(size, align, S) {
                        Ok(p) => {
                            let addr = p.as_ptr() as usize;
                            prop_assert_eq!(addr % align, 0);
                            if size == 0 {
                                continue;
                            }
                            if let Some((&a, &(s, _))) = live.range(..=addr).next_back() {
                                prop_assert!(a + s <= addr, "overlaps the block below");
                            }
                            if let Some((&a, _)) = live.range(addr..).next() {
                                prop_assert!(addr + size <= a, "overlaps the block above");
                            }
                            live.insert(addr, (size, align));
                        }
                        Err(e) => {
                            prop_assert!(e.is_out_of_memory());
                            prop_assert!(in_use + size > 1 << 20);
                        }
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let addr = *live.keys().nth(i % live.len()).unwrap();
                    let (size, align) = live.remove(&addr).unwrap();
                    let p = NonNull::new(addr as *mut u8).unwrap();
                    // SAFETY: a live block of mr with this size and align.
                    unsafe { mr.deallocate(p, size, align, S) };
                }
                Op::Free(_) => {}
            }
            prop_assert_eq!(sim.in_use(), live.values().map(|&(s, _)| s).sum::<usize>());
        }
        for (addr, (size, align)) in std::mem::take(&mut live) {
            // SAFETY: a live block of mr with this size and align.
            unsafe { mr.deallocate(NonNull::new(addr as *mut u8).unwrap(), size, align, S) };
        }
        prop_assert_eq!(sim.in_use(), 0);
        prop_assert_eq!(sim.live(), 0);
    }
}

#[test]
fn erased_resources_ask_for_the_alignment_they_claim() {
    /// Host memory that guarantees nothing beyond what it is asked, recording what it was asked.
    struct Asked(std::sync::Mutex<Vec<usize>>);
    // SAFETY: forwards to System, which honours every alignment it is asked for.
    unsafe impl MemoryResource for Asked {
        claims! { Host = typenum::B1, Device = typenum::B0, Migratable = typenum::B0, Pageable = typenum::B0, Alignment = typenum::U1 }
        fn allocate(
            &self,
            size: usize,
            align: usize,
            s: StreamRef,
        ) -> Result<NonNull<u8>, AllocError> {
            self.0.lock().unwrap().push(align);
            System::new().allocate(size, align, s)
        }
        unsafe fn deallocate(&self, p: NonNull<u8>, size: usize, align: usize, s: StreamRef) {
            self.0.lock().unwrap().push(align);
            // SAFETY: forwarded from the caller, with the alignment it was allocated with.
            unsafe { System::new().deallocate(p, size, align, s) }
        }
        streams!(none);
    }
    let any = AnyResource::<HostAccessible>::new(Asked(Default::default()));
    let p = any.allocate(10, 1, StreamRef::DEFAULT).unwrap();
    assert_eq!(p.as_ptr() as usize % 16, 0);
    // SAFETY: p came from any with this size and align.
    unsafe { any.deallocate(p, 10, 1, StreamRef::DEFAULT) };
    let asked: &Asked = any.downcast_ref().unwrap();
    assert_eq!(*asked.0.lock().unwrap(), [16, 16]);
}
