//! The opcodes of [`Machine::run`], one method per group: containers built from the stack, the memo,
//! numbers, strings and bytes, globals and calls, containers filled in place, and stack shuffles.
//!
//! `run` routes each opcode to its group; an opcode a group does not know is reported as unsupported
//! rather than trusted to the routing.

use super::{Machine, Node, PickleError, Slot, Value};

impl Machine<'_> {
    fn unsupported(&self, op: u8) -> PickleError {
        PickleError::Opcode { op, at: self.at }
    }

    /// `(`, `}`, `]`, `)`, `t`, `TUPLE1..3`, `l`, `d`: a new container from the stack.
    pub(super) fn build_container(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'(' => self.stack.push(Slot::Mark),
            b'}' => self.push(Node::Dict(Vec::new())),
            b']' => self.push(Node::List(Vec::new())),
            b')' => self.push(Node::Tuple(Vec::new())),
            b't' => {
                let items = self.pop_mark()?;
                self.push(Node::Tuple(items));
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push(Node::Tuple(items));
            }
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Node::List(items));
            }
            b'd' => {
                let items = self.pop_mark()?;
                if !items.len().is_multiple_of(2) {
                    return Err(self.malformed("odd number of dict items"));
                }
                let pairs = items.chunks(2).map(|c| (c[0], c[1])).collect();
                self.push(Node::Dict(pairs));
            }
            _ => return Err(self.unsupported(op)),
        }
        Ok(())
    }

    /// `BINPUT`, `LONG_BINPUT`, `MEMOIZE`, `BINGET`, `LONG_BINGET`.
    pub(super) fn memo_op(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'q' => {
                let k = u32::from(self.u8()?);
                self.memo_put(k)
            }
            b'r' => {
                let k = self.u32()?;
                self.memo_put(k)
            }
            0x94 => {
                let k = u32::try_from(self.memo.len()).unwrap_or(u32::MAX);
                self.memo_put(k)
            }
            b'h' => {
                let k = u32::from(self.u8()?);
                self.memo_get(k)
            }
            b'j' => {
                let k = self.u32()?;
                self.memo_get(k)
            }
            _ => Err(self.unsupported(op)),
        }
    }

    /// `None`, booleans, the integer forms and `BINFLOAT`.
    pub(super) fn push_scalar(&mut self, op: u8) -> Result<(), PickleError> {
        let v = match op {
            b'N' => Value::None,
            0x88 => Value::Bool(true),
            0x89 => Value::Bool(false),
            b'K' => Value::Int(i64::from(self.u8()?)),
            b'M' => Value::Int(i64::from(self.u16()?)),
            b'J' => Value::Int(i64::from(self.u32()? as i32)),
            0x8a => {
                let n = usize::from(self.u8()?);
                let b = self.take(n)?;
                if n > 8 {
                    return Err(self.malformed("integer wider than 64 bits"));
                }
                let mut v: i64 = 0;
                for (i, &byte) in b.iter().enumerate() {
                    v |= i64::from(byte) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                Value::Int(v)
            }
            b'G' => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                Value::Float(f64::from_be_bytes(a))
            }
            _ => return Err(self.unsupported(op)),
        };
        self.push(Node::Leaf(v));
        Ok(())
    }

    /// The unicode, py2-str and bytes forms.
    pub(super) fn push_text(&mut self, op: u8) -> Result<(), PickleError> {
        let v = match op {
            b'X' => {
                let n = self.u32()? as usize;
                Value::Str(self.utf8(n)?)
            }
            0x8c => {
                let n = usize::from(self.u8()?);
                Value::Str(self.utf8(n)?)
            }
            0x8d => {
                let n = usize::try_from(self.u64()?).map_err(|_| self.malformed("huge string"))?;
                Value::Str(self.utf8(n)?)
            }
            b'U' => {
                // py2 str: bytes read as Latin-1 text
                let n = usize::from(self.u8()?);
                Value::Str(self.take(n)?.iter().map(|&b| char::from(b)).collect())
            }
            b'T' => {
                let n = self.u32()? as usize;
                Value::Str(self.take(n)?.iter().map(|&b| char::from(b)).collect())
            }
            b'C' => {
                let n = usize::from(self.u8()?);
                Value::Bytes(self.take(n)?.to_vec())
            }
            b'B' => {
                let n = self.u32()? as usize;
                Value::Bytes(self.take(n)?.to_vec())
            }
            _ => return Err(self.unsupported(op)),
        };
        self.push(Node::Leaf(v));
        Ok(())
    }

    /// `GLOBAL`, `STACK_GLOBAL`, `BINPERSID`, `REDUCE`, `NEWOBJ`, `BUILD`: names and what is made of them.
    pub(super) fn global_or_call(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.push(Node::Global(format!("{module}.{name}")));
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let (Some(module), Some(name)) = (self.as_str(module), self.as_str(name)) else {
                    return Err(self.malformed("STACK_GLOBAL needs two strings"));
                };
                let g = format!("{module}.{name}");
                self.push(Node::Global(g));
            }
            b'Q' => {
                let pid = self.pop()?;
                let node = self.persistent(pid)?;
                self.push(node);
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let func = self.pop()?;
                let node = self.call(func, args)?;
                self.push(node);
            }
            b'b' => {
                // BUILD: object state (e.g. an OrderedDict's `_metadata`) is not data we need.
                self.pop()?;
                self.top()?;
            }
            _ => return Err(self.unsupported(op)),
        }
        Ok(())
    }

    /// `APPEND`, `APPENDS`, `SETITEM`, `SETITEMS`: a list or dict on the stack filled in place.
    pub(super) fn fill_container(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'a' => {
                let v = self.pop()?;
                let list = self.top()?;
                match &mut self.arena[list] {
                    Node::List(items) => items.push(v),
                    _ => return Err(self.malformed("APPEND to a non-list")),
                }
            }
            b'e' => {
                let vs = self.pop_mark()?;
                let list = self.top()?;
                match &mut self.arena[list] {
                    Node::List(items) => items.extend(vs),
                    _ => return Err(self.malformed("APPENDS to a non-list")),
                }
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let d = self.top()?;
                self.dict_insert(d, vec![k, v])?;
            }
            b'u' => {
                let kvs = self.pop_mark()?;
                let d = self.top()?;
                self.dict_insert(d, kvs)?;
            }
            _ => return Err(self.unsupported(op)),
        }
        Ok(())
    }

    /// `POP`, `POP_MARK`, `DUP`.
    pub(super) fn shuffle_stack(&mut self, op: u8) -> Result<(), PickleError> {
        match op {
            b'0' => {
                self.stack
                    .pop()
                    .ok_or_else(|| self.malformed("POP on empty stack"))?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let id = self.top()?;
                self.stack.push(Slot::Obj(id));
            }
            _ => return Err(self.unsupported(op)),
        }
        Ok(())
    }
}
