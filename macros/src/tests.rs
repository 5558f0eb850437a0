//! The macro's messages, read from its parser, and a sweep of malformed input that must give
//! errors, never a panic.

use crate::parse::Stack;

/// The error `input` gives, or `None` when it parses.
fn error(input: &str) -> Option<String> {
    syn::parse_str::<Stack>(input).err().map(|e| e.to_string())
}

#[track_caller]
fn refused(input: &str, wanted: &str) {
    match error(input) {
        Some(message) => assert!(message.contains(wanted), "{input}: {message}"),
        None => panic!("{input}: accepted"),
    }
}

#[test]
fn accepts_the_grammar() {
    for input in [
        "Cuda::new(&ctx)?",
        "&sim,",
        "sim, Pool",
        "sim, Pool { initial: 1 GiB, max: 8 GiB }, Statistics,",
        "sim, Pool { initial: 1.5 GiB }",
        "sim, Pool { initial: 1.5MiB, max: 0x10 MiB }",
        "sim, Pool { initial: 0 }",
        "sim, Pool { initial: 1 << 30, max: usize::MAX }",
        "sim, Pool { initial: n * 1024, max: bytes }",
        "sim, Pool { initial: \"512MB\" }",
        "sim, Binning { min: 256 B, max: 1 MiB }",
        "sim, FixedSize { block_size: 1 MiB, blocks_to_preallocate: 128 }",
        "sim, Prefetch { device: 0 }",
        "sim, Aligned<U4096>, Aligned::<U256>",
        "sim, (MyLayer), my_layer, MyLayer::new(1 << 20)",
        "Pool::new(sim, config), Statistics",
        "sim, Tracking { backtraces: true }",
    ] {
        assert_eq!(error(input), None, "{input}");
    }
}

#[test]
fn says_what_is_wrong() {
    refused("", "starts with its leaf resource");
    refused(", Pool", "starts with its leaf resource");
    refused(
        "sim, Pool { initial: n GiB }",
        "a unit follows a number literal, not an expression: write the bytes as a `usize` expression, `n << 30`",
    );
    refused(
        "sim, Pool { initial: 64 * 1024 MiB }",
        "write one number, `65536 MiB`, or the bytes as a `usize` expression, `(64 * 1024) << 20`",
    );
    refused("sim, Pool { initial: n B }", "expression, `n`");
    refused("sim, Pool { initial: -1 GiB }", "never negative");
    refused(
        "Pool { initial: 1 GiB }, System::new()",
        "the leaf must come first: `Pool` is a layer",
    );
    refused("Statistics, sim", "the leaf must come first: `Statistics`");
    refused("Aligned<U4096>", "the leaf must come first");
    refused(
        "System::new() Pool { initial: 1 GiB }",
        "missing `,` after the leaf",
    );
    refused("sim, Pool Statistics", "missing `,` after `Pool`");
    refused(
        "sim, Pool { max: 1 GiB } Statistics",
        "missing `,` after `Pool`",
    );
    refused("sim, (MyLayer) Statistics", "missing `,` after this item");
    refused(
        "sim, Pool { initial: 1 GiB max: 2 GiB }",
        "missing `,` before this field",
    );
    refused(
        "sim, Pool { initial: 64 max: 2 GiB }",
        "missing `,` before this field",
    );
    refused(
        "sim, Pool { initial: 64 }",
        "`Pool`'s `initial` is a size, and `64` has no unit: write `64 B` for bytes",
    );
    refused(
        "sim, Limiting { limit: 1_024 }",
        "`1_024` has no unit: write `1_024 B`",
    );
    refused("sim, Arena { size: 4096usize }", "`4096` has no unit");
    refused("sim, Binning { max: 1.5 }", "`1.5` has no unit");
    refused("sim, Pool { max: \"4096\" }", "`\"4096\"` has no unit");
    refused(
        "sim, FixedSize { blocks_to_preallocate: 128 MiB }",
        "`FixedSize`'s `blocks_to_preallocate` is a count, not a size: drop the unit",
    );
    refused("sim, Prefetch { device: 1GiB }", "is a count");
    refused("sim, Pool { initial: 1 GiBs }", "unknown size unit `GiBs`");
    refused(
        "sim, Pool { initial: 1usize GiB }",
        "drop the `usize` suffix",
    );
    refused(
        "sim, Pool { initial: 2 GiB, max: 1 GiB }",
        "is above its `max`",
    );
    refused(
        "sim, Pool { initial 1 GiB }",
        "expected `:` after `initial`",
    );
    refused("sim, Pool { initial: }", "expected a value for `initial`");
    refused("sim, Pool { 1 GiB }", "expected a field name");
    refused(
        "sim, Pool { initial: 1 GiB GiB }",
        "after the value of `initial`",
    );
    refused(
        "Simulated::new(1 GiB), Pool",
        "reads a size with a unit only as the value of a layer's field",
    );
    refused(
        "sim, Limiting::new(2 MiB)",
        "in an expression write the bytes, `2 << 20`",
    );
    refused("sim, my_layer([(4 KiB)])", "`4 << 10`");
}

/// Every sequence of up to four of these fragments, and the fragments' prefixes: none may panic.
#[test]
fn never_panics() {
    let fragments = [
        "sim",
        ",",
        "Pool",
        "{",
        "}",
        "initial",
        ":",
        "1",
        "1.5",
        "GiB",
        "\"1 GiB\"",
        "<",
        ">",
        "::",
        "-",
        "*",
        "n",
        "(",
        ")",
        "?",
        "0",
        "B",
        "Statistics",
        "max",
        "\"\"",
        "1e3",
        "0x10",
        "usize",
    ];
    let mut count = 0;
    let n = fragments.len();
    for a in 0..n {
        for b in 0..n {
            for c in 0..n {
                for d in [0, 1, 5, 7, 9, 14] {
                    let input = format!(
                        "{} {} {} {} {}",
                        fragments[a],
                        fragments[b],
                        fragments[c],
                        fragments[d],
                        fragments[(a + b) % n]
                    );
                    // Unbalanced braces do not tokenize; the compiler refuses them first.
                    let Ok(tokens) = input.parse::<proc_macro2::TokenStream>() else {
                        continue;
                    };
                    if let Ok(stack) = syn::parse2::<Stack>(tokens) {
                        let _ = stack.expand();
                    }
                    count += 1;
                }
            }
        }
    }
    assert!(count > 10_000, "{count}");
}
