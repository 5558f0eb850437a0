//! `Logging<U, W>`: one CSV line per allocation event, in the format of RMM's logging adaptor.

use crate::config::{ConfigError, FromItem, ItemSpec};
use crate::replay::rmm_log;
use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::StreamRef;
use std::io::{self, BufWriter, Write};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// The writer a [`LoggingConfig`] gives: any `Write + Send`, boxed.
pub type LogWriter = Box<dyn Write + Send>;

struct Sink<W: Write> {
    out: BufWriter<W>,
    /// The first write error since the last `flush`.
    error: Option<io::Error>,
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
///   default stream (see [`StreamId::get`](crate::StreamId::get)).
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
/// A mutex and a formatted line into a `BufWriter` per call; the writer's I/O happens when the
/// buffer fills, on [`flush`](Self::flush) and on drop. A write error does not fail an allocation:
/// the first one is kept and returned by the next `flush`.
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
    sink: Mutex<Sink<W>>,
    /// The file the adaptor opened, for its description.
    path: Option<Box<str>>,
}

impl<U: MemoryResource, W: Write> Logging<U, W> {
    const NAME: &'static str = "Logging";

    /// Logs what goes to `upstream` to `writer`, after a header line. The header goes into the
    /// buffer like every line; a failure to write it shows in the next [`flush`](Self::flush).
    pub fn new(upstream: U, writer: W) -> Self {
        let mut sink = Sink {
            out: BufWriter::new(writer),
            error: None,
        };
        if let Err(e) = writeln!(sink.out, "{}", rmm_log::HEADER) {
            sink.error = Some(e);
        }
        Logging {
            upstream,
            sink: Mutex::new(sink),
            path: None,
        }
    }

    /// As [`new`](Self::new), for a writer to the file at `path` (shown in the description).
    fn with_path(upstream: U, writer: W, path: &str) -> Self {
        Logging {
            path: Some(path.into()),
            ..Self::new(upstream, writer)
        }
    }

    fn log(&self, action: &str, ptr: usize, size: usize, stream: StreamRef) {
        let thread = thread_number();
        let mut sink = self.lock();
        // Read under the lock, so that times never decrease down the file.
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let written = writeln!(
            sink.out,
            "{thread},{micros},{action},{ptr:#x},{size},{}",
            stream.id().get()
        );
        if let Err(e) = written {
            sink.error.get_or_insert(e);
        }
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

impl<U, W: Write> Logging<U, W> {
    /// Writes the buffered lines out and flushes the writer; returns the first write error since
    /// the last flush, if any.
    pub fn flush(&self) -> io::Result<()> {
        let mut sink = self.lock();
        let flushed = sink.out.flush();
        match sink.error.take() {
            Some(e) => Err(e),
            None => flushed,
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Flushes and unwraps the adaptor into its upstream and its writer.
    pub fn into_parts(self) -> io::Result<(U, W)> {
        let sink = self.sink.into_inner().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = sink.error {
            return Err(e);
        }
        let writer = sink.out.into_inner().map_err(|e| e.into_error())?;
        Ok((self.upstream, writer))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sink<W>> {
        // A panic while writing leaves at worst a partial line in the buffer; the log stays usable.
        self.sink.lock().unwrap_or_else(|p| p.into_inner())
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
                self.log(rmm_log::ALLOCATE, ptr.as_ptr() as usize, size, stream);
                Ok(ptr)
            }
            Err(e) => {
                self.log(rmm_log::ALLOCATE_FAILURE, 0, size, stream);
                Err(e)
            }
        }
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        self.log(rmm_log::FREE, ptr.as_ptr() as usize, size, stream);
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

impl FromItem for LoggingConfig {
    /// `logging(path=…)`: a file created (or truncated) at `path`; stderr without it.
    fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
        item.check_fields(&["path"])?;
        let to: LogWriter = match item.field("path") {
            None => Box::new(io::stderr()),
            Some(f) => Box::new(
                std::fs::File::create(&f.value)
                    .map_err(|_| item.bad_value(f, "a file path that can be created"))?,
            ),
        };
        Ok(LoggingConfig { to })
    }
}

/// Builds `logging(path=…)` over `below` as [`LoggingConfig`] reads it, keeping the path for the
/// stack's description (a configuration has no room for it: its one field is the writer).
pub(crate) fn logging_from_item<P: crate::erased::PropertySet>(
    item: &ItemSpec,
    below: crate::erased::AnyResource<P>,
) -> Result<crate::erased::AnyResource<P>, ConfigError> {
    let LoggingConfig { to } = LoggingConfig::from_item(item)?;
    let logging = match item.text("path") {
        Some(path) => Logging::with_path(below, to, path),
        None => Logging::new(below, to),
    };
    item.erase(logging)
}

static_assertions::assert_impl_all!(Logging<crate::System>: Send, Sync, crate::Accessible<crate::HostAccessible>);
static_assertions::assert_impl_all!(Logging<crate::Cuda, std::fs::File>: Send, Sync, crate::Accessible<crate::DeviceAccessible>);
static_assertions::assert_not_impl_any!(Logging<crate::Cuda>: crate::Accessible<crate::HostAccessible>);
