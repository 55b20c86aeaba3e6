//! A set of safetensors files read as one store of named tensors.
//!
//! A Hub checkpoint is either one `model.safetensors` or several shards listed by
//! `model.safetensors.index.json` (`{"weight_map": {name: file}}`). Files are memory-mapped, so opening an
//! 8 GB checkpoint costs page-table entries, not RAM; tensors are borrowed views into the maps.
//!
//! Tensor names keep the prefix they are stored under. The Qwen3.5 text decoder appears under
//! `model.language_model.` (published composite checkpoints), `model.` (`Qwen3_5ForCausalLM`) or no prefix
//! (`Qwen3_5TextModel`); [`TensorStore::text_prefix`] finds which one a store uses, once, at load.

use crate::FileError;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::SafeTensors;

/// Errors while reading safetensors stores.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// A file could not be read or written, or holds what it must not.
    #[error(transparent)]
    File(#[from] crate::FileError),
    /// The directory holds no safetensors checkpoint.
    #[error("{0}: no model.safetensors.index.json, model.safetensors or *.safetensors found")]
    NoCheckpoint(PathBuf),
    /// A tensor is not in the store.
    #[error("tensor {0} is missing")]
    Missing(String),
    /// The store holds no Qwen3.5 text decoder under any known prefix.
    #[error("no embed_tokens.weight under any known prefix (model.language_model., model., none)")]
    NoTextModel,
}

/// Element type of a stored tensor (the subset the engine and the merge understand, plus a catch-all).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// bfloat16.
    BF16,
    /// IEEE half.
    F16,
    /// IEEE single.
    F32,
    /// Anything else, by its safetensors name.
    Other(&'static str),
}

impl Dtype {
    fn from_st(d: safetensors::Dtype) -> Self {
        match d {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::F32 => Dtype::F32,
            other => Dtype::Other(dtype_name(other)),
        }
    }

    /// The safetensors spelling (`BF16`, `F32`, …).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BF16 => "BF16",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::Other(n) => n,
        }
    }

    /// Bytes per element, where known.
    pub fn size(self) -> Option<usize> {
        match self {
            Dtype::BF16 | Dtype::F16 => Some(2),
            Dtype::F32 => Some(4),
            Dtype::Other(_) => None,
        }
    }
}

fn dtype_name(d: safetensors::Dtype) -> &'static str {
    use safetensors::Dtype as D;
    match d {
        D::BOOL => "BOOL",
        D::U8 => "U8",
        D::I8 => "I8",
        D::I16 => "I16",
        D::U16 => "U16",
        D::I32 => "I32",
        D::U32 => "U32",
        D::I64 => "I64",
        D::U64 => "U64",
        D::F64 => "F64",
        _ => "OTHER",
    }
}

/// A borrowed tensor: dtype, shape and its little-endian bytes inside a mapped file.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Full stored name.
    pub name: &'a str,
    /// Element type.
    pub dtype: Dtype,
    /// Shape, outermost first.
    pub shape: &'a [usize],
    /// Raw little-endian bytes.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

struct Entry {
    file: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range inside the mapped file.
    start: usize,
    end: usize,
}

/// One checkpoint: every tensor of every shard, by stored name.
pub struct TensorStore {
    dir: PathBuf,
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: BTreeMap<String, Entry>,
}

/// One tensor's bytes, kept mapped after its store is gone (it shares the file's mapping). What a model
/// keeps of a large table it reads a few rows of at a time: only the pages it reads become resident,
/// and those are clean file pages the kernel may take back under memory pressure.
#[derive(Clone)]
pub struct MappedTensor {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl MappedTensor {
    /// The tensor's raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

impl std::fmt::Debug for MappedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedTensor({} bytes)", self.end - self.start)
    }
}

impl TensorStore {
    /// Open the checkpoint in `dir`: the index if present, else `model.safetensors`, else every
    /// `*.safetensors` in the directory (sorted by name).
    pub fn open(dir: &Path) -> Result<Self, ShardError> {
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index.is_file() {
            let text = std::fs::read_to_string(&index).map_err(|source| FileError::Io {
                path: index.clone(),
                source,
            })?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| FileError::Format {
                    path: index.clone(),
                    message: e.to_string(),
                })?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| FileError::Format {
                    path: index.clone(),
                    message: "no weight_map object".into(),
                })?;
            let mut names: Vec<String> = Vec::new();
            for v in map.values() {
                let f = v.as_str().ok_or_else(|| FileError::Format {
                    path: index.clone(),
                    message: "weight_map values must be file names".into(),
                })?;
                if !names.iter().any(|n| n == f) {
                    names.push(f.to_string());
                }
            }
            names.sort();
            names.into_iter().map(|f| dir.join(f)).collect()
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let rd = std::fs::read_dir(dir).map_err(|source| FileError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
            let mut v: Vec<PathBuf> = rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if files.is_empty() {
            return Err(ShardError::NoCheckpoint(dir.to_path_buf()));
        }
        Self::open_files(dir, &files)
    }

    /// Open an explicit list of safetensors files as one store.
    pub fn open_files(dir: &Path, paths: &[PathBuf]) -> Result<Self, ShardError> {
        let mut files = Vec::with_capacity(paths.len());
        let mut tensors = BTreeMap::new();
        for (fi, path) in paths.iter().enumerate() {
            let file = File::open(path).map_err(|source| FileError::Io {
                path: path.clone(),
                source,
            })?;
            // SAFETY: the checkpoint is treated as immutable while the store lives; a concurrent writer
            // would be a user error that we cannot guard against with any file API.
            let map = unsafe { Mmap::map(&file) }.map_err(|source| FileError::Io {
                path: path.clone(),
                source,
            })?;
            let (header_len, meta) =
                SafeTensors::read_metadata(&map).map_err(|e| FileError::Format {
                    path: path.clone(),
                    message: e.to_string(),
                })?;
            let base = 8 + header_len;
            for (name, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                tensors.insert(
                    name.clone(),
                    Entry {
                        file: fi,
                        dtype: Dtype::from_st(info.dtype),
                        shape: info.shape.clone(),
                        start: base + s,
                        end: base + e,
                    },
                );
            }
            files.push((path.clone(), Arc::new(map)));
        }
        Ok(TensorStore {
            dir: dir.to_path_buf(),
            files,
            tensors,
        })
    }

    /// The directory the store was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The files of the store, in shard order.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// Every stored tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Names of the tensors stored in shard `file` (index into [`TensorStore::files`]), sorted.
    pub fn names_in_file(&self, file: usize) -> impl Iterator<Item = &str> {
        self.tensors
            .iter()
            .filter(move |(_, e)| e.file == file)
            .map(|(n, _)| n.as_str())
    }

    /// Whether a tensor of that exact name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// A tensor by its exact stored name.
    pub fn get(&self, name: &str) -> Result<TensorView<'_>, ShardError> {
        let (key, e) = self
            .tensors
            .get_key_value(name)
            .ok_or_else(|| ShardError::Missing(name.to_string()))?;
        Ok(TensorView {
            name: key,
            dtype: e.dtype,
            shape: &e.shape,
            data: &self.files[e.file].1[e.start..e.end],
        })
    }

    /// A tensor's bytes as a [`MappedTensor`], which outlives the store.
    pub fn mapped(&self, name: &str) -> Result<MappedTensor, ShardError> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| ShardError::Missing(name.to_string()))?;
        Ok(MappedTensor {
            map: Arc::clone(&self.files[e.file].1),
            start: e.start,
            end: e.end,
        })
    }

    /// Drop the mapped pages of one tensor from this process's resident set (`MADV_DONTNEED` on its byte
    /// range, widened to whole pages). The file stays in the page cache and a later read maps it back in,
    /// so this changes no value; it lets a loader that copies tensors into its own layout keep its peak
    /// RSS near the size of the copy instead of copy + mapped file. Unknown names and unsupported
    /// platforms are a no-op.
    pub fn release(&self, name: &str) {
        #[cfg(unix)]
        if let Some(e) = self.tensors.get(name) {
            let map = &self.files[e.file].1;
            // SAFETY: the map is read-only and file-backed, so after MADV_DONTNEED the kernel re-reads
            // the same file bytes on the next access; no borrowed view can observe a change.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    e.start,
                    e.end - e.start,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = name;
    }

    /// The prefix under which the Qwen3.5 text decoder is stored: `model.language_model.`, `model.` or `""`.
    pub fn text_prefix(&self) -> Result<&'static str, ShardError> {
        ["model.language_model.", "model.", ""]
            .into_iter()
            .find(|p| self.contains(&format!("{p}embed_tokens.weight")))
            .ok_or(ShardError::NoTextModel)
    }
}
