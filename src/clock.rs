//! The wall clock: the one clock the sessions, the screen and the metrics endpoint stamp inputs
//! with (the core has none; its inputs carry their times).

/// Milliseconds since 1970 by the wall clock.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
