//! `mrstack`: the command-line tool. `mrstack replay [TRACE]` replays an allocation log (RMM's CSV,
//! as the `Logging` adaptor writes it; or a PyTorch memory snapshot, the pickle of
//! `torch.cuda.memory._dump_snapshot`, told by its first byte) or the built-in random workload through the preset stacks of
//! `mrstack::replay::stacks()`, over a GPU or over `Simulated`, and prints for each stack its ns
//! per op, the peak it took from its upstream and its minimum capacity, and ends with the stack to
//! use, as a `resource_stack!` block and a text config. The work itself is in
//! `mrstack_cli` (cli/src/lib.rs); this file is the command line, the choice of upstream and the progress bar.

use cudarc::driver::CudaContext;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mrstack::replay::rmm_log::{self, OnError};
use mrstack::replay::snapshot;
use mrstack::replay::{
    random, simulated_streams, stack, Metered, RandomConfig, StackFactory, Workload,
};
use mrstack::{leaf::Cuda, leaf::CudaAsync, leaf::Simulated, stream::StreamHandle};
use mrstack_cli::args::{self, Cli, Command, OnErrorArg, ReplayArgs, UpstreamArg, CUDA_ASYNC};
use mrstack_cli::{
    self as replay, probes_estimate, run_stack, timed_capacity, Candidate, Report, Settings,
    NOTHING_TO_TIME,
};
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::{Arc, Weak};

/// Where the stacks sit.
enum Upstream {
    Simulated,
    Cuda { ctx: Arc<CudaContext> },
}

/// Reports a usage error of `replay` the way clap does (exit status 2).
fn usage_error(message: String) -> ! {
    let mut cli = args::command();
    // Building names the subcommand `mrstack replay` in the usage line the error shows.
    cli.build();
    let kind = clap::error::ErrorKind::InvalidValue;
    match cli.find_subcommand_mut("replay") {
        Some(replay) => replay.error(kind, message).exit(),
        None => cli.error(kind, message).exit(),
    }
}

fn main() -> ExitCode {
    let cli: Cli = match args::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Replay(args) => replay_command(&args),
    }
}

fn replay_command(args: &ReplayArgs) -> ExitCode {
    let settings = Settings {
        passes: args.passes as usize,
        precision: args.precision,
        search_capacity: !args.no_capacity,
        threads: !args.sequential,
    };

    // Which upstream, decided before anything slow so that a usage error comes at once.
    // Simulated opens no CUDA context, even where there is a GPU.
    let gpu = match args.upstream {
        UpstreamArg::Simulated => None,
        UpstreamArg::Auto | UpstreamArg::Cuda => Some(mrstack::cuda_context(0)),
    };
    let (upstream, device) = match (args.upstream, gpu) {
        (_, None) => (Upstream::Simulated, "chosen".to_owned()),
        (_, Some(Ok(ctx))) => {
            let device = ctx.name().unwrap_or_else(|_| "device 0".to_owned());
            (Upstream::Cuda { ctx }, device)
        }
        (UpstreamArg::Cuda, Some(Err(e))) => {
            eprintln!("error: --upstream cuda: no GPU: {e}");
            return ExitCode::FAILURE;
        }
        (_, Some(Err(e))) => (Upstream::Simulated, format!("no GPU found: {e}")),
    };
    let is_cuda = matches!(upstream, Upstream::Cuda { .. });
    if !is_cuda && args.stacks.iter().any(|s| s.trim() == CUDA_ASYNC) {
        usage_error(format!(
            "stack `{CUDA_ASYNC}` is the driver's pool and needs --upstream cuda; this run is on \
             Simulated ({device})"
        ));
    }
    let mut names: Vec<String> = mrstack::replay::stacks::<Arc<Simulated>>()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    if is_cuda {
        names.insert(1, CUDA_ASYNC.to_owned());
    }
    let available: Vec<&str> = names.iter().map(String::as_str).collect();
    let alias = if is_cuda { "cuda" } else { "simulated" };
    let chosen = replay::select(&args.stacks, &available, &[(alias, "upstream")])
        .unwrap_or_else(|e| usage_error(e));

    // The workload, parsed in full before anything is timed.
    let (workload, summary, stream_ids) = match &args.trace {
        None => {
            let mut config = RandomConfig {
                // At most MAX_RANDOM_ALLOCATIONS, which fits.
                allocations: usize::try_from(args.allocations).unwrap_or(usize::MAX),
                ..Default::default()
            };
            if let Some(seed) = args.seed {
                config.seed = seed;
            }
            let w = random(&config);
            let summary = replay::WorkloadSummary::of(&w, "built-in random workload");
            (w, summary, vec![0])
        }
        Some(path) => match read_trace(path, args) {
            Ok(t) => {
                report_skipped(&t, path);
                let summary = replay::WorkloadSummary::of_trace(&t, path.display().to_string());
                (t.workload, summary, t.stream_ids)
            }
            Err(e) => {
                eprintln!("error: {e}");
                if args.on_error == OnErrorArg::Stop && e.skippable() {
                    eprintln!("hint: --on-error skip leaves bad lines out and replays the rest");
                }
                return ExitCode::FAILURE;
            }
        },
    };
    let base_capacity = timed_capacity(&workload, None, settings.threads);
    let mut report = Report {
        workload: summary,
        upstream: if is_cuda { "cuda" } else { "simulated" }.to_owned(),
        device,
        base_capacity,
        passes: settings.passes,
        replayed_with_threads: settings.threads,
        precision: settings.precision,
        stacks: Vec::new(),
        note: None,
        recommendation: None,
        no_recommendation: None,
    };
    if workload.ops().is_empty() {
        report.note = Some(NOTHING_TO_TIME.to_owned());
        return print_report(&report, args.json);
    }

    let bar = Bar::new(args.quiet, chosen.len(), &settings);
    let stacks = match &upstream {
        Upstream::Simulated => replay_simulated(&chosen, &workload, &settings, &bar),
        Upstream::Cuda { ctx } => {
            match replay_cuda(ctx, &chosen, &workload, &stream_ids, &settings, &bar) {
                Ok(s) => s,
                Err(e) => {
                    bar.bar.finish_and_clear();
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    bar.bar.finish_and_clear();
    report.stacks = stacks;
    report.recommend(&workload);
    print_report(&report, args.json)
}

/// Prints `report` (as JSON with `json`) and says how it went: the exit status.
fn print_report(report: &Report, json: bool) -> ExitCode {
    let text = if json {
        report.to_json() + "\n"
    } else {
        report.table()
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        // A reader that closed the pipe early (`| head`) wanted no more.
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: writing the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if report.failed() {
        let failed = report.stacks.iter().filter(|s| s.failed()).count();
        eprintln!("error: {failed} of {} stacks failed", report.stacks.len());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Why a trace could not be read: a log's error, or a snapshot's.
enum ReadError {
    Log(rmm_log::TraceError),
    Snapshot(snapshot::SnapshotError),
}

impl ReadError {
    /// Whether `--on-error skip` would have gone on past it (a log's bad line).
    fn skippable(&self) -> bool {
        matches!(self, ReadError::Log(e) if e.skippable)
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Log(e) => e.fmt(f),
            ReadError::Snapshot(e) => e.fmt(f),
        }
    }
}

impl From<rmm_log::TraceError> for ReadError {
    fn from(e: rmm_log::TraceError) -> Self {
        ReadError::Log(e)
    }
}

/// Reads the trace at `path`: a PyTorch memory snapshot when it is a pickle (plain or
/// gzip-compressed, told by its first byte), else an RMM log.
fn read_trace(path: &std::path::Path, args: &ReplayArgs) -> Result<rmm_log::Trace, ReadError> {
    // A file that cannot be opened or read is the log reader's to report.
    if snapshot::is_pickle_file(path).unwrap_or(false) {
        let s = snapshot::read(path, None).map_err(ReadError::Snapshot)?;
        report_snapshot(&s, path);
        return Ok(s.trace);
    }
    Ok(read_log(path, args)?)
}

/// Says on standard error what of a snapshot the replay uses, and what it leaves out.
fn report_snapshot(s: &snapshot::Snapshot, path: &std::path::Path) {
    let mut note = format!(
        "note: {}: PyTorch memory snapshot, device {}",
        path.display(),
        s.device
    );
    if s.devices.len() > 1 {
        note += &format!(
            " (of the devices with a history, {:?}: the most allocations)",
            s.devices
        );
    }
    eprintln!("{note}");
    if s.older_frees > 0 {
        eprintln!(
            "note: {} free{} of blocks allocated before the recorded history began left out",
            s.older_frees,
            if s.older_frees == 1 { "" } else { "s" }
        );
    }
    if let Some(peak) = s.reserved_peak {
        eprintln!(
            "note: PyTorch's caching allocator held at most {peak} bytes ({}) from the driver \
             during the recorded history",
            mrstack::units::Bytes::from(peak)
        );
    }
}

/// Reads the log at `path` with a progress bar over its bytes.
fn read_log(
    path: &std::path::Path,
    args: &ReplayArgs,
) -> Result<rmm_log::Trace, rmm_log::TraceError> {
    let on_error = match args.on_error {
        OnErrorArg::Stop => OnError::Stop,
        OnErrorArg::Skip => OnError::Skip,
    };
    let file = rmm_log::open(path)?;
    let size = file.metadata().map_or(0, |m| m.len());
    let bar = ProgressBar::with_draw_target(Some(size), draw_target(args.quiet)).with_style(
        ProgressStyle::with_template(
            "[{elapsed_precise}] {wide_bar} reading {msg}: {binary_bytes}/{binary_total_bytes}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(rmm_log::workload_name(path));
    let parsed = rmm_log::read_from(bar.wrap_read(file), rmm_log::workload_name(path), on_error);
    bar.finish_and_clear();
    parsed.map_err(|e| rmm_log::TraceError {
        path: Some(path.to_owned()),
        ..e
    })
}

/// Warns of the lines `--on-error skip` left out.
fn report_skipped(t: &rmm_log::Trace, path: &std::path::Path) {
    if t.skipped_lines == 0 {
        return;
    }
    eprintln!(
        "warning: {}: {} bad line{} left out (--on-error skip); the replay uses the rest",
        path.display(),
        t.skipped_lines,
        if t.skipped_lines == 1 { "" } else { "s" }
    );
    const SHOWN: usize = 10;
    for s in t.skipped.iter().take(SHOWN) {
        eprintln!("  {s}");
    }
    if t.skipped_lines > SHOWN {
        eprintln!("  … and {} more", t.skipped_lines - SHOWN);
    }
}

/// Progress steps a stack takes: a warm-up and the timed passes, then the probes of the search.
fn per_stack_steps(settings: &Settings) -> usize {
    let search = if settings.search_capacity {
        probes_estimate(settings.precision)
    } else {
        0
    };
    1 + settings.passes + search
}

/// Progress bars draw on stderr, and not at all with --quiet or where stderr is not a terminal.
fn draw_target(quiet: bool) -> ProgressDrawTarget {
    if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    }
}

/// The progress bar of the replays: a step per pass and per capacity probe.
struct Bar {
    bar: ProgressBar,
    stacks: usize,
    done: Cell<usize>,
    steps_per_stack: usize,
}

impl Bar {
    fn new(quiet: bool, stacks: usize, settings: &Settings) -> Self {
        let steps_per_stack = per_stack_steps(settings);
        let bar = ProgressBar::with_draw_target(
            Some((stacks * steps_per_stack) as u64),
            draw_target(quiet),
        )
        .with_style(
            ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Bar {
            bar,
            stacks,
            done: Cell::new(0),
            steps_per_stack,
        }
    }

    /// Ends a stack: the bar moves to its end, whatever the estimate of its steps was.
    fn stack_done(&self) {
        self.done.set(self.done.get() + 1);
        self.bar
            .set_position((self.done.get() * self.steps_per_stack) as u64);
    }
}

impl replay::Progress for Bar {
    fn phase(&self, stack: &str, phase: &str) {
        let n = self.done.get() + 1;
        self.bar
            .set_message(format!("{stack} ({n}/{}): {phase}", self.stacks));
    }
    fn step(&self) {
        self.bar.inc(1);
    }
}

fn replay_simulated(
    chosen: &[String],
    w: &Workload,
    settings: &Settings,
    bar: &Bar,
) -> Vec<replay::StackReport> {
    let stacks = mrstack::replay::stacks::<Arc<Simulated>>();
    let mut reports = Vec::new();
    for name in chosen {
        let Some(factory) = stacks.iter().find(|s| s.name() == name) else {
            continue;
        };
        let candidate = Candidate::simulated(name, factory.as_ref());
        // Unlimited: the stack's own capacity bounds it, as device memory would hardly.
        let sim = Arc::new(Simulated::new(usize::MAX));
        let streams = simulated_streams(w.stream_count());
        reports.push(run_stack(
            &candidate,
            sim.clone(),
            &|| Some(sim.peak()),
            w,
            streams,
            settings,
            bar,
        ));
        bar.stack_done();
    }
    reports
}

fn replay_cuda(
    ctx: &Arc<CudaContext>,
    chosen: &[String],
    w: &Workload,
    stream_ids: &[u64],
    settings: &Settings,
    bar: &Bar,
) -> Result<Vec<replay::StackReport>, String> {
    let cuda = Cuda::new(ctx).map_err(|e| format!("cannot use device 0: {e}"))?;
    // The log's default stream (0) is the default stream; each other stream gets one of its own.
    let mut streams = Vec::with_capacity(w.stream_count());
    for i in 0..w.stream_count() {
        if stream_ids.get(i).is_none_or(|&id| id == 0) {
            streams.push(StreamHandle::DEFAULT);
        } else {
            let s = ctx
                .new_stream()
                .map_err(|e| format!("creating stream {i}: {e:?}"))?;
            streams.push(StreamHandle::from(s));
        }
    }

    type Up = Arc<Metered<Cuda>>;
    let mut stacks: Vec<Box<dyn StackFactory<Up>>> = mrstack::replay::stacks::<Up>();
    // The driver pool of the `cuda-async` stack last built, to read its peak while the replay
    // holds it; weak, so that the pool still goes when its replay does.
    let pool: Rc<RefCell<Weak<CudaAsync>>> = Rc::default();
    let (async_ctx, async_pool) = (ctx.clone(), pool.clone());
    stacks.insert(
        1,
        stack(CUDA_ASYNC, move |_: Up, _| {
            let r = Arc::new(CudaAsync::new(&async_ctx)?);
            *async_pool.borrow_mut() = Arc::downgrade(&r);
            Ok(r)
        }),
    );
    let on_simulated = mrstack::replay::stacks::<Arc<Simulated>>();

    let mut reports = Vec::new();
    for name in chosen {
        let Some(factory) = stacks.iter().find(|s| s.name() == name) else {
            continue;
        };
        let candidate = Candidate {
            name,
            timing: factory.as_ref(),
            capacity: on_simulated
                .iter()
                .find(|s| s.name() == name)
                .map(|s| s.as_ref()),
        };
        let meter = Arc::new(Metered::new(cuda.clone()));
        let peak = || {
            if name == CUDA_ASYNC {
                let pool = pool.borrow().upgrade();
                pool.and_then(|p| p.reserved_high().ok())
            } else {
                Some(meter.peak())
            }
        };
        reports.push(run_stack(
            &candidate,
            meter.clone(),
            &peak,
            w,
            streams.clone(),
            settings,
            bar,
        ));
        bar.stack_done();
    }
    Ok(reports)
}
