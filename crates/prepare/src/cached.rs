//! A published release prepared into the kev cache on first use: what `kev serve --release NAME` and the
//! Python package's `kev.Model(release=NAME)` load when no model directory is named. One path for both, so
//! they prepare, find and refuse alike.

use std::path::PathBuf;

use kev_release::Release;

use crate::{PrepareError, PrepareOptions, prepare};

/// Where a published release is prepared: `dir` when given, else `$KEV_HOME` (or `~/.cache/kev`) joined
/// with [`Release::dir_name`] (`kev-9b-v1.0`).
pub fn release_dir(release: Release, dir: Option<PathBuf>) -> Result<PathBuf, PrepareError> {
    if let Some(d) = dir {
        return Ok(d);
    }
    let home = std::env::var_os("KEV_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kev")))
        .ok_or_else(|| {
            PrepareError::Usage(
                "set KEV_HOME (or HOME) so kev knows where to keep the prepared model".into(),
            )
        })?;
    Ok(home.join(release.dir_name()))
}

/// The prepared copy of `release` in [`release_dir`], prepared first (downloaded, verified against the
/// release's pins, merged) when it has no `manifest.json` yet. What the pins leave unverified is logged as a
/// warning each time a copy is prepared (and is in its manifest).
pub fn prepared_release(release: Release, dir: Option<PathBuf>) -> Result<PathBuf, PrepareError> {
    let dir = release_dir(release, dir)?;
    if dir.join(kev_release::manifest::MANIFEST_FILE).is_file() {
        return Ok(dir);
    }
    tracing::info!(dir = %dir.display(), release = release.name(), "no prepared model yet: preparing it from the pinned release");
    let opts = PrepareOptions::for_release(dir.clone(), release);
    let report = prepare(&opts)?;
    for w in &report.warnings {
        tracing::warn!("{w}");
    }
    for u in &opts.pins.unverified {
        tracing::warn!("not verified by the {} pins: {u}", opts.pins.name);
    }
    Ok(dir)
}

/// What to do when [`prepared_release`] fails on a machine without the Hub: the same advice from every
/// front end.
pub fn offline_hint() -> &'static str {
    "With no network, point kev at local copies instead:\n  \
     kev prepare --kev-dir KEV_REPO_DIR --base-dir BASE_REPO_DIR --out DIR && kev serve --model DIR\n\
     or serve the release files directly: kev serve --base BASE_REPO_DIR --kev KEV_REPO_DIR\n\
     (or try the API on the bundled miniature, kev-mini: kev serve --demo)"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prepared_copy_is_found_without_preparing() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("kev-9b-v1.0");
        assert_eq!(release_dir(Release::Kev9b, Some(dir.clone())).unwrap(), dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("manifest.json"), "{}").unwrap();
        // found by its manifest: nothing is fetched (there is no network here)
        assert_eq!(
            prepared_release(Release::Kev9b, Some(dir.clone())).unwrap(),
            dir
        );
    }
}
