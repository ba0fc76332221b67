//! This process's memory, for the benchmark examples (included with `#[path]`: each example is
//! a crate of its own).

/// A `/proc/self/status` field in KiB (`VmRSS:` now, `VmHWM:` the peak); 0 where unreadable.
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Resident memory now, in KiB.
#[allow(dead_code)]
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}
