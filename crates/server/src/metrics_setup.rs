//! The Prometheus recorder, installed once per process, and the series the server declares.

use std::sync::OnceLock;

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide recorder's handle (installing it and describing every series on first use).
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let handle = match PrometheusBuilder::new()
                .set_buckets(&[
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ])
                .and_then(|b| b.install_recorder())
            {
                Ok(h) => h,
                // Another recorder is already installed (an embedding program's): render ours empty.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            };
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!(
        "kev_requests_total",
        "HTTP requests answered, by route and status"
    );
    describe_histogram!(
        "kev_request_duration_seconds",
        Unit::Seconds,
        "Wall time from request to response, by route"
    );
    describe_histogram!(
        "kev_queue_wait_seconds",
        Unit::Seconds,
        "Time a decision waited for the engine"
    );
    describe_histogram!(
        "kev_compute_seconds",
        Unit::Seconds,
        "Wall time of the engine pass that answered a decision"
    );
    describe_counter!(
        "kev_adapter_requests_total",
        "Decision requests admitted, by the adapter that answers them (the request's `model`)"
    );
    describe_counter!(
        "kev_adapter_input_tokens_total",
        "Input tokens of admitted decision requests, by adapter"
    );
    describe_counter!(
        "kev_input_tokens_total",
        "Input tokens of answered decisions (state once + every branch)"
    );
    describe_counter!(
        "kev_output_tokens_total",
        "Output tokens (json.dumps of the answers) of answered decisions"
    );
    describe_gauge!("kev_queue_depth", "Decisions waiting for the engine");
    describe_counter!(
        "kev_queue_rejected_total",
        "Decisions refused with 429: the queue was full, or every body-read permit was taken"
    );
    describe_counter!(
        "kev_body_permits_rejected_total",
        "Of kev_queue_rejected_total, the 429s because every body-read permit was taken (slow bodies)"
    );
    describe_counter!(
        "kev_queue_expired_total",
        "Decisions that waited past their deadline (529)"
    );
    describe_counter!(
        "kev_queue_abandoned_total",
        "Decisions dropped because the client disconnected"
    );
    describe_gauge!(
        "kev_queue_capacity",
        "Decisions that may wait for the engine"
    );
    describe_gauge!(
        "kev_queue_oldest_wait_seconds",
        Unit::Seconds,
        "How long the oldest waiting decision has waited"
    );
    describe_gauge!("kev_engine_running", "Decisions started and not finished");
    describe_gauge!(
        "kev_engine_inflight_tokens",
        "Tokens left over every admitted decision (waiting and started)"
    );
    describe_counter!(
        "kev_engine_cancelled_total",
        "Started decisions stopped between passes (client gone or request timeout)"
    );
    describe_counter!(
        "kev_engine_partial_pieces_total",
        "Passes that advanced long work by a piece (a state chunk or some of many rows)"
    );
    describe_counter!(
        "kev_engine_lane_holds_released_total",
        "Times short passes stepped aside for a starved long-lane piece that was still not back 2 s later (other processes holding the lane's cores)"
    );
    describe_counter!(
        "kev_engine_scheduled_passes_total",
        "Passes the scheduler ran"
    );
    describe_counter!("kev_engine_rows_total", "Token rows run by the engine");
    describe_counter!("kev_engine_passes_total", "Engine passes run");
    describe_counter!(
        "kev_prepared_state_cache_hits_total",
        "Prepared-state cache hits"
    );
    describe_counter!(
        "kev_prepared_state_cache_misses_total",
        "Prepared-state cache misses"
    );
    describe_gauge!(
        "kev_prepared_state_cache_bytes",
        Unit::Bytes,
        "Bytes held by the prepared-state cache"
    );
    describe_gauge!(
        "kev_pinned_states",
        "Pinned states held (POST /v1/systemone/states)"
    );
    describe_gauge!(
        "kev_pinned_state_bytes",
        Unit::Bytes,
        "Bytes held by pinned states"
    );
    describe_gauge!(
        "kev_pinned_state_budget_bytes",
        Unit::Bytes,
        "The pinned states' byte budget"
    );
    describe_gauge!("kev_ready", "1 once the warm-up decision succeeded");
    describe_gauge!(
        "kev_process_resident_bytes",
        Unit::Bytes,
        "Resident memory of the server process (VmRSS), read at each scrape"
    );
    describe_gauge!(
        "kev_process_peak_resident_bytes",
        Unit::Bytes,
        "Peak resident memory of the server process since start (VmHWM)"
    );
}
