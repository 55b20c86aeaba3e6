//! The stored int8 form (`int8.safetensors`, written by `kev prepare --int8`), and dropping the float
//! copies of the projections once the int8 ones are built.
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

use std::collections::HashMap;
use std::path::Path;

use kev_release::shards::TensorStore;

use crate::calibrate::ProjectionKind;
use crate::error::EngineError;
use crate::kernels::int8::PackedInt8;
use crate::model::{Backbone, Island};

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
    /// Write every projection's int8 form (built by [`Backbone::quantize_int8`] or loaded) to `path`,
    /// with `meta` added to the file's metadata.
    pub fn write_int8(&self, path: &Path, meta: &[(&str, String)]) -> Result<(), EngineError> {
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let (mut islands, mut gates, mut narrow) = (Vec::new(), false, true);
        for (name, l, _) in self.projections() {
            if l.island != Island::None {
                // Computed from the prepared directory's merged bf16 weights: only its name is stored.
                islands.push(name);
                continue;
            }
            if let Some(t) = l.float_tail.get() {
                if t.n() != self.gdn_gate_rows() {
                    return Err(EngineError::Int8(format!(
                        "{name}: only the GDN gate rows can be stored as fp32 rows"
                    )));
                }
                gates = true;
            }
            let q = l.w.int8_built().ok_or_else(|| {
                EngineError::Int8(format!(
                    "{name}: no int8 form to write (quantise first; bf16 islands are not stored)"
                ))
            })?;
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

    /// Install the stored int8 form of `path` as every projection's int8 weights (before any int8
    /// call). Every projection must be present with its shape, and nothing else. Returns the bytes.
    pub fn load_int8(&mut self, path: &Path) -> Result<usize, EngineError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let store = TensorStore::open_files(dir, &[path.to_path_buf()])?;
        let bad = |what: String| EngineError::Int8(format!("{}: {what}", path.display()));
        let meta = read_metadata(path).map_err(bad)?;
        let islands: Vec<&str> = meta
            .get(META_ISLANDS)
            .map(|s| s.split(',').collect())
            .unwrap_or_default();
        let gates = match meta.get(META_GATES).map(String::as_str) {
            None => false,
            Some("fp32") => true,
            Some(other) => return Err(bad(format!("{META_GATES} = {other:?} (fp32 or absent)"))),
        };
        let names = self.projection_names();
        if let Some(x) = islands.iter().find(|x| !names.iter().any(|n| n == *x)) {
            return Err(bad(format!("island {x} is not a projection of this model")));
        }
        let mut used = 0usize;
        let mut bytes = 0;
        let (mut wide, mut stored) = (0usize, 0usize);
        let is_island: Vec<bool> = names
            .iter()
            .map(|n| islands.contains(&n.as_str()))
            .collect();
        for (name, l, kind) in self.projections() {
            let (n, k) = (l.w.n(), l.w.k());
            if islands.contains(&name.as_str()) {
                continue;
            }
            if gates && kind == ProjectionKind::GdnIn {
                bytes += l.keep_float_rows(self.gdn_gate_rows(), &name)?;
            }
            let get = |suffix: &str, shape: &[usize], dtype: &str| {
                let full = format!("{name}.{suffix}");
                let v = store
                    .get(&full)
                    .map_err(|_| bad(format!("tensor {full} is missing")))?;
                if v.dtype.name() != dtype || v.shape != shape {
                    return Err(bad(format!(
                        "tensor {full} is {} {:?}, expected {dtype} {shape:?}",
                        v.dtype.name(),
                        v.shape
                    )));
                }
                Ok(v.data)
            };
            let q: Vec<i8> = get("qweight", &[n, k], "I8")?
                .iter()
                .map(|&b| b as i8)
                .collect();
            let to_f32 = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            let scale = to_f32(get("scale", &[n], "F32")?);
            used += 2;
            let smooth = if store.contains(&format!("{name}.smooth")) {
                used += 1;
                Some(to_f32(get("smooth", &[k], "F32")?))
            } else {
                None
            };
            let packed = PackedInt8::from_quantised(n, k, &q, &scale, smooth.as_deref())
                .map_err(|e| bad(format!("{name}: {e}")))?;
            bytes += packed.bytes();
            stored += 1;
            wide += usize::from(!packed.narrow());
            if !l.w.set_int8(packed) {
                return Err(bad(format!("{name}: its int8 form was already built")));
            }
        }
        let total = store.names().count();
        if total != used {
            let known: std::collections::HashSet<String> = self
                .projection_names()
                .into_iter()
                .flat_map(|n| ["qweight", "scale", "smooth"].map(|s| format!("{n}.{s}")))
                .collect();
            let extra = store.names().find(|n| !known.contains(*n)).unwrap_or("?");
            return Err(bad(format!(
                "tensor {extra} is not a projection of this model"
            )));
        }
        for (l, island) in self.projections_mut().into_iter().zip(is_island) {
            l.island = if island { Island::Bf16 } else { Island::None };
        }
        if wide > 0 && crate::kernels::int8::narrow_is_faster(self.kernels()) {
            tracing::warn!(
                "{}: {wide} of {stored} int8 projections have 8-bit weights (a form stored before the \
                 7-bit rule); {} runs them on its slower 8-bit kernel: `kev prepare --int8` again \
                 stores the 7-bit form",
                path.display(),
                self.kernels().isa()
            );
        }
        Ok(bytes)
    }

    /// Drop the BF16/F32 copies of every projection whose int8 form is built, so the model holds the
    /// int8 weights only (plus embedding, norms and the small GDN parameters). After this only the int8
    /// arm can run the model. Returns the bytes freed.
    pub fn drop_float_projections(&mut self) -> usize {
        let mut freed = 0;
        for l in self.projections_mut() {
            if l.w.int8_built().is_some() {
                freed += l.w.drop_float();
            }
        }
        freed
    }

    /// Whether the float copies of the projections were dropped (only the int8 arm can run).
    pub fn int8_only(&self) -> bool {
        self.projections()
            .iter()
            .any(|(_, l, _)| l.w.float_dropped())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Arm, Backbone, Int8Plan, LoadOptions};
    use std::path::Path;

    /// The int8 arm's hidden states of one 150-token row (positions 0, 63, 64, 149), as bits.
    fn int8_bits(m: &Backbone) -> Vec<u32> {
        let ids: Vec<u32> = (0..150u32).map(|i| 9 + (i * 7919) % 5000).collect();
        let mut state = m.new_state();
        m.forward(Arm::Int8, &mut state, &ids, &[0, 63, 64, 149])
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    }

    /// Quantising each layer as it loads gives the bits of quantising the loaded model, with the same
    /// islands, and holds no float projection but the islands'.
    #[test]
    fn quantising_at_load_is_quantising_after_load() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/base");
        let plan = Int8Plan {
            scope: crate::SmoothScope::None,
            ..Int8Plan::default()
        };
        let mut a = Backbone::load(&base, &LoadOptions::default()).unwrap();
        let bytes = a.quantize_int8(None, plan).unwrap();
        a.drop_float_projections();
        let b = Backbone::load_quantised(&base, &LoadOptions::default(), &plan).unwrap();
        assert_eq!(b.int8_bytes(), bytes);
        assert_eq!(b.weight_bytes(), a.weight_bytes());
        let islands = |m: &Backbone| -> Vec<bool> {
            m.projections()
                .iter()
                .map(|(_, l, _)| l.island != crate::model::Island::None)
                .collect()
        };
        assert_eq!(islands(&a), islands(&b));
        assert!(islands(&b).iter().any(|x| *x), "the rule has islands");
        assert_eq!(int8_bits(&a), int8_bits(&b));
    }

    /// The stored form gives back, bit for bit, the int8 arm it was written from; the float copies can be
    /// dropped without changing a bit; a model without some projection's form is refused.
    #[test]
    fn the_stored_form_round_trips_bit_for_bit() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/base");
        let mut a = Backbone::load(&base, &LoadOptions::default()).unwrap();
        let bytes = a.quantize_int8(None, Int8Plan::default()).unwrap();
        assert!(bytes > 0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::INT8_FILE);
        a.write_int8(&path, &[("scheme", "test".into())]).unwrap();
        let mut b = Backbone::load(&base, &LoadOptions::default()).unwrap();
        assert_eq!(b.load_int8(&path).unwrap(), bytes);
        let floats = b.weight_bytes();
        assert!(b.drop_float_projections() > 0);
        assert!(b.int8_only() && b.weight_bytes() < floats);
        assert_eq!(int8_bits(&a), int8_bits(&b));
        let mut c = Backbone::load(&base, &LoadOptions::default()).unwrap();
        c.quantize_int8(None, Int8Plan::default()).unwrap();
        assert!(c.load_int8(&path).is_err(), "already built: refused");
        let mut d = Backbone::load(&base, &LoadOptions::default()).unwrap();
        let other = dir.path().join("empty.safetensors");
        let none: Vec<(String, safetensors::tensor::TensorView<'_>)> = Vec::new();
        safetensors::tensor::serialize_to_file(none, None, &other).unwrap();
        let err = d.load_int8(&other).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }

    /// The plan's BF16 islands and fp32 GDN gate rows are recorded in the metadata and restored: the
    /// stored form answers bit for bit as the model quantised at load, and differs from plain W8A8.
    #[test]
    fn islands_and_fp32_gates_round_trip() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/base");
        let ids: Vec<u32> = (0..90u32).map(|i| 11 + (i * 7919) % 5000).collect();
        let wanted = [0, 64, 89];
        let hidden = |m: &Backbone| {
            let mut st = m.new_state();
            let h = m.forward(Arm::Int8, &mut st, &ids, &wanted).unwrap();
            h.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        };
        let plan = Int8Plan {
            gdn_gates_fp32: true,
            ..Int8Plan::default()
        };
        assert!(!plan.bf16_layer_islands.is_empty());
        let mut a = Backbone::load(&base, &LoadOptions::default()).unwrap();
        a.quantize_int8(None, plan).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::INT8_FILE);
        a.write_int8(&path, &[]).unwrap();
        let mut b = Backbone::load(&base, &LoadOptions::default()).unwrap();
        b.load_int8(&path).unwrap();
        b.drop_float_projections();
        assert_eq!(hidden(&a), hidden(&b));
        let mut p = Backbone::load(&base, &LoadOptions::default()).unwrap();
        p.quantize_int8(None, Int8Plan::plain()).unwrap();
        assert_ne!(hidden(&a), hidden(&p));
    }
}
