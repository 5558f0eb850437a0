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

    /// Adds `other`'s streams; when they do not fit, pushes every stream of both onto `sync`
    /// and forgets them all (the caller synchronizes them before the range can be taken).
    pub(super) fn absorb(&mut self, other: &Tags, sync: &mut Vec<Held>) {
        for s in other.iter() {
            if self.iter().any(|t| t == s) {
                continue;
            }
            if usize::from(self.n) < TAGS {
                self.s[usize::from(self.n)] = s;
                self.n += 1;
            } else {
                sync.extend(self.iter());
                sync.extend(other.iter());
                self.n = 0;
                return;
            }
        }
    }
}
