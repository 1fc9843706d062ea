//! One fuzz case: its input (drawn from the seed and the case number alone), the commands it
//! goes through, and running them.

use crate::bound::Context;
use crate::check::{Verdict, classify};
use crate::exec::{Limits, Outcome, run};
use crate::presets::Catalog;
use crate::rng::R;
use crate::{generate, mutate};
use std::path::{Path, PathBuf};

pub const SCENARIO_FILE: &str = "scenario.json";

/// The node file an `nccl-test` run of a case reads (`--node`): the scenario's `cluster.node`.
pub const NODE_FILE: &str = "node.json";

/// How often a case also times one collective with `nccl-test` on its scenario's node.
const NCCL_TEST_FRACTION: f64 = 0.25;

#[derive(Clone, Debug)]
pub struct Case {
    pub id: u64,
    /// "valid", "mutated" or "garbage".
    pub kind: &'static str,
    pub text: Vec<u8>,
    pub files: Vec<(String, Vec<u8>)>,
    pub tags: Vec<String>,
    /// Arguments of each run (the scenario file last; `nccl-test` reads [`NODE_FILE`] instead).
    pub runs: Vec<Vec<String>>,
    /// A file of a corpus: run where it lies (its side files beside it), not in a temp folder.
    pub corpus_dir: Option<PathBuf>,
}

/// How often `capacity` joins the commands of a case (it runs many simulations), and how often
/// a case is a plan search instead.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub capacity_fraction: f64,
    pub search_fraction: f64,
}

/// The most devices a search case may have: `search` simulates every plan its bounds do not
/// prune, so a case stays within the run's time limit on one thread.
pub const SEARCH_MAX_DEVICES: u64 = 32;

/// The scenario without its plan and micro-batch, for `search` to choose them: the same text
/// where it is not a JSON object (a mutated file that does not parse stays as it is).
fn without_plan(text: &[u8]) -> Vec<u8> {
    let Ok(serde_json::Value::Object(mut m)) = serde_json::from_slice::<serde_json::Value>(text) else {
        return text.to_vec();
    };
    m.remove("plan");
    if let Some(serde_json::Value::Object(t)) = m.get_mut("training") {
        t.remove("micro_batch");
    }
    serde_json::to_vec_pretty(&serde_json::Value::Object(m)).unwrap_or_else(|_| text.to_vec())
}

pub fn build(seed: u64, id: u64, cat: &Catalog, mix: Mix) -> Case {
    let mut r = R::for_case(seed, id);
    let base = generate::valid(&mut r, cat);
    let roll = r.unit(0.0, 1.0);
    let (kind, text) = if roll < 0.55 {
        ("valid", serde_json::to_vec_pretty(&base.value).unwrap_or_default())
    } else if roll < 0.95 {
        ("mutated", mutate::mutated(&mut r, &base.value))
    } else {
        ("garbage", mutate::garbage(&mut r))
    };
    let with = |cmd: &str, extra: &[&str]| {
        let mut a = vec![cmd.to_string(), "--json".to_string()];
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push(SCENARIO_FILE.to_string());
        a
    };
    let sim_extra: &[&str] = match r.int(0, 19) {
        0 => &["--network", "ideal"],
        1 if base.devices <= 64 => &["--full"],
        _ => &[],
    };
    let mut runs =
        vec![with("simulate", sim_extra), with("train-run", &[]), with("partition", &[]), with("slices", &[])];
    if r.chance(mix.capacity_fraction) {
        runs.push(with("capacity", &[]));
    }
    let mut tags = base.tags;
    if kind != "valid" {
        tags.push(kind.to_string());
    }
    // A search case: the plan and micro-batch left for `search` to choose, on one thread (its
    // result is the same on any number), instead of the other commands.
    if kind != "garbage" && base.devices <= SEARCH_MAX_DEVICES && r.chance(mix.search_fraction) {
        let args = ["search", "--json", "--top", "3", "--threads", "1", SCENARIO_FILE];
        tags.push("search".to_string());
        let runs = vec![args.iter().map(|s| s.to_string()).collect()];
        return Case { id, kind, text: without_plan(&text), files: base.files, tags, runs, corpus_dir: None };
    }
    let mut files = base.files;
    // Drawn last, so that the draws above (and so every other command's input) are those of a
    // case without it.
    if r.chance(NCCL_TEST_FRACTION) {
        let ops = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"];
        let op = ops[r.int(0, ops.len() as u64 - 1) as usize];
        let nodes = r.int(1, 8).to_string();
        // The node as the (possibly mutated) scenario gives it, else as the valid one did.
        let node = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("cluster")?.get("node").cloned())
            .or_else(|| base.value.get("cluster")?.get("node").cloned())
            .unwrap_or(serde_json::Value::Null);
        files.push((NODE_FILE.to_string(), serde_json::to_vec_pretty(&node).unwrap_or_default()));
        let args = ["nccl-test", "--json", "--node", NODE_FILE, "--nodes", &nodes, "--op", op];
        let sizes = ["--min-bytes", "8", "--max-bytes", "64M", "--step-factor", "64"];
        runs.push(args.iter().chain(sizes.iter()).map(|s| s.to_string()).collect());
        tags.push("nccl-test".to_string());
    }
    Case { id, kind, text, files, tags, runs, corpus_dir: None }
}

/// Cases for the scenario files (`*.json`) under `root`, numbered from `first`: every
/// command on each, `capacity` included.
pub fn corpus(root: &Path, first: u64) -> Vec<Case> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        if d.is_file() {
            files.push(d);
            continue;
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut cases = Vec::new();
    for p in files {
        let Ok(text) = std::fs::read(&p) else { continue };
        // Only scenarios: a JSON object with a workload.
        let is_scenario = serde_json::from_slice::<serde_json::Value>(&text).is_ok_and(|v| v.get("workload").is_some());
        if !is_scenario {
            continue;
        }
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let runs = ["simulate", "train-run", "partition", "slices", "capacity"]
            .iter()
            .map(|c| vec![c.to_string(), "--json".to_string(), name.clone()])
            .collect();
        cases.push(Case {
            id: first + cases.len() as u64,
            kind: "corpus",
            text,
            files: Vec::new(),
            tags: vec![format!("file:{}", p.display())],
            runs,
            corpus_dir: p.parent().map(Path::to_path_buf),
        });
    }
    cases
}

/// Write the case's input into `dir`.
pub fn write_input(dir: &Path, text: &[u8], files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(SCENARIO_FILE), text)?;
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

/// One run's result.
pub struct RunResult {
    pub args: Vec<String>,
    pub verdict: Verdict,
    pub outcome: Outcome,
}

/// The context the checks use: what the scenario file itself settles.
pub fn context(text: &[u8], cat: &Catalog) -> Context {
    serde_json::from_slice(text).map(|v| Context::of(&v, cat)).unwrap_or_default()
}

/// Run every command of `case` in a fresh folder under `tmp`.
pub fn execute(case: &Case, bin: &Path, tmp: &Path, cat: &Catalog, limits: Limits) -> Vec<RunResult> {
    let dir: PathBuf = case.corpus_dir.clone().unwrap_or_else(|| tmp.join(format!("case-{}", case.id)));
    let mut out = Vec::new();
    if case.corpus_dir.is_none()
        && let Err(e) = write_input(&dir, &case.text, &case.files)
    {
        eprintln!("scenario-fuzz: cannot write case {} to {}: {e}", case.id, dir.display());
        return out;
    }
    let ctx = context(&case.text, cat);
    for args in &case.runs {
        let outcome = match run(bin, args, &dir, limits) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("scenario-fuzz: cannot start {}: {e}", bin.display());
                continue;
            }
        };
        let verdict = classify(&args[0], &outcome, &ctx);
        out.push(RunResult { args: args.clone(), verdict, outcome });
    }
    if case.corpus_dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}
