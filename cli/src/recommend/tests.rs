//! Tests of the recommendation: sizes that read back, the choice on made-up rows, the check, and
//! real replays whose printed stacks are the presets measured.

use super::*;
use crate::tests::{report, row, tiny};
use crate::{run_stack, Candidate as Row, Settings};
use mrstack::leaf::Simulated;
use mrstack::replay::{self, random, RandomConfig};
use proptest::prelude::*;
use std::sync::Arc;

/// A row of `name` needing `min` bytes (of a workload of `peak` bytes live).
fn needs(name: &str, min: usize, peak: usize) -> StackReport {
    StackReport {
        min_capacity: Some(min),
        min_capacity_ratio: Some(min as f64 / peak as f64),
        peak_live: peak,
        ..row(name)
    }
}

fn recommended(r: &Report) -> Recommendation {
    recommend(r, &tiny()).unwrap_or_else(|e| panic!("no recommendation: {e}"))
}

#[test]
fn readable_sizes_read_back_as_the_bytes_they_stand_for() {
    for (at_least, bytes, text) in [
        (1, 1, "1 B"),
        (7, 7, "7 B"),
        (563, 570, "570 B"),
        (999, 1000, "1000 B"),
        (1000, 1024, "1 KiB"),
        (1034, 1126, "1.1 KiB"),
        (1 << 20, 1 << 20, "1 MiB"),
        ((1 << 20) + 1, 1153433, "1.1 MiB"),
        (300 << 20, 300 << 20, "300 MiB"),
        (301 << 20, 310 << 20, "310 MiB"),
        (3_800_000_000, 3_865_470_566, "3.6 GiB"),
        (6_460_000_000, 6_549_825_126, "6.1 GiB"),
        (5 << 40, 5 << 40, "5 TiB"),
    ] {
        assert_eq!(
            readable_size(at_least),
            (bytes, text.to_owned()),
            "{at_least}"
        );
        assert_eq!(
            mrstack::units::parse_size(text).map(u128::from),
            Ok(bytes),
            "{text}"
        );
    }
    assert_eq!(readable_size(0), (0, "0 B".to_owned()));
}

proptest! {
    #[test]
    fn readable_sizes_are_close_above_and_parse(at_least in 1u128..(1 << 63)) {
        let (bytes, text) = readable_size(at_least);
        prop_assert!(bytes >= at_least, "{text}");
        // Two significant digits: at most a tenth more, and a hundredth of a unit.
        prop_assert!(bytes * 100 <= at_least * 111 + 100, "{at_least} -> {text}");
        prop_assert_eq!(mrstack::units::parse_size(&text).map(u128::from), Ok(bytes));
    }
}

#[test]
fn heaps_is_shown_but_never_recommended_for_one_thread_or_many() {
    let peak = 1 << 20;
    for threads in [1, 4] {
        // heaps needs the least by far: its log-order figure is one heap's, not its threads'.
        let mut r = report(vec![
            row("upstream"),
            needs("heaps", 1_000_000, peak),
            needs("pool", 1_200_000, peak),
            needs("tlsf", 1_250_000, peak),
        ]);
        r.workload.threads = threads;
        let rec = recommended(&r);
        assert_eq!(rec.stack, "tlsf", "{threads} threads");
        assert_eq!(rec.tied, ["tlsf", "pool"], "{threads} threads");
        assert!(
            !rec.why[0].contains("heaps"),
            "heaps is no candidate: {}",
            rec.why[0]
        );
    }
    // With heaps alone there is nothing to recommend, and the reason names the candidates.
    let r = report(vec![row("upstream"), needs("heaps", 1_000_000, peak)]);
    let why = recommend(&r, &tiny()).unwrap_err();
    assert!(why.contains("none of") && !why.contains("heaps"), "{why}");
}

#[test]
fn the_least_footprint_wins_and_near_ties_go_by_a_fixed_order() {
    let peak = 1 << 20;
    // Arena within 5% of pool, binning past it: arena, the first of the two in the order.
    let r = report(vec![
        row("upstream"),
        needs("pool", 1_000_000, peak),
        needs("binning", 1_060_000, peak),
        needs("arena", 1_040_000, peak),
    ]);
    let rec = recommended(&r);
    assert_eq!(rec.stack, "arena");
    assert_eq!(rec.tied, ["arena", "pool"]);
    assert_eq!(rec.min_capacity, 1_040_000);
    // 1,040,000 + 10% = 1,144,000 bytes = 1.09 MiB, up to 1.1 MiB.
    assert_eq!(rec.capacity_text, "1.1 MiB");
    assert_eq!(rec.capacity, 1_153_433);
    assert_eq!(
        rec.resource_stack,
        "resource_stack![\n    Cuda::new(&ctx)?,\n    Arena { size: 1.1 MiB },\n]"
    );
    assert_eq!(rec.config, "cuda > arena(size=1.1 MiB)");
    assert!(
        rec.why[0].contains("within 5% of the least: arena, pool"),
        "{:?}",
        rec.why
    );
    assert!(
        rec.why[1].contains("fixed order for one thread: paged, binning, tlsf, vmm, arena, pool")
    );
    assert!(rec.why[2].contains("over Simulated they are host bookkeeping only"));
    assert!(rec.why[3].starts_with("capacity: 1.1 MiB = min capacity 1015.62 KiB + 10%"));
    assert_eq!(rec.log_order_capacity, None);

    // Binning within the margin too: first in the order for one thread.
    let mut r2 = r.clone();
    r2.stacks[2] = needs("binning", 1_049_000, peak);
    assert_eq!(recommended(&r2).stack, "binning");
    assert_eq!(
        recommended(&r2).resource_stack,
        "resource_stack![\n    Cuda::new(&ctx)?,\n    Pool { initial: 1.2 MiB, max: 1.2 MiB },\n    Binning,\n]"
    );
    assert_eq!(
        recommended(&r2).config,
        "cuda > pool(initial=1.2 MiB, max=1.2 MiB) > binning"
    );

    // Nothing within the margin: the least footprint alone.
    let mut r3 = r.clone();
    r3.stacks[3] = needs("arena", 1_051_000, peak);
    r3.stacks[2] = needs("binning", 2_000_000, peak);
    let rec = recommended(&r3);
    assert_eq!((rec.stack.as_str(), rec.tied.len()), ("pool", 1));
    assert!(
        rec.why[1].contains("by more than 5%: footprint decides"),
        "{:?}",
        rec.why
    );

    // ns/op never decide: the slowest row is chosen all the same.
    let mut r4 = r.clone();
    r4.stacks[3].ns_per_op = Some(1e9);
    assert_eq!(recommended(&r4).stack, "arena");
}

#[test]
fn a_log_of_several_threads_prefers_arena_and_leaves_room_for_its_threads() {
    let peak = 1 << 20;
    let mut r = report(vec![
        needs("pool", 1 << 20, peak),
        needs("binning", 1 << 20, peak),
        needs("arena", 1 << 20, peak),
    ]);
    r.workload.threads = 4;
    r.workload.peak_live = peak;
    r.workload.threaded_peak = 4 << 20;
    r.workload.capacity_peak = 4 << 20;
    let rec = recommended(&r);
    assert_eq!(rec.stack, "arena");
    assert_eq!(rec.tied, ["arena", "binning", "pool"]);
    // 1 MiB × 4 (what the threads can hold) + 10% = 4.4 MiB.
    assert_eq!(rec.capacity_text, "4.4 MiB");
    assert_eq!(rec.log_order_capacity.as_deref(), Some("1.1 MiB"));
    assert!(rec.why[1].contains("several threads: paged, arena, binning, tlsf, vmm, pool"));
    assert!(rec.why[4].contains("1.1 MiB (min capacity + 10%) suffices"));
    // Threads that hand blocks to each other keep the log's order: no scaling, and why.
    // (as `Workload::capacity_peak` gives it: the log's order)
    r.workload.cross_thread_frees = 7;
    r.workload.capacity_peak = peak;
    let rec = recommended(&r);
    assert_eq!(
        (
            rec.capacity_text.as_str(),
            rec.log_order_capacity.as_deref()
        ),
        ("1.1 MiB", None)
    );
    assert!(
        rec.why[4].contains("7 of its frees are on another thread"),
        "{:?}",
        rec.why
    );
    r.workload.cross_thread_frees = 0;
    // Threads that can hold no more than the log's order: no scaling.
    r.workload.threaded_peak = peak;
    r.workload.capacity_peak = peak;
    let rec = recommended(&r);
    assert_eq!(
        (rec.capacity_text.as_str(), rec.log_order_capacity),
        ("1.1 MiB", None)
    );
}

#[test]
fn a_stack_that_does_not_complete_in_the_check_gives_way() {
    // Binning claims to need 100 bytes of a workload that holds 300 at once: its 110 B
    // cannot complete, and the check finds it.
    let r = report(vec![
        needs("binning", 100, 300),
        needs("pool", 1 << 20, 300),
    ]);
    let rec = recommended(&r);
    assert_eq!(rec.stack, "pool");
    assert!(
        rec.why[1].contains("passed over: binning did not complete with 110 B in the check replay"),
        "{:?}",
        rec.why
    );
    let alone = report(vec![needs("binning", 100, 300)]);
    let e = recommend(&alone, &tiny()).unwrap_err();
    assert!(
        e.contains("no candidate works") && e.contains("out of memory"),
        "{e}"
    );
}

#[test]
fn without_candidates_the_report_says_why() {
    let why = |stacks| recommend(&report(stacks), &tiny()).unwrap_err();
    assert_eq!(
        why(vec![row("upstream")]),
        "none of paged, binning, tlsf, vmm, arena, pool was replayed, and they are the stacks that can be recommended"
    );
    let mut unsearched = row("pool");
    (unsearched.min_capacity, unsearched.min_capacity_ratio) = (None, None);
    assert!(why(vec![unsearched]).contains("--no-capacity"));
    let mut failed = row("arena");
    failed.timing_error = Some("out of memory".into());
    assert_eq!(
        why(vec![row("upstream"), failed]),
        "arena failed (see above)"
    );
    assert_eq!(why(vec![]), "no stack was replayed");

    let mut r = report(vec![row("upstream")]);
    r.recommend(&tiny());
    assert!(r.recommendation.is_none());
    assert!(r.table().ends_with(&format!(
        "recommended: none: {}\n",
        r.no_recommendation.as_deref().unwrap()
    )));
}

#[test]
fn the_table_ends_with_the_stack_to_paste() {
    let mut r = report(vec![row("upstream"), needs("pool", 1 << 20, 1 << 20)]);
    r.recommend(&tiny());
    let t = r.table();
    let tail = "\nas resource_stack! (after `use mrstack::prelude::*;` and `let ctx = mrstack::cuda_context(0)?;`):\n\
                resource_stack![\n    Cuda::new(&ctx)?,\n    Pool { initial: 1.1 MiB, max: 1.1 MiB },\n]\n\n\
                as a text config (mrstack::config::build):\n\
                cuda > pool(initial=1.1 MiB, max=1.1 MiB)\n";
    assert!(t.ends_with(tail), "{t}");
    assert!(
        t.contains("\nrecommended: pool with capacity 1.1 MiB\n  footprint first"),
        "{t}"
    );
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(v["recommendation"]["stack"], "pool");
    assert_eq!(v["recommendation"]["capacity"], 1_153_433);
    assert_eq!(
        v["recommendation"]["config"],
        "cuda > pool(initial=1.1 MiB, max=1.1 MiB)"
    );
    assert!(v["no_recommendation"].is_null());
}

/// The built-in random workload of `allocations` allocations, and the preset stacks over
/// Simulated.
fn random_with_presets(
    allocations: usize,
) -> (Workload, Vec<Box<dyn replay::StackFactory<Arc<Simulated>>>>) {
    let w = random(&RandomConfig {
        allocations,
        ..Default::default()
    });
    (w, replay::stacks::<Arc<Simulated>>())
}

#[test]
fn printed_stacks_are_the_presets_that_were_measured() {
    // The text config of each candidate, over Simulated, needs exactly the capacity its
    // preset needs: the printed stack is the one the table measured.
    let (w, presets) = random_with_presets(400);
    for name in ONE_THREAD_ORDER {
        let preset = presets.iter().find(|s| s.name() == name).unwrap();
        let printed = replay::stack(name, move |_: Arc<Simulated>, capacity: usize| {
            let config = text_config(name, &capacity.to_string()).unwrap();
            over_simulated(&config, &capacity.to_string()).map_err(|_| {
                mrstack::resource::AllocError::new(
                    mrstack::resource::AllocErrorKind::Unsupported("config"),
                    0,
                    0,
                    "test",
                )
            })
        });
        let a = replay::min_capacity(preset.as_ref(), &w, 0.001).unwrap();
        let b = replay::min_capacity(printed.as_ref(), &w, 0.001).unwrap();
        assert_eq!(a.capacity, b.capacity, "{name}");
    }
}

#[test]
fn a_real_replay_recommends_a_stack_that_completes() {
    // Rows from real runs over Simulated, as the command makes them.
    let (w, presets) = random_with_presets(300);
    let settings = Settings {
        passes: 1,
        ..Settings::default()
    };
    let rows = presets
        .iter()
        .map(|f| {
            let sim = Arc::new(Simulated::new(usize::MAX));
            run_stack(
                &Row::simulated(f.name(), f.as_ref()),
                sim.clone(),
                &|| Some(sim.peak()),
                &w,
                w.default_streams(),
                &settings,
                &(),
            )
        })
        .collect();
    let mut r = report(rows);
    r.workload = crate::WorkloadSummary::of(&w, "test");
    r.recommend(&w);
    let rec = r.recommendation.clone().unwrap();
    let row = r.stacks.iter().find(|s| s.name == rec.stack).unwrap();
    assert_eq!(Some(rec.min_capacity), row.min_capacity);
    assert!(rec.capacity as u128 >= with_headroom(rec.min_capacity as u128));
    // The same answer every time: it rests on nothing that moves.
    let mut again = r.clone();
    again.recommend(&w);
    assert_eq!(again.recommendation, Some(rec.clone()));
    // The printed config builds and completes, and a stack a little smaller than the min
    // capacity does not: the capacity is what the workload needs.
    assert_eq!(check(&rec.config, &rec.capacity_text, &w), Ok(()));
    let below = (rec.min_capacity * 99 / 100).to_string();
    let config = text_config(&rec.stack, &below).unwrap();
    assert!(check(&config, &below, &w).is_err());
}
