//! The stack `mrstack replay` recommends pastes unchanged, into `resource_stack!` and into a text
//! config.
//!
//! `data/training_step.csv` is a fixed workload (three steps of a small training loop: large
//! activations held across a step, small scratch buffers). For it the command prints the blocks in
//! `data/recommended_*.rs`, one per candidate it can be made to choose (`--stack`). Here those
//! very files are `include!`d: over the real `Cuda` leaf they compile (and run where there is a
//! GPU), and over a stand-in `Cuda` that builds `Simulated` they run on any machine. The text
//! config the command prints is built with `mrstack::config` and allocated through. The
//! recommendation rests on min capacities, never on timings, so the golden files hold on every
//! run and machine.

// Tests may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for the library).
#![allow(clippy::unwrap_used)]

use mrstack::prelude::*;
use mrstack::replay::rmm_log::{self, OnError};
use mrstack::replay::{simulated_streams, Replayer, Workload};
use serde_json::Value;
use std::error::Error;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

#[path = "../../tests/support/files.rs"]
#[allow(dead_code)] // gzip is for the other test crates
mod files;
use files::TempFile;

/// The fixed workload, carried in the test binary so that it runs where the sources are not.
const WORKLOAD: &str = include_str!("data/training_step.csv");

/// The most bytes the workload holds at once (2.50 GiB, in its second step).
const PEAK_LIVE: usize = 2_688_565_248;

/// What the command recommends for [`WORKLOAD`] with each `--stack` choice (none: all stacks):
/// the stack, its capacity as written, and the `resource_stack!` block it prints.
const GOLDEN: [(&str, &str, &str, &str); 6] = [
    (
        "",
        "paged",
        "2.8 GiB",
        include_str!("data/recommended_paged.rs"),
    ),
    (
        "tlsf",
        "tlsf",
        "2.8 GiB",
        include_str!("data/recommended_tlsf.rs"),
    ),
    (
        "arena",
        "arena",
        "2.8 GiB",
        include_str!("data/recommended_arena.rs"),
    ),
    (
        "pool,upstream",
        "pool",
        "2.8 GiB",
        include_str!("data/recommended_pool.rs"),
    ),
    (
        "binning",
        "binning",
        "3 GiB",
        include_str!("data/recommended_binning.rs"),
    ),
    (
        "vmm",
        "vmm",
        "2.8 GiB",
        include_str!("data/recommended_vmm.rs"),
    ),
];

/// The binary cargo built for these tests, or `$MRSTACK_BIN` where set (the GPU machine).
fn binary() -> PathBuf {
    std::env::var_os("MRSTACK_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_mrstack").into(), PathBuf::from)
}

/// `mrstack replay WORKLOAD` over Simulated, one timed pass, the default capacity precision.
fn replay(stacks: &str, json: bool) -> Output {
    // A file per call: the tests run at once, and each removes its own.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "{}-training_step.csv",
        CALLS.fetch_add(1, Ordering::Relaxed)
    );
    let file = TempFile::new("mrstack-recommended", &name, WORKLOAD.as_bytes());
    let mut args = vec![
        "replay",
        file.text(),
        "--upstream",
        "simulated",
        "--passes",
        "1",
        "--quiet",
    ];
    if !stacks.is_empty() {
        args.extend(["--stack", stacks]);
    }
    if json {
        args.push("--json");
    }
    let out = Command::new(binary()).args(&args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What the table printed to paste: the `resource_stack!` block (with a final newline, as the
/// files hold it), the text config, and the `recommended:` line.
struct Printed {
    block: String,
    config: String,
    headline: String,
}

fn printed(stacks: &str) -> Printed {
    let out = String::from_utf8(replay(stacks, false).stdout).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    let start = lines
        .iter()
        .position(|l| *l == "resource_stack![")
        .unwrap_or_else(|| panic!("no block in:\n{out}"));
    let end = start + lines[start..].iter().position(|l| *l == "]").unwrap();
    let config_at = lines
        .iter()
        .position(|l| *l == "as a text config (mrstack::config::build):")
        .unwrap();
    Printed {
        block: lines[start..=end].join("\n") + "\n",
        config: lines[config_at + 1].to_owned(),
        headline: lines
            .iter()
            .find(|l| l.starts_with("recommended: "))
            .unwrap()
            .to_string(),
    }
}

fn workload() -> Workload {
    rmm_log::read_from(WORKLOAD.as_bytes(), "training_step", OnError::Stop)
        .unwrap()
        .workload
}

/// Replays [`WORKLOAD`] through `mr` twice (the second pass on what the first left behind, as a
/// program's next step would), allocates and frees one block, and checks that a block past
/// `capacity` does not fit: the stack is bounded by the capacity printed, not by what is below it.
fn exercise(mr: &impl MemoryResource, capacity: usize) {
    exercise_unbounded(mr);
    let e = mr
        .allocate(capacity + (1 << 20), 256, StreamRef::DEFAULT)
        .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
}

/// Replays the workload twice and allocates and frees one block: for `paged`, which has no
/// capacity of its own to check.
fn exercise_unbounded(mr: &impl MemoryResource) {
    let w = workload();
    assert_eq!(w.peak_live(), PEAK_LIVE);
    let mut r = Replayer::new(mr, &w, simulated_streams(w.stream_count())).unwrap();
    r.pass().unwrap();
    r.pass().unwrap();
    let p = mr.allocate(1 << 20, 256, StreamRef::DEFAULT).unwrap();
    // SAFETY: p came from mr with this size and alignment, and is freed once.
    unsafe { mr.deallocate(p, 1 << 20, 256, StreamRef::DEFAULT) };
}

#[test]
fn replay_prints_the_golden_blocks() {
    for (stacks, stack, capacity, block) in GOLDEN {
        let p = printed(stacks);
        assert_eq!(p.block, block, "--stack {stacks:?}");
        assert_eq!(
            p.headline,
            format!("recommended: {stack} with capacity {capacity}")
        );
        // The JSON carries the same block and config.
        let v: Value = serde_json::from_slice(&replay(stacks, true).stdout).unwrap();
        let r = &v["recommendation"];
        assert_eq!(r["stack"], stack);
        assert_eq!(r["capacity_text"], capacity);
        assert_eq!(
            r["resource_stack"].as_str().unwrap().to_owned() + "\n",
            block
        );
        assert_eq!(r["config"], p.config.as_str());
        let bytes = mrstack::units::parse_size(capacity).unwrap();
        assert_eq!(r["capacity"].as_u64(), Some(bytes));
        // Min capacity plus 10%, rounded up to two significant digits.
        let min = r["min_capacity"].as_u64().unwrap();
        assert!(bytes >= min * 11 / 10 && bytes <= min * 12 / 10, "{r}");
    }
}

#[test]
fn the_printed_text_config_builds_and_allocates() {
    for (stacks, stack, capacity, _) in GOLDEN {
        let config = printed(stacks).config;
        let spec: mrstack::config::StackSpec = config.parse().unwrap();
        let names: Vec<&str> = spec.items.iter().map(|i| i.name.as_str()).collect();
        let expected: &[&str] = match stack {
            "binning" => &["cuda", "pool", "binning"],
            "vmm" => &["vmm"],
            "paged" => &["paged"],
            other => &["cuda", other],
        };
        assert_eq!(names, expected, "{config}");
        let bytes = usize::try_from(mrstack::units::parse_size(capacity).unwrap()).unwrap();

        // As printed, on a GPU.
        match mrstack::config::build::<DeviceAccessible>(&config) {
            Ok(mr) if stack == "paged" => exercise_unbounded(&mr),
            Ok(mr) => exercise(&mr, bytes),
            Err(e) => {
                // Without a GPU only the leaf can fail, at column 1.
                let text = e.to_string();
                assert!(text.starts_with("column 1: "), "{text}");
                require_no_gpu(&text);
            }
        }

        // The text after the leaf unchanged, over a Simulated leaf far larger than the capacity
        // (for vmm, its own fields over simulated pages).
        let on_host = match config.strip_prefix("vmm(") {
            Some(fields) => format!("vmm(simulated=1 TiB, {fields}"),
            // No capacity of its own: pages of exactly the capacity bound it.
            None if config == "paged" => format!("paged(simulated={capacity})"),
            None => {
                let rest = config.strip_prefix("cuda ").unwrap();
                format!("simulated(capacity=1 TiB) {rest}")
            }
        };
        let mr = mrstack::config::build::<()>(&on_host).unwrap();
        exercise(&mr, bytes);
    }
}

/// Stands in for `mrstack::leaf::Cuda` and `mrstack::DevicePages` so that the golden blocks run on a
/// host: `Cuda::new(&ctx)?` and `DevicePages::new(&ctx)?`, with `ctx` a number of bytes, build a
/// `Simulated` of that capacity (whose 2 MiB pages model the H100's).
mod host_leaf {
    pub(crate) struct Cuda;

    impl Cuda {
        // Named as what it stands in for, it builds another type: that is its point.
        #[allow(clippy::new_ret_no_self)]
        pub(crate) fn new(
            capacity: &usize,
        ) -> Result<mrstack::leaf::Simulated, mrstack::resource::AllocError> {
            Ok(mrstack::leaf::Simulated::new(*capacity))
        }
    }

    /// The same stand-in: both build a `Simulated` of the capacity.
    pub(crate) type DevicePages = Cuda;
}

/// Stands in for `mrstack::leaf::PagedHeaps` in the golden block: `PagedHeaps::for_context(&ctx)?`,
/// with `ctx` a number of bytes, builds heaps over a `Simulated` of that capacity.
mod host_paged {
    pub(crate) struct PagedHeaps;

    impl PagedHeaps {
        pub(crate) fn for_context(
            capacity: &usize,
        ) -> Result<
            mrstack::leaf::PagedHeaps<std::sync::Arc<mrstack::leaf::Simulated>>,
            mrstack::resource::AllocError,
        > {
            Ok(mrstack::leaf::PagedHeaps::new(
                std::sync::Arc::new(mrstack::leaf::Simulated::new(*capacity)),
                mrstack::leaf::PagedHeapsConfig::default(),
            ))
        }
    }
}

/// The golden blocks over the stand-in leaf, as they are in the files.
mod on_host {
    use super::host_leaf::{Cuda, DevicePages};
    use super::host_paged::PagedHeaps;
    use super::*;
    use mrstack::leaf::{VirtualMemory, VirtualMemoryConfig};

    /// `name(ctx)`: the block of `data/recommended_name.rs` over the stand-ins, `ctx` their
    /// capacity (named here, where the blocks' own `ctx` is written).
    macro_rules! golden {
        ($ctx:ident: $($name:ident)*) => {$(
            pub(crate) fn $name($ctx: usize) -> Result<impl MemoryResource, Box<dyn Error>> {
                Ok(include!(concat!("data/recommended_", stringify!($name), ".rs")))
            }
        )*};
    }

    golden!(ctx: arena tlsf pool binning paged vmm);
}

/// The golden blocks over the real `Cuda` leaf, written as the command says: after
/// `use mrstack::prelude::*;` and `let ctx = mrstack::cuda_context(0)?;`. That these compile is
/// the test that a user can paste them; they run where there is a GPU.
mod on_gpu {
    use mrstack::leaf::{DevicePages, VirtualMemory, VirtualMemoryConfig};
    use mrstack::prelude::*;
    use std::error::Error;

    /// `name()`: the block of `data/recommended_name.rs` after `let ctx = …`, as printed (`ctx`
    /// named here, where the blocks' own `ctx` is written).
    macro_rules! golden {
        ($ctx:ident: $($name:ident)*) => {$(
            pub(crate) fn $name() -> Result<impl MemoryResource, Box<dyn Error>> {
                let $ctx = mrstack::cuda_context(0)?;
                Ok(include!(concat!("data/recommended_", stringify!($name), ".rs")))
            }
        )*};
    }

    golden!(ctx: arena tlsf pool binning paged vmm);
}

fn capacity_of(stack: &str) -> usize {
    let (.., capacity, _) = GOLDEN.iter().find(|g| g.1 == stack).unwrap();
    usize::try_from(mrstack::units::parse_size(capacity).unwrap()).unwrap()
}

#[test]
fn the_golden_blocks_run_over_simulated() {
    // Far more below than the capacity: the block's own capacity is what bounds it.
    let below = 1 << 40;
    exercise(&on_host::arena(below).unwrap(), capacity_of("arena"));
    exercise(&on_host::tlsf(below).unwrap(), capacity_of("tlsf"));
    exercise(&on_host::pool(below).unwrap(), capacity_of("pool"));
    exercise(&on_host::binning(below).unwrap(), capacity_of("binning"));
    exercise(&on_host::vmm(below).unwrap(), capacity_of("vmm"));
    // Paged has no capacity of its own: its pages, of the capacity printed, bound it.
    let paged = capacity_of("paged");
    exercise(&on_host::paged(paged).unwrap(), paged);
    // The leaf is the stand-in's: with less below than the workload holds, the replay fails.
    let short = on_host::binning(PEAK_LIVE / 2).unwrap();
    let w = workload();
    let mut r = Replayer::new(&short, &w, simulated_streams(1)).unwrap();
    assert!(r.pass().unwrap_err().is_out_of_memory());
}

/// Fails where a GPU is required (`MRSTACK_REQUIRE_GPU=1`), else says why the GPU part is skipped.
fn require_no_gpu(why: &str) {
    assert!(
        std::env::var_os("MRSTACK_REQUIRE_GPU").is_none_or(|v| v != "1"),
        "MRSTACK_REQUIRE_GPU=1 but no GPU: {why}"
    );
    eprintln!("skipping the GPU part: {why}");
}

#[test]
fn the_golden_blocks_run_on_a_gpu() {
    let built = [
        (
            "arena",
            on_gpu::arena().map(|mr| exercise(&mr, capacity_of("arena"))),
        ),
        (
            "tlsf",
            on_gpu::tlsf().map(|mr| exercise(&mr, capacity_of("tlsf"))),
        ),
        (
            "pool",
            on_gpu::pool().map(|mr| exercise(&mr, capacity_of("pool"))),
        ),
        (
            "binning",
            on_gpu::binning().map(|mr| exercise(&mr, capacity_of("binning"))),
        ),
        (
            "vmm",
            on_gpu::vmm().map(|mr| exercise(&mr, capacity_of("vmm"))),
        ),
        ("paged", on_gpu::paged().map(|mr| exercise_unbounded(&mr))),
    ];
    for (name, result) in built {
        if let Err(e) = result {
            require_no_gpu(&format!("{name}: {e}"));
        }
    }
}
