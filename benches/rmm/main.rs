//! The mrstack side of the side-by-side benchmark with RMM: it writes the op files that
//! both libraries replay ([`ops`]), and replays one over mrstack's stacks, printing one JSON line
//! per stack. `rmm_bench.cpp` beside it is RMM's side, replaying the same files over RMM's
//! resources with the same thread and stream layout and the same timing, and
//! `scripts/gpu-bench-rmm` runs both, alternating, on a GPU machine and prints the table.
//!
//! ```text
//! rmm write-ops --out DIR [--threads 1,8,16,2,4] [--data DIR]... [--no-random] [--allocations N] [--min-ops N] [LOG]...
//! rmm run FILE [--stacks pool,binning,…] [--passes 5] [--budget-ms 2000] [--deadline UNIX_S] [--simulated]
//! rmm ceiling [--threads 1,8,16] [--kib 256]
//! ```
//!
//! `write-ops` writes, for the built-in random workload, every RMM log (`*.csv`, `*.csv.gz`) in each
//! `--data` folder and every LOG given, one op file per thread count and stream use (`8-own`: 8
//! threads each on a stream of its own; `8-one`: 8 threads on the default stream; `N-logged`: a log
//! of several threads or streams as it was recorded), and `manifest.tsv` listing them, layout by
//! layout (every workload's `1-own`, then every workload's `1-one`, …) in the order of `--threads`.
//! A log, or the random workload, of fewer than `--min-ops` ops (default 100,000) is repeated
//! until it has that many
//! ([`ops::repeat`]: each copy frees what the previous left live, so the peak stays the log's),
//! so that starting and waking threads is a small part of a pass at every thread count.
//!
//! `run` replays FILE through each stack: the stack is built with the file's capacity, one warm-up
//! pass, then as many timed passes as fit in the budget (at least 1, at most `--passes`; none
//! when the warm-up took over 2.5 budgets, whose figure then stands, marked `warmup_only`), each
//! pass timed from the moment every thread is ready until the last one finishes, plus
//! synchronizing every stream; ns/op is the median pass over all ops of all threads. Over a GPU
//! (device 0) by default; `--simulated` (or `--dry-run`) replays over `Simulated` instead, where
//! the figures are host bookkeeping only, to check a file and the harness without a GPU.
//!
//! Stacks (the same names as RMM's side, so that the table pairs them): `cuda_async` (the
//! driver's pool), `pool` (`Pool` with initial = max = capacity), `binning` (`Binning` over that
//! pool, bins of 256 B to 1 MiB: mrstack's default), `binning-rmm` (bins of 256 KiB to 4 MiB, as
//! RMM's examples build them), `arena` (`Arena` of the capacity), `binning+arena` (`Binning` over
//! the arena), and `cuda` (raw `cuMemAlloc`, only when asked for: slow). Three have no RMM
//! counterpart, and RMM's side skips them: `tlsf` (`Tlsf` with initial = max = capacity),
//! `tlsf+cache` (a `ThreadCache` of a quarter of the capacity over that `Tlsf`) and `heaps`
//! (`ThreadHeaps` of the capacity: a `Tlsf` per thread over a shared one).
//!
//! `ceiling` measures how far the host itself lets threads scale: each thread updates a table of
//! its own (`--kib` KiB, random slots), sharing nothing, and it prints one JSON line per thread
//! count with ns per update over all threads and the speedup over one thread. Work that shares
//! nothing scales no further than this on the host, whatever the allocator.
//!
//! Run alone (`cargo bench --bench rmm`, which passes `--bench`) it says that it needs a command.
//! Its format tests run in the host tests (`tests/host`, module `rmm_ops`).

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)]

mod ops;

use mrstack::prelude::*;
use mrstack::replay::rmm_log;
use mrstack::replay::{self, simulated_streams, stack, StackFactory, Workload};
use mrstack::{leaf::Cuda, leaf::CudaAsync, leaf::Simulated, stream::StreamHandle};
use ops::{Layout, OpFile, Streams};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Stacks run when `--stacks` is not given, in this order.
const DEFAULT_STACKS: [&str; 11] = [
    "paged",
    "cuda_async",
    "pool",
    "tlsf",
    "vmm",
    "tlsf+cache",
    "heaps",
    "binning",
    "binning-rmm",
    "arena",
    "binning+arena",
];
/// Thread counts when `--threads` is not given: those the targets name (1, 8, 16) first, so that a
/// run cut short by its deadline has them.
const DEFAULT_THREADS: [usize; 5] = [1, 8, 16, 2, 4];

fn usage() -> ! {
    eprintln!(
        "usage:\n  rmm write-ops --out DIR [--threads 1,8,16,2,4] [--data DIR]... [--no-random] [--allocations N] [--min-ops N] [LOG]...\n  \
         rmm run FILE [--stacks {}] [--passes 5] [--budget-ms 2000] [--deadline UNIX_SECONDS] [--simulated]\n  \
         rmm ceiling [--threads 1,8,16] [--kib 256]\n\
         (scripts/gpu-bench-rmm runs both sides on a GPU machine; see benches/rmm/main.rs)",
        DEFAULT_STACKS.join(",")
    );
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("write-ops") => write_ops(&args[1..]),
        Some("run") => run(&args[1..]),
        Some("ceiling") => ceiling(&args[1..]),
        // `cargo bench` runs every bench with `--bench`: this one needs a command.
        None | Some("--bench") => {
            eprintln!("rmm: the side-by-side benchmark with RMM needs a command (scripts/gpu-bench-rmm runs it)");
            return;
        }
        Some("-h" | "--help") => usage(),
        Some(other) => Err(format!("unknown command `{other}`")),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Takes the value of option `name` at `args[*i]`, moving past it.
fn value<'a>(args: &'a [String], i: &mut usize, name: &str) -> Result<&'a str, String> {
    *i += 1;
    args.get(*i)
        .map(String::as_str)
        .ok_or_else(|| format!("{name} needs a value"))
}

fn parse<T: std::str::FromStr>(v: &str, name: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{name}: bad value `{v}`"))
}

/// The thread counts of `--threads` (`1,8,16`), none of them 0.
fn thread_counts(v: &str) -> Result<Vec<usize>, String> {
    let counts = (v.split(','))
        .map(|t| parse::<usize>(t.trim(), "--threads"))
        .collect::<Result<Vec<_>, _>>()?;
    if counts.contains(&0) {
        return Err("--threads: 0 threads".into());
    }
    Ok(counts)
}

// ------------------------------------------------------------------------------------ write-ops

/// A workload to lay out, and the log's stream values where it came from a log.
struct Source {
    workload: Workload,
    stream_ids: Vec<u64>,
}

fn write_ops(args: &[String]) -> Result<(), String> {
    let (mut out, mut threads, mut data, mut logs) =
        (None, DEFAULT_THREADS.to_vec(), vec![], vec![]);
    let (mut random, mut allocations, mut min_ops) = (true, None, 100_000usize);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--out" => out = Some(PathBuf::from(value(args, &mut i, "--out")?)),
            "--threads" => threads = thread_counts(value(args, &mut i, "--threads")?)?,
            "--data" => data.push(PathBuf::from(value(args, &mut i, "--data")?)),
            "--no-random" => random = false,
            "--allocations" => {
                allocations = Some(parse(
                    value(args, &mut i, "--allocations")?,
                    "--allocations",
                )?)
            }
            "--min-ops" => min_ops = parse(value(args, &mut i, "--min-ops")?, "--min-ops")?,
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            log => logs.push(PathBuf::from(log)),
        }
        i += 1;
    }
    let out = out.ok_or("write-ops needs --out DIR")?;
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;

    let mut sources = Vec::new();
    if random {
        let mut config = replay::RandomConfig::default();
        if let Some(n) = allocations {
            config.allocations = n;
        }
        sources.push(Source {
            workload: ops::repeat(&replay::random(&config), min_ops)?,
            stream_ids: vec![0],
        });
    }
    let mut found_all = Vec::new();
    for dir in &data {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.to_string_lossy();
                p.is_file() && (n.ends_with(".csv") || n.ends_with(".csv.gz"))
            })
            .collect();
        found.sort();
        found_all.extend(found);
    }
    // The folders' logs first, in the order given, then the logs named.
    for path in found_all.iter().chain(&logs) {
        let t = rmm_log::read(path).map_err(|e| e.to_string())?;
        sources.push(Source {
            workload: ops::repeat(&t.workload, min_ops)?,
            stream_ids: t.stream_ids,
        });
    }

    // (layout rank, workload rank, line): the manifest lists every workload's first layout, then
    // every workload's second, …, so that a run cut short by its deadline has the first thread
    // counts of every workload rather than every thread count of the first workloads.
    let mut entries: Vec<(usize, usize, String)> = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (rank, src) in sources.iter().enumerate() {
        // Two logs of one name (a.csv and a.csv.gz, or two folders) get distinct names, which the
        // op files carry (the table tells workloads apart by name) and their file names too.
        let base = file_stem(src.workload.name());
        let mut name = base.clone();
        let mut n = 2;
        while !names.insert(name.clone()) {
            name = format!("{base}~{n}");
            n += 1;
        }
        let w = &src.workload;
        let mut files = Vec::new();
        for &t in &threads {
            for s in [Streams::Own, Streams::One] {
                let laid = ops::deal(w, &name, t, s)?;
                files.push(OpFile::new(
                    laid,
                    Layout {
                        threads: t,
                        streams: s,
                    },
                ));
            }
        }
        if w.thread_count() > 1 || w.stream_count() > 1 {
            let laid = ops::logged(w, &name, &src.stream_ids)?;
            let layout = Layout {
                threads: w.thread_count(),
                streams: Streams::Logged,
            };
            files.push(OpFile::new(laid, layout));
        }
        for (layout_rank, f) in files.iter().enumerate() {
            let file = format!("{name}.{}.ops", f.layout.label());
            let path = out.join(&file);
            let handle =
                std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            ops::write(std::io::BufWriter::new(handle), f)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let line = format!(
                "{file}\t{name}\t{}\t{}\t{}\t{}\t{}\n",
                f.layout.label(),
                f.layout.threads,
                f.layout.streams.as_str(),
                f.workload.ops().len(),
                f.capacity
            );
            entries.push((layout_rank, rank, line));
        }
        eprintln!(
            "{name}: {} ops, {} allocations, peak live {:.2} GiB, {} op files",
            w.ops().len(),
            w.allocations(),
            gib(w.peak_live()),
            files.len()
        );
    }
    entries.sort();
    let mut manifest = String::from("file\tworkload\tlayout\tthreads\tstreams\tops\tcapacity\n");
    manifest.extend(entries.into_iter().map(|(_, _, line)| line));
    let path = out.join("manifest.tsv");
    std::fs::write(&path, manifest).map_err(|e| format!("{}: {e}", path.display()))
}

/// A workload name as a file name: letters, digits, `-`, `_` and `.` kept, others `_`.
fn file_stem(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "workload".into()
    } else {
        s
    }
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

// ------------------------------------------------------------------------------------------ run

/// `mrstack replay`'s preset `name`, so that both tools measure one configuration.
fn preset<U: MemoryResource + replay::Paged + Send + Sync + 'static>(
    name: &str,
) -> Box<dyn StackFactory<U>> {
    replay::stacks::<U>()
        .into_iter()
        .find(|s| s.name() == name)
        .unwrap_or_else(|| panic!("mrstack replay has no preset {name}"))
}

/// The stacks that both libraries have, over any upstream `U`, by name, with what they are.
fn stacks<U: MemoryResource + replay::Paged + Send + Sync + 'static>(
) -> Vec<(&'static str, &'static str, Box<dyn StackFactory<U>>)> {
    vec![
        (
            "cuda",
            "the upstream itself (cuMemAlloc)",
            stack("cuda", |up: U, _| Ok(up)),
        ),
        ("pool", "Pool { initial: cap, max: cap }", preset("pool")),
        (
            "binning",
            "Pool { initial: cap, max: cap } > Binning (256 B to 1 MiB)",
            preset("binning"),
        ),
        (
            "binning-rmm",
            "Pool { initial: cap, max: cap } > Binning (256 KiB to 4 MiB)",
            stack("binning-rmm", |up: U, cap| {
                Ok(resource_stack![
                    up,
                    Pool { initial: cap, max: cap },
                    Binning { min: 256 KiB, max: 4 MiB }
                ])
            }),
        ),
        ("tlsf", "Tlsf { initial: cap, max: cap }", preset("tlsf")),
        (
            "tlsf+cache",
            "Tlsf { initial: cap, max: cap } > ThreadCache { bytes: cap / 4, max_block: cap / 4 }",
            stack("tlsf+cache", |up: U, cap| {
                Ok(resource_stack![
                    up,
                    Tlsf {
                        initial: cap,
                        max: cap
                    },
                    ThreadCache {
                        bytes: cap / 4,
                        max_block: cap / 4
                    }
                ])
            }),
        ),
        (
            "vmm",
            "VirtualMemory { max: cap, cache: cap } over the device's pages",
            preset("vmm"),
        ),
        (
            "paged",
            "PagedHeaps (default) over the device's pages",
            preset("paged"),
        ),
        ("heaps", "ThreadHeaps { max: cap }", preset("heaps")),
        ("arena", "Arena { size: cap }", preset("arena")),
        (
            "binning+arena",
            "Arena { size: cap } > Binning (256 B to 1 MiB)",
            stack("binning+arena", |up: U, cap| {
                Ok(resource_stack![
                    up,
                    Arena { size: cap },
                    Binning { min: 256 B, max: 1 MiB }
                ])
            }),
        ),
    ]
}

struct RunOptions {
    stacks: Vec<String>,
    passes: usize,
    budget: Duration,
    deadline: Option<f64>,
    simulated: bool,
}

fn run(args: &[String]) -> Result<(), String> {
    let mut file = None;
    let mut o = RunOptions {
        stacks: DEFAULT_STACKS.iter().map(|s| s.to_string()).collect(),
        passes: 5,
        budget: Duration::from_millis(2000),
        deadline: None,
        simulated: false,
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--stacks" => {
                o.stacks = value(args, &mut i, "--stacks")?
                    .split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            }
            "--passes" => o.passes = parse(value(args, &mut i, "--passes")?, "--passes")?,
            "--budget-ms" => {
                o.budget = Duration::from_millis(parse(
                    value(args, &mut i, "--budget-ms")?,
                    "--budget-ms",
                )?)
            }
            "--deadline" => {
                o.deadline = Some(parse(value(args, &mut i, "--deadline")?, "--deadline")?)
            }
            "--simulated" | "--dry-run" => o.simulated = true,
            a if a.starts_with("--") => return Err(format!("unknown option {a}")),
            f if file.is_none() => file = Some(PathBuf::from(f)),
            f => return Err(format!("one op file at a time (also given {f})")),
        }
        i += 1;
    }
    let path = file.ok_or("run needs an op file")?;
    let known: Vec<&str> = stacks::<Arc<Simulated>>()
        .iter()
        .map(|s| s.0)
        .chain(["cuda_async"])
        .collect();
    if let Some(bad) = o.stacks.iter().find(|s| !known.contains(&s.as_str())) {
        return Err(format!(
            "unknown stack `{bad}` (stacks: {})",
            known.join(", ")
        ));
    }
    let f = read_file(&path)?;
    eprintln!(
        "mrstack: {} {}: {} ops, {} thread(s), {} stream(s), capacity {:.2} GiB",
        f.workload.name(),
        f.layout.label(),
        f.workload.ops().len(),
        f.workload.thread_count(),
        f.workload.stream_count(),
        gib(f.capacity)
    );
    if o.simulated {
        run_simulated(&f, &o);
        Ok(())
    } else {
        run_cuda(&f, &o)
    }
}

fn read_file(path: &Path) -> Result<OpFile, String> {
    let handle = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    ops::read(std::io::BufReader::new(handle)).map_err(|e| format!("{}: {e}", path.display()))
}

fn run_simulated(f: &OpFile, o: &RunOptions) {
    let streams = simulated_streams(f.workload.stream_count());
    let table = stacks::<Arc<Simulated>>();
    for name in &o.stacks {
        let Some((_, what, factory)) = table.iter().find(|s| s.0 == name) else {
            // cuda_async has no simulated form.
            emit(
                f,
                name,
                "simulated",
                "",
                Err("no simulated form (a CUDA leaf)".into()),
            );
            continue;
        };
        if past(o.deadline) {
            emit(f, name, "simulated", what, Err("skipped: deadline".into()));
            continue;
        }
        let upstream = Arc::new(Simulated::new(f.capacity));
        let replay = factory
            .threaded_replayer(upstream, f.capacity, &f.workload, streams.clone())
            .map_err(|e| e.to_string());
        emit(
            f,
            name,
            "simulated",
            what,
            replay.and_then(|mut r| time(r.as_mut(), o)),
        );
    }
}

fn run_cuda(f: &OpFile, o: &RunOptions) -> Result<(), String> {
    let ctx = mrstack::cuda_context(0)
        .map_err(|e| format!("no GPU: {e} (--simulated replays over Simulated)"))?;
    let cuda = Cuda::new(&ctx).map_err(|e| format!("device 0: {e}"))?;
    // Index 0 is the default stream, every other index a stream of its own (non-blocking, as
    // RMM's side creates them).
    let mut streams = vec![StreamHandle::DEFAULT];
    for _ in 1..f.workload.stream_count() {
        streams.push(StreamHandle::from(
            ctx.new_stream()
                .map_err(|e| format!("creating a stream: {e}"))?,
        ));
    }
    let mut table = stacks::<Cuda>();
    let async_ctx = ctx.clone();
    table.push((
        "cuda_async",
        "CudaAsync (the driver's pool, release threshold: device memory)",
        stack("cuda_async", move |_: Cuda, _| CudaAsync::new(&async_ctx)),
    ));
    for name in &o.stacks {
        let (_, what, factory) = table.iter().find(|s| s.0 == name).expect("checked above");
        if past(o.deadline) {
            emit(f, name, "cuda", what, Err("skipped: deadline".into()));
            continue;
        }
        let replay = factory
            .threaded_replayer(cuda.clone(), f.capacity, &f.workload, streams.clone())
            .map_err(|e| e.to_string());
        emit(
            f,
            name,
            "cuda",
            what,
            replay.and_then(|mut r| time(r.as_mut(), o)),
        );
    }
    Ok(())
}

fn past(deadline: Option<f64>) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    deadline.is_some_and(|d| now >= d)
}

/// What one stack measured: the warm-up pass and the timed passes, in ns/op.
struct Measured {
    warmup: f64,
    passes: Vec<f64>,
    seconds: f64,
}

/// One warm-up pass, then [`ops::timed_passes`] timed passes.
fn time(r: &mut dyn replay::Replay, o: &RunOptions) -> Result<Measured, String> {
    let started = Instant::now();
    let ops = r.ops().max(1) as f64;
    let per_op = |d: Duration| d.as_nanos() as f64 / ops;
    let warm = r.pass().map_err(|e| format!("warm-up pass: {e}"))?;
    let n = ops::timed_passes(warm, o.budget, o.passes);
    let passes = (0..n)
        .map(|_| r.pass().map(per_op))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    Ok(Measured {
        warmup: per_op(warm),
        passes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Prints one JSON line: what RMM's side prints for its resources, with `"lib":"mrstack"`.
fn emit(f: &OpFile, stack: &str, upstream: &str, what: &str, result: Result<Measured, String>) {
    let mut line = format!(
        "{{\"lib\":\"mrstack\",\"workload\":{},\"layout\":\"{}\",\"threads\":{},\"streams\":\"{}\",\"stack\":{},\"what\":{},\"upstream\":\"{upstream}\",\"ops\":{},\"capacity\":{}",
        json(f.workload.name()),
        f.layout.label(),
        f.layout.threads,
        f.layout.streams.as_str(),
        json(stack),
        json(what),
        f.workload.ops().len(),
        f.capacity,
    );
    match &result {
        Ok(m) => {
            let passes: Vec<String> = m.passes.iter().map(|p| format!("{p:.2}")).collect();
            // No timed pass (a warm-up over ops::SLOW budgets): the warm-up's figure, marked.
            let (ns, warmup_only) = if m.passes.is_empty() {
                (m.warmup, true)
            } else {
                (ops::median(&m.passes), false)
            };
            line += &format!(
                ",\"ok\":true,\"ns_per_op\":{ns:.2},\"warmup_only\":{warmup_only},\"warmup_ns_per_op\":{:.2},\"passes\":[{}],\"seconds\":{:.3}}}",
                m.warmup,
                passes.join(","),
                m.seconds
            );
            eprintln!(
                "  {stack:<14} {ns:>12.1} ns/op ({} passes{})",
                m.passes.len(),
                if warmup_only {
                    ", the warm-up's figure"
                } else {
                    ""
                }
            );
        }
        Err(e) => {
            line += &format!(",\"ok\":false,\"error\":{}}}", json(e));
            eprintln!("  {stack:<14} {e}");
        }
    }
    println!("{line}");
}

/// `s` as a JSON string.
fn json(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

// ------------------------------------------------------------------------------------- ceiling

/// Updates per thread in each pass of `ceiling`.
const CEILING_UPDATES: u64 = 1 << 25;

fn ceiling(args: &[String]) -> Result<(), String> {
    let (mut threads, mut kib) = (vec![1, 8, 16], 256usize);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--threads" => threads = thread_counts(value(args, &mut i, "--threads")?)?,
            "--kib" => kib = parse(value(args, &mut i, "--kib")?, "--kib")?,
            a => return Err(format!("unknown option {a}")),
        }
        i += 1;
    }
    let slots = (kib * 1024 / 8).max(1).next_power_of_two();
    let mut one = None;
    for &n in &threads {
        // The fastest of three passes, as `run` reports the best of its rounds.
        let ns = (0..3)
            .map(|_| ceiling_pass(n, slots))
            .fold(f64::INFINITY, f64::min);
        let base = *one.get_or_insert(ns * n as f64);
        println!(
            "{{\"command\":\"ceiling\",\"threads\":{n},\"kib\":{kib},\"ns_per_update\":{ns:.3},\"speedup\":{:.2}}}",
            base / ns
        );
    }
    Ok(())
}

/// One pass: `threads` threads, each doing [`CEILING_UPDATES`] read-modify-writes at random slots
/// of a table of its own of `slots` words, all released at once; ns per update over all threads.
fn ceiling_pass(threads: usize, slots: usize) -> f64 {
    let start = std::sync::Barrier::new(threads + 1);
    let began = std::thread::scope(|scope| {
        for t in 0..threads {
            let start = &start;
            scope.spawn(move || {
                let mut table = vec![0u64; slots];
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                start.wait();
                for _ in 0..CEILING_UPDATES {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let slot = &mut table[x as usize & (slots - 1)];
                    *slot = slot.wrapping_add(x);
                }
                std::hint::black_box(&table);
            });
        }
        start.wait();
        Instant::now()
    });
    began.elapsed().as_nanos() as f64 / (CEILING_UPDATES as f64 * threads as f64)
}
