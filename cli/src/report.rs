//! The report of a replay: what was replayed, how, and a row per stack; as JSON.

use crate::Recommendation;
use mrstack::replay::rmm_log::Trace;
use mrstack::replay::Workload;
use serde::Serialize;

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
    /// The capacity the stack was timed with (pool maximum, arena size):
    /// [`timed_capacity`](crate::timed_capacity).
    pub capacity: usize,
    /// The most bytes the stack took from its upstream while timed.
    pub upstream_peak: Option<usize>,
    /// With threads, the most bytes they held at once in the same passes (allocated and not
    /// yet freed), which their interleaving decides; None in log order, where it is
    /// `peak_live`.
    pub held_at_once: Option<usize>,
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
    /// ([`timing_capacity`](mrstack::replay::timing_capacity)); a stack whose minimum capacity is
    /// more than half that gets twice its minimum.
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
