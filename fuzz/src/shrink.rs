//! A small greedy shrinking pass: drop keys and array items, and lower numbers, while the run
//! still fails with the same signature.

use crate::case::{context, write_input};
use crate::check::classify;
use crate::exec::{Limits, run};
use crate::presets::Catalog;
use crate::store::Example;
use serde_json::{Value, json};
use std::path::Path;

/// Paths to every value, shortest first, as JSON pointers.
fn pointers(v: &Value, here: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{here}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{here}/{i}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

/// The candidate edits at `ptr`: removal, then smaller numbers.
fn edits(v: &Value, ptr: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let (parent, last) = ptr.rsplit_once('/').unwrap_or(("", ptr));
    let mut removed = v.clone();
    let ok = match removed.pointer_mut(parent) {
        Some(Value::Object(m)) => m.remove(&last.replace("~1", "/").replace("~0", "~")).is_some(),
        Some(Value::Array(a)) => last.parse::<usize>().ok().filter(|i| *i < a.len()).map(|i| a.remove(i)).is_some(),
        _ => false,
    };
    if ok {
        out.push(removed);
    }
    if let Some(x) = v.pointer(ptr).and_then(Value::as_f64) {
        for smaller in [1.0, (x / 2.0).floor(), 0.0] {
            if smaller < x && smaller >= 0.0 {
                let mut c = v.clone();
                if let Some(slot) = c.pointer_mut(ptr) {
                    *slot = if smaller.fract() == 0.0 { json!(smaller as u64) } else { json!(smaller) };
                    out.push(c);
                }
            }
        }
    }
    out
}

/// Shrink `ex` while `trainsim ARGS` keeps failing with `sig`; at most `budget` runs.
pub fn shrink(
    ex: &Example,
    sig: &str,
    bin: &Path,
    dir: &Path,
    cat: &Catalog,
    limits: Limits,
    budget: usize,
) -> Option<Vec<u8>> {
    let mut best: Value = serde_json::from_slice(&ex.text).ok()?;
    let runs = std::cell::Cell::new(0);
    let still_fails = |v: &Value| -> bool {
        runs.set(runs.get() + 1);
        let text = serde_json::to_vec(v).unwrap_or_default();
        if write_input(dir, &text, &ex.files).is_err() {
            return false;
        }
        let Ok(o) = run(bin, &ex.args, dir, limits) else { return false };
        classify(&ex.args[0], &o, &context(&text, cat)).signature(&ex.args[0], &ex.tags) == sig
    };
    let mut progress = true;
    while progress {
        progress = false;
        let mut ptrs = Vec::new();
        pointers(&best, String::new(), &mut ptrs);
        ptrs.sort_by_key(|p| p.matches('/').count());
        'paths: for p in ptrs {
            for cand in edits(&best, &p) {
                if runs.get() >= budget {
                    break 'paths;
                }
                if still_fails(&cand) {
                    best = cand;
                    progress = true;
                    break 'paths;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    Some(serde_json::to_vec(&best).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edits_remove_and_lower() {
        let v = json!({"plan": {"dp": 8}, "a/b": [1, 2]});
        let e = edits(&v, "/plan/dp");
        assert_eq!(e[0], json!({"plan": {}, "a/b": [1, 2]}));
        assert!(e.contains(&json!({"plan": {"dp": 4}, "a/b": [1, 2]})));
        assert_eq!(edits(&v, "/a~1b/0")[0], json!({"plan": {"dp": 8}, "a/b": [2]}));
    }
}
