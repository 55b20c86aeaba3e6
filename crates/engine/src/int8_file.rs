//! The stored int8 form (`int8.safetensors`, written by `kev prepare --int8`), and dropping the float
//! copies of the projections once the int8 ones are built.
//!
//! Layout: one safetensors file; per (fused) projection `P` of [`Backbone::projection_names`]
//! (`layers.{i}.linear_attn.in_proj` = `[in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]`,
//! `layers.{i}.self_attn.qkv_proj` = `[q_proj; k_proj; v_proj]`, `layers.{i}.mlp.gate_up_proj` =
//! `[gate_proj; up_proj]`, and the unfused `out_proj`, `o_proj`, `down_proj`):
//! - `P.qweight`: I8 `[n, k]` row-major, `round(W[j,k]·f[k] / s_w[j])` in `[−127, 127]`;
//! - `P.scale`: F32 `[n]`, `s_w`;
//! - `P.smooth`: F32 `[k]`, the SmoothQuant factors `f` (absent when the projection is not smoothed).
//!
//! The metadata holds `format` = [`INT8_FORMAT`] and whatever the writer records (scheme, `alpha`,
//! calibration source). Everything else of the model (embedding, norms, GDN parameters, head) stays in the
//! merged shards beside it.

use std::collections::HashMap;
use std::path::Path;

use kev_release::shards::TensorStore;

use crate::error::EngineError;
use crate::kernels::int8::PackedInt8;
use crate::model::Backbone;

/// The file name of the stored int8 form in a prepared directory.
pub const INT8_FILE: &str = "int8.safetensors";
/// The `format` metadata value this engine reads and writes.
pub const INT8_FORMAT: &str = "kev-int8-w8a8/1";

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl Backbone {
    /// Write every projection's int8 form (built by [`Backbone::quantize_int8`] or loaded) to `path`,
    /// with `meta` added to the file's metadata.
    pub fn write_int8(&self, path: &Path, meta: &[(&str, String)]) -> Result<(), EngineError> {
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (name, l, _) in self.projections() {
            let q = l.w.int8_built().ok_or_else(|| {
                EngineError::Int8(format!(
                    "{name}: no int8 form to write (quantise first; bf16 islands are not stored)"
                ))
            })?;
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
        safetensors::tensor::serialize_to_file(views, Some(info), path)
            .map_err(|e| EngineError::Int8(format!("{}: {e}", path.display())))
    }

    /// Install the stored int8 form of `path` as every projection's int8 weights (before any int8
    /// call). Every projection must be present with its shape, and nothing else. Returns the bytes.
    pub fn load_int8(&self, path: &Path) -> Result<usize, EngineError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let store = TensorStore::open_files(dir, &[path.to_path_buf()])?;
        let bad = |what: String| EngineError::Int8(format!("{}: {what}", path.display()));
        let mut used = 0usize;
        let mut bytes = 0;
        for (name, l, _) in self.projections() {
            let (n, k) = (l.w.n(), l.w.k());
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

    /// The stored form gives back, bit for bit, the int8 arm it was written from; the float copies can be
    /// dropped without changing a bit; a model without some projection's form is refused.
    #[test]
    fn the_stored_form_round_trips_bit_for_bit() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/base");
        let a = Backbone::load(&base, &LoadOptions::default()).unwrap();
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
        let ids: Vec<u32> = (0..150u32).map(|i| 9 + (i * 7919) % 5000).collect();
        let wanted = [0, 63, 64, 149];
        let (mut sa, mut sb) = (a.new_state(), b.new_state());
        let ha = a.forward(Arm::Int8, &mut sa, &ids, &wanted).unwrap();
        let hb = b.forward(Arm::Int8, &mut sb, &ids, &wanted).unwrap();
        assert_eq!(
            ha.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            hb.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        let c = Backbone::load(&base, &LoadOptions::default()).unwrap();
        c.quantize_int8(None, Int8Plan::default()).unwrap();
        assert!(c.load_int8(&path).is_err(), "already built: refused");
        let d = Backbone::load(&base, &LoadOptions::default()).unwrap();
        let other = dir.path().join("empty.safetensors");
        let none: Vec<(String, safetensors::tensor::TensorView<'_>)> = Vec::new();
        safetensors::tensor::serialize_to_file(none, None, &other).unwrap();
        let err = d.load_int8(&other).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
