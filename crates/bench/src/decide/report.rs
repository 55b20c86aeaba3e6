//! The decide benchmark's verdicts and table: torch comparisons, the bars, the printed report.

use super::*;

/// Every (our result, torch) pair on the same case.
pub(super) fn compare(results: &[RunResult], torch: Option<&TorchResult>) -> Vec<Comparison> {
    let Some(t) = torch else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for tc in &t.cases {
        for r in results.iter().filter(|r| r.case == tc.case) {
            out.push(Comparison {
                case: r.case,
                arm: r.arm,
                mode: r.mode,
                ours_s: r.timing.median_s,
                torch_s: tc.timing.median_s,
                speedup: speedup(tc.timing.median_s, r.timing.median_s),
            });
        }
    }
    out
}

fn median_of(results: &[RunResult], case: &str, arm: &str, mode: Mode) -> Option<f64> {
    results
        .iter()
        .find(|r| r.case == case && r.arm == arm && r.mode == mode)
        .map(|r| r.timing.median_s)
}

/// The bars of issue 6 that this run measured.
pub(super) fn bars(
    results: &[RunResult],
    cases: &[CaseInfo],
    comparisons: &[Comparison],
) -> Vec<Bar> {
    let mut out = Vec::new();
    for arm in ["fp32", "bf16"] {
        let shared = median_of(results, FIVE, arm, Mode::Shared);
        if let (Some(z), Some(s)) = (median_of(results, FIVE, arm, Mode::FromZero), shared) {
            out.push(Bar::at_most(
                format!("{FIVE} {arm}: shared / from zero"),
                s / z,
                SHARED_BAR,
            ));
        }
        // The rows a hit runs are the question branches, each from the chunk-aligned snapshot (so the state's
        // tail past its last multiple of 64 is run again per question: that is what keeps them bit-equal to
        // rows from zero). Their share of the miss's tokens is the bar's "question rows' share"; the share of
        // the question tokens alone (what `--unaligned-state` runs on a hit) is printed beside it.
        let hit = results
            .iter()
            .find(|r| r.case == FIVE_CACHED && r.arm == arm && r.mode == Mode::Cached);
        let miss = results
            .iter()
            .find(|r| r.case == FIVE && r.arm == arm && r.mode == Mode::Shared);
        let strict = cases
            .iter()
            .find(|c| c.name == FIVE_CACHED)
            .map(|c| c.question_share);
        if let (Some(h), Some(m)) = (hit, miss) {
            let share = h.tokens_run as f64 / m.tokens_run.max(1) as f64;
            let strict =
                strict.map_or(String::new(), |q| format!("; question tokens alone {q:.3}"));
            out.push(Bar::at_most(
                format!(
                    "{FIVE} {arm}: cache hit / miss (hit's rows {} of {} tokens = {share:.3}{strict}; + {CACHE_SLACK:.2})",
                    h.tokens_run, m.tokens_run
                ),
                h.timing.median_s / m.timing.median_s,
                share + CACHE_SLACK,
            ));
        }
    }
    if let Some(c) = comparisons
        .iter()
        .find(|c| c.case == ONE && c.arm == "fp32" && c.mode == Mode::Shared)
        && let Some(x) = c.speedup
    {
        out.push(Bar::at_least(
            format!("{ONE} fp32 end to end vs torch fp32 (× faster)"),
            x,
            TORCH_BAR,
        ));
    }
    out
}

pub(super) fn print_table(r: &DecideReport) {
    println!("{}", r.machine.headline());
    println!(
        "model {} ({} weights), head {}, pass budget {} tokens, snapshots {}",
        r.model,
        r.weights,
        r.head,
        r.pass_tokens,
        if r.chunk_aligned {
            "at multiples of 64 tokens"
        } else {
            "at the state's end (--unaligned-state)"
        }
    );
    println!();
    println!(
        "| case | questions | state tokens | row tokens | arm | mode | tokens run | median s | min–max s | passes | peak RSS GiB |"
    );
    println!("| --- | ---: | ---: | --- | --- | --- | ---: | ---: | --- | ---: | ---: |");
    for c in &r.cases {
        for res in r.results.iter().filter(|x| x.case == c.name) {
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {}–{} | {} | {} |",
                c.name,
                c.questions,
                c.request.state_tokens,
                row_list(&c.row_tokens),
                res.arm,
                res.mode.name(),
                res.tokens_run,
                secs(res.timing.median_s),
                secs(res.timing.min_s),
                secs(res.timing.max_s),
                res.passes_per_request,
                res.peak_rss_gib.map_or("n/a".into(), |g| format!("{g:.2}")),
            );
        }
    }
    if let Some(t) = &r.torch {
        println!();
        println!(
            "torch reference: {} ({} threads, peak RSS {})",
            t.label,
            t.threads,
            t.peak_rss_gib
                .map_or("n/a".into(), |g| format!("{g:.2} GiB"))
        );
        println!("| case | torch s | arm | mode | kev s | kev × faster | max abs dp vs torch |");
        println!("| --- | ---: | --- | --- | ---: | ---: | ---: |");
        for tc in &t.cases {
            for c in r.comparisons.iter().filter(|c| c.case == tc.case) {
                let dp = tc
                    .max_abs_dp
                    .iter()
                    .find(|(arm, _)| arm == c.arm)
                    .filter(|_| c.mode == Mode::Shared)
                    .map_or(String::new(), |(_, d)| format!("{d:.2e}"));
                println!(
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    tc.case,
                    secs(tc.timing.median_s),
                    c.arm,
                    c.mode.name(),
                    secs(c.ours_s),
                    times(c.speedup),
                    dp
                );
            }
        }
    }
    for miss in &r.peers_missing {
        println!("{}", miss.reason);
    }
    print_bars(&r.bars);
}

pub(super) fn row_list(rows: &[usize]) -> String {
    match rows {
        [] => String::new(),
        [one] => one.to_string(),
        many if many.iter().all(|&x| x == many[0]) => format!("{} × {}", many.len(), many[0]),
        many => many
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join("+"),
    }
}
