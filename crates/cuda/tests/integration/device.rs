//! The kernels against plain Rust transcriptions of the same arithmetic (qwen35-arch §3–§7).
//!
//! Two tiers, each saying on stderr when it is skipped and why:
//! - NVRTC (no GPU needed): every kernel compiles for sm_90 and sm_80 and is in the PTX;
//! - a device (an NVIDIA driver and GPU): each kernel runs on random inputs and matches the Rust version
//!   within fp32 rounding, and a rerun is bit-equal. On a GPU machine without Rust, build the test binary here
//!   (`cargo test -p kev-cuda --release --no-run`), carry it, and run it there.

use crate::common;

use common::device;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use kev_cuda::{CudaError, Device, KERNELS, compile, libraries};

/// A splitmix64 stream of floats in [-1, 1).
fn randoms(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn max_rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs() / scale)
        .fold(0.0, f32::max)
}

fn cfg(grid: u32, block: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: shared,
    }
}

fn up(d: &Device, x: &[f32]) -> CudaSlice<f32> {
    d.stream().clone_htod(x).unwrap()
}

fn down(d: &Device, x: &CudaSlice<f32>) -> Vec<f32> {
    d.stream().clone_dtoh(x).unwrap()
}

#[test]
fn kernels_compile_for_hopper_and_ampere() {
    if !libraries().nvrtc {
        assert!(!common::required(), "{}", CudaError::NoNvrtc);
        eprintln!("skipped: {}", CudaError::NoNvrtc);
        return;
    }
    for arch in ["sm_90", "sm_80"] {
        let ptx = compile(arch).unwrap_or_else(|e| panic!("{e}"));
        let src = ptx.to_src();
        assert!(src.contains(&format!(".target {arch}")), "{arch}");
        for k in KERNELS {
            assert!(
                src.contains(&format!(".entry {k}(")),
                "{k} missing from the {arch} PTX"
            );
        }
    }
}

#[test]
fn without_a_driver_the_error_says_what_to_do() {
    if libraries().driver {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let e = Device::open(0).unwrap_err();
    assert!(matches!(e, CudaError::NoDriver), "{e:?}");
    assert!(e.to_string().contains("--device cpu"));
}

fn rms_norm_ref(x: &[f32], w: &[f32], dim: usize, one_plus: bool) -> Vec<f32> {
    x.chunks(dim)
        .flat_map(|r| {
            let ss: f32 = r.iter().map(|v| v * v).sum();
            let inv = 1.0 / (ss / dim as f32 + 1e-6).sqrt();
            r.iter()
                .zip(w)
                .map(move |(v, w)| v * inv * if one_plus { 1.0 + w } else { *w })
        })
        .collect()
}

#[test]
fn rms_norm_matches_and_reruns_bit_equal() {
    let Some(d) = device() else { return };
    let (rows, dim) = (7usize, 2560usize);
    let x = randoms(rows * dim, 1);
    let w = randoms(dim, 2);
    let f = d.function("rms_norm").unwrap();
    for one_plus in [1i32, 0] {
        let (xd, wd) = (up(&d, &x), up(&d, &w));
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut yd = d.stream().alloc_zeros::<f32>(rows * dim).unwrap();
            let (dim_i, stride, eps) = (dim as i32, dim as i64, 1e-6f32);
            let mut b = d.stream().launch_builder(&f);
            b.arg(&xd)
                .arg(&wd)
                .arg(&mut yd)
                .arg(&dim_i)
                .arg(&stride)
                .arg(&eps)
                .arg(&one_plus);
            unsafe { b.launch(cfg(rows as u32, 256, 0)) }.unwrap();
            runs.push(down(&d, &yd));
        }
        let want = rms_norm_ref(&x, &w, dim, one_plus == 1);
        assert!(max_rel(&runs[0], &want) < 1e-5);
        assert_eq!(runs[0], runs[1]);
    }
}

#[test]
fn conv_silu_carries_three_rows() {
    let Some(d) = device() else { return };
    let c = 8192usize;
    let taps = randoms(c * 4, 3);
    for t in [1usize, 2, 3, 9] {
        let qkv = randoms(t * c, 4 + t as u64);
        let hist = randoms(3 * c, 5);
        let (qd, hd, td) = (up(&d, &qkv), up(&d, &hist), up(&d, &taps));
        let mut od = d.stream().alloc_zeros::<f32>(t * c).unwrap();
        let mut hod = d.stream().alloc_zeros::<f32>(3 * c).unwrap();
        let f = d.function("conv_silu").unwrap();
        let (ti, ci) = (t as i32, c as i32);
        let mut b = d.stream().launch_builder(&f);
        b.arg(&qd)
            .arg(&hd)
            .arg(&td)
            .arg(&mut od)
            .arg(&mut hod)
            .arg(&ti)
            .arg(&ci);
        let launch = LaunchConfig {
            grid_dim: (c.div_ceil(256) as u32, t as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(launch) }.unwrap();
        let all: Vec<f32> = hist.iter().chain(&qkv).copied().collect();
        let mut want = vec![0f32; t * c];
        for r in 0..t {
            for ch in 0..c {
                let acc: f32 = (0..4)
                    .map(|j| taps[ch * 4 + j] * all[(r + j) * c + ch])
                    .sum();
                want[r * c + ch] = acc / (1.0 + (-acc).exp());
            }
        }
        assert!(max_rel(&down(&d, &od), &want) < 1e-5, "T = {t}");
        assert_eq!(
            down(&d, &hod),
            all[all.len() - 3 * c..].to_vec(),
            "history, T = {t}"
        );
    }
}

/// One call's inputs to the delta rule: per token, `q`, `k` `[key_heads][128]`, `v` `[value_heads][128]`,
/// the log-decay `g` and write strength `beta` `[value_heads]`.
struct DeltaInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    t_len: usize,
    kh: usize,
    vh: usize,
}

/// The gated delta rule token by token (§4.6), state [v_heads][dk][dv].
fn gdn_ref(x: &DeltaInputs<'_>, state: &mut [f32]) -> Vec<f32> {
    const D: usize = 128;
    let DeltaInputs {
        q,
        k,
        v,
        g,
        beta,
        t_len,
        kh,
        vh,
    } = *x;
    let mut out = vec![0f32; t_len * vh * D];
    for t in 0..t_len {
        for h in 0..vh {
            let j = h / (vh / kh);
            let s = &mut state[h * D * D..(h + 1) * D * D];
            let kk = &k[(t * kh + j) * D..][..D];
            let qq = &q[(t * kh + j) * D..][..D];
            let alpha = g[t * vh + h].exp();
            for col in 0..D {
                let mut kv = 0f32;
                for a in 0..D {
                    s[a * D + col] *= alpha;
                    kv += s[a * D + col] * kk[a];
                }
                let u = beta[t * vh + h] * (v[(t * vh + h) * D + col] - kv);
                let mut o = 0f32;
                for a in 0..D {
                    s[a * D + col] += kk[a] * u;
                    o += s[a * D + col] * qq[a];
                }
                out[(t * vh + h) * D + col] = o;
            }
        }
    }
    out
}

#[test]
fn gdn_recurrence_matches_and_carries_state() {
    let Some(d) = device() else { return };
    let (t_len, kh, vh, dd) = (11usize, 16usize, 32usize, 128usize);
    let unit = |x: Vec<f32>, heads: usize| -> Vec<f32> {
        x.chunks(dd)
            .take(t_len * heads)
            .flat_map(|h| {
                let n = h.iter().map(|v| v * v).sum::<f32>().sqrt();
                h.iter().map(move |v| v / n).collect::<Vec<_>>()
            })
            .collect()
    };
    let q = unit(randoms(t_len * kh * dd, 6), kh);
    let k = unit(randoms(t_len * kh * dd, 7), kh);
    let v = randoms(t_len * vh * dd, 8);
    let g: Vec<f32> = randoms(t_len * vh, 9)
        .iter()
        .map(|x| -0.5 * (x + 1.0))
        .collect();
    let beta: Vec<f32> = randoms(t_len * vh, 10)
        .iter()
        .map(|x| 0.5 * (x + 1.0))
        .collect();
    let state0: Vec<f32> = randoms(vh * dd * dd, 11).iter().map(|x| 0.1 * x).collect();

    let mut want_state = state0.clone();
    let inputs = DeltaInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        t_len,
        kh,
        vh,
    };
    let want = gdn_ref(&inputs, &mut want_state);

    let f = d.function("gdn_recurrent").unwrap();
    let (qd, kd, vd, gd, bd) = (
        up(&d, &q),
        up(&d, &k),
        up(&d, &v),
        up(&d, &g),
        up(&d, &beta),
    );
    let mut sd = up(&d, &state0);
    let mut od = d.stream().alloc_zeros::<f32>(t_len * vh * dd).unwrap();
    let (ti, khi, vhi) = (t_len as i32, kh as i32, vh as i32);
    let (qs, ks, vs) = ((kh * dd) as i64, (kh * dd) as i64, (vh * dd) as i64);
    let mut b = d.stream().launch_builder(&f);
    b.arg(&qd)
        .arg(&kd)
        .arg(&vd)
        .arg(&gd)
        .arg(&bd)
        .arg(&mut sd)
        .arg(&mut od);
    b.arg(&ti).arg(&khi).arg(&vhi).arg(&qs).arg(&ks).arg(&vs);
    unsafe { b.launch(cfg(vh as u32, dd as u32, 0)) }.unwrap();
    assert!(max_rel(&down(&d, &od), &want) < 1e-5);
    assert!(max_rel(&down(&d, &sd), &want_state) < 1e-5);
}

#[test]
fn attention_matches_a_naive_causal_softmax() {
    let Some(d) = device() else { return };
    let (heads, kvh, dim, pos0, t_len) = (16usize, 4usize, 256usize, 70usize, 5usize);
    let len = pos0 + t_len;
    let q = randoms(t_len * heads * dim, 12);
    let kc = randoms(len * kvh * dim, 13);
    let vc = randoms(len * kvh * dim, 14);
    let scale = 1.0 / (dim as f32).sqrt();
    let mut want = vec![0f32; t_len * heads * dim];
    for t in 0..t_len {
        for h in 0..heads {
            let kh = h / (heads / kvh);
            let qr = &q[(t * heads + h) * dim..][..dim];
            let n = pos0 + t + 1;
            let s: Vec<f32> = (0..n)
                .map(|j| {
                    let kr = &kc[(j * kvh + kh) * dim..][..dim];
                    qr.iter().zip(kr).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f32 = e.iter().sum();
            for c in 0..dim {
                let acc: f32 = (0..n).map(|j| e[j] * vc[(j * kvh + kh) * dim + c]).sum();
                want[(t * heads + h) * dim + c] = acc / z;
            }
        }
    }
    let f = d.function("attention").unwrap();
    let (qd, kd, vd) = (up(&d, &q), up(&d, &kc), up(&d, &vc));
    let mut od = d.stream().alloc_zeros::<f32>(t_len * heads * dim).unwrap();
    let (hi, kvi, di, p0) = (heads as i32, kvh as i32, dim as i32, pos0 as i64);
    let mut b = d.stream().launch_builder(&f);
    b.arg(&qd)
        .arg(&kd)
        .arg(&vd)
        .arg(&mut od)
        .arg(&hi)
        .arg(&kvi)
        .arg(&di)
        .arg(&p0)
        .arg(&scale);
    unsafe { b.launch(cfg((t_len * heads) as u32, 256, (len * 4) as u32)) }.unwrap();
    assert!(max_rel(&down(&d, &od), &want) < 1e-5);
}

#[test]
fn qk_norm_rope_rotates_the_first_64_dims() {
    let Some(d) = device() else { return };
    let (t_len, heads, dim, rot, pos0) = (3usize, 16usize, 256usize, 64usize, 41i64);
    // The q projection's layout: per head 256 query dims then 256 gate dims.
    let src = randoms(t_len * heads * 2 * dim, 15);
    let w = randoms(dim, 16);
    let theta = 1e7f64;
    let mut want = vec![0f32; t_len * heads * dim];
    for t in 0..t_len {
        for h in 0..heads {
            let x = &src[t * heads * 2 * dim + h * 2 * dim..][..dim];
            let n = rms_norm_ref(x, &w, dim, true);
            let half = rot / 2;
            for c in 0..dim {
                let y = if c < rot {
                    let i = c % half;
                    let angle = (pos0 as f64 + t as f64) * theta.powf(-2.0 * i as f64 / rot as f64);
                    let (sn, cs) = (angle.sin() as f32, angle.cos() as f32);
                    if c < half {
                        n[c] * cs - n[c + half] * sn
                    } else {
                        n[c] * cs + n[c - half] * sn
                    }
                } else {
                    n[c]
                };
                want[(t * heads + h) * dim + c] = y;
            }
        }
    }
    let f = d.function("qk_norm_rope").unwrap();
    let (sd, wd) = (up(&d, &src), up(&d, &w));
    let mut od = d.stream().alloc_zeros::<f32>(t_len * heads * dim).unwrap();
    let (ss, hs) = ((heads * 2 * dim) as i64, (2 * dim) as i64);
    let (hi, di, ri, eps) = (heads as i32, dim as i32, rot as i32, 1e-6f32);
    let mut b = d.stream().launch_builder(&f);
    b.arg(&sd)
        .arg(&ss)
        .arg(&hs)
        .arg(&wd)
        .arg(&mut od)
        .arg(&hi)
        .arg(&di)
        .arg(&ri)
        .arg(&pos0);
    b.arg(&theta).arg(&eps);
    unsafe { b.launch(cfg((t_len * heads) as u32, 256, 0)) }.unwrap();
    assert!(max_rel(&down(&d, &od), &want) < 1e-5);
}
