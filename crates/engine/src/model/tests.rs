use super::*;
use crate::Arm;
use sha2::{Digest, Sha256};

/// Merging at load gives, bit for bit, the weights of the author's merged export (the fixture's
/// `merge.json` hashes every merged tensor after the bf16 cast).
#[test]
fn merge_at_load_is_bit_exact_with_the_export() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let m = Backbone::load(
        &fx.join("release/base"),
        &LoadOptions {
            adapter: Some(fx.join("release/kev")),
            kernels: None,
            merge_adapter: true,
        },
    )
    .unwrap();
    assert!(!m.has_lora());
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fx.join("expected/merge.json")).unwrap()).unwrap();
    let c = m.cfg.clone();
    let mut checked = 0;
    for (i, kind, lin) in m.projections() {
        let parts = kind.modules(&c);
        {
            let Weight::Float(w) = &lin.weight else {
                panic!("a float model")
            };
            assert!(w.is_bf16());
            let rows = w.to_f32_rows();
            let k = w.k();
            let mut start = 0;
            for (name, n) in parts {
                let bytes: Vec<u8> = rows[start * k..(start + n) * k]
                    .iter()
                    .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
                    .collect();
                let key = format!("model.language_model.layers.{i}.{name}.weight");
                let entry = &want["tensors"][&key];
                assert_eq!(entry["merged"], true, "{key}");
                assert_eq!(
                    hex::encode(Sha256::digest(&bytes)),
                    entry["sha256"].as_str().unwrap(),
                    "{key}"
                );
                checked += 1;
                start += n;
            }
        }
    }
    assert_eq!(checked, want["adapted"].as_u64().unwrap() as usize);
}

/// A pass whose workspace is over the pool's limit gives its buffers back (nothing pooled), and the
/// next pass, on buffers mapped afresh, gives the same bits as one on pooled buffers.
#[test]
fn a_workspace_over_the_limit_is_not_kept_and_results_do_not_change() {
    let fx = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures");
    let mut m = Backbone::load(&fx.join("release/base"), &LoadOptions::default()).unwrap();
    let tokens: Vec<u32> = (0..300).map(|i| (i * 7 % 200) as u32).collect();
    let wanted = [0, 150, 299];
    let run = |m: &Backbone| {
        let mut state = m.new_state();
        m.forward(Arm::Fp32, &mut state, &tokens, &wanted).unwrap()
    };
    let first = run(&m);
    assert_eq!(
        m.pool.held(),
        1,
        "the default limit keeps a small model's workspace"
    );
    assert_eq!(run(&m), first, "pooled buffers");
    m.pool = crate::scratch::WorkspacePool::new(1 << 10);
    assert_eq!(run(&m), first, "fresh buffers");
    assert_eq!(m.pool.held(), 0, "over the limit: not kept");
    assert_eq!(run(&m), first, "fresh buffers again");
}
