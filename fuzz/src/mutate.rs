//! Mutations of a valid scenario (wrong types, extreme values, unknown, missing and renamed
//! keys) and of its text (truncation, stray bytes, numbers JSON cannot hold), and inputs that
//! are not scenarios at all.

use crate::rng::R;
use serde_json::{Value, json};

/// Text spliced in where a value was marked `"@@RAW<n>@@"`: numbers and literals serde_json
/// would never write.
const RAW: [&str; 14] = [
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    "-Infinity",
    "18446744073709551616",
    "1e-400",
    "-0",
    "-0.0",
    "0.1e1",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "340282366920938463463374607431768211456",
    "4.9e-324",
];

fn weird(r: &mut R) -> Value {
    let long = "é".repeat(r.int(20, 80) as usize) + "日本語🚂";
    match r.int(0, 36) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(-0.5),
        3 => json!(0.5),
        4 => json!(1e-320),
        5 => json!(1e308),
        6 => json!(-1e308),
        7 => json!(u32::MAX),
        8 => json!(u32::MAX as u64 + 1),
        9 => json!(i64::MIN),
        10 => json!(u64::MAX),
        11 => json!((1u64 << 53) + 1),
        12 => json!(256),
        13 => json!(255),
        14 => json!(257),
        15 => json!(1e15),
        16 => json!(""),
        17 => json!("NaN"),
        18 => json!("inf"),
        19 => json!("-Infinity"),
        20 => json!("1e999"),
        21 => json!("0x10"),
        22 => json!("１２"),
        23 => json!(long),
        24 => json!("\u{0}"),
        25 => json!("/dev/null"),
        26 => json!("."),
        27 => json!(true),
        28 => Value::Null,
        29 => json!([]),
        30 => json!({}),
        31 => json!([1, 2, 3]),
        32 => json!({"a": 1}),
        33 => json!(2.5),
        34 => json!(65536),
        35 => json!(4294967295u64 * 2),
        _ => json!(format!("@@RAW{}@@", r.int(0, RAW.len() as u64 - 1))),
    }
}

/// Every path (as a list of steps) to a value in `v`.
fn paths(v: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                here.push(Step::Key(k.clone()));
                out.push(here.clone());
                paths(x, here, out);
                here.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                here.push(Step::Index(i));
                out.push(here.clone());
                paths(x, here, out);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn at<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
    let mut cur = v;
    for s in path {
        cur = match s {
            Step::Key(k) => cur.get_mut(k.as_str())?,
            Step::Index(i) => cur.get_mut(*i)?,
        };
    }
    Some(cur)
}

fn misspell(r: &mut R, k: &str) -> String {
    let mut c: Vec<char> = k.chars().collect();
    match r.int(0, 3) {
        0 if c.len() > 1 => {
            let i = r.int(0, c.len() as u64 - 2) as usize;
            c.swap(i, i + 1);
        }
        1 if !c.is_empty() => {
            c.remove(r.int(0, c.len() as u64 - 1) as usize);
        }
        2 => c.push('s'),
        _ => return k.to_uppercase(),
    }
    c.into_iter().collect()
}

/// One structural mutation.
fn mutate_once(r: &mut R, v: &mut Value) {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    if all.is_empty() {
        *v = weird(r);
        return;
    }
    let path = r.pick(&all).clone();
    let (parent, last) = path.split_at(path.len() - 1);
    match r.int(0, 9) {
        // Delete the key (or array item).
        0 | 1 => {
            if let Some(p) = at(v, parent) {
                match (&last[0], p) {
                    (Step::Key(k), Value::Object(m)) => {
                        m.remove(k);
                    }
                    (Step::Index(i), Value::Array(a)) if *i < a.len() => {
                        a.remove(*i);
                    }
                    _ => {}
                }
            }
        }
        // Misspell the key, or add an unknown one next to it.
        2 | 3 => {
            if let (Step::Key(k), Some(Value::Object(m))) = (&last[0], at(v, parent)) {
                let new = misspell(r, k);
                if r.chance(0.5) {
                    if let Some(x) = m.remove(k) {
                        m.insert(new, x);
                    }
                } else {
                    m.insert(new, json!(1));
                }
            }
        }
        // Wrap the value in an array or object.
        4 => {
            if let Some(x) = at(v, &path) {
                let old = x.take();
                *x = if r.chance(0.5) { json!([old]) } else { json!({"value": old}) };
            }
        }
        // Scale a number to the edge.
        5 => {
            if let Some(x) = at(v, &path)
                && let Some(f) = x.as_f64()
            {
                *x = json!(f * *r.pick(&[1e6, 1e12, 1e-9, -1.0, 0.0, 1e300]));
            }
        }
        // Replace with a value of another kind or an extreme one.
        _ => {
            if let Some(x) = at(v, &path) {
                *x = weird(r);
            }
        }
    }
}

/// Serialise with raw splices.
fn render(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    for (i, raw) in RAW.iter().enumerate() {
        s = s.replace(&format!("\"@@RAW{i}@@\""), raw);
    }
    s.into_bytes()
}

/// Text-level damage: truncation, stray bytes, duplicated keys.
fn damage(r: &mut R, mut b: Vec<u8>) -> Vec<u8> {
    match r.int(0, 5) {
        0 => {
            let n = r.int(0, b.len() as u64) as usize;
            b.truncate(n);
        }
        1 => {
            let at = r.int(0, b.len() as u64) as usize;
            let junks: [&[u8]; 7] = [b"\xff\xfe", b"\xc3", b"\x00", b"}", b",", b"\xef\xbb\xbf", b"\xed\xa0\x80"];
            let junk = *r.pick(&junks);
            b.splice(at..at, junk.iter().copied());
        }
        2 => {
            let mut v = b"\xef\xbb\xbf".to_vec();
            v.extend(b);
            b = v;
        }
        3 => {
            // A key given twice: the later one wins in serde_json.
            if let Some(i) = b.iter().position(|&c| c == b'{') {
                b.splice(i + 1..i + 1, br#""plan": {"dp": 0}, "#.iter().copied());
            }
        }
        4 => {
            // A stray byte that is not UTF-8 inside a string.
            if let Some(i) = b.iter().position(|&c| c == b'"') {
                b.insert(i + 1, 0xff);
            }
        }
        _ => b.extend_from_slice(b" trailing"),
    }
    b
}

/// A mutated scenario's text: 1-3 structural mutations, sometimes text damage after.
pub fn mutated(r: &mut R, base: &Value) -> Vec<u8> {
    let mut v = base.clone();
    for _ in 0..r.int(1, 3) {
        mutate_once(r, &mut v);
    }
    let text = render(&v);
    if r.chance(0.15) { damage(r, text) } else { text }
}

/// Input that is not a scenario at all.
pub fn garbage(r: &mut R) -> Vec<u8> {
    match r.int(0, 9) {
        0 => Vec::new(),
        1 => b"{".to_vec(),
        2 => b"[]".to_vec(),
        3 => b"null".to_vec(),
        4 => b"{\"workload\":".to_vec(),
        5 => "[".repeat(r.int(100, 200_000) as usize).into_bytes(),
        6 => (0..r.int(1, 4096)).map(|_| r.int(0, 255) as u8).collect(),
        7 => format!("{{\"name\": \"{}\"}}", "x".repeat(r.int(1, 4 << 20) as usize)).into_bytes(),
        8 => b"{\"workload\": {\"preset\": \"gpt2\"}, \"workload\": 3}".to_vec(),
        _ => b"\xef\xbb\xbf{}".to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_splices_reach_the_text() {
        let v = json!({"a": "@@RAW0@@", "b": "@@RAW10@@"});
        let t = String::from_utf8(render(&v)).unwrap();
        assert!(t.contains("\"a\": 1e400"), "{t}");
        assert!(t.contains(r#""b": "\ud800""#), "{t}");
    }

    #[test]
    fn mutations_change_the_input() {
        let base = json!({"workload": {"preset": "gpt2"}, "plan": {"dp": 2, "tp": 1}});
        let plain = render(&base);
        let changed = (0..50).filter(|&c| mutated(&mut R::for_case(1, c), &base) != plain).count();
        assert!(changed >= 45, "only {changed} of 50 mutations changed the input");
    }
}
