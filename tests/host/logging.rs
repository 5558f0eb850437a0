//! Host tests of `Logging`: the RMM CSV log, thread numbers, every line in each thread's order,
//! wall-clock times, writers that panic or fail, and a log file through `resource_stack!`.

use mrstack::adaptor::Logging;
use mrstack::prelude::*;
use mrstack::replay::rmm_log::HEADER as LOG_HEADER;
use std::collections::HashMap;

use crate::adaptor_support::{stream, S};

/// One parsed line of the CSV log.
#[derive(Debug, PartialEq)]
struct Event {
    thread: u64,
    time: u64,
    action: String,
    pointer: usize,
    size: usize,
    stream: usize,
}

/// Parses a log as RMM's replay benchmark does: a header, then the named columns.
fn parse_log(text: &str) -> Vec<Event> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(LOG_HEADER));
    lines
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 6, "{line}");
            Event {
                thread: f[0].parse().unwrap(),
                time: f[1].parse().unwrap(),
                action: f[2].to_string(),
                pointer: usize::from_str_radix(f[3].strip_prefix("0x").unwrap(), 16).unwrap(),
                size: f[4].parse().unwrap(),
                stream: f[5].parse().unwrap(),
            }
        })
        .collect()
}

#[test]
fn logging_writes_rmm_csv() {
    assert_eq!(LOG_HEADER, "Thread,Time,Action,Pointer,Size,Stream");
    let mr = Logging::new(Simulated::new(10_000), Vec::new());
    let a = mr.allocate(1000, 256, S).unwrap();
    let b = mr.allocate(3000, 256, stream(0x5000)).unwrap();
    assert!(mr.allocate(9000, 256, S).is_err());
    let z = mr.allocate(0, 256, S).unwrap();
    // SAFETY: each came from mr with this size, alignment and stream.
    unsafe {
        mr.deallocate(z, 0, 256, S);
        mr.deallocate(a, 1000, 256, S);
        mr.deallocate(b, 3000, 256, stream(0x5000));
    }
    mr.flush().unwrap();
    let (sim, log) = mr.into_parts().unwrap();
    assert_eq!(sim.in_use(), 0);
    let text = String::from_utf8(log).unwrap();
    let events = parse_log(&text);
    let (a, b) = (a.as_ptr() as usize, b.as_ptr() as usize);
    let got: Vec<(&str, usize, usize, usize)> = events
        .iter()
        .map(|e| (e.action.as_str(), e.pointer, e.size, e.stream))
        .collect();
    assert_eq!(
        got,
        [
            ("allocate", a, 1000, 0),
            ("allocate", b, 3000, stream(0x5000).id().get() as usize),
            ("allocate failure", 0, 9000, 0),
            ("free", a, 1000, 0),
            ("free", b, 3000, stream(0x5000).id().get() as usize),
        ]
    );
    assert!(events.iter().all(|e| e.thread == events[0].thread));
    assert!(events.windows(2).all(|w| w[0].time <= w[1].time));
    // Microseconds since the epoch: after 2020, before 2100.
    assert!((1_577_836_800_000_000..4_102_444_800_000_000).contains(&events[0].time));
    // The text itself, column by column, for the failure line.
    let failure = text.lines().nth(3).unwrap();
    assert!(
        failure.ends_with(",allocate failure,0x0,9000,0"),
        "{failure}"
    );
    assert!(text
        .lines()
        .nth(1)
        .unwrap()
        .ends_with(&format!(",allocate,{a:#x},1000,0")));
}

#[test]
fn logging_threads_get_their_own_numbers() {
    let mr = Logging::new(System::new(), Vec::new());
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                crate::support::serve_one(&mr, 64, 16, S);
            });
        }
    });
    let (_, log) = mr.into_parts().unwrap();
    let events = parse_log(&String::from_utf8(log).unwrap());
    assert_eq!(events.len(), 6);
    let mut threads: Vec<u64> = events.iter().map(|e| e.thread).collect();
    threads.sort_unstable();
    threads.dedup();
    assert_eq!(threads.len(), 3);
    // Each thread's free follows its allocate of the same pointer.
    for t in threads {
        let mine: Vec<&Event> = events.iter().filter(|e| e.thread == t).collect();
        assert_eq!(
            (mine[0].action.as_str(), mine[1].action.as_str()),
            ("allocate", "free")
        );
        assert_eq!(mine[0].pointer, mine[1].pointer);
    }
}

#[test]
fn logging_keeps_every_line_and_each_threads_order() {
    // Formatted on the writer thread: nothing lost, each thread's lines in its order, and an
    // address freed on one thread logged free before another thread's allocate of it.
    let mr = Logging::new(System::new(), Vec::new());
    let (threads, pairs) = (8, 2000);
    std::thread::scope(|s| {
        for t in 0..threads {
            let mr = &mr;
            s.spawn(move || {
                for i in 0..pairs {
                    let size = 16 + (i * 31 + t * 7) % 200;
                    crate::support::serve_one(&mr, size, 16, S);
                }
            });
        }
    });
    mr.flush().unwrap();
    let (_, log) = mr.into_parts().unwrap();
    let events = parse_log(&String::from_utf8(log).unwrap());
    assert_eq!(events.len(), threads * pairs * 2);
    let mut by_thread: HashMap<u64, Vec<&Event>> = HashMap::new();
    for e in &events {
        by_thread.entry(e.thread).or_default().push(e);
    }
    assert_eq!(by_thread.len(), threads);
    for mine in by_thread.values() {
        for pair in mine.chunks(2) {
            assert_eq!(
                (pair[0].action.as_str(), pair[1].action.as_str()),
                ("allocate", "free")
            );
            assert_eq!(
                (pair[0].pointer, pair[0].size),
                (pair[1].pointer, pair[1].size)
            );
        }
        assert!(mine.windows(2).all(|w| w[0].time <= w[1].time));
    }
    // Down the file, each address is allocated and freed in turn.
    let mut live: HashMap<usize, bool> = HashMap::new();
    for e in &events {
        let was = live.insert(e.pointer, e.action == "allocate");
        match e.action.as_str() {
            "allocate" => assert_ne!(was, Some(true), "{:#x} allocated twice", e.pointer),
            _ => assert_eq!(was, Some(true), "{:#x} freed while not live", e.pointer),
        }
    }
}

#[test]
fn logging_times_are_the_wall_clock_in_microseconds() {
    // Stamps are clock ticks (the time-stamp counter where the kernel keeps time with it): the
    // writer turns them into microseconds since the Unix epoch.
    let micros = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    };
    let before = micros();
    let mr = Logging::new(System::new(), Vec::new());
    let mut times = Vec::new();
    for _ in 0..3 {
        times.push(micros());
        crate::support::serve_one(&mr, 256, 16, S);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let after = micros();
    let (_, log) = mr.into_parts().unwrap();
    let events = parse_log(&String::from_utf8(log).unwrap());
    assert_eq!(events.len(), 6);
    for (k, e) in events.iter().enumerate() {
        assert!(
            (before.saturating_sub(1000)..=after + 1000).contains(&e.time),
            "line {k} at {} µs, outside [{before}, {after}]",
            e.time
        );
    }
    // 20 ms between the pairs, as the wall clock saw them (to a millisecond).
    for (w, pair) in events
        .chunks(2)
        .collect::<Vec<_>>()
        .windows(2)
        .zip(times.windows(2))
    {
        let (logged, seen) = (w[1][0].time - w[0][0].time, pair[1] - pair[0]);
        assert!(
            logged.abs_diff(seen) < 2000,
            "{logged} µs logged, {seen} µs seen"
        );
    }
}

/// A writer that panics on its first write.
struct Panics;

impl std::io::Write for Panics {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        panic!("a writer that panics (expected by the test)")
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logging_survives_a_writer_that_panics() {
    // The writer thread dies at its first write: allocations go on, nothing waits for it forever,
    // and flush says what happened.
    let mr = Logging::new(System::new(), Panics);
    for i in 0..20_000 {
        crate::support::serve_one(&mr, 64 + i % 100, 16, S);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut flushed = mr.flush();
    while flushed.is_ok() && std::time::Instant::now() < deadline {
        // The 64 KiB buffer may not have filled before the first flush: flushing writes it.
        flushed = mr.flush();
    }
    assert!(
        flushed.is_err(),
        "flush after the writer panicked: {flushed:?}"
    );
    assert!(mr.into_parts().is_err());
}

#[test]
fn logging_keeps_a_panicking_writer_out_of_drop_and_into_parts() {
    // With a few lines (the buffer never filled), the writer is first called by the last flush,
    // in the adaptor's drop or `into_parts`, on the caller's thread: its panic must come out of
    // neither `drop` (an abort when dropped while unwinding) nor `into_parts`.
    let few = |mr: &Logging<System, Panics>| {
        for _ in 0..4 {
            crate::support::serve_one(&mr, 64, 8, S);
        }
    };
    let mr = Logging::new(System::new(), Panics);
    few(&mr);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(mr)));
    assert!(dropped.is_ok(), "drop(Logging) let the writer's panic out");
    let mr = Logging::new(System::new(), Panics);
    few(&mr);
    let parts = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        mr.into_parts().map(|_| ())
    }));
    assert!(
        matches!(parts, Ok(Err(_))),
        "into_parts: an error, not a panic"
    );
    // Dropped while another panic unwinds: no second panic, so no abort.
    let unwound = std::panic::catch_unwind(|| {
        let mr = Logging::new(System::new(), Panics);
        few(&mr);
        panic!("an unrelated panic (expected by the test)");
    });
    assert!(unwound.is_err());
}

/// A writer that fails every write.
struct Broken;

impl std::io::Write for Broken {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("disk on fire"))
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logging_write_errors_do_not_fail_allocations() {
    let mr = Logging::new(System::new(), Broken);
    // The header sits in the buffer; the error shows when the buffer is written out.
    crate::support::serve_one(&mr, 64, 16, S);
    let err = mr.flush().unwrap_err();
    assert_eq!(err.to_string(), "disk on fire");
}

#[test]
fn logging_through_resource_stack_to_a_file() {
    let path = std::env::temp_dir().join(format!("mrstack-log-{}.csv", std::process::id()));
    let sim = Simulated::new(1 << 20);
    {
        let mr = resource_stack![
            &sim,
            Logging {
                to: Box::new(std::fs::File::create(&path).unwrap())
            }
        ];
        crate::support::serve_one(&mr, 4 << 10, 256, S);
        // Dropping the adaptor flushes the buffer.
    }
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let events = parse_log(&text);
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[0].action.as_str(), events[0].size),
        ("allocate", 4096)
    );
    assert_eq!(
        (events[1].action.as_str(), events[1].pointer),
        ("free", events[0].pointer)
    );
}
