//! What `mrstack replay` does, as a library: replay a workload through one preset stack and report
//! its speed and its memory ([`run_stack`]), pick stacks by name ([`select`]), and print the
//! [`Report`] as a table or as JSON. The binary adds the command line, the upstream (a GPU or
//! `Simulated`) and a progress bar.
//!
//! For each stack a report holds:
//!
//! * **ns/op**: a warm-up pass, then the median of timed passes on the same resource
//!   ([`measure`]); a many-threaded workload replays each thread on an OS thread of its
//!   own (up to [`MAX_REPLAY_THREADS`](mrstack::replay::MAX_REPLAY_THREADS)), and ns/op is then
//!   wall time over all ops
//!   (over `Simulated`, host bookkeeping only: the table marks the column);
//! * **upstream peak**: the most bytes the stack took from its upstream during those passes, with
//!   the stack built with a capacity (pool maximum, arena size) of [`timed_capacity`]: twice the
//!   most bytes the replay can hold at once (the peak live bytes in log order; with threads, the
//!   most they can hold in any interleaving, [`Workload::threaded_peak`]), more for a stack whose
//!   minimum capacity exceeds the peak live bytes, so that the timing measures speed rather than a
//!   squeeze and every run of the same log gives the same answer. The presets with a capacity
//!   reserve it up front, so theirs is that capacity; with threads, it is what that run's
//!   interleaving made the stack take, which can be below the log-order peak live;
//! * **peak live**: the most bytes the workload holds at once, in log order;
//! * **min capacity**: the smallest capacity with which the workload completes, found by
//!   [`min_capacity`] over `Simulated` (host-side, on any machine, in log order on one thread:
//!   the same answer every run), and its ratio to peak live.
//!
//! The report ends with the stack to use ([`Report::recommend`], [`recommend`](mod@recommend)):
//! the least footprint first, a fixed order of speed among near ties, min capacity plus
//! headroom, printed as a `resource_stack!` block and a text config.
//!
//! The library of the `mrstack-cli` package; the mrstack library itself has no CLI dependencies.
//!
//! ```
//! use mrstack_cli::{run_stack, Candidate, Settings};
//! use mrstack::replay::{self, Workload, Op};
//! use mrstack::leaf::Simulated;
//! use std::sync::Arc;
//!
//! let w = Workload::new("tiny", vec![
//!     Op::Alloc { id: 0, size: 100, stream: 0 },
//!     Op::Free { id: 0 },
//! ]).unwrap();
//! let stacks = replay::stacks::<Arc<Simulated>>();
//! let raw = Candidate::simulated("upstream", stacks[0].as_ref());
//! let sim = Arc::new(Simulated::new(1 << 20));
//! let settings = Settings { passes: 3, ..Settings::default() };
//! let report = run_stack(&raw, sim.clone(), &|| Some(sim.peak()), &w, w.default_streams(), &settings, &());
//! assert_eq!(report.upstream_peak, Some(100));
//! assert_eq!(report.min_capacity, Some(100));
//! assert_eq!(report.pass_ns_per_op.len(), 3);
//! ```

pub mod args;
pub mod recommend;
mod table;

pub use recommend::Recommendation;
pub use table::{SIMULATED_NS_NOTE, UPSTREAM_PEAK_NOTE};

use mrstack::leaf::Simulated;
use mrstack::replay::rmm_log::Trace;
use mrstack::replay::{
    measure, min_capacity, timing_capacity, Replay, ReplayError, StackFactory, Workload,
};
use mrstack::stream::StreamHandle;
use serde::Serialize;
use std::fmt::Write as _;
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

/// One stack's row of the report. Sizes are bytes; `null` in JSON where a number is missing:
/// the step failed (its error says why) or did not run (the capacity search of a stack that cannot
/// be built over `Simulated`, or with the search turned off).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StackReport {
    /// The stack's name.
    pub name: String,
    /// Median ns per op over the timed passes.
    pub ns_per_op: Option<f64>,
    /// Each timed pass, ns per op, in the order run.
    pub pass_ns_per_op: Vec<f64>,
    /// The capacity the stack was timed with (pool maximum, arena size): [`timed_capacity`].
    pub capacity: usize,
    /// The most bytes the stack took from its upstream while timed.
    pub upstream_peak: Option<usize>,
    /// The workload's peak live bytes (the same for every stack).
    pub peak_live: usize,
    /// The smallest capacity with which the workload completes (over `Simulated`).
    pub min_capacity: Option<usize>,
    /// `min_capacity / peak_live`.
    pub min_capacity_ratio: Option<f64>,
    /// Replays the capacity search ran.
    pub capacity_probes: Option<usize>,
    /// Why timing failed.
    pub timing_error: Option<String>,
    /// Why the capacity search failed.
    pub capacity_error: Option<String>,
}

impl StackReport {
    /// True when a step failed.
    pub fn failed(&self) -> bool {
        self.timing_error.is_some() || self.capacity_error.is_some()
    }
}

/// What was replayed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSummary {
    /// The workload's name (`random`, or the log's file name less `.csv`/`.gz`).
    pub name: String,
    /// Where it came from: the log's path, or `built-in random workload`.
    pub source: String,
    /// Ops in one pass.
    pub ops: usize,
    /// Allocations in one pass.
    pub allocations: usize,
    /// Threads the ops run on.
    pub threads: usize,
    /// Streams the ops use.
    pub streams: usize,
    /// The most bytes live at once, in log order.
    pub peak_live: usize,
    /// The most bytes a replay with threads can hold at once, in any interleaving of its
    /// threads ([`Workload::threaded_peak`]; `peak_live` for one thread).
    pub threaded_peak: usize,
    /// Frees on another thread than the allocation's ([`Workload::cross_thread_frees`]): where
    /// there are some, the recommendation's capacity rests on the log's order.
    pub cross_thread_frees: usize,
    /// What a capacity for the program must cover ([`Workload::capacity_peak`]).
    pub capacity_peak: usize,
    /// Allocations the log never frees (freed after each pass, untimed).
    pub unfreed: usize,
    /// `allocate failure` lines of the log (not replayed).
    pub log_failures: usize,
    /// Bad lines left out (`--on-error skip`).
    pub skipped_lines: usize,
}

impl WorkloadSummary {
    /// The summary of `workload`, from `source`.
    pub fn of(workload: &Workload, source: impl Into<String>) -> Self {
        WorkloadSummary {
            name: workload.name().to_owned(),
            source: source.into(),
            ops: workload.ops().len(),
            allocations: workload.allocations(),
            threads: workload.thread_count(),
            streams: workload.stream_count(),
            peak_live: workload.peak_live(),
            threaded_peak: workload.threaded_peak(),
            cross_thread_frees: workload.cross_thread_frees(),
            capacity_peak: workload.capacity_peak(),
            unfreed: workload.unfreed(),
            log_failures: 0,
            skipped_lines: 0,
        }
    }

    /// The summary of a parsed log, from `source`.
    pub fn of_trace(trace: &Trace, source: impl Into<String>) -> Self {
        WorkloadSummary {
            log_failures: trace.failures,
            skipped_lines: trace.skipped_lines,
            ..Self::of(&trace.workload, source)
        }
    }
}

/// What `mrstack replay` prints: the workload, how it was replayed, a row per stack.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// What was replayed.
    pub workload: WorkloadSummary,
    /// The upstream timed on: `simulated` or `cuda`.
    pub upstream: String,
    /// The device (`NVIDIA H100 80GB HBM3`), or why there is none for `simulated`.
    pub device: String,
    /// The least capacity a stack is timed with: twice the peak live bytes, at least 1 MiB
    /// ([`timing_capacity`]); a stack whose minimum capacity is more than half that gets twice its
    /// minimum.
    pub base_capacity: usize,
    /// Timed passes per stack.
    pub passes: usize,
    /// Whether a many-threaded workload replayed with its threads.
    pub replayed_with_threads: bool,
    /// Relative precision of the capacity search.
    pub precision: f64,
    /// A row per stack, in the order replayed.
    pub stacks: Vec<StackReport>,
    /// Why there are no rows, where nothing was replayed: [`NOTHING_TO_TIME`].
    pub note: Option<String>,
    /// The stack to use for this workload, as `resource_stack!` and as a text config, once
    /// [`Report::recommend`] has run and found one.
    pub recommendation: Option<Recommendation>,
    /// Why [`Report::recommend`] found no stack to recommend.
    pub no_recommendation: Option<String>,
}

/// The [`Report::note`] of a workload of no ops (a log of only a header, only failed or
/// zero-size requests, or every line left out): nothing to replay, so no stack is timed.
pub const NOTHING_TO_TIME: &str =
    "nothing to time: the workload has no allocations or frees, so no stack was replayed";

impl Report {
    /// True when any stack failed a step.
    pub fn failed(&self) -> bool {
        self.stacks.iter().any(StackReport::failed)
    }

    /// The report as pretty-printed JSON (the fields of [`Report`]).
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing it cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// Picks stacks by name from `available`, in the order asked, each once; nothing asked means all.
/// `aliases` maps other names to available ones (`cuda` for the raw upstream). An unknown name is
/// an error that lists the available names.
///
/// ```
/// use mrstack_cli::select;
/// let all = ["upstream", "pool"];
/// assert_eq!(select(&[], &all, &[]).unwrap(), ["upstream", "pool"]);
/// assert_eq!(select(&["pool".into(), "cuda".into()], &all, &[("cuda", "upstream")]).unwrap(), ["pool", "upstream"]);
/// assert!(select(&["arena".into()], &all, &[]).unwrap_err().contains("available: upstream, pool"));
/// ```
pub fn select(
    asked: &[String],
    available: &[&str],
    aliases: &[(&str, &str)],
) -> Result<Vec<String>, String> {
    if asked.is_empty() {
        return Ok(available.iter().map(|s| (*s).to_owned()).collect());
    }
    let mut chosen: Vec<String> = Vec::new();
    for name in asked {
        let name = name.trim();
        let resolved = available
            .iter()
            .find(|a| **a == name)
            .copied()
            .or_else(|| aliases.iter().find(|(a, _)| *a == name).map(|(_, to)| *to));
        match resolved {
            Some(n) if !chosen.iter().any(|c| c == n) => chosen.push(n.to_owned()),
            Some(_) => {}
            None => {
                let mut names = available.join(", ");
                for (alias, to) in aliases {
                    let _ = write!(names, ", {alias} (= {to})");
                }
                return Err(format!("unknown stack `{name}`; available: {names}"));
            }
        }
    }
    Ok(chosen)
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
        built.and_then(|inner| {
            let mut replay = Ticking { inner, progress };
            let timing = measure(&mut replay, settings.passes)?;
            // Read while the stack is alive: a driver pool's reservation goes with it.
            Ok((timing, upstream_peak()))
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
        Ok((timing, peak)) => {
            report.ns_per_op = Some(timing.ns_per_op);
            report.pass_ns_per_op = timing.passes;
            report.upstream_peak = peak;
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

#[cfg(test)]
mod tests {
    use super::*;
    use mrstack::replay;

    pub(crate) fn tiny() -> Workload {
        use mrstack::replay::Op;
        Workload::new(
            "tiny",
            vec![
                Op::Alloc {
                    id: 0,
                    size: 100,
                    stream: 0,
                },
                Op::Alloc {
                    id: 1,
                    size: 200,
                    stream: 0,
                },
                Op::Free { id: 0 },
                Op::Free { id: 1 },
            ],
        )
        .unwrap()
    }

    /// Counts what a run tells its progress.
    #[derive(Default)]
    struct Steps {
        steps: std::cell::Cell<usize>,
        phases: std::cell::RefCell<Vec<String>>,
    }

    impl Progress for Steps {
        fn phase(&self, stack: &str, phase: &str) {
            self.phases.borrow_mut().push(format!("{stack}: {phase}"));
        }
        fn step(&self) {
            self.steps.set(self.steps.get() + 1);
        }
    }

    #[test]
    fn run_stack_times_meters_and_searches() {
        let w = tiny();
        let stacks = replay::stacks::<Arc<Simulated>>();
        let raw = Candidate::simulated("upstream", stacks[0].as_ref());
        let sim = Arc::new(Simulated::new(usize::MAX));
        let settings = Settings {
            passes: 3,
            ..Settings::default()
        };
        let steps = Steps::default();
        let r = run_stack(
            &raw,
            sim.clone(),
            &|| Some(sim.peak()),
            &w,
            w.default_streams(),
            &settings,
            &steps,
        );
        assert!(!r.failed(), "{r:?}");
        assert_eq!(r.pass_ns_per_op.len(), 3);
        assert!(r.pass_ns_per_op.contains(&r.ns_per_op.unwrap()));
        assert_eq!((r.upstream_peak, r.peak_live), (Some(300), 300));
        assert_eq!(
            (r.min_capacity, r.min_capacity_ratio, r.capacity_probes),
            (Some(300), Some(1.0), Some(1))
        );
        // One probe, then a warm-up and 3 timed passes.
        assert_eq!(steps.steps.get(), 5);
        assert_eq!(
            *steps.phases.borrow(),
            ["upstream: capacity search", "upstream: timing"]
        );
        assert_eq!(r.capacity, 1 << 20);

        let no_search = Settings {
            search_capacity: false,
            ..settings
        };
        let r = run_stack(
            &raw,
            Arc::new(Simulated::new(1 << 20)),
            &|| None,
            &w,
            w.default_streams(),
            &no_search,
            &(),
        );
        assert!(!r.failed());
        assert_eq!((r.min_capacity, r.upstream_peak), (None, None));
    }

    #[test]
    fn a_threaded_replay_out_of_memory_is_timed_again_with_more_room() {
        use mrstack::replay::Op;
        // Three 1 MiB blocks live at once: above the 1 MiB floor of timing capacities.
        let alloc = |id| Op::Alloc {
            id,
            size: 1 << 20,
            stream: 0,
        };
        let ops = vec![alloc(0), alloc(1), alloc(2)];
        let frees = (0..3).map(|id| Op::Free { id });
        let w = Workload::new("three", ops.into_iter().chain(frees).collect()).unwrap();
        // A stack that needs twice what the first timing capacity gives: a quarter of the
        // capacity it is built with is all it has.
        let greedy = replay::stack("greedy", |_: Arc<Simulated>, capacity: usize| {
            Ok(Simulated::new(capacity / 4))
        });
        let candidate = Candidate::simulated("greedy", greedy.as_ref());
        let settings = Settings {
            passes: 1,
            search_capacity: false,
            threads: true,
            ..Settings::default()
        };
        let first = timed_capacity(&w, None, true);
        let sim = Arc::new(Simulated::new(usize::MAX));
        let r = run_stack(
            &candidate,
            sim,
            &|| None,
            &w,
            w.default_streams(),
            &settings,
            &(),
        );
        assert!(r.timing_error.is_none(), "{r:?}");
        assert!(
            r.capacity > first && r.capacity <= first << MAX_CAPACITY_RETRIES,
            "{r:?}"
        );
        // In log order the answer does not depend on the machine: no second try.
        let sequential = Settings {
            threads: false,
            ..settings
        };
        let sim = Arc::new(Simulated::new(usize::MAX));
        let r = run_stack(
            &candidate,
            sim,
            &|| None,
            &w,
            w.default_streams(),
            &sequential,
            &(),
        );
        assert!(
            r.timing_error
                .as_deref()
                .is_some_and(|e| e.contains("out of memory")),
            "{r:?}"
        );
        assert_eq!(r.capacity, timed_capacity(&w, None, false));
    }

    #[test]
    fn run_stack_keeps_failures_and_still_runs_the_other_step() {
        let w = tiny();
        let stacks = replay::stacks::<Arc<Simulated>>();
        let raw = Candidate::simulated("upstream", stacks[0].as_ref());
        // Too small an upstream to time on: timing fails, the search (on its own upstream) works.
        let r = run_stack(
            &raw,
            Arc::new(Simulated::new(250)),
            &|| Some(0),
            &w,
            w.default_streams(),
            &Settings::default(),
            &(),
        );
        assert!(r.failed());
        let e = r.timing_error.as_deref().unwrap();
        assert!(e.contains("op 1") && e.contains("out of memory"), "{e}");
        assert_eq!((r.ns_per_op, r.upstream_peak), (None, None));
        assert_eq!(r.min_capacity, Some(300));

        let broken = replay::stack("broken", |_: Arc<Simulated>, _| {
            Err::<Simulated, _>(mrstack::resource::AllocError::new(
                mrstack::resource::AllocErrorKind::Unsupported("test"),
                0,
                0,
                "broken",
            ))
        });
        let c = Candidate {
            name: "broken",
            timing: broken.as_ref(),
            capacity: Some(broken.as_ref()),
        };
        let r = run_stack(
            &c,
            Arc::new(Simulated::new(1 << 20)),
            &|| None,
            &w,
            w.default_streams(),
            &Settings::default(),
            &(),
        );
        assert!(r
            .timing_error
            .as_deref()
            .unwrap()
            .contains("building the stack"));
        assert!(r
            .capacity_error
            .as_deref()
            .unwrap()
            .contains("unsupported: test"));
    }

    pub(crate) fn report(stacks: Vec<StackReport>) -> Report {
        Report {
            workload: WorkloadSummary::of(&tiny(), "test"),
            upstream: "simulated".into(),
            device: "chosen".into(),
            base_capacity: 1 << 20,
            passes: 5,
            replayed_with_threads: true,
            precision: 0.001,
            stacks,
            note: None,
            recommendation: None,
            no_recommendation: None,
        }
    }

    pub(crate) fn row(name: &str) -> StackReport {
        StackReport {
            name: name.into(),
            ns_per_op: Some(12.25),
            pass_ns_per_op: vec![12.25],
            upstream_peak: Some(3 << 20),
            peak_live: 300,
            capacity: 1 << 20,
            min_capacity: Some(450),
            min_capacity_ratio: Some(1.5),
            capacity_probes: Some(9),
            timing_error: None,
            capacity_error: None,
        }
    }

    #[test]
    fn json_has_every_field() {
        let r = report(vec![row("upstream")]);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["workload"]["peak_live"], 300);
        assert_eq!(v["workload"]["threads"], 1);
        assert_eq!(v["upstream"], "simulated");
        let s = &v["stacks"][0];
        assert_eq!(s["name"], "upstream");
        assert_eq!(s["min_capacity"], 450);
        assert_eq!(s["min_capacity_ratio"], 1.5);
        assert_eq!(s["upstream_peak"], 3 << 20);
        assert!(s["timing_error"].is_null());
    }

    #[test]
    fn select_keeps_the_order_asked_and_names_what_is_available() {
        let all = ["upstream", "pool", "arena"];
        let asked = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let alias = [("cuda", "upstream")];
        assert_eq!(select(&[], &all, &alias).unwrap(), all);
        assert_eq!(
            select(
                &asked(&["arena", " pool", "arena", "cuda", "upstream"]),
                &all,
                &alias
            )
            .unwrap(),
            ["arena", "pool", "upstream"]
        );
        let e = select(&asked(&["pool", "binning"]), &all, &alias).unwrap_err();
        assert_eq!(
            e,
            "unknown stack `binning`; available: upstream, pool, arena, cuda (= upstream)"
        );
    }

    #[test]
    fn timed_capacity_leaves_room_for_the_stack() {
        let w = tiny();
        assert_eq!(timed_capacity(&w, None, true), 1 << 20);
        assert_eq!(timed_capacity(&w, Some(300), true), 1 << 20);
        assert_eq!(timed_capacity(&w, Some(3 << 20), true), 6 << 20);
        let max = mrstack::replay::rmm_log::MAX_SIZE;
        assert_eq!(timed_capacity(&w, Some(usize::MAX), true), max);
    }

    #[test]
    fn probes_estimate_grows_with_precision() {
        assert_eq!(probes_estimate(0.5), 3);
        assert_eq!(probes_estimate(0.001), 12);
        assert_eq!(probes_estimate(0.0), 32);
    }
}
