//! `Bits`, the page bit set a region keeps for its mapped and its cached pages.

/// A set of pages, a bit each.
#[derive(Debug, Default)]
pub(super) struct Bits(pub(super) Vec<u64>);

impl Bits {
    /// Makes room for pages below `n`.
    pub(super) fn grow(&mut self, n: usize) {
        let words = n.div_ceil(64);
        if self.0.len() < words {
            self.0.resize(words, 0);
        }
    }

    #[inline]
    pub(super) fn get(&self, p: usize) -> bool {
        self.0[p / 64] & (1 << (p % 64)) != 0
    }

    /// Calls `f(word index, mask)` for the words of pages `lo..hi` (`lo < hi`).
    #[inline]
    pub(super) fn words(lo: usize, hi: usize, mut f: impl FnMut(usize, u64)) {
        let (first, last) = (lo / 64, (hi - 1) / 64);
        if first == last {
            // Most blocks lie on a page or two: one word, no loop.
            f(first, (u64::MAX >> (64 - (hi - lo))) << (lo % 64));
            return;
        }
        for w in first..=last {
            let from = if w == first { lo % 64 } else { 0 };
            let to = if w == last { (hi - 1) % 64 + 1 } else { 64 };
            let mask = (u64::MAX >> (64 - (to - from))) << from;
            f(w, mask);
        }
    }

    /// Sets pages `lo..hi`; returns how many were clear.
    #[inline]
    pub(super) fn set(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            Self::words(lo, hi, |w, m| {
                n += (!self.0[w] & m).count_ones() as usize;
                self.0[w] |= m;
            });
        }
        n
    }

    /// How many pages of `lo..hi` are clear.
    #[inline]
    pub(super) fn count_clear(&self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            Self::words(lo, hi, |w, m| n += (!self.0[w] & m).count_ones() as usize);
        }
        n
    }

    /// Clears pages `lo..hi`; returns how many were set.
    #[inline]
    pub(super) fn clear(&mut self, lo: usize, hi: usize) -> usize {
        let mut n = 0;
        if lo < hi {
            Self::words(lo, hi, |w, m| {
                n += (self.0[w] & m).count_ones() as usize;
                self.0[w] &= !m;
            });
        }
        n
    }
}
