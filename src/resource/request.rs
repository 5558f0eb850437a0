//! The checks every request goes through first, and the arithmetic they share.

use super::{AllocError, AllocErrorKind, MemoryResource, Result};
use std::ptr::NonNull;
use typenum::Unsigned;

/// Checks a request against the rules of [`MemoryResource`]: `Ok(Some(ptr))` for a zero-size
/// request (a dangling pointer, aligned, that the resource returns without further work),
/// `Ok(None)` for a request to serve, `Err` for an alignment that is not a power of two or a size
/// that overflows once rounded up to the alignment.
#[inline]
pub fn check_request<R: MemoryResource + ?Sized>(
    size: usize,
    align: usize,
    resource: &'static str,
) -> Result<Option<NonNull<u8>>, AllocError> {
    if !align.is_power_of_two() {
        return Err(AllocError::new(
            AllocErrorKind::InvalidArgument("alignment is not a power of two"),
            size,
            align,
            resource,
        ));
    }
    let align = align.max(<R::Alignment as Unsigned>::USIZE);
    if size > isize::MAX as usize - (align - 1) {
        return Err(AllocError::new(
            AllocErrorKind::InvalidArgument("size overflows isize::MAX once aligned"),
            size,
            align,
            resource,
        ));
    }
    if size == 0 {
        return Ok(Some(dangling(align)));
    }
    Ok(None)
}

/// The pointer a zero-size allocation returns: non-null, aligned to `align`, never dereferenced.
#[inline]
pub fn dangling(align: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::without_provenance_mut(align)).unwrap_or(NonNull::dangling())
}

/// Rounds `n` up to a multiple of `align` (a power of two), or `None` on overflow.
#[inline]
pub const fn align_up(n: usize, align: usize) -> Option<usize> {
    match n.checked_add(align - 1) {
        Some(v) => Some(v & !(align - 1)),
        None => None,
    }
}
