//! Networks that are not a stack of identical transformer layers: CNNs (VGG-16, ResNet-50)
//! and recurrent translation models (GNMT), as a sequence of layers, each its own ops.
//!
//! A convolution is costed as the GEMM it lowers to (im2col: m = batch x output pixels,
//! n = output channels, k = input channels x kernel area) plus its bias/normalisation and
//! activation as memory-bound ops; a layer keeps its inputs for backward. An LSTM layer is
//! the input projection over the whole sequence (one GEMM) and one small GEMM per time step
//! for the recurrence, with the gates as memory-bound ops. Sizes follow the architectures'
//! papers (Simonyan & Zisserman 2015 config D; He et al. 2016 ResNet-50; Wu et al. 2016 GNMT
//! with MLPerf's 1024-wide layers and 32k vocabulary).

use super::{LayerOp, OpClass, OpSpec, Saved};
use serde::Serialize;

/// What a layer computes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NetOp {
    /// A k x k convolution over a `size` x `size` input (`stride`, padding keeps size/stride),
    /// with bias or batch norm and ReLU.
    Conv { c_in: u32, c_out: u32, k: u32, size: u32, stride: u32 },
    /// Pooling (max or average) from `size` to `size / factor`.
    Pool { channels: u32, size: u32, factor: u32 },
    /// A residual addition over `elems` per sample.
    Add { elems: u32 },
    /// A fully connected layer over `rows` rows per sample.
    Linear { inputs: u32, outputs: u32, rows: u32 },
    /// An LSTM layer over `steps` time steps.
    Lstm { inputs: u32, hidden: u32, steps: u32 },
    /// An embedding lookup of `rows` tokens per sample.
    Embedding { vocab: u32, width: u32, rows: u32 },
    /// Softmax cross-entropy over `classes` for `rows` rows per sample.
    Loss { classes: u32, rows: u32 },
}

impl NetOp {
    pub fn parameters(&self) -> f64 {
        match *self {
            NetOp::Conv { c_in, c_out, k, .. } => (c_in * k * k * c_out + 2 * c_out) as f64,
            NetOp::Linear { inputs, outputs, .. } => (inputs * outputs + outputs) as f64,
            NetOp::Lstm { inputs, hidden, .. } => 4.0 * hidden as f64 * (inputs + hidden) as f64 + 8.0 * hidden as f64,
            NetOp::Embedding { vocab, width, .. } => vocab as f64 * width as f64,
            _ => 0.0,
        }
    }

    /// Output elements per sample.
    pub fn output_elems(&self) -> f64 {
        match *self {
            NetOp::Conv { c_out, size, stride, .. } => c_out as f64 * (size / stride) as f64 * (size / stride) as f64,
            NetOp::Pool { channels, size, factor } => channels as f64 * (size / factor) as f64 * (size / factor) as f64,
            NetOp::Add { elems } => elems as f64,
            NetOp::Linear { outputs, rows, .. } => (outputs * rows) as f64,
            NetOp::Lstm { hidden, steps, .. } => (hidden * steps) as f64,
            NetOp::Embedding { width, rows, .. } => (width * rows) as f64,
            NetOp::Loss { .. } => 1.0,
        }
    }

    fn ops(&self, name: &'static str, b: f64, e: f64, out: &mut Vec<LayerOp>) {
        let gemm = |name, batch: f64, m: f64, n: f64, k: f64, kept: f64| {
            let flops = 2.0 * batch * m * n * k;
            LayerOp::Compute(OpSpec {
                name,
                class: OpClass::Gemm { batch, m, n, k },
                forward_flops: flops,
                forward_bytes: batch * e * (m * k + k * n + m * n),
                backward_flops: 2.0 * flops,
                backward_bytes: 2.0 * batch * e * (m * k + k * n + m * n),
                saved: Saved { replicated_bytes: kept, ..Saved::default() },
            })
        };
        let mem = |name, elems: f64, kept: f64| {
            LayerOp::Compute(OpSpec {
                name,
                class: OpClass::Memory,
                forward_flops: 0.0,
                forward_bytes: 2.0 * elems * e,
                backward_flops: 0.0,
                backward_bytes: 3.0 * elems * e,
                saved: Saved { replicated_bytes: kept, ..Saved::default() },
            })
        };
        match *self {
            NetOp::Conv { c_in, c_out, k, size, stride } => {
                let pixels = ((size / stride) * (size / stride)) as f64;
                let input = b * (c_in * size * size) as f64;
                out.push(gemm(name, 1.0, b * pixels, c_out as f64, (c_in * k * k) as f64, e * input));
                let outs = b * pixels * c_out as f64;
                out.push(mem("norm_relu", outs, e * outs));
            }
            NetOp::Pool { .. } => {
                let inp = b * self.output_elems() * 4.0;
                out.push(mem("pool", inp, e * inp));
            }
            NetOp::Add { elems } => out.push(mem("residual", 1.5 * b * elems as f64, 0.0)),
            NetOp::Linear { inputs, outputs, rows } => {
                let m = b * rows as f64;
                out.push(gemm(name, 1.0, m, outputs as f64, inputs as f64, e * m * inputs as f64));
            }
            NetOp::Lstm { inputs, hidden, steps } => {
                let h4 = 4.0 * hidden as f64;
                let m = b * steps as f64;
                out.push(gemm("lstm_input", 1.0, m, h4, inputs as f64, e * m * inputs as f64));
                // The recurrence: one small GEMM per step, in order, and the gates.
                for _ in 0..steps {
                    out.push(gemm("lstm_step", 1.0, b, h4, hidden as f64, e * b * (hidden as f64 + h4)));
                    out.push(mem("lstm_gates", b * h4, e * b * h4));
                }
            }
            NetOp::Embedding { width, rows, .. } => out.push(mem("embedding", b * (width * rows) as f64, 0.0)),
            NetOp::Loss { classes, rows } => {
                let elems = b * (classes * rows) as f64;
                out.push(mem("loss", 3.0 * elems, 4.0 * elems));
            }
        }
    }
}

/// One partitionable layer: a name and the ops it runs in order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NetLayer {
    pub name: String,
    pub ops: Vec<NetOp>,
    /// Elements this layer passes to the next one per sample (what crosses a stage boundary).
    pub output_elems: f64,
}

impl NetLayer {
    pub fn parameters(&self) -> f64 {
        self.ops.iter().map(NetOp::parameters).sum()
    }

    /// The layer's ops for a micro-batch of `b` samples at `e` bytes per element.
    pub fn layer_ops(&self, b: u32, e: f64) -> Vec<LayerOp> {
        let mut out = Vec::new();
        let name: &'static str = match self.ops.first() {
            Some(NetOp::Conv { .. }) => "conv",
            Some(NetOp::Linear { .. }) => "fc",
            _ => "layer",
        };
        for op in &self.ops {
            op.ops(name, b as f64, e, &mut out);
        }
        out
    }

    /// Forward FLOPs per sample.
    pub fn forward_flops_per_sample(&self) -> f64 {
        self.layer_ops(1, 2.0).iter().filter_map(LayerOp::compute).map(|o| o.forward_flops).sum()
    }
}

/// A sequential network.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Net {
    pub layers: Vec<NetLayer>,
}

impl Net {
    pub fn parameters(&self) -> f64 {
        self.layers.iter().map(NetLayer::parameters).sum()
    }

    /// Tokens one sample holds: a recurrent net's time steps, one for an image.
    pub fn tokens_per_sample(&self) -> u32 {
        self.layers
            .iter()
            .flat_map(|l| &l.ops)
            .filter_map(|o| match *o {
                NetOp::Lstm { steps, .. } => Some(steps),
                _ => None,
            })
            .max()
            .unwrap_or(1)
    }
}

fn layer(name: &str, ops: Vec<NetOp>) -> NetLayer {
    let output_elems = ops.iter().rev().find(|o| !matches!(o, NetOp::Loss { .. })).map_or(1.0, NetOp::output_elems);
    NetLayer { name: name.to_string(), ops, output_elems }
}

/// VGG-16 (configuration D) on 224 x 224 images: 13 convolutions (pools folded into the
/// convolution before them) and 3 fully connected layers; 138.4M parameters.
pub fn vgg16(classes: u32) -> Net {
    let cfg: [(u32, u32, bool); 13] = [
        (64, 224, false),
        (64, 224, true),
        (128, 112, false),
        (128, 112, true),
        (256, 56, false),
        (256, 56, false),
        (256, 56, true),
        (512, 28, false),
        (512, 28, false),
        (512, 28, true),
        (512, 14, false),
        (512, 14, false),
        (512, 14, true),
    ];
    let mut layers = Vec::new();
    let mut c_in = 3;
    for (i, &(c, size, pool)) in cfg.iter().enumerate() {
        let mut ops = vec![NetOp::Conv { c_in, c_out: c, k: 3, size, stride: 1 }];
        if pool {
            ops.push(NetOp::Pool { channels: c, size, factor: 2 });
        }
        layers.push(layer(&format!("conv{}", i + 1), ops));
        c_in = c;
    }
    layers.push(layer("fc1", vec![NetOp::Linear { inputs: 512 * 7 * 7, outputs: 4096, rows: 1 }]));
    layers.push(layer("fc2", vec![NetOp::Linear { inputs: 4096, outputs: 4096, rows: 1 }]));
    layers.push(layer(
        "fc3",
        vec![NetOp::Linear { inputs: 4096, outputs: classes, rows: 1 }, NetOp::Loss { classes, rows: 1 }],
    ));
    Net { layers }
}

/// ResNet-50 on 224 x 224 images: the stem, 16 bottleneck blocks and the head; 25.6M
/// parameters.
pub fn resnet50(classes: u32) -> Net {
    let mut layers = vec![layer(
        "stem",
        vec![
            NetOp::Conv { c_in: 3, c_out: 64, k: 7, size: 224, stride: 2 },
            NetOp::Pool { channels: 64, size: 112, factor: 2 },
        ],
    )];
    let mut c_in = 64;
    let mut size = 56;
    for (stage, &(width, blocks)) in [(64u32, 3u32), (128, 4), (256, 6), (512, 3)].iter().enumerate() {
        for blk in 0..blocks {
            let stride = if blk == 0 && stage > 0 { 2 } else { 1 };
            let out = 4 * width;
            let mut ops = vec![
                NetOp::Conv { c_in, c_out: width, k: 1, size, stride: 1 },
                NetOp::Conv { c_in: width, c_out: width, k: 3, size, stride },
                NetOp::Conv { c_in: width, c_out: out, k: 1, size: size / stride, stride: 1 },
            ];
            if blk == 0 {
                ops.push(NetOp::Conv { c_in, c_out: out, k: 1, size, stride });
            }
            size /= stride;
            ops.push(NetOp::Add { elems: out * size * size });
            layers.push(layer(&format!("block{}_{}", stage + 2, blk + 1), ops));
            c_in = out;
        }
    }
    layers.push(layer(
        "head",
        vec![
            NetOp::Pool { channels: 2048, size: 7, factor: 7 },
            NetOp::Linear { inputs: 2048, outputs: classes, rows: 1 },
            NetOp::Loss { classes, rows: 1 },
        ],
    ));
    Net { layers }
}

/// GNMT with `lstm_layers` LSTM layers (half encoder, half decoder), 1024 wide, a 32k
/// vocabulary and `steps`-token sentences; attention folded into the first decoder layer.
pub fn gnmt(lstm_layers: u32, steps: u32) -> Net {
    let (h, vocab) = (1024, 32320);
    let half = lstm_layers / 2;
    let mut layers = Vec::new();
    for i in 0..half {
        let mut ops = Vec::new();
        if i == 0 {
            ops.push(NetOp::Embedding { vocab, width: h, rows: steps });
        }
        ops.push(NetOp::Lstm { inputs: h, hidden: h, steps });
        layers.push(layer(&format!("encoder{}", i + 1), ops));
    }
    for i in 0..half {
        let mut ops = Vec::new();
        if i == 0 {
            ops.push(NetOp::Embedding { vocab, width: h, rows: steps });
            // Attention over the encoder's outputs: scores and context per step.
            ops.push(NetOp::Linear { inputs: h, outputs: h, rows: steps });
        }
        ops.push(NetOp::Lstm { inputs: if i == 0 { 2 * h } else { h }, hidden: h, steps });
        layers.push(layer(&format!("decoder{}", i + 1), ops));
    }
    layers.push(layer(
        "classifier",
        vec![NetOp::Linear { inputs: h, outputs: vocab, rows: steps }, NetOp::Loss { classes: vocab, rows: steps }],
    ));
    // Decoder stages also carry the encoder's outputs forward.
    for l in layers.iter_mut().skip(half as usize) {
        l.output_elems += (h * steps) as f64;
    }
    Net { layers }
}
