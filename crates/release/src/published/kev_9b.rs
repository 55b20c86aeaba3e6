//! The Kev-9B v1.0 pins. Every value below is from public records by people who downloaded the files (none
//! could be fetched from here); each is traced to its sources in `docs/kev-9b-pins.md`. Nothing is guessed: a
//! file no record gives a digest for is not pinned, a size no record gives is `None`, and `unverified` says
//! both.

use super::files;
use crate::manifest::{ReleasePins, RepoPin};

impl ReleasePins {
    /// The published Kev-9B v1.0 release: `jaredpalmer/kev-9b@db029f08…` (the `v1.0` tag: the Kev 1.0 card
    /// committed on top of the weights commit `b5d8c18e`, which the author calls Kev-9B v2) on
    /// `Qwen/Qwen3.5-9B-Base@68c46c4b…`. Sha256 digests for every file kev reads; the adapter's, the head's
    /// and `adapter_config.json`'s sizes have no public record and are unpinned (the sha256 binds the bytes).
    pub fn kev_9b_v1() -> Self {
        ReleasePins {
            name: "Kev-9B v1.0".to_string(),
            kev: RepoPin {
                repo: "jaredpalmer/kev-9b".to_string(),
                revision: "db029f08b290afd9fee4aa4bbcd9ae48602d1eb0".to_string(),
                files: files(&[
                    (
                        "adapter_config.json",
                        None,
                        "2b2563a94d1bc1065653bec4d296f5a1a6287ab895b14d23e5997333503ecd97",
                    ),
                    (
                        "adapter_model.safetensors",
                        None,
                        "2b2a70cf4ef4440b6c22899e1f72c2f8ea5c6f65b19aa344539b4b8971d1f13d",
                    ),
                    (
                        "chat_template.jinja",
                        Some(7_756),
                        "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715",
                    ),
                    (
                        "head.pt",
                        None,
                        "8e1dab2c8e3664f6fee843e0257d57946c25e0210c61901ea77e71761f4244e1",
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
                repo: "Qwen/Qwen3.5-9B-Base".to_string(),
                revision: "68c46c4b3498877f3ef123c856ecfde50c39f404".to_string(),
                files: files(&[
                    (
                        "config.json",
                        Some(3_126),
                        "d0883072e01861ed0b2d47be3c16c36a8e81c224c7ffaa310c6558fb3f932b05",
                    ),
                    (
                        "merges.txt",
                        Some(3_353_259),
                        "a9d356d7bdf1ef4949e3e748e95b8e10ad9d4e2e838eddc38a0a7b6b94d1db8d",
                    ),
                    (
                        "model.safetensors-00001-of-00004.safetensors",
                        Some(5_276_436_216),
                        "862bf7bba8a50145d19d0ae463931fae515284024736592a73a336bc4dfa54ee",
                    ),
                    (
                        "model.safetensors-00002-of-00004.safetensors",
                        Some(5_335_161_576),
                        "bace8e115e11ca93c22f0352a60d2fb0c76ac6d7d1c2993c143b7ad2b6c8868c",
                    ),
                    (
                        "model.safetensors-00003-of-00004.safetensors",
                        Some(5_368_717_376),
                        "63a021ac0011cbfc66166e77103327a8b45dee95832e36551f6b4c3337448959",
                    ),
                    (
                        "model.safetensors-00004-of-00004.safetensors",
                        Some(3_325_995_704),
                        "1a643bbed669266917b5058b5d3f660c03233599249ff7d8fd083decfe662ae0",
                    ),
                    (
                        "model.safetensors.index.json",
                        Some(79_657),
                        "026b9d9fe03f19fd065f2a2f56a332c67640878106c0ca6be2f60c655ed5a8c1",
                    ),
                    (
                        "tokenizer.json",
                        Some(12_807_196),
                        "fe000e3ed39ed12b8d2481d527d44f93c65d37e87645d2dcc80d1bf9d50d2927",
                    ),
                    (
                        "tokenizer_config.json",
                        Some(16_713),
                        "3891e840d7dc5fca0af33d3a25083a735e36fe06214e3f707024820cb6b9f89c",
                    ),
                    (
                        "vocab.json",
                        Some(6_722_759),
                        "ce99b4cb2983d118806ce0a8b777a35b093e2000a503ebde25853284c9dfa003",
                    ),
                ]),
            },
            unverified: vec![
                "jaredpalmer/kev-9b@db029f08: the sizes of adapter_model.safetensors, head.pt and \
                 adapter_config.json have no public record; they are pinned by sha256 alone (which fixes \
                 their bytes, and so their length)"
                    .to_string(),
                "jaredpalmer/kev-9b@db029f08: files other than the 6 pinned (README.md, provenance.json, \
                 training_config.json, result.json, ...) have no public digest at this commit and are not \
                 pinned; kev reads none of them"
                    .to_string(),
                "Qwen/Qwen3.5-9B-Base@68c46c4b: LICENSE, README.md, preprocessor_config.json and \
                 video_preprocessor_config.json have no public digest and are not pinned; kev reads none of \
                 them"
                    .to_string(),
                "the small files (under 10 MiB, not LFS) are pinned by the sha256 of their bytes from public \
                 records; the Hub's own id for them (the git blob sha1) was not found and is not checked against \
                 the pins"
                    .to_string(),
                "head.pt's base_revision is not in any public record; kev accepts the pinned base revision in \
                 full or abbreviated (at least 7 hex digits, as the author's model card writes it)"
                    .to_string(),
            ],
        }
    }
}
