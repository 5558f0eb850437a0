//! The index's tests: class bounds, splits and merges, and blocks across streams.

use super::classes::{class_at_least, class_of};
use super::*;
use crate::resource::AllocError;
use crate::stream::StreamRef;

#[test]
fn classes_bound_their_blocks() {
    for units in 1..5000usize {
        let size = units * GRANULE;
        let (f, s) = class_of(size);
        let (g, t) = class_at_least(size).unwrap();
        assert!((g, t) >= (f, s), "{size}");
        // Every block listed at (g, t) is at least `size`: the class's lowest size is.
        let lowest = (1..=units * 2)
            .map(|u| u * GRANULE)
            .find(|&b| class_of(b) == (g, t))
            .unwrap();
        assert!(
            lowest >= size,
            "{size}: class ({g}, {t}) starts at {lowest}"
        );
    }
    assert_eq!(class_at_least(usize::MAX & !(GRANULE - 1)), None);
}

#[test]
fn splits_merge_back_into_one_block() {
    let mut ix = TlsfIndex::default();
    let s = StreamRef::DEFAULT;
    assert!(ix.add_chunk(1 << 20, 1 << 20, s));
    let a = ix.take(s, 256, 256).unwrap();
    let b = ix.take(s, 1024, 4096).unwrap();
    let c = ix.take(s, 512, 256).unwrap();
    assert_eq!(b % 4096, 0);
    assert!(a + 256 <= b || b + 1024 <= a);
    assert_eq!(ix.allocated, 256 + 1024 + 512);
    for p in [b, a, c] {
        ix.free(p, s).unwrap();
    }
    assert_eq!(ix.free_blocks(), 1);
    assert_eq!(ix.free_chunk_streams(1 << 20), Some(vec![Held::DEFAULT]));
    assert!(
        ix.free(a, s).is_none(),
        "a second free of one block is refused"
    );
}

#[test]
fn an_address_ordered_index_takes_the_lowest_block_of_a_larger_class() {
    let s = StreamRef::DEFAULT;
    // Two free 64 KiB holes between live blocks, the higher freed last (the list's head),
    // then a 16 KiB request: a class of its own has nothing, so it takes from theirs.
    let holes = |mut ix: TlsfIndex| {
        assert!(ix.add_chunk(1 << 20, 256 << 10, s));
        let b: Vec<usize> = [64 << 10, 4096, 64 << 10, 4096]
            .iter()
            .map(|&n| ix.take(s, n, 256).unwrap())
            .collect();
        ix.free(b[0], s).unwrap();
        ix.free(b[2], s).unwrap();
        (ix.take(s, 16 << 10, 256).unwrap(), b)
    };
    let (low, b) = holes(TlsfIndex::address_ordered());
    assert_eq!(low, b[0], "the lower hole");
    let (head, b) = holes(TlsfIndex::default());
    assert_eq!(head, b[2], "the list's head");
}

#[test]
fn blocks_of_two_streams_do_not_merge() {
    let mut ix = TlsfIndex::default();
    let (s, t) = (StreamRef::DEFAULT, StreamRef::simulated(1));
    assert!(ix.add_chunk(1 << 20, 4096, s));
    let a = ix.take(s, 1024, 256).unwrap();
    let b = ix.take(s, 1024, 256).unwrap();
    ix.free(a, t).unwrap();
    ix.free(b, s).unwrap();
    assert_eq!(ix.free_blocks(), 2);
    assert_eq!(ix.lists(), 2);
    assert!(ix.take(t, 2048, 256).is_none(), "t's block is 1 KiB");
    let other = ix.other_with_fit(t, 2048).unwrap();
    ix.merge(other, t);
    assert_eq!((ix.free_blocks(), ix.lists()), (1, 1), "all on t, merged");
    assert_eq!(ix.take(t, 4096, 256), Some(1 << 20));
}

#[test]
fn neighbours_freed_on_several_streams_serve_a_request_none_fits_alone() {
    let mut ix = TlsfIndex::default();
    let (s, t, u) = (
        StreamRef::DEFAULT,
        StreamRef::simulated(1),
        StreamRef::simulated(2),
    );
    assert!(ix.add_chunk(1 << 20, 5120, s));
    let b: Vec<usize> = (0..5).map(|_| ix.take(s, 1024, 256).unwrap()).collect();
    // Free on t, u, t, then the last two stay: [t][u][t][live][live].
    for (&addr, stream) in b.iter().zip([t, u, t]) {
        ix.free(addr, stream).unwrap();
    }
    let ordered = std::cell::RefCell::new(Vec::new());
    let wait = |after: StreamRef<'static>| {
        ordered.borrow_mut().push(after.id());
        Ok(())
    };
    // 4 KiB: no run of free neighbours holds it; nothing is ordered, nothing moves.
    assert_eq!(ix.take_or_steal(s, 4096, 256, &wait).unwrap(), None);
    assert!(
        ordered.borrow().is_empty(),
        "no wait for a run that cannot help"
    );
    assert_eq!((ix.free_blocks(), ix.lists()), (3, 2));
    // 3 KiB: the three neighbours, ordered after t and u once each, merged on s.
    assert_eq!(
        ix.take_or_steal(s, 3072, 256, &wait).unwrap(),
        Some(1 << 20)
    );
    let ordered = ordered.into_inner();
    assert_eq!(ordered.len(), 2);
    assert!(ordered.contains(&t.id()) && ordered.contains(&u.id()));
    assert_eq!((ix.free_blocks(), ix.lists()), (0, 0));
    // A wait that fails: the caller grows, and the index is as it was.
    ix.free(1 << 20, t).unwrap();
    ix.free(b[3], u).unwrap();
    let refuse = |_: StreamRef<'static>| Err(AllocError::out_of_memory(0, 256, "test"));
    assert_eq!(ix.take_or_steal(s, 4096, 256, refuse).unwrap(), None);
    assert_eq!((ix.free_blocks(), ix.lists()), (2, 2));
    // A run with blocks of the asking stream in it: [t][s][t] merge into one block on s.
    let mut ix = TlsfIndex::default();
    assert!(ix.add_chunk(1 << 20, 4096, s));
    let b: Vec<usize> = (0..4).map(|_| ix.take(s, 1024, 256).unwrap()).collect();
    for (&addr, stream) in b.iter().zip([t, s, t]) {
        ix.free(addr, stream).unwrap();
    }
    assert_eq!(
        ix.take_or_steal(s, 3072, 256, |_| Ok(())).unwrap(),
        Some(1 << 20)
    );
    ix.free(1 << 20, s).unwrap();
    ix.free(b[3], s).unwrap();
    assert_eq!(
        (ix.free_blocks(), ix.lists()),
        (1, 1),
        "the chunk whole again"
    );
    assert_eq!(ix.take(s, 4096, 256), Some(1 << 20));
}

#[test]
fn grows_in_place_into_its_free_neighbour() {
    let mut ix = TlsfIndex::default();
    let s = StreamRef::DEFAULT;
    assert!(ix.add_chunk(1 << 20, 8192, s));
    let a = ix.take(s, 1024, 256).unwrap();
    assert!(ix.grow_in_place(a, 4096, s));
    assert_eq!(ix.live_size(a), Some(4096));
    let b = ix.take(s, 4096, 256).unwrap();
    assert_eq!(b, a + 4096);
    assert!(!ix.grow_in_place(a, 8192, s), "its neighbour is allocated");
    ix.free(b, s).unwrap();
    assert!(
        ix.grow_in_place(a, 8192, s),
        "exactly the rest of the chunk"
    );
    ix.free(a, s).unwrap();
    assert_eq!(ix.free_chunk_streams(1 << 20), Some(vec![Held::DEFAULT]));
    assert_eq!(ix.allocated, 0);
}
