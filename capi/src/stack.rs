//! `MrstackStack`: a stack built from a text config, the live blocks it handed out, its counts.

use mrstack::adaptor::Logging;
use mrstack::config::{ConfigErrorKind, StackBuilder, StackSpec};
use mrstack::property::Accessible;
use mrstack::property::Properties;
use mrstack::replay::Metered;
use mrstack::stack::ItemWriter;
use mrstack::{erased::AnyResource, resource::MemoryResource, stream::StreamRef};
use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

/// Shards of the live-block table: frees from many threads rarely meet on one lock.
const SHARDS: usize = 64;

/// A memory-resource stack behind the C API. Opaque to C: only pointers to it cross.
pub struct MrstackStack {
    /// The stack, with `Logging` at its top when a log was asked for.
    resource: AnyResource<()>,
    /// The log, when there is one.
    log: Option<Log>,
    config: String,
    /// The layers' counts as JSON fields (`"driver_bytes":…,"layers":[…]`), read from the stack.
    layers: LayersJson,
    /// Every block handed out and not yet freed, by address: a free is checked against it (a
    /// pointer this stack did not hand out, or a double free, is an error, not undefined
    /// behaviour), and the clients that free without a size (CuPy, TensorRT) find it here.
    live: Vec<Mutex<HashMap<usize, Block>>>,
    counts: Counts,
}

/// An alignment as the C calls take it: 0 means any, which is 1.
fn any_alignment(align: usize) -> usize {
    align.max(1)
}

/// A stack's log: its file, and what reaches the `Logging` at the stack's top whatever the type
/// of the stack below it.
struct Log {
    path: Arc<str>,
    /// Writes the log's buffered lines out; the first write error since the last flush.
    flush: Box<dyn Fn() -> io::Result<()> + Send + Sync>,
    /// The stack's description, naming the file.
    describe: Box<dyn Fn() -> String + Send + Sync>,
    /// Set once a failure of this log is on standard error: each log puts one there, its first.
    reported: Arc<AtomicBool>,
}

impl Log {
    /// Writes the buffered lines out; the first failure since the last flush, naming the file.
    fn flush(&self) -> Result<(), String> {
        (self.flush)().map_err(|e| format!("log `{}` could not be written whole: {e}", self.path))
    }

    /// Puts `e` on standard error, unless a failure of this log is there already.
    fn report(&self, e: &str) {
        report_once(&self.reported, e);
    }
}

/// Puts `msg` on standard error unless `reported` says a failure of the same log is there.
fn report_once(reported: &AtomicBool, msg: &str) {
    if !reported.swap(true, Relaxed) {
        // Not `eprintln!`, which panics when standard error cannot be written.
        let _ = writeln!(io::stderr(), "mrstack: {msg}");
    }
}

/// The file a log is written to, which puts the log's first failed write on standard error as
/// it happens: the lines are written on the log's own thread, which no caller waits for, long
/// before anyone flushes. The failure also stays with the log for its next flush
/// (`mrstack_destroy`, `mrstack_report`, the exit's), which returns it.
struct LogFile {
    file: File,
    path: Arc<str>,
    reported: Arc<AtomicBool>,
}

impl LogFile {
    fn checked<T>(&self, result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result {
            // An interrupted write is tried again by the log's writer: not a failure.
            if e.kind() != io::ErrorKind::Interrupted {
                report_once(
                    &self.reported,
                    &format!(
                        "log `{}`: a write failed, the lines from here on may be lost: {e}",
                        self.path
                    ),
                );
            }
        }
        result
    }
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.file.write(buf);
        self.checked(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        let flushed = self.file.flush();
        self.checked(flushed)
    }
}

/// `upstream > logging(path=…)`: the description a `Logging` gives of a file it opened itself.
struct LoggingTo<'a, U>(&'a U, &'a str);

impl<U: MemoryResource> fmt::Display for LoggingTo<'_, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        ItemWriter::over(f, self.0, "logging")
            .text("path", self.1)
            .finish()
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: usize,
    align: usize,
}

#[derive(Debug, Default)]
struct Counts {
    allocations: AtomicU64,
    deallocations: AtomicU64,
    failed_allocations: AtomicU64,
    bad_frees: AtomicU64,
    live_bytes: AtomicUsize,
    peak_live_bytes: AtomicUsize,
}

/// What a free may check: the size and alignment the caller passes, when it passes them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    pub(crate) size: Option<usize>,
    pub(crate) align: Option<usize>,
}

impl Expect {
    pub(crate) const NOTHING: Expect = Expect {
        size: None,
        align: None,
    };
}

impl MrstackStack {
    /// Builds `config` (CUDA leaves that name no device on `device`), recording every request
    /// in RMM's log format to `log` when given.
    pub(crate) fn build(config: &str, device: usize, log: Option<&str>) -> Result<Self, String> {
        let (resource, log, layers) = build_erased(config, device, log)?;
        Ok(MrstackStack {
            resource,
            log,
            config: config.to_string(),
            layers,
            live: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            counts: Counts::default(),
        })
    }

    pub(crate) fn properties(&self) -> Properties {
        self.resource.properties()
    }

    fn shard(&self, addr: usize) -> std::sync::MutexGuard<'_, HashMap<usize, Block>> {
        // Blocks are at least 16-byte aligned, most 256: mix the bits above.
        let i = (addr >> 8 ^ addr >> 16) % SHARDS;
        self.live[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `size` bytes at `align` (0: the stack's own alignment) on `stream`; null for size 0.
    pub(crate) fn allocate(
        &self,
        size: usize,
        align: usize,
        stream: StreamRef,
    ) -> Result<*mut c_void, String> {
        if size == 0 {
            return Ok(std::ptr::null_mut());
        }
        let align = any_alignment(align);
        if !align.is_power_of_two() {
            self.counts.failed_allocations.fetch_add(1, Relaxed);
            return Err(format!("alignment {align} is not a power of two"));
        }
        let p = match self.resource.allocate(size, align, stream) {
            Ok(p) => p,
            Err(e) => {
                self.counts.failed_allocations.fetch_add(1, Relaxed);
                if e.is_out_of_memory() {
                    crate::error::set_kind(crate::error::MRSTACK_ERROR_OUT_OF_MEMORY);
                }
                return Err(e.to_string());
            }
        };
        self.shard(p.as_ptr() as usize)
            .insert(p.as_ptr() as usize, Block { size, align });
        self.counts.allocations.fetch_add(1, Relaxed);
        let live = self.counts.live_bytes.fetch_add(size, Relaxed) + size;
        self.counts.peak_live_bytes.fetch_max(live, Relaxed);
        Ok(p.as_ptr().cast())
    }

    /// Frees `ptr` on `stream` if this stack handed it out (with the size and alignment in
    /// `expect`, where given); a null `ptr` is nothing to free.
    pub(crate) fn deallocate(
        &self,
        ptr: *mut c_void,
        expect: Expect,
        stream: StreamRef,
    ) -> Result<(), String> {
        let Some(p) = NonNull::new(ptr.cast::<u8>()) else {
            return Ok(());
        };
        let addr = p.as_ptr() as usize;
        let block = {
            let mut shard = self.shard(addr);
            let Some(&block) = shard.get(&addr) else {
                drop(shard);
                self.counts.bad_frees.fetch_add(1, Relaxed);
                return Err(format!(
                    "free of {addr:#x}: not a live block of this stack (never allocated here, or already freed)"
                ));
            };
            let size_ok = expect.size.is_none_or(|s| s == block.size);
            let align_ok = expect.align.is_none_or(|a| any_alignment(a) == block.align);
            if !size_ok || !align_ok {
                drop(shard);
                self.counts.bad_frees.fetch_add(1, Relaxed);
                return Err(format!(
                    "free of {addr:#x} with size {:?} and alignment {:?}: it was allocated with size {} and alignment {} (not freed)",
                    expect.size, expect.align, block.size, block.align
                ));
            }
            shard.remove(&addr);
            // A table that held many blocks once gives the room back when most are gone, so
            // that the host memory it takes follows what is live, not its peak.
            if shard.capacity() > 64 && shard.len() < shard.capacity() / 4 {
                let len = shard.len();
                shard.shrink_to(len * 2);
            }
            block
        };
        // SAFETY: `p` was handed out by this stack's resource with `block`'s size and alignment
        // (the live table says so) and leaves the table once, here, so it is freed once.
        unsafe { self.resource.deallocate(p, block.size, block.align, stream) };
        self.counts.deallocations.fetch_add(1, Relaxed);
        self.counts.live_bytes.fetch_sub(block.size, Relaxed);
        Ok(())
    }

    /// Writes the log's buffered lines out, if there is a log; the first failure to write it
    /// since the last flush, naming its file.
    pub(crate) fn flush_log(&self) -> Result<(), String> {
        self.log.as_ref().map_or(Ok(()), Log::flush)
    }

    /// As [`flush_log`](Self::flush_log), with a failure put on standard error, unless one of
    /// this log's is there already: for a flush no caller hears of (the exit's).
    pub(crate) fn flush_log_or_report(&self) {
        if let (Err(e), Some(log)) = (self.flush_log(), &self.log) {
            log.report(&e);
        }
    }

    /// Ends the stack's life for the C caller: the blocks still live go back to it, and the log
    /// is written out whole. The log's failure to be written, naming its file, is the error.
    pub(crate) fn close(&self) -> Result<(), String> {
        self.free_live();
        self.flush_log()
    }

    /// Gives every block the client has not freed back to the stack, so that every byte it took
    /// from its upstream is returned by the time it is dropped.
    fn free_live(&self) {
        let live: Vec<(usize, Block)> = self
            .live
            .iter()
            .flat_map(|s| {
                s.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .drain()
                    .collect::<Vec<_>>()
            })
            .collect();
        for (addr, block) in live {
            if let Some(p) = NonNull::new(std::ptr::with_exposed_provenance_mut::<u8>(addr)) {
                // SAFETY: a live block of this resource with this size and alignment, which left
                // the table here, so it is freed once; the stack's life is over for the client
                // (the C API's contract: `mrstack_destroy` ends every block's life).
                unsafe {
                    self.resource
                        .deallocate(p, block.size, block.align, StreamRef::DEFAULT)
                };
            }
        }
    }

    /// The stack's description in the text-config syntax (every layer, with its settings), what
    /// its memory gives and its alignment.
    pub(crate) fn describe(&self) -> String {
        let p = self.properties();
        let stack = match &self.log {
            Some(log) => (log.describe)(),
            None => self.resource.describe().to_string(),
        };
        format!("{stack} (gives {p}, {}-byte aligned)", p.alignment)
    }

    /// The counts, as one JSON object: the calls' (allocations, deallocations, failed
    /// allocations, bad frees, live blocks and bytes, peak live bytes), the bytes the stack's leaf
    /// handed out and not yet back (`driver_bytes`, what the stack holds from the driver for a
    /// CUDA leaf) and their peak (`peak_driver_bytes`), and each suballocator layer's usage,
    /// leaf side first (`layers`: `layer`, `held`, `peak_held`, `allocated`, `free_blocks`,
    /// `chunks`; a page leaf's: `layer`, `mapped`, `peak_mapped`, `cached`, `allocated`,
    /// `reserved`, `free_blocks`, `maps`, `unmaps`, `waited_ns`, `page_table_bytes`,
    /// `slack_doublings`, `busy`).
    pub(crate) fn statistics_json(&self) -> String {
        let c = &self.counts;
        let live_blocks: usize = self
            .live
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum();
        format!(
            concat!(
                "{{\"config\":{},\"properties\":{},\"allocations\":{},\"deallocations\":{},",
                "\"failed_allocations\":{},\"bad_frees\":{},\"live_blocks\":{},",
                "\"live_bytes\":{},\"peak_live_bytes\":{},{}}}"
            ),
            json_string(&self.config),
            json_string(&self.properties().to_string()),
            c.allocations.load(Relaxed),
            c.deallocations.load(Relaxed),
            c.failed_allocations.load(Relaxed),
            c.bad_frees.load(Relaxed),
            live_blocks,
            c.live_bytes.load(Relaxed),
            c.peak_live_bytes.load(Relaxed),
            (self.layers)(),
        )
    }
}

impl std::fmt::Debug for MrstackStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrstackStack")
            .field("config", &self.config)
            .field("properties", &self.properties())
            .field("counts", &self.counts)
            .finish()
    }
}

impl Drop for MrstackStack {
    fn drop(&mut self) {
        // A stack is dropped once `mrstack_destroy` closed it (and returned its log's failure)
        // and the calls in flight then are done: what they left is given back and written out
        // here, where no caller hears of a failure.
        self.free_live();
        self.flush_log_or_report();
    }
}

/// The JSON fields of a stack's layers, read when asked.
type LayersJson = Box<dyn Fn() -> String + Send + Sync>;

/// Each suballocator layer of `stack`, leaf side first, as a JSON array of its usage.
fn layers_json<P: mrstack::property::PropertySet>(stack: &AnyResource<P>) -> String {
    use mrstack::stack::AnyLayer;
    use mrstack::suballoc::{Arena, Binning, FixedSize, Pool, ThreadHeaps, Tlsf, Usage};
    fn usage_of<P: mrstack::property::PropertySet>(
        layer: &dyn AnyLayer,
    ) -> Option<(&'static str, Usage)> {
        let any = layer.as_any();
        // The first of the suballocator types that `layer` is, with its name in text configs.
        macro_rules! usage_if {
            ($($T:ident $name:literal),*) => {$(
                if let Some(r) = any.downcast_ref::<$T<AnyResource<P>>>() {
                    return Some(($name, r.usage()));
                }
            )*};
        }
        usage_if!(
            Pool "pool",
            Tlsf "tlsf",
            Binning "binning",
            Arena "arena",
            FixedSize "fixed_size",
            ThreadHeaps "thread_heaps"
        );
        None
    }
    /// The page leaves text builds, with what they map: `(name, usage)`.
    fn pages_of(layer: &dyn AnyLayer) -> Option<(&'static str, mrstack::leaf::VmUsage)> {
        use mrstack::leaf::{DevicePages, PagedHeaps, Simulated, VirtualMemory};
        let any = layer.as_any();
        if let Some(r) = any.downcast_ref::<VirtualMemory<DevicePages>>() {
            return Some(("vmm", r.usage()));
        }
        if let Some(r) = any.downcast_ref::<VirtualMemory<Simulated>>() {
            return Some(("vmm", r.usage()));
        }
        if let Some(r) = any.downcast_ref::<PagedHeaps<DevicePages>>() {
            return Some(("paged", r.usage()));
        }
        if let Some(r) = any.downcast_ref::<PagedHeaps<Arc<Simulated>>>() {
            return Some(("paged", r.usage()));
        }
        None
    }
    let mut layers: Vec<String> = stack
        .layers()
        .filter_map(|layer| {
            if let Some((name, u)) = usage_of::<P>(layer) {
                return Some(format!(
                    concat!(
                        "{{\"layer\":\"{}\",\"held\":{},\"peak_held\":{},\"allocated\":{},",
                        "\"free_blocks\":{},\"chunks\":{}}}"
                    ),
                    name, u.held, u.peak_held, u.allocated, u.free_blocks, u.chunks
                ));
            }
            let (name, u) = pages_of(layer)?;
            Some(format!(
                concat!(
                    "{{\"layer\":\"{}\",\"mapped\":{},\"peak_mapped\":{},\"cached\":{},",
                    "\"allocated\":{},\"reserved\":{},\"free_blocks\":{},\"maps\":{},",
                    "\"unmaps\":{},\"waited_ns\":{},\"page_table_bytes\":{},",
                    "\"slack_doublings\":{},\"busy\":{}}}"
                ),
                name,
                u.mapped,
                u.peak_mapped,
                u.cached,
                u.allocated,
                u.reserved,
                u.free_blocks,
                u.maps,
                u.unmaps,
                u.waited.as_nanos(),
                u.page_table_bytes,
                u.slack_doublings,
                u.busy
            ))
        })
        .collect();
    layers.reverse();
    format!("[{}]", layers.join(","))
}

/// Builds `config` (with `Logging` to `log` on top when given), erased to `AnyResource<()>`
/// with what its memory gives kept. A stack built over `AnyResource<()>` would lose its leaf's
/// properties in each layer above it (a layer's properties are those of the type below it): so
/// it is built with the set its leaf gives, read from the leaf's name, and only then erased.
/// A meter goes between the leaf and the item above it, counting what the leaf hands out.
fn build_erased(
    config: &str,
    device: usize,
    log: Option<&str>,
) -> Result<(AnyResource<()>, Option<Log>, LayersJson), String> {
    use mrstack::property::{DeviceAccessible as D, HostAccessible as H, Migratable as M};
    fn with<P: mrstack::property::PropertySet>(
        spec: &StackSpec,
        device: usize,
        log: Option<&str>,
    ) -> Result<(AnyResource<()>, Option<Log>, LayersJson), String>
    where
        AnyResource<P>: Accessible<P>,
        Metered<AnyResource<P>>: Accessible<P>,
        Logging<AnyResource<P>, LogFile>: Accessible<P>,
    {
        let meter: Arc<OnceLock<Arc<Metered<AnyResource<P>>>>> = Arc::default();
        let built = meter.clone();
        let r = StackBuilder::<P>::new()
            .on_device(device)
            .around_leaf(move |leaf| {
                let m = Arc::new(Metered::new(leaf));
                let _ = built.set(m.clone());
                AnyResource::from_arc(m)
            })
            .build_spec(spec)
            .map_err(|e| {
                if !matches!(e.kind, ConfigErrorKind::Resource { .. }) {
                    crate::error::set_kind(crate::error::MRSTACK_ERROR_CONFIG);
                }
                e.to_string()
            })?;
        let layers: LayersJson = {
            let r = r.clone();
            Box::new(move || {
                let (now, peak) = meter.get().map_or(("null".into(), "null".into()), |m| {
                    (m.in_use().to_string(), m.peak().to_string())
                });
                format!(
                    "\"driver_bytes\":{now},\"peak_driver_bytes\":{peak},\"layers\":{}",
                    layers_json(&r)
                )
            })
        };
        let Some(path) = log else {
            return Ok((r.forget::<()>(), None, layers));
        };
        let file = File::create(path).map_err(|e| format!("log: cannot create `{path}`: {e}"))?;
        let path: Arc<str> = path.into();
        let reported = Arc::new(AtomicBool::new(false));
        let file = LogFile {
            file,
            path: path.clone(),
            reported: reported.clone(),
        };
        let logged = Arc::new(Logging::new(r, file));
        let flush = {
            let logged = logged.clone();
            Box::new(move || logged.flush())
        };
        let describe = {
            let (logged, path) = (logged.clone(), path.clone());
            Box::new(move || LoggingTo(logged.upstream(), &path).to_string())
        };
        let log = Log {
            path,
            flush,
            describe,
            reported,
        };
        Ok((
            AnyResource::from_arc(logged).forget::<()>(),
            Some(log),
            layers,
        ))
    }
    let spec: StackSpec = config.parse().map_err(|e| {
        crate::error::set_kind(crate::error::MRSTACK_ERROR_CONFIG);
        format!("config `{config}`: {e}")
    })?;
    // The page leaves give device memory unless their pages are simulated.
    let simulated_pages = spec
        .items
        .first()
        .is_some_and(|i| i.fields.iter().any(|f| f.name == "simulated"));
    let built = match spec.items.first().map(|i| i.name.as_str()) {
        Some("cuda" | "cuda_async" | "cuda_async_view") => with::<D>(&spec, device, log),
        Some("vmm" | "paged") if !simulated_pages => with::<D>(&spec, device, log),
        Some("pinned") => with::<(H, D)>(&spec, device, log),
        Some("managed" | "cuda_async_managed" | "sam_headroom") => {
            with::<(H, D, M)>(&spec, device, log)
        }
        Some("system") => with::<H>(&spec, device, log),
        // Simulated memory gives nothing; anything else, the builder names the error.
        _ => with::<()>(&spec, device, log),
    };
    built.map_err(|e| {
        if e.starts_with("log: ") {
            e
        } else {
            format!("config `{config}`: {e}")
        }
    })
}

/// `s` as a JSON string literal.
pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
