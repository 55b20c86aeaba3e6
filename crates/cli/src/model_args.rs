//! The flags every model-loading command shares (decide, serve, bench, accept).
#![allow(dead_code)]

use std::marker::PhantomData;
use std::path::PathBuf;

use clap::builder::{PossibleValue, TypedValueParser};
use kev_decide::{AdapterDir, Source, WeightForm};
use kev_engine::Arm;

/// Which model to load and how to compute with it.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A prepared (engine-ready) model directory, as written by `kev prepare`.
    #[arg(long, env = "KEV_MODEL", conflicts_with_all = ["base", "kev"])]
    pub model: Option<PathBuf>,
    /// The base release directory (Qwen3.5 base files); use with --kev, or with one or more --adapter.
    #[arg(long)]
    pub base: Option<PathBuf>,
    /// The Kev release directory (adapter, tokenizer.json, and the head: head.pt, or the prepared form `kev synth`
    /// writes); use with --base.
    #[arg(long, requires = "base", conflicts_with = "adapters")]
    pub kev: Option<PathBuf>,
    /// A Kev adapter to serve over --base, as NAME=DIR (a Kev release directory: PEFT adapter, head, optional
    /// calibration.json); repeat for several. One resident base serves them all: a request's `model` picks the
    /// adapter by NAME; the first (or --default-adapter) also answers `kev-latest`, `jev-latest` and any
    /// other name. Every adapter is applied unmerged (the exact weight form).
    #[arg(
        long = "adapter",
        env = "KEV_ADAPTERS",
        value_delimiter = ',',
        value_name = "NAME=DIR",
        requires = "base",
        conflicts_with = "model"
    )]
    pub adapters: Vec<String>,
    /// A JSON file listing adapters, for many: `{"adapters": [{"name", "dir"}], "default"?: NAME}` (a relative
    /// dir is read from the file's directory); the same as that many --adapter flags, after them.
    #[arg(long, env = "KEV_ADAPTERS_FILE", value_name = "FILE", requires = "base",
        conflicts_with_all = ["model", "kev"])]
    pub adapters_file: Option<PathBuf>,
    /// The adapter (by NAME) that answers `kev-latest`, `jev-latest` and names no adapter has (default: the
    /// first).
    #[arg(long, env = "KEV_DEFAULT_ADAPTER", value_name = "NAME")]
    pub default_adapter: Option<String>,
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

    /// The model's files these flags name (with adapters: the base and the default adapter).
    pub fn source(&self) -> anyhow::Result<Source> {
        let adapters = self.adapter_dirs()?;
        match (&self.model, &self.base, &self.kev, adapters.first()) {
            (Some(dir), _, _, _) => Ok(Source::Prepared(dir.clone())),
            (None, Some(base), Some(kev), _) => Ok(Source::Release {
                base: base.clone(),
                kev: kev.clone(),
            }),
            (None, Some(base), None, Some(first)) => Ok(Source::Release {
                base: base.clone(),
                kev: first.dir.clone(),
            }),
            _ => anyhow::bail!(
                "name a model: --model DIR (prepared), or --base DIR with --kev DIR or --adapter NAME=DIR (release)"
            ),
        }
    }

    /// The adapters named by --adapter and --adapters-file, the default first (none without them).
    pub fn adapter_dirs(&self) -> anyhow::Result<Vec<AdapterDir>> {
        let mut out = Vec::new();
        for a in &self.adapters {
            let Some((name, dir)) = a
                .split_once('=')
                .filter(|(n, d)| !n.is_empty() && !d.is_empty())
            else {
                anyhow::bail!("--adapter {a}: expected NAME=DIR");
            };
            out.push(AdapterDir {
                name: name.to_owned(),
                dir: PathBuf::from(dir),
            });
        }
        let mut default = self.default_adapter.clone();
        if let Some(path) = &self.adapters_file {
            let (listed, file_default) = AdapterDir::read_file(path)?;
            out.extend(listed);
            default = default.or(file_default);
        }
        for (i, a) in out.iter().enumerate() {
            if out[..i].iter().any(|b| b.name == a.name) {
                anyhow::bail!("two adapters are named {}", a.name);
            }
        }
        if let Some(name) = default {
            let Some(i) = out.iter().position(|a| a.name == name) else {
                anyhow::bail!("--default-adapter {name}: no adapter has that name");
            };
            let first = out.remove(i);
            out.insert(0, first);
        }
        Ok(out)
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

    #[test]
    fn adapters_come_from_flags_and_a_file_the_default_first() {
        let dir = std::env::temp_dir().join(format!("kev-adapters-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("adapters.json");
        std::fs::write(
            &file,
            r#"{"adapters": [{"name": "ops", "dir": "ops"}, {"name": "abs", "dir": "/x/abs"}], "default": "ops"}"#,
        )
        .unwrap();
        let path = file.display().to_string();
        let cli = Cli::try_parse_from([
            "kev",
            "--base",
            "b",
            "--adapter",
            "one=d1",
            "--adapters-file",
            &path,
        ])
        .unwrap();
        let got = cli.model.adapter_dirs().unwrap();
        let names: Vec<&str> = got.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["ops", "one", "abs"]);
        assert_eq!(got[0].dir, dir.join("ops"));
        assert_eq!(got[2].dir, PathBuf::from("/x/abs"));
        match cli.model.source().unwrap() {
            Source::Release { kev, .. } => assert_eq!(kev, dir.join("ops")),
            other => panic!("{other:?}"),
        }
        // --default-adapter wins over the file's default; a name no adapter has is refused.
        let cli = Cli::try_parse_from([
            "kev",
            "--base",
            "b",
            "--adapter",
            "one=d1",
            "--adapters-file",
            &path,
            "--default-adapter",
            "abs",
        ])
        .unwrap();
        assert_eq!(cli.model.adapter_dirs().unwrap()[0].name, "abs");
        for bad in [
            vec![
                "kev",
                "--base",
                "b",
                "--adapter",
                "one=d1",
                "--default-adapter",
                "two",
            ],
            vec![
                "kev",
                "--base",
                "b",
                "--adapter",
                "one=d1",
                "--adapter",
                "one=d2",
            ],
            vec!["kev", "--base", "b", "--adapter", "nodir"],
        ] {
            let cli = Cli::try_parse_from(bad.clone()).unwrap();
            assert!(cli.model.adapter_dirs().is_err(), "{bad:?}");
        }
        assert!(
            Cli::try_parse_from(["kev", "--adapter", "a=d"]).is_err(),
            "needs --base"
        );
        assert!(
            Cli::try_parse_from(["kev", "--base", "b", "--kev", "k", "--adapter", "a=d"]).is_err(),
            "--kev or --adapter"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
