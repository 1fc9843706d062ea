//! The user's reference (`docs/`) against the code: every scenario key the parser accepts is
//! documented under its section and in the JSON Schema (and nothing else is), every closed set
//! of values and every preset is listed, and every key the commands print with `--json` is in
//! `docs/report.md` (and every documented key is printed by some run).

use crate::util::{TempDir, repo, run, stderr, stdout};
use serde_json::Value;
use sim::scenario::keys;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The first `` `code` `` span of a line.
fn code_span(line: &str) -> Option<&str> {
    let start = line.find('`')? + 1;
    let len = line[start..].find('`')?;
    Some(&line[start..start + len])
}

/// Markdown tables under headings: heading's first code span -> the first cell's code span of
/// each table row -> the whole row.
fn tables(md: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for line in md.lines() {
        if line.starts_with('#') {
            section = code_span(line).map(str::to_string);
            if let Some(s) = &section {
                assert!(!out.contains_key(s), "two headings name `{s}`");
                out.insert(s.clone(), BTreeMap::new());
            }
        } else if let (Some(s), Some(cell)) = (&section, line.strip_prefix("| `")) {
            let key = &cell[..cell.find('`').expect("closing backtick")];
            let prev = out.get_mut(s).expect("section").insert(key.to_string(), line.to_string());
            assert!(prev.is_none(), "`{key}` is documented twice under `{s}`");
        }
    }
    out
}

#[test]
fn scenario_docs_list_exactly_the_keys_the_parser_accepts() {
    let docs = tables(&read("docs/scenario.md"));
    let mut problems = Vec::new();
    for (section, accepted) in keys::SECTIONS {
        let Some(documented) = docs.get(*section) else {
            problems.push(format!("docs/scenario.md has no heading for section `{section}`"));
            continue;
        };
        let accepted: BTreeSet<&str> = accepted.iter().copied().collect();
        for k in &accepted {
            if !documented.contains_key(*k) {
                problems.push(format!("`{section}`: key `{k}` is accepted but not documented"));
            }
        }
        for k in documented.keys() {
            if !accepted.contains(k.as_str()) {
                problems.push(format!("`{section}`: key `{k}` is documented but the parser refuses it"));
            }
        }
    }
    let sections: BTreeSet<&str> = keys::SECTIONS.iter().map(|(s, _)| *s).collect();
    for s in docs.keys() {
        if !sections.contains(s.as_str()) {
            problems.push(format!("docs/scenario.md documents `{s}`, which is no section of scenario::keys"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Closed sets of values: (section, key, values).
fn value_sets() -> Vec<(&'static str, &'static str, Vec<String>)> {
    let v = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        ("training", "precision", v(&sim::hardware::Precision::NAMES)),
        ("training", "optimizer", v(&sim::plan::Optimizer::NAMES)),
        ("training", "attention", v(keys::ATTENTION)),
        ("plan", "schedule", v(keys::SCHEDULES)),
        ("plan", "recompute", v(&sim::plan::Recompute::NAMES)),
        ("plan", "tp_mode", v(keys::TP_MODES)),
        ("plan", "rank_order", v(&sim::plan::RankOrder::NAMES)),
        ("plan", "p2p", v(&sim::plan::P2p::NAMES)),
        ("plan", "offload", v(keys::OFFLOAD_POLICIES)),
        ("plan", "partition", v(keys::PARTITION_POLICIES)),
        ("plan", "sequence_parallel", v(keys::SEQUENCE_PARALLEL)),
        ("plan.offload", "policy", v(keys::OFFLOAD_POLICIES)),
        ("plan.offload", "optimizer", v(&sim::plan::Tier::NAMES)),
        ("plan.offload", "params", v(&sim::plan::Tier::NAMES)),
        ("plan.freeze", "policy", v(keys::FREEZE_POLICIES)),
        ("run", "failures", v(sim::run::failures::PRESETS)),
        ("run.failures", "preset", v(sim::run::failures::PRESETS)),
        ("simulation", "network", v(&sim::network::NetworkKind::NAMES)),
        ("workload.transformer", "mlp", v(keys::MLP)),
        ("workload.transformer", "norm", v(keys::NORM)),
        ("device", "kind", v(keys::DEVICE_KINDS)),
        ("device", "vendor", v(&sim::hardware::Vendor::NAMES)),
        ("node", "intra_topology", v(&sim::hardware::IntraTopology::NAMES)),
        ("workload", "preset", sim::workload::catalog::names().iter().map(|s| s.to_string()).collect()),
        ("cluster", "node", sim::hardware::catalog::nodes().into_iter().map(|n| n.name).collect()),
        ("cluster", "fabric", v(sim::hardware::fabric::PRESETS)),
        ("cluster.fabric", "preset", v(sim::hardware::fabric::PRESETS)),
    ]
}

#[test]
fn scenario_docs_list_every_allowed_value_and_preset() {
    let md = read("docs/scenario.md");
    let docs = tables(&md);
    let mut problems = Vec::new();
    for (section, key, values) in value_sets() {
        let Some(row) = docs.get(section).and_then(|t| t.get(key)) else {
            problems.push(format!("`{section}.{key}` is not documented"));
            continue;
        };
        for v in values {
            if !row.contains(&format!("`{v}`")) {
                problems.push(format!("`{section}.{key}`: value `{v}` is not documented"));
            }
        }
    }
    // Device and link presets are listed in their section's introduction.
    for (what, names) in [
        ("device", sim::hardware::catalog::devices().into_iter().map(|d| d.name).collect::<Vec<_>>()),
        ("link", sim::hardware::catalog::links().into_iter().map(|l| l.name).collect()),
    ] {
        for n in names {
            if !md.contains(&format!("`{n}`")) {
                problems.push(format!("{what} preset `{n}` is not documented"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Schema definition of a section: the root, or `$defs` under the section's name with `.`
/// as `_` and `[]` dropped.
fn schema_def<'a>(schema: &'a Value, section: &str) -> Option<&'a Value> {
    if section == "(top level)" {
        return Some(schema);
    }
    schema.get("$defs")?.get(section.replace("[]", "").replace('.', "_"))
}

#[test]
fn scenario_schema_lists_exactly_the_keys_the_parser_accepts() {
    let schema: Value = serde_json::from_str(&read("docs/scenario.schema.json")).expect("the schema is JSON");
    let mut problems = Vec::new();
    for (section, accepted) in keys::SECTIONS {
        let Some(def) = schema_def(&schema, section) else {
            problems.push(format!("the schema has no definition for `{section}`"));
            continue;
        };
        if def.get("additionalProperties") != Some(&Value::Bool(false)) {
            problems.push(format!("`{section}`: the schema must say \"additionalProperties\": false"));
        }
        let props: BTreeSet<&str> =
            def["properties"].as_object().expect("properties").keys().map(String::as_str).collect();
        let accepted: BTreeSet<&str> = accepted.iter().copied().collect();
        if props != accepted {
            problems.push(format!(
                "`{section}`: schema only {:?}, parser only {:?}",
                props.difference(&accepted).collect::<Vec<_>>(),
                accepted.difference(&props).collect::<Vec<_>>()
            ));
        }
    }
    // Every closed set the parser knows is the schema's enum (or part of a oneOf's).
    for (section, key, values) in value_sets() {
        let Some(prop) = schema_def(&schema, section).and_then(|d| d["properties"].get(key)) else {
            problems.push(format!("schema: no `{section}.{key}`"));
            continue;
        };
        let text = prop.to_string();
        for v in values {
            if !text.contains(&format!("\"{v}\"")) {
                problems.push(format!("schema: `{section}.{key}` does not allow \"{v}\""));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every leaf's key path (`a.b`, `a[].b`); `null` counts as a leaf, empty lists add nothing.
fn key_paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                key_paths(x, &p, out);
            }
        }
        Value::Array(a) => {
            for x in a {
                key_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => {
            out.insert(prefix.to_string());
        }
    }
}

/// Run the CLI, which must succeed, and parse its stdout.
fn json_of(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Value {
    let o = run(args);
    assert!(o.status.success(), "trainsim failed: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("stdout is one JSON value")
}

fn check_report_section(docs: &BTreeMap<String, BTreeMap<String, String>>, section: &str, outputs: &[Value]) {
    let documented = docs.get(section).unwrap_or_else(|| panic!("docs/report.md has no heading `{section}`"));
    let mut printed = BTreeSet::new();
    for v in outputs {
        key_paths(v, "", &mut printed);
    }
    let undocumented: Vec<&String> = printed.iter().filter(|p| !documented.contains_key(*p)).collect();
    assert!(undocumented.is_empty(), "`{section}` prints keys docs/report.md does not list: {undocumented:?}");
    // A documented path is printed when it or a path below it is.
    let stale: Vec<&String> = documented
        .keys()
        .filter(|d| {
            !printed.iter().any(|p| p == *d || p.starts_with(&format!("{d}.")) || p.starts_with(&format!("{d}[")))
        })
        .collect();
    assert!(stale.is_empty(), "docs/report.md lists keys that `{section}` never printed here: {stale:?}");
}

const TINY_CPU: &str = r#"{"workload": {"transformer": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512}},
    "cluster": {"node": "host-cpu", "nodes": 1},
    "training": {"global_batch": 4, "micro_batch": 2, "seq_len": 64, "precision": "fp32"},
    "plan": {"pp": 2, "schedule": "1f1b"}}"#;

#[test]
fn report_docs_list_every_key_the_commands_print() {
    let docs = tables(&read("docs/report.md"));
    let p = |rel: &str| repo(rel);
    let simulate: Vec<Value> = [
        "experiments/core/custom-transformer-small.json",
        "experiments/offload/gpt2-10b-gemini.json",
        "experiments/terapipe/heldout-setting1-gpt3-1b.json",
        "experiments/parallelism/gpt3-6.7b-zero-infinity.json",
        "experiments/parallelism/gpt3-6.7b-tp16-across-nodes.json",
        "experiments/moe/mixtral-8x7b-64xh100-tp8.json",
        // Hybrid sharding and part of the layers recomputed (plan.dp_shard, plan.recompute_layers).
        "experiments/sharding/llama2-13b-hsdp-half-128xa100-4x100g.json",
        // More activations than a report lists: the omitted ones are summed.
        "tests/data/regressions/fuzz_report_size.json",
    ]
    .iter()
    .map(|f| json_of(&[&"simulate", &p(f), &"--json"]))
    .collect();
    check_report_section(&docs, "simulate --json", &simulate);
    let vit = p("experiments/pipetransformer/vit-b16-imagenet.json");
    let whole = p("experiments/whole-run/llama3-405b-16k.json");
    check_report_section(
        &docs,
        "train-run --json",
        &[
            json_of(&[&"train-run", &vit, &"--json"]),
            json_of(&[&"train-run", &whole, &"--json", &"--runs", &"3", &"--price-per-gpu-hour", &"2"]),
        ],
    );
    let gnmt = p("experiments/bapipe/gnmt-8-v100.json");
    check_report_section(&docs, "partition --json", &[json_of(&[&"partition", &gnmt, &"--json"])]);
    let tera = p("experiments/terapipe/heldout-setting1-gpt3-1b.json");
    check_report_section(&docs, "slices --json", &[json_of(&[&"slices", &tera, &"--json"])]);
    let small = p("experiments/core/custom-transformer-small.json");
    check_report_section(
        &docs,
        "capacity --json",
        &[
            json_of(&[&"capacity", &small, &"--vary", &"layers", &"--gpus", &"1,2", &"--json"]),
            // Tiny layers on 1136 devices: the answers are past what the simulator lowers.
            json_of(&[&"capacity", &p("tests/data/regressions/fuzz_capacity_past_simulator.json"), &"--json"]),
        ],
    );
    // A pipeline fixed, so that plans carry a partition; two GPU counts and a price, so that
    // the per-count rows and costs are printed.
    let searched = TempDir::new("docs-search");
    let mut tiny_search: Value = serde_json::from_str(TINY_CPU).unwrap();
    tiny_search["plan"] = serde_json::json!({"pp": 2});
    tiny_search["training"].as_object_mut().unwrap().remove("micro_batch");
    let s = searched.write("search.json", &tiny_search.to_string());
    // Two experts: the search chooses the expert-parallel degree too.
    tiny_search["workload"]["transformer"]["moe"] = serde_json::json!({"experts": 2, "top_k": 1, "expert_ffn": 128});
    let moe = searched.write("moe.json", &tiny_search.to_string());
    // Long sequences on GPUs with fused attention: the search chooses context parallelism,
    // and with --frameworks the profile.
    let long = serde_json::json!({
        "workload": {"transformer": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 512}},
        "cluster": {"node": {"preset": "dgx-h100", "devices": 2}, "nodes": 1},
        "training": {"global_batch": 2, "seq_len": 8192, "attention": "flash"},
        "plan": {"pp": 1, "tp": 1}
    });
    let long = searched.write("long.json", &long.to_string());
    // Many micro-batches per replica: plans measured from three short runs are marked.
    let many = serde_json::json!({
        "workload": {"transformer": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 512}},
        "cluster": {"node": {"preset": "dgx-h100", "devices": 2}, "nodes": 1},
        "training": {"global_batch": 256, "seq_len": 128},
        "plan": {"tp": 1, "offload": "none"}
    });
    let many = searched.write("many.json", &many.to_string());
    check_report_section(
        &docs,
        "search --json",
        &[
            json_of(&[&"search", &s, &"--gpus", &"2,4", &"--price-per-gpu-hour", &"1", &"--top", &"20", &"--json"]),
            json_of(&[
                &"search",
                &s,
                &"--gpus",
                &"2,4",
                &"--tokens",
                &"1e6",
                &"--deadline-days",
                &"1000",
                &"--runs",
                &"5",
                &"--json",
            ]),
            json_of(&[&"search", &moe, &"--gpus", &"2,4", &"--top", &"20", &"--json"]),
            json_of(&[&"search", &many, &"--top", &"100", &"--json"]),
            json_of(&[
                &"search",
                &long,
                &"--gpus",
                &"2,4",
                &"--frameworks",
                &"megatron-core,deepspeed",
                &"--top",
                &"20",
                &"--json",
            ]),
        ],
    );
    let tmp = TempDir::new("docs-replay");
    let tiny: &Path = &tmp.write("tiny.json", TINY_CPU);
    let quick: [&dyn AsRef<std::ffi::OsStr>; 6] = [&"--backend", &"cpu", &"--warmup", &"0", &"--repeats", &"1"];
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"replay", &tiny, &"--json"];
    args.extend(quick);
    check_report_section(&docs, "replay --json", &[json_of(&args)]);
    args[0] = &"validate";
    check_report_section(&docs, "validate --json", &[json_of(&args)]);
}

/// `docs/reference/frameworks.md` is the profiles as the code holds them.
#[test]
fn frameworks_reference_matches_the_profiles() {
    let want = sim::framework::reference_markdown();
    let path = repo("docs/reference/frameworks.md");
    if std::env::var_os("TRAINSIM_BLESS").is_some() {
        std::fs::write(&path, &want).expect("write docs/reference/frameworks.md");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/reference/frameworks.md is out of date: run TRAINSIM_BLESS=1 cargo test --release --test tests frameworks"
    );
}
