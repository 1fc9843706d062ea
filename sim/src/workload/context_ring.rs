//! Context parallelism's ring attention as a framework runs it (`training.framework.cp_ring`):
//! the keys and values that go around the ring, the attention kernels beside them, and what the
//! framework does between the kernels.
//!
//! Under context parallelism (`plan.cp`) a rank holds `1/cp` of every sequence; its queries
//! read every rank's keys and values. With the causal load balancing both implementations use
//! (each rank holds sequence chunks `i` and `2cp - 1 - i` of `2cp`), a rank's first step is
//! its own queries against its own keys under the causal mask, and each of the other `cp - 1`
//! steps half a square without a mask (see `cost::attention::ring_efficiency`).

use super::{Axis, Comm, LayerOp, OpClass, OpSpec, Saved};

/// How the ring's keys, values and their gradients travel (see [`CP_RING_SOURCE`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CpRing {
    /// Transformer Engine's `AttnFuncWithCPAndKVP2P` (Megatron-Core): each step sends the
    /// chunk it holds to the next rank while it computes on it, so the ring's traffic runs
    /// beside the whole attention; backward passes the key/value gradients back in the
    /// activations' dtype; each step's output is corrected into the 16-bit output by one fused
    /// kernel (`flash_attn_fwd_out_correction`, 3 reads and writes an element a step at 16
    /// bits: a sixth of PyTorch's fp32 merging) and each step's gradients added likewise.
    TeP2p,
    /// PyTorch's `context_parallel` with the all-gather rotater (its default since December
    /// 2024; torchtitan's `context_parallel_rotate_method = "allgather"`): one all-gather of
    /// every rank's keys and values, issued before the first (local) step and waited for
    /// before the second, so only the local step overlaps it; the same in backward.
    PytorchAllgather,
    /// PyTorch's `context_parallel` with the all-to-all rotater: each step's keys and values
    /// go to the next rank beside that step's kernel, as Transformer Engine does.
    PytorchAlltoall,
}

impl CpRing {
    pub const NAMES: [&'static str; 3] = ["te_p2p", "pytorch_allgather", "pytorch_alltoall"];

    pub fn name(self) -> &'static str {
        match self {
            CpRing::TeP2p => "te_p2p",
            CpRing::PytorchAllgather => "pytorch_allgather",
            CpRing::PytorchAlltoall => "pytorch_alltoall",
        }
    }

    /// What the ring does, in a phrase (the report's defaults and the profiles' reference).
    pub fn summary(self) -> &'static str {
        match self {
            CpRing::TeP2p => "Transformer Engine's ring, beside the whole attention",
            CpRing::PytorchAllgather => "PyTorch's context_parallel: one all-gather beside the local step only",
            CpRing::PytorchAlltoall => "PyTorch's context_parallel, a permute per step",
        }
    }

    pub fn parse(name: &str) -> Option<CpRing> {
        [CpRing::TeP2p, CpRing::PytorchAllgather, CpRing::PytorchAlltoall].into_iter().find(|r| r.name() == name)
    }
}

/// Where `cp_ring` comes from.
pub const CP_RING_SOURCE: &str = "te_p2p: transformer_engine/pytorch/attention.py AttnFuncWithCPAndKVP2P (Transformer Engine 1.x, which Megatron-Core's TEDotProductAttention calls with cp_comm_type p2p): send/recv of the next key/value chunk on a side stream beside each step's kernel, the gradients of keys and values passed back the same way in the activations' dtype. pytorch_allgather and pytorch_alltoall: pytorch/pytorch torch/distributed/tensor/experimental/_attention.py (PyTorch 2.6 and later; set_rotate_method from pytorch#142093, December 2024; torchtitan 9dec370 config_manager.py context_parallel_rotate_method, default \"allgather\") _templated_ring_attention: _AllGatherRotater all-gathers every rank's keys and values once (ft_c.all_gather_tensor, issued before the first step's SDPA and waited for before the second), _AllToAllRotater permutes them to the next rank per step; every step's output and log-sum-exp merged in fp32 by eager ops (_SDPAMerger: .to(float32), out - sigmoid(lse_b - lse) * (out - out_b), logsigmoid, and torch.cat to update half of it when only the second half of the queries took part); _templated_ring_attention_backward accumulates the query, key and value gradients in fp32 (zeros_like, +=, torch.cat), passes the key/value gradients to the next rank after every step by all-to-all (ft_c.permute_tensor) in fp32, waits for each at the next step and for the last after the loop";

/// One rank's share of the ring, what [`ops`] needs to size it: elements (per micro-batch,
/// on one tensor-parallel rank) of its queries, of the attention's output and of its keys and
/// values together, as the kernel reads them; `e` bytes an activation element.
#[derive(Clone, Copy, Debug)]
pub struct RingShare {
    pub cp: u32,
    pub e: f64,
    pub queries: f64,
    pub output: f64,
    pub keys_values: f64,
}

/// Which of a context-parallel ring's attention kernels an attention op stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingPart {
    /// All of them (one kernel when the ring has one step).
    All,
    /// The first step: the rank's queries against its own keys.
    Local,
    /// The other steps: its queries against the other ranks' keys.
    Remote,
}

fn ring_comm(name: &'static str, bytes: f64, axis: Axis, forward: Option<Comm>, backward: Option<Comm>) -> LayerOp {
    LayerOp::Comm { name, bytes, axis, root: 0, forward, backward, forward_bytes: None }
}

/// The ring around one fused attention op `attn` (built for all `cp` steps, `RingPart::All`).
///
/// - `te_p2p`: the all-gather of keys and values (`cp_kv`) beside the kernel in forward and
///   again in backward, the reduce-scatter of their gradients (`cp_dkv`) beside its backward,
///   and its fused 16-bit corrections after the kernels (`cp_merge`).
/// - `pytorch_alltoall`: the same traffic, the gradients in fp32, and what PyTorch does
///   besides: the fp32 merges and gradient accumulation (`cp_merge`, memory-bound), and the
///   wait for the last step's key/value gradients after the loop (`cp_dkv_last`, on the
///   compute stream).
/// - `pytorch_allgather`: as `pytorch_alltoall`, with the kernel split into the local step
///   and the remote steps: the all-gather runs beside the local step only, and the remote
///   steps wait for it.
pub fn ops(ring: CpRing, attn: OpSpec, r: RingShare) -> Vec<LayerOp> {
    if ring == CpRing::TeP2p {
        // The steps' outputs are kept until the loop ends, beside the 16-bit output they are
        // corrected into and the double-buffered keys and values; backward, the query and
        // key/value gradients and their double buffer.
        let steps = 1.0 + STEP_SHARE * (r.cp as f64 - 1.0);
        let held =
            [r.e * r.output * (steps + 1.0) + 2.0 * r.e * r.keys_values, r.e * (r.queries + 3.0 * r.keys_values)];
        let attn = OpSpec { saved: Saved { transient_bytes: held, ..attn.saved }, ..attn };
        let mut ops = te_comms(r);
        ops.push(LayerOp::Compute(attn));
        ops.push(LayerOp::Compute(te_merge_op(r)));
        return ops;
    }
    let n = r.cp as f64;
    let kv = ring_comm("cp_kv", n * r.e * r.keys_values, Axis::Context, Some(Comm::AllGather), Some(Comm::AllGather));
    // fp32 gradients: cp sends of the accumulated key/value gradients, cp - 1 of them beside
    // the steps (a reduce-scatter's ring steps) and the last waited for after the loop (one
    // ring step of a reduce-scatter over cp / (cp - 1) as many bytes).
    let grad = 4.0 * r.keys_values;
    let dkv = ring_comm("cp_dkv", n * grad, Axis::Context, None, Some(Comm::ReduceScatter));
    let last = ring_comm("cp_dkv_last", grad * n / (n - 1.0), Axis::ContextExposed, None, Some(Comm::ReduceScatter));
    let merge = LayerOp::Compute(merge_op(r));
    // What the ring holds while it runs: the keys and values it received (all of them after
    // the all-gather, a step's send and receive buffers otherwise), the fp32 output being
    // merged with two temporaries its size; backward, the fp32 query, key and value
    // gradients being accumulated and the key/value gradients' send and receive buffers.
    let received = if ring == CpRing::PytorchAllgather { n * r.e * r.keys_values } else { 2.0 * r.e * r.keys_values };
    let transient = [received + 12.0 * r.output, received + 4.0 * r.queries + 12.0 * r.keys_values];
    if ring == CpRing::PytorchAlltoall {
        let attn = OpSpec { saved: Saved { transient_bytes: transient, ..attn.saved }, ..attn };
        return vec![kv, dkv, LayerOp::Compute(attn), merge, last];
    }
    let (local, remote) = split(attn, transient);
    vec![kv, LayerOp::Compute(local), dkv, LayerOp::Compute(remote), merge, last]
}

/// Transformer Engine's ring traffic (also what trainsim charges around materialised scores):
/// the keys and values all-gathered beside the attention in forward and again in backward,
/// their gradients reduce-scattered beside its backward, in the activations' dtype.
pub fn te_comms(r: RingShare) -> Vec<LayerOp> {
    let bytes = r.cp as f64 * r.e * r.keys_values;
    vec![
        ring_comm("cp_kv", bytes, Axis::Context, Some(Comm::AllGather), Some(Comm::AllGather)),
        ring_comm("cp_dkv", bytes, Axis::Context, None, Some(Comm::ReduceScatter)),
    ]
}

/// The local step and the remote steps of a ring attention op built for all its steps: the
/// local step does the work of a kernel over the rank's own keys (half a square under the
/// causal mask, a square without), keeps what the op keeps; the remote steps do the rest and
/// hold `transient` while they run.
fn split(attn: OpSpec, transient: [f64; 2]) -> (OpSpec, OpSpec) {
    let OpClass::Attention { heads, q, context, head_dim, causal, kernel, ring, .. } = attn.class else {
        return (attn.clone(), attn);
    };
    let local_keys = if causal { q / 2.0 } else { q };
    let local_flops = 4.0 * heads * q * local_keys * head_dim;
    let share = local_flops / attn.forward_flops.max(f64::MIN_POSITIVE);
    let class = |context, part| OpClass::Attention { heads, q, context, head_dim, causal, kernel, ring, part };
    let local = OpSpec {
        class: class(0.0, RingPart::Local),
        forward_flops: local_flops,
        backward_flops: attn.backward_flops * share,
        ..attn.clone()
    };
    let remote = OpSpec {
        name: "flash_attn_ring",
        class: class(context, RingPart::Remote),
        forward_flops: attn.forward_flops - local_flops,
        forward_bytes: 0.0,
        backward_flops: attn.backward_flops * (1.0 - share),
        backward_bytes: 0.0,
        saved: Saved { transient_bytes: transient, ..Saved::default() },
    };
    (local, remote)
}

/// Of a rank's `cp - 1` remote steps half take all its queries and half only the second half
/// of them (or, backward, the first half of the arriving keys): a remote step touches 3/4 of
/// the output on average.
const STEP_SHARE: f64 = 0.75;

/// Transformer Engine's corrections around its ring's kernels, per rank, in the activations'
/// dtype (`e` bytes): forward, the output zeroed (e per element of O) and each step's output
/// added into it, scaled by its log-sum-exp correction (`flash_attn_fwd_out_correction`, one
/// fused kernel: reads the step's output and the output, writes the output, 3e) over all or
/// half of O; backward, each step's query and key/value gradients added into the running ones
/// (`dq.add_`, `dkv.add_`: 3e an element) over all or half of them.
fn te_merge_op(r: RingShare) -> OpSpec {
    let steps = 1.0 + STEP_SHARE * (r.cp as f64 - 1.0);
    OpSpec {
        name: "cp_merge",
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: r.e * r.output * (1.0 + 3.0 * steps),
        backward_flops: 0.0,
        backward_bytes: 3.0 * r.e * (r.queries + r.keys_values) * steps,
        saved: Saved::default(),
    }
}

/// PyTorch's fp32 merging around the ring's kernels, per rank (bytes read and written, at
/// `e` bytes an activation element; O the output's elements, Q the queries', KV the keys' and
/// values'). Of the `cp - 1` remote steps, half take all the rank's queries and half only the
/// second half of them (then `torch.cat` rewrites the whole fp32 output).
///
/// Forward: the first step's output cast to fp32 (e + 4 per element of O); each remote step
/// casts its output (e + 4), merges it (`out - out_b`, the product with the sigmoid of the
/// log-sum-exp difference, the subtraction: 12 + 8 + 12 bytes) on all or half of O, plus the
/// cat (8) when half; the keys and values concatenated for the rotater before every step but
/// the last (2e per KV element); the result cast back (4 + e).
///
/// Backward: fp32 zeros for the three gradients (4 per element of Q and KV); every step adds
/// its kernel's gradients into them (8 + e; on half, plus the cat's 8, for the half-steps),
/// concatenates the key/value gradients for the next rank (8 per KV element), and, but for
/// the last, the keys and values (2e); the results cast back (4 + e).
fn merge_op(r: RingShare) -> OpSpec {
    let (n, e) = (r.cp as f64, r.e);
    let (o, q, kv) = (r.output, r.queries, r.keys_values);
    let remote_merge = 0.5 * (e + 36.0) + 0.5 * ((e + 36.0) / 2.0 + 8.0);
    let forward = o * (2.0 * (e + 4.0) + (n - 1.0) * remote_merge) + (n - 1.0) * 2.0 * e * kv;
    let add = 8.0 + e;
    let remote_add = 0.5 * add + 0.5 * (add / 2.0 + 8.0);
    let backward = 4.0 * (q + kv)
        + (q + kv) * (add + (n - 1.0) * remote_add)
        + n * 8.0 * kv
        + (n - 1.0) * 2.0 * e * kv
        + (4.0 + e) * (q + kv);
    OpSpec {
        name: "cp_merge",
        class: OpClass::Memory,
        forward_flops: 0.0,
        forward_bytes: forward,
        backward_flops: 0.0,
        backward_bytes: backward,
        saved: Saved::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::kernels::FlashKernel;

    fn attn(cp: u32) -> OpSpec {
        let (heads, s, d) = (32.0, 32768.0, 128.0);
        let context = s * (cp - 1) as f64 / 2.0;
        let flops = 4.0 * heads * s * (context + s / 2.0) * d;
        OpSpec {
            name: "flash_attn",
            class: OpClass::Attention {
                heads,
                q: s,
                context,
                head_dim: d,
                causal: true,
                kernel: FlashKernel::V2,
                ring: cp,
                part: RingPart::All,
            },
            forward_flops: flops,
            forward_bytes: 1.0,
            backward_flops: 2.5 * flops,
            backward_bytes: 2.0,
            saved: Saved { sharded_bytes: 1.0, ..Saved::default() },
        }
    }

    fn share(cp: u32) -> RingShare {
        let o = 32768.0 * 4096.0;
        RingShare { cp, e: 2.0, queries: o, output: o, keys_values: 2.0 * o }
    }

    #[test]
    fn the_allgather_ring_splits_the_kernel_and_keeps_its_work() {
        let ops = ops(CpRing::PytorchAllgather, attn(8), share(8));
        let names: Vec<&str> = ops.iter().map(LayerOp::name).collect();
        assert_eq!(names, ["cp_kv", "flash_attn", "cp_dkv", "flash_attn_ring", "cp_merge", "cp_dkv_last"]);
        let flops = |f: fn(&OpSpec) -> f64| {
            ops.iter().filter_map(LayerOp::compute).filter(|s| s.name != "cp_merge").map(f).sum::<f64>()
        };
        let whole = attn(8);
        assert!((flops(|s| s.forward_flops) / whole.forward_flops - 1.0).abs() < 1e-12);
        assert!((flops(|s| s.backward_flops) / whole.backward_flops - 1.0).abs() < 1e-12);
        // The local step is one of the cp steps' worth of work under the causal balancing.
        let local = ops[1].compute().unwrap();
        assert!((local.forward_flops / whole.forward_flops - 1.0 / 8.0).abs() < 1e-12);
        // The remote steps hold every rank's keys and values while they run.
        let remote = ops[3].compute().unwrap();
        assert!(remote.saved.transient_bytes[0] >= 8.0 * 2.0 * share(8).keys_values);
    }

    #[test]
    fn pytorch_merges_in_fp32_and_sends_fp32_gradients() {
        let te = ops(CpRing::TeP2p, attn(4), share(4));
        let pt = ops(CpRing::PytorchAlltoall, attn(4), share(4));
        let bytes = |ops: &[LayerOp], name: &str| {
            ops.iter().find_map(|o| match o {
                LayerOp::Comm { name: n, bytes, .. } if *n == name => Some(*bytes),
                _ => None,
            })
        };
        assert_eq!(bytes(&pt, "cp_kv"), bytes(&te, "cp_kv"));
        assert_eq!(bytes(&pt, "cp_dkv").unwrap(), 2.0 * bytes(&te, "cp_dkv").unwrap());
        // Transformer Engine's fused 16-bit corrections move a fraction of PyTorch's fp32 merging.
        let merge_bytes = |ops: &[LayerOp]| {
            let m = ops.iter().filter_map(LayerOp::compute).find(|s| s.name == "cp_merge").unwrap();
            m.forward_bytes + m.backward_bytes
        };
        assert!(merge_bytes(&te) < 0.25 * merge_bytes(&pt), "{} {}", merge_bytes(&te), merge_bytes(&pt));
        // The merges grow with the ring's steps: more than one pass over the output per step.
        let merge = |cp| ops(CpRing::PytorchAlltoall, attn(cp), share(cp))[3].compute().unwrap().forward_bytes;
        let o = share(2).output;
        assert!(merge(8) - merge(4) > 4.0 * 2.0 * o, "{} {}", merge(8), merge(4));
    }
}
