//! The CPU's level-1 data cache size, which sets the fp32 GEMM's input block (`gemm::kc_for_l1d`), and
//! the share of the next weight block a GEMM asks into L2 while it runs the current one.
//!
//! Linux reports it in sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/{level,type,size}`); elsewhere
//! x86 CPUID says it (leaf 4 on Intel, 0x8000_0005 on AMD); failing both, 32 KiB, the smallest L1D of
//! the CPUs kev targets, so the block never outgrows the cache it was sized for.

/// The L1D assumed when it cannot be found.
const DEFAULT_L1D: usize = 32 * 1024;

/// Bytes of level-1 data cache of one core.
pub fn l1d_bytes() -> usize {
    sysfs_l1d()
        .or_else(cpuid_l1d)
        .filter(|&b| b >= 4096)
        .unwrap_or(DEFAULT_L1D)
}

fn sysfs_l1d() -> Option<usize> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    for entry in dir.flatten() {
        let p = entry.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
        if read("level")?.trim() == "1" && read("type")?.trim() == "Data" {
            return parse_size(read("size")?.trim());
        }
    }
    None
}

/// `32K`, `48K`, `1M` or a plain byte count.
fn parse_size(s: &str) -> Option<usize> {
    let (num, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&s[..i], s[i..].trim()),
        None => (s, ""),
    };
    let n: usize = num.parse().ok()?;
    let mult = match unit {
        "" | "B" => 1,
        "K" | "KB" | "KiB" => 1024,
        "M" | "MB" | "MiB" => 1024 * 1024,
        _ => return None,
    };
    Some(n * mult)
}

#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
fn cpuid_l1d() -> Option<usize> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: CPUID exists on every x86-64 CPU; leaves past the maximum return zeros, checked below.
    unsafe {
        let vendor = __cpuid(0);
        let intel = (vendor.ebx, vendor.edx, vendor.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e);
        if intel && vendor.eax >= 4 {
            for sub in 0..16 {
                let r = __cpuid_count(4, sub);
                let (kind, level) = (r.eax & 0x1f, (r.eax >> 5) & 7);
                if kind == 0 {
                    break;
                }
                if kind == 1 && level == 1 {
                    let ways = ((r.ebx >> 22) & 0x3ff) as usize + 1;
                    let parts = ((r.ebx >> 12) & 0x3ff) as usize + 1;
                    let line = (r.ebx & 0xfff) as usize + 1;
                    let sets = r.ecx as usize + 1;
                    return Some(ways * parts * line * sets);
                }
            }
            return None;
        }
        if __cpuid(0x8000_0000).eax >= 0x8000_0005 {
            let kib = (__cpuid(0x8000_0005).ecx >> 24) as usize;
            return (kib > 0).then_some(kib * 1024);
        }
        None
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_l1d() -> Option<usize> {
    None
}

/// Prefetch the `gi`-th of `groups` equal parts of the next weight block, so the block that follows
/// arrives in L2 while the current one is being used from L1 (the first row group of each block
/// would otherwise wait on memory).
#[inline]
pub(crate) fn prefetch_share(next: &[u8], gi: usize, groups: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let len = next.len();
        super::x86::prefetch_l2(next, gi * len / groups, (gi + 1) * len / groups);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (next, gi, groups);
}

/// Ask for the cache lines of `x` to be brought close (a hint: no fault, no effect on values), for loops
/// that read short runs of long rows one row after another, a pattern the hardware prefetchers miss.
#[inline]
pub fn prefetch(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = super::gemm::as_bytes(x);
        super::x86::prefetch_l1(bytes, 0, bytes.len());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_size("32K"), Some(32 * 1024));
        assert_eq!(parse_size("48K"), Some(48 * 1024));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("65536"), Some(65536));
        assert_eq!(parse_size("32X"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn the_l1d_found_is_a_plausible_size() {
        let b = l1d_bytes();
        assert!((4096..=1 << 20).contains(&b), "{b}");
        // Where both sources answer they agree (sysfs is what the kernel read from CPUID).
        if let (Some(s), Some(c)) = (sysfs_l1d(), cpuid_l1d()) {
            assert_eq!(s, c);
        }
    }
}
