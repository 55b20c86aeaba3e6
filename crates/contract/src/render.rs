//! Text the model sees (kev-contract §3.1, §3.2): `render` and `option_text` with Python semantics.

use serde_json::Value;

use crate::pyfmt::{PyNumber, float_repr, int_str, py_number};
use crate::surrogate::model_text;

/// Python's `str.isspace()`: Rust's `char::is_whitespace` plus U+001C..U+001F (the information separators,
/// which Python counts as whitespace and Unicode's White_Space property does not).
pub fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.lstrip()` with no argument.
pub fn py_lstrip(s: &str) -> &str {
    s.trim_start_matches(is_py_space)
}

/// Kev's `render(v)`: the flattened text of a JSON value (kev-contract §3.1).
///
/// `null` → `""`; strings as is; `true`/`false` → `True`/`False`; integers exact; floats as Python `repr`;
/// lists as `- item` lines (each item left-stripped, nested two spaces per level); objects as `key: value`, or
/// `key:` and a nested block for object/list values.
pub fn render(value: &Value) -> String {
    let mut out = String::new();
    render_into(value, 0, &mut out);
    out
}

/// Kev's `option_text(name, desc)`: `name` when `desc` is null or the empty string, else `name: render(desc)`.
pub fn option_text(name: &str, desc: Option<&Value>) -> String {
    match desc {
        None | Some(Value::Null) => model_text(name).into_owned(),
        Some(Value::String(s)) if s.is_empty() => model_text(name).into_owned(),
        Some(d) => {
            let mut out = String::with_capacity(name.len() + 2);
            out.push_str(&model_text(name));
            out.push_str(": ");
            render_into(d, 0, &mut out);
            out
        }
    }
}

/// Python `str(v)` of a scalar.
fn scalar_into(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Array(_) | Value::Object(_) => {}
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::String(s) => out.push_str(&model_text(s)),
        Value::Number(n) => match py_number(n) {
            PyNumber::Int(text) => out.push_str(int_str(text)),
            PyNumber::Float(x) => out.push_str(&float_repr(x)),
        },
    }
}

fn pad(indent: usize, out: &mut String) {
    for _ in 0..indent {
        out.push_str("  ");
    }
}

/// Appends `render(value, indent)`. Recursion depth is the value's nesting depth, which the parser bounds
/// (128 levels).
fn render_into(value: &Value, indent: usize, out: &mut String) {
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                pad(indent, out);
                out.push_str("- ");
                let start = out.len();
                render_into(item, indent + 1, out);
                let strip = out[start..].len() - py_lstrip(&out[start..]).len();
                out.drain(start..start + strip);
            }
        }
        Value::Object(map) => {
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                }
                pad(indent, out);
                out.push_str(&model_text(k));
                if matches!(x, Value::Array(_) | Value::Object(_)) {
                    out.push_str(":\n");
                    render_into(x, indent + 1, out);
                } else {
                    out.push_str(": ");
                    scalar_into(x, out);
                }
            }
        }
        scalar => scalar_into(scalar, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(json: &str) -> String {
        render(&serde_json::from_str(json).expect("valid JSON"))
    }

    /// The verified examples of kev-contract §3.1.
    #[test]
    fn spec_examples() {
        assert_eq!(
            r(r#"{"subject":"Charged twice","customer":{"plan":"pro","tickets":3}}"#),
            "subject: Charged twice\ncustomer:\n  plan: pro\n  tickets: 3"
        );
        assert_eq!(
            r(r#"["  lead","\ttab",null,["x","y"]]"#),
            "- lead\n- tab\n- \n- - x\n  - y"
        );
        assert_eq!(
            r(r#"{"a":[1,{"b":null,"c":[true,2.5e-7]}],"d":{},"e":[],"f":"  x"}"#),
            "a:\n  - 1\n  - b: \n    c:\n      - True\n      - 2.5e-07\nd:\n\ne:\n\nf:   x"
        );
    }

    #[test]
    fn scalars_follow_python_str() {
        assert_eq!(r("null"), "");
        assert_eq!(r("true"), "True");
        assert_eq!(r("false"), "False");
        assert_eq!(r("1180591620717411303424"), "1180591620717411303424");
        assert_eq!(r("-0"), "0");
        assert_eq!(r("-0.0"), "-0.0");
        assert_eq!(r("1E400"), "inf");
        assert_eq!(r("-1e400"), "-inf");
        assert_eq!(r("3.0"), "3.0");
        assert_eq!(r("1e16"), "1e+16");
        assert_eq!(r("0.0001"), "0.0001");
        assert_eq!(r("1E-5"), "1e-05");
        assert_eq!(r(r#""  kept as is  ""#), "  kept as is  ");
        assert_eq!(r("{}"), "");
        assert_eq!(r("[]"), "");
    }

    #[test]
    fn lstrip_uses_python_whitespace() {
        // U+001C..U+001F and U+3000 are Python whitespace; U+200B (zero width space) is not.
        assert_eq!(
            r(r#"["\u001c\u001d\u001e\u001fa", "\u3000b", "\u200bc", "\u0085\u00a0d"]"#),
            "- a\n- b\n- \u{200b}c\n- d"
        );
        assert!(is_py_space('\u{1f}'));
        assert!(!is_py_space('\u{200b}'));
        assert_eq!(py_lstrip("\u{2028}\u{205f} x "), "x ");
    }

    #[test]
    fn nested_lists_strip_first_line_only() {
        assert_eq!(r(r#"[{"a": 1, "b": [" x"]}]"#), "- a: 1\n  b:\n    - x");
        assert_eq!(r(r#"[[" a", " b"]]"#), "- - a\n  - b");
        assert_eq!(r(r#"[{"k": {}}]"#), "- k:\n");
    }

    #[test]
    fn option_texts() {
        let v = |s: &str| serde_json::from_str::<Value>(s).expect("valid");
        assert_eq!(option_text("Billing", None), "Billing");
        assert_eq!(option_text("Billing", Some(&v("null"))), "Billing");
        assert_eq!(option_text("Billing", Some(&v(r#""""#))), "Billing");
        assert_eq!(option_text("Billing", Some(&v("{}"))), "Billing: ");
        assert_eq!(option_text("Billing", Some(&v("[]"))), "Billing: ");
        assert_eq!(option_text("x", Some(&v("false"))), "x: False");
        assert_eq!(option_text("x", Some(&v("0"))), "x: 0");
        assert_eq!(
            option_text("Billing", Some(&v(r#"{"owns":["invoices","refunds"]}"#))),
            "Billing: owns:\n  - invoices\n  - refunds"
        );
    }
}
