//! Load-time checks (kev-contract §1, §4.2a): a file that is not Kev's tokenizer fails with a clear error.

use std::path::Path;

use kev_tokenize::{KevTokenizer, LoadError};
use serde_json::Value;

fn kev_json() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/kev/tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(p).expect("reads")).expect("json")
}

fn load(v: &Value) -> Result<KevTokenizer, LoadError> {
    KevTokenizer::from_json_str(&v.to_string(), "edited.json")
}

#[test]
fn wrong_ids_vocab_and_pre_tokenizers_are_refused() {
    let original = kev_json();

    // A delimiter with another id.
    let mut v = original.clone();
    let added = v["added_tokens"].as_array_mut().expect("added tokens");
    let fim = added
        .iter_mut()
        .find(|t| t["content"] == "<|fim_prefix|>")
        .expect("present");
    fim["content"] = Value::String("<|fim_prefix_x|>".into());
    match load(&v) {
        Err(
            e @ LoadError::TokenId {
                token: "<|fim_prefix|>",
                expected: 248_060,
                ..
            },
        ) => {
            assert!(e.to_string().contains("<|fim_prefix|>"));
        }
        other => panic!("{other:?}"),
    }

    // One added token fewer: the vocabulary is not 248,077 ids.
    let mut v = original.clone();
    let added = v["added_tokens"].as_array_mut().expect("added tokens");
    let at = added
        .iter()
        .position(|t| t["content"] == "<|audio_pad|>")
        .expect("present");
    added.remove(at);
    assert!(matches!(
        load(&v),
        Err(LoadError::VocabSize {
            expected: 248_077,
            found: 248_076
        })
    ));

    // An unknown split regex.
    let mut v = original.clone();
    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = Value::String(r"\s+".into());
    assert!(matches!(load(&v), Err(LoadError::PreTokenizer(_))));

    // Not a tokenizer at all.
    assert!(matches!(
        KevTokenizer::from_json_str("{}", "x.json"),
        Err(LoadError::PreTokenizer(_))
    ));
    assert!(matches!(
        KevTokenizer::from_json_str("not json", "x.json"),
        Err(LoadError::Parse { .. })
    ));
    assert!(matches!(
        KevTokenizer::from_file("/nonexistent/tokenizer.json"),
        Err(LoadError::Read { .. })
    ));

    // The untouched file loads.
    assert!(load(&original).is_ok());
}
