//! Where the time goes: each device's iteration split into compute by op kind and the reasons
//! its compute stream stood idle, grouped into device classes (device model and pipeline
//! stage). The engine measures the parts ([`crate::engine::attribution`]); this module says
//! what an op or a wait counts as, and builds the report's `time_breakdown`.
//!
//! A device's compute stream is either busy (a kernel, or a collective that blocks it, such as
//! a tensor-parallel all-reduce) or idle. An idle stretch is charged to what ended it: the
//! last dependency of the next task to finish (a pipeline receive, a data-parallel collective,
//! a host copy), or the host still issuing that task. So the parts of one device add up to the
//! iteration exactly.

use crate::lower::Program;
use crate::report::timeline::{Label, Phase};
use crate::scenario::Scenario;
use serde::Serialize;

/// What a stretch of a device's compute stream is spent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Part {
    /// Matrix multiplications of the layers (forward and backward).
    Gemm,
    /// The attention core: fused attention, or scores, softmax, dropout and the value GEMM.
    Attention,
    /// The layers' other (bandwidth-bound) ops: norms, activations, dropout, residuals,
    /// gradient accumulation.
    MemoryBound,
    /// The embedding and the head (logits, loss) outside the layers.
    EmbeddingHead,
    /// Forward ops run again before backward (activation recomputation).
    Recompute,
    /// The optimizer step (on the device, or offloaded to the host CPU while the device waits).
    Optimizer,
    /// Tensor-parallel (and sequence-parallel) collectives on the compute stream, and waits
    /// for the group's other members to reach one.
    TpComm,
    /// Waits for context parallelism's key/value ring (`plan.cp`) that outlasts the
    /// attention kernel it runs beside.
    CpComm,
    /// Expert parallelism's all-to-all dispatch and combine on the compute stream, and waits
    /// for the expert-parallel group's other members to reach one.
    EpComm,
    /// Waits for data-parallel collectives: gradient reduction, ZeRO's parameter gathers.
    DpComm,
    /// Waits for pipeline transfers (from when the sending stage's data was ready), and the
    /// receivers' all-gather of a scattered boundary activation.
    PpComm,
    /// Waits for another pipeline stage's compute.
    Bubble,
    /// Waits for the host to issue the next kernel.
    Host,
    /// Waits for copies between host (DRAM or NVMe) and device memory.
    Offload,
    /// Anything else.
    Other,
    /// Idle after the device's own last work while other devices finish. The report counts it
    /// as bubble in a pipeline and as other without one.
    Tail,
}

/// Number of [`Part`]s.
pub const PARTS: usize = Part::Tail as usize + 1;

/// Ops of the attention core, by name (see `workload::transformer`, `grid`, `ring` and
/// `context_ring`).
const ATTENTION_OPS: [&str; 8] =
    ["flash_attn", "flash_attn_ring", "cp_merge", "scores", "attn_scale", "softmax", "attn_dropout", "attn_v"];

/// A label's part when its task is a kernel: `None` for a layer op that is a GEMM or
/// bandwidth-bound by its cost class.
pub fn kernel_part(label: &Label) -> Option<Part> {
    match label.phase {
        Phase::Recompute => Some(Part::Recompute),
        Phase::Optimizer => Some(Part::Optimizer),
        _ if ATTENTION_OPS.contains(&label.op) => Some(Part::Attention),
        _ if label.layer < 0 && label.op != "grad_accumulate" => Some(Part::EmbeddingHead),
        _ => None,
    }
}

/// A label's part when its task is a collective on the compute stream.
pub fn blocking_comm_part(label: &Label) -> Part {
    match (label.op, label.phase) {
        ("recv_allgather", _) => Part::PpComm,
        ("ep_dispatch" | "ep_combine", _) => Part::EpComm,
        ("cp_kv" | "cp_dkv" | "cp_dkv_last", _) => Part::CpComm,
        (_, Phase::Sync) => Part::DpComm,
        _ => Part::TpComm,
    }
}

/// One device class's (or the critical device's) iteration, in seconds, part by part. The
/// parts add up to `iteration_s`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DeviceTime {
    /// `critical_device` (the device whose compute stream is busiest) or `device_class`.
    pub role: &'static str,
    pub device_name: String,
    pub stage: u32,
    /// Devices of the cluster in the class (1 for the critical device).
    pub devices: u32,
    /// The device (the first of the class).
    pub device: u32,
    pub gemm_s: f64,
    pub attention_s: f64,
    pub memory_bound_s: f64,
    pub embedding_head_s: f64,
    pub recompute_s: f64,
    pub optimizer_s: f64,
    pub exposed_tp_comm_s: f64,
    pub exposed_cp_comm_s: f64,
    pub exposed_ep_comm_s: f64,
    pub exposed_dp_comm_s: f64,
    pub exposed_pp_comm_s: f64,
    pub bubble_s: f64,
    pub host_s: f64,
    pub offload_wait_s: f64,
    pub other_s: f64,
}

impl DeviceTime {
    /// The parts with their report keys, in order.
    pub fn parts(&self) -> [(&'static str, f64); 15] {
        [
            ("gemm_s", self.gemm_s),
            ("attention_s", self.attention_s),
            ("memory_bound_s", self.memory_bound_s),
            ("embedding_head_s", self.embedding_head_s),
            ("recompute_s", self.recompute_s),
            ("optimizer_s", self.optimizer_s),
            ("exposed_tp_comm_s", self.exposed_tp_comm_s),
            ("exposed_cp_comm_s", self.exposed_cp_comm_s),
            ("exposed_ep_comm_s", self.exposed_ep_comm_s),
            ("exposed_dp_comm_s", self.exposed_dp_comm_s),
            ("exposed_pp_comm_s", self.exposed_pp_comm_s),
            ("bubble_s", self.bubble_s),
            ("host_s", self.host_s),
            ("offload_wait_s", self.offload_wait_s),
            ("other_s", self.other_s),
        ]
    }

    fn parts_mut(&mut self) -> [&mut f64; 15] {
        [
            &mut self.gemm_s,
            &mut self.attention_s,
            &mut self.memory_bound_s,
            &mut self.embedding_head_s,
            &mut self.recompute_s,
            &mut self.optimizer_s,
            &mut self.exposed_tp_comm_s,
            &mut self.exposed_cp_comm_s,
            &mut self.exposed_ep_comm_s,
            &mut self.exposed_dp_comm_s,
            &mut self.exposed_pp_comm_s,
            &mut self.bubble_s,
            &mut self.host_s,
            &mut self.offload_wait_s,
            &mut self.other_s,
        ]
    }

    /// Sum of the parts (the iteration).
    pub fn total_s(&self) -> f64 {
        self.parts().iter().map(|(_, v)| v).sum()
    }

    /// Compute (busy kernels: the first six parts).
    pub fn compute_s(&self) -> f64 {
        self.parts()[..6].iter().map(|(_, v)| v).sum()
    }

    /// The engine's per-part nanoseconds (averaged over `n` devices) as seconds; the tail
    /// counts as bubble in a pipeline and as other without one.
    fn set(&mut self, ns: &[f64; PARTS], pipelined: bool) {
        let s = |p: Part| ns[p as usize] * 1e-9;
        let tail = s(Part::Tail);
        self.gemm_s = s(Part::Gemm);
        self.attention_s = s(Part::Attention);
        self.memory_bound_s = s(Part::MemoryBound);
        self.embedding_head_s = s(Part::EmbeddingHead);
        self.recompute_s = s(Part::Recompute);
        self.optimizer_s = s(Part::Optimizer);
        self.exposed_tp_comm_s = s(Part::TpComm);
        self.exposed_cp_comm_s = s(Part::CpComm);
        self.exposed_ep_comm_s = s(Part::EpComm);
        self.exposed_dp_comm_s = s(Part::DpComm);
        self.exposed_pp_comm_s = s(Part::PpComm);
        self.bubble_s = s(Part::Bubble) + if pipelined { tail } else { 0.0 };
        self.host_s = s(Part::Host);
        self.offload_wait_s = s(Part::Offload);
        self.other_s = s(Part::Other) + if pipelined { 0.0 } else { tail };
    }

    /// One batch's share of a run that holds two (PipeDream-2BW, whose steady-state step is
    /// T(2m) - T(m)): the compute of `one` (the m-micro-batch run: m micro-batches and one
    /// optimizer step, which 2BW runs every batch), and the waits that the second batch added,
    /// `self - one` part by part (at least 0), plus `stretch` (seconds a communication
    /// stream's own work adds past the doubled run's difference, told as that part), scaled
    /// to fill the rest of `iteration_s`.
    pub fn difference(&self, one: &DeviceTime, iteration_s: f64, stretch: Option<(Part, f64)>) -> DeviceTime {
        let mut out = self.clone();
        let (mine, theirs) = (self.parts(), one.parts());
        for (i, v) in out.parts_mut().into_iter().enumerate() {
            *v = if i < 6 { theirs[i].1 } else { (mine[i].1 - theirs[i].1).max(0.0) };
            if let Some((part, s)) = stretch
                && part as usize == i
            {
                *v += s;
            }
        }
        let compute = out.compute_s();
        let waits = out.total_s() - compute;
        let left = (iteration_s - compute).max(0.0);
        for v in out.parts_mut().into_iter().skip(6) {
            *v = if waits > 0.0 { *v * left / waits } else { 0.0 };
        }
        if waits <= 0.0 {
            out.other_s = left;
        }
        out
    }
}

/// The critical device, then one entry per device class (device model, pipeline stage) in
/// stage order, from the engine's per-device part times.
/// The critical device is the one whose compute stream is busiest (`busy_ns`).
pub fn build(s: &Scenario, p: &Program, parts_ns: &[[u64; PARTS]], busy_ns: &[u64]) -> Vec<DeviceTime> {
    let nd = p.devices.len();
    if parts_ns.len() != nd || busy_ns.len() != nd || nd == 0 {
        return Vec::new();
    }
    let pipelined = s.plan.pp > 1;
    let class = |d: usize| s.cluster.class_of(p.devices[d]);
    // Cluster devices per simulated device (mirrors under symmetry).
    let mut weight = vec![0u32; nd];
    for &m in &p.mirror {
        if (m as usize) < nd {
            weight[m as usize] += 1;
        }
    }
    let critical = (0..nd).max_by(|&a, &b| busy_ns[a].cmp(&busy_ns[b]).then(b.cmp(&a))).unwrap_or(0);
    let as_f64 = |d: usize| parts_ns[d].map(|v| v as f64);
    let mut out = Vec::new();
    let mut crit = DeviceTime {
        role: "critical_device",
        device_name: s.cluster.class(class(critical)).name.clone(),
        stage: p.stages[critical],
        devices: 1,
        device: p.devices[critical],
        ..DeviceTime::default()
    };
    crit.set(&as_f64(critical), pipelined);
    out.push(crit);
    let mut keys: Vec<(u32, u16)> = (0..nd).map(|d| (p.stages[d], class(d))).collect();
    keys.sort_unstable();
    keys.dedup();
    for (stage, cl) in keys {
        let members: Vec<usize> = (0..nd).filter(|&d| p.stages[d] == stage && class(d) == cl).collect();
        let mut mean = [0.0; PARTS];
        for &d in &members {
            for (m, v) in mean.iter_mut().zip(parts_ns[d]) {
                *m += v as f64;
            }
        }
        for m in &mut mean {
            *m /= members.len() as f64;
        }
        let mut t = DeviceTime {
            role: "device_class",
            device_name: s.cluster.class(cl).name.clone(),
            stage,
            devices: members.iter().map(|&d| weight[d].max(1)).sum(),
            device: p.devices[members[0]],
            ..DeviceTime::default()
        };
        t.set(&mean, pipelined);
        out.push(t);
    }
    out
}
