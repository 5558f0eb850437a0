//! `Tracking<U>`: a table of every live allocation, with leak reports and refused bad frees.

use crate::resource::{check_request, forward_upstream, Layer, MemoryResource, Result};
use crate::stack::{has_upstream, ItemWriter};
use crate::stream::{StreamId, StreamRef};
use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// A live allocation, as [`Tracking::outstanding`] lists it.
#[derive(Debug, Clone)]
pub struct Allocation {
    /// Its address.
    pub address: usize,
    /// Its size in bytes.
    pub size: usize,
    /// The alignment it was asked with.
    pub align: usize,
    /// The stream it was allocated on.
    pub stream: StreamId,
    /// Where it was allocated, when the adaptor captures backtraces.
    pub backtrace: Option<Arc<Backtrace>>,
}

/// What was wrong with a deallocation that [`Tracking`] refused to pass on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadFreeKind {
    /// The pointer is not a live allocation of this adaptor: freed already, or never allocated here.
    NotLive,
    /// The pointer is live, but was allocated with another size or alignment; it stays live.
    Mismatch {
        /// The size it was allocated with.
        size: usize,
        /// The alignment it was allocated with.
        align: usize,
    },
}

/// A deallocation [`Tracking`] refused to pass on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadFree {
    /// What was wrong.
    pub kind: BadFreeKind,
    /// The address passed.
    pub address: usize,
    /// The size passed.
    pub size: usize,
    /// The alignment passed.
    pub align: usize,
    /// The stream passed.
    pub stream: StreamId,
}

impl std::fmt::Display for BadFree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "deallocate({:#x}, size {}, align {}, stream {}): ",
            self.address, self.size, self.align, self.stream
        )?;
        match self.kind {
            BadFreeKind::NotLive => {
                f.write_str("not a live allocation (double free, or allocated elsewhere)")
            }
            BadFreeKind::Mismatch { size, align } => write!(
                f,
                "allocated with size {size}, align {align}; the block stays allocated"
            ),
        }
    }
}

#[derive(Debug)]
struct Live {
    size: usize,
    align: usize,
    stream: StreamId,
    backtrace: Option<Arc<Backtrace>>,
}

/// The live allocations whose addresses fall in one stripe, on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe {
    live: HashMap<usize, Live, crate::hash::FastHash>,
    bytes: usize,
}

/// Stripes: threads working on different blocks seldom take the same lock.
const STRIPES: usize = 16;

/// The stripe of an address: blocks are at least 256-byte aligned in the stacks that matter, so
/// the bits above those pick it, hashed as the crate's tables hash addresses so that strided
/// addresses spread.
fn stripe_of(address: usize) -> usize {
    use std::hash::BuildHasher;
    crate::hash::FastHash::default().hash_one(address >> 8) as usize % STRIPES
}

/// Tracks every live allocation of `U`.
///
/// It remembers every live allocation — address, size, alignment, stream and, when enabled, the
/// backtrace of the call that made it — as RMM's `tracking_resource_adaptor` and PyTorch's memory
/// history do. It answers what is allocated now ([`outstanding`](Self::outstanding)), writes a leak
/// report on demand ([`leak_report`](Self::leak_report)) and to stderr when dropped with
/// allocations live, and catches a deallocation of a pointer that is not live here (a double free,
/// a pointer from elsewhere) or with another size or alignment than it was allocated with: such a
/// call is recorded ([`bad_frees`](Self::bad_frees)), reported on stderr and *not* passed to the
/// upstream, so the bug cannot corrupt it. Allocations still live when the adaptor is dropped are
/// reported, not freed: their owner may still use them.
///
/// # Cost
///
/// A mutex and a hash-map operation per call, the mutex one of 16 picked by the address (calls
/// on several threads seldom meet); capturing a backtrace costs microseconds, so it is
/// off by default ([`with_backtraces`](Self::with_backtraces) turns it on; backtraces are
/// symbolized only when printed). Memory: one map entry per live allocation (with its backtrace
/// when captured) and one record per refused deallocation, kept for the adaptor's life.
///
/// # Streams
///
/// Each allocation records the identity ([`StreamId`]) of its stream, not the stream: it keeps no
/// stream alive. The stream of each call goes to the upstream unchanged; `synchronize` and
/// `order_after` are forwarded to the upstream.
///
/// # Upstream
///
/// Requires nothing of its upstream and keeps its properties and alignment.
///
/// # Examples
///
/// ```
/// use mrstack::prelude::*;
///
/// let mr = resource_stack![Simulated::new(1 << 30), Tracking];
/// let p = mr.allocate(4096, 256, StreamRef::DEFAULT).unwrap();
/// assert_eq!(mr.outstanding_bytes(), 4096);
/// assert!(mr.leak_report().contains("4096 bytes"));
/// // SAFETY: p came from mr with this size and alignment.
/// unsafe { mr.deallocate(p, 4096, 256, StreamRef::DEFAULT) };
/// assert_eq!(mr.outstanding_count(), 0);
/// ```
#[derive(Debug)]
pub struct Tracking<U> {
    upstream: U,
    backtraces: bool,
    stripes: Box<[Mutex<Stripe>]>,
    /// Refused deallocations, in order: rare, off the hot path.
    bad_frees: Mutex<Vec<BadFree>>,
}

impl<U: MemoryResource> Tracking<U> {
    const NAME: &'static str = "Tracking";

    /// Tracks what goes to `upstream`, without backtraces.
    pub fn new(upstream: U) -> Self {
        Self::with_backtraces(upstream, false)
    }

    /// Tracks what goes to `upstream`, capturing a backtrace per allocation when `backtraces`.
    /// The backtraces are resolved (symbolized) only when printed.
    pub fn with_backtraces(upstream: U, backtraces: bool) -> Self {
        Tracking {
            upstream,
            backtraces,
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            bad_frees: Mutex::default(),
        }
    }
}

impl<U> Tracking<U> {
    /// The live allocations, by address.
    pub fn outstanding(&self) -> Vec<Allocation> {
        let mut list: Vec<Allocation> = Vec::new();
        for i in 0..STRIPES {
            list.extend(self.lock(i).live.iter().map(|(&address, l)| Allocation {
                address,
                size: l.size,
                align: l.align,
                stream: l.stream,
                backtrace: l.backtrace.clone(),
            }));
        }
        list.sort_by_key(|a| a.address);
        list
    }

    /// The number of live allocations.
    pub fn outstanding_count(&self) -> usize {
        (0..STRIPES).map(|i| self.lock(i).live.len()).sum()
    }

    /// The bytes in live allocations.
    pub fn outstanding_bytes(&self) -> usize {
        (0..STRIPES).map(|i| self.lock(i).bytes).sum()
    }

    /// The deallocations refused so far (double frees, unknown pointers, mismatched sizes).
    pub fn bad_frees(&self) -> Vec<BadFree> {
        self.lock_bad_frees().clone()
    }

    /// The number of deallocations refused so far.
    pub fn bad_free_count(&self) -> usize {
        self.lock_bad_frees().len()
    }

    /// A report of the live allocations, one line each (and its backtrace, when captured); an
    /// empty string when there are none.
    pub fn leak_report(&self) -> String {
        let list = self.outstanding();
        if list.is_empty() {
            return String::new();
        }
        let bytes: usize = list.iter().map(|a| a.size).sum();
        let mut out = format!(
            "Tracking: {} allocation(s) still live, {bytes} bytes:\n",
            list.len()
        );
        for a in &list {
            let _ = writeln!(
                out,
                "  {:#x}: {} bytes, align {}, stream {}",
                a.address, a.size, a.align, a.stream
            );
            if let Some(bt) = &a.backtrace {
                let _ = writeln!(out, "    allocated at:\n{bt}");
            }
        }
        out
    }

    /// Whether backtraces are captured.
    pub fn captures_backtraces(&self) -> bool {
        self.backtraces
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn lock(&self, stripe: usize) -> std::sync::MutexGuard<'_, Stripe> {
        // Every update under the lock is one map operation and a counter: a poisoned lock still
        // holds a consistent state.
        self.stripes[stripe]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn lock_bad_frees(&self) -> std::sync::MutexGuard<'_, Vec<BadFree>> {
        self.bad_frees.lock().unwrap_or_else(|p| p.into_inner())
    }
}

// SAFETY: every allocation is the upstream's, returned unchanged; a deallocation reaches the
// upstream only for a pointer live here with the size and alignment it was allocated with.
unsafe impl<U: MemoryResource> MemoryResource for Tracking<U> {
    forward_upstream!(U, upstream);

    fn allocate(&self, size: usize, align: usize, stream: StreamRef) -> Result<NonNull<u8>> {
        if let Some(empty) = check_request::<Self>(size, align, Self::NAME)? {
            return Ok(empty);
        }
        let backtrace = self
            .backtraces
            .then(|| Arc::new(Backtrace::force_capture()));
        let ptr = self.upstream.allocate(size, align, stream)?;
        let mut s = self.lock(stripe_of(ptr.as_ptr() as usize));
        s.bytes += size;
        s.live.insert(
            ptr.as_ptr() as usize,
            Live {
                size,
                align,
                stream: stream.id(),
                backtrace,
            },
        );
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize, align: usize, stream: StreamRef) {
        if size == 0 {
            return;
        }
        let address = ptr.as_ptr() as usize;
        let bad = |kind| BadFree {
            kind,
            address,
            size,
            align,
            stream: stream.id(),
        };
        let refused = {
            let mut s = self.lock(stripe_of(address));
            match s.live.remove(&address) {
                Some(l) if l.size == size && l.align == align => {
                    s.bytes -= size;
                    None
                }
                Some(l) => {
                    let b = bad(BadFreeKind::Mismatch {
                        size: l.size,
                        align: l.align,
                    });
                    s.live.insert(address, l);
                    Some(b)
                }
                None => Some(bad(BadFreeKind::NotLive)),
            }
        };
        match refused {
            Some(b) => {
                self.lock_bad_frees().push(b);
                eprintln!("{}: refused {b}", Self::NAME);
            }
            // SAFETY: the pointer was live here with this size and alignment: the upstream gave
            // it, and it is freed once (it just left the table).
            None => unsafe { self.upstream.deallocate(ptr, size, align, stream) },
        }
    }

    fn describe_to(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let item = ItemWriter::over(f, &self.upstream, "tracking");
        // The default (no backtraces) is left out, as text usually leaves it.
        let item = if self.backtraces {
            item.flag("backtraces", true)
        } else {
            item
        };
        item.finish()
    }

    forward_upstream!(layer over upstream);
}

has_upstream!(impl<U> for Tracking<U>);

impl<U> Drop for Tracking<U> {
    fn drop(&mut self) {
        let report = self.leak_report();
        if !report.is_empty() {
            eprint!("{report}");
        }
    }
}

/// `resource_stack!` configuration of [`Tracking`]: `Tracking` or `Tracking { backtraces: true }`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackingConfig {
    /// Capture a backtrace per allocation (costly: for debugging leaks).
    pub backtraces: bool,
}

impl<U: MemoryResource> Layer<U> for TrackingConfig {
    type Resource = Tracking<U>;
    fn layer(self, upstream: U) -> Tracking<U> {
        Tracking::with_backtraces(upstream, self.backtraces)
    }
}

crate::property::assert_keeps_properties!(Tracking);
static_assertions::assert_impl_all!(Allocation: Send, Sync);
