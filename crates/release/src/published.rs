//! The published Kev releases kev knows by name, and the Kev-0.8B and Kev-9B v1.0 pins.
//!
//! A [`Release`] names one published size (`kev-4b`, `kev-0.8b`, `kev-9b`): its pins, the directory name a
//! prepared copy gets in the kev cache, and the model name `/v1/models` lists. Kev-4B's pins are in
//! [`crate::manifest`]; Kev-0.8B's are here, with their sources in `docs/kev-0.8b-pins.md`, Kev-9B's in
//! `kev_9b` (sources in `docs/kev-9b-pins.md`). Where a digest was not found in any public record the file is
//! left out of the pins (never guessed), where a size was not found the pin has none, and
//! [`ReleasePins::unverified`] says so.

use crate::manifest::{DigestKind, PinnedFile, ReleasePins, RepoPin};

mod kev_9b;

/// A published Kev release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Release {
    /// Kev-4B v1.0 on Qwen3.5-4B-Base (the default everywhere).
    #[default]
    Kev4b,
    /// Kev-0.8B v1.0 on Qwen3.5-0.8B-Base.
    Kev08b,
    /// Kev-9B v1.0 (the author's "v2", Kev 1.0) on Qwen3.5-9B-Base.
    Kev9b,
}

impl Release {
    /// Every release, default first.
    pub const ALL: [Release; 3] = [Release::Kev4b, Release::Kev08b, Release::Kev9b];

    /// Every release's name, in the order of [`Release::ALL`] (what the command lines accept).
    pub const NAMES: [&'static str; 3] = ["kev-4b", "kev-0.8b", "kev-9b"];

    /// The name on the command line and in `/v1/models`: `kev-4b`, `kev-0.8b`, `kev-9b`.
    pub fn name(self) -> &'static str {
        match self {
            Release::Kev4b => Self::NAMES[0],
            Release::Kev08b => Self::NAMES[1],
            Release::Kev9b => Self::NAMES[2],
        }
    }

    /// The pinned files of this release.
    pub fn pins(self) -> ReleasePins {
        match self {
            Release::Kev4b => ReleasePins::kev_4b_v1(),
            Release::Kev08b => ReleasePins::kev_0_8b_v1(),
            Release::Kev9b => ReleasePins::kev_9b_v1(),
        }
    }

    /// The release whose base repository is `base_repo` (`Qwen/Qwen3.5-9B-Base` → Kev-9B), if one is.
    pub fn of_base(base_repo: &str) -> Option<Release> {
        Release::ALL
            .into_iter()
            .find(|r| r.pins().base.repo == base_repo)
    }

    /// The directory a prepared copy gets in the kev cache: `kev-4b-v1.0`, `kev-0.8b-v1.0`, `kev-9b-v1.0`.
    pub fn dir_name(self) -> String {
        format!("{}-v1.0", self.name())
    }

    /// The published release these pins are, if any (compared file by file, so a pins file with exactly
    /// the built-in content counts too).
    pub fn of_pins(pins: &ReleasePins) -> Option<Release> {
        Release::ALL.into_iter().find(|r| r.pins() == *pins)
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Release {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.trim().to_ascii_lowercase();
        match l.as_str() {
            "kev-4b" | "4b" => Ok(Release::Kev4b),
            "kev-0.8b" | "0.8b" | "kev-08b" => Ok(Release::Kev08b),
            "kev-9b" | "9b" => Ok(Release::Kev9b),
            _ => Err(format!(
                "unknown release `{s}` (known: {})",
                Release::ALL.map(Release::name).join(", ")
            )),
        }
    }
}

/// The model name for a base repository: `Qwen/Qwen3.5-0.8B-Base` → `kev-0.8b`. `None` when the name
/// carries no `<digits>B` size (a local or renamed base).
pub fn size_name(base_repo: &str) -> Option<String> {
    let last = base_repo.rsplit('/').next().unwrap_or(base_repo);
    // the size is the first `-`-separated part that is a number followed by B (Qwen3.5-0.8B-Base)
    last.split('-').find_map(|part| {
        let num = part.strip_suffix(['B', 'b'])?;
        let ok = !num.is_empty()
            && num.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            && num.bytes().next().is_some_and(|b| b.is_ascii_digit());
        ok.then(|| format!("kev-{}b", num))
    })
}

/// Pins by sha256 (`size` `None` where no record gives it).
fn files(list: &[(&str, Option<u64>, &str)]) -> Vec<PinnedFile> {
    list.iter()
        .map(|&(name, size, digest)| PinnedFile {
            name: name.to_string(),
            size,
            // every digest found for Kev-0.8B and Kev-9B is a sha256 of the bytes (also for the small files,
            // whose Hub id is a git blob sha1 that no public record gives)
            kind: DigestKind::Sha256,
            digest: digest.to_string(),
        })
        .collect()
}

impl ReleasePins {
    /// The published Kev-0.8B v1.0 release: `jaredpalmer/kev-0.8b@bf75a6a8…` (tag v1.0) on
    /// `Qwen/Qwen3.5-0.8B-Base@dc7cdfe2…`. Sizes and sha256 digests from public records
    /// (`docs/kev-0.8b-pins.md`); every file kev reads is pinned, the rest of each repository is listed in
    /// `unverified`.
    pub fn kev_0_8b_v1() -> Self {
        ReleasePins {
            name: "Kev-0.8B v1.0".to_string(),
            kev: RepoPin {
                repo: "jaredpalmer/kev-0.8b".to_string(),
                revision: "bf75a6a8848ea6960ff2ed108d9ed44c2941174f".to_string(),
                files: files(&[
                    (
                        "adapter_config.json",
                        Some(1_273),
                        "748acb2cda88454cb1ba69d745ba336f3fcb5486eac349e90960c8b8d8d3e854",
                    ),
                    (
                        "adapter_model.safetensors",
                        Some(43_338_624),
                        "9b908623acb162118575f4e7a94524f9c139c335be4bfb74d6cfceca01e1885a",
                    ),
                    (
                        "head.pt",
                        Some(2_103_999),
                        "f400bd12802b2b105ae45d6b03774a158a3db4fccff42413734ddca2e5c920b6",
                    ),
                    (
                        "tokenizer.json",
                        Some(19_989_325),
                        "06b9509352d2af50381ab2247e083b80d32d5c0aba91c272ca9ff729b6a0e523",
                    ),
                    (
                        "tokenizer_config.json",
                        Some(1_128),
                        "8671bed7c852ce9e661be94f179a7b4ffd091c2a65aea0363e5501c20318ee45",
                    ),
                ]),
            },
            base: RepoPin {
                repo: "Qwen/Qwen3.5-0.8B-Base".to_string(),
                revision: "dc7cdfe2ee4154fa7e30f5b51ca41bfa40174e68".to_string(),
                files: files(&[
                    (
                        "LICENSE",
                        Some(11_343),
                        "50cbab8a892c5f2993b8c7351a99182507472def3b1374558308605d99b86b32",
                    ),
                    (
                        "config.json",
                        Some(2_907),
                        "b90b86f35c8e6925ef74ee04d0e758f0a845c83a42089ad82bbaa948de9b4204",
                    ),
                    (
                        "merges.txt",
                        Some(3_353_259),
                        "a9d356d7bdf1ef4949e3e748e95b8e10ad9d4e2e838eddc38a0a7b6b94d1db8d",
                    ),
                    (
                        "model.safetensors-00001-of-00001.safetensors",
                        Some(1_746_942_600),
                        "c2b1e5a17d9c1e27685d92ed9b382911ebb99955ecd89052d1721241adfbab6c",
                    ),
                    (
                        "model.safetensors.index.json",
                        Some(50_900),
                        "ce9a885efdf27d3664fdef5d512ad365216f1074051ef840c7cd8e5431495d0a",
                    ),
                    (
                        "tokenizer.json",
                        Some(12_807_196),
                        "fe000e3ed39ed12b8d2481d527d44f93c65d37e87645d2dcc80d1bf9d50d2927",
                    ),
                    (
                        "tokenizer_config.json",
                        Some(16_712),
                        "e611fbccc7c29ef3b1cafb1cb7ea548d189968632901d678fd62be68c47885de",
                    ),
                    (
                        "vocab.json",
                        Some(6_722_759),
                        "ce99b4cb2983d118806ce0a8b777a35b093e2000a503ebde25853284c9dfa003",
                    ),
                ]),
            },
            unverified: vec![
                "jaredpalmer/kev-0.8b@bf75a6a8: files other than the 5 pinned (README.md, provenance.json, \
                 training_config.json, result.json, ...) have no public digest at this commit and are not \
                 pinned; kev reads none of them"
                    .to_string(),
                "Qwen/Qwen3.5-0.8B-Base@dc7cdfe2: README.md, preprocessor_config.json and \
                 video_preprocessor_config.json have no public digest and are not pinned; kev reads none of them"
                    .to_string(),
                "the small files (under 10 MiB, not LFS) are pinned by the sha256 of their bytes from public \
                 records; the Hub's own id for them (the git blob sha1) was not found and is not checked against \
                 the pins"
                    .to_string(),
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_pins_are_distinct() {
        for r in Release::ALL {
            assert_eq!(r.name().parse::<Release>().unwrap(), r);
            assert_eq!(Release::of_pins(&r.pins()), Some(r));
        }
        assert_eq!("0.8B".parse::<Release>().unwrap(), Release::Kev08b);
        assert_eq!("9B".parse::<Release>().unwrap(), Release::Kev9b);
        let err = "kev-27b".parse::<Release>().unwrap_err();
        assert!(err.contains("kev-0.8b") && err.contains("kev-9b"), "{err}");
        assert_eq!(Release::default(), Release::Kev4b);
        assert_eq!(Release::Kev08b.dir_name(), "kev-0.8b-v1.0");
        assert_eq!(Release::Kev9b.dir_name(), "kev-9b-v1.0");
        assert_eq!(Release::ALL.map(Release::name), Release::NAMES);
        for r in Release::ALL {
            assert_eq!(Release::of_base(&r.pins().base.repo), Some(r));
            // the size `/v1/models` names is the release's own name
            assert_eq!(size_name(&r.pins().base.repo).as_deref(), Some(r.name()));
        }
        assert_eq!(Release::of_base("Qwen/Qwen3.5-2B-Base"), None);
        let mut other = Release::Kev08b.pins();
        other.kev.files.pop();
        assert_eq!(Release::of_pins(&other), None);
    }

    #[test]
    fn size_names_come_from_the_base_repository() {
        assert_eq!(
            size_name("Qwen/Qwen3.5-0.8B-Base").as_deref(),
            Some("kev-0.8b")
        );
        assert_eq!(size_name("Qwen/Qwen3.5-4B-Base").as_deref(), Some("kev-4b"));
        assert_eq!(size_name("Qwen/Qwen3.5-9B").as_deref(), Some("kev-9b"));
        assert_eq!(size_name("/tmp/base"), None);
        assert_eq!(size_name("Qwen/Qwen3.5-Base"), None);
        assert_eq!(size_name("x/-B-"), None);
    }

    /// The pins survive a round trip through a file, every digest is a sha256, and they name every file
    /// kev reads: the adapter's four, the base's config and index, and its `shards`.
    fn assert_pins_cover_what_kev_reads(p: &ReleasePins, shards: &[&str]) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pins.json");
        std::fs::write(&path, p.to_json()).unwrap();
        assert_eq!(&ReleasePins::from_json_file(&path).unwrap(), p);
        for f in p.kev.files.iter().chain(&p.base.files) {
            assert_eq!(f.kind, DigestKind::Sha256, "{}", f.name);
            assert_eq!(f.digest.len(), 64, "{}", f.name);
        }
        for name in [
            "adapter_config.json",
            "adapter_model.safetensors",
            "head.pt",
            "tokenizer.json",
        ] {
            assert!(p.kev.file(name).is_some(), "{name}");
        }
        let base = ["config.json", "model.safetensors.index.json"];
        for name in base.iter().chain(shards) {
            assert!(p.base.file(name).is_some(), "{name}");
        }
    }

    #[test]
    fn kev_08b_pins_are_well_formed_and_cover_what_kev_reads() {
        let p = ReleasePins::kev_0_8b_v1();
        assert_pins_cover_what_kev_reads(&p, &["model.safetensors-00001-of-00001.safetensors"]);
        // The two releases share the Kev tokenizer and the base tokenizer byte for byte.
        let four = ReleasePins::kev_4b_v1();
        assert_eq!(
            p.kev.file("tokenizer.json").unwrap().digest,
            four.kev.file("tokenizer.json").unwrap().digest
        );
        assert_eq!(
            p.base.file("tokenizer.json").unwrap().digest,
            four.base.file("tokenizer.json").unwrap().digest
        );
        assert!(!p.unverified.is_empty());
        assert!(four.unverified.is_empty());
    }

    #[test]
    fn kev_9b_pins_are_well_formed_and_cover_what_kev_reads() {
        let p = ReleasePins::kev_9b_v1();
        let shards: Vec<String> = (1..=4)
            .map(|i| format!("model.safetensors-{i:05}-of-00004.safetensors"))
            .collect();
        let shards: Vec<&str> = shards.iter().map(String::as_str).collect();
        assert_pins_cover_what_kev_reads(&p, &shards);
        let listed = p.base.files.iter();
        assert_eq!(
            listed
                .filter(|f| f.name.starts_with("model.safetensors-"))
                .count(),
            4
        );
        // Only the three files no record sizes are no_size, and the pins say so.
        let no_size: Vec<&str> = p
            .kev
            .files
            .iter()
            .chain(&p.base.files)
            .filter(|f| f.size.is_none())
            .map(|f| f.name.as_str())
            .collect();
        assert_eq!(
            no_size,
            [
                "adapter_config.json",
                "adapter_model.safetensors",
                "head.pt"
            ]
        );
        assert!(
            p.unverified
                .iter()
                .any(|u| no_size.iter().all(|n| u.contains(n)))
        );
        // The base files the public records size: 19.3 GB, the four shards 19.3 of them.
        let bytes: u64 = p.base.files.iter().filter_map(|f| f.size).sum();
        assert_eq!(bytes, 19_329_293_582);
        // The three sizes share their tokenizers and merges with the other releases, byte for byte.
        let (four, small) = (ReleasePins::kev_4b_v1(), ReleasePins::kev_0_8b_v1());
        for name in ["tokenizer.json", "tokenizer_config.json"] {
            let (a, b) = (p.kev.file(name).unwrap(), small.kev.file(name).unwrap());
            assert_eq!((&a.digest, a.size), (&b.digest, b.size), "{name}");
        }
        for name in ["tokenizer.json", "merges.txt", "vocab.json"] {
            let (a, b) = (p.base.file(name).unwrap(), small.base.file(name).unwrap());
            assert_eq!((&a.digest, a.size), (&b.digest, b.size), "{name}");
        }
        assert_eq!(
            p.base.file("tokenizer_config.json").unwrap().size,
            four.base.file("tokenizer_config.json").unwrap().size
        );
        assert!(p.kev.names_revision("db029f08"));
        assert!(p.base.names_revision("68c46c4b"));
    }
}
