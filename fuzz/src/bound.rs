//! What the checks know about a scenario without trusting the binary: its device count, the
//! fastest device's peak at the training precision, and a lower bound on the model FLOPs of
//! one iteration (6 x matmul parameters x tokens for a token-input transformer).

use crate::presets::Catalog;
use serde_json::Value;

/// Facts drawn from the scenario file itself; `None` where the file does not settle them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Context {
    pub devices: Option<u128>,
    /// The largest peak FLOP/s of any device in the cluster at the training precision.
    pub peak_flops: Option<f64>,
    /// A lower bound on the FLOPs of one training iteration (forward + backward).
    pub min_flops: Option<f64>,
    pub layers: Option<u64>,
    pub seq_len: Option<u64>,
    pub global_batch: Option<u64>,
    /// Degrees and micro-batches per replica the user asked for.
    pub dp: Option<u64>,
    pub pp: Option<u64>,
    pub micro_batches: Option<u64>,
    pub epochs: Option<u64>,
    /// `run.variability.iteration_jitter` above 0: a run may end before its mean useful time.
    pub jitter: bool,
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite() && *x > 0.0)
}

/// Peak FLOP/s of a device spec (as printed by `presets --json` or written in a scenario)
/// at `precision`, with the simulator's fall-back chain (`PeakFlops::at`); if the chain finds
/// nothing, the largest rate given (so the bound stays conservative).
fn device_peak(d: &Value, cat: &Catalog, precision: &str) -> Option<f64> {
    let base = match d {
        Value::String(name) => return device_peak(cat.device(name)?, cat, precision),
        Value::Object(m) => m,
        _ => return None,
    };
    let mut rates: [Option<f64>; 4] = [None; 4]; // fp32, fp16, bf16, fp8
    if let Some(p) = base.get("preset").and_then(Value::as_str).and_then(|n| cat.device(n)) {
        rates = rates_of(p.get("peak_flops"));
    }
    if let (Some(dsp), Some(clock)) = (base.get("dsp_count").and_then(num), base.get("clock_hz").and_then(num)) {
        let p = dsp * clock * base.get("ops_per_dsp_per_cycle").and_then(num).unwrap_or(1.0);
        rates = [Some(0.4 * p), Some(p), Some(p), Some(2.0 * p)];
    }
    if let Some(pf) = base.get("peak_flops") {
        rates = rates_of(Some(pf));
    }
    let chain: &[usize] = match precision {
        "fp8" => &[3, 2, 1, 0],
        "fp16" => &[1, 0],
        "fp32" => &[0],
        _ => &[2, 0],
    };
    chain.iter().find_map(|&i| rates[i]).or_else(|| rates.iter().flatten().copied().reduce(f64::max))
}

fn rates_of(pf: Option<&Value>) -> [Option<f64>; 4] {
    match pf {
        Some(Value::Number(_)) => [pf.and_then(num); 4],
        Some(Value::Object(m)) => ["fp32", "fp16", "bf16", "fp8"].map(|k| m.get(k).and_then(num)),
        _ => [None; 4],
    }
}

/// (device spec, devices per node) of the scenario's node.
fn node_device(n: &Value, cat: &Catalog) -> Option<(Value, u64)> {
    match n {
        Value::String(name) => cat.node(name).map(|n| (n.device.clone(), n.devices as u64)),
        Value::Object(m) => {
            let preset = m.get("preset").and_then(Value::as_str).and_then(|p| cat.node(p));
            let device = m.get("device").cloned().or_else(|| preset.map(|p| p.device.clone()))?;
            let devices = m.get("devices").and_then(Value::as_u64).or_else(|| preset.map(|p| p.devices as u64))?;
            Some((device, devices))
        }
        _ => None,
    }
}

/// Matmul parameters of one layer of a transformer: Q and O (h x h each), K and V (h x h x
/// kv/heads each), the MLP's two h x ffn matrices (SwiGLU's third is left out: a lower bound).
fn layer_matmul_params(hidden: f64, heads: f64, kv_heads: f64, ffn: f64) -> f64 {
    2.0 * hidden * hidden + 2.0 * hidden * hidden * kv_heads / heads + 2.0 * hidden * ffn
}

impl Context {
    pub fn of(v: &Value, cat: &Catalog) -> Context {
        let mut c = Context::default();
        let u = |p: &str| v.pointer(p).and_then(Value::as_u64).filter(|x| *x > 0);
        let training = |k: &str| u(&format!("/training/{k}"));
        c.global_batch = training("global_batch");
        c.seq_len = training("seq_len");
        c.epochs = u("/run/epochs");
        c.jitter = v.pointer("/run/variability/iteration_jitter").and_then(Value::as_f64).is_some_and(|j| j > 0.0);
        let precision = v.pointer("/training/precision").and_then(Value::as_str).unwrap_or("bf16");
        let node = v.pointer("/cluster/node").and_then(|n| node_device(n, cat));
        if let (Some((device, per_node)), Some(nodes)) = (&node, u("/cluster/nodes")) {
            c.devices = Some(*per_node as u128 * nodes as u128);
            let mut peaks = vec![device_peak(device, cat, precision)];
            if let Some(Value::Array(o)) = v.pointer("/cluster/device_overrides") {
                peaks.extend(o.iter().map(|x| x.get("device").and_then(|d| device_peak(d, cat, precision))));
            }
            let peaks: Option<Vec<f64>> = peaks.into_iter().collect();
            c.peak_flops = peaks.and_then(|p| p.into_iter().reduce(f64::max));
        }
        let dev = c.devices.map(|d| d as u64);
        let tp = u("/plan/tp").unwrap_or(1);
        c.pp = u("/plan/pp").or(Some(1));
        c.dp = u("/plan/dp").or(Some(1));
        if let (Some(d), Some(dp), Some(pp)) = (dev, c.dp, c.pp)
            && dp * tp * pp != d
        {
            c.dp = None;
            c.pp = None;
        }
        let micro = training("micro_batch").unwrap_or(1);
        // Token slicing pipelines slices, not micro-batches: its unit count is its own.
        let sliced = v.pointer("/plan/token_slices").is_some_and(|t| !t.is_null());
        if let (Some(gb), Some(dp), false) = (c.global_batch, c.dp, sliced)
            && gb.is_multiple_of(dp * micro)
        {
            c.micro_batches = Some(gb / dp / micro);
        }
        // The workload's shape, for a token-input transformer.
        let w = v.get("workload");
        let t = w.and_then(|w| w.get("transformer"));
        let shape = if let Some(t) = t {
            let g = |k: &str| t.get(k).and_then(Value::as_u64).filter(|x| *x > 0).map(|x| x as f64);
            let (h, heads) = (g("hidden"), g("heads"));
            c.layers = t.get("layers").and_then(Value::as_u64);
            // Experts: a token's MLP is its top-k experts and the shared ones, which may be
            // narrower than the dense `ffn_hidden`; latent attention and a head width of its own
            // change the attention projections (no bound from them).
            let moe = t.get("moe");
            let mg = |k: &str| moe.and_then(|m| m.get(k)).and_then(Value::as_f64);
            let ffn = |h: f64| {
                let dense = g("ffn_hidden").unwrap_or(4.0 * h);
                match moe {
                    Some(_) => dense.min(
                        mg("top_k").unwrap_or(0.0) * mg("expert_ffn").unwrap_or(dense)
                            + mg("shared_ffn").unwrap_or(0.0),
                    ),
                    None => dense,
                }
            };
            let plain = t.get("mla").is_none() && t.get("head_dim").is_none();
            h.zip(heads).filter(|_| plain).map(|(h, n)| (h, n, g("kv_heads").unwrap_or(n), ffn(h)))
        } else if let Some(p) = w.and_then(|w| w.get("preset")).and_then(Value::as_str).and_then(|p| cat.workload(p)) {
            c.layers = Some(p.layers as u64);
            if !p.tokens {
                // Image patches fix the sequence (ViT: patches + class token), whatever was given.
                c.seq_len = None;
            }
            (p.tokens && p.heads > 0)
                .then(|| (p.hidden as f64, p.heads as f64, p.kv_heads.max(1) as f64, p.ffn_hidden as f64))
        } else {
            None
        };
        let frozen = v.pointer("/plan/freeze").is_some();
        if let (Some((h, heads, kv, ffn)), Some(l), Some(gb), Some(s), false) =
            (shape, c.layers, c.global_batch, c.seq_len, frozen)
        {
            c.min_flops = Some(6.0 * layer_matmul_params(h, heads, kv, ffn) * l as f64 * gb as f64 * s as f64);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn devices_and_peak_come_from_the_presets() {
        let cat = crate::presets::tests::small_catalog();
        let v = json!({"workload": {"preset": "gpt3-125m"}, "cluster": {"node": "dgx-1-v100", "nodes": 3},
            "training": {"global_batch": 8, "seq_len": 2048}, "plan": {"dp": 24}});
        let c = Context::of(&v, &cat);
        assert_eq!(c.devices, Some(24));
        // V100 has no bf16: the simulator falls back to fp32.
        assert_eq!(c.peak_flops, Some(1.57e13));
        let per_layer = 2.0 * 768.0 * 768.0 * 2.0 + 2.0 * 768.0 * 3072.0;
        assert_eq!(c.min_flops, Some(6.0 * per_layer * 12.0 * 8.0 * 2048.0));
        assert_eq!((c.dp, c.pp, c.micro_batches), (Some(24), Some(1), None));
        // A CNN preset: the given seq_len is not the one simulated.
        let cnn = json!({"workload": {"preset": "vgg16"}, "training": {"global_batch": 8, "seq_len": 8}});
        assert_eq!(Context::of(&cnn, &cat).seq_len, None);
    }

    #[test]
    fn custom_devices_fpga_fabric_and_overrides() {
        let cat = crate::presets::tests::small_catalog();
        let v = json!({"cluster": {"node": {"devices": 2, "device": {"dsp_count": 10, "clock_hz": 1e9}},
            "nodes": 1, "device_overrides": [{"devices": [1, 1], "device": {"peak_flops": 5e10}}]},
            "training": {"precision": "fp32"}});
        let c = Context::of(&v, &cat);
        // fp32 on the fabric: 0.4 x 1e10; the override's 5e10 is larger.
        assert_eq!(c.peak_flops, Some(5e10));
        assert_eq!(c.devices, Some(2));
    }
}
