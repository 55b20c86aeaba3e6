//! `kev synth`: write a random-weight release in the published layout, for benchmarks and demos.
//! The writing streams (one chunk in memory), so the 8.4 GB 4B-shaped release (or the 1.5 GB 0.8B-shaped one)
//! needs no more RAM than a few megabytes. The checkpoint and the adapter are `kev_engine::synth`'s (the engine's
//! tests load the same files); every safetensors file, the head's included, is written through
//! `kev_release::stream`.
//!
//! `kev/` holds what a decision needs besides the base: the adapter, the Kev tokenizer (copied: the real
//! vocabulary) and a random pointer head in the prepared form (`head.safetensors` + `kev_head.json`, the layout
//! `kev_release::head::PreparedHead::read` loads). Every loader finds a directory's head through
//! `KevHead::read_dir`, which reads that form when there is no `head.pt`, so `kev decide`, `kev serve` and
//! `kev bench decide` take `--base DIR/base --kev DIR/kev` as it is; `head.pt` (a torch pickle, needed by `kev
//! prepare` and the torch peer) is written from the same tensors by `tools/bench/head_pt.py`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use kev_engine::Qwen35Config;
use kev_engine::synth::{Identity, SynthOptions, draw_uniform, tiny_config, write_release};
use kev_release::head::{Delimiters, HeadMeta, HeadProvenance, KevHead, Linear};
use serde_json::{Value, json};

/// The decoder shape `kev synth --config` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Qwen3.5-4B: hidden 2560, 32 layers, vocab 248,320 (≈ 8.4 GB).
    Qwen4b,
    /// Qwen3.5-0.8B: hidden 1024, 24 layers, 8/2 attention heads, 16/16 DeltaNet heads (≈ 1.5 GB).
    Qwen08b,
    /// Qwen3.5-9B: the 4B's layers and heads, hidden 4096, MLP 12,288, untied (an `lm_head.weight` in the
    /// files; ≈ 18 GB).
    Qwen9b,
    /// The fixture widths: hidden 16, 8 layers, the real vocabulary.
    Tiny,
}

impl Shape {
    /// Every shape, in the order `--help` lists them.
    pub const ALL: [Shape; 4] = [Shape::Qwen4b, Shape::Qwen08b, Shape::Qwen9b, Shape::Tiny];

    /// `4b`, `0.8b`, `9b` or `tiny`.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Qwen4b => "4b",
            Shape::Qwen08b => "0.8b",
            Shape::Qwen9b => "9b",
            Shape::Tiny => "tiny",
        }
    }

    /// The decoder configuration.
    pub fn config(self) -> Qwen35Config {
        match self {
            Shape::Qwen4b => Qwen35Config::qwen35_4b(),
            Shape::Qwen08b => Qwen35Config::qwen35_0_8b(),
            Shape::Qwen9b => Qwen35Config::qwen35_9b(),
            Shape::Tiny => tiny_config(248_320),
        }
    }
}

impl std::str::FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Shape::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| format!("unknown decoder shape `{s}` (4b, 0.8b, 9b, tiny)"))
    }
}

/// What `kev synth` writes (its flags, parsed).
#[derive(Debug, Clone)]
pub struct Options {
    /// Output directory; `base/` (and `kev/`) are created inside.
    pub out: PathBuf,
    /// Seed of every value.
    pub seed: u64,
    /// Decoder shape.
    pub shape: Shape,
    /// Number of safetensors shards in `base/`.
    pub shards: usize,
    /// Keep only the first N layers of the shape (every width kept): a release of the shape small enough to
    /// check a pipeline end to end (`None`: all of them).
    pub layers: Option<usize>,
    /// Do not write `kev/`.
    pub no_adapter: bool,
    /// Keep an existing `base/` (of the same shape) and write only `kev/`.
    pub skip_base: bool,
    /// The Kev-variant `tokenizer.json` copied into `kev/` (default: the source tree's fixture one).
    pub tokenizer: Option<PathBuf>,
}

/// Write the release; returns the report `kev synth` prints.
pub fn run(args: &Options) -> anyhow::Result<Value> {
    let mut config = args.shape.config();
    if let Some(n) = args.layers {
        anyhow::ensure!(
            (1..=config.num_layers()).contains(&n),
            "--layers {n}: the {} shape has 1 to {} layers",
            args.shape.name(),
            config.num_layers()
        );
        config.layer_types.truncate(n);
    }
    let tokenizer = match &args.tokenizer {
        Some(path) => path.clone(),
        None => default_tokenizer(),
    };
    if !args.no_adapter && !tokenizer.is_file() {
        anyhow::bail!(
            "the Kev tokenizer is not at {} (pass --tokenizer FILE)",
            tokenizer.display()
        );
    }
    let t = Instant::now();
    let base = args.out.join("base");
    let mut v = if args.skip_base {
        check_base(&base, &config)?;
        let kev = args.out.join("kev");
        kev_engine::synth::write_adapter(&kev, &config, args.seed)
            .with_context(|| format!("writing {}", kev.display()))?;
        json!({"base": base, "kev": kev, "base_kept": true})
    } else {
        let report = write_release(
            &args.out,
            &SynthOptions {
                config: config.clone(),
                seed: args.seed,
                shards: args.shards,
                adapter: !args.no_adapter,
                f32_weights: false,
            },
        )
        .with_context(|| format!("writing {}", args.out.display()))?;
        serde_json::to_value(&report)?
    };
    if !args.no_adapter {
        let kev = args.out.join("kev");
        let files = write_decision_files(&kev, &tokenizer, &config, args.seed)
            .with_context(|| format!("writing the decision files into {}", kev.display()))?;
        v["decision_files"] = serde_json::to_value(&files)?;
    }
    v["seconds"] = json!((t.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    Ok(v)
}

/// The Kev tokenizer bundled with the fixtures of this source tree.
fn default_tokenizer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/kev/tokenizer.json")
}

/// `--skip-base` must not pair new `kev/` files with a base of another shape.
fn check_base(base: &Path, config: &Qwen35Config) -> anyhow::Result<()> {
    let found = Qwen35Config::from_dir(base)
        .with_context(|| format!("--skip-base: reading {}", base.display()))?;
    anyhow::ensure!(
        &found == config,
        "--skip-base: {} holds another decoder shape than --config asks for",
        base.display()
    );
    Ok(())
}

/// Width of Kev's pointer head (`q`, `k`: hidden → 256, in every size).
pub const HEAD_DIM: usize = 256;
/// Kev-4B's fitted softmax temperature (peers-notes §1), given to synthetic heads so their probabilities
/// are about as peaked as the real model's.
pub const KEV_4B_TEMPERATURE: f64 = 2.41;
/// Kev-0.8B v1.0's fitted temperature (2.3510958125672174 in its head.pt), rounded like the 4B's.
pub const KEV_0_8B_TEMPERATURE: f64 = 2.35;
/// Kev-9B v1.0's fitted temperature (2.193649959389252 in its head.pt, docs/kev-9b-pins.md), rounded alike.
pub const KEV_9B_TEMPERATURE: f64 = 2.19;
/// Keeps the head's values independent of the adapter's and the backbone's for the same seed.
const HEAD_SALT: u64 = 0x4ead;

/// The temperature of the synthetic head for the release `id` stands for.
pub fn temperature(id: Identity) -> f64 {
    if id == Identity::of(&Qwen35Config::qwen35_0_8b()) {
        KEV_0_8B_TEMPERATURE
    } else if id == Identity::of(&Qwen35Config::qwen35_9b()) {
        KEV_9B_TEMPERATURE
    } else {
        KEV_4B_TEMPERATURE
    }
}

/// A random pointer head in fp32 with Kev-4B's metadata key set: weights uniform with unit output variance
/// for unit-variance inputs (like the projections), biases uniform on ±0.1.
pub fn random_head(hidden: usize, head_dim: usize, temperature: f64, seed: u64) -> KevHead {
    let four = Identity::of(&Qwen35Config::qwen35_4b());
    random_head_as(hidden, head_dim, four, temperature, seed)
}

/// [`random_head`] naming the base and revision of `id`.
pub fn random_head_as(
    hidden: usize,
    head_dim: usize,
    id: Identity,
    temperature: f64,
    seed: u64,
) -> KevHead {
    let seed = seed ^ HEAD_SALT;
    let w = (3.0 / hidden.max(1) as f32).sqrt();
    let linear = |p: &str| Linear {
        out_features: head_dim,
        in_features: hidden,
        weight: draw_uniform(seed, &format!("{p}.weight"), head_dim * hidden, w),
        bias: draw_uniform(seed, &format!("{p}.bias"), head_dim, 0.1),
    };
    KevHead {
        meta: HeadMeta {
            base: id.base.into(),
            base_revision: id.base_revision.into(),
            lora: json!(16),
            head_dim,
            option_isolation: json!(false),
            special_embeddings: json!(false),
            weights_dtype: json!("bfloat16"),
            temperature,
            lora_placement: json!("all"),
        },
        q: linear("q"),
        k: linear("k"),
    }
}

/// What [`write_decision_files`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DecisionFiles {
    /// The copied `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// `head.safetensors` (fp32 `q.weight`, `q.bias`, `k.weight`, `k.bias`).
    pub head: PathBuf,
    /// `kev_head.json` (metadata, delimiter ids, temperature, scale).
    pub head_json: PathBuf,
    /// Head width.
    pub head_dim: usize,
    /// Softmax temperature.
    pub temperature: f64,
}

/// Make `dir` (a Kev release directory, usually next to the adapter) loadable for decisions: copy
/// `tokenizer` (and a `tokenizer_config.json` beside it, when there is one) and write a random head for a
/// decoder of `cfg`'s width in the prepared form. The delimiter ids are read from the tokenizer, so the head's
/// metadata agrees with the file it ships with.
pub fn write_decision_files(
    dir: &Path,
    tokenizer: &Path,
    cfg: &Qwen35Config,
    seed: u64,
) -> anyhow::Result<DecisionFiles> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tok_out = dir.join("tokenizer.json");
    std::fs::copy(tokenizer, &tok_out)
        .with_context(|| format!("copying {}", tokenizer.display()))?;
    if let Some(side) = tokenizer.parent().map(|p| p.join("tokenizer_config.json"))
        && side.is_file()
    {
        std::fs::copy(&side, dir.join("tokenizer_config.json"))
            .with_context(|| format!("copying {}", side.display()))?;
    }
    let delimiters = Delimiters::from_tokenizer_json(&tok_out)
        .with_context(|| format!("reading {}", tok_out.display()))?;
    let id = Identity::of(cfg);
    let temperature = temperature(id);
    let head = random_head_as(cfg.hidden_size, HEAD_DIM, id, temperature, seed);
    let provenance = HeadProvenance {
        source: format!("kev synth (random head, seed {seed})"),
        revision: None,
        // No head.pt exists for a synthetic head.
        head_pt_sha256: String::new(),
    };
    head.write_prepared(dir, &delimiters, &provenance)
        .with_context(|| format!("writing the head into {}", dir.display()))?;
    Ok(DecisionFiles {
        tokenizer: tok_out,
        head: dir.join(kev_release::head::HEAD_SAFETENSORS),
        head_json: dir.join(kev_release::head::HEAD_JSON),
        head_dim: HEAD_DIM,
        temperature,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kev_engine::synth::{cut, write_adapter};

    fn fixture_tokenizer() -> PathBuf {
        default_tokenizer()
    }

    #[test]
    fn decision_files_round_trip_through_the_prepared_head_reader() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = tiny_config(248_320);
        let files = write_decision_files(dir.path(), &fixture_tokenizer(), &cfg, 3).unwrap();
        assert!(files.tokenizer.is_file() && dir.path().join("tokenizer_config.json").is_file());
        let read = kev_release::head::PreparedHead::read(dir.path()).unwrap();
        assert_eq!(read.head, random_head(16, HEAD_DIM, KEV_4B_TEMPERATURE, 3));
        assert_eq!(read.head.meta.base, "Qwen/Qwen3.5-4B-Base");
        assert_eq!(read.head.hidden_size(), 16);
        assert_eq!(read.scale, 1.0 / 16.0);
        // The delimiter ids come from the copied tokenizer (kev-contract §1).
        assert_eq!(read.delimiters.state, 248_060);
        assert_eq!(read.delimiters.decide, 248_062);
    }

    #[test]
    fn a_0_8b_shaped_release_names_the_0_8b_base() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cut(&Qwen35Config::qwen35_0_8b(), 4, 512);
        assert_eq!(
            Identity::of(&cfg),
            Identity::of(&Qwen35Config::qwen35_0_8b())
        );
        let files = write_decision_files(dir.path(), &fixture_tokenizer(), &cfg, 1).unwrap();
        assert_eq!(files.temperature, KEV_0_8B_TEMPERATURE);
        let read = kev_release::head::PreparedHead::read(dir.path()).unwrap();
        assert_eq!(read.head.meta.base, "Qwen/Qwen3.5-0.8B-Base");
        assert_eq!(
            read.head.meta.base_revision,
            "dc7cdfe2ee4154fa7e30f5b51ca41bfa40174e68"
        );
        assert_eq!(read.head.hidden_size(), 1024);
        write_adapter(dir.path(), &cfg, 1).unwrap();
        let ac: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("adapter_config.json")).unwrap())
                .unwrap();
        assert_eq!(ac["base_model_name_or_path"], "Qwen/Qwen3.5-0.8B-Base");
        assert_eq!(Identity::of(&tiny_config(300)).base, "Qwen/Qwen3.5-4B-Base");
    }

    #[test]
    fn a_9b_shaped_release_names_the_9b_base() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cut(&Qwen35Config::qwen35_9b(), 2, 256);
        assert_eq!(Identity::of(&cfg), Identity::of(&Qwen35Config::qwen35_9b()));
        let files = write_decision_files(dir.path(), &fixture_tokenizer(), &cfg, 1).unwrap();
        assert_eq!(files.temperature, KEV_9B_TEMPERATURE);
        let read = kev_release::head::PreparedHead::read(dir.path()).unwrap();
        assert_eq!(read.head.meta.base, "Qwen/Qwen3.5-9B-Base");
        assert_eq!(
            read.head.meta.base_revision,
            kev_release::ReleasePins::kev_9b_v1().base.revision
        );
        assert_eq!(read.head.hidden_size(), 4096);
        // the 4B's widths with the 9B's tie are not the 9B
        let mut tied = cfg.clone();
        tied.tie_word_embeddings = true;
        assert_eq!(Identity::of(&tied).base, "Qwen/Qwen3.5-4B-Base");
    }

    #[test]
    fn random_heads_are_seeded_and_scaled() {
        let a = random_head(2560, 256, 2.0, 0);
        assert_eq!(a, random_head(2560, 256, 2.0, 0));
        assert_ne!(a.q.weight, random_head(2560, 256, 2.0, 1).q.weight);
        assert_ne!(a.q.weight, a.k.weight);
        assert_eq!(a.q.weight.len(), 256 * 2560);
        let bound = (3.0f32 / 2560.0).sqrt();
        assert!(a.q.weight.iter().all(|w| w.abs() <= bound));
        // Unit output variance for unit-variance inputs: mean square ≈ 1 / hidden.
        let ms = a.k.weight.iter().map(|w| (w * w) as f64).sum::<f64>() / a.k.weight.len() as f64;
        assert!((ms * 2560.0 - 1.0).abs() < 0.01, "{ms}");
        assert!(a.q.bias.iter().all(|b| b.abs() <= 0.1));
    }

    #[test]
    fn shapes_name_their_configs() {
        for s in Shape::ALL {
            assert_eq!(s.name().parse::<Shape>(), Ok(s));
        }
        assert_eq!(Shape::Qwen08b.config(), Qwen35Config::qwen35_0_8b());
        assert_eq!(Shape::Qwen9b.config(), Qwen35Config::qwen35_9b());
        assert_eq!(Shape::Tiny.config().hidden_size, 16);
        let err = "7b".parse::<Shape>().unwrap_err();
        assert_eq!(err, "unknown decoder shape `7b` (4b, 0.8b, 9b, tiny)");
    }
}
