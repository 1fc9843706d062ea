//! `trainsim train-run`: a whole training run, its phases and its goodput under failures.

use crate::csvplot;
use sim::run::{Stat, WholeRunReport};
use std::path::Path;

pub fn train_run(path: &Path, json: bool, plot: Option<&Path>, runs: u32, price: Option<f64>) -> Result<(), String> {
    if !(1..=100_000).contains(&runs) {
        return Err(format!("--runs: {runs}; allowed: 1 to 100000"));
    }
    if let Some(p) = price
        && !(p.is_finite() && p >= 0.0)
    {
        return Err(format!("--price-per-gpu-hour: {p}; allowed: a number >= 0"));
    }
    if let Some(dir) = plot {
        std::fs::create_dir_all(dir).map_err(|e| format!("--plot {}: cannot create: {e}", dir.display()))?;
    }
    let s = crate::load_scenario(path)?;
    if s.run.is_none() {
        return Err(format!("{}: {}", path.display(), sim::run::NEEDS_RUN));
    }
    let progress = crate::outputs::spinner(format!(
        "simulating {} epoch(s), the baseline and the breakdown, then {runs} run(s) of failures and checkpoints",
        s.run.as_ref().map_or(0, |r| r.epochs)
    ));
    let whole = sim::run::try_whole_run(&s, runs, price);
    progress.finish_and_clear();
    let whole = whole.map_err(|e| format!("{}: {e}", path.display()))?;
    let r = &whole.training;
    if let Some(dir) = plot {
        let mut epochs = String::from("epoch,frozen_layers,pipeline_length,replicas,samples_per_s,epoch_s\n");
        for e in &r.epochs {
            epochs += &format!(
                "{},{},{},{},{:.3},{:.3}\n",
                e.epoch, e.frozen_layers, e.pipeline_length, e.replicas, e.samples_per_s, e.epoch_s
            );
        }
        let mut bars = String::from("variant,speedup\nbaseline,1.0\n");
        for v in &r.breakdown {
            bars += &format!("{},{:.4}\n", v.name, v.speedup);
        }
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text).map_err(|e| format!("cannot write {name}: {e}"))
        };
        write("epochs.csv", &epochs)?;
        write("breakdown.csv", &bars)?;
        let mut progress = String::from("wall_days,fraction_done\n");
        for (t, f) in &whole.progress {
            progress += &format!("{:.6},{:.6}\n", t / 86400.0, f);
        }
        write("progress.csv", &progress)?;
        let mut days = whole.wall_days_per_run.clone();
        days.sort_by(f64::total_cmp);
        let mut cdf = String::from("wall_days,fraction_of_runs\n");
        for (i, d) in days.iter().enumerate() {
            cdf += &format!("{:.6},{:.6}\n", d, (i + 1) as f64 / days.len() as f64);
        }
        write("completion.csv", &cdf)?;
        let d = |f: &str| dir.join(f);
        csvplot::draw(
            &d("epochs.csv"),
            &["samples_per_s".into()],
            true,
            &format!("{}: throughput per epoch", s.name),
            "samples/s",
            &d("throughput.png"),
        )?;
        csvplot::draw(
            &d("epochs.csv"),
            &["pipeline_length".into(), "replicas".into(), "frozen_layers".into()],
            true,
            "pipeline length K, replicas R and frozen layers per epoch",
            "count",
            &d("k_r.png"),
        )?;
        csvplot::draw(
            &d("breakdown.csv"),
            &["speedup".into()],
            false,
            "speedup over GPipe + DDP, part by part",
            "speedup",
            &d("breakdown.png"),
        )?;
        csvplot::draw(
            &d("progress.csv"),
            &["fraction_done".into()],
            true,
            &format!("{}: work checkpointed over the run (run 1)", s.name),
            "fraction of the run",
            &d("progress.png"),
        )?;
        csvplot::draw(
            &d("completion.csv"),
            &["fraction_of_runs".into()],
            true,
            &format!("completion time over {} run(s) (cumulative)", whole.runs),
            "fraction of runs done",
            &d("completion.png"),
        )?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&whole).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{}", s.name);
    if r.plan_changes.is_empty() {
        println!("plan:         as written (no policy changed it)");
    }
    for c in &r.plan_changes {
        println!("plan change:  {} {} -> {} ({})", c.key, c.from, c.to, c.why);
    }
    println!("epoch  frozen  K   R   M   cached  fits  iteration_s  samples/s  epoch_s");
    for e in &r.epochs {
        println!(
            "{:>5}  {:>6}  {:<2}  {:<2}  {:<2}  {:<6}  {:<4}  {:<11.4}  {:<9.1}  {:.1}{}",
            e.epoch,
            e.frozen_layers,
            e.pipeline_length,
            e.replicas,
            e.micro_batches,
            if e.cached { "yes" } else { "no" },
            if e.fits { "yes" } else { "NO" },
            e.iteration_s,
            e.samples_per_s,
            e.epoch_s,
            if e.transition_s > 0.0 { format!(" (incl. {:.1} s transition)", e.transition_s) } else { String::new() }
        );
    }
    println!(
        "total:        {:.1} s ({:.2} h); baseline (the plan as written, nothing frozen) {:.1} s; speedup {:.2}x",
        r.total_s,
        r.total_s / 3600.0,
        r.baseline_total_s,
        r.speedup
    );
    for v in &r.breakdown {
        println!("              {:<16} {:.2}x", v.name, v.speedup);
    }
    print_memory(r);
    print_whole(&whole);
    Ok(())
}

/// A loud line for plans that do not fit: their times are those of plans that would not run.
fn print_memory(r: &sim::run::RunReport) {
    let over: Vec<&sim::run::EpochReport> = r.epochs.iter().filter(|e| !e.fits).collect();
    if let Some(worst) = over.iter().max_by(|a, b| a.peak_memory_bytes.total_cmp(&b.peak_memory_bytes)) {
        let gib = |b: f64| b / 1024f64.powi(3);
        println!(
            "memory:       DOES NOT FIT in {} of {} epochs (worst: epoch {}, peak {:.2} GiB of {:.2} GiB usable): \
             the times above are those of plans that would not run",
            over.len(),
            r.epochs.len(),
            worst.epoch,
            gib(worst.peak_memory_bytes),
            gib(worst.memory_capacity_bytes - worst.memory_headroom_bytes)
        );
    }
    if !r.baseline_fits {
        println!("memory:       the baseline (the plan as written, nothing frozen) DOES NOT FIT");
    }
}

fn stat(x: &Stat, unit: &str, digits: usize) -> String {
    match x {
        Stat::One(v) => format!("{v:.digits$} {unit}"),
        Stat::Many { p50, p90, mean } => format!("p50 {p50:.digits$}, p90 {p90:.digits$}, mean {mean:.digits$} {unit}"),
    }
}

fn print_whole(w: &WholeRunReport) {
    let c = &w.checkpoint;
    println!(
        "run:          {} iterations, {:.3e} tokens on {} devices; failures \"{}\"; {} run(s), seed {}",
        w.iterations, w.tokens, w.devices, w.failures.name, w.runs, w.seed
    );
    println!(
        "checkpoint:   {:.1} GB, save stalls {:.1} s (write {:.1} s), restore {:.1} s, every {}",
        c.bytes / 1e9,
        c.save_s,
        c.write_s,
        c.restore_s,
        c.interval_s.map_or("never (no failures)".to_string(), |i| format!(
            "{:.0} s of compute{}",
            i,
            if c.optimal { " (Daly's optimum)" } else { "" }
        ))
    );
    println!("wall time:    {}", stat(&w.wall_days, "days", 2));
    println!("GPU-hours:    {}", stat(&w.gpu_hours, "GPU-h", 0));
    println!("goodput:      {}", stat(&w.goodput, "(useful compute / wall time)", 3));
    println!("interruptions: {}", stat(&w.interruptions, "", 1));
    let by: Vec<String> =
        w.interruptions_by_component.iter().filter(|(_, n)| **n > 0.0).map(|(k, n)| format!("{k} {n:.1}")).collect();
    if !by.is_empty() {
        println!("              by component (mean): {}", by.join(", "));
    }
    let l = &w.lost;
    println!(
        "lost (mean):  rework {:.2} h, restarts {:.2} h, restores {:.2} h, checkpoint stalls {:.2} h, slow nodes {:.2} h",
        l.rework_s / 3600.0,
        l.restart_s / 3600.0,
        l.restore_s / 3600.0,
        l.checkpoint_s / 3600.0,
        l.slow_s / 3600.0
    );
    if let Some(cost) = &w.cost_dollars {
        println!("cost:         {}", stat(cost, "$", 0));
    }
}
