//! Replaying a workload through one stack: the capacity search over `Simulated`, then the
//! timing over the upstream asked for, each step's failure kept in the row.

use crate::StackReport;
use mrstack::leaf::Simulated;
use mrstack::replay::{
    measure, min_capacity, timing_capacity, Replay, ReplayError, StackFactory, Workload,
};
use mrstack::stream::StreamHandle;
use std::sync::Arc;
use std::time::Duration;

/// How to replay each stack.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Timed passes after the warm-up (at least 1); ns/op is their median.
    pub passes: usize,
    /// Relative precision of the capacity search (0.001: within 0.1% above the true minimum).
    pub precision: f64,
    /// Whether to run the capacity search at all.
    pub search_capacity: bool,
    /// Whether a many-threaded workload replays with its threads (true) or in log order on one
    /// thread.
    pub threads: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            passes: 5,
            precision: 0.001,
            search_capacity: true,
            threads: true,
        }
    }
}

/// Told of a replay's progress, to draw a progress bar. Every method defaults to nothing; `()`
/// is the progress nobody watches.
pub trait Progress {
    /// `stack` starts `phase` (`"timing"`, `"capacity search"`).
    fn phase(&self, stack: &str, phase: &str) {
        let _ = (stack, phase);
    }
    /// A replay pass (timing) or a probe (capacity search) is about to run or has run.
    fn step(&self) {}
}

impl Progress for () {}

/// A stack to replay: its factory over the upstream that the timing runs on, and the same stack
/// over `Simulated` for the capacity search (`None` where it cannot be built there: `cuda-async`).
pub struct Candidate<'a, U> {
    /// The name in the report.
    pub name: &'a str,
    /// Builds the stack timed.
    pub timing: &'a dyn StackFactory<U>,
    /// Builds the stack whose minimum capacity is searched.
    pub capacity: Option<&'a dyn StackFactory<Arc<Simulated>>>,
}

impl<'a> Candidate<'a, Arc<Simulated>> {
    /// A stack on `Simulated`, timed and searched with the same factory.
    pub fn simulated(name: &'a str, factory: &'a dyn StackFactory<Arc<Simulated>>) -> Self {
        Candidate {
            name,
            timing: factory,
            capacity: Some(factory),
        }
    }
}

impl<U> std::fmt::Debug for Candidate<'_, U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Candidate")
            .field("name", &self.name)
            .field("capacity_search", &self.capacity.is_some())
            .finish()
    }
}

/// A replay that tells `progress` of each pass.
struct Ticking<'a> {
    inner: Box<dyn Replay + 'a>,
    progress: &'a dyn Progress,
}

impl Replay for Ticking<'_> {
    fn pass(&mut self) -> Result<Duration, ReplayError> {
        let took = self.inner.pass();
        self.progress.step();
        took
    }
    fn ops(&self) -> usize {
        self.inner.ops()
    }
}

/// A factory that tells `progress` of each replay it builds: one per capacity probe.
struct Probing<'a> {
    inner: &'a dyn StackFactory<Arc<Simulated>>,
    progress: &'a dyn Progress,
}

impl StackFactory<Arc<Simulated>> for Probing<'_> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn replayer<'w>(
        &self,
        upstream: Arc<Simulated>,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        self.progress.step();
        self.inner.replayer(upstream, capacity, workload, streams)
    }
    fn threaded_replayer<'w>(
        &self,
        upstream: Arc<Simulated>,
        capacity: usize,
        workload: &'w Workload,
        streams: Vec<StreamHandle>,
    ) -> Result<Box<dyn Replay + 'w>, ReplayError> {
        self.progress.step();
        self.inner
            .threaded_replayer(upstream, capacity, workload, streams)
    }
}

/// The capacity to time a stack with, given its minimum capacity where known (found in log
/// order). Twice the most bytes the replay can hold at once, at least 1 MiB: the workload's peak
/// live bytes ([`timing_capacity`]) in log order, or with `threads` the most its threads can hold
/// in any interleaving ([`Workload::threaded_peak`]). Where the stack's minimum capacity is more
/// than the peak live bytes, that much more again in proportion (its overhead), so that every run
/// of the same log has room enough and gives the same answer. At most
/// [`MAX_SIZE`](mrstack::replay::rmm_log::MAX_SIZE), the largest allocation any resource makes.
pub fn timed_capacity(workload: &Workload, min_capacity: Option<usize>, threads: bool) -> usize {
    let peak = workload.peak_live();
    let held = if threads {
        workload.threaded_peak()
    } else {
        peak
    };
    // min_capacity × held / peak: the stack's overhead in log order, applied to what it holds.
    let with_overhead = match min_capacity {
        Some(min) if peak > 0 => {
            let scaled = min as u128 * held as u128 / peak as u128;
            usize::try_from(scaled).unwrap_or(usize::MAX)
        }
        Some(min) => min,
        None => 0,
    };
    held.max(with_overhead)
        .saturating_mul(2)
        .max(timing_capacity(workload))
        .min(mrstack::replay::rmm_log::MAX_SIZE)
}

/// How many times a threaded replay that ran out of memory is timed again, with twice the room
/// each time (so up to 16 times the first capacity).
pub const MAX_CAPACITY_RETRIES: usize = 4;

/// Replays `workload` through one stack and reports it.
///
/// Capacity first: the search runs over `Simulated`, in log order, so its answer is the same on
/// every machine and every run. Timing next: the stack is built over `upstream` with
/// [`timed_capacity`] (with threads, doubled up to [`MAX_CAPACITY_RETRIES`] times while the
/// replay runs out of memory) and replayed (with the workload's threads if `settings.threads`): a
/// warm-up pass, then `settings.passes` timed ones; `upstream_peak` is read after them, before
/// the stack is dropped. `upstream` should not bound the stack more than its capacity does (an
/// unlimited `Simulated`, a GPU). A failure in either step is kept in the report, and the other
/// step still runs.
pub fn run_stack<U: Clone>(
    candidate: &Candidate<'_, U>,
    upstream: U,
    upstream_peak: &dyn Fn() -> Option<usize>,
    workload: &Workload,
    streams: Vec<StreamHandle>,
    settings: &Settings,
    progress: &dyn Progress,
) -> StackReport {
    let mut report = StackReport {
        name: candidate.name.to_owned(),
        ns_per_op: None,
        pass_ns_per_op: Vec::new(),
        upstream_peak: None,
        held_at_once: None,
        peak_live: workload.peak_live(),
        capacity: 0,
        min_capacity: None,
        min_capacity_ratio: None,
        capacity_probes: None,
        timing_error: None,
        capacity_error: None,
    };

    if let (true, Some(stack)) = (settings.search_capacity, candidate.capacity) {
        progress.phase(candidate.name, "capacity search");
        let probing = Probing {
            inner: stack,
            progress,
        };
        match min_capacity(&probing, workload, settings.precision) {
            Ok(c) => {
                report.min_capacity = Some(c.capacity);
                report.min_capacity_ratio = Some(c.ratio);
                report.capacity_probes = Some(c.probes);
            }
            Err(e) => report.capacity_error = Some(e.to_string()),
        }
    }

    progress.phase(candidate.name, "timing");
    report.capacity = timed_capacity(workload, report.min_capacity, settings.threads);
    let time_at = |capacity: usize| {
        let (upstream, streams) = (upstream.clone(), streams.clone());
        let built = if settings.threads {
            candidate
                .timing
                .threaded_replayer(upstream, capacity, workload, streams)
        } else {
            candidate
                .timing
                .replayer(upstream, capacity, workload, streams)
        };
        built.and_then(|mut inner| {
            // With threads, what they held at once in this run, for the upstream peak to be set
            // against: the interleaving decides it.
            inner.count_held();
            let mut replay = Ticking { inner, progress };
            let timing = measure(&mut replay, settings.passes)?;
            // Read while the stack is alive: a driver pool's reservation goes with it.
            Ok((timing, upstream_peak(), replay.inner.held_peak()))
        })
    };
    let mut timed = time_at(report.capacity);
    // Threads at once may hold more than the log-order overhead says (an arena's per-thread
    // arenas take superblocks ahead, as many as the machine runs threads): out of memory with
    // threads is timed again with twice the room, up to MAX_CAPACITY_RETRIES times, so that the
    // same log completes on every run and machine; the capacity it completed at is reported.
    let mut retries = 0;
    while settings.threads
        && retries < MAX_CAPACITY_RETRIES
        && report.capacity < mrstack::replay::rmm_log::MAX_SIZE
        && matches!(&timed, Err(e) if e.is_out_of_memory())
    {
        retries += 1;
        report.capacity = report
            .capacity
            .saturating_mul(2)
            .min(mrstack::replay::rmm_log::MAX_SIZE);
        timed = time_at(report.capacity);
    }
    match timed {
        Ok((timing, peak, held)) => {
            report.ns_per_op = Some(timing.ns_per_op);
            report.pass_ns_per_op = timing.passes;
            report.upstream_peak = peak;
            report.held_at_once = held;
        }
        Err(e) => report.timing_error = Some(e.to_string()),
    }
    report
}

/// A guess of the probes a capacity search to `precision` runs, for sizing a progress bar: the
/// bisection halves the gap from 1× (or 2×) peak down to `precision`, after a probe or two.
pub fn probes_estimate(precision: f64) -> usize {
    let halvings = (1.0 / precision.clamp(1e-9, 1.0)).log2().ceil() as usize;
    halvings + 2
}
