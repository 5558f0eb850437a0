//! The report as a table for people ([`Report::table`]): the workload, a row per stack, a line per
//! failure, footnotes on what the columns can and cannot say, and the recommendation.

use crate::{recommend, Report};
use mrstack::units::Bytes;
use std::fmt::Write as _;

/// The footnote of the ns/op column when the stacks ran over `Simulated`.
pub const SIMULATED_NS_NOTE: &str = "* ns/op over Simulated is host bookkeeping only (each call that reaches Simulated takes a mutex and a hash map), not GPU speed: `upstream` looks fast here because no device is behind it, and on a GPU it is cuMemAlloc, the slowest row by far (README, \"Performance\")";

/// The footnote of the upstream peak column: what it measures, for every report with rows.
pub const UPSTREAM_PEAK_NOTE: &str = "upstream peak: the most the stack took from below while timed, built with the capacity above; pool, tlsf, binning and arena reserve that capacity up front, so theirs is the capacity they were timed with, not what they need (min capacity is); vmm maps pages only under live blocks and keeps freed ones mapped up to the capacity, so its upstream peak is what it mapped; paged maps them as vmm does and keeps freed ones within the peak of live pages plus a slack; heaps takes chunks as its threads' heaps need them, so its upstream peak is what it took";

impl Report {
    /// The report as a table for people: the workload, a row per stack, a line per failure,
    /// footnotes on the columns, and the stack to use ([`Report::recommend`]).
    pub fn table(&self) -> String {
        let w = &self.workload;
        let plural = |n: usize, what: &str| {
            let s = if what.ends_with('s') { "es" } else { "s" };
            if n == 1 {
                format!("{n} {what}")
            } else {
                format!("{n} {what}{s}")
            }
        };
        let mut out = String::new();
        let with_threads = w.threads > 1 && self.replayed_with_threads;
        let threaded = if with_threads {
            format!(
                " in log order, up to {} with its threads at once",
                Bytes::from(w.threaded_peak)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "workload: {} ({}): {}, {}, {}, {}; peak live {}{threaded}",
            w.name,
            w.source,
            plural(w.ops, "op"),
            plural(w.allocations, "allocation"),
            plural(w.threads, "thread"),
            plural(w.streams, "stream"),
            Bytes::from(w.peak_live)
        );
        if let Some(note) = &self.note {
            let _ = writeln!(out, "{note}");
            return out;
        }
        let held = if with_threads {
            "what its threads can hold at once"
        } else {
            "peak live"
        };
        let _ = writeln!(
            out,
            "upstream: {} ({}); stacks timed with capacity {} (2 × {held}), more for a stack whose min capacity exceeds peak live",
            self.upstream,
            self.device,
            Bytes::from(self.base_capacity)
        );
        let threads = if w.threads > 1 {
            if self.replayed_with_threads {
                let os = w.threads.min(mrstack::replay::MAX_REPLAY_THREADS);
                format!(", {os} OS threads (wall time / ops)")
            } else {
                ", in log order on one thread".to_owned()
            }
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "ns/op: median of {} after a warm-up pass{threads}; min capacity: smallest that completes in log order, to {}%, over Simulated",
            plural(self.passes, "pass"),
            self.precision * 100.0
        );
        let notes: Vec<String> = [
            (
                w.unfreed,
                "allocation",
                "never freed (freed after each pass, untimed)",
            ),
            (w.log_failures, "`allocate failure` line", "not replayed"),
            (w.skipped_lines, "bad line", "left out"),
        ]
        .iter()
        .filter(|(n, ..)| *n > 0)
        .map(|&(n, what, done)| format!("{} {done}", plural(n, what)))
        .collect();
        if !notes.is_empty() {
            let _ = writeln!(out, "log: {}", notes.join("; "));
        }
        let _ = writeln!(out);
        // Marked so that no one reads Simulated's bookkeeping as speed, or a threaded run's
        // upstream peak as a figure every run repeats.
        let simulated = self.upstream == "simulated";
        let ns_header = if simulated { "ns/op*" } else { "ns/op" };
        let peak_header = if with_threads {
            "upstream peak†"
        } else {
            "upstream peak"
        };
        // With threads, what they held at once in each stack's own run, beside its upstream
        // peak from the same passes.
        let held_header = if with_threads {
            format!(" {:>14}", "held at once†")
        } else {
            String::new()
        };
        let header = format!(
            "{:<16} {:>10} {:>14}{held_header} {:>12} {:>13} {:>10}",
            "stack", ns_header, peak_header, "peak live", "min capacity", "min/live"
        );
        let _ = writeln!(out, "{header}");
        let _ = writeln!(out, "{}", "-".repeat(header.chars().count()));
        for s in &self.stacks {
            let or_dash = |v: Option<String>, failed: bool| {
                v.unwrap_or_else(|| if failed { "error" } else { "-" }.to_owned())
            };
            let timing_failed = s.timing_error.is_some();
            let capacity_failed = s.capacity_error.is_some();
            let held = if with_threads {
                let held = s.held_at_once.map(|n| Bytes::from(n).to_string());
                format!(" {:>14}", or_dash(held, timing_failed))
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{:<16} {:>10} {:>14}{held} {:>12} {:>13} {:>10}",
                s.name,
                or_dash(s.ns_per_op.map(|n| format!("{n:.1}")), timing_failed),
                or_dash(
                    s.upstream_peak.map(|n| Bytes::from(n).to_string()),
                    timing_failed
                ),
                Bytes::from(s.peak_live),
                or_dash(
                    s.min_capacity.map(|n| Bytes::from(n).to_string()),
                    capacity_failed
                ),
                or_dash(
                    s.min_capacity_ratio.map(|r| format!("{r:.3}")),
                    capacity_failed
                ),
            );
        }
        for s in &self.stacks {
            if let Some(e) = &s.timing_error {
                let _ = writeln!(out, "{}: timing failed: {e}", s.name);
            }
            if let Some(e) = &s.capacity_error {
                let _ = writeln!(out, "{}: capacity search failed: {e}", s.name);
            }
        }
        let _ = writeln!(out);
        if simulated {
            let _ = writeln!(out, "{SIMULATED_NS_NOTE}");
        }
        let _ = writeln!(out, "{UPSTREAM_PEAK_NOTE}");
        if with_threads {
            let _ = writeln!(out, "{}", self.threaded_peak_note());
        }
        let _ = writeln!(out);
        out.push_str(&recommend::render(self));
        out
    }

    /// The footnote of the upstream peak column in a replay with threads: what it measures there,
    /// and why it may be below peak live.
    fn threaded_peak_note(&self) -> String {
        let w = &self.workload;
        format!(
            "† with threads, upstream peak is what this run's interleaving made the stack take, which changes from run to run: below peak live (log order) where threads that overlap in the log ran apart, above it where threads ran together that the log runs apart (up to {}); held at once is what the threads held (allocated, not yet freed) in the same passes, counted by one atomic add per allocation and per free that the ns/op include, so upstream peak over held at once is what the stack took beyond what it was asked to hold. Peak live and min capacity come from the log's order and are the same every run",
            Bytes::from(w.threaded_peak)
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::tests::{report, row, tiny};

    #[test]
    fn table_has_a_row_per_stack_and_a_line_per_failure() {
        let mut bad = row("bad");
        bad.ns_per_op = None;
        bad.upstream_peak = None;
        bad.timing_error = Some("op 1 (allocate 200 bytes): out of memory".into());
        let mut na = row("cuda-async");
        (na.min_capacity, na.min_capacity_ratio) = (None, None);
        let mut r = report(vec![row("upstream"), bad, na]);
        assert!(r.failed());
        r.recommend(&tiny());
        let t = r.table();
        assert!(
            t.contains("tiny (test): 4 ops, 2 allocations, 1 thread, 1 stream; peak live 300 B"),
            "{t}"
        );
        assert!(t.contains("median of 5 passes"), "{t}");
        let line = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap()
                .to_owned()
        };
        let cells = |name: &str| {
            line(name)
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            cells("upstream"),
            ["upstream", "12.2", "3.00", "MiB", "300", "B", "450", "B", "1.500"]
        );
        assert_eq!(
            cells("bad"),
            ["bad", "error", "error", "300", "B", "450", "B", "1.500"]
        );
        assert_eq!(
            cells("cuda-async"),
            ["cuda-async", "12.2", "3.00", "MiB", "300", "B", "-", "-"]
        );
        assert!(
            t.contains("\nbad: timing failed: op 1 (allocate 200 bytes): out of memory\n\n"),
            "{t}"
        );
        // None of the stacks with a capacity ran: the report says so rather than recommend.
        assert!(
            t.ends_with(
                "recommended: none: none of paged, binning, tlsf, vmm, arena, pool was replayed, and they are the stacks that can be recommended\n"
            ),
            "{t}"
        );
        assert!(!report(vec![row("ok")]).failed());
    }

    #[test]
    fn simulated_ns_per_op_is_marked_as_bookkeeping() {
        let t = report(vec![row("upstream")]).table();
        let header = t.lines().find(|l| l.starts_with("stack ")).unwrap();
        assert!(header.contains("ns/op*"), "{header}");
        assert!(!header.contains('†'), "one thread: {header}");
        assert!(t.contains(super::SIMULATED_NS_NOTE), "{t}");
        assert!(t.contains(super::UPSTREAM_PEAK_NOTE), "{t}");
        // The dashes under the header are as long as it, in characters.
        let dashes = t.lines().find(|l| l.starts_with("---")).unwrap();
        assert_eq!(dashes.chars().count(), header.chars().count());

        let mut on_gpu = report(vec![row("upstream")]);
        on_gpu.upstream = "cuda".into();
        let t = on_gpu.table();
        let header = t.lines().find(|l| l.starts_with("stack ")).unwrap();
        assert!(!header.contains("ns/op*"), "{header}");
        assert!(!t.contains(super::SIMULATED_NS_NOTE), "{t}");
    }

    #[test]
    fn a_threaded_replay_explains_its_upstream_peak_beside_what_its_threads_held() {
        let mut r = report(vec![row("upstream"), row("pool")]);
        r.workload.threads = 2;
        r.workload.threaded_peak = 500;
        r.stacks[0].held_at_once = Some(200);
        r.stacks[1].held_at_once = Some(321);
        let t = r.table();
        let header = t.lines().find(|l| l.starts_with("stack ")).unwrap();
        assert!(header.contains("upstream peak†"), "{header}");
        assert!(header.contains("held at once†"), "{header}");
        let pool = t.lines().find(|l| l.starts_with("pool ")).unwrap();
        assert!(pool.contains(" 321 B "), "{pool}");
        let note = t.lines().find(|l| l.starts_with('†')).unwrap();
        assert!(note.contains("below peak live (log order)"), "{note}");
        assert!(note.contains("(up to 500 B)"), "{note}");
        assert!(
            note.contains("held at once is what the threads held"),
            "{note}"
        );
        // In log order on one thread, the figure is the same every run: no mark, no column.
        r.replayed_with_threads = false;
        let t = r.table();
        assert!(!t.contains('†') && !t.contains("held at once"), "{t}");
    }
}
