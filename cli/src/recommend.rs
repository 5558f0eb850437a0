//! The end of `mrstack replay`'s report: the stack to use for the workload ([`recommend`]), as a
//! `resource_stack!` block and as a text config, both ready to paste, with its capacity and why.
//!
//! The choice rests only on what every run of the same log repeats, so that it cannot flip from
//! one run to the next:
//!
//! 1. **Candidates**: `paged` (which takes no capacity: its min capacity is what it needs), and
//!    the stacks with a capacity to give, `pool`, `tlsf`, `vmm`, `binning` and `arena`, that
//!    replayed without an error and whose min capacity was found. `upstream` is the baseline (on
//!    a GPU every op is a driver call) and `cuda-async` is the driver's own pool, with no
//!    capacity to search. `heaps` is not one either: its min capacity is searched in log order on
//!    one thread, where it is one heap, while with threads each heap holds chunks of its own, so
//!    no capacity found here is one it can be given for a log of several threads.
//! 2. **Footprint first**: the least min capacity (searched in log order over `Simulated`, the
//!    same on every run and machine). Candidates within [`TIE_MARGIN_PERCENT`] of it are tied.
//! 3. **Speed next**, by a fixed order among the tied: [`ONE_THREAD_ORDER`], or [`THREADS_ORDER`]
//!    for a log of several threads, from the stacks' speed on an H100 (README, "Performance").
//!    This run's ns/op never decide: over `Simulated` they are host bookkeeping, and on a GPU
//!    they move between runs.
//! 4. **Capacity**: min capacity plus [`HEADROOM_PERCENT`], rounded up to two significant digits
//!    in a unit that `resource_stack!` and text configs both read ([`readable_size`]). For a log
//!    of several threads, whose threads at once can hold more than its order shows, the min
//!    capacity is first scaled to that ([`capacity_basis`]), as the timing does: a log-order
//!    figure leaves no room for threads that interleave otherwise (64 threads that follow each
//!    other in the log fail at it on every threaded replay). Not where the threads hand blocks
//!    to each other (a free on another thread than the allocation, as PyTorch's autograd and
//!    main threads do): that orders them as the log does, and the log's order is the basis.
//! 5. **Check**: the printed text config, its `cuda` leaf swapped for `simulated` with the same
//!    capacity (`vmm`'s device pages for simulated ones), replays the workload once in log order
//!    ([`check`]); a candidate that does not complete gives way to the next.
//!
//! The stacks printed are the presets of [`mrstack::replay::stacks`] that were measured: a pool
//! whose initial size is its maximum (it reserves its capacity up front), tlsf likewise, binning
//! over such a pool, an arena of that size, and `VirtualMemory` over the device's pages with the
//! capacity as its cap on mapped bytes and as its cache.

use crate::{Report, StackReport};
use mrstack::config::{StackBuilder, StackSpec};
use mrstack::erased::AnyResource;
use mrstack::replay::rmm_log::MAX_SIZE;
use mrstack::replay::{simulated_streams, Replayer, Workload};
use mrstack::units::Bytes;
use serde::Serialize;
use std::fmt::Write as _;

/// The headroom over the min capacity that the recommended capacity adds, in percent: room for a
/// run that holds a little more than the one logged.
pub const HEADROOM_PERCENT: u32 = 10;

/// Candidates whose min capacity is within this many percent of the least are tied on footprint,
/// and speed decides among them: a few percent of memory buys a stack up to ten times faster
/// (README, "Performance").
pub const TIE_MARGIN_PERCENT: u32 = 5;

/// The order of preference among candidates tied on footprint, for a log of one thread: on the
/// paged first, the stack to start with (it takes no capacity: it maps pages as live blocks need
/// them, and gives them back as they go); then, on the H100 run of the README's footprint table,
/// binning was the fastest on every workload, tlsf next (faster than arena and pool on four of
/// five), vmm next (85–104 ns/op: tlsf's index plus page counts), then arena and pool.
pub const ONE_THREAD_ORDER: [&str; 6] = ["paged", "binning", "tlsf", "vmm", "arena", "pool"];

/// The order of preference for a log of several threads: paged gives each stream a heap of its
/// own (and each thread one, where more than four meet on a stream), arena each thread an arena,
/// binning a cache per thread, while tlsf, vmm and pool have one lock.
pub const THREADS_ORDER: [&str; 6] = ["paged", "arena", "binning", "tlsf", "vmm", "pool"];

/// The leaf of the printed `resource_stack!` block: the device memory the stacks were measured
/// over on a GPU (`cuMemAlloc`), from a context `ctx` of `mrstack::cuda_context`.
pub const LEAF_EXPR: &str = "Cuda::new(&ctx)?";

/// The leaf of the printed text config: the same memory as [`LEAF_EXPR`], on device 0.
pub const LEAF_TEXT: &str = "cuda";

/// The stack to use for a workload: see the [module docs](self) for how it is chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// The stack's name in the table: `pool`, `binning` or `arena`.
    pub stack: String,
    /// Its min capacity, in bytes.
    pub min_capacity: usize,
    /// The capacity recommended, in bytes: `capacity_text` as both the macro and text configs
    /// read it.
    pub capacity: usize,
    /// The capacity as the block and the config write it (`3.6 GiB`).
    pub capacity_text: String,
    /// The candidates tied on footprint, in the order of preference (the stack among them).
    pub tied: Vec<String>,
    /// The stack as a `resource_stack!` expression, over [`LEAF_EXPR`].
    pub resource_stack: String,
    /// The stack as a text config for `mrstack::config::build`, over [`LEAF_TEXT`].
    pub config: String,
    /// Why, a line each: footprint, choice, speed, capacity, and threads where they matter.
    pub why: Vec<String>,
    /// For a log whose threads at once can hold more than its order shows (where `capacity`
    /// leaves room for that): the smaller capacity that suffices in the log's own order, min
    /// capacity plus the headroom, as written.
    pub log_order_capacity: Option<String>,
}

impl Report {
    /// Fills [`Report::recommendation`] (or [`Report::no_recommendation`], saying why there is
    /// none) from the rows, checking the stack on `workload`, the workload the rows replayed.
    pub fn recommend(&mut self, workload: &Workload) {
        match recommend(self, workload) {
            Ok(r) => (self.recommendation, self.no_recommendation) = (Some(r), None),
            Err(why) => (self.recommendation, self.no_recommendation) = (None, Some(why)),
        }
    }
}

/// A row that can be recommended.
struct Candidate<'a> {
    row: &'a StackReport,
    min: usize,
    /// Its place in the order of preference.
    rank: usize,
}

/// The stack to use for `workload`, from `report`'s rows (see the [module docs](self)), or why
/// there is none: no candidate was replayed, the capacity search was off, every candidate failed.
pub fn recommend(report: &Report, workload: &Workload) -> Result<Recommendation, String> {
    if report.note.is_some() || report.stacks.is_empty() {
        return Err("no stack was replayed".to_owned());
    }
    let threads = report.workload.threads > 1;
    let order: &[&str] = if threads {
        &THREADS_ORDER
    } else {
        &ONE_THREAD_ORDER
    };
    let rank = |name: &str| order.iter().position(|o| *o == name);
    let rows: Vec<&StackReport> = report
        .stacks
        .iter()
        .filter(|s| rank(&s.name).is_some())
        .collect();
    if rows.is_empty() {
        return Err(format!(
            "none of {} was replayed, and they are the stacks that can be recommended",
            order.join(", ")
        ));
    }
    let mut candidates: Vec<Candidate> = rows
        .iter()
        .filter(|s| !s.failed())
        .filter_map(|&row| {
            Some(Candidate {
                row,
                min: row.min_capacity?,
                rank: rank(&row.name)?,
            })
        })
        .collect();
    if candidates.is_empty() {
        if rows.iter().all(|s| !s.failed()) {
            return Err(
                "the capacity search did not run (--no-capacity), and the choice rests on min capacity"
                    .to_owned(),
            );
        }
        let names: Vec<&str> = rows.iter().map(|s| s.name.as_str()).collect();
        return Err(format!("{} failed (see above)", names.join(", ")));
    }
    candidates.sort_by_key(|c| (c.min, c.rank));
    let least = candidates[0].min;
    let within =
        |min: usize| min as u128 * 100 <= least as u128 * u128::from(100 + TIE_MARGIN_PERCENT);
    let (mut tied, rest): (Vec<&Candidate>, Vec<&Candidate>) =
        candidates.iter().partition(|c| within(c.min));
    tied.sort_by_key(|c| c.rank);
    let tied_names: Vec<String> = tied.iter().map(|c| c.row.name.clone()).collect();

    let mut passed_over = Vec::new();
    for c in tied.iter().chain(&rest) {
        let (bytes, capacity_text) = readable_size(with_headroom(capacity_basis(report, c.min)));
        let capacity = match usize::try_from(bytes) {
            Ok(b) if b <= MAX_SIZE => b,
            _ => {
                passed_over.push(format!(
                    "{} would need {capacity_text}, more than any resource can serve",
                    c.row.name
                ));
                continue;
            }
        };
        let (Some(block), Some(config)) = (
            resource_stack_block(&c.row.name, &capacity_text),
            text_config(&c.row.name, &capacity_text),
        ) else {
            // Every ranked name has both forms: `order` lists only those.
            continue;
        };
        if let Err(e) = check(&config, &capacity_text, workload) {
            passed_over.push(format!(
                "{} did not complete with {capacity_text} in the check replay: {e}",
                c.row.name
            ));
            continue;
        }
        let log_order_capacity = (capacity_basis(report, c.min) > c.min as u128)
            .then(|| readable_size(with_headroom(c.min as u128)).1);
        let why = why(
            report,
            &candidates,
            &tied_names,
            order,
            c,
            &passed_over,
            &capacity_text,
            log_order_capacity.as_deref(),
        );
        return Ok(Recommendation {
            stack: c.row.name.clone(),
            min_capacity: c.min,
            capacity,
            capacity_text,
            tied: tied_names,
            resource_stack: block,
            config,
            why,
            log_order_capacity,
        });
    }
    Err(format!(
        "no candidate works with its capacity: {}",
        passed_over.join("; ")
    ))
}

/// What the headroom is added to: a stack's min capacity `min`, or for a log whose threads at
/// once can hold more than its order shows ([`Workload::capacity_peak`] over
/// [`Workload::peak_live`]), `min` scaled by that ratio: the stack's overhead in log order applied
/// to what its threads can hold, as [`timed_capacity`](crate::timed_capacity) does.
pub fn capacity_basis(report: &Report, min: usize) -> u128 {
    let w = &report.workload;
    if w.capacity_peak <= w.peak_live || w.peak_live == 0 {
        return min as u128;
    }
    min as u128 * w.capacity_peak as u128 / w.peak_live as u128
}

/// The lines that say why `chosen` was recommended.
// The parts of one choice, each read once here: a struct would only name them a second time.
#[allow(clippy::too_many_arguments)]
fn why(
    report: &Report,
    candidates: &[Candidate],
    tied: &[String],
    order: &[&str],
    chosen: &Candidate,
    passed_over: &[String],
    capacity: &str,
    log_order: Option<&str>,
) -> Vec<String> {
    let name = chosen.row.name.as_str();
    let mut lines = Vec::new();

    let sizes: Vec<String> = candidates
        .iter()
        .map(|c| {
            let ratio = c
                .row
                .min_capacity_ratio
                .map(|r| format!(" ({r:.3} × peak live)"))
                .unwrap_or_default();
            format!("{} {}{ratio}", c.row.name, Bytes::from(c.min))
        })
        .collect();
    let mut footprint = format!(
        "footprint first, by min capacity (in log order over Simulated: the same every run): {}",
        sizes.join(", ")
    );
    if candidates.len() > 1 {
        let _ = write!(
            footprint,
            "; within {TIE_MARGIN_PERCENT}% of the least: {}",
            tied.join(", ")
        );
    }
    let left_out: Vec<&str> = report
        .stacks
        .iter()
        .filter(|s| {
            order.contains(&s.name.as_str()) && !candidates.iter().any(|c| c.row.name == s.name)
        })
        .map(|s| s.name.as_str())
        .collect();
    if !left_out.is_empty() {
        let _ = write!(
            footprint,
            "; left out, with no min capacity: {}",
            left_out.join(", ")
        );
    }
    lines.push(footprint);

    let reason = if order == THREADS_ORDER {
        "paged gives each stream a heap of its own (and each thread one, where more than four meet on a stream), arena each thread an arena, binning a cache; tlsf, vmm and pool have one lock"
    } else {
        "paged needs no capacity and follows live memory; binning was the fastest on an H100, tlsf next, then vmm, README \"Footprint\""
    };
    let mut choice = if candidates.len() == 1 {
        format!("choice: {name}, the only stack with a capacity that completed here")
    } else if tied.len() == 1 {
        format!(
            "choice: {name}, which needs the least by more than {TIE_MARGIN_PERCENT}%: footprint decides"
        )
    } else {
        let threads = if order == THREADS_ORDER {
            "several threads"
        } else {
            "one thread"
        };
        format!(
            "choice: {name}, the first of those in the fixed order for {threads}: {} ({reason})",
            order.join(", ")
        )
    };
    if !passed_over.is_empty() {
        let _ = write!(choice, "; passed over: {}", passed_over.join("; "));
    }
    lines.push(choice);

    lines.push(if report.upstream == "simulated" {
        "speed: this run's ns/op do not decide: over Simulated they are host bookkeeping only (*)"
            .to_owned()
    } else {
        format!(
            "speed: this run's ns/op on {} do not decide, so that every run of this log gives the same answer; compare them above",
            report.device
        )
    });

    let shown = |n: u128| Bytes::from(usize::try_from(n).unwrap_or(usize::MAX));
    let basis = capacity_basis(report, chosen.min);
    let w = &report.workload;
    let scaled = if log_order.is_some() {
        format!(
            " × {} / {} (what its {} threads can hold at once in any order, over peak live in log order) = {}",
            Bytes::from(w.threaded_peak),
            Bytes::from(w.peak_live),
            w.threads,
            shown(basis)
        )
    } else {
        String::new()
    };
    let leaf = if name == "vmm" || name == "paged" {
        format!("{name}(simulated={capacity}, …) for its device pages")
    } else {
        format!("simulated(capacity={capacity}) for its leaf")
    };
    // paged has no capacity to set: the figure is the device memory to leave it.
    let what = if name == "paged" {
        "capacity (paged takes none: what the device needs free for it)"
    } else {
        "capacity"
    };
    lines.push(format!(
        "{what}: {capacity} = min capacity {}{scaled} + {HEADROOM_PERCENT}% headroom ({}), rounded up to two significant digits; checked: the text config below, over {leaf}, completes this workload in log order",
        Bytes::from(chosen.min),
        shown(with_headroom(basis)),
    ));
    if let Some(small) = log_order {
        lines.push(format!(
            "threads: {capacity} leaves room for its threads however they interleave; where they keep the log's order, {small} (min capacity + {HEADROOM_PERCENT}%) suffices"
        ));
    } else if w.threads > 1 && w.cross_thread_frees > 0 {
        lines.push(format!(
            "threads: {} of its frees are on another thread than their allocation: its {} threads hand blocks to each other, which orders them as the log does, so the capacity rests on the log's order (a replay that lets each thread run on alone may hold up to {})",
            w.cross_thread_frees,
            w.threads,
            Bytes::from(w.threaded_peak)
        ));
    }
    lines
}

/// `bytes` plus [`HEADROOM_PERCENT`], in whole bytes (truncated, as sizes are read: 1 MiB + 10%
/// is `1.1 MiB`, not a byte more).
pub fn with_headroom(bytes: u128) -> u128 {
    bytes * u128::from(100 + HEADROOM_PERCENT) / 100
}

/// The least size of at least `at_least` bytes that reads well: two significant digits in the
/// largest unit of B, KiB, MiB, GiB, TiB that shows it as 1 or more (1,000 to 1,023 of a unit is
/// 1 of the next), written as `resource_stack!` and text configs both read it (`3.6 GiB`,
/// `350 MiB`, `570 B`): the bytes that text stands for, and the text. Those bytes are what
/// [`mrstack::units::parse_size`] reads from the text, decimals truncated.
///
/// ```
/// use mrstack_cli::recommend::readable_size;
/// assert_eq!(readable_size(3_800_000_000), (3_865_470_566, "3.6 GiB".to_owned()));
/// assert_eq!(readable_size(1 << 20), (1 << 20, "1 MiB".to_owned()));
/// assert_eq!(readable_size(1020), (1024, "1 KiB".to_owned()));
/// assert_eq!(readable_size(563), (570, "570 B".to_owned()));
/// ```
pub fn readable_size(at_least: u128) -> (u128, String) {
    const UNITS: [(&str, u128); 5] = [
        ("B", 1),
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
    ];
    let mut i = UNITS
        .iter()
        .rposition(|&(_, unit)| at_least >= unit)
        .unwrap_or(0);
    if i + 1 < UNITS.len() && at_least >= 1000 * UNITS[i].1 {
        i += 1;
    }
    let (name, unit) = UNITS[i];
    // Counted in tenths of the unit, so that one decimal is exact integer arithmetic; the
    // saturation is for sizes past 2^120 bytes, which no caller has.
    let tenths = at_least.saturating_mul(10).div_ceil(unit);
    let mut step = 1u128;
    let mut whole = tenths / 10;
    while whole >= 10 {
        whole /= 10;
        step *= 10;
    }
    if unit == 1 {
        // Whole bytes: `1.5 B` would be truncated to 1.
        step = step.max(10);
    }
    let n = tenths.div_ceil(step).saturating_mul(step);
    let text = if n % 10 == 0 {
        format!("{} {name}", n / 10)
    } else {
        format!("{}.{} {name}", n / 10, n % 10)
    };
    (n.saturating_mul(unit) / 10, text)
}

/// The `resource_stack!` expression of preset `stack` with capacity `capacity` (as written),
/// over [`LEAF_EXPR`]; `None` for a stack that is not a candidate.
pub fn resource_stack_block(stack: &str, capacity: &str) -> Option<String> {
    let layers = match stack {
        "pool" => format!("    Pool {{ initial: {capacity}, max: {capacity} }},\n"),
        "tlsf" => format!("    Tlsf {{ initial: {capacity}, max: {capacity} }},\n"),
        "binning" => {
            format!("    Pool {{ initial: {capacity}, max: {capacity} }},\n    Binning,\n")
        }
        "arena" => format!("    Arena {{ size: {capacity} }},\n"),
        // A leaf of its own, over the device's pages, with no capacity to set.
        "paged" => {
            return Some("resource_stack![\n    PagedHeaps::for_context(&ctx)?,\n]".to_owned())
        }
        // Not a layer over `Cuda` but a leaf of its own, over the device's pages; its config
        // is a plain struct, so the capacity is written in bytes.
        "vmm" => {
            let bytes = u128::from(mrstack::units::parse_size(capacity).ok()?);
            let n = grouped(bytes);
            return Some(format!(
                "resource_stack![\n    VirtualMemory::new(\n        DevicePages::new(&ctx)?,\n        VirtualMemoryConfig {{\n            max: {n}, // {capacity}\n            cache: {n},\n            ..Default::default()\n        }},\n    )?,\n]"
            ));
        }
        _ => return None,
    };
    Some(format!("resource_stack![\n    {LEAF_EXPR},\n{layers}]"))
}

/// `n` with `_` between groups of three digits, as rustfmt leaves a long literal readable.
fn grouped(n: u128) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push('_');
        }
        out.push(c);
    }
    out
}

/// The text config of preset `stack` with capacity `capacity` (as written), over
/// [`LEAF_TEXT`]; `None` for a stack that is not a candidate.
pub fn text_config(stack: &str, capacity: &str) -> Option<String> {
    let layers = match stack {
        "pool" => format!("pool(initial={capacity}, max={capacity})"),
        "tlsf" => format!("tlsf(initial={capacity}, max={capacity})"),
        "binning" => format!("pool(initial={capacity}, max={capacity}) > binning"),
        "arena" => format!("arena(size={capacity})"),
        // Leaves of their own, on device 0 as `cuda` is; `paged` takes no capacity.
        "vmm" => return Some(format!("vmm(max={capacity}, cache={capacity})")),
        "paged" => return Some("paged".to_owned()),
        _ => return None,
    };
    Some(format!("{LEAF_TEXT} > {layers}"))
}

/// Builds text config `config` with its [`LEAF_TEXT`] leaf swapped for
/// `simulated(capacity=capacity)`, so that the stack can take no more than `capacity` in all,
/// and replays `workload` through it once, in log order. `Err` says why it does not complete.
pub fn check(config: &str, capacity: &str, workload: &Workload) -> Result<(), String> {
    let mr = over_simulated(config, capacity)?;
    Replayer::new(mr, workload, simulated_streams(workload.stream_count()))
        .and_then(|mut r| r.pass().map(drop))
        .map_err(|e| e.to_string())
}

/// Builds text config `config` with its [`LEAF_TEXT`] leaf swapped for
/// `simulated(capacity=capacity)` (a `vmm` leaf's device pages for `simulated=capacity`): the
/// stack as printed, on any machine. `Err` says why not.
pub fn over_simulated(config: &str, capacity: &str) -> Result<AnyResource<()>, String> {
    let mut spec: StackSpec = config
        .parse()
        .map_err(|e| format!("`{config}` does not parse: {e}"))?;
    let leaf = format!("simulated(capacity={capacity})");
    let simulated: StackSpec = leaf
        .parse()
        .map_err(|e| format!("`{leaf}` does not parse: {e}"))?;
    match (spec.items.first_mut(), simulated.items.into_iter().next()) {
        (Some(first), Some(sim)) if first.name == LEAF_TEXT => *first = sim,
        (Some(first), Some(mut sim)) if first.name == "vmm" || first.name == "paged" => {
            first.fields.retain(|f| f.name != "device");
            if let Some(mut pages) = sim.fields.pop() {
                pages.name = "simulated".to_owned();
                first.fields.push(pages);
            }
        }
        _ => {
            return Err(format!(
                "`{config}` does not start with `{LEAF_TEXT}`, `vmm` or `paged`"
            ))
        }
    }
    StackBuilder::<()>::new()
        .build_spec(&spec)
        .map_err(|e| format!("`{config}` over `{leaf}`: {e}"))
}

/// The recommendation's part of the table: the stack, why, and the two forms to paste; or why
/// there is none; nothing before [`Report::recommend`] ran.
pub(crate) fn render(report: &Report) -> String {
    let mut out = String::new();
    if let Some(r) = &report.recommendation {
        let _ = writeln!(
            out,
            "recommended: {} with capacity {}",
            r.stack, r.capacity_text
        );
        for line in &r.why {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(out);
        // The vmm block names a leaf and its config beyond the prelude (paged's is in it).
        let imports = if r.resource_stack.contains("VirtualMemory::new") {
            "`use mrstack::prelude::*;`, `use mrstack::leaf::{DevicePages, VirtualMemory, VirtualMemoryConfig};`"
        } else {
            "`use mrstack::prelude::*;`"
        };
        let _ = writeln!(
            out,
            "as resource_stack! (after {imports} and `let ctx = mrstack::cuda_context(0)?;`):"
        );
        let _ = writeln!(out, "{}", r.resource_stack);
        let _ = writeln!(out);
        let _ = writeln!(out, "as a text config (mrstack::config::build):");
        let _ = writeln!(out, "{}", r.config);
    } else if let Some(why) = &report.no_recommendation {
        let _ = writeln!(out, "recommended: none: {why}");
    }
    out
}

#[cfg(test)]
mod tests;
