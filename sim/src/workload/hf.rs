//! Reader for a Hugging Face `config.json` of a decoder-only transformer (GPT-2, GPT-NeoX,
//! Llama, Mistral, Qwen and their kin). Pure: takes the file's text, returns a workload or
//! an error naming the key.

use super::Workload;
use super::moe::{Mla, Moe};
use super::transformer::{Input, Mlp, Norm, TransformerConfig};
use serde_json::Value;

fn get_u32(v: &Value, keys: &[&str]) -> Option<u32> {
    keys.iter().find_map(|k| v.get(*k)).and_then(Value::as_u64).and_then(|x| u32::try_from(x).ok())
}

/// Keys by which Hugging Face configs declare routed experts (Mixtral, Qwen-MoE, DeepSeek-V2/3,
/// Switch/NLLB-MoE, DBRX's `ffn_config`, GPT-OSS, Llama 4, OLMoE).
const EXPERT_KEYS: [&str; 7] = [
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "num_experts_per_tok",
    "moe_k",
    "expert_capacity",
];

/// The `model_type`s whose experts this reader understands.
pub const MOE_TYPES: [&str; 6] = ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe"];

/// The expert count (or routing key) of a mixture-of-experts config that this reader does not
/// understand, if it is one: simulating it as a dense transformer would be silently wrong.
pub fn mixture_of_experts(text: &str) -> Option<String> {
    let v: Value = serde_json::from_str(text).ok()?;
    let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    if MOE_TYPES.contains(&model_type) {
        return None;
    }
    let nested = v.get("ffn_config").or_else(|| v.get("text_config"));
    for obj in std::iter::once(&v).chain(nested) {
        for k in EXPERT_KEYS {
            if let Some(x) = obj.get(k).filter(|x| x.as_u64().is_some_and(|n| n > 1) || x.is_string()) {
                return Some(format!("{k} = {x}"));
            }
        }
    }
    model_type.contains("moe").then(|| format!("model_type = \"{model_type}\""))
}

/// The experts of a config whose `model_type` is one of [`MOE_TYPES`].
fn experts(v: &Value, model_type: &str, layers: u32) -> Result<Option<Moe>, String> {
    if !MOE_TYPES.contains(&model_type) {
        return Ok(None);
    }
    let uint = |k: &str| get_u32(v, &[k]);
    let experts = get_u32(v, &["num_local_experts", "num_experts", "n_routed_experts"])
        .ok_or("a mixture-of-experts config without num_local_experts, num_experts or n_routed_experts")?;
    let top_k = uint("num_experts_per_tok").ok_or("a mixture-of-experts config without num_experts_per_tok")?;
    // Mixtral's experts are `intermediate_size` wide; the others name `moe_intermediate_size`.
    let expert_ffn = get_u32(v, &["moe_intermediate_size", "intermediate_size"])
        .ok_or("a mixture-of-experts config without moe_intermediate_size or intermediate_size")?;
    let shared_ffn = match model_type {
        "qwen2_moe" => uint("shared_expert_intermediate_size").unwrap_or(0),
        "deepseek_v2" | "deepseek_v3" => uint("n_shared_experts").unwrap_or(0) * expert_ffn,
        _ => 0,
    };
    let dense_layers = uint("first_k_dense_replace").unwrap_or(0);
    // Layers that alternate dense and sparse are not modelled (every MoE layer is alike).
    for (k, one) in [("decoder_sparse_step", 1), ("moe_layer_freq", 1)] {
        if let Some(x) = uint(k).filter(|&x| x != one) {
            return Err(format!("{k} = {x}: only every layer sparse (1) is modelled"));
        }
    }
    if v.get("mlp_only_layers").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
        return Err("mlp_only_layers lists dense layers among sparse ones: not modelled".into());
    }
    if experts < 2 || top_k == 0 || top_k > experts || expert_ffn == 0 || dense_layers >= layers {
        return Err(format!(
            "experts {experts}, top-k {top_k}, expert width {expert_ffn}, dense layers {dense_layers} of {layers}: \
             need 2 or more experts, 1 <= top-k <= experts, a positive width and a sparse layer"
        ));
    }
    Ok(Some(Moe { experts, top_k, expert_ffn, shared_ffn, dense_layers, capacity_factor: 0.0, imbalance: 1.0 }))
}

/// Multi-head latent attention of a DeepSeek-V2/V3 config.
fn latent_attention(v: &Value) -> Option<Mla> {
    let kv_lora_rank = get_u32(v, &["kv_lora_rank"])?;
    Some(Mla {
        q_lora_rank: get_u32(v, &["q_lora_rank"]).unwrap_or(0),
        kv_lora_rank,
        qk_nope_head_dim: get_u32(v, &["qk_nope_head_dim"])?,
        qk_rope_head_dim: get_u32(v, &["qk_rope_head_dim"])?,
        v_head_dim: get_u32(v, &["v_head_dim"])?,
    })
}

/// Parse a `config.json`. `name` labels the workload in reports.
pub fn parse(name: &str, text: &str) -> Result<Workload, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let need =
        |keys: &[&str]| get_u32(&v, keys).ok_or_else(|| format!("missing positive integer key {}", keys.join(" or ")));
    let layers = need(&["num_hidden_layers", "n_layer", "num_layers"])?;
    let hidden = need(&["hidden_size", "n_embd", "d_model"])?;
    let heads = need(&["num_attention_heads", "n_head"])?;
    let vocab = need(&["vocab_size"])?;
    if layers == 0 || hidden == 0 || heads == 0 || vocab == 0 {
        return Err("layers, hidden size, heads and vocabulary must be positive".into());
    }
    let explicit_head_dim = get_u32(&v, &["head_dim"]).filter(|&d| d * heads != hidden && d > 0);
    let mla = latent_attention(&v);
    if hidden % heads != 0 && explicit_head_dim.is_none() && mla.is_none() {
        return Err(format!("hidden size {hidden} is not a multiple of the {heads} attention heads"));
    }
    let kv_heads = get_u32(&v, &["num_key_value_heads"]).unwrap_or(heads);
    let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    let moe = experts(&v, model_type, layers)?;
    let act = v.get("hidden_act").or_else(|| v.get("activation_function")).and_then(Value::as_str).unwrap_or("gelu");
    let gated = act == "silu" || act == "swiglu" || matches!(model_type, "llama" | "mistral" | "qwen2" | "mixtral");
    let ffn = get_u32(&v, &["intermediate_size", "n_inner", "ffn_hidden_size"]).unwrap_or(4 * hidden);
    let rms = v.get("rms_norm_eps").is_some();
    let positions = if v.get("rope_theta").is_some() || v.get("rotary_pct").is_some() || rms {
        0
    } else {
        get_u32(&v, &["max_position_embeddings", "n_positions", "n_ctx"]).unwrap_or(0)
    };
    let tied = v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(!gated);
    let bias = v.get("attention_bias").or_else(|| v.get("bias")).and_then(Value::as_bool).unwrap_or(!gated);
    // Dropout keeps masks for backward: on when any dropout probability is positive.
    let dropout =
        ["attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout_prob", "attention_dropout", "hidden_dropout"]
            .iter()
            .any(|k| v.get(*k).and_then(Value::as_f64).is_some_and(|p| p > 0.0));
    Ok(Workload::transformer(
        name,
        TransformerConfig {
            layers,
            hidden,
            heads,
            kv_heads,
            ffn_hidden: ffn,
            vocab,
            causal: true,
            mlp: if gated { Mlp::SwiGlu } else { Mlp::Gelu },
            norm: if rms { Norm::RmsNorm } else { Norm::LayerNorm },
            bias,
            dropout,
            tied_embeddings: tied,
            input: Input::Tokens { positions, token_types: 0 },
            pooler: false,
            rotary: positions == 0 && (v.get("rope_theta").is_some() || v.get("rotary_pct").is_some() || rms),
            explicit_head_dim,
            moe,
            mla,
        },
    ))
}
