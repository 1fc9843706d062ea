//! A JSON object reader that remembers where it is, so every error names its key path, the
//! value found and what is allowed.

use super::suggest::did_you_mean;
use serde_json::{Map, Value};
use std::fmt;

/// An error in a scenario: where, what was found, what is allowed.
#[derive(Clone, Debug, PartialEq)]
pub struct ScenarioError {
    pub path: String,
    pub message: String,
    /// The key names a feature that later work adds; the input itself is fine.
    pub unsupported: bool,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.unsupported {
            write!(f, "not supported yet: {}: {}", self.path, self.message)
        } else {
            write!(f, "invalid scenario: {}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ScenarioError {}

pub type Result<T> = std::result::Result<T, ScenarioError>;

pub fn invalid(path: &str, message: impl Into<String>) -> ScenarioError {
    ScenarioError { path: path.to_string(), message: message.into(), unsupported: false }
}

pub fn unsupported(path: &str, message: impl Into<String>) -> ScenarioError {
    ScenarioError { path: path.to_string(), message: message.into(), unsupported: true }
}

/// A short rendering of a value for messages: at most 60 characters (cut on a character
/// boundary, never inside a multi-byte one).
pub fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 60 { format!("{}...", s.chars().take(57).collect::<String>()) } else { s }
}

/// A list at `path` of distinct names, each one of `allowed` (`what` names one in messages:
/// "metric", "module"), in the order given.
pub fn name_list(v: &Value, path: &str, allowed: &[&'static str], what: &str) -> Result<Vec<&'static str>> {
    let all = allowed.join(", ");
    let items = v
        .as_array()
        .ok_or_else(|| invalid(path, format!("expected a list of {what} names (allowed: {all}), got {}", show(v))))?;
    let mut out: Vec<&'static str> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let name = item.as_str().ok_or_else(|| invalid(&at, format!("expected a {what} name, got {}", show(item))))?;
        let known = allowed.iter().find(|n| **n == name).ok_or_else(|| {
            invalid(
                &at,
                format!("unknown {what} \"{name}\"{}; allowed: {all}", did_you_mean(name, allowed.iter().copied())),
            )
        })?;
        if out.contains(known) {
            return Err(invalid(&at, format!("\"{name}\" is listed twice")));
        }
        out.push(known);
    }
    Ok(out)
}

/// One JSON object at a key path.
pub struct Obj<'a> {
    pub map: &'a Map<String, Value>,
    pub path: String,
}

impl<'a> Obj<'a> {
    pub fn new(v: &'a Value, path: &str) -> Result<Obj<'a>> {
        match v {
            Value::Object(map) => Ok(Obj { map, path: path.to_string() }),
            other => Err(invalid(path, format!("expected an object, got {}", show(other)))),
        }
    }

    pub fn key(&self, k: &str) -> String {
        if self.path.is_empty() { k.to_string() } else { format!("{}.{}", self.path, k) }
    }

    /// Reject keys not in `allowed`.
    pub fn only(&self, allowed: &[&str]) -> Result<()> {
        for k in self.map.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(invalid(
                    &self.key(k),
                    format!(
                        "unknown key{}; allowed here: {}",
                        did_you_mean(k, allowed.iter().copied()),
                        allowed.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    pub fn get(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    pub fn has(&self, k: &str) -> bool {
        self.map.contains_key(k)
    }

    pub fn obj(&self, k: &str) -> Result<Option<Obj<'a>>> {
        self.get(k).map(|v| Obj::new(v, &self.key(k))).transpose()
    }

    pub fn req<T>(&self, k: &str, f: impl Fn(&Self, &str) -> Result<Option<T>>) -> Result<T> {
        f(self, k)?.ok_or_else(|| invalid(&self.key(k), "required key is missing"))
    }

    pub fn uint(&self, k: &str) -> Result<Option<u32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n >= 1 && n <= u32::MAX as u64 => Ok(Some(n as u32)),
                _ => Err(invalid(&self.key(k), format!("expected a positive integer, got {}", show(v)))),
            },
        }
    }

    /// A non-negative integer (0 allowed).
    pub fn count(&self, k: &str) -> Result<Option<u32>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= u32::MAX as u64 => Ok(Some(n as u32)),
                _ => Err(invalid(&self.key(k), format!("expected a non-negative integer, got {}", show(v)))),
            },
        }
    }

    /// A positive finite number.
    pub fn positive(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(invalid(&self.key(k), format!("expected a positive number, got {}", show(v)))),
            },
        }
    }

    /// A finite number >= 0.
    pub fn non_negative(&self, k: &str) -> Result<Option<f64>> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
                _ => Err(invalid(&self.key(k), format!("expected a number >= 0, got {}", show(v)))),
            },
        }
    }

    /// A number in (0, 1].
    pub fn fraction(&self, k: &str) -> Result<Option<f64>> {
        match self.positive(k)? {
            Some(x) if x > 1.0 => Err(invalid(&self.key(k), format!("expected a fraction in (0, 1], got {x}"))),
            other => Ok(other),
        }
    }

    pub fn boolean(&self, k: &str) -> Result<Option<bool>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(invalid(&self.key(k), format!("expected true or false, got {}", show(v)))),
        }
    }

    pub fn string(&self, k: &str) -> Result<Option<&'a str>> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(invalid(&self.key(k), format!("expected a string, got {}", show(v)))),
        }
    }

    /// A string from a closed set, parsed by `parse`.
    pub fn choice<T>(&self, k: &str, names: &[&str], parse: impl Fn(&str) -> Option<T>) -> Result<Option<T>> {
        match self.string(k)? {
            None => Ok(None),
            Some(s) => parse(s).map(Some).ok_or_else(|| {
                invalid(
                    &self.key(k),
                    format!("\"{s}\" is not one of: {}{}", names.join(", "), did_you_mean(s, names.iter().copied())),
                )
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::show;

    #[test]
    fn show_cuts_long_values_on_character_boundaries() {
        for text in ["a".repeat(100), "é".repeat(100), format!("a{}", "é".repeat(100)), "日本".repeat(40)] {
            let shown = show(&serde_json::Value::String(text.clone()));
            assert!(shown.ends_with("..."), "{shown}");
            assert_eq!(shown.chars().count(), 60, "{shown}");
            assert!(text.starts_with(&shown[1..shown.len() - 3]), "{shown} is not a prefix of the value");
        }
        assert_eq!(show(&serde_json::json!("short é")), "\"short é\"");
    }
}
