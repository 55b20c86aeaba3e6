//! The requests of `kev bench decide`, built with the Kev tokenizer so that their rows have exactly the lengths of
//! the Core AI port's timing cases: one question whose row (state + branch) has N tokens, or Q questions on a state
//! of exactly N tokens (`<|fim_prefix|>` included, as the limits count it).
//!
//! The questions are fixed (a support ticket's: a yes/no, two choices, two scores, …); only the state text grows.
//! It starts as a real ticket and is padded with sentences, then with single-token words, measuring the compiled
//! request after each step, until the count is exact — the fit never guesses at the tokenizer's merges.

use kev_tokenize::{CompiledRequest, KevTokenizer, Limits};
use serde_json::{Map, Value, json};

/// The state every case starts from (the fixtures' ticket).
const TICKET: &str = "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised \
last week still hasn't arrived. I've emailed three times. Please fix this today or I will dispute the charge with \
my bank.";

/// Padding, in order: the ticket's history. Each sentence is well under [`SENTENCE_ROOM`] tokens.
const SENTENCES: [&str; 12] = [
    "Update from support: we located the duplicate payment and opened a case with the billing team.",
    "The customer replied that the second charge is still pending on the card statement.",
    "Billing confirmed that the refund was issued on Monday but returned by the bank.",
    "A new refund request was filed with the corrected account details.",
    "The customer asked whether the late fee on the April invoice will also be removed.",
    "Support promised a written confirmation by email once the refund is processed.",
    "The account shows two active subscriptions, one of which was created by mistake.",
    "The customer mentioned that a colleague had the same problem last year.",
    "An agent noted that the order number on the invoice does not match the one in the shop.",
    "The payment provider reported no errors for either transaction.",
    "The customer prefers to be contacted by phone in the afternoon.",
    "The case was escalated to a supervisor after the third email.",
];

/// Words that are one token each after a space in the Qwen vocabulary, for the last few tokens of the fit.
const WORDS: [&str; 8] = [
    " the", " and", " order", " please", " thanks", " again", " today", " refund",
];

/// Sentences are appended while more than this many tokens are missing; words finish the fit.
const SENTENCE_ROOM: usize = 48;

/// The questions, in request order: the single-question case asks the first; the multi-question cases ask the
/// first Q.
fn questions() -> Vec<(&'static str, Value)> {
    vec![
        (
            "team",
            json!({"type": "choice", "instructions": "Which team should handle this ticket?",
                   "criteria": {"Billing": "Payments, invoices, refunds", "Technical": "Bugs, outages, integrations",
                                "Sales": "Pricing questions, upgrades, new contracts"}}),
        ),
        (
            "refund",
            json!({"type": "noul", "instructions": "Is the customer asking for money back?"}),
        ),
        (
            "anger",
            json!({"type": "score", "instructions": "How frustrated is the customer?",
                   "criteria": ["Calm", "Frustrated", "Very angry"]}),
        ),
        (
            "urgent",
            json!({"type": "noul", "instructions": "Does the customer need an answer today?"}),
        ),
        (
            "lang",
            json!({"type": "choice", "instructions": "What language is the ticket in?",
                   "criteria": {"English": null, "Other": null}}),
        ),
        (
            "polite",
            json!({"type": "score", "instructions": "How polite is the message?",
                   "criteria": ["Rude", "Neutral", "Polite"]}),
        ),
        (
            "threat",
            json!({"type": "noul", "criteria": {"true": "The customer threatens a chargeback",
                                                "false": "No threat"}}),
        ),
        (
            "escalate",
            json!({"type": "noul", "instructions": "Should a supervisor take over this case?"}),
        ),
    ]
}

/// Most questions a case can ask.
pub(super) const MAX_QUESTIONS: usize = 8;

/// What a case's request looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// One question whose whole row (state + branch) has this many tokens.
    OneQuestion {
        /// Row tokens.
        row_tokens: usize,
    },
    /// `questions` questions on a state of exactly `state_tokens` tokens.
    OnState {
        /// State tokens, `<|fim_prefix|>` included.
        state_tokens: usize,
        /// How many questions (1..=8).
        questions: usize,
    },
    /// As [`Shape::OnState`] with a JSON object for the state (a ticket record: channel, customer, the text),
    /// rendered as Kev renders JSON states: the timing case of the public Kev-9B CPU figure (one question on a
    /// 130–250-token JSON state).
    OnJsonState {
        /// State tokens, `<|fim_prefix|>` included.
        state_tokens: usize,
        /// How many questions (1..=8).
        questions: usize,
    },
}

/// A built request and its measured rows.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct CaseRequest {
    /// The request body (compact JSON).
    #[serde(skip)]
    pub body: Vec<u8>,
    /// `|S|`: state tokens, `<|fim_prefix|>` included.
    pub state_tokens: usize,
    /// Tokens of each question's branch.
    pub branch_tokens: Vec<usize>,
    /// `usage.input_tokens`: the state once plus every branch.
    pub input_tokens: usize,
}

impl CaseRequest {
    fn from_compiled(body: Vec<u8>, c: &CompiledRequest) -> Self {
        CaseRequest {
            body,
            state_tokens: c.state_ids().len(),
            branch_tokens: c.branches().iter().map(|b| b.len()).collect(),
            input_tokens: c.input_tokens(),
        }
    }

    /// Each question's row: state + its branch.
    pub fn row_tokens(&self) -> Vec<usize> {
        self.branch_tokens
            .iter()
            .map(|b| self.state_tokens + b)
            .collect()
    }

    /// Tokens the backbone runs with every row from zero (the author's form).
    pub fn tokens_from_zero(&self) -> usize {
        self.row_tokens().iter().sum()
    }

    /// Tokens run when the state is shared: the state up to its last multiple of `chunk` once, then per
    /// question the rest of the state and its branch (kev-decide's exact sharing).
    pub fn tokens_shared(&self, chunk: usize) -> usize {
        let aligned = self.state_tokens / chunk.max(1) * chunk.max(1);
        aligned + self.tokens_cached(chunk)
    }

    /// Tokens run on a cache hit: per question the state's tail past its last multiple of `chunk` and the
    /// branch.
    pub fn tokens_cached(&self, chunk: usize) -> usize {
        let tail = self.state_tokens % chunk.max(1);
        self.branch_tokens.iter().map(|b| tail + b).sum()
    }

    /// The question rows' share of the request's tokens: `Σ branch / input_tokens` — what a cache hit would
    /// cost relative to a miss if time followed tokens exactly and no state token were run again.
    pub fn question_share(&self) -> f64 {
        let q: usize = self.branch_tokens.iter().sum();
        q as f64 / self.input_tokens.max(1) as f64
    }
}

/// Build the request of `shape` with exactly its token counts.
pub(super) fn build(tok: &KevTokenizer, shape: Shape) -> anyhow::Result<CaseRequest> {
    let (n_questions, target) = match shape {
        Shape::OneQuestion { row_tokens } => (1, row_tokens),
        Shape::OnState {
            state_tokens,
            questions,
        }
        | Shape::OnJsonState {
            state_tokens,
            questions,
        } => (questions, state_tokens),
    };
    anyhow::ensure!(
        (1..=MAX_QUESTIONS).contains(&n_questions),
        "a case asks 1 to {MAX_QUESTIONS} questions, not {n_questions}"
    );
    let qs: Map<String, Value> = questions()
        .into_iter()
        .take(n_questions)
        .map(|(id, q)| (id.to_string(), q))
        .collect();
    let body_for = |state: &str| -> Vec<u8> {
        let state = match shape {
            Shape::OnJsonState { .. } => json!({"ticket": {
                "id": 4471, "channel": "email", "priority": "normal",
                "customer": {"name": "Sam Ortiz", "plan": "business", "since": "2021-03-14"},
                "text": state}}),
            _ => Value::String(state.to_string()),
        };
        let v = json!({"model": "kev-latest", "state": state, "questions": qs});
        serde_json::to_vec(&v).unwrap_or_default()
    };
    let compile = |body: &[u8]| -> anyhow::Result<CompiledRequest> {
        let req = kev_contract::parse_request(body)
            .map_err(|e| anyhow::anyhow!("the bench built an invalid request: {}", e.body()))?;
        tok.compile(&req, &Limits::KEV)
            .map_err(|e| anyhow::anyhow!("the bench built a request over a limit: {e}"))
    };
    let measure = |state: &str| -> anyhow::Result<usize> {
        let c = compile(&body_for(state))?;
        Ok(match shape {
            Shape::OneQuestion { .. } => c.state_ids().len() + c.branches()[0].len(),
            Shape::OnState { .. } | Shape::OnJsonState { .. } => c.state_ids().len(),
        })
    };
    let state = fit(target, measure)?;
    let body = body_for(&state);
    let c = compile(&body)?;
    Ok(CaseRequest::from_compiled(body, &c))
}

/// Grow [`TICKET`] until `measure` gives exactly `target`: whole sentences while far, then single words, each
/// step measured (a word that would overshoot is swapped for the next). `measure` must grow with the text.
fn fit(target: usize, measure: impl Fn(&str) -> anyhow::Result<usize>) -> anyhow::Result<String> {
    let mut text = TICKET.to_string();
    let mut t = measure(&text)?;
    anyhow::ensure!(
        t <= target,
        "the smallest request of this case already has {t} tokens, more than the {target} asked for"
    );
    let mut s = 0usize;
    while target - t > SENTENCE_ROOM {
        let next = format!("{text} {}", SENTENCES[s % SENTENCES.len()]);
        s += 1;
        let tn = measure(&next)?;
        anyhow::ensure!(tn > t && tn <= target, "padding sentence {s} did not fit");
        text = next;
        t = tn;
    }
    let mut w = 0usize;
    let mut misses = 0usize;
    while t < target {
        let next = format!("{text}{}", WORDS[w % WORDS.len()]);
        w += 1;
        let tn = measure(&next)?;
        if tn > t && tn <= target {
            text = next;
            t = tn;
            misses = 0;
        } else {
            misses += 1;
            anyhow::ensure!(
                misses < WORDS.len(),
                "no padding word fits the last {} tokens of {target}",
                target - t
            );
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> KevTokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/release/kev/tokenizer.json");
        KevTokenizer::from_file(path).unwrap()
    }

    #[test]
    fn rows_have_exactly_the_case_lengths() {
        let tok = tokenizer();
        for n in [94, 380, 1518, 1802] {
            let r = build(&tok, Shape::OneQuestion { row_tokens: n }).unwrap();
            assert_eq!(r.row_tokens(), [n], "one question of {n}");
            assert_eq!(r.input_tokens, n);
        }
        for (state, q) in [(137, 5), (137, 8), (1477, 4)] {
            let r = build(
                &tok,
                Shape::OnState {
                    state_tokens: state,
                    questions: q,
                },
            )
            .unwrap();
            assert_eq!(r.state_tokens, state);
            assert_eq!(r.branch_tokens.len(), q);
            assert_eq!(
                r.input_tokens,
                state + r.branch_tokens.iter().sum::<usize>()
            );
        }
    }

    #[test]
    fn a_json_state_case_has_exactly_its_state_tokens() {
        let tok = tokenizer();
        let r = build(
            &tok,
            Shape::OnJsonState {
                state_tokens: 190,
                questions: 1,
            },
        )
        .unwrap();
        assert_eq!((r.state_tokens, r.branch_tokens.len()), (190, 1));
        let req: Value = serde_json::from_slice(&r.body).unwrap();
        assert!(req["state"]["ticket"]["text"].is_string(), "{req}");
    }

    #[test]
    fn the_body_is_a_valid_request_that_compiles_to_the_measured_rows() {
        let tok = tokenizer();
        let shape = Shape::OnState {
            state_tokens: 137,
            questions: 5,
        };
        let r = build(&tok, shape).unwrap();
        let req = kev_contract::parse_request(&r.body).unwrap();
        assert_eq!(req.questions().len(), 5);
        let c = tok.compile(&req, &Limits::KEV).unwrap();
        assert_eq!(c.state_ids().len(), 137);
        assert_eq!(
            c.branches().iter().map(|b| b.len()).collect::<Vec<_>>(),
            r.branch_tokens
        );
        // The same shape builds the same bytes (the torch peer gets what we timed).
        let again = build(&tok, shape).unwrap();
        assert_eq!(again.body, r.body);
    }

    #[test]
    fn a_target_below_the_fixed_part_is_refused() {
        let tok = tokenizer();
        let err = build(&tok, Shape::OneQuestion { row_tokens: 10 }).unwrap_err();
        assert!(err.to_string().contains("more than the 10"), "{err}");
        assert!(
            build(
                &tok,
                Shape::OnState {
                    state_tokens: 137,
                    questions: 9
                }
            )
            .is_err()
        );
    }

    #[test]
    fn token_arithmetic() {
        let r = CaseRequest {
            body: Vec::new(),
            state_tokens: 137,
            branch_tokens: vec![20, 30],
            input_tokens: 187,
        };
        assert_eq!(r.row_tokens(), [157, 167]);
        assert_eq!(r.tokens_from_zero(), 324);
        // 128 aligned state tokens once; the 9-token tail again with each branch.
        assert_eq!(r.tokens_shared(64), 128 + 29 + 39);
        assert_eq!(r.tokens_cached(64), 29 + 39);
        assert!((r.question_share() - 50.0 / 187.0).abs() < 1e-12);
    }

    #[test]
    fn fit_stops_exactly_or_explains() {
        // A measure that counts words: sentences first, then one word per step.
        let words = |s: &str| Ok(s.split_whitespace().count());
        let base = words(TICKET).unwrap();
        let exact = fit(base + 100, words).unwrap();
        assert_eq!(words(&exact).unwrap(), base + 100);
        assert!(exact.contains(SENTENCES[0]));
        // A measure that only ever grows in steps of 1000 cannot hit the target.
        let err = fit(TICKET.len() + 10, |s| {
            Ok(if s.len() == TICKET.len() {
                s.len()
            } else {
                s.len() + 1000
            })
        })
        .unwrap_err();
        assert!(err.to_string().contains("no padding word fits"), "{err}");
    }
}
