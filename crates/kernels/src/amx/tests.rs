use super::*;

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// The tile block's contract in plain arithmetic (f32 sums in the block's order for bf16), so the
/// drivers are tested on CPUs without tiles; [`a_tile_block_is_the_plain_product`] holds it to the
/// same test as the assembly.
struct Emulated;

thread_local! {
    static EMULATED_GUARDS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Whether this thread's stand-in tiles are configured: a block without is a driver's bug
    /// (on the CPU's tiles, a fault).
    static EMULATED_LOADED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl TileUnit for Emulated {
    unsafe fn load_config() {
        assert!(!EMULATED_LOADED.get(), "configured twice without a release");
        EMULATED_LOADED.set(true);
    }
    unsafe fn release() {
        assert!(
            EMULATED_LOADED.get(),
            "released tiles that were not configured"
        );
        EMULATED_LOADED.set(false);
    }
    fn depth() -> &'static std::thread::LocalKey<std::cell::Cell<u32>> {
        &EMULATED_GUARDS
    }
    unsafe fn block(product: Product, blk: Block, between: &mut dyn FnMut()) {
        assert!(
            EMULATED_LOADED.get(),
            "a tile block on a thread without a configuration"
        );
        // SAFETY: forwarded.
        unsafe { stand_in_block(product, blk, between) }
    }
}

/// The stand-ins' block: [`plain_block`], then `between` — after C is written, where the tiles run it
/// before, so a driver whose `between` reads the C being computed sees the new block's values and the
/// GEMM tests fail.
///
/// # Safety
/// As [`plain_block`].
unsafe fn stand_in_block(product: Product, blk: Block, between: &mut dyn FnMut()) {
    // SAFETY: forwarded.
    unsafe { plain_block(product, blk) };
    between();
}

/// [`block`]'s contract in plain arithmetic (the stand-ins' tile block).
///
/// # Safety
/// As [`block`]'s, but for the tiles.
unsafe fn plain_block(product: Product, blk: Block) {
    let (a, lda, c, ldc) = (blk.a, blk.lda, blk.c, blk.ldc);
    let bf16 = |p: *const u8| {
        // SAFETY: the caller's extents (two readable bytes).
        let v = unsafe { u16::from_le_bytes([*p, *p.add(1)]) };
        f32::from_bits((v as u32) << 16)
    };
    // SAFETY: the extents of `block`'s contract: A 32 rows of `steps · 64` bytes, B `steps · 16`
    // rows of 256 bytes (the last step from the tail copy), C 32 rows of 32 values.
    unsafe {
        for r in 0..ROWS {
            for j in 0..32 {
                let (mut si, mut sf) = (0i32, 0f32);
                for s in 0..blk.steps {
                    let bs = match blk.b_tail {
                        Some(t) if s + 1 == blk.steps => t,
                        _ => blk.b.add(s * STEP * PANEL_ROW),
                    };
                    for q in 0..STEP {
                        let ap = a.add(r * lda + s * 64 + q * 4);
                        let bp = bs.add(q * PANEL_ROW + j * 4);
                        match product {
                            Product::Int8 => {
                                for l in 0..4 {
                                    si += *ap.add(l) as i8 as i32 * *bp.add(l) as i8 as i32;
                                }
                            }
                            Product::Bf16 => {
                                for l in 0..2 {
                                    sf += bf16(ap.add(2 * l)) * bf16(bp.add(2 * l));
                                }
                            }
                        }
                    }
                }
                let bits = match product {
                    Product::Int8 => si as u32,
                    Product::Bf16 => sf.to_bits(),
                };
                (c.add(r * ldc + j * 4) as *mut u32).write_unaligned(bits);
            }
        }
    }
}

/// One block straight from the assembly (and from the stand-in): 32 rows × 32 outputs over 2 full
/// steps and a partial third (read from the zero-padded tail copy), against plain arithmetic. Small
/// integers in bf16 and int8, so every sum is exact and the comparison is bit for bit.
#[test]
fn a_tile_block_is_the_plain_product() {
    block_is_the_plain_product::<Emulated>();
    if !available() {
        println!(
            "skipped (the assembly): this CPU (or OS) has no AMX tiles; only the stand-in ran"
        );
        return;
    }
    block_is_the_plain_product::<Amx>();
}

fn block_is_the_plain_product<U: TileUnit>() {
    let (steps, tail) = (3usize, 5usize);
    let depth = (steps - 1) * STEP + tail; // pair (or quad) rows of the panel
    for product in [Product::Bf16, Product::Int8] {
        let mut seed = 7;
        let lda = steps * 64 + 64;
        let mut a = vec![0u8; ROWS * lda];
        let mut panel = vec![0u8; depth * PANEL_ROW];
        // Values in -4..=4: bf16 bit patterns of small integers, or plain bytes.
        let val = |seed: &mut u64| (lcg(seed) % 9) as i32 - 4;
        let lanes = if product == Product::Bf16 { 2 } else { 4 };
        let mut av = vec![0i32; ROWS * depth * lanes];
        for r in 0..ROWS {
            for e in 0..depth * lanes {
                let v = val(&mut seed);
                av[r * depth * lanes + e] = v;
                put(product, &mut a[r * lda..], e, v);
            }
        }
        let mut bv = vec![0i32; depth * 64 * lanes];
        for (e, x) in bv.iter_mut().enumerate() {
            *x = val(&mut seed);
            put(product, &mut panel, e, *x);
        }
        let mut tbuf = [0u8; STEP * PANEL_ROW];
        tail_copy(&panel[(depth - tail) * PANEL_ROW..], &mut tbuf);
        for h in 0..2 {
            let mut c = vec![0u32; ROWS * 32];
            let mut calls = 0;
            // SAFETY: AMX checked; A has 32 rows of `steps · 64` bytes, the panel `depth` rows
            // (the last step reads the tail copy), C 32 rows of 128 bytes.
            unsafe {
                let _tiles = TileGuard::<U>::enter();
                U::block(
                    product,
                    Block {
                        a: a.as_ptr(),
                        lda,
                        b: panel.as_ptr().add(h * 128),
                        b_tail: Some(tbuf.as_ptr().add(h * 128)),
                        steps,
                        c: c.as_mut_ptr() as *mut u8,
                        ldc: 128,
                        // Hints over the panel itself: the loop runs, the values cannot change.
                        ahead: StepPrefetch::of(&panel, 3),
                    },
                    &mut || calls += 1,
                );
            }
            for r in 0..ROWS {
                for j in 0..32 {
                    let col = h * 32 + j;
                    let mut want = 0i32;
                    for d in 0..depth {
                        for l in 0..lanes {
                            want += av[r * depth * lanes + d * lanes + l]
                                * bv[(d * 64 + col) * lanes + l];
                        }
                    }
                    let got = match product {
                        Product::Bf16 => f32::from_bits(c[r * 32 + j]) as i32,
                        Product::Int8 => c[r * 32 + j] as i32,
                    };
                    assert_eq!(got, want, "{product:?} row {r} column {col}");
                }
            }
            assert_eq!(calls, 1, "`between` runs once per block");
        }
    }
}

/// Small values of `product`'s element at `e` of `buf`: a bf16 pair element or a byte.
fn put(product: Product, buf: &mut [u8], e: usize, v: i32) {
    match product {
        Product::Bf16 => {
            buf[2 * e..2 * e + 2].copy_from_slice(&crate::bf16_bits(v as f32).to_le_bytes())
        }
        Product::Int8 => buf[e] = v as i8 as u8,
    }
}

/// The whole driver (row chunks, panels on threads, partial last panel, half panels past the
/// outputs, partial last step, rows padded to blocks) on the stand-in unit, against the plain product
/// — on every CPU; and on the tiles where they exist. Every output is delivered exactly once.
#[test]
fn a_tile_gemm_in_chunks_is_the_plain_product() {
    use std::sync::Mutex;
    // (m, depth in pairs or quads, n, chunks)
    let shapes = [
        (1usize, 5usize, 3usize, 1usize),
        (33, 16, 64, 1),
        (70, 37, 100, 3),
        (100, 48, 130, 2),
        (200, 20, 64, 3),
        (200, 9, 70, 7),
        (31, 33, 200, 1),
    ];
    let units: &[(&str, bool)] = &[("stand-in", true), ("tiles", available())];
    for &(unit, present) in units {
        if !present {
            println!(
                "skipped (the assembly): this CPU (or OS) has no AMX tiles; only the stand-in ran"
            );
            continue;
        }
        for product in [Product::Bf16, Product::Int8] {
            let lanes = if product == Product::Bf16 { 2 } else { 4 };
            for &(m, depth, n, chunk) in &shapes {
                let mut seed = (m * 31 + depth * 7 + n) as u64;
                let val = |seed: &mut u64| (lcg(seed) % 9) as i32 - 4;
                let steps = depth.div_ceil(STEP);
                let lda = steps * 64 + 64;
                let mut a = vec![0u8; m.div_ceil(ROWS) * ROWS * lda];
                let mut av = vec![0i32; m * depth * lanes];
                for r in 0..m {
                    for e in 0..depth * lanes {
                        let v = val(&mut seed);
                        av[r * depth * lanes + e] = v;
                        put(product, &mut a[r * lda..], e, v);
                    }
                }
                let panels = n.div_ceil(64);
                let panel_bytes = depth * PANEL_ROW;
                let mut wdata = vec![0u8; panels * panel_bytes];
                let mut wv = vec![0i32; n * depth * lanes];
                for j in 0..n {
                    for d in 0..depth {
                        for l in 0..lanes {
                            let v = val(&mut seed);
                            wv[(j * depth + d) * lanes + l] = v;
                            let (p, col) = (j / 64, j % 64);
                            let e = (d * 64 + col) * lanes + l;
                            put(product, &mut wdata[p * panel_bytes..], e, v);
                        }
                    }
                }
                let got = Mutex::new((vec![0i32; m * n], vec![0u8; m * n]));
                let out = |p: usize, r0: usize, rows: usize, res: &[i32]| {
                    let mut g = got.lock().unwrap();
                    for r in 0..rows {
                        for col in 0..(n - p * 64).min(64) {
                            let (i, j) = (r0 + r, p * 64 + col);
                            let v = match product {
                                Product::Bf16 => f32::from_bits(res[r * 64 + col] as u32) as i32,
                                Product::Int8 => res[r * 64 + col],
                            };
                            g.0[i * n + j] = v;
                            g.1[i * n + j] += 1;
                        }
                    }
                };
                let rows = TileRows {
                    a: a.as_ptr(),
                    lda,
                    m,
                };
                let w = Panels {
                    data: &wdata,
                    panel_bytes,
                    n,
                };
                // SAFETY: rows padded to whole blocks with `steps · 64` bytes each (zeros past the
                // inputs); the unit is present (checked above).
                unsafe {
                    let job = Job {
                        product,
                        rows,
                        w,
                        chunks: chunk,
                        pause: crate::SafePoint::NONE,
                    };
                    if unit == "tiles" {
                        run_gemm::<Amx>(job, out)
                    } else {
                        run_gemm::<Emulated>(job, out)
                    }
                };
                let (got, seen) = got.into_inner().unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let want: i32 = (0..depth * lanes)
                            .map(|e| av[i * depth * lanes + e] * wv[j * depth * lanes + e])
                            .sum();
                        let at = (unit, product, m, depth, n, chunk, i, j);
                        assert_eq!(seen[i * n + j], 1, "{at:?} delivered once");
                        assert_eq!(got[i * n + j], want, "{at:?}");
                    }
                }
            }
        }
    }
}

/// The stand-in, counting its configurations (its own counters: no other test uses this unit).
struct Counted;

static COUNTED_LOADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static COUNTED_RELEASES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

thread_local! {
    static COUNTED_GUARDS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    static COUNTED_LOADED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl TileUnit for Counted {
    unsafe fn load_config() {
        assert!(!COUNTED_LOADED.get(), "configured twice without a release");
        COUNTED_LOADED.set(true);
        COUNTED_LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    unsafe fn release() {
        assert!(
            COUNTED_LOADED.get(),
            "released tiles that were not configured"
        );
        COUNTED_LOADED.set(false);
        COUNTED_RELEASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn depth() -> &'static std::thread::LocalKey<std::cell::Cell<u32>> {
        &COUNTED_GUARDS
    }
    unsafe fn block(product: Product, blk: Block, between: &mut dyn FnMut()) {
        assert!(
            COUNTED_LOADED.get(),
            "a tile block on a thread without a configuration"
        );
        // SAFETY: forwarded.
        unsafe { stand_in_block(product, blk, between) }
    }
}

/// Guards nest: the first loads the configuration, the last releases it (off the workers); and a
/// tile GEMM's workers configure their tiles once, not once per panel (40 panels here, on two
/// threads, twice), every block still running configured.
#[test]
fn tiles_are_configured_once_per_worker_not_once_per_panel() {
    use std::sync::atomic::Ordering::Relaxed;
    let counts = || (COUNTED_LOADS.load(Relaxed), COUNTED_RELEASES.load(Relaxed));
    {
        // SAFETY: the stand-in exists everywhere.
        let _outer = unsafe { TileGuard::<Counted>::enter() };
        {
            // SAFETY: as above.
            let _inner = unsafe { TileGuard::<Counted>::enter() };
            assert_eq!(counts(), (1, 0));
        }
        assert_eq!(
            counts(),
            (1, 0),
            "the inner guard does not release the outer's tiles"
        );
    }
    assert_eq!(counts(), (1, 1));

    let (m, depth, panels) = (70usize, 20usize, 40usize);
    let n = panels * 64;
    let steps = depth.div_ceil(STEP);
    let lda = steps * 64 + 64;
    let mut seed = 3;
    let mut a = vec![0u8; m.div_ceil(ROWS) * ROWS * lda];
    for r in 0..m {
        for e in 0..depth * 4 {
            a[r * lda + e] = (lcg(&mut seed) % 9) as u8;
        }
    }
    let panel_bytes = depth * PANEL_ROW;
    let wdata: Vec<u8> = (0..panels * panel_bytes)
        .map(|_| (lcg(&mut seed) % 9) as u8)
        .collect();
    let got = std::sync::Mutex::new(vec![0i32; m * n]);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let run = || {
        // SAFETY: rows padded to whole blocks with `steps · 64` bytes each; the stand-in exists.
        unsafe {
            run_gemm::<Counted>(
                Job {
                    product: Product::Int8,
                    rows: TileRows {
                        a: a.as_ptr(),
                        lda,
                        m,
                    },
                    w: Panels {
                        data: &wdata,
                        panel_bytes,
                        n,
                    },
                    chunks: 1,
                    pause: crate::SafePoint::NONE,
                },
                |p, r0, rows, res| {
                    let mut g = got.lock().unwrap();
                    for r in 0..rows {
                        g[(r0 + r) * n + p * 64..(r0 + r) * n + p * 64 + 64]
                            .copy_from_slice(&res[r * 64..r * 64 + 64]);
                    }
                },
            )
        }
    };
    pool.install(run);
    pool.install(run);
    let (loads, releases) = counts();
    let (loads, releases) = (loads - 1, releases - 1);
    println!("{panels} panels on 2 threads, twice: {loads} configurations");
    assert!(
        (1..=2).contains(&loads),
        "{loads} configurations for 2 × {panels} panels on 2 workers"
    );
    assert_eq!(releases, 0, "the workers keep their tiles");
    let got = got.into_inner().unwrap();
    for (i, j) in [(0, 0), (5, 700), (69, n - 1), (33, 1234)] {
        let (p, col) = (j / 64, j % 64);
        let want: i32 = (0..depth * 4)
            .map(|e| {
                let w = wdata[p * panel_bytes + (e / 4 * 64 + col) * 4 + e % 4];
                a[i * lda + e] as i8 as i32 * w as i8 as i32
            })
            .sum();
        assert_eq!(got[i * n + j], want, "row {i} output {j}");
    }
}

/// Spread over a panel's blocks, the next panel's lines are asked for once each: the calls' ranges
/// follow one another and cover it, each within what its steps ask for (`per_step` lines a step).
#[test]
fn spread_prefetch_covers_the_next_panel_once() {
    for len in [0usize, 64, 100, 160 << 10, 256 << 10, 1_000_003] {
        for (calls, steps) in [
            (1usize, 1usize),
            (2, 40),
            (6, 40),
            (6, 80),
            (24, 144),
            (7, 3),
        ] {
            let mut at = 0;
            for call in 0..calls {
                let (r, per_step) = spread_share(len, call, calls, steps);
                assert_eq!(r.start, at, "{len} {calls} {steps}: call {call}");
                assert!(r.len() <= per_step * 64 * steps);
                at = r.end;
            }
            assert_eq!(at, len, "{len} bytes, {calls} calls of {steps} steps");
        }
    }
    assert_eq!(spread_share(4096, 0, 0, 5), (0..0, 0));
    // The 4B at 94 rows: 2,560 lines of an int8 panel over 3 blocks × 2 halves × 40 steps.
    assert_eq!(spread_share(160 << 10, 0, 6, 40).1, 11);
    assert_eq!(spread_share(256 << 10, 0, 6, 80).1, 9);
}

/// Chunks are whole 32-row blocks inside the L2 budget and even (sizes one block apart at most);
/// rows that fit half again the budget, or too wide for three blocks, stay whole (the 4B's shapes:
/// 2,560 and 9,216 inputs).
#[test]
fn chunks_are_whole_even_blocks_that_fit_the_budget() {
    let int8 = |k: usize| k + 64;
    let bf16 = |k: usize| (k / 2 + 16) * 4;
    assert_eq!(chunks(int8(2560), 1518), 4);
    assert_eq!(chunks(bf16(2560), 1518), 8);
    assert_eq!(chunks(int8(9216), 1518), 16);
    assert_eq!(chunks(bf16(9216), 1518), 1);
    assert_eq!(chunks(int8(2560), 380), 1);
    assert_eq!(chunks(int8(2560), 600), 2);
    for lda in [64usize, 1_000, 2_624, 5_184, 9_280, 12_000, 18_496, 100_000] {
        for m in [1usize, 31, 100, 380, 600, 1_518, 5_000] {
            let n = chunks(lda, m);
            let padded = m.div_ceil(ROWS) * ROWS;
            if n == 1 {
                let fits = 2 * padded * lda <= 3 * A_CHUNK_BYTES;
                assert!(fits || 3 * ROWS * lda > A_CHUNK_BYTES, "{lda} {m}");
                continue;
            }
            let sizes: Vec<usize> = (0..n)
                .map(|i| chunk_start(i + 1, n, m) - chunk_start(i, n, m))
                .collect();
            assert_eq!(sizes.iter().sum::<usize>(), m);
            let blocks: Vec<usize> = sizes.iter().map(|r| r.div_ceil(ROWS)).collect();
            let (lo, hi) = (blocks.iter().min().unwrap(), blocks.iter().max().unwrap());
            assert!(hi - lo <= 1 && *lo >= 1, "{lda} {m}: {sizes:?}");
            for (i, r) in sizes.iter().enumerate() {
                assert!(chunk_start(i, n, m).is_multiple_of(ROWS));
                let bytes = r.div_ceil(ROWS) * ROWS * lda;
                assert!(bytes <= A_CHUNK_BYTES, "{lda} {m}: {sizes:?}");
            }
        }
    }
}
