//! trainsim's model of the world and its simulator: pure and deterministic, no I/O, no
//! clock. The same scenario gives a byte-identical report and timeline.
//!
//! Data flow: [`scenario::parse`] validates the input into a [`scenario::Scenario`];
//! [`lower::lower`] turns its plan into a [`lower::Program`] of per-device task streams;
//! [`engine::run`] times the program on the cluster with the [`cost`] model and the
//! [`network`] model; [`report::build`] summarises the run. [`simulate`] does all of it.

pub mod cost;
pub mod engine;
pub mod hardware;
pub mod lower;
pub mod network;
pub mod plan;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod workload;

use engine::RunOptions;
use hardware::Topology;

/// Everything one simulation produces.
pub struct Simulation {
    pub report: report::Report,
    pub program: lower::Program,
    pub timeline: report::timeline::Timeline,
}

/// Durations of a program's ops on the scenario's device, in nanoseconds.
pub fn op_durations_ns(s: &scenario::Scenario, p: &lower::Program, calibration: Option<cost::Calibration>) -> Vec<u64> {
    let model = cost::ComputeModel::new(&s.cluster.node.device, s.training.precision, calibration);
    p.ops.iter().map(|o| (model.op_s(&o.spec, o.backward) * 1e9).round() as u64).collect()
}

/// Simulate one training iteration. `record` keeps every span for traces and plots.
pub fn simulate(s: &scenario::Scenario, record: bool) -> Simulation {
    let program = lower::lower(s);
    let topo = Topology::new(&s.cluster);
    let op_ns = op_durations_ns(s, &program, None);
    let opts = RunOptions {
        network: s.options.network,
        record,
        collective_launch_ns: (s.cluster.node.device.kernel_launch_s * 1e9).round() as u64,
    };
    let mut result = engine::run(&program, &topo, &op_ns, opts);
    let report = report::build(s, &program, &result);
    let mut timeline = std::mem::take(&mut result.timeline);
    timeline.static_hbm = program.static_memory.clone();
    timeline.static_host = program.host_memory.clone();
    timeline.hbm_capacity_bytes = s.cluster.node.device.hbm_bytes;
    timeline.host_capacity_bytes = s.cluster.node.host.dram_bytes / s.cluster.node.devices as f64;
    Simulation { report, program, timeline }
}
