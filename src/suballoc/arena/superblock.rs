//! `Superblock`: a superblock held by a local arena, with its free blocks served by first fit.

use super::GRAN;
use crate::resource::align_up;

/// A superblock of a local arena: free blocks as (offset, length) in 256-byte units, by offset.
#[derive(Debug)]
pub(super) struct Superblock {
    pub(super) base: usize,
    pub(super) chunk: u32,
    pub(super) free_units: u32,
    pub(super) free: Vec<(u32, u32)>,
}

impl Superblock {
    pub(super) fn max_free(&self) -> u32 {
        self.free.iter().map(|b| b.1).max().unwrap_or(0)
    }

    /// Takes `n` units at `align` from the first free block that holds them; their offset.
    pub(super) fn take(&mut self, n: u32, align: usize) -> Option<u32> {
        for i in 0..self.free.len() {
            let (start, len) = self.free[i];
            let addr = self.base + start as usize * GRAN;
            let pad = ((align_up(addr, align)? - addr) / GRAN) as u32;
            if u64::from(pad) + u64::from(n) > u64::from(len) {
                continue;
            }
            let rest = len - pad - n;
            match (pad > 0, rest > 0) {
                (false, false) => {
                    self.free.remove(i);
                }
                (false, true) => self.free[i] = (start + n, rest),
                (true, false) => self.free[i] = (start, pad),
                (true, true) => {
                    self.free[i] = (start, pad);
                    self.free.insert(i + 1, (start + pad + n, rest));
                }
            }
            self.free_units -= n;
            return Some(start + pad);
        }
        None
    }

    /// Frees `n` units at `off`, coalescing with the free blocks on either side.
    pub(super) fn give(&mut self, off: u32, n: u32) {
        let i = self.free.partition_point(|b| b.0 < off);
        debug_assert!(
            (i == 0 || self.free[i - 1].0 + self.free[i - 1].1 <= off)
                && (i == self.free.len() || off + n <= self.free[i].0),
            "Arena: double free in a superblock"
        );
        let merge_prev = i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == off;
        let merge_next = i < self.free.len() && off + n == self.free[i].0;
        match (merge_prev, merge_next) {
            (true, true) => {
                let next = self.free.remove(i);
                self.free[i - 1].1 += n + next.1;
            }
            (true, false) => self.free[i - 1].1 += n,
            (false, true) => self.free[i] = (off, self.free[i].1 + n),
            (false, false) => self.free.insert(i, (off, n)),
        }
        self.free_units += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_first_fit_aligns_and_coalesces() {
        let mut sb = Superblock {
            base: 1 << 20,
            chunk: 0,
            free_units: 64,
            free: vec![(0, 64)],
        };
        assert_eq!(sb.take(1, 256), Some(0));
        // 4 KiB alignment skips to unit 16, leaving units 1..16 free before it.
        assert_eq!(sb.take(2, 4096), Some(16));
        assert_eq!(sb.free, [(1, 15), (18, 46)]);
        assert_eq!(
            sb.take(15, 256),
            Some(1),
            "first fit fills the hole exactly"
        );
        assert_eq!(sb.take(47, 256), None);
        sb.give(1, 15);
        sb.give(16, 2);
        sb.give(0, 1);
        assert_eq!((sb.free.as_slice(), sb.free_units), (&[(0, 64)][..], 64));
    }
}
