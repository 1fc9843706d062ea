//! The ops of each block (a transformer layer, the embedding, the head, a net's layer),
//! created once per unit shape and device class and shared by every step that runs them.

use super::builder::Builder;
use super::program::NONE;
use crate::plan::{Recompute, RecomputeModules, Unit};
use crate::scenario::Scenario;
use crate::workload::{LayerOp, LayerShape, TpMode};

/// The ops of one kind of block (a transformer layer, the embedding, the head), with their
/// op-instance ids for forward and backward.
pub(super) struct Block {
    pub(super) ops: Vec<LayerOp>,
    pub(super) fwd: Vec<u32>,
    pub(super) bwd: Vec<u32>,
    /// Activation bytes kept for backward under the plan's recomputation.
    pub(super) saved: f64,
    /// Activation bytes kept without recomputation (what a full recomputation rebuilds).
    pub(super) saved_full: f64,
    /// How many of `ops` a recomputation that stops early reruns (see
    /// [`crate::workload::recompute::early_stop_end`]), decided once per block.
    pub(super) early_stop_end: usize,
    /// Under selective recomputation, which of `ops` run again before the backward
    /// (`workload::recompute::selective`); all false otherwise.
    pub(super) rerun: Vec<bool>,
    /// Bytes each op holds only while its forward and its backward run (`Saved::transient_bytes`).
    pub(super) transient: Vec<[f64; 2]>,
    /// The recomputation this block runs before its backward (the plan's, or none on the
    /// layers past `plan.recompute_layers`).
    pub(super) recompute: Recompute,
}

/// The blocks of one unit shape, and what crosses a stage boundary for it.
pub(super) struct UnitBlocks {
    /// Distinct layer blocks (one for a transformer, one per layer for a net).
    layers: Vec<Block>,
    /// Block of each layer.
    kind_of: Vec<usize>,
    pub(super) embed: Block,
    pub(super) head: Block,
    /// The trainer's metrics over the logits after each micro-batch's backward (no ops
    /// without `training.framework.train_metrics`).
    pub(super) metrics: Block,
    /// Whether the embedding and head exist as blocks (a net folds them into its layers).
    pub(super) edges: bool,
    /// Bytes each layer's output puts on a stage boundary.
    pub(super) boundary: Vec<f64>,
}

impl UnitBlocks {
    pub(super) fn layer(&self, l: u32) -> &Block {
        &self.layers[self.kind_of[l as usize]]
    }
}

/// The blocks of every distinct unit shape (micro-batches, or TeraPipe's token slices) per
/// device class (a heterogeneous cluster times each class's ops on its own device), and the
/// shape of each unit: `(blocks[shape][class], shape_of[unit])`.
pub(super) fn unit_blocks(b: &mut Builder, s: &Scenario, units: &[Unit]) -> (Vec<Vec<UnitBlocks>>, Vec<usize>) {
    let mut shapes: Vec<Unit> = Vec::new();
    let classes = s.cluster.overrides.len() as u16 + 1;
    let mut blocks: Vec<Vec<UnitBlocks>> = Vec::new();
    let mut shape_of = Vec::with_capacity(units.len());
    for u in units {
        let i = match shapes.iter().position(|x| x == u) {
            Some(i) => i,
            None => {
                shapes.push(*u);
                let per_class = (0..classes)
                    .map(|cl| {
                        b.class = cl;
                        unit_blocks_for(b, s, *u)
                    })
                    .collect();
                b.class = 0;
                blocks.push(per_class);
                shapes.len() - 1
            }
        };
        shape_of.push(i);
    }
    (blocks, shape_of)
}

fn unit_blocks_for(b: &mut Builder, s: &Scenario, u: Unit) -> UnitBlocks {
    let plan = &s.plan;
    let w = &s.workload.transformer;
    let e = plan.precision.activation_bytes();
    if let Some(net) = &s.workload.net {
        let boundary: Vec<f64> = net.layers.iter().map(|l| e * u.batch as f64 * l.output_elems).collect();
        let layers = net
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                // Full recomputation keeps the layer's input.
                let input = if i == 0 { 0.0 } else { boundary[i - 1] };
                b.block(l.layer_ops(u.batch, e), plan.layer_recompute(i as u32), plan.recompute_modules, input)
            })
            .collect();
        let empty = b.block(Vec::new(), Recompute::None, RecomputeModules::default(), 0.0);
        let empty2 = b.block(Vec::new(), Recompute::None, RecomputeModules::default(), 0.0);
        let empty3 = b.block(Vec::new(), Recompute::None, RecomputeModules::default(), 0.0);
        return UnitBlocks {
            layers,
            kind_of: (0..net.layers.len()).collect(),
            embed: empty,
            head: empty2,
            metrics: empty3,
            edges: false,
            boundary,
        };
    }
    let shape = LayerShape {
        micro_batch: u.batch,
        seq_len: u.tokens / plan.cp,
        tp: plan.tp,
        tp_mode: plan.tp_mode,
        ep: plan.ep,
        cp: plan.cp,
        context: u.context,
        sequence_parallel: plan.sequence_parallel,
        attention: plan.attention,
        fusion: plan.fusion,
        activation_bytes: e,
    };
    let boundary_bytes = e * u.batch as f64 * (u.tokens / plan.cp) as f64 * w.hidden as f64
        / if plan.sequence_parallel || plan.ring() { plan.tp as f64 } else { 1.0 };
    // A mixture-of-experts model's dense layers come first (DeepSeek-V3's three): two kinds.
    let mut kind_ops = vec![w.layer_ops(shape)];
    let mut kind_of = vec![0; w.layers as usize];
    if w.mixed_layers() {
        kind_ops.push(w.layer_ops_at(0, shape));
        for (l, k) in kind_of.iter_mut().enumerate() {
            if !w.is_moe_layer(l as u32) {
                *k = 1;
            }
        }
    }
    let mut layers: Vec<Block> = kind_ops
        .iter()
        .map(|ops| b.block(ops.clone(), plan.recompute, plan.recompute_modules, boundary_bytes))
        .collect();
    // Under `plan.recompute_layers`, each kind again without recomputation, for the layers
    // past the first ones of their chunk.
    if plan.recompute_layers.is_some() {
        let kinds = layers.len();
        layers.extend(
            kind_ops.into_iter().map(|ops| b.block(ops, Recompute::None, plan.recompute_modules, boundary_bytes)),
        );
        for (l, k) in kind_of.iter_mut().enumerate() {
            if plan.layer_recompute(l as u32) == Recompute::None {
                *k += kinds;
            }
        }
    }
    // Under ring sequence parallelism the embedding and head are whole on each device, on
    // its share of the tokens.
    let edge_shape = if plan.ring() {
        LayerShape { seq_len: u.tokens / plan.tp, tp: 1, tp_mode: TpMode::OneD, ..shape }
    } else {
        shape
    };
    // Embedding and head are not recomputed.
    let embed = b.block(w.embedding_ops(edge_shape), Recompute::None, RecomputeModules::default(), 0.0);
    let head = b.block(w.head_ops(edge_shape), Recompute::None, RecomputeModules::default(), 0.0);
    let metrics = b.block(
        w.metric_ops(edge_shape, &plan.framework.train_metrics),
        Recompute::None,
        RecomputeModules::default(),
        0.0,
    );
    UnitBlocks { layers, kind_of, embed, head, metrics, edges: true, boundary: vec![boundary_bytes; w.layers as usize] }
}

impl Builder {
    /// The forward and backward op instances of a block's compute ops, and what it keeps for
    /// backward (under full recomputation, only its input of `full_input_bytes`).
    fn block(
        &mut self,
        ops: Vec<LayerOp>,
        recompute: Recompute,
        modules: RecomputeModules,
        full_input_bytes: f64,
    ) -> Block {
        let mut fwd = Vec::new();
        let mut bwd = Vec::new();
        let mut saved_none = 0.0;
        for op in &ops {
            match op {
                LayerOp::Compute(spec) => {
                    fwd.push(self.op(spec, false));
                    bwd.push(self.op(spec, true));
                    saved_none += spec.saved.bytes(Recompute::None);
                }
                LayerOp::Comm { .. } => {
                    fwd.push(NONE);
                    bwd.push(NONE);
                }
            }
        }
        let (saved, rerun) = match recompute {
            Recompute::Full => (full_input_bytes, vec![false; ops.len()]),
            Recompute::None => (saved_none, vec![false; ops.len()]),
            Recompute::Selective => {
                let sel = crate::workload::recompute::selective(&ops, modules, full_input_bytes);
                (sel.iter().map(|o| o.kept).sum(), sel.iter().map(|o| o.rerun).collect())
            }
        };
        let early_stop_end = crate::workload::recompute::early_stop_end(&ops);
        let transient = ops.iter().map(|op| op.compute().map_or([0.0; 2], |s| s.saved.transient_bytes)).collect();
        Block { ops, fwd, bwd, saved, saved_full: saved_none, early_stop_end, rerun, transient, recompute }
    }
}
