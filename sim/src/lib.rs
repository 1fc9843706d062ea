//! trainsim's model of the world and its simulator: pure and deterministic, no I/O, no
//! clock. The same scenario gives a byte-identical report and timeline.
//!
//! Data flow: [`scenario::parse`] validates the input into a [`scenario::Scenario`];
//! [`lower::lower`] turns its plan into a [`lower::Program`] of per-device task streams;
//! [`engine::run`] times the program on the cluster with the [`cost`] model and the
//! [`network`] model; [`report::build`] summarises the run. [`simulate`] does all of it.

pub mod capacity;
pub mod cost;
pub mod engine;
pub mod framework;
pub mod hardware;
pub mod lower;
pub mod network;
pub mod partition;
pub mod plan;
pub mod policy;
pub mod report;
pub mod run;
pub mod scenario;
pub mod schedule;
pub mod search;
pub mod workload;

use engine::RunOptions;
use hardware::Topology;

/// Everything one simulation produces.
pub struct Simulation {
    pub report: report::Report,
    pub program: lower::Program,
    pub timeline: report::timeline::Timeline,
}

/// Why a simulation has no report.
#[derive(Clone, Debug, PartialEq)]
pub enum SimError {
    /// The lowered program would exceed `lower::size::MAX_TASKS`: the key to change and why.
    TooLarge { key: &'static str, message: String },
    /// The engine stopped (the clock's range, the event queue's).
    Run(engine::RunError),
    /// The report broke a physical bound (`Report::check_invariants`): a modelling error.
    Impossible(String),
    /// The scenario asks for something the model cannot answer (a policy that does not apply
    /// to this workload, a cost that is not finite).
    Unsupported(String),
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::TooLarge { key, message } => write!(f, "plan too large to simulate: {key}: {message}"),
            SimError::Run(e) => write!(f, "cannot simulate: {e}"),
            SimError::Unsupported(e) => write!(f, "cannot simulate: {e}"),
            SimError::Impossible(e) => {
                write!(
                    f,
                    "internal error: the simulated report is physically impossible ({e}); please report this scenario"
                )
            }
        }
    }
}

impl std::error::Error for SimError {}

/// Seconds as the engine's nanoseconds: past the clock's range (or not a number) it is
/// `engine::MAX_TIME_NS`, which the engine refuses with an error instead of wrapping.
pub fn duration_ns(seconds: f64) -> u64 {
    let ns = (seconds * 1e9).round();
    if ns.is_nan() || ns >= engine::MAX_TIME_NS as f64 {
        engine::MAX_TIME_NS
    } else if ns <= 0.0 {
        0
    } else {
        ns as u64
    }
}

/// Durations of a program's ops on the scenario's device, in nanoseconds.
pub fn op_durations_ns(s: &scenario::Scenario, p: &lower::Program, calibration: Option<cost::Calibration>) -> Vec<u64> {
    let node = &s.cluster.node;
    // One compute model per device class; an FPGA stage whose weights fit its on-chip SRAM
    // reads them from there.
    let heaviest = p.static_memory.iter().map(|m| m.weights).fold(0.0, f64::max);
    let models: Vec<cost::ComputeModel> = (0..=s.cluster.overrides.len() as u16)
        .map(|cl| {
            let dev = s.cluster.class(cl);
            let on_chip = dev.fpga.is_some_and(|f| heaviest <= f.sram_bytes);
            let cal = if cl == 0 { calibration } else { None };
            cost::ComputeModel::new(dev, s.training.precision, cal)
                .with_fp8_plan(&s.plan)
                .with_op_rates(&s.op_rates)
                .with_weights_on_chip(on_chip)
        })
        .collect();
    // Host work (an offloaded optimizer step) shares the node's CPU memory bandwidth and
    // NVMe drives among the node's devices, which all step at once.
    let share = node.devices.max(1) as f64;
    let mut cpu = node.host.cpu.clone().unwrap_or_else(hardware::catalog::host_cpu);
    cpu.mem_bandwidth_bytes_per_s /= share;
    let host = cost::ComputeModel::new(&cpu, hardware::Precision::Fp32, None);
    let nvme_bytes_per_s = node.host.nvme_bandwidth_bytes_per_s / share;
    // Devices of one model differ in speed, and every iteration ends with a synchronisation
    // over all of them (the gradient reduction, the pipeline flush): each device's work takes
    // as long as the slowest device's, the expected maximum of N draws.
    let slowest = scenario::expected_max_std_normal(s.cluster.device_count() as u64);
    let straggle: Vec<f64> = (0..=s.cluster.overrides.len() as u16)
        .map(|cl| 1.0 + s.options.device_variability(s.cluster.class(cl)) * slowest)
        .collect();
    p.ops
        .iter()
        .map(|o| {
            let seconds = if o.on_host {
                host.op_s(&o.spec, o.backward).max(o.nvme_bytes / nvme_bytes_per_s)
            } else {
                models[o.class as usize].op_rows_s(&o.spec, o.backward, o.rows)
                    * o.chunks
                    * o.share()
                    * straggle[o.class as usize]
                    / o.sm_share
            };
            duration_ns(seconds)
        })
        .collect()
}

/// Host time to issue each of the Program's ops and, per simulated device, a collective on its
/// compute stream, at that device's class's `host_op_s` (empty when no device has a host cost).
pub fn host_issue_ns(s: &scenario::Scenario, p: &lower::Program) -> engine::HostCosts {
    let per_class: Vec<f64> =
        (0..=s.cluster.overrides.len() as u16).map(|cl| s.options.host_op_s(s.cluster.class(cl))).collect();
    if per_class.iter().all(|&h| h == 0.0) {
        return engine::HostCosts::default();
    }
    let ns = duration_ns;
    let per_op = p
        .ops
        .iter()
        .map(|o| {
            if o.on_host {
                return 0;
            }
            let (h, n) = (per_class[o.class as usize], cost::launches(&o.spec, o.backward));
            // A run of small kernels (a list all-gather's copies) is issued while the device
            // runs the kernel before: the host delays the device by what issuing each takes
            // beyond the kernel's own launch time, which the op's device time already holds.
            if matches!(o.spec.class, workload::OpClass::Copies { .. }) {
                let launch = s.cluster.class(o.class).kernel_launch_s;
                return ns(n * (h - launch).max(0.0));
            }
            ns(h * n)
        })
        .collect();
    let per_collective = p.devices.iter().map(|&d| ns(per_class[s.cluster.class_of(d) as usize])).collect();
    engine::HostCosts { per_op, per_collective }
}

/// Simulate one training iteration. `record` keeps every span for traces and plots.
///
/// Panics where [`try_simulate`] returns an error (a plan too large to lower, an iteration
/// beyond the clock's range); commands that take a user's scenario call [`try_simulate`].
pub fn simulate(s: &scenario::Scenario, record: bool) -> Simulation {
    try_simulate(s, record).unwrap_or_else(|e| panic!("{e}"))
}

/// Simulate one training iteration, or say why it cannot be. `record` keeps every span for
/// traces and plots.
///
/// PipeDream-2BW never flushes its pipeline: batch k+1's micro-batches enter while batch k
/// drains, and updates use double-buffered weights. Its steady-state iteration is measured
/// as T(2m) - T(m): two runs of 1F1B without a flush, of 2m and m micro-batches.
pub fn try_simulate(s: &scenario::Scenario, record: bool) -> Result<Simulation, SimError> {
    // Policies that rewrite a plan (AutoDP, the baselines) must keep it on the cluster's
    // devices; a plan that does not would index past them: refuse it as a modelling error.
    if s.plan.devices() != s.cluster.device_count() {
        return Err(SimError::Impossible(format!(
            "the plan's dp x cp x tp x pp = {} x {} x {} x {} devices differ from the cluster's {}",
            s.plan.dp,
            s.plan.cp,
            s.plan.tp,
            s.plan.pp,
            s.cluster.device_count()
        )));
    }
    let sim = dispatch(s, record)?;
    // A report outside the physical bounds is a modelling error: refuse it rather than print it.
    sim.report.check_invariants().map_err(SimError::Impossible)?;
    Ok(sim)
}

/// The simulation of the scenario's plan: its policies resolved, then the schedule's way.
fn dispatch(s: &scenario::Scenario, record: bool) -> Result<Simulation, SimError> {
    if s.plan.partition_policy == Some(plan::PartitionPolicy::Explore) {
        // BaPipe: take the fastest fitting (schedule, micro-batch, balanced partition).
        // With none that fits, the balanced partition of the plan as written, reported as
        // not fitting.
        let e = partition::explore(s);
        let mut r = s.clone();
        r.plan.partition_policy = Some(plan::PartitionPolicy::Balanced);
        if let Some(best) = e.best {
            r.plan.schedule = plan::parse_schedule(best.schedule).expect("explored schedule");
            r.plan.virtual_stages = best.virtual_stages;
            r.plan.micro_batch = best.micro_batch;
            r.training.micro_batch = best.micro_batch;
            r.plan.micro_batches = best.micro_batches;
            r.plan.partition = best.partition;
            r.plan.partition_policy = None;
        }
        return try_simulate(&r, record);
    }
    if s.plan.partition_policy.is_some() {
        // Resolve the partition policy first; with no fitting partition the uniform one stays
        // and the report says it does not fit.
        let mut r = s.clone();
        match partition::resolve(s) {
            Ok(parts) => r.plan.partition = parts,
            Err(why) => r.notes.push(format!(
                "plan.partition: {why} (by the partitioner's memory estimate); the uniform partition {:?} was simulated",
                r.plan.partition
            )),
        }
        r.plan.partition_policy = None;
        let first = try_simulate(&r, record)?;
        // The balanced partition's memory estimate fell short of the simulation's: partition
        // again under the simulator's memory, and keep that if it fits.
        let balanced = s.plan.partition_policy == Some(plan::PartitionPolicy::Balanced);
        if balanced
            && !first.report.fits
            && let Some(parts) = partition::refit(s, &r.plan.partition, &first.report)
        {
            r.plan.partition = parts;
            let second = try_simulate(&r, record)?;
            if second.report.fits {
                return Ok(second);
            }
        }
        return Ok(first);
    }
    if s.plan.token_slices.is_some() {
        return simulate_sliced(s, record);
    }
    if s.plan.schedule == schedule::ScheduleKind::TwoBW {
        return simulate_2bw(s, record);
    }
    simulate_once(s, record)
}

/// The optimiser's choice for `auto` token slicing: sub-batches and slices per replica, with
/// the objective, t_max and every candidate it evaluated.
/// An error when the policy does not apply to the workload, a slice's cost is not finite, or
/// the pipeline pass would outlast the simulator's clock.
pub fn choose_token_slices(
    s: &scenario::Scenario,
    granularity: u32,
) -> Result<policy::token_slicing::SlicingPlan, SimError> {
    policy::token_slicing::applies(&s.workload).map_err(SimError::Unsupported)?;
    let node = &s.cluster.node;
    let model = cost::ComputeModel::new(&node.device, s.training.precision, None)
        .with_op_rates(&s.op_rates)
        .with_fp8_plan(&s.plan);
    let problem = policy::token_slicing::SliceProblem {
        seq_len: s.plan.seq_len,
        batch: s.training.global_batch / s.plan.dp,
        stages: s.plan.pp,
        granularity,
    };
    let cost = |b: u32, l: u32, c: u32| cost::slice::slice_cost_s(s, &model, b, l, c);
    let plan = policy::token_slicing::optimize(&problem, &cost).map_err(SimError::Unsupported)?;
    if plan.latency_s >= engine::MAX_TIME_NS as f64 * 1e-9 {
        return Err(SimError::Run(engine::RunError::TimeOverflow));
    }
    Ok(plan)
}

fn simulate_sliced(s: &scenario::Scenario, record: bool) -> Result<Simulation, SimError> {
    use plan::{SlicedBatch, TokenSlices};
    let mut sliced = s.clone();
    let mut chosen = None;
    if let Some(TokenSlices::Auto { granularity }) = s.plan.token_slices {
        let p = choose_token_slices(s, granularity)?;
        let subs =
            p.sub_batches.iter().map(|sb| SlicedBatch { sequences: sb.sequences, slices: sb.slices.clone() }).collect();
        sliced.plan.token_slices = Some(TokenSlices::Explicit(subs));
        chosen = Some(p);
    }
    sliced.plan.schedule = schedule::ScheduleKind::GPipe;
    sliced.plan.micro_batches = sliced.plan.units().len() as u32;
    let mut out = simulate_once(&sliced, record)?;
    // The same pipeline without token slicing, as TeraPipe compares: whole sequences, with the
    // batch still split into sub-batches by the same optimiser (one unit per sequence).
    let mut plain = s.clone();
    let whole = choose_token_slices(s, s.plan.seq_len)?;
    plain.plan.token_slices = Some(TokenSlices::Explicit(
        whole.sub_batches.iter().map(|sb| SlicedBatch { sequences: sb.sequences, slices: sb.slices.clone() }).collect(),
    ));
    plain.plan.schedule = schedule::ScheduleKind::GPipe;
    plain.plan.micro_batches = plain.plan.units().len() as u32;
    let without = simulate_once(&plain, false)?.report.iteration_s;
    let Some(plan::TokenSlices::Explicit(subs)) = &sliced.plan.token_slices else { unreachable!("resolved above") };
    out.report.plan.schedule = "gpipe (token slices)";
    out.report.token_slicing = Some(report::TokenSlicing {
        slices: subs.iter().map(|sb| (sb.sequences, sb.slices.clone())).collect(),
        iteration_s_without: without,
        speedup: without / out.report.iteration_s,
        estimated_latency_s: chosen.as_ref().map(|p| p.latency_s),
        t_max_s: chosen.as_ref().map(|p| p.t_max_s),
    });
    Ok(out)
}

fn simulate_2bw(s: &scenario::Scenario, record: bool) -> Result<Simulation, SimError> {
    let mut one = s.clone();
    one.plan.schedule = schedule::ScheduleKind::OneFOneB;
    let mut two = one.clone();
    two.plan.micro_batches *= 2;
    let a = simulate_once(&one, false)?;
    let mut b = simulate_once(&two, record)?;
    // One batch's work on each stream: its m micro-batches, its gradient synchronisation and
    // its optimizer step, which 2BW runs every batch (the m-micro-batch run holds exactly
    // that). The steady state cannot turn over faster than its busiest stream works: the
    // next batch's compute hides the gradient all-reduce only up to its own length.
    let (stream, busiest_ns) = a
        .timeline
        .stream_busy_ns
        .iter()
        .copied()
        .enumerate()
        .max_by_key(|&(i, ns)| (ns, std::cmp::Reverse(i)))
        .unwrap_or((0, 0));
    let busiest_compute = a.report.stages.iter().map(|st| st.compute_busy_s).fold(0.0, f64::max);
    let doubled_s = b.report.iteration_s - a.report.iteration_s;
    let iteration_s = doubled_s.max(busiest_compute).max(busiest_ns as f64 * 1e-9);
    // Time past the doubled run's difference that a communication stream's work sets, told
    // as that stream's wait.
    let stretch = {
        use report::breakdown::Part;
        use report::timeline::StreamKind as K;
        let part = match lower::Program::stream_kind(stream as u32) {
            K::Compute => None,
            K::DataParallel | K::Gather => Some(Part::DpComm),
            K::PipelineSend => Some(Part::PpComm),
            K::HostCopy => Some(Part::Offload),
            K::TensorParallel | K::TensorAsync => Some(Part::TpComm),
            K::ExpertParallel => Some(Part::EpComm),
        };
        part.map(|p| (p, (iteration_s - doubled_s.max(busiest_compute)).max(0.0)))
    };
    let idle = |r: &report::Report| r.bubble_fraction * r.iteration_s;
    let extra_idle = idle(&b.report) - idle(&a.report);
    let two_bubble: Vec<f64> = b.report.stages.iter().map(|st| st.bubble_s).collect();
    let r = &mut b.report;
    r.iteration_s = iteration_s;
    r.samples_per_s = s.training.global_batch as f64 / iteration_s;
    r.tokens_per_s = r.samples_per_s * s.plan.seq_len as f64;
    r.tokens_per_s_per_device = r.tokens_per_s / r.devices as f64;
    // Hardware FLOPs of one batch (the m-micro-batch run).
    r.hardware_flops_per_iteration = a.report.hardware_flops_per_iteration;
    r.hfu = a.report.hfu * a.report.iteration_s / iteration_s;
    r.hardware_flops_per_s_per_device = a.report.hardware_flops_per_s_per_device * a.report.iteration_s / iteration_s;
    // The same device classes in both runs: one batch's share, part by part.
    if r.time_breakdown.len() == a.report.time_breakdown.len() {
        for (two, one) in r.time_breakdown.iter_mut().zip(&a.report.time_breakdown) {
            *two = two.difference(one, iteration_s, stretch);
        }
    }
    r.model_flops_per_iteration = a.report.model_flops_per_iteration;
    r.compute_lower_bound_s = a.report.compute_lower_bound_s;
    r.mfu = a.report.mfu * a.report.iteration_s / iteration_s;
    r.model_flops_per_s_per_device = a.report.model_flops_per_s_per_device * a.report.iteration_s / iteration_s;
    r.network_flops_utilization = a.report.network_flops_utilization * a.report.iteration_s / iteration_s;
    r.bubble_fraction = (extra_idle / iteration_s).clamp(0.0, 1.0);
    // Per stage, one batch's share of the doubled run: its work, and the pipeline idle time
    // the extra batch added (at most what the iteration leaves).
    for (st, (one, two)) in r.stages.iter_mut().zip(a.report.stages.iter().zip(two_bubble)) {
        st.compute_busy_s = one.compute_busy_s;
        st.bubble_s = (two - one.bubble_s).clamp(0.0, iteration_s - one.compute_busy_s);
    }
    r.compute_idle_fraction = (1.0
        - r.stages.iter().map(|st| st.compute_busy_s).sum::<f64>() / (r.stages.len().max(1) as f64 * iteration_s))
        .clamp(0.0, 1.0);
    // Two weight versions (the shadow copy finishes in-flight micro-batches).
    let extra = r.memory_breakdown.weights;
    r.memory_breakdown.weights += extra;
    r.peak_memory_bytes += extra;
    for st in &mut r.stages {
        st.peak_memory_bytes += extra;
    }
    r.fits_hbm = r.stages.iter().all(|st| st.peak_memory_bytes <= r.memory_capacity_bytes - r.memory_headroom_bytes);
    r.fits = r.fits_hbm && r.fits_host && r.fits_nvme;
    r.plan.schedule = "2bw";
    r.plan.micro_batches = s.plan.micro_batches;
    r.events += a.report.events;
    Ok(b)
}

/// The engine's options for a scenario (`record`: keep every span for traces and plots).
pub fn run_options(s: &scenario::Scenario, record: bool) -> RunOptions {
    RunOptions {
        network: s.options.network,
        record,
        collective_launch_ns: duration_ns(s.cluster.node.device.kernel_launch_s),
        kernel_jitter: s.options.kernel_jitter(&s.cluster),
        kernel_jitter_correlation_s: s.options.kernel_jitter_correlation_s,
        kernel_jitter_draws: s.options.kernel_jitter_draws,
        seed: s.options.seed,
    }
}

fn simulate_once(s: &scenario::Scenario, record: bool) -> Result<Simulation, SimError> {
    let program = lower_checked(s)?;
    let inputs = engine_inputs(s, &program, record);
    let result = inputs.run(&program)?;
    Ok(finish(s, program, result))
}

/// A plan with no policy, token slicing or 2BW (those simulate more than once) is simulated in
/// four steps, which `trainsim bench` times one by one: [`lower_checked`], [`engine_inputs`],
/// [`EngineInputs::run`], [`finish`]. [`try_simulate`] takes exactly these steps for such a
/// plan, then checks the report's invariants.
///
/// Step one: the plan's program, or `TooLarge` past `lower::size::MAX_TASKS`.
pub fn lower_checked(s: &scenario::Scenario) -> Result<lower::Program, SimError> {
    let size = lower::size::estimate(s, None);
    if size.too_large() {
        let (key, message) = size.explain();
        return Err(SimError::TooLarge { key, message });
    }
    Ok(lower::lower(s))
}

/// What the engine needs besides the program: the cluster's topology and the cost model's
/// durations (see [`lower_checked`]).
pub struct EngineInputs {
    pub topology: Topology,
    pub op_ns: Vec<u64>,
    pub host_ns: engine::HostCosts,
    pub options: RunOptions,
}

/// Step two: the engine's inputs for the scenario's program.
pub fn engine_inputs(s: &scenario::Scenario, program: &lower::Program, record: bool) -> EngineInputs {
    EngineInputs {
        topology: Topology::new(&s.cluster).with_nvme_share(program.nvme_share),
        op_ns: op_durations_ns(s, program, None),
        host_ns: host_issue_ns(s, program),
        options: run_options(s, record),
    }
}

impl EngineInputs {
    /// Step three: the engine's run of the program.
    pub fn run(&self, program: &lower::Program) -> Result<engine::RunResult, SimError> {
        engine::run(program, &self.topology, &self.op_ns, &self.host_ns, self.options).map_err(SimError::Run)
    }
}

/// Step four: the report and timeline of the run.
pub fn finish(s: &scenario::Scenario, mut program: lower::Program, mut result: engine::RunResult) -> Simulation {
    // NCCL's communicator buffers are static: every peak and timeline carries them.
    for (m, &nccl) in program.static_memory.iter_mut().zip(&result.nccl_buffer_bytes) {
        m.buffers += nccl;
    }
    let report = report::build(s, &program, &result);
    let mut timeline = std::mem::take(&mut result.timeline);
    timeline.static_hbm = program.static_memory.clone();
    timeline.static_host = program.host_memory.clone();
    timeline.hbm_capacity_bytes = s.cluster.node.device.hbm_bytes;
    timeline.host_capacity_bytes = s.cluster.node.host.dram_bytes / s.cluster.node.devices as f64;
    Simulation { report, program, timeline }
}

/// Every built-in preset as one JSON value (`trainsim presets --json`, the Python package's
/// `presets()`): devices, links, nodes, fabrics and workloads, each workload with its
/// parameters beside the published count.
pub fn presets_json() -> serde_json::Value {
    use hardware::catalog;
    let workloads = workload::catalog::presets()
        .iter()
        .map(|p| {
            serde_json::json!({
                "name": p.name, "parameters": p.config.parameters(),
                "published_parameters": p.published_parameters,
                "active_parameters": p.config.moe.is_some().then(|| p.config.active_parameters()),
                "published_active_parameters": p.published_active_parameters, "config": p.config,
            })
        })
        .chain(workload::catalog::nets().into_iter().map(|(name, published, net)| {
            serde_json::json!({
                "name": name, "parameters": net.parameters(), "published_parameters": published,
                "layers": net.layers.len(),
            })
        }))
        .collect::<Vec<_>>();
    let fabrics = hardware::fabric::Fabric::presets();
    serde_json::json!({
        "devices": catalog::devices(),
        "links": catalog::links(),
        "nodes": catalog::nodes(),
        "fabrics": fabrics,
        "workloads": workloads,
    })
}
