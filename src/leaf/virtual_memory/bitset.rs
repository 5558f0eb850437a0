//! `Bits`: a set of the pages of one chunk of the page table, a bit each.

use super::table::CHUNK_PAGES;

const WORDS: usize = CHUNK_PAGES / 64;

/// A set of the pages of one chunk, by their index in the chunk.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Bits(pub(super) [u64; WORDS]);

impl Bits {
    #[inline]
    pub(super) fn get(&self, p: usize) -> bool {
        self.0[p / 64] & (1 << (p % 64)) != 0
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
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

    /// How many pages are set.
    pub(super) fn count(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
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
