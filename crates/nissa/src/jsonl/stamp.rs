//! The UTC timestamp in run directory names (`YYYY-MM-DD_HHMMSS`).

#![cfg_attr(not(test), warn(clippy::arithmetic_side_effects))]

use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYY-MM-DD_HHMMSS` in UTC (the epoch for clocks set before 1970).
pub(crate) fn utc_stamp(now: SystemTime) -> String {
    let seconds = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    // u64::MAX / 86_400 fits an i64, so the conversion cannot fail.
    let days = i64::try_from(seconds / 86_400).unwrap_or(i64::MAX);
    let of_day = seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}_{:02}{:02}{:02}",
        of_day / 3600,
        of_day / 60 % 60,
        of_day % 60
    )
}

/// Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`). Exact for every day count a `u64` of seconds can
/// give (below 2.2e14 days, far from any overflow of the arithmetic).
#[expect(
    clippy::arithmetic_side_effects,
    reason = "days comes from utc_stamp: a u64 of seconds / 86400 < 2.2e14, so every intermediate stays below 1e15 in i64"
)]
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    // day_of_year < 366 and month_index < 12: both fit a u32.
    let day = u32::try_from(day_of_year - (153 * month_index + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    })
    .unwrap_or(1);
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn civil_dates_match_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(59), (1970, 3, 1));
        // 2000-02-29 is day 11016; 2024-12-31 is day 20088.
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_088), (2024, 12, 31));
        let stamp = utc_stamp(UNIX_EPOCH + Duration::from_secs(20_088 * 86_400 + 3_723));
        assert_eq!(stamp, "2024-12-31_010203");
    }

    #[test]
    fn the_latest_representable_time_does_not_overflow() {
        // Some platforms cannot represent this far; those skip the check.
        if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_secs(u64::MAX / 2)) {
            assert!(utc_stamp(far).contains('_'));
        }
        assert_eq!(utc_stamp(UNIX_EPOCH), "1970-01-01_000000");
    }
}
