//! The request set an acceptance runs: the one shipped in the binary (`fixtures/accept/requests/`,
//! embedded at build time) or a directory of raw request bodies.

use std::path::Path;

use crate::AcceptError;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

pub(crate) use embedded::REFERENCE_SCRIPTS;

/// One request body, named by its file stem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// File stem (names the request in the reference output and the report).
    pub name: String,
    /// Raw bytes, as sent.
    pub body: Vec<u8>,
}

/// Requests, sorted by name.
#[derive(Debug, Clone)]
pub struct RequestSet {
    /// `embedded` or the directory they were read from.
    pub source: String,
    /// The requests.
    pub requests: Vec<Request>,
}

impl RequestSet {
    /// The set shipped with kev (`fixtures/accept/requests/`): every question type, 1 to 255 options,
    /// short and ~1,500-token states, many scripts.
    pub fn embedded() -> Self {
        RequestSet {
            source: "embedded (fixtures/accept/requests)".into(),
            requests: embedded::REQUEST_SET
                .iter()
                .map(|(name, body)| Request {
                    name: (*name).to_string(),
                    body: body.to_vec(),
                })
                .collect(),
        }
    }

    /// Every `*.json` file of a directory, sorted by name.
    pub fn from_dir(dir: &Path) -> Result<Self, AcceptError> {
        let entries = std::fs::read_dir(dir).map_err(|e| AcceptError::io(dir, e))?;
        let mut requests = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| AcceptError::io(dir, e))?.path();
            if !path.is_file() || path.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let body = std::fs::read(&path).map_err(|e| AcceptError::io(&path, e))?;
            requests.push(Request { name, body });
        }
        if requests.is_empty() {
            return Err(AcceptError::Usage(format!(
                "--requests {}: no *.json request bodies there",
                dir.display()
            )));
        }
        requests.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(RequestSet {
            source: dir.display().to_string(),
            requests,
        })
    }

    /// sha256 over `name\0body\0` of every request in order: equal sets give equal digests.
    pub fn sha256(&self) -> String {
        let mut bytes = Vec::new();
        for r in &self.requests {
            bytes.extend_from_slice(r.name.as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(&r.body);
            bytes.push(0);
        }
        kev_release::manifest::sha256_hex(&bytes)
    }

    /// Write the bodies into `dir` as `<name>.json` (for the Python reference).
    pub fn write_to(&self, dir: &Path) -> Result<(), AcceptError> {
        std::fs::create_dir_all(dir).map_err(|e| AcceptError::io(dir, e))?;
        for r in &self.requests {
            let p = dir.join(format!("{}.json", r.name));
            std::fs::write(&p, &r.body).map_err(|e| AcceptError::io(&p, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
    }

    #[test]
    fn embedded_set_is_the_fixture_directory() {
        let emb = RequestSet::embedded();
        let dir = RequestSet::from_dir(&fixtures().join("accept/requests")).unwrap();
        assert_eq!(emb.requests, dir.requests);
        assert_eq!(emb.sha256(), dir.sha256());
        assert!(emb.requests.len() >= 30);
    }

    #[test]
    fn the_reference_script_bundle_is_embedded() {
        let names: Vec<&str> = REFERENCE_SCRIPTS.iter().map(|(n, _)| *n).collect();
        for need in [
            "reference_arm.py",
            "kevref/arms.py",
            "kevref/expected.py",
            "kevref/contract.py",
        ] {
            assert!(names.contains(&need), "{need} missing from {names:?}");
        }
    }

    #[test]
    fn an_empty_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(matches!(
            RequestSet::from_dir(tmp.path()),
            Err(AcceptError::Usage(_))
        ));
    }
}
