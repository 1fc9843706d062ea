//! Helpers for the integration tests: the CLI binary, fixture paths, temporary folders and
//! small scenarios as JSON.

use serde_json::Value;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The `trainsim` binary under test.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_trainsim"))
}

/// A path relative to the repository root.
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A JSON file of the repository (a data table, a trace), parsed; panics naming the file.
pub fn repo_json(rel: &str) -> Value {
    let text = std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The runnable example scenarios (copies of `shared/scenarios` kept in the repository).
pub fn gpt3_175b() -> PathBuf {
    repo("experiments/core/gpt3-175b-1024xa100.json")
}

pub fn custom_small() -> PathBuf {
    repo("experiments/core/custom-transformer-small.json")
}

/// A folder under the system temporary folder, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("trainsim-it-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temporary folder");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Write `text` to `name` in the folder and return its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write temporary file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run the CLI with `args`.
pub fn run(args: &[&dyn AsRef<OsStr>]) -> Output {
    bin().args(args.iter().map(|a| a.as_ref())).output().expect("run trainsim")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `trainsim simulate PATH --json`, which must succeed, parsed as one JSON object.
pub fn simulate_json(path: &Path) -> Value {
    let o = run(&[&"simulate", &path, &"--json"]);
    assert!(o.status.success(), "simulate {} failed ({}): {}", path.display(), o.status, stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("--json output of {} is not one JSON value: {e}", path.display()));
    assert!(v.is_object(), "--json output of {} is not an object", path.display());
    v
}

/// A number at a JSON pointer, or a panic naming it.
pub fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer).and_then(Value::as_f64).unwrap_or_else(|| panic!("report has no number at {pointer}"))
}

/// `|a - b| <= rel * max(|a|, |b|)`.
pub fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs())
}

#[track_caller]
pub fn assert_close(a: f64, b: f64, rel: f64, what: &str) {
    assert!(close(a, b, rel), "{what}: {a} vs {b} (relative tolerance {rel}, off by {:e})", (a - b).abs() / b.abs());
}

/// Loader for scenarios that name no files.
pub fn no_files(name: &str) -> Result<String, String> {
    Err(format!("tests load no files ({name})"))
}

/// Parse a scenario given as JSON text, panicking with the error on failure.
pub fn parse(text: &str) -> sim::scenario::Scenario {
    sim::scenario::parse(text, &no_files).unwrap_or_else(|e| panic!("scenario rejected: {e}\n{text}"))
}

/// Parse and simulate (without recording spans).
pub fn simulate(text: &str) -> sim::report::Report {
    sim::simulate(&parse(text), false).report
}

/// A small custom GPT-style transformer.
pub fn small_transformer(layers: u32, hidden: u32, heads: u32) -> Value {
    serde_json::json!({"transformer": {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 32000}})
}

/// A scenario on `nodes` DGX A100 80GB nodes with the given workload, training and plan.
pub fn scenario(workload: Value, nodes: u32, training: Value, plan: Value) -> String {
    serde_json::json!({
        "name": "test scenario",
        "workload": workload,
        "cluster": {"node": "dgx-a100-80gb", "nodes": nodes},
        "training": training,
        "plan": plan,
    })
    .to_string()
}

/// Run the CLI with string arguments.
pub fn run_cli(args: &[&str]) -> Output {
    bin().args(args).output().expect("run trainsim")
}

/// A DGX A100 80GB node whose NVLink is replaced by a link of `bandwidth` bytes/s.
pub fn with_intra_node_bandwidth(text: &str, bandwidth: f64) -> String {
    let mut v: Value = serde_json::from_str(text).unwrap();
    v["cluster"]["node"] = serde_json::json!({"preset": "dgx-a100-80gb",
                                  "intra_node": {"bandwidth_bytes_per_s": bandwidth, "latency_s": 2e-6}});
    v.to_string()
}
