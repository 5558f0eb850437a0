//! The stack table: [`StackFactory`], the preset [`stacks`], and the capacity and streams a replay of them is given.

use super::{Metered, MeteredPages};
use super::{Replay, ReplayError, Replayer, ThreadedReplayer, Workload};
use crate::leaf::{
    Cuda, DevicePages, PagedHeaps, PagedHeapsConfig, PhysicalPages, Simulated, VirtualMemory,
    VirtualMemoryConfig,
};
use crate::resource::{AllocError, MemoryResource};
use crate::stream::{StreamHandle, StreamRef};
use crate::suballoc::{Pool, PoolConfig, Tlsf, TlsfConfig};
use std::sync::Arc;

/// A named way to build a resource stack over an upstream `U` with a capacity (pool maximum,
/// arena size; ignored by stacks without one), ready to replay a workload.
///
/// [`stack`] makes one from a closure; [`stacks`] is the table of presets that the benchmarks and
/// the replay tool iterate. A factory returns a type-erased [`Replay`], so the table holds stacks
/// of different types while each replay loop stays monomorphic: one virtual call per pass, none
/// per op.
pub trait StackFactory<U> {
    /// The stack's name in tables (`"pool"`, `"binning+pool"`).
    fn name(&self) -> &str;

    /// Builds the stack over `upstream` and a replay of `workload` through it, in op order on
    /// the calling thread ([`Replayer`]), whatever threads the workload names.
    fn replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError>;

    /// Builds the stack over `upstream` and a replay of `workload` that runs each of its threads
    /// on an OS thread of its own ([`ThreadedReplayer`]); for a one-thread workload, the same as
    /// [`replayer`](Self::replayer).
    fn threaded_replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError>;
}

struct Stack<F> {
    name: &'static str,
    factory: F,
}

impl<U, R, F> StackFactory<U> for Stack<F>
where
    F: Fn(U, usize) -> Result<R, AllocError>,
    R: MemoryResource + Sync + 'static,
{
    fn name(&self) -> &str {
        self.name
    }

    fn replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        let resource = (self.factory)(upstream, capacity).map_err(ReplayError::Build)?;
        Ok(Box::new(Replayer::new(resource, workload, streams)?))
    }

    fn threaded_replayer<'w>(
        &self,
        upstream: U,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        if workload.thread_count() == 1 {
            return self.replayer(upstream, capacity, workload, streams);
        }
        let resource = (self.factory)(upstream, capacity).map_err(ReplayError::Build)?;
        Ok(Box::new(ThreadedReplayer::new(
            resource, workload, streams,
        )?))
    }
}

/// A table entry: `factory(upstream, capacity)` builds the stack, typically with
/// `resource_stack!`. The stack must be `Sync`, so that a many-threaded log can replay through it
/// from its threads.
///
/// ```
/// use mrstack::replay::{stack, StackFactory};
/// use mrstack::leaf::Simulated;
/// use std::sync::Arc;
///
/// let raw: Box<dyn StackFactory<Arc<Simulated>>> = stack("raw", |upstream, _capacity| Ok(upstream));
/// assert_eq!(raw.name(), "raw");
/// ```
pub fn stack<U, R, F>(name: &'static str, factory: F) -> Box<dyn StackFactory<U>>
where
    F: Fn(U, usize) -> Result<R, AllocError> + 'static,
    R: MemoryResource + Sync + 'static,
{
    Box::new(Stack { name, factory })
}

/// An upstream whose physical pages the virtual-memory preset (`"vmm"`) maps: the simulated
/// device (`Arc<Simulated>`, its page model), a GPU (`Cuda`, through [`DevicePages`]), and a
/// [`Metered`] one of those (its meter counts the mapped pages).
pub trait Paged {
    /// Where the pages come from.
    type Pages: PhysicalPages + Clone + 'static;
    /// The page source of the same memory as `self`.
    fn pages(&self) -> Result<Self::Pages, AllocError>;
}

impl Paged for Arc<Simulated> {
    type Pages = Arc<Simulated>;
    fn pages(&self) -> Result<Self::Pages, AllocError> {
        Ok(self.clone())
    }
}

impl Paged for Cuda {
    type Pages = DevicePages;
    fn pages(&self) -> Result<Self::Pages, AllocError> {
        DevicePages::new(self.context())
    }
}

impl<U: Paged + Send + Sync + 'static> Paged for Arc<Metered<U>> {
    type Pages = MeteredPages<U, U::Pages>;
    fn pages(&self) -> Result<Self::Pages, AllocError> {
        Ok(MeteredPages::new(self.clone(), self.upstream().pages()?))
    }
}

/// The preset stacks over any upstream `U`, the first being the upstream itself (`"upstream"`).
/// Leaves that are not built over an upstream (`CudaAsync`) are added by their callers.
///
/// `"tlsf"` is [`Tlsf`](crate::suballoc::Tlsf) with the capacity as its reservation and maximum,
/// as `"pool"` is; `"vmm"` is [`VirtualMemory`] over the upstream's pages with the capacity as
/// its cap on mapped bytes and as its cache of free pages (emptied under pressure); `"paged"` is
/// [`PagedHeaps`] over the upstream's pages with its default configuration (no cap: the
/// upstream's capacity bounds it); `"heaps"` is
/// [`ThreadHeaps`](crate::suballoc::ThreadHeaps) with the capacity as its maximum, a heap per
/// thread that replays (one in log order).
pub fn stacks<U: MemoryResource + Paged + Send + Sync + 'static>() -> Vec<Box<dyn StackFactory<U>>>
{
    vec![
        stack("upstream", |upstream: U, _capacity| Ok(upstream)),
        stack("pool", |up: U, cap| Ok(Pool::new(up, whole(cap)))),
        stack("tlsf", |up: U, cap| {
            let PoolConfig { initial, max } = whole(cap);
            Ok(Tlsf::new(up, TlsfConfig { initial, max }))
        }),
        stack("vmm", |up: U, cap| {
            let config = VirtualMemoryConfig {
                max: cap,
                // Under pressure the cache empties first, so its size costs no capacity, and a
                // cache as large as the cap keeps a repeating working set (a training step that
                // frees and allocates gigabytes) off the map and unmap path.
                cache: cap,
                ..VirtualMemoryConfig::default()
            };
            VirtualMemory::new(up.pages()?, config)
        }),
        stack("paged", |up: U, _cap| {
            // No cap of its own: the upstream's pages bound it, and under pressure every heap
            // gives its free pages back before a request fails.
            Ok(PagedHeaps::new(up.pages()?, PagedHeapsConfig::default()))
        }),
        stack("binning", |up: U, cap| {
            Ok(crate::resource_stack![Pool::new(up, whole(cap)), Binning])
        }),
        stack("arena", |up: U, cap| {
            Ok(crate::resource_stack![up, Arena { size: cap }])
        }),
        stack("heaps", |up: U, cap| {
            Ok(crate::resource_stack![up, ThreadHeaps { max: cap }])
        }),
    ]
}

/// A pool that takes the whole capacity when it is built (where the upstream has it), and never
/// more: as `Pool { initial: cap, max: cap }` in a stack.
fn whole(capacity: usize) -> PoolConfig {
    PoolConfig {
        initial: capacity,
        max: capacity,
    }
}

/// The capacity to time a workload with: twice its peak live bytes (at least 1 MiB), room enough
/// for any sensible stack's overhead, so that a timing measures speed rather than a squeeze.
pub fn timing_capacity(workload: &Workload) -> usize {
    workload.peak_live().saturating_mul(2).max(1 << 20)
}

/// Streams for replaying a many-stream workload where no GPU is: index 0 is the default stream,
/// index `i` the simulated stream `i` ([`StreamRef::simulated`]), distinct from the others. Safe
/// for any stack: CUDA resources refuse to allocate on a simulated stream, and have nothing to wait
/// for on one.
pub fn simulated_streams(n: usize) -> Vec<StreamHandle> {
    (0..n.max(1))
        .map(|i| StreamRef::simulated(u32::try_from(i).unwrap_or(u32::MAX)).to_handle())
        .collect()
}
