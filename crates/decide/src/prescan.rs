//! A cheap look at a request body before the full parse: how many questions it holds, so a body far over
//! the question cap is refused (413) without building its whole tree.
//!
//! The full reader (`kev_contract::parse_body`, Python's `json.loads`) builds every question's value; for
//! 20,000 questions that is most of the time a refusal takes. The scan here walks the body with serde's
//! `IgnoredAny`, keeping only the question ids, and answers the count exactly as the full reader would see
//! it: the last top-level `questions` key wins and duplicate ids count once, as in a Python dict. Anything
//! it does not read as plain JSON (NaN, lone surrogates, a BOM, an error) gives `None`, and the full reader
//! decides — so the scan can only answer earlier, never differently.

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

/// The number of distinct question ids under the body's last top-level `questions` key, when the body is
/// plain JSON whose top level is an object and that key holds an object; else `None`.
pub fn question_count(body: &[u8]) -> Option<usize> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let count = Top.deserialize(&mut de).ok()?;
    de.end().ok()?;
    count
}

/// The top-level object: the last `questions` entry's count.
struct Top;

impl<'de> DeserializeSeed<'de> for Top {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut count = None;
        while let Some(key) = map.next_key::<String>()? {
            if key == "questions" {
                count = map.next_value_seed(Questions)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(count)
    }

    // Any other top level: the full reader answers it.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// The `questions` value: its distinct keys when it is an object.
struct Questions;

impl<'de> DeserializeSeed<'de> for Questions {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        // Not an object (validation refuses it later): no count.
        d.deserialize_any(QuestionIds)
    }
}

struct QuestionIds;

impl<'de> Visitor<'de> for QuestionIds {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the questions")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut ids: HashSet<String> = HashSet::new();
        while let Some(id) = map.next_key::<String>()? {
            map.next_value::<IgnoredAny>()?;
            ids.insert(id);
        }
        Ok(Some(ids.len()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::question_count;

    #[test]
    fn counts_distinct_ids_under_the_last_questions_key() {
        assert_eq!(
            question_count(br#"{"state": "s", "questions": {"a": {"type": "noul"}, "b": 1}}"#),
            Some(2)
        );
        // Python keeps the last of duplicate keys: ids and the `questions` key alike.
        assert_eq!(
            question_count(br#"{"questions": {"a": 1, "a": 2, "\u0061": 3}}"#),
            Some(1)
        );
        assert_eq!(
            question_count(
                br#"{"questions": {"a": 1, "b": 2}, "questions": {"c": [1, {"d": 2}]}}"#
            ),
            Some(1)
        );
        assert_eq!(question_count(br#"{"questions": {}}"#), Some(0));
    }

    #[test]
    fn leaves_everything_else_to_the_full_reader() {
        for body in [
            &br#"{"state": "s"}"#[..],
            br#"{"questions": []}"#,
            br#"{"questions": "x"}"#,
            br#"[1, 2]"#,
            br#""s""#,
            br#"{"questions": {"a": NaN}}"#,
            br#"{"questions": {"\ud800": 1}}"#,
            br#"{"questions": {"a": 1}} trailing"#,
            br#"{"questions": {"a": 1"#,
            b"\xef\xbb\xbf{\"questions\": {}}",
            b"",
        ] {
            assert_eq!(
                question_count(body),
                None,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
