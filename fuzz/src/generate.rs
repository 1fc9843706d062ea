//! Valid but unusual scenarios: every key the parser accepts (see `sim/src/scenario/`),
//! with values drawn towards the edges of what is legal. Most draws respect the cross-key
//! rules (dp x tp x pp = devices, tp divides the heads and stays in a node, whole
//! micro-batches, ...) so that the simulator itself is reached; a few break them by chance.

use crate::presets::{Catalog, WorkloadInfo};
use crate::rng::R;
use serde_json::{Map, Value, json};

/// A generated scenario, the side files it names, and what the checks need to know about it.
#[derive(Clone, Debug, Default)]
pub struct Scenario {
    pub value: Value,
    /// Side files (a Hugging Face config, a gradient trace), named relative to the scenario.
    pub files: Vec<(String, Vec<u8>)>,
    /// Devices in the cluster and the data-parallel / pipeline degrees drawn.
    pub devices: u64,
    pub dp: u64,
    pub pp: u64,
    /// Micro-batches per replica drawn.
    pub micro_batches: u64,
    /// Coarse features, used to tell timeouts apart ("devices>=256", "bucket<64KiB", ...).
    pub tags: Vec<String>,
}

const NAMES: [&str; 6] = ["x", "fuzz scenario", "modèle à l'échelle", "模型", "🚂 train", ""];

fn divisors(n: u64) -> Vec<u64> {
    (1..=n.min(4096)).filter(|d| n.is_multiple_of(*d)).collect()
}

/// A draw that is usually small and sometimes extreme.
fn count(r: &mut R, small: &[u64], extreme: (u64, u64), p_extreme: f64) -> u64 {
    if r.chance(p_extreme) { r.int(extreme.0, extreme.1) } else { *r.pick(small) }
}

fn opt(m: &mut Map<String, Value>, r: &mut R, p: f64, k: &str, v: impl FnOnce(&mut R) -> Value) {
    if r.chance(p) {
        let x = v(r);
        m.insert(k.into(), x);
    }
}

fn workload(r: &mut R, cat: &Catalog, s: &mut Scenario) -> (Value, WorkloadInfo) {
    let roll = r.unit(0.0, 1.0);
    if roll < 0.35 {
        let w = r.pick(&cat.workloads).clone();
        s.tags.push(format!("preset:{}", w.name));
        return (json!({"preset": w.name}), w);
    }
    let heads = *r.pick(&[1u64, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64]);
    let head_dim = *r.pick(&[1u64, 2, 8, 16, 64, 128]);
    let hidden = heads * head_dim;
    let layers = count(r, &[1, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32], (33, 300), 0.08);
    let vocab = count(r, &[1, 2, 1000, 32000, 50257, 128256], (1, 300_000), 0.2);
    let kv = *r.pick(&divisors(heads));
    let ffn = if r.chance(0.4) { r.int(1, 8 * hidden) } else { 4 * hidden };
    let mut info = WorkloadInfo {
        name: "custom".into(),
        layers: layers as u32,
        heads: heads as u32,
        hidden,
        ffn_hidden: ffn,
        kv_heads: kv as u32,
        tokens: true,
        causal: true,
        experts: 0,
    };
    if roll < 0.85 {
        let mut t = Map::new();
        t.insert("layers".into(), json!(layers));
        t.insert("hidden".into(), json!(hidden));
        t.insert("heads".into(), json!(heads));
        t.insert("vocab".into(), json!(vocab));
        if ffn != 4 * hidden || r.chance(0.2) {
            t.insert("ffn_hidden".into(), json!(ffn));
        }
        if kv != heads || r.chance(0.2) {
            t.insert("kv_heads".into(), json!(kv));
        }
        let causal = r.chance(0.8);
        info.causal = causal;
        if !causal || r.chance(0.3) {
            t.insert("causal".into(), json!(causal));
        }
        opt(&mut t, r, 0.3, "max_positions", |r| json!(*r.pick(&[0u64, 1, 512, 2048, 8192, 131072])));
        opt(&mut t, r, 0.3, "mlp", |r| json!(*r.pick(&["gelu", "swiglu"])));
        opt(&mut t, r, 0.3, "norm", |r| json!(*r.pick(&["layernorm", "rmsnorm"])));
        for k in ["bias", "dropout", "tied_embeddings"] {
            opt(&mut t, r, 0.25, k, |r| json!(r.chance(0.5)));
        }
        info.experts = experts(r, &mut t, layers, hidden);
        let mut w = Map::new();
        w.insert("transformer".into(), Value::Object(t));
        opt(&mut w, r, 0.3, "name", |r| json!(*r.pick(&NAMES)));
        return (Value::Object(w), info);
    }
    // A Hugging Face config.json in the case's folder.
    let mut c = Map::new();
    let pick_key = |r: &mut R, ks: &[&'static str]| *r.pick(ks);
    c.insert(pick_key(r, &["num_hidden_layers", "n_layer", "num_layers"]).into(), json!(layers));
    c.insert(pick_key(r, &["hidden_size", "n_embd", "d_model"]).into(), json!(hidden));
    c.insert(pick_key(r, &["num_attention_heads", "n_head"]).into(), json!(heads));
    c.insert("vocab_size".into(), json!(vocab));
    opt(&mut c, r, 0.5, "num_key_value_heads", |_| json!(kv));
    opt(&mut c, r, 0.6, "model_type", |r| json!(*r.pick(&["llama", "gpt2", "mistral", "qwen2", "bert", "gpt_neox"])));
    opt(&mut c, r, 0.4, "hidden_act", |r| json!(*r.pick(&["gelu", "silu", "relu", "gelu_new"])));
    opt(&mut c, r, 0.5, "intermediate_size", |_| json!(ffn));
    opt(&mut c, r, 0.3, "rms_norm_eps", |_| json!(1e-5));
    opt(&mut c, r, 0.3, "rope_theta", |_| json!(10000.0));
    opt(&mut c, r, 0.3, "max_position_embeddings", |r| json!(*r.pick(&[0u64, 1024, 4096])));
    opt(&mut c, r, 0.3, "tie_word_embeddings", |r| json!(r.chance(0.5)));
    opt(&mut c, r, 0.2, "attention_bias", |r| json!(r.chance(0.5)));
    opt(&mut c, r, 0.2, "attention_dropout", |r| json!(*r.pick(&[0.0, 0.1])));
    if r.chance(0.15) {
        // A mixture-of-experts config of a kind the reader knows, or not.
        c.insert(
            "model_type".into(),
            json!(*r.pick(&["mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v3", "dbrx", "olmoe"])),
        );
        let e = count(r, &[1, 2, 8, 64, 256], (257, 100_000), 0.1);
        c.insert(pick_key(r, &["num_local_experts", "num_experts", "n_routed_experts"]).into(), json!(e));
        opt(&mut c, r, 0.9, "num_experts_per_tok", |r| json!(count(r, &[0, 1, 2, 8], (9, 1000), 0.1)));
        opt(&mut c, r, 0.5, "moe_intermediate_size", |r| json!(r.int(1, 4 * hidden)));
        opt(&mut c, r, 0.3, "n_shared_experts", |r| json!(r.int(0, 2)));
        opt(&mut c, r, 0.3, "shared_expert_intermediate_size", |r| json!(r.int(0, 4 * hidden)));
        opt(&mut c, r, 0.3, "first_k_dense_replace", |r| json!(r.int(0, layers + 1)));
        opt(&mut c, r, 0.1, "decoder_sparse_step", |r| json!(r.int(1, 3)));
        opt(&mut c, r, 0.1, "head_dim", |r| json!(*r.pick(&[64u64, 128, 256])));
        if r.chance(0.3) {
            c.insert("kv_lora_rank".into(), json!(r.int(1, 1024)));
            c.insert("qk_nope_head_dim".into(), json!(r.int(1, 192)));
            c.insert("qk_rope_head_dim".into(), json!(r.int(0, 128)));
            c.insert("v_head_dim".into(), json!(r.int(1, 192)));
            opt(&mut c, r, 0.5, "q_lora_rank", |r| json!(r.int(0, 2048)));
        }
        s.tags.push("moe".into());
    }
    s.files.push(("config.json".into(), serde_json::to_vec_pretty(&Value::Object(c)).unwrap_or_default()));
    s.tags.push("hf_config".into());
    let mut w = json!({"hf_config": "config.json"});
    if r.chance(0.3) {
        w["name"] = json!(*r.pick(&NAMES));
    }
    (w, info)
}

/// Sometimes: routed experts, a head width of its own, or latent attention (valid shapes
/// mostly, extremes now and then).
fn experts(r: &mut R, t: &mut Map<String, Value>, layers: u64, hidden: u64) -> u32 {
    let mut routed = 0;
    if r.chance(0.12) {
        let mut m = Map::new();
        let e = count(r, &[2, 2, 4, 8, 16, 64, 256], (257, 1_000_000), 0.05);
        m.insert("experts".into(), json!(e));
        routed = e.min(u32::MAX as u64) as u32;
        m.insert("top_k".into(), json!(r.int(1, e.min(9))));
        opt(&mut m, r, 0.6, "expert_ffn", |r| json!(r.int(1, 4 * hidden.max(1))));
        opt(&mut m, r, 0.3, "shared_ffn", |r| json!(r.int(0, 4 * hidden.max(1))));
        opt(&mut m, r, 0.3, "dense_layers", |r| json!(r.int(0, layers.saturating_sub(1))));
        opt(&mut m, r, 0.3, "capacity_factor", |r| json!(*r.pick(&[0.0, 1.0, 1.25, 2.0])));
        t.insert("moe".into(), Value::Object(m));
    }
    opt(t, r, 0.05, "head_dim", |r| json!(*r.pick(&[1u64, 64, 128, 256])));
    if r.chance(0.04) {
        t.insert(
            "mla".into(),
            json!({"q_lora_rank": r.int(0, 2048), "kv_lora_rank": r.int(1, 1024), "qk_nope_head_dim": r.int(1, 192),
                   "qk_rope_head_dim": r.int(0, 128), "v_head_dim": r.int(1, 192)}),
        );
    }
    routed
}

/// Peak FLOP/s object or number for a custom device, covering `precision` most of the time.
fn peak(r: &mut R, precision: &str) -> Value {
    let p = r.log(1e9, 1e16);
    if r.chance(0.4) {
        return json!(p);
    }
    let mut m = Map::new();
    for k in ["fp32", "fp16", "bf16", "fp8"] {
        if k == precision && r.chance(0.9) || r.chance(0.4) {
            m.insert(k.into(), json!(p * r.unit(0.1, 2.0)));
        }
    }
    if m.is_empty() {
        m.insert("fp32".into(), json!(p));
    }
    Value::Object(m)
}

fn extreme(r: &mut R, lo: f64, hi: f64, edge_lo: f64, edge_hi: f64) -> f64 {
    match r.int(0, 19) {
        0 => r.log(edge_lo, lo),
        1 => r.log(hi, edge_hi),
        _ => r.log(lo, hi),
    }
}

fn device(r: &mut R, cat: &Catalog, precision: &str, s: &mut Scenario) -> Value {
    if r.chance(0.45) {
        return json!(r.pick(&cat.devices)["name"].as_str().unwrap_or("h100-sxm"));
    }
    let mut d = Map::new();
    if r.chance(0.25) {
        d.insert("preset".into(), r.pick(&cat.devices)["name"].clone());
    } else {
        let bw = extreme(r, 1e10, 1e13, 1e-3, 1e18);
        if bw < 1e6 {
            s.tags.push("slow-memory".into());
        }
        d.insert("hbm_bytes".into(), json!(extreme(r, 1e9, 1e12, 1.0, 1e18)));
        d.insert("mem_bandwidth_bytes_per_s".into(), json!(bw));
        if !r.chance(0.15) {
            d.insert("peak_flops".into(), peak(r, precision));
        }
    }
    opt(&mut d, r, 0.2, "kind", |r| json!(*r.pick(&["gpu", "fpga", "cpu"])));
    if r.chance(0.1) {
        d.insert("dsp_count".into(), json!(r.int(1, 12_000)));
        d.insert("clock_hz".into(), json!(r.log(1e6, 1e9)));
        opt(&mut d, r, 0.5, "ops_per_dsp_per_cycle", |r| json!(r.unit(0.5, 4.0)));
        opt(&mut d, r, 0.5, "sram_bytes", |r| json!(r.log(1.0, 1e9)));
        d.remove("peak_flops");
    }
    opt(&mut d, r, 0.2, "compute_units", |r| json!(count(r, &[1, 8, 108, 132], (1, 1 << 20), 0.2)));
    for k in ["gemm_efficiency", "fp8_gemm_efficiency", "mem_efficiency"] {
        opt(&mut d, r, 0.2, k, |r| json!(*r.pick(&[1.0, 0.5, 1e-6, 0.85])));
    }
    opt(&mut d, r, 0.2, "kernel_launch_s", |r| json!(*r.pick(&[0.0, 3e-6, 1e-3, 1.0])));
    opt(&mut d, r, 0.05, "rated_power_w", |r| json!(*r.pick(&[700.0, 1.0, 1e6])));
    opt(&mut d, r, 0.1, "power_limit_w", |r| json!(*r.pick(&[500.0, 80.0, 50.0, 1e6, 1e-3])));
    opt(&mut d, r, 0.1, "op_efficiency", |r| json!({"softmax": r.unit(0.01, 1.0), "layernorm": 1.0, "gelu": 0.5}));
    opt(&mut d, r, 0.2, "name", |r| json!(*r.pick(&NAMES)));
    Value::Object(d)
}

fn link(r: &mut R, cat: &Catalog, s: &mut Scenario) -> Value {
    if r.chance(0.5) {
        return json!(r.pick(&cat.links));
    }
    let mut l = Map::new();
    if r.chance(0.3) {
        l.insert("preset".into(), json!(r.pick(&cat.links)));
        opt(&mut l, r, 0.5, "bandwidth_bytes_per_s", |r| json!(r.log(1e6, 1e13)));
    } else {
        let bw = extreme(r, 1e9, 1e12, 1e-3, 1e18);
        if bw < 1e6 {
            s.tags.push("slow-link".into());
        }
        l.insert("bandwidth_bytes_per_s".into(), json!(bw));
    }
    opt(&mut l, r, 0.4, "latency_s", |r| json!(*r.pick(&[0.0, 1e-9, 2e-6, 1e-3, 10.0])));
    opt(&mut l, r, 0.3, "efficiency", |r| json!(*r.pick(&[1.0, 0.8, 0.01, 1e-9])));
    opt(&mut l, r, 0.1, "name", |r| json!(*r.pick(&NAMES)));
    Value::Object(l)
}

/// The node, and how many devices it holds.
fn node(r: &mut R, cat: &Catalog, precision: &str, s: &mut Scenario) -> (Value, u64) {
    let roll = r.unit(0.0, 1.0);
    if roll < 0.45 {
        let n = r.pick(&cat.nodes);
        return (json!(n.name), n.devices as u64);
    }
    let mut m = Map::new();
    let mut devs;
    if roll < 0.55 {
        let n = r.pick(&cat.nodes);
        m.insert("preset".into(), json!(n.name));
        devs = n.devices as u64;
        if r.chance(0.5) {
            devs = *r.pick(&[1u64, 2, 4, 8, 16]);
            m.insert("devices".into(), json!(devs));
        }
        opt(&mut m, r, 0.4, "device", |r| device(r, cat, precision, s));
    } else {
        devs = count(r, &[1, 1, 2, 3, 4, 8, 8, 16], (17, 300), 0.03);
        m.insert("devices".into(), json!(devs));
        m.insert("device".into(), device(r, cat, precision, s));
    }
    if devs > 1 || r.chance(0.2) {
        let l = link(r, cat, s);
        m.insert("intra_node".into(), l);
    }
    opt(&mut m, r, 0.2, "nics", |r| json!(*r.pick(&[1u64, 2, 8, 64])));
    opt(&mut m, r, 0.2, "nic", |r| link(r, cat, s));
    opt(&mut m, r, 0.1, "pcie", |r| link(r, cat, s));
    opt(&mut m, r, 0.1, "host_dram_bytes", |r| json!(r.log(1e6, 1e14)));
    opt(&mut m, r, 0.1, "name", |r| json!(*r.pick(&NAMES)));
    (Value::Object(m), devs)
}

fn partition_list(r: &mut R, layers: u64, chunks: u64) -> Value {
    let mut parts = vec![1u64; chunks as usize];
    for _ in chunks..layers {
        let i = r.int(0, chunks - 1) as usize;
        parts[i] += 1;
    }
    json!(parts)
}

fn slices(r: &mut R, seq: u64) -> Vec<u64> {
    let n = r.int(1, seq.min(6));
    let mut parts = vec![1u64; n as usize];
    for _ in n..seq.min(100_000) {
        let i = r.int(0, n - 1) as usize;
        parts[i] += 1;
    }
    if seq > 100_000 {
        parts[0] += seq - 100_000;
    }
    parts
}

/// A valid-looking scenario.
pub fn valid(r: &mut R, cat: &Catalog) -> Scenario {
    let mut s = Scenario::default();
    let (wv, w) = workload(r, cat, &mut s);
    let precision = *r.pick(&["bf16", "bf16", "fp16", "fp32", "fp8"]);
    let (nv, per_node) = node(r, cat, precision, &mut s);
    let nodes = count(r, &[1, 1, 1, 2, 2, 4, 8], (9, 300), 0.05);
    let devices = per_node * nodes;
    s.devices = devices;
    if devices >= 256 {
        s.tags.push("devices>=256".into());
    }
    let mut cluster = Map::new();
    cluster.insert("node".into(), nv);
    cluster.insert("nodes".into(), json!(nodes));
    opt(&mut cluster, r, if nodes > 1 { 0.4 } else { 0.1 }, "inter_node", |r| link(r, cat, &mut s));
    // A fabric of pods: a preset, or pods of a few nodes, oversubscribed, on rails.
    opt(&mut cluster, r, if nodes > 1 { 0.15 } else { 0.03 }, "fabric", |r| match r.int(0, 3) {
        0 => json!(*r.pick(&["dgx-superpod", "llama3-2024"])),
        _ => {
            let mut f = Map::new();
            f.insert("pod_nodes".into(), json!(r.int(1, nodes.max(1) + 1)));
            opt(&mut f, r, 0.7, "oversubscription", |r| json!(*r.pick(&[1.0, 2.0, 3.0, 7.0, 64.0])));
            opt(&mut f, r, 0.4, "rail_optimized", |r| json!(r.chance(0.5)));
            opt(&mut f, r, 0.4, "extra_latency_s", |r| json!(*r.pick(&[0.0, 1e-7, 2e-6, 1e-4])));
            Value::Object(f)
        }
    });
    // NCCL_ALGO / NCCL_PROTO, valid or leaving a collective nothing (refused as NCCL fails it).
    opt(&mut cluster, r, 0.08, "nccl", |r| {
        let mut n = Map::new();
        opt(&mut n, r, 0.7, "algo", |r| {
            json!(*r.pick(&["ring", "^NVLS", "Tree", "nvls", "ring,tree", "PAT", "^ring,tree,nvls"]))
        });
        opt(&mut n, r, 0.5, "proto", |r| json!(*r.pick(&["Simple", "^LL128", "LL", "LL,LL128", "^simple"])));
        Value::Object(n)
    });
    if r.chance(0.04) && devices > 1 {
        let first = r.int(0, devices - 1);
        let last = r.int(first, devices - 1);
        let d = json!(r.pick(&cat.devices)["name"]);
        cluster.insert("device_overrides".into(), json!([{"devices": [first, last], "device": d}]));
    }

    // Degrees: tp inside a node and dividing the heads, pp at most the layers.
    let tp_ok: Vec<u64> = divisors(per_node)
        .into_iter()
        .filter(|t| !w.is_net() && (w.heads as u64).is_multiple_of(*t) || *t == 1)
        .collect();
    let tp = if r.chance(0.6) { 1 } else { *r.pick(&tp_ok) };
    let pp_ok: Vec<u64> = divisors(devices / tp).into_iter().filter(|p| *p <= w.layers as u64).collect();
    let pp = if r.chance(0.3) { 1 } else { *r.pick(&pp_ok) };
    let dp = devices / tp / pp;
    s.dp = dp;
    s.pp = pp;
    let schedule = *r.pick(&["", "gpipe", "1f1b", "interleaved", "2bw", "flush"]);
    let mut m = count(r, &[1, 1, 2, 3, 4, 8, 16, 32], (33, 2048), 0.04);
    if schedule == "2bw" || schedule == "interleaved" && r.chance(0.7) {
        m = m.max(pp).div_ceil(pp) * pp;
    }
    if m >= 256 {
        s.tags.push("micro_batches>=256".into());
    }
    s.micro_batches = m;
    let micro = count(r, &[1, 1, 2, 3, 4, 8, 16], (17, 512), 0.03);
    let seq = count(r, &[1, 2, 8, 64, 128, 197, 512, 1024, 2048, 4096], (4097, 131_072), 0.04);
    if seq >= 8192 {
        s.tags.push("seq>=8192".into());
    }
    let mut training = Map::new();
    training.insert("global_batch".into(), json!(dp * micro * m));
    if micro > 1 || r.chance(0.3) {
        training.insert("micro_batch".into(), json!(micro));
    }
    training.insert("seq_len".into(), json!(seq));
    if precision != "bf16" || r.chance(0.5) {
        training.insert("precision".into(), json!(precision));
    }
    opt(&mut training, r, 0.4, "optimizer", |r| json!(*r.pick(&["adam", "adamw", "sgd"])));
    opt(&mut training, r, 0.4, "attention", |r| json!(*r.pick(&["flash", "naive"])));
    opt(&mut training, r, 0.15, "master_weights", |r| json!(r.chance(0.5)));
    // A framework profile by name, or with its knobs turned.
    let profiles = ["megatron-lm-2021", "megatron-core", "deepspeed", "pytorch-fsdp", "colossal-ai", "pytorch-ddp"];
    opt(&mut training, r, 0.3, "framework", |r| {
        let name = *r.pick(&profiles);
        if r.chance(0.5) {
            return json!(name);
        }
        let mut f = Map::new();
        f.insert("name".into(), json!(name));
        opt(&mut f, r, 0.4, "grad_reduce", |r| json!(*r.pick(&["overlapped", "after_backward", "blocking"])));
        opt(&mut f, r, 0.3, "gather_prefetch", |r| json!(r.int(0, 4)));
        opt(&mut f, r, 0.3, "param_gather_overlap", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.3, "bucket_first_chunk_only", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.3, "tp_comm_overlap", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.3, "ep_comm_overlap", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_async_backward", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_keeps_gathered_input", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_gather_per_projection", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_replicate_logits", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_replicate_embedding", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_layout_copies", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "tp_micro_pipeline", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.3, "grad_reduce_dtype", |r| json!(*r.pick(&["params", "fp32"])));
        opt(&mut f, r, 0.2, "gather_copy_out", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "gather_per_tensor", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "recompute_early_stop", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "unfused_loss", |r| json!(*r.pick(&["in_place", "fp32", "native", "loss_parallel"])));
        opt(&mut f, r, 0.2, "cp_ring", |r| json!(*r.pick(&["te_p2p", "pytorch_allgather", "pytorch_alltoall"])));
        opt(&mut f, r, 0.2, "foreach_optimizer", |r| json!(r.chance(0.5)));
        opt(&mut f, r, 0.2, "fp8_casts", |r| json!(*r.pick(&["te", "torchao"])));
        opt(&mut f, r, 0.3, "train_metrics", |r| {
            let all = ["cross_entropy", "perplexity", "token_accuracy"];
            json!(all.iter().filter(|_| r.chance(0.5)).collect::<Vec<_>>())
        });
        opt(&mut f, r, 0.3, "fused", |r| {
            json!({"softmax": r.chance(0.5), "swiglu": r.chance(0.5), "adam": r.chance(0.5),
                       "projections": r.chance(0.5)})
        });
        Value::Object(f)
    });

    let mut plan = Map::new();
    for (k, v) in [("dp", dp), ("tp", tp), ("pp", pp)] {
        if v > 1 || r.chance(0.5) {
            plan.insert(k.into(), json!(v));
        }
    }
    if !schedule.is_empty() {
        plan.insert("schedule".into(), json!(schedule));
    }
    let mut chunks = pp;
    if schedule == "interleaved" {
        let v_ok: Vec<u64> = (1..=4).filter(|v| pp * v <= w.layers as u64).collect();
        let v = *r.pick(&v_ok);
        chunks = pp * v;
        if v != 2 || r.chance(0.3) {
            plan.insert("virtual_stages".into(), json!(v));
        }
    } else if r.chance(0.05) {
        plan.insert("virtual_stages".into(), json!(1));
    }
    let cube = (1..=tp).find(|q| q * q * q == tp);
    let square = (1..=tp).find(|q| q * q == tp);
    let mut one_d = true;
    if tp > 1 && r.chance(0.4) {
        let depths: Vec<u64> =
            divisors(tp).into_iter().filter(|d| (1..=tp).any(|q| q * q * d == tp) && *d > 1).collect();
        match r.int(0, 3) {
            0 if square.is_some() => {
                plan.insert("tp_mode".into(), json!("2d"));
                one_d = false;
            }
            1 if cube.is_some() => {
                plan.insert("tp_mode".into(), json!("3d"));
                one_d = false;
            }
            2 if !depths.is_empty() => {
                plan.insert("tp_mode".into(), json!("2.5d"));
                plan.insert("tp_depth".into(), json!(*r.pick(&depths)));
                one_d = false;
            }
            _ => {
                plan.insert("tp_mode".into(), json!("1d"));
            }
        }
    }
    if one_d && r.chance(0.2) {
        let n = if seq.is_multiple_of(tp) { 3 } else { 2 };
        let sp = [json!(true), json!(false), json!("megatron"), json!("ring")][r.int(0, n) as usize].clone();
        plan.insert("sequence_parallel".into(), sp);
    }
    opt(&mut plan, r, 0.35, "zero_stage", |r| json!(r.int(0, 3)));
    // Expert parallelism: a divisor of dp mostly (valid only for experts), else anything.
    let p_ep = if w.experts > 0 { 0.5 } else { 0.03 };
    opt(
        &mut plan,
        r,
        p_ep,
        "ep",
        |r| if r.chance(0.8) { json!(*r.pick(&divisors(dp))) } else { json!(r.int(0, 1000)) },
    );
    // Context parallelism: a divisor of dp taken out of dp mostly (the device product kept),
    // else anything.
    if r.chance(0.08) {
        if r.chance(0.8) {
            let cp = *r.pick(&divisors(dp));
            plan.insert("cp".into(), json!(cp));
            plan.insert("dp".into(), json!(dp / cp));
        } else {
            plan.insert("cp".into(), json!(r.int(0, 64)));
        }
    }
    opt(&mut plan, r, 0.3, "recompute", |r| json!(*r.pick(&["none", "selective", "full"])));
    if plan.get("recompute") == Some(&json!("selective")) || r.chance(0.02) {
        opt(&mut plan, r, 0.5, "recompute_modules", |r| {
            // Per-op checkpointing stands alone (mostly; combined, it is a clear error).
            if r.chance(0.25) {
                return if r.chance(0.9) { json!(["op_sac"]) } else { json!(["op_sac", "mlp"]) };
            }
            let all = ["core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe", "shared_experts"];
            json!(all.iter().filter(|_| r.chance(0.4)).collect::<Vec<_>>())
        });
    }
    // Part of the layers recomputed: mostly with full recomputation and a few layers, else
    // anything (a clear error).
    if plan.get("recompute") == Some(&json!("full")) || r.chance(0.02) {
        opt(&mut plan, r, 0.3, "recompute_layers", |r| {
            let most = if r.chance(0.9) { 8 } else { 1000 };
            json!(r.int(0, most))
        });
    }
    // Hybrid sharding: a divisor of the replicas mostly (valid with ZeRO), else anything.
    if plan.contains_key("zero_stage") || r.chance(0.03) {
        let of = |k: &str| plan.get(k).and_then(Value::as_u64).unwrap_or(1);
        let replicas = if plan.contains_key("dp") { of("dp") * of("cp") } else { dp };
        opt(&mut plan, r, 0.15, "dp_shard", |r| {
            if r.chance(0.85) { json!(*r.pick(&divisors(replicas))) } else { json!(r.int(0, 300)) }
        });
    }
    let zero3 = plan.get("zero_stage") == Some(&json!(3));
    if r.chance(0.15) {
        let o = match r.int(0, 4) {
            0 => json!(*r.pick(&["none", "gemini", "gemini-lru", "const", "zero-offload"])),
            1 if zero3 => json!("zero-infinity"),
            2 => json!({"policy": *r.pick(&["gemini", "gemini-lru", "const", "zero-offload", "none"]),
                        "budget_bytes": r.log(1e3, 1e11)}),
            _ => {
                let mut o = Map::new();
                opt(&mut o, r, 0.7, "optimizer", |r| json!(*r.pick(&["cpu", "nvme", "device", "gpu", "none"])));
                if zero3 {
                    opt(&mut o, r, 0.5, "params", |r| json!(*r.pick(&["cpu", "nvme", "device"])));
                }
                opt(&mut o, r, 0.4, "activations", |r| json!(*r.pick(&["cpu", "device"])));
                Value::Object(o)
            }
        };
        plan.insert("offload".into(), o);
        s.tags.push("offload".into());
    }
    let slicing = w.causal && !w.is_net() && one_d && schedule.is_empty() | (schedule == "gpipe") && r.chance(0.12);
    if slicing {
        plan.remove("sequence_parallel");
        s.tags.push("token-slices".into());
        match r.int(0, 2) {
            0 => {
                plan.insert("token_slices".into(), json!("auto"));
                opt(&mut plan, r, 0.5, "token_granularity", |r| json!(r.int(1, seq.min(64))));
            }
            1 => {
                plan.insert("token_slices".into(), json!(slices(r, seq)));
            }
            _ => {
                let per_replica = micro * m;
                let a = r.int(1, per_replica);
                let mut subs = vec![json!([a, slices(r, seq)])];
                if a < per_replica {
                    subs.push(json!([per_replica - a, slices(r, seq)]));
                }
                plan.insert("token_slices".into(), json!(subs));
            }
        }
    } else if r.chance(0.25) {
        let p = match r.int(0, 4) {
            0 => json!("uniform"),
            1 => json!("balanced"),
            2 => json!("parameters"),
            3 => json!("explore"),
            _ => partition_list(r, w.layers as u64, chunks),
        };
        if let Some(name) = p.as_str() {
            s.tags.push(format!("partition:{name}"));
        }
        plan.insert("partition".into(), p);
    }
    if r.chance(0.2) {
        let b = if r.chance(0.15) { r.log(1.0, 1e4) } else { r.log(1e4, 1e10) };
        if b < 65536.0 {
            s.tags.push("bucket<64KiB".into());
        }
        plan.insert("bucket_bytes".into(), json!(b));
    }
    opt(&mut plan, r, 0.15, "rank_order", |r| json!(*r.pick(&["tp-dp-pp", "tp-pp-dp"])));
    opt(&mut plan, r, 0.15, "p2p", |r| json!(*r.pick(&["blocking", "overlapped"])));

    let epochs = count(r, &[1, 1, 2, 3, 5], (6, 100), 0.05);
    let want_run = r.chance(0.3);
    if !w.is_net() && want_run && r.chance(0.5) {
        s.tags.push("freeze".into());
        let mut f = Map::new();
        match r.int(0, 2) {
            0 => {
                f.insert("policy".into(), json!("autofreeze"));
                f.insert("alpha".into(), json!(*r.pick(&[1e-9, 0.1, 0.333, 0.5, 0.999])));
            }
            1 => {
                f.insert("policy".into(), json!("schedule"));
                let mut k = 0u64;
                let l: Vec<u64> = (0..epochs)
                    .map(|_| {
                        k = r.int(k, w.layers as u64);
                        k
                    })
                    .collect();
                f.insert("frozen_layers".into(), json!(l));
            }
            _ => {
                f.insert("policy".into(), json!("gradient"));
                f.insert("trace".into(), json!("trace.json"));
                let rows: Vec<Vec<f64>> =
                    (0..epochs).map(|e| (0..w.layers).map(|l| 1.0 / (1.0 + e as f64 + l as f64)).collect()).collect();
                s.files.push(("trace.json".into(), serde_json::to_vec(&json!({"grad_l1": rows})).unwrap_or_default()));
            }
        }
        for k in ["auto_pipe", "auto_dp", "auto_cache"] {
            opt(&mut f, r, 0.3, k, |r| json!(r.chance(0.5)));
        }
        plan.insert("freeze".into(), Value::Object(f));
    }

    let mut root = Map::new();
    opt(&mut root, r, 0.5, "name", |r| json!(*r.pick(&NAMES)));
    opt(&mut root, r, 0.1, "description", |r| json!(*r.pick(&NAMES)));
    root.insert("workload".into(), wv);
    root.insert("cluster".into(), Value::Object(cluster));
    root.insert("training".into(), Value::Object(training));
    root.insert("plan".into(), Value::Object(plan));
    if want_run {
        let freezing = s.tags.iter().any(|t| t == "freeze");
        let mut run = Map::new();
        if freezing || r.chance(0.5) {
            let samples = count(r, &[1, 1000, 50_000, 1_281_167], (1, 1 << 40), 0.05);
            run.insert("dataset_samples".into(), json!(samples));
            run.insert("epochs".into(), json!(epochs));
        } else if r.chance(0.5) {
            s.tags.push("run:tokens".into());
            run.insert("tokens".into(), json!(*r.pick(&[1.0, 1e6, 1e9, 3e11, 15.6e12, 1e18])));
        } else {
            s.tags.push("run:iterations".into());
            run.insert("iterations".into(), json!(*r.pick(&[1.0, 10.0, 1e4, 1e6, 1e9])));
        }
        if r.chance(0.5) {
            s.tags.push("run:failures".into());
            let failures = if r.chance(0.5) {
                json!(*r.pick(&["none", "llama3-2024"]))
            } else {
                let mut f = Map::new();
                opt(&mut f, r, 0.5, "preset", |r| json!(*r.pick(&["none", "llama3-2024"])));
                for k in ["gpu", "hbm", "nic", "switch", "host", "software", "maintenance"] {
                    opt(&mut f, r, 0.3, k, |r| json!(*r.pick(&[0.0, 1e-9, 1e-6, 1e-3, 0.1, 1.0])));
                }
                Value::Object(f)
            };
            run.insert("failures".into(), failures);
        }
        if r.chance(0.3) {
            let mut c = Map::new();
            opt(&mut c, r, 0.5, "interval_s", |r| {
                if r.chance(0.3) { json!("optimal") } else { json!(*r.pick(&[1e-3, 1.0, 60.0, 1800.0, 1e9])) }
            });
            opt(&mut c, r, 0.5, "storage_bytes_per_s_per_node", |r| json!(*r.pick(&[1.0, 1e6, 1e9, 1e15])));
            opt(&mut c, r, 0.5, "async", |r| json!(r.chance(0.5)));
            run.insert("checkpoint".into(), Value::Object(c));
        }
        if r.chance(0.3) {
            let mut v = Map::new();
            opt(&mut v, r, 0.5, "iteration_jitter", |r| json!(*r.pick(&[0.0, 0.01, 0.5, 1.0])));
            opt(&mut v, r, 0.5, "slow_node_probability", |r| json!(*r.pick(&[0.0, 1e-4, 0.1, 1.0])));
            opt(&mut v, r, 0.5, "slow_node_slowdown", |r| json!(*r.pick(&[0.0, 0.1, 1.0, 100.0])));
            run.insert("variability".into(), Value::Object(v));
        }
        opt(&mut run, r, 0.3, "restart_s", |r| json!(*r.pick(&[0.0, 60.0, 600.0, 1e7])));
        opt(&mut run, r, 0.3, "seed", |r| json!(r.int(0, u32::MAX as u64)));
        root.insert("run".into(), Value::Object(run));
    }
    if r.chance(0.2) {
        let mut o = Map::new();
        opt(&mut o, r, 0.5, "network", |r| json!(*r.pick(&["fair", "ideal"])));
        opt(&mut o, r, 0.5, "symmetry", |r| json!(r.chance(0.5)));
        opt(&mut o, r, 0.3, "framework_overhead_bytes", |r| json!(*r.pick(&[0.0, 1.0, 5e8, 1e15])));
        opt(&mut o, r, 0.3, "host_op_s", |r| json!(*r.pick(&[0.0, 1e-9, 1e-5, 1.0])));
        opt(&mut o, r, 0.25, "kernel_jitter", |r| json!(*r.pick(&[0.0, 0.01, 0.1, 1.0])));
        opt(&mut o, r, 0.2, "seed", |r| json!(r.int(0, 1000)));
        root.insert("simulation".into(), Value::Object(o));
    }
    s.value = Value::Object(root);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrees_multiply_to_the_cluster_and_batches_split() {
        let cat = crate::presets::tests::small_catalog();
        for case in 0..300 {
            let s = valid(&mut R::for_case(7, case), &cat);
            assert_eq!(s.dp * s.pp * s.value["plan"]["tp"].as_u64().unwrap_or(1), s.devices, "case {case}");
            let gb = s.value["training"]["global_batch"].as_u64().unwrap();
            assert!(gb.is_multiple_of(s.dp), "case {case}");
        }
    }

    #[test]
    fn generation_is_deterministic_per_seed_and_case() {
        let cat = crate::presets::tests::small_catalog();
        let a = valid(&mut R::for_case(3, 11), &cat).value;
        assert_eq!(a, valid(&mut R::for_case(3, 11), &cat).value);
        assert_ne!(a, valid(&mut R::for_case(4, 11), &cat).value);
    }
}
