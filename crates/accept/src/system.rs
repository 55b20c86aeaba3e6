//! The machine an acceptance ran on, for the report: results on one CPU say little about another
//! (the bf16 arm, in particular, depends on the instruction set).

use crate::report::System;

/// CPU features that change which kernels kev runs (or how fast).
const FLAGS: [&str; 10] = [
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "amx_bf16",
];

/// Describe this machine.
pub fn describe() -> System {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let (cpu, flags) = parse_cpuinfo(&cpuinfo);
    System {
        cpu: cpu.unwrap_or_else(|| std::env::consts::ARCH.to_string()),
        cpu_flags: flags,
        kernels: format!("{:?}", kev_engine::Kernels::detect().isa()),
        threads: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
        device: "cpu".into(),
    }
}

/// Model name and the relevant flags of the first processor in `/proc/cpuinfo` text.
fn parse_cpuinfo(text: &str) -> (Option<String>, Vec<String>) {
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let cpu = field("model name").filter(|s| !s.is_empty());
    let have: Vec<String> = field("flags")
        .map(|f| f.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let flags = FLAGS
        .iter()
        .filter(|f| have.iter().any(|h| h == *f))
        .map(|f| f.to_string())
        .collect();
    (cpu, flags)
}

#[cfg(test)]
mod tests {
    use super::parse_cpuinfo;

    #[test]
    fn reads_model_and_relevant_flags() {
        let text = "processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: fpu sse4_2 avx2 fma avx512f avx512_bf16 x2apic\n\nprocessor\t: 1\nmodel name\t: other\n";
        let (cpu, flags) = parse_cpuinfo(text);
        assert_eq!(cpu.as_deref(), Some("AMD EPYC 9B45"));
        assert_eq!(flags, ["sse4_2", "avx2", "fma", "avx512f", "avx512_bf16"]);
        assert_eq!(parse_cpuinfo(""), (None, vec![]));
    }
}
