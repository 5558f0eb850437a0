//! Byte sizes as mrstack reads and writes them, in one place for the library, its text configs,
//! its `resource_stack!` macro and its command.
//!
//! A size is a whole number with an optional unit: `B`, `KB`/`MB`/`GB`/`TB` (powers of 1000) or
//! `KiB`/`MiB`/`GiB`/`TiB` (powers of 1024), with `_` allowed between digits and spaces allowed
//! before the unit. Sizes are shown in powers of 1024 with [`Bytes`].
//!
//! ```
//! use mrstack_units::{parse_size, Bytes};
//!
//! assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
//! assert_eq!(parse_size("1_000 MB"), Ok(1_000_000_000));
//! assert!(parse_size("1.5 GiB").unwrap_err().to_string().contains("whole number"));
//! assert_eq!(Bytes(3 << 30).to_string(), "3.00 GiB");
//! ```

use std::fmt;

/// The units a size may be written in, with the bytes each stands for.
pub const UNITS: [(&str, u64); 9] = [
    ("B", 1),
    ("KB", 1000),
    ("MB", 1000 * 1000),
    ("GB", 1000 * 1000 * 1000),
    ("TB", 1000 * 1000 * 1000 * 1000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// Why a size could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// No digits, or a fraction: `GiB`, `1.5 GiB`.
    NotWhole,
    /// A unit that is not one of [`UNITS`].
    UnknownUnit(String),
    /// More bytes than 64 bits hold.
    TooLarge,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NotWhole => {
                f.write_str("a size is a whole number of bytes or units, e.g. `512 MiB`")
            }
            SizeError::UnknownUnit(unit) => write!(
                f,
                "unknown size unit `{unit}`: use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
            ),
            SizeError::TooLarge => f.write_str("the size does not fit in 64 bits"),
        }
    }
}

impl std::error::Error for SizeError {}

/// The bytes in one `unit` (`""` is bytes), or `None` for a unit that is not one of [`UNITS`].
pub fn unit_scale(unit: &str) -> Option<u64> {
    if unit.is_empty() {
        return Some(1);
    }
    UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|&(_, n)| n)
}

/// The bytes in `digits` `unit`s, where `digits` may hold `_` separators (the macro gets the two
/// apart from a literal's suffix).
pub fn size_of(digits: &str, unit: &str) -> Result<u64, SizeError> {
    if !digits.starts_with(|c: char| c.is_ascii_digit())
        || !digits.chars().all(|c| c.is_ascii_digit() || c == '_')
    {
        return Err(SizeError::NotWhole);
    }
    let scale = match unit_scale(unit) {
        Some(scale) => scale,
        None if unit.starts_with('.') => return Err(SizeError::NotWhole),
        None => return Err(SizeError::UnknownUnit(unit.to_string())),
    };
    let n: u128 = digits
        .replace('_', "")
        .parse()
        .map_err(|_| SizeError::TooLarge)?;
    n.checked_mul(u128::from(scale))
        .and_then(|b| u64::try_from(b).ok())
        .ok_or(SizeError::TooLarge)
}

/// Reads a size written as text: `4096`, `64 KiB`, `1GiB`, `1_000 MB`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_'))
        .unwrap_or(text.len());
    size_of(&text[..end], text[end..].trim_start())
}

/// A number of bytes shown for people: `512 B`, `1.50 KiB`, `2.00 GiB` (powers of 1024, two
/// decimals above 1 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bytes(pub u64);

impl From<usize> for Bytes {
    fn from(n: usize) -> Self {
        Bytes(n as u64)
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return f.pad(&format!("{} B", self.0));
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < NAMES.len() {
            value /= 1024.0;
            unit += 1;
        }
        // `pad`, so that widths and alignment (`{:>12}`) apply as to a string.
        f.pad(&format!("{value:.2} {}", NAMES[unit]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_unit() {
        for (unit, scale) in UNITS {
            assert_eq!(parse_size(&format!("3 {unit}")), Ok(3 * scale));
            assert_eq!(parse_size(&format!("3{unit}")), Ok(3 * scale));
        }
        assert_eq!(parse_size(" 4_096 "), Ok(4096));
        assert_eq!(size_of("512", "MiB"), Ok(512 << 20));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        assert_eq!(parse_size("1.5GiB"), Err(SizeError::NotWhole));
        assert_eq!(parse_size("GiB"), Err(SizeError::NotWhole));
        assert_eq!(parse_size(""), Err(SizeError::NotWhole));
        assert_eq!(
            parse_size("1 gib"),
            Err(SizeError::UnknownUnit("gib".into()))
        );
        assert_eq!(parse_size("99999999999 TiB"), Err(SizeError::TooLarge));
        assert_eq!(
            parse_size("999999999999999999999999999999999999999999"),
            Err(SizeError::TooLarge)
        );
        assert!(SizeError::UnknownUnit("x".into())
            .to_string()
            .contains("KiB, MiB"));
    }

    #[test]
    fn shows_bytes_for_people() {
        assert_eq!(Bytes(0).to_string(), "0 B");
        assert_eq!(Bytes(1023).to_string(), "1023 B");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(3 << 30).to_string(), "3.00 GiB");
        assert_eq!(Bytes(u64::MAX).to_string(), "16384.00 PiB");
        assert_eq!(
            format!("{:>10}|{:<6}|", Bytes(1536), Bytes(7)),
            "  1.50 KiB|7 B   |"
        );
    }
}
