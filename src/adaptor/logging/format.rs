//! The records of the log (`Record`, `Action`) and the numbers of their CSV lines, formatted
//! without `fmt`.

use crate::log_format;

/// One event, as the logging thread records it: no formatting on that thread.
#[derive(Debug, Clone, Copy)]
pub(super) struct Record {
    /// Ticks of the adaptor's [`Clock`], read under the slot's lock; never below the slot's
    /// previous record's, so that a thread's records keep their order in a stable sort.
    pub(super) stamp: u64,
    pub(super) thread: u64,
    pub(super) ptr: usize,
    pub(super) size: usize,
    pub(super) stream: u64,
    pub(super) action: Action,
}

/// What a line records (a byte in the record rather than the text: records stay 48 bytes).
#[derive(Debug, Clone, Copy)]
pub(super) enum Action {
    Allocate,
    AllocateFailure,
    Free,
}

impl Action {
    pub(super) fn text(self) -> &'static str {
        match self {
            Action::Allocate => log_format::ALLOCATE,
            Action::AllocateFailure => log_format::ALLOCATE_FAILURE,
            Action::Free => log_format::FREE,
        }
    }
}

/// `n` in decimal, in the tail of `buf`: two digits per division.
pub(super) fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
        2021222324252627282930313233343536373839\
        4041424344454647484950515253545556575859\
        6061626364656667686970717273747576777879\
        8081828384858687888990919293949596979899";
    let mut i = buf.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        buf[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        buf[i] = b'0' + n as u8;
    }
    &buf[i..]
}

/// `n` in lower-case hexadecimal, in the tail of `buf`.
pub(super) fn hex(mut n: u64, buf: &mut [u8; 16]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[i..];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decimal, hex};

    #[test]
    fn numbers_format_as_std_does() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            123_456_789,
            u64::MAX,
            u64::MAX - 1,
        ]
        .into_iter()
        .chain((0..2000).map(|i| i * 7919))
        {
            assert_eq!(decimal(n, &mut [0; 20]), n.to_string().as_bytes());
            assert_eq!(hex(n, &mut [0; 16]), format!("{n:x}").as_bytes());
        }
    }
}
