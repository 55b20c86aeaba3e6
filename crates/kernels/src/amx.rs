//! Intel AMX (Advanced Matrix Extensions): the tile units of Sapphire Rapids and later Xeons, used for
//! the bf16 arm (`tdpbf16ps`) and the int8 arm (`tdpbssd`).
//!
//! Why: on these CPUs `vdpbf16ps` issues at half the rate of an f32 FMA, so the AVX512_BF16 kernels sit
//! at about the f32 speed, while one tile product does 16 × 16 × 32 BF16 multiply-adds; torch reaches
//! the tiles through oneDNN. The panel layouts the other kernels use already are AMX's B operand: a
//! BF16 panel is `[k/2][64][2]` and an int8 panel `[k/4][64][4]`, 256 bytes per row, so the 16 columns
//! `16j..16j+16` of 16 consecutive pair (or quad) rows are one B tile loaded with a 256-byte stride,
//! straight from the packed weights.
//!
//! The tile instructions are written as inline assembly (the AMX intrinsics and target features are
//! not stable Rust); the tile registers are invisible to the compiler, which is why they may be held
//! across `asm!` blocks. Every tile is configured the same way (16 rows × 64 bytes), so one
//! configuration serves both arms. Linux hands the tile state to a process only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`); [`available`] asks once and reports whether
//! the CPU, the kernel and that request all say yes.
//!
//! Register use in a block: C tiles `tmm0..tmm3` (2 × 2 blocks of 16 × 16 f32 or i32), A tiles `tmm4`,
//! `tmm5` (rows 0–15 and 16–31), B tiles `tmm6`, `tmm7` (columns 0–15 and 16–31 of the half panel).
//!
//! Determinism: each output element is one chain over the input chunks of 16 pairs (or quads) in
//! increasing order, accumulated inside its tile, and depends only on its row of A: rows are padded to
//! blocks of 32 with zeros, so neither `m` nor a row's place in its block changes a bit.
//!
//! Schedule ([`run_gemm`]): rows in chunks that stay in L2 ([`chunks`]), and for each chunk the
//! threads take panels, each worker configuring its tiles once ([`TileGuard`]); a panel runs each
//! 32-row block of the chunk and asks the start of the next panel into L2 meanwhile, a few lines per
//! tile step ([`NextPanel`]); a block's results are handed out (dequantised) while the next block's
//! first half panel is on the tiles. The drivers are generic over a [`TileUnit`], so the tests run them on a
//! plain-arithmetic stand-in on every CPU as well as on the tiles where they exist.

use std::arch::asm;
use std::sync::OnceLock;

use super::buf::AlignedBuf;

/// Rows of A (and of C) per tile block: two 16-row tiles.
pub(crate) const ROWS: usize = 32;
/// Input pairs (bf16) or quads (int8) per tile step: 64 bytes of a row.
pub(crate) const STEP: usize = 16;
/// Bytes of one panel row (64 outputs × 4 bytes) — the B tiles' stride.
const PANEL_ROW: usize = 256;

/// Whether this CPU has AMX-TILE, AMX-BF16 and AMX-INT8 and the OS has granted the tile state to this
/// process (asked for once).
pub(crate) fn available() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpu_has_amx() && request_tiles())
}

fn cpu_has_amx() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 exists where the highest leaf says so.
    if __cpuid_count(0, 0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    // AMX-BF16 (bit 22), AMX-TILE (24), AMX-INT8 (25); plus AVX512_BF16 for the rounding.
    let amx = edx & (1 << 22) != 0 && edx & (1 << 24) != 0 && edx & (1 << 25) != 0;
    amx && std::arch::is_x86_feature_detected!("avx512bf16")
        && std::arch::is_x86_feature_detected!("avx512f")
}

#[cfg(target_os = "linux")]
fn request_tiles() -> bool {
    const ARCH_GET_XCOMP_PERM: i64 = 0x1022;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    const SYS_ARCH_PRCTL: i64 = 158;
    let req: i64;
    // SAFETY: arch_prctl with these codes only changes this process's permission for the tile state;
    // the syscall clobbers rcx and r11 as declared.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => req, in("rdi") ARCH_REQ_XCOMP_PERM,
             in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    if req != 0 {
        return false;
    }
    let mut mask = 0u64;
    let got: i64;
    // SAFETY: as above; the kernel writes one u64 to `mask`.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => got, in("rdi") ARCH_GET_XCOMP_PERM,
             in("rsi") &mut mask as *mut u64, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    got == 0 && mask & (1 << XFEATURE_XTILEDATA) != 0
}

#[cfg(not(target_os = "linux"))]
fn request_tiles() -> bool {
    false
}

/// The tile configuration (palette 1): eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

static CONFIG: TileConfig = {
    let mut colsb = [0u16; 16];
    let mut rows = [0u8; 16];
    let mut t = 0;
    while t < 8 {
        colsb[t] = 64;
        rows[t] = 16;
        t += 1;
    }
    TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb,
        rows,
    }
};

/// The tiles of unit `U` configured on this thread while any guard lives: the first guard of a thread
/// loads the configuration, guards taken inside it only count, and the last one dropped releases the
/// tiles (so a context switch does not carry 8 KiB of tile data for a thread that no longer uses them)
/// — except on a rayon worker, which keeps its tiles once it has loaded them.
///
/// Why: the tile GEMM takes a guard per panel of 64 outputs ([`run_panel`]); loading and releasing the
/// tiles each time was ≈ 17,700 `ldtilecfg` / `tilerelease` pairs a 4B forward, and the figures of the
/// one AMX CPU measured fit a cost of ≈ 64 µs per panel in both arms, whatever its bytes (results,
/// 2026-12-06). The workers run every panel, so they now configure once per thread. What a worker's
/// kept tiles cost: 8 KiB more in each of its context switches; an idle core is not held out of its deep
/// sleep by them (Sapphire Rapids demotes C6 while tile data is live; Linux ≥ 5.20 releases the
/// registers itself before idling and restores the task's saved state when it runs again). Not
/// `Send`: the count is the thread's.
pub(crate) struct TileGuard<U: TileUnit> {
    _unit: std::marker::PhantomData<(U, *const ())>,
}

impl<U: TileUnit> TileGuard<U> {
    /// Configure `U`'s tiles on this thread, unless a guard already holds them.
    ///
    /// # Safety
    /// `U` exists on this CPU (for [`Amx`]: [`available`] returned true).
    #[inline]
    pub(crate) unsafe fn enter() -> Self {
        U::depth().with(|d| {
            if d.get() == 0 {
                // SAFETY: the caller's contract.
                unsafe { U::load_config() };
                if rayon::current_thread_index().is_some() {
                    // The worker's own count, never dropped: its tiles stay loaded.
                    d.set(1);
                }
            }
            d.set(d.get() + 1);
        });
        TileGuard {
            _unit: std::marker::PhantomData,
        }
    }
}

impl<U: TileUnit> Drop for TileGuard<U> {
    fn drop(&mut self) {
        U::depth().with(|d| {
            let left = d.get() - 1;
            d.set(left);
            if left == 0 {
                // SAFETY: this thread's tiles were configured by the first guard (`enter`'s contract).
                unsafe { U::release() };
            }
        });
    }
}

/// Which tile product a block runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Product {
    /// `tdpbf16ps`: A and B are bf16 pairs, C f32.
    Bf16,
    /// `tdpbssd`: A and B are signed bytes in quads, C i32.
    Int8,
}

/// Where a block reads and writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    /// Row 0 of A at the block's first input; rows `lda` bytes apart, 32 of them readable for
    /// `steps · 64` bytes each.
    pub a: *const u8,
    pub lda: usize,
    /// The panel's row 0 plus the half's byte offset (0 or 128); `steps · 16` rows of 256 bytes.
    pub b: *const u8,
    /// The last step reads its B rows from here instead (a 16-row zero-padded copy of the panel's tail),
    /// when the inputs do not fill it.
    pub b_tail: Option<*const u8>,
    pub steps: usize,
    /// C: 32 rows of 32 f32/i32, `ldc` bytes apart.
    pub c: *mut u8,
    pub ldc: usize,
    /// The next panel's lines this block asks into L2 between its steps (a live slice, as
    /// [`StepPrefetch::of`] makes).
    pub ahead: StepPrefetch,
}

/// Lines of the next panel a block asks into L2: the `len` bytes at `from`, `per_step` lines before each
/// tile step (hints only, they change no value).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepPrefetch {
    pub from: *const u8,
    pub len: usize,
    pub per_step: usize,
}

impl StepPrefetch {
    /// Nothing to ask for.
    pub(crate) const NONE: StepPrefetch = StepPrefetch {
        from: std::ptr::NonNull::dangling().as_ptr(),
        len: 0,
        per_step: 0,
    };

    /// All of `bytes`, `per_step` lines before each step.
    fn of(bytes: &[u8], per_step: usize) -> Self {
        StepPrefetch {
            from: bytes.as_ptr(),
            len: bytes.len(),
            per_step,
        }
    }
}

/// How a panel asks the start of the next one ([`NEXT_PANEL_BYTES`]) into L2 while it runs.
/// `KEV_AMX_NEXT_PANEL=spread|burst|off` picks one for a process (read once), so the schedules can be
/// timed against each other on an AMX CPU with one build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextPanel {
    /// A few lines before each tile step, spread evenly over all the steps of the panel (at 94 rows
    /// and 2,560 inputs: 11 lines a step of four tile products, int8; 9, bf16). The default: it is how
    /// the float and int8 GEMMs measured on other CPUs ask for their next block (a share per row
    /// group, tens of lines at a time).
    Spread,
    /// A third of it (at 94 rows) before each 32-row block: bursts of over a thousand prefetches, the
    /// schedule as first written (2026-12-05); untimed, kept for the A/B.
    Burst,
    /// None: the hardware streamer alone (the schedule of the 2026-12-02 AMX figures).
    Off,
}

impl NextPanel {
    /// The schedule of this process: `KEV_AMX_NEXT_PANEL`, else [`NextPanel::Spread`].
    pub(crate) fn chosen() -> NextPanel {
        static CHOICE: OnceLock<NextPanel> = OnceLock::new();
        *CHOICE.get_or_init(|| match std::env::var("KEV_AMX_NEXT_PANEL") {
            Ok(v) if !v.is_empty() => {
                let choice = match v.as_str() {
                    "spread" => NextPanel::Spread,
                    "burst" => NextPanel::Burst,
                    "off" => NextPanel::Off,
                    other => {
                        tracing::warn!(
                            "KEV_AMX_NEXT_PANEL={other}: not spread, burst or off; using spread"
                        );
                        NextPanel::Spread
                    }
                };
                tracing::info!("AMX next-panel prefetch: {choice:?} (KEV_AMX_NEXT_PANEL)");
                choice
            }
            _ => NextPanel::Spread,
        })
    }
}

/// Bytes of `next` (`len` of them) that call `call` of `calls` asks for, `steps` tile steps each, when
/// spread: `per_step` lines a step, the calls' ranges consecutive and covering `0..len` (the last ones
/// may be empty). Returns the range and `per_step`.
fn spread_share(
    len: usize,
    call: usize,
    calls: usize,
    steps: usize,
) -> (std::ops::Range<usize>, usize) {
    if calls == 0 || steps == 0 {
        return (0..0, 0);
    }
    let per_step = len.div_ceil(64).div_ceil(calls * steps);
    let per_call = per_step * 64 * steps;
    let start = (call * per_call).min(len);
    (start..(start + per_call).min(len), per_step)
}

/// The four tile products of one step: `tmm0..3 += {tmm4, tmm5} × {tmm6, tmm7}` (the peak loop's; a
/// block interleaves them with its loads).
///
/// # Safety
/// The thread's tiles are configured and hold the step's operands.
#[cfg(feature = "peak")]
#[inline(always)]
unsafe fn products(product: Product) {
    // SAFETY: the caller's contract; register-only instructions.
    unsafe {
        match product {
            Product::Bf16 => asm!(
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                options(nostack, nomem)
            ),
            Product::Int8 => asm!(
                "tdpbssd tmm0, tmm4, tmm6",
                "tdpbssd tmm1, tmm4, tmm7",
                "tdpbssd tmm2, tmm5, tmm6",
                "tdpbssd tmm3, tmm5, tmm7",
                options(nostack, nomem)
            ),
        }
    }
}

/// The activation rows of a [`run_panel`] call: `m` rows from `a`, `lda` bytes apart, padded as it
/// requires.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TileRows {
    pub a: *const u8,
    pub lda: usize,
    pub m: usize,
}

/// A task's buffers for [`run_panel`]: two 32-row blocks of results (64 per row; one being stored while
/// the other is handed out) and the zero-padded copy of a panel's partial last step.
struct Scratch {
    out: AlignedBuf<i32>,
    tail: AlignedBuf<u8>,
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            out: AlignedBuf::zeroed(2 * ROWS * 64),
            tail: AlignedBuf::zeroed(STEP * PANEL_ROW),
        }
    }
}

/// The tile unit blocks run on: the CPU's tiles ([`Amx`]) or, in tests, a plain-arithmetic stand-in
/// with the same contract, so the drivers above the assembly (row chunks, panels, tails, padding, the
/// configuration held across panels) are tested on every CPU, not only where AMX exists.
pub(crate) trait TileUnit: Sized {
    /// Load the tile configuration on this thread ([`TileGuard`] calls it for the first guard).
    ///
    /// # Safety
    /// The unit exists on this CPU (for [`Amx`]: [`available`] returned true).
    unsafe fn load_config();
    /// Release this thread's tiles ([`TileGuard`] calls it when the last guard goes).
    ///
    /// # Safety
    /// The tiles were configured on this thread.
    unsafe fn release();
    /// The thread's count of live [`TileGuard`]s of this unit.
    fn depth() -> &'static std::thread::LocalKey<std::cell::Cell<u32>>;
    /// [`block`]'s contract.
    ///
    /// # Safety
    /// As [`block`].
    unsafe fn block(product: Product, blk: Block, between: &mut dyn FnMut());
}

/// The CPU's tiles.
pub(crate) struct Amx;

thread_local! {
    static AMX_GUARDS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl TileUnit for Amx {
    #[inline]
    unsafe fn load_config() {
        // SAFETY: AMX present and granted (the caller's contract); the config is 64 valid bytes.
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) &CONFIG as *const TileConfig, options(nostack, readonly))
        };
    }
    #[inline]
    unsafe fn release() {
        // SAFETY: AMX present (the caller's contract).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
    fn depth() -> &'static std::thread::LocalKey<std::cell::Cell<u32>> {
        &AMX_GUARDS
    }
    #[inline]
    unsafe fn block(product: Product, blk: Block, between: &mut dyn FnMut()) {
        // SAFETY: forwarded.
        unsafe { block(product, blk, between) }
    }
}

/// Bytes of activation rows one chunk of a tile GEMM keeps in L2 while every panel passes over them:
/// half the 2 MiB of L2 each core of every AMX CPU so far has (Sapphire, Emerald, Granite Rapids), the
/// rest for the panel in use and the next one arriving.
const A_CHUNK_BYTES: usize = 1 << 20;

/// Chunks for `m` activation rows `lda` bytes apart: as few as keep each within [`A_CHUNK_BYTES`] (whole
/// 32-row blocks, spread evenly by [`run_gemm`]); one where the rows fit half again that (L2 still holds
/// them: a second chunk would read every weight twice for a few rows) or fewer than three blocks fit.
///
/// Why: without chunks each panel streams all the rows again, and at a long row the rows outgrow L2:
/// at 1,518 tokens and 2,560 inputs that is 3.9 MB (int8) or 7.8 MB (bf16) from L3 per 64 outputs, about
/// 170 GB per bf16 forward of the 4B, where the tiles need a few tens of microseconds per panel. With
/// chunks the rows come from L2 and the weights are read once per chunk instead, `64 / rows` of that
/// traffic; below three blocks that ratio is no gain, so the rows stay whole.
pub(crate) fn chunks(lda: usize, m: usize) -> usize {
    let most = A_CHUNK_BYTES / lda.max(1) / ROWS;
    let blocks = m.div_ceil(ROWS);
    if most < 3 || 2 * blocks <= 3 * most {
        return 1;
    }
    blocks.div_ceil(most)
}

/// Where chunk `i` of `chunks` starts: block boundaries spread evenly (sizes differ by one block at most).
fn chunk_start(i: usize, chunks: usize, m: usize) -> usize {
    (i * m.div_ceil(ROWS) / chunks * ROWS).min(m)
}

/// The weights of a tile GEMM: `n` outputs in panels of 64, `panel_bytes` each, in the layout the B
/// tiles read (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Panels<'a> {
    pub data: &'a [u8],
    pub panel_bytes: usize,
    pub n: usize,
}

/// One product on the tiles: what it multiplies, the activation rows, the weight panels, the row chunks
/// ([`chunks`]) and where it may pause.
pub(crate) struct Job<'a> {
    pub product: Product,
    pub rows: TileRows,
    pub w: Panels<'a>,
    pub chunks: usize,
    pub pause: crate::SafePoint<'a>,
}

/// Bytes of the next panel asked into L2 while a panel runs: its first steps, which the hardware
/// streamer has not yet found when the panel starts; the rest it streams.
const NEXT_PANEL_BYTES: usize = 256 << 10;

/// `C = A · Wᵀ` on tiles: rows in `chunks` even chunks of whole blocks (see [`chunks`]); for each chunk
/// the threads take panels, and each panel runs every 32-row block of the chunk ([`run_panel`]), then
/// `out(p, r0, rows, results)` with the panel, the block's first row (of all `m`), its number of real rows
/// and its results (64 per row, as [`run_panel`] gives them).
///
/// Every output is one chain over its inputs in increasing order inside one block, whatever the chunk,
/// so the chunk changes no bit.
///
/// # Safety
/// As [`run_panel`] for all `rows.m` rows, with `depth = w.panel_bytes / 256`; `U` exists on this CPU.
pub(crate) unsafe fn run_gemm<U: TileUnit>(
    job: Job<'_>,
    out: impl Fn(usize, usize, usize, &[i32]) + Sync,
) {
    use rayon::prelude::*;
    let Job {
        product,
        rows,
        w,
        chunks,
        pause,
    } = job;
    let TileRows { a, lda, m } = rows;
    let panels = w.n.div_ceil(64);
    assert!(
        w.data.len() >= panels * w.panel_bytes,
        "run_gemm: panels too short"
    );
    let abase = a as usize;
    let chunks = chunks.max(1);
    for ci in 0..chunks {
        let (c0, c1) = (chunk_start(ci, chunks, m), chunk_start(ci + 1, chunks, m));
        if c0 == c1 {
            continue;
        }
        let mc = c1 - c0;
        (0..panels)
            .into_par_iter()
            .for_each_init(Scratch::new, |scratch, p| {
                pause.reach();
                let panel = &w.data[p * w.panel_bytes..(p + 1) * w.panel_bytes];
                let next = if p + 1 < panels {
                    let np = &w.data[(p + 1) * w.panel_bytes..(p + 2) * w.panel_bytes];
                    &np[..np.len().min(NEXT_PANEL_BYTES)]
                } else {
                    &[]
                };
                let chunk_rows = TileRows {
                    a: (abase as *const u8).wrapping_add(c0 * lda),
                    lda,
                    m: mc,
                };
                // SAFETY: the chunk's rows are rows c0.. of the caller's rows, whose padding to whole
                // blocks covers the chunk's (c0 is a multiple of 32); the unit exists (the caller's
                // contract).
                unsafe {
                    run_panel::<U>(
                        product,
                        chunk_rows,
                        panel,
                        (w.n - p * 64).min(64),
                        scratch,
                        next,
                        |r0, rows, res| out(p, c0 + r0, rows, res),
                    )
                };
            });
    }
}

/// The product of all activation rows with one 64-output panel: for each 32-row block, both half panels
/// over every input step, then `out(r0, rows, results)` with the block's first row, its number of real
/// rows (`min(32, m − r0)`) and its results, 64 per row (f32 bits for [`Product::Bf16`], i32 for
/// [`Product::Int8`]; columns past `ncols` are not computed). `next` (the weights that follow) is asked
/// into L2 as [`NextPanel::chosen`] says.
///
/// # Safety
/// `U` exists on this CPU; `rows.a` addresses `rows.m.div_ceil(32) · 32` rows `rows.lda` bytes
/// apart, each with `depth.div_ceil(16) · 64` readable bytes (zeros past the inputs), where
/// `depth = panel.len() / 256`.
unsafe fn run_panel<U: TileUnit>(
    product: Product,
    rows: TileRows,
    panel: &[u8],
    ncols: usize,
    scratch: &mut Scratch,
    next: &[u8],
    mut out: impl FnMut(usize, usize, &[i32]),
) {
    let TileRows { a, lda, m } = rows;
    let depth = panel.len() / PANEL_ROW;
    let (steps, tail) = (depth.div_ceil(STEP), depth % STEP);
    let b_tail = (tail != 0).then(|| {
        let t: &mut [u8; STEP * PANEL_ROW] = (&mut scratch.tail[..]).try_into().expect("tail size");
        tail_copy(&panel[(depth - tail) * PANEL_ROW..], t);
        scratch.tail.as_ptr()
    });
    let blocks = m.div_ceil(ROWS);
    let halves = if ncols > 32 { 2 } else { 1 };
    let schedule = NextPanel::chosen();
    // SAFETY: the unit exists (the caller's contract). On a worker that has run a panel before, this
    // only counts.
    let _tiles = unsafe { TileGuard::<U>::enter() };
    // Results alternate between the two halves of `scratch.out` (block `b` in half `b % 2`): block
    // `b`'s are handed to `out` while block `b + 1`'s first half panel is on the tiles (see [`block`]),
    // so the vector work of `out` overlaps the tile work instead of following it.
    let results = scratch.out.as_mut_ptr();
    // SAFETY: half `buf` of the buffer; a caller reads the half no tile store is writing (the one of
    // the block before the one on the tiles, or of the last block once all are done).
    let result = |buf: usize| unsafe {
        std::slice::from_raw_parts(results.add(buf * ROWS * 64) as *const i32, ROWS * 64)
    };
    let mut r0 = 0;
    while r0 < m {
        let buf = (r0 / ROWS) % 2;
        if schedule == NextPanel::Burst {
            super::cache::prefetch_share(next, r0 / ROWS, blocks);
        }
        for h in 0..halves {
            let ahead = if schedule == NextPanel::Spread {
                let (range, per_step) =
                    spread_share(next.len(), (r0 / ROWS) * halves + h, blocks * halves, steps);
                StepPrefetch::of(&next[range], per_step)
            } else {
                StepPrefetch::NONE
            };
            // SAFETY: rows r0..r0+32 exist with `steps · 64` bytes each (the caller's contract); the
            // panel holds `depth` rows of 256 bytes and a partial last step reads the padded copy; the
            // block writes 32 rows of 32 values into the result buffer (256-byte rows).
            unsafe {
                U::block(
                    product,
                    Block {
                        a: a.add(r0 * lda),
                        lda,
                        b: panel.as_ptr().add(h * 128),
                        b_tail: b_tail.map(|t| t.add(h * 128)),
                        steps,
                        c: (results.add(buf * ROWS * 64) as *mut u8).add(h * 128),
                        ldc: 64 * 4,
                        ahead,
                    },
                    // Only the last block can be short, so the one before this is whole.
                    &mut || {
                        if h == 0 && r0 > 0 {
                            out(r0 - ROWS, ROWS, result(buf ^ 1))
                        }
                    },
                )
            };
        }
        r0 += ROWS;
    }
    if let Some(last) = blocks.checked_sub(1) {
        out(last * ROWS, m - last * ROWS, result(last % 2));
    }
}

/// `C[0..32][0..32] = Σ_steps A · B` for one 32-row block and one half panel (32 outputs), running
/// `between` after the last tile product is issued and before C is stored.
///
/// Why `between`: the tile unit works through the issued products for thousands of cycles after the
/// loop has issued them, while the vector units idle until the store; vector work placed there (the
/// previous block's dequantisation) runs in that shadow instead of after it. It must not touch C.
///
/// # Safety
/// The thread's tiles are configured (a [`TileGuard`] lives); the pointers address the extents
/// documented on [`Block`].
#[inline]
unsafe fn block(product: Product, blk: Block, between: &mut dyn FnMut()) {
    let Block {
        a,
        lda,
        b,
        b_tail,
        steps,
        c,
        ldc,
        ahead,
    } = blk;
    // SAFETY: `ahead` describes a live slice (see `StepPrefetch`; `NONE` an empty one).
    let ask = unsafe { std::slice::from_raw_parts(ahead.from, ahead.len) };
    let ask_step = 64 * ahead.per_step;
    // SAFETY: the caller's contract; tile loads read 16 rows × 64 bytes at the given strides, stores
    // write the same into C.
    unsafe {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let a1 = a.add(16 * lda);
        for s in 0..steps {
            super::x86::prefetch_l2(ask, s * ask_step, (s + 1) * ask_step);
            let off = s * 64;
            let bs = match b_tail {
                Some(t) if s + 1 == steps => t,
                _ => b.add(s * STEP * PANEL_ROW),
            };
            // Each product follows the two loads it needs, so the unit starts on the first while the
            // later tiles load (the four loads first, then the four products, measured the same on
            // their own; this is the order of the build the A/B in docs/results/engine.md timed).
            macro_rules! step {
                ($tdp:literal) => {
                    asm!(
                        "tileloadd tmm4, [{a0} + {lda}]",
                        "tileloadd tmm6, [{b0} + {ldb}]",
                        concat!($tdp, " tmm0, tmm4, tmm6"),
                        "tileloadd tmm7, [{b1} + {ldb}]",
                        concat!($tdp, " tmm1, tmm4, tmm7"),
                        "tileloadd tmm5, [{a1} + {lda}]",
                        concat!($tdp, " tmm2, tmm5, tmm6"),
                        concat!($tdp, " tmm3, tmm5, tmm7"),
                        a0 = in(reg) a.add(off),
                        a1 = in(reg) a1.add(off),
                        b0 = in(reg) bs,
                        b1 = in(reg) bs.add(64),
                        lda = in(reg) lda,
                        ldb = in(reg) PANEL_ROW,
                        options(nostack, readonly)
                    )
                };
            }
            match product {
                Product::Bf16 => step!("tdpbf16ps"),
                Product::Int8 => step!("tdpbssd"),
            }
        }
        between();
        asm!(
            "tilestored [{c0} + {ldc}], tmm0",
            "tilestored [{c1} + {ldc}], tmm1",
            "tilestored [{c2} + {ldc}], tmm2",
            "tilestored [{c3} + {ldc}], tmm3",
            c0 = in(reg) c,
            c1 = in(reg) c.add(64),
            c2 = in(reg) c.add(16 * ldc),
            c3 = in(reg) c.add(16 * ldc + 64),
            ldc = in(reg) ldc,
            options(nostack)
        );
    }
}

/// A zero-padded copy of a panel's last, partial step: `rows` panel rows from `src`, then zeros up to 16.
fn tail_copy(src: &[u8], buf: &mut [u8; STEP * PANEL_ROW]) {
    buf.fill(0);
    buf[..src.len()].copy_from_slice(src);
}

/// Peak loop: `iters` rounds of 4 independent tile products on tiles loaded once; returns a value that
/// depends on them. Multiply-adds per round: 4 × 16 × 16 × 32 (bf16) or × 64 (int8).
///
/// # Safety
/// [`available`] returned true.
#[cfg(feature = "peak")]
pub(crate) unsafe fn peak(product: Product, iters: u64) -> f32 {
    let src = AlignedBuf::<u8>::zeroed(16 * 64);
    let mut out = AlignedBuf::<f32>::zeroed(16 * 16);
    // SAFETY: AMX granted (the caller's contract); the loads read 16 × 64 bytes of `src`, the store
    // writes 16 × 64 bytes of `out`.
    unsafe {
        let _tiles = TileGuard::<Amx>::enter();
        asm!(
            "tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3",
            "tileloadd tmm4, [{p} + {s}]", "tileloadd tmm5, [{p} + {s}]",
            "tileloadd tmm6, [{p} + {s}]", "tileloadd tmm7, [{p} + {s}]",
            p = in(reg) src.as_ptr(), s = in(reg) 64usize, options(nostack, readonly)
        );
        for _ in 0..iters {
            products(product);
        }
        asm!("tilestored [{p} + {s}], tmm3", p = in(reg) out.as_mut_ptr(), s = in(reg) 64usize,
             options(nostack));
    }
    out[0]
}

#[cfg(test)]
mod tests;
