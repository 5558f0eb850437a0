//! The opcodes the machine runs: plain data is built, class references and objects are kept
//! opaque, and the rest are refused by name.

use super::{Id, Machine, Value};
use crate::replay::snapshot::error::error;
use crate::replay::snapshot::{SnapshotError, SnapshotErrorKind};

impl Machine<'_> {
    /// Runs the pickle's opcodes up to its STOP and returns the value STOP takes.
    pub(super) fn run(&mut self) -> Result<Id, SnapshotError> {
        loop {
            self.op_at = self.pos;
            let op = *self
                .bytes
                .get(self.pos)
                .ok_or_else(|| self.fail("the pickle ends before its STOP opcode"))?;
            self.pos += 1;
            match op {
                // PROTO
                0x80 => {
                    self.take(1)?;
                }
                // FRAME: a length hint only.
                0x95 => {
                    self.take(8)?;
                }
                // STOP
                b'.' => return self.pop(),
                // MARK
                b'(' => self.marks.push(self.stack.len()),
                // POP
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.marks.pop();
                    } else {
                        self.pop()?;
                    }
                }
                // POP_MARK
                b'1' => {
                    self.pop_mark()?;
                }
                // DUP
                b'2' => {
                    let top = self.top()?;
                    self.push_id(top)?;
                }
                // NONE, NEWTRUE, NEWFALSE
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                // BININT, BININT1, BININT2
                b'J' => {
                    let v = self.uint(4)? as u32 as i32;
                    self.push(Value::Int(i128::from(v)))?;
                }
                b'K' => {
                    let v = self.uint(1)?;
                    self.push(Value::Int(i128::from(v)))?;
                }
                b'M' => {
                    let v = self.uint(2)?;
                    self.push(Value::Int(i128::from(v)))?;
                }
                // LONG1, LONG4
                0x8a => {
                    let n = self.uint(1)?;
                    self.long(n)?;
                }
                0x8b => {
                    let n = self.uint(4)?;
                    if n & 0x8000_0000 != 0 {
                        return Err(self.fail("a negative LONG4 length"));
                    }
                    self.long(n)?;
                }
                // INT, LONG (text)
                b'I' | b'L' => {
                    let v = self.text_number()?;
                    self.push(v)?;
                }
                // BINFLOAT, FLOAT
                b'G' => {
                    self.take(8)?;
                    self.push(Value::Float)?;
                }
                b'F' => {
                    self.line()?;
                    self.push(Value::Float)?;
                }
                // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
                0x8c => {
                    let n = self.uint(1)?;
                    self.str(n)?;
                }
                b'X' => {
                    let n = self.uint(4)?;
                    self.str(n)?;
                }
                0x8d => {
                    let n = self.uint(8)?;
                    self.str(n)?;
                }
                // UNICODE (raw-unicode-escape text): kept as its text.
                b'V' => {
                    let line = self.line()?;
                    let s = String::from_utf8_lossy(line).into_owned().into_boxed_str();
                    self.push(Value::Str(s))?;
                }
                // SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8, SHORT_BINSTRING, BINSTRING
                b'C' | b'U' => {
                    let n = self.uint(1)?;
                    self.bytes(n)?;
                }
                b'B' | b'T' => {
                    let n = self.uint(4)?;
                    self.bytes(n)?;
                }
                0x8e | 0x96 => {
                    let n = self.uint(8)?;
                    self.bytes(n)?;
                }
                // STRING (quoted text)
                b'S' => {
                    self.line()?;
                    self.push(Value::Bytes)?;
                }
                // EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE, EMPTY_SET
                b']' => self.push(Value::List(Vec::new()))?,
                b'}' => self.push(Value::Dict(Vec::new()))?,
                b')' => self.push(Value::Tuple(Vec::new()))?,
                0x8f => self.push(Value::Set(Vec::new()))?,
                // LIST, TUPLE, DICT, FROZENSET: from the values above the mark.
                b'l' => {
                    let items = self.pop_mark()?;
                    self.push(Value::List(items))?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items))?;
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let dict = self.push_empty_dict()?;
                    self.set_items(dict, items)?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.push(Value::Set(items))?;
                }
                // TUPLE1, TUPLE2, TUPLE3
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = vec![0; n];
                    for slot in items.iter_mut().rev() {
                        *slot = self.pop()?;
                    }
                    self.push(Value::Tuple(items))?;
                }
                // APPEND, APPENDS, ADDITEMS
                b'a' => {
                    let item = self.pop()?;
                    let list = self.top()?;
                    self.extend(list, vec![item])?;
                }
                b'e' | 0x90 => {
                    let items = self.pop_mark()?;
                    let list = self.top()?;
                    self.extend(list, items)?;
                }
                // SETITEM, SETITEMS
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let dict = self.top()?;
                    self.set_items(dict, vec![key, value])?;
                }
                b'u' => {
                    let items = self.pop_mark()?;
                    let dict = self.top()?;
                    self.set_items(dict, items)?;
                }
                // MEMOIZE, BINPUT, LONG_BINPUT, PUT
                0x94 => {
                    let key = self.memo.len() as u64;
                    self.memo_put(key)?;
                }
                b'q' | b'r' | b'p' => {
                    let key = self.memo_key(op)?;
                    self.memo_put(key)?;
                }
                // BINGET, LONG_BINGET, GET
                b'h' | b'j' | b'g' => {
                    let key = self.memo_key(op)?;
                    self.memo_get(key)?;
                }
                // GLOBAL (two text lines), STACK_GLOBAL: a class reference.
                b'c' => {
                    self.line()?;
                    self.line()?;
                    self.push(Value::Object)?;
                }
                0x93 => {
                    self.pop()?;
                    self.pop()?;
                    self.push(Value::Object)?;
                }
                // REDUCE, NEWOBJ: a callable and its arguments make an object.
                b'R' | 0x81 => {
                    self.pop()?;
                    self.pop()?;
                    self.push(Value::Object)?;
                }
                // NEWOBJ_EX: a class, its arguments and keyword arguments.
                0x92 => {
                    self.pop()?;
                    self.pop()?;
                    self.pop()?;
                    self.push(Value::Object)?;
                }
                // BUILD: sets an object's state; the object stays.
                b'b' => {
                    self.pop()?;
                    self.top()?;
                }
                // INST (two text lines, arguments above a mark), OBJ (class and arguments
                // above a mark).
                b'i' => {
                    self.line()?;
                    self.line()?;
                    self.pop_mark()?;
                    self.push(Value::Object)?;
                }
                b'o' => {
                    self.pop_mark()?;
                    self.push(Value::Object)?;
                }
                _ => {
                    return Err(error(
                        format!("byte {}", self.op_at),
                        SnapshotErrorKind::Unsupported {
                            opcode: op,
                            name: unsupported_name(op),
                        },
                    ))
                }
            }
        }
    }
}

/// The name of an opcode [`Machine::run`] does not run, or "unknown".
fn unsupported_name(op: u8) -> &'static str {
    match op {
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}
