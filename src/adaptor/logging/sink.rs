//! The batching writer: each thread's records gathered in batches (`Slot`, `Shared`), and the
//! `Sink` that formats them on a writer thread of the adaptor's own (`write_lines`), or inline
//! where none could be started.

use crate::shard;
use std::io::{self, BufWriter, Write};
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::time::Duration;

use super::clock::Clock;
use super::format::{decimal, hex, Record};

/// Records a thread gathers before sealing them as a batch for the writer.
pub(super) const BATCH: usize = 512;
/// Sealed batches a thread may have waiting: then it waits for the writer (no line is lost, and
/// what waits is bounded: ~220 KiB per thread).
pub(super) const SEALED: usize = 8;
/// How long the writer sleeps between sweeps while lines come.
pub(super) const NAP: Duration = Duration::from_micros(50);
/// Empty sweeps before the writer sleeps until a logging thread wakes it: 10 ms without a line.
const IDLE: u32 = 200;

/// One thread slot's records not yet taken by the writer: the batch filling and the sealed ones,
/// and emptied batches the writer gave back, so that a logging thread rarely allocates.
#[derive(Debug, Default)]
pub(super) struct Slot {
    pub(super) filling: Vec<Record>,
    pub(super) sealed: Vec<Vec<Record>>,
    pub(super) spare: Vec<Vec<Record>>,
    /// The stamp of the slot's last record.
    pub(super) last: u64,
}

/// What the logging threads and the writer share.
#[derive(Debug)]
pub(super) struct Shared {
    /// One per thread slot ([`shard::SLOTS`]), and the shared one.
    pub(super) slots: Box<[shard::SlotLock<Slot>]>,
    pub(super) clock: Clock,
    /// Microseconds since the Unix epoch when `clock` was made.
    pub(super) epoch_micros: u64,
    /// Set while the writer sleeps until woken.
    pub(super) idle: AtomicBool,
    /// Set when the adaptor goes: the writer takes the last lines and returns.
    pub(super) stop: AtomicBool,
    /// Cleared when the writer thread ends (returns or panics): no one waits for it then.
    pub(super) alive: AtomicBool,
    /// Flushes asked, with when: answered by the first sweep that starts after.
    pub(super) flushes: Mutex<Vec<(u64, mpsc::SyncSender<io::Result<()>>)>>,
}

impl Shared {
    #[inline]
    pub(super) fn now(&self) -> u64 {
        self.clock.now()
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a push, a swap or a drain that cannot panic halfway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The writer's side: the buffered writer, the first write error since the last flush, the
/// records taken but not yet written (sorted by time), and emptied batches for the slots.
pub(super) struct Sink<W: Write> {
    pub(super) out: BufWriter<W>,
    pub(super) error: Option<io::Error>,
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
    pub(super) fn new(out: BufWriter<W>) -> Self {
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
    pub(super) fn sweep(&mut self, shared: &Shared) -> usize {
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
    pub(super) fn finish(&mut self, shared: &Shared) {
        self.sweep(shared);
        let rest = std::mem::take(&mut self.pending);
        self.write_due(shared, &rest, u64::MAX, shared.clock.nanos_per_tick());
        self.flush_out();
    }

    /// Flushes the writer, keeping its error as the first since the last `flush`.
    pub(super) fn flush_out(&mut self) {
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
    pub(super) fn take_error(&mut self) -> io::Result<()> {
        self.error.take().map_or(Ok(()), Err)
    }
}

/// Where the lines are formatted: on a writer thread of the adaptor's own, or, where no thread
/// could be started, by each logging call under a mutex.
pub(super) enum Writer<W: Write> {
    Thread(std::thread::JoinHandle<Sink<W>>),
    Inline(Mutex<Sink<W>>),
}

/// The writer thread: sweeps while lines come, sleeps until woken once idle, and writes the
/// last lines when the adaptor goes.
pub(super) fn write_lines<W: Write>(sink: &mut Sink<W>, shared: &Shared) {
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
