//! What `g` in a replay is asked to go to, as typed: a record number, a time of day or a time
//! ahead. The session that feeds the screen does the going (`Control::seek_source`).

/// Where `g` in a replay goes: forward only (going back would read the files again from the
/// start into a new engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seek {
    /// Until this many records have been read (`120`).
    Record(u64),
    /// Until the first record after this time of day (UTC, as the screen shows times), on the
    /// day of the latest record read (`09:01:30`, `9:01`).
    TimeOfDay(i64),
    /// This many milliseconds of recorded time past the latest record read (`+90s`, `+2m`).
    Ahead(i64),
}

impl Seek {
    /// `120`, `09:01:30` / `9:01`, `+90s` / `+2m` / `+1h` / `+90` (seconds).
    pub fn parse(text: &str) -> Result<Seek, String> {
        let text = text.trim();
        let bad = || format!("{text:?}: a record number (120), a time (09:01:30) or +90s / +2m");
        if let Some(ahead) = text.strip_prefix('+') {
            let (number, unit_ms) = match ahead.char_indices().last() {
                Some((i, 's')) => (&ahead[..i], 1_000),
                Some((i, 'm')) => (&ahead[..i], 60_000),
                Some((i, 'h')) => (&ahead[..i], 3_600_000),
                _ => (ahead, 1_000),
            };
            let n: i64 = number.trim().parse().map_err(|_| bad())?;
            return n
                .checked_mul(unit_ms)
                .filter(|ms| *ms > 0)
                .map(Seek::Ahead)
                .ok_or_else(bad);
        }
        if text.contains(':') {
            let parts: Vec<&str> = text.split(':').collect();
            if parts.len() > 3 || parts.iter().any(|p| p.is_empty() || p.len() > 2) {
                return Err(bad());
            }
            let mut fields = [0i64; 3];
            for (field, part) in fields.iter_mut().zip(&parts) {
                *field = part.parse().map_err(|_| bad())?;
            }
            let [h, m, s] = fields;
            if h > 23 || m > 59 || s > 59 {
                return Err(bad());
            }
            return Ok(Seek::TimeOfDay((h * 3600 + m * 60 + s) * 1000));
        }
        text.parse().map(Seek::Record).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::Seek;

    #[test]
    fn a_seek_is_a_record_a_time_of_day_or_a_time_ahead() {
        assert_eq!(Seek::parse(" 120 "), Ok(Seek::Record(120)));
        assert_eq!(
            Seek::parse("09:01:30"),
            Ok(Seek::TimeOfDay((9 * 3600 + 60 + 30) * 1000))
        );
        assert_eq!(
            Seek::parse("9:01"),
            Ok(Seek::TimeOfDay((9 * 3600 + 60) * 1000))
        );
        assert_eq!(Seek::parse("+90s"), Ok(Seek::Ahead(90_000)));
        assert_eq!(Seek::parse("+90"), Ok(Seek::Ahead(90_000)));
        assert_eq!(Seek::parse("+2m"), Ok(Seek::Ahead(120_000)));
        assert_eq!(Seek::parse("+1h"), Ok(Seek::Ahead(3_600_000)));
        for bad in [
            "",
            "-3",
            "+0s",
            "25:00",
            "9:61",
            "1:2:3:4",
            "x",
            "+9999999999999999h",
        ] {
            assert!(Seek::parse(bad).is_err(), "{bad}");
        }
    }
}
