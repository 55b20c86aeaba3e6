use super::*;

#[test]
fn composite_round_trip_and_costs() {
    let c = Qwen35Config::qwen35_4b();
    let back = Qwen35Config::from_json(&c.to_composite_json()).unwrap();
    assert_eq!(back, c);
    assert_eq!(c.conv_dim(), 8192);
    // qwen35-arch §11: 7.23 GFLOP/token for linear layers, 131,072 per context position.
    let base = c.flops_per_token(0);
    assert!((base / 1e9 - 7.23).abs() < 0.01, "{base}");
    assert_eq!(c.flops_per_token(1) - base, 131_072.0);
    // The 4B's projection weights, shape by shape: 24 DeltaNet layers (in 2560 × 12,352, out
    // 4096 × 2560) and 8 attention layers (in 2560 × 10,240, out 4096 × 2560), each with a
    // 3 × 2560 × 9216 MLP: 3,569,090,560 weights; the last layer (attention) finishes `wanted` rows.
    let (gdn, attn, out, mlp) = (
        2560.0 * 12_352.0,
        2560.0 * 10_240.0,
        4096.0 * 2560.0,
        3.0 * 2560.0 * 9216.0,
    );
    let weights = 24.0 * (gdn + out + mlp) + 8.0 * (attn + out + mlp);
    assert_eq!(weights, 3_569_090_560.0);
    assert_eq!(c.projection_flops(94, 94), 2.0 * 94.0 * weights);
    assert_eq!(
        c.projection_flops(94, 1),
        2.0 * 94.0 * weights - 2.0 * 93.0 * (out + mlp)
    );
    // The rest of a token's FLOPs are the mixers' own: the GDN conv and recurrence.
    let mixers = 24.0 * 2.0 * (4.0 * 8192.0 + 3.5 * 32.0 * 128.0 * 128.0);
    assert_eq!(base, 2.0 * weights + mixers);
}

/// The 0.8B shape as its published config.json states it (docs/kev-0.8b-pins.md, §config).
#[test]
fn the_0_8b_shape() {
    let c = Qwen35Config::qwen35_0_8b();
    assert_eq!(Qwen35Config::from_json(&c.to_composite_json()).unwrap(), c);
    assert_eq!(c.num_layers(), 24);
    let full: Vec<usize> = (0..24)
        .filter(|&i| c.layer_types[i] == LayerKind::Full)
        .collect();
    assert_eq!(full, [3, 7, 11, 15, 19, 23]);
    // the LoRA shapes of the real adapter: in_proj_qkv B is [6144, 16], q_proj out 8·256·2
    assert_eq!(c.conv_dim(), 6144);
    assert_eq!(c.value_dim(), 2048);
    assert_eq!(2 * c.num_attention_heads * c.head_dim, 4096);
    assert_eq!(c.num_key_value_heads * c.head_dim, 512);
    assert_eq!(c.published_base(), Some("Qwen/Qwen3.5-0.8B-Base"));
    assert_eq!(
        Qwen35Config::qwen35_4b().published_base(),
        Some("Qwen/Qwen3.5-4B-Base")
    );
    // ≈ 0.75 B text parameters with the tied embedding: 2·(non-embedding) FLOPs per token
    let per_token = c.flops_per_token(0);
    assert!((per_token / 1e9 - 1.00).abs() < 0.05, "{per_token}");
}

/// The 9B shape (peers-notes, Kev-9B appendix; the pinned base's config.json): the 4B's layers and heads,
/// hidden 4096, MLP 12,288, untied; 6.92 B projection weights, ≈ 13.8 GFLOP a token (1.94× the 4B).
#[test]
fn the_9b_shape() {
    let c = Qwen35Config::qwen35_9b();
    assert_eq!(Qwen35Config::from_json(&c.to_composite_json()).unwrap(), c);
    assert!(!c.tie_word_embeddings);
    assert_eq!(c.num_layers(), 32);
    let full: Vec<usize> = (0..32)
        .filter(|&i| c.layer_types[i] == LayerKind::Full)
        .collect();
    assert_eq!(full, [3, 7, 11, 15, 19, 23, 27, 31]);
    // q_proj 4,096 → 8,192 (query and gate), key dim 2,048, value dim 4,096, conv dim 8,192
    assert_eq!(2 * c.num_attention_heads * c.head_dim, 8192);
    assert_eq!(
        (c.key_dim(), c.value_dim(), c.conv_dim()),
        (2048, 4096, 8192)
    );
    let (gdn, attn, out, mlp) = (
        4096.0 * 12_352.0,
        4096.0 * 10_240.0,
        4096.0 * 4096.0,
        3.0 * 4096.0 * 12_288.0,
    );
    let weights = 24.0 * (gdn + out + mlp) + 8.0 * (attn + out + mlp);
    assert_eq!(weights, 6_918_504_448.0);
    assert_eq!(c.projection_weight_count(), 6_918_504_448);
    assert_eq!(
        c.projection_rows_count(),
        24 * (12_352 + 4096 + 2 * 12_288 + 4096) + 8 * (10_240 + 4096 + 2 * 12_288 + 4096)
    );
    assert_eq!(c.projection_flops(1, 1), 2.0 * weights);
    // matmul work 13.84 GFLOP a token, 1.94× the 4B's; 13.93 with the DeltaNet mixers' own work
    let four = Qwen35Config::qwen35_4b();
    let ratio = c.projection_flops(1, 1) / four.projection_flops(1, 1);
    assert!((ratio - 1.938).abs() < 0.001, "{ratio}");
    assert!((c.flops_per_token(0) / 1e9 - 13.93).abs() < 0.01);
    assert_eq!(c.published_base(), Some("Qwen/Qwen3.5-9B-Base"));
    let mut tied = c.clone();
    tied.tie_word_embeddings = true;
    assert_eq!(tied.published_base(), None);
}

#[test]
fn tie_and_mrope_are_read_checked_and_written_back() {
    let mut c = Qwen35Config::qwen35_0_8b();
    c.tie_word_embeddings = false;
    c.mrope_section = vec![12, 10, 10];
    c.mrope_interleaved = false;
    let v = c.to_composite_json();
    assert_eq!(v["tie_word_embeddings"], json!(false));
    assert_eq!(Qwen35Config::from_json(&v).unwrap(), c);
    // absent: HF's defaults (untied; [11, 11, 10] interleaved)
    let mut v = Qwen35Config::qwen35_4b().to_composite_json();
    v.as_object_mut().unwrap().remove("tie_word_embeddings");
    let tc = v["text_config"].as_object_mut().unwrap();
    tc.remove("tie_word_embeddings");
    let rp = tc["rope_parameters"].as_object_mut().unwrap();
    rp.remove("mrope_section");
    rp.remove("mrope_interleaved");
    let d = Qwen35Config::from_json(&v).unwrap();
    assert!(!d.tie_word_embeddings);
    assert_eq!(
        (d.mrope_section, d.mrope_interleaved),
        (vec![11, 11, 10], true)
    );
    // refusals name the field
    let mut v = Qwen35Config::qwen35_0_8b().to_composite_json();
    v["text_config"]["rope_parameters"]["mrope_section"] = json!([11, 11, 11]);
    let err = Qwen35Config::from_json(&v).unwrap_err().to_string();
    assert!(err.contains("mrope_section") && err.contains("32"), "{err}");
    let mut v = Qwen35Config::qwen35_0_8b().to_composite_json();
    v["tie_word_embeddings"] = json!(false);
    let err = Qwen35Config::from_json(&v).unwrap_err().to_string();
    assert!(err.contains("tie_word_embeddings"), "{err}");
}

fn plain() -> Value {
    let mut v = Qwen35Config::qwen35_4b().to_composite_json();
    v["text_config"].take()
}

#[test]
fn plain_form_and_defaults() {
    let mut v = plain();
    v.as_object_mut().unwrap().remove("layer_types");
    v.as_object_mut().unwrap().remove("rms_norm_eps");
    let c = Qwen35Config::from_json(&v).unwrap();
    assert_eq!(c, Qwen35Config::qwen35_4b());
}

#[test]
fn unsupported_fields_are_named() {
    let cases: Vec<(&str, Value, &str)> = vec![
        ("hidden_act", json!("gelu"), "text_config.hidden_act"),
        ("attention_bias", json!(true), "text_config.attention_bias"),
        (
            "linear_conv_kernel_dim",
            json!(3),
            "text_config.linear_conv_kernel_dim",
        ),
        ("head_dim", Value::Null, "text_config.head_dim"),
        (
            "linear_key_head_dim",
            Value::Null,
            "text_config.linear_key_head_dim",
        ),
        (
            "layer_types",
            json!(["linear_attention", "mamba"]),
            "text_config.layer_types[1]",
        ),
    ];
    for (field, value, expect) in cases {
        let mut v = Qwen35Config::qwen35_4b().to_composite_json();
        v["text_config"][field] = value;
        let err = Qwen35Config::from_json(&v).unwrap_err();
        match &err {
            EngineError::Config { field, .. } => assert_eq!(field, expect, "{err}"),
            other => panic!("{other}"),
        }
    }
    let mut v = Qwen35Config::qwen35_4b().to_composite_json();
    v["text_config"]["rope_parameters"]["partial_rotary_factor"] = json!(0.5);
    let err = Qwen35Config::from_json(&v).unwrap_err().to_string();
    assert!(err.contains("partial_rotary_factor"), "{err}");
    let mut v = Qwen35Config::qwen35_4b().to_composite_json();
    v["model_type"] = json!("qwen3_next");
    assert!(
        Qwen35Config::from_json(&v)
            .unwrap_err()
            .to_string()
            .contains("model_type")
    );
}
