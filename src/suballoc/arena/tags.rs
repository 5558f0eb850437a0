//! `Tags`: the streams whose work may still use a free range of the global arena.

use crate::stream::Held;

/// Streams a free range of the global arena remembers before synchronizing them.
const TAGS: usize = 4;

/// Streams whose work may still use a free range. A merged range keeps the union; past
/// [`TAGS`] streams, they are synchronized and forgotten.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tags {
    n: u8,
    s: [Held; TAGS],
}

impl Tags {
    pub(super) const NONE: Tags = Tags {
        n: 0,
        s: [Held::DEFAULT; TAGS],
    };

    pub(super) fn one(stream: Held) -> Self {
        let mut s = [Held::DEFAULT; TAGS];
        s[0] = stream;
        Tags { n: 1, s }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = Held> + '_ {
        self.s[..usize::from(self.n)].iter().copied()
    }

    /// Adds `other`'s streams. Each stream in a `Tags` stands for one hold in the arena's
    /// keeper; every hold of both ends up exactly once in `self`, in `dup` (a stream `self`
    /// already names: release it) or in `sync` (when they do not fit, every stream of both is
    /// forgotten: synchronize, then release).
    pub(super) fn absorb(&mut self, other: &Tags, sync: &mut Vec<Held>, dup: &mut Vec<Held>) {
        let theirs = &other.s[..usize::from(other.n)];
        for (i, &s) in theirs.iter().enumerate() {
            if self.iter().any(|t| t == s) {
                dup.push(s);
            } else if usize::from(self.n) < TAGS {
                self.s[usize::from(self.n)] = s;
                self.n += 1;
            } else {
                sync.extend(self.iter());
                sync.extend_from_slice(&theirs[i..]);
                self.n = 0;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{StreamKeeper, StreamRef};

    /// Every hold of both sides lands once in the merged tags, `dup` or `sync`.
    #[test]
    fn absorbing_accounts_for_every_hold_once() {
        let mut keeper = StreamKeeper::default();
        let h: Vec<Held> = (1..=8)
            .map(|n| keeper.hold(StreamRef::simulated(n)))
            .collect();
        let tags = |hs: &[Held]| {
            let mut t = Tags::NONE;
            for &x in hs {
                t.s[usize::from(t.n)] = x;
                t.n += 1;
            }
            t
        };
        for (a, b) in [
            (&h[..2], &h[1..3]),
            (&h[..3], &h[3..5]),
            (&h[..4], &h[0..4]),
            (&h[..4], &h[2..6]),
            (&h[..0], &h[..4]),
        ] {
            let (mut x, y) = (tags(a), tags(b));
            let (mut sync, mut dup) = (Vec::new(), Vec::new());
            x.absorb(&y, &mut sync, &mut dup);
            let mut all: Vec<Held> = x.iter().chain(sync).chain(dup).collect();
            let mut want: Vec<Held> = a.iter().chain(b).copied().collect();
            all.sort();
            want.sort();
            assert_eq!(all, want, "{a:?} + {b:?}");
        }
    }
}
