//! Size classes: two levels, a power of two and 32 steps within it, each with a free list and a
//! bit in the bitmaps of its stream's [`Classes`].

use super::{GRANULE, NIL};
use crate::stream::Held;

const GRANULE_LOG: u32 = GRANULE.trailing_zeros();
/// log2 of the classes per power of two: 32, so a class spans at most 1/32 of its sizes and a
/// search that rounds up to the next class wastes at most ~3%.
const SL_LOG: u32 = 5;
const SL: usize = 1 << SL_LOG;
/// First levels: class 0 holds the sizes below `SL` granules one per class (exact), level `f`
/// the sizes of `[2^(f+4), 2^(f+5))` granules.
const FL: usize = (usize::BITS - GRANULE_LOG - SL_LOG + 1) as usize;

/// One stream's free blocks by class.
#[derive(Debug)]
#[repr(C)]
pub(super) struct Classes {
    pub(super) first: u64,
    /// Free blocks in these classes: the list goes (releasing the stream) at zero.
    pub(super) blocks: usize,
    /// The stream these blocks were freed on (the keeper slot the list sits at).
    pub(super) stream: Held,
    pub(super) second: [u32; FL],
    pub(super) heads: [[u32; SL]; FL],
}

impl Classes {
    pub(super) fn new(stream: Held) -> Box<Self> {
        Box::new(Classes {
            stream,
            first: 0,
            second: [0; FL],
            heads: [[NIL; SL]; FL],
            blocks: 0,
        })
    }

    /// The first non-empty class at or above `(f, s)`.
    #[inline]
    pub(super) fn find(&self, f: usize, s: usize) -> Option<(usize, usize)> {
        let here = self.second[f] & (u32::MAX << s);
        if here != 0 {
            return Some((f, here.trailing_zeros() as usize));
        }
        let above = self.first & u64::MAX.checked_shl(f as u32 + 1).unwrap_or(0);
        if above == 0 {
            return None;
        }
        let f = above.trailing_zeros() as usize;
        Some((f, self.second[f].trailing_zeros() as usize))
    }
}

/// The class a free block of `size` bytes (a granule multiple, not zero) is listed in: every
/// block of class `(f, s)` is at least the class's lower bound.
#[inline]
pub(super) fn class_of(size: usize) -> (usize, usize) {
    let units = size >> GRANULE_LOG;
    if units < SL {
        return (0, units);
    }
    let log = usize::BITS - 1 - units.leading_zeros();
    let s = (units >> (log - SL_LOG)) - SL;
    ((log - SL_LOG + 1) as usize, s)
}

/// The lowest class whose every block holds `size` bytes (a granule multiple, not zero): the
/// request rounded up to the next class boundary.
#[inline]
pub(super) fn class_at_least(size: usize) -> Option<(usize, usize)> {
    let units = size >> GRANULE_LOG;
    if units < SL {
        return Some((0, units));
    }
    let log = usize::BITS - 1 - units.leading_zeros();
    let step = (1usize << (log - SL_LOG)) - 1;
    let up = units.checked_add(step)? & !step;
    let (f, s) = class_of(up.checked_mul(GRANULE)?);
    (f < FL).then_some((f, s))
}
