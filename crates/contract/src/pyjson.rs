//! The request body as Python's `json.loads(bytes)` reads it (kev-contract §2.1, §8.5).
//!
//! Kev's server is FastAPI: the body is decoded with `json.loads`, and a decode failure becomes a 422
//! `json_invalid` whose `loc` carries Python's character offset and whose `ctx.error` is Python's message. To
//! reproduce both exactly, a validating scanner that follows CPython's C scanner (`Modules/_json.c`) step by step
//! runs first; it builds nothing. Only when it accepts the text does `serde_json` (with `preserve_order` and
//! `arbitrary_precision`) build the value. The scanner also finds the three things Python accepts and
//! `serde_json` does not, which are rewritten before `serde_json` sees the text:
//!
//! - `Infinity` / `-Infinity` literals become `1e400` / `-1e400` (floats that overflow to the same `±inf`);
//! - `NaN` becomes the string `"nan"`: it renders exactly as `str(float('nan'))` does, and rendering is the only
//!   use of a value of the state, instructions or criteria (as `model` it is accepted as the name `nan`, where
//!   Kev fails with a 500 while echoing it in its 422 body);
//! - a `\uXXXX` escape of a lone surrogate becomes [`crate::surrogate::ESC`] and its four hex digits, and a literal
//!   U+FDDF becomes two of them (Python keeps the surrogate; see [`crate::surrogate`]: two ids that differ only in
//!   a lone surrogate stay two ids, the model reads U+FFFD, clients get the escape back).
//!
//! Bytes are decoded the way `json.loads(bytes)` does (`json.detect_encoding`: UTF-8 with or without BOM, UTF-16,
//! UTF-32). Undecodable bytes, integers of more than 4,300 digits (CPython's `int` conversion limit) and nesting
//! deeper than `serde_json`'s 128 levels are where Kev's FastAPI answers 400 "There was an error parsing the
//! body" (an exception other than `JSONDecodeError` while reading the body; for nesting, Python's own limit is
//! about 1,000 levels, ours is 128).

use std::borrow::Cow;

use serde_json::Value;

use crate::surrogate::ESC;

/// [`ESC`] in UTF-8.
const ESC_UTF8: [u8; 3] = [0xEF, 0xB7, 0x9F];
const ESC_TWICE: &str = "\u{FDDF}\u{FDDF}";

/// CPython's default `sys.get_int_max_str_digits()` (3.11+): longer integer literals raise `ValueError`.
const MAX_INT_DIGITS: usize = 4300;

/// Depth past which the scanner stops descending (`serde_json` stops at 128 anyway).
const MAX_SCAN_DEPTH: usize = 1000;

/// Why a body could not be read as JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonFailure {
    /// `json.JSONDecodeError`: Python's message and character offset.
    Decode {
        /// Offset in characters (Python `str` indices) into the decoded text.
        pos: usize,
        /// Python's message (`"Expecting value"`, ...).
        msg: &'static str,
    },
    /// Any other exception while reading the body (FastAPI answers 400).
    Unreadable(&'static str),
}

/// One same-meaning substitution found by the scanner (byte range in the decoded text, replacement text).
struct Rewrite {
    start: usize,
    end: usize,
    with: Cow<'static, str>,
}

/// Decode and parse a request body as Python's `json.loads(body)` would, into a `serde_json::Value` that keeps
/// key order (duplicate keys: last value at the first key's position, as a Python dict) and number text.
pub(crate) fn loads(body: &[u8]) -> Result<Value, JsonFailure> {
    let text = decode(body)?;
    let rewrites = Scanner::new(&text).document()?;
    let source: Cow<'_, str> = if rewrites.is_empty() {
        Cow::Borrowed(&text)
    } else {
        let mut out = String::with_capacity(text.len() + 8 * rewrites.len());
        let mut at = 0;
        for r in &rewrites {
            out.push_str(&text[at..r.start]);
            out.push_str(&r.with);
            at = r.end;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    };
    serde_json::from_str(&source).map_err(|e| {
        // The scanner accepted the text, so the only disagreement left is serde_json's nesting limit.
        if e.to_string().starts_with("recursion limit exceeded") {
            JsonFailure::Unreadable("nesting deeper than 128 levels")
        } else {
            JsonFailure::Unreadable("the body could not be parsed")
        }
    })
}

const UNDECODABLE: JsonFailure =
    JsonFailure::Unreadable("the body is not valid UTF-8, UTF-16 or UTF-32");

fn utf8(b: &[u8]) -> Result<Cow<'_, str>, JsonFailure> {
    std::str::from_utf8(b)
        .map(Cow::Borrowed)
        .map_err(|_| UNDECODABLE)
}

fn utf16(b: &[u8], big: bool) -> Result<Cow<'_, str>, JsonFailure> {
    if !b.len().is_multiple_of(2) {
        return Err(UNDECODABLE);
    }
    let units = b.chunks_exact(2).map(|c| {
        let pair = [c[0], c[1]];
        if big {
            u16::from_be_bytes(pair)
        } else {
            u16::from_le_bytes(pair)
        }
    });
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .map(Cow::Owned)
        .map_err(|_| UNDECODABLE)
}

fn utf32(b: &[u8], big: bool) -> Result<Cow<'_, str>, JsonFailure> {
    if !b.len().is_multiple_of(4) {
        return Err(UNDECODABLE);
    }
    b.chunks_exact(4)
        .map(|c| {
            let quad = [c[0], c[1], c[2], c[3]];
            let u = if big {
                u32::from_be_bytes(quad)
            } else {
                u32::from_le_bytes(quad)
            };
            char::from_u32(u).ok_or(UNDECODABLE)
        })
        .collect::<Result<String, _>>()
        .map(Cow::Owned)
}

/// `bytes.decode(json.detect_encoding(b), 'surrogatepass')`, except that surrogates are refused (→ 400).
fn decode(b: &[u8]) -> Result<Cow<'_, str>, JsonFailure> {
    // Python's 'utf-32' / 'utf-16' codecs read the BOM, pick the byte order and drop it.
    if let Some(rest) = b.strip_prefix(&[0xFF, 0xFE, 0, 0]) {
        return utf32(rest, false);
    }
    if let Some(rest) = b.strip_prefix(&[0, 0, 0xFE, 0xFF]) {
        return utf32(rest, true);
    }
    if let Some(rest) = b.strip_prefix(&[0xFF, 0xFE]) {
        return utf16(rest, false);
    }
    if let Some(rest) = b.strip_prefix(&[0xFE, 0xFF]) {
        return utf16(rest, true);
    }
    if let Some(rest) = b.strip_prefix(&[0xEF, 0xBB, 0xBF]) {
        return utf8(rest);
    }
    match *b {
        [0, 0, _, _, ..] => utf32(b, true),
        [0, _, _, _, ..] => utf16(b, true),
        [_, 0, 0, 0, ..] => utf32(b, false),
        [_, 0, _, _, ..] => utf16(b, false),
        [0, _] => utf16(b, true),
        [_, 0] => utf16(b, false),
        _ => utf8(b),
    }
}

/// CPython's `IS_WHITESPACE` in `_json.c`.
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Internal failure of the scanner.
enum Fail {
    /// `raise_errmsg(msg, s, idx)` at a byte offset.
    At(usize, &'static str),
    /// `raise_stop_iteration(idx)`: no value starts here; reported as "Expecting value" at `idx`.
    Stop(usize),
    /// Not a `JSONDecodeError` (FastAPI: 400).
    Other(&'static str),
}

/// A validating walk over the text in the order of CPython's C scanner. It works on bytes (every structural
/// character is ASCII, so every error offset falls on a character boundary) and turns the failing byte offset into
/// a character offset only on failure.
struct Scanner<'a> {
    s: &'a str,
    b: &'a [u8],
    rewrites: Vec<Rewrite>,
    depth: usize,
}

impl<'a> Scanner<'a> {
    fn new(s: &'a str) -> Self {
        Scanner {
            s,
            b: s.as_bytes(),
            rewrites: Vec::new(),
            depth: 0,
        }
    }

    /// `JSONDecoder.decode`: skip whitespace, one value, skip whitespace, nothing else.
    fn document(mut self) -> Result<Vec<Rewrite>, JsonFailure> {
        let start = self.skip_ws(0);
        let result = self.value(start).and_then(|end| {
            let end = self.skip_ws(end);
            if end == self.b.len() {
                Ok(())
            } else {
                Err(Fail::At(end, "Extra data"))
            }
        });
        match result {
            Ok(()) => Ok(self.rewrites),
            Err(Fail::At(i, msg)) => Err(self.decode_error(i, msg)),
            Err(Fail::Stop(i)) => Err(self.decode_error(i, "Expecting value")),
            Err(Fail::Other(m)) => Err(JsonFailure::Unreadable(m)),
        }
    }

    fn decode_error(&self, byte_pos: usize, msg: &'static str) -> JsonFailure {
        let byte_pos = byte_pos.min(self.b.len());
        // Offsets come from ASCII positions or the end of the text, so this prefix is always a valid slice; fall
        // back to counting lead bytes rather than panicking if that ever stops being true.
        let pos = match self.s.get(..byte_pos) {
            Some(prefix) => prefix.chars().count(),
            None => self.b[..byte_pos]
                .iter()
                .filter(|&&c| (c & 0xC0) != 0x80)
                .count(),
        };
        JsonFailure::Decode { pos, msg }
    }

    fn skip_ws(&self, mut i: usize) -> usize {
        while i < self.b.len() && is_ws(self.b[i]) {
            i += 1;
        }
        i
    }

    fn at(&self, i: usize) -> Option<u8> {
        self.b.get(i).copied()
    }

    fn starts(&self, i: usize, lit: &[u8]) -> bool {
        self.b.get(i..i + lit.len()) == Some(lit)
    }

    /// `scan_once_unicode`: one value starting exactly at `i`; returns the offset after it.
    fn value(&mut self, i: usize) -> Result<usize, Fail> {
        let Some(c) = self.at(i) else {
            return Err(Fail::Stop(i));
        };
        match c {
            b'"' => self.string(i + 1),
            b'{' | b'[' => {
                if self.depth >= MAX_SCAN_DEPTH {
                    return Err(Fail::Other("nesting deeper than 128 levels"));
                }
                self.depth += 1;
                let r = if c == b'{' {
                    self.object(i + 1)
                } else {
                    self.array(i + 1)
                };
                self.depth -= 1;
                r
            }
            // C checks `idx + 3 < length` etc.: the whole literal must be present.
            b'n' if self.starts(i, b"null") => Ok(i + 4),
            b't' if self.starts(i, b"true") => Ok(i + 4),
            b'f' if self.starts(i, b"false") => Ok(i + 5),
            b'N' if self.starts(i, b"NaN") => {
                self.rewrites.push(Rewrite {
                    start: i,
                    end: i + 3,
                    with: Cow::Borrowed("\"nan\""),
                });
                Ok(i + 3)
            }
            b'I' if self.starts(i, b"Infinity") => {
                self.rewrites.push(Rewrite {
                    start: i,
                    end: i + 8,
                    with: Cow::Borrowed("1e400"),
                });
                Ok(i + 8)
            }
            b'-' if self.starts(i, b"-Infinity") => {
                self.rewrites.push(Rewrite {
                    start: i,
                    end: i + 9,
                    with: Cow::Borrowed("-1e400"),
                });
                Ok(i + 9)
            }
            _ => self.number(i),
        }
    }

    /// `_match_number_unicode`: note the back-tracking on `1.` and `1e` (the number ends before them).
    fn number(&mut self, start: usize) -> Result<usize, Fail> {
        let digit = |c: Option<u8>| c.is_some_and(|c| c.is_ascii_digit());
        let mut i = start;
        if self.at(i) == Some(b'-') {
            i += 1;
            if i >= self.b.len() {
                return Err(Fail::Stop(start));
            }
        }
        let int_start = i;
        match self.at(i) {
            Some(b'1'..=b'9') => {
                i += 1;
                while digit(self.at(i)) {
                    i += 1;
                }
            }
            Some(b'0') => i += 1,
            _ => return Err(Fail::Stop(start)),
        }
        let int_digits = i - int_start;
        let mut is_float = false;
        if self.at(i) == Some(b'.') && digit(self.at(i + 1)) {
            is_float = true;
            i += 2;
            while digit(self.at(i)) {
                i += 1;
            }
        }
        if matches!(self.at(i), Some(b'e' | b'E')) && i + 1 < self.b.len() {
            let e_start = i;
            i += 1;
            if matches!(self.at(i), Some(b'-' | b'+')) && i + 1 < self.b.len() {
                i += 1;
            }
            while digit(self.at(i)) {
                i += 1;
            }
            if digit(self.at(i - 1)) {
                is_float = true;
            } else {
                i = e_start;
            }
        }
        if !is_float && int_digits > MAX_INT_DIGITS {
            return Err(Fail::Other("an integer literal longer than 4300 digits"));
        }
        Ok(i)
    }

    /// `scanstring_unicode`, `i` just after the opening quote; returns the offset after the closing quote.
    fn string(&mut self, i: usize) -> Result<usize, Fail> {
        let begin = i - 1;
        let len = self.b.len();
        let mut next = i;
        loop {
            // Find the end of the string or the next escape; control characters are refused (strict mode).
            let mut c = None;
            while next < len {
                let d = self.b[next];
                if d == b'"' || d == b'\\' {
                    c = Some(d);
                    break;
                }
                if d <= 0x1f {
                    return Err(Fail::At(next, "Invalid control character at"));
                }
                if d == ESC_UTF8[0] && self.b.get(next..next + 3) == Some(&ESC_UTF8[..]) {
                    self.literal_esc(next, next + 3);
                    next += 3;
                    continue;
                }
                next += 1;
            }
            match c {
                Some(b'"') => return Ok(next + 1),
                Some(_) => {}
                None => return Err(Fail::At(begin, "Unterminated string starting at")),
            }
            // A backslash at `next`.
            next += 1;
            if next == len {
                return Err(Fail::At(begin, "Unterminated string starting at"));
            }
            let e = self.b[next];
            if e != b'u' {
                if !matches!(e, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') {
                    return Err(Fail::At(next - 1, "Invalid \\escape"));
                }
                next += 1;
                continue;
            }
            // `\uXXXX`: C requires `end < len`, i.e. at least one character after the four digits.
            let esc_start = next - 1;
            next += 1;
            let end = next + 4;
            if end >= len {
                return Err(Fail::At(next - 1, "Invalid \\uXXXX escape"));
            }
            let Some(unit) = self.hex4(next) else {
                return Err(Fail::At(end - 5, "Invalid \\uXXXX escape"));
            };
            next = end;
            if (0xD800..0xDC00).contains(&unit) {
                // A high surrogate: C joins it with a following `\uXXXX` low surrogate when `end + 6 < len`.
                if end + 6 < len && self.b[next] == b'\\' && self.b[next + 1] == b'u' {
                    let Some(low) = self.hex4(next + 2) else {
                        return Err(Fail::At(end + 1, "Invalid \\uXXXX escape"));
                    };
                    if (0xDC00..0xE000).contains(&low) {
                        next += 6;
                        continue;
                    }
                }
                self.lone_surrogate(esc_start);
            } else if (0xDC00..0xE000).contains(&unit) {
                self.lone_surrogate(esc_start);
            } else if unit == ESC as u32 {
                self.literal_esc(esc_start, esc_start + 6);
            }
        }
    }

    fn hex4(&self, i: usize) -> Option<u32> {
        let digits = self.b.get(i..i + 4)?;
        digits.iter().try_fold(0u32, |acc, &d| {
            let v = (d as char).to_digit(16)?;
            Some(acc << 4 | v)
        })
    }

    /// `\uDXXX` (lone) → ESC + the four hex digits, lowercase.
    fn lone_surrogate(&mut self, esc_start: usize) {
        let hex = self.s[esc_start + 2..esc_start + 6].to_ascii_lowercase();
        self.rewrites.push(Rewrite {
            start: esc_start,
            end: esc_start + 6,
            with: Cow::Owned(format!("{ESC}{hex}")),
        });
    }

    /// A literal U+FDDF (raw or escaped) → two of them.
    fn literal_esc(&mut self, start: usize, end: usize) {
        self.rewrites.push(Rewrite {
            start,
            end,
            with: Cow::Borrowed(ESC_TWICE),
        });
    }

    /// `_parse_object_unicode`, `i` just after `{`.
    fn object(&mut self, i: usize) -> Result<usize, Fail> {
        let mut i = self.skip_ws(i);
        if self.at(i) == Some(b'}') {
            return Ok(i + 1);
        }
        loop {
            if self.at(i) != Some(b'"') {
                return Err(Fail::At(
                    i,
                    "Expecting property name enclosed in double quotes",
                ));
            }
            i = self.string(i + 1)?;
            i = self.skip_ws(i);
            if self.at(i) != Some(b':') {
                return Err(Fail::At(i, "Expecting ':' delimiter"));
            }
            i = self.skip_ws(i + 1);
            i = self.value(i)?;
            i = self.skip_ws(i);
            match self.at(i) {
                Some(b'}') => return Ok(i + 1),
                Some(b',') => i = self.skip_ws(i + 1),
                _ => return Err(Fail::At(i, "Expecting ',' delimiter")),
            }
        }
    }

    /// `_parse_array_unicode`, `i` just after `[`.
    fn array(&mut self, i: usize) -> Result<usize, Fail> {
        let mut i = self.skip_ws(i);
        if self.at(i) == Some(b']') {
            return Ok(i + 1);
        }
        loop {
            i = self.value(i)?;
            i = self.skip_ws(i);
            match self.at(i) {
                Some(b']') => return Ok(i + 1),
                Some(b',') => i = self.skip_ws(i + 1),
                _ => return Err(Fail::At(i, "Expecting ',' delimiter")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> (usize, &'static str) {
        match loads(s.as_bytes()) {
            Err(JsonFailure::Decode { pos, msg }) => (pos, msg),
            other => panic!("{s:?}: expected a decode error, got {other:?}"),
        }
    }

    /// Offsets and messages recorded from CPython 3.11's `json.loads` (C scanner).
    #[test]
    fn python_error_offsets_and_messages() {
        let cases: &[(&str, usize, &str)] = &[
            (" ", 1, "Expecting value"),
            ("\u{0}", 0, "Expecting value"),
            ("{", 1, "Expecting property name enclosed in double quotes"),
            ("{\"a\"", 4, "Expecting ':' delimiter"),
            ("{\"a\" 1}", 5, "Expecting ':' delimiter"),
            ("{\"a\":", 5, "Expecting value"),
            ("{\"a\":1", 6, "Expecting ',' delimiter"),
            ("{\"a\":1 \"b\"}", 7, "Expecting ',' delimiter"),
            ("[1 2]", 3, "Expecting ',' delimiter"),
            ("[1,]", 3, "Expecting value"),
            (
                "{\"state\":1,\"questions\":{\"a\":{\"type\":\"noul\"}},}",
                45,
                "Expecting property name enclosed in double quotes",
            ),
            ("{\"a\":\"\\q\"}", 6, "Invalid \\escape"),
            ("{\"a\":\"\\u12\"}", 7, "Invalid \\uXXXX escape"),
            ("{\"a\":\"x\ny\"}", 7, "Invalid control character at"),
            ("{\"a\":\"abc", 5, "Unterminated string starting at"),
            ("{\"a\":tru}", 5, "Expecting value"),
            ("{\"a\":01}", 6, "Expecting ',' delimiter"),
            ("{\"a\":-}", 5, "Expecting value"),
            ("{\"a\":1.}", 6, "Expecting ',' delimiter"),
            ("{\"a\":1e}", 6, "Expecting ',' delimiter"),
            ("{\"state\": \"x\"} x", 15, "Extra data"),
            // Offsets count characters, not bytes.
            ("{\"s\":\"é\"} x", 10, "Extra data"),
        ];
        for &(text, pos, msg) in cases {
            assert_eq!(err(text), (pos, msg), "{text:?}");
        }
    }

    #[test]
    fn python_literals_and_encodings() {
        let v = loads(b"[NaN, Infinity, -Infinity, 1]").expect("python accepts these");
        assert_eq!(v[0], Value::String("nan".into()));
        assert_eq!(v[1].as_f64(), None, "1e400 does not fit an f64 accessor");
        assert_eq!(
            serde_json::to_string(&v).expect("serializes"),
            "[\"nan\",1e+400,-1e+400,1]"
        );
        let bom = b"\xEF\xBB\xBF{\"a\": 1}";
        assert_eq!(loads(bom).expect("utf-8-sig")["a"].to_string(), "1");
        let utf16le: Vec<u8> = "{\"a\": \"é\"}"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(loads(&utf16le).expect("utf-16-le")["a"], "é");
        assert!(matches!(
            loads(b"{\"a\":\"\xff\"}"),
            Err(JsonFailure::Unreadable(_))
        ));
        // Lone surrogate escapes are kept answerable and distinct; pairs are joined.
        let v = loads(br#"["\ud800", "\ud83d\ude00", "\uDC00x"]"#)
            .expect("python accepts lone surrogates");
        assert_eq!(v[0], "\u{FDDF}d800");
        assert_eq!(v[1], "😀");
        assert_eq!(v[2], "\u{FDDF}dc00x");
        // A literal U+FDDF, raw or escaped, doubles, so no text can pose as a surrogate.
        let v = loads("[\"\u{FDDF}d800\", \"\\ufddf\"]".as_bytes()).expect("valid");
        assert_eq!(v[0], "\u{FDDF}\u{FDDF}d800");
        assert_eq!(v[1], "\u{FDDF}\u{FDDF}");
        let keys = loads(br#"{"\ud800": 1, "\udc00": 2, "\ufffd": 3}"#).expect("valid");
        assert_eq!(keys.as_object().map(|m| m.len()), Some(3));
        assert_eq!(
            crate::surrogate::wire(serde_json::to_string(&keys).expect("ser")),
            "{\"\\ud800\":1,\"\\udc00\":2,\"\u{fffd}\":3}"
        );
    }

    #[test]
    fn integer_digit_limit_and_nesting() {
        let ok = format!("[{}]", "1".repeat(4300));
        assert!(loads(ok.as_bytes()).is_ok());
        let long = format!("[{}]", "1".repeat(4301));
        assert!(matches!(
            loads(long.as_bytes()),
            Err(JsonFailure::Unreadable(_))
        ));
        // A float with many digits is fine for Python.
        let float = format!("[{}.5]", "1".repeat(5000));
        assert!(loads(float.as_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(matches!(
            loads(deep.as_bytes()),
            Err(JsonFailure::Unreadable(_))
        ));
        let very_deep = "[".repeat(100_000);
        assert!(loads(very_deep.as_bytes()).is_err());
    }

    #[test]
    fn duplicate_keys_keep_first_position_last_value() {
        let v = loads(br#"{"a": 1, "b": 2, "a": 3}"#).expect("valid");
        assert_eq!(serde_json::to_string(&v).expect("ser"), r#"{"a":3,"b":2}"#);
    }

    #[test]
    fn number_text_is_kept() {
        let v = loads(b"[1.0E2, -0, 12345678901234567890123, 2.5e-7]").expect("valid");
        assert_eq!(
            serde_json::to_string(&v).expect("ser"),
            // serde_json spells exponents as `e+N`; digits, signs and the int/float split are kept.
            "[1.0e+2,-0,12345678901234567890123,2.5e-7]"
        );
    }
}
