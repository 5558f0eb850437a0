//! What `resource_stack!`'s expansion calls: not an API, hidden from the docs, and free to change
//! with the macro.
//!
//! The leaf of a stack goes through `Wrap(leaf).into_leaf()`, with the three traits below in scope.
//! Method lookup tries the receiver by value before it borrows it, and skips an impl whose bounds
//! fail, so exactly one applies:
//!
//! * a [`MemoryResource`] takes [`IsResource`] (by value): the leaf itself;
//! * a `Result` takes [`IsResult`] (by value): the `Ok` type, under a bound no type meets, so that
//!   a forgotten `?` is one error at the leaf that says so, and the stack above is built over the
//!   `Ok` type as though the `?` were there;
//! * anything else takes [`IsNeither`] (borrowed): a type nothing constrains, under a bound no type
//!   meets, so that the error is one, at the leaf; the layers above see an unknown type, and the
//!   compiler reports nothing more about them.
//!
//! A plain generic function cannot do this: its bound fails, but its result keeps the leaf's type,
//! and every layer and every later use of the stack then fails again.

use crate::resource::MemoryResource;

/// The configurations under the names `resource_stack!`'s lines use.
#[path = "layer.rs"]
pub mod layer;

/// The leaf of a `resource_stack!`, before lookup picks one of the traits.
#[derive(Debug)]
pub struct Wrap<T>(pub T);

/// The leaf is a resource.
pub trait IsResource {
    /// The resource.
    type Resource;
    /// The leaf itself.
    fn into_leaf(self) -> Self::Resource;
}

impl<R: MemoryResource> IsResource for Wrap<R> {
    type Resource = R;
    #[inline(always)]
    fn into_leaf(self) -> R {
        self.0
    }
}

/// The leaf is a `Result`: a constructor without its `?`.
pub trait IsResult {
    /// The `Ok` type.
    type Ok;
    /// The `Ok` type, under a bound no type meets.
    fn into_leaf(self) -> Self::Ok
    where
        Self: ForgottenQuestionMark;
}

impl<R, E> IsResult for Wrap<Result<R, E>> {
    type Ok = R;
    fn into_leaf(self) -> R
    where
        Self: ForgottenQuestionMark,
    {
        self.unreachable()
    }
}

/// The leaf is neither a resource nor a `Result`.
pub trait IsNeither {
    /// The leaf's type.
    type Leaf;
    /// Any type, under a bound no type meets.
    fn into_leaf<R>(self) -> R
    where
        Self::Leaf: NotAResource;
}

impl<T> IsNeither for &Wrap<T> {
    type Leaf = T;
    fn into_leaf<R>(self) -> R
    where
        T: NotAResource,
    {
        <T as NotAResource>::unreachable()
    }
}

/// Implemented by no type: what makes a `Result` leaf an error, and the error's text.
#[diagnostic::on_unimplemented(
    message = "the leaf of this `resource_stack!` is a `Result`, not a memory resource: add `?`",
    label = "this returns a `Result`: add `?` to take the resource out of it",
    note = "a leaf constructor that returns a `Result` needs `?`: `resource_stack![Cuda::new(&ctx)?, …]`"
)]
pub trait ForgottenQuestionMark {
    /// Never called: no type implements the trait.
    fn unreachable<R>(self) -> R;
}

/// Implemented by no type: what makes any other leaf that is not a resource an error.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a memory resource, so it cannot be the leaf of this `resource_stack!`",
    label = "not a `MemoryResource`",
    note = "the first item of `resource_stack!` is the resource at the bottom of the stack: one of mrstack's leaves (`Cuda::new(&ctx)?`, `System::new()`, `&sim`, …) or a type of yours with an `unsafe impl MemoryResource`"
)]
pub trait NotAResource {
    /// Never called: no type implements the trait.
    fn unreachable<R>() -> R;
}
