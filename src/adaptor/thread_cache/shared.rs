//! What the threads share: each thread slot's cache of blocks (`Cache`), the per-class lists of
//! blocks threads gave up (`Central`), and the budget over them (`Shared`), which an exiting
//! thread's hook flushes into.

use crate::shard;
use crate::stream::{StreamHandle, StreamRef};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::classes::{class_of, class_size};
use super::STREAMS_PER_CLASS;

/// One thread's free blocks, all freed on `stream`, by size class.
#[derive(Debug, Default)]
pub(super) struct Cache {
    /// The token of the thread whose exit hands this slot's blocks on ([`shard::token`]).
    pub(super) hooked: u64,
    /// Keeps the stream alive while blocks freed on it wait here.
    pub(super) stream: Option<StreamHandle>,
    /// Bytes in `classes` (class sizes, not request sizes).
    pub(super) held: usize,
    /// Bytes of the shared budget this cache has reserved: at least `held`.
    pub(super) quota: usize,
    /// By class index, oldest first (grown to the largest class used).
    pub(super) classes: Vec<Vec<usize>>,
}

impl Cache {
    pub(super) fn holds(&self, stream: StreamRef) -> bool {
        self.stream.as_ref().is_some_and(|s| s.id() == stream.id())
    }

    /// Takes every block out, with its class size, and lets the stream go (the quota stays).
    pub(super) fn take_all(&mut self, out: &mut Vec<(usize, usize)>) -> Option<StreamHandle> {
        for (i, blocks) in self.classes.iter_mut().enumerate() {
            let size = class_size(i);
            out.extend(blocks.drain(..).map(|a| (a, size)));
        }
        self.held = 0;
        self.stream.take()
    }

    /// Takes the older half of every class (at least one block of each non-empty class) out,
    /// with its class size: at least half of what the cache holds.
    fn take_older_half(&mut self, out: &mut Vec<(usize, usize)>) {
        for (i, blocks) in self.classes.iter_mut().enumerate() {
            if blocks.is_empty() {
                continue;
            }
            let size = class_size(i);
            let n = blocks.len().div_ceil(2);
            self.held -= n * size;
            out.extend(blocks.drain(..n).map(|a| (a, size)));
        }
    }
}

/// The blocks of one size class that threads gave up, per stream they were freed on: where a
/// thread's miss looks before the upstream.
#[derive(Debug, Default)]
pub(super) struct Central {
    /// Each stream's blocks, newest last; a stream with none is dropped (and let go).
    pub(super) lists: Vec<(StreamHandle, Vec<usize>)>,
}

impl Central {
    pub(super) fn pop(&mut self, stream: StreamRef) -> Option<usize> {
        let at = self.lists.iter().position(|(s, _)| s.id() == stream.id())?;
        let addr = self.lists[at].1.pop();
        if self.lists[at].1.is_empty() {
            // `remove`, not `swap_remove`: the lists stay oldest first, for `push`.
            self.lists.remove(at);
        }
        addr
    }

    /// Adds `blocks` to `stream`'s list; a list of a new stream beyond [`STREAMS_PER_CLASS`]
    /// pushes the oldest stream's list out, which the caller gives back to the upstream.
    fn push(
        &mut self,
        stream: StreamRef,
        blocks: impl Iterator<Item = usize>,
    ) -> Vec<(StreamHandle, Vec<usize>)> {
        match self.lists.iter_mut().find(|(s, _)| s.id() == stream.id()) {
            Some((_, list)) => {
                list.extend(blocks);
                Vec::new()
            }
            None => {
                self.lists.push((stream.to_handle(), blocks.collect()));
                let over = self.lists.len().saturating_sub(STREAMS_PER_CLASS);
                self.lists.drain(..over).collect()
            }
        }
    }

    pub(super) fn bytes(&self, class: usize) -> usize {
        self.lists.iter().map(|(_, l)| l.len() * class).sum()
    }
}

/// A stream's list of blocks of one class leaving the shared lists for the upstream: the
/// stream they were freed on, the class size, the addresses. Their bytes are still reserved.
pub(super) type Evicted = (StreamHandle, usize, Vec<usize>);

/// The caches, the shared lists and the budget.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) bytes: usize,
    /// Bytes of `bytes` that no cache and no list holds reserved: the caches' quotas, the lists'
    /// blocks and this sum to `bytes`.
    pub(super) unreserved: AtomicUsize,
    /// What a cache reserves at a time, at least.
    pub(super) piece: usize,
    /// Set when a cache found the budget full: caches then keep no room beyond what they hold,
    /// until half the budget is free again.
    pub(super) tight: AtomicBool,
    /// One per thread slot ([`shard::SLOTS`]), and the shared one.
    pub(super) caches: Box<[shard::SlotLock<Cache>]>,
    /// One per size class up to `max_block`'s, each under its own lock.
    pub(super) central: Box<[Mutex<Central>]>,
    /// Lists an exit hook pushed out of `central` (their bytes still reserved), for the next call
    /// to give back; `has_orphans` says there are some.
    pub(super) orphans: Mutex<Vec<Evicted>>,
    pub(super) has_orphans: AtomicBool,
}

pub(super) fn lock(central: &Mutex<Central>) -> MutexGuard<'_, Central> {
    // Central's updates are whole vector operations that complete before the lock is released
    // (nothing inside calls out), so a poisoned one holds consistent lists.
    central.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Takes `n` bytes of the budget, if that many are left.
    fn take(&self, n: usize) -> bool {
        self.unreserved
            .fetch_update(Relaxed, Relaxed, |left| left.checked_sub(n))
            .is_ok()
    }

    /// [`take`](Self::take), and on a refusal the caches turn tight: the first refusal also
    /// takes back the unused room of every cache whose thread is not in a call (an idle thread
    /// makes no call that would give it back), and tries once more. The caller's own cache, if
    /// it holds it, is locked, so `try_lock` passes it by and nothing waits.
    pub(super) fn reserve(&self, n: usize) -> bool {
        if self.take(n) {
            return true;
        }
        if self.tight.swap(true, Relaxed) {
            return false;
        }
        for cache in self.caches.iter() {
            if let Some(mut c) = cache.try_lock() {
                let room = c.quota - c.held;
                c.quota -= room;
                self.release_quiet(room);
            }
        }
        self.take(n)
    }

    /// Gives `n` reserved bytes back without touching `tight`.
    fn release_quiet(&self, n: usize) {
        self.unreserved.fetch_add(n, Relaxed);
    }

    /// Gives `n` reserved bytes back to the budget.
    pub(super) fn release(&self, n: usize) {
        let left = self.unreserved.fetch_add(n, Relaxed) + n;
        if left >= self.bytes / 2 && self.tight.load(Relaxed) {
            self.tight.store(false, Relaxed);
        }
    }

    /// Makes `cache`'s quota cover what it holds: from the budget (a piece at a time, or just
    /// what is needed once the caches are tight), or, where the budget has no room, by taking
    /// the older half of its classes out into `out` (their bytes then reserved by no one) until
    /// it does. Gives back what it reserved beyond two pieces of room (beyond none when tight),
    /// so that an idle thread keeps little of the budget from the others.
    pub(super) fn fit(&self, cache: &mut Cache, out: &mut Vec<(usize, usize)>) {
        let piece = if self.tight.load(Relaxed) {
            0
        } else {
            self.piece
        };
        if cache.held > cache.quota {
            let need = cache.held - cache.quota;
            let want = need.max(piece);
            if want > need && self.take(want) {
                cache.quota += want;
            } else if self.reserve(need) {
                cache.quota += need;
            } else {
                while cache.held > cache.quota {
                    cache.take_older_half(out);
                }
            }
        }
        let room = cache.quota - cache.held;
        if room > 2 * piece {
            let back = room - piece;
            cache.quota -= back;
            self.release(back);
        }
    }

    /// Puts `blocks` (address, class size; a class's blocks side by side, as [`Cache`] takes
    /// them out), whose bytes are already reserved, on their classes' shared lists for
    /// `stream`. Returns the lists that pushed out, for the upstream.
    #[must_use]
    pub(super) fn keep(&self, blocks: &[(usize, usize)], stream: StreamRef) -> Vec<Evicted> {
        let mut out = Vec::new();
        for run in blocks.chunk_by(|a, b| a.1 == b.1) {
            let class = run[0].1;
            let pushed =
                lock(&self.central[class_of(class).0]).push(stream, run.iter().map(|b| b.0));
            out.extend(pushed.into_iter().map(|(old, list)| (old, class, list)));
        }
        out
    }
}

impl shard::Flush for Shared {
    /// The slot's thread is exiting: its blocks go to the shared lists, with their reservation,
    /// and the rest of its quota back to the budget. Lists this pushes past
    /// [`STREAMS_PER_CLASS`] keep the extra streams until the next push there (no upstream is
    /// at hand here).
    fn flush(&self, slot: usize) {
        // The cache stays locked until its blocks are on the lists: an `empty` (a drop) that
        // runs meanwhile waits for it here, and finds them there (it empties the caches first).
        let mut cache = self.caches[slot].lock();
        cache.hooked = 0;
        let mut blocks = Vec::new();
        let stream = cache.take_all(&mut blocks);
        let held: usize = blocks.iter().map(|b| b.1).sum();
        self.release(std::mem::take(&mut cache.quota) - held);
        let Some(stream) = stream else { return };
        let evicted = self.keep(&blocks, stream.as_ref());
        if !evicted.is_empty() {
            // No upstream here: the next free (or `empty`) on any thread gives them back, their
            // bytes reserved until then.
            let mut orphans = self.orphans.lock().unwrap_or_else(PoisonError::into_inner);
            orphans.extend(evicted);
            self.has_orphans.store(true, Relaxed);
        }
    }
}
