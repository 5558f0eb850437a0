//! What `mrstack replay` says of bad traces (exit status 1) and of bad usage (exit status 2):
//! each names what is wrong and where.

use super::*;

/// Asserts that `body` after the header fails with status 1 and a message naming `line`, and
/// that `--on-error skip` replays the rest, reporting one bad line.
fn bad_line(name: &str, body: &str, line: usize, says: &str) {
    let f = TempFile::new("mrstack-cli", name, format!("{HEADER}{body}").as_bytes());
    let o = replay(&[f.text()]);
    let err = fails_saying(&o, 1, &format!("{}: line {line}: {says}", f.text()));
    assert!(err.contains("--on-error skip"), "{err}");
    assert_eq!(stdout(&o), "", "no table after a trace error");

    let o = replay(&[f.text(), "--on-error", "skip", "--json"]);
    let v = json(&o);
    assert_eq!(v["workload"]["skipped_lines"], 1);
    let err = stderr(&o);
    assert!(err.contains("1 bad line left out"), "{err}");
    assert!(err.contains(&format!("line {line}: {says}")), "{err}");
}

#[test]
fn a_malformed_line_is_named() {
    bad_line(
        "fields.csv",
        "0,1,allocate,0x100,64,0\n0,2,allocate,0x200,64\n0,3,free,0x100,64,0\n",
        3,
        "5 fields where the header has 6",
    );
    bad_line(
        "number.csv",
        "0,1,allocate,0x100,64,0\n0,2,allocate,0x200,lots,0\n",
        3,
        "Size `lots` is not a number",
    );
}

#[test]
fn a_free_of_an_unknown_pointer_is_named() {
    bad_line(
        "unknown.csv",
        "0,1,allocate,0x100,64,0\n0,2,free,0x100,64,0\n0,3,free,0x100,64,0\n",
        4,
        "free of 0x100, which is not a live allocation",
    );
}

#[test]
fn a_truncated_gzip_is_named() {
    let mut text = String::from(HEADER);
    for i in 0..3000u64 {
        let ptr = 0x7f00_0000_0000u64 + i * 0x1000;
        text += &format!(
            "0,{i},allocate,{ptr:#x},{},0\n0,{i},free,{ptr:#x},{},0\n",
            256 + i,
            256 + i
        );
    }
    let packed = gzip(text.as_bytes());
    let f = TempFile::new("mrstack-cli", "cut.csv.gz", &packed[..packed.len() / 2]);
    let o = replay(&[f.text()]);
    expect(&o, 1);
    let err = stderr(&o);
    assert!(
        err.contains(f.text()) && err.contains("line ") && err.contains("truncated"),
        "{err}"
    );

    let o = replay(&[f.text(), "--on-error", "skip", "--json"]);
    let v = json(&o);
    assert_eq!(v["workload"]["skipped_lines"], 1);
    let allocations = v["workload"]["allocations"].as_u64().unwrap();
    assert!(allocations > 0 && allocations < 3000, "{allocations}");
}

#[test]
fn missing_empty_and_headless_files_exit_1() {
    let o = replay(&["/nonexistent/mrstack/trace.csv"]);
    fails_saying(&o, 1, "cannot open");

    let empty = TempFile::new("mrstack-cli", "empty.csv", b"");
    let o = replay(&[empty.text(), "--on-error", "skip"]);
    fails_saying(&o, 1, "empty log");

    let headless = TempFile::new("mrstack-cli", "headless.csv", b"0,1,allocate,0x100,64,0\n");
    let o = replay(&[headless.text()]);
    fails_saying(&o, 1, "line 1: the header has no `Action` column");
}

#[test]
fn cuda_upstream_without_a_gpu_exits_1() {
    if mrstack::cuda_context(0).is_ok() {
        eprintln!("skipping: this machine has a GPU");
        return;
    }
    let o = mrstack(&["replay", "--upstream", "cuda", "--allocations", "10"]);
    fails_saying(&o, 1, "--upstream cuda: no GPU");
}

// ---------------------------------------------------------------- usage errors: exit status 2

#[test]
fn an_unknown_stack_is_a_usage_error_listing_the_names() {
    let o = replay(&["--stack", "upstream,nope", "--allocations", "10"]);
    fails_saying(&o, 2, "unknown stack `nope`; available: upstream");

    let o = replay(&["--stack", "cuda-async", "--allocations", "10"]);
    fails_saying(&o, 2, "needs --upstream cuda");
}

#[test]
fn bad_options_are_usage_errors() {
    let f = tiny("usage.csv");
    // Each line one command; LOG stands for a readable log.
    let lines = "replay --precision 2
        replay --precision 0
        replay --precision fine
        replay --passes 0
        replay --allocations 18446744073709551615
        replay --allocations 10000001
        replay --allocations -1
        replay --passes 18446744073709551615
        replay --passes 1000001
        replay --precision 1e400
        replay --precision NaN
        replay --seed 18446744073709551616
        replay --upstream tpu
        replay --on-error maybe
        replay --bogus
        replay LOG --seed 3
        replay LOG second.csv
        record";
    // Numbers past what each option takes are usage errors, not panics; so is no command.
    let commands = lines.lines().map(|l| {
        let words = l.split_whitespace();
        words
            .map(|w| if w == "LOG" { f.text() } else { w })
            .collect()
    });
    for args in commands.chain([Vec::new()]) {
        let o = mrstack(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty(), "{args:?}");
    }
}

#[test]
fn help_documents_the_exit_status_and_the_stacks() {
    let out = expect(&mrstack(&["replay", "--help"]), 0);
    for text in [
        "Exit status:",
        "0  every stack replayed and measured",
        "1  the trace cannot be read",
        "2  usage error",
        "Stacks: upstream",
        "cuda-async",
        "--on-error",
        "--json",
    ] {
        assert!(out.contains(text), "missing {text:?} in:\n{out}");
    }
    let out = expect(&mrstack(&["--help"]), 0);
    assert!(
        out.contains("replay") && out.contains("Exit status:"),
        "{out}"
    );
}
