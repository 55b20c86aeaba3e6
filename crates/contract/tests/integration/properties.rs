//! Property tests: parsing, validation, rendering and answer shaping never panic, on arbitrary JSON values and
//! arbitrary bytes, and rendering agrees with itself through the request path.

use kev_contract::{parse_request, python_dumps, render, shape_answers, validate};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |x| serde_json::Number::from_f64(x)
            .map(Value::Number)),
        "-?[1-9][0-9]{0,60}".prop_map(|s| s.parse::<Value>().unwrap_or(Value::Null)),
        "-?[0-9]\\.[0-9]{1,20}[eE][-+]?[0-9]{1,4}"
            .prop_map(|s| s.parse::<Value>().unwrap_or(Value::Null)),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        "\\PC{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "noul",
            "choice",
            "score",
            "true",
            "false",
            " \u{1c}x",
            "<|fim_suffix|>"
        ])
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "type",
                        "criteria",
                        "instructions",
                        "state",
                        "questions",
                        "model",
                        "true",
                        "false",
                        "k",
                        ""
                    ]),
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

/// Request-shaped values, so that validation gets past the first checks often.
fn request_like() -> impl Strategy<Value = Value> {
    let question = (
        prop::sample::select(vec![
            json!("noul"),
            json!("choice"),
            json!("score"),
            json!(3),
            Value::Null,
        ]),
        json_value(),
        json_value(),
    )
        .prop_map(|(t, i, c)| json!({"type": t, "instructions": i, "criteria": c}));
    (
        json_value(),
        prop::collection::vec(("\\PC{0,4}", question), 0..4),
        any::<bool>(),
    )
        .prop_map(|(state, qs, with_model)| {
            let mut m = Map::new();
            m.insert("state".into(), state);
            if with_model {
                m.insert("model".into(), json!("m"));
            }
            m.insert("questions".into(), Value::Object(qs.into_iter().collect()));
            Value::Object(m)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn render_and_dumps_never_panic(v in json_value()) {
        let _ = render(&v);
        let _ = python_dumps(&v);
    }

    #[test]
    fn validation_never_panics(v in json_value()) {
        match validate(v) {
            Ok(r) => prop_assert!(!r.questions().is_empty()),
            Err(e) => {
                prop_assert!(e.status() == 422 || e.status() == 400);
                let _ = e.body();
            }
        }
    }

    #[test]
    fn valid_requests_shape_any_probabilities(v in request_like(), seed in any::<u64>()) {
        if let Ok(r) = validate(v.clone()) {
            // The parsed request text round-trips through the byte path to the same request.
            let again = parse_request(v.to_string().as_bytes());
            prop_assert_eq!(again.as_ref().ok(), Some(&r));
            let mut x = seed;
            let probs: Vec<Vec<f32>> = r.questions().iter().map(|q| {
                q.options().iter().map(|_| { x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (x >> 40) as f32 / (1u64 << 24) as f32 }).collect()
            }).collect();
            let answers = shape_answers(&r, &probs);
            prop_assert!(answers.is_ok());
            let answers = answers.unwrap_or_default();
            prop_assert_eq!(answers.as_object().map(|m| m.len()), Some(r.questions().len()));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_request(&bytes).map_err(|e| e.body());
    }

    #[test]
    fn mutated_json_text_never_panics(v in request_like(), cut in any::<usize>(), insert in prop::sample::select(vec!["{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "NaN", "-Infinity", "1e", "\u{0}", "\u{e9}"])) {
        let mut s = v.to_string();
        let mut at = cut % (s.len() + 1);
        while !s.is_char_boundary(at) { at -= 1; }
        s.insert_str(at, insert);
        let _ = parse_request(s.as_bytes()).map_err(|e| e.body());
        let _ = parse_request(&s.as_bytes()[..at]).map_err(|e| e.body());
    }
}
