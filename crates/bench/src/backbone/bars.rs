//! The bars a `kev bench backbone` run is held to: those of the instruction set the kernels run (`isa_bars`:
//! issue 4's on AVX-512, issue 13's on AVX2), issue 29's int8 bars (`int8_bars`: against llama.cpp and
//! ik_llama.cpp on AVX2, against our own float arms on int8 dot-product kernels), the long row and the RSS bar.
//! Everything here is arithmetic on figures already measured, so the unit tests give the figures.

use kev_engine::kernels::Isa;
use kev_kernels::peak;

use super::{PeerResult, RowResult, int8_ceiling};
use crate::{Bar, GIB, secs, times};

/// The bars of one instruction set (the one the kernels run): speed-ups over peers at every length timed,
/// and a share of the ISA's measured peak at [`PEAK_BAR_TOKENS`].
pub(super) struct IsaBars {
    /// (our arm, peer, at least this many times faster).
    pub(super) ratios: &'static [(&'static str, &'static str, f64)],
    /// (our arm, share of its peak): the BF16 dot peak for bf16 with AVX512_BF16, else the f32 FMA peak of
    /// the ISA.
    pub(super) peak: Option<(&'static str, f64)>,
    /// Where the bars are stated.
    pub(super) source: &'static str,
}

/// Issue 4's bars on AVX-512 (written for an AVX512_BF16 machine) with issue 13's "no regression" share,
/// issue 13's on AVX2 with issue 29's 80 % fp32 share; none are stated for NEON or the portable fallback (the
/// long row and RSS still apply). Issue 29's int8 bars come from [`int8_bars`].
pub(super) fn isa_bars(isa: Isa) -> IsaBars {
    match isa {
        // On AMX the bf16 arm runs on tiles; the AVX512_BF16 share is still held against the dot-product
        // peak (the figure the bar was written for), so it reads as "no slower than 85 % of the best
        // `vdpbf16ps` could do"; the table's share column is over the tiles' own peak.
        Isa::Avx512Bf16 | Isa::Amx => IsaBars {
            ratios: &[
                ("fp32", "torch fp32", 2.0),
                ("bf16", "torch bf16", 1.2),
                ("bf16", "llama.cpp bf16", 1.5),
            ],
            peak: Some(("bf16", 0.85)),
            source: "issue 4; issue 13's AVX-512 BF16 share; issue 29's int8 bar",
        },
        Isa::Avx512 => IsaBars {
            ratios: &[("fp32", "torch fp32", 2.0)],
            peak: None,
            source: "issue 4; issue 29's int8 bar where the CPU has AVX512_VNNI",
        },
        Isa::Avx2 | Isa::AvxVnni => IsaBars {
            // Held against both of llama.cpp's 16-bit runs that were timed: that is holding against the
            // faster of them, the bar's "fastest same-precision-class run".
            ratios: &[
                ("fp32", "torch fp32", 1.5),
                ("fp32", "llama.cpp bf16", 1.5),
                ("fp32", "llama.cpp f16", 1.5),
            ],
            // Issue 13 asked 70 %; issue 29 raises it to 80 %.
            peak: Some(("fp32", 0.80)),
            source: "issue 13's AVX2 bars; issue 29's int8 bars and 80 % fp32 share",
        },
        Isa::Neon | Isa::NeonI8mm | Isa::Portable => IsaBars {
            ratios: &[],
            peak: None,
            source: "no speed bar stated for this instruction set",
        },
    }
}

/// The row length the peak-share bars are stated at (issues 13 and 29).
pub(super) const PEAK_BAR_TOKENS: usize = 1518;
/// Rows at least this long are held to [`LONG_ROW_BAR`] (issue 13: attention included).
const LONG_ROW_TOKENS: usize = 8192;
/// Share of the ISA's peak a long row of its main arm must reach.
const LONG_ROW_BAR: f64 = 0.50;
/// Peak RSS bar with BF16 weights, bytes (issue 4: 11 GB).
const RSS_BAR_BYTES: f64 = 11e9;
/// Peak RSS bar of the int8 arm alone, GiB (issue 29: the 4B serves on an 8 GB laptop).
const INT8_RSS_BAR_GIB: f64 = 5.0;

/// The arm an ISA is measured by: bf16 with BF16 dot products, fp32 elsewhere.
fn main_arm(isa: Isa) -> &'static str {
    if matches!(isa, Isa::Avx512Bf16 | Isa::Amx) {
        "bf16"
    } else {
        "fp32"
    }
}

/// A group of peers the int8 arm is held against by its fastest run at each length.
pub(super) struct PeerGroup {
    /// For the bar's line.
    pub(super) what: &'static str,
    /// The bench's peer names (`PeerResult::name`) in the group.
    pub(super) peers: &'static [&'static str],
    /// At least this many times faster than the group's fastest run.
    pub(super) need: f64,
}

/// Issue 29 on AVX2: kev int8 ≥ 1.7× llama.cpp's fastest 16-bit or 8-bit run and ≥ 1.0× ik_llama.cpp's fastest
/// run of any quantisation (Q4_K_M included, though 4-bit weights are outside Kev's fidelity bar).
pub(super) const INT8_AVX2_GROUPS: [PeerGroup; 2] = [
    PeerGroup {
        what: "llama.cpp's fastest F16/BF16/Q8_0 run",
        peers: &["llama.cpp bf16", "llama.cpp f16", "llama.cpp q8_0"],
        need: 1.7,
    },
    PeerGroup {
        what: "ik_llama.cpp's fastest run",
        peers: &[
            "ik_llama.cpp f16",
            "ik_llama.cpp q8_0",
            "ik_llama.cpp q4_k_m",
        ],
        need: 1.0,
    },
];
/// Issue 29 on int8 dot-product kernels (VNNI, AMX): int8 at least this many times our best float arm.
const INT8_VS_FLOAT: f64 = 1.5;
/// Issue 29 on AVX2: the int8 GEMM at least this share of the int8 ceiling `kernels::peak` measures.
const INT8_CEILING_SHARE: f64 = 0.60;
/// Issue 29 on AVX2: at most this share of the int8 forward's time outside its GEMMs, at
/// [`PEAK_BAR_TOKENS`].
const INT8_OUTSIDE_SHARE: f64 = 0.20;

/// Which of issue 29's int8 bars a run is held to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Int8Bars {
    /// AVX2 (`vpmaddubsw`/`vpmaddwd` chains): against the llama.cpp and ik_llama.cpp groups, and the share of
    /// the int8 ceiling.
    Peers,
    /// Integer dot products (AVX512_VNNI, AVX-VNNI, AMX): against our own best float arm.
    DotProducts,
    /// No int8 bar stated (the portable fallback, NEON, AVX-512 without VNNI).
    None,
}

/// The int8 bars of the kernels' instruction set; `cpu_flags` are `/proc/cpuinfo`'s (VNNI is not an ISA level
/// of its own below AVX512_BF16).
pub(super) fn int8_bars(isa: Isa, cpu_flags: &[String]) -> Int8Bars {
    let vnni = cpu_flags.iter().any(|f| f == "avx512_vnni");
    match isa {
        Isa::Avx2 => Int8Bars::Peers,
        Isa::Amx | Isa::AvxVnni => Int8Bars::DotProducts,
        Isa::Avx512 | Isa::Avx512Bf16 if vnni => Int8Bars::DotProducts,
        _ => Int8Bars::None,
    }
}

/// The fastest run of `group` at `tokens` tokens: (peer name, median seconds).
fn fastest<'a>(
    group: &PeerGroup,
    peers: &'a [PeerResult],
    tokens: usize,
) -> Option<(&'a str, f64)> {
    peers
        .iter()
        .filter(|p| group.peers.contains(&p.name))
        .filter_map(|p| {
            p.rows
                .iter()
                .find(|r| r.tokens == tokens && r.median_s.is_finite() && r.median_s > 0.0)
                .map(|r| (p.name, r.median_s))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Issue 29's int8 bars for the figures of one run.
fn int8_bar_list(
    which: Int8Bars,
    pk: Option<&peak::Peak>,
    rows: &[RowResult],
    peers: &[PeerResult],
) -> Vec<Bar> {
    let mut out = Vec::new();
    let int8_rows = || rows.iter().filter(|r| r.arm == "int8");
    match which {
        Int8Bars::Peers => {
            for group in &INT8_AVX2_GROUPS {
                for r in int8_rows() {
                    if let Some((name, s)) = fastest(group, peers, r.tokens) {
                        out.push(Bar::at_least(
                            format!(
                                "int8 vs {} ({name} {} s, int8 {} s), {} tokens (× faster)",
                                group.what,
                                secs(s),
                                secs(r.median_s),
                                r.tokens
                            ),
                            s / r.median_s,
                            group.need,
                        ));
                    }
                }
            }
            // With the stages timed, the projections' own rate (their GEMMs with the fused quantisation and
            // the dequantisation: still a little under the GEMMs' share). Without, the forward's rate: every
            // FLOP of the row over the whole time, at most the GEMM's share, so meeting the bar with it is
            // meeting it.
            if let Some(ceiling) = int8_ceiling(pk)
                && let Some(r) = int8_rows().find(|r| r.tokens == PEAK_BAR_TOKENS)
            {
                let (rate, what) = match r.projection_gflops() {
                    Some(g) => (g, "int8 projections' share"),
                    None => (r.gflops, "int8 forward share"),
                };
                out.push(Bar::at_least(
                    format!(
                        "{what} of the measured int8 ceiling ({ceiling:.0} GOP/s), \
                         {PEAK_BAR_TOKENS} tokens (a lower bound of the GEMM's share)"
                    ),
                    rate / ceiling,
                    INT8_CEILING_SHARE,
                ));
            }
            // The projections' stage holds the GEMMs with the quantisation fused into their packing and
            // the dequantisation of their outputs; everything else is the "not GEMM".
            if let Some(r) = int8_rows().find(|r| r.tokens == PEAK_BAR_TOKENS)
                && r.stages.total_s() > 0.0
            {
                out.push(Bar::at_most(
                    format!(
                        "int8 forward's time outside the projections (GDN, attention, norms, the rest: {} s \
                         of {} s), {PEAK_BAR_TOKENS} tokens (share)",
                        secs(r.stages.outside_projections_s),
                        secs(r.stages.total_s())
                    ),
                    r.stages.outside_projections_s / r.stages.total_s(),
                    INT8_OUTSIDE_SHARE,
                ));
            }
        }
        Int8Bars::DotProducts => {
            for r in int8_rows() {
                let best_float = rows
                    .iter()
                    .filter(|f| f.tokens == r.tokens && (f.arm == "fp32" || f.arm == "bf16"))
                    .filter(|f| f.median_s.is_finite() && f.median_s > 0.0)
                    .min_by(|a, b| a.median_s.total_cmp(&b.median_s));
                if let Some(f) = best_float {
                    // What no int8 GEMM can pass: the float arm's time over the int8 forward's time outside
                    // its projections (f32 in every arm), as if the int8 projections took none.
                    let ceiling = match r.stages.outside_projections_s {
                        o if o > 0.0 => {
                            format!(
                                "; {} with free int8 projections",
                                times(Some(f.median_s / o))
                            )
                        }
                        _ => String::new(),
                    };
                    out.push(Bar::at_least(
                        format!(
                            "int8 vs kev's best float arm ({} {} s, int8 {} s{ceiling}), {} tokens (× faster)",
                            f.arm,
                            secs(f.median_s),
                            secs(r.median_s),
                            r.tokens
                        ),
                        f.median_s / r.median_s,
                        INT8_VS_FLOAT,
                    ));
                }
            }
        }
        Int8Bars::None => {}
    }
    out
}

/// The figures a run's bars are computed from.
pub(super) struct Measured<'a> {
    pub(super) isa: Isa,
    /// The model was loaded for the int8 arm alone (no BF16 projections held).
    pub(super) int8_only: bool,
    /// `/proc/cpuinfo`'s vector flags.
    pub(super) cpu_flags: &'a [String],
    pub(super) peak: Option<&'a peak::Peak>,
    pub(super) rows: &'a [RowResult],
    pub(super) comparisons: &'a [super::Comparison],
    pub(super) peers: &'a [PeerResult],
}

/// The bars of the instruction set in force that this run measured.
pub(super) fn bars(m: &Measured<'_>) -> Vec<Bar> {
    let (isa, pk, rows) = (m.isa, m.peak, m.rows);
    let held = isa_bars(isa);
    let mut out = Vec::new();
    for &(arm, peer, need) in held.ratios {
        for c in m
            .comparisons
            .iter()
            .filter(|c| c.arm == arm && c.peer == peer)
        {
            if let Some(s) = c.speedup {
                out.push(Bar::at_least(
                    format!("{arm} vs {peer}, {} tokens (× faster)", c.tokens),
                    s,
                    need,
                ));
            }
        }
    }
    let peak_name = |arm: &str| {
        if arm == "bf16" && matches!(isa, Isa::Avx512Bf16 | Isa::Amx) {
            "the measured BF16 peak".to_string()
        } else {
            format!("the measured {} f32 FMA peak", isa.name())
        }
    };
    // The share a bar holds: on AMX the bf16 arm's rate over the BF16 dot-product peak, elsewhere the
    // row's own share.
    let held_share = |r: &RowResult| match (isa, r.arm, pk.and_then(|p| p.bf16_gflops)) {
        (Isa::Amx, "bf16", Some(dot)) => Some(r.gflops / dot),
        _ => r.peak_share,
    };
    if let Some((arm, need)) = held.peak
        && let Some(share) = rows
            .iter()
            .find(|r| r.arm == arm && r.tokens == PEAK_BAR_TOKENS)
            .and_then(held_share)
    {
        out.push(Bar::at_least(
            format!(
                "{arm} share of {}, {PEAK_BAR_TOKENS} tokens",
                peak_name(arm)
            ),
            share,
            need,
        ));
    }
    out.extend(int8_bar_list(
        int8_bars(isa, m.cpu_flags),
        pk,
        rows,
        m.peers,
    ));
    let arm = main_arm(isa);
    for r in rows
        .iter()
        .filter(|r| r.arm == arm && r.tokens >= LONG_ROW_TOKENS)
    {
        if let Some(share) = held_share(r) {
            out.push(Bar::at_least(
                format!("{arm} share of {}, {} tokens", peak_name(arm), r.tokens),
                share,
                LONG_ROW_BAR,
            ));
        }
    }
    // Int8 rows beside float ones hold both weight forms: the BF16 bar is the float rows'.
    if let Some(rss) = rows
        .iter()
        .filter(|r| m.int8_only || r.arm != "int8")
        .filter_map(|r| r.peak_rss_gib)
        .max_by(f64::total_cmp)
    {
        out.push(if m.int8_only {
            Bar::at_most(
                "peak RSS of the int8 arm alone (GiB)",
                rss,
                INT8_RSS_BAR_GIB,
            )
        } else {
            Bar::at_most(
                "peak RSS with BF16 weights (GB)",
                rss * GIB / 1e9,
                RSS_BAR_BYTES / 1e9,
            )
        });
    }
    out
}
