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

use std::cell::Cell;
use std::collections::HashMap;
use std::path::Path;

use kev_release::shards::TensorStore;

use crate::calibrate::{layer_projections, projection_name};
use crate::error::EngineError;
use crate::kernels::int8::PackedInt8;
use crate::model::{Backbone, Form, Island, Layer, ProjectionKind};

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

/// A stored int8 form opened to be installed layer by layer as the model loads
/// ([`Backbone::load_quantised`] with [`crate::Int8Source::Stored`]): each layer's projections take their
/// stored int8 weights (the rule's BF16 islands and fp32 GDN gate rows as the metadata says) with no float
/// copy made ([`StoredInt8::load_form`]; an `in_proj` whose gate rows stay fp32 drops its float panels once
/// they are copied out), and each tensor's mapped pages are given back once read, so the load peaks near
/// the int8 model's size, not the float model's.
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

    /// The form the load packs decoder layer `li`'s projection of this kind in: float for the islands
    /// and an `in_proj` whose gate rows stay fp32 (their float rows are copied out first); every other
    /// projection gets its stored form with no float copy made.
    pub(crate) fn load_form(&self, li: usize, kind: ProjectionKind) -> Form {
        if self.islands.contains(&projection_name(li, kind))
            || (self.gates && kind == ProjectionKind::GdnIn)
        {
            Form::Float
        } else {
            Form::Int8Stored
        }
    }

    /// Install decoder layer `li`'s stored forms (`gate_rows`: the GDN gate rows at the end of each
    /// `in_proj`) and drop the float copies but the islands'.
    pub(crate) fn install_layer(
        &self,
        layer: &mut Layer,
        li: usize,
        gate_rows: usize,
    ) -> Result<(), EngineError> {
        for (l, kind, name) in layer_projections(layer, li) {
            if self.islands.contains(&name) {
                l.island = Island::Bf16;
                continue;
            }
            l.island = Island::None;
            if self.gates && kind == ProjectionKind::GdnIn {
                l.keep_float_rows(gate_rows, &name)?;
            }
            let (n, k) = (l.w.n(), l.w.k());
            let scale = self.read(&name, "scale", &[n], "F32", f32_values)?;
            let smooth = if self.store.contains(&format!("{name}.smooth")) {
                Some(self.read(&name, "smooth", &[k], "F32", f32_values)?)
            } else {
                None
            };
            // Packed straight from the mapping (no copy of the weights first).
            let packed = self
                .read(&name, "qweight", &[n, k], "I8", |b| {
                    PackedInt8::from_quantised(
                        n,
                        k,
                        bytemuck::cast_slice(b),
                        &scale,
                        smooth.as_deref(),
                    )
                })?
                .map_err(|e| self.bad(format!("{name}: {e}")))?;
            self.installed.set(self.installed.get() + 1);
            self.wide
                .set(self.wide.get() + usize::from(!packed.narrow()));
            if !l.w.set_int8(packed) {
                return Err(self.bad(format!("{name}: its int8 form was already built")));
            }
            l.w.drop_float();
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use crate::{Arm, Backbone, Int8Plan, Int8Source, LoadOptions};
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

    /// A projection's name, its int8 form (row-major `q`, scales' bits, 7-bit or not) and whether it is an
    /// island.
    type Int8Form = (String, Option<(Vec<i8>, Vec<u32>, bool)>, bool);

    fn int8_forms(m: &Backbone) -> Vec<Int8Form> {
        m.projections()
            .into_iter()
            .map(|(name, l, _)| {
                let q = l.w.int8_built().map(|q| {
                    let scales = q.scales().iter().map(|s| s.to_bits()).collect();
                    (q.q_rows(), scales, q.narrow())
                });
                (name, q, l.island != crate::model::Island::None)
            })
            .collect()
    }

    /// Quantising each layer as it loads — straight from the checkpoint's rows, an adapter merged a row at
    /// a time, no float copy made — gives the bytes and scales of quantising the loaded model's float
    /// panels, with the same islands, and holds no float projection but the islands': on the plain base,
    /// with an adapter merged at load, and with one kept unmerged; and the same hidden-state bits.
    #[test]
    fn quantising_at_load_is_quantising_after_load() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release");
        let base = root.join("base");
        let plan = Int8Plan {
            scope: crate::SmoothScope::None,
            ..Int8Plan::default()
        };
        let merged = LoadOptions {
            adapter: Some(root.join("kev")),
            merge_adapter: true,
            ..LoadOptions::default()
        };
        let exact = LoadOptions {
            adapter: Some(root.join("kev")),
            ..LoadOptions::default()
        };
        for opts in [LoadOptions::default(), merged, exact] {
            let mut a = Backbone::load(&base, &opts).unwrap();
            let bytes = a.quantize_int8(None, plan).unwrap();
            a.drop_float_projections();
            let b = Backbone::load_quantised(&base, &opts, Int8Source::Rule(&plan)).unwrap();
            assert_eq!(b.int8_bytes(), bytes);
            assert_eq!(b.weight_bytes(), a.weight_bytes());
            let (fa, fb) = (int8_forms(&a), int8_forms(&b));
            assert_eq!(fa, fb, "{opts:?}");
            assert!(fb.iter().any(|f| f.2), "the rule has islands");
            assert!(
                fb.iter().all(|f| f.2 || f.1.is_some()),
                "every other projection is int8"
            );
            assert_eq!(int8_bits(&a), int8_bits(&b));
        }
    }

    /// The stored form, installed layer by layer as the model loads, gives back bit for bit the int8 arm it
    /// was written from and holds what that arm holds (no float projection but the islands'); a file
    /// missing a projection's form, or holding a tensor of another model, is refused.
    #[test]
    fn the_stored_form_round_trips_bit_for_bit() {
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/release/base");
        let opts = LoadOptions::default();
        let mut a = Backbone::load(&base, &opts).unwrap();
        let bytes = a.quantize_int8(None, Int8Plan::default()).unwrap();
        assert!(bytes > 0);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(super::INT8_FILE);
        a.write_int8(&path, &[("scheme", "test".into())]).unwrap();
        a.drop_float_projections();
        let b = Backbone::load_quantised(&base, &opts, Int8Source::Stored(&path)).unwrap();
        assert_eq!(b.int8_bytes(), bytes);
        assert!(b.int8_only());
        assert_eq!(b.weight_bytes(), a.weight_bytes());
        assert_eq!(int8_bits(&a), int8_bits(&b));

        let refused = |tensors: Vec<(String, safetensors::tensor::TensorView<'_>)>, meta| {
            let other = dir.path().join("other.safetensors");
            safetensors::tensor::serialize_to_file(tensors, meta, &other).unwrap();
            match Backbone::load_quantised(&base, &opts, Int8Source::Stored(&other)) {
                Ok(_) => panic!("a stored form of another model was accepted"),
                Err(e) => e.to_string(),
            }
        };
        let err = refused(Vec::new(), None);
        assert!(err.contains("missing"), "{err}");
        let file = std::fs::read(&path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&file).unwrap();
        let (_, header) = safetensors::SafeTensors::read_metadata(&file).unwrap();
        let mut tensors: Vec<_> = st.tensors();
        let (_, scale) = tensors
            .iter()
            .find(|(n, _)| n.ends_with(".scale"))
            .cloned()
            .unwrap();
        tensors.push(("layers.99.mlp.down_proj.scale".into(), scale));
        let err = refused(tensors, header.metadata().clone());
        assert!(err.contains("layers.99.mlp.down_proj.scale"), "{err}");
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
        let b = Backbone::load_quantised(&base, &LoadOptions::default(), Int8Source::Stored(&path))
            .unwrap();
        assert_eq!(hidden(&a), hidden(&b));
        let mut p = Backbone::load(&base, &LoadOptions::default()).unwrap();
        p.quantize_int8(None, Int8Plan::plain()).unwrap();
        assert_ne!(hidden(&a), hidden(&p));
    }
}
