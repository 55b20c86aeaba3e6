//! The untied miniature (`fixtures/mini-untied`, written by `tools/reference/untied_mini.py`): kev-mini as an
//! untied checkpoint, the way Qwen3.5-9B-Base is published — `tie_word_embeddings: false`, an
//! `lm_head.weight [248320, 64]` in a shard of its own, and a `head.pt` with Kev-9B's key set (no
//! `special_embeddings`, no `lora_placement`, a `weights` key). Every LM-head value is NaN: a decision never reads
//! the LM head, so an arm that used it would answer NaN.
//!
//! Held here: every arm's answers against the author's arithmetic on this release (transformers' untied model +
//! PEFT, `expected.jsonl`): exact fp32 within 1e-4, merged-bf16 and bf16 compute inside the real bar; and the LM
//! head's shard never read: its pages are dropped from the page cache before the loads, and after the loads and
//! the decisions `mincore` finds no more of it back than opening the store (its header, with the kernel's
//! read-ahead) brings — a read of the values, even one whose values are never used, fails the test — and the
//! process holds none of it mapped or resident (`/proc/self/smaps`).

use std::path::PathBuf;

use kev_decide::{Kev, LoadSpec, Settings, Source, WeightForm, load_cpu};
use kev_engine::{Arm, CpuBackend};
use serde_json::Value;

fn untied() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/mini-untied"
    ))
}

fn load(form: WeightForm, arm: Arm) -> Kev<CpuBackend> {
    let spec = LoadSpec {
        source: Source::Release {
            base: untied().join("base"),
            kev: untied().join("kev"),
        },
        form,
        arm: Some(arm),
        settings: Settings {
            cache_bytes: Some(16 << 20),
            ..Settings::default()
        },
    };
    load_cpu(&spec)
        .unwrap_or_else(|e| panic!("loading the untied miniature: {e}"))
        .0
}

/// (request id, body, per question: the arm's probabilities as the fixture records them).
fn cases(arm: &str) -> Vec<(String, Vec<u8>, Vec<Vec<f64>>)> {
    let text = std::fs::read_to_string(untied().join("expected.jsonl")).unwrap();
    let out: Vec<_> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let probs = v["questions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| {
                    q[arm]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect()
                })
                .collect();
            (
                v["id"].as_str().unwrap().to_string(),
                v["body"].as_str().unwrap().as_bytes().to_vec(),
                probs,
            )
        })
        .collect();
    assert!(out.len() >= 40, "{} requests", out.len());
    out
}

/// (max |Δp|, mean of per-question mean |Δp|, argmax flips where the reference margin > 0.02).
fn gap(kev: &Kev<CpuBackend>) -> (f64, f64, usize) {
    let (mut max, mut means, mut flips) = (0f64, Vec::new(), 0);
    for (id, body, want) in cases("reference") {
        let got = kev
            .decide(&body)
            .unwrap_or_else(|r| panic!("{id}: refused {:?}", r.body()))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(got.probabilities.len(), want.len(), "{id}");
        for (p, r) in got.probabilities.iter().zip(&want) {
            assert!(p.iter().all(|x| x.is_finite()), "{id}: {p:?}");
            let d: Vec<f64> = p
                .iter()
                .zip(r)
                .map(|(a, b)| (*a as f64 - b).abs())
                .collect();
            max = max.max(d.iter().cloned().fold(0.0, f64::max));
            means.push(d.iter().sum::<f64>() / d.len() as f64);
            let top = |v: &[f64]| {
                (0..v.len())
                    .max_by(|&a, &b| v[a].partial_cmp(&v[b]).unwrap())
                    .unwrap()
            };
            let mut s = r.clone();
            s.sort_by(|a, b| b.partial_cmp(a).unwrap());
            let pf: Vec<f64> = p.iter().map(|x| *x as f64).collect();
            if s.len() > 1 && s[0] - s[1] > 0.02 && top(r) != top(&pf) {
                flips += 1;
            }
        }
    }
    (max, means.iter().sum::<f64>() / means.len() as f64, flips)
}

/// Pages of `file` in the page cache now, and the file's pages: `mincore` over a fresh mapping (mapping faults
/// nothing in). `None` where it cannot be asked.
fn cached_pages(file: &std::path::Path) -> Option<(usize, usize)> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(file).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let pages = len.div_ceil(page);
    // SAFETY: a read-only shared mapping of a file we hold open, unmapped below; only its residency is read.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        if addr == libc::MAP_FAILED {
            return None;
        }
        let mut vec = vec![0u8; pages];
        let ok = libc::mincore(addr, len, vec.as_mut_ptr()) == 0;
        libc::munmap(addr, len);
        ok.then(|| (vec.iter().filter(|b| *b & 1 == 1).count(), pages))
    }
}

/// [`cached_pages`] once the kernel's read-ahead has settled (two equal counts 100 ms apart, at most 3 s).
fn settled_pages(file: &std::path::Path) -> Option<(usize, usize)> {
    let mut last = cached_pages(file)?;
    for _ in 0..30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = cached_pages(file)?;
        if now == last {
            break;
        }
        last = now;
    }
    Some(last)
}

/// Drop `file`'s clean pages from the page cache; whether it worked (tmpfs, for one, keeps them).
fn evict(file: &std::path::Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(file) else {
        return false;
    };
    // SAFETY: plain calls on a descriptor we hold.
    unsafe {
        libc::fdatasync(f.as_raw_fd());
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    cached_pages(file).is_some_and(|(n, _)| n == 0)
}

/// Resident bytes of this process's mappings of `file` (`Rss:` of every `/proc/self/smaps` entry whose path
/// is `file`), and how many mappings there are. `None` where there is no `/proc`.
fn resident_of(file: &std::path::Path) -> Option<(u64, usize)> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let want = file.canonicalize().ok()?;
    let (mut rss, mut maps, mut inside) = (0u64, 0usize, false);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if head.contains('-') && head.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // a mapping's first line: `start-end perms offset dev inode path`
            let path = line.split_whitespace().nth(5).unwrap_or("");
            inside = !path.is_empty() && std::path::Path::new(path) == want;
            maps += usize::from(inside);
        } else if inside && let Some(kb) = line.strip_prefix("Rss:") {
            rss += kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap_or(0)
                * 1024;
        }
    }
    Some((rss, maps))
}

#[test]
fn the_untied_miniature_answers_as_the_authors_arithmetic_and_never_reads_its_lm_head() {
    let lm_head = untied().join("base/lm_head.safetensors");
    let data = std::fs::metadata(&lm_head).unwrap().len();
    assert!(data > 30 << 20, "{data}");

    // The LM head leaves the page cache first, so any read of it — by the loader or a decision, mapped or not,
    // used or not — brings pages back, which `mincore` shows afterwards. Opening a store reads each file's
    // header, and the kernel's read-ahead brings more than that back (up to the device's `read_ahead_kb`: 8 MiB
    // on the build machines): what opening the store alone brings back is the yardstick.
    let header_only = if evict(&lm_head) {
        drop(kev_release::TensorStore::open(&untied().join("base")).unwrap());
        settled_pages(&lm_head).map(|(n, _)| n)
    } else {
        None
    };
    let evicted = header_only.is_some() && evict(&lm_head);
    let exact = load(WeightForm::Exact, Arm::Fp32);
    let (max, mean, flips) = gap(&exact);
    eprintln!("untied miniature, exact fp32 vs reference: max |Δp| {max:.2e}, mean {mean:.2e}");
    assert!(max <= 1e-4, "exact fp32: max |Δp| {max:.2e} > 1e-4");
    assert_eq!(flips, 0);

    // Loaded, every request decided: no more of the LM head's file came back than opening the store brings.
    let header = header_only.unwrap_or(usize::MAX);
    match (evicted, settled_pages(&lm_head)) {
        (true, Some((_, pages))) if header >= pages => println!(
            "skipped: the page-cache half (read-ahead alone brings the whole LM head file back here)"
        ),
        (true, Some((cached, pages))) => {
            eprintln!(
                "lm_head shard: {cached} of {pages} pages back in the page cache after the loads and \
                 decisions; opening the store alone brings back {header}"
            );
            // (a few pages of slack: read-ahead windows need not land on the same pages twice)
            assert!(
                cached <= header + 16,
                "{cached} pages of the LM head were read (header: {header})"
            );
        }
        _ => println!(
            "skipped: the page-cache half (the LM head's pages could not be dropped from the cache here)"
        ),
    }
    // Nor does the process keep the file mapped or resident.
    match resident_of(&lm_head) {
        None => println!("skipped: the residency half (no /proc/self/smaps here)"),
        Some((rss, maps)) => {
            eprintln!("lm_head shard: {maps} mapping(s), {rss} bytes resident of {data}");
            assert!(rss <= 256 << 10, "{rss} bytes of the LM head are resident");
        }
    }

    for (form, arm, label) in [
        (
            WeightForm::Merged,
            Arm::Fp32,
            "merged bf16 weights, fp32 compute",
        ),
        (
            WeightForm::Merged,
            Arm::Bf16,
            "merged bf16 weights, bf16 compute",
        ),
    ] {
        let (max, mean, flips) = gap(&load(form, arm));
        eprintln!(
            "untied miniature, {label} vs reference: max |Δp| {max:.4}, mean {mean:.5}, {flips} flips"
        );
        assert!(
            max <= 0.02 && mean <= 0.002 && flips == 0,
            "{label}: {max} {mean} {flips}"
        );
    }
    if evicted {
        let (cached, _) = settled_pages(&lm_head).unwrap();
        assert!(
            cached <= header + 16,
            "the merged loads read {cached} pages of the LM head"
        );
    }
}

/// A `head.pt` with Kev-9B's key set (no `special_embeddings`, no `lora_placement`, an extra `weights`) reads,
/// the two absent keys as null, the tensors and temperature those of kev-mini's head it was written from.
#[test]
fn a_head_with_kev_9b_keys_reads() {
    let (head, _) =
        kev_release::head::KevHead::read_dir(&untied().join("kev")).expect("Kev-9B-style head.pt");
    assert_eq!(head.meta.special_embeddings, Value::Null);
    assert_eq!(head.meta.lora_placement, Value::Null);
    let (mini, _) = kev_release::head::KevHead::read_dir(&PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/mini/kev"
    )))
    .unwrap();
    assert_eq!((&head.q, &head.k), (&mini.q, &mini.k));
    assert_eq!(head.meta.temperature, mini.meta.temperature);
}
