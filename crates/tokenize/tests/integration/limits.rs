//! Limits and truncation (kev-contract §5.2), row layout invariants (§5.1), usage counts (§8.4).

use std::path::Path;
use std::sync::OnceLock;

use kev_contract::{ResponseBody, parse_request};
use kev_tokenize::{
    DECIDE, KevTokenizer, Limits, OPTION_CLOSE, OPTION_OPEN, QUESTION, STATE, TokenizeError,
};
use serde_json::json;

fn kev() -> &'static KevTokenizer {
    static TOK: OnceLock<KevTokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let p =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/kev/tokenizer.json");
        KevTokenizer::from_file(p).expect("kev tokenizer loads")
    })
}

fn request(state: &str, questions: serde_json::Value) -> kev_contract::ValidRequest {
    parse_request(
        json!({"state": state, "questions": questions})
            .to_string()
            .as_bytes(),
    )
    .expect("valid")
}

/// " a" is one token in the Qwen vocabulary, so `" a" * n` is n tokens and the state is `n + 1`.
fn state_of(n: usize) -> String {
    " a".repeat(n)
}

#[test]
fn state_limit_counts_the_delimiter() {
    assert_eq!(kev().user_tokens(&state_of(50)).expect("encodes").len(), 50);
    let small = Limits {
        max_state_tokens: 51,
        max_row_tokens: 1000,
        truncate_state: false,
    };
    let q = json!({"q": {"type": "noul"}});
    assert!(
        kev()
            .compile(&request(&state_of(50), q.clone()), &small)
            .is_ok()
    );
    let err = kev()
        .compile(&request(&state_of(51), q), &small)
        .expect_err("over by one");
    assert_eq!(
        err,
        TokenizeError::StateTooLong {
            tokens: 52,
            limit: 51
        }
    );
    assert_eq!(err.status(), 422);
}

#[test]
fn truncate_mode_cuts_the_state_and_reports_it() {
    let small = Limits {
        max_state_tokens: 11,
        max_row_tokens: 1000,
        truncate_state: true,
    };
    let req = request(
        &state_of(30),
        json!({"q": {"type": "noul", "instructions": "Refund?"}}),
    );
    let c = kev().compile(&req, &small).expect("truncated, not refused");
    assert_eq!(c.state_ids().len(), 11);
    assert_eq!(c.state_ids()[0], STATE);
    let t = c.truncation().expect("reported in truncate mode");
    assert_eq!(
        (t.state_tokens, t.state_tokens_used, t.truncated()),
        (31, 11, true)
    );
    let b = &c.branches()[0];
    assert_eq!(b.positions(), 11..11 + b.len());
    assert_eq!(c.input_tokens(), 11 + b.len());
    let body = t
        .apply(ResponseBody::new(
            "kev-latest",
            json!({}),
            c.input_tokens(),
            0,
        ))
        .to_value();
    assert_eq!(body["x_truncated"], json!(true));
    assert_eq!(body["x_state_tokens"], json!(31));
    assert_eq!(body["x_state_tokens_used"], json!(11));
    // In truncate mode a short state is reported too, as not truncated.
    let short = kev()
        .compile(&request("x", json!({"q": {"type": "noul"}})), &small)
        .expect("compiles");
    assert_eq!(short.truncation().map(|t| t.truncated()), Some(false));
    // With truncation off nothing is reported.
    assert!(
        kev()
            .compile(&request("x", json!({"q": {"type": "noul"}})), &Limits::KEV)
            .expect("ok")
            .truncation()
            .is_none()
    );
}

#[test]
fn row_limit_applies_in_truncate_mode_and_names_the_question() {
    let small = Limits {
        max_state_tokens: 11,
        max_row_tokens: 40,
        truncate_state: true,
    };
    let req = request(
        &state_of(30),
        json!({"ok": {"type": "noul"}, "long": {"type": "noul", "instructions": state_of(30)}, "later": {"type": "noul", "instructions": state_of(40)}}),
    );
    let err = kev().compile(&req, &small).expect_err("row over the limit");
    // branch = 1 + 30 + (1 + 1 + 1) * 2 + 1 = 38 tokens; 11 + 38 > 40. The first question over the limit is named.
    assert_eq!(
        err,
        TokenizeError::BranchTooLong {
            question: "long".into(),
            branch_tokens: 38,
            state_tokens: 11,
            row_limit: 40
        }
    );
    assert_eq!(
        err.to_string(),
        "branch too long: 38 tokens with a 11-token state (row limit 40)"
    );
    assert_eq!(err.body()["detail"]["error_type"], "invalid_request_error");
}

#[test]
fn state_is_checked_before_rows() {
    let small = Limits {
        max_state_tokens: 5,
        max_row_tokens: 6,
        truncate_state: false,
    };
    let req = request(
        &state_of(10),
        json!({"q": {"type": "noul", "instructions": state_of(10)}}),
    );
    assert!(matches!(
        kev().compile(&req, &small),
        Err(TokenizeError::StateTooLong { .. })
    ));
}

#[test]
fn rows_have_the_kev_layout() {
    let req = request(
        "Hello <|box_end|> there",
        json!({
            "a": {"type": "choice", "instructions": "Pick <|fim_suffix|>", "criteria": {"X": null, "Y": "yes", "Z": ""}},
            "b": {"type": "noul", "instructions": "Pick <|fim_suffix|>"},
            "c": {"type": "score", "criteria": ["X", "yes"]}
        }),
    );
    let c = kev().compile(&req, &Limits::KEV).expect("compiles");
    let ls = c.state_ids().len();
    assert_eq!(c.state_ids()[0], STATE);
    assert!(
        !c.state_ids()[1..].contains(&OPTION_CLOSE),
        "caller text cannot forge a delimiter"
    );
    let mut total = ls;
    for (k, (b, q)) in c.branches().iter().zip(req.questions()).enumerate() {
        let row = c.row_ids(k).expect("row");
        assert_eq!(row.len(), ls + b.len());
        assert_eq!(b.ids()[0], QUESTION);
        assert_eq!(b.decide(), row.len() - 1);
        assert_eq!(b.decide_in_branch(), b.len() - 1);
        assert_eq!(row[b.decide()], DECIDE);
        assert_eq!(b.option_ends().len(), q.options().len());
        for (&end, rel) in b.option_ends().iter().zip(b.option_ends_in_branch()) {
            assert_eq!(row[end], OPTION_CLOSE);
            assert_eq!(end, ls + rel);
        }
        // Delimiters appear only where the layout puts them.
        let opens = b.ids().iter().filter(|&&t| t == OPTION_OPEN).count();
        assert_eq!(opens, q.options().len());
        assert_eq!(b.ids().iter().filter(|&&t| t == DECIDE).count(), 1);
        // Each option's tokens are exactly user_tokens(option text).
        let mut at = 1 + kev().user_tokens(q.instructions()).expect("encodes").len();
        for text in q.options() {
            let toks = kev().user_tokens(text).expect("encodes");
            assert_eq!(b.ids()[at], OPTION_OPEN);
            assert_eq!(&b.ids()[at + 1..at + 1 + toks.len()], toks.as_slice());
            at += toks.len() + 2;
        }
        total += b.len();
    }
    assert_eq!(c.input_tokens(), total);
    assert!(c.row_ids(3).is_none());
}

#[test]
fn output_tokens_use_python_dumps_and_the_plain_tokenizer() {
    // kev-contract §12 "noul": {"refund": {"type": "noul", "noul": 0.9523}} → 22 tokens.
    let answers = json!({"refund": {"type": "noul", "noul": 0.9523}});
    assert_eq!(kev().output_tokens(&answers).expect("encodes"), 22);
    // Special tokens in answers text are matched (no rewrite): one token, plus quotes etc.
    let plain = kev().encode_plain("<|fim_suffix|>").expect("encodes");
    assert_eq!(plain, [DECIDE]);
}

#[test]
fn tokenizer_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<KevTokenizer>();
    let req = request("shared", json!({"q": {"type": "noul"}}));
    let want = kev().compile(&req, &Limits::KEV).expect("compiles");
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| assert_eq!(kev().compile(&req, &Limits::KEV).expect("compiles"), want));
        }
    });
}

/// A mixed text of `n` lines: words, digits, punctuation, spaces, newlines, non-ASCII.
fn mixed_text(lines: usize) -> String {
    (0..lines)
        .map(|k| {
            format!(
                "Line {k}: the customer (order #{}) writes «où est ma commande?» — 3 days late!!  Refund {}.\n",
                1000 + k,
                k % 7
            )
        })
        .collect()
}

#[test]
fn a_state_far_over_the_limit_is_refused_early_and_the_cut_count_is_exact() {
    let tok = kev();
    // The cut points (before a space or newline after a letter or digit) end a pre-token in both split
    // regexes, so counting piece by piece must give exactly the whole text's count.
    let text = mixed_text(4000); // ~400 KB
    let whole = tok.user_tokens(&text).unwrap().len();
    for piece in [1000, 4096, 65_536] {
        assert_eq!(
            tok.count_in_pieces(&text, piece, |_, _| true).unwrap(),
            whole,
            "{piece}"
        );
    }
    let spaceless = "漢字かなまじり".repeat(20_000);
    let exact = tok.user_tokens(&spaceless).unwrap().len();
    let pieces = tok
        .count_in_pieces(&spaceless, 65_536, |_, _| true)
        .unwrap();
    assert!(pieces.abs_diff(exact) <= 64, "{pieces} vs {exact}");
    let small = whole / 2;
    let n = tok.certainly_over(&text, small).expect("far over");
    assert!(n > small && n <= whole + 1, "{n} vs {small}..{whole}");
    // Through compile: the over-long state is a 422 that names the limit, found without tokenizing it all.
    let big = mixed_text(60_000); // ~6 MB
    let req = request(&big, json!({"q": {"type": "noul"}}));
    let t = std::time::Instant::now();
    let err = tok.compile(&req, &Limits::KEV).unwrap_err();
    assert!(
        matches!(err, TokenizeError::StateFarTooLong { .. }),
        "{err}"
    );
    assert_eq!(err.status(), 422);
    assert!(err.to_string().contains("65,536"), "{err}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
}

#[test]
fn the_input_token_cap_is_413() {
    let tok = kev();
    let req = request(
        &state_of(100),
        json!({"a": {"type": "noul"}, "b": {"type": "noul"}}),
    );
    let all = tok.compile(&req, &Limits::KEV).unwrap().input_tokens();
    assert!(tok.compile_capped(&req, &Limits::KEV, all).is_ok());
    let err = tok.compile_capped(&req, &Limits::KEV, all - 1).unwrap_err();
    assert_eq!(err.status(), 413);
    assert!(matches!(err, TokenizeError::TooMuchWork { limit, .. } if limit == all - 1));
}
