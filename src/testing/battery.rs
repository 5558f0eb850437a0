//! The battery: `conformance` runs every rule over one resource.

use crate::resource::{AllocError, AllocErrorKind, MemoryResource};
use crate::stream::StreamRef;
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};
use typenum::{Bit, Unsigned};

use super::Record;

/// How the battery writes and reads memory the CPU may not dereference (device memory, through
/// the driver). Host-accessible memory needs none: the battery writes and reads it itself.
pub trait MemoryAccess: Sync + std::fmt::Debug {
    /// Sets the `len` bytes at `ptr` to `byte`, ordered after the work on `stream`, and waits
    /// until they are written.
    ///
    /// # Safety
    ///
    /// `ptr` is a live allocation of at least `len` bytes, usable on `stream`, that nothing else
    /// uses.
    unsafe fn fill(&self, ptr: NonNull<u8>, len: usize, byte: u8, stream: StreamRef<'_>);

    /// Whether the `len` bytes at `ptr` all equal `byte`, read after the work on `stream`.
    ///
    /// # Safety
    ///
    /// As for [`fill`](Self::fill).
    unsafe fn holds(&self, ptr: NonNull<u8>, len: usize, byte: u8, stream: StreamRef<'_>) -> bool;
}

/// What the battery asks of the resource. The defaults suit a resource with room for a few MiB.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    /// The smallest non-zero request (default 1).
    pub min_size: usize,
    /// The largest request (default 64 KiB). Room for `threads × 16` of them is needed at once.
    /// A resource of one block size (`FixedSize`) takes `min_size = max_size = block`.
    pub max_size: usize,
    /// The largest alignment asked for (default 4096; a power of two).
    pub max_align: usize,
    /// Threads in the overlap check (default 4).
    pub threads: usize,
    /// Allocations and frees per thread (default 200).
    pub rounds: usize,
    /// The streams requests are made on, at random (at least one; default the default stream and
    /// simulated streams 1 and 2). The stream checks use the first two.
    pub streams: Vec<StreamRef<'a>>,
    /// The record of a [`Recorder`](super::Recorder) under the resource, for the checks of what reaches the
    /// upstream. The battery expects all of its allocations back once the resource is dropped.
    pub upstream: Option<&'a Record>,
    /// How to write and read memory that is not host-accessible; without it such memory is only
    /// checked for overlap.
    pub access: Option<&'a dyn MemoryAccess>,
    /// Seeds the random requests (default 1).
    pub seed: u64,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            min_size: 1,
            max_size: 64 << 10,
            max_align: 4096,
            threads: 4,
            rounds: 200,
            streams: vec![
                StreamRef::DEFAULT,
                StreamRef::simulated(1),
                StreamRef::simulated(2),
            ],
            upstream: None,
            access: None,
            seed: 1,
        }
    }
}

/// What the battery found, for tests that expect more of a resource than the trait does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// Non-zero allocations the resource served.
    pub allocations: usize,
    /// The alignments above `R::Alignment` it refused with [`AllocErrorKind::Unsupported`].
    pub refused_alignments: Vec<usize>,
}

/// Runs the battery over `resource`, then drops it and checks that the upstream
/// ([`Options::upstream`]) got everything back. Panics, naming the resource, at the first rule
/// broken. See the [module documentation](crate::testing) for the checks.
pub fn conformance<R: MemoryResource + Sync>(resource: R, options: &Options<'_>) -> Report {
    let name = resource.name();
    assert!(
        !options.streams.is_empty(),
        "{name}: Options::streams is empty"
    );
    assert!(
        0 < options.min_size && options.min_size <= options.max_size,
        "{name}: Options wants 0 < min_size <= max_size"
    );
    assert!(
        options.max_align.is_power_of_two(),
        "{name}: Options::max_align is not a power of two"
    );
    let battery = Battery {
        r: &resource,
        name,
        o: options,
        live: Mutex::new(BTreeMap::new()),
    };
    battery.bad_requests();
    battery.zero_size();
    let (accepted, refused_alignments) = battery.alignments();
    let allocations = accepted.len() + battery.threads(&accepted.aligns());
    battery.stream_order();
    drop(resource);
    if let Some(up) = options.upstream {
        let (in_use, live, allocated, freed) =
            (up.in_use(), up.live(), up.allocations(), up.deallocations());
        assert!(
            in_use == 0 && live == 0 && allocated == freed,
            "{name}: once dropped, the upstream still has {in_use} bytes in {live} allocations \
             ({allocated} allocated, {freed} deallocated)"
        );
        assert_eq!(
            up.bad_frees(),
            0,
            "{name}: deallocations reached the upstream with a pointer, size or alignment it did \
             not allocate"
        );
        assert_eq!(
            up.zero_size_calls(),
            0,
            "{name}: zero-size requests reached the upstream"
        );
    }
    Report {
        allocations,
        refused_alignments,
    }
}

struct Battery<'r, 'o, R> {
    r: &'r R,
    name: &'static str,
    o: &'r Options<'o>,
    /// Live ranges, `start → len`, across threads.
    live: Mutex<BTreeMap<usize, usize>>,
}

/// The allocations of the alignment check: (pointer, size, alignment).
struct Accepted(Vec<(NonNull<u8>, usize, usize)>);

impl Accepted {
    fn len(&self) -> usize {
        self.0.len()
    }
    /// The alignments served, without repeats.
    fn aligns(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.0.iter().map(|a| a.2).collect();
        v.dedup();
        v
    }
}

impl<R: MemoryResource + Sync> Battery<'_, '_, R> {
    fn base_align() -> usize {
        <R::Alignment as Unsigned>::USIZE
    }

    fn upstream_calls(&self) -> Option<(usize, usize, usize, usize)> {
        self.o.upstream.map(|u| {
            (
                u.allocations(),
                u.deallocations(),
                u.zero_size_calls(),
                u.bad_frees(),
            )
        })
    }

    fn expect_invalid(&self, size: usize, align: usize) {
        let name = self.name;
        match self.r.allocate(size, align, self.o.streams[0]) {
            Err(AllocError {
                kind: AllocErrorKind::InvalidArgument(_),
                ..
            }) => {}
            Err(e) => panic!(
                "{name}: allocate({size}, {align}) failed with {e}, not with an invalid argument"
            ),
            Ok(p) => panic!("{name}: allocate({size}, {align}) returned {p:?}, not an error"),
        }
    }

    fn bad_requests(&self) {
        let before = self.upstream_calls();
        let top = 1usize << (usize::BITS - 1);
        for align in [0, 3, 6, 24, 1000, 4097, (1 << 20) + 1, usize::MAX, top + 1] {
            for size in [0, 1, 64, 4096, usize::MAX] {
                self.expect_invalid(size, align);
            }
        }
        // An alignment of 2^63 (2^31) leaves room for no byte.
        self.expect_invalid(1, top);
        for align in [
            1,
            Self::base_align(),
            2 * Self::base_align(),
            self.o.max_align,
        ] {
            let eff = align.max(Self::base_align());
            let just_over = isize::MAX as usize - (eff - 2);
            for size in [
                usize::MAX,
                usize::MAX - 1,
                usize::MAX - eff + 1,
                isize::MAX as usize + 1,
                isize::MAX as usize,
                just_over,
            ] {
                self.expect_invalid(size, align);
            }
        }
        assert_eq!(
            self.upstream_calls(),
            before,
            "{}: a bad request reached the upstream",
            self.name
        );
    }

    fn zero_size(&self) {
        let name = self.name;
        let before = self.upstream_calls();
        let top = 1usize << (usize::BITS - 1);
        let aligns = std::iter::successors(Some(1usize), |a| a.checked_mul(2))
            .take_while(|&a| a <= self.o.max_align)
            .chain([top]);
        for align in aligns {
            for &stream in &self.o.streams {
                let p = self
                    .r
                    .allocate(0, align, stream)
                    .unwrap_or_else(|e| panic!("{name}: allocate(0, {align}) failed: {e}"));
                let want = align.max(Self::base_align());
                assert_eq!(
                    p.as_ptr() as usize % want,
                    0,
                    "{name}: allocate(0, {align}) returned {p:?}, not aligned to {want}"
                );
                // SAFETY: `p` came from `allocate` with size 0 and this alignment.
                unsafe { self.r.deallocate(p, 0, align, stream) };
            }
        }
        assert_eq!(
            self.upstream_calls(),
            before,
            "{name}: a zero-size request reached the upstream"
        );
    }

    /// Every power-of-two alignment up to `max_align`, at a few sizes, all live at once: each
    /// aligned, disjoint, and holding its pattern until freed. Returns what was served (freed
    /// since) and the alignments refused.
    fn alignments(&self) -> (Accepted, Vec<usize>) {
        let name = self.name;
        let o = self.o;
        let stream = o.streams[0];
        let clamp = |n: usize| n.clamp(o.min_size, o.max_size);
        let mut sizes = vec![o.min_size, clamp(7), clamp(256), clamp(1000), o.max_size];
        sizes.dedup();
        let mut served = Vec::new();
        let mut refused = Vec::new();
        // `checked_mul`: a `max_align` of 2^63 ends the walk instead of overflowing.
        let aligns = std::iter::successors(Some(1usize), |a| a.checked_mul(2));
        for align in aligns.take_while(|&a| a <= o.max_align) {
            for &size in &sizes {
                match self.r.allocate(size, align, stream) {
                    Ok(p) => {
                        self.take(p, size, align, stream, 0xA5);
                        served.push((p, size, align));
                    }
                    Err(AllocError {
                        kind: AllocErrorKind::Unsupported(_),
                        ..
                    }) if align > Self::base_align() => {
                        if refused.last() != Some(&align) {
                            refused.push(align);
                        }
                    }
                    Err(e) => panic!("{name}: allocate({size}, {align}) failed: {e}"),
                }
            }
        }
        for &(p, size, align) in &served {
            // SAFETY: `p` came from `allocate` with this size and alignment and is freed once.
            unsafe { self.give(p, size, align, stream, stream, 0xA5) };
        }
        (Accepted(served), refused)
    }

    /// Checks a fresh allocation (aligned, disjoint from every live one), records it, and writes
    /// `tag` into it.
    fn take(&self, p: NonNull<u8>, size: usize, align: usize, stream: StreamRef, tag: u8) {
        let name = self.name;
        let addr = p.as_ptr() as usize;
        let want = align.max(Self::base_align());
        assert_eq!(
            addr % want,
            0,
            "{name}: allocate({size}, {align}) returned {addr:#x}, not aligned to {want}"
        );
        let end = addr.checked_add(size);
        assert!(
            end.is_some(),
            "{name}: allocate({size}, {align}) returned {addr:#x}, whose range wraps around"
        );
        {
            let mut live = lock(&self.live);
            if let Some((&a, &n)) = live.range(..=addr).next_back() {
                assert!(
                    a + n <= addr,
                    "{name}: {addr:#x}+{size} overlaps the live {a:#x}+{n}"
                );
            }
            if let Some((&a, &n)) = live.range(addr..).next() {
                assert!(
                    end.is_some_and(|e| e <= a),
                    "{name}: {addr:#x}+{size} overlaps the live {a:#x}+{n}"
                );
            }
            live.insert(addr, size);
        }
        if <R::Host as Bit>::BOOL {
            let synced = self.r.synchronize(stream);
            assert!(synced.is_ok(), "{name}: synchronize failed: {synced:?}");
            // SAFETY: host-accessible memory of `size` bytes, just allocated and synchronized for
            // the host; the resource promised it overlaps no other live allocation.
            unsafe { p.as_ptr().write_bytes(tag, size) };
        } else if let Some(access) = self.o.access {
            // SAFETY: as above, through the caller's accessor.
            unsafe { access.fill(p, size, tag, stream) };
        }
    }

    /// Checks that `p` still holds `tag`, forgets it, and deallocates it on `stream`.
    ///
    /// # Safety
    ///
    /// `p` came from `allocate` with this size and alignment, on `from`, and is given once.
    unsafe fn give(
        &self,
        p: NonNull<u8>,
        size: usize,
        align: usize,
        from: StreamRef,
        stream: StreamRef,
        tag: u8,
    ) {
        let name = self.name;
        let holds = if <R::Host as Bit>::BOOL {
            // SAFETY: host-accessible memory of `size` bytes, live, written by `take`.
            let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
            bytes.iter().all(|&b| b == tag)
        } else if let Some(access) = self.o.access {
            // SAFETY: live memory of `size` bytes, written by `take` on `from`.
            unsafe { access.holds(p, size, tag, from) }
        } else {
            true
        };
        assert!(
            holds,
            "{name}: the {size} bytes at {p:?} (alignment {align}) lost their pattern while live"
        );
        lock(&self.live).remove(&(p.as_ptr() as usize));
        // SAFETY: forwarded from the caller; the range left the live table first, so another
        // thread may be given it at once.
        unsafe { self.r.deallocate(p, size, align, stream) };
    }

    /// `threads` threads of random requests over the alignments served; returns how many non-zero
    /// allocations were made.
    fn threads(&self, aligns: &[usize]) -> usize {
        let o = self.o;
        if aligns.is_empty() {
            return 0;
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..o.threads)
                .map(|t| scope.spawn(move || self.thread(t, aligns)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .sum()
        })
    }

    fn thread(&self, t: usize, aligns: &[usize]) -> usize {
        let (name, o) = (self.name, self.o);
        let mut rng = Rng(o.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut mine: Vec<(NonNull<u8>, usize, usize, StreamRef, u8)> = Vec::new();
        let mut made = 0;
        for round in 0..o.rounds {
            let grow = mine.is_empty() || (mine.len() < 16 && rng.below(3) != 0);
            if grow {
                let size = match rng.below(20) {
                    0 => 0,
                    1..=10 => o.min_size + rng.below((o.max_size - o.min_size).min(255) + 1),
                    11..=15 => o.min_size + rng.below((o.max_size - o.min_size) / 8 + 1),
                    _ => o.min_size + rng.below(o.max_size - o.min_size + 1),
                };
                let align = aligns[rng.below(aligns.len())];
                let stream = o.streams[rng.below(o.streams.len())];
                let p = self.r.allocate(size, align, stream).unwrap_or_else(|e| {
                    panic!("{name}: thread {t}: allocate({size}, {align}) failed: {e}")
                });
                if size == 0 {
                    // SAFETY: `p` came from `allocate` with size 0 and this alignment.
                    unsafe { self.r.deallocate(p, 0, align, stream) };
                    continue;
                }
                let tag = (t * 37 + round) as u8 | 1;
                self.take(p, size, align, stream, tag);
                mine.push((p, size, align, stream, tag));
                made += 1;
            } else {
                let (p, size, align, from, tag) = mine.swap_remove(rng.below(mine.len()));
                let stream = o.streams[rng.below(o.streams.len())];
                // SAFETY: `p` came from `allocate` with this size and alignment on `from`, and
                // left `mine`, so it is given once.
                unsafe { self.give(p, size, align, from, stream, tag) };
            }
        }
        for (p, size, align, from, tag) in mine {
            // SAFETY: as above.
            unsafe { self.give(p, size, align, from, from, tag) };
        }
        made
    }

    fn stream_order(&self) {
        let name = self.name;
        let (a, b) = (self.o.streams[0], self.o.streams[1 % self.o.streams.len()]);
        let before = self
            .o
            .upstream
            .map(|u| (u.synchronized().len(), u.ordered().len()));
        let synced = self.r.synchronize(b);
        assert!(
            synced.is_ok(),
            "{name}: synchronize({b:?}) failed: {synced:?}"
        );
        let synced_len = self.o.upstream.map(|u| u.synchronized().len());
        let ordered = self.r.order_after(a, b);
        assert!(
            ordered.is_ok(),
            "{name}: order_after({a:?}, {b:?}) failed: {ordered:?}"
        );
        let (Some(up), Some((syncs, orders)), Some(synced_len)) =
            (self.o.upstream, before, synced_len)
        else {
            return;
        };
        let synchronized = up.synchronized();
        assert!(
            synchronized[syncs..synced_len].contains(&b.id()),
            "{name}: synchronize({b:?}) did not reach the upstream"
        );
        assert!(
            up.ordered()[orders..].contains(&(a.id(), b.id()))
                || synchronized[synced_len..].contains(&b.id()),
            "{name}: order_after({a:?}, {b:?}) did not reach the upstream (as order_after or as \
             synchronize({b:?}))"
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another thread fails the battery anyway; the map is still readable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// splitmix64: reproducible random requests without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
