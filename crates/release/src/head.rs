//! The pointer head: `head.pt` (a torch zip archive) read without torch, and the prepared form
//! `head.safetensors` (fp32) + `kev_head.json` that the engine loads.
//!
//! `head.pt` is `torch.save` of a dict: `base`, `base_revision`, `lora`, `head_dim`, `option_isolation`,
//! `special_embeddings`, `weights_dtype`, `temperature`, `lora_placement` and `head` (the state dict
//! `q.weight`, `q.bias`, `k.weight`, `k.bias`, fp32); `special_embeddings` and `lora_placement` may be absent
//! (read as null), other keys (Kev-9B's `weights`) are ignored. The archive holds `<name>/data.pkl` (a pickle whose
//! tensors point at storages by key) and one `<name>/data/<key>` entry per storage.

use crate::FileError;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::pickle::{self, StorageDtype, TensorRef, Value};

/// File names of the prepared head.
pub const HEAD_SAFETENSORS: &str = "head.safetensors";
/// See [`HEAD_SAFETENSORS`].
pub const HEAD_JSON: &str = "kev_head.json";
/// Version of the `kev_head.json` layout.
pub const HEAD_FORMAT_VERSION: u32 = 1;

/// Errors while reading or writing the head.
#[derive(Debug, thiserror::Error)]
pub enum HeadError {
    /// A file could not be read or written, or holds what it must not.
    #[error(transparent)]
    File(#[from] crate::FileError),
    /// The pickle could not be read.
    #[error("{path}: {source}")]
    Pickle {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: pickle::PickleError,
    },
}

/// The metadata `head.pt` carries besides the weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadMeta {
    /// Base repository the head was trained on (`Qwen/Qwen3.5-4B-Base`).
    pub base: String,
    /// Its commit.
    pub base_revision: String,
    /// LoRA rank used in training (as stored).
    pub lora: serde_json::Value,
    /// Head width (256 for Kev-4B).
    pub head_dim: usize,
    /// Whether options were isolated from each other (Kev 1.0: false).
    pub option_isolation: serde_json::Value,
    /// As stored.
    pub special_embeddings: serde_json::Value,
    /// As stored (`bfloat16`).
    pub weights_dtype: serde_json::Value,
    /// Softmax temperature, exactly as stored.
    pub temperature: f64,
    /// As stored.
    pub lora_placement: serde_json::Value,
}

impl HeadMeta {
    /// The LoRA rank, when stored as an integer.
    pub fn lora_rank(&self) -> Option<u64> {
        self.lora.as_u64()
    }
}

/// One `nn.Linear`: `y = W x + b`, W `[out, in]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    /// Output features (the head dim).
    pub out_features: usize,
    /// Input features (the hidden size).
    pub in_features: usize,
    /// Weight, `[out, in]` row-major.
    pub weight: Vec<f32>,
    /// Bias, `[out]`.
    pub bias: Vec<f32>,
}

/// The pointer head: metadata and the q/k projections in fp32.
#[derive(Debug, Clone, PartialEq)]
pub struct KevHead {
    /// Metadata.
    pub meta: HeadMeta,
    /// Query projection (applied to the decide position's hidden state).
    pub q: Linear,
    /// Key projection (applied to each option's hidden state).
    pub k: Linear,
}

impl KevHead {
    /// `head_dim ** -0.5` in float64, as Python computes it for the scores.
    pub fn scale(&self) -> f64 {
        (self.meta.head_dim as f64).powf(-0.5)
    }

    /// Hidden size the head reads.
    pub fn hidden_size(&self) -> usize {
        self.q.in_features
    }

    /// The head of a directory, in whichever form it holds: `head.pt` as the Kev release publishes it, else the
    /// prepared form (`kev_head.json` + `head.safetensors`, what `kev prepare` and `kev synth` write). Returns the
    /// head and the file its weights came from. The one way kev finds a head: `--model DIR` and `--kev DIR`
    /// alike.
    pub fn read_dir(dir: &Path) -> Result<(Self, PathBuf), HeadError> {
        let pt = dir.join("head.pt");
        if pt.is_file() {
            return Ok((Self::read_pt(&pt)?, pt));
        }
        if dir.join(HEAD_JSON).is_file() {
            return Ok((PreparedHead::read(dir)?.head, dir.join(HEAD_SAFETENSORS)));
        }
        Err(FileError::Io {
            path: pt,
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no head: neither head.pt nor {HEAD_JSON} is in the directory"),
            ),
        }
        .into())
    }

    /// Read `head.pt`.
    pub fn read_pt(path: &Path) -> Result<Self, HeadError> {
        let TorchArchive {
            mut zip,
            prefix,
            root,
        } = open_torch_archive(path)?;
        let content = |message: String| -> HeadError {
            FileError::Format {
                path: path.to_path_buf(),
                message,
            }
            .into()
        };
        if !matches!(root, Value::Dict(_)) {
            return Err(content("the top-level object is not a dict".into()));
        }
        let get = |k: &str| {
            root.get(k)
                .ok_or_else(|| content(format!("key {k:?} is missing")))
        };
        let optional = |k: &str| root.get(k).map_or(serde_json::Value::Null, Value::to_json);
        let string = |k: &str| match get(k)? {
            Value::Str(s) => Ok(s.clone()),
            other => Err(content(format!("{k} is {other:?}, expected a string"))),
        };
        let head_dim = match get("head_dim")? {
            Value::Int(i) if *i > 0 => *i as usize,
            other => return Err(content(format!("head_dim is {other:?}"))),
        };
        let temperature = match get("temperature")? {
            Value::Float(f) => *f,
            Value::Int(i) => *i as f64,
            Value::Tensor(t) if t.shape.is_empty() => {
                let v = load_tensor(&mut zip, &prefix, t).map_err(content)?;
                f64::from(v[0])
            }
            other => return Err(content(format!("temperature is {other:?}"))),
        };
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(content(format!(
                "temperature {temperature} is not a positive number"
            )));
        }
        let meta = HeadMeta {
            base: string("base")?,
            base_revision: string("base_revision")?,
            lora: get("lora")?.to_json(),
            head_dim,
            option_isolation: get("option_isolation")?.to_json(),
            // Kev-4B's and Kev-0.8B's heads store these two; later heads (Kev 1.0's 9B, as a public port's
            // record lists its keys) may not, and kev uses neither: absent reads as null.
            special_embeddings: optional("special_embeddings"),
            weights_dtype: get("weights_dtype")?.to_json(),
            temperature,
            lora_placement: optional("lora_placement"),
        };
        let head = get("head")?;
        if !matches!(head, Value::Dict(_)) {
            return Err(content("head is not a state dict".into()));
        }
        let mut tensors: HashMap<&str, (Vec<usize>, Vec<f32>)> = HashMap::new();
        for key in ["q.weight", "q.bias", "k.weight", "k.bias"] {
            let t = match head.get(key) {
                Some(Value::Tensor(t)) => t,
                Some(other) => return Err(content(format!("head[{key:?}] is {other:?}"))),
                None => return Err(content(format!("head[{key:?}] is missing"))),
            };
            let v =
                load_tensor(&mut zip, &prefix, t).map_err(|m| content(format!("{key}: {m}")))?;
            tensors.insert(key, (t.shape.clone(), v));
        }
        let mut linear = |p: &str| -> Result<Linear, HeadError> {
            let (ws, w) = tensors
                .remove(format!("{p}.weight").as_str())
                .unwrap_or_default();
            let (bs, b) = tensors
                .remove(format!("{p}.bias").as_str())
                .unwrap_or_default();
            match (ws.as_slice(), bs.as_slice()) {
                (&[o, i], &[ob]) if o == head_dim && ob == head_dim && i > 0 => Ok(Linear {
                    out_features: o,
                    in_features: i,
                    weight: w,
                    bias: b,
                }),
                _ => Err(content(format!(
                    "{p}.weight {ws:?} / {p}.bias {bs:?} do not fit head_dim {head_dim}"
                ))),
            }
        };
        let q = linear("q")?;
        let k = linear("k")?;
        if q.in_features != k.in_features {
            return Err(content("q and k read different hidden sizes".into()));
        }
        Ok(KevHead { meta, q, k })
    }

    /// Write `head.safetensors` and `kev_head.json` into `dir`.
    pub fn write_prepared(
        &self,
        dir: &Path,
        delimiters: &Delimiters,
        provenance: &HeadProvenance,
    ) -> Result<(), HeadError> {
        let st_path = dir.join(HEAD_SAFETENSORS);
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let qw = bytes(&self.q.weight);
        let qb = bytes(&self.q.bias);
        let kw = bytes(&self.k.weight);
        let kb = bytes(&self.k.bias);
        fn view(
            data: &[u8],
            shape: Vec<usize>,
        ) -> Result<safetensors::tensor::TensorView<'_>, safetensors::SafeTensorError> {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, data)
        }
        let content = |message: String| -> HeadError {
            FileError::Format {
                path: st_path.clone(),
                message,
            }
            .into()
        };
        let (o, i) = (self.q.out_features, self.q.in_features);
        let views = vec![
            (
                "q.weight",
                view(&qw, vec![o, i]).map_err(|e| content(e.to_string()))?,
            ),
            (
                "q.bias",
                view(&qb, vec![o]).map_err(|e| content(e.to_string()))?,
            ),
            (
                "k.weight",
                view(&kw, vec![self.k.out_features, self.k.in_features])
                    .map_err(|e| content(e.to_string()))?,
            ),
            (
                "k.bias",
                view(&kb, vec![self.k.out_features]).map_err(|e| content(e.to_string()))?,
            ),
        ];
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        let data = safetensors::serialize(views, Some(meta)).map_err(|e| content(e.to_string()))?;
        std::fs::write(&st_path, data).map_err(|source| FileError::Io {
            path: st_path.clone(),
            source,
        })?;

        let json = HeadJson {
            format_version: HEAD_FORMAT_VERSION,
            weights: HEAD_SAFETENSORS.to_string(),
            hidden_size: self.hidden_size(),
            head_dim: self.meta.head_dim,
            scale: self.scale(),
            temperature: self.meta.temperature,
            delimiters: *delimiters,
            meta: self.meta.clone(),
            provenance: provenance.clone(),
        };
        let path = dir.join(HEAD_JSON);
        let mut text = serde_json::to_string_pretty(&json).map_err(|e| FileError::Format {
            path: path.clone(),
            message: e.to_string(),
        })?;
        text.push('\n');
        std::fs::write(&path, text).map_err(|source| FileError::Io { path, source }.into())
    }
}

/// A torch zip archive opened and its `data.pkl` unpickled.
struct TorchArchive {
    zip: zip::ZipArchive<std::fs::File>,
    /// What the archive's entries start with (`<name>/`), ending in a slash or empty.
    prefix: String,
    /// The unpickled object.
    root: Value,
}

/// Open a `torch.save` zip archive: find its `data.pkl`, refuse a big-endian archive, unpickle.
fn open_torch_archive(path: &Path) -> Result<TorchArchive, HeadError> {
    let file = std::fs::File::open(path).map_err(|source| FileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let archive_err = |message: String| -> HeadError {
        FileError::Format {
            path: path.to_path_buf(),
            message,
        }
        .into()
    };
    let mut zip = zip::ZipArchive::new(file).map_err(|e| archive_err(e.to_string()))?;
    let pkl_name = zip
        .file_names()
        .find(|n| n.ends_with("/data.pkl") || *n == "data.pkl")
        .map(str::to_string)
        .ok_or_else(|| archive_err("no data.pkl: not a torch zip archive".into()))?;
    let prefix = pkl_name.strip_suffix("data.pkl").unwrap_or("").to_string();
    if let Ok(mut e) = zip.by_name(&format!("{prefix}byteorder")) {
        let mut s = String::new();
        e.read_to_string(&mut s)
            .map_err(|e| archive_err(e.to_string()))?;
        if s.trim() != "little" {
            return Err(archive_err(format!("byteorder {s:?} is not supported")));
        }
    }
    let pkl = read_entry(&mut zip, &pkl_name).map_err(archive_err)?;
    let root = pickle::load(&pkl).map_err(|source| HeadError::Pickle {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(TorchArchive { zip, prefix, root })
}

fn read_entry(zip: &mut zip::ZipArchive<std::fs::File>, name: &str) -> Result<Vec<u8>, String> {
    let mut e = zip.by_name(name).map_err(|e| format!("{name}: {e}"))?;
    let mut buf = Vec::with_capacity(usize::try_from(e.size()).unwrap_or(0));
    e.read_to_end(&mut buf)
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(buf)
}

/// Materialise a stored tensor as contiguous fp32 (exact widening from BF16/F16; F64 is refused
/// because narrowing would change the head).
fn load_tensor(
    zip: &mut zip::ZipArchive<std::fs::File>,
    prefix: &str,
    t: &TensorRef,
) -> Result<Vec<f32>, String> {
    let raw = read_entry(zip, &format!("{prefix}data/{}", t.key))?;
    let es = t.dtype.size();
    let elements = raw.len() / es;
    // A crafted pickle must not make us overflow or allocate without bound: a head is a few MB.
    let numel = t
        .shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= 1 << 28)
        .ok_or_else(|| format!("tensor shape {:?} is too large", t.shape))?;
    let read = |i: usize| -> Result<f32, String> {
        let b = raw
            .get(i * es..(i + 1) * es)
            .ok_or_else(|| format!("storage {} too short", t.key))?;
        Ok(match t.dtype {
            StorageDtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            StorageDtype::BF16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            StorageDtype::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            other => return Err(format!("dtype {other:?} is not a float32-exact type")),
        })
    };
    let mut out = Vec::with_capacity(numel);
    let mut idx = vec![0usize; t.shape.len()];
    for _ in 0..numel {
        let off = idx.iter().zip(&t.stride).fold(t.offset, |acc, (i, s)| {
            acc.saturating_add(i.saturating_mul(*s))
        });
        if off >= elements {
            return Err(format!("storage {} too short", t.key));
        }
        out.push(read(off)?);
        // odometer over the shape, last dimension fastest
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < t.shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(out)
}

/// The token ids that delimit a Kev row (kev-contract §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delimiters {
    /// `<|fim_prefix|>`: starts the state.
    pub state: u32,
    /// `<|fim_middle|>`: starts a question.
    pub question: u32,
    /// `<|box_start|>`: opens an option.
    pub option_open: u32,
    /// `<|box_end|>`: closes an option (readout position).
    pub option_close: u32,
    /// `<|fim_suffix|>`: the decide position.
    pub decide: u32,
    /// `<|endoftext|>`: padding / end of text.
    pub pad: u32,
}

impl Delimiters {
    /// The token strings, in field order.
    pub const TOKENS: [&'static str; 6] = [
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|fim_suffix|>",
        "<|endoftext|>",
    ];

    /// Look the delimiter tokens up in a `tokenizer.json`'s `added_tokens`.
    pub fn from_tokenizer_json(path: &Path) -> Result<Self, HeadError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let content = |message: String| -> HeadError {
            FileError::Format {
                path: path.to_path_buf(),
                message,
            }
            .into()
        };
        // Only the added-token list is read; serde skips the 10 MB vocabulary without building it.
        #[derive(Deserialize)]
        struct Added {
            id: u64,
            content: String,
        }
        #[derive(Deserialize)]
        struct Tokenizer {
            added_tokens: Vec<Added>,
        }
        let tok: Tokenizer = serde_json::from_str(&text).map_err(|e| content(e.to_string()))?;
        let mut ids = [0u32; 6];
        for (slot, name) in ids.iter_mut().zip(Self::TOKENS) {
            let id = tok
                .added_tokens
                .iter()
                .find(|t| t.content == name)
                .map(|t| t.id)
                .ok_or_else(|| content(format!("added token {name} not found")))?;
            *slot = u32::try_from(id).map_err(|_| content(format!("{name} id {id} too large")))?;
        }
        Ok(Delimiters {
            state: ids[0],
            question: ids[1],
            option_open: ids[2],
            option_close: ids[3],
            decide: ids[4],
            pad: ids[5],
        })
    }
}

/// Where the head came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeadProvenance {
    /// Repository (`owner/name`) or local directory of the Kev release.
    pub source: String,
    /// Commit, when known.
    pub revision: Option<String>,
    /// sha256 of the `head.pt` the weights were read from.
    pub head_pt_sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct HeadJson {
    format_version: u32,
    weights: String,
    hidden_size: usize,
    head_dim: usize,
    scale: f64,
    temperature: f64,
    delimiters: Delimiters,
    meta: HeadMeta,
    provenance: HeadProvenance,
}

/// A prepared head as the engine loads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedHead {
    /// Metadata and weights.
    pub head: KevHead,
    /// `head_dim ** -0.5`.
    pub scale: f64,
    /// Row delimiter ids.
    pub delimiters: Delimiters,
    /// Where it came from.
    pub provenance: HeadProvenance,
}

impl PreparedHead {
    /// Read `kev_head.json` + `head.safetensors` from a prepared directory.
    pub fn read(dir: &Path) -> Result<Self, HeadError> {
        let path = dir.join(HEAD_JSON);
        let text = std::fs::read_to_string(&path).map_err(|source| FileError::Io {
            path: path.clone(),
            source,
        })?;
        let content = |p: &Path, message: String| -> HeadError {
            FileError::Format {
                path: p.to_path_buf(),
                message,
            }
            .into()
        };
        let json: HeadJson =
            serde_json::from_str(&text).map_err(|e| content(&path, e.to_string()))?;
        if json.format_version != HEAD_FORMAT_VERSION {
            return Err(content(
                &path,
                format!("format_version {} is not supported", json.format_version),
            ));
        }
        let st_path = dir.join(&json.weights);
        let data = std::fs::read(&st_path).map_err(|source| FileError::Io {
            path: st_path.clone(),
            source,
        })?;
        let st = safetensors::SafeTensors::deserialize(&data)
            .map_err(|e| content(&st_path, e.to_string()))?;
        let tensor = |name: &str, shape: &[usize]| -> Result<Vec<f32>, HeadError> {
            let t = st
                .tensor(name)
                .map_err(|e| content(&st_path, format!("{name}: {e}")))?;
            if t.dtype() != safetensors::Dtype::F32 || t.shape() != shape {
                return Err(content(
                    &st_path,
                    format!(
                        "{name}: {:?} {:?}, expected F32 {shape:?}",
                        t.dtype(),
                        t.shape()
                    ),
                ));
            }
            Ok(t.data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        let (d, h) = (json.head_dim, json.hidden_size);
        let q = Linear {
            out_features: d,
            in_features: h,
            weight: tensor("q.weight", &[d, h])?,
            bias: tensor("q.bias", &[d])?,
        };
        let k = Linear {
            out_features: d,
            in_features: h,
            weight: tensor("k.weight", &[d, h])?,
            bias: tensor("k.bias", &[d])?,
        };
        if json.meta.temperature.to_bits() != json.temperature.to_bits() || json.meta.head_dim != d
        {
            return Err(content(
                &path,
                "temperature / head_dim disagree with the recorded head.pt metadata".into(),
            ));
        }
        Ok(PreparedHead {
            head: KevHead {
                meta: json.meta,
                q,
                k,
            },
            scale: json.scale,
            delimiters: json.delimiters,
            provenance: json.provenance,
        })
    }
}
