//! Host-side benchmarks of the preset stacks over `Simulated`, on two workloads: the
//! *random* workload and the ResNet-50 training trace (`data/traces/resnet50_train.csv.gz` of the
//! repository, or `$MRSTACK_TRACES/resnet50_train.csv.gz`; skipped with a message where it cannot
//! be read).
//!
//! Before criterion runs, a table is printed, computed outside criterion's timing: for each stack
//! and workload, ns per op in steady state (a warm-up pass, then the median of 5 passes on the same
//! resource) and the minimum capacity (`replay::min_capacity`, to 0.1%) over peak live bytes.
//! Then criterion times each stack × workload, one criterion iteration being one op, so the times
//! it reports are ns per op. `Simulated` itself costs a mutex and a hash map per call: the raw
//! upstream row is the floor under every stack here, not a GPU number.
//!
//! `cargo bench --bench suballocators` (add `-- random` to run one workload).

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used, missing_docs)] // criterion's macros make undocumented pub fns

use criterion::{criterion_group, criterion_main, Criterion};
#[path = "../tests/support/traces.rs"]
mod traces;

use mrstack::leaf::Simulated;
use mrstack::replay::rmm_log;
use mrstack::replay::{self, measure, min_capacity, timing_capacity, Replay, Workload};
use std::sync::Arc;
use std::time::Duration;

/// The random workload, and the ResNet-50 trace of `data/traces/`.
fn workloads() -> Vec<Workload> {
    let mut all = vec![replay::random(&Default::default())];
    let path = traces::resnet50_path();
    if path.exists() {
        match rmm_log::read(&path) {
            Ok(t) => all.push(t.workload),
            Err(e) => eprintln!("skipping the ResNet-50 trace: {e}"),
        }
    } else {
        eprintln!("skipping the ResNet-50 trace: {} not found", path.display());
    }
    all
}

/// Builds `stack` over a roomy `Simulated` for timing `w`.
fn replayer<'w>(
    stack: &dyn replay::StackFactory<Arc<Simulated>>,
    w: &'w Workload,
) -> Result<Box<dyn Replay + 'w>, replay::ReplayError> {
    let capacity = timing_capacity(w);
    stack.replayer(
        Arc::new(Simulated::new(capacity)),
        capacity,
        w,
        w.default_streams(),
    )
}

fn print_table(workloads: &[Workload]) {
    println!();
    println!("mrstack stacks over Simulated (host bookkeeping only; no GPU memory)");
    println!("ns/op: warm-up pass, then median of 5 passes; min capacity: smallest capacity that completes (0.1%) / peak live");
    println!(
        "{:<16} {:<16} {:>8} {:>11} {:>13} {:>15}",
        "stack", "workload", "ops", "ns/op", "min capacity", "peak live (B)"
    );
    for stack in replay::stacks::<Arc<Simulated>>() {
        for w in workloads {
            let timing = replayer(stack.as_ref(), w).and_then(|mut r| measure(r.as_mut(), 5));
            let ns = match &timing {
                Ok(t) => format!("{:.1}", t.ns_per_op),
                Err(e) => format!("error: {e}"),
            };
            let cap = match min_capacity(stack.as_ref(), w, 0.001) {
                Ok(c) => format!("{:.4}", c.ratio),
                Err(e) => format!("error: {e}"),
            };
            println!(
                "{:<16} {:<16} {:>8} {:>11} {:>13} {:>15}",
                stack.name(),
                w.name(),
                w.ops().len(),
                ns,
                cap,
                w.peak_live()
            );
        }
    }
    println!();
}

/// Runs enough whole passes to cover `iters` ops and returns the time of `iters` ops at the rate
/// measured.
fn time_ops(replay: &mut dyn Replay, iters: u64, what: &str) -> Duration {
    let ops = replay.ops().max(1) as u64;
    let passes = iters.div_ceil(ops).max(1);
    let mut total = Duration::ZERO;
    for _ in 0..passes {
        total += replay
            .pass()
            .unwrap_or_else(|e| panic!("{what} failed: {e}"));
    }
    let nanos = total.as_nanos() * u128::from(iters) / u128::from(passes * ops);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

fn bench(c: &mut Criterion) {
    let workloads = workloads();
    print_table(&workloads);
    for w in &workloads {
        let mut group = c.benchmark_group(format!("{}/per-op", w.name()));
        for stack in replay::stacks::<Arc<Simulated>>() {
            let what = format!("{} on {}", stack.name(), w.name());
            let mut replay = match replayer(stack.as_ref(), w) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("skipping {what}: {e}");
                    continue;
                }
            };
            group.bench_function(stack.name(), |b| {
                b.iter_custom(|iters| time_ops(replay.as_mut(), iters, &what))
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
