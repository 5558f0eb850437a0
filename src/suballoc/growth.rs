//! How the coalescing suballocators (`Pool`, `Tlsf`) take chunks from their upstream: the growth
//! rule and the retries when the upstream is short of memory.

use crate::resource::{AllocError, MemoryResource};
use crate::stream::StreamRef;

/// Every block's size and offset in its chunk is a multiple of this.
pub(crate) const GRANULE: usize = 256;
/// The smallest chunk a suballocator without a maximum takes from its upstream: the page size the
/// CUDA driver maps device memory in, so that smaller chunks would waste address space.
const MIN_GROWTH: usize = 2 << 20;
/// The largest chunk asked for: no allocation exceeds `isize::MAX` bytes.
pub(super) const MAX_CHUNK: usize = isize::MAX as usize & !(GRANULE - 1);

/// What the growth rule needs of a suballocator's bookkeeping.
pub(super) trait Chunks {
    /// Bytes held from the upstream.
    fn held(&self) -> usize;
    /// Records a chunk just taken from the upstream on `stream`; false when the bookkeeping has
    /// no room for it (the chunk then goes back).
    fn add(&mut self, addr: usize, size: usize, stream: StreamRef) -> bool;
}

/// A request that [`grow`] serves from `upstream`.
pub(super) struct Request<'s> {
    /// Bytes the new chunk must hold for the request's block (with its alignment slack).
    pub(super) need: usize,
    pub(super) stream: StreamRef<'s>,
    /// The caller's size and alignment, for the error.
    pub(super) size: usize,
    pub(super) align: usize,
    pub(super) name: &'static str,
}

/// Takes a chunk that can hold `req.need` bytes from `upstream` on the request's stream, holding
/// at most `max` bytes in all: doubling (at least 2 MiB), and near the maximum exactly what is
/// still allowed, so that a maximum barely above the peak of live bytes still serves the
/// workload; an upstream short of memory is asked for half as much, down to the need, as RMM
/// does. `release` gives the wholly free chunks back and returns the bytes it gave: it is called
/// when a chunk for the request would pass the maximum, and once when the upstream is out.
pub(super) fn grow<U: MemoryResource, C: Chunks>(
    upstream: &U,
    book: &mut C,
    max: usize,
    req: Request<'_>,
    mut release: impl FnMut(&mut C) -> usize,
) -> Result<(), AllocError> {
    let Request {
        need,
        stream,
        size,
        align,
        name,
    } = req;
    let mut released = false;
    let oom = AllocError::out_of_memory(size, align, name);
    if need > MAX_CHUNK {
        return Err(oom);
    }
    if need > max - book.held() {
        // Wholly free chunks too small for this request still count against the maximum: give
        // them back to make room for one that fits.
        released = true;
        if release(book) == 0 || need > max - book.held() {
            return Err(oom);
        }
    }
    let mut want = growth(book.held(), need, max - book.held());
    loop {
        match upstream.allocate(want, GRANULE, stream) {
            Ok(ptr) => {
                if book.add(ptr.as_ptr() as usize, want, stream) {
                    return Ok(());
                }
                // SAFETY: just allocated from `upstream` with this size, alignment and stream,
                // and recorded nowhere.
                unsafe { upstream.deallocate(ptr, want, GRANULE, stream) };
                return Err(oom);
            }
            // Like RMM: an upstream short of memory may still have a smaller chunk.
            Err(e) if e.is_out_of_memory() && want > need => {
                want = ((want / 2) & !(GRANULE - 1)).max(need);
            }
            Err(e) if e.is_out_of_memory() && !released && release(book) > 0 => {
                released = true;
                want = need;
            }
            // Out of memory for the caller's request, not for the chunk it asked for.
            Err(e) if e.is_out_of_memory() => return Err(oom),
            Err(e) => return Err(e),
        }
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
