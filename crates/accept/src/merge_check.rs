//! The merge, re-done: every adapted module merged again from base + adapter (`kev_release::merge`, the
//! function `kev prepare` and the engine call) and compared byte for byte with the prepared export; every
//! other tensor compared with the base's bytes. One tensor in memory at a time.

use std::collections::BTreeSet;
use std::path::Path;

use kev_release::manifest::{FileHashes, Manifest};
use kev_release::merge::merge_weight_bytes;
use kev_release::{Adapter, Dtype, TensorStore};

use crate::inputs::ReleaseDirs;
use crate::report::{Gate, MergeSummary, Status};

/// The independent merge of Kev-4B v1.0 published in release-pins.md: (file, bytes, sha256).
pub const PUBLISHED_MERGED: [(&str, u64, &str); 3] = [
    (
        "model.safetensors-00001-of-00002.safetensors",
        5_235_026_680,
        "2a42e56697b0f3928b2466f2f113bc612b248744dc8fc25b732e4d9f3dde2f62",
    ),
    (
        "model.safetensors-00002-of-00002.safetensors",
        3_843_600_704,
        "7d61934b02762a24a7d7209933837094243d0b9c72dd7d2e5393b873d006f9e0",
    ),
    (
        "head.safetensors",
        5_245_420,
        "280aa10ce75f3548622ef34e9d76bd01ee4f525a1f9b8bde45627c4825360d9c",
    ),
];

/// Where two byte strings first differ, and how many bytes differ.
fn byte_diff(a: &[u8], b: &[u8]) -> Option<(usize, usize)> {
    if a.len() != b.len() {
        return Some((a.len().min(b.len()), a.len().abs_diff(b.len())));
    }
    let first = a.iter().zip(b).position(|(x, y)| x != y)?;
    let count = a.iter().zip(b).filter(|(x, y)| x != y).count();
    Some((first, count))
}

/// Re-merge and compare. Returns the gates (`merge.adapted`, `merge.copied`, `merge.published`) and the
/// counts.
pub fn check_merge(
    prepared: &Path,
    release: &ReleaseDirs,
    manifest: Option<&Manifest>,
    published_applies: bool,
) -> (Vec<Gate>, MergeSummary) {
    let adapted_id = "merge.adapted";
    let adapted_title =
        "every adapted module re-merged from base + adapter equals the export byte for byte";
    let copied_id = "merge.copied";
    let copied_title = "every other tensor is byte-identical to the base (same dtype and shape); only mtp.* / model.visual.* left out";
    let fail_both = |why: String| {
        (
            vec![
                Gate::new(adapted_id, adapted_title, Status::Fail, why.clone()),
                Gate::new(copied_id, copied_title, Status::Fail, why),
            ],
            MergeSummary::default(),
        )
    };
    let base = match TensorStore::open(&release.base) {
        Ok(s) => s,
        Err(e) => return fail_both(format!("base {}: {e}", release.base.display())),
    };
    let adapter = match Adapter::load(&release.kev, &base) {
        Ok(a) => a,
        Err(e) => return fail_both(format!("adapter {}: {e}", release.kev.display())),
    };
    let export = match TensorStore::open(prepared) {
        Ok(s) => s,
        Err(e) => return fail_both(format!("export {}: {e}", prepared.display())),
    };

    let names: Vec<String> = export.names().map(str::to_string).collect();
    let Tally {
        mut adapted_problems,
        mut copied_problems,
        adapted_ok,
        copied_ok,
    } = compare_each_tensor(&export, &base, &adapter, &names);
    let in_export: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    for (path, _) in adapter.modules() {
        let t = adapter.base_tensor_name(path);
        if !in_export.contains(t.as_str()) {
            adapted_problems.push(format!("{t}: adapted, but missing from the export"));
        }
    }
    let mut dropped = 0usize;
    for name in base.names() {
        if in_export.contains(name) {
            continue;
        }
        // An untied base's LM head (Qwen3.5-9B) is dropped by default like the MTP head: never read.
        if name.starts_with("mtp.") || name.starts_with("model.visual.") || name == "lm_head.weight"
        {
            dropped += 1;
        } else {
            copied_problems.push(format!("{name}: in the base, missing from the export"));
        }
    }

    let visual_kept = names.iter().any(|n| n.starts_with("model.visual."));
    let export_shards: Vec<String> = file_names(export.files());
    let base_shards: Vec<String> = file_names(base.files());
    let published_layout = visual_kept && export_shards == base_shards;
    let published = published_gate(prepared, manifest, published_layout, published_applies);
    let summary = MergeSummary {
        adapter_modules: adapter.len(),
        adapted_equal: adapted_ok,
        copied_equal: copied_ok,
        dropped,
        published_layout,
        published_digests: Some(published.detail.clone()),
    };
    let gates = vec![
        Gate::from_problems(
            adapted_id,
            adapted_title,
            format!(
                "{adapted_ok} of {} adapted modules re-merged bit-equal (scale {})",
                adapter.len(),
                adapter.scale()
            ),
            adapted_problems,
        ),
        Gate::from_problems(
            copied_id,
            copied_title,
            format!(
                "{copied_ok} tensors byte-identical to the base; {dropped} left out (mtp.* / model.visual.* / lm_head.weight)"
            ),
            copied_problems,
        ),
        published,
    ];
    (gates, summary)
}

/// What comparing the export's tensors found: problems and bit-equal counts, adapted and copied.
struct Tally {
    adapted_problems: Vec<String>,
    copied_problems: Vec<String>,
    adapted_ok: usize,
    copied_ok: usize,
}

/// Each tensor of the export (`names`) against the base: an adapted one re-merged and compared byte for
/// byte, any other compared with the base's bytes, dtype and shape.
fn compare_each_tensor(
    export: &TensorStore,
    base: &TensorStore,
    adapter: &Adapter,
    names: &[String],
) -> Tally {
    let mut adapted_problems = Vec::new();
    let mut copied_problems = Vec::new();
    let (mut adapted_ok, mut copied_ok) = (0usize, 0usize);
    for name in names {
        let (Ok(e), true) = (export.get(name), base.contains(name)) else {
            copied_problems.push(format!("{name}: in the export but not in the base"));
            continue;
        };
        let Ok(b) = base.get(name) else { continue };
        if let Some(lora) = adapter.for_tensor(name) {
            match merge_weight_bytes(&b, lora, adapter.scale()) {
                Err(err) => adapted_problems.push(format!("{name}: {err}")),
                Ok(_) if e.dtype != Dtype::BF16 || e.shape != b.shape => adapted_problems.push(format!(
                    "{name}: exported as {} {:?}, expected BF16 {:?}",
                    e.dtype.name(),
                    e.shape,
                    b.shape
                )),
                Ok(merged) => match byte_diff(&merged, e.data) {
                    None => adapted_ok += 1,
                    Some((at, n)) => adapted_problems.push(format!(
                        "{name}: re-merged bytes differ from the export ({n} of {} bytes differ, first at byte {at})",
                        merged.len()
                    )),
                },
            }
        } else if e.dtype != b.dtype || e.shape != b.shape {
            copied_problems.push(format!(
                "{name}: exported as {} {:?}, the base has {} {:?}",
                e.dtype.name(),
                e.shape,
                b.dtype.name(),
                b.shape
            ));
        } else if let Some((at, n)) = byte_diff(e.data, b.data) {
            copied_problems.push(format!(
                "{name}: differs from the base ({n} of {} bytes, first at byte {at})",
                b.data.len()
            ));
        } else {
            copied_ok += 1;
        }
        // Keep the resident set to one tensor: the pages stay in the page cache.
        export.release(name);
        base.release(name);
    }
    Tally {
        adapted_problems,
        copied_problems,
        adapted_ok,
        copied_ok,
    }
}

fn file_names<'a>(files: impl Iterator<Item = &'a Path>) -> Vec<String> {
    files
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect()
}

/// Compare the export's shard digests with the published kev-4b-merged ones (reported, not gated: the
/// published files are an independent merge, equal only on the real weights and the same file layout).
fn published_gate(
    prepared: &Path,
    manifest: Option<&Manifest>,
    layout: bool,
    applies: bool,
) -> Gate {
    let id = "merge.published";
    let title = "shard digests vs the published kev-4b-merged artifact (release-pins.md); reported, not gated";
    if !applies {
        return Gate::new(
            id,
            title,
            Status::Info,
            "not applicable: the published digests are of Kev-4B v1.0, and these are other pins",
        );
    }
    if !layout {
        return Gate::new(
            id,
            title,
            Status::Info,
            "not comparable: the export is not in the published layout (prepare with `kev prepare --keep-extras`)",
        );
    }
    let mut parts = Vec::new();
    let mut all_equal = true;
    for (name, size, sha) in PUBLISHED_MERGED {
        let recorded = manifest.and_then(|m| m.outputs.iter().find(|o| o.name == name));
        let (found_size, found_sha) = match recorded {
            Some(r) => (r.size, r.sha256.clone()),
            None => match FileHashes::of_file_with(&prepared.join(name), false, |_| {}) {
                Ok(h) => (h.size, h.sha256),
                Err(_) => {
                    all_equal = false;
                    parts.push(format!("{name}: not in the export"));
                    continue;
                }
            },
        };
        if found_size == size && found_sha.eq_ignore_ascii_case(sha) {
            parts.push(format!("{name}: equal"));
        } else {
            all_equal = false;
            parts.push(format!(
                "{name}: differs ({found_size} bytes sha256 {found_sha}; published {size} bytes {sha})"
            ));
        }
    }
    let lead = if all_equal {
        "equal to the published artifact"
    } else {
        "not equal to the published artifact (the tensors are checked by merge.adapted / merge.copied; a \
         difference here with those passing is a difference of file layout)"
    };
    Gate::new(
        id,
        title,
        Status::Info,
        format!("{lead}: {}", parts.join("; ")),
    )
}

#[cfg(test)]
mod tests {
    use super::byte_diff;

    #[test]
    fn byte_diff_finds_the_first_and_counts() {
        assert_eq!(byte_diff(b"abcd", b"abcd"), None);
        assert_eq!(byte_diff(b"abcd", b"abXY"), Some((2, 2)));
        assert_eq!(byte_diff(b"abc", b"abcd"), Some((3, 1)));
    }
}
