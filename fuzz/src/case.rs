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

#[derive(Clone, Debug)]
pub struct Case {
    pub id: u64,
    /// "valid", "mutated" or "garbage".
    pub kind: &'static str,
    pub text: Vec<u8>,
    pub files: Vec<(String, Vec<u8>)>,
    pub tags: Vec<String>,
    /// Arguments of each run (the scenario file last).
    pub runs: Vec<Vec<String>>,
}

/// How often `capacity` joins the commands of a case (it runs many simulations).
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    pub capacity_fraction: f64,
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
    let mut runs = vec![with("simulate", sim_extra), with("train-run", &[]), with("partition", &[]), with("slices", &[])];
    if r.chance(mix.capacity_fraction) {
        runs.push(with("capacity", &[]));
    }
    let mut tags = base.tags;
    if kind != "valid" {
        tags.push(kind.to_string());
    }
    Case { id, kind, text, files: base.files, tags, runs }
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
    let dir: PathBuf = tmp.join(format!("case-{}", case.id));
    let mut out = Vec::new();
    if let Err(e) = write_input(&dir, &case.text, &case.files) {
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
    let _ = std::fs::remove_dir_all(&dir);
    out
}
