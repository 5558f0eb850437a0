//! Byte sizes as mrstack reads and writes them, in one place for the library, its text configs,
//! its `resource_stack!` macro and its command: the macro's docs, the config docs and the
//! README's "Size literals" section point here.
//!
//! # The size convention
//!
//! A size is a number with an optional unit, with spaces allowed before the unit:
//!
//! * **Units.** `B`; `KB`, `MB`, `GB`, `TB`; `KiB`, `MiB`, `GiB`, `TiB`. Both spellings are
//!   powers of 1024: `KB` = `KiB` = 2^10 bytes, `MB` = `MiB` = 2^20, `GB` = `GiB` = 2^30,
//!   `TB` = `TiB` = 2^40. This is how Holoscan reads its `"512MB"` sizes and how PyTorch reads its
//!   `_mb` settings, so a size copied from either means the same here. No unit means bytes. Units
//!   are case-sensitive (`gib` is refused, so that `mb` is never taken for millibits or for
//!   a typo of `MB`).
//! * **Numbers.** Digits with `_` allowed between them (`1_024`), and an optional decimal part
//!   (`1.5`). A decimal size is truncated to whole bytes, as Holoscan does: `1.5GB` is
//!   1.5 · 2^30 bytes, `0.3 KiB` is 307 bytes (307.2 truncated). The result is exact (no floating
//!   point). A number starts with a digit: `.5 GiB`, `1.` and `-1 GiB` are refused.
//! * **Range.** At most `u64::MAX` bytes; more is an error, never a wrap.
//!
//! Sizes are shown in powers of 1024 with [`Bytes`] (`1.50 GiB`), and exactly, in a form
//! [`parse_size`] reads back, with [`ExactBytes`] (`1536 MiB`).
//!
//! ```
//! use mrstack_units::{parse_size, Bytes};
//!
//! assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
//! assert_eq!(parse_size("512MB"), Ok(512 << 20));
//! assert_eq!(parse_size("1.5GB"), Ok(3 << 29));
//! assert_eq!(parse_size("1_000 KB"), Ok(1_024_000));
//! assert!(parse_size("1,5 GiB").unwrap_err().to_string().contains("`1.5 GiB`"));
//! assert_eq!(Bytes(3 << 30).to_string(), "3.00 GiB");
//! ```

use std::fmt;

/// The units a size may be written in, with the bytes each stands for (see the crate docs: `KB`
/// and `KiB` both mean 1024 bytes).
pub const UNITS: [(&str, u64); 9] = [
    ("B", 1),
    ("KB", 1 << 10),
    ("MB", 1 << 20),
    ("GB", 1 << 30),
    ("TB", 1 << 40),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
];

/// Why a size could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeError {
    /// No number, or not one of the forms `12`, `1_024`, `1.5`: `GiB`, `.5 GiB`, `1,5 GiB`.
    NotANumber,
    /// A unit that is not one of [`UNITS`].
    UnknownUnit(String),
    /// More bytes than 64 bits hold.
    TooLarge,
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NotANumber => f.write_str(
                "a size is a number and an optional unit, e.g. `512 MiB`, `1.5 GiB` or `4096`",
            ),
            SizeError::UnknownUnit(unit) => write!(
                f,
                "unknown size unit `{unit}`: use B, KB/KiB, MB/MiB, GB/GiB or TB/TiB (all powers of 1024)"
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

/// `digits` with its `_` separators, if it is one or more ASCII digits and `_`s starting with a
/// digit.
fn digits_of(digits: &str) -> Option<impl Iterator<Item = u8> + '_> {
    let ok = digits.starts_with(|c: char| c.is_ascii_digit())
        && digits.bytes().all(|c| c.is_ascii_digit() || c == b'_');
    ok.then(|| digits.bytes().filter(u8::is_ascii_digit).map(|c| c - b'0'))
}

/// `floor(0.fraction × 2^shift)`, exactly. `n / 2^shift` has at most `shift` decimals, so the
/// first `shift` digits of the fraction decide the floor; the rest are dropped. Long division by
/// `5^shift` (`2^shift / 10^shift = 1 / 5^shift`), so nothing overflows: `shift` ≤ 63 and the
/// remainder stays below `10 · 5^63` < 2^128.
fn fraction_bytes(fraction: impl Iterator<Item = u8>, shift: u32) -> u128 {
    let divisor = 5u128.pow(shift);
    let (mut quotient, mut remainder) = (0u128, 0u128);
    for digit in fraction.chain(std::iter::repeat(0)).take(shift as usize) {
        remainder = remainder * 10 + u128::from(digit);
        quotient = quotient * 10 + remainder / divisor;
        remainder %= divisor;
    }
    quotient
}

/// The bytes in `number` `unit`s (the macro gets the two apart from a literal and its suffix):
/// `number` is digits with `_` separators and an optional decimal part, `unit` one of [`UNITS`]
/// or `""`. See the crate docs for the convention.
pub fn size_of(number: &str, unit: &str) -> Result<u64, SizeError> {
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number, None),
    };
    let whole = digits_of(whole).ok_or(SizeError::NotANumber)?;
    let fraction = match fraction {
        Some(f) => Some(digits_of(f).ok_or(SizeError::NotANumber)?),
        None => None,
    };
    let scale = match unit_scale(unit) {
        Some(scale) => scale,
        // `1,5 GiB`, `1e3`: no unit starts so; the number is what is wrong.
        None if !unit.starts_with(|c: char| c.is_ascii_alphabetic()) => {
            return Err(SizeError::NotANumber)
        }
        None => return Err(SizeError::UnknownUnit(unit.to_string())),
    };
    let mut bytes = 0u128;
    for digit in whole {
        bytes = bytes * 10 + u128::from(digit);
        if bytes > u128::from(u64::MAX) {
            return Err(SizeError::TooLarge);
        }
    }
    bytes *= u128::from(scale);
    if let Some(fraction) = fraction {
        bytes += fraction_bytes(fraction, scale.trailing_zeros());
    }
    u64::try_from(bytes).map_err(|_| SizeError::TooLarge)
}

/// Reads a size written as text: `4096`, `64 KiB`, `1GiB`, `512MB`, `1.5 GB`, `1_000 MiB`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '_' || c == '.'))
        .unwrap_or(text.len());
    size_of(&text[..end], text[end..].trim_start())
}

/// A number of bytes shown for people: `512 B`, `1.50 KiB`, `2.00 GiB` (powers of 1024, two
/// decimals above 1 KiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bytes(pub u64);

/// `From<usize>` for the byte counts: a `usize` fits a `u64` on every target Rust supports.
macro_rules! from_usize {
    ($($T:ident),*) => {$(
        impl From<usize> for $T {
            fn from(n: usize) -> Self {
                $T(n as u64)
            }
        }
    )*};
}
from_usize!(Bytes, ExactBytes);

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

/// A number of bytes written exactly, in the largest unit that divides it: `1 GiB`, `1536 MiB`,
/// `256 B`, `1000 B`. [`parse_size`] reads it back to the same number, so a description written
/// with it (a stack's `pool(initial=1 GiB)`) builds the same configuration again; [`Bytes`] rounds
/// to two decimals for people instead.
///
/// ```
/// use mrstack_units::{parse_size, ExactBytes};
///
/// assert_eq!(ExactBytes(3 << 29).to_string(), "1536 MiB");
/// assert_eq!(ExactBytes(1000).to_string(), "1000 B");
/// assert_eq!(parse_size(&ExactBytes(u64::MAX).to_string()), Ok(u64::MAX));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ExactBytes(pub u64);

impl fmt::Display for ExactBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Largest first; zero divides by every unit but reads best as bytes.
        const EXACT: [(&str, u64); 4] = [
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ];
        let n = self.0;
        match EXACT.iter().find(|&&(_, scale)| n != 0 && n % scale == 0) {
            Some(&(unit, scale)) => write!(f, "{} {unit}", n / scale),
            None => write!(f, "{n} B"),
        }
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
    fn both_spellings_are_powers_of_1024() {
        for (si, iec) in [("KB", "KiB"), ("MB", "MiB"), ("GB", "GiB"), ("TB", "TiB")] {
            assert_eq!(unit_scale(si), unit_scale(iec));
        }
        assert_eq!(parse_size("512MB"), Ok(512 << 20));
        assert_eq!(parse_size("1 KB"), Ok(1024));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
    }

    #[test]
    fn decimals_are_truncated_to_whole_bytes() {
        assert_eq!(parse_size("1.5GB"), Ok(3 << 29));
        assert_eq!(parse_size("0.5 KiB"), Ok(512));
        // 0.3 KiB = 307.2 bytes.
        assert_eq!(parse_size("0.3 KiB"), Ok(307));
        assert_eq!(parse_size("2.75 MB"), Ok(2_883_584));
        assert_eq!(parse_size("1.9"), Ok(1));
        assert_eq!(parse_size("1.0 B"), Ok(1));
        assert_eq!(parse_size("1_024.25 KiB"), Ok(1_048_832));
        // One byte short of 1 TiB: 1 - 2^-40, written out (40 decimals), and then some.
        assert_eq!(
            parse_size("0.9999999999990905052982270717620849609375 TiB"),
            Ok((1 << 40) - 1)
        );
        assert_eq!(
            parse_size("0.99999999999909050529822707176208496093749999 TiB"),
            Ok((1 << 40) - 2)
        );
        // A fraction of any length is read exactly and dropped beyond what decides the floor.
        let long = format!("1.{} GiB", "9".repeat(10_000));
        assert_eq!(parse_size(&long), Ok((2 << 30) - 1));
        // The largest sizes, with a fraction that does not reach the next byte (0.99999999 · 2^40
        // = 1_099_511_616_780.88…).
        assert_eq!(parse_size("18446744073709551615.99"), Ok(u64::MAX));
        assert_eq!(
            parse_size("16777215.99999999 TiB"),
            Ok((16_777_215 << 40) + 1_099_511_616_780)
        );
        assert_eq!(parse_size("16777216 TiB"), Err(SizeError::TooLarge));
    }

    #[test]
    fn exact_sizes_read_back() {
        let cases = [
            (0, "0 B"),
            (1, "1 B"),
            (256, "256 B"),
            (1000, "1000 B"),
            (1024, "1 KiB"),
            (3 << 29, "1536 MiB"),
            (1 << 30, "1 GiB"),
            (5 << 40, "5 TiB"),
            ((1 << 40) + 1, "1099511627777 B"),
        ];
        for (n, text) in cases {
            assert_eq!(ExactBytes(n).to_string(), text);
            assert_eq!(parse_size(text), Ok(n));
        }
        // Every shift and its neighbours, up to the largest size.
        for shift in 0..64 {
            for n in [
                (1u64 << shift) - 1,
                1 << shift,
                (1 << shift) + 1,
                3 << shift.min(62),
            ] {
                assert_eq!(parse_size(&ExactBytes(n).to_string()), Ok(n), "{n}");
            }
        }
        assert_eq!(parse_size(&ExactBytes(u64::MAX).to_string()), Ok(u64::MAX));
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for text in [
            "GiB", "", ".5 GiB", "1.", "1. GiB", "1.5.3 MB", "-1 GiB", "1,5 GiB", "1._5",
        ] {
            assert_eq!(parse_size(text), Err(SizeError::NotANumber), "{text:?}");
        }
        assert_eq!(
            parse_size("1 gib"),
            Err(SizeError::UnknownUnit("gib".into()))
        );
        assert_eq!(
            parse_size("1.5 GiBs"),
            Err(SizeError::UnknownUnit("GiBs".into()))
        );
        assert_eq!(parse_size("99999999999 TiB"), Err(SizeError::TooLarge));
        assert_eq!(
            parse_size("999999999999999999999999999999999999999999"),
            Err(SizeError::TooLarge)
        );
        assert!(SizeError::UnknownUnit("x".into())
            .to_string()
            .contains("MB/MiB"));
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
