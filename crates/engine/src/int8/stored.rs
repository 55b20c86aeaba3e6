//! The stored int8 form (`int8.safetensors`, written by `kev prepare --int8`): writing a model's int8
//! projections, and reading them back as a model loads.
//!
//! Layout: one safetensors file; per (fused) projection `P` of [`Backbone::projection_names`]
//! (`layers.{i}.linear_attn.in_proj` = `[in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]`,
//! `layers.{i}.self_attn.qkv_proj` = `[q_proj; k_proj; v_proj]`, `layers.{i}.mlp.gate_up_proj` =
//! `[gate_proj; up_proj]`, and the unfused `out_proj`, `o_proj`, `down_proj`):
//! - `P.qweight`: I8 `[n, k]` row-major, `round(W[j,k]·f[k] / s_w[j])` in `[−127, 127]` (`[−63, 63]`
//!   for the rule's 7-bit weights; a projection whose values all fit there runs AVX2's narrow kernel);
//! - `P.scale`: F32 `[n]`, `s_w`;
//! - `P.smooth`: F32 `[k]`, the SmoothQuant factors `f` (absent when the projection is not smoothed).
//!
//! The metadata holds `format` = [`INT8_FORMAT`], `weight_bits` (`7` when every stored projection is
//! narrow, else `8`; informative) and whatever the writer records (scheme, `alpha`, calibration source). Everything else of the model (embedding, norms, GDN parameters, head) stays in the
//! merged shards beside it.

use std::cell::Cell;
use std::collections::HashMap;
use std::path::Path;

use kev_release::shards::TensorStore;

use crate::error::EngineError;
use crate::int8::plan::last_rows;
use crate::kernels::Arm;
use crate::kernels::int8::PackedInt8;
use crate::model::build::{At, WeightRows};
use crate::model::linear::Weight;
use crate::model::{Backbone, ProjectionKind};

/// The file name of the stored int8 form in a prepared directory.
pub const INT8_FILE: &str = "int8.safetensors";
/// The `format` metadata value this engine reads and writes.
pub const INT8_FORMAT: &str = "kev-int8-w8a8/1";

/// Metadata: the projections the int8 arm computes in bf16 (comma-separated names; no tensors stored).
const META_ISLANDS: &str = "islands";
/// Metadata: `fp32` when every GDN `in_proj`'s gate rows are computed in fp32 from the merged weights.
const META_GATES: &str = "gdn_gates";
/// Metadata: `7` or `8`, the widest stored weight (informative: the loader reads the values).
const META_WEIGHT_BITS: &str = "weight_bits";

/// The `__metadata__` of a safetensors file (its header only is read).
fn read_metadata(path: &Path) -> Result<HashMap<String, String>, String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|e| e.to_string())?;
    let n = u64::from_le_bytes(len);
    if n > 100 << 20 {
        return Err(format!("header of {n} bytes"));
    }
    let mut head = vec![0u8; n as usize];
    f.read_exact(&mut head).map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(&head).map_err(|e| e.to_string())?;
    Ok(v.get("__metadata__")
        .and_then(|m| m.as_object())
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default())
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Backbone {
    /// Write every projection's int8 form (an int8 model's) to `path`, with `meta` added to the file's
    /// metadata.
    pub fn write_int8(&self, path: &Path, meta: &[(&str, String)]) -> Result<(), EngineError> {
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let (mut islands, mut gates, mut narrow) = (Vec::new(), false, true);
        let gate_rows = 2 * self.cfg.linear_num_value_heads;
        for (li, kind, l) in self.projections() {
            let name = kind.name(li);
            let (q, fp32_rows) = match &l.weight {
                Weight::Island { arm: Arm::Bf16, .. } => {
                    // Computed from the prepared directory's merged bf16 weights: only its name is stored.
                    islands.push(name);
                    continue;
                }
                Weight::Int8 { q, fp32_rows } => (q, fp32_rows),
                _ => {
                    return Err(EngineError::Int8(format!(
                        "{name}: no int8 form to write (an int8 model's projections are; bf16 islands \
                         are not stored)"
                    )));
                }
            };
            if let Some(t) = fp32_rows {
                if t.n() != gate_rows {
                    return Err(EngineError::Int8(format!(
                        "{name}: only the GDN gate rows can be stored as fp32 rows"
                    )));
                }
                gates = true;
            }
            narrow &= q.narrow();
            let bytes: Vec<u8> = q.q_rows().into_iter().map(|x| x as u8).collect();
            tensors.push((
                format!("{name}.qweight"),
                safetensors::Dtype::I8,
                vec![q.n(), q.k()],
                bytes,
            ));
            tensors.push((
                format!("{name}.scale"),
                safetensors::Dtype::F32,
                vec![q.n()],
                f32_bytes(q.scales()),
            ));
            if let Some(f) = q.smooth_factors() {
                tensors.push((
                    format!("{name}.smooth"),
                    safetensors::Dtype::F32,
                    vec![q.k()],
                    f32_bytes(f),
                ));
            }
        }
        let mut views = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, data) in &tensors {
            let v = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data)
                .map_err(|e| EngineError::Int8(format!("{name}: {e}")))?;
            views.push((name.clone(), v));
        }
        let mut info: HashMap<String, String> = meta
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        info.insert("format".into(), INT8_FORMAT.into());
        if !islands.is_empty() {
            info.insert(META_ISLANDS.into(), islands.join(","));
        }
        if gates {
            info.insert(META_GATES.into(), "fp32".into());
        }
        // For readers of the file: the loader decides each projection's kernel from its values.
        info.insert(
            META_WEIGHT_BITS.into(),
            if narrow { "7" } else { "8" }.into(),
        );
        safetensors::tensor::serialize_to_file(views, Some(info), path)
            .map_err(|e| EngineError::Int8(format!("{}: {e}", path.display())))
    }
}

/// A stored int8 form opened to be read as the model loads ([`Backbone::load_quantised`] with
/// [`crate::Int8Source::Stored`]): each projection takes its stored int8 weights (the rule's BF16 islands
/// and fp32 GDN gate rows as the metadata says) with no float copy made ([`StoredInt8::build`]), and each
/// tensor's mapped pages are given back once read, so the load peaks near the int8 model's size, not the
/// float model's.
pub(crate) struct StoredInt8 {
    path: std::path::PathBuf,
    store: TensorStore,
    islands: Vec<String>,
    gates: bool,
    /// Tensors read, projections installed, and those among them with 8-bit weights.
    used: Cell<usize>,
    installed: Cell<usize>,
    wide: Cell<usize>,
}

impl StoredInt8 {
    pub(crate) fn open(path: &Path) -> Result<Self, EngineError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let store = TensorStore::open_files(dir, &[path.to_path_buf()])?;
        let bad = |what: String| EngineError::Int8(format!("{}: {what}", path.display()));
        let meta = read_metadata(path).map_err(bad)?;
        let islands = meta
            .get(META_ISLANDS)
            .map(|s| s.split(',').map(String::from).collect())
            .unwrap_or_default();
        let gates = match meta.get(META_GATES).map(String::as_str) {
            None => false,
            Some("fp32") => true,
            Some(other) => return Err(bad(format!("{META_GATES} = {other:?} (fp32 or absent)"))),
        };
        Ok(StoredInt8 {
            path: path.to_path_buf(),
            store,
            islands,
            gates,
            used: Cell::new(0),
            installed: Cell::new(0),
            wide: Cell::new(0),
        })
    }

    fn bad(&self, what: String) -> EngineError {
        EngineError::Int8(format!("{}: {what}", self.path.display()))
    }

    /// The projection at `at`, from the file: an island's float panels from its `rows` (the prepared
    /// directory's merged weights), else its stored int8 form packed straight from the mapping (with the GDN
    /// gate rows in fp32 from `rows` where the metadata says so). No float copy of an int8 projection is
    /// made.
    pub(crate) fn build(
        &self,
        at: At,
        rows: &dyn WeightRows,
        gate_rows: usize,
    ) -> Result<Weight, EngineError> {
        let name = at.name();
        if self.islands.contains(&name) {
            return Ok(Weight::Island {
                w: rows.pack(),
                arm: Arm::Bf16,
            });
        }
        let fp32_rows = (self.gates && at.kind == ProjectionKind::GdnIn)
            .then(|| last_rows(rows, gate_rows, &name))
            .transpose()?;
        let (n, k) = (rows.n(), rows.k());
        let scale = self.read(&name, "scale", &[n], "F32", f32_values)?;
        let smooth = if self.store.contains(&format!("{name}.smooth")) {
            Some(self.read(&name, "smooth", &[k], "F32", f32_values)?)
        } else {
            None
        };
        // Packed straight from the mapping (no copy of the weights first).
        let q = self
            .read(&name, "qweight", &[n, k], "I8", |b| {
                PackedInt8::from_quantised(n, k, bytemuck::cast_slice(b), &scale, smooth.as_deref())
            })?
            .map_err(|e| self.bad(format!("{name}: {e}")))?;
        self.installed.set(self.installed.get() + 1);
        self.wide.set(self.wide.get() + usize::from(!q.narrow()));
        Ok(Weight::Int8 { q, fp32_rows })
    }

    /// Tensor `name.suffix`, checked, converted by `convert` straight from the mapping (whose pages are
    /// then given back).
    fn read<T>(
        &self,
        name: &str,
        suffix: &str,
        shape: &[usize],
        dtype: &str,
        convert: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, EngineError> {
        let full = format!("{name}.{suffix}");
        let v = self
            .store
            .get(&full)
            .map_err(|_| self.bad(format!("tensor {full} is missing")))?;
        if v.dtype.name() != dtype || v.shape != shape {
            return Err(self.bad(format!(
                "tensor {full} is {} {:?}, expected {dtype} {shape:?}",
                v.dtype.name(),
                v.shape
            )));
        }
        let data = convert(v.data);
        self.store.release(&full);
        self.used.set(self.used.get() + 1);
        Ok(data)
    }

    /// After every layer: the file held nothing else (no unknown island, no tensor of another model), and
    /// a word where its 8-bit weights keep `model`'s kernels off their faster 7-bit kernel.
    pub(crate) fn finish(&self, model: &Backbone) -> Result<(), EngineError> {
        let names = model.projection_names();
        if let Some(x) = self.islands.iter().find(|x| !names.contains(x)) {
            return Err(self.bad(format!("island {x} is not a projection of this model")));
        }
        if self.store.names().count() != self.used.get() {
            let known: std::collections::HashSet<String> = names
                .iter()
                .flat_map(|n| ["qweight", "scale", "smooth"].map(|s| format!("{n}.{s}")))
                .collect();
            let extra = self
                .store
                .names()
                .find(|n| !known.contains(*n))
                .unwrap_or("?");
            return Err(self.bad(format!("tensor {extra} is not a projection of this model")));
        }
        let (wide, stored) = (self.wide.get(), self.installed.get());
        if wide > 0 && crate::kernels::int8::narrow_is_faster(model.kernels()) {
            tracing::warn!(
                "{}: {wide} of {stored} int8 projections have 8-bit weights (a form stored before the \
                 7-bit rule); {} runs them on its slower 8-bit kernel: `kev prepare --int8` again \
                 stores the 7-bit form",
                self.path.display(),
                model.kernels().isa()
            );
        }
        Ok(())
    }
}

fn f32_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
