//! Op files: one workload laid out on threads and streams, written by the Rust side of the
//! side-by-side benchmark and replayed as they are by both the mrstack side (`main.rs`) and RMM's
//! (`rmm_bench.cpp`), so that both run the same ops: each allocation's size and alignment, the
//! order of the frees, which thread runs each op and on which stream.
//!
//! The format is text, one record a line, fields separated by one space:
//!
//! ```text
//! mrstack-ops 1
//! workload <name, the rest of the line>
//! layout <threads asked> <own | one | logged>
//! threads <OS threads: the largest thread index + 1>
//! streams <stream indices: the largest + 1; 0 is the default stream, i >= 1 a stream of its own>
//! capacity <bytes: pool initial and maximum, arena size>
//! peak_live <bytes live at once in op order>
//! threaded_peak <bytes the threads can hold at once in any interleaving>
//! allocations <number of `a` lines>
//! ops <number of `a` and `f` lines>
//! a <thread> <id> <size> <alignment> <stream>
//! f <thread> <id>
//! …
//! end
//! ```
//!
//! Ops are in log order; each thread runs its own ops in that order. Allocation ids count from 0 in
//! order; a free releases allocation `id` on the stream it was allocated on. Thread `t` runs on OS
//! thread `t % 256` (mrstack's `MAX_REPLAY_THREADS`); the generated layouts use fewer.

// The bench uses all of this, the host test of the format only some.
#![allow(dead_code)]

use mrstack::replay::{Op, Workload, WorkloadError, ALIGN, MAX_REPLAY_THREADS};
use std::fmt;
use std::io::{self, BufRead, Write};
use std::time::Duration;

/// The first line of every op file.
pub(crate) const MAGIC: &str = "mrstack-ops 1";

/// Extra room given to every stack beyond twice what the threads can hold: RMM's fixed-size bins
/// take 128 blocks at a time from their pool (512 MiB at once for the 4 MiB bin).
pub(crate) const HEADROOM: usize = 1 << 30;

/// How the threads of a layout use streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streams {
    /// Thread `t` allocates and frees on stream `t + 1`, a stream of its own.
    Own,
    /// Every thread on stream 0, the default stream.
    One,
    /// The log's own threads and streams (its first stream that is the default, 0, stays 0).
    Logged,
}

impl Streams {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Streams::Own => "own",
            Streams::One => "one",
            Streams::Logged => "logged",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "own" => Some(Streams::Own),
            "one" => Some(Streams::One),
            "logged" => Some(Streams::Logged),
            _ => None,
        }
    }
}

/// A workload laid out for a replay: how many threads were asked for and how they use streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Threads asked for (the log's own number for [`Streams::Logged`]).
    pub(crate) threads: usize,
    pub(crate) streams: Streams,
}

impl Layout {
    /// `8-own`, `1-one`, `3-logged`: for file names and tables.
    pub(crate) fn label(&self) -> String {
        format!("{}-{}", self.threads, self.streams.as_str())
    }
}

/// One op file: a workload laid out on threads and streams, and the capacity both sides give it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OpFile {
    pub(crate) layout: Layout,
    /// Pool initial and maximum size, arena size, in bytes.
    pub(crate) capacity: usize,
    /// The ops, with the thread of each (`op_threads`) and the stream of each allocation.
    pub(crate) workload: Workload,
}

impl OpFile {
    /// `workload` laid out as `layout` asks, with the capacity [`capacity_for`] gives.
    pub(crate) fn new(workload: Workload, layout: Layout) -> Self {
        OpFile {
            capacity: capacity_for(&workload),
            layout,
            workload,
        }
    }
}

/// The capacity a layout is timed with: twice what its threads can hold at once in any
/// interleaving (`Workload::threaded_peak`, the README's timing rule for threads), plus
/// [`HEADROOM`], rounded up to 2 MiB; where threads hand blocks to each other (PyTorch's autograd
/// and main threads), twice the log-order peak: `Workload::capacity_peak`, as the replay tool's
/// recommendation uses it (`threaded_peak` says 310 GiB for a 5.4 GiB PyTorch log).
pub(crate) fn capacity_for(w: &Workload) -> usize {
    const ROUND: usize = 2 << 20;
    w.capacity_peak()
        .saturating_mul(2)
        .saturating_add(HEADROOM)
        .div_ceil(ROUND)
        .saturating_mul(ROUND)
}

/// `w`, named `name`, on `threads` threads: allocation `k` (in op order) goes to thread `k % threads`, and its
/// free to the same thread, so every thread frees what it allocated and keeps the log's order.
/// With [`Streams::Own`] thread `t` uses stream `t + 1`; with [`Streams::One`] every thread uses
/// stream 0. The ops are the same at every thread count: only who runs them, and on which stream,
/// changes, so aggregate ns/op compare directly across thread counts.
pub(crate) fn deal(
    w: &Workload,
    name: &str,
    threads: usize,
    streams: Streams,
) -> Result<Workload, String> {
    let threads = threads.max(1);
    if streams == Streams::Logged {
        return Err("deal: the logged layout is the log's own (see `logged`)".into());
    }
    let thread_of = |id: usize| id % threads;
    let stream_of = |id: usize| match streams {
        Streams::Own => thread_of(id) + 1,
        _ => 0,
    };
    let ops: Vec<Op> = w
        .ops()
        .iter()
        .map(|&o| match o {
            Op::Alloc { id, size, .. } => Op::Alloc {
                id,
                size,
                stream: stream_of(id),
            },
            free => free,
        })
        .collect();
    let op_threads = ops
        .iter()
        .map(|&o| match o {
            Op::Alloc { id, .. } | Op::Free { id } => thread_of(id),
        })
        .collect();
    Workload::new(name, ops)
        .and_then(|n| n.with_threads(op_threads))
        .map_err(|e| format!("{}: {e}", w.name()))
}

/// `w` repeated until it has at least `min_ops` ops: each copy's allocations numbered after the
/// previous copy's, and the blocks a copy leaves live freed before the next (on the thread that
/// allocated them), so the peak live bytes stay the log's. A log of a few thousand ops replays
/// in a fraction of a millisecond, where starting and waking threads would be much of a pass.
pub(crate) fn repeat(w: &Workload, min_ops: usize) -> Result<Workload, String> {
    let n = w.ops().len();
    if n == 0 || n >= min_ops {
        return Ok(w.clone());
    }
    let copies = min_ops.div_ceil(n);
    let allocations = w.allocations();
    let mut ops = Vec::with_capacity(copies * (n + w.unfreed()));
    let mut threads = Vec::with_capacity(ops.capacity());
    let thread_of_op = |i: usize| w.op_threads().map_or(0, |t| t[i]);
    for copy in 0..copies {
        let base = copy * allocations;
        // Each allocation's thread, and whether it is still live at the copy's end.
        let mut live: Vec<Option<usize>> = vec![None; allocations];
        for (i, &o) in w.ops().iter().enumerate() {
            let t = thread_of_op(i);
            match o {
                Op::Alloc { id, size, stream } => {
                    live[id] = Some(t);
                    ops.push(Op::Alloc {
                        id: base + id,
                        size,
                        stream,
                    });
                }
                Op::Free { id } => {
                    live[id] = None;
                    ops.push(Op::Free { id: base + id });
                }
            }
            threads.push(t);
        }
        for (id, t) in live.into_iter().enumerate() {
            if let Some(t) = t {
                ops.push(Op::Free { id: base + id });
                threads.push(t);
            }
        }
    }
    let repeated = Workload::new(w.name(), ops).map_err(|e| format!("{}: {e}", w.name()))?;
    if w.op_threads().is_some() {
        repeated
            .with_threads(threads)
            .map_err(|e| format!("{}: {e}", w.name()))
    } else {
        Ok(repeated)
    }
}

/// A log's own layout, named `name`: its threads, and its streams renumbered so that the log's stream 0 (the
/// default stream in RMM's logs) is index 0 and every other stream an index of its own from 1.
/// `stream_ids` are the log's stream values by index (`rmm_log::Trace::stream_ids`).
pub(crate) fn logged(w: &Workload, name: &str, stream_ids: &[u64]) -> Result<Workload, String> {
    // The log's stream index -> the file's: the default stream first, then the others in order.
    let default = stream_ids.iter().position(|&s| s == 0);
    let mut map = vec![0; stream_ids.len().max(1)];
    let mut next = 1;
    for (i, slot) in map.iter_mut().enumerate() {
        if Some(i) != default {
            *slot = next;
            next += 1;
        }
    }
    let ops: Vec<Op> = w
        .ops()
        .iter()
        .map(|&o| match o {
            Op::Alloc { id, size, stream } => Op::Alloc {
                id,
                size,
                stream: map.get(stream).copied().unwrap_or(stream),
            },
            free => free,
        })
        .collect();
    let threads = w
        .op_threads()
        .map_or_else(|| vec![0; ops.len()], <[usize]>::to_vec);
    Workload::new(name, ops)
        .and_then(|n| n.with_threads(threads))
        .map_err(|e| format!("{}: {e}", w.name()))
}

/// Writes `file` in the op-file format.
pub(crate) fn write(mut out: impl Write, file: &OpFile) -> io::Result<()> {
    let w = &file.workload;
    let name: String = w
        .name()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    writeln!(out, "{MAGIC}")?;
    writeln!(out, "workload {name}")?;
    writeln!(
        out,
        "layout {} {}",
        file.layout.threads,
        file.layout.streams.as_str()
    )?;
    writeln!(out, "threads {}", w.thread_count())?;
    writeln!(out, "streams {}", w.stream_count())?;
    writeln!(out, "capacity {}", file.capacity)?;
    writeln!(out, "peak_live {}", w.peak_live())?;
    writeln!(out, "threaded_peak {}", w.threaded_peak())?;
    writeln!(out, "allocations {}", w.allocations())?;
    writeln!(out, "ops {}", w.ops().len())?;
    let threads = w.op_threads();
    for (i, &o) in w.ops().iter().enumerate() {
        let t = threads.map_or(0, |t| t[i]);
        match o {
            Op::Alloc { id, size, stream } => writeln!(out, "a {t} {id} {size} {ALIGN} {stream}")?,
            Op::Free { id } => writeln!(out, "f {t} {id}")?,
        }
    }
    writeln!(out, "end")?;
    out.flush()
}

/// What is wrong with an op file, and on which line (1-based; 0 for the file as a whole).
#[derive(Debug)]
pub(crate) struct OpsError {
    pub(crate) line: usize,
    pub(crate) message: String,
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

impl std::error::Error for OpsError {}

fn bad(line: usize, message: impl Into<String>) -> OpsError {
    OpsError {
        line,
        message: message.into(),
    }
}

/// Reads an op file that [`write`] wrote (or RMM's side would read): every header line, every op,
/// the closing `end`, and the counts and peaks the header states, checked. Alignments other than
/// 256 are refused: mrstack's replayers ask for `ALIGN` (256), as RMM's resources use.
pub(crate) fn read(input: impl BufRead) -> Result<OpFile, OpsError> {
    let mut lines = input.lines().enumerate().map(|(i, l)| (i + 1, l));
    let mut next = |what: &str| -> Result<(usize, String), OpsError> {
        match lines.next() {
            Some((n, Ok(l))) => Ok((n, l)),
            Some((n, Err(e))) => Err(bad(n, format!("cannot read: {e}"))),
            None => Err(bad(0, format!("ends before {what}"))),
        }
    };
    let (n, magic) = next("the header")?;
    if magic.trim_end() != MAGIC {
        return Err(bad(n, format!("expected `{MAGIC}`, found `{magic}`")));
    }
    let mut field = |key: &str| -> Result<(usize, String), OpsError> {
        let (n, l) = next(key)?;
        match l.split_once(' ') {
            Some((k, v)) if k == key => Ok((n, v.to_owned())),
            _ if l == key => Ok((n, String::new())),
            _ => Err(bad(n, format!("expected `{key} …`, found `{l}`"))),
        }
    };
    let number = |(n, v): (usize, String)| -> Result<usize, OpsError> {
        v.trim()
            .parse()
            .map_err(|_| bad(n, format!("not a number: `{v}`")))
    };
    let (_, name) = field("workload")?;
    let (ln, layout) = field("layout")?;
    let layout = match layout.split_once(' ') {
        Some((t, s)) => match (t.parse(), Streams::parse(s.trim())) {
            (Ok(threads), Some(streams)) => Layout { threads, streams },
            _ => return Err(bad(ln, format!("bad layout `{layout}`"))),
        },
        None => return Err(bad(ln, format!("bad layout `{layout}`"))),
    };
    let threads = number(field("threads")?)?;
    let streams = number(field("streams")?)?;
    let capacity = number(field("capacity")?)?;
    let peak_live = number(field("peak_live")?)?;
    let threaded_peak = number(field("threaded_peak")?)?;
    let allocations = number(field("allocations")?)?;
    let (ops_line, ops_count) = field("ops")?;
    let count = number((ops_line, ops_count))?;

    let mut ops = Vec::with_capacity(count.min(1 << 24));
    let mut op_threads = Vec::with_capacity(count.min(1 << 24));
    loop {
        let (n, l) = next("`end`")?;
        let mut f = l.split(' ');
        let kind = f.next().unwrap_or("");
        let mut num = |what: &str| -> Result<usize, OpsError> {
            let v = f.next().ok_or_else(|| bad(n, format!("no {what}")))?;
            v.parse()
                .map_err(|_| bad(n, format!("{what} is not a number: `{v}`")))
        };
        let (op, thread) = match kind {
            "end" => break,
            "a" => {
                let thread = num("thread")?;
                let id = num("id")?;
                let size = num("size")?;
                let align = num("alignment")?;
                let stream = num("stream")?;
                if align != ALIGN {
                    return Err(bad(
                        n,
                        format!("alignment {align}: mrstack's replay asks for {ALIGN}"),
                    ));
                }
                if stream >= streams {
                    return Err(bad(
                        n,
                        format!("stream {stream}, but the header says {streams} streams"),
                    ));
                }
                (Op::Alloc { id, size, stream }, thread)
            }
            "f" => {
                let thread = num("thread")?;
                (Op::Free { id: num("id")? }, thread)
            }
            other => return Err(bad(n, format!("unknown record `{other}`"))),
        };
        if f.next().is_some() {
            return Err(bad(n, "more fields than the record has"));
        }
        if thread >= threads {
            return Err(bad(
                n,
                format!("thread {thread}, but the header says {threads} threads"),
            ));
        }
        ops.push(op);
        op_threads.push(thread);
    }
    if let Some((n, _)) = lines.find(|(_, l)| l.as_ref().map_or(true, |l| !l.trim().is_empty())) {
        return Err(bad(n, "text after `end`"));
    }
    if ops.len() != count {
        return Err(bad(
            0,
            format!("{} ops, but the header says {count}", ops.len()),
        ));
    }
    let werr = |e: WorkloadError| bad(0, e.to_string());
    let workload = Workload::new(name, ops)
        .map_err(werr)?
        .with_threads(op_threads)
        .map_err(werr)?;
    let checks = [
        ("threads", threads, workload.thread_count()),
        ("streams", streams, workload.stream_count()),
        ("allocations", allocations, workload.allocations()),
        ("peak_live", peak_live, workload.peak_live()),
        ("threaded_peak", threaded_peak, workload.threaded_peak()),
    ];
    for (what, said, is) in checks {
        if said != is {
            return Err(bad(
                0,
                format!("the header says {what} {said}, the ops {is}"),
            ));
        }
    }
    if workload.thread_count() > MAX_REPLAY_THREADS {
        eprintln!(
            "note: {} threads: thread t runs on OS thread t % {MAX_REPLAY_THREADS}",
            workload.thread_count()
        );
    }
    Ok(OpFile {
        layout,
        capacity,
        workload,
    })
}

/// A warm-up pass longer than this many budgets is the only pass of its stack: a stack that slow
/// needs no median to be told apart, and the run keeps to its time (`slow` in `rmm_bench.cpp`).
pub(crate) const SLOW: f64 = 2.5;

/// Timed passes after a warm-up pass that took `warmup`: as many as fit in `budget`, at least 1,
/// at most `max`; none when the warm-up took more than [`SLOW`] budgets (its figure stands, marked
/// as the warm-up's). The C++ side uses the same rule (`timed_passes` in `rmm_bench.cpp`).
pub(crate) fn timed_passes(warmup: Duration, budget: Duration, max: usize) -> usize {
    if warmup.as_secs_f64() > SLOW * budget.as_secs_f64() {
        return 0;
    }
    let fit = budget.as_secs_f64() / warmup.as_secs_f64().max(1e-9);
    (fit.floor() as usize).clamp(1, max.max(1))
}

/// The median of `values` (the mean of the middle two for an even count), as RMM's side computes it.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mrstack::replay::{self, RandomConfig};

    fn small() -> Workload {
        replay::random(&RandomConfig {
            allocations: 300,
            max_size: 1 << 16,
            ..Default::default()
        })
    }

    fn round_trip(file: &OpFile) -> OpFile {
        let mut text = Vec::new();
        write(&mut text, file).unwrap();
        read(&text[..]).unwrap()
    }

    #[test]
    fn op_files_round_trip() {
        let w = small();
        for threads in [1, 2, 3, 16] {
            for streams in [Streams::Own, Streams::One] {
                let laid = deal(&w, "random", threads, streams).unwrap();
                let file = OpFile::new(laid, Layout { threads, streams });
                assert_eq!(round_trip(&file), file, "{threads} {streams:?}");
            }
        }
    }

    #[test]
    fn repeating_keeps_the_peak_and_frees_what_each_copy_leaves() {
        // Allocation 1 is never freed: each copy frees it before the next.
        let alloc = |id, size| Op::Alloc {
            id,
            size,
            stream: 0,
        };
        let ops = vec![alloc(0, 100), alloc(1, 50), Op::Free { id: 0 }];
        let w = Workload::new("w", ops).unwrap();
        let r = repeat(&w, 10).unwrap();
        assert_eq!(r.ops().len(), 4 * 4);
        assert_eq!((r.allocations(), r.unfreed(), r.peak_live()), (8, 0, 150));
        assert_eq!(r.name(), "w");
        // Long enough already: unchanged.
        assert_eq!(repeat(&w, 3).unwrap(), w);
    }

    #[test]
    fn dealing_keeps_the_ops_and_gives_each_thread_its_own_frees() {
        let w = small();
        let laid = deal(&w, "random", 4, Streams::Own).unwrap();
        assert_eq!(laid.thread_count(), 4);
        assert_eq!(laid.stream_count(), 5);
        assert_eq!(laid.ops().len(), w.ops().len());
        assert_eq!(laid.peak_live(), w.peak_live());
        let threads = laid.op_threads().unwrap();
        let mut owner = vec![usize::MAX; laid.allocations()];
        for (i, (&o, &before)) in laid.ops().iter().zip(w.ops()).enumerate() {
            match (o, before) {
                (Op::Alloc { id, size, stream }, Op::Alloc { size: s0, .. }) => {
                    assert_eq!(size, s0);
                    assert_eq!(threads[i], id % 4);
                    assert_eq!(stream, threads[i] + 1);
                    owner[id] = threads[i];
                }
                (Op::Free { id }, Op::Free { id: id0 }) => {
                    assert_eq!(id, id0);
                    assert_eq!(threads[i], owner[id], "freed on its allocating thread");
                }
                _ => panic!("op {i} changed kind"),
            }
        }
        let one = deal(&w, "random", 4, Streams::One).unwrap();
        assert_eq!(one.stream_count(), 1);
        assert_eq!(deal(&w, "random", 1, Streams::One).unwrap(), w);
    }

    #[test]
    fn logged_layout_keeps_threads_and_puts_the_default_stream_first() {
        let log = "Thread,Time,Action,Pointer,Size,Stream\n\
                   1,1,allocate,0x1000,100,0x77\n\
                   2,2,allocate,0x2000,200,0\n\
                   2,3,free,0x1000,100,0x77\n\
                   1,4,free,0x2000,200,0\n";
        let t = replay::rmm_log::parse(log.as_bytes(), "two").unwrap();
        let laid = logged(&t.workload, "two", &t.stream_ids).unwrap();
        assert_eq!(laid.op_threads(), Some(&[0, 1, 1, 0][..]));
        let streams: Vec<usize> = laid
            .ops()
            .iter()
            .filter_map(|o| match o {
                Op::Alloc { stream, .. } => Some(*stream),
                _ => None,
            })
            .collect();
        assert_eq!(streams, [1, 0]);
        assert_eq!(laid.cross_thread_frees(), 2);
        let file = OpFile::new(
            laid,
            Layout {
                threads: 2,
                streams: Streams::Logged,
            },
        );
        // Handed-over blocks: the log-order peak sizes the capacity, not threaded_peak.
        assert_eq!(
            file.capacity,
            (2 * 300 + HEADROOM).div_ceil(2 << 20) * (2 << 20)
        );
        assert_eq!(round_trip(&file), file);
    }

    #[test]
    fn bad_files_name_their_line() {
        let file = OpFile::new(
            deal(&small(), "random", 2, Streams::Own).unwrap(),
            Layout {
                threads: 2,
                streams: Streams::Own,
            },
        );
        let mut text = Vec::new();
        write(&mut text, &file).unwrap();
        let text = String::from_utf8(text).unwrap();
        let broken = [
            (text.replacen("mrstack-ops 1", "mrstack-ops 2", 1), "line 1"),
            (text.replacen(" 256 ", " 512 ", 1), "alignment 512"),
            (text.replacen("\nend\n", "\n", 1), "ends before `end`"),
            (text.replacen("\nf 0 ", "\nf 7 ", 1), "thread 7"),
            (text.replacen("\nf ", "\nx ", 1), "unknown record `x`"),
            (text.replacen("capacity ", "capacity x", 1), "line 6"),
            (format!("{text}a 0 0 1 256 0\n"), "text after `end`"),
            (
                text.replacen("threaded_peak ", "threaded_peak 1", 1),
                "threaded_peak",
            ),
        ];
        for (bad, expect) in broken {
            let e = read(bad.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(expect), "{e} should say {expect}");
        }
    }

    #[test]
    fn capacity_holds_the_threads_at_once_with_headroom() {
        let laid = deal(&small(), "random", 8, Streams::Own).unwrap();
        let cap = capacity_for(&laid);
        assert!(cap >= 2 * laid.threaded_peak() + HEADROOM);
        assert_eq!(cap % (2 << 20), 0);
    }

    #[test]
    fn passes_fit_the_budget() {
        let ms = Duration::from_millis;
        assert_eq!(timed_passes(ms(10), ms(2000), 5), 5);
        assert_eq!(timed_passes(ms(700), ms(2000), 5), 2);
        assert_eq!(timed_passes(ms(4900), ms(2000), 5), 1);
        assert_eq!(timed_passes(ms(5100), ms(2000), 5), 0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
