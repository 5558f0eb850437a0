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
//! * **held at once** (with threads): the most bytes the threads held (allocated, not yet freed)
//!   in the same passes, counted by the replay ([`Replay::count_held`](mrstack::replay::Replay::count_held)),
//!   which the upstream peak is set against: what the stack took beyond what it was asked to
//!   hold in that run;
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
//!
//! [`measure`]: mrstack::replay::measure
//! [`min_capacity`]: mrstack::replay::min_capacity
//! [`Workload::threaded_peak`]: mrstack::replay::Workload::threaded_peak

pub mod args;
mod pick;
pub mod recommend;
mod report;
mod run;
mod table;
#[cfg(test)]
mod tests;

pub use pick::select;
pub use recommend::Recommendation;
pub use report::{Report, StackReport, WorkloadSummary, NOTHING_TO_TIME};
pub use run::{
    probes_estimate, run_stack, timed_capacity, Candidate, Progress, Settings, MAX_CAPACITY_RETRIES,
};
pub use table::{SIMULATED_NS_NOTE, UPSTREAM_PEAK_NOTE};
