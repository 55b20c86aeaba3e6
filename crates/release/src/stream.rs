//! Streaming safetensors I/O for exports: read one tensor at a time with positioned reads, write a
//! file tensor by tensor while hashing it. Memory stays at one tensor (plus a copy buffer), however
//! large the shard, and nothing is memory-mapped, so page-cache pages never count against the
//! process.
//!
//! The writer lays a file out exactly as the `safetensors` library (and so Python's `save_file`)
//! does: tensors sorted by descending dtype, then name; the header JSON from the library's own
//! `Metadata` serializer; padded with spaces to a multiple of 8.

use crate::FileError;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Metadata, TensorInfo};

use crate::manifest::HashingWriter;
use crate::shards::Dtype;

/// What a streamed write or read of a safetensors file can hit: its file's error.
pub type StreamError = crate::FileError;

/// Name, dtype, shape and byte range (relative to the data section) of a stored tensor.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    /// Stored name.
    pub name: String,
    /// safetensors dtype.
    pub st_dtype: safetensors::Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Start of the bytes, from the beginning of the file.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
}

impl StoredTensor {
    /// The dtype as the rest of this crate names it.
    pub fn dtype(&self) -> Dtype {
        match self.st_dtype {
            safetensors::Dtype::BF16 => Dtype::BF16,
            safetensors::Dtype::F16 => Dtype::F16,
            safetensors::Dtype::F32 => Dtype::F32,
            _ => Dtype::Other("OTHER"),
        }
    }
}

/// A safetensors file opened for positioned reads.
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    metadata: Option<HashMap<String, String>>,
    tensors: Vec<StoredTensor>,
}

impl SafetensorsFile {
    /// Open a file and parse its header (the data section is not read).
    pub fn open(path: &Path) -> Result<Self, StreamError> {
        let io = |source| FileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let format = |message: String| FileError::Format {
            path: path.to_path_buf(),
            message,
        };
        let mut file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n).map_err(io)?;
        let n = u64::from_le_bytes(n);
        if n > 100_000_000 || 8 + n > file_len {
            return Err(format(format!("header length {n} does not fit the file")));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header).map_err(io)?;
        let meta: Metadata = serde_json::from_slice(&header).map_err(|e| format(e.to_string()))?;
        let base = 8 + n;
        let mut tensors = Vec::new();
        for name in meta.offset_keys() {
            let Some(info) = meta.info(&name) else {
                continue;
            };
            let (s, e) = info.data_offsets;
            tensors.push(StoredTensor {
                name,
                st_dtype: info.dtype,
                shape: info.shape.clone(),
                start: base + s as u64,
                len: (e - s) as u64,
            });
        }
        let data_len = meta.data_len() as u64;
        if base + data_len != file_len {
            return Err(format(format!(
                "data section is {} bytes, header describes {data_len}",
                file_len - base
            )));
        }
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            file,
            metadata: meta.metadata().clone(),
            tensors,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `__metadata__` map, if any.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.as_ref()
    }

    /// Tensors in file order.
    pub fn tensors(&self) -> &[StoredTensor] {
        &self.tensors
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&StoredTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Read a tensor's bytes.
    pub fn read(&self, t: &StoredTensor) -> Result<Vec<u8>, StreamError> {
        let mut buf = vec![0u8; t.len as usize];
        self.file
            .read_exact_at(&mut buf, t.start)
            .map_err(|source| FileError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(buf)
    }

    /// Copy a tensor's bytes into a writer in 8 MiB pieces.
    pub fn copy_to(&self, t: &StoredTensor, out: &mut impl Write) -> Result<(), StreamError> {
        let io = |source| FileError::Io {
            path: self.path.clone(),
            source,
        };
        let mut buf = vec![0u8; (8usize << 20).min(t.len as usize)];
        let mut done = 0u64;
        while done < t.len {
            let n = ((t.len - done) as usize).min(buf.len());
            self.file
                .read_exact_at(&mut buf[..n], t.start + done)
                .map_err(io)?;
            out.write_all(&buf[..n]).map_err(io)?;
            done += n as u64;
        }
        Ok(())
    }
}

/// What one tensor of a file to be written will be.
#[derive(Debug, Clone)]
pub struct PlannedTensor {
    /// Name.
    pub name: String,
    /// dtype.
    pub dtype: safetensors::Dtype,
    /// Shape.
    pub shape: Vec<usize>,
}

impl PlannedTensor {
    fn byte_len(&self) -> Result<usize, String> {
        let numel = self
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or("shape overflows")?;
        let bits = numel
            .checked_mul(self.dtype.bitsize())
            .ok_or("size overflows")?;
        if !bits.is_multiple_of(8) {
            return Err("tensor is not a whole number of bytes".into());
        }
        Ok(bits / 8)
    }
}

/// Writes one safetensors file tensor by tensor, in the library's canonical order, hashing it.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: HashingWriter<BufWriter<File>>,
    order: Vec<(String, usize)>,
    next: usize,
}

/// A finished file.
#[derive(Debug, Clone)]
pub struct WrittenFile {
    /// Path.
    pub path: PathBuf,
    /// Length in bytes.
    pub size: u64,
    /// sha256, lower-case hex.
    pub sha256: String,
}

impl SafetensorsWriter {
    /// Create `path` and write its header for `tensors` (any order; the file order is canonical).
    pub fn create(
        path: &Path,
        tensors: Vec<PlannedTensor>,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<Self, StreamError> {
        let format = |message: String| FileError::Format {
            path: path.to_path_buf(),
            message,
        };
        let mut tensors = tensors;
        tensors.sort_by(|a, b| b.dtype.cmp(&a.dtype).then(a.name.cmp(&b.name)));
        let mut infos = Vec::with_capacity(tensors.len());
        let mut order = Vec::with_capacity(tensors.len());
        let mut offset = 0usize;
        for t in &tensors {
            let n = t
                .byte_len()
                .map_err(|m| format(format!("{}: {m}", t.name)))?;
            infos.push((
                t.name.clone(),
                TensorInfo {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    data_offsets: (offset, offset + n),
                },
            ));
            order.push((t.name.clone(), n));
            offset += n;
        }
        let meta = Metadata::new(metadata, infos).map_err(|e| format(e.to_string()))?;
        let mut header = serde_json::to_string(&meta)
            .map_err(|e| format(e.to_string()))?
            .into_bytes();
        header.resize(header.len().next_multiple_of(8), b' ');
        let file = File::create(path).map_err(|source| FileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut out = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
        let io = |source| FileError::Io {
            path: path.to_path_buf(),
            source,
        };
        out.write_all(&(header.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&header).map_err(io)?;
        Ok(SafetensorsWriter {
            path: path.to_path_buf(),
            out,
            order,
            next: 0,
        })
    }

    /// Names in the order their bytes must be written.
    pub fn order(&self) -> impl Iterator<Item = &str> {
        self.order.iter().map(|(n, _)| n.as_str())
    }

    /// Write the next tensor's bytes; `name` must be the next one in [`SafetensorsWriter::order`].
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<(), StreamError> {
        self.write_with(name, |w| w.write_all(bytes).map_err(|e| e.to_string()))
    }

    /// Write the next tensor through a callback that must write exactly its byte length.
    pub fn write_with(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut dyn Write) -> Result<(), String>,
    ) -> Result<(), StreamError> {
        let format = |message: String| FileError::Format {
            path: self.path.clone(),
            message,
        };
        let Some((want, len)) = self.order.get(self.next).cloned() else {
            return Err(format(format!("{name}: all tensors are already written")));
        };
        if want != name {
            return Err(format(format!("{name} written where {want} belongs")));
        }
        let before = self.out.written();
        f(&mut self.out).map_err(|m| format(format!("{name}: {m}")))?;
        let wrote = self.out.written() - before;
        if wrote != len as u64 {
            return Err(format(format!(
                "{name}: wrote {wrote} bytes, planned {len}"
            )));
        }
        self.next += 1;
        Ok(())
    }

    /// Flush, sync and return the file's size and sha256; fails if a tensor is missing.
    pub fn finish(self) -> Result<WrittenFile, StreamError> {
        if self.next != self.order.len() {
            return Err(FileError::Format {
                path: self.path.clone(),
                message: format!("{} of {} tensors written", self.next, self.order.len()),
            });
        }
        let (buf, size, sha256) = self.out.finish();
        let io = |source| FileError::Io {
            path: self.path.clone(),
            source,
        };
        let file = buf.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok(WrittenFile {
            path: self.path,
            size,
            sha256,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_matches_the_library_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let a: Vec<u8> = (0..24u8).collect(); // F32 [2,3]
        let b: Vec<u8> = (100..108u8).collect(); // BF16 [4]
        let c: Vec<u8> = (7..9u8).collect(); // BF16 [1]
        let meta: HashMap<String, String> = [("format".into(), "pt".into())].into();
        let lib = safetensors::serialize(
            vec![
                (
                    "z.b",
                    safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4], &b)
                        .unwrap(),
                ),
                (
                    "a.c",
                    safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![1], &c)
                        .unwrap(),
                ),
                (
                    "m.a",
                    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &a)
                        .unwrap(),
                ),
            ],
            Some(meta.clone()),
        )
        .unwrap();
        let plan = || {
            vec![
                PlannedTensor {
                    name: "z.b".into(),
                    dtype: safetensors::Dtype::BF16,
                    shape: vec![4],
                },
                PlannedTensor {
                    name: "m.a".into(),
                    dtype: safetensors::Dtype::F32,
                    shape: vec![2, 3],
                },
                PlannedTensor {
                    name: "a.c".into(),
                    dtype: safetensors::Dtype::BF16,
                    shape: vec![1],
                },
            ]
        };
        let bad = dir.path().join("bad.safetensors");
        let mut w = SafetensorsWriter::create(&bad, plan(), Some(meta.clone())).unwrap();
        assert_eq!(w.order().collect::<Vec<_>>(), ["m.a", "a.c", "z.b"]);
        assert!(w.write_tensor("a.c", &c).is_err(), "out of order must fail");
        w.write_tensor("m.a", &a).unwrap();
        w.write_tensor("a.c", &c).unwrap();
        assert!(
            w.write_tensor("z.b", &b[..6]).is_err(),
            "short write must fail"
        );
        assert!(w.finish().is_err(), "an unfinished file must fail");

        let path = dir.path().join("x.safetensors");
        let mut w = SafetensorsWriter::create(&path, plan(), Some(meta)).unwrap();
        w.write_tensor("m.a", &a).unwrap();
        w.write_tensor("a.c", &c).unwrap();
        w.write_tensor("z.b", &b).unwrap();
        let w = w.finish().unwrap();
        let written = std::fs::read(&path).unwrap();
        assert_eq!(written, lib);
        assert_eq!(w.size, lib.len() as u64);
        assert_eq!(w.sha256, crate::manifest::sha256_hex(&lib));

        let r = SafetensorsFile::open(&path).unwrap();
        let names: Vec<&str> = r.tensors().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["m.a", "a.c", "z.b"]);
        let t = r.tensor("z.b").unwrap();
        assert_eq!(r.read(t).unwrap(), b);
        let mut copied = Vec::new();
        r.copy_to(r.tensor("m.a").unwrap(), &mut copied).unwrap();
        assert_eq!(copied, a);
    }
}
