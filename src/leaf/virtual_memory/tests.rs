//! The ordering of synchronizations, maps, enables and unmaps, seen through a page source
//! that records them (the trait is sealed, so only the crate can write one).
use super::*;
use crate::leaf::pages::sealed::Sealed;
use crate::leaf::Simulated;
use crate::stream::StreamId;

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
}

impl Recording {
    fn new(capacity: usize) -> Self {
        Recording {
            sim: Simulated::with_page_size(capacity, P),
            log: Mutex::new(Vec::new()),
        }
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
    type Managed = typenum::B0;
    type Page = ();
    fn page_size(&self) -> usize {
        PhysicalPages::page_size(&self.sim)
    }
    fn capacity(&self) -> usize {
        PhysicalPages::capacity(&self.sim)
    }
    fn default_reservation(&self) -> usize {
        self.sim.default_reservation()
    }
    fn reserve(&self, size: usize) -> Result<usize> {
        self.sim.reserve(size)
    }
    unsafe fn unreserve(&self, addr: usize, size: usize) {
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.unreserve(addr, size) }
    }
    unsafe fn map(&self, addr: usize, size: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.map(addr, size) }?;
        self.push(Ev::Map(addr));
        Ok(())
    }
    unsafe fn enable(&self, addr: usize, size: usize) -> Result<()> {
        self.push(Ev::Enable(addr, size));
        Ok(())
    }
    unsafe fn unmap(&self, addr: usize, size: usize, page: ()) {
        self.push(Ev::Unmap(addr));
        // SAFETY: forwarded from the caller.
        unsafe { self.sim.unmap(addr, size, page) }
    }
    fn synchronize(&self, stream: StreamRef) -> Result<()> {
        self.push(Ev::Sync(stream.id()));
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<()> {
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

#[test]
fn a_failed_allocation_keeps_the_stream_to_wait_for() {
    // U is freed on S while S's work may still use it; a failed request on S takes S's
    // blocks (its slot goes) and gives them back: S must still be waited for before U's page
    // is unmapped.
    let rec = Recording::new(1 << 30);
    let config = VirtualMemoryConfig {
        reservation: 5 * P,
        max: 3 * P,
        cache: 1 << 40,
    };
    let vm = VirtualMemory::new(&rec, config).unwrap();
    let (d, s) = (StreamRef::DEFAULT, StreamRef::simulated(1));
    let d0 = vm.allocate(P, 256, d).unwrap();
    let _d1 = vm.allocate(P, 256, d).unwrap();
    let u = vm.allocate(P, 256, s).unwrap();
    let base = d0.as_ptr() as usize;
    assert_eq!(u.as_ptr() as usize, base + 2 * P);
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(u, P, 256, s);
        vm.deallocate(d0, P, 256, d);
    }
    assert!(vm.allocate(3 * P, 256, s).unwrap_err().is_out_of_memory());
    vm.release();
    assert!(
        synced_before_unmap(&rec.log(), base + 2 * P, s),
        "{:?}",
        rec.log()
    );
}

#[test]
fn a_failed_growth_keeps_the_stream_to_wait_for() {
    let rec = Recording::new(1 << 30);
    let config = VirtualMemoryConfig {
        reservation: 6 * P,
        max: 4 * P,
        cache: 1 << 40,
    };
    let vm = VirtualMemory::new(&rec, config).unwrap();
    let (d, s) = (StreamRef::DEFAULT, StreamRef::simulated(1));
    let d0 = vm.allocate(P, 256, d).unwrap();
    let _d2 = vm.allocate(P, 256, d).unwrap();
    let a = vm.allocate(P, 256, d).unwrap();
    let u = vm.allocate(P, 256, s).unwrap();
    let base = d0.as_ptr() as usize;
    assert_eq!(u.as_ptr() as usize, base + 3 * P);
    // SAFETY: live with these sizes.
    unsafe {
        vm.deallocate(u, P, 256, s);
        vm.deallocate(d0, P, 256, d);
    }
    let grown = {
        // SAFETY: `a` is live, owned here, freed on `s`.
        unsafe { crate::resource::GrowInPlace::grow_in_place(&vm, a, P, 256, 4 * P, s) }
    };
    assert!(grown.is_err());
    vm.release();
    assert!(
        synced_before_unmap(&rec.log(), base + 3 * P, s),
        "{:?}",
        rec.log()
    );
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
