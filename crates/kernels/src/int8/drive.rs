//! The int8 GEMM's drivers: activation quantisation into the layout the path reads, the panel loop,
//! and dequantisation (the scheme is in the parent module's documentation).
//!
//! Blocking (every path but AMX): threads take whole 64-output panels; inside a panel, rows go in passes
//! of [`MC`] (their i32 sums stay in L2), inputs in blocks whose weights stay in L1 while every row
//! group of the pass uses them, and each group of up to six rows runs the path's microkernel over the
//! block. The AVX2 path first widens the block's weights to i16 in an L1 buffer (once per block and
//! pass, amortised over its rows), because its products are `vpmaddwd` on i16 operands.

use std::cell::RefCell;

use rayon::prelude::*;

use super::super::buf::AlignedBuf;
use super::super::cache::prefetch_share;
use super::super::gemm::as_bytes;
use super::super::layout::{MR8, NR};
use super::super::{Isa, Kernels, Rows, RowsMut, Run, SendPtr};
use super::dequant::{Dequant, Dequantised};
use super::{G, PackedInt8, quantize_row};

/// Rows per pass over a panel (their i32 accumulators, `MC · 64 · 4` bytes = 66 KiB, stay in L2).
const MC: usize = 264;

/// Which integer product the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// Plain i32 multiply-adds (the reference).
    Portable,
    /// AVX2 `vpmaddwd` on i16 activations and weights widened to i16 per block, `vpaddd`.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 on narrow weights (`|q_w| ≤ 63`): `vpmaddubsw` on the VNNI operands, `vpmaddwd` by ones,
    /// `vpaddd` (exact there: see `ukr_avx2_narrow`).
    #[cfg(target_arch = "x86_64")]
    Avx2Narrow,
    /// AVX-VNNI `vpdpbusd` on ymm (VEX).
    #[cfg(target_arch = "x86_64")]
    VnniYmm,
    /// The same microkernel compiled for AVX512_VNNI + VL (EVEX): `Isa::AvxVnni` on AVX-512 machines
    /// without AVX-VNNI, so the ymm kernel is tested and measured there.
    #[cfg(target_arch = "x86_64")]
    VnniYmmEvex,
    /// AVX-512 VNNI `vpdpbusd` on zmm.
    #[cfg(target_arch = "x86_64")]
    Vnni512,
    /// AMX `tdpbssd` (s8 × s8) on tiles of 32 rows × 32 outputs × 64 inputs.
    #[cfg(target_arch = "x86_64")]
    Amx,
    /// aarch64 DotProd `sdot` (s8 × s8, indexed by row).
    #[cfg(target_arch = "aarch64")]
    NeonDot,
    /// aarch64 I8MM `smmla` (s8 × s8, 2 rows × 2 outputs × 8 inputs per instruction): activations
    /// stored by pairs of input groups, each weight block interleaved the same way into L1 first.
    #[cfg(target_arch = "aarch64")]
    NeonMmla,
}

impl Path {
    pub(crate) fn of(kern: Kernels) -> Path {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match kern.isa() {
                Isa::Amx => return Path::Amx,
                Isa::Avx512 | Isa::Avx512Bf16
                    if has!("avx512vnni") && has!("avx512bw") && has!("avx512f") =>
                {
                    return Path::Vnni512;
                }
                Isa::AvxVnni if has!("avxvnni") => return Path::VnniYmm,
                Isa::AvxVnni => return Path::VnniYmmEvex,
                Isa::Avx2 | Isa::Avx512 | Isa::Avx512Bf16 => return Path::Avx2,
                _ => {}
            }
        }
        #[cfg(target_arch = "aarch64")]
        match kern.isa() {
            // `Kernels` names `NeonI8mm` only where the CPU has I8MM.
            Isa::NeonI8mm => return Path::NeonMmla,
            Isa::Neon if std::arch::is_aarch64_feature_detected!("dotprod") => {
                return Path::NeonDot;
            }
            _ => {}
        }
        let _ = (kern, Isa::Portable);
        Path::Portable
    }

    /// The path for `w`: AVX2 takes its `vpmaddubsw` kernel where every weight is narrow.
    pub(crate) fn for_weights(self, w: &PackedInt8) -> Path {
        if w.narrow() { self.narrowed() } else { self }
    }

    /// The path for narrow weights (the rule's): what the int8 arm runs on a model quantised by it.
    pub(crate) fn narrowed(self) -> Path {
        #[cfg(target_arch = "x86_64")]
        if self == Path::Avx2 {
            return Path::Avx2Narrow;
        }
        self
    }

    /// Activations stored as `q_a + 128` (u8, the unsigned operand of `vpdpbusd`).
    fn shift(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if matches!(
            self,
            Path::Vnni512 | Path::VnniYmm | Path::VnniYmmEvex | Path::Avx2Narrow
        ) {
            return true;
        }
        false
    }

    /// Bytes per stored activation.
    fn a_bytes(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        if self == Path::Avx2 {
            return 2;
        }
        1
    }

    /// Input groups per block: the block's weights (as the kernel reads them) take 16 KiB of L1.
    fn kg_block(self) -> usize {
        64 / self.a_bytes()
    }

    /// Input groups a row keeps together in the activations' interleaved layout: two for `smmla`
    /// (eight inputs of a row, then the next row's eight), else one.
    fn unit_groups(self) -> usize {
        #[cfg(target_arch = "aarch64")]
        if self == Path::NeonMmla {
            return 2;
        }
        1
    }

    /// Bytes of one row's unit of inputs in the interleaved activations.
    fn a_unit(self) -> usize {
        self.unit_groups() * G * self.a_bytes()
    }

    /// Units of a row of `kg` input groups (the last one padded with zero inputs).
    fn units(self, kg: usize) -> usize {
        kg.div_ceil(self.unit_groups())
    }

    /// The kernel reads each weight block from a copy in another layout (see [`block_for_kernel`]).
    fn rearranges_weights(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self == Path::Avx2 {
            return true;
        }
        #[cfg(target_arch = "aarch64")]
        if self == Path::NeonMmla {
            return true;
        }
        false
    }

    /// The microkernel writes a group's rows of C itself after its last input block (given a
    /// [`Dequantised`]); the x86 kernels' own `store` parameters say which (the ymm macro's `fused`).
    fn dequantises_in_kernel(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if matches!(
            self,
            Path::Avx2 | Path::VnniYmm | Path::VnniYmmEvex | Path::Vnni512
        ) {
            return true;
        }
        false
    }

    /// i32 sums kept per output between blocks: the AVX2 kernel keeps one per input pair of its
    /// groups, added when the sums are dequantised.
    fn lanes(self) -> usize {
        self.a_bytes()
    }

    /// Outputs per column block of the microkernel: a group of six rows keeps its sums as
    /// `[NR / cols][6][cols][lanes]` i32, so each column block's tile is one contiguous stretch.
    fn acc_cols(self) -> usize {
        #[cfg(target_arch = "x86_64")]
        match self {
            Path::Avx2 => return 8,
            Path::VnniYmm | Path::VnniYmmEvex | Path::Avx2Narrow => return 16,
            _ => {}
        }
        #[cfg(target_arch = "aarch64")]
        if matches!(self, Path::NeonDot | Path::NeonMmla) {
            return 16;
        }
        NR
    }

    /// Tile blocks (rows, groups per step) where the path runs on AMX tiles.
    fn tile(self) -> Option<(usize, usize)> {
        #[cfg(target_arch = "x86_64")]
        if self == Path::Amx {
            return Some((super::super::amx::ROWS, super::super::amx::STEP));
        }
        None
    }

    /// The register-resident chain the path's microkernel is built from (its ceiling in `peak`).
    #[cfg(all(target_arch = "x86_64", feature = "peak"))]
    pub(crate) fn chain(self) -> Option<super::super::x86_peak::Chain> {
        use super::super::x86_peak::Chain;
        match self {
            Path::Avx2 => Some(Chain::MaddwdAvx2),
            Path::Avx2Narrow => Some(Chain::MaddubsAvx2),
            Path::VnniYmm => Some(Chain::VnniYmmVex),
            Path::VnniYmmEvex => Some(Chain::VnniYmmEvex),
            Path::Vnni512 => Some(Chain::VnniZmm),
            Path::Portable | Path::Amx => None,
        }
    }

    /// The register-resident chain the path's microkernel is built from (its ceiling in `peak`).
    #[cfg(all(target_arch = "aarch64", feature = "peak"))]
    pub(crate) fn chain(self) -> Option<super::super::neon_peak::Chain> {
        use super::super::neon_peak::Chain;
        match self {
            Path::NeonDot => Some(Chain::Sdot),
            Path::NeonMmla => Some(Chain::Smmla),
            Path::Portable => None,
        }
    }
}

thread_local! {
    /// The quantised activations (bytes, in i16 units so the AVX2 path's view is aligned) and scales.
    static SCRATCH: RefCell<(Vec<i16>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// A worker's i32 sums of one row pass and its widened weight block: kept per thread, because
    /// buffers made per task were returned to the OS and faulted in again on every call (4 % of a call).
    static PANEL: RefCell<(AlignedBuf<i32>, AlignedBuf<i16>)> =
        RefCell::new((AlignedBuf::zeroed(2 * MC * NR), AlignedBuf::zeroed(128 / 2 * NR * G)));
}

/// The name of the register-resident chain (as `kernels::peak` reports it) that the int8 GEMM runs with
/// `kern` on narrow (7-bit) or 8-bit weights; `None` where the path has no such chain (portable, AMX).
#[cfg(feature = "peak")]
pub fn ceiling_chain(kern: Kernels, narrow: bool) -> Option<&'static str> {
    let path = Path::of(kern);
    let path = if narrow { path.narrowed() } else { path };
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    return path.chain().map(|c| c.name());
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = path;
        None
    }
}

/// Whether `kern` multiplies narrow (7-bit) weights on a faster kernel than 8-bit ones (AVX2's
/// `vpmaddubsw`; the VNNI and AMX paths take either width at one speed).
pub fn narrow_is_faster(kern: Kernels) -> bool {
    Path::of(kern).narrowed() != Path::of(kern)
}

/// `C[i, j] = Σ_k A[i, k] · W[j, k]` through int8, for `i < a.m`, `j < w.n()`; strides as in
/// [`crate::gemm()`], which `run` names the kernels and the pause points of (its arm is int8 by definition).
pub fn gemm_int8(run: Run<'_>, a: Rows<'_>, w: &PackedInt8, c: RowsMut<'_>) {
    gemm_int8_on(run, Path::of(run.kern).for_weights(w), a, w, c);
}

/// [`gemm_int8`] on a given path (the tests choose paths [`Path::of`] would not).
pub(crate) fn gemm_int8_on(run: Run<'_>, path: Path, a: Rows<'_>, w: &PackedInt8, c: RowsMut<'_>) {
    let kern = run.kern;
    let (m, a, lda) = (a.m, a.data, a.ld);
    let (c, ldc) = (c.data, c.ld);
    let (n, k) = (w.n, w.k);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lda >= k && a.len() >= (m - 1) * lda + k,
        "gemm_int8: A too short"
    );
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "gemm_int8: C too short"
    );
    #[cfg(target_arch = "x86_64")]
    assert!(
        path != Path::Avx2Narrow || w.narrow(),
        "gemm_int8: vpmaddubsw is exact on narrow weights only"
    );
    SCRATCH.with(|s| {
        let (mut qa, mut sa) = std::mem::take(&mut *s.borrow_mut());
        let fill = if path.shift() { 128u8 } else { 0 };
        // AMX: rows of whole tile steps plus one cache line (no 4 KiB-multiple strides), padded with
        // zero rows to whole tile blocks. Elsewhere: groups of MR8 rows interleaved by input group
        // (by pairs of groups for `smmla`), `[m / 6][kg][6][4]` (the microkernel's broadcasts then read
        // one sequential stream), the last group padded with rows that are computed but never stored.
        let unit = path.a_unit();
        let units = path.units(w.kg);
        let (lq, len) = match path.tile() {
            Some((rows, groups)) => {
                let lq = w.kg.div_ceil(groups) * groups * G + 64;
                (lq, m.div_ceil(rows) * rows * lq)
            }
            None => {
                let lq = units * MR8 * unit;
                (lq, m.div_ceil(MR8) * lq)
            }
        };
        qa.resize(len.div_ceil(2), 0);
        sa.clear();
        sa.resize(m.div_ceil(MR8) * MR8, 0.0);
        // SAFETY: any i16 buffer may be viewed as bytes; `len` of them fit.
        let qb = unsafe { std::slice::from_raw_parts_mut(qa.as_mut_ptr() as *mut u8, len) };
        let unsmooth = w.unsmooth();
        if path.tile().is_some() {
            qb[m * lq..].fill(fill);
            qb[..m * lq]
                .par_chunks_mut(lq)
                .zip(sa.par_iter_mut())
                .enumerate()
                .for_each(|(i, (row, s))| {
                    let x = &a[i * lda..i * lda + k];
                    *s = quantize(kern, path, x, unsmooth, (lq - 64) / G, row, G);
                });
        } else {
            qb.par_chunks_mut(lq)
                .zip(sa.par_chunks_mut(MR8))
                .enumerate()
                .for_each(|(gi, (grp, ss))| {
                    for (r, s) in ss.iter_mut().enumerate() {
                        let i = gi * MR8 + r;
                        let at = &mut grp[r * unit..];
                        *s = if i < m {
                            let x = &a[i * lda..i * lda + k];
                            quantize(kern, path, x, unsmooth, units, at, MR8 * unit)
                        } else {
                            for u in 0..units {
                                at[u * MR8 * unit..u * MR8 * unit + unit].fill(fill);
                            }
                            0.0
                        };
                    }
                });
        }
        let rows = QuantisedRows {
            m,
            q: qb,
            stride: lq,
            scale: &sa,
        };
        run_panels(run, path, &rows, w, c, ldc);
        *s.borrow_mut() = (qa, sa);
    });
}

/// Quantise one activation row for `path` (the definition in `quantize_row`) and store its unit `u`
/// (`path.unit_groups()` groups of four inputs in the path's element type, `path.a_unit()` bytes) at
/// `dst[u · stride..]` for `u < units`, inputs past `x.len()` as zero; returns `s_a`.
fn quantize(
    kern: Kernels,
    path: Path,
    x: &[f32],
    unsmooth: Option<&[f32]>,
    units: usize,
    dst: &mut [u8],
    stride: usize,
) -> f32 {
    let (eb, unit) = (path.a_bytes(), path.a_unit());
    let per_unit = unit / eb;
    assert!(
        units * per_unit >= x.len() && (units == 0 || dst.len() >= (units - 1) * stride + unit)
    );
    #[cfg(target_arch = "x86_64")]
    if path != Path::Portable {
        use super::super::x86_int8::{QForm, quantize_avx2};
        let form = match (eb, path.shift()) {
            (2, _) => QForm::I16,
            (_, true) => QForm::U8Shifted,
            _ => QForm::I8,
        };
        // SAFETY: every non-portable x86 path runs on an AVX2 machine and has units of one group;
        // extents asserted above.
        return unsafe { quantize_avx2(x, unsmooth, units, dst.as_mut_ptr(), stride, form) };
    }
    let _ = kern;
    let mut q = vec![0u8; units * per_unit];
    let s = quantize_row(x, unsmooth, &mut q[..x.len()], path.shift());
    let zero = if path.shift() { 128 } else { 0 };
    q[x.len()..].fill(zero);
    for (u, v) in q.chunks_exact(per_unit).enumerate() {
        for (t, b) in v.iter().enumerate() {
            let at = u * stride + t * eb;
            if eb == 2 {
                dst[at..at + 2].copy_from_slice(&(*b as i8 as i16).to_le_bytes());
            } else {
                dst[at] = *b;
            }
        }
    }
    s
}

/// The activations of one call, quantised (`q`, see [`gemm_int8_on`]), with their scales `s_a`:
/// `stride` bytes per row (AMX) or per group of six rows (every other path).
struct QuantisedRows<'a> {
    m: usize,
    q: &'a [u8],
    stride: usize,
    scale: &'a [f32],
}

fn run_panels(
    run: Run<'_>,
    path: Path,
    rows_in: &QuantisedRows<'_>,
    w: &PackedInt8,
    c: &mut [f32],
    ldc: usize,
) {
    let (m, qa, lq, sa) = (rows_in.m, rows_in.q, rows_in.stride, rows_in.scale);
    let (n, kg) = (w.n, w.kg);
    let Run { kern, pause, .. } = run;
    #[cfg(target_arch = "x86_64")]
    if path == Path::Amx {
        run_panels_amx(run, rows_in, w, c, ldc);
        return;
    }
    let cp = SendPtr(c.as_mut_ptr());
    let eb = path.a_bytes();
    let kgb = path.kg_block();
    let lanes = path.lanes();
    // For kernels that do not dequantise their own rows it is done here, each group right after its
    // last block (while its sums are in L1, and so that C is written between products rather than in
    // one burst per pass).
    let fused = path.dequantises_in_kernel();
    let panels = n.div_ceil(NR);
    (0..panels).into_par_iter().for_each(|p| {
        pause.reach();
        PANEL.with(|bufs| {
            let (acc, wide) = &mut *bufs.borrow_mut();
            let wp = &w.data[p * kg * NR * G..(p + 1) * kg * NR * G];
            let out = Dequant {
                kern,
                w,
                p,
                scale: sa,
                shift: path.shift(),
                lanes,
                cols: path.acc_cols(),
                c: cp,
                ldc,
            };
            let mut mc0 = 0;
            while mc0 < m {
                let mc1 = (mc0 + MC).min(m);
                if kg == 0 {
                    acc[..(mc1 - mc0).div_ceil(MR8) * MR8 * NR * lanes].fill(0);
                    out.rows(&acc[..], mc0..mc1);
                }
                let mut kb = 0;
                while kb < kg {
                    let kgc = (kg - kb).min(kgb);
                    let block = &wp[kb * NR * G..(kb + kgc) * NR * G];
                    let bptr = if path.rearranges_weights() {
                        block_for_kernel(path, block, wide)
                    } else {
                        block.as_ptr() as *const u8
                    };
                    let ablock = kgc * MR8 * G * eb;
                    let next_w = next_weights(w, p, (kb + kgc, kgb));
                    let groups = (mc1 - mc0).div_ceil(MR8);
                    let mut i0 = mc0;
                    while i0 < mc1 {
                        let rows = (mc1 - i0).min(MR8);
                        prefetch_share(as_bytes(next_w), (i0 - mc0) / MR8, groups);
                        let ag = qa[(i0 / MR8) * lq + kb * MR8 * G * eb..].as_ptr();
                        // The next group's activations, one group ahead: groups are a whole row
                        // apart (`lq`), too far for the hardware prefetcher, and once the rows outgrow
                        // L2 each group would start on misses to L3.
                        let next = if i0 + MR8 < mc1 {
                            Some(((i0 / MR8 + 1) * lq + kb * MR8 * G * eb, ablock))
                        } else {
                            let kn = (kg - kb - kgc).min(kgb);
                            let at = (mc0 / MR8) * lq + (kb + kgc) * MR8 * G * eb;
                            (kn > 0).then_some((at, kn * MR8 * G * eb))
                        };
                        if let Some((at, len)) = next {
                            prefetch_l1(&qa[at..at + len]);
                        }
                        let at = (i0 - mc0) * NR * lanes;
                        let accp = acc[at..at + MR8 * NR * lanes].as_mut_ptr();
                        let store = (fused && kb + kgc == kg).then(|| Dequantised {
                            c: cp.get().wrapping_add(i0 * ldc + p * NR),
                            ldc,
                            sw: w.scale[p * NR..(p + 1) * NR].as_ptr(),
                            wsum: w.wsum[p * NR..(p + 1) * NR].as_ptr(),
                            sa: sa[i0..i0 + MR8].as_ptr(),
                            ncols: (n - p * NR).min(NR),
                        });
                        // SAFETY: `ag` addresses `kgc` interleaved groups of six quantised rows
                        // (`lq` covers `kg` of them), `bptr` this block's `kgc` groups of the panel in
                        // the path's element type, `accp` six rows of `NR · lanes` i32, `store` rows
                        // `i0..i0 + rows` of C in this panel's columns (no other task writes them) and
                        // the scales of the panel and of a whole group of rows (`sa` is padded); the
                        // instruction set was checked by `Path::of` (or the test that chose the path).
                        unsafe { ukr(path, kgc, ag, bptr, accp, rows, kb > 0, store) };
                        if !fused && kb + kgc == kg {
                            out.rows(&acc[at..], i0..i0 + rows);
                        }
                        i0 += MR8;
                    }
                    kb += kgc;
                }
                mc0 = mc1;
            }
        });
    });
}

/// The weights panel `p` reads after the block ending at group `end` (its next `kgb` groups), else the next
/// panel's first block, else nothing: asked into L2 a share per row group while the block runs, as the
/// float GEMM does (with few rows — a 94-token row has 16 groups — the first group's misses were a large
/// part of a block).
fn next_weights(w: &PackedInt8, p: usize, (end, kgb): (usize, usize)) -> &[i8] {
    let kg = w.kg;
    let wp = &w.data[p * kg * NR * G..(p + 1) * kg * NR * G];
    if end < kg {
        &wp[end * NR * G..((end + kgb).min(kg)) * NR * G]
    } else if (p + 1) * kg * NR * G < w.data.len() {
        let np = &w.data[(p + 1) * kg * NR * G..];
        &np[..kgb.min(kg) * NR * G]
    } else {
        &[]
    }
}

/// Ask for every cache line of `bytes` in L1 (hints: they never fault and change no value).
#[inline]
fn prefetch_l1(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..bytes.len()).step_by(64) {
        // SAFETY: a prefetch is a hint that cannot fault; the address lies inside `bytes`.
        unsafe {
            use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
            _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(i) as *const i8)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// A weight block of whole groups as the path's kernel reads it, copied into `wide` (a thread's L1
/// buffer, once per block and row pass, so the cost is shared by every row group of the pass): AVX2
/// takes it sign-extended to i16 (see `widen_avx2`); `smmla` interleaved by pairs of groups,
/// `[kg / 2][64][8]` bytes (output `j`'s four inputs of group `2u`, then its four of group `2u + 1`,
/// zero past the block: the activations' layout, see [`Path::unit_groups`]).
fn block_for_kernel(path: Path, src: &[i8], wide: &mut AlignedBuf<i16>) -> *const u8 {
    assert!(src.len().is_multiple_of(NR * G));
    #[cfg(target_arch = "x86_64")]
    if path == Path::Avx2 {
        let dst = &mut wide[..src.len()];
        // SAFETY: AVX2 checked by `Path::of`; whole groups of the panel, equal lengths.
        unsafe { super::super::x86_int8::widen_avx2(src, dst) };
        return dst.as_ptr() as *const u8;
    }
    #[cfg(target_arch = "aarch64")]
    if path == Path::NeonMmla {
        let kg = src.len() / (NR * G);
        let words = kg.div_ceil(2) * 2 * NR;
        assert!(words * 2 <= wide.len());
        // SAFETY: the i16 buffer viewed as 4-byte words (it is 64-byte aligned and holds `words`).
        let dst =
            unsafe { std::slice::from_raw_parts_mut(wide.as_mut_ptr() as *mut [i8; G], words) };
        let word = |g: usize, j: usize| -> [i8; G] {
            if g < kg {
                src[(g * NR + j) * G..(g * NR + j + 1) * G]
                    .try_into()
                    .unwrap()
            } else {
                [0; G]
            }
        };
        for (u, pair) in dst.chunks_exact_mut(2 * NR).enumerate() {
            for (j, out) in pair.chunks_exact_mut(2).enumerate() {
                out[0] = word(2 * u, j);
                out[1] = word(2 * u + 1, j);
            }
        }
        return dst.as_ptr() as *const u8;
    }
    let _ = wide;
    unreachable!("the {path:?} kernel reads the packed weights as they are");
}

/// The int8 arm on AMX tiles ([`amx::run_gemm`](super::super::amx::run_gemm): rows in chunks that stay in
/// L2, per panel and 32-row block two half-panel `tdpbssd` products over all inputs; the quantised rows
/// are padded with zero bytes to whole blocks and steps), then the same dequantisation as every other
/// path. Signed activations, so no zero-point correction.
#[cfg(target_arch = "x86_64")]
fn run_panels_amx(
    run: Run<'_>,
    rows_in: &QuantisedRows<'_>,
    w: &PackedInt8,
    c: &mut [f32],
    ldc: usize,
) {
    use super::super::amx::{self, Product, TileRows};
    let kern = run.kern;
    let (m, qa, lq, sa) = (rows_in.m, rows_in.q, rows_in.stride, rows_in.scale);
    let cp = SendPtr(c.as_mut_ptr());
    let out = |p: usize, r0: usize, rows: usize, acc: &[i32]| {
        Dequant {
            kern,
            w,
            p,
            scale: sa,
            shift: false,
            lanes: 1,
            cols: NR,
            c: cp,
            ldc,
        }
        .rows(acc, r0..r0 + rows)
    };
    // SAFETY: `Path::Amx` is only chosen where `amx::available()` said so; the quantised rows are padded
    // with zero bytes to whole 32-row blocks and 64-input steps (`gemm_int8_on`); the packed data holds
    // whole panels of `kg · NR · G` bytes.
    unsafe {
        amx::run_gemm::<amx::Amx>(
            amx::Job {
                product: Product::Int8,
                rows: TileRows {
                    a: qa.as_ptr(),
                    lda: lq,
                    m,
                },
                w: amx::Panels {
                    data: as_bytes(&w.data[..]),
                    panel_bytes: w.kg * NR * G,
                    n: w.n,
                },
                chunks: amx::chunks(lq, m),
                pause: run.pause,
            },
            out,
        )
    };
}

/// `acc[r][0..NR] (+)= Σ_{g < kg} Σ_t a[g][r][t] · b[g][j][t]` for `r < rows`: `a` six rows interleaved
/// by input group, `a` and `b` in the path's element types (u8 or i8, i16 on AVX2), `acc` in the path's
/// layout ([`Path::acc_cols`]).
///
/// # Safety
/// As documented at the call site in [`run_panels`]; the path's instruction set is present.
#[inline]
// The microkernel's registers in, one by one: a struct would be built and taken apart per row group.
#[allow(clippy::too_many_arguments)]
unsafe fn ukr(
    path: Path,
    kg: usize,
    a: *const u8,
    b: *const u8,
    acc: *mut i32,
    rows: usize,
    load: bool,
    store: Option<Dequantised>,
) {
    #[cfg(target_arch = "x86_64")]
    use super::super::x86_int8 as x;
    #[cfg(not(target_arch = "x86_64"))]
    let _ = store;
    // SAFETY: forwarded from the caller.
    unsafe {
        match path {
            #[cfg(target_arch = "x86_64")]
            Path::Vnni512 => x::ukr_vnni(kg, a, b as *const i8, acc, rows, load, store),
            #[cfg(target_arch = "x86_64")]
            Path::VnniYmm => x::ukr_vnni_ymm(kg, a, b as *const i8, acc, rows, load, store),
            #[cfg(target_arch = "x86_64")]
            Path::VnniYmmEvex => {
                x::ukr_vnni_ymm_evex(kg, a, b as *const i8, acc, rows, load, store)
            }
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => x::ukr_avx2(kg, a, b as *const i16, acc, rows, load, store),
            #[cfg(target_arch = "x86_64")]
            Path::Avx2Narrow => x::ukr_avx2_narrow(kg, a, b as *const i8, acc, rows, load, store),
            #[cfg(target_arch = "x86_64")]
            Path::Amx => unreachable!("AMX runs whole tile blocks (run_panels_amx)"),
            #[cfg(target_arch = "aarch64")]
            Path::NeonDot => {
                super::super::neon::ukr_sdot(kg, a as *const i8, b as *const i8, acc, rows, load)
            }
            #[cfg(target_arch = "aarch64")]
            Path::NeonMmla => {
                super::super::neon::ukr_smmla(kg, a as *const i8, b as *const i8, acc, load)
            }
            Path::Portable => ukr_portable(kg, a as *const i8, b as *const i8, acc, rows, load),
        }
    }
}

/// The reference microkernel: i32 multiply-adds on signed activations.
///
/// # Safety
/// As [`ukr`].
unsafe fn ukr_portable(
    kg: usize,
    a: *const i8,
    b: *const i8,
    acc: *mut i32,
    rows: usize,
    load: bool,
) {
    // SAFETY: extents as documented at the call site.
    unsafe {
        let aa = std::slice::from_raw_parts(a, kg * MR8 * G);
        let bs = std::slice::from_raw_parts(b, kg * NR * G);
        for r in 0..rows {
            let out = std::slice::from_raw_parts_mut(acc.add(r * NR), NR);
            for (j, o) in out.iter_mut().enumerate() {
                let mut s: i32 = if load { *o } else { 0 };
                for g in 0..kg {
                    let wg = &bs[g * NR * G + j * G..g * NR * G + j * G + G];
                    let xg = &aa[(g * MR8 + r) * G..(g * MR8 + r) * G + G];
                    for t in 0..G {
                        s += xg[t] as i32 * wg[t] as i32;
                    }
                }
                *o = s;
            }
        }
    }
}
