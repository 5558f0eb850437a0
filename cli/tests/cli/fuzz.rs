//! Random input never panics, aborts or hangs: random logs (garbled CSV lines, huge numbers, odd
//! thread and stream ids, binary junk, gzip or not) through the log reader and the replay on
//! `Simulated` as the command runs it (capacity search, then timing with the log's threads), and
//! random argument lists through the command's argument handling. Every outcome is `Ok` or an
//! error that says something.
//!
//! `PROPTEST_CASES` sets the number of cases (64 by default here, a few seconds in a debug build).

use mrstack::leaf::Simulated;
use mrstack::replay::rmm_log::{self, OnError};
use mrstack::replay::{self, simulated_streams};
use mrstack_cli::{args, run_stack, select, Candidate, Settings};
use proptest::prelude::*;
use std::io::Write;
use std::sync::Arc;

#[path = "../../../tests/support/fuzz.rs"]
mod strategies;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        // Each failure is a real finding; shrinking a replay is slow.
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_logs_parse_and_replay_or_say_why(
        log in strategies::log(),
        packed in any::<bool>(),
        cut in any::<Option<prop::sample::Index>>(),
        skip in any::<bool>(),
        threads in any::<bool>(),
    ) {
        let mut bytes = if packed { gzip(&log) } else { log };
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        let on_error = if skip { OnError::Skip } else { OnError::Stop };
        let trace = match rmm_log::read_from(&bytes[..], "fuzz", on_error) {
            Ok(t) => t,
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(!msg.is_empty());
                // A skippable error cannot come out of skip mode.
                prop_assert!(!(skip && e.skippable), "{msg}");
                return Ok(());
            }
        };
        let w = &trace.workload;
        prop_assert!(w.threaded_peak() >= w.peak_live());
        let settings = Settings { passes: 1, precision: 0.1, search_capacity: true, threads };
        for factory in &replay::stacks::<Arc<Simulated>>() {
            let candidate = Candidate::simulated(factory.name(), factory.as_ref());
            let sim = Arc::new(Simulated::new(usize::MAX));
            let r = run_stack(
                &candidate,
                sim.clone(),
                &|| Some(sim.peak()),
                w,
                simulated_streams(w.stream_count()),
                &settings,
                &(),
            );
            for e in r.timing_error.iter().chain(&r.capacity_error) {
                prop_assert!(!e.is_empty());
            }
            prop_assert_eq!(sim.in_use(), 0, "{} left memory behind", factory.name());
        }
    }

    #[test]
    fn random_command_lines_parse_or_say_why(line in strategies::command_line()) {
        let mut argv = vec!["mrstack".to_owned()];
        argv.extend(line);
        match args::parse(&argv) {
            Ok(cli) => {
                let args::Command::Replay(a) = cli.command;
                prop_assert!(a.passes >= 1);
                prop_assert!(a.precision > 0.0 && a.precision < 1.0);
                prop_assert!(a.allocations <= args::MAX_RANDOM_ALLOCATIONS);
                let available = ["upstream", "pool", "binning", "arena"];
                if let Err(e) = select(&a.stacks, &available, &[("simulated", "upstream")]) {
                    prop_assert!(e.contains("available"), "{e}");
                }
            }
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
