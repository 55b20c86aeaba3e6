use crate::model::linear::Weight;
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
        .map(|(li, kind, l)| {
            let (q, island) = match &l.weight {
                Weight::Int8 { q, .. } => {
                    let scales = q.scales().iter().map(|s| s.to_bits()).collect();
                    (Some((q.q_rows(), scales, q.narrow())), false)
                }
                Weight::Island { .. } => (None, true),
                Weight::Float(_) => (None, false),
            };
            (kind.name(li), q, island)
        })
        .collect()
}

/// Quantising each layer as it loads — straight from the checkpoint's rows, an adapter merged a row at
/// a time, no float copy made — gives the bytes and scales of quantising a loaded float model's
/// panels ([`Backbone::quantised`]), with the same islands, and holds no float projection but the islands': on the plain base,
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
        let a = Backbone::load(&base, &opts)
            .unwrap()
            .quantised(&plan, None)
            .unwrap();
        let bytes = a.int8_bytes();
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
    let a = Backbone::load(&base, &opts)
        .unwrap()
        .quantised(&Int8Plan::default(), None)
        .unwrap();
    let bytes = a.int8_bytes();
    assert!(bytes > 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::stored::INT8_FILE);
    a.write_int8(&path, &[("scheme", "test".into())]).unwrap();
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
    let a = Backbone::load(&base, &LoadOptions::default())
        .unwrap()
        .quantised(&plan, None)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::stored::INT8_FILE);
    a.write_int8(&path, &[]).unwrap();
    let b = Backbone::load_quantised(&base, &LoadOptions::default(), Int8Source::Stored(&path))
        .unwrap();
    assert_eq!(hidden(&a), hidden(&b));
    let p = Backbone::load(&base, &LoadOptions::default())
        .unwrap()
        .quantised(&Int8Plan::plain(), None)
        .unwrap();
    assert_ne!(hidden(&a), hidden(&p));
}
