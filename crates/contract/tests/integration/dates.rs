//! Golden date facts: expected sentences written by CPython 3 from the author's rule (`re` with the pattern
//! `\b(?:January|…|December) \d{1,2}, \d{4}\b|\b\d{4}-\d{2}-\d{2}\b`, `datetime.strptime`, day
//! differences), pasted here; and the three ways a state carries them.

use kev_contract::{date_facts, parse_request, with_date_facts};
use serde_json::{Value, json};

const GOLDEN: &[(&str, &str)] = &[
    (
        "Ordered July 22, 2026; delivered August 3, 2026.",
        "August 3, 2026 is 12 days after July 22, 2026.",
    ),
    (
        "August 3, 2026 then July 22, 2026",
        "July 22, 2026 is 12 days before August 3, 2026.",
    ),
    (
        "Due 2026-03-03, paid March 3, 2026, again 2026-03-03.",
        "March 3, 2026 is the same day as 2026-03-03.",
    ),
    (
        "From 2024-02-28 to 2024-03-01 and 2023-02-28 to 2023-03-01.",
        "2024-03-01 is 2 days after 2024-02-28. 2023-02-28 is 365 days before 2024-02-28. 2023-03-01 is 364 days before 2024-02-28. 2023-02-28 is 367 days before 2024-03-01. 2023-03-01 is 366 days before 2024-03-01. 2023-03-01 is 1 day after 2023-02-28.",
    ),
    (
        "Bad: February 30, 2026, 2026-13-01, 2026-00-10, March 0, 2026, 0000-01-01; good: 2026-01-01 and January 2, 2026.",
        "January 2, 2026 is 1 day after 2026-01-01.",
    ),
    (
        "Glued: x2026-01-01 and 2026-01-011 and March 3, 20261 and March 3, 2026_ but (2026-01-05) and [2026-01-09].",
        "2026-01-09 is 4 days after 2026-01-05.",
    ),
    (
        "Lowercase march 3, 2026 and MARCH 4, 2026 do not count; March 04, 2026 and March 4, 2026 are two.",
        "March 4, 2026 is the same day as March 04, 2026.",
    ),
    (
        "A year apart: 1999-12-31 and 2000-12-31 and 9999-12-31 and 0001-01-01.",
        "2000-12-31 is 366 days after 1999-12-31. 9999-12-31 is 2921940 days after 1999-12-31. 0001-01-01 is 730118 days before 1999-12-31. 9999-12-31 is 2921574 days after 2000-12-31. 0001-01-01 is 730484 days before 2000-12-31. 0001-01-01 is 3652058 days before 9999-12-31.",
    ),
    ("Only one date: 2026-05-05.", ""),
    (
        "March 12, 2026x and March 123, 2026 and May 5, 2026 and June 6, 2026.",
        "June 6, 2026 is 32 days after May 5, 2026.",
    ),
    (
        "Umlaut boundary: é2026-01-01 2026-01-02é 2026-01-03 — 2026-01-04",
        "2026-01-04 is 1 day after 2026-01-03.",
    ),
    (
        "Sept 3, 2026 and September  3, 2026 and September 3,2026 and September 3, 2026 and October 1, 2026",
        "October 1, 2026 is 28 days after September 3, 2026.",
    ),
    (
        "2026-01-01-2026-01-02 and 2026-01-03",
        "2026-01-02 is 1 day after 2026-01-01. 2026-01-03 is 2 days after 2026-01-01. 2026-01-03 is 1 day after 2026-01-02.",
    ),
    ("", ""),
];

#[test]
fn sentences_match_cpython() {
    for (text, want) in GOLDEN {
        assert_eq!(date_facts(text), *want, "text: {text:?}");
    }
}

#[test]
fn object_states_get_a_field_replacing_any_in_place() {
    let s = json!({"ordered": "July 22, 2026", "shipping": {"delivered": "August 3, 2026"}});
    assert_eq!(
        with_date_facts(&s),
        json!({"ordered": "July 22, 2026", "shipping": {"delivered": "August 3, 2026"},
               "date_facts": "August 3, 2026 is 12 days after July 22, 2026."})
    );
    // An existing `date_facts` key keeps its position (Python's `{**state, "date_facts": …}`); its old text is
    // part of the rendered state the dates are read from.
    let s = json!({"date_facts": "2026-01-01", "x": "2026-01-02"});
    let out = with_date_facts(&s);
    assert_eq!(
        serde_json::to_string(&out).unwrap(),
        r#"{"date_facts":"2026-01-02 is 1 day after 2026-01-01.","x":"2026-01-02"}"#
    );
    // Keys are rendered too.
    let s = json!({"2026-01-01": "2026-01-08"});
    assert_eq!(
        with_date_facts(&s)["date_facts"],
        "2026-01-08 is 7 days after 2026-01-01."
    );
}

#[test]
fn array_states_get_a_trailing_item() {
    let s = json!(["2026-01-01", {"then": ["2026-01-02"]}]);
    assert_eq!(
        with_date_facts(&s),
        json!(["2026-01-01", {"then": ["2026-01-02"]}, {"date_facts": "2026-01-02 is 1 day after 2026-01-01."}])
    );
}

#[test]
fn string_states_get_a_paragraph() {
    let s = json!("Ordered July 22, 2026; delivered August 3, 2026.");
    assert_eq!(
        with_date_facts(&s),
        json!(
            "Ordered July 22, 2026; delivered August 3, 2026.\n\ndate_facts: August 3, 2026 is 12 days after July 22, 2026."
        )
    );
}

#[test]
fn fewer_than_two_dates_or_no_text_leave_the_state_alone() {
    for s in [
        json!("Only 2026-05-05."),
        json!(20260101),
        json!(null),
        json!(true),
        json!({"a": "2026-01-01 and 2026-01-01"}),
        json!(["February 30, 2026", "2026-02-01"]),
    ] {
        assert_eq!(with_date_facts(&s), s);
    }
}

#[test]
fn a_request_is_re_rendered_with_its_facts() {
    let body = br#"{"state": {"a": "2026-01-01", "b": "2026-01-31"}, "questions": {"q": {"type": "noul"}}}"#;
    let plain = parse_request(body).unwrap();
    assert_eq!(plain.rendered_state(), "a: 2026-01-01\nb: 2026-01-31");
    let with = plain.clone().with_date_facts();
    assert_eq!(
        with.rendered_state(),
        "a: 2026-01-01\nb: 2026-01-31\ndate_facts: 2026-01-31 is 30 days after 2026-01-01."
    );
    assert_eq!(with.questions(), plain.questions());
    assert_eq!(
        with.state()["date_facts"],
        Value::String("2026-01-31 is 30 days after 2026-01-01.".into())
    );
}
