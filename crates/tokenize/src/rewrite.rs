//! The delimiter rewrite of kev-contract §4.1: `<|name|>` → `<¦name¦>` (U+00A6), so that caller text can never
//! produce one of the `<|…|>` special tokens (the tokenizer matches added tokens anywhere in its input).

use std::borrow::Cow;

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Python's `re.sub(r"<\|([A-Za-z0-9_]+)\|>", r"<¦\1¦>", text)`: leftmost non-overlapping matches, left to right.
/// Borrows the text when there is nothing to rewrite.
pub fn neutralize_delimiters(text: &str) -> Cow<'_, str> {
    let b = text.as_bytes();
    let mut out: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while let Some(off) = memchr_lt_pipe(&b[i..]) {
        let start = i + off;
        let name_start = start + 2;
        let mut j = name_start;
        while j < b.len() && is_name_byte(b[j]) {
            j += 1;
        }
        // A name is ASCII alphanumerics/underscore and cannot contain `|`, so the greedy run is the only
        // candidate: the regex's backtracking cannot find a shorter name followed by `|>`.
        if j > name_start && b.get(j..j + 2) == Some(b"|>") {
            let s = out.get_or_insert_with(|| String::with_capacity(text.len() + 8));
            s.push_str(&text[copied..start]);
            s.push_str("<¦");
            s.push_str(&text[name_start..j]);
            s.push_str("¦>");
            copied = j + 2;
            i = j + 2;
        } else {
            i = start + 1;
        }
    }
    match out {
        None => Cow::Borrowed(text),
        Some(mut s) => {
            s.push_str(&text[copied..]);
            Cow::Owned(s)
        }
    }
}

/// Offset of the next `<|`.
fn memchr_lt_pipe(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"<|")
}

#[cfg(test)]
mod tests {
    use super::neutralize_delimiters as n;

    #[test]
    fn rewrites_like_python_re_sub() {
        assert_eq!(n("a <|fim_suffix|> b"), "a <¦fim_suffix¦> b");
        assert_eq!(n("<|a|><|b|>"), "<¦a¦><¦b¦>");
        assert_eq!(n("<|<|a|>"), "<|<¦a¦>");
        assert_eq!(n("<|a<|b|>"), "<|a<¦b¦>");
        assert_eq!(n("<||>"), "<||>");
        assert_eq!(n("<|a-b|>"), "<|a-b|>");
        assert_eq!(n("<|é|>"), "<|é|>");
        assert_eq!(n("<|x|"), "<|x|");
        assert_eq!(n("<think>"), "<think>");
        assert_eq!(n("é<|box_end|>é"), "é<¦box_end¦>é");
        assert!(matches!(n("plain text"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(n(""), "");
    }
}
