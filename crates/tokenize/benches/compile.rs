//! `compile` throughput on named request shapes (run: `cargo bench -p kev-tokenize`). Plain timing loop, no
//! harness: median of repeated runs, printed with the shape.

use std::path::Path;
use std::time::{Duration, Instant};

use kev_contract::parse_request;
use kev_tokenize::{KevTokenizer, Limits};
use serde_json::json;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/kev/tokenizer.json");
    let t0 = Instant::now();
    let tok = KevTokenizer::from_file(p).expect("fixture tokenizer");
    println!("load: {:.2?}", t0.elapsed());

    for text in ["Question 7?", "no"] {
        let t = Instant::now();
        for _ in 0..1000 {
            tok.user_tokens(text).expect("encodes");
        }
        println!("user_tokens({text:?}): {:.2?} per call", t.elapsed() / 1000);
    }

    let ticket = "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week \
                  still hasn't arrived. I've emailed three times. Please fix this today or I will dispute the charge \
                  with my bank. ";
    let questions = json!({
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                 "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages, integrations",
                              "Sales": "Pricing questions, upgrades, new contracts"}},
        "anger": {"type": "score", "instructions": "How frustrated is the customer?",
                  "criteria": ["Calm", "Frustrated", "Very angry"]},
        "threat": {"type": "noul", "criteria": {"true": "The customer threatens a chargeback", "false": "No threat"}},
        "lang": {"type": "choice", "criteria": {"English": null, "Other": null}}
    });
    let many: serde_json::Map<String, serde_json::Value> = (0..64)
        .map(|i| {
            (
                format!("q{i}"),
                json!({"type": "noul", "instructions": format!("Question {i}?")}),
            )
        })
        .collect();
    let shapes = [
        (
            "multi: 68-token state, 5 questions",
            ticket.to_owned(),
            questions.clone(),
        ),
        (
            "2.2k-token state, 5 questions",
            ticket.repeat(48),
            questions.clone(),
        ),
        (
            "2.2k-token state, 64 noul questions",
            ticket.repeat(48),
            serde_json::Value::Object(many),
        ),
        (
            "64k-token state, 5 questions",
            ticket.repeat(1250),
            questions,
        ),
    ];
    for (name, state, qs) in shapes {
        let body = json!({"state": state, "questions": qs}).to_string();
        let mut parse = Vec::new();
        let mut compile = Vec::new();
        let mut input_tokens = 0;
        let reps = if body.len() > 100_000 { 5 } else { 50 };
        for _ in 0..reps {
            let t = Instant::now();
            let req = parse_request(body.as_bytes()).expect("valid");
            parse.push(t.elapsed());
            let t = Instant::now();
            let c = tok.compile(&req, &Limits::KEV).expect("compiles");
            compile.push(t.elapsed());
            input_tokens = c.input_tokens();
        }
        println!(
            "{name}: input_tokens {input_tokens}, parse+validate+render {:.2?}, compile {:.2?} (median of {reps})",
            median(parse),
            median(compile)
        );
    }
}
