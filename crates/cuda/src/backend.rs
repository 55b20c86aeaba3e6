//! The CUDA backend: `kev_engine::Backend` over cuBLAS projections and the kernels of `kernels.cu`.
//!
//! **Never run yet** (written on machines without a GPU; issue 9): `tests/backend.rs` compares it with the CPU
//! backend on the fixture release and is skipped where no device opens. Until that test has passed on a GPU,
//! nothing outside the tests constructs it.
//!
//! Shape of the first version, chosen for being easy to check rather than fast:
//! - weights: the engine's checkpoint tree ([`kev_engine::Weights`]) uploaded once as BF16 ([`crate::upload`]:
//!   the LoRA merged with the engine's own merge, bit-exact with the CPU's merged form);
//!   the fp32 arm also keeps an fp32 copy of every matrix, widened on the device, and runs `cublasSgemm`
//!   (no TF32); the bf16 arm rounds activations to bf16 and runs `cublasGemmEx` (BF16 × BF16, fp32 compute);
//! - rows run one after another (no cross-row GEMM batching yet), each token-serial through the GDN recurrence
//!   (the chunked form is the next step for long prefills);
//! - the state lives on the device: per GDN layer the 3-row conv history and the fp32 recurrent state, per
//!   attention layer K and V for every position so far; `Clone` copies it on the device.

use std::path::Path;

use cudarc::cublas::{CudaBlas, sys as cublas_sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use kev_engine::{
    Arm, Backend, BatchRow, Checkpoint, EngineError, LayerKind, Qwen35Config, Weights,
};

use crate::Device;
use crate::upload::{DeviceWeights, Funcs, Mat, Mixer, blocks, dev_err};

/// A model on a CUDA device.
pub struct CudaBackend {
    dev: Device,
    blas: CudaBlas,
    f: Funcs,
    cfg: Qwen35Config,
    arm: Arm,
    w: DeviceWeights,
}

// SAFETY: every use of the device goes through `forward`, which holds `&self` only to enqueue work on the one
// stream and synchronises before returning; cudarc's handles are thread-safe for that use.
unsafe impl Send for CudaBackend {}
unsafe impl Sync for CudaBackend {}

/// Per-layer state on the device.
#[derive(Clone)]
enum LayerState {
    Gdn {
        conv: CudaSlice<f32>,
        rec: CudaSlice<f32>,
    },
    Attn {
        k: Option<CudaSlice<f32>>,
        v: Option<CudaSlice<f32>>,
    },
}

/// A sequence state on the device.
#[derive(Clone)]
pub struct CudaState {
    pos: usize,
    layers: Vec<LayerState>,
}

// SAFETY: device buffers are plain allocations; all access is ordered on the backend's stream.
unsafe impl Send for CudaState {}
unsafe impl Sync for CudaState {}

fn grid(g: usize, b: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (g as u32, 1, 1),
        block_dim: (b, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// Load `dir` (config.json + safetensors) onto `dev`; with `adapter`, the LoRA is merged at load.
    pub fn load(
        dev: Device,
        dir: &Path,
        adapter: Option<&Path>,
        arm: Arm,
    ) -> Result<Self, EngineError> {
        Self::check_arm(arm)?;
        let ck = Checkpoint::open(dir)?;
        Self::from_weights(dev, &ck.weights(adapter)?, arm)
    }

    /// Upload the checkpoint tree onto `dev` (each LoRA merged into its weight).
    pub fn from_weights(dev: Device, w: &Weights<'_>, arm: Arm) -> Result<Self, EngineError> {
        Self::check_arm(arm)?;
        let f = Funcs::look_up(&dev)?;
        let weights = DeviceWeights::upload(&dev, &f, w, arm)?;
        let blas = CudaBlas::new(dev.stream().clone()).map_err(dev_err)?;
        Ok(CudaBackend {
            dev,
            blas,
            f,
            cfg: w.config.clone(),
            arm,
            w: weights,
        })
    }

    fn check_arm(arm: Arm) -> Result<(), EngineError> {
        if arm == Arm::Int8 {
            return Err(EngineError::Device(
                "the int8 arm runs on the CPU only (no CUDA int8 kernels yet)".into(),
            ));
        }
        Ok(())
    }

    fn alloc(&self, n: usize) -> Result<CudaSlice<f32>, EngineError> {
        self.dev
            .stream()
            .alloc_zeros::<f32>(n.max(1))
            .map_err(dev_err)
    }

    /// `y[m, n] = x[m, k] · Wᵀ` (row-major): column-major `yᵀ = W · xᵀ`, i.e. `op(A) = Wᵀ` over W's storage.
    fn gemm(
        &self,
        x: &CudaSlice<f32>,
        w: &Mat,
        m: usize,
        y: &mut CudaSlice<f32>,
    ) -> Result<(), EngineError> {
        let s = self.dev.stream();
        let (n, k) = (w.n as i32, w.k as i32);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let t = cublas_sys::cublasOperation_t::CUBLAS_OP_T;
        let nn = cublas_sys::cublasOperation_t::CUBLAS_OP_N;
        let handle = *self.blas.handle();
        match (&w.f32, self.arm) {
            (Some(wf), Arm::Fp32) => {
                let (a, _ra) = wf.device_ptr(s);
                let (b, _rb) = x.device_ptr(s);
                let (c, _rc) = y.device_ptr_mut(s);
                unsafe {
                    cudarc::cublas::result::sgemm(
                        handle,
                        t,
                        nn,
                        n,
                        m as i32,
                        k,
                        &alpha,
                        a as *const f32,
                        k,
                        b as *const f32,
                        k,
                        &beta,
                        c as *mut f32,
                        n,
                    )
                }
                .map_err(dev_err)
            }
            _ => {
                let mut xb = s.alloc_zeros::<u16>((m * w.k).max(1)).map_err(dev_err)?;
                let len = (m * w.k) as i64;
                let mut lb = s.launch_builder(&self.f.to_bf16);
                lb.arg(x).arg(&mut xb).arg(&len);
                unsafe { lb.launch(blocks(m * w.k)) }.map_err(dev_err)?;
                let (a, _ra) = w.bf16.device_ptr(s);
                let (b, _rb) = xb.device_ptr(s);
                let (c, _rc) = y.device_ptr_mut(s);
                let bf = cublas_sys::cudaDataType_t::CUDA_R_16BF;
                unsafe {
                    cudarc::cublas::result::gemm_ex(
                        handle,
                        t,
                        nn,
                        n,
                        m as i32,
                        k,
                        (&alpha) as *const f32 as *const _,
                        a as *const _,
                        bf,
                        k,
                        b as *const _,
                        bf,
                        k,
                        (&beta) as *const f32 as *const _,
                        c as *mut _,
                        cublas_sys::cudaDataType_t::CUDA_R_32F,
                        n,
                        cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(dev_err)
            }
        }
    }

    fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        rows: usize,
        dim: usize,
        one_plus: bool,
    ) -> Result<(), EngineError> {
        let (d, stride, eps, op) = (
            dim as i32,
            dim as i64,
            self.cfg.rms_norm_eps,
            one_plus as i32,
        );
        let mut b = self.dev.stream().launch_builder(&self.f.rms_norm);
        b.arg(x)
            .arg(w)
            .arg(y)
            .arg(&d)
            .arg(&stride)
            .arg(&eps)
            .arg(&op);
        unsafe { b.launch(grid(rows, 256)) }.map_err(dev_err)?;
        Ok(())
    }

    fn add(&self, x: &mut CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<(), EngineError> {
        let len = n as i64;
        let mut b = self.dev.stream().launch_builder(&self.f.add_inplace);
        b.arg(x).arg(y).arg(&len);
        unsafe { b.launch(blocks(n)) }.map_err(dev_err)?;
        Ok(())
    }

    /// One row through every layer; returns the final-norm hidden states at `wanted`.
    fn row(
        &self,
        st: &mut CudaState,
        tokens: &[u32],
        wanted: &[usize],
    ) -> Result<Vec<f32>, EngineError> {
        let s = self.dev.stream();
        let h = self.cfg.hidden_size;
        let (t, pos0) = (tokens.len(), st.pos);
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        let ids_d = s.clone_htod(&ids).map_err(dev_err)?;
        let mut x = self.alloc(t * h)?;
        {
            let hd = h as i32;
            let mut b = s.launch_builder(&self.f.embed);
            b.arg(&self.w.embed).arg(&ids_d).arg(&mut x).arg(&hd);
            unsafe { b.launch(grid(t, 256)) }.map_err(dev_err)?;
        }
        let mut hn = self.alloc(t * h)?;
        let mut delta = self.alloc(t * h)?;
        for (layer, ls) in self.w.layers.iter().zip(st.layers.iter_mut()) {
            self.rms_norm(&x, &layer.in_norm, &mut hn, t, h, true)?;
            match (&layer.mixer, ls) {
                (Mixer::Gdn { .. }, LayerState::Gdn { conv, rec }) => {
                    self.gdn(&layer.mixer, (conv, rec), &hn, t, &mut delta)?
                }
                (Mixer::Attn { .. }, LayerState::Attn { k, v }) => {
                    self.attention(&layer.mixer, (k, v), &hn, (t, pos0), &mut delta)?
                }
                _ => {
                    return Err(EngineError::Input(
                        "the state was made for another model".into(),
                    ));
                }
            }
            self.add(&mut x, &delta, t * h)?;
            self.mlp(layer, &x, (&mut hn, &mut delta), t)?;
            self.add(&mut x, &delta, t * h)?;
        }
        st.pos += t;
        self.finish(&x, wanted)
    }

    /// A Gated DeltaNet mixer over the row's `t` normed tokens `hn`, its state advanced; the out
    /// projection into `delta`.
    fn gdn(
        &self,
        mixer: &Mixer,
        (conv, rec): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        hn: &CudaSlice<f32>,
        t: usize,
        delta: &mut CudaSlice<f32>,
    ) -> Result<(), EngineError> {
        let Mixer::Gdn {
            qkv,
            z,
            b: bm,
            a: am,
            taps,
            a_log,
            dt_bias,
            norm,
            out,
        } = mixer
        else {
            unreachable!("a GDN layer")
        };
        let (s, cfg, eps) = (self.dev.stream(), &self.cfg, self.cfg.rms_norm_eps);
        let (cd, vd) = (cfg.conv_dim(), cfg.value_dim());
        let (nk, nv, dk) = (
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
        );
        let kd = nk * dk;
        let mut qkv_o = self.alloc(t * cd)?;
        let mut z_o = self.alloc(t * vd)?;
        let mut b_o = self.alloc(t * nv)?;
        let mut a_o = self.alloc(t * nv)?;
        self.gemm(hn, qkv, t, &mut qkv_o)?;
        self.gemm(hn, z, t, &mut z_o)?;
        self.gemm(hn, bm, t, &mut b_o)?;
        self.gemm(hn, am, t, &mut a_o)?;
        let mut conv_o = self.alloc(t * cd)?;
        let mut hist = self.alloc(3 * cd)?;
        {
            let (ti, ci) = (t as i32, cd as i32);
            let mut b = s.launch_builder(&self.f.conv_silu);
            b.arg(&qkv_o)
                .arg(&*conv)
                .arg(taps)
                .arg(&mut conv_o)
                .arg(&mut hist);
            b.arg(&ti).arg(&ci);
            let cfg_l = LaunchConfig {
                grid_dim: (cd.div_ceil(256) as u32, t as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            unsafe { b.launch(cfg_l) }.map_err(dev_err)?;
        }
        *conv = hist;
        self.qk_l2_norms(&mut conv_o, t)?;
        let mut g = self.alloc(t * nv)?;
        let mut beta = self.alloc(t * nv)?;
        {
            let nvi = nv as i32;
            let mut b = s.launch_builder(&self.f.gdn_gates);
            b.arg(&a_o)
                .arg(&b_o)
                .arg(a_log)
                .arg(dt_bias)
                .arg(&mut g)
                .arg(&mut beta)
                .arg(&nvi);
            unsafe { b.launch(grid(t, nv.next_power_of_two() as u32)) }.map_err(dev_err)?;
        }
        let mut o = self.alloc(t * vd)?;
        {
            let qv = conv_o.slice(0..);
            let kv = conv_o.slice(kd..);
            let vv = conv_o.slice(2 * kd..);
            let (ti, nki, nvi) = (t as i32, nk as i32, nv as i32);
            let stride = cd as i64;
            let mut b = s.launch_builder(&self.f.gdn_recurrent);
            b.arg(&qv)
                .arg(&kv)
                .arg(&vv)
                .arg(&g)
                .arg(&beta)
                .arg(&mut *rec)
                .arg(&mut o);
            b.arg(&ti)
                .arg(&nki)
                .arg(&nvi)
                .arg(&stride)
                .arg(&stride)
                .arg(&stride);
            unsafe { b.launch(grid(nv, cfg.linear_value_head_dim as u32)) }.map_err(dev_err)?;
        }
        let mut y = self.alloc(t * vd)?;
        {
            let (dv, zs, nvi) = (cfg.linear_value_head_dim as i32, vd as i64, nv as i32);
            let mut b = s.launch_builder(&self.f.gated_rms_norm);
            b.arg(&o)
                .arg(&z_o)
                .arg(norm)
                .arg(&mut y)
                .arg(&dv)
                .arg(&zs)
                .arg(&nvi)
                .arg(&eps);
            unsafe { b.launch(grid(t * nv, 128)) }.map_err(dev_err)?;
        }
        self.gemm(&y, out, t, delta)
    }

    /// The conv output's q (at columns `[0, kd)`, scaled) and k (at `[kd, 2kd)`) L2-normalised per head in
    /// place; v after them is left.
    fn qk_l2_norms(&self, conv_o: &mut CudaSlice<f32>, t: usize) -> Result<(), EngineError> {
        let (s, cfg) = (self.dev.stream(), &self.cfg);
        let (cd, nk, dk) = (
            cfg.conv_dim(),
            cfg.linear_num_key_heads,
            cfg.linear_key_head_dim,
        );
        let kd = nk * dk;
        for (off, scale) in [(0usize, 1.0 / (dk as f32).sqrt()), (kd, 1.0f32)] {
            let (hi, di, rs, e) = (nk as i32, dk as i32, cd as i64, 1e-6f32);
            let mut view = conv_o.slice_mut(off..);
            let mut b = s.launch_builder(&self.f.l2_norm_heads);
            b.arg(&mut view)
                .arg(&hi)
                .arg(&di)
                .arg(&rs)
                .arg(&e)
                .arg(&scale);
            unsafe { b.launch(grid(t * nk, 128)) }.map_err(dev_err)?;
        }
        Ok(())
    }

    /// A gated attention mixer over the row's `t` normed tokens `hn` at positions `pos0..`, its key/value
    /// cache grown; the out projection into `delta`.
    fn attention(
        &self,
        mixer: &Mixer,
        (kc, vc): (&mut Option<CudaSlice<f32>>, &mut Option<CudaSlice<f32>>),
        hn: &CudaSlice<f32>,
        (t, pos0): (usize, usize),
        delta: &mut CudaSlice<f32>,
    ) -> Result<(), EngineError> {
        let Mixer::Attn {
            q,
            k,
            v,
            q_norm,
            k_norm,
            o,
        } = mixer
        else {
            unreachable!("an attention layer")
        };
        let (s, cfg, eps) = (self.dev.stream(), &self.cfg, self.cfg.rms_norm_eps);
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let mut qg = self.alloc(t * 2 * nh * hd)?;
        let mut kk = self.alloc(t * nkv * hd)?;
        let mut vv = self.alloc(t * nkv * hd)?;
        self.gemm(hn, q, t, &mut qg)?;
        self.gemm(hn, k, t, &mut kk)?;
        self.gemm(hn, v, t, &mut vv)?;
        let mut qr = self.alloc(t * nh * hd)?;
        let mut kr = self.alloc(t * nkv * hd)?;
        let (di, ri, p0) = (hd as i32, cfg.rotary_dim as i32, pos0 as i64);
        let theta = cfg.rope_theta;
        for (src, stride, head_stride, w, dst, heads) in [
            (
                &qg,
                (2 * nh * hd) as i64,
                (2 * hd) as i64,
                q_norm,
                &mut qr,
                nh,
            ),
            (&kk, (nkv * hd) as i64, hd as i64, k_norm, &mut kr, nkv),
        ] {
            let hi = heads as i32;
            let mut b = s.launch_builder(&self.f.qk_norm_rope);
            b.arg(src)
                .arg(&stride)
                .arg(&head_stride)
                .arg(w)
                .arg(dst)
                .arg(&hi)
                .arg(&di);
            b.arg(&ri).arg(&p0).arg(&theta).arg(&eps);
            unsafe { b.launch(grid(t * heads, 256)) }.map_err(dev_err)?;
        }
        let (k_new, v_new) = self.grow_kv((kc, vc), (&kr, &vv), (pos0, t))?;
        let len = pos0 + t;
        let mut att = self.alloc(t * nh * hd)?;
        {
            let (hi, kvi, dii) = (nh as i32, nkv as i32, hd as i32);
            let scale = 1.0 / (hd as f32).sqrt();
            // 48 KiB of shared memory without an opt-in, 1 KiB of it the kernel's reduction scratch.
            let shared = (len * 4) as u32;
            if shared > 47 * 1024 {
                return Err(EngineError::Input(format!(
                    "{len} positions: the CUDA attention kernel holds at most 12,032 scores per query"
                )));
            }
            let mut b = s.launch_builder(&self.f.attention);
            b.arg(&qr)
                .arg(&k_new)
                .arg(&v_new)
                .arg(&mut att)
                .arg(&hi)
                .arg(&kvi)
                .arg(&dii);
            b.arg(&p0).arg(&scale);
            let mut lc = grid(t * nh, 256);
            lc.shared_mem_bytes = shared;
            unsafe { b.launch(lc) }.map_err(dev_err)?;
        }
        {
            let gate = qg.slice(hd..);
            let (gs, ghs, hi, dii) = ((2 * nh * hd) as i64, (2 * hd) as i64, nh as i32, hd as i32);
            let mut b = s.launch_builder(&self.f.sigmoid_gate);
            b.arg(&mut att)
                .arg(&gate)
                .arg(&gs)
                .arg(&ghs)
                .arg(&hi)
                .arg(&dii);
            unsafe { b.launch(grid(t * nh, hd as u32)) }.map_err(dev_err)?;
        }
        *kc = Some(k_new);
        *vc = Some(v_new);
        self.gemm(&att, o, t, delta)
    }

    /// This call's keys and values appended to a layer's cache, as new buffers: the cache grows by copying
    /// (simple, and rows are short next to the weights).
    fn grow_kv(
        &self,
        (kc, vc): (&Option<CudaSlice<f32>>, &Option<CudaSlice<f32>>),
        (kr, vv): (&CudaSlice<f32>, &CudaSlice<f32>),
        (pos0, t): (usize, usize),
    ) -> Result<(CudaSlice<f32>, CudaSlice<f32>), EngineError> {
        let (s, cfg) = (self.dev.stream(), &self.cfg);
        let (nkv, hd) = (cfg.num_key_value_heads, cfg.head_dim);
        let p0 = pos0 as i64;
        let len = pos0 + t;
        let width = nkv * hd;
        let mut k_new = self.alloc(len * width)?;
        let mut v_new = self.alloc(len * width)?;
        if let (Some(ko), Some(vo)) = (kc.as_ref(), vc.as_ref()) {
            s.memcpy_dtod(
                &ko.slice(0..pos0 * width),
                &mut k_new.slice_mut(0..pos0 * width),
            )
            .map_err(dev_err)?;
            s.memcpy_dtod(
                &vo.slice(0..pos0 * width),
                &mut v_new.slice_mut(0..pos0 * width),
            )
            .map_err(dev_err)?;
        }
        {
            let (kvi, dii) = (nkv as i32, hd as i32);
            let mut b = s.launch_builder(&self.f.kv_append);
            b.arg(kr)
                .arg(vv)
                .arg(&mut k_new)
                .arg(&mut v_new)
                .arg(&p0)
                .arg(&kvi)
                .arg(&dii);
            unsafe { b.launch(grid(t * nkv, hd as u32)) }.map_err(dev_err)?;
        }
        Ok((k_new, v_new))
    }

    /// The MLP half's product of the row's `t` tokens of `x` into `delta` (`hn` its scratch).
    fn mlp(
        &self,
        layer: &crate::upload::Layer,
        x: &CudaSlice<f32>,
        (hn, delta): (&mut CudaSlice<f32>, &mut CudaSlice<f32>),
        t: usize,
    ) -> Result<(), EngineError> {
        let (s, cfg) = (self.dev.stream(), &self.cfg);
        let h = cfg.hidden_size;
        let im = cfg.intermediate_size;
        self.rms_norm(x, &layer.post_norm, hn, t, h, true)?;
        let mut g = self.alloc(t * im)?;
        let mut u = self.alloc(t * im)?;
        self.gemm(hn, &layer.gate, t, &mut g)?;
        self.gemm(hn, &layer.up, t, &mut u)?;
        let mut act = self.alloc(t * im)?;
        {
            let n = (t * im) as i64;
            let mut b = s.launch_builder(&self.f.silu_mul);
            b.arg(&g).arg(&u).arg(&mut act).arg(&n);
            unsafe { b.launch(blocks(t * im)) }.map_err(dev_err)?;
        }
        self.gemm(&act, &layer.down, t, delta)
    }

    /// The final norm of the rows of `x` at `wanted`, copied to the host.
    fn finish(&self, x: &CudaSlice<f32>, wanted: &[usize]) -> Result<Vec<f32>, EngineError> {
        let (s, h) = (self.dev.stream(), self.cfg.hidden_size);
        if wanted.is_empty() {
            s.synchronize().map_err(dev_err)?;
            return Ok(Vec::new());
        }
        let rows: Vec<i32> = wanted.iter().map(|&w| w as i32).collect();
        let rows_d = s.clone_htod(&rows).map_err(dev_err)?;
        let mut picked = self.alloc(wanted.len() * h)?;
        {
            let hi = h as i32;
            let mut b = s.launch_builder(&self.f.gather_rows);
            b.arg(x).arg(&rows_d).arg(&mut picked).arg(&hi);
            unsafe { b.launch(grid(wanted.len(), 256)) }.map_err(dev_err)?;
        }
        let mut normed = self.alloc(wanted.len() * h)?;
        self.rms_norm(
            &picked,
            &self.w.final_norm,
            &mut normed,
            wanted.len(),
            h,
            true,
        )?;
        let out = s.clone_dtoh(&normed).map_err(dev_err)?;
        Ok(out[..wanted.len() * h].to_vec())
    }
}

/// The CUDA backend serves the weights it was loaded with: it lays out no further adapter (an
/// uninhabited type, so no row can name one); several adapters run on the CPU backend.
#[derive(Debug)]
pub enum NoAdapter {}

impl Backend for CudaBackend {
    type State = CudaState;
    type Adapter = NoAdapter;

    fn load_adapter(&self, _base: &Path, _adapter: &Path) -> Result<NoAdapter, EngineError> {
        Err(EngineError::Adapter(
            "the CUDA backend serves the adapter it was loaded with; several adapters run on the CPU backend"
                .into(),
        ))
    }

    fn adapter_bytes(&self, adapter: &NoAdapter) -> usize {
        match *adapter {}
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn new_state(&self) -> CudaState {
        let cfg = &self.cfg;
        let s = self.dev.stream();
        let layers = cfg
            .layer_types
            .iter()
            .map(|k| match k {
                LayerKind::Linear => LayerState::Gdn {
                    conv: s
                        .alloc_zeros::<f32>(3 * cfg.conv_dim())
                        .expect("device memory for a state"),
                    rec: s
                        .alloc_zeros::<f32>(
                            cfg.linear_num_value_heads
                                * cfg.linear_key_head_dim
                                * cfg.linear_value_head_dim,
                        )
                        .expect("device memory for a state"),
                },
                LayerKind::Full => LayerState::Attn { k: None, v: None },
            })
            .collect();
        CudaState { pos: 0, layers }
    }

    fn position(&self, state: &CudaState) -> usize {
        state.pos
    }

    fn state_bytes(&self, state: &CudaState) -> usize {
        let floats: usize = state
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Gdn { conv, rec } => conv.len() + rec.len(),
                LayerState::Attn { k, v } => {
                    k.as_ref().map_or(0, |k| k.len()) + v.as_ref().map_or(0, |v| v.len())
                }
            })
            .sum();
        4 * floats
    }

    /// The recurrence runs token by token, so a row splits anywhere bit-exactly.
    fn snapshot_grain(&self) -> usize {
        1
    }

    /// A background pass runs as any other here: the GPU's queue is not where the long lane's pauses
    /// would help.
    fn forward(
        &self,
        rows: &mut [BatchRow<'_, CudaState, NoAdapter>],
        _background: Option<&kev_engine::Lanes>,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        for r in rows.iter() {
            if let Some(t) = r
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.cfg.vocab_size)
            {
                return Err(EngineError::Input(format!(
                    "token id {t} is outside the vocabulary (0..{})",
                    self.cfg.vocab_size
                )));
            }
            if let Some(w) = r.wanted.iter().find(|&&w| w >= r.tokens.len()) {
                return Err(EngineError::Input(format!(
                    "wanted index {w} is outside the row's {} new tokens",
                    r.tokens.len()
                )));
            }
        }
        // On error no state changes: each row runs on a copy that replaces the original only at the end.
        let mut next = Vec::with_capacity(rows.len());
        let mut out = Vec::with_capacity(rows.len());
        for r in rows.iter() {
            let mut st = r.state.clone();
            out.push(self.row(&mut st, r.tokens, r.wanted)?);
            next.push(st);
        }
        for (r, st) in rows.iter_mut().zip(next) {
            *r.state = st;
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("{} {}", self.dev.describe(), self.arm.name())
    }

    fn device(&self) -> String {
        format!("cuda:{}", self.dev.ordinal())
    }
}
