//! The executor's commands: `replay`, `calibrate`, `validate`, and profiles for `simulate`.
//! Wall clocks and files live here; the measuring is in the `executor` crate.

use crate::load_scenario;
use executor::OpContext;
use executor::calibrate::Profile;
use executor::replay::{Measured, ReplayOptions, median, replay};
use serde::Serialize;
use sim::scenario::{MeasuredRates, Scenario};
use std::path::{Path, PathBuf};

/// Read a calibration profile's rates (schema trainsim-profile/1).
/// The calibration-profile options that `simulate`, `validate` and `torch-block` share.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ProfileArgs {
    /// Predict with a calibration profile's measured rates (from `trainsim calibrate`) for the
    /// device and its links.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Apply --profile even when it was measured on another kind or model of device than the
    /// scenario's (the report's notes say so).
    #[arg(long, requires = "profile")]
    pub force_profile: bool,
}

impl ProfileArgs {
    /// Calibrate `s` with the profile, if one was given.
    pub fn apply(&self, s: &mut Scenario) -> Result<(), String> {
        match &self.profile {
            Some(p) => apply_profile(s, p, self.force_profile),
            None => Ok(()),
        }
    }
}

/// Calibrate `s` with the profile at `path`, refusing a profile of another device unless
/// `force` (then the report's notes state the mismatch).
pub fn apply_profile(s: &mut Scenario, path: &Path, force: bool) -> Result<(), String> {
    let m = load_profile(path)?;
    if let Some(why) = s.profile_mismatch(&m) {
        if !force {
            return Err(format!(
                "profile {}: {why}; its rates would make the prediction meaningless. Calibrate on the \
                 scenario's device, or pass --force-profile to apply it anyway",
                path.display()
            ));
        }
        s.notes.push(format!("calibration profile applied by --force-profile although {why}"));
    }
    s.calibrate(&m);
    Ok(())
}

pub fn load_profile(path: &Path) -> Result<MeasuredRates, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read profile {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("profile {}: not valid JSON: {e}", path.display()))?;
    let schema = v["schema"].as_str().unwrap_or("");
    if schema != executor::calibrate::SCHEMA {
        return Err(format!(
            "profile {}: schema \"{schema}\" is not \"{}\" (make it again with trainsim calibrate)",
            path.display(),
            executor::calibrate::SCHEMA
        ));
    }
    let num = |p: &str| {
        v.pointer(p)
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| format!("profile {}: missing number {p}", path.display()))
    };
    let backend = v["backend"].as_str().unwrap_or("");
    let device = v["device"].as_str().unwrap_or("").to_string();
    // A CUDA backend, or torch on a CUDA device, measured a GPU; the rest ran on CPU threads.
    let gpu = backend == "cuda" || (backend == "torch" && device.contains("cuda"));
    Ok(MeasuredRates {
        device,
        device_kind: if gpu { sim::hardware::DeviceKind::Gpu } else { sim::hardware::DeviceKind::Cpu },
        gemm_flops_per_s: num("/gemm/flops_per_s")?,
        mem_bytes_per_s: num("/memory/bytes_per_s")?,
        launch_s: num("/launch_s")?,
        link_bytes_per_s: num("/link/bytes_per_s").ok(),
        link_latency_s: num("/link/latency_s").ok(),
        // Profiles from before session 16 have none.
        kernel_jitter: num("/kernel_jitter").ok(),
        // Profiles from before session 40 timed it right after a warm-up.
        kernel_jitter_settled_s: num("/kernel_jitter_settled_s").ok(),
        // Profiles from before session 18 timed f32 GEMMs and do not say so.
        gemm_element_bytes: num("/element_bytes").ok(),
        memory_op_bytes_per_s: v["memory_ops"]
            .as_array()
            .map(|a| {
                a.iter().filter_map(|o| Some((o["name"].as_str()?.to_string(), o["bytes_per_s"].as_f64()?))).collect()
            })
            .unwrap_or_default(),
    })
}

fn context(s: &Scenario) -> OpContext {
    OpContext {
        hidden: s.workload.transformer.hidden as usize,
        seq_len: s.plan.seq_len as usize,
        element_bytes: s.training.precision.activation_bytes(),
    }
}

/// The reference GEMM's rate on device 0 (see `executor::calibrate::reference_gemm_flops_per_s`).
fn reference_rate(b: &dyn executor::Backend) -> Option<f64> {
    let mut dev = b.open(0).ok()?;
    executor::calibrate::reference_gemm_flops_per_s(dev.as_mut()).ok()
}

/// A replay: the simulation whose Program ran, what was measured, and (when probed) the
/// reference GEMM rate just before and just after it.
struct Replayed {
    sim: sim::Simulation,
    measured: Measured,
    probe: Option<(f64, f64)>,
}

/// Replay `s` on `backend`; with `probe`, also time the reference GEMM around the replay.
/// Longest replay `replay` and `validate` start without `--max-seconds`.
pub const DEFAULT_MAX_REPLAY_S: f64 = 600.0;

/// Host time assumed per replayed task (dispatch, dependency wait): a floor for the estimate.
const REPLAY_TASK_S: f64 = 10e-6;

/// FLOPs one iteration of the replayed program runs (one replica under symmetry).
fn program_flops(s: &Scenario, sim_out: &sim::Simulation) -> f64 {
    sim_out.report.network_flops_per_iteration * sim_out.program.devices.len() as f64 / s.plan.devices().max(1) as f64
}

/// Estimated wall time of replaying `sim_out`'s program on `b` for `rounds` runs: its `flops`
/// at `rate` (a reference GEMM's FLOP/s on device 0 right now), plus a dispatch floor per
/// task; devices run one after another when the backend has fewer than the program.
fn replay_estimate_s(sim_out: &sim::Simulation, b: &dyn executor::Backend, rate: f64, flops: f64, rounds: u32) -> f64 {
    let nd = sim_out.program.devices.len() as f64;
    let parallel = if b.device_count() as f64 >= nd { nd } else { 1.0 };
    let tasks = sim_out.program.tasks.len() as f64;
    rounds as f64 * (flops / rate / parallel + tasks * REPLAY_TASK_S / parallel)
}

fn run_replay(s: &Scenario, backend: &str, opts: ReplayOptions, probe: bool, max_s: f64) -> Result<Replayed, String> {
    let b = executor::backend(backend).map_err(|e| e.to_string())?;
    if b.device_count() == 0 {
        // Say why there is nothing to run on before announcing a replay.
        b.open(0).map_err(|e| format!("replay on {backend}: {e}"))?;
    }
    // The replay runs every tensor rank and every replica of a node: their collectives are
    // real work on the devices.
    let mut s = s.clone();
    s.options.fold_node_peers = false;
    let s = &s;
    let sim_out = sim::try_simulate(s, false).map_err(|e| e.to_string())?;
    // One reference GEMM: the estimate's rate, and the drift probe's "before".
    let rate = reference_rate(b.as_ref());
    let flops = program_flops(s, &sim_out);
    if let Some(est) = rate.map(|r| replay_estimate_s(&sim_out, b.as_ref(), r, flops, opts.warmup + opts.repeats))
        && est > max_s
    {
        return Err(format!(
            "replaying {} tasks ({:.3e} FLOP per iteration) of {} device(s) on backend {backend} would take about \
             {est:.0} s for {} runs (estimate from a reference GEMM on this machine); that is over the {max_s} s \
             limit: replay a smaller plan (fewer layers, micro-batches or devices), or raise --max-seconds",
            sim_out.program.tasks.len(),
            flops,
            sim_out.program.devices.len(),
            opts.warmup + opts.repeats
        ));
    }
    let before = if probe { rate } else { None };
    eprintln!(
        "replaying {} tasks on {} device(s) of backend {backend} ({} warm-up + {} measured runs)...",
        sim_out.program.tasks.len(),
        sim_out.program.devices.len(),
        opts.warmup,
        opts.repeats
    );
    let measured =
        replay(&sim_out.program, b.as_ref(), context(s), opts).map_err(|e| format!("replay on {backend}: {e}"))?;
    let after = if probe { reference_rate(b.as_ref()) } else { None };
    Ok(Replayed { sim: sim_out, measured, probe: before.zip(after) })
}

#[derive(Serialize)]
struct OpRow {
    op: String,
    pass: &'static str,
    count: usize,
    predicted_s: f64,
    measured_s: f64,
    error: f64,
}

/// Per op kind (name and pass): mean predicted and measured duration per task.
fn op_rows(s: &Scenario, sim_out: &sim::Simulation, m: &Measured) -> Vec<OpRow> {
    let predicted = sim::op_durations_ns(s, &sim_out.program, None);
    let mut rows: std::collections::BTreeMap<(String, &'static str), (usize, f64, f64)> = Default::default();
    for o in &m.ops {
        if o.samples_s.is_empty() {
            continue;
        }
        let inst = &sim_out.program.ops[o.op as usize];
        let key = (inst.spec.name.to_string(), if inst.backward { "backward" } else { "forward" });
        let e = rows.entry(key).or_insert((0, 0.0, 0.0));
        e.0 += o.samples_s.len();
        e.1 += predicted[o.op as usize] as f64 * 1e-9 * o.samples_s.len() as f64;
        e.2 += o.samples_s.iter().sum::<f64>();
    }
    rows.into_iter()
        .map(|((op, pass), (n, p, mm))| {
            let (predicted_s, measured_s) = (p / n as f64, mm / n as f64);
            OpRow { op, pass, count: n, predicted_s, measured_s, error: (predicted_s - measured_s) / measured_s }
        })
        .collect()
}

pub fn replay_cmd(
    path: &Path,
    backend: &str,
    opts: ReplayOptions,
    json: bool,
    trace: Option<&Path>,
    max_s: f64,
) -> Result<(), String> {
    let s = load_scenario(path)?;
    if let Some(t) = trace {
        crate::outputs::check_writable([("--trace", t)])?;
    }
    let Replayed { sim: sim_out, measured: m, .. } = run_replay(&s, backend, opts, false, max_s)?;
    if let Some(t) = trace {
        let link_name = |l: u32| format!("link{l}");
        let device_name = |d: u32| format!("dev{d} ({backend}, measured)");
        let names = sim::report::trace::TraceNames { link_name: &link_name, device_name: &device_name };
        std::fs::write(t, sim::report::trace::chrome_trace(&m.timeline, &names))
            .map_err(|e| format!("cannot write trace {}: {e}", t.display()))?;
    }
    let rows = op_rows(&s, &sim_out, &m);
    if json {
        let v = serde_json::json!({
            "backend": backend, "mode": m.mode, "iteration_s_measured": m.iteration_s(),
            "iterations_s": m.iterations_s, "ops": rows,
        });
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        println!("{}: measured on {backend} ({})", s.name, m.mode);
        println!("iteration:    {:.4} s (median of {:?})", m.iteration_s(), m.iterations_s);
        println!("op kinds:     op  pass  count  measured_ms");
        for r in &rows {
            println!("              {:<18} {:<8} {:>6}  {:.4}", r.op, r.pass, r.count, r.measured_s * 1e3);
        }
    }
    Ok(())
}

pub fn calibrate_cmd(backend: &str, out: &Path, quick: bool) -> Result<(), String> {
    let b = executor::backend(backend).map_err(|e| e.to_string())?;
    let n = b.device_count().max(1);
    let devs =
        (0..n).map(|i| b.open(i)).collect::<Result<Vec<_>, _>>().map_err(|e| format!("calibrate on {backend}: {e}"))?;
    let created = today();
    eprintln!("calibrating {n} device(s) of backend {backend} at once...");
    let profile = executor::calibrate::calibrate(backend, devs, &created, quick, &|msg| {
        eprintln!("calibrating: {msg}");
    })
    .map_err(|e| format!("calibrate on {backend}: {e}"))?;
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let file = out.join("profile.json");
    std::fs::write(&file, serde_json::to_string_pretty(&profile).map_err(|e| e.to_string())?)
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    std::fs::write(out.join("README.md"), profile_readme(&profile, quick))
        .map_err(|e| format!("cannot write README in {}: {e}", out.display()))?;
    println!(
        "profile: {} ({} GEMM {:.1} GFLOP/s [{:.1}, {:.1}], memory {:.1} GB/s, launch {:.2} us, {}, kernel spread {:.1}%)",
        file.display(),
        profile.precision,
        profile.gemm.flops_per_s / 1e9,
        profile.gemm.flops_per_s_ci95[0] / 1e9,
        profile.gemm.flops_per_s_ci95[1] / 1e9,
        profile.memory.bytes_per_s / 1e9,
        profile.launch_s * 1e6,
        link_summary(&profile),
        profile.kernel_jitter * 100.0
    );
    Ok(())
}

/// The links a profile measured, in one phrase.
fn link_summary(p: &Profile) -> String {
    match (&p.link, &p.host_link) {
        (Some(l), _) => format!("link {:.1} GB/s + {:.1} us", l.bytes_per_s / 1e9, l.latency_s * 1e6),
        (None, Some(h)) => format!("host to device {:.1} GB/s + {:.1} us", h.bytes_per_s / 1e9, h.latency_s * 1e6),
        (None, None) => "no link measured".into(),
    }
}

fn today() -> String {
    std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cpu}, {cores} hardware threads")
}

fn profile_readme(p: &Profile, quick: bool) -> String {
    let fit_row = |what: &str, f: &Option<executor::calibrate::BandwidthFit>, absent: &str| match f {
        Some(l) => format!(
            "| {what} | {:.2} GB/s, {:.2} us latency | [{:.2}, {:.2}] GB/s |\n",
            l.bytes_per_s / 1e9,
            l.latency_s * 1e6,
            l.bytes_per_s_ci95[0] / 1e9,
            l.bytes_per_s_ci95[1] / 1e9
        ),
        None => format!("| {what} | not measured ({absent}) | |\n"),
    };
    format!(
        "# Calibration profile: {} backend, {}\n\nMachine: {}. Made on {} with `trainsim calibrate --backend {}{}`. \
         GEMMs and memory ops measured in {}.\n\n\
         | parameter | value | 95% interval |\n|---|---|---|\n\
         | large-GEMM rate | {:.2} GFLOP/s | [{:.2}, {:.2}] |\n| GEMM overhead | {:.2} us | |\n\
         | streaming memory bandwidth | {:.2} GB/s | [{:.2}, {:.2}] |\n| op launch overhead | {:.2} us | |\n\
         {}{}\
         | kernel time spread, launch to launch | {:.1}% (robust relative standard deviation of 31 runs of one GEMM{}; `simulation.kernel_jitter`) | |\n\n\
         `profile.json` holds every measured point. Use it with `trainsim simulate --profile` or `trainsim validate --profile`.\n",
        p.backend,
        p.device,
        machine(),
        p.created,
        p.backend,
        if quick { " --quick" } else { "" },
        p.precision,
        p.gemm.flops_per_s / 1e9,
        p.gemm.flops_per_s_ci95[0] / 1e9,
        p.gemm.flops_per_s_ci95[1] / 1e9,
        p.gemm.overhead_s * 1e6,
        p.memory.bytes_per_s / 1e9,
        p.memory.bytes_per_s_ci95[0] / 1e9,
        p.memory.bytes_per_s_ci95[1] / 1e9,
        p.launch_s * 1e6,
        fit_row("device-to-device link", &p.link, "peer copies between GPUs are not timed"),
        fit_row("host-to-device copies (pinned)", &p.host_link, "CPU threads share one memory"),
        p.kernel_jitter * 100.0,
        if p.kernel_jitter_settled_s > 0.0 {
            format!(", after {:.0} s of back-to-back GEMMs", p.kernel_jitter_settled_s)
        } else {
            String::new()
        },
    )
}

#[derive(Serialize)]
struct Validation {
    scenario: String,
    backend: String,
    mode: String,
    iteration_s_predicted: f64,
    iteration_s_measured: f64,
    /// (predicted - measured) / measured.
    error: f64,
    /// Mean absolute percentage error over op kinds.
    ops_mape: f64,
    /// A reference GEMM's FLOP/s on device 0 just before and just after the replay.
    reference_gemm_flops_per_s: Option<[f64; 2]>,
    /// after / before - 1: how much the machine's speed drifted during the replay (a shared
    /// machine's noise, not the model's error).
    machine_drift: Option<f64>,
    ops: Vec<OpRow>,
    /// What to know when reading the comparison (absent when there is nothing to say).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

/// The replay runs the executor's own kernels, not a framework's: on a GPU its memory-bound ops
/// run at their own rates, where a prediction from the catalog preset charges PyTorch's
/// kernels' measured shares of a copy's rate (`hardware::kernels::memory_kernel_efficiency`; on
/// an H100 the preset's predictions of the four GPU plans were 16-30% above their replays, 4-28%
/// with a profile: `traces/2026-11-26-cuda-h100/`). A profile measures the executor's own rates.
/// Any backend predicted without a profile says that nothing of the machine was measured.
fn validate_notes(backend: &str, profiled: bool) -> Vec<String> {
    if profiled {
        return Vec::new();
    }
    if backend != "cuda" {
        return vec![
            "predicted from the catalog preset, with nothing measured on this machine: `trainsim calibrate` and \
             `--profile` compare the replay with a prediction from this machine's own rates"
                .into(),
        ];
    }
    vec![
        "the replay runs trainsim's own memory-bound kernels (norms, softmax, masks, dropout, activations), not \
         PyTorch's, whose measured shares of a copy's rate the preset charges: per op kind they differ from the prediction \
         either way (on an H100 the score scale and mask passes replayed in about half the time charged, dropout and \
         LayerNorm took 23-41% longer); predict with `--profile` (from `trainsim calibrate --backend cuda`) to compare like with like"
            .into(),
    ]
}

pub fn validate_cmd(
    path: &Path,
    backend: &str,
    profile: &ProfileArgs,
    opts: ReplayOptions,
    json: bool,
    plot: Option<&Path>,
) -> Result<(), String> {
    let mut s = load_scenario(path)?;
    profile.apply(&mut s)?;
    let Replayed { sim: sim_out, measured: m, probe } = run_replay(&s, backend, opts, true, DEFAULT_MAX_REPLAY_S)?;
    let rows = op_rows(&s, &sim_out, &m);
    let predicted = sim_out.report.iteration_s;
    let measured = m.iteration_s();
    let v = Validation {
        scenario: s.name.clone(),
        backend: backend.into(),
        mode: m.mode.clone(),
        iteration_s_predicted: predicted,
        iteration_s_measured: measured,
        error: (predicted - measured) / measured,
        ops_mape: rows.iter().map(|r| r.error.abs()).sum::<f64>() / rows.len().max(1) as f64,
        reference_gemm_flops_per_s: probe.map(|(b, a)| [b, a]),
        machine_drift: probe.map(|(b, a)| a / b - 1.0),
        ops: rows,
        notes: validate_notes(backend, profile.profile.is_some()),
    };
    if let Some(p) = plot {
        crate::validate_plot::draw(
            &v.ops
                .iter()
                .map(|r| (format!("{} {}", r.op, &r.pass[..1]), r.predicted_s, r.measured_s))
                .collect::<Vec<_>>(),
            (predicted, measured),
            &s.name,
            p,
        )?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        println!("{}: predicted vs measured on {backend} ({})", v.scenario, v.mode);
        println!(
            "iteration:    predicted {:.4} s, measured {:.4} s (median of {}), error {:+.1}%",
            predicted,
            measured,
            m.iterations_s.len(),
            100.0 * v.error
        );
        if let Some((b, a)) = probe {
            println!(
                "machine:      reference GEMM {:.1} GFLOP/s before the replay, {:.1} after ({:+.1}%)",
                b / 1e9,
                a / 1e9,
                100.0 * (a / b - 1.0)
            );
        }
        println!("op kinds:     mean absolute error {:.1}%", 100.0 * v.ops_mape);
        for n in &v.notes {
            println!("note:         {n}");
        }
        for r in &v.ops {
            println!(
                "              {:<18} {:<8} x{:<5} predicted {:>9.4} ms  measured {:>9.4} ms  {:+.1}%",
                r.op,
                r.pass,
                r.count,
                r.predicted_s * 1e3,
                r.measured_s * 1e3,
                100.0 * r.error
            );
        }
    }
    let _ = median;
    Ok(())
}

/// The simulator's time for one transformer layer's forward and backward kernels (micro-batch 0,
/// the first layer of device 0), in seconds: what a real block step is compared with.
pub fn predicted_layer_s(s: &Scenario) -> Result<f64, String> {
    use sim::report::timeline::{Phase, StreamKind};
    let p = sim::lower::lower(s);
    let ns = sim::op_durations_ns(s, &p, None);
    let stream = &p.streams[sim::lower::Program::stream_index(0, StreamKind::Compute) as usize];
    let layer = (0..s.workload.transformer.layers as i32)
        .find(|&l| stream.iter().any(|&t| p.labels[p.tasks[t as usize].label as usize].layer == l))
        .ok_or("the first device runs no transformer layer")?;
    let total: u64 = stream
        .iter()
        .map(|&t| &p.tasks[t as usize])
        .filter(|t| t.kind == sim::lower::TaskKind::Compute && t.micro_batch == 0)
        .filter(|t| {
            let l = &p.labels[t.label as usize];
            l.layer == layer && matches!(l.phase, Phase::Forward | Phase::Backward)
        })
        .map(|t| ns[t.payload as usize])
        .sum();
    Ok(total as f64 * 1e-9)
}

/// `trainsim torch-block`: a real GPT block through PyTorch against the prediction.
pub fn torch_block_cmd(
    path: &Path,
    profile: &ProfileArgs,
    warmup: u32,
    repeats: u32,
    json: bool,
) -> Result<(), String> {
    let mut s = load_scenario(path)?;
    profile.apply(&mut s)?;
    let predicted = predicted_layer_s(&s)?;
    let w = &s.workload.transformer;
    let measured = torch_block(&s, warmup, repeats)?;
    let error = (predicted - measured) / measured;
    if json {
        let v = serde_json::json!({"hidden": w.hidden, "heads": w.heads, "seq_len": s.plan.seq_len,
            "micro_batch": s.plan.micro_batch, "block_s_measured": measured, "block_s_predicted": predicted, "error": error});
        println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
    } else {
        println!(
            "{}: one GPT block forward+backward (h={}, {} heads, seq {}, micro-batch {}): measured {:.3} ms (PyTorch), predicted {:.3} ms, error {:+.1}%",
            s.name,
            w.hidden,
            w.heads,
            s.plan.seq_len,
            s.plan.micro_batch,
            measured * 1e3,
            predicted * 1e3,
            100.0 * error
        );
    }
    Ok(())
}

#[cfg(feature = "torch")]
fn torch_block(s: &Scenario, warmup: u32, repeats: u32) -> Result<f64, String> {
    let w = &s.workload.transformer;
    eprintln!("running a GPT block in PyTorch ({warmup} warm-up + {repeats} timed steps)...");
    executor::torch::gpt_block_step(
        0,
        context(s).element_bytes,
        w.hidden as i64,
        w.heads as i64,
        s.plan.seq_len as i64,
        s.plan.micro_batch as i64,
        warmup as usize,
        repeats.max(1) as usize,
    )
    .map_err(|e| e.to_string())
}

#[cfg(not(feature = "torch"))]
fn torch_block(_: &Scenario, _: u32, _: u32) -> Result<f64, String> {
    Err("torch-block needs the torch backend: build with --features torch against PyTorch 2.11 (see the README)".into())
}

#[cfg(test)]
mod validate_notes_tests {
    use super::validate_notes;

    #[test]
    fn a_prediction_without_a_profile_says_what_it_compares() {
        assert!(validate_notes("cuda", true).is_empty() && validate_notes("cpu", true).is_empty());
        let cuda = validate_notes("cuda", false).join(" ");
        assert!(cuda.contains("own memory-bound kernels") && cuda.contains("--profile"), "{cuda}");
        let cpu = validate_notes("cpu", false).join(" ");
        assert!(cpu.contains("nothing measured") && !cpu.contains("PyTorch"), "{cpu}");
    }
}
