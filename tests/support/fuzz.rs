//! Proptest strategies for random input to the replay: logs that are mostly well-formed RMM CSV,
//! with garbled lines, huge numbers, odd thread and stream ids and binary junk among them, and
//! command lines of `mrstack` made of its options and odd values.

use proptest::prelude::*;

/// A number as a log might write it: small, huge, at the edges of `u64`, in hex or decimal, or
/// not a number at all.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u64..4).prop_map(|n| (n * 0x100).to_string()),
        4 => (1u64..1 << 20).prop_map(|n| n.to_string()),
        2 => prop::sample::select(vec![
            0u64,
            1,
            255,
            256,
            1 << 40,
            1 << 62,
            (isize::MAX as u64) - 255,
            isize::MAX as u64,
            (isize::MAX as u64) + 1,
            u64::MAX - 1,
            u64::MAX,
        ])
        .prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| format!("{n:#x}")),
        1 => prop::sample::select(vec![
            "", "-1", "0x", "0X10", "1e9", "18446744073709551616", " 7 ", "+3", "ß", "0x-1",
        ])
        .prop_map(str::to_owned),
    ]
}

/// One line of a log after its header.
fn line() -> impl Strategy<Value = Vec<u8>> {
    let action = prop::sample::select(vec![
        "allocate",
        "free",
        "allocate failure",
        "Allocate",
        "",
        "reallocate",
    ]);
    // Pointers from a small set, each mostly with a size of its own, so that frees often find
    // their allocation; some sizes huge.
    let slot_size = |k: u64| match k {
        0 => 1 << 62,
        1 => isize::MAX as u64 & !255,
        2 => 1 << 40,
        _ => k * 1000 + 1,
    };
    let pointer_size = prop_oneof![
        10 => (0u64..12).prop_map(move |k| (format!("{:#x}", (k + 1) * 0x1000), slot_size(k).to_string())),
        2 => (0u64..12, number()).prop_map(|(k, s)| (format!("{:#x}", (k + 1) * 0x1000), s)),
        1 => (number(), number()),
    ];
    let action = prop_oneof![
        8 => Just("allocate"),
        8 => Just("free"),
        1 => action,
    ];
    let thread = prop_oneof![4 => (0u64..4).prop_map(|t| t.to_string()), 1 => number()];
    let stream = prop_oneof![4 => (0u64..3).prop_map(|s| s.to_string()), 1 => number()];
    let csv = (thread, action, pointer_size, stream)
        .prop_map(|(t, a, (p, s), st)| format!("{t},0,{a},{p},{s},{st}\n").into_bytes());
    prop_oneof![
        12 => csv,
        1 => "[ -~]{0,40}\n".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..40),
        1 => Just(b"\n".to_vec()),
        1 => (number(), number()).prop_map(|(a, b)| format!("{a},{b}\n").into_bytes()),
    ]
}

/// A log: usually RMM's header, then lines.
pub(crate) fn log() -> impl Strategy<Value = Vec<u8>> {
    let header = prop_oneof![
        8 => Just(b"Thread,Time,Action,Pointer,Size,Stream\n".to_vec()),
        1 => Just(b"Action,Size,Pointer\n".to_vec()),
        1 => Just(b"\xef\xbb\xbfThread,Time,Action,Pointer,Size\n".to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..20),
    ];
    (header, prop::collection::vec(line(), 0..40)).prop_map(|(mut h, lines)| {
        for l in lines {
            h.extend(l);
        }
        h
    })
}

/// The arguments after `mrstack`: usually `replay` and some of its options, with values good and
/// bad.
pub(crate) fn command_line() -> impl Strategy<Value = Vec<String>> {
    let word = prop_oneof![
        4 => prop::sample::select(vec![
            "--stack", "-s", "--upstream", "--passes", "--precision", "--no-capacity",
            "--sequential", "--on-error", "--allocations", "--seed", "--json", "--quiet", "-q",
            "--help", "--version", "-h", "-V", "--", "replay", "trace.csv", "pool,arena",
            "cuda-async", "simulated", "cuda", "auto", "skip", "stop", "--passes=0",
            "--allocations=10000001", "--precision=nan", "--precision=inf", "--stack=",
        ])
        .prop_map(str::to_owned),
        2 => number(),
        1 => prop::sample::select(vec![
            "0", "-1", "1e400", "0.5", "1", "1e-300", "4294967296", "1000001", "NaN", "",
        ])
        .prop_map(str::to_owned),
        1 => "\\PC{0,12}",
    ];
    (any::<bool>(), prop::collection::vec(word, 0..8)).prop_map(|(replay, mut words)| {
        if replay {
            words.insert(0, "replay".to_owned());
        }
        words
    })
}
