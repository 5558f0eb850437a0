//! The library's tests, and the workload and report rows the other modules' tests share.

use super::*;
use mrstack::leaf::Simulated;
use mrstack::replay::{self, Workload};
use std::sync::Arc;

pub(crate) fn tiny() -> Workload {
    use mrstack::replay::Op;
    let alloc = |id, size| Op::Alloc {
        id,
        size,
        stream: 0,
    };
    Workload::new(
        "tiny",
        vec![
            alloc(0, 100),
            alloc(1, 200),
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

/// [`run_stack`] over a `Simulated` of `capacity` bytes, its peak not read and its progress
/// not watched.
fn run_unwatched(
    candidate: &Candidate<'_, Arc<Simulated>>,
    capacity: usize,
    w: &Workload,
    settings: &Settings,
) -> StackReport {
    let sim = Arc::new(Simulated::new(capacity));
    run_stack(
        candidate,
        sim,
        &|| None,
        w,
        w.default_streams(),
        settings,
        &(),
    )
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
    let r = run_unwatched(&raw, 1 << 20, &w, &no_search);
    assert!(!r.failed());
    assert_eq!((r.min_capacity, r.upstream_peak), (None, None));
}

/// Three 1 MiB blocks made, then freed in turn.
fn three_blocks(name: &str) -> Workload {
    use mrstack::replay::Op;
    let alloc = |id| Op::Alloc {
        id,
        size: 1 << 20,
        stream: 0,
    };
    let ops = vec![alloc(0), alloc(1), alloc(2)];
    let frees = (0..3).map(|id| Op::Free { id });
    Workload::new(name, ops.into_iter().chain(frees).collect()).unwrap()
}

#[test]
fn a_threaded_replay_reports_what_its_threads_held_at_once() {
    // Thread 0 makes the blocks, thread 1 frees them as they come.
    let w = three_blocks("handed")
        .with_threads(vec![0, 0, 0, 1, 1, 1])
        .unwrap();
    let stacks = replay::stacks::<Arc<Simulated>>();
    let raw = Candidate::simulated("upstream", stacks[0].as_ref());
    let settings = Settings {
        passes: 2,
        search_capacity: false,
        threads: true,
        ..Settings::default()
    };
    let r = run_unwatched(&raw, usize::MAX, &w, &settings);
    let held = r.held_at_once.unwrap();
    assert!((1 << 20..=3 << 20).contains(&held), "{r:?}");
}

#[test]
fn a_threaded_replay_out_of_memory_is_timed_again_with_more_room() {
    // Three 1 MiB blocks live at once: above the 1 MiB floor of timing capacities.
    let w = three_blocks("three");
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
    let r = run_unwatched(&candidate, usize::MAX, &w, &settings);
    assert!(r.timing_error.is_none(), "{r:?}");
    // One thread: replayed in log order, where peak live is what it holds.
    assert_eq!(r.held_at_once, None);
    assert!(
        r.capacity > first && r.capacity <= first << MAX_CAPACITY_RETRIES,
        "{r:?}"
    );
    // In log order the answer does not depend on the machine: no second try.
    let sequential = Settings {
        threads: false,
        ..settings
    };
    let r = run_unwatched(&candidate, usize::MAX, &w, &sequential);
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
    let r = run_unwatched(&c, 1 << 20, &w, &Settings::default());
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
        held_at_once: None,
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
    assert!(s["held_at_once"].is_null());
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
