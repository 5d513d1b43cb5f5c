//! `strftime_now(format)`, the date function Hugging Face gives chat templates (Llama 3.x
//! writes "Today Date: {{ strftime_now('%d %b %Y') }}"). Time is UTC.

use std::fmt::Write;
use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

pub(crate) fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    format_utc(secs, &format)
}

/// A civil date-time in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DateTime {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize, // 0 = Monday
    yday: u32,      // 1..=366
}

impl DateTime {
    fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Howard Hinnant's civil_from_days.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let before: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = before[month as usize - 1] + day + u32::from(leap && month > 2);
        DateTime {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem / 60 % 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 3).rem_euclid(7) as usize,
            yday,
        }
    }
}

/// C's `strftime` for the common directives; others are written as they are.
fn format_utc(secs: i64, format: &str) -> String {
    let t = DateTime::from_unix(secs);
    let month = MONTHS[t.month as usize - 1];
    let weekday = WEEKDAYS[t.weekday];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{}", t.year),
            Some('y') => write!(out, "{:02}", t.year.rem_euclid(100)),
            Some('m') => write!(out, "{:02}", t.month),
            Some('d') => write!(out, "{:02}", t.day),
            Some('e') => write!(out, "{:2}", t.day),
            Some('j') => write!(out, "{:03}", t.yday),
            Some('H') => write!(out, "{:02}", t.hour),
            Some('I') => write!(out, "{:02}", (t.hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if t.hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{:02}", t.minute),
            Some('S') => write!(out, "{:02}", t.second),
            Some('B') => write!(out, "{month}"),
            Some('b') | Some('h') => write!(out, "{}", &month[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('F') => write!(out, "{}-{:02}-{:02}", t.year, t.month, t.day),
            Some('T') => write!(out, "{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_722_171_909 - 2 * 86_400;
        assert_eq!(format_utc(t, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            format_utc(t, "%A %B %e %j %H:%M:%S %I%p %y %% %Q"),
            "Friday July 26 208 13:05:09 01PM 24 % %Q"
        );
        assert_eq!(format_utc(0, "%F %T %a"), "1970-01-01 00:00:00 Thu");
        // 2000-02-29, leap day of a century leap year.
        assert_eq!(format_utc(951_782_400, "%F %j"), "2000-02-29 060");
        assert_eq!(format_utc(-1, "%F %T"), "1969-12-31 23:59:59");
    }
}
