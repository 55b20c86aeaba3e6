//! Date facts (the author's opt-in `KEV_DATE_FACTS=1` preprocessing): the model cannot subtract dates, but it
//! can read a stated day count. When the rendered state holds two or more distinct absolute dates, one
//! sentence per pair is added to the state before it is rendered for the model.
//!
//! A date is written `Month D, YYYY` (English month name, capitalised, day of one or two digits) or
//! `YYYY-MM-DD`, delimited as Python's `\b` delimits it (no letter, digit or `_` on either side). Dates are
//! kept in order of first appearance, distinct by how they are written (so `March 3, 2026` and `2026-03-03`
//! are two dates, "the same day"); a written date that is not on the calendar (`February 30, 2026`,
//! `2026-13-01`, day `0`, year `0000`) is skipped, as `datetime.strptime` refuses it.
//!
//! Digits are ASCII: Python's `\d` also matches other Unicode decimal digits (`２０２６-…`), which this port
//! does not take as dates.

use serde_json::{Map, Value};

use crate::render::render;

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

/// Python's `\w` on one character (Unicode letters, digits and `_`).
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A civil date: year, month (1–12), day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil(i64, i64, i64);

impl Civil {
    fn new(y: i64, m: i64, d: i64) -> Option<Self> {
        if !(1..=9999).contains(&y) || !(1..=12).contains(&m) || d < 1 {
            return None;
        }
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let days = [
            31,
            if leap { 29 } else { 28 },
            31,
            30,
            31,
            30,
            31,
            31,
            30,
            31,
            30,
            31,
        ];
        (d <= days[(m - 1) as usize]).then_some(Civil(y, m, d))
    }

    /// Days since 1970-01-01 in the proleptic Gregorian calendar.
    fn day_number(self) -> i64 {
        let Civil(y, m, d) = self;
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let mp = (m + 9) % 12;
        let doy = (153 * mp + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146_097 + doe - 719_468
    }
}

fn digits(s: &str, n: usize) -> Option<i64> {
    let b = s.as_bytes();
    (b.len() >= n && b[..n].iter().all(u8::is_ascii_digit)).then(|| s[..n].parse().ok())?
}

/// A match of the date pattern starting at `s` (the text from a position preceded by a non-word character or
/// the start): its length in bytes and whether it is a real date.
fn match_at(s: &str) -> Option<(usize, Option<Civil>)> {
    let boundary_after = |len: usize| !s[len..].chars().next().is_some_and(is_word);
    // `\b(?:January|…) \d{1,2}, \d{4}\b`, tried first (the pattern's first alternative).
    for (i, month) in MONTHS.iter().enumerate() {
        let Some(rest) = s.strip_prefix(month).and_then(|r| r.strip_prefix(' ')) else {
            continue;
        };
        // `\d{1,2}` is greedy but backtracks: two digits first, then one.
        for day_len in [2, 1] {
            let Some(day) = digits(rest, day_len) else {
                continue;
            };
            let Some(tail) = rest[day_len..].strip_prefix(", ") else {
                continue;
            };
            let Some(year) = digits(tail, 4) else {
                continue;
            };
            let len = s.len() - tail.len() + 4;
            if boundary_after(len) {
                // strptime's %d takes `1`–`31` (one or two digits, leading zero allowed), never `0`/`00`.
                return Some((len, Civil::new(year, i as i64 + 1, day)));
            }
        }
        break; // no month name is a prefix of another
    }
    // `\b\d{4}-\d{2}-\d{2}\b`
    let year = digits(s, 4)?;
    let month = digits(s.get(5..)?, 2).filter(|_| s.as_bytes()[4] == b'-')?;
    let day = digits(s.get(8..)?, 2).filter(|_| s.as_bytes()[7] == b'-')?;
    boundary_after(10).then_some((10, Civil::new(year, month, day)))
}

/// The distinct valid dates written in `text`, in order of first appearance, as written.
fn dates_in(text: &str) -> Vec<(&str, Civil)> {
    let mut found: Vec<(&str, Civil)> = Vec::new();
    let mut prev: Option<char> = None;
    let mut i = 0;
    while i < text.len() {
        let rest = &text[i..];
        let c = rest.chars().next().unwrap_or(' ');
        if !prev.is_some_and(is_word)
            && is_word(c)
            && let Some((len, date)) = match_at(rest)
        {
            let written = &rest[..len];
            if let Some(d) = date
                && !found.iter().any(|(w, _)| *w == written)
            {
                found.push((written, d));
            }
            // finditer resumes after the match; the match ends on a digit.
            prev = written.chars().last();
            i += len;
            continue;
        }
        prev = Some(c);
        i += c.len_utf8();
    }
    found
}

/// One sentence per pair of distinct dates in `text` (`"<later-listed> is N day(s) after|before
/// <earlier-listed>."`, or `"… is the same day as …"`), joined by spaces; `""` with fewer than two dates.
pub fn date_facts(text: &str) -> String {
    let found = dates_in(text);
    let mut facts: Vec<String> = Vec::new();
    for i in 0..found.len() {
        for j in i + 1..found.len() {
            let (earlier, a) = found[i];
            let (later, b) = found[j];
            let n = b.day_number() - a.day_number();
            facts.push(if n == 0 {
                format!("{later} is the same day as {earlier}.")
            } else {
                let unit = if n.abs() == 1 { "day" } else { "days" };
                let rel = if n > 0 { "after" } else { "before" };
                format!("{later} is {} {unit} {rel} {earlier}.", n.abs())
            });
        }
    }
    facts.join(" ")
}

/// The state with its date facts added when its rendered text holds two or more dates: a `date_facts` field for
/// an object (an existing one is replaced in place), a trailing `{"date_facts": …}` item for an array, a final
/// `"\n\ndate_facts: …"` paragraph for a string. Otherwise the state unchanged.
pub fn with_date_facts(state: &Value) -> Value {
    let facts = date_facts(&render(state));
    if facts.is_empty() {
        return state.clone();
    }
    match state {
        Value::Object(map) => {
            let mut map = map.clone();
            map.insert("date_facts".into(), Value::String(facts));
            Value::Object(map)
        }
        Value::Array(items) => {
            let mut items = items.clone();
            let mut item = Map::new();
            item.insert("date_facts".into(), Value::String(facts));
            items.push(Value::Object(item));
            Value::Array(items)
        }
        Value::String(s) => Value::String(format!("{s}\n\ndate_facts: {facts}")),
        // Numbers, booleans and null render without dates.
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_numbers_are_the_epoch_count() {
        assert_eq!(Civil(1970, 1, 1).day_number(), 0);
        assert_eq!(Civil(2000, 3, 1).day_number(), 11_017);
        assert_eq!(Civil(1, 1, 1).day_number(), -719_162);
        assert!(Civil::new(2024, 2, 29).is_some());
        assert!(Civil::new(2100, 2, 29).is_none());
        assert!(Civil::new(2000, 2, 29).is_some());
        assert!(Civil::new(0, 1, 1).is_none());
    }
}
