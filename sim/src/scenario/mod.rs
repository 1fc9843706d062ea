//! The scenario file: raw JSON in, a validated [`Scenario`] out.
//!
//! This is the one place input is checked. Every error names the key path, the value and
//! what is allowed (every key is in `docs/scenario.md`); keys that name features still to come give a
//! "not supported yet" error. Files the scenario points to (a Hugging Face `config.json`)
//! are read by the caller through the `load` function, so this module does no I/O.

pub mod framework;
pub mod keys;
pub mod limits;
pub mod reader;
pub mod suggest;
#[cfg(test)]
mod tests;

use crate::hardware::{
    ClusterSpec, DeviceKind, DeviceSpec, FpgaFabric, LinkSpec, NodeSpec, PeakFlops, Precision, catalog,
};
use crate::plan::{Offload, Optimizer, PartitionPolicy, Plan, Recompute, Tier, TokenSlices, parse_schedule};
use crate::schedule::{self, ScheduleKind, ScheduleShape};
use crate::workload::{self, TpMode, Workload};
use reader::{Obj, invalid, show};
pub use reader::{Result, ScenarioError};
use serde::Serialize;
use serde_json::Value;
use suggest::did_you_mean;

/// How the engine models the interconnect and which devices it simulates.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimOptions {
    pub network: crate::network::NetworkKind,
    /// Simulate one data-parallel replica and mirror it, where that is exact.
    pub symmetry: bool,
    /// Device memory the framework holds besides tensors (CUDA context, library
    /// workspaces); `None`: the device kind's default (see [`SimOptions::framework_bytes`]).
    pub framework_overhead_bytes: Option<u64>,
    /// Host (framework) time to issue one op; `None`: the device kind's default (see
    /// [`SimOptions::host_op_s`]).
    pub host_op_s: Option<f64>,
    /// Fraction of each device's memory kept free for the allocator's fragmentation and
    /// reserve; `None`: the device kind's default (see [`SimOptions::headroom_bytes`]).
    pub memory_headroom: Option<f64>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            network: crate::network::NetworkKind::MaxMinFair,
            symmetry: true,
            framework_overhead_bytes: None,
            host_op_s: None,
            memory_headroom: None,
        }
    }
}

/// Default fraction of a GPU's memory a plan must leave free: PyTorch's caching allocator
/// holds memory it cannot hand out (split blocks, rounding). GMLake (Guo et al., ASPLOS 2024)
/// measured on average 9.2 GB of such fragmentation over eight LLM training setups on
/// A100-80GB (11.5%, with recompute/offload/ZeRO, which fragment more); 10% is kept here.
pub const DEFAULT_GPU_MEMORY_HEADROOM: f64 = 0.10;

/// Default host time to issue one modelled op on a GPU from an eager framework (see
/// [`SimOptions::host_op_s`]).
pub const DEFAULT_GPU_HOST_OP_S: f64 = 10e-6;

impl SimOptions {
    /// The framework allowance on `device`: 0.5 GiB on a GPU by default (a PyTorch CUDA context
    /// with cuBLAS and NCCL workspaces is 0.3-0.6 GiB; allocator fragmentation is not
    /// included), nothing on FPGAs and CPUs.
    pub fn framework_bytes(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.framework_overhead_bytes {
            Some(b) => b as f64,
            None if device.kind == DeviceKind::Gpu => 0.5 * 1024f64.powi(3),
            None => 0.0,
        }
    }

    /// The memory fraction kept free on `device`: [`DEFAULT_GPU_MEMORY_HEADROOM`] on GPUs,
    /// none on FPGAs (statically allocated buffers) and CPU devices, unless set.
    pub fn headroom_fraction(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.memory_headroom {
            Some(h) => h,
            None if device.kind == DeviceKind::Gpu => DEFAULT_GPU_MEMORY_HEADROOM,
            None => 0.0,
        }
    }

    /// The memory a plan may fill on `device`: its capacity less the allocator headroom.
    pub fn usable_bytes(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        device.hbm_bytes * (1.0 - self.headroom_fraction(device))
    }

    /// Host time to issue one op on `device` (a GEMM's backward is two). An eager framework's
    /// host thread runs Python, the dispatcher and autograd bookkeeping, then launches the
    /// kernel; it runs ahead of the GPU except where it waits for a pipeline receive or a
    /// gradient reduction, so this bounds only streams of short kernels. GPU default:
    /// [`DEFAULT_GPU_HOST_OP_S`]; FPGAs and CPU devices (whose own time includes it): 0.
    pub fn host_op_s(&self, device: &crate::hardware::DeviceSpec) -> f64 {
        match self.host_op_s {
            Some(s) => s,
            None if device.kind == DeviceKind::Gpu => DEFAULT_GPU_HOST_OP_S,
            None => 0.0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Training {
    /// Fused (a FlashAttention generation) or materialised attention, as written; `None`:
    /// the framework's ([`Plan::attention`] holds the one simulated).
    pub attention: Option<crate::hardware::kernels::Attention>,
    pub global_batch: u32,
    pub micro_batch: u32,
    pub seq_len: u32,
    pub precision: Precision,
    pub optimizer: Optimizer,
    /// `training.framework` as written (resolved against the plan in [`Plan::framework`]).
    #[serde(skip)]
    pub framework: Option<framework::FrameworkSpec>,
}

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

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSpec {
    pub dataset_samples: u64,
    pub epochs: u32,
}

/// Which layers are frozen in each epoch.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FreezePolicy {
    /// AutoFreeze's closed form with this alpha.
    Autofreeze { alpha: f64 },
    /// The gradient-norm rule over a per-layer gradient trace (epoch x layer).
    Gradient { trace: Vec<Vec<f64>> },
    /// Frozen layers given per epoch.
    Schedule { frozen_layers: Vec<u32> },
}

/// `plan.freeze`: the policy, and which of PipeTransformer's system parts are on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FreezeSpec {
    pub policy: FreezePolicy,
    pub auto_pipe: bool,
    pub auto_dp: bool,
    pub auto_cache: bool,
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
    /// The device the profile was measured on, as the backend named it (e.g. "cpu thread 0",
    /// "cuda:0 (NVIDIA A100-SXM4-80GB, sm_80, 79 GiB)"), and its kind.
    pub device: String,
    pub device_kind: DeviceKind,
}

impl Scenario {
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
        // A machine that measures faster than its preset's peak (a CPU preset is a guess at
        // a class of machines) gets the measured rate as its peak: MFU stays below 1.
        if m.gemm_flops_per_s > peak {
            d.peak_flops.set(precision, m.gemm_flops_per_s);
            self.notes.push(format!(
                "the device's {} peak was raised to the profile's measured GEMM rate, {:.3e} FLOP/s (the preset said {peak:.3e})",
                precision.name(),
                m.gemm_flops_per_s
            ));
        }
        let peak = d.peak_flops.at(precision);
        if peak > 0.0 {
            d.gemm_efficiency = m.gemm_flops_per_s / peak;
        }
        d.mem_efficiency = m.mem_bytes_per_s / d.mem_bandwidth_bytes_per_s;
        d.kernel_launch_s = m.launch_s;
        self.op_rates = m.memory_op_bytes_per_s.clone();
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


/// Parse and validate a scenario from its JSON text. `load` reads a file named in it.
pub fn parse(text: &str, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<Scenario> {
    let v: Value = serde_json::from_str(text).map_err(|e| invalid("(file)", format!("not valid JSON: {e}")))?;
    from_value(&v, load)
}

pub fn from_value(v: &Value, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<Scenario> {
    let root = Obj::new(v, "")?;
    root.only(keys::ROOT)?;
    let run = match root.obj("run")? {
        None => None,
        Some(r) => {
            r.only(keys::RUN)?;
            let samples = match r.get("dataset_samples") {
                Some(v) => v.as_u64().filter(|n| *n > 0).ok_or_else(|| {
                    invalid(&r.key("dataset_samples"), format!("expected a positive integer, got {}", show(v)))
                })?,
                None => return Err(invalid(&r.key("dataset_samples"), "required key is missing")),
            };
            Some(RunSpec { dataset_samples: samples, epochs: r.req("epochs", Obj::uint)? })
        }
    };
    let mut defaults = Vec::new();
    let name = root.string("name")?.unwrap_or("unnamed scenario").to_string();
    let workload = parse_workload(&root.req("workload", Obj::obj)?, load)?;
    let cluster = parse_cluster(&root.req("cluster", Obj::obj)?)?;
    let training = parse_training(&root.req("training", Obj::obj)?, &workload, &mut defaults)?;
    check_fp8(&cluster, &training)?;
    let plan_obj = root.req("plan", Obj::obj)?;
    let plan = parse_plan(&plan_obj, &workload, &cluster, &training, &mut defaults)?;
    let freeze = parse_freeze(&plan_obj, &workload, run.as_ref(), load)?;
    if freeze.is_some() {
        check_elastic(&plan_obj, &plan, &cluster)?;
    }
    let mut notes = Vec::new();
    if plan.tp > cluster.node.devices {
        notes.push(format!(
            "tensor parallelism of {} spans {} nodes of {} devices: its collectives cross the inter-node \
             network on every layer (as Colossal-AI's 2D/2.5D/3D modes run over 16-64 GPUs); Megatron-LM \
             keeps tp inside a node",
            plan.tp,
            plan.tp.div_ceil(cluster.node.devices),
            cluster.node.devices
        ));
    }
    let options = parse_options(root.obj("simulation")?)?;
    if options.memory_headroom.is_none() && cluster.has_kind(DeviceKind::Gpu) {
        defaults.push(format!(
            "simulation.memory_headroom = {DEFAULT_GPU_MEMORY_HEADROOM} (GPU memory kept free for the caching allocator)"
        ));
    }
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

/// fp8 training needs fp8 matrix units on every device class: a device without them would
/// silently run at its bf16 rate while the report claimed fp8.
fn check_fp8(cluster: &ClusterSpec, training: &Training) -> Result<()> {
    if training.precision != Precision::Fp8 {
        return Ok(());
    }
    match cluster.classes().find(|d| d.peak_flops.fp8.is_none()) {
        None => Ok(()),
        Some(d) => Err(invalid(
            "training.precision",
            format!(
                "\"fp8\" needs fp8 tensor cores, and device {} has no fp8 peak; use \"bf16\" or \"fp16\", \
                 or a device with fp8 (H100, H200, B200, MI300X), or give the device a peak_flops.fp8",
                d.name
            ),
        )),
    }
}

fn parse_options(o: Option<Obj>) -> Result<SimOptions> {
    let mut opts = SimOptions::default();
    if let Some(o) = o {
        o.only(keys::SIMULATION)?;
        if let Some(h) = o.non_negative("memory_headroom")? {
            if h >= 0.9 {
                return Err(invalid(
                    &o.key("memory_headroom"),
                    format!("{h} leaves almost no memory; expected a fraction of device memory in [0, 0.9)"),
                ));
            }
            opts.memory_headroom = Some(h);
        }
        if let Some(b) = o.non_negative("framework_overhead_bytes")? {
            opts.framework_overhead_bytes = Some(b.round() as u64);
        }
        if let Some(h) = o.non_negative("host_op_s")? {
            opts.host_op_s = Some(h);
        }
        if let Some(n) = o.choice("network", &crate::network::NetworkKind::NAMES, crate::network::NetworkKind::parse)? {
            opts.network = n;
        }
        if let Some(s) = o.boolean("symmetry")? {
            opts.symmetry = s;
        }
    }
    Ok(opts)
}

fn parse_workload(o: &Obj, load: &dyn Fn(&str) -> std::result::Result<String, String>) -> Result<Workload> {
    o.only(keys::WORKLOAD)?;
    let given = ["preset", "transformer", "hf_config"].iter().filter(|k| o.has(k)).count();
    if given != 1 {
        return Err(invalid(&o.path, "give exactly one of: preset, transformer, hf_config"));
    }
    if let Some(p) = o.string("preset")? {
        return workload::catalog::workload(p).ok_or_else(|| {
            invalid(
                &o.key("preset"),
                format!(
                    "\"{p}\" is not a workload preset{}; presets: {}",
                    did_you_mean(p, workload::catalog::names()),
                    workload::catalog::names().join(", ")
                ),
            )
        });
    }
    if let Some(path) = o.string("hf_config")? {
        let text = load(path).map_err(|e| invalid(&o.key("hf_config"), format!("cannot read \"{path}\": {e}")))?;
        let name = o.string("name")?.unwrap_or(path);
        if let Some(experts) = workload::hf::mixture_of_experts(&text) {
            return Err(reader::unsupported(
                &o.key("hf_config"),
                format!(
                    "\"{path}\" is a mixture-of-experts model ({experts}); experts (routing, all-to-all, \
                     expert parallelism) are not modelled yet, and simulating it as a dense model would be wrong"
                ),
            ));
        }
        return workload::hf::parse(name, &text).map_err(|e| invalid(&o.key("hf_config"), format!("\"{path}\": {e}")));
    }
    let t = o.req("transformer", Obj::obj)?;
    t.only(keys::TRANSFORMER)?;
    let layers = t.req("layers", Obj::uint)?;
    let hidden = t.req("hidden", Obj::uint)?;
    let heads = t.req("heads", Obj::uint)?;
    let vocab = t.req("vocab", Obj::uint)?;
    if hidden % heads != 0 {
        return Err(invalid(
            &t.key("heads"),
            format!("{heads} does not divide hidden {hidden}; allowed: a divisor of hidden"),
        ));
    }
    let mut cfg =
        workload::TransformerConfig::gpt(layers, hidden, heads, vocab, t.count("max_positions")?.unwrap_or(0));
    if let Some(f) = t.uint("ffn_hidden")? {
        cfg.ffn_hidden = f;
    }
    if let Some(kv) = t.uint("kv_heads")? {
        if heads % kv != 0 {
            return Err(invalid(
                &t.key("kv_heads"),
                format!("{kv} does not divide heads {heads}; allowed: a divisor of heads"),
            ));
        }
        cfg.kv_heads = kv;
    }
    use workload::transformer::{Mlp, Norm};
    if let Some(m) = t.choice("mlp", keys::MLP, |s| match s {
        "gelu" => Some(Mlp::Gelu),
        "swiglu" => Some(Mlp::SwiGlu),
        _ => None,
    })? {
        cfg.mlp = m;
    }
    if let Some(n) = t.choice("norm", keys::NORM, |s| match s {
        "layernorm" => Some(Norm::LayerNorm),
        "rmsnorm" => Some(Norm::RmsNorm),
        _ => None,
    })? {
        cfg.norm = n;
    }
    cfg.causal = t.boolean("causal")?.unwrap_or(true);
    cfg.bias = t.boolean("bias")?.unwrap_or(cfg.bias);
    cfg.dropout = t.boolean("dropout")?.unwrap_or(cfg.dropout);
    cfg.tied_embeddings = t.boolean("tied_embeddings")?.unwrap_or(cfg.tied_embeddings);
    let name = o.string("name")?.unwrap_or("custom transformer");
    Ok(Workload::transformer(&format!("{name} ({layers} layers, h={hidden})"), cfg))
}

fn parse_link(v: &Value, path: &str) -> Result<LinkSpec> {
    if let Value::String(name) = v {
        return catalog::link_preset(name).ok_or_else(|| {
            let names: Vec<String> = catalog::links().into_iter().map(|l| l.name).collect();
            let hint = did_you_mean(name, names.iter().map(String::as_str));
            invalid(path, format!("\"{name}\" is not a link preset{hint}; presets: {}", names.join(", ")))
        });
    }
    let o = Obj::new(v, path)?;
    o.only(keys::LINK)?;
    let mut link = match o.string("preset")? {
        Some(p) => parse_link(&Value::String(p.into()), &o.key("preset"))?,
        None => LinkSpec {
            name: "custom link".into(),
            bandwidth_bytes_per_s: o.req("bandwidth_bytes_per_s", Obj::positive)?,
            latency_s: 0.0,
            efficiency: 1.0,
            source: "scenario file".into(),
        },
    };
    if let Some(b) = o.positive("bandwidth_bytes_per_s")? {
        link.bandwidth_bytes_per_s = b;
    }
    if let Some(l) = o.non_negative("latency_s")? {
        link.latency_s = l;
    }
    if let Some(e) = o.fraction("efficiency")? {
        link.efficiency = e;
    }
    if let Some(n) = o.string("name")? {
        link.name = n.into();
    }
    Ok(link)
}

fn parse_device(v: &Value, path: &str) -> Result<DeviceSpec> {
    if let Value::String(name) = v {
        return catalog::device(name).ok_or_else(|| {
            let names: Vec<String> = catalog::devices().into_iter().map(|d| d.name).collect();
            let hint = did_you_mean(name, names.iter().map(String::as_str));
            invalid(path, format!("\"{name}\" is not a device preset{hint}; presets: {}", names.join(", ")))
        });
    }
    let o = Obj::new(v, path)?;
    o.only(keys::DEVICE)?;
    let mut d = match o.string("preset")? {
        Some(p) => parse_device(&Value::String(p.into()), &o.key("preset"))?,
        None => DeviceSpec {
            name: "custom device".into(),
            kind: DeviceKind::Gpu,
            peak_flops: PeakFlops::default(),
            hbm_bytes: o.req("hbm_bytes", Obj::positive)?,
            mem_bandwidth_bytes_per_s: o.req("mem_bandwidth_bytes_per_s", Obj::positive)?,
            compute_units: 1,
            gemm_efficiency: 0.8,
            mem_efficiency: 0.85,
            kernel_launch_s: 3e-6,
            fpga: None,
            op_efficiency: Vec::new(),
            source: "scenario file".into(),
        },
    };
    if let Some(k) = o.choice("kind", keys::DEVICE_KINDS, |s| match s {
        "gpu" => Some(DeviceKind::Gpu),
        "fpga" => Some(DeviceKind::Fpga),
        "cpu" => Some(DeviceKind::Cpu),
        _ => None,
    })? {
        d.kind = k;
    }
    if o.has("dsp_count") || o.has("clock_hz") {
        let fabric = FpgaFabric {
            dsp_count: o.req("dsp_count", Obj::positive)?,
            clock_hz: o.req("clock_hz", Obj::positive)?,
            ops_per_dsp_per_cycle: o.positive("ops_per_dsp_per_cycle")?.unwrap_or(1.0),
            sram_bytes: o.non_negative("sram_bytes")?.unwrap_or(0.0),
        };
        let p = fabric.peak_flops();
        d.kind = DeviceKind::Fpga;
        d.peak_flops = PeakFlops { fp32: Some(0.4 * p), fp16: Some(p), bf16: Some(p), fp8: Some(2.0 * p) };
        d.fpga = Some(fabric);
    }
    match o.get("peak_flops") {
        None => {}
        Some(Value::Number(_)) => {
            let p = o.positive("peak_flops")?.unwrap_or(0.0);
            d.peak_flops = PeakFlops { fp32: Some(p), fp16: Some(p), bf16: Some(p), fp8: Some(p) };
        }
        Some(_) => {
            let po = o.req("peak_flops", Obj::obj)?;
            po.only(keys::PEAK_FLOPS)?;
            d.peak_flops = PeakFlops {
                fp32: po.positive("fp32")?,
                fp16: po.positive("fp16")?,
                bf16: po.positive("bf16")?,
                fp8: po.positive("fp8")?,
            };
        }
    }
    if d.peak_flops.at(Precision::Fp32) <= 0.0 && d.peak_flops.fp16.is_none() && d.peak_flops.bf16.is_none() {
        return Err(invalid(
            &o.key("peak_flops"),
            "required: a number, or an object with fp32/fp16/bf16/fp8 rates in FLOP/s (or dsp_count and clock_hz for an FPGA)",
        ));
    }
    if let Some(x) = o.positive("hbm_bytes")? {
        d.hbm_bytes = x;
    }
    if let Some(x) = o.positive("mem_bandwidth_bytes_per_s")? {
        d.mem_bandwidth_bytes_per_s = x;
    }
    if let Some(x) = o.uint("compute_units")? {
        d.compute_units = x;
    }
    if let Some(x) = o.fraction("gemm_efficiency")? {
        d.gemm_efficiency = x;
    }
    if let Some(x) = o.fraction("mem_efficiency")? {
        d.mem_efficiency = x;
    }
    if let Some(x) = o.non_negative("kernel_launch_s")? {
        d.kernel_launch_s = x;
    }
    if let Some(n) = o.string("name")? {
        d.name = n.into();
    }
    if let Some(eff) = o.obj("op_efficiency")? {
        let mut v = Vec::new();
        for name in eff.map.keys() {
            v.push((name.clone(), eff.fraction(name)?.unwrap_or(1.0)));
        }
        d.op_efficiency = v;
    }
    Ok(d)
}

fn parse_node(v: &Value, path: &str) -> Result<NodeSpec> {
    if let Value::String(name) = v {
        return catalog::node_preset(name).ok_or_else(|| {
            let names: Vec<String> = catalog::nodes().into_iter().map(|n| n.name).collect();
            let hint = did_you_mean(name, names.iter().map(String::as_str));
            invalid(path, format!("\"{name}\" is not a node preset{hint}; presets: {}", names.join(", ")))
        });
    }
    let o = Obj::new(v, path)?;
    o.only(keys::NODE)?;
    let mut n = match o.string("preset")? {
        Some(p) => parse_node(&Value::String(p.into()), &o.key("preset"))?,
        None => NodeSpec {
            name: "custom node".into(),
            device: parse_device(
                o.get("device").ok_or_else(|| invalid(&o.key("device"), "required key is missing"))?,
                &o.key("device"),
            )?,
            devices: o.req("devices", Obj::uint)?,
            intra_node: None,
            nics: 1,
            nic: catalog::link_preset("ib-hdr").expect("preset"),
            host: crate::hardware::HostSpec {
                dram_bytes: 512.0 * 1024f64.powi(3),
                pcie: catalog::link_preset("pcie4").expect("preset"),
                cpu: Some(catalog::host_cpu()),
                nvme_bytes: 15e12,
                nvme_bandwidth_bytes_per_s: 25e9,
            },
        },
    };
    if let Some(d) = o.get("device") {
        n.device = parse_device(d, &o.key("device"))?;
    }
    if let Some(d) = o.uint("devices")? {
        n.devices = d;
    }
    if o.has("intra_node") {
        n.intra_node = o.get("intra_node").map(|l| parse_link(l, &o.key("intra_node"))).transpose()?;
    }
    if n.devices > 1 && n.intra_node.is_none() {
        return Err(invalid(
            &o.key("intra_node"),
            format!(
                "a node of {} devices needs a link between them (a link preset or {{\"bandwidth_bytes_per_s\", \"latency_s\"}})",
                n.devices
            ),
        ));
    }
    if let Some(k) = o.uint("nics")? {
        n.nics = k;
    }
    if let Some(l) = o.get("nic") {
        n.nic = parse_link(l, &o.key("nic"))?;
    }
    if let Some(l) = o.get("pcie") {
        n.host.pcie = parse_link(l, &o.key("pcie"))?;
    }
    if let Some(b) = o.positive("host_dram_bytes")? {
        n.host.dram_bytes = b;
    }
    if let Some(s) = o.string("name")? {
        n.name = s.into();
    }
    Ok(n)
}

fn parse_cluster(o: &Obj) -> Result<ClusterSpec> {
    o.only(keys::CLUSTER)?;
    let node_v = o
        .get("node")
        .ok_or_else(|| invalid(&o.key("node"), "required key is missing (a node preset or a node description)"))?;
    let mut node = parse_node(node_v, &o.key("node"))?;
    let nodes = o.req("nodes", Obj::uint)?;
    limits::device_count(nodes, node.devices, &o.key("nodes"))?;
    if let Some(l) = o.get("inter_node") {
        node.nic = parse_link(l, &o.key("inter_node"))?;
        if let Some(k) =
            Obj::new(l, &o.key("inter_node")).ok().and_then(|lo| lo.map.get("nics").and_then(Value::as_u64))
        {
            node.nics = u32::try_from(k).ok().filter(|k| (1..=limits::MAX_NICS).contains(k)).ok_or_else(|| {
                invalid(&format!("{}.nics", o.key("inter_node")), format!("{k}; allowed: 1 to {}", limits::MAX_NICS))
            })?;
        }
    }
    let mut cluster = ClusterSpec::new(node, nodes);
    if let Some(v) = o.get("device_overrides") {
        let key = o.key("device_overrides");
        let items = v.as_array().ok_or_else(|| {
            invalid(
                &key,
                format!("expected a list of {{\"devices\": [first, last], \"device\": ...}}, got {}", show(v)),
            )
        })?;
        for (i, it) in items.iter().enumerate() {
            let io = Obj::new(it, &format!("{key}[{i}]"))?;
            io.only(keys::DEVICE_OVERRIDE)?;
            let range = io
                .get("devices")
                .and_then(Value::as_array)
                .filter(|a| a.len() == 2)
                .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)));
            let (first, last) =
                range.filter(|(a, b)| a <= b && *b < cluster.device_count() as u64).ok_or_else(|| {
                    invalid(
                        &io.key("devices"),
                        format!("expected [first, last] device ids within 0..{}", cluster.device_count()),
                    )
                })?;
            let dv = io.get("device").ok_or_else(|| invalid(&io.key("device"), "required key is missing"))?;
            let device = parse_device(dv, &io.key("device"))?;
            cluster.overrides.push(crate::hardware::DeviceOverride {
                first: first as u32,
                count: (last - first + 1) as u32,
                device,
            });
        }
    }
    Ok(cluster)
}

fn parse_training(o: &Obj, w: &Workload, defaults: &mut Vec<String>) -> Result<Training> {
    o.only(keys::TRAINING)?;
    let global_batch = o.req("global_batch", Obj::uint)?;
    let micro_batch = o.uint("micro_batch")?.unwrap_or_else(|| {
        defaults.push("training.micro_batch = 1".into());
        1
    });
    let mut seq_len = o.req("seq_len", Obj::uint)?;
    if let Some(fixed) = w.fixed_seq_len()
        && fixed != seq_len
    {
        let why =
            if w.net.is_some() { "tokens per sample of the workload" } else { "the workload's patches + class token" };
        defaults.push(format!("training.seq_len = {fixed} ({why}; {seq_len} was given)"));
        seq_len = fixed;
    }
    let precision = o.choice("precision", &Precision::NAMES, Precision::parse)?.unwrap_or_else(|| {
        defaults.push("training.precision = bf16".into());
        Precision::Bf16
    });
    let optimizer = o.choice("optimizer", &Optimizer::NAMES, Optimizer::parse)?.unwrap_or_else(|| {
        defaults.push("training.optimizer = adam".into());
        Optimizer::Adam
    });
    if micro_batch > global_batch {
        return Err(invalid(
            &o.key("micro_batch"),
            format!("{micro_batch} is larger than global_batch {global_batch}"),
        ));
    }
    // Absent: the framework's (resolved with the plan).
    let attention = o.choice("attention", keys::ATTENTION, crate::hardware::kernels::Attention::parse)?;
    let framework = framework::parse(o)?;
    Ok(Training { attention, global_batch, micro_batch, seq_len, precision, optimizer, framework })
}

/// `plan.freeze`: {"policy": "autofreeze", "alpha": a} | {"policy": "gradient", "trace": FILE}
/// | {"policy": "schedule", "frozen_layers": [...]}, with "auto_pipe", "auto_dp", "auto_cache"
/// (default true).
fn parse_freeze(
    o: &Obj,
    w: &Workload,
    run: Option<&RunSpec>,
    load: &dyn Fn(&str) -> std::result::Result<String, String>,
) -> Result<Option<FreezeSpec>> {
    let Some(f) = o.obj("freeze")? else { return Ok(None) };
    if w.net.is_some() {
        return Err(invalid(
            &f.path,
            format!("freezing is modelled for transformers; \"{}\" is a network of distinct layers", w.name),
        ));
    }
    f.only(keys::FREEZE)?;
    let layers = w.transformer.layers;
    let policy = match f.req("policy", Obj::string)? {
        "autofreeze" => {
            let alpha = f.req("alpha", Obj::positive)?;
            if alpha >= 1.0 {
                return Err(invalid(&f.key("alpha"), format!("{alpha} is not in (0, 1)")));
            }
            FreezePolicy::Autofreeze { alpha }
        }
        "gradient" => {
            let path = f.req("trace", Obj::string)?;
            let text = load(path).map_err(|e| invalid(&f.key("trace"), format!("cannot read \"{path}\": {e}")))?;
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| invalid(&f.key("trace"), format!("\"{path}\" is not JSON: {e}")))?;
            let rows = v.get("grad_l1").unwrap_or(&v);
            let trace: Option<Vec<Vec<f64>>> = rows.as_array().and_then(|a| {
                a.iter().map(|r| r.as_array().and_then(|c| c.iter().map(Value::as_f64).collect())).collect()
            });
            let trace = trace.filter(|t| !t.is_empty() && t.iter().all(|r| r.len() == layers as usize)).ok_or_else(|| {
                invalid(&f.key("trace"), format!("\"{path}\" must hold an array of epochs, each an array of {layers} per-layer gradient norms (or {{\"grad_l1\": ...}})"))
            })?;
            FreezePolicy::Gradient { trace }
        }
        "schedule" => {
            let v =
                f.get("frozen_layers").ok_or_else(|| invalid(&f.key("frozen_layers"), "required with \"schedule\""))?;
            let l: Option<Vec<u32>> =
                v.as_array().and_then(|a| a.iter().map(|x| x.as_u64().map(|n| n as u32)).collect());
            let l = l.filter(|l| l.windows(2).all(|w| w[0] <= w[1]) && l.iter().all(|&n| n <= layers)).ok_or_else(
                || {
                    invalid(
                        &f.key("frozen_layers"),
                        format!(
                            "expected non-decreasing counts of frozen layers, each at most {layers}, got {}",
                            show(v)
                        ),
                    )
                },
            )?;
            FreezePolicy::Schedule { frozen_layers: l }
        }
        other => {
            return Err(invalid(
                &f.key("policy"),
                format!(
                    "\"{other}\" is not one of: autofreeze, gradient, schedule{}",
                    did_you_mean(other, keys::FREEZE_POLICIES.iter().copied())
                ),
            ));
        }
    };
    if run.is_none() {
        return Err(invalid(
            &f.key("policy"),
            "freezing acts over a training run: add \"run\": {\"dataset_samples\": N, \"epochs\": E}",
        ));
    }
    Ok(Some(FreezeSpec {
        policy,
        auto_pipe: f.boolean("auto_pipe")?.unwrap_or(true),
        auto_dp: f.boolean("auto_dp")?.unwrap_or(true),
        auto_cache: f.boolean("auto_cache")?.unwrap_or(true),
    }))
}

/// What PipeTransformer's elastic pipelines (`policy::freeze::elastic_schedule`) need of the
/// plan: the initial pipeline length K0 = pp a power of two whose pipelines (pp x tp devices)
/// fit inside one node, one chunk per stage, and no token slicing.
fn check_elastic(o: &Obj, plan: &Plan, c: &ClusterSpec) -> Result<()> {
    let (pp, tp, per_node) = (plan.pp, plan.tp, c.node.devices);
    if !pp.is_power_of_two() {
        return Err(invalid(
            &o.key("pp"),
            format!(
                "{pp}: with \"freeze\", AutoPipe halves the pipeline length; allowed: a power of two (1, 2, 4, ...)"
            ),
        ));
    }
    if u64::from(pp) * u64::from(tp) > u64::from(per_node) {
        return Err(invalid(
            &o.key("pp"),
            format!(
                "{pp}: with \"freeze\", each pipeline (pp x tp = {} devices) stays inside one node of {per_node} devices; allowed: pp a power of two <= {}",
                u64::from(pp) * u64::from(tp),
                per_node / tp.max(1)
            ),
        ));
    }
    if plan.virtual_stages > 1 {
        return Err(invalid(
            &o.key("schedule"),
            "\"interleaved\" with \"freeze\": AutoPipe re-cuts the pipeline each epoch into one chunk per stage; allowed: gpipe, 1f1b, flush, 2bw",
        ));
    }
    if plan.token_slices.is_some() {
        return Err(invalid(
            &o.key("token_slices"),
            "token slicing with \"freeze\" is not modelled; use one or the other",
        ));
    }
    Ok(())
}

/// `tp_mode` and, for 2.5D, `tp_depth`: the grid must use exactly `tp` devices.
fn parse_tp_mode(o: &Obj, tp: u32, dflt: &mut dyn FnMut(&str, &str)) -> Result<TpMode> {
    let root = |n: u32, k: u32| (1..=n).find(|q| q.pow(k) >= n).filter(|q| q.pow(k) == n);
    let mode = match o.string("tp_mode")? {
        None => {
            dflt("tp_mode", "1d");
            TpMode::OneD
        }
        Some("1d") => TpMode::OneD,
        Some("2d") => match root(tp, 2) {
            Some(q) => TpMode::TwoD { q },
            None => return Err(invalid(&o.key("tp"), format!("{tp} is not a square; \"2d\" needs tp = q x q"))),
        },
        Some("2.5d") => {
            let d = o
                .uint("tp_depth")?
                .ok_or_else(|| invalid(&o.key("tp_depth"), "required with \"2.5d\": the depth d of tp = d x q x q"))?;
            match root(tp / d, 2).filter(|_| tp.is_multiple_of(d)) {
                Some(q) => TpMode::TwoPointFiveD { q, d },
                None => return Err(invalid(&o.key("tp"), format!("{tp} is not d x q x q with d = tp_depth = {d}"))),
            }
        }
        Some("3d") => match root(tp, 3) {
            Some(q) => TpMode::ThreeD { q },
            None => return Err(invalid(&o.key("tp"), format!("{tp} is not a cube; \"3d\" needs tp = q x q x q"))),
        },
        Some(m) => {
            let hint = did_you_mean(m, keys::TP_MODES.iter().copied());
            return Err(invalid(&o.key("tp_mode"), format!("\"{m}\" is not one of: 1d, 2d, 2.5d, 3d{hint}")));
        }
    };
    if o.has("tp_depth") && !matches!(mode, TpMode::TwoPointFiveD { .. }) {
        return Err(invalid(&o.key("tp_depth"), "only with \"tp_mode\": \"2.5d\""));
    }
    Ok(mode)
}

/// `token_slices`: "auto", a list of slice lengths (each micro-batch's sequences cut the same
/// way), or a list of [sequences, [slice lengths]] sub-batches covering a replica's batch.
fn parse_token_slices(o: &Obj, w: &Workload, t: &Training, dp: u32) -> Result<Option<TokenSlices>> {
    use crate::plan::SlicedBatch;
    let key = o.key("token_slices");
    let Some(v) = o.get("token_slices") else {
        if o.has("token_granularity") {
            return Err(invalid(&o.key("token_granularity"), "only with \"token_slices\": \"auto\""));
        }
        return Ok(None);
    };
    if !w.transformer.causal {
        return Err(invalid(
            &key,
            "token slicing needs causal attention (a later token must not be read by an earlier one); this workload is bidirectional",
        ));
    }
    let per_replica = t.global_batch / dp;
    let tokens_ok = |slices: &[u32], path: &str| -> Result<()> {
        let sum: u64 = slices.iter().map(|&x| x as u64).sum();
        if slices.is_empty() || slices.contains(&0) || sum != t.seq_len as u64 {
            return Err(invalid(
                path,
                format!("slice lengths must be positive and sum to seq_len {}; they sum to {sum}", t.seq_len),
            ));
        }
        Ok(())
    };
    let ts = match v {
        Value::String(s) if s == "auto" => {
            let g = o.uint("token_granularity")?.unwrap_or(8);
            if g > t.seq_len {
                return Err(invalid(&o.key("token_granularity"), format!("{g} is longer than seq_len {}", t.seq_len)));
            }
            TokenSlices::Auto { granularity: g }
        }
        Value::Array(items) if items.iter().all(Value::is_u64) => {
            let slices: Vec<u32> =
                items.iter().filter_map(Value::as_u64).map(|x| u32::try_from(x).unwrap_or(u32::MAX)).collect();
            tokens_ok(&slices, &key)?;
            let n = per_replica / t.micro_batch;
            if n as u64 * slices.len() as u64 > crate::lower::size::MAX_TASKS {
                return Err(invalid(
                    &key,
                    format!(
                        "{n} micro-batches x {} slices = {} units; allowed: at most {} (raise training.micro_batch or use longer slices)",
                        slices.len(),
                        n as u64 * slices.len() as u64,
                        crate::lower::size::MAX_TASKS
                    ),
                ));
            }
            TokenSlices::Explicit(vec![SlicedBatch { sequences: t.micro_batch, slices }; n as usize])
        }
        Value::Array(items) => {
            let mut subs = Vec::new();
            for (i, it) in items.iter().enumerate() {
                let path = format!("{key}[{i}]");
                let pair = it.as_array().filter(|a| a.len() == 2);
                let (Some(b), Some(sl)) = (
                    pair.and_then(|a| a[0].as_u64()).filter(|b| (1..=u32::MAX as u64).contains(b)),
                    pair.and_then(|a| a[1].as_array()),
                ) else {
                    return Err(invalid(&path, format!("expected [sequences, [slice lengths]], got {}", show(it))));
                };
                let slices: Option<Vec<u32>> =
                    sl.iter().map(|x| x.as_u64().and_then(|y| u32::try_from(y).ok())).collect();
                let slices = slices.ok_or_else(|| invalid(&path, "slice lengths must be positive integers"))?;
                tokens_ok(&slices, &path)?;
                subs.push(SlicedBatch { sequences: b as u32, slices });
            }
            let total: u64 = subs.iter().map(|s| s.sequences as u64).sum();
            if total != per_replica as u64 {
                return Err(invalid(
                    &key,
                    format!(
                        "the sub-batches hold {total} sequences; each replica has global_batch / dp = {per_replica}"
                    ),
                ));
            }
            TokenSlices::Explicit(subs)
        }
        other => {
            return Err(invalid(
                &key,
                format!(
                    "{} is not \"auto\", a list of slice lengths, or a list of [sequences, [slice lengths]]",
                    show(other)
                ),
            ));
        }
    };
    Ok(Some(ts))
}

/// Gemini's dynamic placement: Belady eviction (`gemini`), least recently used
/// (`gemini-lru`), or a fixed 512 MiB device budget (`const`), unless `budget` says.
fn dynamic(policy: &str, budget: Option<f64>) -> Offload {
    use crate::policy::gemini::{CONST_POLICY_BYTES, Eviction};
    let eviction = if policy == "gemini-lru" { Eviction::Lru } else { Eviction::Belady };
    let budget_bytes = budget.or(if policy == "const" { Some(CONST_POLICY_BYTES) } else { None });
    Offload { dynamic: Some(crate::plan::Dynamic { eviction, budget_bytes }), ..Offload::NONE }
}

fn parse_offload(o: &Obj, zero_stage: u8, dflt: &mut dyn FnMut(&str, &str)) -> Result<Offload> {
    let key = o.key("offload");
    let offload = match o.get("offload") {
        None => {
            dflt("offload", "none");
            Offload::NONE
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Offload::NONE,
            // ZeRO-Offload (Ren et al. 2021): optimizer states and step on the CPU.
            "zero-offload" => Offload { optimizer: Tier::Cpu, ..Offload::NONE },
            // ZeRO-Infinity (Rajbhandari et al. 2021): optimizer and parameters on NVMe.
            "zero-infinity" => Offload { optimizer: Tier::Nvme, params: Tier::Nvme, ..Offload::NONE },
            p @ ("gemini" | "gemini-lru" | "const") => dynamic(p, None),
            other => {
                return Err(invalid(
                    &key,
                    format!(
                        "\"{other}\" is not one of: none, gemini, gemini-lru, const, zero-offload, zero-infinity, or an object {{\"optimizer\": tier, \"params\": tier}}{}",
                        did_you_mean(other, keys::OFFLOAD_POLICIES.iter().copied())
                    ),
                ));
            }
        },
        Some(v) => {
            let oo = Obj::new(v, &key)?;
            oo.only(keys::OFFLOAD)?;
            if let Some(p) = oo.string("policy")? {
                let budget = oo.positive("budget_bytes")?;
                if oo.has("optimizer") || oo.has("params") {
                    return Err(invalid(
                        &oo.key("policy"),
                        "a policy places the optimizer and parameters itself; leave out \"optimizer\" and \"params\"",
                    ));
                }
                return match p {
                    "none" => Ok(Offload::NONE),
                    "zero-offload" => Ok(Offload { optimizer: Tier::Cpu, ..Offload::NONE }),
                    "zero-infinity" if zero_stage >= 3 => {
                        Ok(Offload { optimizer: Tier::Nvme, params: Tier::Nvme, ..Offload::NONE })
                    }
                    "gemini" | "gemini-lru" | "const" => Ok(dynamic(p, budget)),
                    _ => Err(invalid(
                        &oo.key("policy"),
                        format!(
                            "\"{p}\" is not one of: none, gemini, gemini-lru, const, zero-offload, zero-infinity (with zero_stage 3){}",
                            did_you_mean(p, keys::OFFLOAD_POLICIES.iter().copied())
                        ),
                    )),
                };
            }
            if oo.has("budget_bytes") {
                return Err(invalid(&oo.key("budget_bytes"), "only with a \"policy\""));
            }
            Offload {
                optimizer: oo.choice("optimizer", &Tier::NAMES, Tier::parse)?.unwrap_or(Tier::Device),
                params: oo.choice("params", &Tier::NAMES, Tier::parse)?.unwrap_or(Tier::Device),
                activations: match oo.choice("activations", &Tier::NAMES, Tier::parse)? {
                    Some(Tier::Nvme) => {
                        return Err(invalid(
                            &oo.key("activations"),
                            "activations offload to \"cpu\" only (NVMe is too slow to hide)",
                        ));
                    }
                    Some(t) => t,
                    None => Tier::Device,
                },
                dynamic: None,
            }
        }
    };
    if offload.params != Tier::Device && zero_stage < 3 {
        return Err(invalid(
            &format!("{key}.params"),
            format!(
                "parameter offload needs zero_stage 3 (parameters are fetched shard by shard before use); zero_stage is {zero_stage}"
            ),
        ));
    }
    Ok(offload)
}

fn parse_plan(o: &Obj, w: &Workload, c: &ClusterSpec, t: &Training, defaults: &mut Vec<String>) -> Result<Plan> {
    o.only(keys::PLAN)?;
    let mut dflt = |k: &str, v: &str| defaults.push(format!("plan.{k} = {v}"));
    let dp = o.uint("dp")?.unwrap_or_else(|| {
        dflt("dp", "1");
        1
    });
    let tp = o.uint("tp")?.unwrap_or_else(|| {
        dflt("tp", "1");
        1
    });
    let pp = o.uint("pp")?.unwrap_or_else(|| {
        dflt("pp", "1");
        1
    });
    let devices = c.device_count();
    if dp as u64 * tp as u64 * pp as u64 != devices as u64 {
        return Err(invalid(
            &o.path,
            format!(
                "dp x tp x pp = {dp} x {tp} x {pp} = {} but the cluster has {devices} devices; allowed: degrees whose product is {devices}",
                dp as u64 * tp as u64 * pp as u64
            ),
        ));
    }
    let rank_order = match o.choice("rank_order", &crate::plan::RankOrder::NAMES, crate::plan::RankOrder::parse)? {
        Some(r) => r,
        None => {
            if dp > 1 && pp > 1 {
                dflt("rank_order", "tp-dp-pp (Megatron-LM)");
            }
            crate::plan::RankOrder::TpDpPp
        }
    };
    let p2p = match o.choice("p2p", &crate::plan::P2p::NAMES, crate::plan::P2p::parse)? {
        Some(x) => x,
        None => {
            if pp > 1 {
                dflt("p2p", "blocking (Megatron-LM, DeepSpeed)");
            }
            crate::plan::P2p::Blocking
        }
    };
    let mut tp_mode = parse_tp_mode(o, tp, &mut dflt)?;
    // true or "megatron": Megatron's sequence parallelism inside 1D tensor parallelism;
    // "ring": the tp group splits the sequence instead and passes keys and values around.
    let sp_key = o.key("sequence_parallel");
    let sequence_parallel = match o.get("sequence_parallel") {
        None => {
            dflt("sequence_parallel", "false");
            false
        }
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s == "megatron" => true,
        Some(Value::String(s)) if s == "ring" => {
            if tp_mode != TpMode::OneD {
                return Err(invalid(
                    &sp_key,
                    "ring self-attention uses the tp group as a sequence-parallel ring; leave tp_mode at \"1d\"",
                ));
            }
            if !t.seq_len.is_multiple_of(tp) {
                return Err(invalid(
                    &sp_key,
                    format!("seq_len {} does not split into tp = {tp} equal chunks", t.seq_len),
                ));
            }
            tp_mode = TpMode::Ring;
            false
        }
        Some(v) => {
            let hint = v.as_str().map(|x| did_you_mean(x, keys::SEQUENCE_PARALLEL.iter().copied())).unwrap_or_default();
            return Err(invalid(
                &sp_key,
                format!("{} is not one of: true, false, \"megatron\", \"ring\"{hint}", show(v)),
            ));
        }
    };
    if sequence_parallel && tp_mode != TpMode::OneD {
        return Err(invalid(&sp_key, "Megatron sequence parallelism goes with tp_mode \"1d\""));
    }
    let tf = &w.transformer;
    if w.net.is_some() && (tp > 1 || sequence_parallel || tp_mode != TpMode::OneD) {
        return Err(invalid(
            &o.key("tp"),
            format!(
                "{tp}: tensor and sequence parallelism are modelled for transformers; \"{}\" is a network of distinct layers (use dp and pp)",
                w.name
            ),
        ));
    }
    if !tf.heads.is_multiple_of(tp) && tp_mode != TpMode::Ring {
        return Err(invalid(&o.key("tp"), format!("{tp} does not divide the workload's {} attention heads", tf.heads)));
    }
    let schedule = match o.choice("schedule", keys::SCHEDULES, parse_schedule)? {
        Some(s) => s,
        None => {
            dflt("schedule", "1f1b");
            ScheduleKind::OneFOneB
        }
    };
    let virtual_stages = match (schedule, o.uint("virtual_stages")?) {
        (ScheduleKind::Interleaved, Some(v)) => v,
        (ScheduleKind::Interleaved, None) => {
            dflt("virtual_stages", "2");
            2
        }
        (_, Some(v)) if v != 1 => {
            return Err(invalid(
                &o.key("virtual_stages"),
                format!(
                    "{v} needs \"schedule\": \"interleaved\"; allowed with {}: 1",
                    crate::plan::schedule_name(schedule)
                ),
            ));
        }
        _ => 1,
    };
    let zero_stage = match o.get("zero_stage") {
        None => {
            dflt("zero_stage", "0");
            0
        }
        Some(v) => match v.as_u64() {
            Some(z @ 0..=3) => z as u8,
            _ => return Err(invalid(&o.key("zero_stage"), format!("{} is not one of: 0, 1, 2, 3", show(v)))),
        },
    };
    let offload = parse_offload(o, zero_stage, &mut dflt)?;
    let token_slices = parse_token_slices(o, w, t, dp)?;
    if token_slices.is_some() {
        let key = o.key("token_slices");
        if !matches!(o.get("schedule").and_then(Value::as_str), None | Some("gpipe")) {
            return Err(invalid(
                &key,
                "token slicing runs TeraPipe's GPipe-like schedule; set \"schedule\": \"gpipe\" or leave it out",
            ));
        }
        if o.uint("virtual_stages")?.is_some_and(|v| v > 1)
            || o.get("tp_mode").and_then(Value::as_str).is_some_and(|m| m != "1d")
            || o.has("sequence_parallel") && o.get("sequence_parallel") != Some(&Value::Bool(false))
        {
            return Err(invalid(
                &key,
                "token slicing goes with 1D tensor parallelism, no sequence parallelism and no virtual stages",
            ));
        }
    }
    let recompute = o.choice("recompute", &Recompute::NAMES, Recompute::parse)?.unwrap_or_else(|| {
        dflt("recompute", "none");
        Recompute::None
    });
    let per_replica = t.global_batch / dp;
    if !t.global_batch.is_multiple_of(dp) || !per_replica.is_multiple_of(t.micro_batch) {
        return Err(invalid(
            "training.global_batch",
            format!(
                "{} samples do not split into dp={dp} replicas of whole micro-batches of {}; allowed: a multiple of dp x micro_batch = {}",
                t.global_batch,
                t.micro_batch,
                dp * t.micro_batch
            ),
        ));
    }
    let micro_batches = per_replica / t.micro_batch;
    let chunks = pp * virtual_stages;
    if chunks > tf.layers {
        return Err(invalid(
            &o.key("pp"),
            format!(
                "{pp} stages x {virtual_stages} virtual stages = {chunks} chunks, but the workload has only {} layers; allowed: at most one chunk per layer ({})",
                tf.layers,
                if tf.layers >= pp {
                    format!("virtual_stages <= {}", tf.layers / pp)
                } else {
                    format!("pp <= {}", tf.layers)
                }
            ),
        ));
    }
    let mut partition_policy = None;
    let partition = match o.get("partition") {
        None if virtual_stages > 1 && !tf.layers.is_multiple_of(chunks) => {
            let p = Plan::ends_short_partition(tf.layers, chunks);
            let size = tf.layers.div_ceil(chunks);
            let short: Vec<usize> = (0..p.len()).filter(|&c| p[c] < size).collect();
            dflt(
                "partition",
                &format!(
                    "uneven: {} layers over {chunks} chunks of {size}, one fewer on chunks {short:?} (the ends first)",
                    tf.layers
                ),
            );
            p
        }
        None => {
            dflt("partition", "uniform");
            Plan::uniform_partition(tf.layers, chunks)
        }
        Some(Value::String(s)) if s == "uniform" => Plan::uniform_partition(tf.layers, chunks),
        Some(Value::String(s)) if s == "balanced" || s == "parameters" => {
            if virtual_stages > 1 {
                return Err(invalid(
                    &o.key("partition"),
                    format!("\"{s}\" cuts one chunk per stage; use it without virtual stages"),
                ));
            }
            partition_policy =
                Some(if s == "balanced" { PartitionPolicy::Balanced } else { PartitionPolicy::Parameters });
            // A placeholder the policy replaces before lowering.
            Plan::uniform_partition(tf.layers, chunks)
        }
        Some(Value::String(s)) if s == "explore" => {
            if virtual_stages > 1 {
                return Err(invalid(
                    &o.key("partition"),
                    "\"explore\" chooses the schedule itself; leave out virtual stages",
                ));
            }
            partition_policy = Some(PartitionPolicy::Explore);
            Plan::uniform_partition(tf.layers, chunks)
        }
        Some(Value::Array(a)) => {
            let layers: Option<Vec<u32>> =
                a.iter().map(|x| x.as_u64().filter(|n| *n >= 1).and_then(|n| u32::try_from(n).ok())).collect();
            match layers {
                Some(l)
                    if l.len() == chunks as usize && l.iter().map(|&n| n as u64).sum::<u64>() == tf.layers as u64 =>
                {
                    l
                }
                _ => {
                    return Err(invalid(
                        &o.key("partition"),
                        format!(
                            "expected {chunks} positive layer counts summing to {}, got {}",
                            tf.layers,
                            show(o.get("partition").unwrap_or(&Value::Null))
                        ),
                    ));
                }
            }
        }
        Some(v) => {
            return Err(invalid(
                &o.key("partition"),
                format!(
                    "{} is not \"uniform\", \"balanced\", \"parameters\", \"explore\" or a list of layers per stage{}",
                    show(v),
                    v.as_str().map(|x| did_you_mean(x, keys::PARTITION_POLICIES.iter().copied())).unwrap_or_default()
                ),
            ));
        }
    };
    // A heterogeneous cluster: every device of a pipeline stage must be of one kind.
    for stage in 0..pp {
        let members: Vec<u32> =
            (0..dp).flat_map(|r| (0..tp).map(move |x| rank_order.device([dp, pp, tp], r, stage, x))).collect();
        let first = c.class_of(members[0]);
        if let Some(&other) = members.iter().find(|&&d| c.class_of(d) != first) {
            return Err(invalid(
                "cluster.device_overrides",
                format!(
                    "pipeline stage {stage} mixes device kinds (devices {} and {other}); give each stage one kind",
                    members[0]
                ),
            ));
        }
    }
    if schedule == ScheduleKind::TwoBW && micro_batches < pp {
        return Err(invalid(
            &o.key("schedule"),
            format!(
                "\"2bw\" accumulates gradients over at least as many micro-batches as stages: {micro_batches} < pp = {pp}"
            ),
        ));
    }
    let shape = ScheduleShape { stages: pp, micro_batches, virtual_stages };
    // Validation only: the table itself holds 2 x micro-batches steps per stage.
    if let Err(e) = schedule::validate(schedule, shape) {
        return Err(invalid(
            &o.key("schedule"),
            format!("{e} (micro-batches per replica = global_batch / (dp x micro_batch) = {micro_batches})"),
        ));
    }
    let traits = crate::framework::PlanTraits {
        tp,
        pp,
        zero_stage,
        offloaded: offload.optimizer != Tier::Device || offload.params != Tier::Device,
        gemini: offload.dynamic.is_some(),
    };
    let framework = framework::resolve(t.framework.as_ref(), traits, defaults);
    let grad_bytes = framework.grad_reduce_bytes(t.precision.activation_bytes());
    let attention = match t.attention {
        Some(a) => a,
        None => {
            let name = if framework.flash_attention { "flash" } else { "naive" };
            defaults.push(format!("training.attention = {name} ({})", framework.name));
            crate::hardware::kernels::Attention::parse(name).expect("a known attention")
        }
    };
    let bucket_bytes = match o.positive("bucket_bytes")? {
        Some(b) => b,
        None => {
            let b = framework.bucket_bytes(dp, grad_bytes);
            defaults.push(format!("plan.bucket_bytes = {:.0} MiB ({})", b / 1048576.0, framework.name));
            b
        }
    };
    Ok(Plan {
        dp,
        tp,
        pp,
        rank_order,
        p2p,
        schedule,
        virtual_stages,
        recompute,
        zero_stage,
        sequence_parallel,
        tp_mode,
        attention,
        fusion: crate::workload::Fusion {
            scale_mask_softmax: framework.fused.softmax,
            bias_dropout_add: framework.fused.bias_dropout_add,
        },
        partition,
        micro_batches,
        micro_batch: t.micro_batch,
        seq_len: t.seq_len,
        precision: t.precision,
        optimizer: t.optimizer,
        bucket_bytes,
        offload,
        token_slices,
        frozen: crate::plan::Frozen::default(),
        partition_policy,
        framework,
    })
}
