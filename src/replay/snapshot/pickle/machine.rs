//! The machine's stack, marks and memo, and the arguments its opcodes read from the pickle.

use super::{Id, Machine, Value, MAX_STACK};
use crate::replay::snapshot::error::error;
use crate::replay::snapshot::{SnapshotError, SnapshotErrorKind};

impl<'b> Machine<'b> {
    pub(super) fn fail(&self, what: impl Into<String>) -> SnapshotError {
        error(
            format!("byte {}", self.op_at),
            SnapshotErrorKind::Pickle(what.into()),
        )
    }

    pub(super) fn take(&mut self, n: u64) -> Result<&'b [u8], SnapshotError> {
        let left = self.bytes.len() - self.pos;
        match usize::try_from(n) {
            Ok(n) if n <= left => {
                let bytes: &'b [u8] = self.bytes;
                let s = &bytes[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(self.fail(format!(
                "a length of {n} bytes where {left} are left (a file cut short?)"
            ))),
        }
    }

    pub(super) fn uint(&mut self, n: u64) -> Result<u64, SnapshotError> {
        let b = self.take(n)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    pub(super) fn line(&mut self) -> Result<&'b [u8], SnapshotError> {
        let bytes: &'b [u8] = self.bytes;
        let rest = &bytes[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.pos += i + 1;
                Ok(&rest[..i])
            }
            None => Err(self.fail("a text argument without its end of line")),
        }
    }

    pub(super) fn push(&mut self, v: Value) -> Result<(), SnapshotError> {
        let id = Id::try_from(self.values.len())
            .map_err(|_| self.fail("more values than this reader holds"))?;
        self.values.push(v);
        self.push_id(id)
    }

    pub(super) fn push_id(&mut self, id: Id) -> Result<(), SnapshotError> {
        if self.stack.len() >= MAX_STACK {
            return Err(self.fail(format!("more than {MAX_STACK} values on the stack")));
        }
        self.stack.push(id);
        Ok(())
    }

    pub(super) fn pop(&mut self) -> Result<Id, SnapshotError> {
        match self.marks.last() {
            Some(&mark) if self.stack.len() <= mark => {
                Err(self.fail("a value taken from an empty stack (below a mark)"))
            }
            _ => self
                .stack
                .pop()
                .ok_or_else(|| self.fail("a value taken from an empty stack")),
        }
    }

    pub(super) fn top(&self) -> Result<Id, SnapshotError> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| self.fail("a value read from an empty stack"))
    }

    /// The values above the last mark, which is removed.
    pub(super) fn pop_mark(&mut self) -> Result<Vec<Id>, SnapshotError> {
        let mark = self
            .marks
            .pop()
            .ok_or_else(|| self.fail("no mark to take values up to"))?;
        Ok(self.stack.split_off(mark))
    }

    pub(super) fn str(&mut self, n: u64) -> Result<(), SnapshotError> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b)
            .map_err(|_| self.fail("a string that is not UTF-8"))?
            .into();
        self.push(Value::Str(s))
    }

    pub(super) fn bytes(&mut self, n: u64) -> Result<(), SnapshotError> {
        self.take(n)?;
        self.push(Value::Bytes)
    }

    /// A little-endian two's-complement integer of `n` bytes.
    pub(super) fn long(&mut self, n: u64) -> Result<(), SnapshotError> {
        let b = self.take(n)?;
        let value = if b.len() > 16 {
            // Larger than i128 unless its top bytes only extend the sign.
            let (low, high) = b.split_at(16);
            let sign = if low[15] & 0x80 != 0 { 0xff } else { 0 };
            if high.iter().all(|&x| x == sign) {
                Value::Int(le_int(low))
            } else {
                Value::BigInt
            }
        } else {
            Value::Int(le_int(b))
        };
        self.push(value)
    }

    pub(super) fn memo_put(&mut self, key: u64) -> Result<(), SnapshotError> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }

    pub(super) fn memo_get(&mut self, key: u64) -> Result<(), SnapshotError> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.fail(format!("memo key {key} was never stored")))?;
        self.push_id(id)
    }

    /// Appends `items` to the list (or set) `to`.
    pub(super) fn extend(&mut self, to: Id, items: Vec<Id>) -> Result<(), SnapshotError> {
        match &mut self.values[to as usize] {
            Value::List(v) | Value::Set(v) => {
                v.extend(items);
                Ok(())
            }
            // Appending to an object calls its methods: nothing here keeps it.
            Value::Object => Ok(()),
            other => {
                let kind = other.kind();
                Err(self.fail(format!("items appended to {kind}, not a list")))
            }
        }
    }

    pub(super) fn set_items(&mut self, to: Id, items: Vec<Id>) -> Result<(), SnapshotError> {
        if items.len() % 2 != 0 {
            return Err(self.fail("a dict's keys and values are not in pairs"));
        }
        match &mut self.values[to as usize] {
            Value::Dict(d) => {
                for pair in items.chunks_exact(2) {
                    d.push((pair[0], pair[1]));
                }
                Ok(())
            }
            Value::Object => Ok(()),
            other => {
                let kind = other.kind();
                Err(self.fail(format!("items set in {kind}, not a dict")))
            }
        }
    }

    pub(super) fn text_number(&mut self) -> Result<Value, SnapshotError> {
        let line = self.line()?;
        let text = std::str::from_utf8(line).unwrap_or("").trim();
        let text = text.strip_suffix('L').unwrap_or(text);
        match text {
            "00" => return Ok(Value::Bool(false)),
            "01" => return Ok(Value::Bool(true)),
            _ => {}
        }
        text.parse::<i128>()
            .map(Value::Int)
            .or_else(|_| text.parse::<f64>().map(|_| Value::Float))
            .map_err(|_| self.fail(format!("`{text}` is not a number")))
    }

    pub(super) fn push_empty_dict(&mut self) -> Result<Id, SnapshotError> {
        self.push(Value::Dict(Vec::new()))?;
        self.top()
    }

    /// The key of a memo opcode: one byte (BINPUT, BINGET), four (LONG_BINPUT, LONG_BINGET), or
    /// a text line (PUT, GET).
    pub(super) fn memo_key(&mut self, op: u8) -> Result<u64, SnapshotError> {
        match op {
            b'q' | b'h' => self.uint(1),
            b'r' | b'j' => self.uint(4),
            _ => {
                let line = self.line()?;
                let text = std::str::from_utf8(line).unwrap_or("").trim();
                text.parse()
                    .map_err(|_| self.fail(format!("memo key `{text}` is not a number")))
            }
        }
    }
}

/// A little-endian two's-complement integer of at most 16 bytes.
fn le_int(b: &[u8]) -> i128 {
    if b.is_empty() {
        return 0;
    }
    let negative = b[b.len() - 1] & 0x80 != 0;
    let mut full = [if negative { 0xff } else { 0 }; 16];
    full[..b.len()].copy_from_slice(b);
    i128::from_le_bytes(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_integers_read_as_two_s_complement() {
        assert_eq!(le_int(&[]), 0);
        assert_eq!(le_int(&[0xff]), -1);
        assert_eq!(le_int(&[0x00, 0x80]), -32768);
        assert_eq!(le_int(&[0xff, 0x00]), 255);
        let mut big = u64::MAX.to_le_bytes().to_vec();
        big.push(0);
        assert_eq!(le_int(&big), i128::from(u64::MAX));
    }
}
