//! A small, safe reader for the pickles `torch.save` writes (protocol 2, also the common opcodes of
//! protocols 3–5). It never executes anything: a `GLOBAL` becomes a name, and a `REDUCE` of a name
//! this module knows (`collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`,
//! `torch._utils._rebuild_parameter`, `_codecs.encode`, numpy scalars) builds the corresponding value;
//! any other call is kept as an opaque [`Value::Call`].
//!
//! Objects live in an arena so that pickle's memo semantics hold: a container memoised before it is
//! filled (`EMPTY_DICT`, `BINPUT`, … `SETITEMS`) is the same object when fetched back with `BINGET`.

mod ops;

/// Errors from unpickling.
#[derive(Debug, thiserror::Error)]
pub enum PickleError {
    /// The stream ended inside an opcode.
    #[error("pickle truncated at byte {0}")]
    Truncated(usize),
    /// An opcode this reader does not implement.
    #[error("unsupported pickle opcode 0x{op:02x} at byte {at}")]
    Opcode {
        /// The opcode byte.
        op: u8,
        /// Its offset.
        at: usize,
    },
    /// The stream is structurally wrong (stack underflow, bad memo index, …).
    #[error("malformed pickle at byte {at}: {what}")]
    Malformed {
        /// Offset of the opcode.
        at: usize,
        /// What went wrong.
        what: String,
    },
}

/// Element type of a torch storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageDtype {
    /// `torch.FloatStorage`.
    F32,
    /// `torch.DoubleStorage`.
    F64,
    /// `torch.HalfStorage`.
    F16,
    /// `torch.BFloat16Storage`.
    BF16,
    /// `torch.LongStorage`.
    I64,
    /// `torch.IntStorage`.
    I32,
    /// `torch.BoolStorage`.
    Bool,
    /// `torch.ByteStorage`.
    U8,
}

impl StorageDtype {
    fn from_class(name: &str) -> Option<Self> {
        Some(match name {
            "FloatStorage" => StorageDtype::F32,
            "DoubleStorage" => StorageDtype::F64,
            "HalfStorage" => StorageDtype::F16,
            "BFloat16Storage" => StorageDtype::BF16,
            "LongStorage" => StorageDtype::I64,
            "IntStorage" => StorageDtype::I32,
            "BoolStorage" => StorageDtype::Bool,
            "ByteStorage" => StorageDtype::U8,
            _ => return None,
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            StorageDtype::F64 | StorageDtype::I64 => 8,
            StorageDtype::F32 | StorageDtype::I32 => 4,
            StorageDtype::F16 | StorageDtype::BF16 => 2,
            StorageDtype::Bool | StorageDtype::U8 => 1,
        }
    }
}

/// A reference to a tensor stored in the archive.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRef {
    /// Storage element type.
    pub dtype: StorageDtype,
    /// Storage key: the archive entry is `<archive>/data/<key>`.
    pub key: String,
    /// Offset into the storage, in elements.
    pub offset: usize,
    /// Shape.
    pub shape: Vec<usize>,
    /// Strides, in elements.
    pub stride: Vec<usize>,
}

/// An unpickled value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `bool`.
    Bool(bool),
    /// `int` (within i64).
    Int(i64),
    /// `float`.
    Float(f64),
    /// `str`.
    Str(String),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// `list`.
    List(Vec<Value>),
    /// `tuple`.
    Tuple(Vec<Value>),
    /// `dict` / `OrderedDict`, in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A global name (`module.name`) that was not called.
    Global(String),
    /// A torch tensor.
    Tensor(TensorRef),
    /// A call of an unknown global, kept as data.
    Call(String, Vec<Value>),
}

impl Value {
    /// Look up a string key in a dict.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value as plain JSON (tensors and calls become descriptive strings).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::None => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.clone()),
            Value::Bytes(b) => J::String(hex::encode(b)),
            Value::List(v) | Value::Tuple(v) => J::Array(v.iter().map(Value::to_json).collect()),
            Value::Dict(items) => {
                let mut m = serde_json::Map::new();
                for (k, v) in items {
                    let key = match k {
                        Value::Str(s) => s.clone(),
                        other => other.to_json().to_string(),
                    };
                    m.insert(key, v.to_json());
                }
                J::Object(m)
            }
            Value::Global(g) => J::String(g.clone()),
            Value::Tensor(t) => J::String(format!("tensor{:?}", t.shape)),
            Value::Call(f, args) => J::String(format!(
                "{f}({})",
                args.iter()
                    .map(|a| a.to_json().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

/// Arena node: containers are mutable in place.
#[derive(Debug, Clone)]
enum Node {
    Leaf(Value),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Storage { dtype: StorageDtype, key: String },
    Global(String),
    Call(String, usize),
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Mark,
    Obj(usize),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    at: usize,
    arena: Vec<Node>,
    stack: Vec<Slot>,
    memo: std::collections::HashMap<u32, usize>,
    /// Nodes `resolve` may still produce: shared references could otherwise expand exponentially.
    budget: std::cell::Cell<usize>,
}

/// Unpickle a byte stream.
pub fn load(data: &[u8]) -> Result<Value, PickleError> {
    let mut m = Machine {
        data,
        pos: 0,
        at: 0,
        arena: Vec::new(),
        stack: Vec::new(),
        memo: std::collections::HashMap::new(),
        budget: std::cell::Cell::new(1 << 22),
    };
    let root = m.run()?;
    m.resolve(root, 0)
}

impl<'a> Machine<'a> {
    fn malformed(&self, what: impl Into<String>) -> PickleError {
        PickleError::Malformed {
            at: self.at,
            what: what.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or(PickleError::Truncated(self.pos))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, PickleError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, PickleError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, PickleError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn line(&mut self) -> Result<String, PickleError> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(PickleError::Truncated(self.pos))?;
        let s = String::from_utf8_lossy(&rest[..n]).into_owned();
        self.pos += n + 1;
        Ok(s)
    }

    fn utf8(&mut self, n: usize) -> Result<String, PickleError> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| self.malformed("invalid UTF-8 string"))
    }

    fn new_node(&mut self, n: Node) -> usize {
        self.arena.push(n);
        self.arena.len() - 1
    }

    fn push(&mut self, n: Node) {
        let id = self.new_node(n);
        self.stack.push(Slot::Obj(id));
    }

    fn pop(&mut self) -> Result<usize, PickleError> {
        match self.stack.pop() {
            Some(Slot::Obj(id)) => Ok(id),
            Some(Slot::Mark) => Err(self.malformed("unexpected MARK")),
            None => Err(self.malformed("stack underflow")),
        }
    }

    fn top(&self) -> Result<usize, PickleError> {
        match self.stack.last() {
            Some(Slot::Obj(id)) => Ok(*id),
            _ => Err(self.malformed("no object on the stack")),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<usize>, PickleError> {
        let mut items = Vec::new();
        loop {
            match self.stack.pop() {
                Some(Slot::Obj(id)) => items.push(id),
                Some(Slot::Mark) => break,
                None => return Err(self.malformed("MARK not found")),
            }
        }
        items.reverse();
        Ok(items)
    }

    fn memo_put(&mut self, key: u32) -> Result<(), PickleError> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), PickleError> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| self.malformed(format!("memo {key} not set")))?;
        self.stack.push(Slot::Obj(id));
        Ok(())
    }

    fn leaf(&self, id: usize) -> Option<&Value> {
        match &self.arena[id] {
            Node::Leaf(v) => Some(v),
            _ => None,
        }
    }

    fn as_str(&self, id: usize) -> Option<&str> {
        match self.leaf(id) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }

    fn as_usize(&self, id: usize) -> Result<usize, PickleError> {
        match self.leaf(id) {
            Some(Value::Int(i)) => usize::try_from(*i).map_err(|_| self.malformed("negative size")),
            _ => Err(self.malformed("expected an int")),
        }
    }

    fn tuple_items(&self, id: usize) -> Result<Vec<usize>, PickleError> {
        match &self.arena[id] {
            Node::Tuple(v) | Node::List(v) => Ok(v.clone()),
            _ => Err(self.malformed("expected a tuple")),
        }
    }

    fn usize_tuple(&self, id: usize) -> Result<Vec<usize>, PickleError> {
        self.tuple_items(id)?
            .into_iter()
            .map(|i| self.as_usize(i))
            .collect()
    }

    fn run(&mut self) -> Result<usize, PickleError> {
        loop {
            self.at = self.pos;
            let op = self.u8()?;
            match op {
                0x80 => {
                    self.u8()?; // PROTO
                }
                0x95 => {
                    self.u64()?; // FRAME: a length hint only
                }
                b'.' => return self.pop(),
                b'(' | b'}' | b']' | b')' | b't' | 0x85..=0x87 | b'l' | b'd' => {
                    self.build_container(op)?
                }
                b'q' | b'r' | 0x94 | b'h' | b'j' => self.memo_op(op)?,
                b'N' | 0x88 | 0x89 | b'K' | b'M' | b'J' | 0x8a | b'G' => self.push_scalar(op)?,
                b'X' | 0x8c | 0x8d | b'U' | b'T' | b'C' | b'B' => self.push_text(op)?,
                b'c' | 0x93 | b'Q' | b'R' | 0x81 | b'b' => self.global_or_call(op)?,
                b'a' | b'e' | b's' | b'u' => self.fill_container(op)?,
                b'0' | b'1' | b'2' => self.shuffle_stack(op)?,
                _ => return Err(PickleError::Opcode { op, at: self.at }),
            }
        }
    }

    fn dict_insert(&mut self, d: usize, kvs: Vec<usize>) -> Result<(), PickleError> {
        if !kvs.len().is_multiple_of(2) {
            return Err(self.malformed("odd number of dict items"));
        }
        if !matches!(self.arena[d], Node::Dict(_)) {
            return Err(self.malformed("SETITEM(S) on a non-dict"));
        }
        for pair in kvs.chunks(2) {
            // Python dicts keep a key's first position and its last value.
            let pos = match (&self.arena[d], self.leaf(pair[0])) {
                (Node::Dict(items), Some(key)) => {
                    items.iter().position(|(k, _)| self.leaf(*k) == Some(key))
                }
                _ => None,
            };
            if let Node::Dict(items) = &mut self.arena[d] {
                match pos {
                    Some(i) => items[i].1 = pair[1],
                    None => items.push((pair[0], pair[1])),
                }
            }
        }
        Ok(())
    }

    fn persistent(&self, pid: usize) -> Result<Node, PickleError> {
        let items = self.tuple_items(pid)?;
        // ('storage', storage_type, key, location, numel)
        if items.len() < 3 || self.as_str(items[0]) != Some("storage") {
            return Err(self.malformed("persistent id is not a torch storage"));
        }
        let class = match &self.arena[items[1]] {
            Node::Global(g) => g.clone(),
            _ => return Err(self.malformed("storage type is not a global")),
        };
        let short = class.rsplit('.').next().unwrap_or(&class);
        let dtype = StorageDtype::from_class(short)
            .ok_or_else(|| self.malformed(format!("unsupported storage type {class}")))?;
        let key = match self.leaf(items[2]) {
            Some(Value::Str(s)) => s.clone(),
            Some(Value::Int(i)) => i.to_string(),
            _ => return Err(self.malformed("storage key is not a string")),
        };
        Ok(Node::Storage { dtype, key })
    }

    fn call(&mut self, func: usize, args: usize) -> Result<Node, PickleError> {
        let name = match &self.arena[func] {
            Node::Global(g) => g.clone(),
            _ => return Err(self.malformed("call of a non-global")),
        };
        let argv = self.tuple_items(args)?;
        match name.as_str() {
            "collections.OrderedDict" | "builtins.dict" | "__builtin__.dict" if argv.is_empty() => {
                Ok(Node::Dict(Vec::new()))
            }
            "torch._utils._rebuild_tensor_v2" | "torch._utils._rebuild_tensor" => {
                if argv.len() < 4 {
                    return Err(self.malformed("_rebuild_tensor needs 4 arguments"));
                }
                let Node::Storage { dtype, key } = self.arena[argv[0]].clone() else {
                    return Err(self.malformed("_rebuild_tensor without a storage"));
                };
                let offset = self.as_usize(argv[1])?;
                let shape = self.usize_tuple(argv[2])?;
                let stride = self.usize_tuple(argv[3])?;
                if shape.len() != stride.len() {
                    return Err(self.malformed("shape and stride lengths differ"));
                }
                Ok(Node::Leaf(Value::Tensor(TensorRef {
                    dtype,
                    key,
                    offset,
                    shape,
                    stride,
                })))
            }
            "torch._utils._rebuild_parameter" | "torch._utils._rebuild_parameter_with_state" => {
                let first = *argv
                    .first()
                    .ok_or_else(|| self.malformed("_rebuild_parameter without data"))?;
                Ok(self.arena[first].clone())
            }
            "_codecs.encode" if argv.len() == 2 => {
                // protocol 2 spells bytes as _codecs.encode(<latin-1 text>, 'latin1')
                let text = self
                    .as_str(argv[0])
                    .ok_or_else(|| self.malformed("_codecs.encode of a non-string"))?;
                Ok(Node::Leaf(Value::Bytes(
                    text.chars().map(|c| c as u32 as u8).collect(),
                )))
            }
            "numpy.core.multiarray.scalar" | "numpy._core.multiarray.scalar" if argv.len() == 2 => {
                self.numpy_scalar(argv[0], argv[1])
            }
            _ => {
                let id = self.new_node(Node::Tuple(argv));
                Ok(Node::Call(name, id))
            }
        }
    }

    /// `numpy.core.multiarray.scalar(dtype('f8'), b'...')` → a float or int.
    fn numpy_scalar(&self, dtype: usize, bytes: usize) -> Result<Node, PickleError> {
        let code = match &self.arena[dtype] {
            Node::Call(f, args) if f.ends_with("numpy.dtype") => self
                .tuple_items(*args)?
                .first()
                .and_then(|&i| self.as_str(i).map(str::to_string)),
            _ => None,
        }
        .ok_or_else(|| self.malformed("numpy scalar without a dtype"))?;
        let Some(Value::Bytes(b)) = self.leaf(bytes) else {
            return Err(self.malformed("numpy scalar without bytes"));
        };
        let v = match (code.as_str(), b.len()) {
            ("f8", 8) => Value::Float(f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))),
            ("f4", 4) => Value::Float(f64::from(f32::from_le_bytes(
                b[..4].try_into().unwrap_or([0; 4]),
            ))),
            ("i8", 8) => Value::Int(i64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]))),
            ("i4", 4) => Value::Int(i64::from(i32::from_le_bytes(
                b[..4].try_into().unwrap_or([0; 4]),
            ))),
            _ => return Err(self.malformed(format!("unsupported numpy scalar {code}"))),
        };
        Ok(Node::Leaf(v))
    }

    fn resolve(&self, id: usize, depth: usize) -> Result<Value, PickleError> {
        if depth > 256 {
            return Err(self.malformed("nesting too deep (or a cycle)"));
        }
        let left = self.budget.get();
        if left == 0 {
            return Err(self.malformed("too many objects (shared references expand too far)"));
        }
        self.budget.set(left - 1);
        Ok(match &self.arena[id] {
            Node::Leaf(v) => v.clone(),
            Node::List(items) => Value::List(
                items
                    .iter()
                    .map(|&i| self.resolve(i, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Node::Tuple(items) => Value::Tuple(
                items
                    .iter()
                    .map(|&i| self.resolve(i, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            Node::Dict(items) => Value::Dict(
                items
                    .iter()
                    .map(|&(k, v)| Ok((self.resolve(k, depth + 1)?, self.resolve(v, depth + 1)?)))
                    .collect::<Result<_, PickleError>>()?,
            ),
            Node::Storage { key, .. } => Value::Str(format!("storage {key}")),
            Node::Global(g) => Value::Global(g.clone()),
            Node::Call(f, args) => match self.resolve(*args, depth + 1)? {
                Value::Tuple(a) => Value::Call(f.clone(), a),
                other => Value::Call(f.clone(), vec![other]),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memoised_dict_filled_later_is_shared() {
        // {} memo0, MARK 'a' 1 SETITEMS, then a list holding memo0 twice
        let mut p = vec![0x80, 2, b'}', b'q', 0, b'('];
        p.extend([b'X', 1, 0, 0, 0, b'a', b'K', 1, b'u']);
        p.extend([b']', b'q', 1, b'h', 0, b'a', b'h', 0, b'a', b'.']);
        // stack after SETITEMS: [dict]; then ] pushes list: [dict, list]; h0 a → list=[dict]
        let v = load(&p).unwrap();
        let Value::List(items) = v else {
            panic!("{v:?}")
        };
        assert_eq!(items.len(), 2);
        for it in items {
            assert_eq!(it.get("a"), Some(&Value::Int(1)));
        }
    }

    #[test]
    fn exponential_sharing_is_refused() {
        // t0 = [], then 40 times t(i+1) = (t(i), t(i)) through the memo: 2^40 nodes if expanded naively
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for i in 0..40u8 {
            p.extend([b'h', i, b'h', i, 0x86, b'q', i + 1]);
        }
        p.push(b'.');
        let err = load(&p).unwrap_err();
        assert!(err.to_string().contains("too many objects"), "{err}");
    }

    #[test]
    fn ints_floats_and_truncation() {
        let mut p = vec![0x80, 2, b'('];
        p.extend([b'J', 0xff, 0xff, 0xff, 0xff]); // -1
        p.extend([0x8a, 2, 0x00, 0x80]); // LONG1 -32768
        p.push(b'G');
        p.extend(2.406050072164233f64.to_be_bytes());
        p.extend([b't', b'.']);
        assert_eq!(
            load(&p).unwrap(),
            Value::Tuple(vec![
                Value::Int(-1),
                Value::Int(-32768),
                Value::Float(2.406050072164233)
            ])
        );
        assert!(matches!(
            load(&p[..p.len() - 3]),
            Err(PickleError::Truncated(_))
        ));
        assert!(matches!(
            load(&[0x80, 2, 0xff]),
            Err(PickleError::Opcode { op: 0xff, .. })
        ));
    }
}
