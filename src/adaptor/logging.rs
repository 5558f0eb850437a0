//! `Logging<U, W>`: one CSV line per allocation event, in the format of RMM's logging adaptor.

use crate::log_format;
use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::shard;
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::io::{self, BufWriter, Write};
use std::ptr::NonNull;
use std::sync::atomic::{
    AtomicBool, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The writer a [`LoggingConfig`] gives: any `Write + Send`, boxed.
pub type LogWriter = Box<dyn Write + Send>;

/// Records a thread gathers before sealing them as a batch for the writer.
const BATCH: usize = 512;
/// Sealed batches a thread may have waiting: then it waits for the writer (no line is lost, and
/// what waits is bounded: ~220 KiB per thread).
const SEALED: usize = 8;
/// How long the writer sleeps between sweeps while lines come.
const NAP: Duration = Duration::from_micros(50);
/// Empty sweeps before the writer sleeps until a logging thread wakes it: 10 ms without a line.
const IDLE: u32 = 200;

/// The clock records are stamped with: the processor's time-stamp counter where the kernel
/// itself keeps time with it (x86-64 Linux, clocksource `tsc`: then the counter is invariant and
/// synchronized across cores, and an ordered read of it is what `clock_gettime` does, without
/// the seqlock and the scaling), else [`Instant`]. Stamps are ticks, compared as they are and
/// turned into time only by the writer.
#[derive(Debug)]
struct Clock {
    epoch: Instant,
    /// The counter at `epoch`, when the counter is the clock.
    tsc: Option<u64>,
}

impl Clock {
    fn new() -> Self {
        let tsc = tsc::usable().then(tsc::read);
        Clock {
            epoch: Instant::now(),
            tsc,
        }
    }

    /// Ticks since the clock was made. An ordered read: it happens after every earlier
    /// instruction of this thread completed (a lock taken before it included), as
    /// `clock_gettime`'s does, so that a stamp read after taking a lock is later than any read
    /// before that lock was last released.
    #[inline]
    fn now(&self) -> u64 {
        match self.tsc {
            // A counter behind its start (it never is where the kernel keeps time with it) reads
            // as the start, rather than as a stamp no sweep would ever reach.
            Some(start) => tsc::read().saturating_sub(start),
            None => u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Nanoseconds per tick, measured now over the clock's whole life (exact for `Instant`;
    /// for the counter, within ~25 ns over however long the log has run).
    fn nanos_per_tick(&self) -> f64 {
        if self.tsc.is_none() {
            return 1.0;
        }
        let (ticks, nanos) = (self.now(), self.epoch.elapsed().as_nanos());
        if ticks == 0 {
            return 1.0;
        }
        nanos as f64 / ticks as f64
    }
}

/// The time-stamp counter, where it keeps time.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tsc {
    /// True when the kernel keeps time with the counter: it checked at boot that the counter
    /// is invariant and synchronized across cores, and would have switched away otherwise.
    pub(super) fn usable() -> bool {
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc")
    }

    /// The counter, read after every earlier instruction completed (`lfence; rdtsc`, the
    /// kernel's `rdtsc_ordered`).
    #[inline]
    pub(super) fn read() -> u64 {
        use std::arch::x86_64::{_mm_lfence, _rdtsc};
        // SAFETY: `lfence` (SSE2) and `rdtsc` are in every x86-64 processor, touch no memory and
        // only read the counter. A process that made `rdtsc` fault (`prctl(PR_SET_TSC,
        // PR_TSC_SIGSEGV)`, as rr and some sandboxes do) gets a SIGSEGV here, not undefined
        // behaviour.
        unsafe {
            _mm_lfence();
            _rdtsc()
        }
    }
}

/// No counter elsewhere: [`Instant`] it is.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod tsc {
    pub(super) fn usable() -> bool {
        false
    }
    pub(super) fn read() -> u64 {
        0
    }
}

/// One event, as the logging thread records it: no formatting on that thread.
#[derive(Debug, Clone, Copy)]
struct Record {
    /// Ticks of the adaptor's [`Clock`], read under the slot's lock; never below the slot's
    /// previous record's, so that a thread's records keep their order in a stable sort.
    stamp: u64,
    thread: u64,
    ptr: usize,
    size: usize,
    stream: u64,
    action: Action,
}

/// What a line records (a byte in the record rather than the text: records stay 48 bytes).
#[derive(Debug, Clone, Copy)]
enum Action {
    Allocate,
    AllocateFailure,
    Free,
}

impl Action {
    fn text(self) -> &'static str {
        match self {
            Action::Allocate => log_format::ALLOCATE,
            Action::AllocateFailure => log_format::ALLOCATE_FAILURE,
            Action::Free => log_format::FREE,
        }
    }
}

/// One thread slot's records not yet taken by the writer: the batch filling and the sealed ones,
/// and emptied batches the writer gave back, so that a logging thread rarely allocates.
#[derive(Debug, Default)]
struct Slot {
    filling: Vec<Record>,
    sealed: Vec<Vec<Record>>,
    spare: Vec<Vec<Record>>,
    /// The stamp of the slot's last record.
    last: u64,
}

/// What the logging threads and the writer share.
#[derive(Debug)]
struct Shared {
    /// One per thread slot ([`shard::SLOTS`]), and the shared one.
    slots: Box<[shard::SlotLock<Slot>]>,
    clock: Clock,
    /// Microseconds since the Unix epoch when `clock` was made.
    epoch_micros: u64,
    /// Set while the writer sleeps until woken.
    idle: AtomicBool,
    /// Set when the adaptor goes: the writer takes the last lines and returns.
    stop: AtomicBool,
    /// Cleared when the writer thread ends (returns or panics): no one waits for it then.
    alive: AtomicBool,
    /// Flushes asked, with when: answered by the first sweep that starts after.
    flushes: Mutex<Vec<(u64, mpsc::SyncSender<io::Result<()>>)>>,
}

impl Shared {
    #[inline]
    fn now(&self) -> u64 {
        self.clock.now()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a push, a swap or a drain that cannot panic halfway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writer's side: the buffered writer, the first write error since the last flush, the
/// records taken but not yet written (sorted by time), and emptied batches for the slots.
struct Sink<W: Write> {
    out: BufWriter<W>,
    error: Option<io::Error>,
    pending: Vec<Record>,
    /// Batches taken in a sweep, each sorted by time (scratch, kept for its capacity).
    runs: Vec<Vec<Record>>,
    /// Several threads' records, sorted together (scratch, kept for its capacity).
    merged: Vec<Record>,
    /// The time of the last line written: lines go in stamp order, and the scale from ticks
    /// to time is measured anew at each sweep, so a line's time is kept from going below it.
    last_micros: u64,
    /// Empty batches, handed to slots as their next ones (at most [`SPARE_BATCHES`]).
    spare: Vec<Vec<Record>>,
}

/// Empty batches the writer keeps for the slots: enough for 8 busy threads' next batches, and
/// a bound on what the log holds beyond its records.
const SPARE_BATCHES: usize = 16;

impl<W: Write> Sink<W> {
    fn new(out: BufWriter<W>) -> Self {
        Sink {
            out,
            error: None,
            pending: Vec::new(),
            runs: Vec::new(),
            merged: Vec::new(),
            last_micros: 0,
            spare: Vec::new(),
        }
    }

    /// An empty batch with room for [`BATCH`] records.
    fn empty_batch(&mut self) -> Vec<Record> {
        self.spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BATCH))
    }

    /// Takes every slot's records and writes, in time order, those older than the sweep's
    /// start: a record made later than a slot's visit is newer than the start, so none older
    /// can still come. Answers the flushes asked before the start. Returns the records taken.
    fn sweep(&mut self, shared: &Shared) -> usize {
        let start = shared.now();
        let mut taken = 0;
        let mut runs = std::mem::take(&mut self.runs);
        // The records left from the last sweep are older than any taken now from the same slot:
        // first among equal times.
        if !self.pending.is_empty() {
            runs.push(std::mem::take(&mut self.pending));
        }
        for slot in shared.slots.iter() {
            let mut slot = slot.lock();
            if slot.sealed.is_empty() && slot.filling.is_empty() {
                continue;
            }
            for batch in slot.sealed.drain(..) {
                taken += batch.len();
                runs.push(batch);
            }
            if !slot.filling.is_empty() {
                taken += slot.filling.len();
                let next = self.empty_batch();
                runs.push(std::mem::replace(&mut slot.filling, next));
            }
            // A busy slot gets its next batch ready, so that its thread does not allocate.
            if slot.spare.is_empty() {
                if let Some(batch) = self.spare.pop() {
                    slot.spare.push(batch);
                }
            }
        }
        self.write_runs(shared, &runs, start);
        for mut run in runs.drain(..) {
            run.clear();
            if run.capacity() >= BATCH && self.spare.len() < SPARE_BATCHES {
                self.spare.push(run);
            }
        }
        self.runs = runs;
        let asked: Vec<_> = {
            let mut flushes = lock(&shared.flushes);
            let (now, later) = flushes.drain(..).partition(|(at, _)| *at < start);
            *flushes = later;
            now
        };
        if !asked.is_empty() {
            let result = self.flush();
            let mut result = Some(result);
            for (_, answer) in asked {
                // The first asker gets the error, the others the flush's outcome since.
                let r = result.take().unwrap_or(Ok(()));
                let _ = answer.send(r);
            }
        }
        taken
    }

    /// Writes the records of `runs` (each sorted by time) older than `until`, merged in time
    /// order (equal times in the order of the runs), and keeps the others in `pending`.
    fn write_runs(&mut self, shared: &Shared, runs: &[Vec<Record>], until: u64) {
        let scale = shared.clock.nanos_per_tick();
        // One thread's runs (its leftovers, then its batches) follow each other in time: written
        // as they are. Several threads' interleave: one stable sort (which finds the runs and
        // merges them with block copies), as for any number of threads.
        let in_order = runs
            .iter()
            .filter(|run| !run.is_empty())
            .try_fold(0u64, |last, run| {
                (run[0].stamp >= last).then(|| run[run.len() - 1].stamp)
            })
            .is_some();
        if in_order {
            for run in runs {
                self.write_due(shared, run, until, scale);
            }
            return;
        }
        let mut all = std::mem::take(&mut self.merged);
        for run in runs {
            all.extend_from_slice(run);
        }
        // Stable: records of one time keep the order of the runs (a thread's own first the
        // leftovers, then its batches in order).
        all.sort_by_key(|r| r.stamp);
        self.write_due(shared, &all, until, scale);
        all.clear();
        // Kept for the next sweep, unless a burst made it large.
        if all.capacity() <= 1 << 16 {
            self.merged = all;
        }
    }

    /// Writes the records of `sorted` older than `until` and keeps the rest in `pending`.
    fn write_due(&mut self, shared: &Shared, sorted: &[Record], until: u64, scale: f64) {
        let due = sorted.partition_point(|r| r.stamp < until);
        for r in &sorted[..due] {
            self.write(shared, r, scale);
        }
        self.pending.extend_from_slice(&sorted[due..]);
    }

    /// Writes one record's line.
    fn write(&mut self, shared: &Shared, r: &Record, nanos_per_tick: f64) {
        // By hand rather than `writeln!`: the writer must keep up with every logging thread.
        let mut line = [0u8; 128];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            line[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        let micros = (shared.epoch_micros)
            .saturating_add((r.stamp as f64 * nanos_per_tick / 1000.0) as u64)
            .max(self.last_micros);
        self.last_micros = micros;
        put(decimal(r.thread, &mut [0; 20]));
        put(b",");
        put(decimal(micros, &mut [0; 20]));
        put(b",");
        put(r.action.text().as_bytes());
        put(b",0x");
        put(hex(r.ptr as u64, &mut [0; 16]));
        put(b",");
        put(decimal(r.size as u64, &mut [0; 20]));
        put(b",");
        put(decimal(r.stream, &mut [0; 20]));
        put(b"\n");
        if let Err(e) = self.out.write_all(&line[..at]) {
            self.error.get_or_insert(e);
        }
    }

    /// Takes and writes everything and flushes the writer: the last sweep.
    fn finish(&mut self, shared: &Shared) {
        self.sweep(shared);
        let rest = std::mem::take(&mut self.pending);
        self.write_due(shared, &rest, u64::MAX, shared.clock.nanos_per_tick());
        self.flush_out();
    }

    /// Flushes the writer, keeping its error as the first since the last `flush`.
    fn flush_out(&mut self) {
        if let Err(e) = self.out.flush() {
            self.error.get_or_insert(e);
        }
    }

    /// Flushes the writer; returns the first write error since the last `flush`.
    fn flush(&mut self) -> io::Result<()> {
        self.flush_out();
        self.take_error()
    }

    /// The first write error since the last call, forgotten.
    fn take_error(&mut self) -> io::Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }
}

/// `n` in decimal, in the tail of `buf`: two digits per division.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut i = buf.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    &buf[i..]
}

/// `n` in lower-case hexadecimal, in the tail of `buf`.
fn hex(mut n: u64, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// The writer thread: sweeps while lines come, sleeps until woken once idle, and writes the
/// last lines when the adaptor goes.
fn write_lines<W: Write>(sink: &mut Sink<W>, shared: &Shared) {
    let mut idle = 0;
    loop {
        if shared.stop.load(Acquire) {
            // The last I/O, its flush included, on this thread: a writer that panics panics
            // here, where the join sees it, not in the adaptor's drop (which may run while
            // unwinding).
            sink.finish(shared);
            return;
        }
        let taken = sink.sweep(shared);
        if taken >= BATCH {
            // Lines come faster than a nap's worth: sweep again at once.
            idle = 0;
            continue;
        }
        if taken > 0 || !sink.pending.is_empty() {
            idle = 0;
        } else {
            idle += 1;
        }
        if idle < IDLE {
            std::thread::park_timeout(NAP);
            continue;
        }
        // A thread that logs after this store sees it once it has its slot's lock (which the
        // sweep below also takes), and wakes the writer; one that logged before is swept here.
        shared.idle.store(true, Release);
        if sink.sweep(shared) == 0 && lock(&shared.flushes).is_empty() {
            std::thread::park();
        }
        shared.idle.store(false, Relaxed);
        idle = 0;
    }
}

/// Clears [`Shared::alive`] when the writer thread ends, however it ends.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.alive.store(false, Release);
    }
}

/// Where the lines are formatted: on a writer thread of the adaptor's own, or, where no thread
/// could be started, by each logging call under a mutex.
enum Writer<W: Write> {
    Thread(std::thread::JoinHandle<Sink<W>>),
    Inline(Mutex<Sink<W>>),
}

/// Logs every allocation and deallocation of `U` as a CSV line to `W`.
///
/// The lines are in the format of RMM's `logging_resource_adaptor`, so that a log taken from a
/// real program can be replayed (`mrstack replay`, RMM's `REPLAY_BENCHMARK`):
///
/// ```text
/// Thread,Time,Action,Pointer,Size,Stream
/// 0,1718000000123456,allocate,0x7f3a40000000,1048576,0
/// 0,1718000000123470,allocate failure,0x0,1099511627776,0
/// 0,1718000000123501,free,0x7f3a40000000,1048576,0
/// ```
///
/// * `Thread`: a small number per thread, in the order threads first log (RMM writes the OS
///   thread id; replay only groups by it).
/// * `Time`: microseconds since the Unix epoch (RMM writes `HH:MM:SS.ffffff`; replay does not use
///   the column, and an integer sorts and subtracts across midnight).
/// * `Action`: `allocate`, `allocate failure` or `free`. `Pointer`: hexadecimal, `0x0` for a
///   failure. `Size`: bytes. `Stream`: the `CUstream` handle as a decimal integer, `0` for the
///   default stream (see [`StreamId::get`](crate::stream::StreamId::get)).
///
/// An allocation is logged after the upstream returns it and a free before the upstream gets it
/// back, so that when an address is reused its `free` line always precedes the next `allocate`.
/// Zero-size requests take no memory and are not logged. The header line is written by
/// [`new`](Self::new). The stack's [description](MemoryResource::describe) names the file when
/// the adaptor opened it ([`create`](Logging::create), text `logging(path=…)`): `logging(path=…)`;
/// another writer is not named (`logging`).
///
/// # Cost
///
/// The logging thread formats nothing: it reads a monotonic clock (the time-stamp counter where
/// the kernel keeps time with it: x86-64 Linux on clocksource `tsc`; `Instant` elsewhere) and
/// appends a 48-byte record to a buffer of its own (under a spin lock only it takes, but for
/// the writer's visits: the first 64 live threads get one, later ones share one); its next
/// buffers are ones the writer emptied. A writer thread of the adaptor's own visits every buffer
/// each 50 µs while lines come (sleeping until woken after 10 ms without one), merges what it
/// took by time (each buffer is in order already) and formats the lines into a `BufWriter`,
/// whose I/O happens when it fills, on [`flush`](Self::flush) and on drop. A thread with 4,096
/// records waiting waits for the writer: no line is lost, and what waits is bounded (~200 KiB
/// per thread, and 16 empty buffers the writer keeps).
///
/// # Order
///
/// Lines are in the order of their times (a monotonic clock, read in order with the lock taken
/// before it; on a coarse clock, two threads' lines in one tick keep the order of their
/// buffers), which are read under each buffer's lock: each thread's
/// lines keep its order, and a `free` logged before an address is reused on another thread
/// precedes that `allocate` (the free is logged before the upstream has the block back, the
/// allocate after the upstream gave it). A write error does not fail an allocation: the first one
/// is kept and returned by the next `flush`. Where no thread can be started, each call formats
/// under a mutex.
///
/// # Streams
///
/// Each line records the stream's handle as a number; the adaptor keeps no stream alive. The
/// stream of each call goes to the upstream unchanged; `synchronize` and `order_after` are
/// forwarded to the upstream.
///
/// # Upstream
///
/// Requires nothing of its upstream and keeps its properties and alignment.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
/// use mrstack::adaptor::Logging;
///
/// let mr = Logging::new(Simulated::new(1 << 30), Vec::new());
/// let p = mr.allocate(1024, 256, StreamRef::DEFAULT).unwrap();
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate(p, 1024, 256, StreamRef::DEFAULT) };
/// let (_, log) = mr.into_parts().unwrap();
/// let log = String::from_utf8(log).unwrap();
/// let lines: Vec<&str> = log.lines().collect();
/// assert_eq!(lines[0], "Thread,Time,Action,Pointer,Size,Stream");
/// let addr = p.as_ptr() as usize;
/// assert!(lines[1].ends_with(&format!(",allocate,{addr:#x},1024,0")));
/// assert!(lines[2].ends_with(&format!(",free,{addr:#x},1024,0")));
/// ```
pub struct Logging<U, W: Write = LogWriter> {
    upstream: U,
    shared: Arc<Shared>,
    /// `None` only once [`into_parts`](Self::into_parts) or drop has taken it.
    writer: Option<Writer<W>>,
    /// The file the adaptor opened, for its description.
    path: Option<Box<str>>,
}

impl<U: MemoryResource, W: Write + Send + 'static> Logging<U, W> {
    /// Logs what goes to `upstream` to `writer`, after a header line, formatted on a thread of
    /// the adaptor's own. The header goes into the buffer like every line; a failure to write it
    /// shows in the next [`flush`](Self::flush).
    pub fn new(upstream: U, writer: W) -> Self {
        let mut sink = Sink::new(BufWriter::with_capacity(64 << 10, writer));
        if let Err(e) = writeln!(sink.out, "{}", log_format::HEADER) {
            sink.error = Some(e);
        }
        let shared = Arc::new(Shared {
            slots: (0..=shard::SLOTS)
                .map(|_| shard::SlotLock::default())
                .collect(),
            clock: Clock::new(),
            epoch_micros: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
            idle: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            flushes: Mutex::default(),
        });
        // The sink goes to the thread through a slot, so that it is not lost with the closure
        // when the thread cannot be started.
        let handoff = Arc::new(Mutex::new(Some(sink)));
        let (theirs, their_shared) = (handoff.clone(), shared.clone());
        let started = std::thread::Builder::new()
            .name("mrstack-log".into())
            .spawn(move || {
                let _alive = Alive(&their_shared);
                let taken = lock(&theirs).take();
                let mut sink = taken.unwrap_or_else(|| taken_twice());
                write_lines(&mut sink, &their_shared);
                sink
            });
        let writer = match started {
            Ok(thread) => Writer::Thread(thread),
            Err(_) => {
                shared.alive.store(false, Release);
                let taken = lock(&handoff).take();
                Writer::Inline(Mutex::new(taken.unwrap_or_else(|| taken_twice())))
            }
        };
        Logging {
            upstream,
            shared,
            writer: Some(writer),
            path: None,
        }
    }

    /// As [`new`](Self::new), for a writer to the file at `path` (shown in the description).
    pub(crate) fn with_path(upstream: U, writer: W, path: &str) -> Self {
        let mut logging = Self::new(upstream, writer);
        logging.path = Some(path.into());
        logging
    }
}

/// Runs `f` on the sink with a panic of the writer `W` caught and kept as the sink's error: where
/// no writer thread could be started, the writer runs inside an allocation or a free, and its
/// panic must not leave a block behind (nor escape a drop that may run while unwinding). Lines
/// `f` had taken are lost with the panic.
fn contained<W: Write>(sink: &mut Sink<W>, f: impl FnOnce(&mut Sink<W>)) {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(sink)));
    if caught.is_err() {
        sink.error
            .get_or_insert_with(|| io::Error::other("the log's writer panicked"));
    }
}

/// The sink is taken once: by the writer thread, or by `new` when the thread did not start.
#[cold]
fn taken_twice() -> ! {
    unreachable!("the log's sink is taken once")
}

impl<U, W: Write> Logging<U, W> {
    const NAME: &'static str = "Logging";

    #[inline]
    fn log(&self, action: Action, ptr: usize, size: usize, stream: StreamRef) {
        let shared = &*self.shared;
        let index = shard::slot();
        let thread = thread_number();
        let stream = stream.id().get();
        let mut slot = shared.slots[index].lock();
        // The time is read under the slot's lock: what the writer's sweep relies on.
        let stamp = shared.now().max(slot.last);
        slot.last = stamp;
        slot.filling.push(Record {
            stamp,
            thread,
            action,
            ptr,
            size,
            stream,
        });
        let full = slot.filling.len() >= BATCH;
        if full {
            let next = slot
                .spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(BATCH));
            let batch = std::mem::replace(&mut slot.filling, next);
            slot.sealed.push(batch);
        }
        let waiting = slot.sealed.len();
        drop(slot);
        match &self.writer {
            Some(Writer::Inline(sink)) => {
                contained(&mut lock(sink), |s| {
                    s.sweep(shared);
                });
            }
            Some(Writer::Thread(thread)) => {
                if shared.idle.load(Relaxed) && shared.idle.swap(false, AcqRel) {
                    thread.thread().unpark();
                }
                if waiting >= SEALED {
                    self.wait_for_writer(index, thread.thread());
                }
            }
            None => {}
        }
    }

    /// Waits until the writer has taken this slot's sealed batches (or is gone).
    #[cold]
    fn wait_for_writer(&self, index: usize, writer: &std::thread::Thread) {
        let shared = &*self.shared;
        writer.unpark();
        // Yield first: the writer is likely busy and about to visit; sleep if it takes long.
        let mut looks = 0u32;
        while shared.slots[index].lock().sealed.len() >= SEALED && shared.alive.load(Acquire) {
            looks += 1;
            if looks < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(NAP);
            }
        }
        if !shared.alive.load(Acquire) {
            // No one will take these lines: they go, so that memory stays bounded.
            shared.slots[index].lock().sealed.clear();
        }
    }

    /// Writes every line logged so far out and flushes the writer; returns the first write error
    /// since the last flush, if any.
    pub fn flush(&self) -> io::Result<()> {
        match &self.writer {
            Some(Writer::Inline(sink)) => {
                // A sweep writes every line logged before it started; lines other threads log
                // meanwhile wait for the next, so that the file stays in time order.
                let mut sink = lock(sink);
                contained(&mut sink, |s| {
                    s.sweep(&self.shared);
                    s.flush_out();
                });
                sink.take_error()
            }
            Some(Writer::Thread(thread)) => {
                let gone =
                    || io::Error::other("the log's writer thread is gone (its writer panicked)");
                let (answer, answered) = mpsc::sync_channel(1);
                lock(&self.shared.flushes).push((self.shared.now(), answer));
                thread.thread().unpark();
                // The request keeps its sender in `flushes`: a writer thread that died (a writer
                // `W` that panicked) would never answer, so its end is looked for while waiting.
                loop {
                    match answered.recv_timeout(Duration::from_millis(10)) {
                        Ok(result) => return result,
                        Err(_) if !self.shared.alive.load(Acquire) => {
                            // No one will answer the requests left: they go.
                            lock(&self.shared.flushes).clear();
                            return Err(gone());
                        }
                        Err(_) => {}
                    }
                }
            }
            None => Ok(()),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Flushes and unwraps the adaptor into its upstream and its writer.
    pub fn into_parts(mut self) -> io::Result<(U, W)> {
        let sink = self.finish()?;
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, and each field is read once: `writer`
        // is `None` after `finish`, so dropping the other fields here is all its drop would do.
        let (upstream, shared, path) = unsafe {
            (
                std::ptr::read(&this.upstream),
                std::ptr::read(&this.shared),
                std::ptr::read(&this.path),
            )
        };
        drop((shared, path));
        let Sink { out, error, .. } = sink;
        if let Some(e) = error {
            return Err(e);
        }
        let writer = out.into_inner().map_err(|e| e.into_error())?;
        Ok((upstream, writer))
    }

    /// Stops the writer after it has written every line, and returns its sink.
    fn finish(&mut self) -> io::Result<Sink<W>> {
        self.shared.stop.store(true, Release);
        match self.writer.take() {
            Some(Writer::Thread(thread)) => {
                thread.thread().unpark();
                thread
                    .join()
                    .map_err(|_| io::Error::other("the log's writer thread panicked"))
            }
            Some(Writer::Inline(sink)) => {
                let mut sink = sink.into_inner().unwrap_or_else(|p| p.into_inner());
                contained(&mut sink, |s| s.finish(&self.shared));
                Ok(sink)
            }
            None => Err(io::Error::other("the log was already finished")),
        }
    }
}

impl<U, W: Write> Drop for Logging<U, W> {
    fn drop(&mut self) {
        // Every line is written and the writer flushed (the `BufWriter`'s drop) before the
        // adaptor is gone; errors have no one to go to.
        let _ = self.finish();
    }
}

impl<U: MemoryResource> Logging<U, std::fs::File> {
    /// Logs what goes to `upstream` to a new file at `path` (truncated if it exists).
    pub fn create(upstream: U, path: impl AsRef<std::path::Path>) -> io::Result<Self> {
        let file = std::fs::File::create(path.as_ref())?;
        Ok(Self::with_path(
            upstream,
            file,
            &path.as_ref().to_string_lossy(),
        ))
    }
}

impl<U: std::fmt::Debug, W: Write> std::fmt::Debug for Logging<U, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logging")
            .field("upstream", &self.upstream)
            .finish_non_exhaustive()
    }
}

/// This thread's number in logs: 0 for the first thread that logs, then 1, 2 …
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Relaxed);
    }
    NUMBER.with(|n| *n)
}

// SAFETY: every allocation is the upstream's, returned unchanged; logging does not touch memory.
unsafe impl<U: MemoryResource, W: Write> MemoryResource for Logging<U, W> {
    forward_upstream!(U, upstream);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        match self.upstream.allocate(size, align, stream) {
            Ok(ptr) => {
                self.log(Action::Allocate, ptr.as_ptr() as usize, size, stream);
                Ok(ptr)
            }
            Err(e) => {
                self.log(Action::AllocateFailure, 0, size, stream);
                Err(e)
            }
        }
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        self.log(Action::Free, ptr.as_ptr() as usize, size, stream);
        // SAFETY: forwarded from the caller.
        unsafe { self.upstream.deallocate(ptr, size, align, stream) }
    }

    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let item = ItemWriter::over(f, &self.upstream, "logging");
        let item = match &self.path {
            Some(path) => item.text("path", path),
            None => item,
        };
        item.finish()
    }

    fn upstream_layer(&self) -> Option<&dyn crate::stack::AnyLayer>
    where
        Self: 'static,
    {
        Some(&self.upstream)
    }
}

has_upstream!(impl<U, W> for Logging<U, W> where W: Write);

/// `resource_stack!` configuration of [`Logging`]:
/// `Logging { to: Box::new(std::fs::File::create("alloc.csv")?) }`; bare `Logging` logs to stderr.
///
/// The writer is boxed so that any writer fits the `..Default::default()` the macro adds; build
/// a `Logging` with [`Logging::new`] to keep its type.
pub struct LoggingConfig {
    /// Where the CSV goes (buffered by the adaptor). Default: stderr.
    pub to: LogWriter,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            to: Box::new(io::stderr()),
        }
    }
}

impl std::fmt::Debug for LoggingConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggingConfig").finish_non_exhaustive()
    }
}

impl<U: MemoryResource> Layer<U> for LoggingConfig {
    type Resource = Logging<U, LogWriter>;
    fn layer(self, upstream: U) -> Logging<U, LogWriter> {
        Logging::new(upstream, self.to)
    }
}

static_assertions::assert_impl_all!(Logging<crate::leaf::System>: Send, Sync, crate::property::Accessible<crate::property::HostAccessible>);
static_assertions::assert_impl_all!(Logging<crate::leaf::Cuda, std::fs::File>: Send, Sync, crate::property::Accessible<crate::property::DeviceAccessible>);
static_assertions::assert_not_impl_any!(Logging<crate::leaf::Cuda>: crate::property::Accessible<crate::property::HostAccessible>);

#[cfg(test)]
mod tests {
    use super::{decimal, hex};

    #[test]
    fn numbers_format_as_std_does() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            123_456_789,
            u64::MAX,
            u64::MAX - 1,
        ]
        .into_iter()
        .chain((0..2000).map(|i| i * 7919))
        {
            assert_eq!(decimal(n, &mut [0; 20]), n.to_string().as_bytes());
            assert_eq!(hex(n, &mut [0; 16]), format!("{n:x}").as_bytes());
        }
    }
}
