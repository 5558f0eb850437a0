//! Performance: the latest measured tables, each from one run of one command on one machine, and
//! the commands that made them. Compare figures only within one table: machines differ by up to
//! 2x for the same binary, and one-thread figures move between runs. The detailed result files stay
//! in `benches/` (`benches/rmm/results-*.md`, `benches/gpu-results-*.md`).
//!
//! # Side by side with RMM
//!
//! `bash scripts/gpu-bench-rmm` (on a GPU machine, with `gpu-bin/` from `scripts/gpu-test`; knobs
//! in its header) compiles RMM's side (`benches/rmm/rmm_bench.cpp`) with the machine's nvcc
//! against the `librmm-cu13` wheel, then replays the same op files through RMM's resources and
//! mrstack's stacks, alternating between the two libraries, with a warm-up pass and then the
//! median of the timed passes. `scripts/rmm-bench-check` runs the same steps where there is no
//! GPU (RMM's side over host memory, mrstack's over `Simulated`). The table is one call of 341 s
//! on an NVIDIA H100 80GB HBM3 (driver 580.159.04, nvcc 13.0; host: 16 cores of an Intel Xeon),
//! RMM 26.10.00, 2026-11-24:
//!
//! ```text
//! RMM_BENCH_THREADS=1,8,16 RMM_BENCH_MIN_OPS=200000 RMM_BENCH_BUDGET_MS=600 RMM_BENCH_PASSES=3 \
//! RMM_BENCH_STACKS=cuda_async,pool,tlsf,heaps,tlsf+cache,binning,arena,binning+arena \
//! RMM_BENCH_WORKLOADS=random,resnet50_train_pytorch,transformer_infer,transformer_train \
//! RMM_BENCH_DEADLINE_S=400 bash scripts/gpu-bench-rmm
//! ```
//!
//! The workloads: *random* (50,000 allocations of 1 B to 1 MiB), and three traces of
//! `data/traces`: PyTorch's ResNet-50 training, the transformer inference with random shapes and
//! the transformer training with random lengths. Each is repeated until it has 200,000 ops (each
//! copy frees what the one before left live, so the peak stays the workload's). Each runs at 1, 8
//! and 16 threads, the allocations dealt round-robin (each thread frees what it allocated), each
//! thread on a stream of its own (`own`) or all on the default stream (`one`); a log of several
//! threads also as recorded (`logged`, where a thread frees blocks another allocated). ns/op is the
//! aggregate: wall time over all ops of all threads, so a stack that scales perfectly shows 1/8 of
//! its one-thread figure at 8 threads.
//!
//! The stacks: `pool`, `binning` (over the pool), `arena`, `binning+arena` and `cuda_async`, each
//! against RMM's counterpart, and three with no RMM counterpart: `tlsf`
//! (`Tlsf { initial: cap, max: cap }`), `heaps` (`ThreadHeaps { max: cap }`) and `tlsf+cache`
//! (that `Tlsf` under a `ThreadCache { bytes: cap / 4 }`). The best stack of each library per row
//! (ns/op; a ratio below 1: mrstack is faster); every pair of stacks and the throughput against
//! one thread are in `benches/rmm/results-2026-11-24-h100-same-lane.md`, 2 and 4 threads in
//! `benches/rmm/results-2026-11-24-h100-heaps-2-4-threads.md`:
//!
//! | workload | threads | streams | mrstack best | RMM best | mrstack/RMM |
//! |---|---:|---|---:|---:|---:|
//! | random | 1 | own | 23.8 (binning+arena) | 243 (binning) | 0.10 |
//! | random | 1 | one | 26.4 (binning+arena) | 566 (binning+arena) | 0.05 |
//! | random | 8 | own | 30.6 (heaps) | 608 (binning+arena) | 0.05 |
//! | random | 8 | one | 20.5 (heaps) | 1,333 (binning) | 0.02 |
//! | random | 16 | own | 17.3 (heaps) | 343 (arena) | 0.05 |
//! | random | 16 | one | 15.8 (heaps) | 1,411 (binning+arena) | 0.01 |
//! | resnet50_train_pytorch | 1 | own | 58.7 (tlsf) | 437 (pool) | 0.13 |
//! | resnet50_train_pytorch | 1 | one | 61.4 (heaps) | 562 (pool) | 0.11 |
//! | resnet50_train_pytorch | 2 | logged | 104 (tlsf+cache) | 645 (binning) | 0.16 |
//! | resnet50_train_pytorch | 8 | own | 15.8 (heaps) | 702 (binning) | 0.02 |
//! | resnet50_train_pytorch | 8 | one | 14.3 (heaps) | 1,507 (binning) | 0.01 |
//! | resnet50_train_pytorch | 16 | own | 10.3 (heaps) | 776 (binning) | 0.01 |
//! | resnet50_train_pytorch | 16 | one | 11.4 (heaps) | 1,721 (binning) | 0.01 |
//! | transformer_infer | 1 | own | 66.2 (tlsf) | 233 (binning) | 0.28 |
//! | transformer_infer | 1 | one | 86.3 (tlsf) | 325 (pool) | 0.27 |
//! | transformer_infer | 8 | own | 15.4 (heaps) | 941 (binning) | 0.02 |
//! | transformer_infer | 8 | one | 12.3 (heaps) | 1,500 (binning) | 0.01 |
//! | transformer_infer | 16 | own | 9.6 (heaps) | 1,057 (binning) | 0.01 |
//! | transformer_infer | 16 | one | 9.3 (heaps) | 1,578 (binning) | 0.01 |
//! | transformer_train | 1 | own | 100 (tlsf) | 274 (binning) | 0.37 |
//! | transformer_train | 1 | one | 92.4 (tlsf) | 386 (pool) | 0.24 |
//! | transformer_train | 2 | logged | 243 (tlsf+cache) | 950 (binning) | 0.26 |
//! | transformer_train | 8 | own | 18.1 (heaps) | 881 (binning) | 0.02 |
//! | transformer_train | 8 | one | 13.3 (heaps) | 1,678 (binning) | 0.01 |
//! | transformer_train | 16 | own | 10.2 (heaps) | 1,050 (binning) | 0.01 |
//! | transformer_train | 16 | one | 9.7 (heaps) | 1,834 (binning) | 0.01 |
//!
//! * mrstack's best is faster than RMM's best in all 26 rows (0.01–0.37 of its time).
//! * **Many threads: `ThreadHeaps`.** Each thread allocates from a `Tlsf` of its own and frees
//!   into it, so threads that free what they allocate share no lock: at 8 and 16 threads it is the
//!   best stack in every row, 9.3–18.1 ns/op aggregate on the traces where RMM's best takes
//!   702–1,834. Where a thread frees the other's blocks (`logged`), `tlsf+cache` is faster.
//! * **One thread:** 23.8–26.4 ns/op on *random* (`binning+arena`), 58.7–100 on the traces
//!   (`tlsf` best in five rows of six).
//! * `pool`, `tlsf`, `binning`, `tlsf+cache` and `cuda_async` lose throughput with threads, as
//!   RMM's stacks do: each serializes on a shared lock (`std`'s mutex, whose waiters park in the
//!   kernel). Locks that spin before they park made the rows with one stream 2–4x faster at 8 and
//!   16 threads but the rows with a stream per thread 1.3–3x slower at 16, so `std`'s mutex stays
//!   (`benches/rmm/lock-experiments-2026-11-24.md`).
//!
//! # Footprint and speed of each preset, one thread on a GPU
//!
//! `gpu-bin/bench/gpu` (built by `scripts/gpu-test`, run by `bash gpu-bin/run.sh bench`): one
//! thread over `Cuda`, ns/op the median of 5 timed passes after a warm-up, each stack built with
//! twice the peak live bytes; min capacity / peak live over `Simulated` (to 0.1%, `vmm` with the
//! 2 MiB page model). One run on an NVIDIA H100 80GB HBM3, 2026-11-24
//! (`benches/gpu-results-2026-11-24-h100.md`); min capacity / ns/op:
//!
//! | stack | random | resnet50_train | transformer_infer | transformer_train | resnet50_train_pytorch |
//! |---|---|---|---|---|---|
//! | `cuda` (`cuMemAlloc`) | – / 21,211 | – / 46,766 | – / 40,100 | – / 37,595 | – / 43,837 |
//! | `cuda-async` | – / 2,516 | – / 1,492 | – / 1,289 | – / 1,529 | – / 1,520 |
//! | `pool` | 1.011 / 414 | 1.011 / 239 | 1.085 / 169 | 1.121 / 232 | 1.007 / 188 |
//! | `tlsf` | 1.012 / 125 | 1.017 / 104 | 1.085 / 86 | 1.120 / 100 | 1.011 / 97 |
//! | `vmm` | 1.011 / 174 | **1.003** / 155 | **1.017** / 139 | **1.024** / 146 | **1.003** / 138 |
//! | `binning` | 1.358 / 39 | 1.019 / 125 | 1.099 / 117 | 1.195 / 153 | 1.016 / 109 |
//! | `arena` | 1.042 / 184 | 1.011 / 284 | 1.098 / 220 | 1.177 / 337 | 1.020 / 253 |
//! | `heaps` | 1.012 / 138 | 1.021 / 118 | 1.305 / 105 | 1.157 / 72 | 1.015 / 61 |
//!
//! * `vmm` (`VirtualMemory` over `DevicePages`: a TLSF index over a virtual range of twice the
//!   device's memory, physical 2 MiB pages mapped only under live blocks, its cache of free mapped
//!   pages the whole capacity, emptied only under pressure) needs the least memory on every trace:
//!   within 1.05x of the peak live bytes on all, within 1.01x on both ResNet-50 training traces,
//!   1.024x on transformer_train. There, at its worst moment, 227 live blocks of about 200 distinct
//!   sizes lie in 23 runs with free holes between them, and 25 of the 425 pages of 2 MiB they touch
//!   are partly free (2 MiB is the smallest page the H100 maps). `scripts/placement-bound` models
//!   any placement over 2 MiB pages: none reaches the 419 pages that 1.01x allows on that trace,
//!   not even one that knows every block's lifetime (421).
//!   `cargo run --release --example page_footprint -- data/traces/transformer_train.csv.gz` counts
//!   the pages a log's live blocks touch after every allocation.
//! * On the same GPU, `mrstack replay --upstream cuda` saw `vmm` map, its cache included, 532 MiB
//!   for 490 MiB live on transformer_infer, 970 MiB for 830 MiB on transformer_train, and 5.51 GiB
//!   for 5.43 GiB on resnet50_train_pytorch.
//! * The driver's page calls (the same bench, 64 pages of 2 MiB, median of 5 rounds): a page
//!   mapped (`cuMemCreate` + `cuMemMap` + `cuMemSetAccess`) costs 42.6–55.0 µs, unmapped
//!   (`cuMemUnmap` + `cuMemRelease`) 28.9–33.7 µs. That is why `VirtualMemory` keeps free pages
//!   mapped: a workload whose working set repeats maps nothing after its first pass, and
//!   unmapping happens in batches (down to half the cache), each after one synchronization of the
//!   streams that freed blocks since the last.
//!
//! # The default stack in PyTorch training
//!
//! `capi/python/footprint_torch.py --stack paged --steps 20 --rounds 3`, then the same with
//! `--model resnet50 --min-batch 64 --max-batch 160` (each allocator in a process of its own, run
//! three times taking turns after one native run that is not counted, each round starting one
//! allocator later; both models in one call on an NVIDIA H200, torch 2.11, 2026-11-28).
//! GPT-style training: 12 pre-norm layers, d_model 1024, 16 heads, vocabulary 32,000, sequence
//! length 128–1024 and batch 8–24 drawn at every step. ResNet-50: torchvision's, SGD, 224-pixel
//! random images, batch 64–160 drawn at every step. 3 warm-up and 20 timed steps a run; ResNet-50's
//! warm-up also runs one step at each batch size the timed steps draw (19 more), since cuDNN plans
//! each new convolution shape on the host, tens of milliseconds that would otherwise time cuDNN
//! rather than the allocator (without it, its runs' median steps spread over 104–176 ms whatever
//! the allocator; with it, 56.8–57.1 ms). Peak in use: `cuMemGetInfo`'s total − free, sampled
//! every millisecond during the timed steps, the highest of the three runs; ratio: that peak less
//! what native mode holds outside its allocator (native's peak in use − its
//! `max_memory_reserved`) over native's `max_memory_allocated` (23.87 GiB for the GPT, 13.19 GiB
//! for ResNet-50); step time: the median of the runs' median steps; × native: the median over the
//! rounds of the run's median step over native's run's in the same round (the host's speed
//! drifts over minutes; within a round it drifts less).
//!
//! | model | allocator | peak in use | ratio | median step ms | × native |
//! |---|---|---:|---:|---:|---:|
//! | GPT | PyTorch native | 28.65 GiB | 1.169 | 256.5 | 1.000 |
//! | GPT | PyTorch expandable segments | 25.54 GiB | 1.039 | 256.3 | 0.999 |
//! | GPT | mrstack `paged` | 25.00 GiB | **1.017** | 256.4 | **0.999** |
//! | ResNet-50 | PyTorch native | 24.06 GiB | 1.767 | 57.0 | 1.000 |
//! | ResNet-50 | PyTorch expandable segments | 14.19 GiB | 1.018 | 57.0 | 1.002 |
//! | ResNet-50 | mrstack `paged` | 14.14 GiB | **1.015** | 57.1 | **1.000** |
//!
//! Each run's median step, in round order: GPT native 256.4, 256.6, 256.5 ms, expandable
//! segments 256.8, 256.3, 256.3, `paged` 256.4, 256.4, 256.1; ResNet-50 native 56.8, 57.0, 57.0,
//! expandable segments 57.0, 57.1, 57.0, `paged` 57.1, 57.0, 57.1. Losses: equal to native's for
//! ResNet-50; for the GPT, 3 of its 23 steps' losses differ from native's in the last bits (at
//! most 3.1e-05 of about 100), for PyTorch's own expandable segments as for `paged` (no
//! deterministic mode here). Over its first run, `paged`
//! mapped 12,692 pages and unmapped 267 for the GPT, 6,891 and 36 for ResNet-50, and waited
//! 0 ms for the device in both, its slack never doubled (the C library's statistics: `maps`,
//! `unmaps`, `waited_ns`, `slack_doublings`). In one more GPT run that day (1.017, 0.998x
//! native's step), no allocation found its stream's heap held by the other thread (`busy`: 0):
//! PyTorch's forward and backward threads take turns on their stream. The same two commands on
//! 2026-11-29, with the threads' heaps borrowing a left stream heap's pages (never called on
//! here: no heap was left), gave the same peaks (25.00 and 14.14 GiB: 1.017 and 1.015), steps
//! 0.998x and 1.001x native's, and the same pages mapped and unmapped.
//!
//! Page size. `capi/python/kernels_torch.py` times kernels on memory from each allocator. On 2
//! MiB pages (the device's granule, `paged`'s default) a 2 GiB copy took 1.084–1.104 ms, against
//! 1.008–1.021 on native's, expandable segments' and `cuda_async`'s memory; on `paged`'s own
//! pages of 4, 8, 16 and 32 MiB (`paged(page=…)`) 1.057, 1.024, 1.007 and 1.011–1.016 (each
//! allocator run once). The script itself (`--stack paged --stack 'paged(page=16MiB)'`, two
//! rounds, the lowest round's mean) gave 1.002 ms on native's memory, 1.003 on expandable
//! segments', 1.025 on `paged`'s and 1.006 on 16 MiB pages. A gather over 2 GiB, a 3x3
//! convolution and a batch norm took the same time on every allocator's memory (within 0.4%).
//! The GPT on 16 MiB pages held 1.027 (2 MiB: 1.017, same call) at the same step time: larger
//! pages are for programs bound by memory bandwidth, at some footprint.
//!
//! How `paged` holds the GPT's peak: each heap keeps its mapped pages within the peak of its
//! live pages and a 64th of it ([`PagedHeapsConfig::peak_slack`](crate::leaf::PagedHeapsConfig::peak_slack)).
//! A block that needs new pages beyond that first unmaps free pages whose freeing work is known
//! done (settled: an event recorded on the freeing streams is reached; free pages near the bound
//! are marked at most every 32 calls and every 50 µs, so they keep settling), and their physical
//! memory moves to its pages (`cuMemUnmap`, then `cuMemMap` of the same allocation); where too
//! few are settled and a batch marked earlier is pending, it waits for that batch (the device
//! keeps working meanwhile: only the work queued before the marks is waited for). Without that
//! wait the GPT held 1.045: PyTorch queues a step ahead of the device, so the pages freed during
//! the step had not settled when the next peak came. Where swapping pages for the bound (the
//! remap and the new page's `cuMemSetAccess`) takes over a fortieth of the time in a second, a
//! quarter of a tenth of one, or half of 20 ms, the slack doubles (up to 64 times; the heaps of
//! one `PagedHeaps` count their swaps together, since the driver serializes them): the GPT never
//! doubled it, while the replays below did within their first pass.
//!
//! The log of a `paged` run of the GPT is `data/traces/gpt_train_pytorch.csv.gz`. Replayed in its
//! order over `Simulated` pages (`mrstack replay data/traces/gpt_train_pytorch.csv.gz --stack
//! paged --upstream simulated --sequential --no-capacity`), it maps 26.57 GiB for 26.12 GiB of
//! peak live bytes (1.017; 27.31 GiB, 1.0455, with no bound), each pass unmapping and mapping
//! about 1,465 pages again. `mrstack replay --upstream cuda --sequential --no-capacity --passes 5`
//! mapped 528 MiB for transformer_infer's 489.9 MiB (1.078; `vmm`: 532 MiB) and 956 MiB for
//! transformer_train's 830.0 MiB (1.152; `vmm`: 970 MiB): those replays do little but allocate, so
//! their slack doubled, twice and three times (before the heaps counted a swap's access grant
//! and swaps over 20 ms, once each: 512 and 876 MiB, 1.045 and 1.055, at up to five times the
//! time a pass). They cannot keep a bound near 1.03 at a pace worth having: over
//! `Simulated`, with no doubling, each pass of transformer_infer swaps about 450 pages for a peak
//! of 245 live ones (the same pages go back and forth), while with no bound it maps 266 and
//! swaps none.
//!
//! `python3 scripts/vmm-costs.py` on an H200 (2026-11-28): a 2 MiB page costs `cuMemCreate`
//! 9–12 µs, `cuMemMap` 2–3 µs, `cuMemSetAccess` 21–26 µs, `cuMemUnmap` 14–17 µs and
//! `cuMemRelease` 10–12 µs (each per page, in runs of 1, 16 and 128 pages, whether
//! `cuMemSetAccess` and `cuMemUnmap` are called per page or once per run); a swap of one page
//! (unmapped at one address, mapped at another) costs 60.0 µs given back and made anew, 39.3 µs
//! with the same allocation moved (0.65x). A swap costs the same whatever the page's size:
//! 39.1 µs for 2 MiB, 39.3 for 16 MiB, 39.7 for 64 MiB. The calls cost per mapping, not per
//! byte, so pages of 16 MiB move memory for the bound at an eighth of the cost per byte of 2 MiB
//! pages, beside their bandwidth; their price is the footprint's coarser grain. Mapping or
//! unmapping pages no work uses does not wait for a kernel running on another stream;
//! `cuEventRecord` costs 0.9–1.7 µs and `cuEventQuery` 0.6–1.0 µs, which is why marks are
//! recorded and queried at most every 32 calls, and 50 µs apart at least. The same script on
//! 2026-11-29: one allocation of 4 pages mapped whole took 23.3 µs to map and enable and 14.8 to
//! unmap (16 pages: 31.9 and 19.0), against about 100 and 60 for 4 allocations of a page; mapping
//! part of an allocation (a nonzero offset into it) fails with `CUDA_ERROR_NOT_SUPPORTED`, so an
//! allocation of several pages maps, moves and goes back only whole.
//!
//! The same stack in the RMM side-by-side harness (`RMM_BENCH_ROUNDS=3
//! RMM_BENCH_MRSTACK_STACKS=paged RMM_BENCH_STACKS=paged,cuda_async,pool,binning,arena
//! RMM_BENCH_THREADS=1,8,16 RMM_BENCH_WORKLOADS=random,transformer_infer,transformer_train
//! RMM_BENCH_DEADLINE_S=330 bash scripts/gpu-bench-rmm`, H200, 2026-11-29,
//! `benches/rmm/results-2026-11-29-h200-paged.md`), ns/op (wall time over all threads' ops), each
//! the fastest of its rounds (two: the deadline cut the third), and its ratio to RMM's best of
//! `cuda_async`, `pool`, `binning` and `arena` in the same run; the one-thread rows are from a
//! later call of six rounds on one thread (`RMM_BENCH_THREADS=1 RMM_BENCH_ROUNDS=6
//! RMM_BENCH_DEADLINE_S=300`, the same file), for the reason below:
//!
//! | workload | threads | own streams: `paged` / RMM's best | one stream: `paged` / RMM's best |
//! |---|---:|---:|---:|
//! | random | 1 | 134 / 212 (0.63) | 128 / 285 (0.45) |
//! | random | 8 | 30.2 / 632 (0.048) | 29.7 / 1,213 (0.024) |
//! | random | 16 | 14.7 / 350 (0.042) | 30.6 / 1,422 (0.022) |
//! | transformer_infer | 1 | 128 / 222 (0.58) | 124 / 292 (0.43) |
//! | transformer_infer | 8 | 25.1 / 770 (0.033) | 23.3 / 1,432 (0.016) |
//! | transformer_infer | 16 | 13.7 / 901 (0.015) | 21.2 / 1,536 (0.014) |
//! | transformer_train | 1 | 116 / 274 (0.42) | 108 / 313 (0.34) |
//! | transformer_train | 8 | 25.0 / 757 (0.033) | 29.6 / 1,597 (0.019) |
//! | transformer_train | 16 | 14.8 / 891 (0.017) | 23.5 / 1,652 (0.014) |
//!
//! One-thread figures on this host take one of two speeds for a whole process, on both sides,
//! whatever core it is pinned to: the passes of one process agree within 2%, while in the six
//! rounds of random's one thread on streams of their own `paged` took 134–239 ns/op and RMM's
//! `binning` 212–484. The call of every thread count drew the slow speed for `paged` in both
//! rounds of transformer_infer (237 / 238 ns/op, 1.02 and 0.72 of RMM's best) and random's own
//! streams (137, 0.34 against `binning`'s slow 403). Old and new builds of `paged`, alternated in
//! one call, showed the same two speeds. Two more calls of six rounds (the same file), on builds
//! of 11% and then 14% fewer instructions an allocation and its free, gave `paged` over RMM's
//! best 0.56 and 0.52 on random's own stream, 0.66 and 0.51 on transformer_infer's, 0.57 and 0.72
//! on transformer_train's (all six rounds of the last at the slow speed, 183–213 ns/op), and
//! 0.29–0.42 on one stream: across the three calls, 0.42–0.72 where the table says 0.42, the
//! host's two speeds rather than the builds.
//!
//! With 8 or 16 threads on one stream, the stream's heap is left to the threads' own heaps within the
//! warm-up (they meet there at once), so every timed pass runs on heaps that hold the same
//! blocks as the pass before: random's 8 threads on one stream took 28.5–48.7 ns/op a pass.
//! Where threads instead went back to the stream's heap now and then, what each heap held kept
//! shifting, and each pass mapped tens of new pages as some heap passed its own peak: the same
//! cells took 67.5 ns/op (8 threads) and 27.7 (16) in a call of that rule, its passes
//! 28.8–218.8.
//!
//! Up to four threads on one stream share its heap: one that finds it held waits for the other's
//! call, unless a fifth thread found it held within 100 ms. `mrstack replay --stack paged,vmm
//! --passes 3 --no-capacity data/traces/X.csv.gz` replays the two-thread logs with their threads
//! at once where the log ran them in turns, and shows beside each stack's upstream peak what its
//! threads held at once in the same passes. Upstream peak over held at once, each run:
//!
//! | log | `paged`, `Simulated` | `paged`, H200 | `vmm`, H200 |
//! |---|---:|---:|---:|
//! | transformer_train | 1.04, 1.05, 1.02, 1.06, 1.03 | 1.16, 1.05, 1.07, 1.17, 1.16 | 1.19, 1.03, 1.18, 1.27 |
//! | resnet50_train_pytorch | 1.01, 1.01, 1.01, 1.02, 1.01 | 1.01, 1.01, 1.01, 1.02, 1.02 | 1.00, 1.02, 1.02, 1.02 |
//! | gpt_train_pytorch | 1.00, 1.01, 1.00, 1.01, 1.00 | 1.02, 1.02, 1.03, 1.01, 1.03 | 1.04, 1.08, 1.09, 1.10 |
//! | transformer_train, 4 threads | 1.01, 1.04, 1.04, 1.05, 1.04 | 1.06, 1.12 | 1.21, 1.19 |
//!
//! Without the bound (`peak_slack: usize::MAX`), transformer_train's log on the H200 mapped 1.19
//! and 1.18 times what its threads held (two runs, 2026-11-29; with it, in the same call, 1.14
//! and 1.09, the slack doubled three times and twice), against 1.02–1.03 over `Simulated` on a
//! 2-core build host. Unbounded, the heap mapped fewer pages on the H200 (568 and 580, against
//! 652), but its threads held less at once (954 and 979 MiB, against 1.25 GiB): what the bound
//! cannot take back there comes from the threads' interleaving, not from the slack.
//!
//! The last row is transformer_train's log with a copy of its two threads (threads 2 and 3, at
//! addresses 2^44 higher, each op a microsecond after the one it copies); with only two threads
//! sharing a stream's heap (a third made it crowded), its `paged` runs over `Simulated` took 1.07,
//! 1.91, 1.67 and 1.52. transformer_train's log holds 1 GiB, and its replay does little but
//! allocate, so its slack doubles (as above). When each thread instead went to its own heap where it found the other in
//! the stream's (and both, for good, after 16 such meetings within 100 ms), the H200's GPT runs
//! mapped 1.29 to 2.06 times what the threads held, at up to 23.7 µs an op against 0.57–0.72
//! sharing: the replay starts new OS threads every pass, which take the thread slots, and so the
//! heaps, in a different order, so each heap's pages rose to the peaks of both threads' parts,
//! and pages moved between heaps at tens of microseconds each. The price of sharing is the two
//! threads' throughput on one lock: the two-thread cell of the side-by-side harness
//! (transformer_train as logged) took 666 ns/op against RMM's best 1,310 (0.51; 278 against 796,
//! 0.35, in the run of the table above, with a heap each).
//!
//! Heaps that all reach their peaks within 100 ms keep their pages: moving a page between heaps
//! costs a swap, and with every heap's pages taken down to the peak of what all of them hold,
//! transformer_infer on 16 threads of their own streams over the GPU took 643–940 ns/op in each of
//! six passes, against 13.7 in the table above. Only the left heaps lend their pages: with every
//! heap lending, transformer_train on 8 threads over `Simulated` took 116–155 ns/op against 45–54
//! and mapped more, not less (1.31–1.59 GiB against 0.93–1.34): each thread's blocks scattered
//! over the heaps, each page shared by more of them.
//!
//! Against its own one thread in the call of every thread count (own streams), `paged` runs 4.5x
//! (random), 9.4x and 8.7x as many ops on 8 threads, and 9.3x, 17.3x and 14.7x on 16, from
//! one-thread figures at the slow speed; against the six-round call's one thread, 4.4x, 5.1x and
//! 4.6x on 8 and 9.1x, 9.3x and 7.8x on 16. Every heap sits on cache lines of its own:
//! with the heaps side by side instead (neighbours' lock words on one line), random on 8 threads
//! over `Simulated` on the same host took 35.7–36.4 ns/op against 24.4–25.6 apart (16 threads:
//! 19.4–19.7 against 14.4–18.0; transformer_train on 16 threads 19.9–20.9 against 15.0).
//! The host has 16 cores of one thread each, yet `ThreadHeaps`, whose threads share nothing but
//! the replayer, scales about as far: in one call of `rmm run` over `Simulated` and over the
//! GPU, random on streams of their own took it 92–143 ns/op on one thread, 19–28 on 8 and
//! 14–19 on 16 (`paged`: 121–208, 28–32 and 17–26). Each thread runs up to about twice as
//! slow with eight at once whichever stack it uses. `rmm ceiling` measures what the host allows
//! work that shares nothing (each thread updating a table of its own at random): on the GPU host
//! (a virtual machine of 16 cores, one NUMA node) tables of 256 KiB, within a core's L2, ran
//! 7.5–7.7x as fast on 8 threads and 13.3x on 16, but tables of 8 MiB only 3.4x and 6.0x. The
//! replays sit between the two, as work whose data spills from a core's own caches: with op
//! files of a million ops (`write-ops --min-ops 1000000`, so that a pass of 16 threads takes
//! milliseconds, not a scheduler's tick), `paged` ran random 4.5x as fast on 8 threads as on one
//! and 8.7x on 16, transformer_train 4.4x and 7.4x, `ThreadHeaps` random 5.4x and 8.6x. The
//! threaded replayer reads each thread's ops in order, each with its size, stream and hand-over
//! slot at hand; reading them from tables by allocation id, dealt round-robin to the threads,
//! `paged` took 14.9–16.7 ns/op on random's 16 threads and 18.5–18.8 on transformer_train's,
//! against 13.7 and 15.2–16.8.
//!
//! One thread is where `paged` is weakest, and where the host moves most (above): random on
//! one thread over `Simulated` on the GPU host took 97–106 ns/op in some runs and 141–169 in
//! others, each run's passes alike. Hence the rounds, and the fastest of them. Replaying random
//! and transformer_infer on one thread alternately over the GPU and over `Simulated` in one
//! call, `tlsf` took 53–152 ns/op and `paged` 113–284,
//! whichever the page source and the stream: the one-stream cells are no slower than the
//! own-stream ones beyond that spread. A TLSF index with records kept apart costs 70–100 ns/op
//! over `Simulated` on one thread, and `paged` about 25 more than `tlsf` (87 against 62 on
//! random's one stream, on a build host): 7 for the heaps' routing (`vmm`: 81), the rest for the
//! pages under each block. In instructions (callgrind over `rmm run W.1-own.ops --stacks paged
//! --passes 2 --simulated`, 2026-11-29), an allocation and its free take 1,668 on
//! transformer_train's ops, 1,784 on transformer_infer's and 1,557 on random's, about 840 of them
//! in the TLSF index; a block within one page that other live blocks share costs a count on that
//! page, and nothing more of the page table, and any other block within one chunk of the table
//! (512 MiB of pages) looks that chunk up once.
//!
//! The host, not the allocator, picks a process's speed: on the GPU host (2026-11-29), ten
//! processes of a pointer chase over 2 MiB took 11–14 ns a step in some and 20–25 in others, and
//! ten of `rmm run` over `Simulated` took `paged` 110–115 ns/op on random's one thread in some
//! and 172–217 in others (`tlsf`, 79–83 or 106–155). Transparent huge pages for the heap
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) left both speeds as they were.
//!
//! Two ways to fewer instructions were measured and left out (callgrind over `rmm run … --stacks
//! paged --simulated` on one thread, `allocate` and `deallocate` together):
//!
//! * Keeping up to 128 blocks freed whole, out of the free ranges, each for the next request of
//!   its size on its stream (as glibc malloc's fast bins; every kept block back in the free
//!   ranges before a page is mapped): 25% fewer on transformer_train, but 1.4% more on
//!   transformer_infer, whose large blocks' pages the bound had unmapped by the time their size
//!   came back, and 26% more on random, whose sizes rarely repeat. Placement drifted too: eight
//!   threads repeating the same random work mapped 45.1, 45.7, 46.3 … 48.1 MiB over ten passes,
//!   where without kept blocks every pass maps what the first did.
//! * Placing a request whose block would need pages mapped in another free range whose pages
//!   are all mapped (84% of such requests on transformer_train had one among the heap's free
//!   ranges): 8–12% fewer pages mapped there, 6–9% more on transformer_infer, 12–30% more time
//!   an op, and the min capacity rose from 1.024 to 1.031 of peak live (transformer_infer: 1.017
//!   to 1.021): the class search's fit packs pages tighter than a place chosen for its mapped
//!   pages.
//!
//! Which cached pages a swap or a trim takes first decides how often the same pages go back and
//! forth. Over `Simulated` (`mrstack replay data/traces/X.csv.gz --stack paged --upstream
//! simulated --sequential --no-capacity --passes 3`: a warm-up and three passes, 2026-11-29),
//! the pages mapped and, of them, those swapped, with each order (the highest first is the rule):
//!
//! | order | transformer_train | transformer_infer | gpt_train_pytorch |
//! |---|---:|---:|---:|
//! | highest address first | 2,605 / 2,174 | 2,161 / 1,909 | 19,290 / 5,686 |
//! | lowest address first | 8,435 / 8,004 | 4,214 / 3,962 | 151,615 / 137,802 |
//! | freed longest ago first | 3,793 / 3,362 | 3,258 / 3,006 | 26,935 / 13,331 |
//! | freed last first | 4,610 / 4,179 | 2,485 / 2,233 | 82,848 / 69,244 |
//! | deepest into its free range first | 2,597 / 2,166 | 2,255 / 2,003 | 19,506 / 5,902 |
//! | in the largest free range first | 2,559 / 2,128 | 2,251 / 1,999 | 19,459 / 5,855 |
//!
//! resnet50_train mapped 2,866–2,876 pages and swapped 82–92 whatever the order. Taking the
//! lowest-addressed fit of a larger class (as `Tlsf` does) swapped 1,873, 1,875 and 5,069 pages,
//! but raised transformer_train's min capacity from 1.024 to 1.027 of peak live. The pages a block
//! needs come in runs: in one such replay, 2,079 of transformer_train's 2,670 pages mapped came in
//! runs of four or more (5.4 a mapping on average), 2,011 of transformer_infer's 2,121 (6.9), and
//! 19,094 of the GPT's 19,407 in runs of six or more (44). One allocation for each run would cut
//! the driver's time for them about fourfold (23.3 µs to map four pages as one allocation, above,
//! against about 100 as four), but an allocation goes back only whole: a free page that shares one
//! with a live block's page could not go back, under pressure or at `release`, so runs are left
//! out.
//!
//! Swapping a page costs a remap (18–21 µs) and its access grant (25–30 µs per page,
//! `cuMemSetAccess` on each run of new pages). The harness's transformer_infer ops (its log seven
//! times over) swap about 2,900 pages a pass over `Simulated` with the bound at its first
//! slack, nearly all for blocks of 8 MiB and more: 113 ms of swaps on a GPU against 8 ms of
//! bookkeeping, which is why the slack doubles there. On transformer_infer's log, replayed on one
//! thread over the GPU with the bound at its first slack, 420 swaps a pass took 21 ms of 27.
//! With the slack doubling once swaps take half of 20 ms, the passes go 37, 11 and then
//! 2.2–2.3 ms (16 swaps a pass), and transformer_train's 52, 18, 13, 6.2, then 5.5 ms. Each of
//! the first 16 streams a `PagedHeaps` sees gets a heap of its own, so threads on streams of
//! their own share no lock; threads on one stream find its heap busy and settle in heaps of
//! their own.
//!
//! # Clients through the C library
//!
//! `bash gpu-bin/run.sh clients` ([C library](super::c_library#the-gpu-proof)) on an NVIDIA H200
//! (driver 580.159.04; torch 2.11.0+cu130, torchvision 0.26.0+cu130, CuPy 14.2.0, cuDNN 9.19),
//! 2026-11-29: `clients: 98 passed, 0 failed`. ResNet-50 training, batch 64, 5 warm-up and 50
//! timed steps (55 losses compared):
//!
//! | config | median step ms | ratio to native | peak device MiB | stack peak live MiB | losses equal |
//! |---|---:|---:|---:|---:|---|
//! | native | 35.28 | 1.000 | 7429 | 5583 * | (reference) |
//! | native (again: the control) | 35.85 | 1.016 | 7429 | 5583 * | yes |
//! | cudaMallocAsync | 35.60 | 1.009 | 7049 | 5560 * | yes |
//! | mrstack `cuda > pool` | 35.73 | 1.013 | 8899 | 5560 | yes |
//! | mrstack `cuda > pool > binning` | 35.23 | 0.999 | 8899 | 5560 | yes |
//! | mrstack `cuda > pool > binning` + `MRSTACK_LOG` | 36.17 | 1.025 | 8899 | 5560 | yes |
//! | mrstack `paged` (the replay's recommendation) | 35.04 | 0.993 | 6345 | 5560 | yes |
//!
//! Median step: forward + backward + SGD step, `torch.cuda.synchronize()` before and after;
//! deterministic mode also fills every new tensor, in every row. Peak device: the most of
//! `torch.cuda.mem_get_info()` total − free, sampled after forward, after backward and after each
//! step (the CUDA context and libraries included). Stack peak live: the stack's
//! `peak_live_bytes` (`mrstack_statistics_json`); * native rows: `torch.cuda.max_memory_allocated()`
//! instead. The pool rows hold more device memory than native: the pool grows by doubling (8 GiB
//! for 5.4 GiB live); the recommended `paged` holds 1,084 MiB less than native. The recorded log is
//! `data/traces/resnet50_train_pytorch.csv.gz`. The transformer's logits (40 batches of random
//! lengths) equal native's bit for bit; CuPy's matrix products and FFTs equal NumPy's and leave 0
//! live blocks at exit; a 200 GiB request raises `RuntimeError` in PyTorch and `MemoryError` in
//! CuPy, and both go on working.
//!
//! # What each adaptor adds
//!
//! `cargo bench --bench adaptors`, over `Null` (a resource that does nothing). The figures are ns
//! per operation, half an allocate + deallocate pair; "8 threads" is the wall time of eight threads
//! at once over the pairs they made in all, so it is 1/8 of the one-thread figure where an adaptor
//! scales perfectly. The ranges are two runs on two machines:
//!
//! | adaptor | 1 thread | 8 threads |
//! |---|---:|---:|
//! | `Statistics` (sharded per thread) | 4.8–6.4 | 0.8–0.9 |
//! | `Limiting` (per-thread reservations) | 2.3–4.4 | 0.5 |
//! | `Tracking` (16 address-striped locks) | 24–30 | 6–10 |
//! | `Logging` to `io::sink()` (writer thread) | 125–128 | 83–90 |
//!
//! `Logging`'s row predates its time-stamp-counter clock, recycled buffers and merging writer,
//! which took its one-thread figure to about 0.7x in a run of the old and new binaries side by
//! side. On a machine without a GPU, `cargo bench --bench suballocators` runs the replay
//! workloads over `Simulated`.
