//! Where `VirtualMemory`'s physical footprint goes on an allocation log: replays it in log order
//! through `VirtualMemory` over `Simulated` (2 MiB pages), and after every allocation counts the
//! pages the live blocks touch. Prints the worst moment: pages touched, live bytes, pages partly
//! free, and the runs of neighbouring live blocks (each run's ends leave partly free pages).
//!
//! ```text
//! cargo run --release --example page_footprint -- data/traces/transformer_train.csv.gz
//! ```
//!
//! Without a log it replays the built-in random workload (`mrstack replay`'s).
//!
//! Counting every page after every allocation is O(live blocks) per op: a probe, not a tool for
//! large logs.

use mrstack::leaf::{VirtualMemory, VirtualMemoryConfig};
use mrstack::prelude::*;
use mrstack::replay::{random, rmm_log, Op, RandomConfig};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the live blocks touch at one moment.
struct Touch {
    pages: usize,
    partial: usize,
    runs: usize,
}

fn touch(live: &BTreeMap<usize, usize>, page: usize) -> Touch {
    let mut bytes_in = BTreeMap::<usize, usize>::new();
    let (mut runs, mut last_end) = (0, usize::MAX);
    for (&addr, &size) in live {
        if addr != last_end {
            runs += 1;
        }
        last_end = addr + size;
        for p in addr / page..=(addr + size - 1) / page {
            let lo = addr.max(p * page);
            let hi = (addr + size).min((p + 1) * page);
            *bytes_in.entry(p).or_default() += hi - lo;
        }
    }
    Touch {
        pages: bytes_in.len(),
        partial: bytes_in.values().filter(|&&b| b < page).count(),
        runs,
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (path, workload) = match std::env::args().nth(1) {
        Some(path) => {
            let trace = rmm_log::read(&path)?;
            (path, trace.workload)
        }
        None => ("random".to_owned(), random(&RandomConfig::default())),
    };
    let w = &workload;
    // Room for any placement: the probe measures where the pages go, not a limit.
    let capacity = w.peak_live().saturating_mul(4).max(64 << 20);
    let sim = Arc::new(Simulated::new(capacity));
    let vm = VirtualMemory::new(
        sim,
        VirtualMemoryConfig {
            max: capacity,
            cache: capacity,
            ..Default::default()
        },
    )?;
    let page = vm.pages().page_size();
    let mut blocks: Vec<Option<(std::ptr::NonNull<u8>, usize)>> = vec![None; w.allocations()];
    let mut live = BTreeMap::new();
    let (mut live_bytes, mut peak_live) = (0usize, 0usize);
    let mut worst: Option<(usize, Touch, usize, usize)> = None;
    for (op, &o) in w.ops().iter().enumerate() {
        match o {
            Op::Alloc { id, size, .. } => {
                let ptr = vm.allocate(size, 256, StreamRef::DEFAULT)?;
                let rounded = size.div_ceil(256) * 256;
                blocks[id] = Some((ptr, size));
                live.insert(ptr.as_ptr() as usize, rounded);
                live_bytes += rounded;
                peak_live = peak_live.max(live_bytes);
                let t = touch(&live, page);
                if worst.as_ref().is_none_or(|w| t.pages > w.1.pages) {
                    worst = Some((op, t, live_bytes, live.len()));
                }
            }
            Op::Free { id } => {
                let (ptr, size) = blocks[id].take().ok_or("a free of a block not live")?;
                live_bytes -= live.remove(&(ptr.as_ptr() as usize)).unwrap_or(0);
                // SAFETY: allocated above from this resource with this size and alignment, and
                // taken out of `blocks`, so freed once.
                unsafe { vm.deallocate(ptr, size, 256, StreamRef::DEFAULT) };
            }
        }
    }
    let Some((op, t, at_live, at_blocks)) = worst else {
        println!("{path}: no allocation");
        return Ok(());
    };
    println!(
        "{path}: worst at op {op}: {} pages touched ({:.1} MiB) by {at_blocks} live blocks of \
         {:.1} MiB in {} runs, {} pages partly free; over peak live {:.1} MiB: {:.4}",
        t.pages,
        mib(t.pages * page),
        mib(at_live),
        t.runs,
        t.partial,
        mib(peak_live),
        (t.pages * page) as f64 / peak_live as f64
    );
    Ok(())
}
