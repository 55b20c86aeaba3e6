//! Traces by OTLP over gRPC (`--otlp-protocol grpc`), in a test binary of its own (traces are set up once per
//! process): a receiver made of `opentelemetry-proto`'s generated gRPC service gets the request's span in the
//! caller's trace.

#[path = "integration/support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kev_server::ServerConfig;
use kev_server::telemetry::{OtlpConfig, OtlpProtocol};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use support::{Stub, agent, keep_spans, send, serve_loopback, start_ready};

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep_spans(
            &mut self.0.lock().unwrap(),
            request.into_inner().resource_spans,
        );
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[test]
fn spans_reach_a_grpc_receiver_in_the_callers_trace() {
    let receiver = Receiver::default();
    let spans = Arc::clone(&receiver.0);
    let url = serve_loopback(move |listener| async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    let (layer, telemetry) =
        kev_server::telemetry::start::<tracing_subscriber::Registry>(&OtlpConfig {
            endpoint: url,
            protocol: OtlpProtocol::Grpc,
            service_name: "kev-test".into(),
        })
        .unwrap();
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let r = start_ready(ServerConfig::default(), Arc::new(Stub::default()));
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let body = json!({"state": "x", "questions": {"q": {"type": "noul"}}}).to_string();
    let (status, _) = send(
        agent()
            .post(&r.url("/v1/systemone"))
            .set("content-type", "application/json")
            .set("traceparent", &format!("00-{trace}-b7ad6b7169203331-01")),
        body.as_bytes(),
    );
    assert_eq!(status, 200);
    let mut found = None;
    for _ in 0..300 {
        telemetry.flush();
        found = spans
            .lock()
            .unwrap()
            .iter()
            .find(|s| s.name == "POST /v1/systemone")
            .cloned();
        if found.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let root = found.expect("no request span reached the gRPC receiver");
    let hex: String = root.trace_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, trace);
    drop(r);
    telemetry.shutdown();
}
