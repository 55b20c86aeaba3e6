//! Loading and checking the tokenizer (kev-contract §1, §4.2a), and the encoders.

use std::path::Path;
use std::str::FromStr;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::error::{LoadError, TokenizeError};
use crate::rewrite::neutralize_delimiters;

/// `<|fim_prefix|>`: opens the state.
pub const STATE: u32 = 248_060;
/// `<|fim_middle|>`: opens a question branch.
pub const QUESTION: u32 = 248_061;
/// `<|box_start|>`: opens an option.
pub const OPTION_OPEN: u32 = 248_049;
/// `<|box_end|>`: closes an option (an option readout position).
pub const OPTION_CLOSE: u32 = 248_050;
/// `<|fim_suffix|>`: ends a branch (the decide readout position).
pub const DECIDE: u32 = 248_062;
/// `<|endoftext|>`: pad / eos (never added).
pub const ENDOFTEXT: u32 = 248_044;
/// 248,044 BPE entries + 33 added tokens.
pub const VOCAB_SIZE: usize = 248_077;

/// The special tokens checked at load: text and Kev's id.
const CHECKED: [(&str, u32); 6] = [
    ("<|fim_prefix|>", STATE),
    ("<|fim_middle|>", QUESTION),
    ("<|box_start|>", OPTION_OPEN),
    ("<|box_end|>", OPTION_CLOSE),
    ("<|fim_suffix|>", DECIDE),
    ("<|endoftext|>", ENDOFTEXT),
];

/// The split regex Kev 1.0 tokenized with (Qwen2's: combining marks are not kept with letters).
const KEV_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The base Qwen3.5 file's split regex (`[\p{L}\p{M}]+`), which Kev 1.0 did not use.
const BASE_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Which pre-tokenizer the loaded file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerVariant {
    /// The Kev repository's file: Qwen2 split regex, used as is.
    Kev,
    /// A base Qwen3.5 file: its split regex was replaced by the Kev one.
    BaseSwitched,
}

/// The Kev tokenizer: a checked `tokenizers::Tokenizer` (`Send + Sync`; share it behind an `Arc`).
pub struct KevTokenizer {
    inner: Tokenizer,
    variant: PreTokenizerVariant,
}

impl std::fmt::Debug for KevTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KevTokenizer")
            .field("variant", &self.variant)
            .finish_non_exhaustive()
    }
}

impl KevTokenizer {
    /// Load a `tokenizer.json`: the Kev variant, or a base variant with its split regex switched (logged).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, LoadError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json_str(&text, path)
    }

    /// Load from the text of a `tokenizer.json` (`origin` names it in errors and logs).
    pub fn from_json_str(text: &str, origin: impl AsRef<Path>) -> Result<Self, LoadError> {
        let origin = origin.as_ref();
        let parse = |message: String| LoadError::Parse {
            path: origin.to_owned(),
            message,
        };
        let mut doc: Value = serde_json::from_str(text).map_err(|e| parse(e.to_string()))?;
        let regex = split_regex(&mut doc)?;
        let variant = if regex.as_str() == Some(KEV_SPLIT) {
            PreTokenizerVariant::Kev
        } else if regex.as_str() == Some(BASE_SPLIT) {
            *regex = Value::String(KEV_SPLIT.to_owned());
            PreTokenizerVariant::BaseSwitched
        } else {
            return Err(LoadError::PreTokenizer(format!(
                "split regex {regex} is neither Kev's (Qwen2) nor the base Qwen3.5 one"
            )));
        };
        let inner = match variant {
            PreTokenizerVariant::Kev => Tokenizer::from_str(text),
            PreTokenizerVariant::BaseSwitched => {
                let switched = serde_json::to_string(&doc).map_err(|e| parse(e.to_string()))?;
                Tokenizer::from_str(&switched)
            }
        }
        .map_err(|e| parse(e.to_string()))?;
        match variant {
            PreTokenizerVariant::Kev => tracing::info!(
                file = %origin.display(),
                "tokenizer: Kev variant (Qwen2 split regex), used as is"
            ),
            PreTokenizerVariant::BaseSwitched => tracing::info!(
                file = %origin.display(),
                "tokenizer: base Qwen3.5 variant; split regex switched to Kev's (Qwen2) one, as Kev 1.0 tokenized"
            ),
        }
        let tok = KevTokenizer { inner, variant };
        tok.verify()?;
        Ok(tok)
    }

    fn verify(&self) -> Result<(), LoadError> {
        for (token, expected) in CHECKED {
            let found = self.inner.token_to_id(token);
            if found != Some(expected) {
                return Err(LoadError::TokenId {
                    token,
                    expected,
                    found,
                });
            }
        }
        let found = self.inner.get_vocab_size(true);
        if found != VOCAB_SIZE {
            return Err(LoadError::VocabSize {
                expected: VOCAB_SIZE,
                found,
            });
        }
        Ok(())
    }

    /// Which file variant was loaded.
    pub fn variant(&self) -> PreTokenizerVariant {
        self.variant
    }

    /// The wrapped tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Token ids of `text` with no rewrite and no special-token additions (added tokens in the text match).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }

    /// `user_tokens(text)` (§4.1): `<|name|>` → `<¦name¦>`, then [`Self::encode_plain`].
    pub fn user_tokens(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        self.encode_plain(&neutralize_delimiters(text))
    }

    /// `Some(n)` when `text` (a state, before its `<|fim_prefix|>`) is certainly more than `limit - 1` tokens:
    /// `n` tokens were counted in a leading part of it. `None` when it may fit: then it must be tokenized in
    /// full. Texts of up to 4 bytes per allowed token are never judged here (`None`).
    ///
    /// Long texts are counted piece by piece (~64 KiB each), each piece ending just before a space or newline
    /// that follows an ASCII letter or digit: both split regexes end a pre-token there, so the pieces' counts
    /// add up to the whole text's count; `64` tokens of slack per cut cover a cut where no such place was
    /// found (then at a character boundary). Counting stops as soon as the sum is over the limit plus the
    /// slack, so refusing a megabytes-long state costs about as much as tokenizing `limit` tokens.
    pub fn certainly_over(&self, text: &str, limit: usize) -> Option<usize> {
        const PIECE: usize = 64 << 10;
        const SLACK_PER_CUT: usize = 64;
        if text.len() <= limit.saturating_mul(4) {
            return None;
        }
        let mut over = None;
        self.count_in_pieces(text, PIECE, |counted, cuts| {
            // The state's own `<|fim_prefix|>` makes `counted + 1` tokens.
            if counted + 1 > limit.saturating_add(SLACK_PER_CUT * cuts) {
                over = Some(counted + 1);
                return false;
            }
            true
        })
        .ok()?;
        over
    }

    /// `user_tokens(text).len()` counted piece by piece (pieces of about `piece` bytes, cut as
    /// [`Self::certainly_over`] describes), calling `go(counted so far, cuts so far)` after each piece and
    /// stopping when it returns false. Returns the count reached.
    pub fn count_in_pieces(
        &self,
        text: &str,
        piece: usize,
        mut go: impl FnMut(usize, usize) -> bool,
    ) -> Result<usize, TokenizeError> {
        let len = text.len();
        let mut at = 0;
        let mut counted = 0usize;
        let mut cuts = 0usize;
        while at < len {
            let end = piece_end(text, at, piece.max(1));
            counted += self.user_tokens(&text[at..end])?.len();
            if end < len {
                cuts += 1;
            }
            if !go(counted, cuts) {
                break;
            }
            at = end;
        }
        Ok(counted)
    }

    /// `usage.output_tokens` (§8.4): tokens of Python's default `json.dumps(answers)`, plain tokenizer.
    pub fn output_tokens(&self, answers: &Value) -> Result<usize, TokenizeError> {
        self.encode_plain(&kev_contract::python_dumps(answers))
            .map(|ids| ids.len())
    }
}

/// The `pattern.Regex` of the file's `Split` pre-tokenizer (the first of a `Sequence`, or the only one).
fn split_regex(doc: &mut Value) -> Result<&mut Value, LoadError> {
    let pre = doc
        .get_mut("pre_tokenizer")
        .ok_or_else(|| LoadError::PreTokenizer("no pre_tokenizer".into()))?;
    let split = if pre.get("type").and_then(Value::as_str) == Some("Sequence") {
        pre.get_mut("pretokenizers")
            .and_then(Value::as_array_mut)
            .and_then(|v| {
                v.iter_mut()
                    .find(|p| p.get("type").and_then(Value::as_str) == Some("Split"))
            })
    } else if pre.get("type").and_then(Value::as_str) == Some("Split") {
        Some(pre)
    } else {
        None
    };
    split
        .and_then(|s| s.get_mut("pattern"))
        .and_then(|p| p.get_mut("Regex"))
        .ok_or_else(|| {
            LoadError::PreTokenizer("no Split pre-tokenizer with a Regex pattern".into())
        })
}

/// Where a counting piece that starts at `at` ends: just before the first space or newline after `at + piece`
/// that follows an ASCII letter or digit (looking 4 KiB further), else at the next character boundary.
fn piece_end(text: &str, at: usize, piece: usize) -> usize {
    let b = text.as_bytes();
    let want = at + piece;
    if want >= b.len() {
        return b.len();
    }
    let look = (want + (4 << 10)).min(b.len());
    for i in want.max(at + 1)..look {
        if matches!(b[i], b' ' | b'\n') && b[i - 1].is_ascii_alphanumeric() {
            return i;
        }
    }
    let mut i = want;
    while !text.is_char_boundary(i) {
        i += 1;
    }
    i
}
