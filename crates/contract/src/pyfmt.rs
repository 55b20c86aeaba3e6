//! Python's number and JSON text formats: `str(int)`, `repr(float)`, `round(x, 4)` and `json.dumps` with default
//! settings (kev-contract §3.1, §7, §8.4).

use serde_json::{Number, Value};

/// A JSON number as Python's `json.loads` types it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PyNumber<'a> {
    /// No `.`/`e`/`E` in the text: a Python `int` of any size; the text (JSON: no leading zeros, maybe `-`).
    Int(&'a str),
    /// Otherwise a Python `float`, correctly rounded (overflow → `±inf`, as `float('1e400')`).
    Float(f64),
}

/// Classify a number's text the way Python's JSON scanner does.
pub(crate) fn py_number(n: &Number) -> PyNumber<'_> {
    let text = n.as_str();
    if text.bytes().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        // serde_json only produces valid JSON number text here, which Rust parses with correct rounding
        // (`1e400` → inf), as CPython's `float()` does.
        PyNumber::Float(text.parse::<f64>().unwrap_or(f64::NAN))
    } else {
        PyNumber::Int(text)
    }
}

/// Python `str(int)` of a JSON integer's text: the text itself, except that `-0` is `0`.
pub(crate) fn int_str(text: &str) -> &str {
    if text == "-0" { "0" } else { text }
}

/// Python `repr(float)` (= `str(float)`): the shortest digits that round-trip, positional when
/// `1e-4 <= |x| < 1e16` (with `.0` when integral), else `d[.ddd]e±XX`; `inf`, `-inf`, `nan`, `-0.0`.
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let mut buf = ryu::Buffer::new();
    let (digits, decpt) = shortest_digits(buf.format_finite(x));
    let mut out = String::with_capacity(digits.len() + 8);
    if x.is_sign_negative() {
        out.push('-');
    }
    if digits.is_empty() {
        out.push_str("0.0");
        return out;
    }
    // `decpt` places the decimal point: value = 0.d1d2... × 10^decpt (CPython's `format_float_short`).
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exp = decpt - 1;
        out.push('e');
        out.push(if exp < 0 { '-' } else { '+' });
        let mag = exp.unsigned_abs();
        if mag < 10 {
            out.push('0');
        }
        out.push_str(&mag.to_string());
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', decpt.unsigned_abs() as usize));
        out.push_str(&digits);
    } else {
        let d = decpt as usize;
        if d >= digits.len() {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', d - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..d]);
            out.push('.');
            out.push_str(&digits[d..]);
        }
    }
    out
}

/// Significant digits (no leading/trailing zeros; empty for zero) and the decimal-point position of ryu's
/// shortest round-trip output (`"1.5e-7"`, `"100.0"`, `"-0.001"`, `"1e16"`).
fn shortest_digits(s: &str) -> (String, i32) {
    let s = s.strip_prefix('-').unwrap_or(s);
    let (mantissa, exp) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (s, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: String = int_part.chars().chain(frac_part.chars()).collect();
    let mut decpt = int_part.len() as i32 + exp;
    let leading = digits.len() - digits.trim_start_matches('0').len();
    digits.drain(..leading);
    decpt -= leading as i32;
    let kept = digits.trim_end_matches('0').len();
    digits.truncate(kept);
    (digits, decpt)
}

/// Python `round(x, 4)` for a float: the decimal with 4 places nearest to the *exact* binary value of `x` (ties
/// to even), read back as the nearest float. Computed exactly: `x = m·2^e`, so `x·10^4 = m·10^4 / 2^-e`, an
/// integer division with remainder in 128 bits (`m < 2^53`, `10^4 < 2^14`).
pub fn round4(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let bits = x.to_bits();
    let neg = (bits >> 63) != 0;
    let exp_bits = ((bits >> 52) & 0x7ff) as i32;
    let frac = bits & ((1u64 << 52) - 1);
    // x = m · 2^e exactly.
    let (m, e) = if exp_bits == 0 {
        (frac, -1074)
    } else {
        (frac | (1u64 << 52), exp_bits - 1075)
    };
    if e >= 0 {
        // An integer: already has no decimals.
        return x;
    }
    let n = u128::from(m) * 10_000;
    let shift = e.unsigned_abs();
    let q = if shift >= 128 {
        // n < 2^67 ≤ half of 2^shift: rounds to zero.
        0
    } else {
        let q = n >> shift;
        let r = n & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        if r > half || (r == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    // Exact integer over an exact power of ten: parsing the decimal text rounds correctly once.
    let v = format!("{q}e-4").parse::<f64>().unwrap_or(f64::NAN);
    if neg { -v } else { v }
}

/// A JSON number whose text is Python's `repr` of `x` (finite `x`), so that a serializer writes what Python's
/// `json.dumps` would. Non-finite values have no JSON number: `None`.
pub fn py_float_number(x: f64) -> Option<Number> {
    if !x.is_finite() {
        return None;
    }
    float_repr(x).parse::<Number>().ok()
}

/// Python's `json.dumps(value)` with default settings: `", "` and `": "` separators, `ensure_ascii=True`
/// (non-ASCII as `\uXXXX`, astral characters as surrogate pairs), floats as `repr` (`Infinity`/`NaN` spelled as
/// Python writes them), integers exact.
pub fn python_dumps(value: &Value) -> String {
    let mut out = String::new();
    dumps_into(value, &mut out);
    out
}

fn dumps_into(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => match py_number(n) {
            PyNumber::Int(text) => out.push_str(int_str(text)),
            PyNumber::Float(x) if x.is_nan() => out.push_str("NaN"),
            PyNumber::Float(x) if x.is_infinite() => {
                out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" })
            }
            PyNumber::Float(x) => out.push_str(&float_repr(x)),
        },
        Value::String(s) => ascii_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                dumps_into(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                ascii_string(k, out);
                out.push_str(": ");
                dumps_into(v, out);
            }
            out.push('}');
        }
    }
}

/// `json.encoder.py_encode_basestring_ascii`: escapes `"`, `\`, and everything outside `' '..='~'`.
fn ascii_string(s: &str, out: &mut String) {
    use crate::surrogate::{Piece, pieces};
    out.push('"');
    for piece in pieces(s) {
        let text = match piece {
            Piece::Text(t) => t,
            Piece::Esc => "\u{FDDF}",
            Piece::Surrogate(hex) => {
                out.push_str("\\u");
                out.push_str(hex);
                continue;
            }
        };
        ascii_text(text, out);
    }
    out.push('"');
}

fn ascii_text(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values checked against CPython's `repr`.
    #[test]
    fn float_repr_matches_python() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (2.5e-7, "2.5e-07"),
            (1e-5, "1e-05"),
            (1e-4, "0.0001"),
            (0.00012, "0.00012"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1234567890123456.7, "1234567890123456.8"),
            (1.5e300, "1.5e+300"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (0.9523, "0.9523"),
            (-12.5, "-12.5"),
            (123456789.0, "123456789.0"),
            (1e22, "1e+22"),
            (9999999999999998.0, "9999999999999998.0"),
        ];
        for &(x, want) in cases {
            assert_eq!(float_repr(x), want, "{x:e}");
        }
        assert_eq!(float_repr("1E400".parse().unwrap_or(0.0)), "inf");
    }

    #[test]
    fn round4_is_exact_and_ties_to_even() {
        // Exact binary ties: 1/32 = 0.03125 → 0.0312 (even), 3/32 = 0.09375 → 0.0938 (even).
        assert_eq!(round4(0.03125), 0.0312);
        assert_eq!(round4(0.09375), 0.0938);
        assert_eq!(round4(-0.03125), -0.0312);
        // Not ties in binary: 0.00005 is slightly above 5e-5, 0.00015 slightly below 1.5e-4.
        assert_eq!(round4(0.00005), 0.0001);
        assert_eq!(round4(0.00015), 0.0001);
        assert_eq!(round4(1.00005), 1.0001);
        assert_eq!(round4(2.675), 2.675);
        assert_eq!(round4(0.95234999), 0.9523);
        assert_eq!(round4(0.95235001), 0.9524);
        assert_eq!(round4(1e-10), 0.0);
        assert!(round4(-1e-10).is_sign_negative());
        assert_eq!(round4(5e-324), 0.0);
        assert_eq!(round4(123456.0), 123456.0);
        assert_eq!(round4(1e300), 1e300);
        assert!(round4(f64::NAN).is_nan());
        assert_eq!(round4(f64::INFINITY), f64::INFINITY);
        // fp32 probabilities widened to f64, as the reference does (`tolist()`).
        assert_eq!(round4(f64::from(0.952_349_98_f32)), 0.9523);
    }

    #[test]
    fn dumps_matches_python_default() {
        let v: Value = serde_json::from_str(
            r#"{"a": [1, 2.5e-7, true, null], "é": "😀\n\u007f\"", "n": -0, "e": {}, "l": []}"#,
        )
        .expect("valid");
        assert_eq!(
            python_dumps(&v),
            r#"{"a": [1, 2.5e-07, true, null], "\u00e9": "\ud83d\ude00\n\u007f\"", "n": 0, "e": {}, "l": []}"#
        );
        let v: Value = serde_json::from_str("[1e400, -1e400, 1.0E2]").expect("valid");
        assert_eq!(python_dumps(&v), "[Infinity, -Infinity, 100.0]");
    }

    #[test]
    fn py_float_numbers_serialize_as_python_repr() {
        let n = py_float_number(1e-5).expect("finite");
        assert_eq!(serde_json::to_string(&n).expect("ser"), "1e-05");
        assert!(py_float_number(f64::NAN).is_none());
    }
}
