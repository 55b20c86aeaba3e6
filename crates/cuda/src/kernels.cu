// kev CUDA kernels: everything in a Qwen3.5 row that is not a GEMM (the projections go to cuBLAS).
//
// Compiled at start with NVRTC for the device's architecture (see `lib.rs`). Conventions, chosen so that each
// kernel is a direct transcription of the CPU engine's arithmetic (shared/spec/qwen35-arch.md §3–§7):
// - activations are fp32, row-major `[tokens, width]`; the large weight matrices never reach these kernels;
// - the small per-layer vectors (norm weights, conv taps, A_log, dt_bias) are widened to fp32 at upload;
// - reductions run in fp32 in a fixed tree order, so reruns are bit-equal;
// - no kernel reads what another thread of the same launch writes, except through shared memory after a
//   `__syncthreads()`.

typedef unsigned short bf16_bits;

__device__ __forceinline__ float bf16_to_f32(bf16_bits b) {
    return __uint_as_float(((unsigned int)b) << 16);
}

// Round to nearest even, as the CPU engine's bf16 arm does; NaN stays NaN.
__device__ __forceinline__ bf16_bits f32_to_bf16(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_bits)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_bits)(u >> 16);
}

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float siluf_(float x) { return x / (1.0f + expf(-x)); }

// torch's softplus: x above 20 is returned as is.
__device__ __forceinline__ float softplusf_(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Sum of `v` over the block (blockDim.x a power of two ≤ 1024); every thread gets the total.
__device__ float block_sum(float v, float* scratch) {
    const int t = threadIdx.x;
    scratch[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) scratch[t] += scratch[t + s];
        __syncthreads();
    }
    const float total = scratch[0];
    __syncthreads();
    return total;
}

__device__ float block_max(float v, float* scratch) {
    const int t = threadIdx.x;
    scratch[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) scratch[t] = fmaxf(scratch[t], scratch[t + s]);
        __syncthreads();
    }
    const float m = scratch[0];
    __syncthreads();
    return m;
}

// out[i, :] = table[ids[i], :] widened to fp32. Grid (n), block (any).
extern "C" __global__ void embed_bf16(const bf16_bits* table, const int* ids, float* out, int hidden) {
    const long row = (long)ids[blockIdx.x] * hidden;
    float* o = out + (long)blockIdx.x * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) o[c] = bf16_to_f32(table[row + c]);
}

// RMSNorm over `dim` with weight (1 + w) (`one_plus` = 1) or w (`one_plus` = 0), fp32. Grid (rows), block 256.
// Rows are `stride` apart so that a head inside a wider row can be normalised in place.
extern "C" __global__ void rms_norm(const float* x, const float* w, float* y, int dim, long stride, float eps,
                                    int one_plus) {
    __shared__ float scratch[256];
    const float* xr = x + blockIdx.x * stride;
    float* yr = y + blockIdx.x * stride;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        const float wc = one_plus ? 1.0f + w[c] : w[c];
        yr[c] = xr[c] * inv * wc;
    }
}

// Causal depthwise conv (4 taps, tap 3 on the current token) over [history (3 rows); qkv (T rows)], then SiLU.
// Writes the new 3-row history (the last three pre-conv rows) to `hist_out` (a separate buffer).
// Grid (ceil(C/256), T), block 256.
extern "C" __global__ void conv_silu(const float* qkv, const float* hist, const float* taps, float* out,
                                     float* hist_out, int T, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int t = blockIdx.y;
    if (c >= C) return;
    float acc = 0.0f;
    for (int j = 0; j < 4; ++j) {
        const int src = t - 3 + j;  // index into qkv; negative reaches into the history
        const float v = src >= 0 ? qkv[(long)src * C + c] : hist[(long)(3 + src) * C + c];
        acc += taps[c * 4 + j] * v;
    }
    out[(long)t * C + c] = siluf_(acc);
    if (t == 0) {
        // The last three rows of [history; qkv]: combined row i is hist[i] for i < 3, else qkv[i - 3].
        for (int r = 0; r < 3; ++r) {
            const int i = r + T;
            hist_out[(long)r * C + c] = i < 3 ? hist[(long)i * C + c] : qkv[(long)(i - 3) * C + c];
        }
    }
}

// L2-normalise each `dim`-wide head of each row in place and scale it (q: 1/sqrt(dim); k: 1). Heads are
// contiguous inside a row; rows are `row_stride` apart (q and k live inside the wider conv output).
// Grid (rows * heads), block 128.
extern "C" __global__ void l2_norm_heads(float* x, int heads, int dim, long row_stride, float eps, float scale) {
    __shared__ float scratch[128];
    float* h = x + (long)(blockIdx.x / heads) * row_stride + (long)(blockIdx.x % heads) * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += h[c] * h[c];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) + eps) * scale;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) h[c] *= inv;
}

// β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias), per token and value head. Grid (T), block (heads).
extern "C" __global__ void gdn_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                                     float* g, float* beta, int heads) {
    const int h = threadIdx.x;
    if (h >= heads) return;
    const long i = (long)blockIdx.x * heads + h;
    beta[i] = sigmoidf_(b[i]);
    g[i] = -expf(a_log[h]) * softplusf_(a[i] + dt_bias[h]);
}

// The gated delta rule, token by token (§4.6), for one value head per block; thread `j` owns column j of the
// 128×128 fp32 state, so S^T·k and S^T·q need no cross-thread reduction. q and k are already L2-normalised
// (q scaled); value head h reads key head h / (v_heads / k_heads). Grid (v_heads), block (dv = 128).
extern "C" __global__ void gdn_recurrent(const float* q, const float* k, const float* v, const float* g,
                                         const float* beta, float* state, float* out, int T, int k_heads,
                                         int v_heads, long q_stride, long k_stride, long v_stride) {
    const int DK = 128;
    __shared__ float ks[128];
    __shared__ float qs[128];
    const int h = blockIdx.x;
    const int j = threadIdx.x;
    const int kh = h / (v_heads / k_heads);
    float s[128];
    float* col = state + (long)h * DK * DK;  // state[h][a][j] at col[a * DK + j]
    for (int a = 0; a < DK; ++a) s[a] = col[a * DK + j];
    for (int t = 0; t < T; ++t) {
        ks[j] = k[t * k_stride + kh * DK + j];
        qs[j] = q[t * q_stride + kh * DK + j];
        __syncthreads();
        const float alpha = expf(g[(long)t * v_heads + h]);
        const float bt = beta[(long)t * v_heads + h];
        float kv = 0.0f;
        for (int a = 0; a < DK; ++a) {
            s[a] *= alpha;
            kv += s[a] * ks[a];
        }
        const float u = bt * (v[t * v_stride + h * DK + j] - kv);
        float o = 0.0f;
        for (int a = 0; a < DK; ++a) {
            s[a] += ks[a] * u;
            o += s[a] * qs[a];
        }
        out[(long)t * v_heads * DK + h * DK + j] = o;
        __syncthreads();
    }
    for (int a = 0; a < DK; ++a) col[a * DK + j] = s[a];
}

// Gated RMSNorm per value head: y = o / rms(o) · w · silu(z). Grid (T * heads), block 128.
extern "C" __global__ void gated_rms_norm(const float* o, const float* z, const float* w, float* y, int dim,
                                          long z_stride_row, int heads, float eps) {
    __shared__ float scratch[128];
    const int t = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    const float* orow = o + (long)blockIdx.x * dim;
    const float* zrow = z + t * z_stride_row + (long)h * dim;
    float* yrow = y + (long)blockIdx.x * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += orow[c] * orow[c];
    const float inv = 1.0f / sqrtf(block_sum(ss, scratch) / (float)dim + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) yrow[c] = orow[c] * inv * w[c] * siluf_(zrow[c]);
}

// Attention q/k: RMSNorm (1 + w) over each 256-wide head read at `src` (row stride `src_stride`, head stride
// `src_head_stride`), then NeoX rotary on the first `rot` dims at position pos0 + t (angles in double), written
// packed to dst [T, heads, dim]. Grid (T * heads), block 256 (= dim).
extern "C" __global__ void qk_norm_rope(const float* src, long src_stride, long src_head_stride, const float* w,
                                        float* dst, int heads, int dim, int rot, long pos0, double theta,
                                        float eps) {
    __shared__ float scratch[256];
    __shared__ float row[256];
    const int t = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    const int c = threadIdx.x;
    const float x = c < dim ? src[t * src_stride + h * src_head_stride + c] : 0.0f;
    const float inv = 1.0f / sqrtf(block_sum(x * x, scratch) / (float)dim + eps);
    if (c < dim) row[c] = x * inv * (1.0f + w[c]);
    __syncthreads();
    if (c >= dim) return;
    float y = row[c];
    if (c < rot) {
        const int half = rot / 2;
        const int i = c % half;
        const double inv_freq = pow(theta, -2.0 * (double)i / (double)rot);
        const double angle = (double)(pos0 + t) * inv_freq;
        const float cs = (float)cos(angle);
        const float sn = (float)sin(angle);
        y = c < half ? row[c] * cs - row[c + half] * sn : row[c] * cs + row[c - half] * sn;
    }
    dst[((long)t * heads + h) * dim + c] = y;
}

// Append T rows of K and V ([T, kv_heads, dim]) to a cache holding `pos0` rows. Grid (T * kv_heads), block dim.
extern "C" __global__ void kv_append(const float* k, const float* v, float* k_cache, float* v_cache, long pos0,
                                     int kv_heads, int dim) {
    const long src = (long)blockIdx.x * dim + threadIdx.x;
    const long dst = (pos0 * kv_heads) * dim + src;
    k_cache[dst] = k[src];
    v_cache[dst] = v[src];
}

// Causal softmax attention of T new query rows (positions pos0 + t) over the cache (pos0 + T rows), fp32, GQA
// head h → kv head h / (heads / kv_heads). Scores in dynamic shared memory (pos0 + T floats).
// Grid (T * heads), block 256 (= dim).
extern "C" __global__ void attention(const float* q, const float* k_cache, const float* v_cache, float* out,
                                     int heads, int kv_heads, int dim, long pos0, float scale) {
    extern __shared__ float scores[];
    __shared__ float scratch[256];
    const int t = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    const int kh = h / (heads / kv_heads);
    const long len = pos0 + t + 1;
    const float* qr = q + ((long)t * heads + h) * dim;
    float local_max = -__int_as_float(0x7f800000);  // −∞ (NVRTC has no <math.h> macros)
    for (long j = threadIdx.x; j < len; j += blockDim.x) {
        const float* kr = k_cache + (j * kv_heads + kh) * dim;
        float dot = 0.0f;
        for (int c = 0; c < dim; ++c) dot += qr[c] * kr[c];
        dot *= scale;
        scores[j] = dot;
        local_max = fmaxf(local_max, dot);
    }
    const float m = block_max(local_max, scratch);
    float local_sum = 0.0f;
    for (long j = threadIdx.x; j < len; j += blockDim.x) {
        const float e = expf(scores[j] - m);
        scores[j] = e;
        local_sum += e;
    }
    const float inv = 1.0f / block_sum(local_sum, scratch);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
        float acc = 0.0f;
        for (long j = 0; j < len; ++j) acc += scores[j] * v_cache[(j * kv_heads + kh) * dim + c];
        out[((long)t * heads + h) * dim + c] = acc * inv;
    }
}

// out[t, h, c] *= sigmoid(gate[t * gate_stride + h * gate_head_stride + c]). Grid (T * heads), block dim.
extern "C" __global__ void sigmoid_gate(float* out, const float* gate, long gate_stride, long gate_head_stride,
                                        int heads, int dim) {
    const int t = blockIdx.x / heads;
    const int h = blockIdx.x % heads;
    const int c = threadIdx.x;
    out[(long)blockIdx.x * dim + c] *= sigmoidf_(gate[t * gate_stride + h * gate_head_stride + c]);
}

// MLP activation: y = silu(g) · u, n elements.
extern "C" __global__ void silu_mul(const float* g, const float* u, float* y, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = siluf_(g[i]) * u[i];
}

// Residual: x += y, n elements.
extern "C" __global__ void add_inplace(float* x, const float* y, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// The bf16 arm's GEMM input: activations rounded to bf16 (nearest even), n elements.
extern "C" __global__ void to_bf16(const float* x, bf16_bits* y, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f32_to_bf16(x[i]);
}

// The fp32 arm's weights: bf16 widened exactly, n elements (once, at load).
extern "C" __global__ void widen_bf16(const bf16_bits* x, float* y, long n) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = bf16_to_f32(x[i]);
}

// The rows a caller asked for: out[i, :] = x[rows[i], :]. Grid (n), block 256.
extern "C" __global__ void gather_rows(const float* x, const int* rows, float* out, int width) {
    const float* src = x + (long)rows[blockIdx.x] * width;
    float* dst = out + (long)blockIdx.x * width;
    for (int c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[c];
}
