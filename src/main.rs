//! `trainsim`: the command line. Parses arguments, reads and writes files, times runs, and
//! calls into the pure `sim` crate for everything else.

/// `println!` that ends the program quietly when stdout is a closed pipe (`trainsim ... | head`)
/// instead of panicking.
macro_rules! println {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            panic!("writing to stdout: {e}");
        }
    }};
}

mod bench;
mod csvplot;
mod exec;
mod figure;
mod gantt;
mod memory_plot;
mod nccl_test;
mod outputs;
mod search;
mod summary;
mod train_run;
mod validate_plot;

#[cfg(test)]
mod help_tests;

use clap::{Parser, Subcommand};
use sim::scenario::{self, Scenario};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "trainsim",
    version,
    about = "Simulate distributed training of large neural networks before spending a GPU-hour",
    after_help = "The scenario format: docs/scenario.md. The JSON reports: docs/report.md. Built-in presets: trainsim presets."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Time one collective alone over a range of sizes, as nccl-tests does (size, time,
    /// algbw, busbw, and NCCL's algorithm and protocol).
    NcclTest(nccl_test::Args),
    /// Simulate one training iteration of a scenario file.
    Simulate {
        /// The scenario (JSON; every key is in docs/scenario.md).
        scenario: PathBuf,
        /// Print the report as one JSON object (keys in docs/report.md).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        trace: outputs::TraceArgs,
        /// Also draw the pipeline schedule (.png or .svg).
        #[arg(long, value_name = "FILE")]
        gantt: Option<PathBuf>,
        /// Also write every simulated device's memory per tier over the iteration (CSV).
        #[arg(long = "memory", value_name = "FILE.csv")]
        memory_csv: Option<PathBuf>,
        /// Also draw the memory of the peak device (or --memory-device) stacked by kind (.png or .svg).
        #[arg(long, value_name = "FILE")]
        memory_plot: Option<PathBuf>,
        /// Device (cluster id) for --memory-plot; default: the one with the highest peak.
        #[arg(long, value_name = "ID", requires = "memory_plot")]
        memory_device: Option<u32>,
        /// Simulate every device even where one data-parallel replica could stand for all.
        #[arg(long)]
        full: bool,
        /// Interconnect model: fair (max-min fair sharing) or ideal (no contention).
        #[arg(long, value_name = "MODEL")]
        network: Option<String>,
        #[command(flatten)]
        profile: exec::ProfileArgs,
    },
    /// Run a scenario's lowered plan on real devices and measure it.
    Replay {
        /// The scenario (JSON; docs/scenario.md).
        scenario: PathBuf,
        /// cpu (worker threads of this machine), cuda, or torch.
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Unmeasured runs before the measured ones.
        #[arg(long, default_value_t = 1)]
        warmup: u32,
        /// Measured runs (the report gives their median).
        #[arg(long, default_value_t = 3)]
        repeats: u32,
        /// Print the measurement as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
        /// Write the measured timeline as a Chrome/Perfetto trace.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// Refuse to start a replay estimated to run longer than this (seconds, all runs).
        #[arg(long, value_name = "S", default_value_t = exec::DEFAULT_MAX_REPLAY_S)]
        max_seconds: f64,
    },
    /// Time one real GPT block (PyTorch autograd, forward + backward) at the scenario's sizes
    /// against the simulator's prediction for one layer (needs --features torch).
    TorchBlock {
        /// The scenario (JSON; docs/scenario.md): its model width, heads, sequence and micro-batch.
        scenario: PathBuf,
        #[command(flatten)]
        profile: exec::ProfileArgs,
        /// Unmeasured runs before the measured ones.
        #[arg(long, default_value_t = 2)]
        warmup: u32,
        /// Measured runs.
        #[arg(long, default_value_t = 5)]
        repeats: u32,
        /// Print the comparison as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
    },
    /// Microbenchmark a device and write a calibration profile (profile.json + README.md).
    Calibrate {
        /// cpu (worker threads of this machine), cuda, or torch.
        #[arg(long, default_value = "cpu")]
        backend: String,
        /// Folder for the profile, e.g. traces/2026-11-22-cpu/.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Fewer shapes and repeats.
        #[arg(long)]
        quick: bool,
    },
    /// Predict, replay, and compare per op kind and per iteration.
    Validate {
        /// The scenario (JSON; docs/scenario.md).
        scenario: PathBuf,
        /// cpu (worker threads of this machine), cuda, or torch.
        #[arg(long, default_value = "cpu")]
        backend: String,
        #[command(flatten)]
        profile: exec::ProfileArgs,
        /// Unmeasured runs before the measured ones.
        #[arg(long, default_value_t = 1)]
        warmup: u32,
        /// Measured runs (the report gives their median).
        #[arg(long, default_value_t = 3)]
        repeats: u32,
        /// Print the comparison as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
        /// Draw predicted vs measured (.png or .svg).
        #[arg(long, value_name = "FILE")]
        plot: Option<PathBuf>,
    },
    /// TeraPipe's token-slicing optimiser on a scenario: the candidate t_max values and the optimum.
    Slices {
        /// The scenario (JSON; docs/scenario.md).
        scenario: PathBuf,
        /// Tokens per slicing unit (default: the scenario's token_granularity, else 8).
        #[arg(long)]
        granularity: Option<u32>,
        /// Print the optimiser's result as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
    },
    /// Draw a chart from a CSV (first column on x): grouped bars, or lines with --lines.
    Plot {
        /// The data: a CSV with a header row; the first column is the x axis.
        csv: PathBuf,
        /// Columns to draw, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        y: Vec<String>,
        /// Draw lines instead of grouped bars.
        #[arg(long)]
        lines: bool,
        /// Title above the chart.
        #[arg(long, default_value = "")]
        title: String,
        /// Label of the y axis.
        #[arg(long, default_value = "")]
        y_label: String,
        /// The chart to write (.png or .svg).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Simulate a whole training run: its epochs (with freezing and elastic pipelines,
    /// PipeTransformer, when the plan asks), then failures, checkpoints and restarts over it in
    /// seeded Monte Carlo runs: days, GPU-hours, goodput, cost.
    TrainRun {
        /// The scenario (JSON; docs/scenario.md), with "run" and optionally "plan.freeze".
        scenario: PathBuf,
        /// Print the run as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
        /// Write CSVs and plots (throughput, K and R per epoch, the speedup breakdown, the
        /// run's progress, the distribution of its completion time) here.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
        /// Seeded runs of failures and checkpoints to draw (1 to 100000); with more than one,
        /// days, GPU-hours, goodput and cost are given as p50, p90 and mean.
        #[arg(long, default_value_t = 1)]
        runs: u32,
        /// Price of one GPU-hour in dollars, for the run's cost.
        #[arg(long, value_name = "DOLLARS")]
        price_per_gpu_hour: Option<f64>,
    },
    /// Write a synthetic per-layer gradient-norm trace (epoch x layer) for plan.freeze's
    /// gradient policy: plausible, not measured (see policy::freeze::synthetic_trace).
    SyntheticTrace {
        /// Layers of the model (one gradient norm per layer and epoch).
        #[arg(long)]
        layers: u32,
        /// Epochs of the trace.
        #[arg(long)]
        epochs: u32,
        /// Seed of the pseudo-random noise (the same seed gives the same trace).
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Pipeline partitions: each schedule and micro-batch size with its balanced partition,
    /// simulated, and the best (BaPipe's exploration).
    Partition {
        /// The scenario (JSON; docs/scenario.md).
        scenario: PathBuf,
        /// Print every candidate and the best as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
        /// Write the best plan as a scenario file.
        #[arg(long, value_name = "FILE")]
        write: Option<PathBuf>,
    },
    /// The largest model of the scenario's family that fits, per memory policy (binary search
    /// on the simulated peak), with its throughput.
    Capacity {
        /// The scenario (JSON; docs/scenario.md) whose transformer is grown.
        scenario: PathBuf,
        /// Which knob grows the model: hidden, layers or params (both).
        #[arg(long, default_value = "params")]
        vary: String,
        /// Also sweep data parallelism over these GPU counts (one node) for plots.
        #[arg(long, value_delimiter = ',')]
        gpus: Vec<u32>,
        /// Print the result as one JSON object (docs/report.md).
        #[arg(long)]
        json: bool,
        /// Write CSVs and plots (max model vs GPUs) here.
        #[arg(long, value_name = "DIR")]
        plot: Option<PathBuf>,
    },
    /// The fastest plan that fits, the top K and the Pareto front of iteration time against
    /// peak memory, over dp, tp, pp, micro-batch, schedule, recompute, ZeRO, offload, partition
    /// and rank order (bounds prune, survivors are simulated on all cores).
    Search(search::SearchArgs),
    /// List every built-in device, link, node and workload preset.
    Presets {
        /// Print every preset with all its numbers and sources as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Time the simulator on GPT-3 175B at 1024, 3072 and 8192 GPUs.
    Bench {
        /// Simulate every device (no symmetry) as well, and check both agree.
        #[arg(long)]
        full: bool,
        /// Only the 1024-GPU case.
        #[arg(long)]
        quick: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay { scenario, backend, warmup, repeats, json, trace, max_seconds } => exec::replay_cmd(
            &scenario,
            &backend,
            executor::replay::ReplayOptions { warmup, repeats },
            json,
            trace.as_deref(),
            max_seconds,
        ),
        Command::Calibrate { backend, out, quick } => exec::calibrate_cmd(&backend, &out, quick),
        Command::TorchBlock { scenario, profile, warmup, repeats, json } => {
            exec::torch_block_cmd(&scenario, &profile, warmup, repeats, json)
        }
        Command::Slices { scenario, granularity, json } => slices(&scenario, granularity, json),
        Command::TrainRun { scenario, json, plot, runs, price_per_gpu_hour } => {
            train_run::train_run(&scenario, json, plot.as_deref(), runs, price_per_gpu_hour)
        }
        Command::Capacity { scenario, vary, gpus, json, plot } => {
            capacity_cmd(&scenario, &vary, &gpus, json, plot.as_deref())
        }
        Command::Search(args) => search::run(&args),
        Command::Partition { scenario, json, write } => partition_cmd(&scenario, json, write.as_deref()),
        Command::SyntheticTrace { layers, epochs, seed } => {
            let t = sim::policy::freeze::synthetic_trace(layers, epochs, seed);
            let v = serde_json::json!({"synthetic": true, "layers": layers, "grad_l1": t});
            println!("{}", serde_json::to_string_pretty(&v).expect("serializable"));
            Ok(())
        }
        Command::Plot { csv, y, lines, title, y_label, out } => csvplot::draw(&csv, &y, lines, &title, &y_label, &out),
        Command::Validate { scenario, backend, profile, warmup, repeats, json, plot } => exec::validate_cmd(
            &scenario,
            &backend,
            &profile,
            executor::replay::ReplayOptions { warmup, repeats },
            json,
            plot.as_deref(),
        ),
        Command::Simulate {
            scenario,
            json,
            trace,
            gantt,
            memory_csv,
            memory_plot,
            memory_device,
            full,
            network,
            profile,
        } => {
            let outputs = Outputs {
                trace: &trace,
                gantt: gantt.as_deref(),
                memory_csv: memory_csv.as_deref(),
                memory_plot: memory_plot.as_deref(),
                memory_device,
            };
            simulate(&scenario, json, &outputs, full, network.as_deref(), &profile)
        }
        Command::Presets { json } => {
            summary::presets(json);
            Ok(())
        }
        Command::Bench { full, quick } => bench::run(full, quick),
        Command::NcclTest(args) => nccl_test::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Read and validate a scenario; files it names are resolved against its folder.
pub fn load_scenario(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read scenario {}: {e}", path.display()))?;
    load_scenario_text(path, &text)
}

/// A scenario from `text`, its files read beside `path`.
pub fn load_scenario_text(path: &Path, text: &str) -> Result<Scenario, String> {
    scenario::parse(text, &file_loader(path)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads a file a scenario names (a gradient trace, a Hugging Face config), relative names
/// beside the scenario file `path`.
pub fn file_loader(path: &Path) -> impl Fn(&str) -> Result<String, String> {
    let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
    move |name: &str| {
        let p = Path::new(name);
        let p = if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
    }
}

/// Files `simulate` writes besides the report.
struct Outputs<'a> {
    trace: &'a outputs::TraceArgs,
    gantt: Option<&'a Path>,
    memory_csv: Option<&'a Path>,
    memory_plot: Option<&'a Path>,
    memory_device: Option<u32>,
}

fn simulate(
    path: &Path,
    json: bool,
    outputs: &Outputs,
    full: bool,
    network: Option<&str>,
    profile: &exec::ProfileArgs,
) -> Result<(), String> {
    let (trace, gantt_path) = (outputs.trace.trace.as_deref(), outputs.gantt);
    let mut s = load_scenario(path)?;
    profile.apply(&mut s)?;
    if full {
        s.options.symmetry = false;
    }
    if let Some(n) = network {
        s.options.network = sim::network::NetworkKind::parse(n).ok_or_else(|| {
            format!("--network: \"{n}\" is not one of: {}", sim::network::NetworkKind::NAMES.join(", "))
        })?;
    }
    let (trace_filter, trace_note) = outputs.trace.filter(&s)?;
    let files = [
        ("--trace", trace),
        ("--gantt", gantt_path),
        ("--memory", outputs.memory_csv),
        ("--memory-plot", outputs.memory_plot),
    ];
    outputs::check_writable(files.iter().filter_map(|&(what, p)| p.map(|p| (what, p))))?;
    let record =
        trace.is_some() || gantt_path.is_some() || outputs.memory_csv.is_some() || outputs.memory_plot.is_some();
    let progress = outputs::spinner(format!(
        "simulating {} devices{}",
        s.plan.devices(),
        if record { ", recording every span" } else { "" }
    ));
    let out = sim::try_simulate(&s, record);
    progress.finish_and_clear();
    let out = out.map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(t) = trace {
        if let Some(note) = &trace_note {
            eprintln!("{note}");
        }
        let progress = outputs::spinner(format!("writing trace {}", t.display()));
        let bytes = outputs::write_trace(t, &out.timeline, &s, &trace_filter)?;
        progress.finish_and_clear();
        if !json {
            eprintln!("trace: {:.1} MB written to {}", bytes as f64 / 1e6, t.display());
        }
    }
    if let Some(g) = gantt_path {
        let opts = gantt::GanttOptions { title: s.name.clone(), max_rows: 32 };
        gantt::draw(&out.timeline, g, &opts)?;
    }
    if let Some(m) = outputs.memory_plot {
        let device = match outputs.memory_device {
            Some(d) => d,
            None => sim::report::memory::peak_device(&out.timeline).ok_or("--memory-plot: no device was simulated")?,
        };
        memory_plot::draw(&out.timeline, device, m, &s.name)?;
    }
    if let Some(c) = outputs.memory_csv {
        std::fs::write(c, sim::report::memory::curves_csv(&out.timeline))
            .map_err(|e| format!("cannot write memory CSV {}: {e}", c.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out.report).map_err(|e| e.to_string())?);
    } else {
        summary::print_summary(&out.report);
        if let Some(t) = trace {
            println!("trace:        {}", t.display());
        }
        if let Some(g) = gantt_path {
            println!("gantt:        {}", g.display());
        }
        if let Some(m) = outputs.memory_plot {
            println!("memory plot:  {}", m.display());
        }
        if let Some(c) = outputs.memory_csv {
            println!("memory CSV:   {}", c.display());
        }
    }
    Ok(())
}

fn partition_cmd(path: &Path, json: bool, write: Option<&Path>) -> Result<(), String> {
    let s = load_scenario(path)?;
    if s.plan.token_slices.is_some() {
        return Err(format!(
            "{}: plan.token_slices is set: token slicing (TeraPipe) fixes the schedule and the units, so there is nothing for partition to explore; use `trainsim slices`, or drop token_slices to explore plain pipelines",
            path.display()
        ));
    }
    if let Some(w) = write {
        outputs::check_writable([("--write", w)])?;
    }
    let progress = outputs::spinner("exploring schedules and micro-batch sizes with balanced partitions");
    let e = sim::partition::explore(&s);
    progress.finish_and_clear();
    let no_plan = || {
        format!(
            "no plan fits: none of the {} simulated plans (schedules, micro-batch sizes, partitions) fits the devices' memory{}{}",
            e.candidates.len(),
            if e.not_simulated > 0 {
                format!(
                    "; {} more (schedule, micro-batch size) plans were not simulated: the search for a fitting one stopped at its budget of {} M tasks",
                    e.not_simulated,
                    sim::partition::FALLBACK_TASK_BUDGET / 1_000_000
                )
            } else {
                String::new()
            },
            if write.is_some() { "; nothing written" } else { "" }
        )
    };
    if let (Some(out), Some(best)) = (write, e.best.as_ref()) {
        let text = std::fs::read_to_string(path).map_err(|err| err.to_string())?;
        let mut v: serde_json::Value = serde_json::from_str(&text).map_err(|err| err.to_string())?;
        v["plan"]["schedule"] = best.schedule.into();
        v["plan"]["partition"] = serde_json::json!(best.partition);
        v["training"]["micro_batch"] = best.micro_batch.into();
        if let Some(o) = v["plan"].as_object_mut() {
            if best.virtual_stages > 1 {
                o.insert("virtual_stages".into(), best.virtual_stages.into());
            } else {
                o.remove("virtual_stages");
            }
        }
        std::fs::write(out, serde_json::to_string_pretty(&v).map_err(|err| err.to_string())?)
            .map_err(|err| format!("cannot write {}: {err}", out.display()))?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&e).map_err(|err| err.to_string())?);
        return if e.best.is_some() { Ok(()) } else { Err(no_plan()) };
    }
    println!("{}", s.name);
    println!(
        "schedule         micro_batch  micro_batches  fits  s/sample     chunks (first-last layer: time ms, simulated memory GiB)"
    );
    for c in &e.candidates {
        let stages: Vec<String> = c
            .stages
            .iter()
            .map(|st| {
                format!(
                    "{}-{}: {:.2}, {:.1}",
                    st.first_layer,
                    st.last_layer,
                    st.time_s * 1e3,
                    st.memory_bytes / 1024f64.powi(3)
                )
            })
            .collect();
        println!(
            "{:<16} {:<12} {:<14} {:<5} {:<12.6} {}",
            if c.virtual_stages > 1 {
                format!("{} v={}", c.schedule, c.virtual_stages)
            } else {
                c.schedule.to_string()
            },
            c.micro_batch,
            c.micro_batches,
            if c.fits { "yes" } else { "no" },
            c.time_per_sample_s,
            stages.join("; ")
        );
    }
    match &e.best {
        Some(b) => println!(
            "best:        {} with micro-batches of {} ({:.6} s per sample)",
            b.schedule, b.micro_batch, b.time_per_sample_s
        ),
        None => return Err(no_plan()),
    }
    if let Some(x) = e.speedup_vs_data_parallel {
        println!("             {x:.2}x data parallelism over all devices");
    }
    if let Some(x) = e.speedup_vs_uniform_gpipe {
        println!("             {x:.2}x GPipe with uniform stages");
    }
    if let Some(w) = write {
        // Reached only with a best plan, which was written above.
        println!("written:      {}", w.display());
    }
    Ok(())
}

fn capacity_cmd(path: &Path, vary: &str, gpus: &[u32], json: bool, plot: Option<&Path>) -> Result<(), String> {
    use sim::capacity::{Policy, Vary, capacity_observed};
    let s = load_scenario(path)?;
    let v = Vary::parse(vary).ok_or_else(|| format!("--vary: \"{vary}\" is not one of: hidden, layers, params"))?;
    if s.workload.net.is_some() {
        return Err("capacity studies vary a transformer; this workload is a network of distinct layers".into());
    }
    let progress = outputs::spinner("searching the largest model per memory policy");
    // Each simulated size, as it finishes: a search over thousands of layers takes minutes.
    let show = |bar: &indicatif::ProgressBar| {
        let bar = bar.clone();
        move |policy: &str, p: &sim::capacity::Probed| {
            let verdict = match p.fits {
                Some(true) => "fits",
                Some(false) => "does not fit",
                None => "refused",
            };
            bar.set_message(format!(
                "largest model per memory policy: {policy}, {} layers of width {}: {verdict}",
                p.layers, p.hidden
            ));
        }
    };
    let r = capacity_observed(&s, v, &Policy::ALL, &show(&progress));
    progress.finish_and_clear();
    let mut sweep = Vec::new();
    for &n in gpus {
        let mut g = s.clone();
        g.cluster.nodes = 1;
        g.cluster.node.devices = n;
        g.plan.dp = n;
        g.plan.cp = 1;
        // Expert-parallel groups are consecutive replicas: kept where they divide the GPUs.
        if !n.is_multiple_of(g.plan.ep) {
            g.plan.ep = 1;
        }
        g.plan.tp = 1;
        g.plan.pp = 1;
        g.plan.partition = vec![g.workload.layers()];
        let per = g.training.global_batch.div_ceil(n).max(1);
        g.training.global_batch = per * n;
        g.plan.micro_batch = per.min(g.plan.micro_batch).max(1);
        g.plan.micro_batch = (1..=g.plan.micro_batch).rev().find(|b| per.is_multiple_of(*b)).unwrap_or(1);
        g.training.micro_batch = g.plan.micro_batch;
        g.plan.micro_batches = per / g.plan.micro_batch;
        let bar = outputs::spinner(format!("{n} GPU(s)"));
        sweep.push((n, capacity_observed(&g, v, &Policy::ALL, &show(&bar))));
        bar.finish_and_clear();
        eprintln!("  {n} GPU(s) done");
    }
    if let Some(dir) = plot {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
        let mut params = format!("gpus,{}\n", names.join(","));
        let mut speed = format!("gpus,{}\n", names.join(","));
        for (n, c) in &sweep {
            let row = |f: &dyn Fn(&sim::capacity::PolicyCapacity) -> f64| {
                c.policies.iter().map(|p| format!("{:.4}", f(p))).collect::<Vec<_>>().join(",")
            };
            params += &format!("{n},{}\n", row(&|p| p.max_params / 1e9));
            speed += &format!("{n},{}\n", row(&|p| p.samples_per_s));
        }
        std::fs::write(dir.join("max_params.csv"), &params).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("throughput.csv"), &speed).map_err(|e| e.to_string())?;
        let y: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        csvplot::draw(
            &dir.join("max_params.csv"),
            &y,
            true,
            "largest trainable model vs GPUs",
            "billion parameters",
            &dir.join("max_params.png"),
        )?;
        csvplot::draw(
            &dir.join("throughput.csv"),
            &y,
            true,
            "throughput of the largest model vs GPUs",
            "samples/s",
            &dir.join("throughput.png"),
        )?;
    }
    if json {
        let v = serde_json::json!({"vary": r.vary, "devices": r.devices, "policies": r.policies,
            "sweep": sweep.iter().map(|(n, c)| serde_json::json!({"gpus": n, "policies": c.policies})).collect::<Vec<_>>()});
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{}: the largest model per policy on {} devices (varying {vary})", s.name, r.devices);
    for p in &r.policies {
        println!("  {:<14} {:>9.2} B parameters  {:>9.2} samples/s", p.policy, p.max_params / 1e9, p.samples_per_s);
        if let Some(note) = &p.note {
            println!("  {:<14} note: {note}", "");
        }
    }
    for (n, c) in &sweep {
        let cells: Vec<String> =
            c.policies.iter().map(|p| format!("{} {:.1}B", p.policy, p.max_params / 1e9)).collect();
        println!("  {n:>3} GPUs: {}", cells.join(", "));
    }
    Ok(())
}

fn slices(path: &Path, granularity: Option<u32>, json: bool) -> Result<(), String> {
    let s = load_scenario(path)?;
    let g = granularity
        .or(match s.plan.token_slices {
            Some(sim::plan::TokenSlices::Auto { granularity }) => Some(granularity),
            _ => None,
        })
        .unwrap_or_else(|| {
            // TeraPipe's 8-token units, but at most 256 units per sequence: the optimiser's
            // cost table grows with the square of the units (a 8K sequence in 8-token units
            // runs for minutes).
            let g = 8.max(s.plan.seq_len.div_ceil(256));
            if g > 8 {
                eprintln!("granularity: {g} tokens (8 by default, coarser so that a sequence has at most 256 units)");
            }
            g
        });
    if g == 0 || g > s.plan.seq_len {
        return Err(format!("--granularity: {g} must be between 1 and seq_len {}", s.plan.seq_len));
    }
    let problem = sim::policy::token_slicing::SliceProblem {
        seq_len: s.plan.seq_len,
        batch: s.training.global_batch / s.plan.dp,
        stages: s.plan.pp,
        granularity: g,
    };
    problem.check_size().map_err(|e| format!("{}: {e}", path.display()))?;
    let p = sim::choose_token_slices(&s, g).map_err(|e| format!("{}: {e}", path.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&p).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!(
        "{}: token slicing of {} sequences of {} tokens over {} stages ({}-token units)",
        s.name,
        s.training.global_batch / s.plan.dp,
        s.plan.seq_len,
        s.plan.pp,
        g
    );
    println!(
        "candidates:   {} t_max values evaluated{}",
        p.evaluated,
        if p.stopped_early { " (stopped early: K x t_max passed the best latency)" } else { "" }
    );
    println!("              t_max_ms    latency_ms");
    let best = p.latency_s;
    let step = (p.candidates.len() / 40).max(1);
    for (i, c) in p.candidates.iter().enumerate() {
        if i % step == 0 || (c.total_s - best).abs() < 1e-12 {
            println!(
                "              {:<10.4}  {:.4}{}",
                c.t_max_s * 1e3,
                c.total_s * 1e3,
                if (c.total_s - best).abs() < 1e-12 { "  <- optimum" } else { "" }
            );
        }
    }
    println!("optimum:      {:.4} ms per pipeline pass, t_max {:.4} ms", best * 1e3, p.t_max_s * 1e3);
    for sb in &p.sub_batches {
        println!("              {} sequence(s): slices {:?}", sb.sequences, sb.slices);
    }
    Ok(())
}
