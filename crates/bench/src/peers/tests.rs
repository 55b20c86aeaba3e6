//! Unit tests of the peer plumbing: id streams, answer parsing, subprocess logging.

use super::*;

#[test]
fn bench_ids_equal_the_python_stream() {
    // Values printed by tools/bench/common.py `bench_ids` (the torch peer's own generator).
    assert_eq!(
        bench_ids(8, BENCH_SEED, ORDINARY_VOCAB),
        [197003, 246589, 150328, 33122, 110518, 82963, 221674, 187950]
    );
    assert_eq!(bench_ids(4, 0, 1000), [535, 700, 679, 444]);
    assert_eq!(
        bench_ids(3, u64::MAX, u32::MAX),
        [4103576, 3314973489, 3936516661]
    );
}

#[test]
fn bench_rows_are_prefixes_and_in_range() {
    let long = bench_ids(1518, BENCH_SEED, ORDINARY_VOCAB);
    assert_eq!(bench_ids(94, BENCH_SEED, ORDINARY_VOCAB), long[..94]);
    assert!(long.iter().all(|&t| t < ORDINARY_VOCAB));
    assert_ne!(bench_ids(94, BENCH_SEED + 1, ORDINARY_VOCAB), long[..94]);
    assert!(bench_ids(0, BENCH_SEED, ORDINARY_VOCAB).is_empty());
}

/// A scratch `tools/bench` with a fake interpreter (a bash script) standing in for Python.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kev-peers-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tools")).unwrap();
        Scratch(dir)
    }

    fn tools(&self) -> PathBuf {
        self.0.join("tools")
    }

    fn file(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// An interpreter that runs `body` with the script path in $1 and the other arguments after it; `$OUT` is
    /// the value of `--out`.
    fn python(&self, body: &str) -> PathBuf {
        let p = self.file(
            "python",
            &format!(
                "#!/usr/bin/env bash\nset -eu\nOUT=\nprev=\nfor a in \"$@\"; do [ \"$prev\" = --out ] && OUT=$a; prev=$a; done\n{body}\n"
            ),
        );
        let status = Command::new("chmod").arg("+x").arg(&p).status().unwrap();
        assert!(status.success());
        p
    }

    fn env(&self) -> PeerEnv {
        PeerEnv::new(self.tools(), self.0.join("cache")).with_threads(2)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn backbone_answer(lengths: &[usize]) -> String {
    let results: Vec<_> = lengths
        .iter()
        .map(|&n| {
            let s = n as f64 / 100.0;
            serde_json::json!({"tokens": n, "runs": 2, "warmup": 1, "median_s": s, "min_s": s, "max_s": s,
                               "samples_s": [s, s]})
        })
        .collect();
    serde_json::json!({"peer": "torch", "kind": "backbone", "threads": 2, "peak_rss_bytes": 1234,
                       "versions": {"torch": "2.15.0"}, "results": results})
    .to_string()
}

#[test]
fn torch_backbone_passes_the_rows_and_parses_the_answer() {
    let s = Scratch::new("tb");
    s.file("tools/torch_backbone.py", "# stand-in\n");
    let answer = s.file("answer.json", &backbone_answer(&[94, 380]));
    let seen = s.0.join("seen-ids.json");
    // Record the ids file and the arguments the script got, then answer.
    let py = s.python(&format!(
        "prev=; for a in \"$@\"; do [ \"$prev\" = --ids ] && cp \"$a\" {seen}; prev=$a; done\n\
         echo \"$@\" > {args}\necho progress >&2\ncp {answer} \"$OUT\"",
        seen = seen.display(),
        args = s.0.join("args").display(),
        answer = answer.display()
    ));
    let env = s.env().with_python(&py);
    let rows = vec![
        bench_ids(94, BENCH_SEED, ORDINARY_VOCAB),
        bench_ids(380, BENCH_SEED, ORDINARY_VOCAB),
    ];
    let run = torch_backbone(
        &env,
        Path::new("/models/base"),
        &rows,
        TorchDtype::Bfloat16,
        2,
    )
    .unwrap();
    assert_eq!(run.label, "torch 2.15.0 bfloat16");
    assert_eq!(run.peak_rss_bytes, Some(1234));
    assert_eq!(run.median_for(380), Some(3.8));
    assert_eq!(run.median_for(1518), None);
    let ids: serde_json::Value = serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
    let got: Vec<Vec<u32>> = serde_json::from_value(ids["rows"].clone()).unwrap();
    assert_eq!(got, rows);
    let args = std::fs::read_to_string(s.0.join("args")).unwrap();
    assert!(args.contains("--model /models/base"), "{args}");
    assert!(
        args.contains("--dtype bfloat16 --runs 2 --warmup 1 --threads 2"),
        "{args}"
    );
    // The run directory is removed after a good run.
    assert_eq!(
        std::fs::read_dir(s.0.join("cache/runs")).unwrap().count(),
        0
    );
}

#[test]
fn an_answer_for_other_lengths_is_a_failure() {
    let s = Scratch::new("len");
    s.file("tools/torch_backbone.py", "");
    let answer = s.file("answer.json", &backbone_answer(&[94]));
    let py = s.python(&format!("cp {} \"$OUT\"", answer.display()));
    let env = s.env().with_python(&py);
    let err = torch_backbone(
        &env,
        Path::new("m"),
        &[vec![1; 94], vec![2; 95]],
        TorchDtype::Float32,
        1,
    )
    .unwrap_err();
    assert!(!err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("asked for [94, 95]"), "{err}");
}

#[test]
fn a_failing_script_reports_its_last_lines() {
    let s = Scratch::new("fail");
    s.file("tools/torch_backbone.py", "");
    let py = s.python("echo 'Traceback: out of memory' >&2\nexit 3");
    let env = s.env().with_python(&py);
    let err =
        torch_backbone(&env, Path::new("m"), &[vec![1, 2]], TorchDtype::Float32, 1).unwrap_err();
    assert_eq!(err.peer(), Peer::TorchBackbone);
    assert!(!err.is_unavailable());
    let msg = err.to_string();
    assert!(
        msg.starts_with("peer failed: torch backbone: torch_backbone.py failed"),
        "{msg}"
    );
    assert!(msg.contains("Traceback: out of memory"), "{msg}");
}

#[test]
fn a_peer_that_cannot_be_set_up_is_unavailable() {
    let s = Scratch::new("setup");
    s.file(
        "tools/setup.sh",
        "echo '[bench setup] error: no python3 >= 3.10' >&2\nexit 1\n",
    );
    let env = s.env();
    let err = torch_backbone(&env, Path::new("m"), &[vec![1]], TorchDtype::Float32, 1).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let msg = err.to_string();
    assert!(
        msg.starts_with("peer unavailable: torch backbone: setup.sh torch failed"),
        "{msg}"
    );
    assert!(msg.contains("no python3 >= 3.10"), "{msg}");
    // llama.cpp's setup fails the same way.
    let err =
        llama_backbone(&env, Fork::Mainline, Path::new("m"), &[94], 1, Quant::Bf16).unwrap_err();
    assert!(
        err.is_unavailable() && err.peer() == Peer::LlamaCpp,
        "{err}"
    );
    // No scripts at all: unavailable too.
    let err = torch_backbone(
        &PeerEnv::new(s.0.join("nowhere"), s.0.join("c")),
        Path::new("m"),
        &[vec![1]],
        TorchDtype::Float32,
        1,
    )
    .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
}

#[test]
fn setup_answers_the_last_stdout_line() {
    let s = Scratch::new("answer");
    let py = s.python("exit 0");
    s.file(
        "tools/setup.sh",
        &format!("echo noise\necho {}\necho building >&2\n", py.display()),
    );
    assert_eq!(s.env().python(Peer::TorchDecide).unwrap(), py);
}

#[test]
fn torch_decide_sends_one_line_per_request_and_checks_the_answer() {
    let s = Scratch::new("decide");
    s.file("tools/torch_decide.py", "");
    let seen = s.0.join("seen.jsonl");
    let answer = serde_json::json!({
    "peer": "torch", "kind": "decide", "arm": "reference", "threads": 2, "peak_rss_bytes": 99,
    "versions": {"torch": "2.15.0"},
    "requests": [
        {"index": 0, "questions": 1, "row_tokens": [94], "input_tokens": 94, "median_s": 0.5, "min_s": 0.4,
         "max_s": 0.6, "samples_s": [0.4, 0.5, 0.6], "tokenize_median_s": 0.001, "probabilities": [[0.25, 0.75]]},
        {"index": 1, "questions": 2, "row_tokens": [30, 31], "input_tokens": 40, "median_s": 0.7, "min_s": 0.7,
         "max_s": 0.7, "samples_s": [0.7], "tokenize_median_s": 0.001, "probabilities": [[1.0], [0.5, 0.5]]}
    ]});
    let answer = s.file("answer.json", &answer.to_string());
    let py = s.python(&format!(
        "prev=; for a in \"$@\"; do [ \"$prev\" = --requests ] && cp \"$a\" {}; prev=$a; done\ncp {} \"$OUT\"",
        seen.display(),
        answer.display()
    ));
    let env = s.env().with_python(&py);
    let bodies: [&[u8]; 2] = [
        b"{\"state\": \"a\\nb\",\r\n \"questions\": {}}",
        b"{\"x\":\n1}",
    ];
    let run = torch_decide(
        &env,
        Path::new("b"),
        Path::new("k"),
        &bodies,
        TorchDtype::Float32,
        3,
    )
    .unwrap();
    assert_eq!(run.label, "torch 2.15.0 reference");
    assert_eq!(run.requests.len(), 2);
    assert_eq!(run.requests[1].row_tokens, [30, 31]);
    assert_eq!(run.requests[0].probabilities, [[0.25, 0.75]]);
    let sent = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(
        sent,
        "{\"state\": \"a\\nb\",   \"questions\": {}}\n{\"x\": 1}\n"
    );
    // Each line is still the same JSON document.
    let first: serde_json::Value = serde_json::from_str(sent.lines().next().unwrap()).unwrap();
    assert_eq!(first["state"], "a\nb");
    // Asking for three requests but getting two answers is a failure.
    let three: [&[u8]; 3] = [b"{}", b"{}", b"{}"];
    let err = torch_decide(
        &env,
        Path::new("b"),
        Path::new("k"),
        &three,
        TorchDtype::Float32,
        1,
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("answered 2 requests, asked 3"),
        "{err}"
    );
}

/// A scratch with a `setup.sh` answering a bin dir per llama fork and the fake interpreter for `torch`, and
/// recording the `KEV_BENCH_LLAMA_ISA` each setup saw.
fn llama_scratch(name: &str, fail: &str) -> (Scratch, PathBuf) {
    let s = Scratch::new(name);
    s.file("tools/llama_cpp.py", "# stand-in\n");
    let answer = serde_json::json!({
        "peer": "ik_llama.cpp", "kind": "backbone", "threads": 2, "peak_rss_bytes": 77,
        "llama": {"build_commit": "55d3c05bf"},
        "results": [{"tokens": 94, "runs": 1, "median_s": 0.5, "min_s": 0.5, "max_s": 0.5, "samples_s": [0.5]}]
    });
    let answer = s.file("answer.json", &answer.to_string());
    let py = s.python(&format!(
        "echo \"$@\" >> {args}\ncp {answer} \"$OUT\"",
        args = s.0.join("args").display(),
        answer = answer.display()
    ));
    s.file(
        "tools/setup.sh",
        &format!(
            "echo \"$1 ${{KEV_BENCH_LLAMA_ISA:-native}}\" >> {seen}\n\
             [ \"$1\" = {fail} ] && {{ echo \"[bench setup] error: cmake build failed\" >&2; exit 1; }}\n\
             case $1 in llama) echo {root}/llama.cpp/build/bin ;; ik-llama) echo {root}/ik_llama.cpp/build/bin ;;\n\
             torch) echo {py} ;; esac\n",
            seen = s.0.join("setups").display(),
            root = s.0.display(),
            py = py.display(),
        ),
    );
    (s, py)
}

#[test]
fn ik_llama_times_mainlines_gguf_with_its_own_bench_and_repacking() {
    let (s, _) = llama_scratch("ik", "none");
    let env = s.env().with_vars([("KEV_BENCH_LLAMA_ISA", "avx2")]);
    let run = llama_backbone(&env, Fork::Ik, Path::new("/m/base"), &[94], 1, Quant::Q4KM).unwrap();
    assert_eq!(run.peer, Peer::IkLlama);
    assert_eq!(run.label, "ik_llama.cpp 55d3c05bf q4_k_m rtr");
    let args = std::fs::read_to_string(s.0.join("args")).unwrap();
    let root = s.0.display();
    // The GGUF is made by mainline's tree (converter, llama-quantize) and cached under the bench cache; the
    // timing is ik's llama-bench with -rtr 1.
    assert!(
        args.contains(&format!("--llama-dir {root}/llama.cpp ")),
        "{args}"
    );
    assert!(
        args.contains(&format!("--gguf-cache {root}/cache/gguf ")),
        "{args}"
    );
    assert!(
        args.contains("--model /m/base --outtype q4_k_m --tokens 94 --runs 1 --threads 2"),
        "{args}"
    );
    assert!(
        args.contains(&format!(
            "--bench-dir {root}/ik_llama.cpp/build/bin --run-time-repack --peer ik_llama.cpp"
        )),
        "{args}"
    );
    // Both builds were set up once each, capped as asked.
    let setups = std::fs::read_to_string(s.0.join("setups")).unwrap();
    assert!(
        setups.contains("llama avx2") && setups.contains("ik-llama avx2"),
        "{setups}"
    );
    // Mainline on the same env: no ik flags, its label, no second build.
    std::fs::remove_file(s.0.join("args")).unwrap();
    let run = llama_backbone(
        &env,
        Fork::Mainline,
        Path::new("/m/base"),
        &[94],
        1,
        Quant::Q8_0,
    )
    .unwrap();
    assert_eq!(run.peer, Peer::LlamaCpp);
    assert_eq!(run.label, "llama.cpp 55d3c05bf q8_0");
    let args = std::fs::read_to_string(s.0.join("args")).unwrap();
    assert!(
        !args.contains("--bench-dir") && !args.contains("--run-time-repack"),
        "{args}"
    );
    assert!(args.contains("--outtype q8_0"), "{args}");
    let setups = std::fs::read_to_string(s.0.join("setups")).unwrap();
    assert_eq!(
        setups.lines().filter(|l| l.starts_with("llama ")).count(),
        1,
        "{setups}"
    );
}

#[test]
fn an_ik_llama_that_cannot_be_built_is_unavailable() {
    let (s, _) = llama_scratch("ik-fail", "ik-llama");
    let env = s.env();
    let err = llama_backbone(&env, Fork::Ik, Path::new("m"), &[94], 1, Quant::F16).unwrap_err();
    assert!(err.is_unavailable() && err.peer() == Peer::IkLlama, "{err}");
    assert!(
        err.to_string().contains("setup.sh ik-llama failed"),
        "{err}"
    );
    // Mainline still runs.
    assert!(llama_backbone(&env, Fork::Mainline, Path::new("m"), &[94], 1, Quant::Bf16).is_ok());
    // Without mainline's build there is no GGUF for ik to time.
    let (s, _) = llama_scratch("main-fail", "llama");
    let err =
        llama_backbone(&s.env(), Fork::Ik, Path::new("m"), &[94], 1, Quant::Q8_0).unwrap_err();
    assert!(err.is_unavailable() && err.peer() == Peer::IkLlama, "{err}");
    assert!(
        err.to_string()
            .contains("llama.cpp (which makes the GGUFs)"),
        "{err}"
    );
}

#[test]
fn quants_name_their_files_and_sources() {
    let all = [Quant::Bf16, Quant::F16, Quant::Q8_0, Quant::Q4KM];
    let names: Vec<&str> = all.iter().map(|q| q.outtype()).collect();
    assert_eq!(names, ["bf16", "f16", "q8_0", "q4_k_m"]);
    assert_eq!(Quant::Q4KM.quantized_from(), Some(Quant::Bf16));
    assert!(all[..3].iter().all(|q| q.quantized_from().is_none()));
    assert_eq!(
        (Fork::Mainline.setup_name(), Fork::Ik.setup_name()),
        ("llama", "ik-llama")
    );
    assert_eq!(Fork::Ik.peer().to_string(), "ik_llama.cpp");
}

/// `llama_cpp.py --gguf-path-only`: where a GGUF of (model dir, type) is cached. Runs the script's own key
/// code (python3, standard library only), not a peer.
fn gguf_path(model: &Path, cache: &Path, outtype: &str) -> Option<String> {
    let script = find_tools(None)?.join("llama_cpp.py");
    let out = Command::new("python3")
        .arg(script)
        .args([
            "--llama-dir",
            "/nonexistent",
            "--gguf-path-only",
            "--outtype",
            outtype,
        ])
        .arg("--model")
        .arg(model)
        .arg("--gguf-cache")
        .arg(cache)
        .arg("--out")
        .arg(cache.join("unused.json"))
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap().trim().to_string())
}

#[test]
fn gguf_cache_keys_follow_the_model_files_and_the_type() {
    let s = Scratch::new("gguf");
    let model = s.0.join("synth-4b");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    std::fs::write(model.join("model.safetensors"), "12345678").unwrap();
    let cache = s.0.join("cache/gguf");
    let Some(bf16) = gguf_path(&model, &cache, "bf16") else {
        println!("skipped: no python3 to run tools/bench/llama_cpp.py's key code");
        return;
    };
    // <cache>/<dir name>-<16 hex digits>.<type>.gguf
    let name = bf16
        .strip_prefix(&format!("{}/", cache.display()))
        .unwrap_or_else(|| panic!("{bf16} outside the cache"));
    let key = name
        .strip_prefix("synth-4b-")
        .and_then(|n| n.strip_suffix(".bf16.gguf"))
        .unwrap_or_else(|| panic!("{name}"));
    assert!(
        key.len() == 16 && key.chars().all(|c| c.is_ascii_hexdigit()),
        "{key}"
    );
    // Stable; one file per type (ik and mainline share each).
    assert_eq!(gguf_path(&model, &cache, "bf16").unwrap(), bf16);
    let q4 = gguf_path(&model, &cache, "q4_k_m").unwrap();
    let q8 = gguf_path(&model, &cache, "q8_0").unwrap();
    assert!(
        q4.ends_with(".q4_k_m.gguf") && q8.ends_with(".q8_0.gguf"),
        "{q4} {q8}"
    );
    assert_ne!(q4.replace(".q4_k_m.", ".bf16."), bf16);
    // A file that is not config or weights does not change the key; a changed weight file does.
    std::fs::write(model.join("README.md"), "notes").unwrap();
    assert_eq!(gguf_path(&model, &cache, "bf16").unwrap(), bf16);
    std::fs::write(model.join("model.safetensors"), "123456789").unwrap();
    let changed = gguf_path(&model, &cache, "bf16").unwrap();
    assert_ne!(changed, bf16);
    assert!(changed.ends_with(".bf16.gguf"));
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Every peer for real, on a release, through this API:
/// `KEV_PEERS_BASE=DIR KEV_PEERS_KEV=DIR [KEV_BENCH_PYTHON=…] cargo test -p kev-bench -- --ignored real_peers --nocapture`.
/// `KEV_PEERS_TOKENS` (default 94,380,1518), `KEV_PEERS_RUNS` (default 2), `KEV_PEERS_ONLY` (a subset of
/// `torch-fp32,torch-bf16,llama,ik-llama,decide`; `decide` needs `KEV_PEERS_KEV`). Prints one line per timing.
#[test]
#[ignore = "runs torch and llama.cpp for minutes; needs KEV_PEERS_BASE (and KEV_PEERS_KEV)"]
fn real_peers_end_to_end() {
    let base = PathBuf::from(
        std::env::var("KEV_PEERS_BASE").expect("set KEV_PEERS_BASE to a base release dir"),
    );
    let only = env_or("KEV_PEERS_ONLY", "torch-fp32,torch-bf16,llama,decide");
    let wants = |p: &str| only.split(',').any(|w| w.trim() == p);
    let lengths: Vec<usize> = env_or("KEV_PEERS_TOKENS", "94,380,1518")
        .split(',')
        .map(|t| t.trim().parse().unwrap())
        .collect();
    let runs: usize = env_or("KEV_PEERS_RUNS", "2").parse().unwrap();
    let env = PeerEnv::from_env().unwrap();
    let rows: Vec<Vec<u32>> = lengths
        .iter()
        .map(|&n| bench_ids(n, BENCH_SEED, ORDINARY_VOCAB))
        .collect();
    let gib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / f64::from(1u32 << 30));
    let mut done = Vec::new();
    for (name, dtype) in [
        ("torch-fp32", TorchDtype::Float32),
        ("torch-bf16", TorchDtype::Bfloat16),
    ] {
        if wants(name) {
            done.push(torch_backbone(&env, &base, &rows, dtype, runs).unwrap());
        }
    }
    if wants("llama") {
        done.push(
            llama_backbone(&env, Fork::Mainline, &base, &lengths, runs, Quant::Bf16).unwrap(),
        );
    }
    if wants("ik-llama") {
        for quant in [Quant::F16, Quant::Q8_0, Quant::Q4KM] {
            done.push(llama_backbone(&env, Fork::Ik, &base, &lengths, runs, quant).unwrap());
        }
    }
    for run in &done {
        for t in &run.timings {
            assert!(t.median_s > 0.0 && t.min_s <= t.median_s && t.median_s <= t.max_s);
            println!(
                "PEER {:<26} {:>5} tokens  median {:>8.3} s  ({:>6.1} tok/s)  peak RSS {:.2} GiB",
                run.label,
                t.tokens,
                t.median_s,
                t.tokens as f64 / t.median_s,
                gib(run.peak_rss_bytes)
            );
        }
    }
    if !wants("decide") {
        return;
    }
    let kev = PathBuf::from(
        std::env::var("KEV_PEERS_KEV").expect("set KEV_PEERS_KEV to a Kev release dir"),
    );
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/requests/valid");
    let bodies: Vec<Vec<u8>> = ["state-spec-example", "multi-3"]
        .iter()
        .map(|n| std::fs::read(fixtures.join(format!("{n}.json"))).unwrap())
        .collect();
    let refs: Vec<&[u8]> = bodies.iter().map(Vec::as_slice).collect();
    let run = torch_decide(&env, &base, &kev, &refs, TorchDtype::Float32, runs).unwrap();
    for (i, r) in run.requests.iter().enumerate() {
        for p in &r.probabilities {
            let sum: f64 = p.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-5,
                "request {i}: probabilities sum to {sum}"
            );
        }
        println!(
            "PEER {:<26} request {i}: {} questions, rows {:?} tokens  median {:>8.3} s  peak RSS {:.2} GiB",
            run.label,
            r.questions,
            r.row_tokens,
            r.median_s,
            gib(run.peak_rss_bytes)
        );
    }
}

#[test]
fn finds_this_repository_scripts() {
    let dir = find_tools(None).expect("tools/bench of this source tree");
    for f in [
        "setup.sh",
        "torch_backbone.py",
        "torch_decide.py",
        "llama_cpp.py",
        "common.py",
        "gguf_convert.py",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }
    assert!(find_tools(Some("/nonexistent/kev-tools".into())).is_none());
}
