//! `mrstack replay`: which stack, and how much memory, for your workload.
//!
//! The command replays an allocation workload through every preset stack, prints how fast each
//! is and how much memory each needs, and ends with the stack to use, ready to paste. It works on
//! any machine: without a GPU it runs on [`Simulated`](crate::leaf::Simulated). It is its own package,
//! `mrstack-cli` in `cli/`, so the library pulls none of its dependencies (clap, indicatif, serde);
//! `cargo run` at the repository root runs it. The library side is [`replay`](crate::replay).
//!
//! ```text
//! cargo run --release -- replay                                # the built-in random workload
//! cargo run --release -- replay alloc.csv                      # every preset stack
//! cargo run --release -- replay alloc.csv --stack pool,arena   # only some of them
//! cargo run --release -- replay alloc.csv --json > report.json # for scripts
//! ```
//!
//! # The report
//!
//! Without a log, it replays a built-in random workload (10,000 allocations of 1 B to 1 MiB)
//! through each preset stack. It prints one row per stack, what the columns can and cannot say,
//! and the stack to use. A run on a machine with no GPU, so over `Simulated`:
//!
//! ```text
//! stack                ns/op*  upstream peak    peak live  min capacity   min/live
//! --------------------------------------------------------------------------------
//! upstream               31.1       3.09 GiB     3.09 GiB      3.09 GiB      1.000
//! pool                  156.6       6.25 GiB     3.09 GiB      3.13 GiB      1.011
//! tlsf                   61.5       6.26 GiB     3.09 GiB      3.13 GiB      1.012
//! vmm                    76.2       3.13 GiB     3.09 GiB      3.13 GiB      1.011
//! binning                18.1       8.41 GiB     3.09 GiB      4.20 GiB      1.358
//! arena                  73.7       6.45 GiB     3.09 GiB      3.22 GiB      1.042
//! heaps                  61.1       4.00 GiB     3.09 GiB      3.13 GiB      1.012
//!
//! recommended: tlsf with capacity 3.5 GiB
//!   …
//! as resource_stack! (after `use mrstack::prelude::*;` and `let ctx = mrstack::cuda_context(0)?;`):
//! resource_stack![
//!     Cuda::new(&ctx)?,
//!     Tlsf { initial: 3.5 GiB, max: 3.5 GiB },
//! ]
//!
//! as a text config (mrstack::config::build):
//! cuda > tlsf(initial=3.5 GiB, max=3.5 GiB)
//! ```
//!
//! * **ns/op**: the median of the timed passes, after one warm-up pass on the same stack. Each
//!   stack is built with a capacity (pool maximum, arena size) of twice the most the replay can
//!   hold at once (the peak live bytes; for a many-threaded log, what its threads can hold
//!   together, below), more in proportion for a stack whose min capacity exceeds peak live, so the
//!   timing measures speed and not a squeeze. Over `Simulated` the column reads `ns/op*`: those
//!   figures are host-side bookkeeping only (every call that reaches `Simulated` takes a mutex and
//!   a hash map), and say nothing of speed on a GPU. `upstream` looks fast there because no device
//!   is behind it; on a GPU it is raw `cuMemAlloc`, 12,102 ns/op where `Binning<Pool<Cuda>>` took
//!   19 on an H100. Never drop a pool because `upstream` looks fastest over `Simulated`.
//! * **upstream peak**: the most bytes the stack took from the memory below it while it was timed.
//!   `pool`, `tlsf`, `binning` and `arena` are built with the timing capacity as their initial
//!   size, so they reserve it up front: theirs is the capacity they were timed with, not what they
//!   need (that is min capacity). `vmm` maps pages only under live blocks and keeps freed pages
//!   mapped up to its capacity (emptied only under pressure): its upstream peak is the physical
//!   memory it mapped. `heaps` (`ThreadHeaps`, a heap per thread) takes chunks as its heaps need
//!   them: its upstream peak is what it took. In a replay with threads the column reads
//!   `upstream peak†`: it is what that run's interleaving made the stack take, which changes from
//!   run to run. It can be *below* peak live, which is counted in log order (two threads that
//!   each hold 1 MiB at the same point of the log may run one after the other), and above it, up
//!   to what the threads can hold at once.
//! * **held at once†** (with threads only): the most bytes that stack's threads held (allocated
//!   and not yet freed) in the same passes, counted by one atomic add per allocation and per free
//!   on a line all threads share (which its ns/op include). The interleaving that decides a
//!   stack's upstream peak decides this too, so upstream peak over held at once is what the stack
//!   took beyond what it was asked to hold in that run: a fast stack's threads overlap more than
//!   `cuMemAlloc`'s, and hold more.
//! * **peak live**: the most bytes the workload holds at once, in log order.
//! * **min capacity**: the smallest pool or arena size with which the workload still completes,
//!   found by binary search over `Simulated` (so it works without a GPU), replaying in log order
//!   on one thread, and shown as a ratio to peak live. It is the same on every run and machine.
//!   For `heaps` that one thread is one heap; with several threads each heap holds chunks of its
//!   own, so its row is there for its speed under your threads, and the recommendation leaves it
//!   out.
//!
//! Stacks run on a GPU (device 0, `--upstream cuda`) when one opens; otherwise on `Simulated`,
//! which hands out address ranges with exact accounting and no memory behind them. On a GPU the
//! `cuda-async` row is the driver's stream-ordered pool, and the `upstream` row is raw
//! `cuMemAlloc` / `cuMemFree`.
//!
//! # The recommendation
//!
//! The report ends with the stack to use, in two forms that paste unchanged: a `resource_stack!`
//! block (as `let mr = resource_stack![…];`) and a text config for
//! [`config::build`](crate::config::build). It rests only on what every run of the log repeats,
//! so it does not change from run to run:
//!
//! 1. **Candidates**: `pool`, `tlsf`, `vmm`, `binning` and `arena`, the stacks with a capacity to
//!    give, that replayed without an error. `upstream` is the baseline and `cuda-async` the
//!    driver's own pool.
//! 2. **Footprint first**: the least min capacity. Candidates within 5% of it are tied.
//! 3. **Speed next**, by a fixed order among the tied, from the measurements on an H100
//!    ([performance](super::performance)): `binning`, `tlsf`, `vmm`, `arena`, `pool` for a log of
//!    one thread; `arena`, `binning`, `tlsf`, `vmm`, `pool` for a log of several threads (arena
//!    gives each thread an arena of its own, binning a cache per thread; tlsf, vmm and pool have
//!    one lock). This run's ns/op never decide: over `Simulated` they are bookkeeping, and on a
//!    GPU they move between runs. `ThreadHeaps` is not a candidate: its heaps need about the sum
//!    of the threads' peaks (2 MiB each at least), which a replay in log order does not measure.
//!    For threads that free what they allocate, put `ThreadHeaps { max: … }` in place of the
//!    recommended suballocator with the capacity it prints and room for those per-thread peaks.
//! 4. **Capacity**: min capacity plus 10% headroom, rounded up to two significant digits in B,
//!    KiB, MiB, GiB or TiB (`3.6 GiB`, `71 MiB`), which `resource_stack!` and text configs read
//!    alike (powers of 1024, see [size literals](super::text_config#size-literals)). For a log
//!    whose threads can hold more at once than its order shows, the min capacity is first scaled
//!    to that, as the timing is, and the report gives the smaller log-order figure too.
//! 5. **Check**: the printed text config, its `cuda` leaf swapped for `simulated` with the same
//!    capacity (for `vmm`, its device pages for simulated ones), replays the workload once; a
//!    stack that does not complete gives way to the next.
//!
//! The stacks are the presets the table measured: a pool (or tlsf) whose initial size is its
//! maximum, `Binning` over such a pool, an arena of that size, and `VirtualMemory` over the
//! device's pages with the capacity as its cap and its cache. `vmm` is a leaf of its own, so its
//! block has no `Cuda` line, and its capacity is in bytes (`VirtualMemoryConfig` is a plain
//! struct, which the macro's size literals do not reach):
//!
//! ```text
//! resource_stack![
//!     VirtualMemory::new(
//!         DevicePages::new(&ctx)?,
//!         VirtualMemoryConfig {
//!             max: 3_006_477_107, // 2.8 GiB
//!             cache: 3_006_477_107,
//!             ..Default::default()
//!         },
//!     )?,
//! ]
//!
//! as a text config (mrstack::config::build):
//! vmm(max=2.8 GiB, cache=2.8 GiB)
//! ```
//!
//! `cli/tests/recommended.rs` compiles the printed blocks (kept as
//! `cli/tests/data/recommended_*.rs`) over the real `Cuda` leaf, runs them over `Simulated`, and
//! builds and allocates through the printed text configs. With `--json` the report carries the
//! same as `recommendation`. On the ResNet-50 trace of the repository
//! (`data/traces/resnet50_train.csv.gz`) the report ends:
//!
//! ```text
//! recommended: binning with capacity 6.1 GiB
//!   footprint first, by min capacity (in log order over Simulated: the same every run): vmm 5.38 GiB (1.003 × peak live), arena 5.42 GiB (1.011 × peak live), pool 5.42 GiB (1.011 × peak live), tlsf 5.46 GiB (1.017 × peak live), binning 5.47 GiB (1.019 × peak live); within 5% of the least: binning, tlsf, vmm, arena, pool
//!   …
//! resource_stack![
//!     Cuda::new(&ctx)?,
//!     Pool { initial: 6.1 GiB, max: 6.1 GiB },
//!     Binning,
//! ]
//!
//! as a text config (mrstack::config::build):
//! cuda > pool(initial=6.1 GiB, max=6.1 GiB) > binning
//! ```
//!
//! The same search is a function of the library, [`replay::min_capacity`](crate::replay::min_capacity),
//! over any [`Workload`](crate::replay::Workload) (here one built by hand) and any preset stack:
//!
//! ```
//! use mrstack::replay::{self, Op, Workload};
//! use std::sync::Arc;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ops = vec![
//!     Op::Alloc { id: 0, size: 1 << 20, stream: 0 },
//!     Op::Alloc { id: 1, size: 1 << 20, stream: 0 },
//!     Op::Free { id: 0 },
//!     Op::Free { id: 1 },
//! ];
//! let w = Workload::new("two", ops)?;
//! assert_eq!(w.peak_live(), 2 << 20);
//! for stack in replay::stacks::<Arc<mrstack::leaf::Simulated>>() {
//!     let cap = replay::min_capacity(stack.as_ref(), &w, 0.001)?;
//!     assert!(cap.capacity >= w.peak_live(), "{}", stack.name());
//! }
//! # Ok(()) }
//! ```
//!
//! # Record a log from your program, then replay it
//!
//! Put the `Logging` adaptor at the top of your program's stack. It writes one CSV line per
//! allocation and free, in RMM's format (`Thread,Time,Action,Pointer,Size,Stream`):
//!
//! ```no_run
//! use mrstack::prelude::*;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let ctx = mrstack::cuda_context(0)?;
//!     let mr = resource_stack![
//!         Cuda::new(&ctx)?,
//!         Pool { initial: 1 GiB },
//!         Logging { to: Box::new(std::fs::File::create("alloc.csv")?) }, // what your code asks for
//!     ];
//!     // … run your program with `mr` …
//!     drop(mr); // flushes the log
//!     Ok(())
//! }
//! ```
//!
//! Then replay it (plain or gzipped, told by its content). Logs that RMM's
//! `logging_resource_adaptor` writes replay the same way; so does the C library's `MRSTACK_LOG`
//! ([C library](super::c_library)).
//!
//! A log that comes from several threads is replayed the same way: each thread gets its own OS
//! thread and keeps its own order. A free that another thread made waits until the allocation it
//! frees exists. At most 256 OS threads run (`MAX_REPLAY_THREADS`): in a log of more threads,
//! thread `t` shares OS thread `t % 256` with others, which runs their ops merged in log order.
//! `--sequential` replays the log in file order on one thread.
//!
//! Threads that run at once can hold more than the log's order shows. The answer stays the same
//! from run to run this way: the **min capacity** comes from a replay in log order
//! (deterministic), and the timing capacity is twice what the threads can hold in *any*
//! interleaving: the sum, over the OS threads, of the most each one has allocated and not yet
//! freed at any point (`Workload::threaded_peak`; the table shows it as "up to … with its threads
//! at once"). A stack that completes in log order then has room to complete however its threads
//! interleave.
//!
//! Options: `--passes N` (timed passes, default 5), `--precision P` (how precise the capacity
//! search is, default 0.001), `--no-capacity`, `--upstream auto|simulated|cuda`, `--quiet` (no
//! progress bar). `--allocations N` (at most 10,000,000) and `--seed S` change the built-in
//! workload.
//!
//! # Bad logs
//!
//! Bad logs never cause a panic. A malformed line, a free of a pointer that was never allocated,
//! an allocation larger than any resource can serve (over `isize::MAX` once rounded up to 256
//! bytes), live bytes that overflow, a line over 64 KiB, or a file cut short (truncated gzip)
//! stops the replay with a message that names the file and line. So does a log past what a replay
//! holds in memory: more than 2^26 (67 million) allocations and frees, or more than 4096 distinct
//! streams (the replay makes a CUDA stream for each):
//!
//! ```text
//! error: alloc.csv: line 3: free of 0x200, which is not a live allocation (never allocated, or freed twice)
//! hint: --on-error skip leaves bad lines out and replays the rest
//! ```
//!
//! With `--on-error skip`, bad lines are left out and counted, their reasons are printed, and the
//! rest is replayed (the free of an allocation left out is left out with it); the hint appears
//! only for errors that skipping can cure, not for a missing file, a directory or a bad header. A
//! log with nothing to replay (a header only) prints the workload line and "nothing to time", and
//! no table. Host memory follows what the log holds live, never the sizes it names: a log of one
//! 2^62-byte allocation replays in a few MiB. Exit status: `0` on success, `1` for a trace or
//! replay error, `2` for a usage error (a bad option or an unknown stack name: the message lists
//! the names that exist).
