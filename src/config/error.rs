//! What can be wrong with a text configuration, and where.

use crate::property::Properties;
use crate::resource::AllocError;
use crate::units::Bytes;

/// What is wrong with a configuration; [`ConfigError`] adds where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// Nothing but white space.
    #[error(
        "empty configuration: expected a resource such as `cuda` or `simulated(capacity=1GiB)`"
    )]
    Empty,
    /// The text does not follow the grammar here.
    #[error("expected {expected}, found {}", found.map_or("the end of the text".to_string(), |c| format!("`{c}`")))]
    Expected {
        /// What would have been right.
        expected: String,
        /// What is there (`None`: the end of the text).
        found: Option<char>,
    },
    /// A `"` that is never closed.
    #[error("a quoted value is not closed with `\"`")]
    UnterminatedString,
    /// A field given twice in one item.
    #[error("`{item}` has the field `{field}` twice")]
    DuplicateField {
        /// The item.
        item: String,
        /// The field.
        field: String,
    },
    /// A name that is neither a leaf nor a registered adaptor.
    #[error("unknown resource or adaptor `{name}`; known: {known}")]
    Unknown {
        /// The name written.
        name: String,
        /// The names this builder knows, comma-separated.
        known: String,
    },
    /// A leaf resource after the first item.
    #[error("`{name}` is a leaf resource: only the first item may be one (items wrap the one before, as in `cuda > statistics`)")]
    LeafNotFirst {
        /// The leaf's name.
        name: String,
    },
    /// An adaptor as the first item.
    #[error("`{name}` is an adaptor: it needs a leaf resource before it, as in `cuda > {name}`")]
    AdaptorFirst {
        /// The adaptor's name.
        name: String,
    },
    /// A field the item does not take.
    #[error("`{item}` has no field `{field}`; it takes {}", if known.is_empty() { "none" } else { known })]
    UnknownField {
        /// The item.
        item: String,
        /// The field written.
        field: String,
        /// The fields it takes, comma-separated.
        known: String,
    },
    /// A field the item needs and does not have.
    #[error("`{item}` needs the field `{field}`")]
    MissingField {
        /// The item.
        item: String,
        /// The field.
        field: String,
    },
    /// A value that is not a size.
    #[error("bad size `{value}` for `{item}.{field}`: {reason}")]
    BadSize {
        /// The item.
        item: String,
        /// The field.
        field: String,
        /// The value written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A value that is not what the field takes (a whole number, one of a few choices).
    #[error("bad value `{value}` for `{item}.{field}`: expected {expected}")]
    BadValue {
        /// The item.
        item: String,
        /// The field.
        field: String,
        /// The value written.
        value: String,
        /// What the field takes.
        expected: String,
    },
    /// An item whose memory lacks a property the stack must give.
    #[error("`{item}` gives {gives} memory, but the stack must give {wants}")]
    Properties {
        /// The item.
        item: String,
        /// What it gives.
        gives: Properties,
        /// What the stack's `P` asks for.
        wants: Properties,
    },
    /// Two fields of an item that contradict each other, as `pool(initial=2MiB, max=1MiB)`.
    #[error("`{item}.{low}` ({}) is above `{item}.{high}` ({})", Bytes(*low_value as u64), Bytes(*high_value as u64))]
    Contradiction {
        /// The item.
        item: String,
        /// The field that may not be above the other.
        low: String,
        /// Its value in bytes, given or defaulted.
        low_value: usize,
        /// The other field.
        high: String,
        /// Its value in bytes, given or defaulted.
        high_value: usize,
    },
    /// More items than [`MAX_ITEMS`](super::MAX_ITEMS): each layer adds a virtual call to every
    /// operation, and a very deep stack would overflow the thread's stack.
    #[error("a stack has at most {limit} items (the leaf and {} adaptors); this is item {}", limit - 1, limit + 1)]
    TooDeep {
        /// The most items a stack may have.
        limit: usize,
    },
    /// Building the item failed (no driver, no such device, out of memory).
    #[error("`{item}` could not be built: {error}")]
    Resource {
        /// The item.
        item: String,
        /// Why.
        error: AllocError,
    },
}

/// A configuration error at a column of the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("column {}: {kind}", .position + 1)]
pub struct ConfigError {
    /// What is wrong.
    pub kind: ConfigErrorKind,
    /// Where, as a column counted from 0 in characters.
    pub position: usize,
}

impl ConfigError {
    /// An error of `kind` at column `position` (from 0).
    pub fn new(kind: ConfigErrorKind, position: usize) -> Self {
        ConfigError { kind, position }
    }
}
