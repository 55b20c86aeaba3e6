//! The loader refuses what it cannot run, naming the tensor or config field: wrong dtype, wrong shape,
//! missing tensor, unexpected tensor, unsupported config, mismatched adapter.

use std::path::{Path, PathBuf};

use kev_engine::synth::{SynthOptions, tiny_config, write_release};
use kev_engine::{Backbone, EngineError, LoadOptions};
use serde_json::Value;

fn release() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_release(
        dir.path(),
        &SynthOptions {
            config: tiny_config(300),
            seed: 3,
            shards: 2,
            adapter: true,
            f32_weights: false,
        },
    )
    .unwrap();
    dir
}

fn load(dir: &Path, adapter: bool) -> Result<Backbone, EngineError> {
    Backbone::load(
        &dir.join("base"),
        &LoadOptions {
            adapter: adapter.then(|| dir.join("kev")),
            kernels: None,
            merge_adapter: false,
        },
    )
}

/// The safetensors file of `dir` that holds `name`.
fn file_with(dir: &Path, name: &str) -> PathBuf {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") && header(&p).0.get(name).is_some() {
            return p;
        }
    }
    panic!("{name} not found");
}

fn header(path: &Path) -> (Value, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    (h, bytes[8 + n..].to_vec())
}

/// Rewrite the header of the file holding `name` (the data section stays as it is).
fn edit(dir: &Path, name: &str, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = file_with(dir, name);
    let (mut h, data) = header(&path);
    f(h.as_object_mut().unwrap());
    let mut hb = serde_json::to_vec(&h).unwrap();
    while hb.len() % 8 != 0 {
        hb.push(b' ');
    }
    let mut out = (hb.len() as u64).to_le_bytes().to_vec();
    out.extend(hb);
    out.extend(data);
    std::fs::write(&path, out).unwrap();
    // The index must follow a renamed tensor.
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let mut ix: Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        let file = path.file_name().unwrap().to_str().unwrap().to_string();
        let map = ix["weight_map"].as_object_mut().unwrap();
        map.retain(|_, v| v.as_str() != Some(&file));
        for k in h
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "__metadata__")
        {
            map.insert(k.clone(), Value::String(file.clone()));
        }
        std::fs::write(&index, serde_json::to_vec(&ix).unwrap()).unwrap();
    }
}

fn tensor_error(e: EngineError) -> (String, String) {
    match e {
        EngineError::Tensor { name, reason } => (name, reason),
        other => panic!("expected a tensor error, got {other}"),
    }
}

const Z: &str = "model.language_model.layers.0.linear_attn.in_proj_z.weight";

#[test]
fn the_release_loads_in_both_forms() {
    let dir = release();
    assert!(!load(dir.path(), false).unwrap().has_lora());
    assert!(load(dir.path(), true).unwrap().has_lora());
}

#[test]
fn wrong_dtype_is_named() {
    let dir = release();
    edit(&dir.path().join("base"), Z, |h| {
        h[Z]["dtype"] = Value::from("F16")
    });
    let (name, reason) = tensor_error(load(dir.path(), false).unwrap_err());
    assert_eq!(name, Z);
    assert!(reason.contains("F16"), "{reason}");
}

#[test]
fn wrong_shape_is_named() {
    let dir = release();
    edit(&dir.path().join("base"), Z, |h| {
        let s = h[Z]["shape"].as_array().unwrap().clone();
        h[Z]["shape"] = Value::Array(vec![s[1].clone(), s[0].clone()]);
    });
    let (name, reason) = tensor_error(load(dir.path(), false).unwrap_err());
    assert_eq!(name, Z);
    assert!(reason.contains("expected [96, 16]"), "{reason}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = release();
    let k = "model.language_model.layers.3.self_attn.k_norm.weight";
    edit(&dir.path().join("base"), k, |h| {
        let v = h.remove(k).unwrap();
        h.insert(format!("{k}_renamed"), v);
    });
    let (name, reason) = tensor_error(load(dir.path(), false).unwrap_err());
    assert_eq!(name, k);
    assert_eq!(reason, "missing");
}

#[test]
fn unexpected_tensor_is_named_and_ignored_ones_are_skipped() {
    let dir = release();
    // The synthetic release carries `mtp.fc.weight`, which loads fine (skipped); renamed into the text
    // model it is refused.
    let extra = "model.language_model.layers.1.linear_attn.extra.weight";
    edit(&dir.path().join("base"), "mtp.fc.weight", |h| {
        let v = h.remove("mtp.fc.weight").unwrap();
        h.insert(extra.into(), v);
    });
    match load(dir.path(), false).unwrap_err() {
        EngineError::UnexpectedTensor(n) => assert_eq!(n, extra),
        other => panic!("{other}"),
    }
}

#[test]
fn unsupported_config_field_is_named() {
    let dir = release();
    let path = dir.path().join("base/config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    cfg["text_config"]["hidden_act"] = Value::from("gelu");
    std::fs::write(&path, serde_json::to_vec(&cfg).unwrap()).unwrap();
    match load(dir.path(), false).unwrap_err() {
        EngineError::Config { field, reason } => {
            assert_eq!(field, "text_config.hidden_act");
            assert!(reason.contains("gelu"));
        }
        other => panic!("{other}"),
    }
}

#[test]
fn adapter_for_a_module_the_layer_lacks_is_refused() {
    let dir = release();
    let kev = dir.path().join("kev");
    let a = "base_model.model.layers.0.linear_attn.in_proj_qkv.lora_A.weight";
    let b = a.replace("lora_A", "lora_B");
    edit(&kev, a, |h| {
        for n in [a.to_string(), b.clone()] {
            let v = h.remove(&n).unwrap();
            h.insert(n.replace("layers.0.", "layers.3."), v);
        }
    });
    let err = load(dir.path(), true).unwrap_err().to_string();
    assert!(err.contains("layers.3.linear_attn.in_proj_qkv"), "{err}");
}
