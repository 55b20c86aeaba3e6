//! The kernels are a leaf of the workspace: they build and pass their tests with no other kev crate (this
//! test binary is one such build), and their manifest names none, so a kernel can never again reach into the
//! engine (a pause is the caller's [`kev_kernels::SafePoint`], not a process-global of the engine's).

#[test]
fn the_kernels_depend_on_no_other_kev_crate() {
    let manifest =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")).unwrap();
    let mut section = String::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if section.contains("dependencies") {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("");
            assert!(
                !name.starts_with("kev-") && !name.starts_with("kev_"),
                "{section} names {name}: the kernels must stay a leaf"
            );
        }
    }
}

#[test]
fn a_product_runs_through_the_public_api_alone() {
    use kev_kernels::{Arm, Kernels, PackedMatrix, Rows, RowsMut, Run, SafePoint, gemm};
    let (m, n, k) = (3, 70, 40);
    let w: Vec<f32> = (0..n * k).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let a: Vec<f32> = (0..m * k).map(|i| ((i % 5) as f32 - 2.0) * 0.5).collect();
    let packed = PackedMatrix::from_f32(n, k, &w);
    let paused = std::sync::atomic::AtomicUsize::new(0);
    let wait = || {
        paused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    for kern in Kernels::available() {
        let mut c = vec![0f32; m * n];
        let run = Run {
            kern,
            arm: Arm::Fp32,
            pause: SafePoint::new(&wait),
        };
        gemm(
            run,
            Rows { m, data: &a, ld: k },
            &packed,
            RowsMut {
                data: &mut c,
                ld: n,
            },
        );
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|x| a[i * k + x] * w[j * k + x]).sum();
                assert!(
                    (c[i * n + j] - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{kern:?}"
                );
            }
        }
    }
    // The caller's safe point is reached between panels (two panels of 64 outputs here, per kernel set).
    assert!(paused.load(std::sync::atomic::Ordering::Relaxed) >= 2);
}
