//! kev-release against the committed synthetic release (`fixtures/release`, written by
//! tools/reference with torch + PEFT): adapter mapping, the merge bit for bit against PEFT's,
//! head.pt read without torch, and the refusals.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kev_release::head::{Delimiters, HeadProvenance, KevHead, PreparedHead};
use kev_release::manifest::sha256_hex;
use kev_release::merge::merge_weight_bytes;
use kev_release::{Adapter, AdapterError, TensorStore};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn merge_is_bit_equal_to_the_reference() {
    let root = fixtures().join("release");
    let base = TensorStore::open(&root.join("base")).unwrap();
    let adapter = Adapter::load(&root.join("kev"), &base).unwrap();
    let expected = json(&fixtures().join("expected/merge.json"));
    assert_eq!(adapter.base_prefix(), "model.language_model.");
    assert_eq!(adapter.r(), expected["r"].as_u64().unwrap() as usize);
    assert_eq!(
        f64::from(adapter.scale()),
        expected["scale"].as_f64().unwrap()
    );
    let tensors = expected["tensors"].as_object().unwrap();
    let want_merged: Vec<&String> = tensors
        .iter()
        .filter(|(_, v)| v["merged"].as_bool() == Some(true))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        want_merged.len(),
        expected["adapted"].as_u64().unwrap() as usize
    );
    assert_eq!(adapter.len(), want_merged.len());

    let mut equal = 0;
    for name in &want_merged {
        let lora = adapter
            .for_tensor(name)
            .unwrap_or_else(|| panic!("{name} is not adapted"));
        let w = base.get(name).unwrap();
        let merged = merge_weight_bytes(&w, lora, adapter.scale()).unwrap();
        let e = &tensors[name.as_str()];
        assert_eq!(e["dtype"], "BF16", "{name}");
        assert_eq!(
            sha256_hex(&merged),
            e["sha256"].as_str().unwrap(),
            "{name}: merged bytes differ from PEFT's merge"
        );
        equal += 1;
    }
    assert_eq!(equal, 62);

    // The module API the engine uses: paths relative to the text decoder.
    let m = adapter.module("layers.0.linear_attn.in_proj_qkv").unwrap();
    assert_eq!((m.r, m.in_features), (16, 16));
    assert_eq!(m.a.len(), 16 * m.in_features);
    assert_eq!(m.b.len(), m.out_features * 16);
    assert_eq!(
        adapter.base_tensor_name("layers.0.linear_attn.in_proj_qkv"),
        "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    );
}

#[test]
fn wrong_adapter_does_not_reproduce_the_reference() {
    // Negative control: the seed-2 adapter on the seed-1 base must not hit the recorded hashes.
    let base = TensorStore::open(&fixtures().join("release/base")).unwrap();
    let adapter = Adapter::load(&fixtures().join("release-wrong/kev"), &base).unwrap();
    let expected = json(&fixtures().join("expected/merge.json"));
    let name = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";
    let lora = adapter.for_tensor(name).unwrap();
    let merged = merge_weight_bytes(&base.get(name).unwrap(), lora, adapter.scale()).unwrap();
    assert_ne!(
        sha256_hex(&merged),
        expected["tensors"][name]["sha256"].as_str().unwrap()
    );
}

#[test]
fn head_pt_converts_to_the_reference_tensors_and_temperature() {
    let head = KevHead::read_pt(&fixtures().join("release/kev/head.pt")).unwrap();
    let expected = json(&fixtures().join("expected/head.json"));
    // exactly as stored: compare the f64 bits
    assert_eq!(
        head.meta.temperature.to_bits(),
        expected["temperature"].as_f64().unwrap().to_bits()
    );
    assert_eq!(
        head.meta.head_dim as u64,
        expected["head_dim"].as_u64().unwrap()
    );
    assert_eq!(
        head.scale().to_bits(),
        expected["scale"].as_f64().unwrap().to_bits()
    );
    let meta = &expected["meta"];
    assert_eq!(head.meta.base, meta["base"].as_str().unwrap());
    assert_eq!(
        head.meta.base_revision,
        meta["base_revision"].as_str().unwrap()
    );
    assert_eq!(head.meta.lora, meta["lora"]);
    assert_eq!(head.meta.option_isolation, meta["option_isolation"]);
    assert_eq!(head.meta.special_embeddings, meta["special_embeddings"]);
    assert_eq!(head.meta.weights_dtype, meta["weights_dtype"]);
    assert_eq!(head.meta.lora_placement, meta["lora_placement"]);
    let parts = [
        (
            "q.weight",
            f32_bytes(&head.q.weight),
            vec![head.q.out_features, head.q.in_features],
        ),
        ("q.bias", f32_bytes(&head.q.bias), vec![head.q.out_features]),
        (
            "k.weight",
            f32_bytes(&head.k.weight),
            vec![head.k.out_features, head.k.in_features],
        ),
        ("k.bias", f32_bytes(&head.k.bias), vec![head.k.out_features]),
    ];
    for (name, bytes, shape) in parts {
        let e = &expected["tensors"][name];
        assert_eq!(sha256_hex(&bytes), e["sha256"].as_str().unwrap(), "{name}");
        let want: Vec<usize> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        assert_eq!(shape, want, "{name}");
    }

    // The wrong release's head is a different head.
    let wrong = KevHead::read_pt(&fixtures().join("release-wrong/kev/head.pt")).unwrap();
    assert_ne!(
        sha256_hex(&f32_bytes(&wrong.q.weight)),
        expected["tensors"]["q.weight"]["sha256"].as_str().unwrap()
    );
}

#[test]
fn prepared_head_round_trips() {
    let head = KevHead::read_pt(&fixtures().join("release/kev/head.pt")).unwrap();
    let delimiters =
        Delimiters::from_tokenizer_json(&fixtures().join("release/kev/tokenizer.json")).unwrap();
    // kev-contract §1
    assert_eq!(
        delimiters,
        Delimiters {
            state: 248060,
            question: 248061,
            option_open: 248049,
            option_close: 248050,
            decide: 248062,
            pad: 248044,
        }
    );
    let provenance = HeadProvenance {
        source: "jaredpalmer/kev-4b".into(),
        revision: Some("6cfce5c2fa4b4bd64026336ab649c5ca78857d52".into()),
        head_pt_sha256: "00".repeat(32),
    };
    let dir = tempfile::tempdir().unwrap();
    head.write_prepared(dir.path(), &delimiters, &provenance)
        .unwrap();
    let back = PreparedHead::read(dir.path()).unwrap();
    assert_eq!(back.head, head);
    assert_eq!(back.delimiters, delimiters);
    assert_eq!(back.provenance, provenance);
    assert_eq!(back.scale.to_bits(), head.scale().to_bits());
    // the temperature survives the JSON text exactly
    let text = std::fs::read_to_string(dir.path().join("kev_head.json")).unwrap();
    assert!(
        text.contains(&format!("\"temperature\": {}", head.meta.temperature)),
        "{text}"
    );
}

/// A copy of the base release with one tensor removed from its shard and index.
fn base_without(tensor: &str, dir: &Path) {
    let src = fixtures().join("release/base");
    let index = json(&src.join("model.safetensors.index.json"));
    let shard = index["weight_map"][tensor].as_str().unwrap().to_string();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if name == shard {
            let data = std::fs::read(&p).unwrap();
            let st = safetensors::SafeTensors::deserialize(&data).unwrap();
            let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
                .tensors()
                .into_iter()
                .filter(|(n, _)| n != tensor)
                .collect();
            let meta: HashMap<String, String> = [("format".into(), "pt".into())].into();
            std::fs::write(
                dir.join(&name),
                safetensors::serialize(kept, Some(meta)).unwrap(),
            )
            .unwrap();
        } else if name == "model.safetensors.index.json" {
            let mut idx = index.clone();
            idx["weight_map"].as_object_mut().unwrap().remove(tensor);
            std::fs::write(dir.join(&name), idx.to_string()).unwrap();
        } else {
            std::fs::copy(&p, dir.join(&name)).unwrap();
        }
    }
}

#[test]
fn missing_adapted_module_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let gone = "model.language_model.layers.3.self_attn.q_proj.weight";
    base_without(gone, dir.path());
    let base = TensorStore::open(dir.path()).unwrap();
    let err = Adapter::load(&fixtures().join("release/kev"), &base).unwrap_err();
    match &err {
        AdapterError::MissingModules { missing } => {
            assert_eq!(missing, &["layers.3.self_attn.q_proj".to_string()]);
        }
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("layers.3.self_attn.q_proj"),
        "{err}"
    );
}

fn kev_copy_with(dir: &Path, config_edit: impl FnOnce(&mut Value)) {
    let src = fixtures().join("release/kev");
    for name in ["adapter_model.safetensors", "head.pt"] {
        std::fs::copy(src.join(name), dir.join(name)).unwrap();
    }
    let mut cfg = json(&src.join("adapter_config.json"));
    config_edit(&mut cfg);
    std::fs::write(dir.join("adapter_config.json"), cfg.to_string()).unwrap();
}

#[test]
fn unsupported_adapter_configs_are_refused_with_the_field_named() {
    let base = TensorStore::open(&fixtures().join("release/base")).unwrap();
    let cases: [(&str, Value); 6] = [
        ("use_dora", Value::Bool(true)),
        ("use_rslora", Value::Bool(true)),
        ("rank_pattern", serde_json::json!({"q_proj": 8})),
        ("alpha_pattern", serde_json::json!({"down_proj": 64})),
        ("bias", Value::String("all".into())),
        ("modules_to_save", serde_json::json!(["lm_head"])),
    ];
    for (field, value) in cases {
        let dir = tempfile::tempdir().unwrap();
        kev_copy_with(dir.path(), |c| {
            c[field] = value.clone();
        });
        let err = Adapter::load(dir.path(), &base).unwrap_err();
        assert!(
            matches!(&err, AdapterError::Unsupported { field: f, .. } if f == field),
            "{field}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(field) && msg.contains("not supported"),
            "{msg}"
        );
    }
    // an unknown target module
    let dir = tempfile::tempdir().unwrap();
    kev_copy_with(dir.path(), |c| {
        c["target_modules"]
            .as_array_mut()
            .unwrap()
            .push(Value::String("lm_head".into()));
    });
    let err = Adapter::load(dir.path(), &base).unwrap_err();
    assert!(err.to_string().contains("lm_head"), "{err}");
}

#[test]
fn a_mapped_tensor_outlives_its_store_with_the_same_bytes() {
    let base = TensorStore::open(&fixtures().join("release/base")).unwrap();
    let name = base
        .names()
        .find(|n| n.ends_with("embed_tokens.weight"))
        .unwrap()
        .to_string();
    let want = base.get(&name).unwrap().data.to_vec();
    let mapped = base.mapped(&name).unwrap();
    assert!(base.mapped("no.such.tensor").is_err());
    base.release(&name);
    drop(base);
    assert_eq!(mapped.bytes(), &want[..]);
}
