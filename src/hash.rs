//! `FastHash`: the hasher of the crate's own tables, keyed by numbers the crate makes itself.

use std::hash::{BuildHasherDefault, Hasher};

/// Builds [`FastHasher`]s: what every table keyed by stream identities, block addresses or
/// window numbers uses. A multiply per word instead of SipHash, whose flooding resistance buys
/// nothing for keys no outsider chooses, and which would cost more than the rest of a
/// deallocation.
pub(crate) type FastHash = BuildHasherDefault<FastHasher>;

/// A multiply-and-fold hasher: each word is mixed with a 64-bit odd constant, and the
/// well-mixed high half of the product folded onto the low bits a table indexes by.
#[derive(Debug, Default)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::BuildHasher;

    #[test]
    fn addresses_spread_over_the_low_bits() {
        // Multiples of 256 (block addresses) must not collide in the bits a table indexes by.
        let low: HashSet<u64> = (0..4096u64)
            .map(|i| FastHash::default().hash_one(i * 256) & 0xfff)
            .collect();
        assert!(low.len() > 2000, "{} distinct of 4096", low.len());
    }
}
