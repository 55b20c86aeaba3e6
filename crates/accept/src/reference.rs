//! The author's reference: the project's Python script (`tools/reference/reference_arm.py`, embedded in
//! this crate) run on the same weights, or an output of it computed earlier.
//!
//! Output shape (tools/reference/README.md): `{"base", "kev", "arms", "requests": [{"name", "path", …record}]}`
//! with each record in the `fixtures/expected/valid/*.json` shape, or `{"status", "body"}` for a request
//! Kev rejects. A directory of such records (`fixtures/expected/valid`) is read the same way, each named
//! by its file stem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde::Deserialize;
use serde_json::Value;

use crate::AcceptError;
use crate::report::ReferenceInfo;
use crate::requests::{REFERENCE_SCRIPTS, RequestSet};

/// The three arms the script can compute.
pub const ARMS: [&str; 3] = ["reference", "merged_bf16", "torch_bf16"];

/// One question of one answered request.
#[derive(Debug, Clone, Deserialize)]
pub struct RefQuestion {
    /// Question id.
    pub id: String,
    /// The whole row (state prefix + branch).
    pub row_ids: Vec<u32>,
    /// Index of each option's `<|box_end|>` in the row.
    pub option_ends: Vec<usize>,
    /// Index of the `<|fim_suffix|>`.
    pub decide: usize,
    /// The author's fp32 arm.
    #[serde(default)]
    pub reference: Option<Vec<f64>>,
    /// The merged weights (bf16-rounded adapted modules) computed in fp32.
    #[serde(default)]
    pub merged_bf16: Option<Vec<f64>>,
    /// Torch's own bf16 run of the merged model.
    #[serde(default)]
    pub torch_bf16: Option<Vec<f64>>,
}

impl RefQuestion {
    /// The probabilities of one arm, by its script name.
    pub fn arm(&self, arm: &str) -> Option<&[f64]> {
        match arm {
            "reference" => self.reference.as_deref(),
            "merged_bf16" => self.merged_bf16.as_deref(),
            "torch_bf16" => self.torch_bf16.as_deref(),
            _ => None,
        }
    }
}

/// One answered request.
#[derive(Debug, Clone, Deserialize)]
pub struct RefRecord {
    /// State prefix token ids.
    pub state_ids: Vec<u32>,
    /// `usage.input_tokens`.
    pub input_tokens: usize,
    /// Questions in request order.
    pub questions: Vec<RefQuestion>,
    /// The reference arm's response body.
    #[serde(default)]
    pub response: Option<Value>,
    /// The merged-bf16 arm's response body.
    #[serde(default)]
    pub response_merged_bf16: Option<Value>,
}

/// What the reference did with one request.
#[derive(Debug, Clone)]
pub enum RefEntry {
    /// Answered.
    Answered(RefRecord),
    /// Rejected by Kev's schema or limits.
    Rejected {
        /// HTTP status.
        status: u16,
        /// Body.
        body: Value,
    },
}

/// A reference output, by request name.
#[derive(Debug, Clone)]
pub struct ReferenceOutput {
    /// Where it was read from.
    pub source: String,
    /// Per request name.
    pub requests: BTreeMap<String, RefEntry>,
}

impl ReferenceOutput {
    /// Read a reference script output file, or a directory of `expected/valid`-shaped records.
    pub fn read(path: &Path) -> Result<Self, AcceptError> {
        let bad =
            |message: String| AcceptError::Reference(format!("{}: {message}", path.display()));
        let mut requests = BTreeMap::new();
        if path.is_dir() {
            let entries = std::fs::read_dir(path).map_err(|e| AcceptError::io(path, e))?;
            for entry in entries {
                let p = entry.map_err(|e| AcceptError::io(path, e))?.path();
                if !p.is_file() || p.extension().is_none_or(|x| x != "json") {
                    continue;
                }
                let name = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let value = read_json(&p)?;
                requests.insert(name, entry_of(value).map_err(&bad)?);
            }
        } else {
            let doc = read_json(path)?;
            let list = doc
                .get("requests")
                .and_then(Value::as_array)
                .ok_or_else(|| bad("no \"requests\" list: not a reference_arm.py output".into()))?;
            for item in list {
                let name = item
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a request without a \"name\"".into()))?
                    .to_string();
                requests.insert(name, entry_of(item.clone()).map_err(&bad)?);
            }
        }
        if requests.is_empty() {
            return Err(bad("no reference records".into()));
        }
        Ok(ReferenceOutput {
            source: path.display().to_string(),
            requests,
        })
    }

    /// Whether every question of every answered request has this arm.
    pub fn has_arm(&self, arm: &str) -> bool {
        self.answered()
            .all(|(_, r)| r.questions.iter().all(|q| q.arm(arm).is_some()))
    }

    /// The arms present throughout.
    pub fn arms(&self) -> Vec<String> {
        ARMS.iter()
            .filter(|a| self.has_arm(a))
            .map(|a| a.to_string())
            .collect()
    }

    /// Answered requests by name.
    pub fn answered(&self) -> impl Iterator<Item = (&str, &RefRecord)> {
        self.requests.iter().filter_map(|(n, e)| match e {
            RefEntry::Answered(r) => Some((n.as_str(), r)),
            RefEntry::Rejected { .. } => None,
        })
    }

    /// The record of one request, if the reference answered it.
    pub fn record(&self, name: &str) -> Option<&RefRecord> {
        match self.requests.get(name) {
            Some(RefEntry::Answered(r)) => Some(r),
            _ => None,
        }
    }
}

fn read_json(path: &Path) -> Result<Value, AcceptError> {
    let text = std::fs::read_to_string(path).map_err(|e| AcceptError::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| AcceptError::Reference(format!("{}: {e}", path.display())))
}

fn entry_of(value: Value) -> Result<RefEntry, String> {
    if let Some(status) = value.get("status").and_then(Value::as_u64) {
        return Ok(RefEntry::Rejected {
            status: u16::try_from(status).unwrap_or(u16::MAX),
            body: value.get("body").cloned().unwrap_or(Value::Null),
        });
    }
    serde_json::from_value::<RefRecord>(value)
        .map(RefEntry::Answered)
        .map_err(|e| format!("a record of unexpected shape: {e}"))
}

/// Run the embedded reference script with `python` on a release, over a request set.
///
/// The script and the requests are written to a temporary directory; the script's progress goes to this
/// process's stderr. `arms` is a subset of [`ARMS`].
pub fn run_python(
    python: &Path,
    base: &Path,
    kev: &Path,
    set: &RequestSet,
    arms: &[&str],
) -> Result<(ReferenceOutput, ReferenceInfo), AcceptError> {
    let versions = python_versions(python)?;
    let tmp = tempfile::Builder::new()
        .prefix("kev-accept-reference")
        .tempdir()
        .map_err(|e| AcceptError::io(&std::env::temp_dir(), e))?;
    let script_dir = tmp.path().join("reference");
    write_scripts(&script_dir)?;
    let req_dir = tmp.path().join("requests");
    set.write_to(&req_dir)?;
    let out = tmp.path().join("reference.json");
    let started = Instant::now();
    tracing::info!(
        python = %python.display(),
        arms = arms.join(","),
        "running the Python reference (the author's fp32 arm) on the same weights"
    );
    let status = Command::new(python)
        .arg(script_dir.join("reference_arm.py"))
        .arg("--base")
        .arg(absolute(base))
        .arg("--kev")
        .arg(absolute(kev))
        .arg("--requests")
        .arg(&req_dir)
        .arg("--out")
        .arg(&out)
        .arg("--arms")
        .arg(arms.join(","))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| {
            AcceptError::Reference(format!("could not start {}: {e}", python.display()))
        })?;
    if !status.success() {
        return Err(AcceptError::Reference(format!(
            "the reference script failed ({status}); its messages are above. It needs torch, transformers, \
             peft, tokenizers, safetensors, pydantic and fastapi (tools/reference/requirements.txt)"
        )));
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut output = ReferenceOutput::read(&out)?;
    output.source = format!("python {}", python.display());
    let info = ReferenceInfo {
        source: format!(
            "python {} tools/reference/reference_arm.py (embedded)",
            python.display()
        ),
        arms: arms.iter().map(|a| a.to_string()).collect(),
        versions,
        script_sha256: Some(scripts_sha256()),
        seconds: Some(seconds),
    };
    Ok((output, info))
}

/// Write the embedded script bundle into `dir` (`reference_arm.py`, `kevref/*.py`).
pub fn write_scripts(dir: &Path) -> Result<(), AcceptError> {
    for (name, bytes) in REFERENCE_SCRIPTS {
        let p = dir.join(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(|e| AcceptError::io(parent, e))?;
        }
        std::fs::write(&p, bytes).map_err(|e| AcceptError::io(&p, e))?;
    }
    Ok(())
}

/// sha256 over the embedded script bundle (`name\0bytes\0` in order).
pub fn scripts_sha256() -> String {
    let mut all = Vec::new();
    for (name, bytes) in REFERENCE_SCRIPTS {
        all.extend_from_slice(name.as_bytes());
        all.push(0);
        all.extend_from_slice(bytes);
        all.push(0);
    }
    kev_release::manifest::sha256_hex(&all)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Interpreter and package versions, for the report. Fails (exit 2) when `python` cannot import torch.
fn python_versions(python: &Path) -> Result<Value, AcceptError> {
    const PROBE: &str = "import json, platform\n\
        out = {'python': platform.python_version()}\n\
        for m in ('torch', 'transformers', 'peft', 'tokenizers', 'safetensors', 'pydantic', 'fastapi'):\n\
        \x20   try:\n\
        \x20       out[m] = __import__(m).__version__\n\
        \x20   except Exception as e:\n\
        \x20       out[m] = None\n\
        print(json.dumps(out))\n";
    let out = Command::new(python)
        .arg("-c")
        .arg(PROBE)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            AcceptError::Reference(format!("could not start {}: {e}", python.display()))
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let value: Value = serde_json::from_str(text.trim()).map_err(|_| {
        AcceptError::Reference(format!(
            "{} did not run the version probe: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })?;
    let missing: Vec<&str> = ["torch", "transformers", "peft", "safetensors", "tokenizers"]
        .into_iter()
        .filter(|m| value.get(*m).is_none_or(Value::is_null))
        .collect();
    if !missing.is_empty() {
        return Err(AcceptError::Reference(format!(
            "{} lacks {}: install tools/reference/requirements.txt into it",
            python.display(),
            missing.join(", ")
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
    }

    #[test]
    fn reads_the_script_output_and_a_directory_of_records_alike() {
        let file =
            ReferenceOutput::read(&fixtures().join("accept/reference-synthetic.json")).unwrap();
        assert_eq!(file.arms(), ["reference", "merged_bf16", "torch_bf16"]);
        let rec = file.record("choice-255").unwrap();
        assert_eq!(rec.questions[0].option_ends.len(), 255);
        let dir = ReferenceOutput::read(&fixtures().join("expected/valid")).unwrap();
        assert_eq!(dir.arms(), ["reference", "merged_bf16", "torch_bf16"]);
        // the shipped set copies some fixture requests byte for byte: same rows, same probabilities
        let a = file.record("ticket-noul").unwrap();
        let b = dir.record("ticket-noul").unwrap();
        assert_eq!(a.questions[0].row_ids, b.questions[0].row_ids);
        assert_eq!(a.questions[0].reference, b.questions[0].reference);
    }

    #[test]
    fn a_file_of_another_shape_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.json");
        std::fs::write(&p, "{\"answers\": {}}").unwrap();
        let err = ReferenceOutput::read(&p).unwrap_err().to_string();
        assert!(err.contains("not a reference_arm.py output"), "{err}");
    }

    #[test]
    fn the_bundle_writes_a_runnable_layout() {
        let tmp = tempfile::tempdir().unwrap();
        write_scripts(tmp.path()).unwrap();
        assert!(tmp.path().join("reference_arm.py").is_file());
        assert!(tmp.path().join("kevref/__init__.py").is_file());
        assert_eq!(scripts_sha256().len(), 64);
    }
}
