//! The typed wire shapes (the API document's schemas) read every fixture body: valid requests as `Request`,
//! the reference's responses as `Response`, the refusals as `ValidationError` or `Error` bodies.

use std::path::PathBuf;

use kev_contract::wire::{Request, Response, ValidationBody};
use serde_json::Value;

fn fixtures(dir: &str) -> Vec<(String, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(dir);
    let mut out: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no fixtures in {}", root.display());
    out
}

#[test]
fn every_valid_request_reads_as_the_request_schema() {
    for (name, bytes) in fixtures("requests/valid") {
        // The contract's own reader accepts it (as Python's json.loads reads it); the schema type must too.
        assert!(kev_contract::parse_request(&bytes).is_ok(), "{name}");
        let v: Value = kev_contract::python_loads(&bytes).unwrap();
        if let Err(e) = serde_json::from_value::<Request>(v) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn every_reference_response_reads_as_the_response_schema() {
    for (name, bytes) in fixtures("expected/valid") {
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        if let Err(e) = serde_json::from_value::<Response>(v["response"].clone()) {
            panic!("{name}: {e}");
        }
    }
}

#[test]
fn every_refusal_reads_as_one_of_the_error_schemas() {
    for (name, bytes) in fixtures("expected/invalid") {
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        let body = &v["body"];
        let typed =
            body["detail"]["error_type"].is_string() && body["detail"]["message"].is_string();
        let plain = body["detail"].is_string();
        let listed = serde_json::from_value::<ValidationBody>(body.clone());
        assert!(
            typed || plain || listed.is_ok(),
            "{name}: {body} ({listed:?})"
        );
    }
}
