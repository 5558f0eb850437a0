//! Compile-fail cases that only `cargo build` reports: the containers' alignment check is a
//! constant evaluated per element type and resource (a post-monomorphization error), which
//! `cargo check` skips. trybuild builds instead of checking when the set has a passing case, so
//! the set pairs each failing case with the stack that fixes it.

#[test]
fn ui_build() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui-build/pass/*.rs");
    t.compile_fail("tests/ui-build/fail/*.rs");
}
