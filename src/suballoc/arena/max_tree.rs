//! `MaxTree`: the 16-ary max-tree with which a local arena finds the first superblock that fits.

/// A 16-ary max-tree over a local arena's slots: finds the lowest window whose value reaches a bound in
/// a few steps, each comparing 16 children at once (no branch per level to mispredict).
#[derive(Debug, Default)]
pub(super) struct MaxTree {
    /// `levels[0]` holds the leaves; each level above holds the maxima of groups of 16 entries
    /// below (padded with zeros to a multiple of 16); the top level has 16 entries.
    levels: Vec<Vec<u32>>,
}

const FAN: usize = 16;

/// `n` rounded up to a whole number of groups of 16, at least one.
fn round(n: usize) -> usize {
    n.div_ceil(FAN).max(1) * FAN
}

/// The first of 16 values that is at least `n`.
#[inline]
fn first_at_least(group: &[u32], n: u32) -> Option<usize> {
    let group: &[u32; FAN] = group.try_into().ok()?;
    let mut mask = 0u32;
    for (k, &v) in group.iter().enumerate() {
        mask |= u32::from(v >= n) << k;
    }
    (mask != 0).then(|| mask.trailing_zeros() as usize)
}

impl MaxTree {
    pub(super) fn leaves(&self) -> usize {
        self.levels.first().map_or(0, Vec::len)
    }

    /// Makes room for leaf `leaf` (new leaves are 0), doubling so that growing is amortized O(1).
    pub(super) fn ensure(&mut self, leaf: usize) {
        if leaf < self.leaves() {
            return;
        }
        let mut leaves = vec![0; round((leaf + 1).max(2 * self.leaves()))];
        if let Some(old) = self.levels.first() {
            leaves[..old.len()].copy_from_slice(old);
        }
        self.build(leaves);
    }

    /// Drops the leaves from `len` on (the caller has set them to 0) when they are most of the
    /// tree, keeping room for twice `len`: the tree stays proportional to what it indexes now,
    /// not to its peak.
    pub(super) fn shrink(&mut self, len: usize) {
        if self.leaves() <= FAN || len * 4 > self.leaves() {
            return;
        }
        let keep = round(2 * len);
        let leaves = self.levels.first().map(|l| l[..keep].to_vec());
        self.build(leaves.unwrap_or_default());
    }

    /// Host bytes of the tree.
    pub(super) fn bytes(&self) -> usize {
        self.levels.iter().map(|l| l.capacity() * 4).sum()
    }

    fn build(&mut self, leaves: Vec<u32>) {
        let mut levels = vec![leaves];
        while let Some(below) = levels.last().filter(|l| l.len() > FAN) {
            let mut above: Vec<u32> = below
                .chunks(FAN)
                .map(|g| g.iter().copied().max().unwrap_or(0))
                .collect();
            above.resize(round(above.len()), 0);
            levels.push(above);
        }
        self.levels = levels;
    }

    pub(super) fn set(&mut self, leaf: usize, v: u32) {
        let (mut i, mut new) = (leaf, v);
        let mut old = std::mem::replace(&mut self.levels[0][i], v);
        for k in 1..self.levels.len() {
            let parent = i / FAN;
            let cur = self.levels[k][parent];
            let m = if new >= cur {
                // A raise (or a tie) sets the parent without looking at the siblings.
                new
            } else if old < cur {
                // The child was not the maximum before and is less now: nothing changes above.
                return;
            } else {
                let below = &self.levels[k - 1][parent * FAN..parent * FAN + FAN];
                below.iter().copied().max().unwrap_or(0)
            };
            if m == cur {
                return;
            }
            self.levels[k][parent] = m;
            (i, old, new) = (parent, cur, m);
        }
    }

    pub(super) fn first_at_least(&self, n: u32) -> Option<usize> {
        let mut levels = self.levels.iter().rev();
        let mut i = first_at_least(levels.next()?, n)?;
        for level in levels {
            i = i * FAN + first_at_least(&level[i * FAN..i * FAN + FAN], n)?;
        }
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The max-tree finds what a scan of its leaves finds, as it grows and changes.
        #[test]
        fn max_tree_finds_the_first_leaf_reaching_a_bound(
            ops in prop::collection::vec((0usize..700, 0u32..50, 0u32..60, 0u8..8), 1..200)
        ) {
            let mut tree = MaxTree::default();
            let mut model: Vec<u32> = Vec::new();
            for (leaf, value, bound, shrink) in ops {
                if shrink == 0 {
                    // Leaves from `len` on are 0 (the caller's promise), then the tree shrinks.
                    let len = leaf / 8;
                    for (i, v) in model.iter_mut().enumerate().skip(len) {
                        if *v != 0 {
                            tree.set(i, 0);
                            *v = 0;
                        }
                    }
                    let before = tree.leaves();
                    tree.shrink(len);
                    if before > FAN && len * 4 <= before {
                        prop_assert_eq!(tree.leaves(), round(2 * len));
                    } else {
                        prop_assert_eq!(tree.leaves(), before);
                    }
                    prop_assert_eq!(tree.first_at_least(1), model.iter().position(|&v| v >= 1));
                }
                tree.ensure(leaf);
                if model.len() <= leaf {
                    model.resize(leaf + 1, 0);
                }
                tree.set(leaf, value);
                model[leaf] = value;
                let want = model.iter().position(|&v| v >= bound);
                prop_assert_eq!(tree.first_at_least(bound), want);
            }
        }
    }
}
