//! The flags every model-loading command shares (decide, serve, bench, accept).
#![allow(dead_code)]

use std::marker::PhantomData;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use kev_decide::{Source, WeightForm};
use kev_engine::Arm;

/// Which model to load and how to compute with it.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A prepared (engine-ready) model directory, as written by `kev prepare`.
    #[arg(long, env = "KEV_MODEL", conflicts_with_all = ["base", "kev"])]
    pub model: Option<PathBuf>,
    /// The base release directory (Qwen3.5 base files); use with --kev.
    #[arg(long, requires = "kev")]
    pub base: Option<PathBuf>,
    /// The Kev release directory (adapter, tokenizer.json, and the head: head.pt, or the prepared form `kev synth`
    /// writes); use with --base.
    #[arg(long, requires = "base")]
    pub kev: Option<PathBuf>,
    /// Weight form: `merged` (LoRA merged into BF16 weights) or `exact` (LoRA kept unmerged in fp32; needs --base/--kev).
    #[arg(long, env = "KEV_WEIGHTS", default_value = "merged", value_parser = LibraryEnum::<WeightForm>::new())]
    pub weights: WeightForm,
    /// Compute arm: `fp32`, `bf16` or `int8` (W8A8 projections; default: bf16 where the CPU has native BF16
    /// dot products, else fp32).
    #[arg(long, env = "KEV_PRECISION", value_parser = LibraryEnum::<Arm>::new())]
    pub precision: Option<Arm>,
    /// Device: `cpu`, or `cuda[:N]` (checks the device and kernels; the CUDA backend is not enabled until it has
    /// passed its parity test on a GPU).
    #[arg(long, env = "KEV_DEVICE", default_value = "cpu")]
    pub device: String,
}

impl ModelArgs {
    /// `--device`: `cpu` runs; `cuda[:N]` opens the device and compiles the kernels, so that the error says
    /// whether the machine could run them, then refuses until the CUDA backend has passed its parity test on a GPU
    /// (issue 9).
    pub fn check_device(&self) -> anyhow::Result<()> {
        let choice: kev_cuda::DeviceChoice = self.device.parse().map_err(anyhow::Error::msg)?;
        let kev_cuda::DeviceChoice::Cuda(n) = choice else {
            return Ok(());
        };
        match kev_cuda::Device::open(n) {
            Err(e) => anyhow::bail!("--device {choice}: {e}"),
            Ok(d) => anyhow::bail!(
                "--device {choice}: {} is usable and kev's kernels compile for it, but the CUDA backend has not \
                 passed its parity test on a GPU yet (kev-cuda's tests/backend.rs), so kev does not serve with it; \
                 use --device cpu",
                d.describe()
            ),
        }
    }

    /// The model's files these flags name.
    pub fn source(&self) -> anyhow::Result<Source> {
        match (&self.model, &self.base, &self.kev) {
            (Some(dir), _, _) => Ok(Source::Prepared(dir.clone())),
            (None, Some(base), Some(kev)) => Ok(Source::Release {
                base: base.clone(),
                kev: kev.clone(),
            }),
            _ => anyhow::bail!(
                "name a model: --model DIR (prepared), or --base DIR --kev DIR (release)"
            ),
        }
    }

    /// The compute arm asked for, if any.
    pub fn arm(&self) -> Option<Arm> {
        self.precision
    }
}

/// A library enum the flags name: its `FromStr` is the one parser (and its error the one wording), its
/// `name` the one spelling `--help` lists.
pub trait Named: std::str::FromStr<Err = String> + Copy + Send + Sync + 'static {
    /// Every value, in the order `--help` lists them.
    const ALL: &'static [Self];
    /// The value's name on the command line.
    fn name(self) -> &'static str;
}

impl Named for WeightForm {
    const ALL: &'static [Self] = &[WeightForm::Merged, WeightForm::Exact];
    fn name(self) -> &'static str {
        WeightForm::name(self)
    }
}

impl Named for Arm {
    const ALL: &'static [Self] = &[Arm::Fp32, Arm::Bf16, Arm::Int8];
    fn name(self) -> &'static str {
        Arm::name(self)
    }
}

impl Named for kev_bench::PeerName {
    const ALL: &'static [Self] = &kev_bench::PeerName::ALL;
    fn name(self) -> &'static str {
        kev_bench::PeerName::name(self)
    }
}

impl Named for kev_bench::decide::Case {
    const ALL: &'static [Self] = &kev_bench::decide::Case::ALL;
    fn name(self) -> &'static str {
        kev_bench::decide::Case::name(self)
    }
}

impl Named for kev_bench::synth::Shape {
    const ALL: &'static [Self] = &kev_bench::synth::Shape::ALL;
    fn name(self) -> &'static str {
        kev_bench::synth::Shape::name(self)
    }
}

/// clap's value parser for a [`Named`] library enum.
#[derive(Clone)]
pub struct LibraryEnum<T>(PhantomData<T>);

impl<T: Named> LibraryEnum<T> {
    /// The parser.
    pub fn new() -> Self {
        LibraryEnum(PhantomData)
    }
}

impl<T: Named> Default for LibraryEnum<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Named> TypedValueParser for LibraryEnum<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<T, clap::Error> {
        let text = value
            .to_str()
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidUtf8).with_cmd(cmd))?;
        text.parse().map_err(|message: String| {
            let flag = arg.map(|a| a.to_string()).unwrap_or_default();
            clap::Error::raw(
                clap::error::ErrorKind::InvalidValue,
                format!("{flag}: {message}\n"),
            )
            .with_cmd(cmd)
        })
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            T::ALL.iter().map(|v| PossibleValue::new(v.name())),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    #[test]
    fn weights_and_precision_parse_to_the_library_types_with_the_library_wording() {
        let cli =
            Cli::try_parse_from(["kev", "--weights", "exact", "--precision", "int8"]).unwrap();
        assert_eq!(cli.model.weights, WeightForm::Exact);
        assert_eq!(cli.model.arm(), Some(Arm::Int8));
        let cli = Cli::try_parse_from(["kev"]).unwrap();
        assert_eq!(cli.model.weights, WeightForm::Merged);
        assert_eq!(cli.model.arm(), None);
        let err = Cli::try_parse_from(["kev", "--precision", "fp16"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("unknown compute arm `fp16` (fp32, bf16, int8)"),
            "{err}"
        );
        let err = Cli::try_parse_from(["kev", "--weights", "lora"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("unknown weight form `lora` (merged, exact)"),
            "{err}"
        );
    }
}
