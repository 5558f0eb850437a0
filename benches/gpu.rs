//! GPU benchmark (no criterion: `harness = false`): the preset stacks over `Cuda` on device 0, with
//! raw `cuMemAlloc` (`Cuda`) and the driver's stream-ordered pool (`CudaAsync`) measured in the
//! same run, on two workloads (random, and ResNet-50 training). Prints one table: ns per op (a
//! warm-up pass, then the median of 5 passes on the same resource; fewer passes where one pass is
//! slow, said in the table), each stack's speed-up over `Cuda` and over `CudaAsync`, and its
//! minimum capacity over peak live bytes, searched over `Simulated` with the same stack (host-side,
//! to 0.1%); the project's traces (data/traces) join the two workloads. Then threads, and what the
//! driver's virtual memory calls cost (`VirtualMemory`'s map and unmap).
//!
//! Without a GPU it prints why and exits 0, unless `MRSTACK_REQUIRE_GPU=1`, where it exits 1. It
//! also exits 1 when any measurement failed. Plain device memory only: the random workload holds up
//! to 8 GiB live, and each stack's capacity is twice the workload's peak.
//!
//! `cargo bench --bench gpu`

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

#[path = "../tests/support/traces.rs"]
mod traces;

use mrstack::replay::rmm_log;
use mrstack::replay::{
    self, measure, min_capacity, stack, timing_capacity, StackFactory, Workload,
};
use mrstack::{leaf::Cuda, leaf::CudaAsync, leaf::Simulated, stream::StreamHandle};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Timed passes after the warm-up.
const PASSES: usize = 5;
/// Time allowed for the timed passes of one stack on one workload; a slower stack gets fewer.
const BUDGET: Duration = Duration::from_secs(20);

/// RMM 26.10 on an H100, measured apart from this benchmark (ns/op: random, ResNet-50), by stack
/// name.
const RMM: [(&str, f64, f64); 4] = [
    ("cuda-async", 1345.0, 1518.0),
    ("pool", 3480.0, 590.0),
    ("binning", 280.0, 616.0),
    ("arena", 10502.0, 1098.0),
];

fn workloads() -> Vec<Workload> {
    let mut all = vec![replay::random(&Default::default())];
    let path = traces::resnet50_path();
    match rmm_log::read(&path) {
        Ok(t) => all.push(t.workload),
        Err(e) => println!("skipping the ResNet-50 trace: {e}"),
    }
    // The project's own traces (data/traces, read from the working directory where the bench
    // runs beside a copy of the repository, else from the source tree).
    let here = std::path::Path::new("data/traces");
    let dir = if here.is_dir() {
        here.to_path_buf()
    } else {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/traces")
    };
    for name in [
        "transformer_infer.csv.gz",
        "transformer_train.csv.gz",
        "resnet50_train_pytorch.csv.gz",
    ] {
        match rmm_log::read(dir.join(name)) {
            Ok(t) => all.push(t.workload),
            Err(e) => println!("skipping {name}: {e}"),
        }
    }
    all
}

/// What the driver's virtual memory calls cost on device 0, as `VirtualMemory` makes them: one
/// page mapped (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`) and unmapped (`cuMemUnmap` +
/// `cuMemRelease`), one at a time and in runs of 16 pages with one `cuMemSetAccess` per run.
/// Prints microseconds per page, the median of 5 rounds of 64 pages.
fn page_costs(ctx: &Arc<cudarc::driver::CudaContext>) -> bool {
    use mrstack::leaf::{DevicePages, PhysicalPages};
    use std::time::Instant;
    let pages = match DevicePages::new(ctx) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("no device pages: {e}");
            return false;
        }
    };
    let page = pages.page_size();
    const N: usize = 64;
    let base = match pages.reserve(N * page) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("cannot reserve: {e}");
            return false;
        }
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut results = Vec::new();
    for run in [1usize, 16] {
        let (mut map_us, mut unmap_us) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let t = Instant::now();
            let mut handles = Vec::with_capacity(N);
            for start in (0..N).step_by(run) {
                for p in start..start + run {
                    // SAFETY: a page of the reservation above, not mapped yet.
                    handles.push(unsafe { pages.map(base + p * page, page) }.unwrap());
                }
                // SAFETY: the pages just mapped.
                unsafe { pages.enable(base + start * page, run * page) }.unwrap();
            }
            map_us.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
            let t = Instant::now();
            for (p, h) in handles.into_iter().enumerate() {
                // SAFETY: mapped just above, used by nothing.
                unsafe { pages.unmap(base + p * page, page, h) };
            }
            unmap_us.push(t.elapsed().as_secs_f64() * 1e6 / N as f64);
        }
        results.push((run, median(map_us), median(unmap_us)));
    }
    // SAFETY: reserved above with this size; everything in it was unmapped.
    unsafe { pages.unreserve(base, N * page) };
    println!();
    println!(
        "VMM page costs on device 0 (page {} KiB), µs per page, median of 5 rounds of {N} pages:",
        page >> 10
    );
    for (run, map, unmap) in results {
        println!("  runs of {run:>2} page(s): map (create + map + access) {map:.1} µs, unmap (unmap + release) {unmap:.1} µs");
    }
    true
}

/// One cell of the table.
struct Cell {
    ns_per_op: f64,
    passes: usize,
}

/// Warm-up, then up to `PASSES` timed passes within `BUDGET`, of `stack` on `w`.
fn time(
    stack: &dyn StackFactory<Cuda>,
    cuda: &Cuda,
    w: &Workload,
    streams: &[StreamHandle],
) -> Result<Cell, replay::ReplayError> {
    let capacity = timing_capacity(w);
    let mut replay = stack.replayer(cuda.clone(), capacity, w, streams.to_vec())?;
    // A first pass, cold (the stack fills from the driver), to size the run; `measure` adds its own
    // warm-up pass after it.
    let first = replay.pass()?;
    let passes = (BUDGET.as_secs_f64() / first.as_secs_f64().max(1e-9)).clamp(1.0, PASSES as f64);
    let passes = passes as usize;
    let t = measure(replay.as_mut(), passes)?;
    Ok(Cell {
        ns_per_op: t.ns_per_op,
        passes,
    })
}

fn main() {
    let ctx = match mrstack::cuda_context(0) {
        Ok(ctx) => ctx,
        Err(e) if std::env::var_os("MRSTACK_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            eprintln!("MRSTACK_REQUIRE_GPU=1 but no GPU: {e}");
            std::process::exit(1);
        }
        Err(e) => {
            println!("skipping the GPU benchmark: {e}");
            return;
        }
    };
    let cuda = match Cuda::new(&ctx) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot use device 0: {e}");
            std::process::exit(1);
        }
    };
    let workloads = workloads();

    // Stream index 0 is the default stream; more streams (none in these workloads) get their own.
    let needed = workloads
        .iter()
        .map(Workload::stream_count)
        .max()
        .unwrap_or(1);
    let streams: Vec<StreamHandle> = std::iter::once(StreamHandle::DEFAULT)
        .chain((1..needed).filter_map(|_| ctx.new_stream().ok().map(StreamHandle::from)))
        .collect();
    if streams.len() < needed {
        eprintln!("could not create {needed} streams");
        std::process::exit(1);
    }

    // The table: raw cuMemAlloc (the "upstream" preset), CudaAsync, then the suballocator stacks.
    let async_ctx = ctx.clone();
    let mut stacks: Vec<Box<dyn StackFactory<Cuda>>> = replay::stacks::<Cuda>();
    stacks.insert(
        1,
        stack("cuda-async", move |_: Cuda, _| CudaAsync::new(&async_ctx)),
    );
    let label = |name: &str| match name {
        "upstream" => "cuda (cuMemAlloc)".to_owned(),
        other => other.to_owned(),
    };

    // Minimum capacities, host-side over Simulated, for the suballocator stacks.
    let mut min_cap: HashMap<(String, usize), String> = HashMap::new();
    for s in replay::stacks::<Arc<Simulated>>().iter().skip(1) {
        for (i, w) in workloads.iter().enumerate() {
            let cell = match min_capacity(s.as_ref(), w, 0.001) {
                Ok(c) => format!("{:.3}", c.ratio),
                Err(e) => {
                    eprintln!("min capacity of {} on {}: {e}", s.name(), w.name());
                    "error".to_owned()
                }
            };
            min_cap.insert((s.name().to_owned(), i), cell);
        }
    }

    let mut failed = false;
    let mut cells: Vec<Vec<Option<Cell>>> = Vec::new();
    for s in &stacks {
        let mut row = Vec::new();
        for w in &workloads {
            eprintln!("timing {} on {} …", label(s.name()), w.name());
            match time(s.as_ref(), &cuda, w, &streams) {
                Ok(c) => row.push(Some(c)),
                Err(e) => {
                    eprintln!("{} on {}: {e}", label(s.name()), w.name());
                    failed = true;
                    row.push(None);
                }
            }
        }
        cells.push(row);
    }

    let device = ctx.name().unwrap_or_else(|_| "device 0".to_owned());
    println!();
    println!(
        "mrstack GPU benchmark on {device}: ns per op, warm-up pass then median of {PASSES} passes"
    );
    println!("speed-up = baseline ns/op / this stack's ns/op (same run); min cap = smallest capacity that completes / peak live (over Simulated, 0.1%)");
    for w in &workloads {
        println!(
            "  {}: {} ops, peak live {:.2} GiB, stack capacity {:.2} GiB",
            w.name(),
            w.ops().len(),
            w.peak_live() as f64 / (1u64 << 30) as f64,
            timing_capacity(w) as f64 / (1u64 << 30) as f64
        );
    }
    let mut header = format!("{:<18}", "stack");
    for w in &workloads {
        let n = w.name();
        header += &format!(
            " | {:>14} {:>9} {:>9} {:>7} {:>9}",
            format!("{n:.14}"),
            "vs cuda",
            "vs async",
            "min cap",
            "RMM ns/op"
        );
    }
    println!("{header}");
    println!("{}", "-".repeat(header.chars().count()));
    for (s, row) in stacks.iter().zip(&cells) {
        let mut line = format!("{:<18}", label(s.name()));
        for (i, cell) in row.iter().enumerate() {
            let base = |r: usize| cells[r][i].as_ref().map(|c| c.ns_per_op);
            let (cuda_ns, async_ns) = (base(0), base(1));
            let rmm = RMM
                .iter()
                .find(|r| r.0 == s.name())
                .map(|r| if i == 0 { r.1 } else { r.2 });
            let rmm = match (rmm, workloads[i].name()) {
                (Some(ns), "random" | "resnet50_train") => format!("{ns:.0}"),
                _ => "-".to_owned(),
            };
            let cap = min_cap
                .get(&(s.name().to_owned(), i))
                .cloned()
                .unwrap_or_else(|| "-".to_owned());
            match cell {
                Some(c) => {
                    let ratio = |b: Option<f64>| match b {
                        Some(b) => format!("{:.2}x", b / c.ns_per_op),
                        None => "-".to_owned(),
                    };
                    let ns = if c.passes < PASSES {
                        format!("{:.0} ({}p)", c.ns_per_op, c.passes)
                    } else {
                        format!("{:.0}", c.ns_per_op)
                    };
                    line += &format!(
                        " | {:>14} {:>9} {:>9} {:>7} {:>9}",
                        ns,
                        ratio(cuda_ns),
                        ratio(async_ns),
                        cap,
                        rmm
                    );
                }
                None => {
                    line += &format!(
                        " | {:>14} {:>9} {:>9} {:>7} {:>9}",
                        "error", "-", "-", cap, rmm
                    )
                }
            }
        }
        println!("{line}");
    }
    println!("(Np) after a time: only N timed passes fit the {BUDGET:?} budget. RMM ns/op: RMM 26.10 on an H100, measured apart, not in this run.");
    failed |= !threads_table(&ctx);
    failed |= !page_costs(&ctx);
    if failed {
        std::process::exit(1);
    }
}

/// Threads sharing one stack: the random workload (a different seed per thread) on 1 and on 8
/// threads at once, over `Cuda`, each stack sized to twice the threads' summed peak. Prints
/// aggregate ns/op and the 8-thread throughput as a multiple of the 1-thread one (the target
/// for Arena: >= 4x). Returns false when a measurement failed.
fn threads_table(ctx: &Arc<cudarc::driver::CudaContext>) -> bool {
    use mrstack::resource_stack;
    const THREADS: usize = 8;
    const THREAD_PASSES: usize = 11;
    let workloads: Vec<Workload> = (0..THREADS as u64)
        .map(|t| {
            replay::random(&replay::RandomConfig {
                seed: 42 + t,
                ..Default::default()
            })
        })
        .collect();
    let cap = |n: usize| 2 * workloads[..n].iter().map(|w| w.peak_live()).sum::<usize>();
    let run = |name: &str, n: usize| -> Result<f64, String> {
        let cuda = Cuda::new(ctx).map_err(|e| e.to_string())?;
        let w = &workloads[..n];
        match name {
            "arena" => {
                let mr = resource_stack![cuda, Arena { size: cap(n) }];
                replay::measure_threads(&mr, w, THREAD_PASSES)
            }
            "arena/16M" => {
                let mr = resource_stack![cuda, Arena { size: cap(n), superblock: 16 MiB }];
                replay::measure_threads(&mr, w, THREAD_PASSES)
            }
            _ => {
                let mr = resource_stack![
                    cuda,
                    Pool {
                        initial: cap(n),
                        max: cap(n)
                    }
                ];
                replay::measure_threads(&mr, w, THREAD_PASSES)
            }
        }
        .map_err(|e| e.to_string())
    };
    println!();
    println!("threads: the random workload per thread, one shared stack over Cuda, aggregate ns/op of the median of {THREAD_PASSES} passes after a warm-up");
    println!("stack      |   1 thread  {THREADS} threads   {THREADS}-thread throughput / 1-thread");
    println!("{}", "-".repeat(61));
    let mut ok = true;
    for name in ["arena", "arena/16M", "pool"] {
        eprintln!("timing {name} on 1 and {THREADS} threads …");
        match (run(name, 1), run(name, THREADS)) {
            (Ok(one), Ok(many)) => {
                println!(
                    "{name:<10} | {one:>10.1} {many:>10.1}   {:>6.2}x",
                    one / many
                )
            }
            (a, b) => {
                ok = false;
                println!("{name:<10} | error: {:?} {:?}", a.err(), b.err())
            }
        }
    }
    println!(
        "(RMM 26.10's pool with 8 threads on this workload: 58,956 ns/op aggregate, measured apart.)"
    );
    ok
}
