//! Request bytes → parse + validate → (render, shape answers, write the body) or the error body.
//! Nothing reachable from a request body may panic.
#![no_main]

use kev_contract::{ResponseBody, parse_request, python_dumps, render, shape_answers};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_request(data) {
        Ok(req) => {
            let _ = render(req.state());
            // Probabilities derived from the input bytes, including zeros and non-finite values.
            let mut bytes = data.iter().copied().cycle();
            let probs: Vec<Vec<f32>> = req
                .questions()
                .iter()
                .map(|q| {
                    q.options()
                        .iter()
                        .map(|_| match bytes.next().unwrap_or(0) {
                            0 => 0.0,
                            255 => f32::NAN,
                            b => f32::from(b) / 255.0,
                        })
                        .collect()
                })
                .collect();
            if let Ok(answers) = shape_answers(&req, &probs) {
                let _ = python_dumps(&answers);
                let _ = ResponseBody::new(req.model(), answers, 1, 1).to_json();
            }
        }
        Err(e) => {
            let _ = (e.status(), serde_json::to_string(&e.body()));
        }
    }
});
