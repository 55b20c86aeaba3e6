//! The process's memory as the operating system counts it, and giving the C heap's free pages back.
//!
//! One reader of `/proc` for every layer above (the server's `/metrics` and memory headers, the default
//! cache budget, the benchmarks' RSS rows), so they agree on what they read.

/// A `kB` line of a `/proc` file (`VmRSS:` of `/proc/self/status`, `MemTotal:` of `/proc/meminfo`), in
/// bytes; `None` where the file or the line is missing (not Linux).
fn proc_bytes(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Bytes resident now (`VmRSS`).
pub fn resident_bytes() -> Option<u64> {
    proc_bytes("/proc/self/status", "VmRSS:")
}

/// The most bytes ever resident (`VmHWM`), since start or the last reset of the peak.
pub fn peak_resident_bytes() -> Option<u64> {
    proc_bytes("/proc/self/status", "VmHWM:")
}

/// The machine's physical memory (`MemTotal`).
pub fn total_memory() -> Option<u64> {
    proc_bytes("/proc/meminfo", "MemTotal:")
}

/// The memory the system can give a process now without swapping (`MemAvailable`: free memory plus the
/// caches it can reclaim).
pub fn available_memory() -> Option<u64> {
    proc_bytes("/proc/meminfo", "MemAvailable:")
}

/// Give the C heap's free pages back to the system. Freed blocks below glibc's mapping threshold (a
/// state's 2 MiB buffers, a long row's key/value segments, a loader's temporaries) otherwise stay
/// resident in its arenas for good: after loading the 4B that was ~290 MB, after a 2,000-token request
/// hundreds more. Costs milliseconds; called after loading and after long passes, not per short call.
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free memory to the system; it is thread-safe in glibc.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counts_read_are_plausible_where_proc_exists() {
        let Some(rss) = resident_bytes() else {
            println!("skipped: no /proc/self/status here (not Linux)");
            return;
        };
        let (peak, total) = (peak_resident_bytes().unwrap(), total_memory().unwrap());
        assert!(
            rss > 1 << 20 && rss <= peak && peak < total,
            "{rss} {peak} {total}"
        );
        let available = available_memory().unwrap();
        assert!(available > 0 && available <= total, "{available} {total}");
    }
}
