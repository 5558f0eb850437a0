//! Host tests of the per-device registry: the mechanism (`DeviceRegistry`) over simulated devices,
//! threads racing set/get, and the process-wide functions on a machine without a driver.

use mrstack::prelude::*;
use mrstack::registry::{self, DeviceRegistry};
use mrstack::{adaptor::Retry, erased::AnyResource, resource::AllocErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const S: StreamRef = StreamRef::DEFAULT;

/// The simulated leaves a registry's defaults were made of, kept for inspection.
type Made = Arc<Mutex<Vec<Arc<Simulated>>>>;

/// A registry of `devices` simulated devices whose defaults are counted and kept.
fn simulated_registry(devices: usize) -> (DeviceRegistry<()>, Arc<AtomicUsize>, Made) {
    let made = Arc::new(AtomicUsize::new(0));
    let all: Made = Arc::default();
    let (m, a) = (made.clone(), all.clone());
    let reg = DeviceRegistry::new(devices, move |_| {
        m.fetch_add(1, Ordering::Relaxed);
        let sim = Arc::new(Simulated::new(1 << 30));
        a.lock().unwrap().push(sim.clone());
        Ok(AnyResource::from_arc(sim))
    })
    .unwrap();
    (reg, made, all)
}

#[test]
fn a_default_is_made_once_per_slot_on_first_use() {
    let (reg, made, _) = simulated_registry(3);
    assert_eq!(reg.devices(), 3);
    assert_eq!(
        made.load(Ordering::Relaxed),
        0,
        "nothing is made before it is needed"
    );
    let a = reg.get(1).unwrap();
    let b = reg.get(1).unwrap();
    assert!(a.ptr_eq(&b));
    assert_eq!(made.load(Ordering::Relaxed), 1);
    let c = reg.get(2).unwrap();
    assert!(!c.ptr_eq(&a), "each device has its own slot");
    assert_eq!(made.load(Ordering::Relaxed), 2);
}

#[test]
fn set_returns_the_previous_and_reset_empties_the_slot() {
    let (reg, made, _) = simulated_registry(2);
    let mine = AnyResource::<()>::new(Simulated::new(1 << 20));
    assert!(
        reg.set(0, mine.clone()).unwrap().is_none(),
        "nothing was there yet"
    );
    assert!(reg.get(0).unwrap().ptr_eq(&mine));
    assert_eq!(
        made.load(Ordering::Relaxed),
        0,
        "a set slot makes no default"
    );
    let other = AnyResource::<()>::new(Simulated::new(1 << 20));
    assert!(reg.set(0, other.clone()).unwrap().unwrap().ptr_eq(&mine));
    assert!(reg.reset(0).unwrap().unwrap().ptr_eq(&other));
    assert!(reg.reset(0).unwrap().is_none());
    let fresh = reg.get(0).unwrap();
    assert!(!fresh.ptr_eq(&other));
    assert_eq!(
        made.load(Ordering::Relaxed),
        1,
        "after a reset the default is made again"
    );
}

#[test]
fn device_ids_are_checked() {
    let (reg, _, _) = simulated_registry(2);
    for bad in [2, 3, usize::MAX] {
        let e = reg.get(bad).unwrap_err();
        assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)));
        assert!(e.to_string().contains("device id out of range"), "{e}");
        assert!(reg.set(bad, AnyResource::new(Simulated::new(1))).is_err());
        assert!(reg.reset(bad).is_err());
    }
    let none =
        DeviceRegistry::<()>::new(0, |_| unreachable!("no device to make a default for")).unwrap();
    assert!(none.get(0).is_err());
}

#[test]
fn a_failing_default_is_an_error_and_leaves_the_slot_empty() {
    let tries = Arc::new(AtomicUsize::new(0));
    let t = tries.clone();
    let reg = DeviceRegistry::<HostAccessible>::new(1, move |_| {
        if t.fetch_add(1, Ordering::Relaxed) == 0 {
            Err(AllocError::new(
                AllocErrorKind::NoDriver,
                0,
                0,
                "test default",
            ))
        } else {
            Ok(AnyResource::new(System::new()))
        }
    })
    .unwrap();
    assert_eq!(reg.get(0).unwrap_err().kind, AllocErrorKind::NoDriver);
    assert_eq!(reg.get(0).unwrap().name(), "System");
    assert_eq!(tries.load(Ordering::Relaxed), 2);
}

#[test]
fn a_replaced_resource_stays_valid_for_its_holders() {
    let (reg, _, all) = simulated_registry(1);
    let old = reg.get(0).unwrap();
    let p = old.allocate(4096, 256, S).unwrap();
    reg.set(0, AnyResource::new(Simulated::new(1 << 20)))
        .unwrap();
    // The handle keeps the old resource alive: memory from it goes back to it.
    let q = old.allocate(100, 8, S).unwrap();
    // SAFETY: p and q came from old with these sizes and aligns.
    unsafe {
        old.deallocate(p, 4096, 256, S);
        old.deallocate(q, 100, 8, S);
    }
    assert_eq!(all.lock().unwrap()[0].in_use(), 0);
}

#[test]
fn threads_racing_set_and_get() {
    const DEVICES: usize = 4;
    const THREADS: usize = 8;
    const ROUNDS: usize = 400;
    let (reg, made, defaults) = simulated_registry(DEVICES);
    let replacements: Mutex<Vec<Arc<Simulated>>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (reg, replacements) = (&reg, &replacements);
            s.spawn(move || {
                for i in 0..ROUNDS {
                    let device = (t + i) % DEVICES;
                    if (t * 7 + i) % 5 == 0 {
                        let sim = Arc::new(Simulated::new(1 << 30));
                        replacements.lock().unwrap().push(sim.clone());
                        reg.set(device, AnyResource::from_arc(sim)).unwrap();
                    } else if (t + i) % 97 == 0 {
                        reg.reset(device).unwrap();
                    } else {
                        // Whatever another thread set meanwhile, the handle got works to the end.
                        let mr = reg.get(device).unwrap();
                        let size = 256 * (1 + i % 8);
                        let p = mr.allocate(size, 256, S).unwrap();
                        std::thread::yield_now();
                        // SAFETY: p came from mr with this size and align.
                        unsafe { mr.deallocate(p, size, 256, S) };
                    }
                }
            });
        }
    });
    // Every resource that was ever current gave back everything it handed out.
    let defaults = defaults.lock().unwrap();
    let replacements = replacements.into_inner().unwrap();
    for sim in defaults.iter().chain(replacements.iter()) {
        assert_eq!((sim.in_use(), sim.live()), (0, 0));
    }
    assert_eq!(replacements.len(), THREADS * ROUNDS / 5);
    assert!(made.load(Ordering::Relaxed) >= 1);
    // Each slot still answers with one resource, shared by every get.
    for d in 0..DEVICES {
        assert!(reg.get(d).unwrap().ptr_eq(&reg.get(d).unwrap()));
    }
}

#[test]
fn the_process_wide_registry_needs_a_driver() {
    if crate::support::driver_loaded(
        "a driver is loaded here; the GPU suite (erased) covers the registry",
    ) {
        return;
    }
    crate::support::assert_no_driver(registry::per_device_resource(0).unwrap_err());
    crate::support::assert_no_driver(registry::reset_per_device_resource(0).unwrap_err());
    crate::support::assert_no_driver(registry::current_device_resource().unwrap_err());
    crate::support::assert_no_driver(registry::current_device().unwrap_err());
    crate::support::assert_no_driver(registry::reset_current_device_resource().unwrap_err());
}

/// A default that lost to a resource stored meanwhile is dropped after the slot's lock goes: its
/// drop may run the caller's code, which may get from the registry without hanging.
#[test]
fn a_default_that_loses_a_race_is_dropped_outside_the_lock() {
    static REG: std::sync::OnceLock<DeviceRegistry<()>> = std::sync::OnceLock::new();
    struct GetsOnDrop(Arc<AtomicUsize>);
    impl Drop for GetsOnDrop {
        fn drop(&mut self) {
            let got = REG.get().unwrap().get(0).unwrap();
            assert_eq!(got.name(), "Simulated");
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let dropped = Arc::new(AtomicUsize::new(0));
    let d = dropped.clone();
    let reg = DeviceRegistry::new(1, move |device| {
        // What a racing thread does: another resource goes in first.
        REG.get()
            .unwrap()
            .set(device, AnyResource::new(Simulated::new(1 << 20)))?;
        let guard = GetsOnDrop(d.clone());
        let losing = Retry::new(Simulated::new(1 << 20), move |_: &AllocError, _| {
            let _ = &guard;
            false
        });
        Ok(AnyResource::new(losing))
    })
    .unwrap();
    assert!(REG.set(reg).is_ok());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(REG.get().unwrap().get(0).map(|r| r.name())));
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("get hung: the losing default was dropped under the slot's lock");
    assert_eq!(got.unwrap(), "Simulated");
    assert_eq!(dropped.load(Ordering::Relaxed), 1);
}

/// A device count past any machine's is an error naming the bound, not a capacity panic or an
/// abort (neither `usize::MAX` nor 2^40 may panic or abort); the bound itself is made.
#[test]
fn a_registry_of_more_devices_than_any_machine_has_is_an_error() {
    for devices in [usize::MAX, 1 << 40, registry::MAX_DEVICES + 1] {
        let e = DeviceRegistry::<()>::new(devices, |_| unreachable!()).unwrap_err();
        assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");
        assert!(e.to_string().contains("MAX_DEVICES"), "{e}");
    }
    let most = DeviceRegistry::<()>::new(registry::MAX_DEVICES, |_| unreachable!()).unwrap();
    assert_eq!(most.devices(), registry::MAX_DEVICES);
}
