//! The scenario file: raw JSON in, a validated [`Scenario`] out.
//!
//! This is the one place input is checked. Every error names the key path, the value and
//! what is allowed (every key is in `docs/scenario.md`); keys that name features still to come give a
//! "not supported yet" error. Files the scenario points to (a Hugging Face `config.json`)
//! are read by the caller through the `load` function, so this module does no I/O.
//!
//! One file per section, each with its parser: `options` (`simulation`), `workload`,
//! `cluster`, `training`, `plan`, `run` (`run` and `plan.freeze`); `checks` holds the checks
//! that span sections and `limits` the bounds that keep the simulation finite. [`from_value`]
//! calls them in order.

mod checks;
mod cluster;
pub mod framework;
pub mod keys;
pub mod limits;
mod options;
mod parallel;
mod plan;
mod recompute;
pub(crate) use plan::{P2P_DEFAULT, default_p2p};
pub mod reader;
mod run;
mod search;
pub mod suggest;
#[cfg(test)]
mod tests;
mod training;
mod workload;

pub use options::{
    DEFAULT_GPU_DEVICE_VARIABILITY, DEFAULT_GPU_HOST_OP_S, DEFAULT_GPU_KERNEL_JITTER, DEFAULT_GPU_MEMORY_HEADROOM,
    SimOptions, expected_max_std_normal,
};
pub use reader::{Result, ScenarioError};
pub use run::{CheckpointInterval, CheckpointSpec, FreezePolicy, FreezeSpec, RunSpec, RunVariability};
pub use search::{SEARCHED_KEYS, SearchInput, parse_for_search};
pub use training::Training;

use crate::hardware::{ClusterSpec, DeviceKind, Precision};
use crate::plan::Plan;
use crate::workload::Workload;
use reader::{Obj, invalid};
use serde::Serialize;
use serde_json::Value;

/// A validated scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    pub name: String,
    pub workload: Workload,
    pub cluster: ClusterSpec,
    pub training: Training,
    pub plan: Plan,
    pub options: SimOptions,
    /// Defaults filled in, as "key = value (why)".
    pub defaults_applied: Vec<String>,
    /// What the user should know about how the scenario is simulated (a plan outside common
    /// practice, a forced profile), one sentence each.
    pub notes: Vec<String>,
    /// Measured streaming rates per kind of memory-bound op, from a calibration profile.
    pub op_rates: Vec<(String, f64)>,
    /// A whole training run (`trainsim train-run`): dataset and epochs.
    pub run: Option<RunSpec>,
    /// A freezing policy over the run (PipeTransformer).
    pub freeze: Option<FreezeSpec>,
}

/// Rates measured on real hardware (a calibration profile), in the simulator's terms.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeasuredRates {
    /// Large-GEMM rate, FLOP/s.
    pub gemm_flops_per_s: f64,
    /// Streaming-op memory bandwidth, bytes/s.
    pub mem_bytes_per_s: f64,
    /// Fixed cost of one op.
    pub launch_s: f64,
    /// Device-to-device link inside a node, if measured.
    pub link_bytes_per_s: Option<f64>,
    pub link_latency_s: Option<f64>,
    /// Streaming rate of each kind of memory-bound op (see `cost::memory_kernel`).
    pub memory_op_bytes_per_s: Vec<(String, f64)>,
    /// Launch-to-launch spread of a kernel's time (a relative standard deviation), if the
    /// profile measured one: the scenario's `simulation.kernel_jitter` unless it gives one.
    pub kernel_jitter: Option<f64>,
    /// Seconds the device ran GEMMs back to back before that spread was timed (`None` or 0:
    /// right after a warm-up, as `trainsim calibrate` did before session 40). A GPU's spread is
    /// taken only when measured settled: just after a warm-up its clock still swings 3-6%
    /// toward its power limit, twice the settled drift the GPU default stands for.
    pub kernel_jitter_settled_s: Option<f64>,
    /// Bytes per element of the GEMMs the profile timed (4: f32, 2: bf16), if it says: its
    /// GEMM rate describes training at a precision of that size only. Profiles from before
    /// session 18 timed f32.
    pub gemm_element_bytes: Option<f64>,
    /// The device the profile was measured on, as the backend named it (e.g. "cpu thread 0",
    /// "cuda:0 (NVIDIA A100-SXM4-80GB, sm_80, 79 GiB)"), and its kind.
    pub device: String,
    pub device_kind: DeviceKind,
}

impl Scenario {
    /// The same plan with `m` micro-batches per replica, the global batch following
    /// (`m` x micro-batch x dp).
    pub fn set_micro_batches(&mut self, m: u32) {
        self.plan.micro_batches = m;
        self.training.global_batch = m * self.plan.micro_batch * self.plan.dp;
    }

    /// Why the profile `m` does not describe this scenario's device, if it does not: a
    /// profile of another kind of silicon, or of another GPU model when the profile names
    /// one. Applying it anyway needs the user's explicit consent.
    pub fn profile_mismatch(&self, m: &MeasuredRates) -> Option<String> {
        let d = &self.cluster.node.device;
        if d.kind != m.device_kind {
            return Some(format!(
                "the profile was measured on a {:?} ({}) and the scenario's device {} is a {:?}",
                m.device_kind, m.device, d.name, d.kind
            ));
        }
        // GPU presets are named by model first ("a100-sxm-80gb"); CUDA names the model too.
        let family = d.name.split(['-', '_', ' ']).next().unwrap_or("").to_ascii_lowercase();
        let measured = m.device.to_ascii_lowercase();
        let names_model = measured.contains("nvidia") || measured.contains("amd");
        (d.kind == DeviceKind::Gpu && names_model && !family.is_empty() && !measured.contains(&family))
            .then(|| format!("the profile was measured on {} and the scenario's device is {}", m.device, d.name))
    }

    /// Replace the device's and intra-node link's defaults by measured rates.
    pub fn calibrate(&mut self, m: &MeasuredRates) {
        let d = &mut self.cluster.node.device;
        let precision = self.training.precision;
        let peak = d.peak_flops.at(precision);
        let measured_bytes = m.gemm_element_bytes.unwrap_or(4.0);
        // fp8 GEMMs run at another rate than the 2-byte ones a GPU profile times.
        let gemm_bytes = if precision == Precision::Fp8 { 1.0 } else { precision.activation_bytes() };
        // A CPU computes every precision in f32 (so does the executor's CPU backend): its rate
        // applies whatever the training precision.
        let gemm_applies = m.device_kind != DeviceKind::Gpu || (measured_bytes - gemm_bytes).abs() < 0.5;
        if !gemm_applies {
            self.notes.push(format!(
                "the profile's GEMM rate was measured with {measured_bytes}-byte elements and the GEMMs run in {} \
                 ({gemm_bytes}-byte): the preset's GEMM efficiency is kept",
                precision.name()
            ));
        }
        // A machine that measures faster than its preset's peak (a CPU preset is a guess at
        // a class of machines) gets the measured rate as its peak: MFU stays below 1.
        if gemm_applies && m.gemm_flops_per_s > peak {
            d.peak_flops.set(precision, m.gemm_flops_per_s);
            self.notes.push(format!(
                "the device's {} peak was raised to the profile's measured GEMM rate, {:.3e} FLOP/s (the preset said {peak:.3e})",
                precision.name(),
                m.gemm_flops_per_s
            ));
        }
        let peak = d.peak_flops.at(precision);
        if gemm_applies && peak > 0.0 {
            // An fp8 rate is the fp8 GEMMs'; the GEMMs that stay 16-bit keep the preset's.
            if precision == Precision::Fp8 && d.kind == DeviceKind::Gpu {
                d.fp8_gemm_efficiency = Some(m.gemm_flops_per_s / peak);
            } else {
                d.gemm_efficiency = m.gemm_flops_per_s / peak;
            }
        }
        d.mem_efficiency = m.mem_bytes_per_s / d.mem_bandwidth_bytes_per_s;
        d.kernel_launch_s = m.launch_s;
        self.op_rates = m.memory_op_bytes_per_s.clone();
        let settled = m.device_kind != DeviceKind::Gpu || m.kernel_jitter_settled_s.is_some_and(|s| s > 0.0);
        let spread = m.kernel_jitter.filter(|j| j.is_finite() && *j > 0.0 && self.options.kernel_jitter.is_none());
        match spread {
            Some(j) if !settled => self.notes.push(format!(
                "the profile's kernel spread ({:.2}%) was timed right after a warm-up, while a GPU's clock still swings \
                 toward its power limit; the settled default is kept (calibrate again to measure it settled)",
                100.0 * j
            )),
            Some(j) => {
                let j = j.min(1.0);
                self.options.kernel_jitter = Some(j);
                self.defaults_applied.retain(|d| !d.starts_with("simulation.kernel_jitter ="));
                self.notes.push(format!(
                    "simulation.kernel_jitter = {j:.4} from the profile (the spread of repeated runs of one GEMM on {})",
                    m.device
                ));
            }
            None => {}
        }
        d.source = format!("{} (calibrated)", d.source);
        if let (Some(bw), Some(lat), Some(link)) =
            (m.link_bytes_per_s, m.link_latency_s, self.cluster.node.intra_node.as_mut())
        {
            link.bandwidth_bytes_per_s = bw;
            link.latency_s = lat;
            link.efficiency = 1.0;
            link.source = "calibrated".into();
        }
    }
}

/// A node as `cluster.node` takes it (a preset's name, or an object: a preset's values
/// overridden, or all given), from JSON text, held to a scenario node's limits on its links,
/// NICs and devices: what `trainsim nccl-test --node FILE` reads.
pub fn parse_node(text: &str) -> Result<crate::hardware::NodeSpec> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid("(file)", format!("not valid JSON: {e}")))?;
    let node = cluster::parse_node(&v, "node")?;
    limits::device_count(1, node.devices, "node.devices")?;
    limits::check_node_links(&node, "node")?;
    limits::check_link(&node.nic, "node.nic")?;
    Ok(node)
}

/// Parse and validate a scenario from its JSON text. `load` reads a file named in it.
pub fn parse(text: &str, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<Scenario> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid("(file)", format!("not valid JSON: {e}")))?;
    from_value(&v, load)
}

/// Validate a scenario's JSON value, section by section (`run`, `workload`, `cluster`,
/// `training`, `plan`, `plan.freeze`, `simulation`), then the limits on the whole.
pub fn from_value(v: &Value, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<Scenario> {
    let root = Obj::new(v, "")?;
    root.only(keys::ROOT)?;
    let mut defaults = Vec::new();
    let mut run = run::parse_run(&root, &mut defaults)?;
    let name = root.string("name")?.unwrap_or("unnamed scenario").to_string();
    let workload = workload::parse_workload(&root.req("workload", Obj::obj)?, load)?;
    let cluster = cluster::parse_cluster(&root.req("cluster", Obj::obj)?)?;
    let training = training::parse_training(&root.req("training", Obj::obj)?, &workload, &mut defaults)?;
    if let Some(r) = run.as_mut() {
        run::resolve_length(r, training.global_batch, training.seq_len)?;
    }
    checks::check_fp8(&cluster, &training)?;
    checks::check_attention(&cluster, &training)?;
    let plan_obj = root.req("plan", Obj::obj)?;
    let plan = plan::parse_plan(&plan_obj, &workload, &cluster, &training, &mut defaults)?;
    let freeze = run::parse_freeze(&plan_obj, &workload, run.as_ref(), load)?;
    if freeze.is_some() {
        run::check_elastic(&plan_obj, &plan, &cluster)?;
    }
    let notes = checks::plan_notes(&plan, &cluster, &workload);
    let mut options = options::parse_options(root.obj("simulation")?)?;
    if let Some(r) = &run {
        run::share_kernel_jitter(r, &mut options)?;
    }
    option_defaults(&options, &cluster, &mut defaults);
    let scenario = Scenario {
        name,
        workload,
        cluster,
        training,
        plan,
        options,
        defaults_applied: defaults,
        notes,
        op_rates: Vec::new(),
        run,
        freeze,
    };
    limits::check(&scenario)?;
    Ok(scenario)
}

/// The defaults of `simulation` worth saying (a GPU's memory headroom and speed spread).
fn option_defaults(options: &SimOptions, cluster: &ClusterSpec, defaults: &mut Vec<String>) {
    if options.memory_headroom.is_none() && cluster.has_kind(DeviceKind::Gpu) {
        defaults.push(format!(
            "simulation.memory_headroom = {DEFAULT_GPU_MEMORY_HEADROOM} (GPU memory kept free for the caching allocator)"
        ));
    }
    if options.device_variability.is_none() && cluster.has_kind(DeviceKind::Gpu) && cluster.device_count() > 1 {
        defaults.push(format!(
            "simulation.device_variability = {} (GPU speed spread; every step waits for the slowest device)",
            options::DEFAULT_GPU_DEVICE_VARIABILITY
        ));
    }
    if options.kernel_jitter.is_none() && cluster.has_kind(DeviceKind::Gpu) && cluster.device_count() > 1 {
        defaults.push(format!(
            "simulation.kernel_jitter = {} (GPU kernel speed drift, correlated over {} s; each collective waits for its slowest member)",
            options::DEFAULT_GPU_KERNEL_JITTER,
            options.kernel_jitter_correlation_s
        ));
    }
}
