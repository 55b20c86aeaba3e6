//! Lone surrogates (`"\ud800"`) kept distinct from each other and from U+FFFD.
//!
//! JSON allows a `\uXXXX` escape of a lone UTF-16 surrogate; Python keeps it in the `str`, a Rust `String`
//! cannot hold it. Reading every lone surrogate as U+FFFD would merge two question ids `"\ud800"` and
//! `"\udc00"` (or two options) into one. So the reader ([`crate::pyjson`]) writes a lone surrogate as
//! [`ESC`] followed by its four lowercase hex digits, and a literal [`ESC`] (a noncharacter) as two of
//! them; the mapping is one-to-one. Three places read the form back:
//! - text the model sees ([`model_text`]): a lone surrogate is U+FFFD there, as before (Python could not
//!   tokenize it at all);
//! - JSON written to a client ([`wire`]): the escape again, `"\ud800"`, so ids come back as sent;
//! - `json.dumps` for `usage.output_tokens` ([`crate::python_dumps`]): `\ud800`, as Python writes it.

use std::borrow::Cow;

/// The escape character (U+FDDF, a noncharacter: never meaningful in interchange).
pub const ESC: char = '\u{FDDF}';

/// One piece of a string in the escaped form.
pub(crate) enum Piece<'a> {
    /// Plain text.
    Text(&'a str),
    /// A literal U+FDDF.
    Esc,
    /// A lone surrogate code unit.
    Surrogate(&'a str),
}

/// The pieces of `s`, in order.
pub(crate) fn pieces(s: &str) -> impl Iterator<Item = Piece<'_>> {
    let mut rest = s;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.find(ESC) {
            Some(0) => {
                let after = &rest[ESC.len_utf8()..];
                if let Some(r) = after.strip_prefix(ESC) {
                    rest = r;
                    Some(Piece::Esc)
                } else if after.len() >= 4 && after.is_char_boundary(4) {
                    let (hex, r) = after.split_at(4);
                    rest = r;
                    Some(Piece::Surrogate(hex))
                } else {
                    // Not produced by the reader; keep it as text.
                    let (t, r) = rest.split_at(ESC.len_utf8());
                    rest = r;
                    Some(Piece::Text(t))
                }
            }
            Some(i) => {
                let (t, r) = rest.split_at(i);
                rest = r;
                Some(Piece::Text(t))
            }
            None => {
                let t = rest;
                rest = "";
                Some(Piece::Text(t))
            }
        }
    })
}

/// The text the model sees: lone surrogates as U+FFFD (borrowed when there is nothing to undo).
pub fn model_text(s: &str) -> Cow<'_, str> {
    if !s.contains(ESC) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    for p in pieces(s) {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Esc => out.push(ESC),
            Piece::Surrogate(_) => out.push('\u{FFFD}'),
        }
    }
    Cow::Owned(out)
}

/// JSON text (as `serde_json` writes it: non-ASCII raw) with every escaped lone surrogate written back as
/// its `\uXXXX` escape and every doubled [`ESC`] as one.
pub fn wire(json: String) -> String {
    if !json.contains(ESC) {
        return json;
    }
    let mut out = String::with_capacity(json.len());
    for p in pieces(&json) {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Esc => out.push(ESC),
            Piece::Surrogate(hex) => {
                out.push_str("\\u");
                out.push_str(hex);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_model_text() {
        let s = format!("a{ESC}d800b{ESC}{ESC}c{ESC}dc00");
        assert_eq!(model_text(&s), format!("a\u{FFFD}b{ESC}c\u{FFFD}"));
        assert_eq!(
            wire(format!("\"{s}\"")),
            format!("\"a\\ud800b{ESC}c\\udc00\"")
        );
        assert_eq!(model_text("plain"), "plain");
        assert!(matches!(model_text("plain"), Cow::Borrowed(_)));
    }
}
