//! Thread-local storage: each thread's arenas, and the registry that passes a thread's arena on.

use super::{lock, Arena};
use crate::resource::MemoryResource;
use crate::stream::{StreamId, StreamRef};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What a thread's storage shares with an arena: its id and the thread arenas that threads left.
#[derive(Debug)]
pub(super) struct Registry {
    id: u64,
    idle: Mutex<Vec<u32>>,
}

impl Registry {
    /// A registry under an id that no other arena of the process has, so that a thread's
    /// entries never mistake a new arena for a dropped one.
    pub(super) fn new() -> Self {
        Registry {
            id: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            idle: Mutex::new(Vec::new()),
        }
    }
}

/// A thread's view of one arena: its thread arena and the last stream arena it used.
struct TlsEntry {
    instance: u64,
    registry: Weak<Registry>,
    thread_arena: Option<u32>,
    last_stream: Option<(StreamId, u32)>,
}

impl TlsEntry {
    fn new(instance: u64, registry: &Arc<Registry>) -> Self {
        TlsEntry {
            instance,
            registry: Arc::downgrade(registry),
            thread_arena: None,
            last_stream: None,
        }
    }
}

impl Drop for TlsEntry {
    fn drop(&mut self) {
        // The thread is gone: a later thread adopts its arena (and whatever is still live in it).
        if let (Some(id), Some(registry)) = (self.thread_arena, self.registry.upgrade()) {
            lock(&registry.idle).push(id);
        }
    }
}

thread_local! {
    static THREAD_ARENAS: RefCell<Vec<TlsEntry>> = const { RefCell::new(Vec::new()) };
}

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(0);

impl<U: MemoryResource> Arena<U> {
    /// The local arena for `stream` as seen from this thread, created on first use; `None` when
    /// there is none to be had (thread-local storage torn down, or too many arenas).
    pub(super) fn arena_for(&self, stream: StreamRef) -> Option<u32> {
        let me = self.registry.id;
        THREAD_ARENAS
            .try_with(|cell| {
                let mut list = cell.try_borrow_mut().ok()?;
                let i = match list.iter().position(|e| e.instance == me) {
                    Some(i) => i,
                    None => {
                        // Entries of dropped arenas are dead weight: drop them as new ones come.
                        list.retain(|e| e.registry.strong_count() > 0);
                        list.insert(0, TlsEntry::new(me, &self.registry));
                        0
                    }
                };
                let entry = &mut list[i];
                if stream.is_default() {
                    if entry.thread_arena.is_none() {
                        entry.thread_arena = self.thread_arena();
                    }
                    entry.thread_arena
                } else {
                    match entry.last_stream {
                        Some((s, id)) if s == stream.id() => Some(id),
                        _ => {
                            let id = self.stream_arena(stream)?;
                            entry.last_stream = Some((stream.id(), id));
                            Some(id)
                        }
                    }
                }
            })
            .ok()
            .flatten()
    }

    fn thread_arena(&self) -> Option<u32> {
        let idle = lock(&self.registry.idle).pop();
        idle.or_else(|| self.new_arena(StreamRef::DEFAULT, false))
    }
}
