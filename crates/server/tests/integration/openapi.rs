//! The committed `crates/server/openapi.json` is the document the code derives (`kev_server::openapi`), and
//! that document covers every endpoint and every status the server answers with.
//!
//! On drift, regenerate: `KEV_WRITE_OPENAPI=1 cargo test -p kev-server --test integration openapi::`.

use std::path::PathBuf;

use kev_contract::ErrorKind;
use serde_json::Value;

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("openapi.json")
}

#[test]
fn the_committed_document_is_the_generated_one() {
    let generated = kev_server::openapi::json();
    let path = committed_path();
    if std::env::var_os("KEV_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} differs from the document the code generates; regenerate it with \
         `KEV_WRITE_OPENAPI=1 cargo test -p kev-server --test integration openapi::` and commit the result",
        path.display()
    );
}

#[test]
fn every_endpoint_and_status_is_documented_with_an_example() {
    let doc: Value = serde_json::from_str(kev_server::openapi::json()).unwrap();
    let routes = [
        ("/v1/systemone", "post"),
        ("/v1/systemone/permute", "post"),
        ("/v1/systemone/separate", "post"),
        ("/v1/models", "get"),
        ("/health", "get"),
        ("/ready", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
    ];
    for (path, method) in routes {
        let op = &doc["paths"][path][method];
        assert!(op.is_object(), "{method} {path} is not documented");
        let responses = op["responses"].as_object().unwrap();
        assert!(responses.contains_key("200"), "{path}: no 200");
        for (status, r) in responses {
            let content = r["content"].as_object().unwrap();
            let has_example = content.values().all(|c| {
                c["example"].is_string() || c["example"].is_object() || c["examples"].is_object()
            });
            assert!(has_example, "{path} {status}: no example");
        }
    }
    // The decision routes answer every client and server error of the table's request path.
    for path in [
        "/v1/systemone",
        "/v1/systemone/permute",
        "/v1/systemone/separate",
    ] {
        let responses = &doc["paths"][path]["post"]["responses"];
        for kind in [
            ErrorKind::Unparseable,
            ErrorKind::AuthInvalid,
            ErrorKind::AuthMissing,
            ErrorKind::BodyTimeout,
            ErrorKind::TooMuchWork,
            ErrorKind::UnsupportedMedia,
            ErrorKind::Validation,
            ErrorKind::QueueFull,
            ErrorKind::KeyLimit,
            ErrorKind::Internal,
            ErrorKind::NotReady,
            ErrorKind::Overloaded,
        ] {
            let r = &responses[kind.status().to_string()];
            let examples = &r["content"]["application/json"]["examples"];
            assert!(
                examples[format!("{kind:?}")]["value"]["detail"].is_object()
                    || examples[format!("{kind:?}")]["value"]["detail"].is_array()
                    || examples[format!("{kind:?}")]["value"]["detail"].is_string(),
                "{path}: {kind:?} ({}) has no example body: {r}",
                kind.status()
            );
        }
    }
    // The documented statuses are the table's: 422 carries both body shapes, 529 the overloaded type.
    let decide = &doc["paths"]["/v1/systemone"]["post"]["responses"];
    assert_eq!(
        decide["529"]["content"]["application/json"]["examples"]["Overloaded"]["value"]["detail"]["error_type"],
        "overloaded_error"
    );
    assert!(decide["422"]["content"]["application/json"]["schema"]["oneOf"].is_array());
    assert!(
        decide["500"]["content"]["application/json"]["examples"]["Internal"]["value"]["detail"]
            ["message"]
            .as_str()
            .unwrap()
            .contains("request id")
    );
}
