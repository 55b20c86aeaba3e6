//! Unit tests of the backbone bench's arithmetic: comparisons, bars per instruction set, peer rates.

use super::bars::{INT8_AVX2_GROUPS, Int8Bars, int8_bars};
use super::*;

/// The bars of figures given here, on a CPU without VNNI flags.
fn held(
    isa: Isa,
    pk: Option<&peak::Peak>,
    rows: &[RowResult],
    comparisons: &[Comparison],
    peers: &[PeerResult],
) -> Vec<Bar> {
    bars(&Measured {
        isa,
        int8_only: false,
        cpu_flags: &[],
        peak: pk,
        rows,
        comparisons,
        peers,
    })
}

fn row(arm: &'static str, tokens: usize, median_s: f64, share: Option<f64>) -> RowResult {
    RowResult {
        arm,
        tokens,
        median_s,
        runs_s: vec![median_s],
        cpu_s: vec![],
        gflops_per_cpu: None,
        gflop: 1.0,
        gflops: 1.0 / median_s,
        peak_share: share,
        peak_rss_gib: Some(8.0),
        stages: Stages::default(),
        projection_gflop: 0.9,
    }
}

/// A row whose forward spent `outside` seconds outside its projections (in the GDN stage).
fn row_outside(arm: &'static str, tokens: usize, median_s: f64, outside: f64) -> RowResult {
    let mut r = row(arm, tokens, median_s, None);
    r.stages = Stages {
        projections_s: median_s - outside,
        gdn_s: outside,
        outside_projections_s: outside,
        ..Stages::default()
    };
    r
}

fn peer(name: &'static str, timings: &[(usize, f64)]) -> PeerResult {
    PeerResult {
        name,
        label: name.into(),
        threads: 2,
        peak_rss_gib: None,
        rows: timings
            .iter()
            .map(|&(tokens, s)| PeerRow {
                tokens,
                median_s: s,
                min_s: s,
                max_s: s,
                samples_s: vec![s],
                gflops: 1.0 / s,
                peak_share: None,
            })
            .collect(),
        raw: serde_json::Value::Null,
        peer: String::new(),
    }
}

#[test]
fn comparisons_pair_each_arm_with_its_peers_and_bars_follow() {
    let rows = vec![
        row("fp32", 94, 1.5, Some(0.85)),
        row("bf16", 94, 0.8, Some(0.83)),
        row("fp32", 1518, 24.0, Some(0.87)),
        row("bf16", 1518, 13.4, Some(0.60)),
    ];
    let peers = vec![
        peer("torch fp32", &[(94, 5.1), (1518, 60.4)]),
        peer("torch bf16", &[(94, 1.59), (1518, 19.7)]),
        // llama.cpp only timed the short row.
        peer("llama.cpp bf16", &[(94, 1.55)]),
    ];
    let c = compare(&rows, &peers);
    // 5 as before + fp32 vs llama.cpp bf16 at 94 (issue 13's pair).
    assert_eq!(c.len(), 6);
    let find = |arm: &str, p: &str, n: usize| {
        c.iter()
            .find(|c| c.arm == arm && c.peer == p && c.tokens == n)
            .and_then(|c| c.speedup)
    };
    assert_eq!(find("fp32", "torch fp32", 94), Some(5.1 / 1.5));
    assert_eq!(find("bf16", "torch bf16", 1518), Some(19.7 / 13.4));
    assert_eq!(find("bf16", "llama.cpp bf16", 1518), None);
    // AVX-512 BF16: issue 4's 5 ratios + the bf16 share of the BF16 peak at 1,518 + RSS (no AVX2 bar).
    let b = held(Isa::Avx512Bf16, None, &rows, &c, &[]);
    assert_eq!(b.len(), 7);
    let fp32_94 = &b[0];
    assert!(fp32_94.met && fp32_94.threshold == 2.0);
    // bf16 at 1518: 19.7 / 13.4 = 1.47 ≥ 1.2.
    assert!(
        b.iter()
            .any(|x| x.what.contains("bf16 vs torch bf16, 1518") && x.met)
    );
    assert!(!b.iter().any(|x| x.what.contains("fp32 vs llama.cpp")));
    // 60 % of the peak misses the 85 % bar.
    let share = b.iter().find(|x| x.what.contains("share")).unwrap();
    assert!(!share.met && share.value == 0.60 && share.threshold == 0.85);
    assert!(
        share.what.contains("BF16 peak, 1518 tokens"),
        "{}",
        share.what
    );
    let rss = b.last().unwrap();
    assert!(rss.met && (rss.value - 8.0 * GIB / 1e9).abs() < 1e-12);
}

#[test]
fn amx_holds_the_bf16_share_against_the_dot_peak() {
    // 1 GFLOP in 0.004 s = 250 GFLOP/s: 5 % of a 5,000 GFLOP/s tile peak (the row's share), but
    // 1.25× the 200 GFLOP/s `vdpbf16ps` peak the bar is stated against.
    let rows = vec![row("bf16", 1518, 0.004, Some(0.05))];
    let pk = peak::Peak {
        threads: 2,
        isa: "amx".into(),
        fp32_gflops: 400.0,
        bf16_gflops: Some(200.0),
        amx_bf16_gflops: Some(5000.0),
        amx_int8_gops: Some(10000.0),
        fp32_by_isa: vec![("avx512".into(), 400.0)],
        int8_gops: Some(10000.0),
        int8_by_chain: vec![],
    };
    let b = held(Isa::Amx, Some(&pk), &rows, &[], &[]);
    let share = b.iter().find(|x| x.what.contains("share")).unwrap();
    assert!(share.met && (share.value - 1.25).abs() < 1e-12, "{share:?}");
    // Without the dot peak (no measurement), the row's own share is held.
    let b = held(Isa::Amx, None, &rows, &[], &[]);
    let share = b.iter().find(|x| x.what.contains("share")).unwrap();
    assert!(!share.met && share.value == 0.05);
    // The table's share of a bf16 row on AMX is over the tile peak.
    assert_eq!(share_of_peak(Some(&pk), true, 500.0), Some(0.1));
    assert_eq!(share_of_peak(Some(&pk), false, 200.0), Some(0.5));
}

#[test]
fn avx2_runs_are_held_to_the_avx2_bars() {
    let rows = vec![
        row("fp32", 94, 1.5, Some(0.85)),
        row("fp32", 1518, 24.0, Some(0.75)),
        row("fp32", 8192, 200.0, Some(0.55)),
        row("bf16", 8192, 150.0, Some(0.40)),
    ];
    let peers = vec![
        peer("torch fp32", &[(94, 2.4), (1518, 60.0)]),
        peer("llama.cpp bf16", &[(94, 2.0)]),
        // F16 faster than 1.5× us at 1,518 only: the fastest 16-bit run decides there.
        peer("llama.cpp f16", &[(1518, 30.0)]),
    ];
    let c = compare(&rows, &peers);
    let b = held(Isa::Avx2, None, &rows, &c, &[]);
    // No AVX-512 bar: nothing asks for 2× torch.
    assert!(b.iter().all(|x| x.threshold != 2.0), "{b:?}");
    let get = |what: &str| b.iter().find(|x| x.what.contains(what)).unwrap();
    // 2.4 / 1.5 = 1.6 ≥ 1.5; 60 / 24 = 2.5.
    assert!(get("fp32 vs torch fp32, 94").met && get("fp32 vs torch fp32, 94").threshold == 1.5);
    // 2.0 / 1.5 = 1.33 < 1.5.
    assert!(!get("fp32 vs llama.cpp bf16, 94").met);
    // 30 / 24 = 1.25 < 1.5.
    assert!(!get("fp32 vs llama.cpp f16, 1518").met);
    let share = get("share of the measured avx2 f32 FMA peak, 1518 tokens");
    assert!(share.what.contains("avx2 f32 FMA peak") && share.threshold == 0.80 && !share.met);
    // The long row: fp32 (the AVX2 arm) at ≥ 50 %; the bf16 arm is not held to it here.
    let long = get("share of the measured avx2 f32 FMA peak, 8192 tokens");
    assert!(long.met && long.threshold == 0.50 && long.what.starts_with("fp32"));
    assert_eq!(b.iter().filter(|x| x.what.contains("8192")).count(), 1);
    // 4 ratios (torch at 94 and 1,518, llama.cpp bf16 at 94, f16 at 1,518) + share at 1,518 + long row
    // + RSS.
    assert_eq!(b.len(), 7, "{b:?}");
    // AVX-512 BF16 holds the long row to the bf16 arm instead.
    let b = held(Isa::Avx512Bf16, None, &rows, &c, &[]);
    let long = b.iter().find(|x| x.what.contains("8192")).unwrap();
    assert!(long.what.starts_with("bf16") && !long.met);
    // The portable fallback has no stated speed bar: the long row and RSS only.
    let b = held(Isa::Portable, None, &rows, &[], &[]);
    assert_eq!(b.len(), 2, "{b:?}");
}

#[test]
fn peer_rates_use_our_flop_count() {
    let cfg = Qwen35Config::qwen35_4b();
    let pk = peak::Peak {
        threads: 2,
        isa: "avx512bf16".into(),
        fp32_gflops: 500.0,
        bf16_gflops: Some(1000.0),
        amx_bf16_gflops: None,
        amx_int8_gops: None,
        fp32_by_isa: vec![("avx2".into(), 250.0), ("avx512".into(), 500.0)],
        int8_gops: None,
        int8_by_chain: vec![],
    };
    let run = BackboneRun {
        peer: peers::Peer::TorchBackbone,
        label: "torch 2.15.0 bfloat16".into(),
        threads: 2,
        peak_rss_bytes: Some(1 << 30),
        timings: vec![peers::Timing {
            tokens: 94,
            median_s: 2.0,
            min_s: 1.9,
            max_s: 2.1,
            samples_s: vec![1.9, 2.0, 2.1],
        }],
        raw: serde_json::Value::Null,
    };
    let p = peer_result("torch bf16", run, &cfg, Some(&pk));
    let want = cfg.prefill_flops(94) / 1e9 / 2.0;
    assert!((p.rows[0].gflops - want).abs() < 1e-9);
    assert_eq!(p.rows[0].peak_share, Some(want / 1000.0));
    assert_eq!(p.peak_rss_gib, Some(1.0));
    // An fp32 peer is measured against the fp32 peak.
    assert_eq!(share_of_peak(Some(&pk), false, 250.0), Some(0.5));
    assert_eq!(share_of_peak(None, true, 250.0), None);
}

/// The 4B figures of issue 29 (2-core Zen 3, AVX2), seconds at 94 / 380 / 1,518 tokens, with ik_llama.cpp's
/// runs of the same issue beside them.
fn issue29_peers() -> Vec<PeerResult> {
    vec![
        peer("llama.cpp bf16", &[(94, 7.15), (380, 30.75), (1518, 116.7)]),
        peer("llama.cpp f16", &[(94, 5.04), (380, 22.30), (1518, 84.00)]),
        peer("llama.cpp q8_0", &[(94, 7.17), (380, 32.33), (1518, 164.4)]),
        peer("ik_llama.cpp q8_0", &[(94, 4.1), (380, 17.4), (1518, 79.6)]),
        peer(
            "ik_llama.cpp q4_k_m",
            &[(94, 3.56), (380, 14.14), (1518, 63.43)],
        ),
        // Timed at 94 only: the other lengths fall to the group's other runs.
        peer("ik_llama.cpp f16", &[(94, 3.0)]),
    ]
}

#[test]
fn int8_on_avx2_is_held_to_each_familys_fastest_run() {
    let rows = vec![
        row("int8", 94, 4.38, None),
        row("int8", 380, 17.61, None),
        row("int8", 1518, 30.0, None),
        row("fp32", 94, 5.50, Some(0.64)),
    ];
    let peers = issue29_peers();
    let c = compare(&rows, &peers);
    // Every int8 pair is compared (6 peers × 3 lengths, ik f16 at 94 only = 16).
    assert_eq!(c.iter().filter(|c| c.arm == "int8").count(), 16);
    let b = held(Isa::Avx2, None, &rows, &c, &peers);
    let int8: Vec<&Bar> = b.iter().filter(|x| x.what.starts_with("int8 vs")).collect();
    // Two families × three lengths.
    assert_eq!(int8.len(), 6, "{int8:?}");
    let get = |family: &str, n: usize| {
        *int8
            .iter()
            .find(|x| {
                x.what.contains(family) && x.what.ends_with(&format!(", {n} tokens (× faster)"))
            })
            .unwrap()
    };
    // llama.cpp's fastest at 94 is its F16 (5.04 s): 5.04 / 4.38 = 1.15 < 1.7.
    let l94 = get("llama.cpp's fastest", 94);
    assert!(!l94.met && l94.threshold == 1.7, "{l94:?}");
    assert!((l94.value - 5.04 / 4.38).abs() < 1e-12);
    assert!(
        l94.what.contains("(llama.cpp f16 5.040 s, int8 4.380 s)"),
        "{}",
        l94.what
    );
    // At 1,518 int8 takes 30 s: 84 / 30 = 2.8 ≥ 1.7.
    assert!(get("llama.cpp's fastest", 1518).met);
    // ik_llama.cpp's fastest at 94 is the F16 run (3.0 s), at 380 its Q4_K_M (14.14 s).
    let ik94 = get("ik_llama.cpp's fastest", 94);
    assert!(ik94.what.contains("ik_llama.cpp f16 3.000 s") && !ik94.met && ik94.threshold == 1.0);
    let ik380 = get("ik_llama.cpp's fastest", 380);
    assert!(
        ik380.what.contains("ik_llama.cpp q4_k_m 14.14 s"),
        "{}",
        ik380.what
    );
    assert!((ik380.value - 14.14 / 17.61).abs() < 1e-12 && !ik380.met);
    // 63.43 / 30 ≥ 1.0.
    assert!(get("ik_llama.cpp's fastest", 1518).met);
    // The fp32 bars still hold on AVX2; no int8 bar without an int8 row.
    assert!(
        b.iter()
            .any(|x| x.what.starts_with("fp32 vs llama.cpp f16, 94"))
    );
    let fp32_only: Vec<RowResult> = vec![row("fp32", 94, 5.50, None)];
    let b = held(Isa::Avx2, None, &fp32_only, &[], &peers);
    assert!(!b.iter().any(|x| x.what.starts_with("int8")), "{b:?}");
    // No peer of a family timed: no bar for that family.
    let only_ik = vec![peer("ik_llama.cpp q4_k_m", &[(94, 3.56)])];
    let b = held(Isa::Avx2, None, &rows, &[], &only_ik);
    let names: Vec<&str> = b.iter().map(|x| x.what.as_str()).collect();
    assert_eq!(
        names.iter().filter(|w| w.starts_with("int8 vs")).count(),
        1,
        "{names:?}"
    );
}

#[test]
fn the_int8_ceiling_bar_needs_a_measured_ceiling() {
    // 1 GFLOP in 0.004 s = 250 GOP/s over a 400 GOP/s ceiling: 62.5 % ≥ 60 %.
    let rows = vec![row("int8", 1518, 0.004, None), row("int8", 94, 0.001, None)];
    let mut pk = peak::Peak {
        threads: 2,
        isa: "avx2".into(),
        fp32_gflops: 200.0,
        bf16_gflops: None,
        amx_bf16_gflops: None,
        amx_int8_gops: None,
        fp32_by_isa: vec![("avx2".into(), 200.0)],
        int8_gops: Some(400.0),
        int8_by_chain: vec![],
    };
    let b = held(Isa::Avx2, Some(&pk), &rows, &[], &[]);
    let share = b
        .iter()
        .find(|x| x.what.contains("int8 ceiling"))
        .expect("the ceiling bar");
    assert!(share.met && (share.value - 0.625).abs() < 1e-12 && share.threshold == 0.60);
    assert!(share.what.contains("1518 tokens") && share.what.contains("400 GOP/s"));
    pk.int8_gops = Some(500.0);
    let b = held(Isa::Avx2, Some(&pk), &rows, &[], &[]);
    assert!(
        !b.iter()
            .find(|x| x.what.contains("int8 ceiling"))
            .unwrap()
            .met
    );
    // No ceiling measured: no bar (rather than a share of the f32 peak).
    let b = held(Isa::Avx2, None, &rows, &[], &[]);
    assert!(!b.iter().any(|x| x.what.contains("ceiling")), "{b:?}");
    // With the stages timed, the projections' own rate: 0.9 GFLOP in 0.0025 s = 360 GOP/s of 500: 72 %
    // (the forward's rate, 250, would not have met it).
    let timed = vec![row_outside("int8", 1518, 0.004, 0.0015)];
    let b = held(Isa::Avx2, Some(&pk), &timed, &[], &[]);
    let share = b.iter().find(|x| x.what.contains("ceiling")).unwrap();
    assert!(
        share.what.starts_with("int8 projections' share"),
        "{}",
        share.what
    );
    assert!(share.met && (share.value - 0.72).abs() < 1e-9, "{share:?}");
}

#[test]
fn the_int8_forward_is_held_to_a_fifth_of_its_time_outside_the_projections_on_avx2() {
    let outside = |rows: &[RowResult], isa| {
        held(isa, None, rows, &[], &[])
            .into_iter()
            .filter(|x| x.what.contains("outside the projections"))
            .collect::<Vec<_>>()
    };
    // 5.5 s of 30 s outside at 1,518 tokens: 18 % ≤ 20 %.
    let rows = vec![
        row_outside("int8", 94, 2.0, 1.0),
        row_outside("int8", 1518, 30.0, 5.5),
    ];
    let b = outside(&rows, Isa::Avx2);
    assert_eq!(b.len(), 1, "one bar, at 1,518 tokens: {b:?}");
    assert!(b[0].met && (b[0].value - 5.5 / 30.0).abs() < 1e-12 && b[0].threshold == 0.20);
    assert!(b[0].what.contains("5.500 s of 30.00 s"), "{}", b[0].what);
    let rows = vec![row_outside("int8", 1518, 30.0, 6.5)];
    assert!(!outside(&rows, Isa::Avx2)[0].met);
    // No stages timed (figures from before the stage clock): no bar. Not on dot-product kernels.
    assert!(outside(&[row("int8", 1518, 30.0, None)], Isa::Avx2).is_empty());
    assert!(outside(&rows, Isa::Amx).is_empty());
}

#[test]
fn int8_on_dot_products_is_held_to_our_best_float_arm() {
    let rows = vec![
        row("fp32", 94, 1.0, None),
        row("bf16", 94, 0.5, None),
        row("int8", 94, 0.3, None),
        row("fp32", 1518, 20.0, None),
        row("int8", 1518, 14.0, None),
    ];
    let b = held(Isa::Amx, None, &rows, &[], &issue29_peers());
    let int8: Vec<&Bar> = b.iter().filter(|x| x.what.starts_with("int8")).collect();
    assert_eq!(int8.len(), 2, "{int8:?}");
    // bf16 is the faster float arm at 94: 0.5 / 0.3 = 1.67 ≥ 1.5.
    assert!(
        int8[0]
            .what
            .contains("(bf16 0.500 s, int8 0.300 s), 94 tokens")
    );
    assert!(int8[0].met && int8[0].threshold == 1.5);
    // fp32 alone at 1,518: 20 / 14 = 1.43 < 1.5.
    assert!(int8[1].what.contains("fp32 20.00 s") && !int8[1].met);
    assert!(
        !int8[1].what.contains("free"),
        "no stages timed: no ceiling"
    );
    // With the stages timed the bar says what free int8 projections would reach: 20 s / 16 s outside = 1.25×.
    let timed = vec![
        row("fp32", 1518, 20.0, None),
        row_outside("int8", 1518, 18.0, 16.0),
    ];
    let b = held(Isa::Amx, None, &timed, &[], &[]);
    let w = &b
        .iter()
        .find(|x| x.what.starts_with("int8 vs"))
        .unwrap()
        .what;
    assert!(
        w.contains("(fp32 20.00 s, int8 18.00 s; 1.25× with free int8 projections)"),
        "{w}"
    );
    // Which bars an ISA gets: AVX-512 needs the VNNI flag; a CPU capped to AVX2 is held to the peers.
    let vnni = vec!["avx512f".to_string(), "avx512_vnni".to_string()];
    assert_eq!(int8_bars(Isa::Avx2, &vnni), Int8Bars::Peers);
    assert_eq!(int8_bars(Isa::Avx512Bf16, &vnni), Int8Bars::DotProducts);
    assert_eq!(int8_bars(Isa::Avx512, &vnni), Int8Bars::DotProducts);
    assert_eq!(int8_bars(Isa::Avx512, &vnni[..1]), Int8Bars::None);
    assert_eq!(int8_bars(Isa::Amx, &[]), Int8Bars::DotProducts);
    assert_eq!(int8_bars(Isa::Portable, &vnni), Int8Bars::None);
    assert_eq!(int8_bars(Isa::Neon, &[]), Int8Bars::None);
    assert_eq!(int8_bars(Isa::NeonI8mm, &[]), Int8Bars::None);
    let b = bars(&Measured {
        isa: Isa::Avx512,
        int8_only: false,
        cpu_flags: &vnni,
        peak: None,
        rows: &rows,
        comparisons: &[],
        peers: &[],
    });
    assert_eq!(
        b.iter()
            .filter(|x| x.what.starts_with("int8 vs kev's"))
            .count(),
        2
    );
}

#[test]
fn peers_choose_their_llama_runs() {
    let all = llama_runs(PeerChoice::of(&[PeerName::All]));
    let names: Vec<&str> = all.iter().map(|r| r.2).collect();
    assert_eq!(
        names,
        [
            "llama.cpp bf16",
            "llama.cpp f16",
            "llama.cpp q8_0",
            "ik_llama.cpp f16",
            "ik_llama.cpp q8_0",
            "ik_llama.cpp q4_k_m"
        ]
    );
    // Each name is "<fork> <outtype>": the label's form, and what the bars look up.
    for (fork, quant, name) in &all {
        assert_eq!(*name, format!("{} {}", fork.peer(), quant.outtype()));
        assert!(PAIRS.contains(&("int8", *name)), "{name}");
    }
    let grouped: Vec<&str> = INT8_AVX2_GROUPS
        .iter()
        .flat_map(|g| g.peers.iter().copied())
        .collect();
    assert_eq!(grouped, names);
    let ik = llama_runs(PeerChoice::of(&[PeerName::IkLlama]));
    assert_eq!(
        ik.iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        [
            (Fork::Ik, Quant::F16),
            (Fork::Ik, Quant::Q8_0),
            (Fork::Ik, Quant::Q4KM)
        ]
    );
    assert!(llama_runs(PeerChoice::of(&[PeerName::Torch])).is_empty());
    assert_eq!(
        llama_runs(PeerChoice::of(&[PeerName::LlamaQ8, PeerName::Llama]))
            .iter()
            .map(|r| r.2)
            .collect::<Vec<_>>(),
        ["llama.cpp bf16", "llama.cpp q8_0"]
    );
}

/// With the int8 arm alone (loaded as `kev serve --precision int8` loads it) the memory bar is issue 29's
/// 5 GiB for what that arm holds, not the 11 GB of a process holding BF16 weights.
#[test]
fn the_int8_arm_alone_is_held_to_its_own_memory_bar() {
    let mut rows = vec![row("int8", 94, 1.0, None)];
    let bar = |rows: &[RowResult], int8_only: bool| {
        bars(&Measured {
            isa: Isa::Avx2,
            int8_only,
            cpu_flags: &[],
            peak: None,
            rows,
            comparisons: &[],
            peers: &[],
        })
        .into_iter()
        .find(|b| b.what.contains("peak RSS"))
        .unwrap()
    };
    let b = bar(&rows, true);
    assert_eq!(b.what, "peak RSS of the int8 arm alone (GiB)");
    assert!(!b.met && b.value == 8.0 && b.threshold == 5.0);
    rows[0].peak_rss_gib = Some(3.8);
    assert!(bar(&rows, true).met);
    // Beside float arms, the int8 rows (both weight forms held) are not the BF16 bar's.
    let mut fp32 = row("fp32", 94, 2.0, None);
    fp32.peak_rss_gib = Some(7.0);
    rows[0].peak_rss_gib = Some(10.5);
    rows.push(fp32);
    let b = bar(&rows, false);
    assert!(b.what.contains("BF16 weights") && b.met, "{b:?}");
    assert!((b.value - 7.0 * GIB / 1e9).abs() < 1e-12);
}
