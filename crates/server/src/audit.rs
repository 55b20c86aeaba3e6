//! The audit log (`kev serve --audit-log FILE|-`): one JSON line per decision request, written by a thread of
//! its own so that no request waits on a disk.
//!
//! A line: `{"ts", "request_id", "route", "key", "status", "error_type"?, "adapters": [{"name", "sha256"}],
//! "priority", "deadline_ms", "parts", "input_tokens", "output_tokens", "ms": {"admission", "queue", "compute",
//! "head", "total"}, "trace_id"?, "states"?}` — `ts` in seconds since 1970 (UTC, to the millisecond), `key` the
//! API key's *name* (never its secret; `null` with auth off), phase times in milliseconds (`null` for a phase
//! the request never reached), `status` 499 for a client that left before its answer. The state texts are
//! written only with `--audit-log-states` (`states`: each part's state as sent): by default the log holds no
//! document content. The adapter admin routes write a line each too (`route`, `key`, `status`, `adapter`).
//!
//! The file is opened for appending, and opened again on SIGHUP (after a log rotation moved it). Lines are
//! queued to the writer (at most [`QUEUE_LINES`]); past that they are dropped and counted
//! (`kev_audit_lines_dropped_total`) rather than slowing requests down.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use serde_json::Value;

/// Lines the writer may be behind before new ones are dropped.
pub const QUEUE_LINES: usize = 65_536;

/// Where the audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    /// Standard error (`--audit-log -`).
    Stderr,
    /// A file, appended to.
    File(PathBuf),
}

impl std::str::FromStr for AuditTarget {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(if s == "-" {
            AuditTarget::Stderr
        } else {
            AuditTarget::File(PathBuf::from(s))
        })
    }
}

/// The audit log's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// Where lines go.
    pub target: AuditTarget,
    /// Whether lines carry the requests' states (`--audit-log-states`).
    pub states: bool,
}

enum Message {
    Line(Vec<u8>),
    Reopen,
}

/// A running audit log.
pub struct AuditLog {
    tx: SyncSender<Message>,
    states: bool,
    dropped: AtomicU64,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("states", &self.states)
            .finish_non_exhaustive()
    }
}

fn open(target: &AuditTarget) -> std::io::Result<Box<dyn Write + Send>> {
    Ok(match target {
        AuditTarget::Stderr => Box::new(std::io::stderr()),
        AuditTarget::File(path) => Box::new(std::io::BufWriter::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        )),
    })
}

impl AuditLog {
    /// Open the target (a file that cannot be opened is an error now, not a silent loss later) and start the
    /// writer thread.
    pub fn start(config: &AuditConfig) -> std::io::Result<Self> {
        let out = open(&config.target)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_LINES);
        let target = config.target.clone();
        std::thread::Builder::new()
            .name("kev-audit".into())
            .spawn(move || writer(rx, out, target))?;
        Ok(AuditLog {
            tx,
            states: config.states,
            dropped: AtomicU64::new(0),
        })
    }

    /// Whether lines carry states.
    pub fn states(&self) -> bool {
        self.states
    }

    /// Queue one line (never waits: a full queue drops it, counted).
    pub fn write(&self, line: Value) {
        let mut bytes = kev_contract::compact_json(&line).into_bytes();
        bytes.push(b'\n');
        if let Err(TrySendError::Full(_)) = self.tx.try_send(Message::Line(bytes)) {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            metrics::counter!("kev_audit_lines_dropped_total").increment(1);
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped = n,
                    "the audit log's writer is behind: lines dropped"
                );
            }
        }
    }

    /// Open the file again (after a rotation moved it; SIGHUP).
    pub fn reopen(&self) {
        let _ = self.tx.send(Message::Reopen);
    }
}

/// Write lines as they come, flushing whenever the queue is empty.
fn writer(rx: Receiver<Message>, mut out: Box<dyn Write + Send>, target: AuditTarget) {
    let mut failing = false;
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                Message::Line(bytes) => {
                    let r = out.write_all(&bytes);
                    if r.is_err() != failing {
                        failing = r.is_err();
                        if let Err(e) = r {
                            tracing::error!(error = %e, "the audit log cannot be written");
                        }
                    }
                }
                Message::Reopen => {
                    let _ = out.flush();
                    match open(&target) {
                        Ok(o) => out = o,
                        Err(e) => {
                            tracing::error!(error = %e, "SIGHUP: the audit log could not be opened again; writing to the old file")
                        }
                    }
                }
            }
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

/// Now, in seconds since 1970 to the millisecond.
pub(crate) fn timestamp() -> f64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_millis() as f64) / 1000.0
}
