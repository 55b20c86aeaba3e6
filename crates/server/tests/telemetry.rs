//! Traces (`kev_server::telemetry`), in a test binary of its own: turning traces on installs the process's
//! subscriber and exporter, once. With no endpoint no exporter thread exists and no span is made; with one, an
//! OTLP/HTTP receiver built from the `opentelemetry-proto` types gets the request's span — in the caller's trace
//! (W3C `traceparent`), carrying the request id — and its phases as children.

#[path = "integration/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kev_server::ServerConfig;
use kev_server::telemetry::{OtlpConfig, OtlpProtocol};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use support::{Stub, agent, keep_spans, send, serve_loopback, start_ready};

/// The names of this process's threads.
fn threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect()
}

fn exporter_threads() -> Vec<String> {
    threads()
        .into_iter()
        .filter(|t| t.starts_with("OpenTelemetry") || t.starts_with("kev-otlp"))
        .collect()
}

/// An OTLP/HTTP receiver on a loopback port: every span posted to `/v1/traces`.
fn receiver() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&spans);
    let url = serve_loopback(move |listener| async move {
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let kept = Arc::clone(&kept);
                async move {
                    let req = ExportTraceServiceRequest::decode(body).unwrap();
                    keep_spans(&mut kept.lock().unwrap(), req.resource_spans);
                    // An empty ExportTraceServiceResponse.
                    (
                        [("content-type", "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            }),
        );
        axum::serve(listener, app).await.unwrap();
    });
    (url, spans)
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
        .map(|v| match v {
            Any::StringValue(s) => s,
            Any::IntValue(i) => i.to_string(),
            Any::BoolValue(b) => b.to_string(),
            other => format!("{other:?}"),
        })
}

#[test]
fn no_exporter_without_an_endpoint_and_spans_in_the_callers_trace_with_one() {
    let body =
        json!({"model": "traced", "state": "x", "questions": {"q": {"type": "noul"}}}).to_string();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace}-{parent}-01");
    let ask = |r: &support::Running| {
        let (status, resp) = send(
            agent()
                .post(&r.url("/v1/systemone"))
                .set("content-type", "application/json")
                .set("traceparent", &traceparent),
            body.as_bytes(),
        );
        assert_eq!(status, 200);
        resp.header("x-typesafe-request-id").unwrap().to_owned()
    };

    // Off (the default): requests are answered, no exporter thread exists.
    let r = start_ready(ServerConfig::default(), Arc::new(Stub::default()));
    ask(&r);
    assert!(!kev_server::telemetry::enabled());
    assert_eq!(exporter_threads(), Vec::<String>::new());
    drop(r);

    // On: an exporter posting to the receiver.
    let (url, spans) = receiver();
    let (layer, telemetry) =
        kev_server::telemetry::start::<tracing_subscriber::Registry>(&OtlpConfig {
            endpoint: url,
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: "kev-test".into(),
        })
        .unwrap();
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    assert!(kev_server::telemetry::enabled());
    // A new thread names itself once it runs: give it a moment.
    let named = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(10));
        !exporter_threads().is_empty()
    });
    assert!(named, "no exporter thread: {:?}", threads());
    let r = start_ready(ServerConfig::default(), Arc::new(Stub::default()));
    let rid = ask(&r);
    telemetry.flush();
    let mut got = Vec::new();
    for _ in 0..200 {
        got = spans.lock().unwrap().clone();
        if got.iter().any(|s| s.name == "POST /v1/systemone") {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        telemetry.flush();
    }
    let root = got
        .iter()
        .find(|s| s.name == "POST /v1/systemone")
        .unwrap_or_else(|| {
            panic!(
                "no request span among {:?}",
                got.iter().map(|s| &s.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(hex(&root.trace_id), trace, "the caller's trace");
    assert_eq!(
        hex(&root.parent_span_id),
        parent,
        "the caller's span is its parent"
    );
    assert_eq!(attr(root, "kev.request_id").as_deref(), Some(rid.as_str()));
    assert_eq!(
        attr(root, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attr(root, "kev.adapter").as_deref(), Some("traced"));
    for phase in ["kev.admission", "kev.queue", "kev.pass"] {
        let child = got
            .iter()
            .find(|s| s.name == phase)
            .unwrap_or_else(|| panic!("no {phase} span"));
        assert_eq!(child.trace_id, root.trace_id, "{phase}");
        assert_eq!(child.parent_span_id, root.span_id, "{phase}");
        assert!(
            child.end_time_unix_nano >= child.start_time_unix_nano,
            "{phase}"
        );
    }
    drop(r);
    telemetry.shutdown();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
