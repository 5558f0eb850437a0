//! A pickle reader for plain data: the values a pickle builds, and the machine that runs its
//! opcodes to build them.

mod machine;
mod opcodes;

use super::error::error;
use super::{SnapshotError, SnapshotErrorKind, PICKLE_MAGIC};

/// A value's index in [`Values`].
pub(super) type Id = u32;

/// A value the pickle builds. Containers hold the ids of their items, so that the memo and the
/// containers share values without reference counts, and no value is dropped recursively.
#[derive(Debug)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i128),
    /// An integer outside i128.
    BigInt,
    Float,
    Str(Box<str>),
    Bytes,
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    /// A class reference, or an object built from one.
    Object,
}

impl Value {
    /// What the value is, for an error.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::BigInt => "an integer",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Bytes => "bytes",
            Value::List(_) => "a list",
            Value::Tuple(_) => "a tuple",
            Value::Dict(_) => "a dict",
            Value::Set(_) => "a set",
            Value::Object => "an object",
        }
    }
}

/// Every value a pickle built, and the one it returned.
#[derive(Debug)]
pub(super) struct Values {
    values: Vec<Value>,
    root: Id,
}

impl Values {
    pub(super) fn root(&self) -> Id {
        self.root
    }

    pub(super) fn get(&self, id: Id) -> &Value {
        // Ids come from `push`, which made each one's value.
        &self.values[id as usize]
    }

    pub(super) fn str(&self, id: Id) -> Option<&str> {
        match self.get(id) {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// The most values on the stack at once: far more than plain data nests (the pickler batches
/// a container's items in thousands), and a bound on what a pickle can make wait there.
const MAX_STACK: usize = 1 << 20;

struct Machine<'b> {
    bytes: &'b [u8],
    pos: usize,
    /// Where the opcode being run starts, for errors.
    op_at: usize,
    values: Vec<Value>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: std::collections::HashMap<u64, Id>,
}

/// Runs the pickle in `bytes` and returns what it built.
pub(super) fn load(bytes: &[u8]) -> Result<Values, SnapshotError> {
    match bytes.first() {
        None => return Err(error("", SnapshotErrorKind::Pickle("empty input".into()))),
        Some(&b) if b != PICKLE_MAGIC => {
            return Err(error("byte 0", SnapshotErrorKind::NotPickle(b)))
        }
        Some(_) => {}
    }
    let mut m = Machine {
        bytes,
        pos: 0,
        op_at: 0,
        values: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: std::collections::HashMap::new(),
    };
    let root = m.run()?;
    Ok(Values {
        values: m.values,
        root,
    })
}
