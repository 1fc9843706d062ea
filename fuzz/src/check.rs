//! The invariant: a run ends either with exit 0 and a report whose numbers are finite and
//! physically possible, or with a non-zero exit and one clear paragraph on stderr. Anything
//! else is classified (panic, signal, timeout, out of memory, impossible, unclear error) with
//! a signature that tells distinct bugs apart.

use crate::bound::Context;
use crate::exec::Outcome;
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    Ok,
    ClearError,
    Panic,
    Signal,
    Timeout,
    Oom,
    Impossible,
    UnclearError,
}

impl Class {
    pub const ALL: [Class; 8] = [
        Class::Ok,
        Class::ClearError,
        Class::Panic,
        Class::Signal,
        Class::Timeout,
        Class::Oom,
        Class::Impossible,
        Class::UnclearError,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::Ok => "ok",
            Class::ClearError => "clear-error",
            Class::Panic => "panic",
            Class::Signal => "abort/signal",
            Class::Timeout => "timeout",
            Class::Oom => "oom",
            Class::Impossible => "impossible",
            Class::UnclearError => "unclear-error",
        }
    }

    pub fn is_failure(self) -> bool {
        !matches!(self, Class::Ok | Class::ClearError)
    }
}

/// A classified run: the class and what identifies the bug (a panic's location, the failed
/// check, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub class: Class,
    pub detail: String,
}

impl Verdict {
    fn new(class: Class, detail: impl Into<String>) -> Verdict {
        Verdict { class, detail: detail.into() }
    }

    /// The deduplication key: class, command where the bug is command-specific, and detail.
    pub fn signature(&self, command: &str, tags: &[String]) -> String {
        let tags: Vec<&str> = tags.iter().map(String::as_str).filter(|t| !t.starts_with("preset:")).collect();
        match self.class {
            Class::Panic => format!("panic {}", self.detail),
            Class::Timeout | Class::Oom => format!("{} {command} [{}]", self.class.name(), tags.join(" ")),
            _ => format!("{} {command}: {}", self.class.name(), self.detail),
        }
    }
}

/// Digits to `N`, so messages that differ only in numbers group together.
fn normalise(s: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(ch);
        }
    }
    out.chars().take(100).collect()
}

/// `panicked at FILE:LINE:COL:` and the message line after it.
fn panic_site(stderr: &str) -> Option<String> {
    let i = stderr.find("panicked at ")?;
    let rest = &stderr[i + "panicked at ".len()..];
    let (head, tail) = rest.split_once('\n').unwrap_or((rest, ""));
    let head = head.trim_end_matches(':');
    // Keep FILE:LINE; a column moves with formatting.
    let loc = match head.rsplit_once(':') {
        Some((fl, col)) if col.chars().all(|c| c.is_ascii_digit()) => fl,
        _ => head,
    };
    let msg = tail.lines().next().unwrap_or("").trim();
    Some(format!("{loc}: {}", normalise(msg)))
}

fn signal_name(s: i32) -> &'static str {
    match s {
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        _ => "signal",
    }
}

/// Is this stderr one clear paragraph with an `error:` line? `Err(why not)` otherwise.
fn clear_error(stderr: &str) -> Result<(), &'static str> {
    let t = stderr.trim();
    if t.is_empty() {
        return Err("empty stderr");
    }
    if t.len() > 2000 {
        return Err("stderr longer than a paragraph (2000 bytes)");
    }
    if t.contains("\n\n") {
        return Err("stderr has more than one paragraph");
    }
    if !t.lines().any(|l| l.starts_with("error:")) {
        return Err("no \"error:\" line");
    }
    // Rust's Debug output of an error or an option: `Os { code: 2, kind: NotFound, .. }`,
    // `Some(3)`, `Err(..)`. (A key path such as `device.kind: ` is fine.)
    for debug in ["{ code:", "Error {", "kind: NotFound", "kind: InvalidData", "Some(", "Err(", "Ok(", "RUST_BACKTRACE"]
    {
        if t.contains(debug) {
            return Err("debug formatting in the message");
        }
    }
    Ok(())
}

/// Classify one run of `command` (`simulate`, `train-run`, `partition`, `slices`,
/// `capacity`, `search`, `nccl-test`).
pub fn classify(command: &str, o: &Outcome, ctx: &Context) -> Verdict {
    let stderr = o.stderr_text();
    if o.timed_out {
        return Verdict::new(Class::Timeout, "");
    }
    let oom_text = stderr.contains("memory allocation of") || stderr.contains("out of memory");
    if stderr.contains("panicked") || stderr.contains("RUST_BACKTRACE") && !oom_text {
        let site = panic_site(&stderr).unwrap_or_else(|| "(no location)".into());
        return Verdict::new(Class::Panic, site);
    }
    if oom_text || o.signal == Some(9) {
        return Verdict::new(Class::Oom, "");
    }
    if let Some(s) = o.signal {
        let what = if stderr.contains("overflowed its stack") { "stack overflow" } else { signal_name(s) };
        return Verdict::new(Class::Signal, what);
    }
    if o.code != Some(0) {
        return match clear_error(&stderr) {
            Ok(()) => Verdict::new(Class::ClearError, ""),
            Err(why) => Verdict::new(Class::UnclearError, why),
        };
    }
    let report: Value = match serde_json::from_slice(&o.stdout) {
        Ok(v) => v,
        Err(_) => return Verdict::new(Class::Impossible, "exit 0 but stdout is not a JSON report"),
    };
    match crate::invariants::check(command, &report, ctx) {
        Ok(()) => Verdict::new(Class::Ok, ""),
        Err(check) => Verdict::new(Class::Impossible, check),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn outcome(code: Option<i32>, signal: Option<i32>, stdout: &str, stderr: &str) -> Outcome {
        Outcome {
            code,
            signal,
            timed_out: false,
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            wall_s: 0.1,
        }
    }

    #[test]
    fn a_panic_is_a_panic_with_its_location() {
        let err = "thread 'main' (123) panicked at sim/src/engine/run.rs:214:13:\ndeadlock: 7 streams did not finish\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        let v = classify("simulate", &outcome(Some(101), None, "", err), &Context::default());
        assert_eq!(v.class, Class::Panic);
        assert_eq!(v.detail, "sim/src/engine/run.rs:214: deadlock: N streams did not finish");
        assert_eq!(v.signature("simulate", &[]), "panic sim/src/engine/run.rs:214: deadlock: N streams did not finish");
    }

    #[test]
    fn allocation_failure_and_signals() {
        let oom = outcome(
            None,
            Some(6),
            "",
            "memory allocation of 8589934592 bytes failed\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
        );
        assert_eq!(classify("simulate", &oom, &Context::default()).class, Class::Oom);
        let seg = outcome(None, Some(11), "", "");
        assert_eq!(classify("simulate", &seg, &Context::default()), Verdict::new(Class::Signal, "SIGSEGV"));
        let stack = outcome(
            None,
            Some(6),
            "",
            "\nthread 'main' has overflowed its stack\nfatal runtime error: stack overflow\n",
        );
        assert_eq!(classify("slices", &stack, &Context::default()).detail, "stack overflow");
        let mut slow = outcome(None, Some(9), "", "");
        slow.timed_out = true;
        assert_eq!(classify("capacity", &slow, &Context::default()).class, Class::Timeout);
    }

    #[test]
    fn errors_are_clear_only_as_one_paragraph_with_an_error_line() {
        let ctx = Context::default();
        for msg in [
            "error: s.json: invalid scenario: plan.tp: 3 does not divide 8\n",
            "error: s.json: invalid scenario: cluster.node.device.kind: expected a string, got {\"value\":\"cpu\"}\n",
        ] {
            assert_eq!(classify("simulate", &outcome(Some(2), None, "", msg), &ctx).class, Class::ClearError, "{msg}");
        }
        let progress =
            "simulating 3 epochs...\nerror: s.json: invalid scenario: run.epochs: expected a positive integer, got 0\n";
        assert_eq!(classify("train-run", &outcome(Some(2), None, "", progress), &ctx).class, Class::ClearError);
        for (bad, why) in [
            ("", "empty stderr"),
            ("error: a\n\nsecond paragraph", "stderr has more than one paragraph"),
            ("something went wrong", "no \"error:\" line"),
            ("error: Os { code: 2, kind: NotFound }", "debug formatting in the message"),
        ] {
            assert_eq!(
                classify("simulate", &outcome(Some(1), None, "", bad), &ctx),
                Verdict::new(Class::UnclearError, why)
            );
        }
    }

    #[test]
    fn a_report_with_mfu_above_one_is_impossible() {
        let r = json!({"iteration_s": 1.0, "mfu": 1.5, "devices": 1, "stages": []});
        let v = classify("simulate", &outcome(Some(0), None, &r.to_string(), ""), &Context::default());
        assert_eq!(v, Verdict::new(Class::Impossible, "mfu > 1"));
        assert_eq!(v.signature("simulate", &[]), "impossible simulate: mfu > 1");
        let ok = json!({"iteration_s": 1.0, "mfu": 0.5, "devices": 1, "stages": []});
        assert_eq!(
            classify("simulate", &outcome(Some(0), None, &ok.to_string(), ""), &Context::default()).class,
            Class::Ok
        );
    }

    #[test]
    fn exit_zero_without_a_report_is_impossible() {
        let v = classify("simulate", &outcome(Some(0), None, "half a rep", ""), &Context::default());
        assert_eq!(v.class, Class::Impossible);
    }

    #[test]
    fn timeouts_group_by_command_and_scenario_features() {
        let v = Verdict::new(Class::Timeout, "");
        let tags = vec!["preset:gpt2".to_string(), "bucket<64KiB".to_string()];
        assert_eq!(v.signature("simulate", &tags), "timeout simulate [bucket<64KiB]");
    }
}
