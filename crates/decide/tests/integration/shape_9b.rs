//! The Qwen3.5-9B shape through the loader and the decision arithmetic, held to the author's.
//!
//! The release is `kev synth`'s 9B shape with every width real (hidden 4096, MLP 12,288, 16/4 attention heads
//! of 256 with the output gate, 16/32 DeltaNet heads of 128, untied with an `lm_head.weight` in the files) but two
//! layers — one Gated DeltaNet, one attention: every layer kind — and a 1,024-row vocabulary, so a test writes
//! and loads it in seconds (0.87 GB; the whole 9B is 18 GB). With the random rank-16 LoRA over all 12 target
//! modules (unmerged for `exact`, merged at load for `merged`) and a random pointer head (hidden 4096 → 256,
//! T 2.19), three decision rows are run from zero and read out at their option ends and decide position, then
//! scored by the pointer head, as a request's questions are.
//!
//! `fixtures/shape-9b/expected.json` holds the author's arithmetic on exactly these files (the sha256 of every
//! file is checked first): `tools/reference/shape_9b.py` ran transformers' untied Qwen3.5 model with the LoRA
//! through PEFT in fp32 (the reference arm), on the PEFT-merged weights rounded to bf16 (merged_bf16), and in
//! torch bf16, on the same rows, through the same head formula. The bars: exact fp32 ≤ 1e-4; the merged and bf16
//! arms within the real bar (max |Δp| ≤ 0.02, mean ≤ 0.002, no argmax flip where the reference margin > 0.02);
//! int8 within its max and no-flip criteria, its mean within three times torch bf16's own on these random weights
//! (torch's bf16 run itself is 0.0025 from fp32 here, over the fixed 0.002).

use std::path::{Path, PathBuf};

use kev_decide::PointerHead;
use kev_engine::synth::{SynthOptions, draw_uniform, write_release};
use kev_engine::{Arm, Backbone, Int8Plan, Int8Source, LayerKind, LoadOptions, Qwen35Config};
use kev_release::head::{Delimiters, HeadMeta, HeadProvenance, KevHead, Linear};
use serde_json::{Value, json};

const SEED: u64 = 9;
const VOCAB: usize = 1024;

fn fixture() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/shape-9b/expected.json"
    ))
}

/// The 9B's widths, one layer of each kind, a 1,024-row vocabulary.
fn config() -> Qwen35Config {
    let mut c = Qwen35Config::qwen35_9b();
    c.layer_types = vec![LayerKind::Linear, LayerKind::Full];
    c.vocab_size = VOCAB;
    c
}

/// The random pointer head (hidden 4096 → 256), drawn like `kev synth`'s.
fn head() -> KevHead {
    let (hidden, dim) = (4096, 256);
    let linear = |p: &str| Linear {
        out_features: dim,
        in_features: hidden,
        weight: draw_uniform(
            SEED,
            &format!("head.{p}.weight"),
            dim * hidden,
            (3.0f32 / hidden as f32).sqrt(),
        ),
        bias: draw_uniform(SEED, &format!("head.{p}.bias"), dim, 0.1),
    };
    KevHead {
        meta: HeadMeta {
            base: "Qwen/Qwen3.5-9B-Base".into(),
            base_revision: "68c46c4b3498877f3ef123c856ecfde50c39f404".into(),
            lora: json!(16),
            head_dim: dim,
            option_isolation: json!(false),
            special_embeddings: Value::Null,
            weights_dtype: json!("fp32"),
            temperature: 2.19,
            lora_placement: Value::Null,
        },
        q: linear("q"),
        k: linear("k"),
    }
}

/// Three decision rows of 41, 58 and 77 tokens: (ids, readout indices = option ends then the decide position).
fn rows() -> Vec<(Vec<u32>, Vec<usize>)> {
    let mut s: u64 = 0x9b;
    let mut next = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 33) % VOCAB as u64) as u32
    };
    [
        (41, vec![30, 34, 38]),
        (58, vec![49, 53]),
        (77, vec![60, 64, 68, 72]),
    ]
    .into_iter()
    .map(|(n, mut ends)| {
        let ids: Vec<u32> = (0..n).map(|_| next()).collect();
        ends.push(n - 1);
        (ids, ends)
    })
    .collect()
}

/// Write the release (`base/`, `kev/` with the adapter and the prepared head) and `rows.json` into `dir`.
fn write(dir: &Path) {
    write_release(
        dir,
        &SynthOptions {
            config: config(),
            seed: SEED,
            shards: 2,
            adapter: true,
            f32_weights: false,
        },
    )
    .unwrap();
    let d = Delimiters {
        state: 248_060,
        question: 248_061,
        option_open: 248_049,
        option_close: 248_050,
        decide: 248_062,
        pad: 248_044,
    };
    let prov = HeadProvenance {
        source: "kev test shape_9b".into(),
        revision: None,
        head_pt_sha256: String::new(),
    };
    head().write_prepared(&dir.join("kev"), &d, &prov).unwrap();
    let rows: Vec<Value> = rows()
        .into_iter()
        .map(|(ids, ends)| json!({"ids": ids, "readout": ends}))
        .collect();
    std::fs::write(dir.join("rows.json"), serde_json::to_string(&rows).unwrap()).unwrap();
}

/// sha256 of every file under `dir`, by path relative to it.
fn digests(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for sub in ["base", "kev"] {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(sub))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            let h = kev_release::manifest::FileHashes::of_file(&dir.join(sub).join(&n)).unwrap();
            out.push((format!("{sub}/{n}"), h.sha256));
        }
    }
    out
}

/// Per row, the pointer-head probabilities of one loaded backbone in `arm`.
fn decide(m: &Backbone, arm: Arm) -> Vec<Vec<f64>> {
    let head = PointerHead::new(&head(), 4096).unwrap();
    rows()
        .into_iter()
        .map(|(ids, readout)| {
            let mut s = m.new_state();
            let hidden = m.forward(arm, &mut s, &ids, &readout).unwrap();
            head.probabilities(&hidden)
                .into_iter()
                .map(f64::from)
                .collect()
        })
        .collect()
}

/// (max |Δp|, mean of per-row mean |Δp|, argmax flips where the reference margin > 0.02).
fn gap(got: &[Vec<f64>], want: &[Vec<f64>]) -> (f64, f64, usize) {
    let top = |v: &[f64]| (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
    let (mut max, mut mean, mut flips) = (0f64, 0f64, 0);
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        let d: Vec<f64> = g.iter().zip(w).map(|(a, b)| (a - b).abs()).collect();
        max = max.max(d.iter().cloned().fold(0.0, f64::max));
        mean += d.iter().sum::<f64>() / d.len() as f64 / want.len() as f64;
        let mut s = w.clone();
        s.sort_by(|a, b| b.total_cmp(a));
        if s[0] - s[1] > 0.02 && top(g) != top(w) {
            flips += 1;
        }
    }
    (max, mean, flips)
}

fn arm(expected: &Value, name: &str) -> Vec<Vec<f64>> {
    expected["arms"][name]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

#[test]
fn the_9b_shape_loads_and_decides_as_the_authors_arithmetic() {
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture()).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path());
    // The very files the reference ran on.
    let want: Vec<(String, String)> = expected["files"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    assert_eq!(digests(tmp.path()), want);
    let rows_json: Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("rows.json")).unwrap())
            .unwrap();
    assert_eq!(rows_json, expected["rows"]);

    let (base, kev) = (tmp.path().join("base"), tmp.path().join("kev"));
    // The untied base carries its LM head; the loader reads the config's tie and skips the tensor.
    let index: Value = serde_json::from_str(
        &std::fs::read_to_string(base.join("model.safetensors.index.json")).unwrap(),
    )
    .unwrap();
    assert!(index["weight_map"].get("lm_head.weight").is_some());
    let reference = arm(&expected, "reference");
    let opts = |merge| LoadOptions {
        adapter: Some(kev.clone()),
        kernels: None,
        merge_adapter: merge,
    };

    let exact = Backbone::load(&base, &opts(false)).unwrap();
    assert_eq!(exact.config(), &config());
    assert!(!exact.config().tie_word_embeddings);
    let (max, mean, flips) = gap(&decide(&exact, Arm::Fp32), &reference);
    eprintln!("9B shape, exact fp32 vs reference: max |Δp| {max:.2e}, mean {mean:.2e}");
    assert!(max <= 1e-4 && flips == 0, "exact fp32: {max:.2e}");
    drop(exact);

    let torch = gap(&arm(&expected, "torch_bf16"), &reference);
    eprintln!("9B shape, torch bf16 vs reference (fixture): {torch:?}");
    let merged = Backbone::load(&base, &opts(true)).unwrap();
    for (a, label) in [(Arm::Fp32, "merged, fp32"), (Arm::Bf16, "merged, bf16")] {
        let (max, mean, flips) = gap(&decide(&merged, a), &reference);
        eprintln!(
            "9B shape, {label} vs reference: max |Δp| {max:.4}, mean {mean:.5}, {flips} flips"
        );
        assert!(
            max <= 0.02 && mean <= 0.002 && flips == 0,
            "{label}: {max} {mean} {flips}"
        );
    }
    drop(merged);

    // int8 on random weights: the fixed max and no-flip criteria, and the mean held to three times torch's own
    // bf16 distance where that is above the fixed 0.002 (it is: random weights amplify any rounding, and
    // torch's bf16 run misses the fixed mean on this model; the project gives int8 no yardstick at all on
    // random weights, `kev accept --gates synthetic`).
    let plan = Int8Plan::default();
    let int8 = Backbone::load_quantised(&base, &opts(true), Int8Source::Rule(&plan)).unwrap();
    let (max, mean, flips) = gap(&decide(&int8, Arm::Int8), &reference);
    let mean_bar = 0.002f64.max(3.0 * torch.1);
    eprintln!(
        "9B shape, int8 (the rule) vs reference: max |Δp| {max:.4}, mean {mean:.5} (bar {mean_bar:.4}), {flips} flips"
    );
    assert!(
        max <= 0.02 && mean <= mean_bar && flips == 0,
        "int8: {max} {mean} {flips}"
    );
}

/// A Kev-9B adapter on the 4B base (and a 4B adapter on the 9B base) is refused at start, naming the tensor
/// and both shapes.
#[test]
fn a_9b_adapter_on_the_4b_base_and_the_reverse_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let small = |c: Qwen35Config| {
        let mut c = c;
        c.layer_types = vec![LayerKind::Linear];
        c.vocab_size = 64;
        c
    };
    let (nine, four) = (
        small(Qwen35Config::qwen35_9b()),
        small(Qwen35Config::qwen35_4b()),
    );
    for (name, c) in [("nine", &nine), ("four", &four)] {
        write_release(
            &tmp.path().join(name),
            &SynthOptions {
                config: c.clone(),
                seed: 1,
                shards: 1,
                adapter: true,
                f32_weights: false,
            },
        )
        .unwrap();
    }
    for (base, kev, base_w, lora_w) in [("four", "nine", 2560, 4096), ("nine", "four", 4096, 2560)]
    {
        let err = Backbone::load(
            &tmp.path().join(base).join("base"),
            &LoadOptions {
                adapter: Some(tmp.path().join(kev).join("kev")),
                ..LoadOptions::default()
            },
        )
        .unwrap_err()
        .to_string();
        eprintln!("{kev} adapter on the {base} base: {err}");
        assert!(err.contains("base_model.model.layers.0."), "{err}");
        assert!(err.contains("model.language_model.layers.0."), "{err}");
        assert!(
            err.contains(&format!("16, {lora_w}")) || err.contains(&format!("{lora_w}, 16")),
            "{err}"
        );
        assert!(err.contains(&base_w.to_string()), "{err}");
    }
}

/// Writes the release and its rows to `$KEV_SHAPE_9B_OUT` for `tools/reference/shape_9b.py` (ignored: run by
/// that script's instructions only).
#[test]
#[ignore]
fn write_the_9b_shaped_release_for_the_reference() {
    let out = PathBuf::from(std::env::var("KEV_SHAPE_9B_OUT").expect("set KEV_SHAPE_9B_OUT"));
    write(&out);
    let files: serde_json::Map<String, Value> = digests(&out)
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect();
    std::fs::write(
        out.join("files.json"),
        serde_json::to_string_pretty(&files).unwrap(),
    )
    .unwrap();
}

/// A model no arm of this machine can hold is refused before any weight file is opened: the directory here holds
/// only the `config.json` of a decoder sixteen times the 9B's width (about 3.5 TB in BF16), no shards at all.
#[test]
fn a_model_too_big_for_this_machine_is_refused_before_its_files_are_read() {
    if kev_engine::memory::available_memory().is_none() {
        println!("skipped: this system does not say how much memory is available");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Qwen35Config::qwen35_9b();
    c.hidden_size *= 16;
    c.intermediate_size *= 16;
    std::fs::write(
        tmp.path().join("config.json"),
        serde_json::to_string(&c.to_composite_json()).unwrap(),
    )
    .unwrap();
    for arm in [Arm::Int8, Arm::Bf16, Arm::Fp32] {
        let spec = kev_decide::LoadSpec {
            source: kev_decide::Source::Prepared(tmp.path().to_path_buf()),
            form: kev_decide::WeightForm::Merged,
            arm: Some(arm),
            settings: kev_decide::Settings::default(),
        };
        let err = match kev_decide::load_cpu(&spec) {
            Ok(_) => panic!("a 3.5 TB model loaded"),
            Err(e) => e,
        };
        assert!(
            matches!(err, kev_decide::load::LoadError::Memory(_)),
            "{arm:?}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("the {} arm", arm.name())) && msg.contains("no arm fits"),
            "{msg}"
        );
    }
}
