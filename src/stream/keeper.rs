//! [`StreamKeeper`], the streams a resource holds, each in a slot ([`Held`]) until its last
//! release, found by id.

use cudarc::driver::CudaStream;
use std::collections::HashMap;
use std::sync::Arc;

use super::{Kind, StreamId, StreamRef};

/// A stream kept alive by a [`StreamKeeper`]: a slot number (`Copy`, four bytes), so that
/// suballocators store it in their free lists and chunk tables at no cost; its keeper turns it
/// back into the stream ([`StreamKeeper::get`]). Slot 0 is the default stream in every keeper.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Held(u32);

impl Held {
    /// The default stream, slot 0 of every keeper.
    pub(crate) const DEFAULT: Held = Held(0);

    /// The slot number: below the most streams its keeper held at once, for tables indexed by
    /// stream.
    #[inline]
    pub(crate) fn slot(self) -> usize {
        self.0 as usize
    }

    /// The `Held` at keeper slot `slot`, for tables that store slot numbers (a bit per slot): it
    /// names whatever the keeper holds there now (the default stream for a free slot).
    #[inline]
    pub(crate) fn at(slot: u32) -> Held {
        Held(slot)
    }
}

/// A map keyed by stream identity.
pub(crate) type IdMap<V> = HashMap<StreamId, V, crate::hash::FastHash>;

/// Up to this many slots, [`StreamKeeper::find`] compares ids instead of hashing one.
const SCAN_SLOTS: usize = 8;

/// The streams a suballocator keeps: every cudarc stream it stores a [`Held`] of, with its
/// identity, counted. Each [`hold`](StreamKeeper::hold) counts one more reference to the slot and
/// each [`release`](StreamKeeper::release) one fewer; a slot whose count reaches zero drops its
/// stream (the `Arc`) and is reused for the next new stream, so the keeper holds as many slots as
/// streams were named at once, not as many as were ever named.
///
/// A suballocator holds a stream for as long as anything it stores (a free list, a chunk) names
/// it, and releases it only then: the streams that blocks were freed on stay alive while those
/// blocks may still be handed out, so that reusing such a block can still be ordered after that
/// stream's work, and no new stream can be given the handle value of one that a free list is
/// keyed by. A suballocator that never releases (the arena) keeps every stream until it is dropped.
/// The default stream (slot 0) is never released.
pub(crate) struct StreamKeeper {
    /// Slot `i` is `Held(i)`.
    slots: Vec<Slot>,
    by_id: IdMap<u32>,
    /// Slots whose count reached zero, for reuse.
    free: Vec<u32>,
}

struct Slot {
    /// The stream; it borrows `arc` where it has one. Reset to the default stream before `arc`
    /// is dropped.
    stream: StreamRef<'static>,
    id: StreamId,
    /// Holds and releases not yet matched; 0 for a free slot. Saturates (a slot that reaches
    /// `usize::MAX` is never freed: it keeps a stream alive, which is always sound).
    count: usize,
    // The Box is the point: the slot's StreamRef borrows the `Arc` itself, which must not move
    // when `slots` grows.
    #[allow(clippy::redundant_allocation)]
    arc: Option<Box<Arc<CudaStream>>>,
}

impl Default for StreamKeeper {
    fn default() -> Self {
        StreamKeeper {
            slots: vec![Slot {
                stream: StreamRef::DEFAULT,
                id: StreamId::DEFAULT,
                count: usize::MAX,
                arc: None,
            }],
            by_id: IdMap::from_iter([(StreamId::DEFAULT, 0)]),
            free: Vec::new(),
        }
    }
}

impl StreamKeeper {
    /// A `Held` of `stream`, keeping the stream alive until as many
    /// [`release`](Self::release)s of it as `hold`s (or until `self` is dropped). Every hold of
    /// one stream gives the same `Held` while the stream is held.
    pub(crate) fn hold(&mut self, stream: StreamRef<'_>) -> Held {
        let id = stream.id();
        if let Some(&slot) = self.by_id.get(&id) {
            if let Some(s) = self.slots.get_mut(slot as usize) {
                s.count = s.count.saturating_add(1);
            }
            return Held(slot);
        }
        let mut arc = None;
        let mut keep = |s: &Arc<CudaStream>| -> &'static Arc<CudaStream> {
            let boxed: &Arc<CudaStream> = arc.insert(Box::new(s.clone()));
            let ptr: *const Arc<CudaStream> = boxed;
            // SAFETY: the box goes into this slot's `arc` below and is dropped only when the
            // slot is freed (`release`, after the slot's `stream` is reset) or the keeper is
            // dropped; a Box's contents do not move when `slots` grows. A slot's StreamRef is
            // used only while its stream is held (the keeper's contract above), so the reference
            // is valid at every use.
            unsafe { &*ptr }
        };
        let kept = StreamRef(match stream.0 {
            Kind::Default => Kind::Default,
            Kind::Stream(s) => Kind::Stream(keep(s)),
            Kind::ContextDefault(s) => Kind::ContextDefault(keep(s)),
            Kind::PerThread(s, t) => Kind::PerThread(s.map(keep), t),
            Kind::Raw(s) => Kind::Raw(s),
            Kind::Simulated(n) => Kind::Simulated(n),
        });
        let new = Slot {
            stream: kept,
            id,
            count: 1,
            arc,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = new;
                slot
            }
            None => {
                // Each slot holds a live stream's identity, and fewer than 2^32 streams can be
                // alive at once in one process (each one a driver object); saturating keeps this
                // panic-free regardless.
                let slot = u32::try_from(self.slots.len()).unwrap_or(u32::MAX);
                self.slots.push(new);
                slot
            }
        };
        self.by_id.insert(id, slot);
        Held(slot)
    }

    /// Holds `held` once more (as [`hold`](Self::hold) of its stream would): for a copy of a
    /// `Held` that will be released on its own. Retaining the default stream, or a slot that is
    /// not held, does nothing.
    pub(crate) fn retain(&mut self, held: Held) {
        if let Some(slot) = self.slots.get_mut(held.0 as usize) {
            if slot.count > 0 {
                slot.count = slot.count.saturating_add(1);
            }
        }
    }

    /// Undoes one [`hold`](Self::hold) of `held`: at the last one the slot drops its stream and
    /// is free for reuse. After that `held` names nothing and must not be used again. Releasing
    /// the default stream, or a slot that is not held, does nothing.
    pub(crate) fn release(&mut self, held: Held) {
        if held == Held::DEFAULT {
            return;
        }
        let Some(slot) = self.slots.get_mut(held.0 as usize) else {
            return;
        };
        match slot.count {
            0 | usize::MAX => {}
            1 => {
                self.by_id.remove(&slot.id);
                // The StreamRef borrows `arc`: forget it before the Arc goes.
                slot.stream = StreamRef::DEFAULT;
                slot.id = StreamId::DEFAULT;
                slot.count = 0;
                slot.arc = None;
                self.free.push(held.0);
            }
            _ => slot.count -= 1,
        }
    }

    /// The `Held` of `stream` if it is held, without holding it again.
    #[inline]
    pub(crate) fn find(&self, stream: StreamRef<'_>) -> Option<Held> {
        if matches!(stream.0, Kind::Default) {
            // Slot 0, never released: no lookup on the most common stream.
            return Some(Held::DEFAULT);
        }
        let id = stream.id();
        if self.slots.len() <= SCAN_SLOTS {
            // A few streams (the usual case): comparing them costs less than hashing the id. A
            // held slot's `id` is its stream's, a free slot's count is 0 (`release`), and held
            // ids are distinct (`hold` reuses a held one's slot), so this finds what `by_id` does.
            return (self.slots.iter().enumerate())
                .find(|(_, s)| s.count > 0 && s.id == id)
                .map(|(i, _)| Held(i as u32));
        }
        self.by_id.get(&id).map(|&slot| Held(slot))
    }

    /// The stream `held` names, valid while `held` is held and `self` lives (the default stream
    /// for a `Held` that names nothing).
    #[inline]
    pub(crate) fn get(&self, held: Held) -> StreamRef<'static> {
        self.slots
            .get(held.0 as usize)
            .map_or(StreamRef::DEFAULT, |s| s.stream)
    }

    /// The identity of the stream `held` names.
    #[inline]
    pub(crate) fn id(&self, held: Held) -> StreamId {
        self.slots
            .get(held.0 as usize)
            .map_or(StreamId::DEFAULT, |s| s.id)
    }

    /// True when `held` names `stream`.
    #[inline]
    pub(crate) fn is(&self, held: Held, stream: StreamRef<'_>) -> bool {
        self.id(held) == stream.id()
    }

    /// Every stream held now, the default stream included.
    pub(crate) fn each(&self) -> impl Iterator<Item = StreamRef<'static>> + '_ {
        self.slots.iter().filter(|s| s.count > 0).map(|s| s.stream)
    }

    /// Streams held now (the default stream included), for the bounds the tests check.
    pub(crate) fn held(&self) -> usize {
        self.by_id.len()
    }

    /// Slots, held or free: the most streams held at once.
    #[cfg(test)]
    fn slots(&self) -> usize {
        self.slots.len()
    }
}

impl std::fmt::Debug for StreamKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamKeeper({} streams)", self.by_id.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keeper_holds_what_it_is_given() {
        let mut keeper = StreamKeeper::default();
        let held = keeper.hold(StreamRef::simulated(7));
        assert!(keeper.is(held, StreamRef::simulated(7)));
        assert!(!keeper.is(held, StreamRef::DEFAULT));
        assert_eq!(keeper.get(held), StreamRef::simulated(7));
        assert_eq!(keeper.hold(StreamRef::simulated(7)), held);
        assert_eq!(keeper.hold(StreamRef::DEFAULT), Held::DEFAULT);
        assert_eq!(keeper.id(Held::DEFAULT), StreamId::DEFAULT);
    }

    #[test]
    fn a_keeper_finds_by_scan_what_its_map_holds_with_few_slots_or_many() {
        let mut keeper = StreamKeeper::default();
        let mut held = Vec::new();
        let check = |keeper: &StreamKeeper| {
            for n in 0..40 {
                let s = StreamRef::simulated(n);
                let by_map = keeper.by_id.get(&s.id()).map(|&slot| Held(slot));
                assert_eq!(
                    keeper.find(s),
                    by_map,
                    "stream {n}, {} slots",
                    keeper.slots.len()
                );
            }
            // A raw null handle has the default stream's identity: slot 0 either way.
            // SAFETY: the handle is only compared, never given to a driver.
            let null = unsafe { StreamRef::from_raw(std::ptr::null_mut()) };
            let by_map = keeper.by_id.get(&null.id()).map(|&slot| Held(slot));
            assert_eq!(keeper.find(null), by_map);
        };
        // Slots grow past SCAN_SLOTS, with releases that leave free slots between held ones.
        for n in 1..20 {
            held.push(keeper.hold(StreamRef::simulated(n)));
            if n % 3 == 0 {
                keeper.release(held[n as usize / 2]);
            }
            check(&keeper);
        }
        for h in held {
            keeper.release(h);
            check(&keeper);
        }
    }

    #[test]
    fn a_keeper_frees_a_slot_at_its_last_release_and_reuses_it() {
        let mut keeper = StreamKeeper::default();
        let a = keeper.hold(StreamRef::simulated(1));
        assert_eq!(keeper.hold(StreamRef::simulated(1)), a);
        keeper.release(a);
        // Still held once: still there.
        assert!(keeper.is(a, StreamRef::simulated(1)));
        assert_eq!(keeper.held(), 2);
        keeper.release(a);
        assert!(!keeper.is(a, StreamRef::simulated(1)));
        assert_eq!(keeper.held(), 1);
        // A retained copy is one more hold, released on its own.
        let r = keeper.hold(StreamRef::simulated(9));
        keeper.retain(r);
        keeper.release(r);
        assert!(keeper.is(r, StreamRef::simulated(9)));
        keeper.release(r);
        assert!(!keeper.is(r, StreamRef::simulated(9)));
        // Extra releases and the default stream's are ignored.
        keeper.release(a);
        keeper.release(Held::DEFAULT);
        assert!(keeper.is(Held::DEFAULT, StreamRef::DEFAULT));
        // 10,000 streams held one after another take one slot between them.
        for n in 2..10_002 {
            let h = keeper.hold(StreamRef::simulated(n));
            assert_eq!(keeper.get(h), StreamRef::simulated(n));
            keeper.release(h);
        }
        assert_eq!((keeper.held(), keeper.slots()), (1, 2));
        // A reused slot names its new stream only.
        let b = keeper.hold(StreamRef::simulated(5));
        let c = keeper.hold(StreamRef::simulated(6));
        assert!(keeper.is(b, StreamRef::simulated(5)) && keeper.is(c, StreamRef::simulated(6)));
        assert_eq!(keeper.slots(), 3);
    }
}
