//! The pointer head: the prepared `head.safetensors` + `kev_head.json` against the release's `head.pt`.

use std::path::Path;

use kev_release::head::{KevHead, Linear, PreparedHead};
use kev_release::manifest::{FileHashes, ReleasePins};

use crate::report::{Gate, HeadSummary, Status};

const ID: &str = "head.equal";
const TITLE: &str = "head.safetensors equals head.pt exactly (q/k weights and biases bit for bit, temperature as stored, metadata)";

fn first_diff(name: &str, a: &[f32], b: &[f32]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{name}: {} values vs {}", a.len(), b.len()));
    }
    let diffs = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    let first = a
        .iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())?;
    Some(format!(
        "{name}: {diffs} of {} values differ, first at {first}: {:e} in head.safetensors, {:e} in head.pt",
        a.len(),
        a[first],
        b[first]
    ))
}

fn compare_linear(which: &str, ours: &Linear, theirs: &Linear, problems: &mut Vec<String>) {
    if (ours.out_features, ours.in_features) != (theirs.out_features, theirs.in_features) {
        problems.push(format!(
            "{which}: shape [{}, {}] vs [{}, {}]",
            ours.out_features, ours.in_features, theirs.out_features, theirs.in_features
        ));
        return;
    }
    problems.extend(first_diff(
        &format!("{which}.weight"),
        &ours.weight,
        &theirs.weight,
    ));
    problems.extend(first_diff(
        &format!("{which}.bias"),
        &ours.bias,
        &theirs.bias,
    ));
}

/// Compare the prepared head with `head.pt` (when at hand). Without `head.pt`, the head recorded by the
/// prepared directory is checked against the pinned `head.pt` digest instead.
pub fn check_head(
    prepared: &Path,
    head_pt: Option<&Path>,
    pins: &ReleasePins,
) -> (Gate, Option<HeadSummary>) {
    let prep = match PreparedHead::read(prepared) {
        Ok(p) => p,
        Err(e) => return (Gate::new(ID, TITLE, Status::Fail, e.to_string()), None),
    };
    let summary = summary_of(&prep.head);
    let mut problems = Vec::new();
    let expected_scale = prep.head.scale();
    if prep.scale.to_bits() != expected_scale.to_bits() {
        problems.push(format!(
            "kev_head.json scale {:?}, head_dim {} gives {:?}",
            prep.scale, prep.head.meta.head_dim, expected_scale
        ));
    }
    let Some(pt_path) = head_pt else {
        // The manifest gate has checked head.safetensors against its recorded digest; here the head.pt it
        // says it came from must be the pinned one.
        let pinned = pins.kev.file("head.pt");
        match pinned {
            Some(p) if p.digest.eq_ignore_ascii_case(&prep.provenance.head_pt_sha256) => {}
            Some(p) => problems.push(format!(
                "kev_head.json says it came from a head.pt with sha256 {}, the pinned head.pt has {}",
                prep.provenance.head_pt_sha256, p.digest
            )),
            None => problems.push("the pins do not list head.pt".into()),
        }
        let detail =
            "head.pt not at hand: kev_head.json's recorded head.pt digest equals the pinned one";
        return (
            Gate::from_problems(ID, TITLE, detail, problems),
            Some(summary),
        );
    };
    let pt = match KevHead::read_pt(pt_path) {
        Ok(h) => h,
        Err(e) => {
            return (
                Gate::new(ID, TITLE, Status::Fail, e.to_string()),
                Some(summary),
            );
        }
    };
    compare_linear("q", &prep.head.q, &pt.q, &mut problems);
    compare_linear("k", &prep.head.k, &pt.k, &mut problems);
    if prep.head.meta.temperature.to_bits() != pt.meta.temperature.to_bits() {
        problems.push(format!(
            "temperature {:?} in kev_head.json, {:?} stored in head.pt",
            prep.head.meta.temperature, pt.meta.temperature
        ));
    }
    if prep.head.meta != pt.meta {
        problems.push(format!(
            "metadata differs: kev_head.json {:?}, head.pt {:?}",
            prep.head.meta, pt.meta
        ));
    }
    match FileHashes::of_file_with(pt_path, false, |_| {}) {
        Ok(h)
            if h.sha256
                .eq_ignore_ascii_case(&prep.provenance.head_pt_sha256) => {}
        Ok(h) => problems.push(format!(
            "kev_head.json says it came from a head.pt with sha256 {}, this head.pt has {}",
            prep.provenance.head_pt_sha256, h.sha256
        )),
        Err(e) => problems.push(e.to_string()),
    }
    let detail = format!(
        "q/k [{}, {}] bit-equal, temperature {:?} as stored",
        pt.q.out_features, pt.q.in_features, pt.meta.temperature
    );
    (
        Gate::from_problems(ID, TITLE, detail, problems),
        Some(summary),
    )
}

/// The head's identity for the report.
pub fn summary_of(head: &KevHead) -> HeadSummary {
    HeadSummary {
        base: head.meta.base.clone(),
        base_revision: head.meta.base_revision.clone(),
        lora: head.meta.lora.clone(),
        option_isolation: head.meta.option_isolation.clone(),
        head_dim: head.meta.head_dim,
        temperature: head.meta.temperature,
    }
}

#[cfg(test)]
mod tests {
    use super::first_diff;

    #[test]
    fn bitwise_comparison_sees_signed_zero_and_nan_payloads() {
        assert_eq!(first_diff("w", &[1.0, 0.0], &[1.0, 0.0]), None);
        assert!(first_diff("w", &[0.0], &[-0.0]).is_some());
        assert!(
            first_diff("w", &[1.0], &[1.0, 2.0])
                .unwrap()
                .contains("1 values vs 2")
        );
        let m = first_diff("q.weight", &[1.0, 2.0, 3.0], &[1.0, 2.5, 3.5]).unwrap();
        assert!(m.contains("2 of 3 values differ, first at 1"), "{m}");
    }
}
