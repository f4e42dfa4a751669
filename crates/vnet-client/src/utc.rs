//! UTC dates of Unix times, as RFC 3339 text, for certificate errors and
//! logs (the civil calendar from days, after Howard Hinnant's
//! `civil_from_days`; no time zone database needed).

use std::time::Duration;

/// `YYYY-MM-DDTHH:MM:SSZ` of `secs` after the Unix epoch.
pub fn seconds(secs: u64) -> String {
    let (date, rem) = civil(secs);
    format!("{date}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` of `since_epoch`.
pub fn millis(since_epoch: Duration) -> String {
    let (date, rem) = civil(since_epoch.as_secs());
    let ms = since_epoch.subsec_millis();
    format!("{date}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The date (`YYYY-MM-DD`) of `secs`, and the seconds into that day.
fn civil(secs: u64) -> (String, u64) {
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (format!("{y:04}-{m:02}-{d:02}"), rem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(seconds(1_795_651_200 + 3_661), "2026-11-26T01:01:01Z");
        assert_eq!(seconds(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(millis(Duration::from_millis(1_795_651_200_007)), "2026-11-26T00:00:00.007Z");
    }
}
