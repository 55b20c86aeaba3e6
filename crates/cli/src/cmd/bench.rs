//! `kev bench <sub-benchmark>`: the flags; the measuring is kev-bench's (`kev_bench::backbone`,
//! `kev_bench::decide`).

use std::path::PathBuf;
use std::process::ExitCode;

use kev_bench::PeerName;
use kev_bench::decide::Case;
use kev_bench::peers::BENCH_SEED;
use kev_engine::Arm;

use crate::model_args::{LibraryEnum, ModelArgs};

/// Flags of `kev bench`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// One row of N tokens through the backbone, per compute arm, against torch and llama.cpp.
    Backbone(BackboneArgs),
    /// Decisions end to end on the Core AI port's timing cases, against the torch reference.
    Decide(DecideArgs),
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.sub {
        Sub::Backbone(a) => kev_bench::backbone::run(a.options()?)?,
        Sub::Decide(a) => kev_bench::decide::run(a.options()?)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The model a bench loads, from the shared model flags (the device checked first: benches run on the CPU).
fn model(m: &ModelArgs) -> anyhow::Result<kev_bench::Model> {
    m.check_device()?;
    Ok(kev_bench::Model {
        source: m.source()?,
        weights: m.weights,
    })
}

/// Flags of `kev bench backbone`.
#[derive(clap::Args)]
struct BackboneArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Row lengths in tokens (`--lengths 94 380 1518` or `--lengths 94,380,1518`).
    #[arg(long, num_args = 1.., value_delimiter = ',', default_values_t = [94usize, 380, 1518])]
    lengths: Vec<usize>,
    /// Compute arms to time, comma-separated (default: fp32 and bf16; `--precision` picks one).
    #[arg(long, value_delimiter = ',', value_parser = LibraryEnum::<Arm>::new())]
    arms: Vec<Arm>,
    /// Timed runs per (arm, length); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Untimed runs before the timed ones.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Seconds per peak micro-benchmark loop.
    #[arg(long, default_value_t = 1.0)]
    peak_seconds: f64,
    /// Peers to run after ours: `none`, `torch` (fp32 and bf16), `llama` (llama.cpp on its BF16 GGUF),
    /// `llama-q8` (its Q8_0 GGUF), `llama-f16` (its F16 GGUF), `ik-llama` (ik_llama.cpp on the F16, Q8_0 and
    /// Q4_K_M GGUFs, run-time repacking on), `ik-llama-q` (the same on Q8_0 and Q4_K_M only: no F16 GGUF), `all` (every one of them); comma-separated. When our kernels
    /// run AVX2 (`KEV_ISA=avx2` or an AVX2-only CPU) the peers run as on an AVX2-only CPU:
    /// `KEV_BENCH_LLAMA_ISA=avx2` (the llama.cpp and ik_llama.cpp AVX2 builds), `ATEN_CPU_CAPABILITY=avx2
    /// ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2` (torch), each unless already set.
    #[arg(long, value_delimiter = ',', default_value = "all", value_parser = LibraryEnum::<PeerName>::new())]
    peers: Vec<PeerName>,
    /// Leave torch fp32 out of `torch` (it needs ~21 GB of memory for the 4B and minutes per length).
    #[arg(long)]
    no_torch_fp32: bool,
    /// Leave torch bf16 out of `torch` (without AVX512_BF16 it is several times slower than its fp32).
    #[arg(long)]
    no_torch_bf16: bool,
    /// Timed runs per peer and length (default: --reps); each peer adds one warm-up of its own.
    #[arg(long)]
    peer_reps: Option<usize>,
    /// Write the JSON report to this file (else it is printed after the tables).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seed of the token stream shared with the torch peer (`kev_bench::peers::bench_ids`).
    #[arg(long, default_value_t = BENCH_SEED)]
    seed: u64,
}

impl BackboneArgs {
    fn options(self) -> anyhow::Result<kev_bench::backbone::Options> {
        Ok(kev_bench::backbone::Options {
            model: model(&self.model)?,
            lengths: self.lengths,
            precision: self.model.arm(),
            arms: self.arms,
            reps: self.reps,
            warmup: self.warmup,
            peak_seconds: self.peak_seconds,
            peers: self.peers,
            no_torch_fp32: self.no_torch_fp32,
            no_torch_bf16: self.no_torch_bf16,
            peer_reps: self.peer_reps,
            json: self.json,
            seed: self.seed,
        })
    }
}

/// Flags of `kev bench decide`.
#[derive(clap::Args)]
struct DecideArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Cases to run, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_parser = LibraryEnum::<Case>::new())]
    cases: Vec<Case>,
    /// Compute arms, comma-separated (default: fp32 and bf16; `--precision` picks one).
    #[arg(long, value_delimiter = ',', value_parser = LibraryEnum::<Arm>::new())]
    arms: Vec<Arm>,
    /// Timed runs per (case, arm, mode); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Untimed runs before the timed ones (a cached case always gets at least one: it fills the cache).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Peers: `none` or `torch` (the author's row form, float32, on 1q-94 and 5q-137; needs --base/--kev).
    #[arg(long, value_delimiter = ',', default_value = "torch", value_parser = LibraryEnum::<PeerName>::new())]
    peers: Vec<PeerName>,
    /// Timed runs of the torch reference per request (default: --reps), after one warm-up pass.
    #[arg(long)]
    peer_reps: Option<usize>,
    /// Largest number of tokens one forward pass takes (as `kev serve --pass-tokens`).
    #[arg(long, default_value_t = 4096)]
    pass_tokens: usize,
    /// Shared and cached modes snapshot the state at its end rather than at its last multiple of 64 tokens
    /// (as `kev serve --unaligned-state`: fewer tokens per question, equal to from-zero rows only to fp32
    /// rounding).
    #[arg(long)]
    unaligned_state: bool,
    /// Write the JSON report to this file (else it is printed after the tables).
    #[arg(long)]
    json: Option<PathBuf>,
}

impl DecideArgs {
    fn options(self) -> anyhow::Result<kev_bench::decide::Options> {
        Ok(kev_bench::decide::Options {
            model: model(&self.model)?,
            cases: self.cases,
            precision: self.model.arm(),
            arms: self.arms,
            reps: self.reps,
            warmup: self.warmup,
            peers: self.peers,
            peer_reps: self.peer_reps,
            pass_tokens: self.pass_tokens,
            unaligned_state: self.unaligned_state,
            json: self.json,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn backbone(argv: &[&str]) -> Result<BackboneArgs, clap::Error> {
        let argv = ["kev", "backbone"].iter().chain(argv).copied();
        Cli::try_parse_from(argv).map(|c| match c.args.sub {
            Sub::Backbone(a) => a,
            Sub::Decide(_) => unreachable!(),
        })
    }

    fn decide(argv: &[&str]) -> Result<DecideArgs, clap::Error> {
        let argv = ["kev", "decide"].iter().chain(argv).copied();
        Cli::try_parse_from(argv).map(|c| match c.args.sub {
            Sub::Decide(a) => a,
            Sub::Backbone(_) => unreachable!(),
        })
    }

    #[test]
    fn lengths_take_several_values_after_one_flag_or_a_comma_list() {
        let a = backbone(&["--model", "m", "--lengths", "94", "380", "1518"]).unwrap();
        assert_eq!(a.lengths, [94, 380, 1518]);
        let a = backbone(&["--model", "m", "--lengths", "94,380", "8192"]).unwrap();
        assert_eq!(a.lengths, [94, 380, 8192]);
        let a = backbone(&["--model", "m", "--lengths", "8192", "--reps", "1"]).unwrap();
        assert_eq!((a.lengths.as_slice(), a.reps), ([8192].as_slice(), 1));
        let a = backbone(&["--model", "m"]).unwrap();
        assert_eq!(a.lengths, [94, 380, 1518]);
        assert!(backbone(&["--model", "m", "--lengths", "94", "x"]).is_err());
    }

    #[test]
    fn arms_peers_and_cases_are_the_library_types() {
        let a = backbone(&[
            "--model",
            "m",
            "--arms",
            "int8,fp32",
            "--peers",
            "torch,llama-q8",
        ])
        .unwrap();
        assert_eq!(a.arms, [Arm::Int8, Arm::Fp32]);
        assert_eq!(a.peers, [PeerName::Torch, PeerName::LlamaQ8]);
        assert_eq!(backbone(&["--model", "m"]).unwrap().peers, [PeerName::All]);
        let ik = backbone(&["--model", "m", "--peers", "ik-llama,llama-f16"]).unwrap();
        assert_eq!(ik.peers, [PeerName::IkLlama, PeerName::LlamaF16]);
        let err = backbone(&["--model", "m", "--arms", "fp16"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("unknown compute arm `fp16` (fp32, bf16, int8)"),
            "{err}"
        );
        let err = backbone(&["--model", "m", "--peers", "vllm"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("unknown peer `vllm`"), "{err}");

        let d = decide(&["--model", "m", "--cases", "1q-94,5q-137-cached"]).unwrap();
        assert_eq!(
            d.cases.iter().map(|c| c.name()).collect::<Vec<_>>(),
            ["1q-94", "5q-137-cached"]
        );
        assert_eq!(d.peers, [PeerName::Torch]);
        let err = decide(&["--model", "m", "--cases", "2q-9"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("unknown case `2q-9` (1q-94, 1q-380"), "{err}");
    }

    #[test]
    fn options_carry_the_model_and_the_precision() {
        let o = backbone(&[
            "--base",
            "b",
            "--kev",
            "k",
            "--weights",
            "exact",
            "--precision",
            "bf16",
        ])
        .unwrap()
        .options()
        .unwrap();
        assert_eq!(o.precision, Some(Arm::Bf16));
        assert_eq!(o.model.weights, kev_decide::WeightForm::Exact);
        assert_eq!(
            o.model.source,
            kev_decide::Source::Release {
                base: "b".into(),
                kev: "k".into()
            }
        );
    }
}
