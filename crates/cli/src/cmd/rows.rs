//! `kev rows`: what a request compiles to, without a model (kev-contract §5): per question the row's token ids,
//! positions, readout indices and option keys, plus `input_tokens`; or the status and body an invalid request
//! gets (exit 2).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use kev_decide::rows::rows;
use kev_tokenize::{KevTokenizer, Limits};

/// Show what a request compiles to (token rows, readout indices, usage) without running a model.
#[derive(clap::Args)]
pub struct Args {
    /// The `tokenizer.json` (the Kev variant, or a base Qwen3.5 one: its split regex is switched).
    #[arg(long, env = "KEV_TOKENIZER")]
    tokenizer: PathBuf,
    /// The request body (JSON, as it would be POSTed to /v1/systemone).
    #[arg(long)]
    request: PathBuf,
    /// Read only the first 65,536 tokens of a longer state instead of refusing it.
    #[arg(long, env = "KEV_TRUNCATE_STATES")]
    truncate_state: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let body = std::fs::read(&args.request)
        .with_context(|| format!("reading {}", args.request.display()))?;
    let tok = KevTokenizer::from_file(&args.tokenizer)?;
    let limits = Limits {
        truncate_state: args.truncate_state,
        ..Limits::KEV
    };
    let (out, code) = match rows(&tok, &body, &limits)? {
        Ok(v) => (v, ExitCode::SUCCESS),
        Err(refused) => (
            serde_json::json!({ "status": refused.status(), "body": refused.body() }),
            ExitCode::from(2),
        ),
    };
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &out)?;
    writeln!(stdout)?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    fn tokenizer() -> KevTokenizer {
        let p =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/kev/tokenizer.json");
        KevTokenizer::from_file(p).expect("fixture tokenizer loads")
    }

    #[test]
    fn rows_of_a_request_and_refusals() {
        let tok = tokenizer();
        let body = br#"{"state": "Charged twice.", "questions": {"a": {"type": "noul"}, "b": {"type": "choice", "criteria": {"X": null, "Y": "y"}}}}"#;
        let out = rows(&tok, body, &Limits::KEV)
            .expect("no fault")
            .expect("valid");
        let state = out["state_tokens"].as_u64().expect("state tokens") as usize;
        let qs = out["questions"].as_array().expect("questions");
        assert_eq!(qs.len(), 2);
        let mut total = state;
        for q in qs {
            let row = q["row_ids"].as_array().expect("row");
            assert_eq!(q["positions"].as_array().map(Vec::len), Some(row.len()));
            assert_eq!(q["decide"].as_u64(), Some(row.len() as u64 - 1));
            assert_eq!(row[row.len() - 1], json!(kev_tokenize::DECIDE));
            for end in q["option_ends"].as_array().expect("ends") {
                let end = end.as_u64().expect("index") as usize;
                assert_eq!(row[end], json!(kev_tokenize::OPTION_CLOSE));
            }
            total += q["branch_tokens"].as_u64().expect("branch tokens") as usize;
        }
        assert_eq!(out["input_tokens"].as_u64(), Some(total as u64));
        assert_eq!(qs[1]["keys"], json!(["X", "Y"]));

        let refused = rows(&tok, b"{", &Limits::KEV)
            .expect("no fault")
            .expect_err("invalid");
        assert_eq!(refused.status(), 422);
        assert_eq!(refused.body()["detail"][0]["type"], json!("json_invalid"));

        let small = Limits {
            max_state_tokens: 2,
            ..Limits::KEV
        };
        let refused = rows(&tok, body, &small)
            .expect("no fault")
            .expect_err("over the limit");
        assert_eq!(refused.status(), 422);
        assert_eq!(
            refused.body()["detail"]["error_type"],
            json!("invalid_request_error")
        );
    }
}
