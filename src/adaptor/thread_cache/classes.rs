//! The size classes: a request's class and block size (`class_of`), and a class's block size
//! (`class_size`).

use super::{GRANULE, SUBCLASSES};

/// The class of a request of `size` bytes (1 ≤ size ≤ 2^(usize::BITS - 2)): its index and the
/// size of its blocks. Up to 2 KiB, classes of 256 bytes; above, 8 classes per power of two.
#[inline]
pub(super) fn class_of(size: usize) -> (usize, usize) {
    let s = size.max(1) - 1;
    if s < 8 * GRANULE {
        let i = s / GRANULE;
        return (i, (i + 1) * GRANULE);
    }
    // s >= 2048: the top bit p >= 11; the class steps by 2^(p - 3) within (2^p, 2^(p+1)].
    let p = usize::BITS - 1 - s.leading_zeros();
    let step = p - SUBCLASSES.trailing_zeros();
    let top = s >> step; // in [8, 16)
    let i = ((p - 11) * SUBCLASSES) as usize + top;
    (i, (top + 1) << step)
}

/// The block size of class `i` (the inverse of [`class_of`]).
#[inline]
pub(super) fn class_size(i: usize) -> usize {
    if i < 8 {
        return (i + 1) * GRANULE;
    }
    let p = (i / SUBCLASSES as usize) as u32 + 10;
    let top = i % SUBCLASSES as usize + 8;
    (top + 1) << (p - SUBCLASSES.trailing_zeros())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_round_up_by_at_most_an_eighth_and_invert() {
        let sizes = (1..70_000)
            .chain((1..62).map(|p| (1usize << p) + 1))
            .chain([1 << 62]);
        for size in sizes {
            let (i, block) = class_of(size);
            assert!(block >= size, "{size}: block {block}");
            assert_eq!(block % GRANULE, 0, "{size}");
            assert!(
                block - size < GRANULE || (block - size) * 8 <= size,
                "{size}: block {block}"
            );
            assert_eq!(class_size(i), block, "class {i} of {size}");
        }
        // Classes grow with the size, one index at a time.
        let mut last = 0;
        for size in 1..70_000 {
            let (i, _) = class_of(size);
            assert!(i == last || i == last + 1, "{size}: class {i} after {last}");
            last = i;
        }
    }
}
