//! Negative controls (qwen35-arch §10.3): plausible layout and formula mistakes, introduced into the
//! loaded fixture model, must move the hidden states far outside the 1e-4 bar against the reference.
//! Each shows that the fixture comparison would catch that mistake in the engine.

use std::path::Path;

use crate::Arm;
use crate::adapter::Adapter;
use crate::kernels::PackedMatrix;
use crate::model::layer::Mixer;
use crate::model::linear::{Linear, Weight};
use crate::model::{Backbone, LoadOptions};

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn model() -> Backbone {
    let fx = fixtures();
    Backbone::load(
        &fx.join("release/base"),
        &LoadOptions {
            adapter: Some(fx.join("release/kev")),
            kernels: None,
            merge_adapter: false,
        },
    )
    .unwrap()
}

/// Rows and wanted positions of one fixture request, with its reference hidden states.
fn case(name: &str) -> (Vec<u32>, Vec<usize>, Vec<f32>) {
    let fx = fixtures();
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fx.join(format!("expected/valid/{name}.json"))).unwrap(),
    )
    .unwrap();
    let q = &v["questions"][0];
    let ids = q["row_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let mut wanted: Vec<usize> = q["option_ends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    wanted.push(q["decide"].as_u64().unwrap() as usize);
    let store = kev_release::shards::TensorStore::open_files(
        &fx,
        &[fx.join(v["hidden"].as_str().unwrap())],
    )
    .unwrap();
    let t = store.get("0").unwrap();
    let hidden = t
        .data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (ids, wanted, hidden)
}

fn rel_err(m: &Backbone) -> f32 {
    let (ids, wanted, want) = case("choice-basic");
    let mut s = m.new_state();
    let got = m.forward(Arm::Fp32, &mut s, &ids, &wanted).unwrap();
    let h = m.cfg.hidden_size;
    got.chunks(h)
        .zip(want.chunks(h))
        .map(|(x, y)| {
            let mx = y.iter().fold(0f32, |a, v| a.max(v.abs()));
            x.iter().zip(y).fold(0f32, |e, (p, q)| e.max((p - q).abs())) / mx
        })
        .fold(0f32, f32::max)
}

/// Reorder the output rows of a projection (weights and the model's own adapter's `B`): new row `i` is
/// old row `perm[i]`.
fn permute_rows(lin: &mut Linear, adapter: Option<&mut Adapter>, perm: &[usize]) {
    let Weight::Float(w) = &lin.weight else {
        unreachable!("the controls load float models")
    };
    let (n, k) = (w.n(), w.k());
    let old = w.to_f32_rows();
    let mut rows = vec![0f32; n * k];
    for (i, &p) in perm.iter().enumerate() {
        rows[i * k..(i + 1) * k].copy_from_slice(&old[p * k..(p + 1) * k]);
    }
    lin.weight = Weight::Float(PackedMatrix::from_f32(n, k, &rows));
    let segs = adapter.map_or(&mut [][..], |a| &mut a.segments[lin.id][..]);
    for seg in segs {
        let bt_old = seg.b_t.clone();
        for i in 0..seg.n {
            let src = perm[seg.col + i] - seg.col;
            assert!(src < seg.n, "permutation crosses modules");
            for j in 0..seg.r {
                seg.b_t[j * seg.n + i] = bt_old[j * seg.n + src];
            }
        }
    }
}

fn assert_caught(what: &str, m: &Backbone) {
    let e = rel_err(m);
    eprintln!("negative control {what}: relative error {e:.3}");
    assert!(e > 1e-2, "{what} went unnoticed ({e})");
}

#[test]
fn the_unmodified_model_passes() {
    assert!(rel_err(&model()) <= 1e-4);
}

#[test]
fn query_and_gate_as_two_blocks_is_caught() {
    let mut m = model();
    let (nh, hd) = (m.cfg.num_attention_heads, m.cfg.head_dim);
    for l in &mut m.layers {
        if let Mixer::Attention(a) = &mut l.mixer {
            // Read q_proj as [all queries | all gates]: interleaved slot (h, part) takes block-layout row.
            let n = a.qkv.n();
            let mut perm: Vec<usize> = (0..n).collect();
            for h in 0..nh {
                for d in 0..hd {
                    perm[2 * hd * h + d] = hd * h + d;
                    perm[2 * hd * h + hd + d] = nh * hd + hd * h + d;
                }
            }
            permute_rows(&mut a.qkv, m.adapter.as_mut(), &perm);
        }
    }
    assert_caught("q_proj as [all q | all gate]", &m);
}

#[test]
fn norm_without_the_one_is_caught() {
    let mut m = model();
    for l in &mut m.layers {
        l.input_norm.iter_mut().for_each(|w| *w -= 1.0);
        l.post_norm.iter_mut().for_each(|w| *w -= 1.0);
    }
    m.final_norm.iter_mut().for_each(|w| *w -= 1.0);
    assert_caught("RMSNorm x·w instead of x·(1+w)", &m);
}

#[test]
fn gated_norm_with_a_one_is_caught() {
    let mut m = model();
    for l in &mut m.layers {
        if let Mixer::Gdn(g) = &mut l.mixer {
            g.norm.iter_mut().for_each(|w| *w += 1.0);
        }
    }
    assert_caught("gated norm x·(1+w) instead of x·w", &m);
}

#[test]
fn reversed_conv_taps_are_caught() {
    let mut m = model();
    let cd = m.cfg.conv_dim();
    for l in &mut m.layers {
        if let Mixer::Gdn(g) = &mut l.mixer {
            let old = g.conv_t.clone();
            for j in 0..4 {
                g.conv_t[j * cd..(j + 1) * cd].copy_from_slice(&old[(3 - j) * cd..(4 - j) * cd]);
            }
        }
    }
    assert_caught("conv taps reversed", &m);
}

#[test]
fn interleaved_rope_pairs_are_caught() {
    // GPT-J pairs (2i, 2i+1) instead of NeoX halves (i, i+half): move stored dims 2i, 2i+1 to i, i+half in
    // every q and k head (and their norm weights); dot products are unchanged by the permutation, so only
    // the rotation pairing differs.
    let mut m = model();
    let (nh, nkv, hd, rd) = (
        m.cfg.num_attention_heads,
        m.cfg.num_key_value_heads,
        m.cfg.head_dim,
        m.cfg.rotary_dim,
    );
    let half = rd / 2;
    let mut dim = (0..hd).collect::<Vec<_>>();
    for i in 0..half {
        dim[i] = 2 * i;
        dim[half + i] = 2 * i + 1;
    }
    for l in &mut m.layers {
        if let Mixer::Attention(a) = &mut l.mixer {
            let n = a.qkv.n();
            let mut perm: Vec<usize> = (0..n).collect();
            for h in 0..nh {
                for d in 0..hd {
                    perm[2 * hd * h + d] = 2 * hd * h + dim[d];
                }
            }
            for g in 0..nkv {
                for d in 0..hd {
                    perm[2 * nh * hd + g * hd + d] = 2 * nh * hd + g * hd + dim[d];
                }
            }
            permute_rows(&mut a.qkv, m.adapter.as_mut(), &perm);
            let (qn, kn) = (a.q_norm.clone(), a.k_norm.clone());
            for d in 0..hd {
                a.q_norm[d] = qn[dim[d]];
                a.k_norm[d] = kn[dim[d]];
            }
        }
    }
    assert_caught("GPT-J interleaved RoPE pairs", &m);
}
