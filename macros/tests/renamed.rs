//! `resource_stack!` in a crate that renamed its mrstack dependency (`mrs = { package =
//! "mrstack" }`, this package's dev-dependency): the macro names the crate as the caller does.

// Tests and benches may unwrap: a failed unwrap is a failed test (clippy::unwrap_used is for
// the library).
#![allow(clippy::unwrap_used)]

use mrs::prelude::*;

#[test]
fn the_macro_follows_a_renamed_dependency() {
    let sim = Simulated::new(1 << 30);
    let mr = mrs::resource_stack![&sim, Pool { initial: 1 MiB }, Statistics];
    let p = mr.allocate(1000, 256, StreamRef::DEFAULT).unwrap();
    assert_eq!(mr.bytes().current, 1000);
    // SAFETY: p came from mr with this size and alignment.
    unsafe { mr.deallocate(p, 1000, 256, StreamRef::DEFAULT) };
    assert_eq!(mr.upstream().usage().held, 1 << 20);
}
