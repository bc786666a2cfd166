//! Process memory probes (Linux `/proc`), for the per-point peak RSS.
//!
//! The kernel's `VmHWM` is the lifetime peak of the process; writing `5` to
//! `/proc/self/clear_refs` resets it to the current RSS (Linux ≥ 4.0, `Documentation/filesystems/
//! proc.rst`), so resetting before a sweep point and reading after gives that point's own peak.

/// Resets the peak-RSS counter. Returns false where that is not possible (non-Linux, no /proc).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Peak resident set size since the last reset, bytes (`VmHWM`), if the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// Current resident set size, bytes (`VmRSS`).
pub fn current_rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|k| k * 1024)
}

/// Memory the kernel says can be allocated without swapping, bytes (`MemAvailable`).
pub fn available_bytes() -> Option<u64> {
    meminfo_kib("MemAvailable:").map(|k| k * 1024)
}

/// Total physical memory, bytes (`MemTotal`).
pub fn total_bytes() -> Option<u64> {
    meminfo_kib("MemTotal:").map(|k| k * 1024)
}

fn status_kib(key: &str) -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/self/status").ok()?, key)
}

fn meminfo_kib(key: &str) -> Option<u64> {
    kib_field(&std::fs::read_to_string("/proc/meminfo").ok()?, key)
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kib_fields() {
        let t = "Name:\tx\nVmHWM:\t  12345 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(kib_field(t, "VmHWM:"), Some(12345));
        assert_eq!(kib_field(t, "VmSwap:"), None);
    }

    /// Other tests in this process allocate and free concurrently, so the peak is compared
    /// with what must be resident while our buffer lives, not with a before/after difference.
    #[cfg(target_os = "linux")]
    #[test]
    fn peak_tracks_a_fresh_allocation() {
        reset_peak_rss();
        let v = vec![1u8; 64 << 20];
        std::hint::black_box(&v);
        let now = current_rss_bytes().unwrap();
        let peak = peak_rss_bytes().unwrap();
        assert!(now >= 64 << 20, "RSS {now} does not hold the 64 MiB buffer");
        assert!(peak >= now, "peak {peak} below current RSS {now}");
        drop(v);
    }
}
