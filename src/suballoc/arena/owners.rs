//! `Owners`: which local arena holds the superblock at an address, for deallocation.

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Shards of the map: neighbouring superblocks fall in different shards, so that threads freeing
/// in their own superblocks rarely share a lock.
const SHARDS: usize = 64;

/// The local arena holding a superblock, and the superblock's slot in that arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) arena: u32,
    pub(super) slot: u32,
}

/// A map from superblock (its address divided by the superblock size) to its owner, with one
/// entry per superblock that a local arena holds: its size follows the superblocks in use, not
/// the arena's capacity.
#[derive(Debug)]
pub(super) struct Owners {
    shards: Box<[Shard]>,
}

type Map = HashMap<usize, Owner, crate::hash::FastHash>;

#[repr(align(64))] // each shard's lock on its own cache line
#[derive(Debug, Default)]
struct Shard(RwLock<Map>);

impl Default for Owners {
    fn default() -> Self {
        Owners {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl Owners {
    fn shard(&self, window: usize) -> &RwLock<Map> {
        &self.shards[window % SHARDS].0
    }

    fn read(&self, window: usize) -> RwLockReadGuard<'_, Map> {
        // Every update under these locks is one map operation: a poisoned lock still guards a
        // consistent map.
        self.shard(window).read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self, window: usize) -> RwLockWriteGuard<'_, Map> {
        self.shard(window)
            .write()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The owner of superblock `window`, if a local arena holds it.
    pub(super) fn get(&self, window: usize) -> Option<Owner> {
        self.read(window).get(&window).copied()
    }

    pub(super) fn set(&self, window: usize, owner: Owner) {
        self.write(window).insert(window, owner);
    }

    /// Forgets superblock `window`; a shard that emptied to a quarter of its room shrinks, so
    /// that the map stays proportional to the superblocks held now, not at the peak.
    pub(super) fn remove(&self, window: usize) {
        let mut map = self.write(window);
        map.remove(&window);
        if map.capacity() > 16 && map.len() * 4 < map.capacity() {
            let len = map.len();
            map.shrink_to(len * 2);
        }
    }

    /// Host bytes of the map (an estimate of its tables: entries, control bytes, shards).
    pub(super) fn bytes(&self) -> usize {
        let entry = std::mem::size_of::<(usize, Owner)>() + 1;
        self.shards.len() * std::mem::size_of::<Shard>()
            + self
                .shards
                .iter()
                .map(|s| s.0.read().map_or(0, |m| m.capacity()) * entry)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_map_sets_gets_removes_and_shrinks() {
        let owners = Owners::default();
        let empty = owners.bytes();
        for w in 0..10_000usize {
            owners.set(
                w << 20,
                Owner {
                    arena: w as u32,
                    slot: 1,
                },
            );
        }
        assert_eq!(owners.get(5 << 20), Some(Owner { arena: 5, slot: 1 }));
        assert_eq!(owners.get(5), None);
        let full = owners.bytes();
        assert!(
            full > empty + 10_000 * 16,
            "{full} bytes for 10,000 entries"
        );
        for w in 0..10_000usize {
            owners.remove(w << 20);
        }
        assert_eq!(owners.get(5 << 20), None);
        // Emptied shards gave their room back.
        assert!(
            owners.bytes() < empty + SHARDS * 64 * 17,
            "{}",
            owners.bytes()
        );
    }
}
