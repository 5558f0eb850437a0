//! How the coalescing suballocators (`Pool`, `Tlsf`) take chunks from their upstream and give
//! them back: the growth rule, the retries when the upstream is short of memory, release and drop.

use crate::resource::{AllocError, MemoryResource, Undo};
use crate::stream::{Held, StreamKeeper, StreamRef};
use std::ptr::NonNull;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::ThreadId;

/// Every block's size and offset in its chunk is a multiple of this.
pub(crate) const GRANULE: usize = 256;
/// The smallest chunk a suballocator without a maximum takes from its upstream: the page size the
/// CUDA driver maps device memory in, so that smaller chunks would waste address space.
const MIN_GROWTH: usize = 2 << 20;
/// The largest chunk asked for: no allocation exceeds `isize::MAX` bytes.
const MAX_CHUNK: usize = isize::MAX as usize & !(GRANULE - 1);

/// A chunk with no block allocated: where, how large, the stream it was allocated on, and the
/// streams its free blocks were freed on.
pub(super) struct FreeChunk {
    pub(super) start: usize,
    pub(super) size: usize,
    pub(super) stream: Held,
    pub(super) freed_on: Vec<Held>,
}

/// What the growth and release rules need of a suballocator's bookkeeping.
pub(super) trait Chunks {
    /// Bytes held from the upstream.
    fn held(&self) -> usize;
    /// Records a chunk just taken from the upstream on `stream`; false when the bookkeeping has
    /// no room for it (the chunk then goes back).
    fn add(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool;
    /// The chunks with no block allocated.
    fn free_chunks(&self) -> Vec<FreeChunk>;
    /// Forgets the wholly free chunks at `starts` and their free blocks; their streams stay
    /// held (the caller releases them).
    fn forget(&mut self, starts: &[usize]);
    /// The streams the bookkeeping names.
    fn streams(&mut self) -> &mut StreamKeeper;
    /// The [`grow`]s under way, with the lock let go: their bytes count against the maximum.
    fn in_flight(&self) -> &InFlight;
    /// [`in_flight`](Self::in_flight), to change.
    fn in_flight_mut(&mut self) -> &mut InFlight;
}

/// The initial reservation: one chunk of `bytes` (rounded up to the granule, at most `max`) on
/// the default stream, or the upstream's error; out of memory for a size no allocation can have,
/// or when the bookkeeping has no room for the chunk.
pub(super) fn reserve<U: MemoryResource, C: Chunks>(
    upstream: &U,
    book: &mut C,
    bytes: usize,
    max: usize,
    name: &'static str,
) -> Result<(), AllocError> {
    let size = bytes
        .checked_next_multiple_of(GRANULE)
        .unwrap_or(usize::MAX)
        .min(max);
    if size == 0 {
        return Ok(());
    }
    let oom = AllocError::out_of_memory(bytes, GRANULE, name);
    if size > MAX_CHUNK {
        return Err(oom);
    }
    let ptr = upstream.allocate(size, GRANULE, StreamRef::DEFAULT)?;
    if book.add(ptr.as_ptr() as usize, size, StreamRef::DEFAULT) {
        return Ok(());
    }
    // SAFETY: just allocated with this size, alignment and stream; recorded nowhere.
    unsafe { upstream.deallocate(ptr, size, GRANULE, StreamRef::DEFAULT) };
    Err(oom)
}

/// Gives every wholly free chunk of `book` back to `upstream`, each on its stream after
/// `order_after` that stream behind the streams that freed blocks inside it (a chunk whose
/// ordering fails is kept); returns the bytes given back.
pub(super) fn release<U: MemoryResource, C: Chunks>(upstream: &U, book: &mut C) -> usize {
    let free = book.free_chunks();
    let streams = book.streams();
    let ordered: Vec<FreeChunk> = free
        .into_iter()
        .filter(|c| {
            c.freed_on
                .iter()
                .filter(|&&s| s != c.stream)
                .try_for_each(|&s| upstream.order_after(streams.get(c.stream), streams.get(s)))
                .is_ok()
        })
        .collect();
    let mut bytes = 0;
    for c in &ordered {
        // One at a time: an upstream `deallocate` that panics leaves the chunks not yet given
        // back in the book, for the next release or the drop.
        book.forget(&[c.start]);
        let streams = book.streams();
        bytes += c.size;
        // SAFETY: the chunk came from `upstream.allocate(c.size, GRANULE, c.stream)`, is wholly
        // free and was just forgotten, so it goes back once, on its stream, ordered after every
        // stream that freed a block inside it.
        unsafe { give_back(upstream, c, streams) };
        streams.release(c.stream);
    }
    bytes
}

/// For a suballocator being dropped: gives every wholly free chunk back as [`release`] does,
/// waiting for a stream on the host where it cannot be ordered; a chunk with a block still
/// allocated (its owner was leaked with `mem::forget`, and device work queued before may still
/// use it) is leaked rather than handed back for reuse under that work.
pub(super) fn drop_chunks<U: MemoryResource, C: Chunks>(upstream: &U, book: &mut C) {
    let free = book.free_chunks();
    let streams = book.streams();
    let mut panicked = FirstPanic::default();
    for c in &free {
        // An upstream that panics on one chunk (ordering it or taking it back) still gets the
        // others, and a chunk whose ordering panics is leaked; the first panic goes on after them
        // all (unless this drop runs while unwinding, where a second panic would abort). The
        // ordering runs inside the catch, or a panic there would lose every later chunk or abort.
        panicked.catch(|| {
            // Where a stream can be neither ordered after nor waited for, its work may still use
            // the chunk: it is leaked rather than given back under it.
            let ordered = (c.freed_on.iter())
                .all(|&s| order_or_wait(upstream, streams.get(c.stream), streams.get(s)));
            if ordered {
                // SAFETY: the chunk came from the upstream with this size on this stream, and
                // the suballocator, being dropped, hands out none of it any more; each chunk is
                // visited once, ordered after every stream that freed a block inside it.
                unsafe { give_back(upstream, c, streams) };
            }
        });
    }
    panicked.resume();
}

/// Orders `stream` after `after` on `upstream`, or, where no event can, waits for `after` on the
/// host. False when neither worked: `stream` may not take what `after` freed, and the caller leaks
/// it rather than hand it over unordered (the drops, and frees that cannot return an error).
pub(crate) fn order_or_wait<U: MemoryResource + ?Sized>(
    upstream: &U,
    stream: StreamRef,
    after: StreamRef,
) -> bool {
    stream == after
        || upstream.order_after(stream, after).is_ok()
        || upstream.synchronize(after).is_ok()
}

/// For a drop that gives several things back to an upstream that may panic: each is given back
/// whatever the others do, and the first panic goes on after them all (unless the drop runs while
/// unwinding, where a second panic would abort).
#[derive(Default)]
pub(crate) struct FirstPanic(Option<Box<dyn std::any::Any + Send>>);

impl FirstPanic {
    /// Runs `f`, keeping its panic if it is the first.
    pub(crate) fn catch(&mut self, f: impl FnOnce()) {
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            self.0.get_or_insert(payload);
        }
    }

    /// Goes on with the first panic caught, if any.
    pub(crate) fn resume(self) {
        if let Some(payload) = self.0 {
            if !std::thread::panicking() {
                std::panic::resume_unwind(payload);
            }
        }
    }
}

/// # Safety
///
/// `c` describes an upstream allocation that nothing uses any more, and `streams` holds its
/// stream.
unsafe fn give_back<U: MemoryResource>(upstream: &U, c: &FreeChunk, streams: &StreamKeeper) {
    if let Some(ptr) = NonNull::new(std::ptr::with_exposed_provenance_mut(c.start)) {
        // SAFETY: forwarded from the caller: a live upstream allocation of this size.
        unsafe { upstream.deallocate(ptr, c.size, GRANULE, streams.get(c.stream)) };
    }
}

/// The block a request of `size` bytes at `align` takes: `(align, block, need)`, the alignment
/// raised to the granule, the size rounded up to it, and the bytes a free range must hold to
/// place such a block at that alignment (ranges start at granule multiples). For a request
/// `check_request` accepted, which bounds `size` by `isize::MAX - align`: nothing overflows.
#[inline]
pub(crate) fn block_of(size: usize, align: usize) -> (usize, usize, usize) {
    let align = align.max(GRANULE);
    let block = size.next_multiple_of(GRANULE);
    (align, block, block + (align - GRANULE))
}

/// A request that [`grow`] serves from `upstream`.
#[derive(Clone, Copy)]
pub(super) struct Request<'s> {
    /// Bytes the new chunk must hold for the request's block (with its alignment slack).
    pub(super) need: usize,
    pub(super) stream: StreamRef<'s>,
    /// The caller's size and alignment, for the error.
    pub(super) size: usize,
    pub(super) align: usize,
    pub(super) name: &'static str,
}

/// Growths under way with their suballocator's lock let go (around the upstream's `allocate`):
/// their bytes count against the cap, and the threads running them are known, so that a thread
/// about to grow waits for another thread's growth (one at a time: that chunk may serve it, as
/// when the lock was held throughout) while a thread's own call from inside its growth (a
/// [`Retry`](crate::adaptor::Retry) callback calling back in) never waits, for itself or for
/// others.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    bytes: usize,
    threads: Vec<ThreadId>,
}

impl InFlight {
    /// Bytes being asked for.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The calling thread starts asking for `bytes`.
    pub(crate) fn begin(&mut self, bytes: usize) {
        self.bytes += bytes;
        self.threads.push(std::thread::current().id());
    }

    /// The calling thread's growth of `bytes` is over.
    pub(crate) fn end(&mut self, bytes: usize) {
        self.bytes -= bytes;
        let me = std::thread::current().id();
        if let Some(i) = self.threads.iter().position(|&t| t == me) {
            self.threads.swap_remove(i);
        }
    }

    /// True when the calling thread should wait for the growths under way before it grows: other
    /// threads grow, and it does not (a call from inside its own growth never waits).
    pub(crate) fn worth_waiting(&self) -> bool {
        let me = std::thread::current().id();
        !self.threads.is_empty() && !self.threads.contains(&me)
    }
}

/// A suballocator's lock, the condition its growths signal when they end, and where its state
/// keeps them.
pub(crate) struct Locks<'m, C> {
    pub(crate) state: &'m Mutex<C>,
    pub(crate) grown: &'m Condvar,
    pub(crate) in_flight: fn(&mut C) -> &mut InFlight,
}

impl<'m, C> Locks<'m, C> {
    pub(crate) fn lock(&self) -> MutexGuard<'m, C> {
        // The callers keep their state consistent across every call that may panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lets `st` go until no growth that [`InFlight::worth_waiting`] names is under way.
    pub(crate) fn wait(&self, st: MutexGuard<'m, C>) -> MutexGuard<'m, C> {
        self.grown
            .wait_while(st, |st| (self.in_flight)(st).worth_waiting())
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `upstream_call` with `st`'s lock let go and `bytes` counted as the calling thread's
    /// growth meanwhile; then takes the lock again, ends the growth and wakes the threads waiting
    /// for it. Should the call panic, the growth ends on the way out: the cap stays whole.
    pub(crate) fn unlocked<R>(
        &self,
        mut st: MutexGuard<'m, C>,
        bytes: usize,
        upstream_call: impl FnOnce() -> R,
    ) -> (MutexGuard<'m, C>, R) {
        (self.in_flight)(&mut st).begin(bytes);
        drop(st);
        let end = |st: &mut C| {
            (self.in_flight)(st).end(bytes);
            self.grown.notify_all();
        };
        let claim = Undo(|| end(&mut self.lock()));
        let got = upstream_call();
        std::mem::forget(claim);
        let mut st = self.lock();
        end(&mut st);
        (st, got)
    }
}

/// Takes a chunk that can hold `req.need` bytes from `upstream` on the request's stream, holding
/// at most `max` bytes in all: doubling (at least 2 MiB), and near the maximum exactly what is
/// still allowed, so that a maximum barely above the peak of live bytes still serves the
/// workload; an upstream short of memory is asked for half as much, down to the need, as RMM
/// does. `release` gives the wholly free chunks back and returns the bytes it gave: it is called
/// when a chunk for the request would pass the maximum, and once when the upstream is out.
///
/// `st` is the suballocator's locked bookkeeping: the lock is let go around each
/// `upstream.allocate`, which may run code of the caller's (a [`Retry`](crate::adaptor::Retry)
/// callback that frees blocks of this suballocator or trims it) that takes it. The bytes asked
/// for count against `max` meanwhile ([`Chunks::in_flight`]). Returns the lock and whether a
/// chunk went in (held since: the caller's `take` finds it); `false` when another thread's growth
/// was under way, which it waited for (one growth at a time): the caller looks again.
pub(super) fn grow<'m, U: MemoryResource, C: Chunks>(
    upstream: &U,
    mut st: MutexGuard<'m, C>,
    locks: &Locks<'m, C>,
    max: usize,
    req: Request<'_>,
    mut release: impl FnMut(&mut C) -> usize,
) -> Result<(MutexGuard<'m, C>, bool), AllocError> {
    let Request {
        need,
        stream,
        size,
        align,
        name,
    } = req;
    let mut released = false;
    let oom = AllocError::out_of_memory(size, align, name);
    // A request no chunk under the cap could hold gives nothing back: it would only empty the
    // pool for nothing.
    if need > MAX_CHUNK || need > max {
        return Err(oom);
    }
    // One growth at a time (but a thread's own, from inside its growth): another thread's chunk
    // may serve this request, as it did when the lock was held around the upstream, and two
    // growths at once would each take a chunk (sixteen threads could take 64 GiB for 64 KiB).
    if st.in_flight().worth_waiting() {
        return Ok((locks.wait(st), false));
    }
    let taken = |st: &C| st.held() + st.in_flight().bytes();
    let room = |st: &C| max.saturating_sub(taken(st));
    if need > room(&st) {
        // Wholly free chunks too small for this request still count against the maximum: give
        // them back to make room for one that fits.
        released = true;
        if release(&mut st) == 0 || need > room(&st) {
            return Err(oom);
        }
    }
    // Doubling what is held (a re-entrant growth's claim counts against the cap, not as held).
    let mut want = growth(st.held(), need, room(&st));
    loop {
        let got;
        (st, got) = locks.unlocked(st, want, || upstream.allocate(want, GRANULE, stream));
        match got {
            Ok(ptr) => {
                if st.add(ptr.as_ptr() as usize, want, stream) {
                    return Ok((st, true));
                }
                drop(st);
                // SAFETY: just allocated from `upstream` with this size, alignment and stream,
                // and recorded nowhere.
                unsafe { upstream.deallocate(ptr, want, GRANULE, stream) };
                return Err(oom);
            }
            // Like RMM: an upstream short of memory may still have a smaller chunk.
            Err(e) if e.is_out_of_memory() && want > need => {
                want = ((want / 2) & !(GRANULE - 1)).max(need);
            }
            Err(e) if e.is_out_of_memory() && !released && release(&mut st) > 0 => {
                released = true;
                want = need;
            }
            // Out of memory for the caller's request, not for the chunk it asked for.
            Err(e) if e.is_out_of_memory() => return Err(oom),
            Err(e) => return Err(e),
        }
        // A release may have given room back meanwhile; re-entrant growths may have taken some.
        if need > room(&st) {
            return Err(oom);
        }
        want = want.min(room(&st));
    }
}

/// How much to take from the upstream for a block of `need` bytes, when `held` bytes are held and
/// `remaining` more may be (`need <= remaining`, `need <= MAX_CHUNK`): never more than
/// `MAX_CHUNK`.
fn growth(held: usize, need: usize, remaining: usize) -> usize {
    // Doubling keeps the number of chunks (and upstream calls) logarithmic in the peak.
    let want = need.max(held).max(MIN_GROWTH).min(remaining);
    // Near the cap, a chunk that left less than itself behind would strand the rest in a piece
    // too small for the next growth: take everything that is still allowed instead.
    let want = if remaining - want < want {
        remaining
    } else {
        want
    };
    // No allocation exceeds isize::MAX bytes (`need` does not, so this still holds it).
    want.min(MAX_CHUNK)
}
