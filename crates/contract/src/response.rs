//! Response bodies: `POST /v1/systemone` (kev-contract §8.3, §8.4) and the `GET /v1/models` card (§8.1).

use serde_json::{Map, Value};

/// Extension fields are `x_`-prefixed (jevcompat `response.extensions`); a name without the prefix gets it.
fn extension_key(name: &str) -> String {
    if name.starts_with("x_") {
        name.to_owned()
    } else {
        format!("x_{name}")
    }
}

/// `usage`: tokens the request ran and the tokens its answers count as output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Usage {
    /// The state once plus every question's branch (delimiters included).
    pub input_tokens: usize,
    /// Tokens of Python's `json.dumps(answers)`.
    pub output_tokens: usize,
}

/// The 200 body: `{"model", "answers", "usage": {"input_tokens", "output_tokens"}}` plus `x_` extensions.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseBody {
    model: String,
    answers: Value,
    usage: Usage,
    usage_extras: Vec<(String, Value)>,
    extras: Vec<(String, Value)>,
}

impl ResponseBody {
    /// A body for `model` (echo the request's), the `answers` object of [`crate::shape_answers`], and usage.
    pub fn new(model: &str, answers: Value, input_tokens: usize, output_tokens: usize) -> Self {
        ResponseBody {
            model: model.to_owned(),
            answers,
            usage: Usage {
                input_tokens,
                output_tokens,
            },
            usage_extras: Vec::new(),
            extras: Vec::new(),
        }
    }

    /// Adds a top-level extension field (`x_` prefixed; added if missing), after the standard fields.
    pub fn extra(mut self, name: &str, value: Value) -> Self {
        self.extras.push((extension_key(name), value));
        self
    }

    /// Adds an extension field inside `usage` (`x_` prefixed; added if missing).
    pub fn usage_extra(mut self, name: &str, value: Value) -> Self {
        self.usage_extras.push((extension_key(name), value));
        self
    }

    /// The model name echoed from the request.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The `answers` object.
    pub fn answers(&self) -> &Value {
        &self.answers
    }

    /// `usage` (without its extensions).
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// A top-level extension field by its (`x_`-prefixed) name.
    pub fn extension(&self, name: &str) -> Option<&Value> {
        self.extras.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The body as a JSON value (key order as sent).
    pub fn to_value(&self) -> Value {
        let mut usage = Map::new();
        usage.insert("input_tokens".into(), Value::from(self.usage.input_tokens));
        usage.insert(
            "output_tokens".into(),
            Value::from(self.usage.output_tokens),
        );
        for (k, v) in &self.usage_extras {
            usage.insert(k.clone(), v.clone());
        }
        let mut body = Map::new();
        body.insert("model".into(), Value::String(self.model.clone()));
        body.insert("answers".into(), self.answers.clone());
        body.insert("usage".into(), Value::Object(usage));
        for (k, v) in &self.extras {
            body.insert(k.clone(), v.clone());
        }
        Value::Object(body)
    }

    /// The bytes Kev's FastAPI sends: compact separators, UTF-8, non-ASCII unescaped, floats as Python `repr`
    /// (which is how [`crate::shape_answers`] writes its numbers).
    pub fn to_json(&self) -> String {
        compact_json(&self.to_value())
    }
}

/// Starlette's `JSONResponse` serialization (`json.dumps(ensure_ascii=False, separators=(",", ":"))`): for values
/// whose numbers already carry Python's text, `serde_json`'s compact writer produces the same bytes (same
/// escapes: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`, other controls as lowercase `\u00XX`).
///
/// Lone surrogates the reader kept (see [`crate::surrogate`]) are written back as their `\uXXXX` escapes.
pub fn compact_json(value: &Value) -> String {
    // Serializing a `Value` cannot fail: its map keys are strings.
    crate::surrogate::wire(serde_json::to_string(value).unwrap_or_default())
}

/// One `/v1/models` card: the TypeSafe fields and `x_`-prefixed extras.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelCard {
    /// The model name clients send (`kev-latest`, `jev-latest`).
    pub name: String,
    /// Human-readable description.
    pub description: String,
    /// `YYYY-MM-DD`.
    pub release_date: String,
    /// Extra fields (names are `x_`-prefixed on output).
    pub extras: Vec<(String, Value)>,
}

impl ModelCard {
    /// The card as a JSON object: `name`, `description`, `release_date`, then the extras.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), Value::String(self.name.clone()));
        m.insert(
            "description".into(),
            Value::String(self.description.clone()),
        );
        m.insert(
            "release_date".into(),
            Value::String(self.release_date.clone()),
        );
        for (k, v) in &self.extras {
            m.insert(extension_key(k), v.clone());
        }
        Value::Object(m)
    }
}

/// The `GET /v1/models` body: `{"models": [card, ...]}`.
pub fn models_body(cards: &[ModelCard]) -> Value {
    let mut m = Map::new();
    m.insert(
        "models".into(),
        Value::Array(cards.iter().map(ModelCard::to_value).collect()),
    );
    Value::Object(m)
}
