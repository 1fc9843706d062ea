//! `trainsim._native`: the simulator behind the `trainsim` Python package.
//!
//! Every function takes a scenario either as a file (`path`) or as JSON text with the folder its
//! relative files (gradient traces, Hugging Face configs) are resolved against (`base_dir`), and
//! returns JSON text that the Python side decodes. The JSON is the CLI's `--json` output, made by
//! the same `sim` calls. Simulation runs with the GIL released.
//!
//! Errors: a scenario the reader refuses, or a plan too large to simulate, raises `ValueError`
//! with the CLI's message (key path, value, what is allowed); an unreadable file `OSError`; a
//! report the simulator judges physically impossible `RuntimeError`.

use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use sim::scenario::{self, Scenario};
use std::path::{Path, PathBuf};

/// Why a call has no result; becomes a Python exception once the GIL is held again.
enum Error {
    /// Bad input: `ValueError`.
    Invalid(String),
    /// A file that cannot be read: `OSError`.
    Io(String),
    /// A modelling error or an engine limit: `RuntimeError`.
    Internal(String),
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Invalid(m) => PyValueError::new_err(m),
            Error::Io(m) => PyOSError::new_err(m),
            Error::Internal(m) => PyRuntimeError::new_err(m),
        }
    }
}

type Result<T> = std::result::Result<T, Error>;

/// A scenario as the caller gave it.
struct Input {
    /// The file, or None for JSON text.
    path: Option<PathBuf>,
    text: Option<String>,
    /// Where relative file names in the scenario are resolved.
    base: PathBuf,
}

impl Input {
    fn new(path: Option<String>, text: Option<String>, base_dir: Option<String>) -> Input {
        let path = path.map(PathBuf::from);
        let base = match (&path, base_dir) {
            (_, Some(b)) => PathBuf::from(b),
            (Some(p), None) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
            (None, None) => PathBuf::new(),
        };
        Input { path, text, base }
    }

    /// The prefix the CLI puts before a message about this scenario: its file, if any.
    fn prefix(&self, message: impl std::fmt::Display) -> String {
        match &self.path {
            Some(p) => format!("{}: {message}", p.display()),
            None => message.to_string(),
        }
    }

    /// Read and validate the scenario as the CLI's `load_scenario` does: files it names are
    /// resolved against its folder (or `base_dir`).
    fn load(&self) -> Result<Scenario> {
        let text = match (&self.path, &self.text) {
            (Some(p), _) => std::fs::read_to_string(p)
                .map_err(|e| Error::Io(format!("cannot read scenario {}: {e}", p.display())))?,
            (None, Some(t)) => t.clone(),
            (None, None) => return Err(Error::Invalid("no scenario given".into())),
        };
        let load = |name: &str| {
            let p = Path::new(name);
            let p = if p.is_absolute() { p.to_path_buf() } else { self.base.join(p) };
            std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
        };
        scenario::parse(&text, &load).map_err(|e| Error::Invalid(self.prefix(e)))
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Internal(e.to_string()))
}

fn sim_error(input: &Input, e: sim::SimError) -> Error {
    let m = input.prefix(&e);
    match e {
        sim::SimError::Impossible(_) => Error::Internal(m),
        sim::SimError::TooLarge { .. } | sim::SimError::Run(_) | sim::SimError::Unsupported(_) => Error::Invalid(m),
    }
}

/// One iteration's report (`trainsim simulate --json`).
#[pyfunction]
#[pyo3(signature = (path=None, text=None, base_dir=None, full=false, network=None))]
fn _simulate_json(
    py: Python<'_>,
    path: Option<String>,
    text: Option<String>,
    base_dir: Option<String>,
    full: bool,
    network: Option<String>,
) -> PyResult<String> {
    let input = Input::new(path, text, base_dir);
    let r: Result<String> = py.detach(|| {
        let mut s = input.load()?;
        if full {
            s.options.symmetry = false;
        }
        if let Some(n) = network {
            s.options.network = sim::network::NetworkKind::parse(&n).ok_or_else(|| {
                Error::Invalid(format!(
                    "network: \"{n}\" is not one of: {}",
                    sim::network::NetworkKind::NAMES.join(", ")
                ))
            })?;
        }
        let out = sim::try_simulate(&s, false).map_err(|e| sim_error(&input, e))?;
        to_json(&out.report)
    });
    Ok(r?)
}

/// A whole training run (`trainsim train-run --json`).
#[pyfunction]
#[pyo3(signature = (path=None, text=None, base_dir=None, runs=1, price_per_gpu_hour=None))]
fn _train_run_json(
    py: Python<'_>,
    path: Option<String>,
    text: Option<String>,
    base_dir: Option<String>,
    runs: u32,
    price_per_gpu_hour: Option<f64>,
) -> PyResult<String> {
    if !(1..=100_000).contains(&runs) {
        return Err(Error::Invalid(format!("runs: {runs}; allowed: 1 to 100000")).into());
    }
    if let Some(p) = price_per_gpu_hour
        && !(p.is_finite() && p >= 0.0)
    {
        return Err(Error::Invalid(format!("price_per_gpu_hour: {p}; allowed: a number >= 0")).into());
    }
    let input = Input::new(path, text, base_dir);
    let r: Result<String> = py.detach(|| {
        let s = input.load()?;
        if s.run.is_none() {
            return Err(Error::Invalid(
                input.prefix(sim::run::NEEDS_RUN),
            ));
        }
        let whole = sim::run::try_whole_run(&s, runs, price_per_gpu_hour).map_err(|e| {
            let m = input.prefix(&e);
            if e.contains("internal error") { Error::Internal(m) } else { Error::Invalid(m) }
        })?;
        to_json(&whole)
    });
    Ok(r?)
}

/// BaPipe's exploration (`trainsim partition --json`): every candidate and the best plan (null
/// when none fits).
#[pyfunction]
#[pyo3(signature = (path=None, text=None, base_dir=None))]
fn _partition_json(
    py: Python<'_>,
    path: Option<String>,
    text: Option<String>,
    base_dir: Option<String>,
) -> PyResult<String> {
    let input = Input::new(path, text, base_dir);
    let r: Result<String> = py.detach(|| {
        let s = input.load()?;
        if s.plan.token_slices.is_some() {
            return Err(Error::Invalid(input.prefix(
                "plan.token_slices is set: token slicing (TeraPipe) fixes the schedule and the units, so there is \
                 nothing for partition to explore; use slices(), or drop token_slices to explore plain pipelines",
            )));
        }
        to_json(&sim::partition::explore(&s))
    });
    Ok(r?)
}

/// TeraPipe's slicing optimiser (`trainsim slices --json`). Without a granularity: the plan's
/// `auto` granularity, else 8-token units, coarser so that a sequence has at most 256 units.
#[pyfunction]
#[pyo3(signature = (path=None, text=None, base_dir=None, granularity=None))]
fn _slices_json(
    py: Python<'_>,
    path: Option<String>,
    text: Option<String>,
    base_dir: Option<String>,
    granularity: Option<u32>,
) -> PyResult<String> {
    let input = Input::new(path, text, base_dir);
    let r: Result<String> = py.detach(|| {
        let s = input.load()?;
        let g = granularity
            .or(match s.plan.token_slices {
                Some(sim::plan::TokenSlices::Auto { granularity }) => Some(granularity),
                _ => None,
            })
            .unwrap_or_else(|| 8.max(s.plan.seq_len.div_ceil(256)));
        if g == 0 || g > s.plan.seq_len {
            return Err(Error::Invalid(format!("granularity: {g} must be between 1 and seq_len {}", s.plan.seq_len)));
        }
        let problem = sim::policy::token_slicing::SliceProblem {
            seq_len: s.plan.seq_len,
            batch: s.training.global_batch / s.plan.dp,
            stages: s.plan.pp,
            granularity: g,
        };
        problem.check_size().map_err(|e| Error::Invalid(input.prefix(e)))?;
        to_json(&sim::choose_token_slices(&s, g).map_err(|e| sim_error(&input, e))?)
    });
    Ok(r?)
}

/// The largest model per memory policy on the scenario's devices (`trainsim capacity --json`
/// without `--gpus`).
#[pyfunction]
#[pyo3(signature = (path=None, text=None, base_dir=None, vary="params".to_string()))]
fn _capacity_json(
    py: Python<'_>,
    path: Option<String>,
    text: Option<String>,
    base_dir: Option<String>,
    vary: String,
) -> PyResult<String> {
    use sim::capacity::{Policy, Vary, capacity};
    let input = Input::new(path, text, base_dir);
    let r: Result<String> = py.detach(|| {
        let s = input.load()?;
        let v = Vary::parse(&vary)
            .ok_or_else(|| Error::Invalid(format!("vary: \"{vary}\" is not one of: hidden, layers, params")))?;
        if s.workload.net.is_some() {
            return Err(Error::Invalid(
                "capacity studies vary a transformer; this workload is a network of distinct layers".into(),
            ));
        }
        let r = capacity(&s, v, &Policy::ALL);
        to_json(&serde_json::json!({"vary": r.vary, "devices": r.devices, "policies": r.policies}))
    });
    Ok(r?)
}

/// The built-in presets (`trainsim presets --json`): devices, links, nodes, workloads.
#[pyfunction]
fn _presets_json() -> PyResult<String> {
    let v = sim::presets_json();
    Ok(to_json(&v)?)
}

/// Rank plans for a scenario (`trainsim search`): `scenario_json` is the scenario's JSON text
/// (its `plan` and `training.micro_batch` may be missing; plan keys given stay fixed),
/// `options_json` an object with `top`, `gpus` (a list of device counts; default the
/// cluster's), `frameworks` (profiles to search too: a list of names, or `"all"`) and
/// `base_dir`; any other key is refused. One count: `{gpus, best, top, pareto, progress}`; several:
/// `{by_gpus: [that, ...], best}` (the fastest best).
/// The keys `_search_json`'s options may hold.
const SEARCH_OPTIONS: [&str; 4] = ["top", "gpus", "frameworks", "base_dir"];

#[pyfunction]
fn _search_json(py: Python<'_>, scenario_json: String, options_json: String) -> PyResult<String> {
    let options: serde_json::Value = serde_json::from_str(&options_json)
        .map_err(|e| Error::Invalid(format!("search options: not valid JSON: {e}")))?;
    if let Some(k) = options.as_object().and_then(|o| o.keys().find(|k| !SEARCH_OPTIONS.contains(&k.as_str()))) {
        return Err(Error::Invalid(format!("search: unknown option {k:?}; allowed: {}", SEARCH_OPTIONS.join(", "))).into());
    }
    let frameworks: Vec<String> = match options.get("frameworks") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(f) => f
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_str().map(String::from)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::Invalid(format!("frameworks: expected profile names, got {f}")))?,
    };
    let base = options.get("base_dir").and_then(|b| b.as_str()).map(PathBuf::from).unwrap_or_default();
    let top = options.get("top").and_then(serde_json::Value::as_u64).unwrap_or(10).clamp(1, 1000) as usize;
    let gpus: Vec<u64> = match options.get("gpus") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(g) => g
            .as_array()
            .and_then(|a| a.iter().map(serde_json::Value::as_u64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| Error::Invalid(format!("gpus: expected device counts, got {g}")))?,
    };
    let out = py.detach(|| -> Result<String> {
        let load = |name: &str| {
            let p = Path::new(name);
            let p = if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
            std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
        };
        let mut raw: serde_json::Value =
            serde_json::from_str(&scenario_json).map_err(|e| Error::Invalid(format!("(file): not valid JSON: {e}")))?;
        let first = scenario::parse_for_search(&raw.to_string(), &load).map_err(|e| Error::Invalid(e.to_string()))?;
        let per_node = u64::from(first.cluster.node.devices);
        let counts: Vec<Option<u64>> = if gpus.is_empty() { vec![None] } else { gpus.iter().map(|&g| Some(g)).collect() };
        let mut runs = Vec::new();
        for g in counts {
            let mut input = match g {
                None => first.clone(),
                Some(g) => {
                    if g == 0 || !g.is_multiple_of(per_node) {
                        return Err(Error::Invalid(format!("gpus: {g} is not a multiple of the node's {per_node} devices")));
                    }
                    match raw.get_mut("cluster").and_then(serde_json::Value::as_object_mut) {
                        Some(c) if c.contains_key("nodes") && !c.contains_key("device_overrides") => {
                            c.insert("nodes".into(), serde_json::json!(g / per_node));
                        }
                        _ => return Err(Error::Invalid("gpus: needs a cluster given as {\"node\": ..., \"nodes\": N}".into())),
                    }
                    scenario::parse_for_search(&raw.to_string(), &load).map_err(|e| Error::Invalid(e.to_string()))?
                }
            };
            input.search_frameworks(&frameworks).map_err(|e| Error::Invalid(format!("frameworks: {e}")))?;
            let o = sim::search::search(&input, sim::search::Options { top, prune: true, extrapolate: true }, &|_| {})
                .map_err(|e| Error::Invalid(e.to_string()))?;
            runs.push(serde_json::json!({
                "gpus": input.cluster.device_count(),
                "best": o.best,
                "top": o.top,
                "pareto": o.pareto,
                "progress": o.progress,
            }));
        }
        let v = if runs.len() == 1 {
            runs.remove(0)
        } else {
            let t = |r: &serde_json::Value| r["best"]["iteration_s"].as_f64().unwrap_or(f64::INFINITY);
            let best = runs.iter().min_by(|a, b| t(a).total_cmp(&t(b))).map(|r| r["best"].clone());
            serde_json::json!({"by_gpus": runs, "best": best})
        };
        to_json(&v)
    })?;
    Ok(out)
}

/// The version of the simulator this module was built from.
#[pyfunction]
fn _version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_simulate_json, m)?)?;
    m.add_function(wrap_pyfunction!(_train_run_json, m)?)?;
    m.add_function(wrap_pyfunction!(_partition_json, m)?)?;
    m.add_function(wrap_pyfunction!(_slices_json, m)?)?;
    m.add_function(wrap_pyfunction!(_capacity_json, m)?)?;
    m.add_function(wrap_pyfunction!(_presets_json, m)?)?;
    m.add_function(wrap_pyfunction!(_search_json, m)?)?;
    m.add_function(wrap_pyfunction!(_version, m)?)?;
    Ok(())
}
