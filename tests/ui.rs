//! Compile-fail suite: each file in tests/ui is one misuse, with the message a user sees.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
