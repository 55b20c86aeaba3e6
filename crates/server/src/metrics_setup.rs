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
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0,
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
    describe_operations();
    describe_requests();
    describe_queue();
    describe_engine();
    describe_connections();
    describe_states();
    describe_process();
}

/// The HTTP side: requests by route, and the tokens of admitted and answered decisions.
fn describe_requests() {
    describe_counter!(
        "kev_requests_total",
        "HTTP requests answered, by route and status"
    );
    describe_histogram!(
        "kev_request_duration_seconds",
        Unit::Seconds,
        "Wall time from request to response, by route"
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
}

/// The queue: slots, refusals, and how long decisions wait.
fn describe_queue() {
    describe_gauge!(
        "kev_queue_depth",
        "Decisions holding a queue slot (admitted or being admitted, not yet started): THE autoscaling signal (docs/autoscaling.md)"
    );
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
}

/// The engine thread and its long lane.
fn describe_engine() {
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
    describe_gauge!(
        "kev_long_lane_share",
        "The long lane's share of a machine saturated with short requests (--long-lane-share; 0 with --long-lane off)"
    );
    describe_counter!(
        "kev_long_lane_holds_total",
        "Times short passes stepped aside so that long work on the lane got its share"
    );
    describe_gauge!(
        "kev_long_lane_held_seconds",
        Unit::Seconds,
        "Time short passes have stepped aside for the long lane's share since the start (seconds, only grows)"
    );
    describe_counter!(
        "kev_engine_scheduled_passes_total",
        "Passes the scheduler ran"
    );
    describe_counter!("kev_engine_rows_total", "Token rows run by the engine");
    describe_counter!("kev_engine_passes_total", "Engine passes run");
}

/// Connections the server refused or closed itself.
fn describe_connections() {
    describe_counter!(
        "kev_connections_refused_total",
        "Connections answered 429 and closed at once, by reason (per_ip: the address held --max-connections-per-ip)"
    );
    describe_counter!(
        "kev_connections_closed_total",
        "Connections the server closed, by reason (stuck: its answers did not move for the header-read timeout; lingered: a graceful close that did not finish; killed: open at the end of the drain)"
    );
    describe_counter!(
        "kev_connections_reset_unread_total",
        "Connections closed with a reset because their client had not read what was sent (a FIN would have waited behind it)"
    );
}

/// Prepared and pinned states.
fn describe_states() {
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
        "kev_pinned_state_reserved_bytes",
        Unit::Bytes,
        "Bytes reserved by pin requests in flight (estimated until their snapshot is made)"
    );
    describe_gauge!(
        "kev_pinned_state_budget_bytes",
        Unit::Bytes,
        "The pinned states' byte budget"
    );
}

/// Readiness and the process's memory.
fn describe_process() {
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

/// The series of operating kev (issue 57): per-phase histograms, priorities and deadlines, audit, adapters.
fn describe_operations() {
    // The per-phase histograms of answered decisions, labelled adapter, key and input_tokens (a bucket): see
    // `trail`.
    describe_histogram!(
        "kev_admission_seconds",
        Unit::Seconds,
        "Decoding, parsing and tokenizing an answered decision's body, by adapter, key and input-token bucket"
    );
    describe_histogram!(
        "kev_queue_wait_seconds",
        Unit::Seconds,
        "Time an answered decision waited for its first engine pass, by adapter, key and input-token bucket"
    );
    describe_histogram!(
        "kev_compute_seconds",
        Unit::Seconds,
        "Wall time of the engine passes that advanced an answered decision (readout included), by adapter, key and input-token bucket"
    );
    describe_histogram!(
        "kev_head_seconds",
        Unit::Seconds,
        "Time an answered decision's answers took to read out (pointer head, shaping), by adapter, key and input-token bucket"
    );
    describe_histogram!(
        "kev_decision_seconds",
        Unit::Seconds,
        "End to end: from a decision request's arrival at its handler to its answer, by adapter, key and input-token bucket"
    );
    describe_gauge!(
        "kev_queue_waiting",
        "Decisions waiting for their first engine pass, by priority (as of the last pass)"
    );
    describe_counter!(
        "kev_queue_deadline_expired_total",
        "Decisions whose own deadline (x_deadline_ms, X-Kev-Deadline-Ms) passed while they waited: answered 408, never run"
    );
    describe_counter!(
        "kev_audit_lines_dropped_total",
        "Audit lines dropped because the audit log's writer was behind"
    );
    describe_gauge!(
        "kev_adapters_retired",
        "Adapters removed live whose last requests are still in flight (dropped at the pass after they end)"
    );
    describe_counter!(
        "kev_adapter_changes_total",
        "Adapter admin actions (add, remove; through /v1/adapters or the adapters file), by result"
    );
    describe_counter!(
        "kev_canary_checks_total",
        "Canary decisions (the warm-up decision again, compared with its answer at start), by result: ok, diverged, failed, shed"
    );
    describe_gauge!(
        "kev_canary_seconds",
        Unit::Seconds,
        "The latest canary decision's time to answer"
    );
}
