//! Byte sizes: how text configs, the macro and reports read and show them (the `mrstack-units`
//! crate, whose docs state the convention: `KB` = `KiB` = 1024 bytes, decimals truncated).

pub use mrstack_units::{parse_size, size_of, unit_scale, Bytes, ExactBytes, SizeError, UNITS};
