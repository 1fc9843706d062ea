//! `trainsim search`: the plan search of `sim::search` over one or several GPU counts, with a
//! progress bar, a table or JSON, the best plan as a scenario file, and charts of the fronts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde_json::{Value, json};
use sim::scenario::{self, SearchInput};
use sim::search::{self, Evaluated, Outcome};

use crate::figure::{Figure, ImageFormat, render};

/// The options of `trainsim search`.
#[derive(clap::Args, Debug)]
pub struct SearchArgs {
    /// The scenario (JSON; docs/scenario.md): workload, cluster and training; `plan` and
    /// `training.micro_batch` may be left out, and the plan keys given are kept fixed.
    pub scenario: PathBuf,
    /// Search at these GPU counts instead of the cluster's (a list: 64,128,256); the cluster
    /// keeps its node and changes its node count.
    #[arg(long, value_delimiter = ',')]
    pub gpus: Vec<u32>,
    /// How many of the fastest fitting plans to list.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub top: u32,
    /// Print the result as one JSON object (docs/report.md, "Plan search").
    #[arg(long)]
    pub json: bool,
    /// Write the best plan as a complete scenario file that `trainsim simulate` reads.
    #[arg(long, value_name = "FILE")]
    pub write: Option<PathBuf>,
    /// Write the fronts as CSV and SVG charts into this folder.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Price of one GPU-hour in dollars: adds each GPU count's cost per iteration and per
    /// million tokens, and the front of time against cost.
    #[arg(long, value_name = "DOLLARS")]
    pub price_per_gpu_hour: Option<f64>,
    /// Simulate on this many threads (default: every core); the result is the same for any.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Simulate every valid plan in full, without pruning by the bounds or measuring long plans
    /// from short runs (slow; for checking).
    #[arg(long)]
    pub exhaustive: bool,
    /// Tokens to train on: with --deadline-days, find the smallest GPU count (of --gpus, in
    /// increasing order) whose best plan finishes the whole run in time, failures and
    /// checkpoints included (the scenario's "run" section, else failures "llama3-2024").
    #[arg(long, requires = "deadline_days")]
    pub tokens: Option<f64>,
    /// The deadline in days for --tokens.
    #[arg(long, requires = "tokens")]
    pub deadline_days: Option<f64>,
    /// The confidence the deadline is met with: the run's completion-time quantile compared
    /// with the deadline (0.5 to 0.999).
    #[arg(long, default_value_t = 0.9)]
    pub confidence: f64,
    /// Seeded runs of failures and checkpoints per GPU count for --deadline-days.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100000))]
    pub runs: u32,
    /// Framework profiles to search as well ("all", or a list: megatron-core,deepspeed);
    /// without it each plan runs under the scenario's training.framework, or the profile
    /// the reader picks for it.
    #[arg(long, value_delimiter = ',', value_name = "PROFILES")]
    pub frameworks: Vec<String>,
}

/// `--frameworks` as profile names (checked), against a scenario that names none.
fn frameworks(a: &SearchArgs, input: &mut SearchInput) -> Result<(), String> {
    input.search_frameworks(&a.frameworks).map_err(|e| format!("--frameworks: {e}"))
}

/// One GPU count's whole run at its best plan, for --deadline-days.
struct DeadlineRow {
    gpus: u32,
    wall_days_p50: f64,
    wall_days_at_confidence: f64,
    goodput: f64,
    meets: bool,
}

/// The whole run of `tokens` at `r`'s best plan: the quantile `confidence` of its wall days.
fn whole_run_at(a: &SearchArgs, r: &Run, tokens: f64) -> Result<Option<DeadlineRow>, String> {
    let Some(b) = r.outcome.best.as_ref() else { return Ok(None) };
    let mut file = r.input.scenario_file(b.micro_batch, &b.plan, b.framework);
    let mut run = file.get("run").and_then(Value::as_object).cloned().unwrap_or_default();
    for k in ["dataset_samples", "epochs", "iterations"] {
        run.remove(k);
    }
    run.insert("tokens".into(), json!(tokens));
    run.entry("failures").or_insert(json!("llama3-2024"));
    file["run"] = Value::Object(run);
    let s = crate::load_scenario_text(&a.scenario, &file.to_string())?;
    let w = sim::run::try_whole_run(&s, a.runs, None).map_err(|e| format!("{} GPUs: {e}", r.gpus))?;
    let days = &w.wall_days_per_run;
    let q = sim::run::goodput::quantile(days, a.confidence);
    let deadline = a.deadline_days.unwrap_or(f64::INFINITY);
    Ok(Some(DeadlineRow {
        gpus: r.gpus,
        wall_days_p50: sim::run::goodput::quantile(days, 0.5),
        wall_days_at_confidence: q,
        goodput: w.goodput.p50(),
        meets: q <= deadline,
    }))
}

/// One GPU count's search.
struct Run {
    gpus: u32,
    input: SearchInput,
    outcome: Outcome,
    wall_s: f64,
}

fn read_input(path: &Path, text: &str) -> Result<SearchInput, String> {
    scenario::parse_for_search(text, &crate::file_loader(path)).map_err(|e| format!("{}: {e}", path.display()))
}

/// The input at `gpus` devices: the cluster's node count changed.
fn at_gpus(path: &Path, input: &SearchInput, gpus: u32) -> Result<SearchInput, String> {
    let per_node = input.cluster.node.devices;
    if gpus == 0 || !gpus.is_multiple_of(per_node) {
        return Err(format!("--gpus {gpus}: not a multiple of the node's {per_node} devices"));
    }
    let mut raw = input.raw.clone();
    match raw.get_mut("cluster").and_then(Value::as_object_mut) {
        Some(c) if c.contains_key("nodes") && !c.contains_key("device_overrides") => {
            c.insert("nodes".into(), json!(gpus / per_node));
        }
        _ => return Err("--gpus needs a cluster of identical nodes given as {\"node\": ..., \"nodes\": N}".into()),
    }
    read_input(path, &raw.to_string())
}

pub fn run(a: &SearchArgs) -> Result<(), String> {
    if let Some(p) = a.price_per_gpu_hour
        && !(p.is_finite() && p > 0.0)
    {
        return Err(format!("--price-per-gpu-hour {p}: expected a positive number of dollars"));
    }
    if let Some(w) = &a.write {
        crate::outputs::check_writable([("--write", w.as_path())])?;
    }
    if let Some(t) = a.tokens
        && !(t.is_finite() && t > 0.0 && t <= 1e18)
    {
        return Err(format!("--tokens {t}: expected a number of tokens in (0, 1e18]"));
    }
    if let Some(d) = a.deadline_days
        && !(d.is_finite() && d > 0.0)
    {
        return Err(format!("--deadline-days {d}: expected a positive number of days"));
    }
    if !(0.5..=0.999).contains(&a.confidence) {
        return Err(format!("--confidence {}: allowed 0.5 to 0.999", a.confidence));
    }
    let text = std::fs::read_to_string(&a.scenario)
        .map_err(|e| format!("cannot read scenario {}: {e}", a.scenario.display()))?;
    let mut base = read_input(&a.scenario, &text)?;
    frameworks(a, &mut base)?;
    let mut counts = if a.gpus.is_empty() { vec![base.cluster.device_count()] } else { a.gpus.clone() };
    if a.tokens.is_some() {
        // The smallest count that meets the deadline: in increasing order, stopping there.
        counts.sort_unstable();
        counts.dedup();
    }
    let mut deadline: Vec<DeadlineRow> = Vec::new();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.unwrap_or(0))
        .build()
        .map_err(|e| format!("--threads: {e}"))?;
    let opts = search::Options { top: a.top as usize, prune: !a.exhaustive, extrapolate: !a.exhaustive };
    let mut runs = Vec::new();
    for &g in &counts {
        let input = if a.gpus.is_empty() {
            base.clone()
        } else {
            let mut at = at_gpus(&a.scenario, &base, g)?;
            at.frameworks = base.frameworks.clone();
            at
        };
        let bar = crate::outputs::spinner(format!("searching plans on {g} GPUs"));
        let started = Instant::now();
        let show = |p: &search::Progress| {
            bar.set_message(format!(
                "{g} GPUs: {} plans, {} evaluated ({} simulations, {} from short runs), {} pruned, {} invalid",
                p.enumerated,
                p.evaluated,
                p.simulated,
                p.extrapolated,
                p.pruned(),
                p.invalid
            ))
        };
        let outcome =
            pool.install(|| search::search(&input, opts, &show)).map_err(|e| format!("{}: {e}", a.scenario.display()));
        bar.finish_and_clear();
        runs.push(Run { gpus: g, input, outcome: outcome?, wall_s: started.elapsed().as_secs_f64() });
        if let Some(tokens) = a.tokens {
            let last = runs.last().expect("just pushed");
            if let Some(row) = whole_run_at(a, last, tokens)? {
                let met = row.meets;
                deadline.push(row);
                if met {
                    break;
                }
            }
        }
    }
    let met = deadline.iter().find(|r| r.meets).map(|r| r.gpus);
    let best = runs
        .iter()
        .filter_map(|r| r.outcome.best.as_ref().map(|b| (r, b)))
        .filter(|(r, _)| a.tokens.is_none() || Some(r.gpus) == met)
        .min_by(|x, y| x.1.iteration_s.total_cmp(&y.1.iteration_s).then(x.0.gpus.cmp(&y.0.gpus)));
    if let (Some(w), Some((r, b))) = (&a.write, best) {
        let file = r.input.scenario_file(b.micro_batch, &b.plan, b.framework);
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())? + "\n";
        std::fs::write(w, text).map_err(|e| format!("--write {}: {e}", w.display()))?;
    }
    if let Some(dir) = &a.plot {
        plot(dir, &runs, a.price_per_gpu_hour)?;
    }
    if a.json {
        let mut v = to_json(&runs, a.price_per_gpu_hour);
        if let Some(tokens) = a.tokens {
            v["deadline"] = json!({
                "tokens": tokens,
                "deadline_days": a.deadline_days,
                "confidence": a.confidence,
                "runs": a.runs,
                "met_at_gpus": met,
                "by_gpus": deadline.iter().map(|r| json!({
                    "gpus": r.gpus,
                    "wall_days_p50": r.wall_days_p50,
                    "wall_days_at_confidence": r.wall_days_at_confidence,
                    "goodput": r.goodput,
                    "meets_deadline": r.meets,
                })).collect::<Vec<_>>(),
            });
        }
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        print_text(&runs, a.price_per_gpu_hour);
        if let Some(tokens) = a.tokens {
            println!(
                "deadline:     {tokens:.3e} tokens in {} days at {:.0}% confidence ({} runs of failures and checkpoints each)",
                a.deadline_days.unwrap_or(0.0),
                a.confidence * 100.0,
                a.runs
            );
            for r in &deadline {
                println!(
                    "  {:>6} GPUs  p50 {:.2} days, {:.0}% {:.2} days, goodput {:.3}{}",
                    r.gpus,
                    r.wall_days_p50,
                    a.confidence * 100.0,
                    r.wall_days_at_confidence,
                    r.goodput,
                    if r.meets { "  <- meets the deadline" } else { "" }
                );
            }
            match met {
                Some(g) => println!("smallest:     {g} GPUs"),
                None => println!("smallest:     none of the GPU counts searched meets the deadline"),
            }
        }
    }
    if runs.iter().all(|r| r.outcome.best.is_none()) {
        return Err("no plan in the space fits the devices' memory".into());
    }
    if a.tokens.is_some() && met.is_none() {
        return Err("no GPU count searched meets the deadline; add larger counts to --gpus".into());
    }
    Ok(())
}

fn entry(e: &Evaluated) -> Value {
    annotated(
        e,
        json!({
            "plan": e.plan,
            "micro_batch": e.micro_batch,
            "iteration_s": e.iteration_s,
            "peak_memory_bytes": e.peak_memory_bytes,
            "memory_headroom_bytes": e.memory_headroom_bytes,
            "fits": e.fits,
            "mfu": e.mfu,
        }),
    )
}

fn point(e: &Evaluated) -> Value {
    annotated(
        e,
        json!({"plan": e.plan, "micro_batch": e.micro_batch, "iteration_s": e.iteration_s, "peak_memory_bytes": e.peak_memory_bytes}),
    )
}

/// An entry annotated with its searched framework profile (`--frameworks`), if any, and whether its
/// numbers were measured from three short runs.
fn annotated(e: &Evaluated, mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        if let Some(f) = e.framework {
            o.insert("framework".into(), json!(f));
        }
        if e.extrapolated {
            o.insert("extrapolated".into(), json!(true));
        }
    }
    v
}

/// Dollars per iteration and per million tokens of the best plan at `gpus`.
fn costs(r: &Run, price: f64) -> Option<(f64, f64)> {
    let b = r.outcome.best.as_ref()?;
    let per_iteration = r.gpus as f64 * price * b.iteration_s / 3600.0;
    let tokens = r.input.training.global_batch as f64 * r.input.training.seq_len as f64;
    Some((per_iteration, per_iteration / tokens * 1e6))
}

/// Per GPU count, its best plan; and the counts on the front of time against GPUs (or, with a
/// price, against cost): each faster than every cheaper one.
fn gpu_rows(runs: &[Run], price: Option<f64>) -> (Vec<Value>, Vec<u32>) {
    let mut rows = Vec::new();
    let mut pts: Vec<(f64, f64, u32)> = Vec::new();
    for r in runs {
        let mut row = json!({
            "gpus": r.gpus,
            "iteration_s": r.outcome.best.as_ref().map(|b| b.iteration_s),
            "best": r.outcome.best.as_ref().map(entry),
            "evaluated": r.outcome.progress.evaluated,
            "pruned": r.outcome.progress.pruned(),
            "wall_s": r.wall_s,
        });
        if let Some(p) = price
            && let Some((it, mt)) = costs(r, p)
        {
            row["cost_usd_per_iteration"] = json!(it);
            row["cost_usd_per_million_tokens"] = json!(mt);
        }
        if let Some(b) = &r.outcome.best {
            let x = match price.and_then(|p| costs(r, p)) {
                Some((it, _)) => it,
                None => r.gpus as f64,
            };
            pts.push((x, b.iteration_s, r.gpus));
        }
        rows.push(row);
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut front = Vec::new();
    let mut fastest = f64::INFINITY;
    for (_, t, g) in pts {
        if t < fastest {
            fastest = t;
            front.push(g);
        }
    }
    (rows, front)
}

fn to_json(runs: &[Run], price: Option<f64>) -> Value {
    let sum = |f: &dyn Fn(&search::Progress) -> usize| runs.iter().map(|r| f(&r.outcome.progress)).sum::<usize>();
    let main = runs.iter().min_by(|x, y| {
        let t = |r: &Run| r.outcome.best.as_ref().map_or(f64::INFINITY, |b| b.iteration_s);
        t(x).total_cmp(&t(y)).then(x.gpus.cmp(&y.gpus))
    });
    let mut v = json!({
        "gpus_searched": runs.iter().map(|r| r.gpus).collect::<Vec<_>>(),
        "best": main.and_then(|r| r.outcome.best.as_ref()).map(entry),
        "top": main.map(|r| r.outcome.top.iter().map(entry).collect::<Vec<_>>()).unwrap_or_default(),
        "pareto": main.map(|r| r.outcome.pareto.iter().map(point).collect::<Vec<_>>()).unwrap_or_default(),
        "enumerated": sum(&|p| p.enumerated),
        "invalid": sum(&|p| p.invalid),
        "pruned": sum(&|p| p.pruned()),
        "pruned_memory": sum(&|p| p.pruned_memory),
        "pruned_time": sum(&|p| p.pruned_time),
        "evaluated": sum(&|p| p.evaluated),
        "simulated": sum(&|p| p.simulated),
        "extrapolated": sum(&|p| p.extrapolated),
        "failed": sum(&|p| p.failed),
        "wall_s": runs.iter().map(|r| r.wall_s).sum::<f64>(),
    });
    if runs.len() > 1 || price.is_some() {
        let (rows, front) = gpu_rows(runs, price);
        v["by_gpus"] = json!(rows);
        v["gpu_front"] = json!(front);
    }
    v
}

/// A plan in one line: its degrees and choices.
pub fn describe(e: &Evaluated) -> String {
    let p = &e.plan;
    let s = |k: &str| match p.get(k) {
        Some(Value::String(x)) => x.clone(),
        Some(v) => v.to_string(),
        None => "-".into(),
    };
    let sp = if p.get("sequence_parallel").is_some_and(|v| v == true || v == "megatron") { "+sp" } else { "" };
    let v = if s("schedule") == "interleaved" { format!("x{}", s("virtual_stages")) } else { String::new() };
    let part = p.get("partition").map(|_| format!(" {}", s("partition"))).unwrap_or_default();
    let ep = p.get("ep").map(|_| format!(" ep{}", s("ep"))).unwrap_or_default();
    let cp = p.get("cp").map(|_| format!(" cp{}", s("cp"))).unwrap_or_default();
    let fw = e.framework.map(|f| format!(" [{f}]")).unwrap_or_default();
    // Hybrid sharding (ZeRO's state over `dp_shard` replicas) and part of the layers
    // recomputed, where the plan has them.
    let shard = p.get("dp_shard").map(|_| format!("/shard{}", s("dp_shard"))).unwrap_or_default();
    let layers = p.get("recompute_layers").map(|_| format!("({} layers)", s("recompute_layers"))).unwrap_or_default();
    format!(
        "dp{}{cp}{ep} tp{}({}{sp}) pp{} mb{} {}{v} rc={}{layers} z{}{shard} off={}{part} {}{fw}",
        s("dp"),
        s("tp"),
        s("tp_mode"),
        s("pp"),
        e.micro_batch,
        s("schedule"),
        s("recompute"),
        s("zero_stage"),
        s("offload"),
        s("rank_order")
    )
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn print_text(runs: &[Run], price: Option<f64>) {
    for r in runs {
        let p = &r.outcome.progress;
        println!(
            "{} GPUs: {} plans: {} invalid, {} pruned by memory, {} by time, {} evaluated ({} refused) with {} simulations (a twin takes its plan's result; {} of many micro-batches measured from three short runs each) in {:.1} s",
            r.gpus,
            p.enumerated,
            p.invalid,
            p.pruned_memory,
            p.pruned_time,
            p.evaluated,
            p.failed,
            p.simulated,
            p.extrapolated,
            r.wall_s
        );
        let Some(b) = &r.outcome.best else {
            println!("  no plan fits");
            continue;
        };
        println!(
            "  best: {}\n        iteration {:.4} s, MFU {:.1}%, peak {:.2} GiB, headroom {:.2} GiB",
            describe(b),
            b.iteration_s,
            100.0 * b.mfu,
            b.peak_memory_bytes / GIB,
            b.memory_headroom_bytes / GIB
        );
        println!("  top {}:", r.outcome.top.len());
        println!("    {:>3}  {:>11}  {:>6}  {:>9}  plan", "#", "iteration_s", "MFU", "peak GiB");
        for (i, e) in r.outcome.top.iter().enumerate() {
            println!(
                "    {:>3}  {:>11.4}  {:>5.1}%  {:>9.2}  {}",
                i + 1,
                e.iteration_s,
                100.0 * e.mfu,
                e.peak_memory_bytes / GIB,
                describe(e)
            );
        }
        println!("  Pareto front, iteration time against peak memory ({} plans):", r.outcome.pareto.len());
        for e in &r.outcome.pareto {
            println!("    {:>11.4} s  {:>9.2} GiB  {}", e.iteration_s, e.peak_memory_bytes / GIB, describe(e));
        }
    }
    if runs.len() > 1 || price.is_some() {
        let (rows, front) = gpu_rows(runs, price);
        println!("by GPU count (* on the front of time against {}):", if price.is_some() { "cost" } else { "GPUs" });
        for (r, row) in runs.iter().zip(&rows) {
            let cost = match (row.get("cost_usd_per_iteration"), row.get("cost_usd_per_million_tokens")) {
                (Some(a), Some(b)) => {
                    format!(
                        "  ${:.4}/iteration  ${:.4}/1M tokens",
                        a.as_f64().unwrap_or(0.0),
                        b.as_f64().unwrap_or(0.0)
                    )
                }
                _ => String::new(),
            };
            let t = r.outcome.best.as_ref().map_or("no plan fits".into(), |b| format!("{:.4} s", b.iteration_s));
            let mark = if front.contains(&r.gpus) { "*" } else { " " };
            println!("  {mark} {:>6} GPUs  {t}{cost}", r.gpus);
        }
    }
}

/// Every simulated plan of one search (time against peak memory), its front drawn.
struct FrontChart<'a> {
    title: String,
    all: &'a [Evaluated],
    front: &'a [Evaluated],
}

impl Figure for FrontChart<'_> {
    fn draw_on<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("plot: {e}");
        area.fill(&WHITE).map_err(err)?;
        let xs = self.all.iter().map(|e| e.peak_memory_bytes / GIB);
        let ys = self.all.iter().map(|e| e.iteration_s);
        let xmax = xs.fold(0.0f64, f64::max).max(1e-9) * 1.05;
        let ymax = ys.fold(0.0f64, f64::max).max(1e-9) * 1.05;
        let mut c = ChartBuilder::on(area)
            .caption(&self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(err)?;
        c.configure_mesh().x_desc("peak memory per device (GiB)").y_desc("iteration (s)").draw().map_err(err)?;
        let grey = RGBColor(150, 150, 150);
        let red = RGBColor(200, 40, 40);
        c.draw_series(
            self.all
                .iter()
                .filter(|e| e.fits)
                .map(|e| Circle::new((e.peak_memory_bytes / GIB, e.iteration_s), 3, grey.filled())),
        )
        .map_err(err)?
        .label("simulated, fits")
        .legend(move |(x, y)| Circle::new((x + 8, y), 3, grey.filled()));
        c.draw_series(
            self.all
                .iter()
                .filter(|e| !e.fits)
                .map(|e| Cross::new((e.peak_memory_bytes / GIB, e.iteration_s), 3, grey.stroke_width(1))),
        )
        .map_err(err)?
        .label("simulated, does not fit")
        .legend(move |(x, y)| Cross::new((x + 8, y), 3, grey.stroke_width(1)));
        let pts: Vec<(f64, f64)> = self.front.iter().map(|e| (e.peak_memory_bytes / GIB, e.iteration_s)).collect();
        c.draw_series(LineSeries::new(pts.clone(), red.stroke_width(2)))
            .map_err(err)?
            .label("Pareto front")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], red.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 5, red.filled()))).map_err(err)?;
        c.configure_series_labels()
            .background_style(WHITE)
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
        Ok(())
    }
}

/// The best iteration time at each GPU count (and its cost, with a price).
struct GpuChart {
    title: String,
    /// (x, iteration_s, gpus)
    points: Vec<(f64, f64, u32)>,
    x_label: &'static str,
}

impl Figure for GpuChart {
    fn draw_on<DB: DrawingBackend>(&self, area: &DrawingArea<DB, Shift>) -> Result<(), String>
    where
        DB::ErrorType: 'static,
    {
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| format!("plot: {e}");
        area.fill(&WHITE).map_err(err)?;
        let xmax = self.points.iter().map(|p| p.0).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let ymax = self.points.iter().map(|p| p.1).fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let mut c = ChartBuilder::on(area)
            .caption(&self.title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..xmax, 0.0..ymax)
            .map_err(err)?;
        c.configure_mesh().x_desc(self.x_label).y_desc("best iteration (s)").draw().map_err(err)?;
        let blue = RGBColor(40, 90, 200);
        let pts: Vec<(f64, f64)> = self.points.iter().map(|p| (p.0, p.1)).collect();
        c.draw_series(LineSeries::new(pts.clone(), blue.stroke_width(2))).map_err(err)?;
        c.draw_series(self.points.iter().map(|&(x, y, g)| {
            EmptyElement::at((x, y))
                + Circle::new((0, 0), 5, blue.filled())
                + Text::new(format!("{g} GPUs"), (6, -16), ("sans-serif", 14).into_font())
        }))
        .map_err(err)?;
        Ok(())
    }
}

fn plot(dir: &Path, runs: &[Run], price: Option<f64>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot {}: {e}", dir.display()))?;
    let write = |name: &str, text: String| {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("--plot {}: {e}", p.display()))
    };
    for r in runs {
        let mut csv = String::from("gpus,iteration_s,peak_memory_bytes,fits,on_front,plan\n");
        for e in &r.outcome.simulated {
            let on = r.outcome.pareto.iter().any(|f| f.index == e.index);
            csv += &format!("{},{},{},{},{},{}\n", r.gpus, e.iteration_s, e.peak_memory_bytes, e.fits, on, describe(e));
        }
        write(&format!("search-{}gpus.csv", r.gpus), csv)?;
        let chart = FrontChart {
            title: format!("{} GPUs: iteration time against peak memory", r.gpus),
            all: &r.outcome.simulated,
            front: &r.outcome.pareto,
        };
        render(&chart, &dir.join(format!("search-front-{}gpus.svg", r.gpus)), ImageFormat::Svg, (1100, 700), "--plot")?;
    }
    if runs.len() > 1 {
        let mut csv = String::from("gpus,iteration_s,cost_usd_per_iteration,cost_usd_per_million_tokens\n");
        let mut points = Vec::new();
        for r in runs {
            let Some(b) = &r.outcome.best else { continue };
            let c = price.and_then(|p| costs(r, p));
            csv += &format!(
                "{},{},{},{}\n",
                r.gpus,
                b.iteration_s,
                c.map_or(String::new(), |x| x.0.to_string()),
                c.map_or(String::new(), |x| x.1.to_string())
            );
            points.push((c.map_or(r.gpus as f64, |x| x.0), b.iteration_s, r.gpus));
        }
        write("search-gpus.csv", csv)?;
        let chart = GpuChart {
            title: "Best plan per GPU count".into(),
            points,
            x_label: if price.is_some() { "cost per iteration ($)" } else { "GPUs" },
        };
        render(&chart, &dir.join("search-gpus.svg"), ImageFormat::Svg, (1100, 700), "--plot")?;
    }
    Ok(())
}
