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
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod clock;
mod format;
mod sink;

use clock::Clock;
use format::{Action, Record};
use sink::{lock, write_lines, Shared, Sink, Writer, BATCH, NAP, SEALED};

/// The writer a [`LoggingConfig`] gives: any `Write + Send`, boxed.
pub type LogWriter = Box<dyn Write + Send>;

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

/// Clears [`Shared::alive`] when the writer thread ends, however it ends.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.alive.store(false, Release);
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

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let item = ItemWriter::over(f, &self.upstream, "logging");
        let item = match &self.path {
            Some(path) => item.text("path", path),
            None => item,
        };
        item.finish()
    }

    forward_upstream!(layer over upstream);
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
